//! The label sets of the per-container series beside the container's own
//! (`ContainerLabels`): who preempted or woke, the cause of a wait, a GPU,
//! a cold-start stage, the advice's key; and the node-wide map label.

use prometheus_client::encoding::EncodeLabelSet;

pub(crate) use crate::labels::{ContainerLabels, LabelValue};

/// Node-wide failed map inserts, by the map that was full.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct MapLabels {
    pub map: LabelValue,
}

/// A container's preemptions by who preempted it: `same` (its own threads),
/// `other` (another container's), `host` (anything else).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct PreemptLabels {
    pub by: LabelValue,
    #[prometheus(flatten)]
    pub container: ContainerLabels,
}

impl PreemptLabels {
    pub(crate) fn new(container: &ContainerLabels, by: &str) -> PreemptLabels {
        PreemptLabels {
            container: container.clone(),
            by: by.into(),
        }
    }
}

/// A container's runnable-but-not-running time by cause (the report's
/// diagnosis, docs/report.md): `own_limit`, `ancestor_limit` (a pod's or a
/// parent's quota froze it), `own_threads`, `other_containers`, `host`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct WaitLabels {
    pub cause: LabelValue,
    #[prometheus(flatten)]
    pub container: ContainerLabels,
}

impl WaitLabels {
    pub(crate) fn new(container: &ContainerLabels, cause: &str) -> WaitLabels {
        WaitLabels {
            container: container.clone(),
            cause: cause.into(),
        }
    }
}

pub(crate) const WAIT_CAUSES: [&str; 5] = [
    "own_limit",
    "ancestor_limit",
    "own_threads",
    "other_containers",
    "host",
];

/// Cold starts are aggregated per namespace and class: one observation per
/// container would be 6 stages × 14 series that nobody reads alone.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct StageLabels {
    pub namespace: LabelValue,
    pub qos_class: LabelValue,
    pub stage: LabelValue,
}

/// One of a container's GPUs (`gpu`: NVML's index, as the log's
/// `start.topology.container_gpus`; at most `gpu::MAX_GPUS` per container).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct GpuLabels {
    pub gpu: LabelValue,
    #[prometheus(flatten)]
    pub container: ContainerLabels,
}

impl GpuLabels {
    pub(crate) fn new(container: &ContainerLabels, gpu: usize) -> GpuLabels {
        GpuLabels {
            container: container.clone(),
            gpu: gpu.to_string().as_str().into(),
        }
    }
}

/// A container's advice (advice.rs): the setting and its value as the
/// node report prints them. One value per container at a time.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct AdviceLabels {
    pub key: LabelValue,
    pub value: LabelValue,
    #[prometheus(flatten)]
    pub container: ContainerLabels,
}

impl AdviceLabels {
    pub(crate) fn new(
        c: &ContainerLabels,
        a: &crate::daemon::exported_advice::Advice,
    ) -> AdviceLabels {
        AdviceLabels {
            key: a.key.as_str().into(),
            value: a.value.as_str().into(),
            container: c.clone(),
        }
    }
}

/// The advice's key alone (its predicted effect).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct KeyLabels {
    pub key: LabelValue,
    #[prometheus(flatten)]
    pub container: ContainerLabels,
}

impl KeyLabels {
    pub(crate) fn new(c: &ContainerLabels, key: &str) -> KeyLabels {
        KeyLabels {
            key: key.into(),
            container: c.clone(),
        }
    }
}
