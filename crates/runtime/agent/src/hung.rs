//! Test support: a kubelet socket and an API server that accept connections and never answer,
//! so the agent's tasks can be shown to give way to shutdown in the middle of a hung call.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::sync::Arc;
use tokio::sync::Notify;
use tokio::task::JoinHandle;

/// Accepts and keeps every connection, answering nothing; [`Hung::accepted`] returns once the
/// first one arrived (the caller is then inside its call).
pub(crate) struct Hung {
    accepted: Arc<Notify>,
    task: JoinHandle<()>,
    pub(crate) dir: tempfile::TempDir,
}

impl Hung {
    /// A kubelet gRPC socket (`kubelet.sock` or the PodResources socket) at [`Hung::socket`].
    pub(crate) fn unix() -> Hung {
        let dir = tempfile::tempdir().unwrap();
        let listener = tokio::net::UnixListener::bind(dir.path().join("hung.sock")).unwrap();
        let accepted = Arc::new(Notify::new());
        let signal = Arc::clone(&accepted);
        let task = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((stream, _)) = listener.accept().await {
                held.push(stream);
                signal.notify_one();
            }
        });
        Hung {
            accepted,
            task,
            dir,
        }
    }

    /// An API server on loopback, and a client whose every request goes to it (through a
    /// kubeconfig, as the agent's own client is built).
    pub(crate) async fn api_server() -> (Hung, gpuops_kube::kube::Client) {
        let dir = tempfile::tempdir().unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let accepted = Arc::new(Notify::new());
        let signal = Arc::clone(&accepted);
        let task = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((stream, _)) = listener.accept().await {
                held.push(stream);
                signal.notify_one();
            }
        });
        let kubeconfig = dir.path().join("kubeconfig");
        std::fs::write(
            &kubeconfig,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: http://{address}\ncontexts:\n- name: here\n  context:\n    cluster: c\n    user: u\nusers:\n- name: u\n  user: {{}}\ncurrent-context: here\n"
            ),
        )
        .unwrap();
        let client = gpuops_kube::ClientOptions {
            kubeconfig: Some(kubeconfig),
            // Far longer than any test waits: only the stop signal can end a call.
            request_timeout: std::time::Duration::from_secs(300),
            ..gpuops_kube::ClientOptions::default()
        }
        .client()
        .await
        .unwrap();
        (
            Hung {
                accepted,
                task,
                dir,
            },
            client,
        )
    }

    pub(crate) fn socket(&self) -> PathBuf {
        self.dir.path().join("hung.sock")
    }

    /// Returns once a connection was accepted (at once if one already was).
    pub(crate) async fn accepted(&self) {
        self.accepted.notified().await;
    }
}

impl Drop for Hung {
    fn drop(&mut self) {
        self.task.abort();
    }
}
