//! Demand-driven MIG, pure: pending pods asking for MIG profiles that no node offers free are
//! batched, then served by re-partitioning free capacity of MIG-capable nodes (cheaper nodes
//! first, every busy instance kept) and, for what re-partitioning cannot serve, by new nodes
//! of a MIG pool bought with the layout they need.
//!
//! The caller's clock is a parameter (`now`), so the controller and a trace replay run the same
//! code. Hysteresis lives in [`MigMemory`]: a minimum time between two changes of one node, a
//! back-off for nodes whose last change failed, and demand that must have persisted for the
//! batch idle window before it counts. Every GPU layout is checked by the exact placement
//! planner ([`gpuops_mig::planner::plan`]) from the GPU's busy instances only, so a layout is
//! accepted only when every busy instance stays at its placement.

use crate::model::Millis;
use gpuops_catalog::{Family, GpuModel};
use gpuops_mig::config::{DeviceSpec, Devices, MigPartedConfig, NamedConfig};
use gpuops_mig::layout::{Instance, Layout, gi_profile_of};
use gpuops_mig::planner::{self, Plan};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::time::Duration;

/// Knobs of the MIG demand decision.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MigConfig {
    /// A pending pod counts once it has waited this long (flapping demand never does), and a
    /// batch closes once no pod newer than this is pending ...
    pub batch_idle: Duration,
    /// ... or once the oldest pending pod waited this long.
    pub batch_max: Duration,
    /// Minimum time between two layout changes of one node.
    pub min_interval: Duration,
    /// A node whose change failed is not chosen for this long after the failure was seen (and
    /// never while it is still failed).
    pub failed_backoff: Duration,
}

impl Default for MigConfig {
    fn default() -> Self {
        // nos batches MIG demand over 10 s idle / 60 s max; a change takes the device plugin
        // down for tens of seconds, so one node is not re-partitioned more than every 10 min.
        Self {
            batch_idle: Duration::from_secs(10),
            batch_max: Duration::from_secs(60),
            min_interval: Duration::from_secs(10 * 60),
            failed_backoff: Duration::from_secs(30 * 60),
        }
    }
}

/// `nvidia.com/mig.config.state` of a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum MigNodeState {
    /// The label's config is applied.
    Success,
    /// A change is under way (`pending`, `rebooting`).
    Pending,
    /// The last change failed.
    Failed,
}

/// One MIG device on a GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MigInstance {
    /// Canonical MIG device name (`1g.10gb`).
    pub profile: String,
    /// First memory slice.
    pub start: u32,
    /// A pod holds it: it must survive every change.
    pub busy: bool,
}

/// One physical GPU of a node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MigGpu {
    pub mig_enabled: bool,
    /// With MIG off: the whole GPU runs a pod (it is never touched then).
    pub busy: bool,
    pub instances: Vec<MigInstance>,
}

/// A MIG-capable (or not: it is then skipped) node as the decision sees it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MigNode {
    pub name: String,
    pub pool: Option<String>,
    /// Catalog key or `nvidia.com/gpu.product` value of its GPUs.
    pub model: String,
    /// Price of one node-hour (cheaper nodes are re-partitioned first).
    pub price_per_hour: f64,
    /// `nvidia.com/mig.config` now.
    pub config: String,
    pub state: MigNodeState,
    /// When its label last changed, if known (survives a controller restart, unlike the memory).
    pub changed_at: Option<Millis>,
    /// Cordoned or being removed: not re-partitioned.
    pub unschedulable: bool,
    /// Launched, not ready yet: its layout counts as capacity pods wait for (so demand it
    /// will serve buys nothing twice), and it is not re-partitioned.
    #[serde(default)]
    pub in_flight: bool,
    /// The GPUs; for a node in state `Pending`, the layout being applied.
    pub gpus: Vec<MigGpu>,
    /// Free CPU (milli) and memory (MiB): a free slice is no use to a pod the node has no
    /// room for.
    #[serde(default = "unbounded")]
    pub cpu_free_milli: u64,
    #[serde(default = "unbounded")]
    pub memory_free_mib: u64,
}

fn unbounded() -> u64 {
    u64::MAX
}

/// A pending pod asking for MIG devices of one profile.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MigPod {
    pub key: String,
    pub created: Millis,
    /// Profile (`3g.40gb`) of its `nvidia.com/mig-3g.40gb` request.
    pub profile: String,
    /// How many of them (all on one node).
    pub count: u32,
    #[serde(default)]
    pub cpu_milli: u64,
    #[serde(default)]
    pub memory_mib: u64,
}

/// A pool new MIG nodes can be bought from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MigPool {
    pub name: String,
    /// Catalog key or product name of its GPUs.
    pub model: String,
    pub gpus: u32,
    pub price_per_hour: f64,
    /// How many more nodes it may get (max size minus current and in-flight replicas).
    pub room: u32,
    /// The named config its nodes come up with by default and its per-GPU devices, if any.
    pub default_config: Option<(String, Vec<BTreeMap<String, u32>>)>,
    /// CPU (milli) and memory (MiB) of one node.
    #[serde(default = "unbounded")]
    pub cpu_milli: u64,
    #[serde(default = "unbounded")]
    pub memory_mib: u64,
}

/// What the decision remembers between calls.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct MigMemory {
    /// Node -> when this decision last changed its layout.
    pub last_change: BTreeMap<String, Millis>,
    /// Node -> when its change was first seen failed.
    pub failed_at: BTreeMap<String, Millis>,
}

impl MigMemory {
    /// Moves every remembered instant by `delta_ms` (see [`crate::model::State::shift`]).
    pub fn shift(&mut self, delta_ms: i64) {
        for t in self
            .last_change
            .values_mut()
            .chain(self.failed_at.values_mut())
        {
            *t = crate::model::shift_ms(*t, delta_ms);
        }
    }
}

/// Re-partition one node: the named config to write and the label value to set.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MigChange {
    pub node: String,
    /// The new `nvidia.com/mig.config` value (the config's name).
    pub config_name: String,
    /// The mig-parted config (one named config) for the agents' ConfigMap.
    pub config: NamedConfigYaml,
    /// Per changed GPU (index): the planner's plan from its busy instances.
    pub plans: Vec<(u32, Plan)>,
    /// Pending pods the change is for.
    pub pods: Vec<String>,
    pub message: String,
}

/// New nodes of a MIG pool, bought with the layout they need.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MigScaleUp {
    pub pool: String,
    pub nodes: u32,
    /// `nvidia.com/mig.config` the new nodes come up with: the pool's default when it serves
    /// the pods, else a generated config.
    pub config_name: String,
    pub config: NamedConfigYaml,
    /// Devices per GPU of the new nodes.
    pub layout: Vec<BTreeMap<String, u32>>,
    pub pods: Vec<String>,
    pub message: String,
}

/// A named mig-parted config with its YAML text (`version: v1`, one config).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NamedConfigYaml {
    pub name: String,
    pub yaml: String,
}

/// The outcome of one [`decide_mig`] call.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct MigDecision {
    pub changes: Vec<MigChange>,
    pub scale_ups: Vec<MigScaleUp>,
    /// Pods a free instance already exists for (the scheduler binds them).
    pub served_by_free: Vec<String>,
    /// Pods whose demand has not persisted for the batch window yet, or whose batch is open.
    pub waiting: Vec<String>,
    /// Pods nothing can serve now, with the reason.
    pub unserved: Vec<(String, String)>,
}

fn ms(d: Duration) -> Millis {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// The catalog model of a key or product name.
pub fn model_of(name: &str) -> Option<&'static GpuModel> {
    gpuops_catalog::lookup(name).ok().or_else(|| {
        gpuops_catalog::models()
            .iter()
            .find(|m| m.nvml_name.replace(' ', "-").eq_ignore_ascii_case(name))
    })
}

/// Memory slices one instance of `profile` takes on `model` (0: not a profile of it).
fn slices(model: &GpuModel, profile: &str) -> u32 {
    gi_profile_of(model, profile).map_or(0, |p| p.memory_slices)
}

/// Feasibility of "these busy instances plus exactly these counts", memoized: many GPUs of a
/// cluster share a busy layout, and the planner is the expensive part.
/// (model, busy instances, wanted counts).
type PlanKey = (&'static str, Vec<(String, u32)>, Vec<(String, u32)>);

#[derive(Default)]
struct Planner {
    memo: HashMap<PlanKey, Option<Plan>>,
    /// [`slices`] by model and profile: asked for every instance of every GPU filled, and
    /// each answer parses the profile's name.
    sizes: HashMap<&'static str, HashMap<String, u32>>,
}

impl Planner {
    fn slices(&mut self, model: &'static GpuModel, profile: &str) -> u32 {
        let sizes = self.sizes.entry(model.key).or_default();
        match sizes.get(profile) {
            Some(&n) => n,
            None => {
                let n = slices(model, profile);
                sizes.insert(profile.to_string(), n);
                n
            }
        }
    }

    fn plan(
        &mut self,
        model: &'static GpuModel,
        busy: &Layout,
        wanted: &BTreeMap<String, u32>,
    ) -> Option<Plan> {
        let key = (
            model.key,
            busy.instances
                .iter()
                .map(|i| (i.profile.clone(), i.start))
                .collect(),
            wanted.iter().map(|(k, v)| (k.clone(), *v)).collect(),
        );
        if let Some(p) = self.memo.get(&key) {
            return p.clone();
        }
        // Current = the busy instances only: free ones may go, and a plan that destroys
        // anything destroys a busy instance, which is never allowed.
        let p = planner::plan(model, wanted, busy)
            .ok()
            .filter(|p| p.destroy.is_empty() && p.keep.len() == busy.instances.len());
        self.memo.insert(key, p.clone());
        p
    }
}

/// Demand grouped by profile, each queue in service order.
struct Demand {
    /// Profiles largest first (memory slices), then name.
    order: Vec<String>,
    queues: BTreeMap<String, VecDeque<usize>>,
}

impl Demand {
    fn is_empty(&self) -> bool {
        self.queues.values().all(VecDeque::is_empty)
    }
}

/// Fills one GPU from `demand` around its busy instances; returns the pods placed and the
/// resulting wanted counts (busy + added + the free instances that still fit), or `None` when
/// nothing could be added.
fn fill_gpu(
    planner: &mut Planner,
    model: &'static GpuModel,
    busy: &Layout,
    free_before: &[String],
    demand: &mut Demand,
    pods: &[MigPod],
    budget: &mut (u64, u64),
) -> Option<(Vec<usize>, BTreeMap<String, u32>, Plan)> {
    let total = model.mig.as_ref().map_or(0, |m| m.memory_slices);
    let mut wanted = busy.counts();
    let mut used: u32 = busy
        .instances
        .iter()
        .map(|i| planner.slices(model, &i.profile))
        .sum();
    let mut placed = Vec::new();
    let mut last: Option<Plan> = None;
    let Demand { order, queues } = demand;
    for profile in order.iter() {
        let size = planner.slices(model, profile);
        if size == 0 {
            continue;
        }
        while let Some(&pi) = queues.get(profile).and_then(|q| q.front()) {
            let n = pods[pi].count.max(1);
            if used + size * n > total
                || pods[pi].cpu_milli > budget.0
                || pods[pi].memory_mib > budget.1
            {
                break;
            }
            let mut w = wanted.clone();
            *w.entry(profile.clone()).or_insert(0) += n;
            let Some(p) = planner.plan(model, busy, &w) else {
                break;
            };
            wanted = w;
            used += size * n;
            last = Some(p);
            placed.push(pi);
            budget.0 -= pods[pi].cpu_milli;
            budget.1 -= pods[pi].memory_mib;
            if let Some(q) = queues.get_mut(profile) {
                q.pop_front();
            }
        }
    }
    let mut plan = last?;
    // Give back what the GPU offered free before, where it still fits, so a change only takes
    // the room the demand needs.
    let mut back: Vec<(u32, &String)> = free_before
        .iter()
        .map(|p| (planner.slices(model, p), p))
        .collect();
    back.sort_by_key(|(size, _)| std::cmp::Reverse(*size));
    for (size, profile) in back {
        if size == 0 || used + size > total {
            continue;
        }
        let mut w = wanted.clone();
        *w.entry(profile.clone()).or_insert(0) += 1;
        if let Some(p) = planner.plan(model, busy, &w) {
            wanted = w;
            used += size;
            plan = p;
        }
    }
    Some((placed, wanted, plan))
}

/// A deterministic short name for a layout: `gpuops-<hash>` (FNV-1a of the canonical text).
fn config_name(prefix: &str, per_gpu: &[(bool, BTreeMap<String, u32>)]) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for (i, (on, d)) in per_gpu.iter().enumerate() {
        let text = format!(
            "{i}:{on}:{}",
            d.iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(",")
        );
        for b in text.bytes().chain([b';']) {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    format!("{prefix}-{:08x}", h >> 32)
}

/// The named config for per-GPU states; GPUs with the same state share one entry.
fn named_config(name: &str, per_gpu: &[(bool, BTreeMap<String, u32>)]) -> NamedConfigYaml {
    let mut entries: Vec<DeviceSpec> = Vec::new();
    for (i, (on, devices)) in per_gpu.iter().enumerate() {
        let idx = u32::try_from(i).unwrap_or(u32::MAX);
        let devices: BTreeMap<String, u32> = devices
            .iter()
            .filter(|(_, v)| **v > 0)
            .map(|(k, v)| (k.clone(), *v))
            .collect();
        match entries
            .iter_mut()
            .find(|e| e.mig_enabled == *on && e.mig_devices == devices)
        {
            Some(DeviceSpec {
                devices: Devices::List(l),
                ..
            }) => l.push(idx),
            _ => entries.push(DeviceSpec {
                devices: Devices::List(vec![idx]),
                filters: Vec::new(),
                mig_enabled: *on,
                mig_devices: if *on { devices } else { BTreeMap::new() },
                line: 0,
            }),
        }
    }
    if entries.len() == 1 {
        entries[0].devices = Devices::All;
    }
    let cfg = MigPartedConfig {
        configs: vec![NamedConfig {
            name: name.to_string(),
            entries,
        }],
    };
    NamedConfigYaml {
        name: name.to_string(),
        yaml: cfg.to_yaml(),
    }
}

fn describe(per_gpu: &[(bool, BTreeMap<String, u32>)]) -> String {
    per_gpu
        .iter()
        .enumerate()
        .map(|(i, (on, d))| {
            if *on {
                format!("GPU {i}: {}", gpuops_mig::layout::describe_counts(d))
            } else {
                format!("GPU {i}: MIG off")
            }
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// Why a node is not re-partitioned now, if it is not.
fn node_blocked(n: &MigNode, mem: &MigMemory, now: Millis, cfg: &MigConfig) -> Option<String> {
    if n.unschedulable {
        return Some("cordoned".into());
    }
    match n.state {
        MigNodeState::Pending => return Some("a change is under way".into()),
        MigNodeState::Failed => return Some("its last MIG change failed".into()),
        MigNodeState::Success => {}
    }
    if let Some(at) = mem.failed_at.get(&n.name)
        && now.saturating_sub(*at) < ms(cfg.failed_backoff)
    {
        return Some("backed off after a failed MIG change".into());
    }
    let last = mem
        .last_change
        .get(&n.name)
        .copied()
        .into_iter()
        .chain(n.changed_at)
        .max();
    if let Some(at) = last
        && now.saturating_sub(at) < ms(cfg.min_interval)
    {
        return Some("changed less than the minimum interval ago".into());
    }
    None
}

/// One MIG demand decision. `pods` are the pending pods asking for MIG devices; `pools` the
/// pools new MIG nodes can come from (empty: re-partitioning only).
///
/// Gather (failures and changes remembered, free instances, the batch), choose (re-partition
/// free capacity, then buy new nodes), and build the outcome (changes, scale-ups, pods left).
pub fn decide_mig(
    nodes: &[MigNode],
    pods: &[MigPod],
    pools: &[MigPool],
    mem: &mut MigMemory,
    now: Millis,
    cfg: &MigConfig,
) -> MigDecision {
    let mut out = MigDecision::default();
    remember(nodes, mem, now, cfg);
    let demand_pods = serve_from_free(nodes, pods, &mut out);
    let acted = close_batch(pods, &demand_pods, now, cfg, &mut out);
    if acted.is_empty() {
        return out;
    }
    let mut demand = Demand::of(pods, &acted);
    let mut planner = Planner::default();
    repartition(
        nodes,
        pods,
        &mut demand,
        &mut planner,
        mem,
        now,
        cfg,
        &mut out,
    );
    buy_nodes(pools, pods, &mut demand, &mut planner, &mut out);
    for q in demand.queues.values() {
        for &pi in q {
            out.unserved.push((
                pods[pi].key.clone(),
                format!(
                    "no MIG node can be re-partitioned for {}x {} and no pool can add one",
                    pods[pi].count.max(1),
                    pods[pi].profile
                ),
            ));
        }
    }
    out
}

/// Failures: remembered while failed and through the back-off after recovery; changes through
/// the minimum interval, while their node exists.
fn remember(nodes: &[MigNode], mem: &mut MigMemory, now: Millis, cfg: &MigConfig) {
    for n in nodes {
        if n.state == MigNodeState::Failed {
            mem.failed_at.entry(n.name.clone()).or_insert(now);
        }
    }
    mem.failed_at.retain(|name, at| {
        nodes
            .iter()
            .any(|n| &n.name == name && n.state == MigNodeState::Failed)
            || (now.saturating_sub(*at) < ms(cfg.failed_backoff)
                && nodes.iter().any(|n| &n.name == name))
    });
    mem.last_change.retain(|name, at| {
        now.saturating_sub(*at) < ms(cfg.min_interval) && nodes.iter().any(|n| &n.name == name)
    });
}

/// Step 1: free instances the scheduler can bind now or once a launched node or a change under
/// way is done, on nodes with room for the pod. Fills `out.served_by_free`; returns the pods
/// (by index, oldest first) that free instances do not serve.
fn serve_from_free(nodes: &[MigNode], pods: &[MigPod], out: &mut MigDecision) -> Vec<usize> {
    struct Room {
        free: BTreeMap<String, u64>,
        cpu: u64,
        mem: u64,
    }
    let mut rooms: Vec<Room> = nodes
        .iter()
        .filter(|n| !n.unschedulable && n.state != MigNodeState::Failed)
        .map(|n| {
            let mut free = BTreeMap::new();
            for g in n.gpus.iter().filter(|g| g.mig_enabled) {
                for i in g.instances.iter().filter(|i| !i.busy) {
                    *free.entry(i.profile.clone()).or_insert(0) += 1;
                }
            }
            Room {
                free,
                cpu: n.cpu_free_milli,
                mem: n.memory_free_mib,
            }
        })
        .filter(|r| !r.free.is_empty())
        .collect();
    let mut order: Vec<usize> = (0..pods.len()).collect();
    order.sort_by(|&a, &b| {
        pods[a]
            .created
            .cmp(&pods[b].created)
            .then(pods[a].key.cmp(&pods[b].key))
    });
    // Per profile the rooms offering it, and the first one that may still have some: free
    // counts only fall, so the exhausted prefix is skipped for good.
    let mut by_profile: HashMap<String, (Vec<usize>, usize)> = HashMap::new();
    for (ri, r) in rooms.iter().enumerate() {
        for k in r.free.keys() {
            by_profile.entry(k.clone()).or_default().0.push(ri);
        }
    }
    let mut demand_pods = Vec::new();
    for &pi in &order {
        let p = &pods[pi];
        let want = u64::from(p.count.max(1));
        let mut room = None;
        if let Some((list, cursor)) = by_profile.get_mut(&p.profile) {
            while *cursor < list.len()
                && rooms[list[*cursor]]
                    .free
                    .get(&p.profile)
                    .copied()
                    .unwrap_or(0)
                    == 0
            {
                *cursor += 1;
            }
            room = list[*cursor..].iter().copied().find(|&ri| {
                let r = &rooms[ri];
                r.free.get(&p.profile).copied().unwrap_or(0) >= want
                    && r.cpu >= p.cpu_milli
                    && r.mem >= p.memory_mib
            });
        }
        match room.map(|ri| &mut rooms[ri]) {
            Some(r) => {
                if let Some(f) = r.free.get_mut(&p.profile) {
                    *f -= want;
                }
                r.cpu -= p.cpu_milli;
                r.mem -= p.memory_mib;
                out.served_by_free.push(p.key.clone());
            }
            None => demand_pods.push(pi),
        }
    }
    demand_pods
}

/// Step 2: the batch: demand counts once it persisted for the idle window; the batch closes when
/// nothing newer arrived for that long, or the oldest waited the maximum. Fills `out.waiting`;
/// returns the pods to act for.
fn close_batch(
    pods: &[MigPod],
    demand_pods: &[usize],
    now: Millis,
    cfg: &MigConfig,
    out: &mut MigDecision,
) -> Vec<usize> {
    let idle = ms(cfg.batch_idle);
    let newest = demand_pods.iter().map(|&i| pods[i].created).max();
    let oldest = demand_pods.iter().map(|&i| pods[i].created).min();
    let closed = match (newest, oldest) {
        (Some(n), Some(o)) => {
            now.saturating_sub(n) >= idle || now.saturating_sub(o) >= ms(cfg.batch_max)
        }
        _ => false,
    };
    let mut acted = Vec::new();
    for &pi in demand_pods {
        if closed && now.saturating_sub(pods[pi].created) >= idle {
            acted.push(pi);
        } else {
            out.waiting.push(pods[pi].key.clone());
        }
    }
    acted
}

impl Demand {
    /// Step 3: demand by profile, largest first, in arrival order within a profile. The slice size
    /// comes from any model offering the profile (names carry the memory, so sizes agree).
    fn of(pods: &[MigPod], acted: &[usize]) -> Self {
        let size_of = |profile: &str| -> u32 {
            gpuops_catalog::models()
                .iter()
                .map(|m| slices(m, profile))
                .max()
                .unwrap_or(0)
        };
        let mut queues: BTreeMap<String, VecDeque<usize>> = BTreeMap::new();
        for &pi in acted {
            queues
                .entry(pods[pi].profile.clone())
                .or_default()
                .push_back(pi);
        }
        let mut profiles: Vec<String> = queues.keys().cloned().collect();
        profiles.sort_by(|a, b| size_of(b).cmp(&size_of(a)).then(a.cmp(b)));
        Demand {
            order: profiles,
            queues,
        }
    }
}

/// Step 4: re-partition free capacity, cheaper nodes first; one change per node that serves at
/// least one pending pod.
#[allow(clippy::too_many_arguments)] // the decision's inputs, passed through from decide_mig
fn repartition(
    nodes: &[MigNode],
    pods: &[MigPod],
    demand: &mut Demand,
    planner: &mut Planner,
    mem: &mut MigMemory,
    now: Millis,
    cfg: &MigConfig,
    out: &mut MigDecision,
) {
    let mut candidates: Vec<&MigNode> = nodes.iter().collect();
    candidates.sort_by(|a, b| {
        a.price_per_hour
            .total_cmp(&b.price_per_hour)
            .then(a.name.cmp(&b.name))
    });
    for n in candidates {
        if demand.is_empty() {
            break;
        }
        let Some(model) = model_of(&n.model).filter(|m| m.mig_capable()) else {
            continue;
        };
        // A node that offers none of the wanted profiles is not worth a look.
        if !demand
            .queues
            .iter()
            .any(|(p, q)| !q.is_empty() && slices(model, p) > 0)
        {
            continue;
        }
        if n.in_flight || node_blocked(n, mem, now, cfg).is_some() {
            continue;
        }
        let (per_gpu, plans, served) = repartition_node(n, model, pods, demand, planner);
        // A change must serve at least one pending pod.
        if served.is_empty() {
            continue;
        }
        let name = config_name("gpuops", &per_gpu);
        mem.last_change.insert(n.name.clone(), now);
        out.changes.push(MigChange {
            node: n.name.clone(),
            config_name: name.clone(),
            config: named_config(&name, &per_gpu),
            message: format!(
                "re-partitioning node {} ({} -> {name}: {}) for {} pending pod(s): {}",
                n.name,
                if n.config.is_empty() {
                    "no config"
                } else {
                    &n.config
                },
                describe(&per_gpu),
                served.len(),
                served.join(", ")
            ),
            plans,
            pods: served,
        });
    }
}

/// Per-GPU MIG mode and profile counts: the shape a node's config is written from.
type PerGpu = Vec<(bool, BTreeMap<String, u32>)>;

/// One node's GPUs filled from `demand` around their busy instances: the node's resulting
/// per-GPU counts, the plan of each GPU changed, and the pods served.
fn repartition_node(
    n: &MigNode,
    model: &'static GpuModel,
    pods: &[MigPod],
    demand: &mut Demand,
    planner: &mut Planner,
) -> (PerGpu, Vec<(u32, Plan)>, Vec<String>) {
    let mut per_gpu: PerGpu = n
        .gpus
        .iter()
        .map(|g| {
            let mut c = BTreeMap::new();
            for i in &g.instances {
                *c.entry(i.profile.clone()).or_insert(0) += 1;
            }
            (g.mig_enabled, c)
        })
        .collect();
    let mut plans = Vec::new();
    let mut served = Vec::new();
    let mut budget = (n.cpu_free_milli, n.memory_free_mib);
    for (gi, g) in n.gpus.iter().enumerate() {
        if demand.is_empty() {
            break;
        }
        if !g.mig_enabled {
            // Ampere needs a GPU reset to turn MIG on: only GPUs already in MIG mode are
            // re-partitioned there. A whole GPU with running work is never touched.
            if g.busy || model.family == Family::Ampere {
                continue;
            }
        }
        let busy = Layout::new(
            g.instances
                .iter()
                .filter(|i| i.busy)
                .map(|i| Instance::new(i.profile.clone(), i.start))
                .collect(),
        );
        let free_before: Vec<String> = g
            .instances
            .iter()
            .filter(|i| !i.busy)
            .map(|i| i.profile.clone())
            .collect();
        if let Some((placed, wanted, plan)) = fill_gpu(
            planner,
            model,
            &busy,
            &free_before,
            demand,
            pods,
            &mut budget,
        ) {
            per_gpu[gi] = (true, wanted);
            plans.push((u32::try_from(gi).unwrap_or(u32::MAX), plan));
            served.extend(placed.into_iter().map(|pi| pods[pi].key.clone()));
        }
    }
    (per_gpu, plans, served)
}

/// Step 5: what re-partitioning cannot serve: new nodes of the cheapest pool offering the
/// profile, bought with the layout the pods need.
fn buy_nodes(
    pools: &[MigPool],
    pods: &[MigPod],
    demand: &mut Demand,
    planner: &mut Planner,
    out: &mut MigDecision,
) {
    let mut pools_sorted: Vec<&MigPool> = pools.iter().collect();
    pools_sorted.sort_by(|a, b| {
        a.price_per_hour
            .total_cmp(&b.price_per_hour)
            .then(a.name.cmp(&b.name))
    });
    for pool in pools_sorted {
        if demand.is_empty() {
            break;
        }
        let Some(model) = model_of(&pool.model).filter(|m| m.mig_capable()) else {
            continue;
        };
        let new = fill_new_nodes(pool, model, pods, demand, planner);
        if new.bought == 0 {
            continue;
        }
        out.scale_ups.push(pool_scale_up(pool, new));
    }
}

/// New nodes of one pool, filled.
struct NewNodes {
    bought: u32,
    /// The pods they serve.
    served: Vec<String>,
    /// Per node, per GPU: profile counts.
    layouts: Vec<Vec<BTreeMap<String, u32>>>,
}

/// Empty nodes of `pool` filled from `demand` while the pool has room and each new node
/// serves a pod.
fn fill_new_nodes(
    pool: &MigPool,
    model: &'static GpuModel,
    pods: &[MigPod],
    demand: &mut Demand,
    planner: &mut Planner,
) -> NewNodes {
    let mut bought = 0u32;
    let mut served = Vec::new();
    let mut layouts: Vec<Vec<BTreeMap<String, u32>>> = Vec::new();
    while bought < pool.room && !demand.is_empty() {
        let mut node_layout = Vec::new();
        let mut node_served = Vec::new();
        let mut budget = (pool.cpu_milli, pool.memory_mib);
        for _ in 0..pool.gpus {
            match fill_gpu(
                planner,
                model,
                &Layout::default(),
                &[],
                demand,
                pods,
                &mut budget,
            ) {
                Some((placed, wanted, _)) => {
                    node_served.extend(placed.into_iter().map(|pi| pods[pi].key.clone()));
                    node_layout.push(wanted);
                }
                None => node_layout.push(BTreeMap::new()),
            }
        }
        if node_served.is_empty() {
            break;
        }
        bought += 1;
        served.extend(node_served);
        layouts.push(node_layout);
    }
    NewNodes {
        bought,
        served,
        layouts,
    }
}

/// The scale-up of `pool` by the new nodes, with the layouts they were filled with.
fn pool_scale_up(pool: &MigPool, new: NewNodes) -> MigScaleUp {
    let NewNodes {
        bought,
        served,
        layouts,
    } = new;
    // One config for all new nodes: the per-GPU maximum of each profile over them, which
    // serves every node's share (they are interchangeable to the scheduler).
    let gpus = pool.gpus as usize;
    let mut layout: Vec<BTreeMap<String, u32>> = vec![BTreeMap::new(); gpus];
    for l in &layouts {
        for (g, d) in l.iter().enumerate() {
            if d.values().sum::<u32>() > layout[g].values().sum::<u32>() {
                layout[g] = d.clone();
            }
        }
    }
    let needs: BTreeMap<String, u32> = layouts.iter().fold(BTreeMap::new(), |mut acc, l| {
        for d in l {
            for (k, v) in d {
                *acc.entry(k.clone()).or_insert(0) += v;
            }
        }
        acc
    });
    let default_serves = pool.default_config.as_ref().filter(|(_, d)| {
        needs.iter().all(|(k, v)| {
            let per_node: u32 = d.iter().map(|g| g.get(k).copied().unwrap_or(0)).sum();
            per_node * bought >= *v
        })
    });
    let (config_name_s, layout) = match default_serves {
        Some((name, d)) => (name.clone(), d.clone()),
        None => {
            let per_gpu: PerGpu = layout.iter().map(|d| (true, d.clone())).collect();
            (config_name("gpuops", &per_gpu), layout)
        }
    };
    let per_gpu: PerGpu = layout.iter().map(|d| (true, d.clone())).collect();
    MigScaleUp {
        pool: pool.name.clone(),
        nodes: bought,
        config: named_config(&config_name_s, &per_gpu),
        message: format!(
            "no free MIG capacity can be re-partitioned for {} pod(s): buying {bought} node(s) of pool {} with MIG config {config_name_s} ({})",
            served.len(),
            pool.name,
            describe(&per_gpu)
        ),
        config_name: config_name_s,
        layout,
        pods: served,
    }
}

#[cfg(test)]
#[path = "mig_demand_tests.rs"]
mod tests;
