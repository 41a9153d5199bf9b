//! What the probe needs, checked before anything else is tried: an
//! unprivileged `throttlewatch run` says once what is missing instead of
//! logging each fallback it attempts on the way to EPERM.

/// Capability bits (linux/capability.h).
const CAP_SYS_ADMIN: u32 = 21;
const CAP_PERFMON: u32 = 38;
const CAP_BPF: u32 = 39;

/// The effective capability set of this process (`CapEff` in /proc/self/status).
fn effective_caps(status: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
}

/// The capabilities loading the probe needs that `cap_eff` lacks, by name.
pub(crate) fn missing(cap_eff: u64) -> Vec<&'static str> {
    [
        (CAP_BPF, "CAP_BPF"),
        (CAP_PERFMON, "CAP_PERFMON"),
        (CAP_SYS_ADMIN, "CAP_SYS_ADMIN"),
    ]
    .into_iter()
    .filter(|(bit, _)| cap_eff & (1u64 << bit) == 0)
    .map(|(_, name)| name)
    .collect()
}

/// This process cannot load the probe: what needs it and the capabilities
/// it lacks.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{what} loads eBPF programs and needs root (or CAP_BPF + CAP_PERFMON + CAP_SYS_ADMIN); this process lacks {}", lacking.join(", "))]
pub struct MissingPrivileges {
    pub what: String,
    pub lacking: Vec<&'static str>,
}

/// `Err` when this process cannot load the probe.
pub fn check(what: &str) -> Result<(), MissingPrivileges> {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let Some(eff) = effective_caps(&status) else {
        return Ok(()); // no procfs: let the load itself say what is wrong
    };
    let lacking = missing(eff);
    if lacking.is_empty() {
        return Ok(());
    }
    Err(MissingPrivileges {
        what: what.to_string(),
        lacking,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_has_everything_and_a_user_nothing() {
        let root = "Name:\tx\nCapEff:\t000001ffffffffff\n";
        assert_eq!(missing(effective_caps(root).unwrap()), Vec::<&str>::new());
        let user = "CapEff:\t0000000000000000\n";
        assert_eq!(
            missing(effective_caps(user).unwrap()),
            ["CAP_BPF", "CAP_PERFMON", "CAP_SYS_ADMIN"]
        );
        let bpf_only = format!("CapEff:\t{:016x}\n", 1u64 << CAP_BPF);
        assert_eq!(
            missing(effective_caps(&bpf_only).unwrap()),
            ["CAP_PERFMON", "CAP_SYS_ADMIN"]
        );
        assert_eq!(effective_caps("garbage"), None);
    }
}
