//! `gpuops agent` and `gpuops exporter`: flags -> [`gpuops_agent::AgentConfig`] ->
//! [`gpuops_agent::Agent::run`]; the runtime itself lives in the gpuops-agent crate.

use crate::gpu_source::{self, GpuArgs};

use anyhow::{Context, Result};
use gpuops_agent::{AgentConfig, MetricsConfig, prepare};
use gpuops_metrics::HostnameLabel;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
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
    c: Collection,
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
    /// The named config of --config-dir for nodes without the `nvidia.com/device-plugin.config`
    /// label (NVIDIA's chart: `config.default`) [default: the config named `default`, else the
    /// only one].
    #[arg(
        long,
        env = "GPUOPS_DEFAULT_CONFIG",
        value_name = "NAME",
        requires = "config_dir"
    )]
    default_config: Option<String>,
    /// Do not serve the kubelet device plugin API.
    #[arg(long)]
    no_device_plugin: bool,
    /// NVIDIA's MPS control daemon, started per MPS-shared device plugin resource and per DRA
    /// claim whose opaque config asks for MPS sharing, its directories under --mps-root (the
    /// config's mpsRoot, default /run/nvidia/mps) [default: usr/bin/nvidia-cuda-mps-control
    /// under the driver root, where it is]. Without one, MPS-shared resources are not served
    /// and MPS claims fail to prepare, saying so.
    #[arg(long, env = "GPUOPS_MPS_CONTROL_BINARY", value_name = "FILE")]
    mps_control_binary: Option<PathBuf>,
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
    #[command(flatten)]
    dra: DraFlags,
}

/// The DRA driver (docs/dra.md).
#[derive(Debug, Clone, Default, clap::Args)]
#[command(next_help_heading = "Dynamic Resource Allocation (docs/dra.md)")]
pub struct DraFlags {
    /// Serve the GPUs as DRA driver gpu.nvidia.com (NVIDIA's names): register with the kubelet,
    /// publish the node's ResourceSlices, prepare claims with a CDI spec each (in --cdi-spec-dir,
    /// default /var/run/cdi). Needs --kubernetes and --no-device-plugin: a node's GPUs are
    /// served by one of the two, never both.
    #[arg(long, env = "GPUOPS_DRA")]
    dra: bool,
    /// The kubelet's plugin registration directory [default: /var/lib/kubelet/plugins_registry].
    #[arg(long, env = "GPUOPS_DRA_REGISTRY_DIR", value_name = "DIR")]
    dra_registry_dir: Option<PathBuf>,
    /// The kubelet's plugins directory; the driver's socket and checkpoint go in
    /// <DIR>/gpu.nvidia.com [default: /var/lib/kubelet/plugins].
    #[arg(long, env = "GPUOPS_DRA_PLUGINS_DIR", value_name = "DIR")]
    dra_plugins_dir: Option<PathBuf>,
    /// Mark unhealthy devices with device taints instead of leaving them out of the slice
    /// (the cluster's DRADeviceTaints feature gate must be on).
    #[arg(long, env = "GPUOPS_DRA_DEVICE_TAINTS")]
    dra_device_taints: bool,
    /// Dynamic MIG (the cluster's DRAPartitionableDevices feature gate must be on): offer every
    /// valid MIG placement of each MIG-capable GPU from a shared counter set, create a claim's
    /// MIG device at prepare and destroy it at unprepare. The GPUs' MIG devices then belong to
    /// claims: MIG devices no prepared claim holds are destroyed at start, and the MIG manager
    /// (--mig-config-file) must be off.
    #[arg(long, env = "GPUOPS_DRA_DYNAMIC_MIG", requires = "dra")]
    dra_dynamic_mig: bool,
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
    /// KEY[=VALUE]:EFFECT removed from the node once every device it is configured to offer is
    /// advertised and healthy (register it with the kubelet's --register-with-taints and declare
    /// it to the autoscaler: docs/startup-taint.md); never put back. Empty: none.
    #[arg(long, env = "GPUOPS_STARTUP_TAINT", default_value = gpuops_agent::DEFAULT_STARTUP_TAINT, value_name = "TAINT")]
    startup_taint: String,
    /// mig-parted config file (a mounted ConfigMap) whose config the node label
    /// nvidia.com/mig.config names; the agent applies it and reports nvidia.com/mig.config.state.
    #[arg(long, env = "GPUOPS_MIG_CONFIG_FILE", value_name = "FILE")]
    mig_config_file: Option<PathBuf>,
    /// Config applied when the node has no nvidia.com/mig.config label, before the device plugin
    /// advertises anything (so no pod lands on the wrong layout).
    #[arg(long, env = "GPUOPS_MIG_DEFAULT_CONFIG", value_name = "NAME")]
    mig_default_config: Option<String>,
    /// Keep --mig-config-file a copy of this ConfigMap's config.yaml, read and watched through
    /// the API (a change is seen in seconds, not at the kubelet's next volume sync).
    #[arg(
        long,
        env = "GPUOPS_MIG_CONFIG_CONFIGMAP",
        value_name = "NAMESPACE/NAME"
    )]
    mig_config_configmap: Option<String>,
    /// How long a MIG change waits for pods using the GPUs before it gives up (state failed,
    /// resources restored, retried with backoff).
    #[arg(long, env = "GPUOPS_MIG_DRAIN_TIMEOUT", default_value = "5m", value_parser = super::parse_duration)]
    mig_drain_timeout: Duration,
    /// First wait before retrying a failed MIG change (doubles up to 10m).
    #[arg(long, env = "GPUOPS_MIG_RETRY", default_value = "30s", value_parser = super::parse_duration)]
    mig_retry: Duration,
    /// How long one MIG check or apply may run before it is cancelled (it stops before its next
    /// driver call) and the change counts as failed (the GPUs are advertised again).
    #[arg(long, env = "GPUOPS_MIG_CHILD_TIMEOUT", default_value = "10m", value_parser = super::parse_duration)]
    mig_child_timeout: Duration,
    /// Pause between MIG driver calls (test-only, cargo feature `test-hooks`).
    #[cfg(feature = "test-hooks")]
    #[arg(long, hide = true, env = "GPUOPS_MIG_STEP_DELAY", value_parser = super::parse_duration)]
    mig_step_delay: Option<Duration>,
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
    c: Collection,
    /// Where /metrics listens; port 0 picks a free one (printed at start) [default: 0.0.0.0:9400,
    /// or dcgm-exporter's DCGM_EXPORTER_LISTEN, e.g. :9400].
    #[arg(long, env = "GPUOPS_METRICS_ADDRESS")]
    address: Option<SocketAddr>,
}

/// What the agent and the exporter both read and collect.
#[derive(Debug, clap::Args)]
struct Collection {
    #[command(flatten)]
    gpus: GpuArgs,
    /// Name of this node (labels, metrics); defaults to the host name.
    #[arg(long, env = "NODE_NAME")]
    node_name: Option<String>,
    /// How often to re-read the GPUs and refresh the metrics (dcgm-exporter's collect interval; a
    /// scrape always gets the last collection at once) [default: 10s, or DCGM_EXPORTER_INTERVAL ms].
    #[arg(long, value_parser = super::parse_duration)]
    interval: Option<Duration>,
    /// How the node label on every metric is spelled: `hostname` (dcgm-exporter 4.6 and later, what
    /// the GPU Operator ships) or `Hostname` (dcgm-exporter before 4.6).
    #[arg(long, env = "GPUOPS_HOSTNAME_LABEL", default_value = "hostname", value_parser = parse_hostname_label)]
    hostname_label: HostnameLabel,
    /// The kubelet's PodResources socket, for the pod, namespace and container labels on metrics
    /// [default: DCGM_POD_RESOURCES_KUBELET_SOCKET, else /var/lib/kubelet/pod-resources/kubelet.sock;
    /// with --simulate: none unless given]. DCGM_EXPORTER_KUBERNETES=false turns pod labels off.
    #[arg(long, env = "GPUOPS_POD_RESOURCES_SOCKET", value_name = "FILE")]
    pod_resources_socket: Option<PathBuf>,
    /// A device an XID made unhealthy is healthy again after this long without another counted XID
    /// (and once the driver answers for it). NVIDIA's plugin never recovers without a restart.
    #[arg(long, env = "GPUOPS_HEALTH_QUIET_PERIOD", default_value = "5m", value_parser = super::parse_duration)]
    health_quiet_period: Duration,
}

impl Args {
    /// `--once`: print the inventory and exit.
    pub fn once(&self) -> bool {
        self.once
    }
}

/// `gpuops exporter`: the agent loop with metrics only.
pub fn run_exporter(a: ExporterArgs) -> Result<ExitCode> {
    run(Args {
        c: a.c,
        once: false,
        metrics_address: a.address,
        no_metrics: false,
        device_plugin_dir: None,
        config_file: None,
        config_dir: None,
        default_config: None,
        no_device_plugin: true,
        mps_control_binary: None,
        snapshot_timeout: Duration::from_secs(30),
        node: NodeFlags::default(),
        nvidia: NvidiaFlags::default(),
        // The exporter serves no device plugin: no spec for its devices.
        cdi: CdiFlags {
            cdi_spec_dir: Some(String::new()),
            cdi_hook_path: None,
        },
        dra: DraFlags::default(),
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
        fn o(v: &Option<String>) -> Option<&str> {
            v.as_deref()
        }
        gpuops_resources::config::Overrides::from_flags([
            ("MIG_STRATEGY", o(&self.mig_strategy)),
            ("FAIL_ON_INIT_ERROR", o(&self.fail_on_init_error)),
            ("NVIDIA_DRIVER_ROOT", o(&self.nvidia_driver_root)),
            ("NVIDIA_DEV_ROOT", o(&self.nvidia_dev_root)),
            ("PASS_DEVICE_SPECS", o(&self.pass_device_specs)),
            ("DEVICE_LIST_STRATEGY", o(&self.device_list_strategy)),
            ("DEVICE_ID_STRATEGY", o(&self.device_id_strategy)),
            ("CDI_ANNOTATION_PREFIX", o(&self.cdi_annotation_prefix)),
            ("MPS_ROOT", o(&self.mps_root)),
            (
                "SHARED_DEVICES_ALLOCATION_POLICY",
                o(&self.shared_devices_allocation_policy),
            ),
            ("DEVICE_SPLIT_COUNT", o(&self.device_split_count)),
        ])
        .map_err(anyhow::Error::msg)
    }
}

fn parse_hostname_label(text: &str) -> Result<HostnameLabel, String> {
    match text {
        "Hostname" => Ok(HostnameLabel::Upper),
        "hostname" => Ok(HostnameLabel::Lower),
        _ => Err(format!("{text:?}: use Hostname or hostname")),
    }
}

// Long on purpose: it maps each flag group onto the agent's config in one place, a step per group, so the flags and what they set are read side by side.
pub fn run(args: Args) -> Result<ExitCode> {
    // dcgm-exporter's env vars, so its DaemonSets can switch images; our flags and env win.
    let dcgm = gpuops_metrics::DcgmExporterEnv::from_vars(std::env::vars())?;
    for note in &dcgm.ignored {
        tracing::warn!("{note}");
    }
    // Refused before anything is opened: the message says which flag to change.
    gpuops_agent::check_dra_flags(args.dra.dra, !args.no_device_plugin, args.node.kubernetes)?;
    if args.dra.dra_dynamic_mig && args.node.mig_config_file.is_some() {
        anyhow::bail!(
            "--dra-dynamic-mig makes a claim's MIG device at prepare, and the MIG manager (--mig-config-file) would change the same GPUs' MIG devices from the node label: drop one (chart: dra.dynamicMig turns mig.enabled off on the DRA nodes)"
        );
    }
    // Preparing may set the simulator's environment: do it before the runtime starts threads.
    let (library, simulation) = gpu_source::prepare(&args.c.gpus)?;
    let (source, config) = prepare::config_source(
        args.config_file.clone(),
        args.config_dir.as_deref(),
        args.default_config.clone(),
        args.nvidia.overrides()?,
        gpuops_resources::config::Overrides::from_env(std::env::vars())?,
    )?;
    let libraries = prepare::nvml_libraries(&library, simulation.is_some(), &config);
    let gpus = prepare::open_gpus(&libraries, &args.c.gpus.sysfs_root, &config, args.once)?;
    let node = prepare::node_name(args.c.node_name.clone());
    let places = prepare::places(
        prepare::GivenPlaces {
            metrics_address: args.metrics_address,
            interval: args.c.interval,
            pod_socket: args.c.pod_resources_socket.clone(),
            plugin_dir: args.device_plugin_dir.clone(),
        },
        &dcgm,
        simulation.as_ref().map(|s| s.state_dir.as_path()),
    );
    let (metrics_address, interval) = (places.metrics_address, places.interval);
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
    print!("{}", gpuops_inventory::render::tables(&first));
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
    let pod_socket = places.pod_socket.clone();
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
    let plugin_dir = places.plugin_dir;
    let sim_state = simulation.as_ref().map(|s| s.state_dir.as_path());
    let host_devices = prepare::host_devices(sim_state, &config);
    let cdi = prepare::cdi_config(
        args.cdi.cdi_spec_dir.as_deref(),
        args.cdi.cdi_hook_path.clone(),
        &config,
        sim_state.map(|state_dir| prepare::SimulatedRoots {
            state_dir,
            driver_root: state_dir.join(gpuops_sim::devnodes::DRIVER_ROOT),
        }),
    );
    match &cdi {
        Some(c) => println!("  CDI spec       {}", c.path.display()),
        None => println!("  CDI spec       not written (--cdi-spec-dir)"),
    }
    // The driver's files as this process sees them, as the CDI spec probes them.
    let mps_control_binary = |probe_root: Option<&Path>| {
        args.mps_control_binary.clone().or_else(|| {
            let root = match probe_root {
                Some(r) => r.to_path_buf(),
                None => {
                    prepare::cdi_config(
                        Some("."),
                        None,
                        &config,
                        sim_state.map(|state_dir| prepare::SimulatedRoots {
                            state_dir,
                            driver_root: state_dir.join(gpuops_sim::devnodes::DRIVER_ROOT),
                        }),
                    )?
                    .probe_root
                }
            };
            Some(root.join("usr/bin/nvidia-cuda-mps-control")).filter(|p| p.is_file())
        })
    };
    let dra = args.dra.dra.then(|| {
        // Claims get their own specs beside the node's, in --cdi-spec-dir or the default.
        let dir = args
            .cdi
            .cdi_spec_dir
            .clone()
            .filter(|d| !d.is_empty())
            .unwrap_or_else(|| match sim_state {
                Some(s) => s.join("cdi").display().to_string(),
                None => gpuops_resources::cdi::DEFAULT_SPEC_DIR.to_string(),
            });
        let roots = prepare::cdi_config(
            Some(&dir),
            args.cdi.cdi_hook_path.clone(),
            &config,
            sim_state.map(|state_dir| prepare::SimulatedRoots {
                state_dir,
                driver_root: state_dir.join(gpuops_sim::devnodes::DRIVER_ROOT),
            }),
        );
        let plugin = gpuops_agent::DraPluginConfig::new(
            gpuops_agent::DRA_DRIVER_NAME,
            &args
                .dra
                .dra_registry_dir
                .clone()
                .unwrap_or_else(|| gpuops_kubelet_api::PLUGINS_REGISTRY_DIR.into()),
            &args
                .dra
                .dra_plugins_dir
                .clone()
                .unwrap_or_else(|| gpuops_kubelet_api::PLUGINS_DIR.into()),
        );
        println!(
            "  DRA            driver {} at {}, claims' CDI specs in {dir}",
            plugin.driver,
            plugin.registration_socket().display()
        );
        let probe_root = roots
            .as_ref()
            .map(|r| r.probe_root.clone())
            .unwrap_or_else(|| PathBuf::from("/"));
        let mps_binary = mps_control_binary(Some(&probe_root));
        match &mps_binary {
            Some(b) => println!("  MPS            {} (daemons in {})", b.display(), config.mps_root()),
            None => println!("  MPS            no nvidia-cuda-mps-control (--mps-control-binary): claims asking for MPS fail"),
        }
        gpuops_agent::DraConfig {
            mps: mps_binary.map(|b| gpuops_agent::MpsConfig::new(b, config.mps_root())),
            plugin,
            cdi_dir: PathBuf::from(&dir),
            probe_root,
            spec_options: roots.map(|r| r.options).unwrap_or_default(),
            options: gpuops_agent::DraOptions {
                device_taints: args.dra.dra_device_taints,
                dynamic_mig: args.dra.dra_dynamic_mig,
                ..gpuops_agent::DraOptions::default()
            },
            resync: Duration::from_secs(60),
        }
    });
    let published = gpuops_agent::publish(
        &first,
        &config,
        &gpuops_resources::health::HealthTracker::default(),
        &Arc::new(host_devices.clone()),
    )?;
    let policy = prepare::health_policy(|v| std::env::var(v).ok(), args.c.health_quiet_period)?;
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
    let origin = prepare::GpuOrigin {
        sim_state: simulation.as_ref().map(|s| s.state_dir.clone()),
        nvml_lib: args.c.gpus.nvml_lib.clone(),
    };
    let kube = prepare::kube_config(
        &args.node.settings(),
        args.config_dir.is_some(),
        &origin,
        pod_socket.clone(),
    )?;
    let metrics = metrics_listener.map(|listener| MetricsConfig {
        hostname_label: args.c.hostname_label,
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
        sysfs_root: args.c.gpus.sysfs_root.clone(),
        cdi,
        dra,
        mps_control_binary: mps_control_binary(None).filter(|_| !args.no_device_plugin),
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

/// A path from an environment variable; unset or empty: none.
fn env_path(var: &str) -> Option<PathBuf> {
    std::env::var_os(var)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
}

impl NodeFlags {
    fn settings(&self) -> prepare::NodeSettings {
        prepare::NodeSettings {
            kubernetes: self.kubernetes,
            no_feature_labels: self.no_feature_labels,
            nfd_features_file: self.nfd_features_file.clone(),
            taint_unhealthy: self.taint_unhealthy,
            taint_key: self.taint_key.clone(),
            startup_taint: self.startup_taint.clone(),
            mig_config_file: self.mig_config_file.clone(),
            mig_default_config: self.mig_default_config.clone(),
            mig_config_configmap: self.mig_config_configmap.clone(),
            mig_drain_timeout: self.mig_drain_timeout,
            mig_retry: self.mig_retry,
            mig_child_timeout: self.mig_child_timeout,
            // What the `gpuops mig apply` children the agent ran before read from the
            // environment they inherited.
            mig_checkpoint: env_path("GPUOPS_MIG_CHECKPOINT"),
            mig_hooks_file: env_path("MIG_PARTED_HOOKS_FILE"),
            #[cfg(feature = "test-hooks")]
            mig_step_delay: self.mig_step_delay,
            #[cfg(not(feature = "test-hooks"))]
            mig_step_delay: None,
            node_resync: self.node_resync,
            client: gpuops_kube::ClientOptions {
                kubeconfig: self.kubeconfig.clone(),
                context: self.context.clone(),
                request_timeout: self.kube_timeout,
                ..gpuops_kube::ClientOptions::default()
            },
        }
    }
}
