//! The runc-compatible wrapper's library: spec modifiers shared with the shim.

pub mod modifiers;
