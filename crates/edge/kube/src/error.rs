//! The kube crate's one error type, and the deadline every request gets.

/// Failures talking to the API server.
#[derive(Debug, thiserror::Error)]
pub enum KubeError {
    /// No usable kubeconfig or in-cluster configuration.
    #[error(
        "no Kubernetes configuration ({source}); set KUBECONFIG or --kubeconfig, or run in a pod"
    )]
    Config {
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A kubeconfig file that cannot be read or has no such context.
    #[error("kubeconfig {path}: {message}")]
    Kubeconfig { path: String, message: String },
    /// The API server answered with an error, or the connection failed.
    #[error("{what}: {source}")]
    Api {
        what: String,
        #[source]
        source: kube::Error,
    },
    /// No answer within the request timeout.
    #[error("{what}: no answer from the API server within {timeout:?}")]
    Timeout {
        what: String,
        timeout: std::time::Duration,
    },
    /// The object kept changing under an optimistic-concurrency write.
    #[error("{what}: the object kept changing; gave up after {attempts} attempts")]
    Conflict { what: String, attempts: u32 },
}

impl KubeError {
    /// A short, stable name per variant, for metric labels and log fields.
    pub fn kind(&self) -> &'static str {
        match self {
            KubeError::Config { .. } => "config",
            KubeError::Kubeconfig { .. } => "kubeconfig",
            KubeError::Api { .. } => "api",
            KubeError::Timeout { .. } => "timeout",
            KubeError::Conflict { .. } => "conflict",
        }
    }
}

/// Runs `request` with a deadline; both failures name `what`.
pub(crate) async fn bounded<T>(
    timeout: std::time::Duration,
    what: impl Fn() -> String,
    request: impl std::future::Future<Output = Result<T, kube::Error>>,
) -> Result<T, KubeError> {
    match tokio::time::timeout(timeout, request).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(source)) => Err(KubeError::Api {
            what: what(),
            source,
        }),
        Err(_) => Err(KubeError::Timeout {
            what: what(),
            timeout,
        }),
    }
}
