//! The agent crate's one error type.

/// Why the agent could not start or stopped.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error(transparent)]
    Kube(#[from] gpuops_kube::KubeError),
    #[error("device plugin config: {0}")]
    Config(String),
    /// A setting that cannot work, named by its flag.
    #[error("{0}")]
    Invalid(String),
    #[error("CDI: {0}")]
    Cdi(String),
}
