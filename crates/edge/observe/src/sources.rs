//! Where metric samples come from: a Prometheus URL, agents' `/metrics` URLs, or the agent pods
//! through the API server's pod proxy.

use crate::error::{ObserveError, chain};
use crate::http::{self, Http, HttpOptions};
use gpuops_doctor::Sample;
use gpuops_doctor::metrics::{parse_exposition, parse_prometheus};
use k8s_openapi::api::core::v1::Pod;
use kube::api::ListParams;
use kube::{Api, Client};
use std::time::Duration;

/// The series the doctor and `top` read.
const SERIES: &str = "{__name__=~\"DCGM_FI_DEV_GPU_UTIL|DCGM_FI_DEV_FB_USED|DCGM_FI_DEV_FB_FREE|DCGM_FI_DEV_FB_RESERVED|gpuops_device_allocated|gpuops_device_healthy|gpuops_xid_errors_total|gpuops_node_gpus|gpuops_node_gpus_healthy\"}";

type Result<T, E = ObserveError> = std::result::Result<T, E>;

/// Where to read metrics from, as `doctor`'s and `top`'s flags name it.
#[derive(Debug, Clone, Default)]
pub struct MetricSources {
    /// Prometheus base URL (--prometheus).
    pub prometheus: Option<String>,
    /// Credentials and TLS for the URLs.
    pub http: HttpOptions,
    /// Agents' metrics URLs (--metrics).
    pub metrics: Vec<String>,
    /// Scrape the agent pods through the API server's pod proxy (--metrics-from agents).
    pub from_agents: bool,
    /// Label selector of the agent pods.
    pub agent_selector: String,
    /// The agents' metrics port.
    pub agent_port: u16,
}

/// Samples, plus the window utilization is averaged over and a description of where they came from.
pub struct Collected {
    pub samples: Vec<Sample>,
    pub utilization_window: Option<Duration>,
    pub from: Vec<String>,
    /// Sources that could not be read: the flag, the URL and why (the rest is still used).
    pub unread: Vec<String>,
}

/// Reads what the flags name. A source that fails is named in `unread`, and the others are still
/// read. `averaged` also asks Prometheus for the last hour's mean utilization.
pub async fn collect(
    args: &MetricSources,
    client: Option<&Client>,
    averaged: Option<Duration>,
) -> Result<Collected> {
    let mut out = Collected {
        samples: Vec::new(),
        utilization_window: None,
        from: Vec::new(),
        unread: Vec::new(),
    };
    if let Some(base) = &args.prometheus {
        let base = base.trim_end_matches('/');
        let read = match Http::new(&args.http, true) {
            Ok(h) => prometheus(&h, base, averaged).await,
            Err(e) => Err(e),
        };
        match read {
            Ok((samples, window)) => {
                out.from
                    .push(format!("{} samples from Prometheus", samples.len()));
                out.samples.extend(samples);
                out.utilization_window = window;
            }
            Err(e) => out
                .unread
                .push(format!("--prometheus {base}: {}", chain(&e))),
        }
    }
    if !args.metrics.is_empty() {
        let h = Http::new(&args.http, false)?;
        for url in &args.metrics {
            let read = h.get(url).await.and_then(|text| {
                parse_exposition(&text).map_err(|source| ObserveError::Parse {
                    what: format!("parsing {url}"),
                    source,
                })
            });
            match read {
                Ok(samples) => {
                    out.from
                        .push(format!("{} samples from {url}", samples.len()));
                    out.samples.extend(samples);
                }
                Err(e) => out.unread.push(format!("--metrics {url}: {}", chain(&e))),
            }
        }
    }
    if args.from_agents {
        match client {
            Some(client) => match agents(client, &args.agent_selector, args.agent_port).await {
                Ok((samples, failed)) => {
                    out.from
                        .push(format!("{} samples from agent pods", samples.len()));
                    out.samples.extend(samples);
                    out.unread.extend(failed);
                }
                Err(e) => out
                    .unread
                    .push(format!("--metrics-from agents: {}", chain(&e))),
            },
            None => out
                .unread
                .push("--metrics-from agents: needs the cluster".to_string()),
        }
    }
    Ok(out)
}

async fn query(h: &Http, base: &str, q: &str, default_name: &str) -> Result<Vec<Sample>> {
    let url = format!("{base}/api/v1/query?query={}", http::encode(q));
    let body = h.get(&url).await?;
    parse_prometheus(&body, default_name).map_err(|source| ObserveError::Parse {
        what: format!("Prometheus query {q}"),
        source,
    })
}

async fn prometheus(
    h: &Http,
    base: &str,
    averaged: Option<Duration>,
) -> Result<(Vec<Sample>, Option<Duration>)> {
    let mut samples = query(h, base, SERIES, "unknown").await?;
    let mut window = None;
    if let Some(w) = averaged {
        let minutes = (w.as_secs() / 60).max(1);
        let avg = query(
            h,
            base,
            &format!("avg_over_time(DCGM_FI_DEV_GPU_UTIL{{pod!=\"\"}}[{minutes}m])"),
            "DCGM_FI_DEV_GPU_UTIL",
        )
        .await?;
        if !avg.is_empty() {
            // The averages replace the instant utilization of pods' GPUs.
            samples.retain(|s| !(s.name == "DCGM_FI_DEV_GPU_UTIL" && s.label("pod").is_some()));
            samples.extend(avg);
            window = Some(w);
        }
    }
    Ok((samples, window))
}

/// The agents' samples, and the agents that could not be scraped.
async fn agents(client: &Client, selector: &str, port: u16) -> Result<(Vec<Sample>, Vec<String>)> {
    let pods: Api<Pod> = Api::all(client.clone());
    let list = pods
        .list(&ListParams::default().labels(selector))
        .await
        .map_err(|source| ObserveError::Kube {
            what: format!("listing agent pods ({selector})"),
            source,
        })?;
    let mut out = Vec::new();
    let mut failed = Vec::new();
    for p in list.items {
        let (Some(ns), Some(name)) = (p.metadata.namespace.as_deref(), p.metadata.name.as_deref())
        else {
            continue;
        };
        let path = format!("/api/v1/namespaces/{ns}/pods/{name}:{port}/proxy/metrics");
        let req = ::http::Request::get(&path)
            .body(Vec::new())
            .map_err(|source| ObserveError::Request {
                what: "building the proxy request".into(),
                source,
            })?;
        match client.request_text(req).await {
            Ok(text) => match parse_exposition(&text) {
                Ok(s) => out.extend(s),
                Err(e) => failed.push(format!("--metrics-from agents: pod {ns}/{name}: {e}")),
            },
            Err(e) => failed.push(format!("--metrics-from agents: pod {ns}/{name}: {e}")),
        }
    }
    Ok((out, failed))
}
