//! gpuops-extender: the kube-scheduler HTTP extender service (`filter` + `prioritize`) that
//! scores nodes for GPU-sharing pods with the packing engine, over its own watch of nodes and
//! unfinished pods. See docs/packing.md.
//!
//! The wire protocol and the answers are pure ([`protocol`], [`server::handle`]); the Kubernetes
//! objects become the engine's model in gpuops-kubemodel; this crate adds the watch and the HTTP
//! service (gpuops-serve) and [`run`]s them until shutdown.

pub mod protocol;
pub mod server;

use gpuops_packing::{PodSpec, PolicyKind};
use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

/// Failures of the extender service.
#[derive(Debug, thiserror::Error)]
pub enum ExtenderError {
    #[error(transparent)]
    Serve(#[from] gpuops_serve::ServeError),
    #[error("--kubeconfig: cannot read {path}: {source}")]
    Kubeconfig {
        path: PathBuf,
        #[source]
        source: kube::config::KubeconfigError,
    },
    #[error("{context}: {source}")]
    Kube {
        context: String,
        #[source]
        source: kube::Error,
    },
    #[error(
        "connecting to Kubernetes (KUBECONFIG, ~/.kube/config or in-cluster; or pass --kubeconfig): {0}"
    )]
    InferConfig(#[source] kube::config::InferConfigError),
}

/// What the extender serves with.
#[derive(Debug, Clone)]
pub struct ExtenderConfig {
    /// Scoring policy.
    pub policy: PolicyKind,
    /// Typical pod shapes for FGD and ours; `None`: the shapes of the pods in the cluster.
    pub workload: Option<Vec<PodSpec>>,
    /// Kubeconfig file; `None`: KUBECONFIG, ~/.kube/config or in-cluster.
    pub kubeconfig: Option<PathBuf>,
}

/// A bound extender, not yet serving: binding first makes a taken port fail the start clearly.
pub struct Extender {
    listener: gpuops_serve::Listener,
    config: ExtenderConfig,
}

impl Extender {
    /// Binds `address` (kube-scheduler's urlPrefix points here).
    pub fn bind(address: SocketAddr, config: ExtenderConfig) -> Result<Extender, ExtenderError> {
        Ok(Extender {
            listener: server::bind(address)?,
            config,
        })
    }

    /// The address actually bound.
    pub fn local_addr(&self) -> Result<SocketAddr, ExtenderError> {
        Ok(self.listener.local_addr()?)
    }

    /// Connects to the API server, starts the watches and serves until `shutdown` resolves, then
    /// drains the requests in flight.
    pub async fn run(self, shutdown: impl Future<Output = ()>) -> Result<(), ExtenderError> {
        let client = client(self.config.kubeconfig.as_deref()).await?;
        let view = server::watch(client);
        let served = Arc::new(server::Served {
            view,
            engine: protocol::Engine {
                policy: self.config.policy,
                workload: self.config.workload,
            },
            requests: AtomicU64::new(0),
        });
        let (tx, rx) = tokio::sync::watch::channel(false);
        let serving = tokio::spawn(server::serve(self.listener, served, rx));
        shutdown.await;
        let _ = tx.send(true);
        match serving.await {
            Ok(result) => result,
            // The server task panicked or was cancelled: nothing is left to drain.
            Err(e) => {
                tracing::error!(error = %e, "the extender server stopped");
                Ok(())
            }
        }
    }
}

async fn client(kubeconfig: Option<&std::path::Path>) -> Result<kube::Client, ExtenderError> {
    let config = match kubeconfig {
        Some(path) => {
            let kc = kube::config::Kubeconfig::read_from(path).map_err(|source| {
                ExtenderError::Kubeconfig {
                    path: path.to_path_buf(),
                    source,
                }
            })?;
            kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
                .await
                .map_err(|source| ExtenderError::Kubeconfig {
                    path: path.to_path_buf(),
                    source,
                })?
        }
        None => kube::Config::infer()
            .await
            .map_err(ExtenderError::InferConfig)?,
    };
    kube::Client::try_from(config).map_err(|source| ExtenderError::Kube {
        context: "connecting to Kubernetes".to_string(),
        source,
    })
}
