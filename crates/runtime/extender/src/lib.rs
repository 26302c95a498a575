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
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

/// Failures of the extender service.
#[derive(Debug, thiserror::Error)]
pub enum ExtenderError {
    #[error(transparent)]
    Serve(#[from] gpuops_serve::ServeError),
    /// The Kubernetes client could not be built; `flag` names the flag to fix.
    #[error("{flag}")]
    Client {
        flag: String,
        #[source]
        source: gpuops_kube::KubeError,
    },
    // A scheduler request the extender cannot answer; the text goes back to the scheduler.
    #[error("the request has no Pod (expected ExtenderArgs {{Pod, Nodes|NodeNames}})")]
    NoPod,
    #[error("the request has neither Nodes nor NodeNames")]
    NoCandidates,
    #[error("Nodes.items[{index}] has no metadata.name")]
    UnnamedNode { index: usize },
    /// The nodes of a request cannot be modelled.
    #[error("{source:#}")]
    Model {
        #[source]
        source: gpuops_kubemodel::ModelError,
    },
}

/// What the extender serves with.
#[derive(Debug, Clone)]
pub struct ExtenderConfig {
    /// Scoring policy.
    pub policy: PolicyKind,
    /// Typical pod shapes for FGD and ours; `None`: the shapes of the pods in the cluster.
    pub workload: Option<Vec<PodSpec>>,
    /// Which cluster to watch (kubeconfig and context), through the shared client builder.
    pub client: gpuops_kube::ClientOptions,
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
        let client = client(&self.config.client).await?;
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

async fn client(options: &gpuops_kube::ClientOptions) -> Result<kube::Client, ExtenderError> {
    let flag = match (&options.kubeconfig, &options.context) {
        (Some(path), Some(ctx)) => format!("--kubeconfig {} --context {ctx}", path.display()),
        (Some(path), None) => format!("--kubeconfig {}", path.display()),
        (None, Some(ctx)) => format!("--context {ctx}"),
        (None, None) => "connecting to Kubernetes (KUBECONFIG, ~/.kube/config or in-cluster; or pass --kubeconfig)".to_string(),
    };
    options
        .client()
        .await
        .map_err(|source| ExtenderError::Client { flag, source })
}
