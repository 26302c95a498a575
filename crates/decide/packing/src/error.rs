//! The crate's single error type.

use std::path::PathBuf;

/// Everything that can go wrong while parsing traces, building a cluster or simulating.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PackingError {
    /// A trace row (or the header) is malformed. `line` is 1-based; the header is line 1.
    #[error("{file}:{line}: {message}")]
    Parse {
        /// File name as given by the caller (used only in messages).
        file: String,
        /// 1-based line number.
        line: usize,
        /// What is wrong, naming the column and the bad value.
        message: String,
    },
    /// A trace file could not be read (only from the `read_*_file` helpers).
    #[error("cannot read {path}: {message}")]
    Io {
        /// The path that was read.
        path: PathBuf,
        /// The operating system's message.
        message: String,
    },
    /// The node list describes a cluster this engine cannot model.
    #[error("invalid cluster: {0}")]
    Cluster(String),
    /// A placement was requested that does not fit (caller bug or stale state).
    #[error("invalid placement of pod on node {node}: {reason}")]
    Placement {
        /// Node index.
        node: usize,
        /// Why it does not fit.
        reason: String,
    },
    /// Unknown policy name.
    #[error(
        "unknown policy {0:?} (expected one of: random, dotprod, gpuclustering, gpupacking, bestfit, fgd, ours, all)"
    )]
    UnknownPolicy(String),
    /// Bad simulation parameters (empty pod list, bad load or seed range).
    #[error("invalid simulation input: {0}")]
    Input(String),
}

/// Result alias for this crate.
pub type Result<T> = std::result::Result<T, PackingError>;
