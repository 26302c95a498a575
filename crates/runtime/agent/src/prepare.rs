//! From the agent's settings (its flags and env vars as plain data) to the checked parts of
//! [`crate::AgentConfig`]: the Kubernetes side, the defaults taken from dcgm-exporter's env, and
//! where the device plugin and PodResources sockets are.

use crate::error::AgentError;
use crate::mig::FlowConfig;
use crate::node::{NodeOptions, StartupOptions};
use crate::startup::StartupTaint;
use crate::{ConfigSource, KubeConfig};
use gpuops_nvml::Library;
use gpuops_resources::config::Config;
use gpuops_resources::health::HealthPolicy;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// What the agent does on its Kubernetes Node, as the flags say.
#[derive(Debug, Clone)]
pub struct NodeSettings {
    /// `--kubernetes`: this agent runs for a Kubernetes node.
    pub kubernetes: bool,
    pub no_feature_labels: bool,
    pub nfd_features_file: Option<PathBuf>,
    pub taint_unhealthy: bool,
    pub taint_key: String,
    /// `KEY[=VALUE]:EFFECT`; empty: no startup taint.
    pub startup_taint: String,
    pub mig_config_file: Option<PathBuf>,
    pub mig_default_config: Option<String>,
    /// `NAMESPACE/NAME`: keep `mig_config_file` a copy of this ConfigMap, read through the API.
    pub mig_config_configmap: Option<String>,
    pub mig_drain_timeout: Duration,
    pub mig_retry: Duration,
    /// How long one MIG check or apply may run (`--mig-child-timeout`, named when they were
    /// child processes).
    pub mig_child_timeout: Duration,
    /// GPUOPS_MIG_CHECKPOINT: the MIG checkpoint file instead of the default.
    pub mig_checkpoint: Option<PathBuf>,
    /// MIG_PARTED_HOOKS_FILE: mig-parted hooks run around each MIG apply.
    pub mig_hooks_file: Option<PathBuf>,
    /// Pause between MIG driver calls (the test-only GPUOPS_MIG_STEP_DELAY).
    pub mig_step_delay: Option<Duration>,
    pub node_resync: Duration,
    pub client: gpuops_kube::ClientOptions,
}

/// Where the agent's GPUs come from, as far as the Kubernetes side needs to know.
#[derive(Debug, Clone, Default)]
pub struct GpuOrigin {
    /// The simulator's state directory, when simulating.
    pub sim_state: Option<PathBuf>,
    /// `--nvml-lib`, when given.
    pub nvml_lib: Option<PathBuf>,
}

impl GpuOrigin {
    /// The MIG checkpoint `gpuops mig apply` keeps for the same GPUs (`given` first).
    pub fn mig_checkpoint(&self, given: Option<&Path>) -> PathBuf {
        gpuops_migexec::checkpoint_path(given, self.sim_state.as_deref())
    }
}

/// The agent's Kubernetes side. `named_configs`: device plugin configs picked by a node label
/// (the node is then watched even when nothing is written).
pub fn kube_config(
    s: &NodeSettings,
    named_configs: bool,
    gpus: &GpuOrigin,
    pod_socket: Option<PathBuf>,
) -> Result<Option<KubeConfig>, AgentError> {
    let startup = StartupTaint::parse(&s.startup_taint)?;
    if !s.kubernetes {
        if s.mig_config_file.is_some() || s.taint_unhealthy || s.nfd_features_file.is_some() {
            return Err(AgentError::Flags(
                "--mig-config-file, --taint-unhealthy and --nfd-features-file act on the Kubernetes node: add --kubernetes",
            ));
        }
        // Named configs follow a node label: watch the node, write nothing.
        return Ok(named_configs.then(|| KubeConfig {
            client: s.client.clone(),
            node: None,
            mig: None,
            resync: s.node_resync,
        }));
    }
    let configmap = match &s.mig_config_configmap {
        None => None,
        Some(v) => match v.split_once('/') {
            Some((ns, name)) if !ns.is_empty() && !name.is_empty() && !name.contains('/') => {
                Some((ns.to_string(), name.to_string()))
            }
            _ => return Err(AgentError::ConfigMapFlag(v.clone())),
        },
    };
    if configmap.is_some() && s.mig_config_file.is_none() {
        return Err(AgentError::Flags(
            "--mig-config-configmap needs --mig-config-file (where the copy is kept)",
        ));
    }
    let mig = match &s.mig_config_file {
        Some(file) => {
            // A config file that cannot be read now is reported, not fatal: a ConfigMap may
            // appear later; the flow reports the problem on the node.
            if let Err(e) = std::fs::metadata(file) {
                tracing::warn!(file = %file.display(), "MIG config file {}: {e}", file.display());
            }
            Some(FlowConfig {
                config_file: file.clone(),
                default_config: s.mig_default_config.clone(),
                drain_timeout: s.mig_drain_timeout,
                backoff_min: s.mig_retry,
                backoff_max: Duration::from_secs(600),
                checkpoint: gpus.mig_checkpoint(s.mig_checkpoint.as_deref()),
                hooks_file: s.mig_hooks_file.clone(),
                deadline: s.mig_child_timeout,
                step_delay: s.mig_step_delay,
                pod_socket,
                configmap,
            })
        }
        None => None,
    };
    let wants_node = !s.no_feature_labels
        || mig.is_some()
        || s.taint_unhealthy
        || s.nfd_features_file.is_some()
        || startup.is_some();
    Ok(Some(KubeConfig {
        client: s.client.clone(),
        node: wants_node.then(|| NodeOptions {
            feature_labels: !s.no_feature_labels,
            nfd_file: s.nfd_features_file.clone(),
            health: gpuops_labels::HealthPolicy {
                taint_enabled: s.taint_unhealthy,
                taint_key: s.taint_key.clone(),
            },
            machine_type: std::fs::read_to_string("/sys/class/dmi/id/product_name")
                .ok()
                .filter(|_| gpus.sim_state.is_none())
                .map(|s| s.trim().to_string()),
            startup: startup.map(|taint| StartupOptions {
                taint,
                mig_config_file: s.mig_config_file.clone(),
                mig_default_config: s.mig_default_config.clone(),
            }),
        }),
        mig,
        resync: s.node_resync,
    }))
}

/// The node's name: the one given, else the host name, else `localhost`.
pub fn node_name(given: Option<String>) -> String {
    given
        .or_else(|| std::fs::read_to_string("/proc/sys/kernel/hostname").ok())
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".into())
}

/// What NVIDIA's device plugin says when NVML cannot be loaded, for the same situations.
pub const NVML_HINTS: &str = "if this is a GPU node, is the NVIDIA driver installed and the container \
    runtime set up to expose it (the nvidia runtime, or CDI)? If the driver is in a container, set \
    --nvidia-driver-root / CONTAINER_DRIVER_ROOT. If this is not a GPU node, deploy the agent only \
    to GPU nodes (a nodeSelector or affinity on nvidia.com/gpu.present)";

/// Where metrics listen and how often they are collected, unless a flag or dcgm-exporter's env says.
pub const DEFAULT_METRICS_ADDRESS: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED), 9400);
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(10);
/// Where the kubelet looks for device plugins.
pub const KUBELET_DEVICE_PLUGIN_DIR: &str = "/var/lib/kubelet/device-plugins";

/// The exporter's and device plugin's places, from the flags (`given`) and dcgm-exporter's env.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Places {
    pub metrics_address: SocketAddr,
    pub interval: Duration,
    /// The kubelet's PodResources socket; `None` on a simulated node unless given.
    pub pod_socket: Option<PathBuf>,
    pub plugin_dir: PathBuf,
}

/// Flags win over dcgm-exporter's env vars, which win over the defaults. A simulated node
/// (`sim_state`) touches no system path unless told to.
pub fn places(
    given: GivenPlaces,
    dcgm: &gpuops_metrics::DcgmExporterEnv,
    sim_state: Option<&Path>,
) -> Places {
    Places {
        metrics_address: given
            .metrics_address
            .or(dcgm.listen)
            .unwrap_or(DEFAULT_METRICS_ADDRESS),
        interval: given.interval.or(dcgm.interval).unwrap_or(DEFAULT_INTERVAL),
        pod_socket: given
            .pod_socket
            .or_else(|| dcgm.pod_resources_socket.clone())
            .or_else(|| {
                sim_state
                    .is_none()
                    .then(|| PathBuf::from(gpuops_kubelet_api::POD_RESOURCES_SOCKET))
            }),
        plugin_dir: given.plugin_dir.unwrap_or_else(|| match sim_state {
            Some(state) => state.join("device-plugins"),
            None => PathBuf::from(KUBELET_DEVICE_PLUGIN_DIR),
        }),
    }
}

/// The places the flags give, each optional.
#[derive(Debug, Clone, Default)]
pub struct GivenPlaces {
    pub metrics_address: Option<SocketAddr>,
    pub interval: Option<Duration>,
    pub pod_socket: Option<PathBuf>,
    pub plugin_dir: Option<PathBuf>,
}

/// Where the device plugin config comes from: `--config-file`, or a directory of named configs,
/// with the flags' and NVIDIA's env vars' overrides; resolved once now, so a bad config stops
/// the start with its file and line.
pub fn config_source(
    file: Option<PathBuf>,
    dir: Option<&Path>,
    default_name: Option<String>,
    flags: gpuops_resources::Overrides,
    env: gpuops_resources::Overrides,
) -> Result<(ConfigSource, Config), AgentError> {
    let named = dir.map(crate::load_dir).transpose()?;
    let source = ConfigSource {
        file,
        named,
        default_name,
        flags,
        env,
    };
    let config = source
        .resolve(None)
        .map_err(|e| AgentError::Config(Box::new(e)))?;
    Ok((source, config))
}

/// Where to look for NVML: the library the flags name, or on a real node the driver's under
/// the config's driver roots (a driver container's first).
pub fn nvml_libraries(library: &Library, simulated: bool, config: &Config) -> Vec<Library> {
    match (library, simulated) {
        (Library::System, false) => gpuops_nvml::driver_libraries(&[
            config
                .flags
                .plugin
                .container_driver_root
                .as_deref()
                .unwrap_or_default(),
            config.nvidia_driver_root(),
        ]),
        _ => vec![library.clone()],
    }
}

/// Opens NVML. Without it the agent stops, unless FAIL_ON_INIT_ERROR=false (and not `once`):
/// then it runs without GPUs (`None`), serving its own health and metrics, and retries.
pub fn open_gpus(
    libraries: &[Library],
    sysfs_root: &Path,
    config: &Config,
    once: bool,
) -> Result<Option<gpuops_nvml::Gpus>, AgentError> {
    match crate::open_nvml(libraries, sysfs_root) {
        Ok(g) => Ok(Some(g)),
        Err(e) if !config.fail_on_init_error() && !once => {
            tracing::error!(
                error = %e,
                "cannot load NVML; {NVML_HINTS}. FAIL_ON_INIT_ERROR=false: advertising nothing, serving the agent's own health and metrics, retrying with backoff"
            );
            Ok(None)
        }
        Err(e) => Err(AgentError::NvmlRequired(Box::new(e))),
    }
}

/// The host's device nodes for Allocate's device specs. A simulated node has none to probe: it
/// gets NVIDIA's full layout.
pub fn host_devices(sim_state: Option<&Path>, config: &Config) -> gpuops_resources::HostDevices {
    match sim_state {
        // A simulated node's device nodes are in its state directory (`gpuops sim dev-nodes`
        // makes them); without them Allocate presumes NVIDIA's full layout.
        Some(state) if state.join("dev").is_dir() => {
            gpuops_deviceplugin::probe_host(state, &state.join("proc"))
        }
        Some(_) => gpuops_resources::HostDevices::default(),
        None => {
            gpuops_deviceplugin::probe_host(Path::new(config.nvidia_dev_root()), Path::new("/proc"))
        }
    }
}

/// A simulated node, as the CDI spec sees it: its state directory and the driver root that
/// `gpuops sim dev-nodes` fills in it.
pub struct SimulatedRoots<'a> {
    pub state_dir: &'a Path,
    pub driver_root: PathBuf,
}

/// Where and how the agent writes its CDI spec, as `--cdi-spec-dir`, `--cdi-hook-path` and the
/// device plugin config say; `None`: no spec.
pub fn cdi_config(
    spec_dir: Option<&str>,
    hook_path: Option<String>,
    config: &Config,
    simulation: Option<SimulatedRoots<'_>>,
) -> Option<crate::CdiConfig> {
    use gpuops_resources::cdi::{DEFAULT_SPEC_DIR, SpecOptions, spec_file_name};
    let dir = match spec_dir {
        Some("") => return None,
        Some(d) => PathBuf::from(d),
        None if !config.device_list_strategies().any_cdi() => return None,
        None => match &simulation {
            Some(sim) => sim.state_dir.join("cdi"),
            None => PathBuf::from(DEFAULT_SPEC_DIR),
        },
    };
    // A simulated node's driver files and device nodes are in its state directory, which the
    // runtime must see at the same path (docs/cdi.md).
    let (probe_root, options) = match simulation {
        Some(sim) => {
            // Without `gpuops sim dev-nodes` there is nothing there: the usual paths, no files.
            let root = match sim.driver_root.is_dir() {
                true => sim.driver_root,
                false => sim.state_dir.to_path_buf(),
            };
            let dev_root = match sim.state_dir.join("dev").is_dir() {
                true => sim.state_dir.display().to_string(),
                false => "/".to_string(),
            };
            let options = SpecOptions {
                dev_root,
                driver_root: root.display().to_string(),
                gpuops_hook: hook_path,
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
                gpuops_hook: hook_path,
                ..SpecOptions::default()
            };
            (PathBuf::from(probe_root), options)
        }
    };
    let path = dir.join(spec_file_name(&options.kind));
    Some(crate::CdiConfig {
        path,
        probe_root,
        options,
    })
}

/// NVIDIA's DP_DISABLE_HEALTHCHECKS / DP_ENABLE_HEALTHCHECKS, and the quiet period after which
/// an XID no longer counts.
pub fn health_policy(
    vars: impl Fn(&str) -> Option<String>,
    quiet: Duration,
) -> Result<HealthPolicy, AgentError> {
    HealthPolicy::from_env(
        vars("DP_DISABLE_HEALTHCHECKS").as_deref(),
        vars("DP_ENABLE_HEALTHCHECKS").as_deref(),
        quiet.as_millis() as u64,
    )
    .map_err(AgentError::HealthPolicy)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> NodeSettings {
        NodeSettings {
            kubernetes: true,
            no_feature_labels: true,
            nfd_features_file: None,
            taint_unhealthy: false,
            taint_key: gpuops_labels::DEFAULT_TAINT_KEY.into(),
            startup_taint: crate::DEFAULT_STARTUP_TAINT.into(),
            mig_config_file: None,
            mig_default_config: None,
            mig_config_configmap: None,
            mig_drain_timeout: Duration::from_secs(300),
            mig_retry: Duration::from_secs(30),
            mig_child_timeout: Duration::from_secs(600),
            mig_checkpoint: None,
            mig_hooks_file: None,
            mig_step_delay: None,
            node_resync: Duration::from_secs(300),
            client: gpuops_kube::ClientOptions::default(),
        }
    }

    #[test]
    fn a_mig_config_configmap_is_namespace_slash_name_and_needs_the_file() {
        let mut s = settings();
        s.mig_config_file = Some(PathBuf::from("/tmp/mig.yaml"));
        s.mig_config_configmap = Some("gpuops/gpuops-mig-config".into());
        let k = kube_config(&s, false, &GpuOrigin::default(), None)
            .unwrap()
            .unwrap();
        assert_eq!(
            k.mig.unwrap().configmap,
            Some(("gpuops".to_string(), "gpuops-mig-config".to_string()))
        );
        for bad in ["gpuops-mig-config", "/name", "ns/", "a/b/c"] {
            s.mig_config_configmap = Some(bad.into());
            let e = kube_config(&s, false, &GpuOrigin::default(), None)
                .err()
                .unwrap()
                .to_string();
            assert!(
                e.contains("--mig-config-configmap")
                    && e.contains(bad)
                    && e.contains("NAMESPACE/NAME"),
                "{bad}: {e}"
            );
        }
        s.mig_config_file = None;
        s.mig_config_configmap = Some("gpuops/gpuops-mig-config".into());
        let e = kube_config(&s, false, &GpuOrigin::default(), None)
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("needs --mig-config-file"), "{e}");
    }

    #[test]
    fn the_startup_taint_is_on_by_default_and_an_empty_flag_turns_it_off() {
        let k = kube_config(&settings(), false, &GpuOrigin::default(), None)
            .unwrap()
            .unwrap();
        let startup = k.node.unwrap().startup.unwrap();
        assert_eq!(startup.taint.key, "gpuops.io/gpu-not-ready");
        assert_eq!(startup.taint.effect, "NoSchedule");
        let off = NodeSettings {
            startup_taint: String::new(),
            ..settings()
        };
        // Nothing else to write: no node reconciler at all.
        let k = kube_config(&off, false, &GpuOrigin::default(), None)
            .unwrap()
            .unwrap();
        assert!(k.node.is_none());
    }

    #[test]
    fn a_bad_startup_taint_or_node_flags_without_kubernetes_are_refused_by_name() {
        let bad = NodeSettings {
            startup_taint: "gpuops.io/x:Never".into(),
            ..settings()
        };
        let e = kube_config(&bad, false, &GpuOrigin::default(), None).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("--startup-taint \"gpuops.io/x:Never\": the effect \"Never\""),
            "{e}"
        );
        let off = NodeSettings {
            kubernetes: false,
            taint_unhealthy: true,
            ..settings()
        };
        let e = kube_config(&off, false, &GpuOrigin::default(), None).unwrap_err();
        assert!(e.to_string().contains("add --kubernetes"), "{e}");
        let plain = NodeSettings {
            kubernetes: false,
            ..settings()
        };
        let k = kube_config(&plain, true, &GpuOrigin::default(), None).unwrap();
        assert!(k.is_some_and(|k| k.node.is_none()));
    }

    #[test]
    fn the_mig_flow_reaches_the_same_gpus_and_the_startup_taint_knows_its_file() {
        let with_mig = NodeSettings {
            mig_config_file: Some(PathBuf::from("/etc/gpuops/mig.yaml")),
            mig_default_config: Some("all-disabled".into()),
            mig_config_configmap: None,
            ..settings()
        };
        let sim = GpuOrigin {
            sim_state: Some(PathBuf::from("/tmp/n1")),
            nvml_lib: None,
        };
        let k = kube_config(&with_mig, false, &sim, None).unwrap().unwrap();
        let flow = k.mig.unwrap();
        // The same GPUs, so the same checkpoint as `gpuops mig apply --sim-state /tmp/n1`.
        assert_eq!(
            flow.checkpoint,
            PathBuf::from("/tmp/n1/mig-checkpoint.json")
        );
        let given = NodeSettings {
            mig_checkpoint: Some(PathBuf::from("/data/cp.json")),
            ..with_mig.clone()
        };
        let other = kube_config(&given, false, &sim, None).unwrap().unwrap();
        assert_eq!(
            other.mig.unwrap().checkpoint,
            PathBuf::from("/data/cp.json")
        );
        let startup = k.node.unwrap().startup.unwrap();
        assert_eq!(
            startup.mig_config_file,
            Some(PathBuf::from("/etc/gpuops/mig.yaml"))
        );
        assert_eq!(startup.mig_default_config.as_deref(), Some("all-disabled"));
    }

    #[test]
    fn flags_win_over_dcgm_exporter_env_and_a_simulated_node_touches_no_system_path() {
        let dcgm = gpuops_metrics::DcgmExporterEnv::from_vars([
            ("DCGM_EXPORTER_LISTEN".to_string(), ":9500".to_string()),
            ("DCGM_EXPORTER_INTERVAL".to_string(), "30000".to_string()),
        ])
        .unwrap();
        let p = places(GivenPlaces::default(), &dcgm, Some(Path::new("/tmp/sim")));
        assert_eq!(p.metrics_address.port(), 9500);
        assert_eq!(p.interval, Duration::from_secs(30));
        assert_eq!(p.pod_socket, None);
        assert_eq!(p.plugin_dir, PathBuf::from("/tmp/sim/device-plugins"));
        let given = GivenPlaces {
            interval: Some(Duration::from_secs(1)),
            ..GivenPlaces::default()
        };
        let p = places(given, &dcgm, None);
        assert_eq!(p.interval, Duration::from_secs(1));
        assert_eq!(p.plugin_dir, PathBuf::from(KUBELET_DEVICE_PLUGIN_DIR));
        assert!(p.pod_socket.is_some());
    }

    #[test]
    fn a_bad_device_plugin_config_or_health_setting_stops_the_start_with_its_place() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("config.yaml");
        std::fs::write(&file, "version: v1\nflags:\n  migStrategy: sometimes\n").unwrap();
        let e = config_source(
            Some(file.clone()),
            None,
            None,
            gpuops_resources::Overrides::default(),
            gpuops_resources::Overrides::default(),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("config.yaml") && e.contains("sometimes"), "{e}");
        let vars = |v: &str| (v == "DP_DISABLE_HEALTHCHECKS").then(|| "maybe".to_string());
        let e = health_policy(vars, Duration::from_secs(60)).unwrap_err();
        assert!(e.to_string().contains("maybe"), "{e}");
        let libs = nvml_libraries(&Library::System, true, &gpuops_resources::Config::default());
        assert_eq!(libs, [Library::System]);
    }
}
