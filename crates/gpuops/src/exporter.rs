//! The agent's DCGM-compatible metrics: collected on the agent's interval, served from memory.
//!
//! A scrape reads the last rendered text and appends the scrape counter; it never calls NVML or
//! the kubelet (dcgm-exporter maps pods on every scrape, which is what makes it slow and hang).

use anyhow::{Context, Result};
use bytes::Bytes;
use gpuops_inventory::Inventory;
use gpuops_kubelet_api::podresources::v1::ListPodResourcesRequest;
use gpuops_kubelet_api::podresources::v1::pod_resources_lister_client::PodResourcesListerClient;
use gpuops_metrics::{AgentStats, Assignment, HostnameLabel, NodeView, PodMap, XidCounters};
use gpuops_resources::health::HealthTracker;
use http_body_util::Full;
use hyper::{Method, Request, Response, StatusCode};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// How long one PodResources `List()` may take before the last good answer is kept.
const POD_RESOURCES_TIMEOUT: Duration = Duration::from_secs(3);

/// What the HTTP side serves: the last render and the node it is for.
pub struct Served {
    body: watch::Receiver<Arc<String>>,
    scrapes: AtomicU64,
    label: HostnameLabel,
    hostname: String,
}

/// Collection state: XID counts, the last pod mapping, self-metrics.
pub struct Exporter {
    hostname: String,
    label: HostnameLabel,
    pod_socket: Option<PathBuf>,
    /// The last good PodResources answer.
    assignments: Vec<Assignment>,
    /// The last PodResources error, so a lasting problem is logged once.
    pod_error: Option<String>,
    /// The connection to the kubelet, kept between collections; dropped on an error.
    pod_client: Option<PodClient>,
    xids: XidCounters,
    capacity: u32,
    stats: AgentStats,
    tx: watch::Sender<Arc<String>>,
}

impl Exporter {
    pub fn new(
        hostname: &str,
        label: HostnameLabel,
        pod_socket: Option<PathBuf>,
    ) -> (Exporter, Arc<Served>) {
        let (tx, body) = watch::channel(Arc::new(String::new()));
        let served = Arc::new(Served {
            body,
            scrapes: AtomicU64::new(0),
            label,
            hostname: hostname.to_string(),
        });
        let exporter = Exporter {
            hostname: hostname.to_string(),
            label,
            pod_socket,
            assignments: Vec::new(),
            pod_error: None,
            pod_client: None,
            xids: XidCounters::default(),
            capacity: 0,
            stats: AgentStats::default(),
            tx,
        };
        (exporter, served)
    }

    pub fn record_xid(&mut self, gpu: u32, gi: Option<u32>, xid: u64) {
        self.xids.record(gpu, gi, xid);
    }

    pub fn nvml_error(&mut self) {
        self.stats.nvml_errors += 1;
    }

    /// Asks the kubelet which pods hold which devices; on failure the last answer stays.
    pub async fn refresh_pods(&mut self) {
        let Some(socket) = self.pod_socket.clone() else {
            return;
        };
        let client = self.pod_client.take();
        let result =
            tokio::time::timeout(POD_RESOURCES_TIMEOUT, list_pod_resources(&socket, client))
                .await
                .unwrap_or_else(|_| {
                    Err(anyhow::anyhow!(
                        "no answer within {POD_RESOURCES_TIMEOUT:?}"
                    ))
                });
        match result {
            Ok((a, client)) => {
                self.pod_client = Some(client);
                if self.pod_error.take().is_some() {
                    println!(
                        "{} pod attribution: kubelet PodResources at {} answers again",
                        crate::cmd::agent::clock(),
                        socket.display()
                    );
                }
                self.assignments = a;
            }
            Err(e) => {
                self.stats.pod_resources_errors += 1;
                let message = format!(
                    "pod attribution: kubelet PodResources at {}: {e:#}; keeping the last pod labels",
                    socket.display()
                );
                if self.pod_error.as_deref() != Some(message.as_str()) {
                    eprintln!("{} {message}", crate::cmd::agent::clock());
                    self.pod_error = Some(message);
                }
            }
        }
    }

    /// Renders `inv` for the next scrapes. `started` is when this collection began; `None`
    /// re-renders the last collection (after an XID) without counting a collection.
    pub fn publish(&mut self, inv: &Inventory, health: &HealthTracker, started: Option<Instant>) {
        self.capacity = self.capacity.max(inv.gpus.len() as u32);
        let pods = PodMap::build(self.assignments.iter().cloned(), inv);
        if started.is_some() {
            let (rss, cpu) = process_usage();
            self.stats.collections += 1;
            self.stats.last_collection_unix = crate::gpu_source::now_ms() as f64 / 1000.0;
            self.stats.resident_memory_bytes = rss;
            self.stats.cpu_seconds = cpu;
        }
        let unhealthy = |gpu: u32, mig: Option<(u32, u32)>| health.xid_for(gpu, mig);
        let mut text = gpuops_metrics::render(&NodeView {
            inventory: inv,
            hostname: &self.hostname,
            hostname_label: self.label,
            pods: &pods,
            xids: &self.xids,
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

pub(crate) type PodClient = PodResourcesListerClient<tonic::transport::Channel>;

/// PodResources `List()` as assignments, on `client` or a new connection; returns the client for
/// the next collection.
pub(crate) async fn list_pod_resources(
    socket: &std::path::Path,
    client: Option<PodClient>,
) -> Result<(Vec<Assignment>, PodClient)> {
    let mut client = match client {
        Some(c) => c,
        None => PodResourcesListerClient::new(
            gpuops_kubelet_api::unix::connect(socket)
                .await
                .context("cannot connect")?,
        ),
    };
    let response = client
        .list(ListPodResourcesRequest {})
        .await
        .map_err(|s| anyhow::anyhow!("List failed: {}", s.message()))?
        .into_inner();
    let mut out = Vec::new();
    for pod in response.pod_resources {
        for container in pod.containers {
            for devices in container.devices {
                out.push(Assignment {
                    namespace: pod.namespace.clone(),
                    pod: pod.name.clone(),
                    container: container.name.clone(),
                    resource: devices.resource_name,
                    device_ids: devices.device_ids,
                });
            }
        }
    }
    Ok((out, client))
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

/// Binds the metrics address now, so a taken port fails the start with a clear message.
pub fn bind(address: SocketAddr) -> Result<gpuops_serve::Listener> {
    Ok(gpuops_serve::bind(
        address,
        "metrics",
        "is another exporter, e.g. NVIDIA's dcgm-exporter, using the port? choose another with --metrics-address",
    )?)
}

/// Serves `/metrics` (and `/healthz`, `/readyz`) until `shutdown` turns true; ready once the first
/// collection is published.
pub async fn serve(
    listener: gpuops_serve::Listener,
    served: Arc<Served>,
    shutdown: watch::Receiver<bool>,
) -> Result<()> {
    let probes = gpuops_serve::Probes::new();
    let mut body = served.body.clone();
    let latch = Arc::clone(&probes);
    tokio::spawn(async move {
        if body.wait_for(|b| !b.is_empty()).await.is_ok() {
            latch.set_ready(true);
        }
    });
    gpuops_serve::serve(
        listener,
        probes,
        gpuops_serve::Options::default(),
        move |req| {
            let reply = respond(&served, &req);
            async move { reply }
        },
        shutdown,
    )
    .await?;
    Ok(())
}

fn respond<B>(served: &Served, req: &Request<B>) -> Response<Full<Bytes>> {
    use gpuops_serve::reply;
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return reply(
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain",
            Bytes::from_static(b"only GET\n"),
        );
    }
    match req.uri().path() {
        "/metrics" => {
            let scrapes = served.scrapes.fetch_add(1, Ordering::Relaxed) + 1;
            let body = Arc::clone(&served.body.borrow());
            let tail = gpuops_metrics::render_scrapes(served.label, &served.hostname, scrapes);
            let mut bytes = Vec::with_capacity(body.len() + tail.len());
            bytes.extend_from_slice(body.as_bytes());
            bytes.extend_from_slice(tail.as_bytes());
            reply(
                StatusCode::OK,
                gpuops_metrics::text::CONTENT_TYPE,
                Bytes::from(bytes),
            )
        }
        "/" => reply(
            StatusCode::OK,
            "text/html",
            Bytes::from_static(
                b"<html><body><h1>gpuops</h1><p><a href=\"/metrics\">metrics</a></p></body></html>\n",
            ),
        ),
        _ => reply(
            StatusCode::NOT_FOUND,
            "text/plain",
            Bytes::from_static(b"not found; metrics are at /metrics\n"),
        ),
    }
}
