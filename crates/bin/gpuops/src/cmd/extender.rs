//! `gpuops scheduler-extender`: arguments for gpuops-extender, the packing engine's node scoring
//! served to kube-scheduler as an HTTP extender. See docs/packing.md.

use anyhow::{Context, Result, anyhow};
use gpuops_extender::{Extender, ExtenderConfig};
use gpuops_packing::{PodSpec, PolicyKind};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

/// Serve the GPU packing engine to kube-scheduler as an HTTP scheduler extender.
///
/// kube-scheduler calls POST /filter and POST /prioritize for pods that request GPUs
/// (nvidia.com/gpu or nvidia.com/gpu.shared; list them as managedResources). The extender keeps a
/// watch of nodes and unfinished pods (it needs only get/list/watch on both), models each node's
/// GPUs at milli-GPU granularity (time-slicing replicas from GFD's nvidia.com/gpu.replicas, a
/// replica = 1000/replicas milli; or the pod annotation gpuops.io/gpu-milli), filters out nodes
/// where the pod's share does not fit on one GPU, and scores the rest with --policy (0..10, only
/// the best node gets 10). Pods that request no GPU pass through untouched.
///
/// Configure kube-scheduler with deploy/scheduler/kube-scheduler-config.yaml (a
/// KubeSchedulerConfiguration with this extender); the ClusterRole is in
/// deploy/scheduler/rbac.yaml.
///
/// Examples:
///   gpuops scheduler-extender                               in-cluster, port 8888, policy ours
///   gpuops scheduler-extender --kubeconfig ~/.kube/config --address 127.0.0.1:8888
///   gpuops scheduler-extender --policy fgd --workload /work/shared/traces/openb/openb_pod_list_default.csv
///   curl -s -XPOST 127.0.0.1:8888/prioritize -d @extender-args.json
#[derive(Debug, clap::Args)]
#[command(verbatim_doc_comment)]
pub struct Args {
    /// Where the extender listens (kube-scheduler's urlPrefix points here).
    #[arg(long, env = "GPUOPS_EXTENDER_ADDRESS", default_value = "0.0.0.0:8888")]
    address: SocketAddr,
    /// Scoring policy: ours, fgd, bestfit, gpupacking, gpuclustering, dotprod or random.
    #[arg(long, env = "GPUOPS_EXTENDER_POLICY", default_value = "ours")]
    policy: String,
    /// The cluster to watch nodes and pods of.
    #[command(flatten)]
    kube: super::flags::KubeArgs,
    /// A pod list CSV (trace format, see `gpuops simulate --help`) whose shapes are the typical
    /// pods FGD and ours protect [default: the shapes of the pods running in the cluster].
    #[arg(long, value_name = "FILE")]
    workload: Option<PathBuf>,
}

pub fn run(args: Args) -> Result<ExitCode> {
    let policy = PolicyKind::parse(&args.policy).context("--policy")?;
    let workload: Option<Vec<PodSpec>> = match &args.workload {
        Some(path) => {
            let text = super::read_input(
                path,
                "--workload",
                gpuops_yamlpos::MAX_TRACE_BYTES,
                "a trace",
            )?;
            Some(
                gpuops_packing::parse_pods(&path.display().to_string(), &text)
                    .map_err(|e| anyhow!("--workload: {e}"))?,
            )
        }
        None => None,
    };
    let extender = Extender::bind(
        args.address,
        ExtenderConfig {
            policy,
            workload,
            client: args.kube.options(),
        },
    )?;
    let local = extender
        .local_addr()
        .context("reading the extender's address")?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    println!(
        "gpuops scheduler-extender {}: policy {}, listening on http://{local} (POST /filter, POST /prioritize)",
        env!("CARGO_PKG_VERSION"),
        policy.name()
    );
    runtime.block_on(extender.run(gpuops_serve::shutdown_signal()))?;
    println!("stopped");
    Ok(ExitCode::SUCCESS)
}
