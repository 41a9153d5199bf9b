//! The OCI hook stages throttlewatch installs its hook for.

use std::fmt;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    CreateRuntime,
    Prestart,
    Poststop,
}

impl Stage {
    pub const ACCEPTED: &'static str = "createRuntime, prestart or poststop";

    pub fn parse(s: &str) -> Option<Stage> {
        match s {
            "createRuntime" => Some(Stage::CreateRuntime),
            "prestart" => Some(Stage::Prestart),
            "poststop" => Some(Stage::Poststop),
            _ => None,
        }
    }

    /// The hook's argument and the key in the spec's `hooks` object.
    pub fn as_str(self) -> &'static str {
        match self {
            Stage::CreateRuntime => "createRuntime",
            Stage::Prestart => "prestart",
            Stage::Poststop => "poststop",
        }
    }

    pub fn starts_container(self) -> bool {
        !matches!(self, Stage::Poststop)
    }
}

impl fmt::Display for Stage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for s in [Stage::CreateRuntime, Stage::Prestart, Stage::Poststop] {
            assert_eq!(Stage::parse(s.as_str()), Some(s));
        }
        assert_eq!(Stage::parse("createruntime"), None);
        assert!(!Stage::Poststop.starts_container());
    }
}
