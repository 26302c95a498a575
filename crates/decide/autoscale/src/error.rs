//! Why a node pool cannot be modelled, or what the MIG reconciler read does not parse.

/// A MachineDeployment that cannot be used as a node pool (the pool is skipped, the others
/// keep scaling), or MIG input that cannot be used (that input is left out).
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
    /// The owed configs on the agents' MIG ConfigMap (`origin`) are not JSON of the expected
    /// shape; `message` is the JSON parser's.
    #[error(
        "MIG config: {origin}: annotation {annotation}: {message} (want {{\"NAMESPACE/MACHINEDEPLOYMENT\": [{{\"config\": \"gpuops-...\", \"at\": MILLIS}}]}})"
    )]
    OwedNotJson {
        origin: String,
        annotation: &'static str,
        message: String,
    },
    /// An owed entry naming a config this controller did not generate.
    #[error(
        "MIG config: {origin}: annotation {annotation}: MachineDeployment {pool} entry {index}: config {config:?} is not a generated config ({prefix}...)"
    )]
    OwedNotGenerated {
        origin: String,
        annotation: &'static str,
        pool: String,
        index: usize,
        config: String,
        prefix: &'static str,
    },
    /// A mig-parted config read from the agents' ConfigMap or generated that does not parse.
    #[error("MIG config: {0}")]
    MigConfig(#[from] gpuops_mig::MigError),
    /// A node's layout annotation (the agent's) that does not parse; `message` is the JSON
    /// parser's.
    #[error("node {node}: annotation {annotation}: {message}")]
    Layout {
        node: String,
        annotation: &'static str,
        message: String,
    },
}

impl AutoscaleError {
    /// The pool (`namespace/name`) the error is about, for the errors about one pool.
    pub fn pool(&self) -> Option<&str> {
        match self {
            AutoscaleError::Annotation { pool, .. }
            | AutoscaleError::Pool { pool, .. }
            | AutoscaleError::OwedNotGenerated { pool, .. } => Some(pool),
            AutoscaleError::OwedNotJson { .. }
            | AutoscaleError::MigConfig(_)
            | AutoscaleError::Layout { .. } => None,
        }
    }
}
