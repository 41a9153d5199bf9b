//! The container engines we install into, by the name the command takes.

use crate::CliError;

/// The engines we configure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ContainerEngine {
    Containerd,
    Docker,
    Podman,
    Crio,
}

impl ContainerEngine {
    pub(crate) const ACCEPTED: &'static str = "containerd, docker, podman, crio";

    pub(crate) fn parse(s: &str, command: &str) -> Result<ContainerEngine, CliError> {
        match s {
            "containerd" => Ok(ContainerEngine::Containerd),
            "docker" => Ok(ContainerEngine::Docker),
            "podman" => Ok(ContainerEngine::Podman),
            "crio" | "cri-o" => Ok(ContainerEngine::Crio),
            other => Err(CliError::usage(format!(
                "{command}: unknown engine {other:?}; accepted: {}",
                ContainerEngine::ACCEPTED
            ))),
        }
    }

    pub(crate) fn name(self) -> &'static str {
        match self {
            ContainerEngine::Containerd => "containerd",
            ContainerEngine::Docker => "docker",
            ContainerEngine::Podman => "podman",
            ContainerEngine::Crio => "crio",
        }
    }
}
