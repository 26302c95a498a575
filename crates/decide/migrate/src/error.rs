//! The one error type of the translation: every variant names the object and the field.

/// Why the objects cannot be translated. Each names the object (`ClusterPolicy/cluster-policy`,
/// `ConfigMap gpu-operator/time-slicing`) and the field, so the user knows what to fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MigrateError {
    /// A ClusterPolicy whose `apiVersion` is not the one whose fields this translation knows.
    #[error(
        "{object}: apiVersion is {found:?}; gpuops migrate reads ClusterPolicy nvidia.com/v1 (GPU Operator v24 to v26)"
    )]
    WrongVersion { object: String, found: String },
    /// A field that names a ConfigMap which is not among the objects read.
    #[error(
        "{object}: {field} names ConfigMap {name:?}{}, which was not found; give it with -f, or read the cluster with access to that namespace",
        .namespace.as_deref().map(|n| format!(" in namespace {n}")).unwrap_or_default()
    )]
    MissingConfigMap {
        object: String,
        field: String,
        name: String,
        namespace: Option<String>,
    },
    /// A field that names a key (a config) that the ConfigMap or config file does not have.
    #[error("{object}: {field} names {what} {key:?}, which {where_and_have}")]
    MissingKey {
        object: String,
        field: String,
        what: &'static str,
        key: String,
        /// `ConfigMap ns/x does not have (have: a, b)`.
        where_and_have: String,
    },
    /// A value gpuops (and NVIDIA's own parser) refuses.
    #[error("{object}: {field}: {problem}")]
    BadValue {
        object: String,
        field: String,
        problem: String,
    },
    /// Two objects of which only one can be followed.
    #[error("{first} and {second} both {what}; give only one (-f) or remove the other")]
    Ambiguous {
        first: String,
        second: String,
        what: &'static str,
    },
    /// Nothing among the objects is NVIDIA's node stack.
    #[error(
        "no ClusterPolicy (nvidia.com/v1) and no DaemonSet of NVIDIA's device plugin, GPU Feature Discovery, MIG manager or dcgm-exporter among the {count} objects read"
    )]
    NothingToMigrate { count: usize },
    /// Input that is not a Kubernetes object at all.
    #[error("{origin}: {problem}")]
    NotAnObject { origin: String, problem: String },
    /// The values could not be written as YAML.
    #[error("writing the values as YAML: {0}")]
    Yaml(String),
}
