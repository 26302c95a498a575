//! Why a replay cannot run: a bad pools file or a bad trace, each naming where.

/// Errors of the replay; every variant names the file and, where there is one, the line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReplayError {
    /// The pools file is not valid YAML of the expected shape, or a value is unusable.
    #[error("{file}:{line}{}: {message}", .column.map_or_else(String::new, |c| format!(":{c}")))]
    Pools {
        file: String,
        /// 1-based; 0 when the problem is not at one place.
        line: u64,
        /// 1-based, when known (YAML syntax and type errors).
        column: Option<u64>,
        message: String,
    },
    /// The pod trace cannot be read.
    #[error("{file}:{line}: {message}")]
    Trace {
        file: String,
        line: u64,
        message: String,
    },
    /// The trace's main columns failed the packing crate's checks (its message names the place).
    #[error("{0}")]
    Packing(String),
}
