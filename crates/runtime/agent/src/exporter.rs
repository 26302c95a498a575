//! The agent's DCGM-compatible metrics: collected from every new state, served from memory.
//!
//! A scrape reads the last rendered text and appends the scrape counter; it never calls NVML or
//! the kubelet (dcgm-exporter maps pods on every scrape, which is what makes it slow and hang).
//! This task is the only one that waits on the kubelet's PodResources, with a deadline.

use crate::error::AgentError;
use crate::podresources::{PodClient, list_pod_resources};
use crate::state::{NodeState, Probes, now_ms};
use gpuops_metrics::{AgentStats, Assignment, HostnameLabel, NodeView, PodMap};
use gpuops_serve::hyper::{Method, StatusCode};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// How long shutdown waits for scrapes in flight: the whole agent stops within 2 s.
const DRAIN: Duration = Duration::from_secs(1);

/// How long one PodResources `List()` may take before the last good answer is kept.
const POD_RESOURCES_TIMEOUT: Duration = Duration::from_secs(3);

/// What the HTTP side serves: the last render and the node it is for.
pub struct Served {
    body: watch::Receiver<Arc<String>>,
    scrapes: AtomicU64,
    label: HostnameLabel,
    hostname: String,
}

/// One HTTP answer: status, content type, body.
pub struct Reply {
    pub status: u16,
    pub content_type: &'static str,
    pub body: Vec<u8>,
}

/// Collection state: the last pod mapping, self-metrics.
struct Exporter {
    hostname: String,
    label: HostnameLabel,
    pod_socket: Option<PathBuf>,
    /// The last good PodResources answer.
    assignments: Vec<Assignment>,
    /// The last PodResources error, so a lasting problem is logged once.
    pod_error: Option<String>,
    /// The connection to the kubelet, kept between collections; dropped on an error.
    pod_client: Option<PodClient>,
    capacity: u32,
    stats: AgentStats,
    tx: watch::Sender<Arc<String>>,
}

/// Starts the exporter on `state`; the returned [`Served`] answers scrapes.
pub(crate) fn spawn(
    hostname: &str,
    label: HostnameLabel,
    pod_socket: Option<PathBuf>,
    mut state: watch::Receiver<Arc<NodeState>>,
    mut stop: watch::Receiver<bool>,
) -> (Arc<Served>, JoinHandle<()>) {
    let (tx, body) = watch::channel(Arc::new(String::new()));
    let served = Arc::new(Served {
        body,
        scrapes: AtomicU64::new(0),
        label,
        hostname: hostname.to_string(),
    });
    let mut exporter = Exporter {
        hostname: hostname.to_string(),
        label,
        pod_socket,
        assignments: Vec::new(),
        pod_error: None,
        pod_client: None,
        capacity: 0,
        stats: AgentStats::default(),
        tx,
    };
    let task = tokio::spawn(async move {
        let mut last_collection = None;
        loop {
            let now = state.borrow_and_update().clone();
            let collection = now.collection.filter(|c| Some(*c) != last_collection);
            if collection.is_some() {
                last_collection = collection;
                // A kubelet that does not answer holds this for up to POD_RESOURCES_TIMEOUT;
                // shutdown does not wait for it.
                let refreshed =
                    gpuops_kube::runtime::until_stopped(exporter.refresh_pods(), &stop).await;
                if refreshed.is_none() {
                    return;
                }
            }
            exporter.stats.nvml_errors = now.nvml_errors;
            exporter.publish(&now, collection);
            tokio::select! {
                changed = state.changed() => if changed.is_err() { return },
                _ = stop.changed() => return,
            }
        }
    });
    (served, task)
}

impl Exporter {
    /// Asks the kubelet which pods hold which devices; on failure the last answer stays.
    async fn refresh_pods(&mut self) {
        let Some(socket) = self.pod_socket.clone() else {
            return;
        };
        let client = self.pod_client.take();
        let result =
            tokio::time::timeout(POD_RESOURCES_TIMEOUT, list_pod_resources(&socket, client))
                .await
                .unwrap_or(Err(AgentError::PodResourcesTimeout(POD_RESOURCES_TIMEOUT)));
        match result {
            Ok((a, client)) => {
                self.pod_client = Some(client);
                if self.pod_error.take().is_some() {
                    tracing::info!(socket = %socket.display(), "pod attribution: kubelet PodResources at {} answers again", socket.display());
                }
                self.assignments = a;
            }
            Err(e) => {
                self.stats.pod_resources_errors += 1;
                let message = format!(
                    "pod attribution: kubelet PodResources at {}: {e}; keeping the last pod labels",
                    socket.display()
                );
                if self.pod_error.as_deref() != Some(message.as_str()) {
                    tracing::warn!(socket = %socket.display(), error = %e, "{message}");
                    self.pod_error = Some(message);
                }
            }
        }
    }

    /// Renders `state` for the next scrapes. `started` is when this collection began; `None`
    /// re-renders the last collection (after an XID) without counting a collection.
    fn publish(&mut self, state: &NodeState, started: Option<Instant>) {
        let (inv, health) = (&*state.inventory, &state.health);
        self.capacity = self.capacity.max(inv.gpus.len() as u32);
        let pods = PodMap::build(self.assignments.iter().cloned(), inv);
        if started.is_some() {
            let (rss, cpu) = process_usage();
            self.stats.collections += 1;
            self.stats.last_collection_unix = now_ms() as f64 / 1000.0;
            self.stats.resident_memory_bytes = rss;
            self.stats.cpu_seconds = cpu;
        }
        let unhealthy = |gpu: u32, mig: Option<(u32, u32)>| health.xid_for(gpu, mig);
        let mut text = gpuops_metrics::render(&NodeView {
            inventory: inv,
            hostname: &self.hostname,
            hostname_label: self.label,
            pods: &pods,
            xids: &state.xids,
            unhealthy: &unhealthy,
            capacity: self.capacity,
            agent: self.stats,
        });
        // The duration of this collection is served with the next one; rendering is included.
        if let Some(started) = started {
            self.stats.collection_seconds = started.elapsed().as_secs_f64();
        }
        text.push_str(&crate::config_warnings::exposition());
        text.shrink_to_fit();
        let _ = self.tx.send(Arc::new(text));
    }
}

/// Resident memory (bytes) and CPU time (seconds) of this process, from /proc.
fn process_usage() -> (Option<u64>, Option<f64>) {
    let rss = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
                .map(|kib| kib * 1024)
        });
    // Fields 14 and 15 of /proc/self/stat, after the parenthesised command name, in clock ticks
    // (USER_HZ, 100 on every Linux architecture we ship for).
    let cpu = std::fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|s| {
            let rest = &s[s.rfind(')')? + 2..];
            let fields: Vec<&str> = rest.split(' ').collect();
            let utime: u64 = fields.get(11)?.parse().ok()?;
            let stime: u64 = fields.get(12)?.parse().ok()?;
            Some((utime + stime) as f64 / 100.0)
        });
    (rss, cpu)
}

impl Served {
    /// The answer to `GET path` (`head`: the same without a body).
    pub fn respond(&self, method: &Method, path: &str) -> Reply {
        let text = |status, body: &'static [u8]| Reply {
            status,
            content_type: "text/plain",
            body: body.to_vec(),
        };
        if method != Method::GET && method != Method::HEAD {
            return text(405, b"only GET\n");
        }
        match path {
            "/metrics" => {
                let scrapes = self.scrapes.fetch_add(1, Ordering::Relaxed) + 1;
                let body = Arc::clone(&self.body.borrow());
                let tail = gpuops_metrics::render_scrapes(self.label, &self.hostname, scrapes);
                let mut bytes = Vec::with_capacity(body.len() + tail.len());
                bytes.extend_from_slice(body.as_bytes());
                bytes.extend_from_slice(tail.as_bytes());
                Reply {
                    status: 200,
                    content_type: gpuops_metrics::text::CONTENT_TYPE,
                    body: bytes,
                }
            }
            "/" => Reply {
                status: 200,
                content_type: "text/html",
                body: b"<html><body><h1>gpuops</h1><p><a href=\"/metrics\">metrics</a></p></body></html>\n".to_vec(),
            },
            _ => text(404, b"not found; metrics are at /metrics\n"),
        }
    }
}

/// Serves `/metrics` (and the probes) on `listener` until `stop`; liveness follows the snapshot
/// loop, readiness [`crate::state::not_ready`] (NVML, the plugin's registration, a recent
/// collection) once the first collection is rendered.
pub(crate) async fn serve(
    listener: gpuops_serve::Listener,
    served: Arc<Served>,
    probes: Probes,
    state: watch::Receiver<Arc<crate::state::NodeState>>,
    mut stop: watch::Receiver<bool>,
) {
    let watchdog = {
        let (probes, mut stop) = (probes.clone(), stop.clone());
        let mut body = served.body.clone();
        tokio::spawn(async move {
            let first = body.wait_for(|b| !b.is_empty());
            tokio::pin!(first);
            let mut rendered = false;
            let mut last_collection: Option<std::time::Instant> = None;
            // Anything but "ready", so that the first round sets the latch and logs.
            let mut reason = Some(crate::state::NotReady::NoCollection);
            let mut first_round = true;
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            loop {
                tokio::select! {
                    _ = stop.changed() => return,
                    done = &mut first, if !rendered => {
                        rendered = done.is_ok();
                        tick.reset_immediately();
                    }
                    _ = tick.tick() => {
                        // A kubelet restarting the pod is the only cure for a hung driver call.
                        let alive = probes.loop_alive();
                        if alive != probes.serve.is_live() {
                            if !alive {
                                tracing::error!("the GPU snapshot loop is stuck: /healthz fails");
                            }
                            probes.serve.set_live(alive);
                        }
                        if !rendered {
                            continue;
                        }
                        let (nvml_loaded, collection) = {
                            let s = state.borrow();
                            (s.nvml_loaded, s.collection)
                        };
                        // An XID or a failed read publishes a state without a collection: the
                        // last successful one still counts until it is stale.
                        if let Some(c) = collection
                            && last_collection.is_none_or(|l| c > l)
                        {
                            last_collection = Some(c);
                        }
                        let why = crate::state::not_ready(&crate::state::ReadyInputs {
                            nvml_loaded,
                            plugin_registered: probes
                                .registered
                                .as_ref()
                                .map(|r| r.load(Ordering::Relaxed)),
                            since_collection: last_collection.map(|c| c.elapsed()),
                            collection_stale_after: probes.collection_stale_after,
                        });
                        if first_round || !crate::state::NotReady::same_kind(why, reason) {
                            match &why {
                                None => tracing::info!("ready: /readyz answers 200"),
                                Some(w) => tracing::warn!(reason = %w, "not ready: {w}; /readyz answers 503"),
                            }
                            probes.serve.set_ready(why.is_none());
                            first_round = false;
                        }
                        reason = why;
                    }
                }
            }
        })
    };
    // The first scrape gets the first collection: connections wait in the socket's backlog
    // until it is rendered (pod labels included, at most the PodResources timeout).
    let mut body = served.body.clone();
    tokio::select! {
        _ = stop.changed() => {
            watchdog.abort();
            return;
        }
        _ = body.wait_for(|b| !b.is_empty()) => {}
    }
    let options = gpuops_serve::Options {
        drain_timeout: DRAIN,
        ..gpuops_serve::Options::default()
    };
    let result = gpuops_serve::serve(
        listener,
        Arc::clone(&probes.serve),
        options,
        move |req| {
            let reply = served.respond(req.method(), req.uri().path());
            let status =
                StatusCode::from_u16(reply.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            let response = gpuops_serve::reply(status, reply.content_type, reply.body);
            async move { response }
        },
        stop.clone(),
    )
    .await;
    if let Err(e) = result {
        tracing::error!(error = %e, "metrics server: {e}");
    }
    let _ = stop.changed().await;
    watchdog.abort();
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::hung::Hung;

    fn state() -> NodeState {
        NodeState {
            inventory: Arc::new(gpuops_inventory::Inventory::default()),
            health: gpuops_resources::health::HealthTracker::default(),
            xids: gpuops_metrics::XidCounters::default(),
            collection: Some(Instant::now()),
            nvml_errors: 0,
            nvml_loaded: true,
        }
    }

    #[tokio::test]
    async fn a_kubelet_that_never_answers_does_not_hold_shutdown_up() {
        let kubelet = Hung::unix();
        let (_state_tx, state_rx) = watch::channel(Arc::new(state()));
        let (stop_tx, stop_rx) = watch::channel(false);
        let (_served, task) = spawn(
            "node-1",
            HostnameLabel::Lower,
            Some(kubelet.socket()),
            state_rx,
            stop_rx,
        );
        // The collection is now waiting on PodResources, which will not answer.
        kubelet.accepted().await;
        let asked = Instant::now();
        stop_tx.send(true).unwrap();
        // Without the stop signal the task would end only at POD_RESOURCES_TIMEOUT (3 s).
        tokio::time::timeout(POD_RESOURCES_TIMEOUT / 3, task)
            .await
            .expect("the exporter stops in the middle of a hung PodResources call")
            .unwrap();
        assert!(asked.elapsed() < POD_RESOURCES_TIMEOUT / 3);
    }
}
