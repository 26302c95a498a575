//! `gpuops doctor` (also `kubectl gpu doctor`): reads the cluster once and explains GPU scheduling,
//! driver, MIG, health, OOM and cost problems with evidence and a fix.

use crate::output::{self, Format};
use anyhow::{Context, Result};
use gpuops_doctor::{Options, Snapshot, diagnose, has_critical, render};
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
    let stats = render::ReadStats {
        read_ms,
        diagnose_ms,
        sources: from,
        unread,
        metrics_given: args.metrics.any(),
    };
    let text =
        match output::structured(&render::document(&snapshot, &findings, &stats), args.output)? {
            Some(text) => text,
            None => {
                let colour = match args.color {
                    Colour::Always => true,
                    Colour::Never => false,
                    Colour::Auto => {
                        std::io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none()
                    }
                };
                render::text(&snapshot, &findings, &stats, colour)
            }
        };
    print!("{text}");
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
