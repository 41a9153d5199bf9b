//! The OCI hook stages throttlewatch installs its hook for.

use std::fmt;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HookStage {
    CreateRuntime,
    Prestart,
    Poststop,
}

impl HookStage {
    pub const ACCEPTED: &'static str = "createRuntime, prestart or poststop";

    pub fn parse(s: &str) -> Option<HookStage> {
        match s {
            "createRuntime" => Some(HookStage::CreateRuntime),
            "prestart" => Some(HookStage::Prestart),
            "poststop" => Some(HookStage::Poststop),
            _ => None,
        }
    }

    /// The hook's argument and the key in the spec's `hooks` object.
    pub fn as_str(self) -> &'static str {
        match self {
            HookStage::CreateRuntime => "createRuntime",
            HookStage::Prestart => "prestart",
            HookStage::Poststop => "poststop",
        }
    }

    pub fn starts_container(self) -> bool {
        !matches!(self, HookStage::Poststop)
    }
}

impl fmt::Display for HookStage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for s in [
            HookStage::CreateRuntime,
            HookStage::Prestart,
            HookStage::Poststop,
        ] {
            assert_eq!(HookStage::parse(s.as_str()), Some(s));
        }
        assert_eq!(HookStage::parse("createruntime"), None);
        assert!(!HookStage::Poststop.starts_container());
    }
}
