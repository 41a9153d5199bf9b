//! Real daemons started and stopped by tests (filled by the runtime tests).
