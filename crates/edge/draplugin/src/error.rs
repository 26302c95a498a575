//! The DRA plugin crate's one error type.

use std::path::PathBuf;

/// Failures of the DRA plugin's sockets and checkpoint.
#[derive(Debug, thiserror::Error)]
pub enum DraPluginError {
    /// The preparer's own message for one claim: its text is the driver's, passed on as is.
    #[error("{0}")]
    ClaimFailed(String),
    #[error("the driver gave no answer for claim {0}")]
    NoAnswer(String),
    #[error("claim {namespace}/{name} has no UID")]
    NoUid { namespace: String, name: String },
    #[error("DRA plugin directory {dir}: {source}")]
    PluginDir {
        dir: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("serving {what} on {socket}: {source}")]
    Listen {
        what: &'static str,
        socket: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("reading the DRA checkpoint {path}: {source}")]
    CheckpointRead {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The file is there but is not a checkpoint this agent reads (not JSON, the wrong shape, or
    /// a format too new): the caller decides whether to set it aside and start empty or to
    /// refuse to prepare; never a reason to crash.
    #[error("the DRA checkpoint {path} cannot be used: {source}")]
    CheckpointCorrupt {
        path: PathBuf,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("encoding the DRA checkpoint for {path}: {source}")]
    CheckpointEncode {
        path: PathBuf,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("writing the DRA checkpoint: {0}")]
    CheckpointWrite(#[from] gpuops_atomicfile::AtomicWriteError),
    #[error("setting the corrupt DRA checkpoint {path} aside as {to}: {source}")]
    CheckpointSetAside {
        path: PathBuf,
        to: PathBuf,
        #[source]
        source: std::io::Error,
    },
}
