//! `gpuops top nodes|gpus|pods`: allocation and live use per node, GPU, MIG instance and pod, from
//! the agents' metrics or Prometheus.

use super::flags::{KubeArgs, MetricsArgs, MetricsFrom};
use crate::output::{self, Format};
use anyhow::{Context, Result, bail};
use gpuops_doctor::{render, top};
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
    // A cluster named on the command line is also asked for the GPUs DRA claims hold; metrics
    // alone (--prometheus, --metrics) need no cluster, so none is contacted then.
    let agents = args.metrics.metrics_from == Some(MetricsFrom::Agents);
    let cluster_named = args.kube.kubeconfig.is_some() || args.kube.context.is_some();
    let (collected, claims) = runtime.block_on(async {
        let client = if agents {
            Some(args.kube.client().await?)
        } else if cluster_named {
            // Only for the claims: a cluster that cannot be reached is a note, as before.
            match args.kube.client().await {
                Ok(c) => Some(c),
                Err(e) => {
                    eprintln!("could not read ResourceClaims: {e:#}");
                    None
                }
            }
        } else {
            None
        };
        let collected = gpuops_observe::collect(&args.metrics.sources(), client.as_ref(), None)
            .await
            .map_err(anyhow::Error::from)?;
        let claims = match &client {
            Some(c) => gpuops_observe::dra::claims(c).await,
            None => Ok(Vec::new()),
        };
        anyhow::Ok((collected, claims))
    })?;
    let claims = match claims {
        Ok(c) => top::claim_devices(&c),
        Err(why) => {
            eprintln!("could not read ResourceClaims: {why}");
            Vec::new()
        }
    };
    for u in &collected.unread {
        eprintln!("could not read {u}");
    }
    if collected.samples.is_empty() && !collected.unread.is_empty() && collected.from.is_empty() {
        bail!("no metric source could be read");
    }
    let samples = &collected.samples;
    let text = match args.what {
        What::Nodes => {
            let mut rows = top::nodes(samples);
            top::add_claims_to_nodes(&mut rows, &claims);
            output::structured(&rows, args.output)?.unwrap_or_else(|| render::nodes_table(&rows))
        }
        What::Gpus => {
            let rows = top::devices(samples);
            output::structured(&rows, args.output)?.unwrap_or_else(|| render::devices_table(&rows))
        }
        What::Pods => {
            let mut rows = top::pods(samples);
            top::add_claims_to_pods(&mut rows, &claims);
            if let Some(ns) = &args.namespace {
                rows.retain(|r| &r.namespace == ns);
            }
            let _ = args.all_namespaces;
            output::structured(&rows, args.output)?.unwrap_or_else(|| render::pods_table(&rows))
        }
    };
    print!("{text}");
    if samples.is_empty() && claims.is_empty() {
        eprintln!("no GPU samples found ({})", collected.from.join(", "));
    }
    Ok(ExitCode::SUCCESS)
}
