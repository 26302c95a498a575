//! The scale-up half of the decision: pending pods onto free capacity, then onto nodes in
//! flight, then onto new nodes of the cheapest feasible pool, with the packing engine as the
//! one model of what fits on a node.

use crate::decision::{Decision, Event, InFlight, Plan, PodPlan, ScaleUp, Target, TimedOut};
use crate::model::{Config, Millis, Node, NodeTemplate, PODS, PendingPod, Pool, Snapshot, State};
use gpuops_kubemodel::fit::{self, Taint};
use gpuops_packing::policy::baselines::default_gpus;
use gpuops_packing::{Cluster, NodeSpec, PodReq};
use std::collections::{BTreeMap, HashMap};

/// One place a pod can go: a ready node, a node in flight, or a new node.
struct Bin<'a> {
    name: String,
    labels: &'a BTreeMap<String, String>,
    taints: &'a [Taint],
    gpu_resource: &'a str,
    gpu_replicas: u32,
    scalars: BTreeMap<String, u64>,
}

/// Bins with their packing state.
struct Group<'a> {
    cluster: Option<Cluster>,
    bins: Vec<Bin<'a>>,
}

impl<'a> Group<'a> {
    fn new(bins: Vec<Bin<'a>>, specs: &[NodeSpec]) -> Self {
        // Cluster::new refuses an empty node list; an empty group simply has nothing to offer.
        let cluster = if specs.is_empty() {
            None
        } else {
            Cluster::new(specs).ok()
        };
        Self { cluster, bins }
    }

    /// Whether the pod's resources fit bin `i` now.
    fn fits(&self, i: usize, pod: &PendingPod, req: &PodReq) -> bool {
        let Some(c) = &self.cluster else {
            return false;
        };
        let bin = &self.bins[i];
        c.fits(i, req)
            && pod
                .scalars
                .iter()
                .all(|(k, v)| bin.scalars.get(k).copied().unwrap_or(0) >= *v)
            && bin.scalars.get(PODS).is_none_or(|p| *p >= 1)
    }

    fn place(&mut self, i: usize, pod: &PendingPod, req: &PodReq) -> bool {
        let Some(c) = &mut self.cluster else {
            return false;
        };
        let Some(gpus) = default_gpus(c.gpus(i), req) else {
            return false;
        };
        if c.place(i, req, gpus).is_err() {
            return false;
        }
        let bin = &mut self.bins[i];
        for (k, v) in &pod.scalars {
            if let Some(free) = bin.scalars.get_mut(k) {
                *free = free.saturating_sub(*v);
            }
        }
        if let Some(p) = bin.scalars.get_mut(PODS) {
            *p = p.saturating_sub(1);
        }
        true
    }
}

fn spec_of(name: &str, cpu: u64, mem: u64, gpus: u32) -> NodeSpec {
    NodeSpec {
        name: name.to_string(),
        cpu_milli: cpu,
        memory_mib: mem,
        gpus,
        // GPU products are matched through labels (nodeSelector/affinity), not the engine's
        // model table, so every node shares one model.
        model: if gpus > 0 {
            "gpu".into()
        } else {
            String::new()
        },
    }
}

/// The part of a pod's fit that does not change as pods are placed: taints, labels, the GPU
/// resource name.
fn static_misfit(
    pod: &PendingPod,
    name: &str,
    labels: &BTreeMap<String, String>,
    taints: &[Taint],
    gpu_resource: &str,
) -> Option<String> {
    if let Some(t) = taints
        .iter()
        .find(|t| t.blocks() && !pod.tolerations.iter().any(|x| fit::tolerates(x, t)))
    {
        return Some(format!("taint {t} not tolerated"));
    }
    if let Some(why) = pod.constraints.mismatch(name, labels) {
        return Some(why);
    }
    if pod.gpu_count > 0 && pod.gpu_resource != gpu_resource {
        return Some(if gpu_resource.is_empty() {
            format!("offers no {}", pod.gpu_resource)
        } else {
            format!("offers {gpu_resource}, not {}", pod.gpu_resource)
        });
    }
    None
}

/// [`static_misfit`] without building the explanation (the hot path).
fn static_fits(
    pod: &PendingPod,
    name: &str,
    labels: &BTreeMap<String, String>,
    taints: &[Taint],
    gpu_resource: &str,
) -> bool {
    taints
        .iter()
        .all(|t| !t.blocks() || pod.tolerations.iter().any(|x| fit::tolerates(x, t)))
        && pod.constraints.admits(name, labels)
        && (pod.gpu_count == 0 || pod.gpu_resource == gpu_resource)
}

/// Why an empty node of the template cannot take the pod, if it cannot.
pub(crate) fn template_misfit(t: &NodeTemplate, pod: &PendingPod) -> Option<String> {
    if let Some(why) = static_misfit(pod, "", &t.labels, &t.taints, &t.gpu_resource) {
        return Some(why);
    }
    if pod.cpu_milli > t.cpu_milli {
        return Some(format!(
            "a node has {}m CPU, the pod asks {}m",
            t.cpu_milli, pod.cpu_milli
        ));
    }
    if pod.memory_mib > t.memory_mib {
        return Some(format!(
            "a node has {} MiB memory, the pod asks {} MiB",
            t.memory_mib, pod.memory_mib
        ));
    }
    for (k, v) in &pod.scalars {
        let have = t.scalars.get(k).copied().unwrap_or(0);
        if have < *v {
            return Some(if have == 0 {
                format!("offers no {k}")
            } else {
                format!("a node offers {have} {k}, the pod asks {v}")
            });
        }
    }
    if pod.gpu_count > 0 {
        let req = pod.ask().request(t.gpu_replicas);
        if u32::from(req.num_gpu) > t.gpus {
            return Some(format!(
                "a node has {} GPUs ({} x {}), the pod needs {}",
                t.gpus,
                u64::from(t.gpus) * u64::from(t.gpu_replicas.max(1)),
                t.gpu_resource,
                req.num_gpu
            ));
        }
    }
    None
}

fn template_bin<'a>(name: String, pool: &'a Pool) -> (Bin<'a>, NodeSpec) {
    let t = &pool.template;
    let spec = spec_of(&name, t.cpu_milli, t.memory_mib, t.gpus);
    (
        Bin {
            name,
            labels: &t.labels,
            taints: &t.taints,
            gpu_resource: &t.gpu_resource,
            gpu_replicas: t.gpu_replicas.max(1),
            scalars: t.scalars.clone(),
        },
        spec,
    )
}

fn existing_group(nodes: &[Node]) -> (Group<'_>, Vec<usize>) {
    let mut bins = Vec::new();
    let mut specs = Vec::new();
    let mut index = Vec::new();
    for (i, n) in nodes.iter().enumerate() {
        if n.unschedulable || n.removing {
            continue;
        }
        let name = format!("{i}:{}", n.name);
        specs.push(NodeSpec {
            name: name.clone(),
            // Free capacity is what the engine is given; usage is then zero except on GPUs.
            cpu_milli: n.cpu_free_milli,
            memory_mib: n.memory_free_mib,
            gpus: u32::try_from(n.gpu_free.len()).unwrap_or(0),
            model: if n.gpu_free.is_empty() {
                String::new()
            } else {
                "gpu".into()
            },
        });
        bins.push(Bin {
            name: n.name.clone(),
            labels: &n.labels,
            taints: &n.taints,
            gpu_resource: &n.gpu_resource,
            gpu_replicas: n.gpu_replicas.max(1),
            scalars: n.scalars_free.clone(),
        });
        index.push(i);
    }
    let mut g = Group::new(bins, &specs);
    if let Some(c) = &mut g.cluster {
        for (bi, &ni) in index.iter().enumerate() {
            let n = &nodes[ni];
            if n.gpu_free.iter().any(|f| *f < 1000) {
                let free: Vec<u16> = n.gpu_free.iter().map(|f| (*f).min(1000)).collect();
                // Cannot fail: the usage is zero and the length is the node's GPU count.
                let _ = c.set_usage(bi, 0, 0, &free, &[]);
            }
        }
    }
    (g, index)
}

/// Deterministic jitter in [0.8, 1.2): the decision must not read a clock or an RNG, and two
/// pools backed off together should not retry in lock-step.
fn jitter(pool: &str, failures: u32) -> f64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in pool.bytes().chain(failures.to_le_bytes()) {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    0.8 + 0.4 * ((h >> 11) as f64 / (1u64 << 53) as f64)
}

pub(crate) fn ms(d: std::time::Duration) -> Millis {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

pub(crate) fn human(d_ms: Millis) -> String {
    gpuops_duration::format(std::time::Duration::from_millis(d_ms))
}

/// Machines past their stage's limit, and the back-off they cause.
fn timeouts(
    snap: &Snapshot,
    pools: &HashMap<&str, &Pool>,
    state: &mut State,
    now: Millis,
    cfg: &Config,
    out: &mut Decision,
) -> Vec<bool> {
    let mut timed = vec![false; snap.machines.len()];
    for (i, m) in snap.machines.iter().enumerate() {
        let Some(pool) = pools.get(m.pool.as_str()) else {
            continue;
        };
        let limit = ms(m.stage.timeout(&pool.timeouts));
        let over = now.saturating_sub(m.stage_since) > limit;
        if !(over || m.failed) {
            continue;
        }
        timed[i] = true;
        let message = if m.failed {
            format!(
                "machine {} of pool {} failed in stage {}",
                m.name,
                m.pool,
                m.stage.as_str()
            )
        } else {
            format!(
                "machine {} of pool {} exceeded the {} limit of {} in stage {}",
                m.name,
                m.pool,
                m.stage.as_str(),
                human(limit),
                m.stage.as_str()
            )
        };
        // Back off once per machine: the same machine stays in the snapshot until deleted.
        if !state.timed_out.contains_key(&m.name) {
            state.timed_out.insert(m.name.clone(), now);
            let b = state
                .backoff
                .entry(m.pool.clone())
                .or_insert(crate::model::Backoff {
                    failures: 0,
                    until: 0,
                });
            b.failures += 1;
            let base = cfg.backoff_base.as_secs_f64()
                * 2f64.powi(i32::try_from(b.failures - 1).unwrap_or(30).min(30));
            let secs = base.min(cfg.backoff_max.as_secs_f64()) * jitter(&m.pool, b.failures);
            b.until = now.saturating_add((secs * 1000.0) as u64);
            out.events.push(Event {
                target: Target::Pool(m.pool.clone()),
                reason: "ScaleUpTimedOut".into(),
                message: format!(
                    "{message}; pool backed off for {}",
                    human((secs * 1000.0) as u64)
                ),
                warning: true,
            });
        }
        out.timed_out.push(TimedOut {
            pool: m.pool.clone(),
            machine: m.name.clone(),
            stage: m.stage,
            message,
        });
    }
    let names: std::collections::HashSet<&str> =
        snap.machines.iter().map(|m| m.name.as_str()).collect();
    state
        .timed_out
        .retain(|name, _| names.contains(name.as_str()));
    timed
}

/// Size of the pod for first-fit-decreasing: GPUs first, then slices, CPU, memory.
fn size_key(p: &PendingPod) -> (u64, u64, u64, u64) {
    let gpu = match p.gpu_milli {
        Some(m) => u64::from(m),
        None => p.gpu_count * 1000,
    };
    (gpu, p.scalars.values().sum(), p.cpu_milli, p.memory_mib)
}

/// Borrowed from the pod: interning 50,000 pods copied every key's tolerations and selectors.
type ClassKey<'p> = (
    &'p [gpuops_kubemodel::fit::Toleration],
    &'p gpuops_kubemodel::fit::NodeConstraints,
    &'p str,
);

/// Scale-up: fills `out.plans`, `out.scale_ups`, `out.in_flight`; returns the ready nodes (by
/// snapshot index) that pending pods were planned onto, which scale-down must keep.
///
/// Gather (timeouts, nodes in flight, the batching window, the pods in size order and their
/// shapes), choose (free capacity first, then nodes in flight and new nodes by packing), then
/// build the outcome (each pod's plan, the scale-ups, the events).
pub(crate) fn scale_up(
    snap: &Snapshot,
    state: &mut State,
    now: Millis,
    cfg: &Config,
    out: &mut Decision,
) -> Vec<bool> {
    let pools: HashMap<&str, &Pool> = snap.pools.iter().map(|p| (p.name.as_str(), p)).collect();
    let timed = timeouts(snap, &pools, state, now, cfg, out);
    // A pool that stayed clear of failures for a full maximum back-off starts over.
    state
        .backoff
        .retain(|_, b| now < b.until.saturating_add(ms(cfg.backoff_max)));
    let slots = in_flight(snap, &pools, &timed, out);
    let window = Window::of(snap, now, cfg);
    let order = size_order(snap);
    let shapes = Shapes::intern(snap);

    let ready = place_on_ready_nodes(snap, &order, &shapes);
    let mut plans = ready.plans;
    let units = Units::new(&snap.pools);
    let batch = Batch::new(snap, &ready.rest, &shapes.shape_of, shapes.n_shapes, &units);
    let backed_off: Vec<Option<&crate::model::Backoff>> = snap
        .pools
        .iter()
        .map(|p| state.backoff.get(&p.name).filter(|b| b.until > now))
        .collect();
    let mut purchase = buy(snap, &batch, &ready.rest, &slots, &backed_off);

    let mut for_pool = explain_rest(
        snap,
        &ExplainInputs {
            batch: &batch,
            shapes: &shapes,
            purchase: &purchase,
            backed_off: &backed_off,
            now,
            batch_open: window.open,
        },
        &ready.rest,
        &mut plans,
    );
    if !window.open {
        push_scale_ups(
            snap,
            &purchase.bought,
            &mut for_pool,
            &mut purchase.openers,
            out,
        );
    }
    for su in &out.scale_ups {
        out.events.push(Event {
            target: Target::Pool(su.pool.clone()),
            reason: "TriggeredScaleUp".into(),
            message: su.message.clone(),
            warning: false,
        });
    }
    out.plans = plans.into_iter().flatten().collect();
    // Pods waiting for the window: it closes with no change in the cluster to wake the caller.
    if out
        .plans
        .iter()
        .any(|p| matches!(p.plan, Plan::Waiting { .. }))
    {
        let closes = window
            .newest
            .saturating_add(ms(cfg.batch_idle))
            .min(window.oldest.saturating_add(ms(cfg.batch_max)));
        out.batch_closes_in = Some(std::time::Duration::from_millis(closes.saturating_sub(now)));
    }
    explain_pods(snap, state, out);
    ready.used
}

/// In flight: machines not timed out, plus replicas no Machine stands for yet; fills
/// `out.in_flight` and returns one slot (pool, name) per node in flight.
///
/// Within a pool these are identical empty template nodes, so only the pool order matters;
/// sorting by pool keeps the placement the same whether a node is a raised replica, a
/// provisioning Machine or a node waiting for its devices, which is what keeps the next decision
/// from buying again.
fn in_flight<'s>(
    snap: &'s Snapshot,
    pools: &HashMap<&str, &'s Pool>,
    timed: &[bool],
    out: &mut Decision,
) -> Vec<(&'s Pool, String)> {
    let mut slots: Vec<(&Pool, String)> = Vec::new();
    let mut per_stage: BTreeMap<(String, Option<crate::model::Stage>), u32> = BTreeMap::new();
    for (m, _) in snap.machines.iter().zip(timed).filter(|(_, t)| !**t) {
        let Some(pool) = pools.get(m.pool.as_str()) else {
            continue;
        };
        slots.push((pool, m.name.clone()));
        *per_stage
            .entry((m.pool.clone(), Some(m.stage)))
            .or_default() += 1;
    }
    for pool in &snap.pools {
        let ready = snap
            .nodes
            .iter()
            .filter(|n| n.pool.as_deref() == Some(&pool.name))
            .count();
        let machines = snap.machines.iter().filter(|m| m.pool == pool.name).count();
        let have = u32::try_from(ready + machines).unwrap_or(u32::MAX);
        for k in 0..pool.replicas.saturating_sub(have) {
            slots.push((pool, format!("{}#{}", pool.name, k + 1)));
            *per_stage.entry((pool.name.clone(), None)).or_default() += 1;
        }
    }
    out.in_flight = per_stage
        .into_iter()
        .map(|((pool, stage), count)| InFlight { pool, stage, count })
        .collect();
    slots
}

/// The batching window: the newest and oldest pending pod, and whether pods still wait for
/// more to join them before anything is bought.
struct Window {
    newest: Millis,
    oldest: Millis,
    open: bool,
}

impl Window {
    fn of(snap: &Snapshot, now: Millis, cfg: &Config) -> Self {
        let newest = snap.pending.iter().map(|p| p.created).max().unwrap_or(0);
        let oldest = snap.pending.iter().map(|p| p.created).min().unwrap_or(0);
        let open = now.saturating_sub(newest) < ms(cfg.batch_idle)
            && now.saturating_sub(oldest) < ms(cfg.batch_max);
        Self {
            newest,
            oldest,
            open,
        }
    }
}

/// Pending pods (by index) in first-fit-decreasing order, ties by age then key.
fn size_order(snap: &Snapshot) -> Vec<usize> {
    // Each pod's key computed once and sorted in place, not looked up through the pods twice
    // per comparison. The index comes last, so the unstable sort orders exactly as a stable
    // one would.
    let mut keyed: Vec<_> = snap
        .pending
        .iter()
        .enumerate()
        .map(|(i, p)| (std::cmp::Reverse(size_key(p)), p.created, p.key.as_str(), i))
        .collect();
    keyed.sort_unstable();
    keyed.into_iter().map(|(.., i)| i).collect()
}

/// Pods with the same class (tolerations, constraints, GPU resource) pass the same static
/// filters; pods with the same shape (class and resources) fit the same bins. Interned once
/// so the loops index vectors instead of hashing keys.
struct Shapes {
    shape_of: Vec<usize>,
    class_of: Vec<usize>,
    n_shapes: usize,
    n_classes: usize,
}

impl Shapes {
    fn intern(snap: &Snapshot) -> Self {
        let mut shape_ids: HashMap<ShapeKey, usize> = HashMap::new();
        let mut class_ids: HashMap<ClassKey, usize> = HashMap::new();
        let mut shape_of = vec![0usize; snap.pending.len()];
        let mut class_of = vec![0usize; snap.pending.len()];
        for (i, pod) in snap.pending.iter().enumerate() {
            let key = shape_key(pod);
            let next_class = class_ids.len();
            class_of[i] = *class_ids.entry(key.0).or_insert(next_class);
            let next = shape_ids.len();
            shape_of[i] = *shape_ids.entry(key).or_insert(next);
        }
        Self {
            shape_of,
            class_of,
            n_shapes: shape_ids.len(),
            n_classes: class_ids.len(),
        }
    }
}

/// What free capacity on ready nodes takes.
struct ReadyPlacement {
    /// Per snapshot node: whether a pending pod was planned onto it.
    used: Vec<bool>,
    /// Per pending pod: its plan, for those that fit free capacity.
    plans: Vec<Option<PodPlan>>,
    /// The pods (by index, in size order) that did not fit.
    rest: Vec<usize>,
}

/// Step 1: free capacity on ready nodes. Static feasibility is computed once per class of pods,
/// and per shape the first node worth trying is remembered: capacity only shrinks during a
/// decision, so a node that refused a shape refuses it again.
fn place_on_ready_nodes(snap: &Snapshot, order: &[usize], shapes: &Shapes) -> ReadyPlacement {
    let (mut existing, existing_index) = existing_group(&snap.nodes);
    let mut used = vec![false; snap.nodes.len()];
    let mut classes: Vec<Option<Vec<usize>>> = vec![None; shapes.n_classes];
    let mut cursor = vec![0usize; shapes.n_shapes];
    let mut plans: Vec<Option<PodPlan>> = vec![None; snap.pending.len()];
    let mut rest: Vec<usize> = Vec::new();
    for &pi in order {
        let pod = &snap.pending[pi];
        let candidates = classes[shapes.class_of[pi]].get_or_insert_with(|| {
            existing
                .bins
                .iter()
                .enumerate()
                .filter(|(_, b)| static_fits(pod, &b.name, b.labels, b.taints, b.gpu_resource))
                .map(|(i, _)| i)
                .collect()
        });
        // Per bin the demand of one ask is fixed (it depends on the bin's replicas) and bins
        // only fill up, so a bin that refused this exact ask refuses it for the rest of the
        // decision: the cursor is sound even across nodes with different replica counts.
        let start = cursor[shapes.shape_of[pi]];
        let mut placed = None;
        for (ci, &bi) in candidates.iter().enumerate().skip(start) {
            let req = pod.ask().request(existing.bins[bi].gpu_replicas);
            if existing.fits(bi, pod, &req) && existing.place(bi, pod, &req) {
                placed = Some((ci, bi));
                break;
            }
        }
        cursor[shapes.shape_of[pi]] = placed.map_or(candidates.len(), |(ci, _)| ci);
        match placed {
            Some((_, bi)) => {
                used[existing_index[bi]] = true;
                let node = existing.bins[bi].name.clone();
                plans[pi] = Some(PodPlan {
                    pod: pod.key.clone(),
                    message: format!("fits free capacity on node {node}"),
                    plan: Plan::Existing { node },
                });
            }
            None => rest.push(pi),
        }
    }
    ReadyPlacement { used, plans, rest }
}

/// What the packing over nodes in flight and new nodes chose.
struct Purchase {
    /// Per pool: new nodes bought.
    bought: Vec<u32>,
    /// Per pool: the pods that opened each bought node.
    openers: Vec<Vec<String>>,
    /// Per pending pod: pool index and slot index in that pool ([`Purchase::slot`]).
    place: Vec<Option<(usize, usize)>>,
    /// Per pool: the names of its nodes in flight, sorted; slots past them are bought.
    slot_names: Vec<Vec<String>>,
}

impl Purchase {
    /// The node in flight that slot `u` of pool `j` is, `None` for a node this decision buys.
    /// Named when a pod's plan is written, not in every round of [`buy`] for every pod.
    fn in_flight(&self, j: usize, u: usize) -> Option<&str> {
        self.slot_names[j].get(u).map(String::as_str)
    }
}

/// Step 2: nodes in flight, then new nodes. Both are chosen by the same packing of the whole
/// batch (`pack`, below): the in-flight nodes are a limited supply per pool, new
/// nodes a supply bounded by each pool's room. What is bought is then checked by placing
/// the batch again over the in-flight nodes plus what was bought, exactly as the next
/// decision will (it sees the bought nodes as in flight), and bought again for what would
/// not fit. From an empty start the check reproduces the purchase step for step (see
/// `pack`), so it passes at once; with older nodes in flight it may take another round.
fn buy(
    snap: &Snapshot,
    batch: &Batch<'_>,
    rest: &[usize],
    slots: &[(&Pool, String)],
    backed_off: &[Option<&crate::model::Backoff>],
) -> Purchase {
    let npools = snap.pools.len();
    let pool_index: HashMap<&str, usize> = snap
        .pools
        .iter()
        .enumerate()
        .map(|(j, p)| (p.name.as_str(), j))
        .collect();
    let mut slot_names: Vec<Vec<String>> = vec![Vec::new(); npools];
    for (p, n) in slots {
        if let Some(&j) = pool_index.get(p.name.as_str()) {
            slot_names[j].push(n.clone());
        }
    }
    for s in &mut slot_names {
        s.sort();
    }
    let mut bought = vec![0u32; npools];
    let mut openers: Vec<Vec<String>> = vec![Vec::new(); npools];
    let mut final_place: Vec<Option<(usize, usize)>> = vec![None; snap.pending.len()];
    const ROUNDS: usize = 6;
    for round in 0..ROUNDS {
        let mut left: Vec<usize> = batch.pods.iter().map(Vec::len).collect();
        let mut supply: Vec<u32> = (0..npools)
            .map(|j| {
                u32::try_from(slot_names[j].len()).map_or(u32::MAX, |n| n.saturating_add(bought[j]))
            })
            .collect();
        let placed = pack(&snap.pools, &mut supply, batch, &mut left);
        let mut cursor = vec![0usize; batch.pods.len()];
        let mut used = vec![0usize; npools];
        for &pi in rest {
            final_place[pi] = None;
        }
        for (j, took) in placed {
            let u = used[j];
            used[j] += 1;
            for (k, n) in took {
                for &pi in &batch.pods[k][cursor[k]..cursor[k] + n] {
                    final_place[pi] = Some((j, u));
                }
                cursor[k] += n;
            }
        }
        if left.iter().all(|&n| n == 0) || round + 1 == ROUNDS {
            break;
        }
        let mut room: Vec<u32> = snap
            .pools
            .iter()
            .enumerate()
            .map(|(j, p)| {
                if backed_off[j].is_some() {
                    0
                } else {
                    p.max.saturating_sub(p.replicas.saturating_add(bought[j]))
                }
            })
            .collect();
        let buys = pack(&snap.pools, &mut room, batch, &mut left);
        if buys.is_empty() {
            break;
        }
        for (j, took) in buys {
            bought[j] += 1;
            if let Some(&(k, _)) = took.first() {
                openers[j].push(snap.pending[batch.pods[k][cursor[k]]].key.clone());
            }
            for (k, n) in took {
                cursor[k] += n;
            }
        }
    }
    Purchase {
        bought,
        openers,
        place: final_place,
        slot_names,
    }
}

/// What [`explain_rest`] reads besides the snapshot.
struct ExplainInputs<'a, 'p> {
    batch: &'a Batch<'p>,
    shapes: &'a Shapes,
    purchase: &'a Purchase,
    backed_off: &'a [Option<&'a crate::model::Backoff>],
    now: Millis,
    batch_open: bool,
}

/// The plans of the pods free capacity did not take (`rest`), into `plans`; returns, per pool,
/// the pods that new nodes of the pool are bought for.
fn explain_rest(
    snap: &Snapshot,
    inp: &ExplainInputs<'_, '_>,
    rest: &[usize],
    plans: &mut [Option<PodPlan>],
) -> Vec<Vec<String>> {
    let npools = snap.pools.len();
    let (batch, bought, now) = (inp.batch, &inp.purchase.bought, inp.now);
    // Why a pool is not the one a pod of shape `k` goes to, if it cannot be.
    let why = |j: usize, k: usize| -> Option<String> {
        let pool = &snap.pools[j];
        if let Some(w) = &batch.misfit[j][k] {
            Some(w.clone())
        } else if pool.replicas.saturating_add(bought[j]) >= pool.max {
            Some(format!("at its maximum size {}", pool.max))
        } else {
            inp.backed_off[j].map(|b| {
                format!(
                    "backed off for {} more after {} timed-out node(s)",
                    human(b.until - now),
                    b.failures
                )
            })
        }
    };
    let mut shape_in_batch = vec![usize::MAX; inp.shapes.n_shapes];
    for (k, members) in batch.pods.iter().enumerate() {
        if let Some(&pi) = members.first() {
            shape_in_batch[inp.shapes.shape_of[pi]] = k;
        }
    }
    let mut other_pools: HashMap<(usize, usize), String> = HashMap::new();
    let mut for_pool: Vec<Vec<String>> = vec![Vec::new(); npools];
    for &pi in rest {
        let pod = &snap.pending[pi];
        let k = shape_in_batch[inp.shapes.shape_of[pi]];
        let place = inp.purchase.place[pi].map(|(j, u)| (j, inp.purchase.in_flight(j, u)));
        plans[pi] = Some(match place {
            Some((j, Some(slot))) => {
                let pool = &snap.pools[j].name;
                PodPlan {
                    pod: pod.key.clone(),
                    message: format!("waits for node {slot} of pool {pool} already in flight"),
                    plan: Plan::InFlight {
                        pool: pool.clone(),
                        slot: slot.to_string(),
                    },
                }
            }
            Some((j, None)) => {
                for_pool[j].push(pod.key.clone());
                let mut plan = new_plan(pod, &snap.pools[j].name, inp.batch_open);
                let others = other_pools.entry((j, k)).or_insert_with(|| {
                    (0..npools)
                        .filter(|&o| o != j)
                        .filter_map(|o| {
                            why(o, k).map(|w| format!("pool {}: {w}", snap.pools[o].name))
                        })
                        .collect::<Vec<_>>()
                        .join("; ")
                });
                if !others.is_empty() {
                    plan.message = format!("{} (other pools: {others})", plan.message);
                }
                plan
            }
            None => {
                let reasons = (0..npools)
                    .map(|j| {
                        let w = why(j, k).unwrap_or_else(|| {
                            // The template check said it fits; the engine's own limits disagree.
                            "the packing engine cannot model its nodes".to_string()
                        });
                        format!("pool {}: {w}", snap.pools[j].name)
                    })
                    .collect();
                unschedulable(pod, reasons, &snap.skipped_pools)
            }
        });
    }
    for_pool
}

/// Scale-ups: one per pool, by the number of new nodes bought for it.
fn push_scale_ups(
    snap: &Snapshot,
    bought: &[u32],
    for_pool: &mut [Vec<String>],
    openers: &mut [Vec<String>],
    out: &mut Decision,
) {
    for (j, pool) in snap.pools.iter().enumerate() {
        let n = bought[j];
        if n == 0 {
            continue;
        }
        let pods = std::mem::take(&mut for_pool[j]);
        let to = pool.replicas + n;
        out.scale_ups.push(ScaleUp {
            pool: pool.name.clone(),
            from: pool.replicas,
            to,
            message: format!(
                "triggered scale-up of pool {} by {n} node{} ({} -> {to}) for {} pending pod{}: {}",
                pool.name,
                if n == 1 { "" } else { "s" },
                pool.replicas,
                pods.len(),
                if pods.len() == 1 { "" } else { "s" },
                abbreviate(&pods)
            ),
            pods,
            triggered_by: std::mem::take(&mut openers[j]),
        });
    }
}

/// Pod events, only when the explanation changed.
fn explain_pods(snap: &Snapshot, state: &mut State, out: &mut Decision) {
    let pending: std::collections::HashSet<&str> =
        snap.pending.iter().map(|p| p.key.as_str()).collect();
    state.explained.retain(|k, _| pending.contains(k.as_str()));
    for plan in &out.plans {
        let (reason, warning) = match &plan.plan {
            Plan::NewNode { .. } => ("TriggeredScaleUp", false),
            Plan::InFlight { .. } => ("WaitingForNode", false),
            Plan::Unschedulable { .. } => ("NotTriggerScaleUp", true),
            Plan::Existing { .. } | Plan::Waiting { .. } => continue,
        };
        if state.explained.get(&plan.pod) == Some(&plan.message) {
            continue;
        }
        state
            .explained
            .insert(plan.pod.clone(), plan.message.clone());
        out.events.push(Event {
            target: Target::Pod(plan.pod.clone()),
            reason: reason.into(),
            message: plan.message.clone(),
            warning,
        });
    }
}

/// The resources of a pod: with its class, everything that decides whether it fits a bin.
/// (The ask itself, not its request on one replica: a `gpuops.io/gpu-milli` pod and a plain
/// one can ask the same of a 1-replica GPU and differ on a shared one.)
type ShapeKey<'p> = (
    ClassKey<'p>,
    (u64, u64, u64, Option<u32>),
    &'p BTreeMap<String, u64>,
);

/// Everything that decides whether a pod fits a bin: its class and its resources.
fn shape_key(pod: &PendingPod) -> ShapeKey<'_> {
    (
        (&pod.tolerations, &pod.constraints, &pod.gpu_resource),
        (pod.cpu_milli, pod.memory_mib, pod.gpu_count, pod.gpu_milli),
        &pod.scalars,
    )
}

/// Prefix of the countable MIG resources.
const MIG_PREFIX: &str = "nvidia.com/mig-";

/// The share of a GPU one device of a MIG resource is: its compute slices over the 7 of an
/// A100/H100 (`1g.10gb` = 1/7, `3g.40gb` = 3/7, `7g.80gb` = 1). A fixed share per profile
/// name, not per product, so it does not depend on which pool serves the pod.
fn mig_share(resource: &str) -> Option<f64> {
    let profile = resource.strip_prefix(MIG_PREFIX)?;
    let digits = profile.split('g').next()?;
    let slices: f64 = digits.parse().ok()?;
    Some((slices / 7.0).min(1.0))
}

/// What pods are measured in when pools are compared: GPU-equivalents, the same whichever
/// pool serves the pod, so that the scores of two pools serving the same pods compare their
/// prices and nothing else.
struct Units {
    /// Shared resources (`nvidia.com/gpu.shared`): a replica is 1 / the most replicas any pool
    /// splits a GPU into for that name.
    replicas: HashMap<String, u32>,
    /// CPU (milli) and memory (MiB) per GPU-equivalent of the pool that gives the most: a pod
    /// weighs more than its GPUs only when it asks more CPU or memory per GPU than any pool
    /// has, i.e. when CPU or memory is what fills its node.
    cpu_per_gpu: f64,
    memory_per_gpu: f64,
}

impl Units {
    fn new(pools: &[Pool]) -> Self {
        let mut replicas: HashMap<String, u32> = HashMap::new();
        let (mut cpu_per_gpu, mut memory_per_gpu) = (0f64, 0f64);
        for p in pools {
            let t = &p.template;
            if t.gpus > 0 {
                let r = replicas.entry(t.gpu_resource.clone()).or_insert(1);
                *r = (*r).max(t.gpu_replicas.max(1));
            }
            let gpus = f64::from(t.gpus)
                + t.scalars
                    .iter()
                    .filter_map(|(k, v)| mig_share(k).map(|s| s * *v as f64))
                    .sum::<f64>();
            if gpus > 0.0 {
                cpu_per_gpu = cpu_per_gpu.max(t.cpu_milli as f64 / gpus);
                memory_per_gpu = memory_per_gpu.max(t.memory_mib as f64 / gpus);
            }
        }
        Self {
            replicas,
            cpu_per_gpu,
            memory_per_gpu,
        }
    }

    /// One pod's demand, never zero (a pod served must count for something).
    fn of(&self, pod: &PendingPod) -> f64 {
        let gpu = match pod.gpu_milli {
            // As the engine reads `gpuops.io/gpu-milli`: a share of one GPU, or whole GPUs.
            Some(m) if m < 1000 => f64::from(m) / 1000.0,
            Some(m) => f64::from(m.div_ceil(1000)),
            None if pod.gpu_count > 0 => {
                let r = self.replicas.get(&pod.gpu_resource).copied().unwrap_or(1);
                pod.gpu_count as f64 / f64::from(r.max(1))
            }
            None => 0.0,
        };
        let mig: f64 = pod
            .scalars
            .iter()
            .filter_map(|(k, v)| mig_share(k).map(|s| s * *v as f64))
            .sum();
        let share = |asked: u64, per_gpu: f64| {
            if per_gpu > 0.0 {
                asked as f64 / per_gpu
            } else {
                0.0
            }
        };
        (gpu + mig)
            .max(share(pod.cpu_milli, self.cpu_per_gpu))
            .max(share(pod.memory_mib, self.memory_per_gpu))
            .max(1e-6)
    }
}

/// The pods still to place, by shape: pods of one shape fit exactly the same bins, so the
/// packing moves counts, not pods.
struct Batch<'p> {
    /// Per shape, its pods in the decision's size order; shapes in the order of their first pod.
    pods: Vec<Vec<usize>>,
    /// One pod standing for each shape.
    rep: Vec<&'p PendingPod>,
    /// GPU-equivalents of one pod of each shape ([`Units`]).
    weight: Vec<f64>,
    /// `[pool][shape]`: why an empty node of the pool cannot take a pod of the shape, if it
    /// cannot ([`template_misfit`]).
    misfit: Vec<Vec<Option<String>>>,
}

impl<'p> Batch<'p> {
    fn new(
        snap: &'p Snapshot,
        rest: &[usize],
        shape_of: &[usize],
        n_shapes: usize,
        units: &Units,
    ) -> Self {
        let mut local = vec![usize::MAX; n_shapes];
        let mut pods: Vec<Vec<usize>> = Vec::new();
        for &pi in rest {
            let s = shape_of[pi];
            if local[s] == usize::MAX {
                local[s] = pods.len();
                pods.push(Vec::new());
            }
            pods[local[s]].push(pi);
        }
        let rep: Vec<&PendingPod> = pods.iter().map(|m| &snap.pending[m[0]]).collect();
        let weight = rep.iter().map(|p| units.of(p)).collect();
        let misfit = snap
            .pools
            .iter()
            .map(|pool| {
                rep.iter()
                    .map(|p| template_misfit(&pool.template, p))
                    .collect()
            })
            .collect();
        Self {
            pods,
            rep,
            weight,
            misfit,
        }
    }
}

/// One node of a pool filled from the batch: how many pods of each shape it takes, and the
/// GPU-equivalents they add up to.
struct Fill {
    took: Vec<(usize, usize)>,
    served: f64,
}

/// An empty node of pool `j` filled first-fit with the pods left (`left[k]` of shape `k`), in
/// the batch's order; `None` when it takes none of them.
fn fill<'a>(
    pool: &'a Pool,
    j: usize,
    batch: &Batch<'_>,
    left: &[usize],
    node: &mut Option<Group<'a>>,
) -> Option<Fill> {
    let g = empty_node(pool, node);
    let replicas = g.bins[0].gpu_replicas;
    let mut took = Vec::new();
    let mut served = 0.0;
    for (k, &n_left) in left.iter().enumerate() {
        if n_left == 0 || batch.misfit[j][k].is_some() {
            continue;
        }
        let pod = batch.rep[k];
        let req = pod.ask().request(replicas);
        let mut n = 0;
        while n < n_left && g.fits(0, pod, &req) && g.place(0, pod, &req) {
            n += 1;
        }
        if n > 0 {
            took.push((k, n));
            served += n as f64 * batch.weight[k];
        }
    }
    (!took.is_empty()).then_some(Fill { took, served })
}

/// An empty node of `pool` in `node`: the one of the last fill emptied again, or a new one.
/// A greedy fills tens of thousands of nodes when it buys thousands; building each one anew
/// (its name, its engine cluster, its scalars) was most of that time.
fn empty_node<'a, 'g>(pool: &'a Pool, node: &'g mut Option<Group<'a>>) -> &'g mut Group<'a> {
    let t = &pool.template;
    let emptied = node.as_mut().is_some_and(|g| {
        let Some(c) = &mut g.cluster else {
            // The engine could not model the template: no pod fits, nothing to empty.
            return true;
        };
        const FREE: [u16; 64] = [1000; 64];
        let Some(free) = FREE.get(..c.gpus(0).len()) else {
            return false;
        };
        if c.set_usage(0, 0, 0, free, &[]).is_err() {
            return false;
        }
        for (v, t) in g.bins[0].scalars.values_mut().zip(t.scalars.values()) {
            *v = *t;
        }
        true
    });
    if !emptied {
        *node = None;
    }
    node.get_or_insert_with(|| {
        let (bin, spec) = template_bin(format!("{}+new", pool.name), pool);
        Group::new(vec![bin], &[spec])
    })
}

/// Nodes chosen for the pods left, each with what it takes (`(shape, count)` pairs).
type Picks = Vec<(usize, Vec<(usize, usize)>)>;

/// Which nodes, of which pools, hold the pods left: the cheaper of two greedy packings of
/// the whole batch, and a way to choose that the next decision repeats.
///
/// Both greedies repeat one step until no pool with `supply` can take a pod left: fill one
/// empty node of each such pool first-fit with the pods left (largest first, as `fill` does),
/// score it price / GPU-equivalents served ([`Units`]), and take the best-scoring node with its
/// pods. Ties go to the node serving more (fewer nodes), then the cheaper node, then
/// [`pool_order`]. They differ in which nodes compete:
/// - the set-cover greedy (`anchored: false`) lets every pool's node compete. This is greedy
///   weighted set cover: when GPUs are what fills nodes, some node of an optimal purchase for
///   the pods left costs at most OPT / (demand left) per unit, and the first-fit fill of an
///   empty node of its pool serves at least half of what that node holds (a fill at most half
///   full has taken every pod the pool can run), so each step pays at most
///   2·OPT / (demand left) per unit it serves and the total is at most 2·H(W)·OPT for W whole
///   GPUs requested;
/// - the anchored greedy (`anchored: true`) lets compete only the nodes that take the largest
///   pod left: first-fit decreasing with the node type chosen per node. It sees what the
///   set-cover greedy misses: a pod that needs a large node pays for the room beside it, so
///   small pods go there rather than on small nodes of their own (one 3-GPU and one 1-GPU pod:
///   one 8x node, not an 8x and a 1x).
///
/// Choosing per pod the cheapest node that fits it (the rule before) bought a 1x node for
/// every small pod while larger nodes at the same price per GPU would hold several; scoring
/// what a whole node serves is what packs the batch. With one pool both are first-fit
/// decreasing (filling node after node from the sorted pods is the same assignment), with
/// its 11/9 OPT + 6/9 bound. Against an exact optimum over small random batches the cheaper
/// of the two is optimal in most cases and about 1% above it in total
/// (`property_the_purchase_is_near_the_cheapest`).
///
/// Reproducible by the next decision, which sees the nodes bought here as in flight and runs
/// [`pack`] with `supply` = those nodes (plus what was in flight before). Each greedy picks at
/// every step the best of its candidates by an order that depends only on the pool and the
/// pods left; with supply limited to what it bought, the pools it may pick from are a subset
/// of the ones it had, including the one it picked, so it picks the same nodes with the same
/// pods, places everything, and nothing is bought twice, whichever greedy the next decision
/// then prefers.
///
/// A fill's result stays valid while, for every shape it took, at least as many pods of that
/// shape are left (capacity is filled in the same order up to the same point), so after a step
/// only the pools whose fill used the pods just taken are filled again (the pool just picked
/// too, once its pods run short: its next node fills the same way while they last); that
/// keeps a decision buying thousands of nodes within its time.
fn pack(pools: &[Pool], supply: &mut [u32], batch: &Batch<'_>, left: &mut [usize]) -> Picks {
    // A packing's picks, the pods and supply it leaves, and (demand unplaced, cost, nodes).
    type Packed = (Picks, Vec<usize>, Vec<u32>, (f64, f64, usize));
    let mut best: Option<Packed> = None;
    for anchored in [false, true] {
        let mut l = left.to_vec();
        let mut s = supply.to_vec();
        let picks = greedy(pools, &mut s, batch, &mut l, anchored);
        let unplaced: f64 = l
            .iter()
            .zip(&batch.weight)
            .map(|(n, w)| *n as f64 * w)
            .sum();
        let cost: f64 = picks.iter().map(|(j, _)| pools[*j].price_per_hour).sum();
        let key = (unplaced, cost, picks.len());
        let wins = best.as_ref().is_none_or(|(.., b)| {
            if !close(key.0, b.0) {
                key.0 < b.0
            } else if !close(key.1, b.1) {
                key.1 < b.1
            } else {
                key.2 < b.2
            }
        });
        if wins {
            best = Some((picks, l, s, key));
        }
    }
    match best {
        Some((picks, l, s, _)) => {
            left.copy_from_slice(&l);
            supply.copy_from_slice(&s);
            picks
        }
        None => Vec::new(),
    }
}

/// One greedy of [`pack`].
fn greedy(
    pools: &[Pool],
    supply: &mut [u32],
    batch: &Batch<'_>,
    left: &mut [usize],
    anchored: bool,
) -> Picks {
    let mut cache: Vec<Option<Option<Fill>>> = (0..pools.len()).map(|_| None).collect();
    let mut nodes: Vec<Option<Group<'_>>> = (0..pools.len()).map(|_| None).collect();
    let mut picks = Vec::new();
    // Anchored: shapes before `first` have no pod left or no node left to take one (supply
    // only shrinks, so they stay that way).
    let mut first = 0;
    loop {
        while first < left.len() && left[first] == 0 {
            first += 1;
        }
        if first == left.len() {
            break;
        }
        let mut best: Option<(usize, f64, f64)> = None;
        for (j, pool) in pools.iter().enumerate() {
            if supply[j] == 0 {
                continue;
            }
            let stale = match &cache[j] {
                None => true,
                Some(None) => false,
                Some(Some(f)) => f.took.iter().any(|&(k, n)| left[k] < n),
            };
            if stale {
                cache[j] = Some(fill(pool, j, batch, left, &mut nodes[j]));
            }
            let Some(Some(f)) = &cache[j] else {
                continue;
            };
            if anchored && f.took[0].0 != first {
                continue;
            }
            let score = pool.price_per_hour / f.served;
            if best.is_none_or(|(b, bs, bserved)| {
                better((score, f.served, pool), (bs, bserved, &pools[b]))
            }) {
                best = Some((j, score, f.served));
            }
        }
        let Some((j, ..)) = best else {
            if anchored {
                // No node left takes the largest pod: it stays unplaced; go on with the next.
                first += 1;
                continue;
            }
            break;
        };
        let Some(Some(f)) = &cache[j] else {
            break;
        };
        // The fill stays cached: while its pods are left, the next node of the pool fills
        // the same way (the rule above), and thousands of nodes are bought that way in a row.
        let took = f.took.clone();
        for &(k, n) in &took {
            left[k] -= n;
        }
        supply[j] -= 1;
        picks.push((j, took));
    }
    picks
}

/// Whether node `a` (score, GPU-equivalents served, pool) beats `b`. Scores within a relative
/// 1e-9 are equal: prices such as 98.32 and 4 x 24.58 per 8 GPUs must tie.
fn better(a: (f64, f64, &Pool), b: (f64, f64, &Pool)) -> bool {
    if !close(a.0, b.0) {
        return a.0 < b.0;
    }
    if !close(a.1, b.1) {
        return a.1 > b.1;
    }
    pool_order(a.2, b.2).is_lt()
}

/// Equal within a relative 1e-9: sums of prices and GPU fractions are not exact.
fn close(x: f64, y: f64) -> bool {
    (x - y).abs() <= 1e-9 * x.abs().max(y.abs())
}

/// Cheaper per node-hour first; ties go to fewer GPUs (less waste), then the name (determinism).
fn pool_order(a: &Pool, b: &Pool) -> std::cmp::Ordering {
    a.price_per_hour
        .total_cmp(&b.price_per_hour)
        .then(a.template.gpus.cmp(&b.template.gpus))
        .then(a.name.cmp(&b.name))
}

fn new_plan(pod: &PendingPod, pool: &str, batch_open: bool) -> PodPlan {
    if batch_open {
        PodPlan {
            pod: pod.key.clone(),
            message: format!("will trigger a scale-up of pool {pool} when the batch window closes"),
            plan: Plan::Waiting {
                pool: pool.to_string(),
            },
        }
    } else {
        PodPlan {
            pod: pod.key.clone(),
            message: format!(
                "triggered scale-up of pool {pool}: the pod fits a new node of it, in the cheapest packing found for the pending pods"
            ),
            plan: Plan::NewNode {
                pool: pool.to_string(),
            },
        }
    }
}

fn unschedulable(pod: &PendingPod, mut reasons: Vec<String>, skipped: &[String]) -> PodPlan {
    for s in skipped {
        reasons.push(format!("pool {s}: skipped (invalid configuration)"));
    }
    let message = if reasons.is_empty() {
        "no pool can run this pod: no node pools are configured".to_string()
    } else {
        format!("no pool can run this pod: {}", reasons.join("; "))
    };
    PodPlan {
        pod: pod.key.clone(),
        plan: Plan::Unschedulable { reasons },
        message,
    }
}

fn abbreviate(pods: &[String]) -> String {
    const SHOWN: usize = 5;
    if pods.len() <= SHOWN {
        pods.join(", ")
    } else {
        format!(
            "{} and {} more",
            pods[..SHOWN].join(", "),
            pods.len() - SHOWN
        )
    }
}
