//! The label keys GFD writes, which the agent owns, and the test for whether a key is one.

pub(crate) const PREFIX: &str = "nvidia.com/";

pub(crate) const TIMESTAMP: &str = "nvidia.com/gfd.timestamp";
pub(crate) const MACHINE: &str = "nvidia.com/gpu.machine";
pub(crate) const MIG_CAPABLE: &str = "nvidia.com/mig.capable";
pub(crate) const MPS_CAPABLE: &str = "nvidia.com/mps.capable";
pub(crate) const GPU_MODE: &str = "nvidia.com/gpu.mode";
pub(crate) const MIG_STRATEGY: &str = "nvidia.com/mig.strategy";

pub(crate) const DRIVER_MAJOR: &str = "nvidia.com/cuda.driver-version.major";
pub(crate) const DRIVER_MINOR: &str = "nvidia.com/cuda.driver-version.minor";
pub(crate) const DRIVER_REVISION: &str = "nvidia.com/cuda.driver-version.revision";
pub(crate) const DRIVER_FULL: &str = "nvidia.com/cuda.driver-version.full";
pub(crate) const RUNTIME_MAJOR: &str = "nvidia.com/cuda.runtime-version.major";
pub(crate) const RUNTIME_MINOR: &str = "nvidia.com/cuda.runtime-version.minor";
pub(crate) const RUNTIME_FULL: &str = "nvidia.com/cuda.runtime-version.full";
// Deprecated by GFD, still written.
pub(crate) const OLD_DRIVER_MAJOR: &str = "nvidia.com/cuda.driver.major";
pub(crate) const OLD_DRIVER_MINOR: &str = "nvidia.com/cuda.driver.minor";
pub(crate) const OLD_DRIVER_REV: &str = "nvidia.com/cuda.driver.rev";
pub(crate) const OLD_RUNTIME_MAJOR: &str = "nvidia.com/cuda.runtime.major";
pub(crate) const OLD_RUNTIME_MINOR: &str = "nvidia.com/cuda.runtime.minor";

/// Node-wide keys (not per resource).
const NODE_KEYS: &[&str] = &[
    TIMESTAMP,
    MACHINE,
    MIG_CAPABLE,
    MPS_CAPABLE,
    GPU_MODE,
    MIG_STRATEGY,
    DRIVER_MAJOR,
    DRIVER_MINOR,
    DRIVER_REVISION,
    DRIVER_FULL,
    RUNTIME_MAJOR,
    RUNTIME_MINOR,
    RUNTIME_FULL,
    OLD_DRIVER_MAJOR,
    OLD_DRIVER_MINOR,
    OLD_DRIVER_REV,
    OLD_RUNTIME_MAJOR,
    OLD_RUNTIME_MINOR,
];

/// Per-resource suffixes: `<resource>.<suffix>` for `nvidia.com/gpu` and `nvidia.com/mig-<profile>`.
pub const RESOURCE_LABEL_SUFFIXES: &[&str] = &[
    "product",
    "count",
    "replicas",
    "sharing-strategy",
    "memory",
    "family",
    "compute.major",
    "compute.minor",
    "multiprocessors",
    "slices.gi",
    "slices.ci",
    "engines.copy",
    "engines.decoder",
    "engines.encoder",
    "engines.jpeg",
    "engines.ofa",
];

/// `<resource>.<suffix>` as a label key.
pub(crate) fn resource_key(resource: &str, suffix: &str) -> String {
    format!("{resource}.{suffix}")
}

/// Whether `key` is a label the agent may write, so one it may remove when it no longer applies.
///
/// These are exactly GFD's keys: the node-wide ones (`nvidia.com/cuda.*`, `gfd.timestamp`,
/// `gpu.machine`, `mig.capable`, `mps.capable`, `gpu.mode`, `mig.strategy`) and the per-resource
/// ones `nvidia.com/gpu.<suffix>` and `nvidia.com/mig-<profile>.<suffix>` for the suffixes in
/// [`RESOURCE_LABEL_SUFFIXES`]. Labels others own under `nvidia.com/` (`gpu.present`,
/// `gpu.deploy.*`, `mig.config`, `mig.config.state`, `device-plugin.config`, ...) are not ours.
pub fn owned_label_key(key: &str) -> bool {
    if NODE_KEYS.contains(&key) {
        return true;
    }
    let Some(name) = key.strip_prefix(PREFIX) else {
        return false;
    };
    RESOURCE_LABEL_SUFFIXES.iter().any(|suffix| {
        let Some(resource) = name.strip_suffix(suffix).and_then(|r| r.strip_suffix('.')) else {
            return false;
        };
        resource == "gpu"
            || resource
                .strip_prefix("mig-")
                .is_some_and(is_mig_profile_name)
    })
}

/// A MIG profile as it appears in resource names: `1g.10gb`, `1c.3g.40gb`, `1g.10gb.me`.
fn is_mig_profile_name(p: &str) -> bool {
    p.starts_with(|c: char| c.is_ascii_digit())
        && p.contains("gb")
        && p.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owned_keys() {
        let ours = [
            "nvidia.com/gfd.timestamp",
            "nvidia.com/cuda.driver.rev",
            "nvidia.com/cuda.runtime-version.full",
            "nvidia.com/mig.strategy",
            "nvidia.com/gpu.product",
            "nvidia.com/gpu.sharing-strategy",
            "nvidia.com/gpu.compute.major",
            "nvidia.com/gpu.engines.ofa",
            "nvidia.com/mig-1g.10gb.count",
            "nvidia.com/mig-1g.10gb.me.product",
            "nvidia.com/mig-1c.3g.40gb.slices.ci",
        ];
        for k in ours {
            assert!(owned_label_key(k), "{k}");
        }
        let theirs = [
            "nvidia.com/gpu.present",
            "nvidia.com/gpu.deploy.device-plugin",
            "nvidia.com/gpu.deploy.gpu-feature-discovery",
            "nvidia.com/mig.config",
            "nvidia.com/mig.config.state",
            "nvidia.com/device-plugin.config",
            "nvidia.com/vgpu.present",
            "nvidia.com/gpu.clique",
            "nvidia.com/gpu-driver-upgrade-state",
            "nvidia.com/mig-.count",
            "nvidia.com/mig-foo.count",
            "nvidia.com/gpu.shared.count",
            "example.com/gpu.product",
            "gpu.product",
            "kubernetes.io/hostname",
        ];
        for k in theirs {
            assert!(!owned_label_key(k), "{k}");
        }
    }
}
