//! Why the controller could not start or act.

/// Failures of the controller runtime.
#[derive(Debug, thiserror::Error)]
pub enum ControllerError {
    #[error(transparent)]
    Kube(#[from] gpuops_kube::KubeError),
    #[error("{what}: {source}")]
    Api {
        what: String,
        #[source]
        source: kube::Error,
    },
    #[error(transparent)]
    Serve(#[from] gpuops_serve::ServeError),
    #[error("status ConfigMap {name}: {message}")]
    Status { name: String, message: String },
    /// The GPU utilization feed (`--prometheus-url`).
    #[error("Prometheus {url}: {message}")]
    Prometheus { url: String, message: String },
    /// What the MIG reconciler read or generated does not parse (its owed configs, a
    /// mig-parted config).
    #[error(transparent)]
    Mig(#[from] gpuops_autoscale::AutoscaleError),
}
