//! The MIG demand reconciler's controller half: the inputs of `decide_mig` from the watched
//! Nodes (the agent's `gpuops.io/mig.layout` annotation and MIG labels) and the snapshot, and
//! its actions: named configs merged into the agents' mig-parted ConfigMap, then the node label
//! `nvidia.com/mig.config` the agent applies; a failed change is put back to the config the
//! node last applied. A node bought with a generated config is owed it (an annotation on the
//! ConfigMap, written before the scale) and labelled with it when it registers.

use crate::error::ControllerError;
use crate::snapshot::may_be_at_or_after;
use gpuops_autoscale::mig_demand::{
    MigConfig, MigDecision, MigGpu, MigMemory, MigNode, MigNodeState, MigPod, MigPool,
    NamedConfigYaml, decide_mig,
};
use gpuops_autoscale::{Event as AEvent, Millis, ScaleUp, Snapshot, Target};
use k8s_openapi::api::core::v1::{ConfigMap, Node};
use kube::api::{Api, Patch, PatchParams};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

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
const GENERATED_PREFIX: &str = "gpuops-";
const RESOURCE_PREFIX: &str = "nvidia.com/mig-";
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
pub fn parse_owed(origin: &str, text: &str) -> Result<OwedMap, ControllerError> {
    let bad = |why: String| {
        ControllerError::Mig(format!("{origin}: annotation {OWED_ANNOTATION}: {why}"))
    };
    if text.trim().is_empty() {
        return Ok(OwedMap::new());
    }
    let owed: OwedMap = serde_json::from_str(text).map_err(|e| {
        bad(format!(
            "{e} (want {{\"NAMESPACE/MACHINEDEPLOYMENT\": [{{\"config\": \"gpuops-...\", \"at\": MILLIS}}]}})"
        ))
    })?;
    for (pool, list) in &owed {
        if let Some((i, o)) = list
            .iter()
            .enumerate()
            .find(|(_, o)| !o.config.starts_with(GENERATED_PREFIX))
        {
            return Err(bad(format!(
                "MachineDeployment {pool} entry {i}: config {:?} is not a generated config ({GENERATED_PREFIX}...)",
                o.config
            )));
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
    /// Its creation time (ms).
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
/// its creationTimestamp, whole seconds, and an entry's time is ours, milliseconds: a node
/// created in the second of its entry counts as after it (else it is never labelled and the
/// entry only goes after [`TRIM_GRACE_MS`], the node booting on the default layout; see
/// [`crate::snapshot::second_end`]). Entries older than
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

/// What the pools owe their booting nodes, and the layouts of the generated configs nodes
/// are labelled with, for [`view`].
#[derive(Debug, Clone, Default)]
pub struct Boot {
    /// Pool -> owed configs (after this pass's assignment).
    pub owed: BTreeMap<String, Vec<Owed>>,
    /// Config name -> devices per GPU (from the owed entries and the agents' ConfigMap).
    pub layouts: BTreeMap<String, Vec<BTreeMap<String, u32>>>,
}

/// How the MIG demand reconciler runs.
#[derive(Debug, Clone)]
pub struct MigOptions {
    /// The agents' mig-parted ConfigMap, in the controller's namespace.
    pub configmap: String,
    pub decision: MigConfig,
}

/// What the agent publishes about a node's GPUs.
#[derive(Debug, Clone, Default, Deserialize)]
struct Layout {
    /// The config last applied successfully (`None` before the first one).
    #[serde(default)]
    applied: Option<String>,
    #[serde(default)]
    model: String,
    gpus: Vec<MigGpu>,
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

fn state_of(node: &Node, layout: &Layout) -> MigNodeState {
    let labels = node.metadata.labels.clone().unwrap_or_default();
    match labels.get(STATE_LABEL).map(String::as_str) {
        Some("failed") => MigNodeState::Failed,
        Some("pending" | "rebooting") => MigNodeState::Pending,
        // The label asks for a config the agent has not applied: a change not picked up yet.
        _ if labels
            .get(CONFIG_LABEL)
            .is_some_and(|c| layout.applied.as_ref() != Some(c)) =>
        {
            MigNodeState::Pending
        }
        _ => MigNodeState::Success,
    }
}

fn parse_layout(node: &Node) -> Option<Result<Layout, String>> {
    let text = node.metadata.annotations.as_ref()?.get(LAYOUT_ANNOTATION)?;
    Some(serde_json::from_str(text).map_err(|e| {
        format!(
            "node {}: annotation {LAYOUT_ANNOTATION}: {e}",
            node.metadata.name.as_deref().unwrap_or_default()
        )
    }))
}

/// The profile and count of a pending pod asking for MIG devices of exactly one profile.
fn mig_ask(p: &gpuops_autoscale::PendingPod) -> Option<(String, u32)> {
    let mut it = p
        .scalars
        .iter()
        .filter_map(|(k, v)| Some((k.strip_prefix(RESOURCE_PREFIX)?, *v)));
    let (profile, n) = it.next()?;
    if it.next().is_some() || p.gpu_count > 0 {
        return None;
    }
    Some((profile.to_string(), u32::try_from(n).unwrap_or(u32::MAX)))
}

/// Whether a pending pod is the MIG reconciler's (then the node-pool decision leaves it alone).
pub fn is_mig_pod(p: &gpuops_autoscale::PendingPod) -> bool {
    mig_ask(p).is_some()
}

/// The decision's inputs from the Nodes and the snapshot (pure). Problems (an annotation that
/// does not parse) are returned, not fatal: that node is left out.
pub fn view(
    nodes: &[Arc<Node>],
    snap: &Snapshot,
    boot: &Boot,
) -> (Vec<MigNode>, Vec<MigPod>, Vec<MigPool>, Vec<String>) {
    let mut problems = Vec::new();
    let price: HashMap<&str, f64> = snap
        .pools
        .iter()
        .map(|p| (p.name.as_str(), p.price_per_hour))
        .collect();
    let ready: HashMap<&str, &gpuops_autoscale::Node> =
        snap.nodes.iter().map(|n| (n.name.as_str(), n)).collect();
    let mut out = Vec::new();
    for n in nodes {
        let Some(layout) = parse_layout(n) else {
            continue;
        };
        let layout = match layout {
            Ok(l) => l,
            Err(e) => {
                problems.push(e);
                continue;
            }
        };
        let name = n.metadata.name.clone().unwrap_or_default();
        let seen = ready.get(name.as_str());
        let pool = seen.and_then(|s| s.pool.clone());
        let annotations = n.metadata.annotations.clone().unwrap_or_default();
        out.push(MigNode {
            price_per_hour: pool
                .as_deref()
                .and_then(|p| price.get(p).copied())
                .or_else(|| {
                    annotations
                        .get("gpuops.io/price-per-hour")
                        .and_then(|v| v.parse().ok())
                })
                .unwrap_or(0.0),
            pool,
            model: layout.model.clone(),
            config: n
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(CONFIG_LABEL))
                .cloned()
                .unwrap_or_default(),
            state: state_of(n, &layout),
            changed_at: annotations
                .get(CHANGED_ANNOTATION)
                .and_then(|s| crate::snapshot::parse_rfc3339(s))
                // Written in whole seconds: the minimum interval counts from the second's end,
                // so it never ends early.
                .map(crate::snapshot::second_end),
            unschedulable: n.spec.as_ref().and_then(|s| s.unschedulable) == Some(true)
                || seen.is_some_and(|s| s.removing),
            in_flight: seen.is_none(),
            cpu_free_milli: seen.map_or(u64::MAX, |s| s.cpu_free_milli),
            memory_free_mib: seen.map_or(u64::MAX, |s| s.memory_free_mib),
            gpus: layout.gpus,
            name,
        });
    }
    let pods = snap
        .pending
        .iter()
        .filter_map(|p| {
            let (profile, count) = mig_ask(p)?;
            Some(MigPod {
                key: p.key.clone(),
                created: p.created,
                profile,
                count,
                cpu_milli: p.cpu_milli,
                memory_mib: p.memory_mib,
            })
        })
        .collect();
    let pools: Vec<MigPool> = snap
        .pools
        .iter()
        .filter_map(|p| {
            let t = &p.template;
            let per_node: BTreeMap<String, u32> = t
                .scalars
                .iter()
                .filter_map(|(k, v)| {
                    Some((
                        k.strip_prefix(RESOURCE_PREFIX)?.to_string(),
                        u32::try_from(*v).unwrap_or(u32::MAX),
                    ))
                })
                .collect();
            if per_node.is_empty() {
                return None;
            }
            let gpus: u32 = t
                .labels
                .get("nvidia.com/gpu.count")
                .and_then(|v| v.parse().ok())
                .unwrap_or(1)
                .max(1);
            // The template says per node; its GPUs are taken as alike.
            let per_gpu: BTreeMap<String, u32> = per_node
                .iter()
                .map(|(k, v)| (k.clone(), v / gpus))
                .filter(|(_, v)| *v > 0)
                .collect();
            Some(MigPool {
                name: p.name.clone(),
                model: t.gpu_product.clone(),
                gpus,
                price_per_hour: p.price_per_hour,
                room: p.max.saturating_sub(p.replicas),
                default_config: t
                    .labels
                    .get(CONFIG_LABEL)
                    .map(|c| (c.clone(), vec![per_gpu.clone(); gpus as usize])),
                cpu_milli: t.cpu_milli,
                memory_mib: t.memory_mib,
            })
        })
        .collect();
    let labels: HashMap<&str, &str> = nodes
        .iter()
        .filter_map(|n| {
            Some((
                n.metadata.name.as_deref()?,
                n.metadata.labels.as_ref()?.get(CONFIG_LABEL)?.as_str(),
            ))
        })
        .collect();
    let advertised: HashMap<&str, BTreeMap<String, u64>> = nodes
        .iter()
        .filter_map(|n| {
            let a = n.status.as_ref()?.allocatable.as_ref()?;
            Some((
                n.metadata.name.as_deref()?,
                a.iter()
                    .filter_map(|(k, q)| {
                        let p = k.strip_prefix(RESOURCE_PREFIX)?;
                        let v = gpuops_kubemodel::quantity(&q.0)?;
                        // Whole device counts; a fraction would be a broken quantity.
                        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
                        let v = v.max(0.0) as u64;
                        Some((p.to_string(), v))
                    })
                    .filter(|(_, v)| *v > 0)
                    .collect(),
            ))
        })
        .collect();
    out.extend(pool_nodes(&out, snap, &pools, &labels, &advertised, boot));
    (out, pods, pools, problems)
}

/// Devices per GPU.
type PerGpu = Vec<BTreeMap<String, u32>>;

/// Nodes of MIG pools that publish no layout yet: those launched and not ready (replicas minus
/// ready nodes) and ready ones without an agent's annotation, in flight (never re-partitioned).
/// Each counts with the layout of the config its label names when `boot` knows it, a launched
/// one not labelled yet with what its pool owes it, else with the pool's default layout. Pods
/// they will hold are counted as served, so a pool is not bought twice for one need.
fn pool_nodes(
    known: &[MigNode],
    snap: &Snapshot,
    pools: &[MigPool],
    labels: &HashMap<&str, &str>,
    advertised: &HashMap<&str, BTreeMap<String, u64>>,
    boot: &Boot,
) -> Vec<MigNode> {
    let mut out = Vec::new();
    for pool in pools {
        let Some((default_name, default_layout)) = &pool.default_config else {
            continue;
        };
        let layout_of = |label: Option<&str>| -> (String, Vec<BTreeMap<String, u32>>) {
            match label.and_then(|l| Some((l, boot.layouts.get(l)?))) {
                Some((l, layout)) if l != default_name => (l.to_string(), layout.clone()),
                _ => (default_name.clone(), default_layout.clone()),
            }
        };
        let ready: Vec<&gpuops_autoscale::Node> = snap
            .nodes
            .iter()
            .filter(|n| n.pool.as_deref() == Some(pool.name.as_str()))
            .collect();
        let synth = |name: String,
                     config: String,
                     layout: &[BTreeMap<String, u32>],
                     used: &BTreeMap<String, u64>| {
            let mut used = used.clone();
            let gpus = layout
                .iter()
                .map(|devices| {
                    let mut instances = Vec::new();
                    for (profile, n) in devices {
                        for _ in 0..*n {
                            let left = used.entry(profile.clone()).or_insert(0);
                            let busy = *left > 0;
                            *left = left.saturating_sub(1);
                            instances.push(gpuops_autoscale::mig_demand::MigInstance {
                                profile: profile.clone(),
                                // Unknown placements: in flight, the decision never plans them.
                                start: 0,
                                busy,
                            });
                        }
                    }
                    MigGpu {
                        mig_enabled: true,
                        busy: false,
                        instances,
                    }
                })
                .collect();
            MigNode {
                name,
                pool: Some(pool.name.clone()),
                model: pool.model.clone(),
                price_per_hour: pool.price_per_hour,
                config,
                state: MigNodeState::Success,
                changed_at: None,
                unschedulable: false,
                in_flight: true,
                gpus,
                cpu_free_milli: pool.cpu_milli,
                memory_free_mib: pool.memory_mib,
            }
        };
        for n in &ready {
            if known.iter().any(|k| k.name == n.name) {
                continue;
            }
            // The Node object's label: the snapshot's may predate this pass's labelling.
            let label = labels
                .get(n.name.as_str())
                .copied()
                .or_else(|| n.labels.get(CONFIG_LABEL).map(String::as_str));
            let (config, layout) = layout_of(label);
            // Used = the layout's count minus what is free now.
            let per_node: BTreeMap<String, u64> =
                layout.iter().fold(BTreeMap::new(), |mut a, g| {
                    for (k, v) in g {
                        *a.entry(k.clone()).or_insert(0) += u64::from(*v);
                    }
                    a
                });
            // A node relabelled at boot still advertising what it came up with: the change
            // has not landed, nothing runs on the new layout yet.
            let landed = config == *default_name
                || advertised
                    .get(n.name.as_str())
                    .is_none_or(|a| a.iter().eq(per_node.iter().filter(|(_, v)| **v > 0)));
            let used = per_node
                .iter()
                .filter(|_| landed)
                .map(|(k, total)| {
                    let free = n
                        .scalars_free
                        .get(&format!("{RESOURCE_PREFIX}{k}"))
                        .copied()
                        .unwrap_or(0);
                    (k.clone(), total.saturating_sub(free))
                })
                .collect();
            let mut node = synth(n.name.clone(), config, &layout, &used);
            node.cpu_free_milli = n.cpu_free_milli;
            node.memory_free_mib = n.memory_free_mib;
            out.push(node);
        }
        let launched = snap
            .pools
            .iter()
            .find(|p| p.name == pool.name)
            .map_or(0, |p| p.replicas as usize)
            .saturating_sub(ready.len());
        // Registered, not ready, already labelled with a generated config: that layout.
        let mut booting: Vec<(String, String, PerGpu)> = snap
            .machines
            .iter()
            .filter(|m| m.pool == pool.name)
            .filter_map(|m| {
                let node = m.node.as_deref()?;
                if known.iter().any(|k| k.name == node) {
                    return None;
                }
                let (config, layout) = layout_of(labels.get(node).copied());
                (config != *default_name).then(|| (node.to_string(), config, layout))
            })
            .collect();
        booting.sort();
        let owed = boot.owed.get(&pool.name).map_or(&[][..], Vec::as_slice);
        let mut owed_iter = owed.iter().filter(|o| !o.layout.is_empty());
        for i in 0..launched {
            let node = if let Some((name, config, layout)) = booting.get(i) {
                synth(name.clone(), config.clone(), layout, &BTreeMap::new())
            } else if let Some(o) = owed_iter.next() {
                synth(
                    format!("{}/launched-{i}", pool.name),
                    o.config.clone(),
                    &o.layout,
                    &BTreeMap::new(),
                )
            } else {
                synth(
                    format!("{}/launched-{i}", pool.name),
                    default_name.clone(),
                    default_layout,
                    &BTreeMap::new(),
                )
            };
            out.push(node);
        }
    }
    out
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
) -> Result<String, ControllerError> {
    let bad = |e: gpuops_mig::MigError| ControllerError::Mig(e.to_string());
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

/// The reconciler: its options and what it remembers between passes.
#[derive(Debug)]
pub struct Mig {
    pub opts: MigOptions,
    memory: std::sync::Mutex<MigMemory>,
}

/// What one pass did, for the runtime to record and publish.
#[derive(Debug, Default)]
pub struct MigPass {
    pub events: Vec<AEvent>,
    pub status: Vec<MigChangeStatus>,
    /// Scale-ups for new MIG nodes the pool's own config serves (the runtime scales the pool).
    pub scale_ups: Vec<ScaleUp>,
    pub decision: MigDecision,
    pub error: Option<ControllerError>,
    /// What MIG pools owe their booting nodes.
    pub owed: Vec<OwedStatus>,
}

/// The agents' ConfigMap as a pass saw it.
#[derive(Debug, Clone)]
struct CmState {
    text: String,
    owed_text: String,
    resource_version: Option<String>,
}

impl CmState {
    fn of(cm: &ConfigMap) -> CmState {
        CmState {
            text: cm
                .data
                .as_ref()
                .and_then(|d| d.get(CONFIGMAP_KEY))
                .cloned()
                .unwrap_or_default(),
            owed_text: cm
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(OWED_ANNOTATION))
                .cloned()
                .unwrap_or_default(),
            resource_version: cm.metadata.resource_version.clone(),
        }
    }
}

/// One owed config, for the status.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OwedStatus {
    pub pool: String,
    pub config: String,
    pub at: Millis,
}

/// The pool's registered nodes nothing has labelled since (still on `default`, no
/// `gpuops.io/mig.config.changed-at`) with their creation times, and how many nodes of the pool
/// have registered at all (pure).
pub fn boot_nodes(
    pool: &str,
    default: &str,
    nodes: &[Arc<Node>],
    snap: &Snapshot,
) -> (Vec<BootNode>, usize) {
    let names: BTreeSet<&str> = snap
        .nodes
        .iter()
        .filter(|n| n.pool.as_deref() == Some(pool))
        .map(|n| n.name.as_str())
        .chain(
            snap.machines
                .iter()
                .filter(|m| m.pool == pool)
                .filter_map(|m| m.node.as_deref()),
        )
        .collect();
    let fresh = nodes
        .iter()
        .filter_map(|n| {
            let name = n.metadata.name.as_deref()?;
            if !names.contains(name) {
                return None;
            }
            let label = n.metadata.labels.as_ref().and_then(|l| l.get(CONFIG_LABEL));
            let touched = n
                .metadata
                .annotations
                .as_ref()
                .is_some_and(|a| a.contains_key(CHANGED_ANNOTATION));
            if touched || label.is_some_and(|l| l != default) {
                return None;
            }
            let t = serde_json::to_value(n.metadata.creation_timestamp.as_ref()?).ok()?;
            Some(BootNode {
                name: name.to_string(),
                registered: crate::snapshot::parse_rfc3339(t.as_str()?)?,
            })
        })
        .collect();
    (fresh, names.len())
}

impl Mig {
    pub fn new(opts: MigOptions) -> Mig {
        Mig {
            opts,
            memory: std::sync::Mutex::new(MigMemory::default()),
        }
    }

    /// Moves the remembered change and failure times with a wall-clock jump.
    pub fn shift(&self, delta_ms: i64) {
        if let Ok(mut m) = self.memory.lock() {
            m.shift(delta_ms);
        }
    }

    /// One pass: label new nodes with the configs their pools owe them, decide on `nodes`
    /// and `snap`, write configs and labels (unless `dry_run`), record what a scale-up with a
    /// generated config owes its pool, and take the MIG pods out of `snap.pending` so the
    /// node-pool decision leaves them to it.
    #[allow(clippy::too_many_lines)]
    pub async fn pass(
        &self,
        client: &kube::Client,
        namespace: &str,
        nodes: &[Arc<Node>],
        snap: &mut Snapshot,
        now: Millis,
        dry_run: bool,
    ) -> MigPass {
        let mut out = MigPass::default();
        let mut boot = Boot::default();
        // Nodes as this pass leaves them: one labelled at boot counts with its new label at
        // once (the cache has the old one), so its config is neither bought again nor pruned.
        let mut local: Vec<Arc<Node>> = nodes.to_vec();
        let mig_pools = snap
            .pools
            .iter()
            .any(|p| p.template.labels.contains_key(CONFIG_LABEL));
        let agentless_generated = nodes.iter().any(|n| {
            parse_layout(n).is_none()
                && n.metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get(CONFIG_LABEL))
                    .is_some_and(|c| c.starts_with(GENERATED_PREFIX))
        });
        // The ConfigMap as this pass last read or wrote it.
        let mut cm: Option<CmState> = None;
        // Why the owed configs cannot be read (then no generated layout is bought).
        let mut owed_broken: Option<String> = None;
        if mig_pools || agentless_generated {
            // Not fatal to the pass: without the ConfigMap nothing is owed and no generated
            // layout can be bought (a pool's own config still can).
            match self.read_configmap(client, namespace).await {
                Ok(c) => cm = Some(c),
                Err(e) => {
                    tracing::debug!(error = %e, "MIG ConfigMap not read");
                    owed_broken = Some(e.to_string());
                }
            }
        }
        let mut owed = OwedMap::new();
        if let Some(c) = &cm {
            match parse_owed(&self.origin(namespace), &c.owed_text) {
                Ok(o) => owed = o,
                Err(e) => {
                    tracing::warn!("{e}");
                    owed_broken = Some(e.to_string());
                    out.error.get_or_insert(e);
                }
            }
        }
        // 1. The new nodes that take what their pools owe.
        let mut kept = OwedMap::new();
        let mut labels: Vec<(String, String, Owed)> = Vec::new();
        let mut dropped: Vec<(String, Owed, String)> = Vec::new();
        for (pool_name, list) in &owed {
            let pool = snap.pools.iter().find(|p| &p.name == pool_name);
            let default = pool.and_then(|p| p.template.labels.get(CONFIG_LABEL));
            let (fresh, registered, replicas, expire) = match (pool, default) {
                (Some(p), Some(d)) => {
                    let (fresh, registered) = boot_nodes(pool_name, d, nodes, snap);
                    let t = &p.timeouts;
                    let expire = u64::try_from((t.provision + t.registration).as_millis())
                        .unwrap_or(u64::MAX);
                    (fresh, registered, p.replicas as usize, expire)
                }
                // The pool is gone (or no MIG pool any more): nothing to wait for.
                _ => (Vec::new(), 0, 0, u64::MAX),
            };
            let a = assign(
                list,
                &fresh,
                replicas.saturating_sub(registered),
                now,
                expire,
            );
            labels.extend(a.labels.into_iter().map(|(n, o)| (pool_name.clone(), n, o)));
            dropped.extend(
                a.dropped
                    .into_iter()
                    .map(|(o, why)| (pool_name.clone(), o, why)),
            );
            if !a.keep.is_empty() {
                kept.insert(pool_name.clone(), a.keep);
            }
        }
        let changed = !labels.is_empty() || !dropped.is_empty();
        if changed && !dry_run {
            // Popped first: a crash now leaves a node with the pool's default (re-partitioned
            // later), never a second node with one entry's config.
            // The configs about to be labelled count as referenced: not pruned.
            let mut after = local.clone();
            for (_, node, o) in &labels {
                relabel_local(&mut after, node, &o.config);
            }
            match self
                .write_configs(client, namespace, &after, &mut cm, &[], Some(&kept))
                .await
            {
                Ok(()) => {
                    for (pool, o, why) in &dropped {
                        out.events.push(AEvent {
                            target: Target::Pool(pool.clone()),
                            reason: "MIGLayoutNotOwed".into(),
                            message: format!(
                                "MIG config {} owed since {} no longer owed: {why}",
                                o.config,
                                gpuops_kube::rfc3339(o.at / 1000)
                            ),
                            warning: true,
                        });
                    }
                    let nodes_api: Api<Node> = Api::all(client.clone());
                    for (pool, node, o) in &labels {
                        match label(&nodes_api, node, &o.config).await {
                            Ok(()) => {
                                relabel_local(&mut local, node, &o.config);
                                out.events.push(AEvent {
                                    target: Target::Node(node.clone()),
                                    reason: "MIGLayoutAtBoot".into(),
                                    message: format!(
                                        "new node {node} of pool {pool} labelled {CONFIG_LABEL}={} (bought for that layout)",
                                        o.config
                                    ),
                                    warning: false,
                                });
                            }
                            Err(e) => {
                                out.error.get_or_insert(e);
                            }
                        }
                    }
                    owed = kept;
                }
                Err(e) => {
                    out.error.get_or_insert(e);
                }
            }
        } else if changed {
            owed = kept;
        }
        let nodes: &[Arc<Node>] = &local;
        // 2. Layouts of the owed configs and of generated configs on nodes no agent reports
        // yet.
        for o in owed.values().flatten() {
            if !o.layout.is_empty() {
                boot.layouts.insert(o.config.clone(), o.layout.clone());
            }
        }
        if let Some(c) = &cm {
            match gpuops_mig::config::parse(&c.text, &self.origin(namespace)) {
                Ok(all) => {
                    for g in all
                        .configs
                        .iter()
                        .filter(|g| g.name.starts_with(GENERATED_PREFIX))
                    {
                        let listed = g
                            .entries
                            .iter()
                            .filter_map(|e| match &e.devices {
                                gpuops_mig::config::Devices::List(l) => {
                                    l.iter().max().map(|m| m + 1)
                                }
                                gpuops_mig::config::Devices::All => None,
                            })
                            .max()
                            .unwrap_or(0);
                        let gpus = snap
                            .pools
                            .iter()
                            .filter_map(|p| {
                                p.template.labels.get("nvidia.com/gpu.count")?.parse().ok()
                            })
                            .max()
                            .unwrap_or(1u32)
                            .max(listed);
                        if let Some(l) = config_layout(g, gpus) {
                            boot.layouts.entry(g.name.clone()).or_insert(l);
                        }
                    }
                }
                Err(e) => tracing::warn!("{e}"),
            }
        }
        out.owed = owed
            .iter()
            .flat_map(|(pool, v)| {
                v.iter().map(|o| OwedStatus {
                    pool: pool.clone(),
                    config: o.config.clone(),
                    at: o.at,
                })
            })
            .collect();
        boot.owed = owed.clone();
        // 3. The decision.
        let (mig_nodes, pods, pools, problems) = view(nodes, snap, &boot);
        snap.pending.retain(|p| !is_mig_pod(p));
        for p in problems {
            tracing::warn!("{p}");
        }
        out.status = under_way(nodes);
        let mut mem = match self.memory.lock() {
            Ok(m) => m.clone(),
            Err(p) => p.into_inner().clone(),
        };
        // Also without pending pods: failures are remembered for the back-off.
        let d = decide_mig(
            &mig_nodes,
            &pods,
            &pools,
            &mut mem,
            now,
            &self.opts.decision,
        );
        if !dry_run {
            for n in nodes {
                if let Some(ev) = self.revert_failed(client, n).await {
                    match ev {
                        Ok(ev) => out.events.push(ev),
                        Err(e) => {
                            out.error.get_or_insert(e);
                        }
                    }
                }
            }
            if !d.changes.is_empty() {
                let add: Vec<&NamedConfigYaml> = d.changes.iter().map(|c| &c.config).collect();
                let owed_now = (owed_broken.is_none()).then_some(&owed);
                let mut r = self
                    .write_configs(client, namespace, nodes, &mut cm, &add, owed_now)
                    .await;
                if r.is_ok() {
                    let nodes_api: Api<Node> = Api::all(client.clone());
                    for c in &d.changes {
                        r = label(&nodes_api, &c.node, &c.config_name).await;
                        if r.is_err() {
                            break;
                        }
                    }
                }
                match r {
                    Ok(()) => {
                        for c in &d.changes {
                            out.events.push(AEvent {
                                target: Target::Node(c.node.clone()),
                                reason: "MIGRepartition".into(),
                                message: c.message.clone(),
                                warning: false,
                            });
                            for p in &c.pods {
                                out.events.push(AEvent {
                                    target: Target::Pod(p.clone()),
                                    reason: "TriggeredMIGRepartition".into(),
                                    message: c.message.clone(),
                                    warning: false,
                                });
                            }
                        }
                    }
                    Err(e) => {
                        // Not done: the nodes may be chosen again next pass.
                        for c in &d.changes {
                            mem.last_change.remove(&c.node);
                        }
                        out.error.get_or_insert(e);
                    }
                }
            }
        }
        // 4. Scale-ups: the pool's own config as it is; a generated one written into the
        // ConfigMap together with what the pool is owed, before the runtime scales it.
        for su in &d.scale_ups {
            let Some(p) = snap.pools.iter().find(|p| p.name == su.pool) else {
                continue;
            };
            let default = p.template.labels.get(CONFIG_LABEL);
            let generated = default != Some(&su.config_name);
            if generated && let Some(why) = &owed_broken {
                for pod in &su.pods {
                    out.events.push(AEvent {
                        target: Target::Pod(pod.clone()),
                        reason: "NotTriggerScaleUp".into(),
                        message: format!("{}; not bought: {why}", su.message),
                        warning: true,
                    });
                }
                continue;
            }
            if generated && !dry_run {
                owed.entry(su.pool.clone())
                    .or_default()
                    .extend((0..su.nodes).map(|_| Owed {
                        config: su.config_name.clone(),
                        at: now,
                        layout: su.layout.clone(),
                    }));
                if let Err(e) = self
                    .write_configs(
                        client,
                        namespace,
                        nodes,
                        &mut cm,
                        &[&su.config],
                        Some(&owed),
                    )
                    .await
                {
                    out.error.get_or_insert(e);
                    // Not recorded: not bought; decided again next pass.
                    if let Some(v) = owed.get_mut(&su.pool) {
                        let keep = v.len().saturating_sub(su.nodes as usize);
                        v.truncate(keep);
                    }
                    continue;
                }
                out.owed.extend((0..su.nodes).map(|_| OwedStatus {
                    pool: su.pool.clone(),
                    config: su.config_name.clone(),
                    at: now,
                }));
            }
            out.scale_ups.push(ScaleUp {
                pool: su.pool.clone(),
                from: p.replicas,
                to: p.replicas + su.nodes,
                pods: su.pods.clone(),
                triggered_by: su.pods.clone(),
                message: su.message.clone(),
            });
            for pod in &su.pods {
                out.events.push(AEvent {
                    target: Target::Pod(pod.clone()),
                    reason: "TriggeredScaleUp".into(),
                    message: if generated {
                        format!(
                            "{}; its new node(s) are labelled {} when they register",
                            su.message, su.config_name
                        )
                    } else {
                        su.message.clone()
                    },
                    warning: false,
                });
            }
        }
        match self.memory.lock() {
            Ok(mut m) => *m = mem,
            Err(p) => *p.into_inner() = mem,
        }
        out.decision = d;
        out
    }

    fn origin(&self, namespace: &str) -> String {
        format!("ConfigMap {namespace}/{}", self.opts.configmap)
    }

    async fn read_configmap(
        &self,
        client: &kube::Client,
        namespace: &str,
    ) -> Result<CmState, ControllerError> {
        let name = &self.opts.configmap;
        let api: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
        let cm = api.get(name).await.map_err(|source| ControllerError::Api {
            what: format!("reading MIG ConfigMap {namespace}/{name}"),
            source,
        })?;
        Ok(CmState::of(&cm))
    }

    /// Merges `add` into the agents' ConfigMap and, with `owed`, sets the owed configs, in one
    /// patch; generated configs still named by a node label, a node's applied config or an
    /// owed entry are kept. Before any label names them: a label naming a config the ConfigMap
    /// lacks would only fail. `cm` is the ConfigMap as last seen (read when `None`), and is
    /// what the API server returned after.
    async fn write_configs(
        &self,
        client: &kube::Client,
        namespace: &str,
        nodes: &[Arc<Node>],
        cm: &mut Option<CmState>,
        add: &[&NamedConfigYaml],
        owed: Option<&OwedMap>,
    ) -> Result<(), ControllerError> {
        let name = &self.opts.configmap;
        let api: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
        let what = |verb: &str| format!("{verb} MIG ConfigMap {namespace}/{name}");
        let current = match cm.take() {
            Some(c) => c,
            None => self.read_configmap(client, namespace).await?,
        };
        let mut referenced: BTreeSet<String> = nodes
            .iter()
            .filter_map(|n| n.metadata.labels.as_ref()?.get(CONFIG_LABEL).cloned())
            .collect();
        referenced.extend(nodes.iter().filter_map(|n| {
            let l = parse_layout(n)?.ok()?;
            l.applied
        }));
        // Owed configs not rewritten here are still owed as the ConfigMap has them.
        let still_owed: OwedMap = match owed {
            Some(o) => o.clone(),
            None => parse_owed(&self.origin(namespace), &current.owed_text).unwrap_or_default(),
        };
        referenced.extend(still_owed.values().flatten().map(|o| o.config.clone()));
        let text = merge_configs(
            &current.text,
            &format!("ConfigMap {namespace}/{name} key {CONFIGMAP_KEY}"),
            add,
            &referenced,
        )?;
        let owed_text = owed.map(owed_json);
        let owed_changed = owed_text
            .as_ref()
            .is_some_and(|t| parse_owed("", t).ok() != parse_owed("", &current.owed_text).ok());
        if text == current.text && !owed_changed {
            *cm = Some(current);
            return Ok(());
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
        let updated = api
            .patch(
                name,
                &PatchParams::apply(crate::act::MANAGER),
                &Patch::Merge(&patch),
            )
            .await
            .map_err(|source| ControllerError::Api {
                what: what("writing"),
                source,
            })?;
        *cm = Some(CmState::of(&updated));
        Ok(())
    }

    /// A node whose change to one of our configs failed goes back to the config it last
    /// applied (its capacity comes back; the decision's back-off keeps it from being chosen
    /// again for a while). `None`: nothing to do.
    async fn revert_failed(
        &self,
        client: &kube::Client,
        n: &Node,
    ) -> Option<Result<AEvent, ControllerError>> {
        let labels = n.metadata.labels.as_ref()?;
        if labels.get(STATE_LABEL).map(String::as_str) != Some("failed") {
            return None;
        }
        let wanted = labels.get(CONFIG_LABEL)?;
        if !wanted.starts_with(GENERATED_PREFIX) {
            return None;
        }
        let applied = parse_layout(n)?.ok()?.applied?;
        if &applied == wanted {
            return None;
        }
        let name = n.metadata.name.clone().unwrap_or_default();
        let reason = n
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(REASON_ANNOTATION))
            .cloned()
            .unwrap_or_else(|| "no reason given".into());
        let nodes_api: Api<Node> = Api::all(client.clone());
        Some(label(&nodes_api, &name, &applied).await.map(|()| AEvent {
            target: Target::Node(name.clone()),
            reason: "MIGRepartitionFailed".into(),
            message: format!(
                "MIG config {wanted} failed on node {name} ({reason}); back to {applied}, not re-partitioned again for {:?}",
                self.opts.decision.failed_backoff
            ),
            warning: true,
        }))
    }
}

async fn label(api: &Api<Node>, node: &str, config: &str) -> Result<(), ControllerError> {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let patch = json!({"metadata": {
        "labels": {CONFIG_LABEL: config},
        "annotations": {CHANGED_ANNOTATION: gpuops_kube::rfc3339(now)},
    }});
    api.patch(node, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(|source| ControllerError::Api {
            what: format!("labelling node {node} {CONFIG_LABEL}={config}"),
            source,
        })?;
    Ok(())
}

/// `nodes` with `node` labelled `config` as [`label`] just did.
fn relabel_local(nodes: &mut [Arc<Node>], node: &str, config: &str) {
    for n in nodes.iter_mut() {
        if n.metadata.name.as_deref() == Some(node) {
            let n = Arc::make_mut(n);
            n.metadata
                .labels
                .get_or_insert_with(BTreeMap::new)
                .insert(CONFIG_LABEL.into(), config.into());
            n.metadata
                .annotations
                .get_or_insert_with(BTreeMap::new)
                .insert(
                    CHANGED_ANNOTATION.into(),
                    gpuops_kube::rfc3339(gpuops_kube::now_secs()),
                );
        }
    }
}

/// Nodes whose label asks for a config they have not applied yet, or whose change failed.
fn under_way(nodes: &[Arc<Node>]) -> Vec<MigChangeStatus> {
    let mut out = Vec::new();
    for n in nodes {
        let Some(Ok(layout)) = parse_layout(n) else {
            continue;
        };
        let labels = n.metadata.labels.clone().unwrap_or_default();
        let Some(to) = labels.get(CONFIG_LABEL) else {
            continue;
        };
        let state = labels.get(STATE_LABEL).map(String::as_str);
        let state = match (state, layout.applied.as_ref() == Some(to)) {
            (Some("failed"), _) => "failed",
            (_, true) => continue,
            (Some("pending" | "rebooting"), false) => "pending",
            _ => "requested",
        };
        out.push(MigChangeStatus {
            node: n.metadata.name.clone().unwrap_or_default(),
            from: layout.applied.clone().unwrap_or_else(|| "-".into()),
            to: to.clone(),
            state: state.into(),
            message: n
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(REASON_ANNOTATION))
                .filter(|_| state == "failed")
                .cloned()
                .unwrap_or_default(),
        });
    }
    out
}

#[cfg(test)]
#[path = "mig_tests.rs"]
mod tests;
