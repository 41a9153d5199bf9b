//! What the tests of containers in kubelet's pod cgroups share
//! (tests/kubelet_pods.rs through the runc wrapper, tests/cri_kubelet.rs
//! through the CRI).

/// tw-burn's arguments for 45 ms of CPU every 300 ms for 3 s on one thread:
/// issue 32's measured case, throttled under a 30 ms / 100 ms quota.
pub const SPIKY: &[&str] = &[
    "--threads",
    "1",
    "--pin",
    "packed",
    "--spin-cpu",
    "45",
    "--sleep",
    "300",
    "--ms",
    "3000",
];

/// tw-burn's arguments for a container that is idle but for 1 ms every
/// second, for 60 s: a container to resize.
pub const IDLE: &[&str] = &[
    "--threads",
    "1",
    "--spin-cpu",
    "1",
    "--sleep",
    "1000",
    "--ms",
    "60000",
];
