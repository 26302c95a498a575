//! The MIG demand reconciler's plain half, pure: the generated configs a pool owes the nodes
//! being bought for it (kept in an annotation of the agents' mig-parted ConfigMap), which new
//! node takes which, the layouts of generated configs, and the merged ConfigMap text. The
//! controller reads and writes the ConfigMap; [`crate::mig_view`] reads the Nodes.

use crate::error::AutoscaleError;
use crate::mig_demand::NamedConfigYaml;
use crate::model::{Millis, Snapshot};
use crate::time::may_be_at_or_after;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet};

/// The agent's layout annotation (see gpuops-agent's `LAYOUT_ANNOTATION`).
pub const LAYOUT_ANNOTATION: &str = "gpuops.io/mig.layout";
/// The label naming the wanted config, and the one reporting the agent's progress.
pub const CONFIG_LABEL: &str = "nvidia.com/mig.config";
pub const STATE_LABEL: &str = "nvidia.com/mig.config.state";
/// Why the agent's last change failed.
pub const REASON_ANNOTATION: &str = "gpuops.io/mig.config.reason";
/// When this reconciler last set the node's config label (RFC 3339): the minimum interval
/// between changes survives a controller restart.
pub const CHANGED_ANNOTATION: &str = "gpuops.io/mig.config.changed-at";
/// The key of the mig-parted config in the agents' ConfigMap.
pub const CONFIGMAP_KEY: &str = "config.yaml";
/// Names of the configs this reconciler generates; unreferenced ones are pruned.
pub const GENERATED_PREFIX: &str = "gpuops-";
/// The prefix of MIG device resources.
pub const RESOURCE_PREFIX: &str = "nvidia.com/mig-";
/// On the agents' MIG ConfigMap: the generated configs each pool owes the nodes being bought
/// for them, one entry per node (JSON object: pool `namespace/name` -> list of [`Owed`]).
/// Written with the config itself in one patch, before the pool is scaled, so a crash between
/// the two loses nothing; an entry is popped when a new node is labelled with its config. On
/// the ConfigMap, not the MachineDeployment: the controller may patch only the scale
/// subresource of those.
pub const OWED_ANNOTATION: &str = "gpuops.io/mig.owed-configs";

/// One new node's generated config, owed until a node of the pool registers after `at`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Owed {
    pub config: String,
    /// When the scale-up was decided (ms since the epoch).
    pub at: Millis,
    /// Devices per GPU the config gives: launched nodes count with it while they boot.
    #[serde(default)]
    pub layout: Vec<BTreeMap<String, u32>>,
}

/// Pool -> its owed configs.
pub type OwedMap = BTreeMap<String, Vec<Owed>>;

/// Reads the owed configs (the annotation's text) of the ConfigMap `origin` names.
///
/// # Errors
/// When the text is not a JSON object of pools to lists of owed configs, or an entry names
/// no generated config; the message names the ConfigMap, the annotation and the pool.
pub fn parse_owed(origin: &str, text: &str) -> Result<OwedMap, AutoscaleError> {
    if text.trim().is_empty() {
        return Ok(OwedMap::new());
    }
    let owed: OwedMap = serde_json::from_str(text).map_err(|e| AutoscaleError::OwedNotJson {
        origin: origin.to_string(),
        annotation: OWED_ANNOTATION,
        message: e.to_string(),
    })?;
    for (pool, list) in &owed {
        if let Some((index, o)) = list
            .iter()
            .enumerate()
            .find(|(_, o)| !o.config.starts_with(GENERATED_PREFIX))
        {
            return Err(AutoscaleError::OwedNotGenerated {
                origin: origin.to_string(),
                annotation: OWED_ANNOTATION,
                pool: pool.clone(),
                index,
                config: o.config.clone(),
                prefix: GENERATED_PREFIX,
            });
        }
    }
    Ok(owed)
}

/// The annotation's text for owed configs (pools owing nothing left out).
pub fn owed_json(owed: &OwedMap) -> String {
    let owed: BTreeMap<&String, &Vec<Owed>> = owed.iter().filter(|(_, v)| !v.is_empty()).collect();
    serde_json::to_string(&owed).unwrap_or_else(|_| "{}".into())
}

/// How long an owed entry is kept even if the pool's replicas do not show its node yet.
pub const TRIM_GRACE_MS: Millis = 30_000;

/// A node of the pool that registered and that nothing has labelled since.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BootNode {
    pub name: String,
    /// Its creation time (ms; a Kubernetes time, whole seconds).
    pub registered: Millis,
}

/// What to do with a pool's owed configs this pass.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Assignment {
    /// Node -> the owed config it is labelled with.
    pub labels: Vec<(String, Owed)>,
    /// Still owed: nodes not registered yet.
    pub keep: Vec<Owed>,
    /// Given up, with why (too old, or more owed than nodes still to come).
    pub dropped: Vec<(Owed, String)>,
}

/// Matches owed configs to fresh nodes (pure): each entry, oldest first, labels the first
/// node that registered at or after it; one entry labels one node. A node's registration is
/// its creationTimestamp, whole seconds: a node created in the second of the entry counts as
/// after it (see [`crate::time`]); read as an instant, one created 300 ms after an entry at
/// x.500 s looked older than it, was never matched and the entry went only after
/// [`TRIM_GRACE_MS`]. Entries older than
/// `expire_ms` are dropped (their node timed out), and so are the oldest of those left beyond
/// `to_register`, the nodes the pool still waits for (a scale that failed after its entries
/// were written): a stale entry must not label a node bought later for something else. Entries
/// younger than [`TRIM_GRACE_MS`] are not dropped for that: the replicas the caller counts may
/// not show their scale yet.
pub fn assign(
    owed: &[Owed],
    fresh: &[BootNode],
    to_register: usize,
    now: Millis,
    expire_ms: Millis,
) -> Assignment {
    let mut out = Assignment::default();
    let mut owed: Vec<Owed> = owed.to_vec();
    owed.sort_by_key(|o| o.at);
    let mut fresh: Vec<&BootNode> = fresh.iter().collect();
    fresh.sort_by(|a, b| a.registered.cmp(&b.registered).then(a.name.cmp(&b.name)));
    let mut used = vec![false; fresh.len()];
    let mut left = Vec::new();
    for o in owed {
        if now.saturating_sub(o.at) > expire_ms {
            out.dropped.push((
                o,
                format!("no node registered within {} s", expire_ms / 1000),
            ));
            continue;
        }
        let found = fresh
            .iter()
            .enumerate()
            .find(|(i, n)| !used[*i] && may_be_at_or_after(n.registered, o.at))
            .map(|(i, _)| i);
        match found {
            Some(i) => {
                used[i] = true;
                out.labels.push((fresh[i].name.clone(), o));
            }
            None => left.push(o),
        }
    }
    let mut excess = left.len().saturating_sub(to_register);
    for o in left {
        if excess > 0 && now.saturating_sub(o.at) >= TRIM_GRACE_MS {
            excess -= 1;
            out.dropped.push((
                o,
                "more owed than nodes the pool still waits for (its scale-up did not happen)"
                    .into(),
            ));
        } else {
            out.keep.push(o);
        }
    }
    out
}

/// Devices per GPU of a generated config on a node with `gpus` GPUs (later entries win, as in
/// mig-parted; generated configs carry no device filters). `None` for a config selecting no GPU.
pub fn config_layout(
    cfg: &gpuops_mig::config::NamedConfig,
    gpus: u32,
) -> Option<Vec<BTreeMap<String, u32>>> {
    let mut out: Vec<Option<BTreeMap<String, u32>>> = vec![None; gpus as usize];
    for e in &cfg.entries {
        for (i, slot) in out.iter_mut().enumerate() {
            let i = u32::try_from(i).unwrap_or(u32::MAX);
            let selected = match &e.devices {
                gpuops_mig::config::Devices::All => true,
                gpuops_mig::config::Devices::List(l) => l.contains(&i),
            };
            if selected {
                *slot = Some(if e.mig_enabled {
                    e.mig_devices.clone()
                } else {
                    BTreeMap::new()
                });
            }
        }
    }
    if out.iter().all(Option::is_none) {
        return None;
    }
    Some(out.into_iter().map(Option::unwrap_or_default).collect())
}

/// A MIG change the status shows while it is under way or failed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MigChangeStatus {
    pub node: String,
    /// The config the node last applied.
    pub from: String,
    /// The config its label asks for.
    pub to: String,
    /// `requested` (the agent has not started), `pending`, `failed`.
    pub state: String,
    pub message: String,
}

/// `existing` (a mig-parted config file) with `add` put in (a config of the same name is
/// replaced) and the generated configs no node label names any more left out (pure).
///
/// # Errors
/// When `existing` or one of `add` does not parse; the message names `origin`.
pub fn merge_configs(
    existing: &str,
    origin: &str,
    add: &[&NamedConfigYaml],
    referenced: &BTreeSet<String>,
) -> Result<String, AutoscaleError> {
    let bad = AutoscaleError::MigConfig;
    let mut all = if existing.trim().is_empty() {
        gpuops_mig::config::MigPartedConfig {
            configs: Vec::new(),
        }
    } else {
        gpuops_mig::config::parse(existing, origin).map_err(bad)?
    };
    let added: BTreeSet<&str> = add.iter().map(|c| c.name.as_str()).collect();
    all.configs.retain(|c| {
        !added.contains(c.name.as_str())
            && (!c.name.starts_with(GENERATED_PREFIX) || referenced.contains(&c.name))
    });
    for c in add {
        let parsed = gpuops_mig::config::parse(&c.yaml, &format!("generated config {}", c.name))
            .map_err(bad)?;
        all.configs.extend(parsed.configs);
    }
    Ok(all.to_yaml())
}

/// One owed config, for the status.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OwedStatus {
    pub pool: String,
    pub config: String,
    pub at: Millis,
}

/// The owed configs as the status lists them.
pub fn owed_status(owed: &OwedMap) -> Vec<OwedStatus> {
    owed.iter()
        .flat_map(|(pool, v)| {
            v.iter().map(|o| OwedStatus {
                pool: pool.clone(),
                config: o.config.clone(),
                at: o.at,
            })
        })
        .collect()
}

/// Config name -> devices per GPU (profile -> count).
pub type Layouts = BTreeMap<String, Vec<BTreeMap<String, u32>>>;

/// The layouts of the owed configs and of the generated configs in the agents' ConfigMap
/// (`cm_text`, from `origin`), for nodes no agent reports yet. A config listing no GPUs is
/// taken for the largest pool's GPU count. Also the error when `cm_text` does not parse (the
/// owed layouts are still returned).
pub fn boot_layouts(
    owed: &OwedMap,
    cm_text: Option<&str>,
    origin: &str,
    snap: &Snapshot,
) -> (Layouts, Option<AutoscaleError>) {
    let mut layouts = BTreeMap::new();
    for o in owed.values().flatten() {
        if !o.layout.is_empty() {
            layouts.insert(o.config.clone(), o.layout.clone());
        }
    }
    let Some(text) = cm_text else {
        return (layouts, None);
    };
    let all = match gpuops_mig::config::parse(text, origin) {
        Ok(all) => all,
        Err(e) => return (layouts, Some(AutoscaleError::MigConfig(e))),
    };
    let pool_gpus = snap
        .pools
        .iter()
        .filter_map(|p| p.template.labels.get("nvidia.com/gpu.count")?.parse().ok())
        .max()
        .unwrap_or(1u32);
    for g in all
        .configs
        .iter()
        .filter(|g| g.name.starts_with(GENERATED_PREFIX))
    {
        let listed = g
            .entries
            .iter()
            .filter_map(|e| match &e.devices {
                gpuops_mig::config::Devices::List(l) => l.iter().max().map(|m| m + 1),
                gpuops_mig::config::Devices::All => None,
            })
            .max()
            .unwrap_or(0);
        if let Some(l) = config_layout(g, pool_gpus.max(listed)) {
            layouts.entry(g.name.clone()).or_insert(l);
        }
    }
    (layouts, None)
}

/// The agents' ConfigMap as a pass saw it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConfigMapText {
    /// The mig-parted config ([`CONFIGMAP_KEY`]).
    pub text: String,
    /// The owed configs ([`OWED_ANNOTATION`]).
    pub owed_text: String,
    pub resource_version: Option<String>,
}

/// The merge patch that puts `add` into the agents' ConfigMap (`origin`, e.g.
/// `ConfigMap gpuops/gpuops-mig-config`) and, with `owed`, sets the owed configs, in one
/// patch; `None` when nothing would change. Generated configs in `referenced` (named by a
/// node's label or applied config) or owed are kept, the other generated ones pruned. Owed
/// configs not rewritten here (`owed` is `None`) are still owed as `current` has them.
///
/// # Errors
/// When the ConfigMap's config or one of `add` does not parse.
pub fn config_patch(
    current: &ConfigMapText,
    origin: &str,
    add: &[&NamedConfigYaml],
    mut referenced: BTreeSet<String>,
    owed: Option<&OwedMap>,
) -> Result<Option<Value>, AutoscaleError> {
    let still_owed: OwedMap = match owed {
        Some(o) => o.clone(),
        None => parse_owed(origin, &current.owed_text).unwrap_or_default(),
    };
    referenced.extend(still_owed.values().flatten().map(|o| o.config.clone()));
    let text = merge_configs(
        &current.text,
        &format!("{origin} key {CONFIGMAP_KEY}"),
        add,
        &referenced,
    )?;
    let owed_text = owed.map(owed_json);
    let owed_changed = owed_text
        .as_ref()
        .is_some_and(|t| parse_owed("", t).ok() != parse_owed("", &current.owed_text).ok());
    if text == current.text && !owed_changed {
        return Ok(None);
    }
    let mut patch = json!({
        // The resourceVersion makes a concurrent edit (helm, a person) a conflict,
        // retried next pass from what is there then.
        "metadata": {"resourceVersion": current.resource_version},
        "data": {CONFIGMAP_KEY: text},
    });
    if let Some(t) = owed_text.filter(|_| owed_changed) {
        let v = if t == "{}" {
            Value::Null
        } else {
            Value::String(t)
        };
        patch["metadata"]["annotations"] = json!({ OWED_ANNOTATION: v });
    }
    Ok(Some(patch))
}
