//! Why an opaque config or a checkpoint was refused.

/// The crate's one error type. Every message names what was wrong and what is accepted, so the
/// agent can hand it to the kubelet (a failed prepare) or to the operator (a checkpoint) as is.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DraError {
    /// An opaque device config (`resource.nvidia.com/v1beta1`) has a bad field.
    #[error("opaque config: {path}: {value} is not accepted: {accepted}")]
    Config {
        /// JSON path of the field, e.g. `sharing.timeSlicingConfig.interval`.
        path: String,
        /// The value found, as JSON (or `missing`).
        value: String,
        /// What would be accepted there.
        accepted: String,
    },
    /// The opaque config is not JSON at all.
    #[error("opaque config is not valid JSON: {0}")]
    ConfigSyntax(String),
    /// The claim checkpoint could not be read; the caller adds the file name.
    #[error("claim checkpoint: {0}")]
    Checkpoint(String),
    /// The claim checkpoint was written by an agent whose format this one cannot read.
    #[error(
        "claim checkpoint: written by format version {version} that needs a reader of version {min_reader} or newer; this agent reads up to version {supported}"
    )]
    CheckpointTooNew {
        version: u32,
        min_reader: u32,
        supported: u32,
    },
    /// A device name that is not one of ours (`gpu-<minor>`, `gpu-<minor>-mig-…`).
    #[error(
        "{0:?} is not a device name of this driver (gpu-<minor> or gpu-<minor>-mig-<profile>-<profile id>-<start>)"
    )]
    DeviceName(String),
    /// A per-device pinned-memory limit names no device of the claim.
    #[error(
        "opaque config: {path}: {key:?} is neither the UUID nor the index (0-{last}) of a device of this claim"
    )]
    UnknownDeviceKey {
        path: String,
        key: String,
        last: usize,
    },
}
