//! `gpuops doctor` (also `kubectl gpu doctor`): reads the cluster once and explains GPU scheduling,
//! driver, MIG, health, OOM and cost problems with evidence and a fix.

use crate::output::{self, Format};
use anyhow::{Context, Result};
use gpuops_doctor::{Options, Snapshot, diagnose, has_critical, report};
use std::io::IsTerminal;
use std::process::ExitCode;
use std::time::{Duration, Instant};

/// Exit code when a critical finding exists (1 stays "the doctor itself failed").
pub const EXIT_CRITICAL: u8 = 2;

/// Explain why GPU pods are pending, crashing or idle, and what to change.
///
/// Reads nodes, pods and events once each (plus, on request, GPU metrics and the logs of crashed
/// GPU containers) and reports findings grouped by severity and category, each with the objects
/// concerned, the evidence (the scheduler's event text, label values, numbers) and a concrete fix.
/// Exits 2 when a finding is critical, 0 otherwise, 1 on errors.
///
/// Examples:
///   gpuops doctor                              the whole cluster (KUBECONFIG or in-cluster)
///   kubectl gpu doctor -n ml                   as a kubectl plugin, one namespace
///   gpuops doctor --node gpu-node-7            one node and the pods on it
///   gpuops doctor --prometheus http://localhost:9090     + XIDs, idle GPUs (1h average)
///   gpuops doctor --prometheus https://prom.example --prometheus-token-file /var/run/token
///   gpuops doctor --metrics-from agents        + the agents' metrics, via the API server
///   gpuops doctor --context prod --gpu-hour-price 2.5     idle GPUs in money too
///   gpuops doctor -o json | jq '.findings[] | select(.severity=="critical")'
#[derive(Debug, clap::Args)]
#[command(verbatim_doc_comment)]
pub struct Args {
    /// Output format.
    #[arg(short, long, value_enum, default_value_t = Format::Table)]
    output: Format,
    /// Only findings about this namespace (its pods, and nodes running them).
    #[arg(short, long)]
    namespace: Option<String>,
    /// Only findings about this node and the pods on it (reads only that node, its pool and its pods).
    #[arg(long)]
    node: Option<String>,
    #[command(flatten)]
    kube: super::flags::KubeArgs,
    /// Price of one GPU-hour for the cost findings (a node's gpuops.io/gpu-hour-price annotation
    /// or label wins).
    #[arg(long, value_name = "PRICE", value_parser = parse_price)]
    gpu_hour_price: Option<f64>,
    #[command(flatten)]
    metrics: super::flags::MetricsArgs,
    /// Read the logs of at most this many crashed/restarted GPU containers (0: none).
    #[arg(long, default_value_t = 20, value_name = "N")]
    logs: usize,
    /// Lines of each log to read.
    #[arg(long, default_value_t = 200, value_name = "N")]
    log_lines: i64,
    /// Colours: auto (on a terminal), always, never.
    #[arg(long, value_enum, default_value_t = Colour::Auto)]
    color: Colour,
    /// A pending pod younger than this with no scheduling failure is just new.
    #[arg(long, default_value = "60s", value_parser = super::parse_duration, value_name = "DURATION")]
    pending_grace: Duration,
    /// A MIG config state pending/rebooting for longer than this is stuck.
    #[arg(long, default_value = "15m", value_parser = super::parse_duration, value_name = "DURATION")]
    mig_stuck_after: Duration,
    /// Allocated GPUs below 5% utilization for this long are reported idle.
    #[arg(long, default_value = "1h", value_parser = super::parse_duration, value_name = "DURATION")]
    idle_after: Duration,
}

fn parse_price(s: &str) -> Result<f64, String> {
    match s.trim().trim_start_matches('$').parse::<f64>() {
        Ok(p) if p.is_finite() && p >= 0.0 => Ok(p),
        _ => Err(format!("{s:?} is not a price like 2.5")),
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Colour {
    Auto,
    Always,
    Never,
}

#[derive(serde::Serialize)]
struct Json<'a> {
    summary: Summary<'a>,
    findings: &'a [gpuops_doctor::Finding],
}

#[derive(serde::Serialize)]
struct Summary<'a> {
    critical: usize,
    warning: usize,
    info: usize,
    nodes: usize,
    pods: usize,
    events: usize,
    metric_samples: usize,
    logs: usize,
    read_ms: u128,
    diagnose_ms: u128,
    sources: &'a [String],
    /// Sources that could not be read (flag or object, and why); the findings use the rest.
    unread: &'a [String],
}

pub fn run(args: Args) -> Result<ExitCode> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let started = Instant::now();
    let (snapshot, from, unread) = runtime.block_on(read(&args))?;
    let read_ms = started.elapsed().as_millis();
    let options = Options {
        namespace: args.namespace.clone(),
        node: args.node.clone(),
        pending_grace: args.pending_grace,
        mig_stuck_after: args.mig_stuck_after,
        idle_after: args.idle_after,
        gpu_hour_price: args.gpu_hour_price,
        ..Options::default()
    };
    let t = Instant::now();
    let findings = diagnose(&snapshot, &options);
    let diagnose_ms = t.elapsed().as_millis();
    let (critical, warning, info) = gpuops_doctor::counts(&findings);
    let summary = Summary {
        critical,
        warning,
        info,
        nodes: snapshot.nodes.len(),
        pods: snapshot.pods.len(),
        events: snapshot.events.len(),
        metric_samples: snapshot.metrics.len(),
        logs: snapshot.logs.len(),
        read_ms,
        diagnose_ms,
        sources: &from,
        unread: &unread,
    };
    match output::structured(
        &Json {
            summary,
            findings: &findings,
        },
        args.output,
    )? {
        Some(text) => print!("{text}"),
        None => {
            let colour = match args.color {
                Colour::Always => true,
                Colour::Never => false,
                Colour::Auto => {
                    std::io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none()
                }
            };
            let gpu_nodes = snapshot
                .nodes
                .iter()
                .filter(|n| {
                    n.status
                        .as_ref()
                        .and_then(|s| s.capacity.as_ref())
                        .is_some_and(|c| c.keys().any(|k| k.starts_with("nvidia.com/")))
                })
                .count();
            let mut header = format!(
                "Read {} nodes ({gpu_nodes} with GPUs), {} pods, {} events",
                snapshot.nodes.len(),
                snapshot.pods.len(),
                snapshot.events.len()
            );
            for f in &from {
                header.push_str(&format!(", {f}"));
            }
            header.push_str(&format!(" in {read_ms} ms; diagnosed in {diagnose_ms} ms"));
            for u in &unread {
                header.push_str(&format!("\ncould not read {u}"));
            }
            if !args.metrics.any() {
                header.push_str("\n(no metrics: add --prometheus URL or --metrics-from agents for XIDs, memory and idle GPUs)");
            }
            print!("{}", report::render(&findings, &header, colour));
        }
    }
    Ok(if has_critical(&findings) {
        ExitCode::from(EXIT_CRITICAL)
    } else {
        ExitCode::SUCCESS
    })
}

async fn read(args: &Args) -> Result<(Snapshot, Vec<String>, Vec<String>)> {
    let client = args.kube.client().await?;
    let read = gpuops_observe::snapshot(
        &client,
        &gpuops_observe::SnapshotOptions {
            namespace: args.namespace.clone(),
            node: args.node.clone(),
            logs: args.logs,
            log_lines: args.log_lines,
            metrics: args.metrics.sources(),
            averaged: Some(args.idle_after),
        },
    )
    .await?;
    Ok(read)
}
