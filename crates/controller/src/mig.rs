//! The MIG demand reconciler's controller half: the inputs of `decide_mig` from the watched
//! Nodes (the agent's `gpuops.io/mig.layout` annotation and MIG labels) and the snapshot, and
//! its actions: named configs merged into the agents' mig-parted ConfigMap, then the node label
//! `nvidia.com/mig.config` the agent applies; a failed change is put back to the config the
//! node last applied.

use crate::error::ControllerError;
use gpuops_autoscale::mig_demand::{
    MigConfig, MigDecision, MigGpu, MigMemory, MigNode, MigNodeState, MigPod, MigPool,
    NamedConfigYaml, decide_mig,
};
use gpuops_autoscale::{Event as AEvent, Millis, ScaleUp, Snapshot, Target};
use k8s_openapi::api::core::v1::{ConfigMap, Node};
use kube::api::{Api, Patch, PatchParams};
use serde::{Deserialize, Serialize};
use serde_json::json;
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
                .and_then(|s| crate::snapshot::parse_rfc3339(s)),
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
    out.extend(pool_nodes(&out, snap, &pools));
    (out, pods, pools, problems)
}

/// Nodes of MIG pools that publish no layout yet: those launched and not ready (replicas minus
/// ready nodes) and ready ones without an agent's annotation, taken to have the pool's default
/// layout, in flight (never re-partitioned). Pods they will hold are counted as served, so a
/// pool is not bought twice for one need.
fn pool_nodes(known: &[MigNode], snap: &Snapshot, pools: &[MigPool]) -> Vec<MigNode> {
    let mut out = Vec::new();
    for pool in pools {
        let Some((config, layout)) = &pool.default_config else {
            continue;
        };
        let ready: Vec<&gpuops_autoscale::Node> = snap
            .nodes
            .iter()
            .filter(|n| n.pool.as_deref() == Some(pool.name.as_str()))
            .collect();
        let synth = |name: String, used: &BTreeMap<String, u64>| {
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
                config: config.clone(),
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
            // Used = the template's count minus what is free now.
            let per_node: BTreeMap<String, u64> =
                layout.iter().fold(BTreeMap::new(), |mut a, g| {
                    for (k, v) in g {
                        *a.entry(k.clone()).or_insert(0) += u64::from(*v);
                    }
                    a
                });
            let used = per_node
                .iter()
                .map(|(k, total)| {
                    let free = n
                        .scalars_free
                        .get(&format!("{RESOURCE_PREFIX}{k}"))
                        .copied()
                        .unwrap_or(0);
                    (k.clone(), total.saturating_sub(free))
                })
                .collect();
            let mut node = synth(n.name.clone(), &used);
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
        for i in 0..launched {
            out.push(synth(
                format!("{}/launched-{i}", pool.name),
                &BTreeMap::new(),
            ));
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

    /// One pass: decide on `nodes` and `snap`, write configs and labels (unless `dry_run`),
    /// and take the MIG pods out of `snap.pending` so the node-pool decision leaves them to it.
    pub async fn pass(
        &self,
        client: &kube::Client,
        namespace: &str,
        nodes: &[Arc<Node>],
        snap: &mut Snapshot,
        now: Millis,
        dry_run: bool,
    ) -> MigPass {
        let (mig_nodes, pods, pools, problems) = view(nodes, snap);
        snap.pending.retain(|p| !is_mig_pod(p));
        let mut out = MigPass::default();
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
                let r = self.write_changes(client, namespace, nodes, &d).await;
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
        for su in &d.scale_ups {
            let pool = snap.pools.iter().find(|p| p.name == su.pool);
            let default = pool.and_then(|p| p.template.labels.get(CONFIG_LABEL));
            match pool {
                Some(p) if default == Some(&su.config_name) => {
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
                            message: su.message.clone(),
                            warning: false,
                        });
                    }
                }
                _ => {
                    for pod in &su.pods {
                        out.events.push(AEvent {
                            target: Target::Pod(pod.clone()),
                            reason: "NotTriggerScaleUp".into(),
                            message: format!(
                                "{}; not bought: pool {} comes up with {}, and a pool's nodes are not re-labelled at boot",
                                su.message,
                                su.pool,
                                default.map_or("no MIG config", String::as_str)
                            ),
                            warning: true,
                        });
                    }
                }
            }
        }
        match self.memory.lock() {
            Ok(mut m) => *m = mem,
            Err(p) => *p.into_inner() = mem,
        }
        out.decision = d;
        out
    }

    /// Writes the chosen configs into the agents' ConfigMap, then labels the nodes: a label
    /// naming a config the ConfigMap lacks would only fail.
    async fn write_changes(
        &self,
        client: &kube::Client,
        namespace: &str,
        nodes: &[Arc<Node>],
        d: &MigDecision,
    ) -> Result<(), ControllerError> {
        let name = &self.opts.configmap;
        let api: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
        let what = |verb: &str| format!("{verb} MIG ConfigMap {namespace}/{name}");
        let cm = api.get(name).await.map_err(|source| ControllerError::Api {
            what: what("reading"),
            source,
        })?;
        let existing = cm
            .data
            .as_ref()
            .and_then(|d| d.get(CONFIGMAP_KEY))
            .cloned()
            .unwrap_or_default();
        let mut referenced: BTreeSet<String> = nodes
            .iter()
            .filter_map(|n| n.metadata.labels.as_ref()?.get(CONFIG_LABEL).cloned())
            .collect();
        referenced.extend(nodes.iter().filter_map(|n| {
            let l = parse_layout(n)?.ok()?;
            l.applied
        }));
        let add: Vec<&NamedConfigYaml> = d.changes.iter().map(|c| &c.config).collect();
        let text = merge_configs(
            &existing,
            &format!("ConfigMap {namespace}/{name} key {CONFIGMAP_KEY}"),
            &add,
            &referenced,
        )?;
        if text != existing {
            // The resourceVersion makes a concurrent edit (helm, a person) a conflict, retried
            // next pass from what is there then.
            let patch = json!({
                "metadata": {"resourceVersion": cm.metadata.resource_version},
                "data": {CONFIGMAP_KEY: text},
            });
            api.patch(
                name,
                &PatchParams::apply(crate::act::MANAGER),
                &Patch::Merge(&patch),
            )
            .await
            .map_err(|source| ControllerError::Api {
                what: what("writing"),
                source,
            })?;
        }
        let nodes_api: Api<Node> = Api::all(client.clone());
        for c in &d.changes {
            label(&nodes_api, &c.node, &c.config_name).await?;
        }
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
