//! `gpuops agent`: the node agent. Today: GPU discovery, health watching and a standalone mode on a
//! simulated node; the device plugin, metrics and labels plug into the same loop.

use crate::gpu_source::{self, GpuArgs};
use crate::output;
use crate::watch::changes;
use anyhow::{Context, Result};
use gpuops_inventory::Inventory;
use gpuops_metrics::HostnameLabel;
use gpuops_nvml::{GpuEvent, Gpus, Scope};
use gpuops_resources::health::{HealthPolicy, HealthTracker};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::mpsc;

/// Run the GPU node agent (a DaemonSet in a cluster; standalone with --simulate).
///
/// Discovers the node's GPUs through NVML, re-reads them every --interval and reports what changes,
/// and watches for XID errors and GPUs falling off the bus.
///
/// Examples:
///   gpuops agent --simulate dgx-h100                    a simulated 8x H100 node, no GPU needed
///   gpuops agent --simulate dgx-h100 --sim-state /tmp/n1   then, in another shell:
///       gpuops sim xid --state /tmp/n1 --gpu 3 --xid 48
///   gpuops agent --simulate l4x4 --once                 print the inventory and exit
#[derive(Debug, clap::Args)]
#[command(verbatim_doc_comment)]
pub struct Args {
    #[command(flatten)]
    gpus: GpuArgs,
    /// Name of this node (labels, metrics); defaults to the host name.
    #[arg(long, env = "NODE_NAME")]
    node_name: Option<String>,
    /// How often to re-read the GPUs and refresh the metrics (dcgm-exporter's collect interval; a
    /// scrape always gets the last collection at once) [default: 10s, or DCGM_EXPORTER_INTERVAL ms].
    #[arg(long, value_parser = super::parse_duration)]
    interval: Option<Duration>,
    /// Read the GPUs once, print them and exit.
    #[arg(long)]
    once: bool,
    /// Where the Prometheus endpoint (/metrics, DCGM-compatible) listens; port 0 picks a free one
    /// [default: 0.0.0.0:9400, or dcgm-exporter's DCGM_EXPORTER_LISTEN].
    #[arg(long, env = "GPUOPS_METRICS_ADDRESS")]
    metrics_address: Option<SocketAddr>,
    /// Do not serve metrics.
    #[arg(long)]
    no_metrics: bool,
    /// How the node label on every metric is spelled: `hostname` (dcgm-exporter 4.6 and later, what
    /// the GPU Operator ships) or `Hostname` (dcgm-exporter before 4.6).
    #[arg(long, env = "GPUOPS_HOSTNAME_LABEL", default_value = "hostname", value_parser = parse_hostname_label)]
    hostname_label: HostnameLabel,
    /// The kubelet's PodResources socket, for the pod, namespace and container labels on metrics
    /// [default: DCGM_POD_RESOURCES_KUBELET_SOCKET, else /var/lib/kubelet/pod-resources/kubelet.sock;
    /// with --simulate: none unless given]. DCGM_EXPORTER_KUBERNETES=false turns pod labels off.
    #[arg(long, env = "GPUOPS_POD_RESOURCES_SOCKET", value_name = "FILE")]
    pod_resources_socket: Option<PathBuf>,
    /// The kubelet's device plugin directory [default: /var/lib/kubelet/device-plugins; with
    /// --simulate, device-plugins/ in the simulator state, so a demo touches no system path].
    #[arg(long, env = "DEVICE_PLUGIN_PATH", value_name = "DIR")]
    device_plugin_dir: Option<PathBuf>,
    /// NVIDIA device plugin config file (`version: v1`, flags and sharing); NVIDIA's env vars
    /// (MIG_STRATEGY, DEVICE_LIST_STRATEGY, DEVICE_SPLIT_COUNT, ...) override it.
    #[arg(long, env = "CONFIG_FILE", value_name = "FILE")]
    config_file: Option<PathBuf>,
    /// A directory of named device plugin configs (a mounted ConfigMap: one file per config); the
    /// node label `nvidia.com/device-plugin.config` picks one, watched through the Kubernetes API
    /// (KUBECONFIG or in-cluster). Without the label: the config named `default`, else the only one.
    #[arg(
        long,
        env = "GPUOPS_CONFIG_DIR",
        value_name = "DIR",
        conflicts_with = "config_file"
    )]
    config_dir: Option<PathBuf>,
    /// Do not serve the kubelet device plugin API.
    #[arg(long)]
    no_device_plugin: bool,
    /// A device an XID made unhealthy is healthy again after this long without another counted XID
    /// (and once the driver answers for it). NVIDIA's plugin never recovers without a restart.
    #[arg(long, env = "GPUOPS_HEALTH_QUIET_PERIOD", default_value = "5m", value_parser = super::parse_duration)]
    health_quiet_period: Duration,
    #[command(flatten)]
    node: NodeFlags,
    #[command(flatten)]
    nvidia: NvidiaFlags,
}

/// What the agent keeps on its Kubernetes Node.
#[derive(Debug, Clone, Default, clap::Args)]
#[command(next_help_heading = "On the Kubernetes node (--kubernetes)")]
pub struct NodeFlags {
    /// This agent runs for a Kubernetes node (--node-name or NODE_NAME; KUBECONFIG or in-cluster):
    /// write GPU Feature Discovery labels and the GPUHealthy condition, follow
    /// nvidia.com/mig.config when --mig-config-file is given.
    #[arg(long, env = "GPUOPS_KUBERNETES")]
    kubernetes: bool,
    /// Do not write the GFD-compatible feature labels (when NVIDIA's GFD still runs).
    #[arg(long, env = "GPUOPS_NO_FEATURE_LABELS")]
    no_feature_labels: bool,
    /// Also write the labels as a Node Feature Discovery feature file, e.g.
    /// /etc/kubernetes/node-feature-discovery/features.d/gpuops.
    #[arg(long, env = "GPUOPS_NFD_FEATURES_FILE", value_name = "FILE")]
    nfd_features_file: Option<PathBuf>,
    /// Taint the node NoSchedule while a GPU has a fatal XID or is lost (removed on recovery).
    #[arg(long, env = "GPUOPS_TAINT_UNHEALTHY")]
    taint_unhealthy: bool,
    /// The key of that taint.
    #[arg(long, env = "GPUOPS_TAINT_KEY", default_value = gpuops_labels::DEFAULT_TAINT_KEY)]
    taint_key: String,
    /// mig-parted config file (a mounted ConfigMap) whose config the node label
    /// nvidia.com/mig.config names; the agent applies it and reports nvidia.com/mig.config.state.
    #[arg(long, env = "GPUOPS_MIG_CONFIG_FILE", value_name = "FILE")]
    mig_config_file: Option<PathBuf>,
    /// Config applied when the node has no nvidia.com/mig.config label, before the device plugin
    /// advertises anything (so no pod lands on the wrong layout).
    #[arg(long, env = "GPUOPS_MIG_DEFAULT_CONFIG", value_name = "NAME")]
    mig_default_config: Option<String>,
    /// How long a MIG change waits for pods using the GPUs before it gives up (state failed,
    /// resources restored, retried with backoff).
    #[arg(long, env = "GPUOPS_MIG_DRAIN_TIMEOUT", default_value = "5m", value_parser = super::parse_duration)]
    mig_drain_timeout: Duration,
    /// First wait before retrying a failed MIG change (doubles up to 10m).
    #[arg(long, env = "GPUOPS_MIG_RETRY", default_value = "30s", value_parser = super::parse_duration)]
    mig_retry: Duration,
}

/// Run only the DCGM-compatible Prometheus exporter: the agent without its device plugin.
///
/// Serves dcgm-exporter's default metrics (same names, types, help and labels) per GPU and MIG
/// instance, pod labels from the kubelet's PodResources API, XID counters per code, device health
/// and the exporter's own figures. Collection runs every --interval in the background; a scrape
/// only serves the last collection.
///
/// Examples:
///   gpuops exporter --simulate dgx-h100 --address 127.0.0.1:9400
///   curl -s 127.0.0.1:9400/metrics | grep DCGM_FI_DEV_GPU_TEMP
///   gpuops exporter --hostname-label Hostname     label spelling of dcgm-exporter before 4.6
///   DCGM_EXPORTER_LISTEN=:9400 DCGM_EXPORTER_INTERVAL=30000 gpuops exporter   dcgm-exporter's env
#[derive(Debug, clap::Args)]
#[command(verbatim_doc_comment)]
pub struct ExporterArgs {
    #[command(flatten)]
    gpus: GpuArgs,
    /// Name of this node (the Hostname label); defaults to the host name.
    #[arg(long, env = "NODE_NAME")]
    node_name: Option<String>,
    /// Where /metrics listens; port 0 picks a free one (printed at start) [default: 0.0.0.0:9400,
    /// or dcgm-exporter's DCGM_EXPORTER_LISTEN, e.g. :9400].
    #[arg(long, env = "GPUOPS_METRICS_ADDRESS")]
    address: Option<SocketAddr>,
    /// How often to collect (NVML and PodResources) [default: 10s, or DCGM_EXPORTER_INTERVAL in ms].
    #[arg(long, value_parser = super::parse_duration)]
    interval: Option<Duration>,
    /// `hostname` (dcgm-exporter 4.6 and later) or `Hostname` (before 4.6).
    #[arg(long, env = "GPUOPS_HOSTNAME_LABEL", default_value = "hostname", value_parser = parse_hostname_label)]
    hostname_label: HostnameLabel,
    /// The kubelet's PodResources socket [default: DCGM_POD_RESOURCES_KUBELET_SOCKET, else
    /// /var/lib/kubelet/pod-resources/kubelet.sock; with --simulate: none unless given].
    /// DCGM_EXPORTER_KUBERNETES=false turns pod labels off.
    #[arg(long, env = "GPUOPS_POD_RESOURCES_SOCKET", value_name = "FILE")]
    pod_resources_socket: Option<PathBuf>,
    /// A device an XID made unhealthy counts as healthy again after this long without another.
    #[arg(long, env = "GPUOPS_HEALTH_QUIET_PERIOD", default_value = "5m", value_parser = super::parse_duration)]
    health_quiet_period: Duration,
}

/// `gpuops exporter`: the agent loop with metrics only.
pub fn run_exporter(a: ExporterArgs) -> Result<ExitCode> {
    run(Args {
        gpus: a.gpus,
        node_name: a.node_name,
        interval: a.interval,
        once: false,
        metrics_address: a.address,
        no_metrics: false,
        hostname_label: a.hostname_label,
        pod_resources_socket: a.pod_resources_socket,
        device_plugin_dir: None,
        config_file: None,
        config_dir: None,
        no_device_plugin: true,
        health_quiet_period: a.health_quiet_period,
        node: NodeFlags::default(),
        nvidia: NvidiaFlags::default(),
    })
}

/// NVIDIA device plugin flags, same names and meaning; they win over the env vars of the same name
/// (MIG_STRATEGY, ...) which win over the config file.
#[derive(Debug, Clone, Default, clap::Args)]
#[command(next_help_heading = "NVIDIA device plugin flags (override env vars and the config file)")]
pub struct NvidiaFlags {
    /// none | single | mixed
    #[arg(long)]
    mig_strategy: Option<String>,
    #[arg(long, value_name = "BOOL")]
    fail_on_init_error: Option<String>,
    #[arg(long, value_name = "DIR")]
    nvidia_driver_root: Option<String>,
    #[arg(long, value_name = "DIR")]
    nvidia_dev_root: Option<String>,
    #[arg(long, value_name = "BOOL")]
    pass_device_specs: Option<String>,
    /// Comma list of envvar, volume-mounts, cdi-annotations, cdi-cri.
    #[arg(long, value_name = "LIST")]
    device_list_strategy: Option<String>,
    /// uuid | index
    #[arg(long)]
    device_id_strategy: Option<String>,
    #[arg(long, value_name = "PREFIX")]
    cdi_annotation_prefix: Option<String>,
    #[arg(long, value_name = "DIR")]
    mps_root: Option<String>,
    /// distributed | packed
    #[arg(long)]
    shared_devices_allocation_policy: Option<String>,
    /// Time-slicing replicas of nvidia.com/gpu (1 = no sharing), as the seed's DaemonSet sets it.
    #[arg(long, value_name = "N")]
    device_split_count: Option<String>,
}

impl NvidiaFlags {
    fn overrides(&self) -> Result<gpuops_resources::config::Overrides> {
        let mut o = gpuops_resources::config::Overrides::default();
        for (var, value) in [
            ("MIG_STRATEGY", &self.mig_strategy),
            ("FAIL_ON_INIT_ERROR", &self.fail_on_init_error),
            ("NVIDIA_DRIVER_ROOT", &self.nvidia_driver_root),
            ("NVIDIA_DEV_ROOT", &self.nvidia_dev_root),
            ("PASS_DEVICE_SPECS", &self.pass_device_specs),
            ("DEVICE_LIST_STRATEGY", &self.device_list_strategy),
            ("DEVICE_ID_STRATEGY", &self.device_id_strategy),
            ("CDI_ANNOTATION_PREFIX", &self.cdi_annotation_prefix),
            ("MPS_ROOT", &self.mps_root),
            (
                "SHARED_DEVICES_ALLOCATION_POLICY",
                &self.shared_devices_allocation_policy,
            ),
            ("DEVICE_SPLIT_COUNT", &self.device_split_count),
        ] {
            if let Some(v) = value {
                let flag = var.to_lowercase().replace('_', "-");
                o.set(var, v)
                    .map_err(|e| anyhow::anyhow!("--{flag} {v:?}: {e}"))?;
            }
        }
        Ok(o)
    }
}

/// Where the kubelet looks for device plugins.
const KUBELET_DEVICE_PLUGIN_DIR: &str = "/var/lib/kubelet/device-plugins";

fn parse_hostname_label(text: &str) -> Result<HostnameLabel, String> {
    match text {
        "Hostname" => Ok(HostnameLabel::Upper),
        "hostname" => Ok(HostnameLabel::Lower),
        _ => Err(format!("{text:?}: use Hostname or hostname")),
    }
}

/// The effective device plugin config: file, then NVIDIA's env vars on top.
fn plugin_config(
    file: Option<&PathBuf>,
    named: Option<(&NamedConfigs, Option<&str>)>,
    flags: &gpuops_resources::config::Overrides,
) -> Result<gpuops_resources::config::Config> {
    let parsed = match (file, named) {
        (_, Some((configs, label))) => {
            Some(gpuops_resources::select_named(configs, label, None)?.config)
        }
        (Some(path), None) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading device plugin config {}", path.display()))?;
            let origin = path.display().to_string();
            let parsed = gpuops_resources::config::Config::parse(&text, &origin)?;
            Some(crate::config_warnings::note(&origin, parsed))
        }
        (None, None) => None,
    };
    let env = gpuops_resources::config::Overrides::from_env(std::env::vars())?;
    Ok(gpuops_resources::config::Config::effective(
        parsed, &env, flags,
    )?)
}

/// The node's labels as watched (`None` until read).
type NodeLabels = tokio::sync::watch::Receiver<Option<std::collections::BTreeMap<String, String>>>;

/// Named device plugin configs, by name.
type NamedConfigs = std::collections::BTreeMap<String, gpuops_resources::config::Config>;

/// What the device plugins advertise for an inventory; a model error is logged and advertises
/// nothing (unless FAIL_ON_INIT_ERROR), so the agent keeps running.
fn publish(
    inv: &Inventory,
    config: &gpuops_resources::config::Config,
    health: &HealthTracker,
) -> Result<gpuops_deviceplugin::Published> {
    let resources = match gpuops_resources::resources(inv, config) {
        Ok(mut r) => {
            health.apply(&mut r);
            r
        }
        Err(e) if config.fail_on_init_error() => return Err(e.into()),
        Err(e) => {
            eprintln!(
                "{} device plugin: {e}; advertising nothing until this is fixed",
                clock()
            );
            Vec::new()
        }
    };
    Ok(gpuops_deviceplugin::Published {
        resources,
        config: config.clone(),
        inventory: Arc::new(inv.clone()),
    })
}

fn node_name(given: Option<String>) -> String {
    given
        .or_else(|| std::fs::read_to_string("/proc/sys/kernel/hostname").ok())
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".into())
}

/// `HH:MM:SS` UTC, for event lines.
pub(crate) fn clock() -> String {
    let secs = gpu_source::now_ms() / 1000;
    format!(
        "{:02}:{:02}:{:02}",
        (secs / 3600) % 24,
        (secs / 60) % 60,
        secs % 60
    )
}

/// Where metrics listen and how often they are collected, unless a flag or dcgm-exporter's env says.
const DEFAULT_METRICS_ADDRESS: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED), 9400);
const DEFAULT_INTERVAL: Duration = Duration::from_secs(10);

pub fn run(args: Args) -> Result<ExitCode> {
    // dcgm-exporter's env vars, so its DaemonSets can switch images; our flags and env win.
    let dcgm = gpuops_metrics::DcgmExporterEnv::from_vars(std::env::vars())?;
    for note in &dcgm.ignored {
        eprintln!("warning: {note}");
    }
    let metrics_address = args
        .metrics_address
        .or(dcgm.listen)
        .unwrap_or(DEFAULT_METRICS_ADDRESS);
    let interval = args.interval.or(dcgm.interval).unwrap_or(DEFAULT_INTERVAL);
    // Opening may set the simulator's environment: do it before the runtime starts threads.
    let opened = gpu_source::open(&args.gpus)?;
    let node = node_name(args.node_name.clone());
    let first = opened.gpus.snapshot().context("reading the GPUs")?;
    println!("gpuops agent {} on node {node}", env!("CARGO_PKG_VERSION"));
    println!("GPUs from {}\n", opened.describe());
    print!("{}", output::inventory_tables(&first));
    println!("\nEndpoints:");
    let metrics_listener = if args.no_metrics {
        println!("  metrics        not served (--no-metrics)");
        None
    } else if args.once {
        println!(
            "  metrics        http://{}/metrics (DCGM-compatible; not served with --once)",
            metrics_address
        );
        None
    } else {
        let listener = crate::exporter::bind(metrics_address)?;
        let address = listener.local_addr().unwrap_or(metrics_address);
        println!("  metrics        http://{address}/metrics (DCGM-compatible, every {interval:?})");
        Some(listener)
    };
    let pod_socket = args
        .pod_resources_socket
        .clone()
        .or(dcgm.pod_resources_socket)
        .or_else(|| {
            opened
                .simulation
                .is_none()
                .then(|| PathBuf::from(gpuops_kubelet_api::POD_RESOURCES_SOCKET))
        });
    if metrics_listener.is_some() {
        match &pod_socket {
            Some(p) => println!(
                "  pod labels     from kubelet PodResources at {}",
                p.display()
            ),
            None => println!(
                "  pod labels     none (simulated node; --pod-resources-socket to map pods)"
            ),
        }
    }
    let plugin_dir = args
        .device_plugin_dir
        .clone()
        .unwrap_or_else(|| match &opened.simulation {
            Some(sim) => sim.state_dir.join("device-plugins"),
            None => PathBuf::from(KUBELET_DEVICE_PLUGIN_DIR),
        });
    let named = args
        .config_dir
        .as_ref()
        .map(|dir| crate::node_config::load_dir(dir))
        .transpose()?;
    let flags = args.nvidia.overrides()?;
    let config = plugin_config(
        args.config_file.as_ref(),
        named.as_ref().map(|n| (n, None)),
        &flags,
    )?;
    let published = publish(&first, &config, &HealthTracker::default())?;
    let policy = HealthPolicy::from_env(
        std::env::var("DP_DISABLE_HEALTHCHECKS").ok().as_deref(),
        std::env::var("DP_ENABLE_HEALTHCHECKS").ok().as_deref(),
        args.health_quiet_period.as_millis() as u64,
    )
    .map_err(anyhow::Error::msg)?;
    if args.no_device_plugin {
        println!("  device plugin  not served");
    }
    for r in published
        .resources
        .iter()
        .filter(|_| !args.no_device_plugin)
    {
        println!(
            "  device plugin  {}/{} for {} ({} devices){}",
            plugin_dir.display(),
            r.socket_name,
            r.name,
            r.devices.len(),
            if args.once {
                " (not served with --once)"
            } else {
                ""
            }
        );
    }
    if args.once {
        return Ok(ExitCode::SUCCESS);
    }
    if let Some(sim) = &opened.simulation {
        println!(
            "\nInject faults from another shell, e.g.:\n  gpuops sim xid --state {} --gpu 0 --xid 48\n  gpuops sim lost --state {} --gpu 1",
            sim.state_dir.display(),
            sim.state_dir.display()
        );
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let plugins = (!args.no_device_plugin).then(|| Plugins {
        dir: plugin_dir.clone(),
        published,
        config,
        config_file: args.config_file.clone(),
        named: named.map(|n| (n, node.clone())),
        flags,
    });
    let node_setup = node_setup(&args, &node, &opened, pod_socket.clone())?;
    let metrics = metrics_listener.map(|listener| {
        let (exporter, served) = crate::exporter::Exporter::new(
            &node,
            args.hostname_label,
            pod_socket.filter(|_| dcgm.kubernetes != Some(false)),
        );
        Metrics {
            exporter,
            served,
            listener,
        }
    });
    runtime.block_on(agent_loop(
        Arc::new(opened.gpus),
        first,
        interval,
        policy,
        plugins,
        metrics,
        node_setup,
    ))?;
    // Keep the temporary simulator state until the loop ended.
    drop(opened.simulation);
    Ok(ExitCode::SUCCESS)
}

/// The agent's Kubernetes node integration, as configured.
struct NodeSetup {
    name: String,
    options: crate::node_sync::NodeOptions,
    mig: Option<crate::mig_flow::FlowConfig>,
    /// Named device plugin configs follow a node label too.
    watch_labels: bool,
}

fn node_setup(
    args: &Args,
    node: &str,
    opened: &gpu_source::Opened,
    pod_socket: Option<PathBuf>,
) -> Result<Option<NodeSetup>> {
    let flags = &args.node;
    if !flags.kubernetes {
        if flags.mig_config_file.is_some()
            || flags.taint_unhealthy
            || flags.nfd_features_file.is_some()
        {
            anyhow::bail!(
                "--mig-config-file, --taint-unhealthy and --nfd-features-file act on the Kubernetes node: add --kubernetes"
            );
        }
        return Ok(args.config_dir.is_some().then(|| NodeSetup {
            name: node.to_string(),
            options: crate::node_sync::NodeOptions {
                feature_labels: false,
                nfd_file: None,
                health: gpuops_labels::HealthPolicy::default(),
                machine_type: None,
            },
            mig: None,
            watch_labels: true,
        }));
    }
    let mig = match &flags.mig_config_file {
        Some(file) => {
            // A config file that cannot be read now is reported, not fatal: a ConfigMap may
            // appear later; the flow reports the problem on the node.
            if let Err(e) = std::fs::metadata(file) {
                eprintln!("{} MIG config file {}: {e}", clock(), file.display());
            }
            let gpu_flags = match (&opened.simulation, &args.gpus.nvml_lib) {
                (Some(sim), _) => vec![
                    "--sim-state".to_string(),
                    sim.state_dir.display().to_string(),
                ],
                (None, Some(lib)) => vec!["--nvml-lib".to_string(), lib.display().to_string()],
                (None, None) => Vec::new(),
            };
            Some(crate::mig_flow::FlowConfig {
                config_file: file.clone(),
                default_config: flags.mig_default_config.clone(),
                drain_timeout: flags.mig_drain_timeout,
                backoff_min: flags.mig_retry,
                backoff_max: Duration::from_secs(600),
                gpu_flags,
                pod_socket,
            })
        }
        None => None,
    };
    Ok(Some(NodeSetup {
        name: node.to_string(),
        options: crate::node_sync::NodeOptions {
            feature_labels: !flags.no_feature_labels,
            nfd_file: flags.nfd_features_file.clone(),
            health: gpuops_labels::HealthPolicy {
                taint_enabled: flags.taint_unhealthy,
                taint_key: flags.taint_key.clone(),
            },
            machine_type: std::fs::read_to_string("/sys/class/dmi/id/product_name")
                .ok()
                .filter(|_| opened.simulation.is_none())
                .map(|s| s.trim().to_string()),
        },
        mig,
        watch_labels: true,
    }))
}

/// What the XID thread tells the loop.
enum Report {
    Event(GpuEvent),
    /// The XID watch now covers these GPU indices.
    Watching(Vec<u32>),
    Problem(String),
}

/// What the device plugins need from the agent loop.
struct Plugins {
    dir: PathBuf,
    published: gpuops_deviceplugin::Published,
    config: gpuops_resources::config::Config,
    config_file: Option<PathBuf>,
    /// Named configs and this node's name, to follow the node's config label.
    named: Option<(NamedConfigs, String)>,
    flags: gpuops_resources::config::Overrides,
}

/// The metrics exporter and its bound socket.
struct Metrics {
    exporter: crate::exporter::Exporter,
    served: Arc<crate::exporter::Served>,
    listener: gpuops_serve::Listener,
}

/// The plugins' feed: republished on every snapshot and at once on every counted XID.
struct Feed {
    tx: tokio::sync::watch::Sender<Arc<gpuops_deviceplugin::Published>>,
    config: gpuops_resources::config::Config,
    /// The config file and the modification time of the version in use.
    config_file: Option<(PathBuf, Option<std::time::SystemTime>)>,
    /// Named configs, the node's labels (one of which picks one) and the value in use.
    named: Option<(NamedConfigs, NodeLabels, Option<String>)>,
    /// True while a MIG change runs: advertise no devices.
    busy: tokio::sync::watch::Receiver<bool>,
    /// NVIDIA flags given on the command line: they win on every reload too.
    flags: gpuops_resources::config::Overrides,
}

impl Feed {
    /// Re-reads the config file when it changed; a bad one is reported and the last good config
    /// stays in use.
    fn reload_config(&mut self) {
        if let Some((configs, labels, in_use)) = self.named.as_mut()
            && labels.has_changed().unwrap_or(false)
            && let value = labels
                .borrow_and_update()
                .as_ref()
                .and_then(|l| l.get(crate::node_config::LABEL).cloned())
            && value != *in_use
        {
            *in_use = value.clone();
            match plugin_config(None, Some((configs, value.as_deref())), &self.flags) {
                Ok(config) => {
                    println!(
                        "{} node label {}={}: device plugin config switched",
                        clock(),
                        crate::node_config::LABEL,
                        value.as_deref().unwrap_or("(none)")
                    );
                    self.config = config;
                }
                Err(e) => eprintln!(
                    "{} {e:#}; keeping the last good device plugin config",
                    clock()
                ),
            }
        }
        let Some((path, seen)) = self.config_file.as_mut() else {
            return;
        };
        let modified = std::fs::metadata(&*path).and_then(|m| m.modified()).ok();
        if modified == *seen {
            return;
        }
        *seen = modified;
        match plugin_config(Some(&*path), None, &self.flags) {
            Ok(config) => {
                println!(
                    "{} device plugin config {} reloaded",
                    clock(),
                    path.display()
                );
                self.config = config;
            }
            Err(e) => eprintln!(
                "{} {e:#}; keeping the last good device plugin config",
                clock()
            ),
        }
    }

    fn republish(&self, inv: &Inventory, health: &HealthTracker) {
        let published = publish(inv, &self.config, health).map(|mut p| {
            if *self.busy.borrow() {
                // During a MIG change every resource stays registered with no devices, so the
                // kubelet's allocatable drops to zero at once.
                for r in &mut p.resources {
                    r.devices.clear();
                }
            }
            p
        });
        match published {
            Ok(p) if p.resources != self.tx.borrow().resources => {
                println!(
                    "{} device plugin resources: {}",
                    clock(),
                    describe_resources(&p)
                );
                let _ = self.tx.send(Arc::new(p));
            }
            Ok(_) => {}
            Err(e) => eprintln!(
                "{} device plugin: {e:#}; keeping the last resources",
                clock()
            ),
        }
    }
}

async fn agent_loop(
    gpus: Arc<Gpus>,
    first: Inventory,
    interval: Duration,
    policy: HealthPolicy,
    plugins: Option<Plugins>,
    metrics: Option<Metrics>,
    node_setup: Option<NodeSetup>,
) -> Result<()> {
    let (stop_plugins, plugins_stopped) = tokio::sync::watch::channel(false);
    // The node's labels, when anything follows them.
    let (labels_tx, labels_rx) = tokio::sync::watch::channel(None);
    if let Some(setup) = node_setup.as_ref().filter(|s| s.watch_labels) {
        let name = setup.name.clone();
        tokio::spawn(async move {
            if let Err(e) = crate::node_config::watch_labels(name, labels_tx).await {
                eprintln!("{} {e:#}; node labels are not followed", clock());
            }
        });
    }
    let (inventory_tx, inventory_rx) = tokio::sync::watch::channel(Arc::new(first.clone()));
    let mig_flow = node_setup.as_ref().and_then(|s| s.mig.clone());
    // With a MIG flow the plugin advertises nothing until its first decision.
    let (busy_tx, mut busy_rx) = tokio::sync::watch::channel(mig_flow.is_some());
    let mut node_sync = None;
    if let Some(setup) = node_setup.as_ref().filter(|s| {
        s.options.feature_labels
            || s.mig.is_some()
            || s.options.health.taint_enabled
            || s.options.nfd_file.is_some()
    }) {
        let writer = crate::node_sync::NodeWriter::connect(&setup.name).await?;
        if let Some(cfg) = mig_flow {
            tokio::spawn(crate::mig_flow::run(
                cfg,
                writer.clone(),
                labels_rx.clone(),
                inventory_rx.clone(),
                busy_tx,
            ));
        }
        node_sync = Some(crate::node_sync::NodeSync::new(
            writer,
            setup.options.clone(),
        ));
    }
    let default_config = gpuops_resources::config::Config::effective(
        None,
        &gpuops_resources::config::Overrides::default(),
        &gpuops_resources::config::Overrides::default(),
    )?;
    let mut feed = None;
    let mut plugin_task = None;
    if let Some(p) = plugins {
        let (tx, rx) = tokio::sync::watch::channel(Arc::new(p.published));
        plugin_task = Some(tokio::spawn(gpuops_deviceplugin::serve(
            p.dir,
            rx,
            plugins_stopped,
        )));
        let config_file = p.config_file.map(|f| {
            let modified = std::fs::metadata(&f).and_then(|m| m.modified()).ok();
            (f, modified)
        });
        let named = p
            .named
            .map(|(configs, _)| (configs, labels_rx.clone(), None));
        feed = Some(Feed {
            tx,
            config: p.config,
            config_file,
            named,
            busy: busy_rx.clone(),
            flags: p.flags,
        });
        if let Some(f) = feed.as_ref() {
            f.republish(&first, &HealthTracker::default());
        }
    }
    let mut health = HealthTracker::default();
    let mut exporter = None;
    let mut metrics_task = None;
    if let Some(m) = metrics {
        let mut e = m.exporter;
        e.refresh_pods().await;
        e.publish(&first, &health, Some(std::time::Instant::now()));
        metrics_task = Some(tokio::spawn(crate::exporter::serve(
            m.listener,
            m.served,
            stop_plugins.subscribe(),
        )));
        exporter = Some(e);
    }
    let healthy = Arc::new(Mutex::new(healthy_indices(&first)));
    let stop = Arc::new(AtomicBool::new(false));
    let (tx, mut rx) = mpsc::channel(64);
    let xid_thread = {
        let (gpus, healthy, stop) = (Arc::clone(&gpus), Arc::clone(&healthy), Arc::clone(&stop));
        std::thread::Builder::new()
            .name("xid-watch".into())
            .spawn(move || watch_xids(&gpus, &healthy, &stop, &tx))
            .context("starting the XID watcher")?
    };
    println!(
        "\n{} re-reading the GPUs every {:?}; Ctrl-C to stop",
        clock(),
        interval
    );
    let mut previous = first;
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticker.tick().await;
    let shutdown = gpuops_serve::shutdown_signal();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            _ = &mut shutdown => break,
            Ok(()) = busy_rx.changed() => {
                // A MIG change started or ended: advertise nothing now, or re-read the GPUs now.
                let busy = *busy_rx.borrow_and_update();
                if busy {
                    if let Some(f) = feed.as_ref() {
                        f.republish(&previous, &health);
                    }
                } else {
                    ticker.reset_immediately();
                }
            }
            _ = ticker.tick() => {
                let started = std::time::Instant::now();
                let g = Arc::clone(&gpus);
                match tokio::task::spawn_blocking(move || g.snapshot_with(Scope::Live)).await {
                    Ok(Ok(mut next)) => {
                        keep_static_facts(&mut next, &previous);
                        for change in changes(&previous, &next) {
                            println!("{} {change}", clock());
                        }
                        if let Ok(mut h) = healthy.lock() {
                            *h = healthy_indices(&next);
                        }
                        if health.expire(&policy, gpu_source::now_ms()) {
                            println!("{} no XID for the quiet period: devices healthy again where the driver agrees", clock());
                        }
                        if let Some(f) = feed.as_mut() {
                            f.reload_config();
                            f.republish(&next, &health);
                        }
                        if let Some(e) = exporter.as_mut() {
                            e.refresh_pods().await;
                            e.publish(&next, &health, Some(started));
                        }
                        if let Some(n) = node_sync.as_mut() {
                            let config = feed.as_ref().map_or(&default_config, |f| &f.config);
                            n.sync(&next, config, &health).await;
                        }
                        let _ = inventory_tx.send(Arc::new(next.clone()));
                        previous = next;
                    }
                    Ok(Err(e)) => {
                        if let Some(x) = exporter.as_mut() {
                            x.nvml_error();
                        }
                        eprintln!("{} reading the GPUs failed: {e}; keeping the last snapshot", clock())
                    }
                    Err(e) => eprintln!("{} snapshot task failed: {e}", clock()),
                }
            }
            Some(report) = rx.recv() => match report {
                Report::Event(event) => {
                    println!("{} {}", clock(), describe_event(&event, &previous));
                    if let &GpuEvent::Xid { gpu, xid, gi_id, ci_id } = &event {
                        let counted = health.record(&policy, gpu, gi_id, ci_id, xid, gpu_source::now_ms());
                        if let (true, Some(f)) = (counted, feed.as_ref()) {
                            f.republish(&previous, &health);
                        }
                        if let Some(e) = exporter.as_mut() {
                            e.record_xid(gpu, gi_id, xid);
                            e.publish(&previous, &health, None);
                        }
                        if let (true, Some(n)) = (counted, node_sync.as_mut()) {
                            let config = feed.as_ref().map_or(&default_config, |f| &f.config);
                            n.sync(&previous, config, &health).await;
                        }
                    }
                }
                Report::Watching(gpus) => println!(
                    "{} watching {} GPUs for XID errors ({})",
                    clock(),
                    gpus.len(),
                    gpus.iter().map(u32::to_string).collect::<Vec<_>>().join(",")
                ),
                Report::Problem(p) => eprintln!("{} {p}", clock()),
            },
        }
    }
    println!("{} stopping", clock());
    stop.store(true, Ordering::Relaxed);
    let _ = stop_plugins.send(true);
    if let Some(task) = metrics_task {
        match task.await {
            Ok(Err(e)) => eprintln!("{} metrics: {e:#}", clock()),
            Err(e) => eprintln!("{} metrics task: {e}", clock()),
            Ok(Ok(())) => {}
        }
    }
    if let Some(task) = plugin_task {
        match task.await {
            Ok(Err(e)) => eprintln!("{} device plugin: {e}", clock()),
            Err(e) => eprintln!("{} device plugin task: {e}", clock()),
            Ok(Ok(())) => {}
        }
    }
    // The watcher wakes at least every WAIT_MS; joining it releases NVML cleanly.
    let _ = tokio::task::spawn_blocking(move || xid_thread.join()).await;
    Ok(())
}

fn describe_resources(p: &gpuops_deviceplugin::Published) -> String {
    let parts: Vec<String> = p
        .resources
        .iter()
        .map(|r| format!("{} {}/{}", r.name, r.healthy_count(), r.devices.len()))
        .collect();
    if parts.is_empty() {
        "none".into()
    } else {
        parts.join(", ")
    }
}

/// NVLinks and the PCIe/NVLink topology do not change while the node runs: a [`Scope::Live`]
/// re-read takes them from the previous snapshot.
fn keep_static_facts(next: &mut Inventory, previous: &Inventory) {
    next.topology.clone_from(&previous.topology);
    for gpu in &mut next.gpus {
        if let Some(before) = previous.gpus.iter().find(|p| p.uuid == gpu.uuid) {
            gpu.nvlinks.clone_from(&before.nvlinks);
        }
    }
}

fn healthy_indices(inv: &Inventory) -> Vec<u32> {
    inv.healthy_gpus().map(|g| g.index).collect()
}

const WAIT_MS: u32 = 500;

/// Blocking loop on NVML's event set; rebuilt when the set of healthy GPUs changes.
fn watch_xids(
    gpus: &Gpus,
    healthy: &Mutex<Vec<u32>>,
    stop: &AtomicBool,
    tx: &mpsc::Sender<Report>,
) {
    let current = || healthy.lock().map(|h| h.clone()).unwrap_or_default();
    let mut announced: Option<Vec<u32>> = None;
    while !stop.load(Ordering::Relaxed) {
        let watched = current();
        let (watcher, skipped) = match gpus.watch_xids(&watched) {
            Ok(w) => w,
            Err(e) => {
                let _ = tx.blocking_send(Report::Problem(format!("cannot watch XID events: {e}")));
                std::thread::sleep(Duration::from_secs(5));
                continue;
            }
        };
        for (gpu, why) in skipped {
            let _ = tx.blocking_send(Report::Problem(format!(
                "GPU {gpu}: not watching XID events: {why}"
            )));
        }
        let now_watched = watcher.watched();
        if announced.as_ref() != Some(&now_watched) {
            let _ = tx.blocking_send(Report::Watching(now_watched.clone()));
            announced = Some(now_watched);
        }
        while !stop.load(Ordering::Relaxed) {
            match watcher.wait(WAIT_MS) {
                Ok(None) if current() == watched => {}
                Ok(None) => break,
                Ok(Some(event)) => {
                    let lost = event == GpuEvent::GpuLost;
                    let _ = tx.blocking_send(Report::Event(event));
                    if lost {
                        // The driver keeps answering "lost" until the GPU is gone from the watch
                        // list: wait for the next snapshot to drop it.
                        while !stop.load(Ordering::Relaxed) && current() == watched {
                            std::thread::sleep(Duration::from_millis(200));
                        }
                        break;
                    }
                }
                Err(e) => {
                    let _ =
                        tx.blocking_send(Report::Problem(format!("waiting for XID events: {e}")));
                    std::thread::sleep(Duration::from_secs(1));
                    break;
                }
            }
        }
    }
}

/// `XID 48 on GPU 3 (GPU-…): double-bit ECC error; action: drain the node and reset the GPU`.
fn describe_event(event: &GpuEvent, inv: &Inventory) -> String {
    match event {
        GpuEvent::GpuLost => {
            "a watched GPU fell off the bus (NVML: GPU is lost); the next read says which".into()
        }
        GpuEvent::Xid {
            gpu,
            xid,
            gi_id,
            ci_id,
        } => {
            let info = gpuops_catalog::xid::describe(*xid);
            let uuid = inv
                .gpus
                .iter()
                .find(|g| g.index == *gpu)
                .map(|g| g.uuid.clone())
                .unwrap_or_default();
            let instance = match (gi_id, ci_id) {
                (Some(gi), Some(ci)) => format!(" MIG gi {gi} ci {ci}"),
                (Some(gi), None) => format!(" MIG gi {gi}"),
                _ => String::new(),
            };
            let ignored = if gpuops_catalog::xid::DEFAULT_IGNORED_XIDS.contains(xid) {
                " (application fault: GPU stays healthy)"
            } else {
                ""
            };
            format!(
                "XID {xid} on GPU {gpu} ({uuid}){instance}: {}{ignored}; action: {}",
                info.meaning, info.action
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuops_inventory::{Gpu, Health};

    fn gpu(index: u32) -> Gpu {
        Gpu {
            index,
            uuid: format!("GPU-{index}"),
            ..Gpu::default()
        }
    }

    #[test]
    fn events_are_explained() {
        let inv = Inventory {
            gpus: vec![gpu(0), gpu(3)],
            ..Inventory::default()
        };
        let text = describe_event(
            &GpuEvent::Xid {
                gpu: 3,
                xid: 48,
                gi_id: None,
                ci_id: None,
            },
            &inv,
        );
        assert_eq!(
            text,
            "XID 48 on GPU 3 (GPU-3): double-bit ECC error; action: drain the node and reset the GPU"
        );
        let text = describe_event(
            &GpuEvent::Xid {
                gpu: 0,
                xid: 13,
                gi_id: Some(7),
                ci_id: Some(0),
            },
            &inv,
        );
        assert!(
            text.contains("MIG gi 7 ci 0") && text.contains("GPU stays healthy"),
            "{text}"
        );
    }

    #[test]
    fn live_rereads_keep_nvlinks_and_topology_of_the_same_gpus() {
        let mut before = gpu(0);
        before.nvlinks = vec![gpuops_inventory::NvLink {
            link: 0,
            remote_pci_bus_id: "00000000:05:00.0".into(),
            remote_is_switch: true,
        }];
        let previous = Inventory {
            gpus: vec![before.clone(), gpu(1)],
            topology: vec![gpuops_inventory::GpuLink {
                a: 0,
                b: 1,
                nvlinks: 18,
                pcie: gpuops_inventory::PcieLevel::CrossCpu,
            }],
            ..Inventory::default()
        };
        let mut replaced = gpu(1);
        replaced.uuid = "GPU-new".into();
        let mut next = Inventory {
            gpus: vec![gpu(0), replaced],
            ..Inventory::default()
        };
        keep_static_facts(&mut next, &previous);
        assert_eq!(next.gpus[0].nvlinks, before.nvlinks);
        assert!(
            next.gpus[1].nvlinks.is_empty(),
            "another GPU: nothing carried over"
        );
        assert_eq!(next.topology, previous.topology);
    }

    #[test]
    fn healthy_indices_skip_lost_gpus() {
        let mut lost = gpu(2);
        lost.health = Health::Lost;
        let inv = Inventory {
            gpus: vec![gpu(0), gpu(1), lost],
            ..Inventory::default()
        };
        assert_eq!(healthy_indices(&inv), vec![0, 1]);
    }
}
