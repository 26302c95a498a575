//! Why labels could not be computed for a node.

/// Why [`crate::gfd_labels`] could not compute a node's labels. GFD fails the same way (it writes
/// no labels at all), so the caller should report the error and leave the node's labels alone.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LabelError {
    #[error("driver version {0:?} does not match the format X.Y[.Z]")]
    InvalidDriverVersion(String),
    #[error("CUDA version {0:?} does not match the format X.Y")]
    InvalidCudaVersion(String),
    #[error(
        "MPS sharing is not supported with MIG: MIG is enabled on GPU {}; disable MIG or use time-slicing",
        .gpus.iter().map(u32::to_string).collect::<Vec<_>>().join(", ")
    )]
    MpsWithMig { gpus: Vec<u32> },
    #[error("invalid resource name in the sharing config: {0}")]
    InvalidResourceName(#[source] gpuops_resources::ResourcesError),
    #[error("annotation gpuops.io/gpu-health is not a health report: {0}")]
    InvalidHealthAnnotation(String),
}
