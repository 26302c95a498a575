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
    /// DP_DISABLE_HEALTHCHECKS / DP_ENABLE_HEALTHCHECKS; the text is gpuops-resources'.
    #[error("{0}")]
    HealthPolicy(String),

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
    /// The OCI state or the folders the ldcache hook was given; the text is gpuops-resources'.
    #[error("{0}")]
    CdiHook(String),
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
    /// The node names a MIG config that cannot be used; the text is the node reconciler's.
    #[error("{0}")]
    MigConfigBroken(String),

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
            MigConfig(_) | MigConfigBroken(_) => Category::Config,
            Kube(_)
            | MigDeadline { .. }
            | MigDrain { .. }
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
