//! The MPS crate's one error type.

use std::path::PathBuf;
use std::time::Duration;

/// Failures to lay out, start, command or stop an MPS control daemon.
#[derive(Debug, thiserror::Error)]
pub enum MpsError {
    #[error(
        "the MPS control binary {path} does not exist or is not a file: install the NVIDIA \
         driver's nvidia-cuda-mps-control there, or point gpuops at it"
    )]
    BinaryMissing { path: PathBuf },
    #[error("MPS daemon name {name:?} cannot name its directory: {why}")]
    BadName { name: String, why: &'static str },
    #[error("MPS daemon {name}: {why}")]
    BadSpec { name: String, why: String },
    #[error("creating the MPS directory {dir}: {source}")]
    Dir {
        dir: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("running {path}: {source}")]
    Spawn {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The client ran and said no (or exited non-zero): `detail` is what it printed.
    #[error("`{command}` to the MPS control daemon on {pipe_dir}: {detail}")]
    Command {
        command: String,
        pipe_dir: PathBuf,
        detail: String,
    },
    #[error("`{command}` to the MPS control daemon on {pipe_dir} got no answer within {timeout:?}")]
    Timeout {
        command: String,
        pipe_dir: PathBuf,
        timeout: Duration,
    },
    #[error("the MPS control daemon {name} did not start: {detail}")]
    Start { name: String, detail: String },
    #[error("the MPS control daemon {name} was asked to stop before it was ready")]
    Stopped { name: String },
}
