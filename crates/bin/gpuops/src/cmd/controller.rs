//! `gpuops controller`: arguments for gpuops-controller, GPU node-pool autoscaling on Cluster
//! API. See docs/autoscaling.md.

use anyhow::{Context, Result};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

/// Autoscale GPU node pools (Cluster API MachineDeployments) for pending GPU pods.
///
/// Pools are MachineDeployments with Cluster Autoscaler's clusterapi annotations (min/max size,
/// capacity.cluster-autoscaler.kubernetes.io/*) plus gpuops.io/* ones (price, GPU product, MIG
/// config, time-slicing replicas, stage timeouts). Pending GPU pods go to free capacity, then to
/// nodes in flight, then to new nodes of the cheapest feasible pool; idle nodes are drained and
/// removed. Every decision is explained in events and in the status ConfigMap
/// (`gpuops autoscaler status`).
///
/// Examples:
///   gpuops controller --namespace gpuops --leader-election-identity "$POD_NAME"
///   gpuops controller --kubeconfig ~/.kube/config --no-leader-election --dry-run
#[derive(Debug, clap::Args)]
#[command(verbatim_doc_comment)]
pub struct Args {
    #[command(flatten)]
    kube: super::flags::KubeArgs,
    /// Namespace of the status ConfigMap and the Lease.
    #[arg(long, env = "GPUOPS_NAMESPACE", default_value = "gpuops")]
    namespace: String,
    /// A decision also runs this often without any change.
    #[arg(long, default_value = "10s", value_parser = super::parse_duration)]
    resync: Duration,
    /// A node stays unneeded (no GPU pod, or its GPUs idle by measure) this long before removal.
    #[arg(long, default_value = "10m", value_parser = super::parse_duration)]
    scale_down_idle: Duration,
    /// GPU utilization (percent) at or below which an allocated GPU counts as idle.
    #[arg(long, default_value_t = 0.0)]
    idle_util_pct: f64,
    /// Scale up once no new pending GPU pod appeared for this long...
    #[arg(long, default_value = "1s", value_parser = super::parse_duration)]
    batch_idle: Duration,
    /// ...or once the oldest unserved pending pod waited this long.
    #[arg(long, default_value = "10s", value_parser = super::parse_duration)]
    batch_max: Duration,
    /// `/metrics`, `/healthz` and `/readyz` listen here.
    #[arg(
        long,
        env = "GPUOPS_CONTROLLER_METRICS_ADDRESS",
        default_value = "0.0.0.0:8080"
    )]
    metrics_address: SocketAddr,
    /// Lease name for leader election.
    #[arg(long, default_value = "gpuops-controller")]
    leader_election_name: String,
    /// Lease namespace [default: --namespace].
    #[arg(long)]
    leader_election_namespace: Option<String>,
    /// This replica's identity in the Lease [default: $POD_NAME, else the host name].
    #[arg(long, env = "POD_NAME")]
    leader_election_identity: Option<String>,
    /// How long the Lease lasts without renewal (a killed leader is replaced after this).
    #[arg(long, default_value = "15s", value_parser = super::parse_duration)]
    leader_election_duration: Duration,
    /// Run without leader election (only with a single replica).
    #[arg(long)]
    no_leader_election: bool,
    /// Decide and publish the status, change nothing in the cluster.
    #[arg(long)]
    dry_run: bool,
    /// Prometheus base URL (http:// or https://, credentials in the URL become basic auth).
    /// Every 30s the controller asks its /api/v1/query for each node's peak
    /// DCGM_FI_DEV_GPU_UTIL over --scale-down-idle (label Hostname or hostname); a node whose
    /// GPU pods kept the GPUs at or below --idle-util-pct counts as idle. The last answer is
    /// kept while Prometheus is slow or down, a node's value for at most 5 minutes; a node
    /// without a value falls back to the pod-based rule. [default: off]
    #[arg(long, env = "GPUOPS_PROMETHEUS_URL", value_parser = parse_url)]
    prometheus_url: Option<String>,
    /// File holding a bearer token for --prometheus-url, read again before every query (a
    /// projected service-account token rotates). The token is never logged.
    #[arg(long, requires = "prometheus_url")]
    prometheus_bearer_token_file: Option<PathBuf>,
    /// CA certificate (PEM) to trust for an https:// --prometheus-url, besides the system's.
    #[arg(long, requires = "prometheus_url")]
    prometheus_ca_file: Option<PathBuf>,
    /// Re-partition MIG nodes for pending nvidia.com/mig-* pods (docs/autoscaling.md, MIG).
    #[arg(long)]
    mig: bool,
    /// The agents' mig-parted ConfigMap (in --namespace) the chosen layouts are written into.
    #[arg(long, default_value = "gpuops-mig-config")]
    mig_configmap: String,
    /// MIG demand counts once it waited this long and nothing newer arrived...
    #[arg(long, default_value = "10s", value_parser = super::parse_duration)]
    mig_batch_idle: Duration,
    /// ...or once the oldest waited this long.
    #[arg(long, default_value = "60s", value_parser = super::parse_duration)]
    mig_batch_max: Duration,
    /// Minimum time between two MIG changes of one node.
    #[arg(long, default_value = "10m", value_parser = super::parse_duration)]
    mig_min_interval: Duration,
    /// A node whose MIG change failed is not chosen again for this long.
    #[arg(long, default_value = "30m", value_parser = super::parse_duration)]
    mig_failed_backoff: Duration,
}

fn parse_url(s: &str) -> Result<String, String> {
    gpuops_controller::prom::check_url(s).map_err(|e| e.to_string())
}

pub fn run(args: Args) -> Result<ExitCode> {
    let identity = args
        .leader_election_identity
        .clone()
        .or_else(|| {
            std::fs::read_to_string("/etc/hostname")
                .ok()
                .map(|s| s.trim().to_string())
        })
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| format!("gpuops-controller-{}", std::process::id()));
    let duration = args.leader_election_duration;
    let lease = (!args.no_leader_election).then(|| gpuops_kube::LeaseOptions {
        namespace: args
            .leader_election_namespace
            .clone()
            .unwrap_or_else(|| args.namespace.clone()),
        name: args.leader_election_name.clone(),
        identity: identity.clone(),
        duration,
        grace: (duration / 3).max(Duration::from_secs(1)),
    });
    let config = gpuops_controller::ControllerConfig {
        client: args.kube.options(),
        namespace: args.namespace.clone(),
        identity,
        lease,
        resync: args.resync,
        decision: gpuops_autoscale::Config {
            scale_down_idle: args.scale_down_idle,
            idle_util_pct: args.idle_util_pct,
            batch_idle: args.batch_idle,
            batch_max: args.batch_max,
            ..gpuops_autoscale::Config::default()
        },
        metrics_address: args.metrics_address,
        dry_run: args.dry_run,
        prometheus: args
            .prometheus_url
            .clone()
            .map(|url| gpuops_controller::prom::Source {
                url,
                bearer_token_file: args.prometheus_bearer_token_file.clone(),
                ca_file: args.prometheus_ca_file.clone(),
                poll: gpuops_controller::prom::POLL,
            }),
        mig: args.mig.then(|| gpuops_controller::mig::MigOptions {
            configmap: args.mig_configmap.clone(),
            decision: gpuops_autoscale::MigConfig {
                batch_idle: args.mig_batch_idle,
                batch_max: args.mig_batch_max,
                min_interval: args.mig_min_interval,
                failed_backoff: args.mig_failed_backoff,
            },
        }),
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let (stop, stopped) = tokio::sync::watch::channel(false);
    runtime.spawn(async move {
        gpuops_serve::shutdown_signal().await;
        let _ = stop.send(true);
    });
    eprintln!(
        "gpuops controller {}: metrics on http://{}/metrics, status in ConfigMap {}/{}",
        env!("CARGO_PKG_VERSION"),
        args.metrics_address,
        args.namespace,
        gpuops_controller::status::CONFIGMAP
    );
    runtime
        .block_on(gpuops_controller::run(config, stopped))
        .with_context(|| args.kube.blame())?;
    Ok(ExitCode::SUCCESS)
}
