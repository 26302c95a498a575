//! The agent crate's one error type.
//!
//! Where a variant's text already holds the error it wraps (`{error}`), that error is a field and
//! not a `#[source]`, so a `{:#}` chain (the binary's `error: …`) does not say it twice.

use gpuops_migexec::Category;
use std::path::PathBuf;
use std::time::Duration;

/// Why the agent could not start or stopped, and why one of its jobs (the MIG flow, the CDI
/// spec, the device plugin config) failed.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error(transparent)]
    Kube(#[from] gpuops_kube::KubeError),

    // The device plugin config.
    /// A problem with the device plugin config, at the agent's start.
    #[error("device plugin config: {0}")]
    Config(Box<AgentError>),
    #[error("reading config directory {}: {error}", dir.display())]
    ReadConfigDir { dir: PathBuf, error: std::io::Error },
    #[error("reading {}: {error}", path.display())]
    ReadNamedConfig {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("reading device plugin config {}: {error}", path.display())]
    ReadConfigFile {
        path: PathBuf,
        error: std::io::Error,
    },
    /// A device plugin config, model or CDI spec gpuops-resources rejected.
    #[error(transparent)]
    Resources(#[from] gpuops_resources::ResourcesError),

    // Settings that cannot work, named by their flag.
    // `--startup-taint`; `text` is the flag's value.
    #[error(
        "--startup-taint {text:?} has no effect: write KEY[=VALUE]:EFFECT, e.g. {:?}",
        crate::startup::DEFAULT_STARTUP_TAINT
    )]
    StartupTaintNoEffect { text: String },
    #[error(
        "--startup-taint {text:?}: the effect {effect:?} is not one of {}",
        crate::startup::EFFECTS.join(", ")
    )]
    StartupTaintEffect { text: String, effect: String },
    #[error("--startup-taint {text:?}: the key {key:?} {why}")]
    StartupTaintKey {
        text: String,
        key: String,
        why: &'static str,
    },
    #[error(
        "--startup-taint {text:?}: the value {value:?} must be at most 63 letters, digits, '-', '_' or '.'"
    )]
    StartupTaintValue { text: String, value: String },
    /// Flags that only work together.
    #[error("{0}")]
    Flags(&'static str),
    /// The flag's value, as the user gave it.
    #[error("--mig-config-configmap {0:?}: expected NAMESPACE/NAME")]
    ConfigMapFlag(String),
    /// NVML cannot be loaded and the agent may not run without it.
    #[error(
        "{0}. {hints}; or set FAIL_ON_INIT_ERROR=false to keep the agent up without GPUs",
        hints = crate::prepare::NVML_HINTS
    )]
    NvmlRequired(Box<AgentError>),
    /// No NVML library could be loaded: the places that do not exist, then each load's error.
    #[error("{}", nvml_open_text(missing, errors))]
    NvmlOpen {
        missing: Vec<PathBuf>,
        errors: Vec<gpuops_nvml::NvmlError>,
    },
    /// DP_DISABLE_HEALTHCHECKS / DP_ENABLE_HEALTHCHECKS as gpuops-resources rejected them.
    #[error(transparent)]
    HealthPolicy(gpuops_resources::ResourcesError),

    // The DRA driver.
    /// One claim's prepare or unprepare failed; the kubelet shows this text on the pod.
    #[error("claim {claim}: {message}")]
    DraClaim { claim: String, message: String },
    /// A claim's allocated device is not among the node's devices now (MIG changed, GPU lost).
    #[error("device {name} ({uuid}) is not on this node now")]
    DraDeviceGone { name: String, uuid: String },
    /// The kubelet plugin or its checkpoint.
    #[error("DRA: {0}")]
    DraPlugin(gpuops_draplugin::DraPluginError),
    /// DRA reads claims and writes ResourceSlices through the API server.
    #[error(
        "DRA needs the Kubernetes side (--kubernetes): claims and ResourceSlices live in the API server"
    )]
    DraNeedsKubernetes,
    /// The device plugin and DRA would both advertise this node's GPUs.
    #[error(
        "--dra serves this node's GPUs through DRA, and the device plugin would advertise the same GPUs again: add --no-device-plugin (chart: devicePlugin.enabled=false, or dra.nodeSelector for the pools that use DRA)"
    )]
    DraWithDevicePlugin,

    // The CDI spec and its hook.
    /// A problem with the CDI spec, at the agent's start.
    #[error("CDI: {0}")]
    Cdi(Box<AgentError>),
    #[error("CDI: driver root {}: {error}", root.display())]
    DriverRoot {
        root: PathBuf,
        error: std::io::Error,
    },
    #[error("CDI: driver root {}: not a directory", root.display())]
    DriverRootNotDir { root: PathBuf },
    #[error("CDI: driver root {}: cannot be read: {error}", root.display())]
    DriverRootUnreadable {
        root: PathBuf,
        error: std::io::Error,
    },
    /// The problems gpuops-resources' validator found.
    #[error("the spec is invalid: {}", .0.join("; "))]
    CdiSpecInvalid(Vec<String>),
    #[error("CDI: serializing the CDI spec: {0}")]
    CdiSerialize(serde_json::Error),
    #[error("CDI: writing the CDI spec: {0}")]
    CdiWrite(gpuops_atomicfile::AtomicWriteError),
    /// The OCI state or the folders the ldcache hook was given, as gpuops-resources rejected them.
    #[error(transparent)]
    CdiHook(gpuops_resources::ResourcesError),
    #[error("{} is a symlink in the container's image; not writing through it", .0.display())]
    CdiHookSymlink(PathBuf),
    #[error("{error}: {}", error.source)]
    CdiHookWrite {
        error: gpuops_atomicfile::AtomicWriteError,
    },
    #[error("running {}: {error}", ldconfig.display())]
    Ldconfig {
        ldconfig: PathBuf,
        error: std::io::Error,
    },
    #[error("{} -r {}: {status}", ldconfig.display(), root.display())]
    LdconfigFailed {
        ldconfig: PathBuf,
        root: PathBuf,
        status: std::process::ExitStatus,
    },

    // What the node should offer (the startup taint).
    /// A MIG config gpuops-mig rejected for this node's GPUs.
    #[error(transparent)]
    MigConfig(#[from] gpuops_mig::MigError),
    /// The MIG config file the node's config is read from cannot be read.
    #[error("MIG config file {}: {error}", path.display())]
    MigConfigRead {
        path: PathBuf,
        error: std::io::Error,
    },
    /// The MIG config file does not have the config the node names.
    #[error("{}: {error}", file.display())]
    MigConfigIn {
        file: PathBuf,
        error: Box<gpuops_mig::MigError>,
    },

    // The MIG flow.
    /// Reading, planning or applying a MIG config (gpuops-migexec).
    #[error(transparent)]
    MigExec(#[from] gpuops_migexec::ExecError),
    /// A MIG check or apply overran its deadline; an apply stops before its next driver call.
    #[error("{what} did not finish within {after:?}{}", if *.what == APPLY { "; it stops before its next driver call" } else { "" })]
    MigDeadline { what: &'static str, after: Duration },
    /// An earlier check or apply is still inside a driver call that has not returned.
    #[error("the previous {0} has not returned from the NVIDIA driver yet")]
    MigStillRunning(&'static str),
    #[error("NVML is not loaded (the agent keeps trying to load it)")]
    MigNoNvml,
    /// The apply went through, but a MIG mode change waits for a GPU reset (one line per GPU).
    #[error("{}", .0.join("\n"))]
    MigPendingReset(Vec<String>),
    /// Pods still held the devices the change takes away (`namespace/pod`, or why the holders
    /// are unknown).
    #[error(
        "timed out after {after:?} waiting for pods using this node's GPUs to finish ({}); nothing was changed and the GPUs are advertised again",
        holders.join(", ")
    )]
    MigDrain {
        after: Duration,
        holders: Vec<String>,
    },
    /// The blocking task of a check or apply panicked.
    #[error("the MIG task failed: {0}")]
    MigTask(tokio::task::JoinError),
    /// The kubelet's PodResources socket could not be connected to.
    #[error("cannot connect: {0}")]
    PodResourcesConnect(#[source] tonic::transport::Error),
    /// The kubelet answered PodResources `List()` with an error.
    #[error("List failed: {}", .0.message())]
    PodResourcesList(#[source] Box<tonic::Status>),
    #[error("no answer within {0:?}")]
    PodResourcesTimeout(Duration),
}

/// What the MIG flow calls its two blocking jobs (in [`AgentError::MigDeadline`] and
/// [`AgentError::MigStillRunning`]).
pub(crate) const CHECK: &str = "MIG check";
pub(crate) const APPLY: &str = "MIG apply";

fn nvml_open_text(missing: &[PathBuf], errors: &[gpuops_nvml::NvmlError]) -> String {
    let mut parts: Vec<String> = Vec::new();
    if !missing.is_empty() {
        let places: Vec<String> = missing.iter().map(|p| p.display().to_string()).collect();
        parts.push(format!("no NVML library at {}", places.join(", ")));
    }
    parts.extend(errors.iter().map(ToString::to_string));
    parts.join("; ")
}

impl AgentError {
    /// What a failure asks of the MIG flow: retry with backoff, wait for a new config, or
    /// report the node and retry only slowly. Start-up failures are configuration.
    pub fn category(&self) -> Category {
        use AgentError::*;
        match self {
            MigExec(e) => e.category(),
            MigConfig(_) | MigConfigRead { .. } | MigConfigIn { .. } => Category::Config,
            Kube(_)
            | MigDeadline { .. }
            | MigDrain { .. }
            | DraClaim { .. }
            | DraDeviceGone { .. }
            | MigTask(_)
            | PodResourcesConnect(_)
            | PodResourcesList(_)
            | PodResourcesTimeout(_) => Category::Retryable,
            // A driver that does not return, is not loaded, or waits for a reset.
            MigStillRunning(_) | MigNoNvml | MigPendingReset(_) | NvmlOpen { .. } => {
                Category::Hardware
            }
            Config(_)
            | ReadConfigDir { .. }
            | ReadNamedConfig { .. }
            | ReadConfigFile { .. }
            | Resources(_)
            | StartupTaintNoEffect { .. }
            | StartupTaintEffect { .. }
            | StartupTaintKey { .. }
            | StartupTaintValue { .. }
            | Flags(_)
            | ConfigMapFlag(_)
            | NvmlRequired(_)
            | HealthPolicy(_)
            | DraPlugin(_)
            | DraNeedsKubernetes
            | DraWithDevicePlugin
            | Cdi(_)
            | DriverRoot { .. }
            | DriverRootNotDir { .. }
            | DriverRootUnreadable { .. }
            | CdiSpecInvalid(_)
            | CdiSerialize(_)
            | CdiWrite(_)
            | CdiHook(_)
            | CdiHookSymlink(_)
            | CdiHookWrite { .. }
            | Ldconfig { .. }
            | LdconfigFailed { .. } => Category::Config,
        }
    }
}

/// The error and its sources, as the binary prints an error (`{:#}`): what a `gpuops mig`
/// child printed, and so what the MIG flow reports.
pub(crate) fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut next = e.source();
    while let Some(s) = next {
        text.push_str(": ");
        text.push_str(&s.to_string());
        next = s.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuops_migexec::ExecError;

    #[test]
    #[allow(clippy::unwrap_used)]
    fn settings_and_mig_files_the_agent_cannot_use_keep_their_cause_typed_and_their_text() {
        let rejected = gpuops_resources::health::HealthPolicy::from_env(Some("x"), None, 0)
            .unwrap_err()
            .to_string();
        let e = crate::prepare::health_policy(
            |k| (k == "DP_DISABLE_HEALTHCHECKS").then(|| "x".to_string()),
            Duration::ZERO,
        )
        .unwrap_err();
        assert!(matches!(e, AgentError::HealthPolicy(_)), "{e:?}");
        assert_eq!(e.to_string(), rejected);
        let hook = crate::update_ldcache("{}", &[], std::path::Path::new("/bin/true")).unwrap_err();
        assert!(matches!(hook, AgentError::CdiHook(_)), "{hook:?}");
        let missing = AgentError::MigConfigIn {
            file: "mig.yaml".into(),
            error: Box::new(gpuops_mig::MigError::UnknownConfig {
                name: "all-9g".into(),
                known: vec!["all-1g.10gb".into()],
            }),
        };
        assert!(
            missing
                .to_string()
                .starts_with("mig.yaml: no MIG config named \"all-9g\""),
            "{missing}"
        );
        let unreadable = AgentError::MigConfigRead {
            path: "/etc/mig.yaml".into(),
            error: std::io::Error::from(std::io::ErrorKind::NotFound),
        };
        assert_eq!(
            unreadable.to_string(),
            "MIG config file /etc/mig.yaml: entity not found"
        );
        for e in [missing, unreadable, e, hook] {
            assert_eq!(e.category(), Category::Config, "{e}");
        }
    }

    #[test]
    fn the_mig_flow_retries_waits_for_a_new_config_or_reports_the_node_by_category() {
        let unknown = gpuops_mig::MigError::UnknownConfig {
            name: "x".into(),
            known: vec!["all-disabled".into()],
        };
        let cases = [
            (
                AgentError::MigExec(ExecError::Mig(unknown)),
                Category::Config,
            ),
            (
                AgentError::MigExec(ExecError::Busy(vec!["GPU 0: pid 7".into()])),
                Category::Retryable,
            ),
            (
                AgentError::MigExec(ExecError::Snapshot(gpuops_nvml::NvmlError::GpuLost {
                    gpu: Some(1),
                })),
                Category::Hardware,
            ),
            (
                AgentError::MigDrain {
                    after: Duration::from_secs(4),
                    holders: vec!["default/mig-pod".into()],
                },
                Category::Retryable,
            ),
            (
                AgentError::MigDeadline {
                    what: APPLY,
                    after: Duration::from_secs(600),
                },
                Category::Retryable,
            ),
            (AgentError::MigStillRunning(APPLY), Category::Hardware),
            (AgentError::MigNoNvml, Category::Hardware),
            (
                AgentError::MigPendingReset(vec!["GPU 0: …".into()]),
                Category::Hardware,
            ),
        ];
        for (e, want) in cases {
            assert_eq!(e.category(), want, "{e}");
        }
    }

    #[test]
    fn texts_read_as_the_child_process_and_the_string_errors_did() {
        let drain = AgentError::MigDrain {
            after: Duration::from_secs(4),
            holders: vec!["default/a".into(), "default/b".into()],
        };
        assert_eq!(
            drain.to_string(),
            "timed out after 4s waiting for pods using this node's GPUs to finish (default/a, default/b); nothing was changed and the GPUs are advertised again"
        );
        let nvml = AgentError::MigExec(ExecError::Nvml {
            what: "setting MIG mode on GPU 0".into(),
            source: gpuops_nvml::NvmlError::GpuLost { gpu: Some(0) },
        });
        // As `error: {e:#}` of the binary said it.
        assert_eq!(
            chain(&nvml),
            format!(
                "setting MIG mode on GPU 0: {lost}: {lost}",
                lost = gpuops_nvml::NvmlError::GpuLost { gpu: Some(0) }
            )
        );
        let open = AgentError::NvmlOpen {
            missing: vec!["/a/libnvidia-ml.so.1".into(), "/b/libnvidia-ml.so.1".into()],
            errors: vec![],
        };
        assert_eq!(
            open.to_string(),
            "no NVML library at /a/libnvidia-ml.so.1, /b/libnvidia-ml.so.1"
        );
        let deadline = AgentError::MigDeadline {
            what: APPLY,
            after: Duration::from_millis(500),
        };
        assert_eq!(
            deadline.to_string(),
            "MIG apply did not finish within 500ms; it stops before its next driver call"
        );
    }
}
