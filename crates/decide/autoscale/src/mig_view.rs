//! The MIG demand reconciler's view of the Nodes, pure: the inputs of `decide_mig` from the
//! watched Nodes (the agent's `gpuops.io/mig.layout` annotation and MIG labels) and the
//! snapshot, which new nodes take what their pools owe, the changes under way, and what a pass
//! does with a node whose change failed. The controller observes the Nodes and acts.

use crate::decision::{Event, Target};
use crate::error::AutoscaleError;
use crate::mig_demand::{MigGpu, MigNode, MigNodeState, MigPod, MigPool};
use crate::mig_owed::{
    Assignment, BootNode, CHANGED_ANNOTATION, CONFIG_LABEL, CONFIGMAP_KEY, ConfigMapText,
    GENERATED_PREFIX, LAYOUT_ANNOTATION, MigChangeStatus, OWED_ANNOTATION, Owed, OwedMap,
    REASON_ANNOTATION, RESOURCE_PREFIX, STATE_LABEL, assign,
};
use crate::model::{Millis, PendingPod, Snapshot};
use crate::snapshot::meta_time;
use crate::time::{parse_rfc3339, rfc3339, second_end};
use k8s_openapi::api::core::v1::{ConfigMap, Node};
use serde::Deserialize;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

/// What the pools owe their booting nodes, and the layouts of the generated configs nodes
/// are labelled with, for [`view`].
#[derive(Debug, Clone, Default)]
pub struct Boot {
    /// Pool -> owed configs (after this pass's assignment).
    pub owed: BTreeMap<String, Vec<Owed>>,
    /// Config name -> devices per GPU (from the owed entries and the agents' ConfigMap).
    pub layouts: crate::mig_owed::Layouts,
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

fn parse_layout(node: &Node) -> Option<Result<Layout, AutoscaleError>> {
    let text = node.metadata.annotations.as_ref()?.get(LAYOUT_ANNOTATION)?;
    Some(
        serde_json::from_str(text).map_err(|e| AutoscaleError::Layout {
            node: node.metadata.name.clone().unwrap_or_default(),
            annotation: LAYOUT_ANNOTATION,
            message: e.to_string(),
        }),
    )
}

/// The profile and count of a pending pod asking for MIG devices of exactly one profile.
fn mig_ask(p: &PendingPod) -> Option<(String, u32)> {
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
pub fn is_mig_pod(p: &PendingPod) -> bool {
    mig_ask(p).is_some()
}

/// The decision's inputs from the Nodes and the snapshot (pure). Problems (an annotation that
/// does not parse) are returned, not fatal: that node is left out.
pub fn view(
    nodes: &[Arc<Node>],
    snap: &Snapshot,
    boot: &Boot,
) -> (Vec<MigNode>, Vec<MigPod>, Vec<MigPool>, Vec<AutoscaleError>) {
    let (mut out, problems) = agent_nodes(nodes, snap);
    let pods = mig_pods(snap);
    let pools = mig_pools(snap);
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

/// The nodes whose agent publishes a layout, and the layouts that do not parse.
fn agent_nodes(nodes: &[Arc<Node>], snap: &Snapshot) -> (Vec<MigNode>, Vec<AutoscaleError>) {
    let mut problems = Vec::new();
    let price: HashMap<&str, f64> = snap
        .pools
        .iter()
        .map(|p| (p.name.as_str(), p.price_per_hour))
        .collect();
    let ready: HashMap<&str, &crate::model::Node> =
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
                .and_then(|s| parse_rfc3339(s))
                // Written in whole seconds: the minimum interval counts from the second's end,
                // so it never ends early (see crate::time).
                .map(second_end),
            unschedulable: n.spec.as_ref().and_then(|s| s.unschedulable) == Some(true)
                || seen.is_some_and(|s| s.removing),
            in_flight: seen.is_none(),
            cpu_free_milli: seen.map_or(u64::MAX, |s| s.cpu_free_milli),
            memory_free_mib: seen.map_or(u64::MAX, |s| s.memory_free_mib),
            gpus: layout.gpus,
            name,
        });
    }
    (out, problems)
}

/// The pending pods asking for MIG devices of one profile.
fn mig_pods(snap: &Snapshot) -> Vec<MigPod> {
    snap.pending
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
        .collect()
}

/// The pools whose template offers MIG devices, with their per-GPU layout.
fn mig_pools(snap: &Snapshot) -> Vec<MigPool> {
    snap.pools
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
        .collect()
}

/// Devices per GPU.
type PerGpu = Vec<BTreeMap<String, u32>>;

/// A node of `pool` in flight with `config`'s `layout`, its first `used` devices of each
/// profile busy.
fn synth_node(
    pool: &MigPool,
    name: String,
    config: String,
    layout: &[BTreeMap<String, u32>],
    used: &BTreeMap<String, u64>,
) -> MigNode {
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
                    instances.push(crate::mig_demand::MigInstance {
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
}

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
        let ready: Vec<&crate::model::Node> = snap
            .nodes
            .iter()
            .filter(|n| n.pool.as_deref() == Some(pool.name.as_str()))
            .collect();
        let synth = |name: String,
                     config: String,
                     layout: &[BTreeMap<String, u32>],
                     used: &BTreeMap<String, u64>| {
            synth_node(pool, name, config, layout, used)
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
            Some(BootNode {
                name: name.to_string(),
                registered: meta_time(n.metadata.creation_timestamp.as_ref())?,
            })
        })
        .collect();
    (fresh, names.len())
}

/// `nodes` with `node` labelled `config` at `now_secs` as the controller's labelling does.
pub fn relabel_local(nodes: &mut [Arc<Node>], node: &str, config: &str, now_secs: u64) {
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
                .insert(CHANGED_ANNOTATION.into(), rfc3339(now_secs));
        }
    }
}

/// Nodes whose label asks for a config they have not applied yet, or whose change failed.
pub fn under_way(nodes: &[Arc<Node>]) -> Vec<MigChangeStatus> {
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

/// Whether a pass needs the agents' ConfigMap: a pool offers MIG, or a node no agent reports
/// yet is labelled with a generated config (its layout is in the ConfigMap).
pub fn needs_configmap(nodes: &[Arc<Node>], snap: &Snapshot) -> bool {
    let mig_pools = snap
        .pools
        .iter()
        .any(|p| p.template.labels.contains_key(CONFIG_LABEL));
    mig_pools
        || nodes.iter().any(|n| {
            parse_layout(n).is_none()
                && n.metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get(CONFIG_LABEL))
                    .is_some_and(|c| c.starts_with(GENERATED_PREFIX))
        })
}

impl ConfigMapText {
    /// The parts of the agents' ConfigMap a pass reads.
    pub fn of(cm: &ConfigMap) -> ConfigMapText {
        ConfigMapText {
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

/// What a pass does with the owed configs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BootPlan {
    /// (pool, node, entry): the new node is labelled with the entry's config.
    pub labels: Vec<(String, String, Owed)>,
    /// (pool, entry, why): given up.
    pub dropped: Vec<(String, Owed, String)>,
    /// What stays owed.
    pub kept: OwedMap,
}

impl BootPlan {
    /// Whether the owed configs change.
    pub fn changes(&self) -> bool {
        !self.labels.is_empty() || !self.dropped.is_empty()
    }
}

/// Which new nodes take what their pools owe ([`assign`] per pool, on the pool's fresh nodes
/// and the nodes it still waits for); entries of a pool gone (or no MIG pool any more) wait
/// for nothing and are dropped as too many.
pub fn plan_boot(owed: &OwedMap, nodes: &[Arc<Node>], snap: &Snapshot, now: Millis) -> BootPlan {
    let mut out = BootPlan::default();
    for (pool_name, list) in owed {
        let pool = snap.pools.iter().find(|p| &p.name == pool_name);
        let default = pool.and_then(|p| p.template.labels.get(CONFIG_LABEL));
        let (fresh, registered, replicas, expire) = match (pool, default) {
            (Some(p), Some(d)) => {
                let (fresh, registered) = boot_nodes(pool_name, d, nodes, snap);
                let t = &p.timeouts;
                let expire =
                    u64::try_from((t.provision + t.registration).as_millis()).unwrap_or(u64::MAX);
                (fresh, registered, p.replicas as usize, expire)
            }
            _ => (Vec::new(), 0, 0, u64::MAX),
        };
        let Assignment {
            labels,
            keep,
            dropped,
        } = assign(
            list,
            &fresh,
            replicas.saturating_sub(registered),
            now,
            expire,
        );
        out.labels
            .extend(labels.into_iter().map(|(n, o)| (pool_name.clone(), n, o)));
        out.dropped.extend(
            dropped
                .into_iter()
                .map(|(o, why)| (pool_name.clone(), o, why)),
        );
        if !keep.is_empty() {
            out.kept.insert(pool_name.clone(), keep);
        }
    }
    out
}

/// The configs nodes name: their labels and the configs their agents last applied (generated
/// ones are kept in the ConfigMap while named).
pub fn referenced_by_nodes(nodes: &[Arc<Node>]) -> BTreeSet<String> {
    let mut referenced: BTreeSet<String> = nodes
        .iter()
        .filter_map(|n| n.metadata.labels.as_ref()?.get(CONFIG_LABEL).cloned())
        .collect();
    referenced.extend(nodes.iter().filter_map(|n| {
        let l = parse_layout(n)?.ok()?;
        l.applied
    }));
    referenced
}

/// A node put back to the config it last applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Revert {
    pub node: String,
    /// The config to label it with.
    pub to: String,
    pub event: Event,
}

/// A node whose change to one of our configs failed goes back to the config it last applied
/// (its capacity comes back; the decision's back-off, `backoff`, keeps it from being chosen
/// again for a while). `None`: nothing to do.
pub fn revert_failed(n: &Node, backoff: std::time::Duration) -> Option<Revert> {
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
    Some(Revert {
        event: Event {
            target: Target::Node(name.clone()),
            reason: "MIGRepartitionFailed".into(),
            message: format!(
                "MIG config {wanted} failed on node {name} ({reason}); back to {applied}, not re-partitioned again for {backoff:?}"
            ),
            warning: true,
        },
        node: name,
        to: applied,
    })
}

#[cfg(test)]
#[path = "mig_view_tests.rs"]
mod tests;
