//! Why a node pool cannot be modelled.

/// A MachineDeployment that cannot be used as a node pool; the pool is skipped, the others
/// keep scaling.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AutoscaleError {
    /// An annotation with a value that cannot be used.
    #[error("MachineDeployment {pool}: annotation {annotation}={value:?}: {reason}")]
    Annotation {
        pool: String,
        annotation: String,
        value: String,
        reason: String,
    },
    /// Something missing or inconsistent that is not one annotation's fault.
    #[error("MachineDeployment {pool}: {reason}")]
    Pool { pool: String, reason: String },
}

impl AutoscaleError {
    /// The pool (`namespace/name`) the error is about.
    pub fn pool(&self) -> &str {
        match self {
            AutoscaleError::Annotation { pool, .. } | AutoscaleError::Pool { pool, .. } => pool,
        }
    }
}
