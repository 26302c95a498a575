//! The startup taint: whether every device the node is configured to offer is advertised (in the
//! Node's `status.allocatable`, as the API server has it) and healthy, so the taint can go.
//!
//! Pure: the node reconciler feeds it the snapshot, the device plugin config, the MIG config the
//! node asks for and the observed allocatable, and removes the taint on [`Readiness::Ready`].

use crate::error::AgentError;
use gpuops_inventory::{Inventory, MigDevice};
use gpuops_mig::config::NamedConfig;
use gpuops_resources::config::Config;
use gpuops_resources::health::HealthTracker;
use std::collections::BTreeMap;

/// The taint the agent removes once the node's devices are ready (`KEY[=VALUE]:EFFECT`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StartupTaint {
    pub key: String,
    pub value: String,
    pub effect: String,
}

/// What the Kubernetes docs and Cluster Autoscaler expect a startup taint to look like.
pub const DEFAULT_STARTUP_TAINT: &str = "gpuops.io/gpu-not-ready:NoSchedule";

pub(crate) const EFFECTS: [&str; 3] = ["NoSchedule", "PreferNoSchedule", "NoExecute"];

impl StartupTaint {
    /// Parses `KEY[=VALUE]:EFFECT`; the empty string means no startup taint.
    pub fn parse(text: &str) -> Result<Option<StartupTaint>, AgentError> {
        let text = text.trim();
        if text.is_empty() {
            return Ok(None);
        }
        let Some((kv, effect)) = text.rsplit_once(':') else {
            return Err(AgentError::StartupTaintNoEffect { text: text.into() });
        };
        if !EFFECTS.contains(&effect) {
            return Err(AgentError::StartupTaintEffect {
                text: text.into(),
                effect: effect.into(),
            });
        }
        let (key, value) = kv.split_once('=').unwrap_or((kv, ""));
        if let Err(why) = check_key(key) {
            return Err(AgentError::StartupTaintKey {
                text: text.into(),
                key: key.into(),
                why,
            });
        }
        if value.len() > 63
            || !value
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
        {
            return Err(AgentError::StartupTaintValue {
                text: text.into(),
                value: value.into(),
            });
        }
        Ok(Some(StartupTaint {
            key: key.to_string(),
            value: value.to_string(),
            effect: effect.to_string(),
        }))
    }
}

/// A Kubernetes qualified name: `[prefix/]name`, the name up to 63 characters.
fn check_key(key: &str) -> Result<(), &'static str> {
    let (prefix, name) = match key.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    if name.is_empty() {
        return Err("is empty");
    }
    let name_ok = name.len() <= 63
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name.ends_with(|c: char| c.is_ascii_alphanumeric());
    if !name_ok {
        return Err(
            "must be at most 63 letters, digits, '-', '_' or '.' (starting and ending alphanumeric), after an optional DNS prefix and '/'",
        );
    }
    if let Some(p) = prefix
        && (p.is_empty()
            || p.len() > 253
            || !p
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"-.".contains(&b)))
    {
        return Err("has a prefix that is not a lower-case DNS name");
    }
    Ok(())
}

/// Whether the startup taint can go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Readiness {
    /// Every expected device is advertised and healthy; the summary says what (for the log).
    Ready(String),
    /// Why not yet.
    Waiting(String),
}

/// The MIG layout the node asks for, as the reconciler found it.
#[derive(Debug, Clone, Copy)]
pub enum MigWanted<'a> {
    /// No MIG flow, or no `nvidia.com/mig.config` label and no default: the GPUs keep the layout
    /// they have.
    Current,
    /// The named config, applied to the node's GPUs.
    Config(&'a NamedConfig),
    /// The node names a config that cannot be used (unreadable file, unknown name): nothing the
    /// node offers is known yet.
    Broken(&'a str),
}

/// The device counts per resource the node should advertise once its MIG config (`None`: the
/// layout the GPUs have) is in place: the same naming (MIG strategy, sharing, renames) as the
/// device plugin, applied to the GPUs as the config will leave them.
pub fn expected_devices(
    inv: &Inventory,
    config: &Config,
    layout: Option<&NamedConfig>,
) -> Result<BTreeMap<String, u64>, AgentError> {
    let target = match layout {
        None => inv.clone(),
        Some(named) => with_layout(inv, named)?,
    };
    let resources = gpuops_resources::resources(&target, config)?;
    Ok(resources
        .iter()
        .map(|r| (r.name.clone(), r.devices.len() as u64))
        .collect())
}

/// `inv` with each GPU the config selects switched to the MIG mode and devices it asks for.
fn with_layout(inv: &Inventory, named: &NamedConfig) -> Result<Inventory, AgentError> {
    let selected = gpuops_mig::select::select(named, &inv.gpus)?;
    let mut target = inv.clone();
    for s in selected {
        let Some(gpu) = target.gpus.iter_mut().find(|g| g.index == s.gpu) else {
            continue;
        };
        gpu.mig.current_enabled = s.mig_enabled;
        gpu.mig.pending_enabled = s.mig_enabled;
        gpu.mig_devices = s
            .mig_devices
            .iter()
            .flat_map(|(profile, n)| std::iter::repeat_n(profile, *n as usize))
            .enumerate()
            .map(|(j, profile)| MigDevice {
                // Only names and counts matter here; the IDs merely have to be distinct.
                uuid: format!("{}-expected-{j}", gpu.uuid),
                index: j as u32,
                gi_id: j as u32 + 1,
                profile: profile.clone(),
                ci_profile: profile.clone(),
                ..MigDevice::default()
            })
            .collect();
    }
    Ok(target)
}

/// Compares what the node should offer with what its Node object advertises. A device that is
/// unhealthy now (fatal XID, lost GPU) keeps the taint even when the kubelet still counts it.
pub fn readiness(
    inv: &Inventory,
    config: &Config,
    health: &HealthTracker,
    mig: MigWanted<'_>,
    allocatable: &BTreeMap<String, String>,
) -> Readiness {
    let unknown = |why: &dyn std::fmt::Display| {
        Readiness::Waiting(format!("what the node offers is unknown: {why}"))
    };
    let layout = match mig {
        MigWanted::Current => None,
        MigWanted::Config(named) => Some(named),
        MigWanted::Broken(why) => return unknown(&why),
    };
    let expected = match expected_devices(inv, config, layout) {
        Ok(e) => e,
        Err(why) => return unknown(&why),
    };
    let mut now = match gpuops_resources::resources(inv, config) {
        Ok(r) => r,
        Err(e) => return Readiness::Waiting(format!("the device plugin advertises nothing: {e}")),
    };
    health.apply(&mut now);
    let unhealthy: Vec<String> = now
        .iter()
        .flat_map(|r| r.devices.iter().filter(|d| !d.health_ok))
        .map(|d| format!("GPU {}", d.backing.gpu_index))
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    if !unhealthy.is_empty() {
        return Readiness::Waiting(format!("unhealthy: {}", unhealthy.join(", ")));
    }
    let missing: Vec<String> = expected
        .iter()
        .filter_map(|(name, want)| {
            let have = allocatable
                .get(name)
                .and_then(|q| q.trim().parse::<u64>().ok())
                .unwrap_or(0);
            (have < *want).then(|| format!("{name} {have}/{want}"))
        })
        .collect();
    if missing.is_empty() {
        let all: Vec<String> = expected.iter().map(|(n, c)| format!("{c} {n}")).collect();
        Readiness::Ready(if all.is_empty() {
            "no GPU devices to offer".into()
        } else {
            all.join(", ")
        })
    } else {
        Readiness::Waiting(format!("not advertised yet: {}", missing.join(", ")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuops_inventory::{Gpu, MigState};
    use gpuops_resources::config::Overrides;

    fn h100(index: u32) -> Gpu {
        Gpu {
            index,
            uuid: format!("GPU-{index:08x}-1111-2222-3333-444444444444"),
            name: "NVIDIA H100 80GB HBM3".into(),
            model: Some("H100-SXM5-80GB".into()),
            pci_device_id: 0x2330_10DE,
            minor_number: Some(index),
            mig: MigState {
                capable: true,
                ..MigState::default()
            },
            ..Gpu::default()
        }
    }

    fn node(n: u32) -> Inventory {
        Inventory {
            gpus: (0..n).map(h100).collect(),
            ..Inventory::default()
        }
    }

    fn cfg(yaml: &str, strategy: &str) -> Config {
        let file = (!yaml.is_empty()).then(|| Config::parse(yaml, "t.yaml").unwrap());
        let mut flags = Overrides::default();
        flags.set("MIG_STRATEGY", strategy).unwrap();
        Config::effective(file, &Overrides::default(), &flags).unwrap()
    }

    fn mig(name: &str) -> NamedConfig {
        gpuops_mig::config::nvidia_default_configs()
            .get(name)
            .unwrap()
            .clone()
    }

    fn alloc(pairs: &[(&str, u64)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn ready(r: &Readiness) -> bool {
        matches!(r, Readiness::Ready(_))
    }

    #[test]
    fn whole_gpus_are_ready_once_the_count_is_allocatable() {
        let (inv, c) = (node(8), cfg("", "none"));
        let health = HealthTracker::default();
        let waiting = readiness(&inv, &c, &health, MigWanted::Current, &alloc(&[]));
        assert_eq!(
            waiting,
            Readiness::Waiting("not advertised yet: nvidia.com/gpu 0/8".into())
        );
        let partial = alloc(&[("nvidia.com/gpu", 7)]);
        assert!(!ready(&readiness(
            &inv,
            &c,
            &health,
            MigWanted::Current,
            &partial
        )));
        let all = alloc(&[("nvidia.com/gpu", 8), ("cpu", 64)]);
        assert_eq!(
            readiness(&inv, &c, &health, MigWanted::Current, &all),
            Readiness::Ready("8 nvidia.com/gpu".into())
        );
    }

    #[test]
    fn mixed_strategy_expects_every_profile_the_mig_config_implies() {
        let (inv, c) = (node(8), cfg("", "mixed"));
        let all_1g = mig("all-1g.10gb");
        let expected = expected_devices(&inv, &c, Some(&all_1g)).unwrap();
        assert_eq!(
            expected,
            BTreeMap::from([("nvidia.com/mig-1g.10gb".to_string(), 56)])
        );
        let health = HealthTracker::default();
        // Whole GPUs still advertised: the MIG change has not happened yet.
        let before = alloc(&[("nvidia.com/gpu", 8)]);
        let r = readiness(&inv, &c, &health, MigWanted::Config(&all_1g), &before);
        assert_eq!(
            r,
            Readiness::Waiting("not advertised yet: nvidia.com/mig-1g.10gb 0/56".into())
        );
        let after = alloc(&[("nvidia.com/gpu", 0), ("nvidia.com/mig-1g.10gb", 56)]);
        assert!(ready(&readiness(
            &inv,
            &c,
            &health,
            MigWanted::Config(&all_1g),
            &after
        )));
        let balanced = mig("all-balanced");
        let expected = expected_devices(&inv, &c, Some(&balanced)).unwrap();
        assert_eq!(expected.len(), 3, "{expected:?}");
        assert_eq!(expected["nvidia.com/mig-1g.10gb"], 16);
    }

    #[test]
    fn single_strategy_names_the_mig_devices_nvidia_com_gpu() {
        let (inv, c) = (node(8), cfg("", "single"));
        let all_1g = mig("all-1g.10gb");
        let expected = expected_devices(&inv, &c, Some(&all_1g)).unwrap();
        assert_eq!(
            expected,
            BTreeMap::from([("nvidia.com/gpu".to_string(), 56)])
        );
        let health = HealthTracker::default();
        let whole = alloc(&[("nvidia.com/gpu", 8)]);
        assert!(!ready(&readiness(
            &inv,
            &c,
            &health,
            MigWanted::Config(&all_1g),
            &whole
        )));
        let split = alloc(&[("nvidia.com/gpu", 56)]);
        assert!(ready(&readiness(
            &inv,
            &c,
            &health,
            MigWanted::Config(&all_1g),
            &split
        )));
    }

    #[test]
    fn time_slicing_with_rename_by_default_expects_the_shared_replicas() {
        let yaml = "version: v1\nsharing:\n  timeSlicing:\n    renameByDefault: true\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 4\n";
        let (inv, c) = (node(2), cfg(yaml, "none"));
        let health = HealthTracker::default();
        let expected = expected_devices(&inv, &c, None).unwrap();
        assert_eq!(
            expected,
            BTreeMap::from([("nvidia.com/gpu.shared".to_string(), 8)])
        );
        // The plain name does not count: the replicas are what the node offers.
        let plain = alloc(&[("nvidia.com/gpu", 8)]);
        assert!(!ready(&readiness(
            &inv,
            &c,
            &health,
            MigWanted::Current,
            &plain
        )));
        let shared = alloc(&[("nvidia.com/gpu.shared", 8)]);
        assert!(ready(&readiness(
            &inv,
            &c,
            &health,
            MigWanted::Current,
            &shared
        )));
    }

    #[test]
    fn an_unhealthy_gpu_keeps_the_taint_even_when_it_is_still_allocatable() {
        let mut inv = node(4);
        inv.gpus[2].health = gpuops_inventory::Health::Lost;
        let c = cfg("", "none");
        let all = alloc(&[("nvidia.com/gpu", 4)]);
        let r = readiness(
            &inv,
            &c,
            &HealthTracker::default(),
            MigWanted::Current,
            &all,
        );
        assert_eq!(r, Readiness::Waiting("unhealthy: GPU 2".into()));
    }

    #[test]
    fn without_a_mig_config_label_the_current_layout_is_expected_and_a_broken_one_waits() {
        let mut inv = node(2);
        // GPU 1 is already partitioned: with no label, that layout is what the node offers.
        inv.gpus[1].mig.current_enabled = true;
        inv.gpus[1].mig_devices = vec![MigDevice {
            uuid: "MIG-1".into(),
            profile: "3g.40gb".into(),
            ci_profile: "3g.40gb".into(),
            ..MigDevice::default()
        }];
        let c = cfg("", "mixed");
        let expected = expected_devices(&inv, &c, None).unwrap();
        assert_eq!(
            expected,
            BTreeMap::from([
                ("nvidia.com/gpu".to_string(), 1),
                ("nvidia.com/mig-3g.40gb".to_string(), 1)
            ])
        );
        let r = readiness(
            &inv,
            &c,
            &HealthTracker::default(),
            MigWanted::Broken("MIG config \"all-9g\" is not in mig.yaml"),
            &alloc(&[("nvidia.com/gpu", 1), ("nvidia.com/mig-3g.40gb", 1)]),
        );
        assert_eq!(
            r,
            Readiness::Waiting(
                "what the node offers is unknown: MIG config \"all-9g\" is not in mig.yaml".into()
            )
        );
    }

    #[test]
    fn taints_parse_with_and_without_a_value_and_bad_ones_say_what_is_wrong() {
        assert_eq!(
            StartupTaint::parse(DEFAULT_STARTUP_TAINT).unwrap(),
            Some(StartupTaint {
                key: "gpuops.io/gpu-not-ready".into(),
                value: String::new(),
                effect: "NoSchedule".into(),
            })
        );
        let ca = StartupTaint::parse(
            "startup-taint.cluster-autoscaler.kubernetes.io/gpu=pending:NoExecute",
        )
        .unwrap()
        .unwrap();
        assert_eq!(
            (ca.value.as_str(), ca.effect.as_str()),
            ("pending", "NoExecute")
        );
        assert_eq!(StartupTaint::parse("").unwrap(), None);
        let no_effect = StartupTaint::parse("gpuops.io/x").unwrap_err().to_string();
        assert!(no_effect.contains("has no effect"), "{no_effect}");
        let bad_effect = StartupTaint::parse("gpuops.io/x:NoRun")
            .unwrap_err()
            .to_string();
        assert!(
            bad_effect.contains("\"NoRun\" is not one of NoSchedule"),
            "{bad_effect}"
        );
        let bad_key = StartupTaint::parse("Bad Key:NoSchedule")
            .unwrap_err()
            .to_string();
        assert!(bad_key.contains("the key \"Bad Key\""), "{bad_key}");
        let bad_prefix = StartupTaint::parse("GPU.io/x:NoSchedule")
            .unwrap_err()
            .to_string();
        assert!(bad_prefix.contains("prefix"), "{bad_prefix}");
        let bad_value = StartupTaint::parse("gpuops.io/x=a b:NoSchedule")
            .unwrap_err()
            .to_string();
        assert!(bad_value.contains("the value \"a b\""), "{bad_value}");
    }
}
