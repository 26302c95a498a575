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
    // The HTTP variants' texts carry their cause too: a failed scrape is reported by its text
    // alone in places (a log field, a test's message), and `chain` leaves the repeat out.
    /// A URL (as given) that does not parse.
    #[error("{url}: not a URL: {source}")]
    Url {
        url: String,
        // `url::ParseError`, named through reqwest (which re-exports `Url` but not its error).
        #[source]
        source: <reqwest::Url as std::str::FromStr>::Err,
    },
    /// A URL (as given) that is not http:// or https://.
    #[error("{url}: only http:// and https:// URLs are supported")]
    Scheme { url: String },
    /// A GET that got no answer; `url` is shown without credentials.
    #[error("{url}: {}", chain(source))]
    Get {
        url: String,
        #[source]
        source: reqwest::Error,
    },
    /// An answer whose body could not be read.
    #[error("{url}: reading the answer: {}", chain(source))]
    Read {
        url: String,
        #[source]
        source: reqwest::Error,
    },
    /// An answer that is not 2xx; `body` is the start of what the server said.
    #[error("{url}: HTTP {status}: {body}")]
    Status {
        url: String,
        status: reqwest::StatusCode,
        body: String,
    },
    /// A metrics answer that does not parse.
    #[error("{what}")]
    Parse {
        what: String,
        #[source]
        source: gpuops_doctor::DoctorError,
    },
    /// An object read from the API server that could not be turned into JSON.
    #[error("{what}: {source}")]
    Json {
        what: String,
        #[source]
        source: serde_json::Error,
    },
    /// A request that could not be built.
    #[error("{what}")]
    Request {
        what: String,
        #[source]
        source: ::http::Error,
    },
}

/// An error and its causes, `: `-joined (what `{:#}` of an anyhow error prints), leaving out a
/// cause whose text is already there (HTTP clients' errors often repeat their source's).
pub fn chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut cur = e.source();
    while let Some(s) = cur {
        let t = s.to_string();
        if !out.contains(&t) {
            out.push_str(": ");
            out.push_str(&t);
        }
        cur = s.source();
    }
    out
}
