//! The one error type of gpuops-observe.

/// Why a read failed.
#[derive(Debug, thiserror::Error)]
pub enum ObserveError {
    /// Building the Kubernetes client (kubeconfig, context, in-cluster config).
    #[error(transparent)]
    Client(#[from] gpuops_kube::KubeError),
    /// A request to the API server failed.
    #[error("{what}")]
    Kube {
        what: String,
        #[source]
        source: kube::Error,
    },
    /// A file a flag names could not be read.
    #[error("{what}")]
    File {
        what: String,
        #[source]
        source: std::io::Error,
    },
    /// The HTTP client could not be set up (TLS, certificate).
    #[error("{what}")]
    HttpSetup {
        what: String,
        #[source]
        source: reqwest::Error,
    },
    /// An HTTP GET that failed: the URL (without credentials) and why.
    #[error("{0}")]
    Http(String),
    /// A metrics answer that does not parse.
    #[error("{what}")]
    Parse {
        what: String,
        #[source]
        source: gpuops_doctor::DoctorError,
    },
    /// A request that could not be built.
    #[error("{what}")]
    Request {
        what: String,
        #[source]
        source: ::http::Error,
    },
}

/// An error and its causes, `: `-joined (what `{:#}` of an anyhow error prints).
pub fn chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut cur = e.source();
    while let Some(s) = cur {
        out.push_str(": ");
        out.push_str(&s.to_string());
        cur = s.source();
    }
    out
}
