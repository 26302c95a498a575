//! `gpuops agent` and `gpuops exporter`: flags -> [`gpuops_agent::AgentConfig`] ->
//! [`gpuops_agent::Agent::run`]; the runtime itself lives in the gpuops-agent crate.

use crate::gpu_source::{self, GpuArgs};
use crate::output;
use anyhow::{Context, Result};
use gpuops_agent::{AgentConfig, ConfigSource, FlowConfig, KubeConfig, MetricsConfig, NodeOptions};
use gpuops_metrics::HostnameLabel;
use gpuops_resources::health::HealthPolicy;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

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
    /// How long one read of the GPUs may take before the agent reports the driver as hanging
    /// (and /healthz fails after a few such intervals).
    #[arg(long, env = "GPUOPS_SNAPSHOT_TIMEOUT", default_value = "30s", value_parser = super::parse_duration)]
    snapshot_timeout: Duration,
    #[command(flatten)]
    node: NodeFlags,
    #[command(flatten)]
    nvidia: NvidiaFlags,
    #[command(flatten)]
    cdi: CdiFlags,
}

/// The CDI spec the agent writes for the `cdi-annotations` / `cdi-cri` device list strategies.
#[derive(Debug, Clone, Default, clap::Args)]
#[command(next_help_heading = "CDI spec (docs/cdi.md)")]
pub struct CdiFlags {
    /// Write the CDI spec (kind k8s.device-plugin.nvidia.com/gpu, file
    /// k8s.device-plugin.nvidia.com-gpu.json) into this directory at start and whenever the
    /// devices change; an empty value writes none [default: /var/run/cdi (with --simulate: cdi/
    /// in the simulator state) when DEVICE_LIST_STRATEGY names cdi-annotations or cdi-cri, else
    /// none]. The driver's files are looked for under CONTAINER_DRIVER_ROOT (default
    /// --nvidia-driver-root) and named in the spec under --nvidia-driver-root.
    #[arg(long, env = "GPUOPS_CDI_SPEC_DIR", value_name = "DIR")]
    cdi_spec_dir: Option<String>,
    /// A gpuops binary on the host (not in the agent's image: the runtime runs hooks on the
    /// host) for the spec's ldcache hook, `gpuops cdi hook update-ldcache` [default: NVIDIA's
    /// nvidia-cdi-hook when found under the driver root, else no hook].
    #[arg(long, env = "GPUOPS_CDI_HOOK_PATH", value_name = "FILE")]
    cdi_hook_path: Option<String>,
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
    /// How long one `gpuops mig` child (apply, assert, dry run) may run before it is killed and
    /// the change counts as failed (the GPUs are advertised again).
    #[arg(long, env = "GPUOPS_MIG_CHILD_TIMEOUT", default_value = "10m", value_parser = super::parse_duration)]
    mig_child_timeout: Duration,
    /// How often the node's labels, condition, taint and annotations are checked against the Node
    /// even when nothing changed (what someone else removed comes back; the condition's
    /// heartbeat is refreshed).
    #[arg(long, env = "GPUOPS_NODE_RESYNC", default_value = "5m", value_parser = super::parse_duration)]
    node_resync: Duration,
    /// Kubeconfig file [default: KUBECONFIG, ~/.kube/config, then in-cluster].
    #[arg(long, env = "GPUOPS_KUBECONFIG", value_name = "FILE")]
    kubeconfig: Option<PathBuf>,
    /// Kubeconfig context [default: the current one].
    #[arg(long, value_name = "NAME")]
    context: Option<String>,
    /// Deadline of every request to the API server.
    #[arg(long, env = "GPUOPS_KUBE_TIMEOUT", default_value = "15s", value_parser = super::parse_duration)]
    kube_timeout: Duration,
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
        snapshot_timeout: Duration::from_secs(30),
        node: NodeFlags::default(),
        nvidia: NvidiaFlags::default(),
        // The exporter serves no device plugin: no spec for its devices.
        cdi: CdiFlags {
            cdi_spec_dir: Some(String::new()),
            cdi_hook_path: None,
        },
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
    pub(crate) fn overrides(&self) -> Result<gpuops_resources::config::Overrides> {
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

fn node_name(given: Option<String>) -> String {
    given
        .or_else(|| std::fs::read_to_string("/proc/sys/kernel/hostname").ok())
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".into())
}

/// What NVIDIA's device plugin says when NVML cannot be loaded, for the same situations.
const NVML_HINTS: &str = "if this is a GPU node, is the NVIDIA driver installed and the container \
    runtime set up to expose it (the nvidia runtime, or CDI)? If the driver is in a container, set \
    --nvidia-driver-root / CONTAINER_DRIVER_ROOT. If this is not a GPU node, deploy the agent only \
    to GPU nodes (a nodeSelector or affinity on nvidia.com/gpu.present)";

/// Where metrics listen and how often they are collected, unless a flag or dcgm-exporter's env says.
const DEFAULT_METRICS_ADDRESS: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED), 9400);
const DEFAULT_INTERVAL: Duration = Duration::from_secs(10);

pub fn run(args: Args) -> Result<ExitCode> {
    // dcgm-exporter's env vars, so its DaemonSets can switch images; our flags and env win.
    let dcgm = gpuops_metrics::DcgmExporterEnv::from_vars(std::env::vars())?;
    for note in &dcgm.ignored {
        tracing::warn!("{note}");
    }
    let metrics_address = args
        .metrics_address
        .or(dcgm.listen)
        .unwrap_or(DEFAULT_METRICS_ADDRESS);
    let interval = args.interval.or(dcgm.interval).unwrap_or(DEFAULT_INTERVAL);
    // Preparing may set the simulator's environment: do it before the runtime starts threads.
    let (library, simulation) = gpu_source::prepare(&args.gpus)?;
    let source = ConfigSource {
        file: args.config_file.clone(),
        named: args
            .config_dir
            .as_ref()
            .map(|dir| gpuops_agent::load_dir(dir))
            .transpose()?,
        flags: args.nvidia.overrides()?,
        env: gpuops_resources::config::Overrides::from_env(std::env::vars())?,
    };
    let config = source.resolve(None).map_err(anyhow::Error::msg)?;
    let libraries = match (&library, &simulation) {
        (gpuops_nvml::Library::System, None) => gpu_source::driver_libraries(&[
            config
                .flags
                .plugin
                .container_driver_root
                .as_deref()
                .unwrap_or_default(),
            config.nvidia_driver_root(),
        ]),
        _ => vec![library.clone()],
    };
    let gpus = match gpuops_agent::open_nvml(&libraries, &args.gpus.sysfs_root) {
        Ok(g) => Some(g),
        Err(e) if !config.fail_on_init_error() && !args.once => {
            tracing::error!(
                error = %e,
                "cannot load NVML; {NVML_HINTS}. FAIL_ON_INIT_ERROR=false: advertising nothing, serving the agent's own health and metrics, retrying with backoff"
            );
            None
        }
        Err(e) => anyhow::bail!(
            "{e}. {NVML_HINTS}; or set FAIL_ON_INIT_ERROR=false to keep the agent up without GPUs"
        ),
    };
    let node = node_name(args.node_name.clone());
    let first = match &gpus {
        Some(g) => g.snapshot().context("reading the GPUs")?,
        None => gpuops_inventory::Inventory::default(),
    };
    println!("gpuops agent {} on node {node}", env!("CARGO_PKG_VERSION"));
    match &gpus {
        Some(g) => println!(
            "GPUs from {}\n",
            gpu_source::describe(g.library(), simulation.as_ref())
        ),
        None => println!("GPUs from: none yet (NVML not loaded; retrying)\n"),
    }
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
        let listener = gpuops_serve::bind(
            metrics_address,
            "metrics",
            "is another exporter, e.g. NVIDIA's dcgm-exporter, using the port? choose another with --metrics-address",
        )?;
        let address = listener.local_addr().unwrap_or(metrics_address);
        println!("  metrics        http://{address}/metrics (DCGM-compatible, every {interval:?})");
        Some(listener)
    };
    let pod_socket = args
        .pod_resources_socket
        .clone()
        .or(dcgm.pod_resources_socket)
        .or_else(|| {
            simulation
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
        .unwrap_or_else(|| match &simulation {
            Some(sim) => sim.state_dir.join("device-plugins"),
            None => PathBuf::from(KUBELET_DEVICE_PLUGIN_DIR),
        });
    // A simulated node's device nodes are in its state directory (`gpuops sim init` makes them);
    // one made before it did gets NVIDIA's full layout.
    let host_devices = match &simulation {
        Some(sim) if sim.state_dir.join("dev").is_dir() => {
            gpuops_deviceplugin::probe_host(&sim.state_dir, &sim.state_dir.join("proc"))
        }
        Some(_) => gpuops_resources::HostDevices::default(),
        None => gpuops_deviceplugin::probe_host(
            std::path::Path::new(config.nvidia_dev_root()),
            std::path::Path::new("/proc"),
        ),
    };
    let cdi = cdi_config(&args.cdi, &config, simulation.as_ref())?;
    match &cdi {
        Some(c) => println!("  CDI spec       {}", c.path.display()),
        None => println!("  CDI spec       not written (--cdi-spec-dir)"),
    }
    let published = gpuops_agent::publish(
        &first,
        &config,
        &gpuops_resources::health::HealthTracker::default(),
        &Arc::new(host_devices.clone()),
    )?;
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
    if let Some(sim) = &simulation {
        println!(
            "\nInject faults from another shell, e.g.:\n  gpuops sim xid --state {} --gpu 0 --xid 48\n  gpuops sim lost --state {} --gpu 1",
            sim.state_dir.display(),
            sim.state_dir.display()
        );
    }
    let kube = kube_config(&args, simulation.as_ref(), pod_socket.clone())?;
    let metrics = metrics_listener.map(|listener| MetricsConfig {
        hostname_label: args.hostname_label,
        // DCGM_EXPORTER_KUBERNETES=false: no pod labels, as with dcgm-exporter.
        pod_socket: pod_socket.filter(|_| dcgm.kubernetes != Some(false)),
        listener,
    });
    let config = AgentConfig {
        node_name: node,
        interval,
        snapshot_timeout: args.snapshot_timeout,
        health_policy: policy,
        config: source,
        plugin_dir: (!args.no_device_plugin).then_some(plugin_dir),
        host_devices,
        metrics,
        kube,
        nvml_libraries: libraries,
        sysfs_root: args.gpus.sysfs_root.clone(),
        cdi,
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(
        gpuops_agent::Agent::new(gpus, first, config).run(gpuops_serve::shutdown_signal()),
    )?;
    // A task stuck in a driver or kubelet call must not hold the exit up.
    runtime.shutdown_timeout(Duration::from_millis(200));
    // Keep the temporary simulator state until the agent stopped.
    drop(simulation);
    Ok(ExitCode::SUCCESS)
}

/// Where and how the agent writes its CDI spec, as the flags and the device plugin config say.
fn cdi_config(
    flags: &CdiFlags,
    config: &gpuops_resources::Config,
    simulation: Option<&gpu_source::Simulation>,
) -> Result<Option<gpuops_agent::CdiConfig>> {
    use gpuops_resources::cdi::{DEFAULT_SPEC_DIR, SpecOptions, spec_file_name};
    let dir = match &flags.cdi_spec_dir {
        Some(d) if d.is_empty() => return Ok(None),
        Some(d) => PathBuf::from(d),
        None if !config.device_list_strategies().any_cdi() => return Ok(None),
        None => match simulation {
            Some(sim) => sim.state_dir.join("cdi"),
            None => PathBuf::from(DEFAULT_SPEC_DIR),
        },
    };
    // A simulated node's driver files and device nodes are in its state directory, which the
    // runtime must see at the same path (docs/cdi.md).
    let (probe_root, options) = match simulation {
        Some(sim) => {
            // Without `gpuops sim dev-nodes` there is nothing there: the usual paths, no files.
            let mut root = sim.state_dir.join(gpuops_sim::devnodes::DRIVER_ROOT);
            if !root.is_dir() {
                root = sim.state_dir.clone();
            }
            let dev_root = match sim.state_dir.join("dev").is_dir() {
                true => sim.state_dir.display().to_string(),
                false => "/".to_string(),
            };
            let options = SpecOptions {
                dev_root,
                driver_root: root.display().to_string(),
                gpuops_hook: flags.cdi_hook_path.clone(),
                ..SpecOptions::default()
            };
            (root, options)
        }
        None => {
            let host_root = config.nvidia_driver_root().to_string();
            let probe_root = config
                .flags
                .plugin
                .container_driver_root
                .clone()
                .filter(|r| !r.is_empty())
                .unwrap_or_else(|| host_root.clone());
            let options = SpecOptions {
                dev_root: config.nvidia_dev_root().to_string(),
                driver_root: host_root,
                gpuops_hook: flags.cdi_hook_path.clone(),
                ..SpecOptions::default()
            };
            (PathBuf::from(probe_root), options)
        }
    };
    let path = dir.join(spec_file_name(&options.kind));
    Ok(Some(gpuops_agent::CdiConfig {
        path,
        probe_root,
        options,
    }))
}

/// The agent's Kubernetes side, as the flags configure it.
fn kube_config(
    args: &Args,
    simulation: Option<&gpu_source::Simulation>,
    pod_socket: Option<PathBuf>,
) -> Result<Option<KubeConfig>> {
    let flags = &args.node;
    let client = gpuops_kube::ClientOptions {
        kubeconfig: flags.kubeconfig.clone(),
        context: flags.context.clone(),
        request_timeout: flags.kube_timeout,
        ..gpuops_kube::ClientOptions::default()
    };
    if !flags.kubernetes {
        if flags.mig_config_file.is_some()
            || flags.taint_unhealthy
            || flags.nfd_features_file.is_some()
        {
            anyhow::bail!(
                "--mig-config-file, --taint-unhealthy and --nfd-features-file act on the Kubernetes node: add --kubernetes"
            );
        }
        // Named configs follow a node label: watch the node, write nothing.
        return Ok(args.config_dir.is_some().then_some(KubeConfig {
            client,
            node: None,
            mig: None,
            resync: flags.node_resync,
        }));
    }
    let mig = match &flags.mig_config_file {
        Some(file) => {
            // A config file that cannot be read now is reported, not fatal: a ConfigMap may
            // appear later; the flow reports the problem on the node.
            if let Err(e) = std::fs::metadata(file) {
                tracing::warn!(file = %file.display(), "MIG config file {}: {e}", file.display());
            }
            let gpu_flags = match (simulation, &args.gpus.nvml_lib) {
                (Some(sim), _) => vec![
                    "--sim-state".to_string(),
                    sim.state_dir.display().to_string(),
                ],
                (None, Some(lib)) => vec!["--nvml-lib".to_string(), lib.display().to_string()],
                (None, None) => Vec::new(),
            };
            Some(FlowConfig {
                config_file: file.clone(),
                default_config: flags.mig_default_config.clone(),
                drain_timeout: flags.mig_drain_timeout,
                backoff_min: flags.mig_retry,
                backoff_max: Duration::from_secs(600),
                program: std::env::current_exe().context("locating the gpuops binary")?,
                gpu_flags,
                child_timeout: flags.mig_child_timeout,
                pod_socket,
            })
        }
        None => None,
    };
    let wants_node = !flags.no_feature_labels
        || mig.is_some()
        || flags.taint_unhealthy
        || flags.nfd_features_file.is_some();
    Ok(Some(KubeConfig {
        client,
        node: wants_node.then(|| NodeOptions {
            feature_labels: !flags.no_feature_labels,
            nfd_file: flags.nfd_features_file.clone(),
            health: gpuops_labels::HealthPolicy {
                taint_enabled: flags.taint_unhealthy,
                taint_key: flags.taint_key.clone(),
            },
            machine_type: std::fs::read_to_string("/sys/class/dmi/id/product_name")
                .ok()
                .filter(|_| simulation.is_none())
                .map(|s| s.trim().to_string()),
        }),
        mig,
        resync: flags.node_resync,
    }))
}
