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

type ClassKey = (
    Vec<gpuops_kubemodel::fit::Toleration>,
    gpuops_kubemodel::fit::NodeConstraints,
    String,
);

/// Scale-up: fills `out.plans`, `out.scale_ups`, `out.in_flight`; returns the ready nodes (by
/// snapshot index) that pending pods were planned onto, which scale-down must keep.
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

    // In flight: machines not timed out, plus replicas no Machine stands for yet. Within a pool
    // these are identical empty template nodes, so only the pool order matters; sorting by pool
    // keeps the placement the same whether a node is a raised replica, a provisioning Machine or
    // a node waiting for its devices, which is what keeps the next decision from buying again.
    let mut slots: Vec<(&Pool, String)> = Vec::new();
    let mut per_stage: BTreeMap<(String, Option<crate::model::Stage>), u32> = BTreeMap::new();
    for (m, _) in snap.machines.iter().zip(&timed).filter(|(_, t)| !**t) {
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

    let newest = snap.pending.iter().map(|p| p.created).max().unwrap_or(0);
    let oldest = snap.pending.iter().map(|p| p.created).min().unwrap_or(0);
    let batch_open = now.saturating_sub(newest) < ms(cfg.batch_idle)
        && now.saturating_sub(oldest) < ms(cfg.batch_max);

    let mut order: Vec<usize> = (0..snap.pending.len()).collect();
    order.sort_by(|&a, &b| {
        let (pa, pb) = (&snap.pending[a], &snap.pending[b]);
        size_key(pb)
            .cmp(&size_key(pa))
            .then(pa.created.cmp(&pb.created))
            .then(pa.key.cmp(&pb.key))
    });

    // Pods with the same class (tolerations, constraints, GPU resource) pass the same static
    // filters; pods with the same shape (class and resources) fit the same bins. Interned once
    // so the loops below index vectors instead of hashing keys.
    let mut shape_ids: HashMap<ShapeKey, usize> = HashMap::new();
    let mut class_ids: HashMap<ClassKey, usize> = HashMap::new();
    let mut shape_of = vec![0usize; snap.pending.len()];
    let mut class_of = vec![0usize; snap.pending.len()];
    for (i, pod) in snap.pending.iter().enumerate() {
        let key = shape_key(pod);
        let next_class = class_ids.len();
        class_of[i] = match class_ids.get(&key.0) {
            Some(c) => *c,
            None => {
                class_ids.insert(key.0.clone(), next_class);
                next_class
            }
        };
        let next = shape_ids.len();
        shape_of[i] = *shape_ids.entry(key).or_insert(next);
    }
    let n_shapes = shape_ids.len();
    drop(shape_ids);

    // 1. Free capacity on ready nodes. Static feasibility is computed once per class of pods,
    // and per shape the first node worth trying is remembered: capacity only shrinks during a
    // decision, so a node that refused a shape refuses it again.
    let (mut existing, existing_index) = existing_group(&snap.nodes);
    let mut used_existing = vec![false; snap.nodes.len()];
    let mut classes: Vec<Option<Vec<usize>>> = vec![None; class_ids.len()];
    let mut cursor = vec![0usize; n_shapes];
    let mut plans: Vec<Option<PodPlan>> = vec![None; snap.pending.len()];
    let mut rest: Vec<usize> = Vec::new();
    for &pi in &order {
        let pod = &snap.pending[pi];
        let candidates = classes[class_of[pi]].get_or_insert_with(|| {
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
        let start = cursor[shape_of[pi]];
        let mut placed = None;
        for (ci, &bi) in candidates.iter().enumerate().skip(start) {
            let req = pod.ask().request(existing.bins[bi].gpu_replicas);
            if existing.fits(bi, pod, &req) && existing.place(bi, pod, &req) {
                placed = Some((ci, bi));
                break;
            }
        }
        cursor[shape_of[pi]] = placed.map_or(candidates.len(), |(ci, _)| ci);
        match placed {
            Some((_, bi)) => {
                used_existing[existing_index[bi]] = true;
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

    // 2. Nodes in flight, then new nodes: buy for what does not fit, then check that the
    // in-flight nodes plus what was bought hold everything when placed as the next decision
    // will place them (all bins present from the start, in pool order); buy again for what
    // still does not fit. First-fit with bins appended converges in a few rounds.
    let mut bought: BTreeMap<&str, u32> = BTreeMap::new();
    let mut openers: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    let mut reasons_of: HashMap<usize, Vec<String>> = HashMap::new();
    let mut final_place: Vec<Option<(String, String, bool)>> = vec![None; snap.pending.len()];
    for _round in 0..6 {
        let mut all: Vec<(&Pool, String, bool)> =
            slots.iter().map(|(p, n)| (*p, n.clone(), false)).collect();
        for (pool, n) in &bought {
            if let Some(p) = pools.get(pool) {
                for k in 0..*n {
                    all.push((p, format!("{pool}+{}", k + 1), true));
                }
            }
        }
        all.sort_by(|a, b| pool_order(a.0, b.0).then(a.2.cmp(&b.2)).then(a.1.cmp(&b.1)));
        let mut bins = Vec::with_capacity(all.len());
        let mut specs = Vec::with_capacity(all.len());
        for (p, n, _) in &all {
            let (b, s) = template_bin(n.clone(), p);
            bins.push(b);
            specs.push(s);
        }
        let mut flight = Group::new(bins, &specs);
        let mut unplaced = Vec::new();
        let mut fcursor = vec![0usize; n_shapes];
        for &pi in &rest {
            let pod = &snap.pending[pi];
            match first_fit(&mut flight, pod, &mut fcursor[shape_of[pi]]) {
                Some(bi) => {
                    let (p, n, new) = &all[bi];
                    final_place[pi] = Some((p.name.clone(), n.clone(), *new));
                }
                None => {
                    final_place[pi] = None;
                    unplaced.push(pi);
                }
            }
        }
        if unplaced.is_empty() {
            break;
        }
        // Open new nodes for the unplaced pods: first-fit over the ones opened in this round,
        // else the cheapest feasible pool with room.
        let mut fresh: Vec<Group<'_>> = Vec::new();
        let mut opened_any = false;
        let mut ncursor = vec![0usize; n_shapes];
        for &pi in &unplaced {
            let pod = &snap.pending[pi];
            let start = ncursor[shape_of[pi]];
            let hit =
                (start..fresh.len()).find(|&gi| first_fit_from(&mut fresh[gi], pod, 0).is_some());
            ncursor[shape_of[pi]] = hit.unwrap_or(fresh.len());
            if hit.is_some() {
                continue;
            }
            let mut reasons = Vec::new();
            let mut best: Option<&Pool> = None;
            for pool in &snap.pools {
                let n_open = bought.get(pool.name.as_str()).copied().unwrap_or(0);
                let why = if let Some(why) = template_misfit(&pool.template, pod) {
                    Some(why)
                } else if pool.replicas.saturating_add(n_open) >= pool.max {
                    Some(format!("at its maximum size {}", pool.max))
                } else {
                    state
                        .backoff
                        .get(&pool.name)
                        .filter(|b| b.until > now)
                        .map(|b| {
                            format!(
                                "backed off for {} more after {} timed-out node(s)",
                                human(b.until - now),
                                b.failures
                            )
                        })
                };
                match why {
                    Some(w) => reasons.push(format!("pool {}: {w}", pool.name)),
                    None => {
                        if best.is_none_or(|b| cheaper(pool, b)) {
                            best = Some(pool);
                        }
                    }
                }
            }
            match best {
                Some(pool) => {
                    let (b, s) = template_bin(format!("{}+new", pool.name), pool);
                    let mut g = Group::new(vec![b], &[s]);
                    if first_fit_from(&mut g, pod, 0).is_some() {
                        fresh.push(g);
                        *bought.entry(pool.name.as_str()).or_default() += 1;
                        openers
                            .entry(pool.name.as_str())
                            .or_default()
                            .push(pod.key.clone());
                        opened_any = true;
                        reasons_of.insert(pi, reasons);
                    } else {
                        // The template check said it fits; the engine's own limits disagree.
                        reasons_of.insert(
                            pi,
                            vec![format!(
                                "pool {}: the packing engine cannot model its nodes",
                                pool.name
                            )],
                        );
                    }
                }
                None => {
                    reasons_of.insert(pi, reasons);
                }
            }
        }
        if !opened_any {
            break;
        }
    }

    let mut for_pool: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for &pi in &rest {
        let pod = &snap.pending[pi];
        plans[pi] = Some(match &final_place[pi] {
            Some((pool, slot, false)) => PodPlan {
                pod: pod.key.clone(),
                message: format!("waits for node {slot} of pool {pool} already in flight"),
                plan: Plan::InFlight {
                    pool: pool.clone(),
                    slot: slot.clone(),
                },
            },
            Some((pool, _, true)) => {
                for_pool
                    .entry(pool.clone())
                    .or_default()
                    .push(pod.key.clone());
                let mut plan = new_plan(pod, pool, batch_open);
                if let Some(r) = reasons_of.get(&pi).filter(|r| !r.is_empty()) {
                    plan.message = format!("{} (other pools: {})", plan.message, r.join("; "));
                }
                plan
            }
            None => unschedulable(
                pod,
                reasons_of.remove(&pi).unwrap_or_default(),
                &snap.skipped_pools,
            ),
        });
    }

    // Scale-ups: one per pool, by the number of new nodes bought for it.
    if !batch_open {
        for pool in &snap.pools {
            let n = bought.get(pool.name.as_str()).copied().unwrap_or(0);
            if n == 0 {
                continue;
            }
            let pods = for_pool.remove(&pool.name).unwrap_or_default();
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
                triggered_by: openers.remove(pool.name.as_str()).unwrap_or_default(),
            });
        }
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
    // Pod events only when the explanation changed.
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
    used_existing
}

type ShapeKey = (ClassKey, PodReq, Vec<(String, u64)>);

/// Everything that decides whether a pod fits a bin: its class and its resources.
fn shape_key(pod: &PendingPod) -> ShapeKey {
    (
        (
            pod.tolerations.clone(),
            pod.constraints.clone(),
            pod.gpu_resource.clone(),
        ),
        pod.ask().request(1),
        pod.scalars.iter().map(|(k, v)| (k.clone(), *v)).collect(),
    )
}

/// First bin of `g` that takes the pod, placing it there; `cursor` remembers per shape where
/// to start (bins before it refused the shape and still do).
fn first_fit(g: &mut Group<'_>, pod: &PendingPod, cursor: &mut usize) -> Option<usize> {
    let hit = first_fit_from(g, pod, *cursor);
    *cursor = hit.unwrap_or(g.bins.len());
    hit
}

fn first_fit_from(g: &mut Group<'_>, pod: &PendingPod, start: usize) -> Option<usize> {
    (start..g.bins.len()).find(|&i| {
        let b = &g.bins[i];
        static_fits(pod, &b.name, b.labels, b.taints, b.gpu_resource) && {
            let req = pod.ask().request(b.gpu_replicas);
            g.fits(i, pod, &req) && g.place(i, pod, &req)
        }
    })
}

/// Cheaper per node-hour first; ties go to fewer GPUs (less waste), then the name (determinism).
fn pool_order(a: &Pool, b: &Pool) -> std::cmp::Ordering {
    a.price_per_hour
        .total_cmp(&b.price_per_hour)
        .then(a.template.gpus.cmp(&b.template.gpus))
        .then(a.name.cmp(&b.name))
}

fn cheaper(a: &Pool, b: &Pool) -> bool {
    pool_order(a, b).is_lt()
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
                "triggered scale-up of pool {pool}: the pod fits a new node of the cheapest feasible pool"
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
