//! The extender's HTTP server and its view of the cluster (a watch of nodes and unfinished pods).

use crate::ExtenderError;
use crate::protocol::{self, Engine, ExtenderArgs, FilterResult};
use gpuops_kube::runtime::{reflect, until_stopped};
use gpuops_serve::bytes::Bytes;
use gpuops_serve::http_body_util::{BodyExt, Full, Limited};
use gpuops_serve::hyper::{self, Method, Request, Response, StatusCode};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Api;
use kube::runtime::reflector::Store;
use kube::runtime::watcher;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::sync::watch;

/// Largest request body accepted (a `Nodes` list of a few thousand nodes fits).
const MAX_BODY: usize = 256 * 1024 * 1024;
/// How long a request waits for the first list of nodes and pods.
const SYNC_WAIT: Duration = Duration::from_secs(10);

/// Where the cluster state comes from.
pub struct View {
    nodes: Store<Node>,
    pods: Store<Pod>,
}

/// What the handlers share.
pub struct Served {
    pub view: View,
    pub engine: Engine,
    pub requests: AtomicU64,
}

/// Starts watching nodes and unfinished pods; the watches retry with backoff for ever.
pub fn watch(client: kube::Client) -> View {
    let nodes = reflect(
        Api::<Node>::all(client.clone()),
        (),
        watcher::Config::default(),
        "nodes",
        || {},
    );
    // Finished pods hold no GPU: leave them out of the cache.
    let pods = reflect(
        Api::<Pod>::all(client),
        (),
        watcher::Config::default().fields("status.phase!=Succeeded,status.phase!=Failed"),
        "pods",
        || {},
    );
    View { nodes, pods }
}

impl View {
    async fn synced(&self) -> bool {
        let wait = async {
            let _ = self.nodes.wait_until_ready().await;
            let _ = self.pods.wait_until_ready().await;
        };
        tokio::time::timeout(SYNC_WAIT, wait).await.is_ok()
    }
}

/// Binds the address now, so a taken port fails the start with a clear message.
pub fn bind(address: SocketAddr) -> Result<gpuops_serve::Listener, ExtenderError> {
    Ok(gpuops_serve::bind(
        address,
        "the scheduler",
        "is another extender using the port? choose another with --address",
    )?)
}

/// Serves the extender verbs until `shutdown` turns true; `/readyz` answers 200 once the first
/// lists of nodes and pods arrived (until then kube-scheduler's `ignorable` skips us).
pub async fn serve(
    listener: gpuops_serve::Listener,
    served: Arc<Served>,
    shutdown: watch::Receiver<bool>,
) -> Result<(), ExtenderError> {
    let probes = gpuops_serve::Probes::new();
    {
        let (served, probes, stop) = (Arc::clone(&served), Arc::clone(&probes), shutdown.clone());
        tokio::spawn(async move {
            let ready = async {
                served.view.nodes.wait_until_ready().await.is_ok()
                    && served.view.pods.wait_until_ready().await.is_ok()
            };
            // Waiting on the first lists ends with shutdown: never ready then.
            if until_stopped(ready, &stop).await == Some(true) {
                probes.set_ready(true);
            }
        });
    }
    let handler_probes = Arc::clone(&probes);
    let handler_stop = shutdown.clone();
    gpuops_serve::serve(
        listener,
        probes,
        gpuops_serve::Options::default(),
        move |req| {
            let served = Arc::clone(&served);
            let probes = Arc::clone(&handler_probes);
            let stop = handler_stop.clone();
            async move { respond(&served, &probes, &stop, req).await }
        },
        shutdown,
    )
    .await?;
    Ok(())
}

use gpuops_serve::reply;

/// The extender verb a path names: its last segment (`/filter`, `/gpuops/filter`, ...).
fn verb(path: &str) -> &str {
    path.trim_end_matches('/').rsplit('/').next().unwrap_or("")
}

async fn respond(
    served: &Served,
    probes: &gpuops_serve::Probes,
    stop: &watch::Receiver<bool>,
    req: Request<hyper::body::Incoming>,
) -> Response<Full<Bytes>> {
    let path = req.uri().path().to_string();
    let verb = verb(&path).to_string();
    match (req.method(), verb.as_str()) {
        // Under a urlPrefix (`/gpuops/healthz`); the bare paths are answered by the server.
        (&Method::GET, "healthz") => return probes.liveness(),
        (&Method::GET, "readyz") => return probes.readiness(),
        (&Method::POST, "filter" | "prioritize") => {}
        (_, "filter" | "prioritize") => {
            return reply(
                StatusCode::METHOD_NOT_ALLOWED,
                "text/plain",
                format!("{verb}: only POST (kube-scheduler sends ExtenderArgs as JSON)\n"),
            );
        }
        _ => {
            return reply(
                StatusCode::NOT_FOUND,
                "text/plain",
                format!(
                    "no verb {path:?}; this scheduler extender serves POST /filter and POST /prioritize\n"
                ),
            );
        }
    }
    served.requests.fetch_add(1, Ordering::Relaxed);
    let body = match Limited::new(req.into_body(), MAX_BODY).collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => {
            return reply(
                StatusCode::BAD_REQUEST,
                "text/plain",
                format!("{verb}: cannot read the request body: {e}\n"),
            );
        }
    };
    // Shutting down: answer at once as not synced instead of holding the exit up to SYNC_WAIT.
    let synced = until_stopped(served.view.synced(), stop)
        .await
        .unwrap_or(false);
    let nodes = served.view.nodes.state();
    let pods = served.view.pods.state();
    let nodes: Vec<&Node> = nodes.iter().map(AsRef::as_ref).collect();
    let pods: Vec<&Pod> = pods.iter().map(AsRef::as_ref).collect();
    let (status, text) = handle(&verb, &body, synced, &nodes, &pods, &served.engine);
    reply(status, "application/json", text)
}

/// Answers one verb: pure, for tests. Bad JSON is a 400 whose message names line and column;
/// everything else is a 200 with the protocol's answer (filter errors in `Error`).
pub fn handle(
    verb: &str,
    body: &[u8],
    synced: bool,
    nodes: &[&Node],
    pods: &[&Pod],
    engine: &Engine,
) -> (StatusCode, String) {
    let args: ExtenderArgs = match serde_json::from_slice(body) {
        Ok(a) => a,
        Err(e) => {
            let message = format!("{verb}: the body is not ExtenderArgs JSON: {e}");
            tracing::warn!("{message}");
            let body = if verb == "filter" {
                json(&FilterResult::error(message))
            } else {
                json(&serde_json::json!({ "Error": message }))
            };
            return (StatusCode::BAD_REQUEST, body);
        }
    };
    let wants_gpu = args
        .pod
        .as_ref()
        .is_some_and(|p| gpuops_kubemodel::pod_ask(p).is_gpu());
    if verb == "filter" {
        if !synced && wants_gpu {
            return (
                StatusCode::OK,
                json(&FilterResult::error(
                    "gpuops scheduler-extender has not listed the cluster's nodes and pods yet (check its RBAC: get/list/watch on nodes and pods)",
                )),
            );
        }
        let r = protocol::filter(&args, nodes, pods, engine);
        if !r.error.is_empty() {
            tracing::warn!("filter: {}", r.error);
        }
        return (StatusCode::OK, json(&r));
    }
    if !synced && wants_gpu {
        tracing::warn!("prioritize: cluster not listed yet; scoring every node 0");
    }
    let (nodes, pods) = if synced {
        (nodes, pods)
    } else {
        (&[][..], &[][..])
    };
    match protocol::prioritize(&args, nodes, pods, engine) {
        Ok(list) => (StatusCode::OK, json(&list)),
        Err(e) => {
            tracing::warn!("prioritize: {e}");
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                json(&serde_json::json!({ "Error": e.to_string() })),
            )
        }
    }
}

fn json<T: serde::Serialize>(value: &T) -> String {
    serde_json::to_string(value).unwrap_or_else(|e| format!("{{\"Error\":\"{e}\"}}"))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;
    use gpuops_kubemodel::GPU;
    use gpuops_kubemodel::testkit::{node, pod};
    use gpuops_packing::PolicyKind;

    fn engine() -> Engine {
        Engine {
            policy: PolicyKind::Ours,
            workload: None,
        }
    }

    #[test]
    fn verbs_from_paths() {
        assert_eq!(verb("/filter"), "filter");
        assert_eq!(verb("/gpuops/prioritize/"), "prioritize");
        assert_eq!(verb("/"), "");
    }

    #[test]
    fn bad_json_is_a_400_naming_the_position() {
        let (s, body) = handle("filter", b"{\"Pod\": [}", true, &[], &[], &engine());
        assert_eq!(s, StatusCode::BAD_REQUEST);
        let r: FilterResult = serde_json::from_str(&body).unwrap();
        assert!(r.error.contains("line 1 column"), "{}", r.error);
        let (s, body) = handle("prioritize", b"", true, &[], &[], &engine());
        assert_eq!(s, StatusCode::BAD_REQUEST);
        assert!(body.contains("EOF while parsing"), "{body}");
    }

    #[test]
    fn end_to_end_json() {
        let a = node("a", 2, 1, false);
        let p = pod("p", None, GPU, 1, None);
        let body = serde_json::json!({"Pod": p, "NodeNames": ["a"]}).to_string();
        let (s, out) = handle("filter", body.as_bytes(), true, &[&a], &[], &engine());
        assert_eq!(s, StatusCode::OK);
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(&out).unwrap()["NodeNames"],
            serde_json::json!(["a"])
        );
        let (_, out) = handle("prioritize", body.as_bytes(), true, &[&a], &[], &engine());
        assert_eq!(out, r#"[{"Host":"a","Score":10}]"#);
        // Not synced: a GPU pod's filter is an error the scheduler shows; prioritize is neutral.
        let (_, out) = handle("filter", body.as_bytes(), false, &[&a], &[], &engine());
        assert!(out.contains("has not listed"), "{out}");
    }
}
