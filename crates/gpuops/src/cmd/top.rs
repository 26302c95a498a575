//! `gpuops top nodes|gpus|pods`: allocation and live use per node, GPU, MIG instance and pod, from
//! the agents' metrics or Prometheus.

use super::flags::{KubeArgs, MetricsArgs, MetricsFrom};
use crate::output::{self, Format};
use anyhow::{Context, Result, bail};
use gpuops_doctor::top;
use std::process::ExitCode;

/// Show GPU allocation and live use (utilization, memory) per node, GPU/MIG instance or pod.
///
/// Examples:
///   gpuops top nodes --prometheus http://localhost:9090
///   gpuops top gpus  --metrics http://gpu-node-1:9400/metrics
///   kubectl gpu top pods --metrics-from agents        (through the API server)
///   gpuops top pods --prometheus http://prom:9090 -n ml -o json
///   kubectl gpu top nodes --metrics-from agents --context prod
#[derive(Debug, clap::Args)]
#[command(verbatim_doc_comment)]
pub struct Args {
    /// What to list.
    #[arg(value_enum)]
    what: What,
    #[command(flatten)]
    metrics: MetricsArgs,
    #[command(flatten)]
    kube: KubeArgs,
    /// `top pods`: only this namespace's pods.
    #[arg(short, long, value_name = "NAMESPACE")]
    namespace: Option<String>,
    /// `top pods`: every namespace (the default; kubectl's spelling).
    #[arg(short = 'A', long, conflicts_with = "namespace")]
    all_namespaces: bool,
    /// Output format.
    #[arg(short, long, value_enum, default_value_t = Format::Table)]
    output: Format,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum What {
    /// One row per node.
    Nodes,
    /// One row per GPU and MIG instance.
    Gpus,
    /// One row per container holding GPUs.
    Pods,
}

fn opt(v: Option<f64>, unit: &str) -> String {
    v.map_or_else(|| "-".into(), |v| format!("{v:.0}{unit}"))
}

fn mem(used: Option<f64>, total: Option<f64>) -> String {
    match (used, total) {
        (Some(u), Some(t)) if t > 0.0 => format!("{u:.0}/{t:.0} MiB ({:.0}%)", 100.0 * u / t),
        (Some(u), _) => format!("{u:.0} MiB"),
        _ => "-".into(),
    }
}

pub fn run(args: Args) -> Result<ExitCode> {
    if !args.metrics.any() {
        bail!(
            "say where the metrics are: --prometheus URL, --metrics URL (an agent's :9400/metrics) or --metrics-from agents"
        );
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let collected = runtime.block_on(async {
        let client = if args.metrics.metrics_from == Some(MetricsFrom::Agents) {
            Some(args.kube.client().await?)
        } else {
            None
        };
        gpuops_observe::collect(&args.metrics.sources(), client.as_ref(), None)
            .await
            .map_err(anyhow::Error::from)
    })?;
    for u in &collected.unread {
        eprintln!("could not read {u}");
    }
    if collected.samples.is_empty() && !collected.unread.is_empty() && collected.from.is_empty() {
        bail!("no metric source could be read");
    }
    let samples = &collected.samples;
    let text = match args.what {
        What::Nodes => {
            let rows = top::nodes(samples);
            output::structured(&rows, args.output)?.unwrap_or_else(|| {
                let mut t = output::table(&[
                    "NODE",
                    "MODEL",
                    "GPUS",
                    "HEALTHY",
                    "MIG",
                    "ALLOCATED",
                    "UTIL",
                    "MEMORY",
                    "PODS",
                ]);
                for r in &rows {
                    t.add_row(vec![
                        r.node.clone(),
                        r.model.clone(),
                        r.gpus.to_string(),
                        opt(r.gpus_healthy, ""),
                        r.mig_instances.to_string(),
                        format!("{}/{}", r.devices_allocated, r.devices),
                        opt(r.utilization_percent, "%"),
                        mem(Some(r.memory_used_mib), Some(r.memory_total_mib)),
                        r.pods.to_string(),
                    ]);
                }
                format!("{t}\n")
            })
        }
        What::Gpus => {
            let rows = top::devices(samples);
            output::structured(&rows, args.output)?.unwrap_or_else(|| {
                let mut t = output::table(&[
                    "NODE",
                    "DEVICE",
                    "UUID",
                    "ALLOCATED",
                    "HEALTHY",
                    "UTIL",
                    "MEMORY",
                    "PODS",
                ]);
                let yn =
                    |b: Option<bool>| b.map_or("-", |b| if b { "yes" } else { "no" }).to_string();
                for r in &rows {
                    t.add_row(vec![
                        r.node.clone(),
                        r.label(),
                        r.uuid.clone(),
                        yn(r.allocated),
                        yn(r.healthy),
                        opt(r.utilization_percent, "%"),
                        mem(r.memory_used_mib, r.memory_total_mib),
                        r.pods.join(", "),
                    ]);
                }
                format!("{t}\n")
            })
        }
        What::Pods => {
            let mut rows = top::pods(samples);
            if let Some(ns) = &args.namespace {
                rows.retain(|r| &r.namespace == ns);
            }
            let _ = args.all_namespaces;
            output::structured(&rows, args.output)?.unwrap_or_else(|| {
                let mut t = output::table(&[
                    "NAMESPACE",
                    "POD",
                    "CONTAINER",
                    "NODE",
                    "DEVICES",
                    "UTIL",
                    "MEMORY",
                    "SHARING WITH",
                ]);
                for r in &rows {
                    t.add_row(vec![
                        r.namespace.clone(),
                        r.pod.clone(),
                        r.container.clone(),
                        r.node.clone(),
                        r.devices.join(", "),
                        opt(r.utilization_percent, "%"),
                        mem(r.memory_used_mib, None),
                        r.sharing_with.join(", "),
                    ]);
                }
                format!("{t}\n")
            })
        }
    };
    print!("{text}");
    if samples.is_empty() {
        eprintln!("no GPU samples found ({})", collected.from.join(", "));
    }
    Ok(ExitCode::SUCCESS)
}
