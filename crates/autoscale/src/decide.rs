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
    pool: Option<&'a str>,
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
    if let Some(t) = fit::untolerated(&pod.tolerations, taints).first() {
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
            pool: Some(&pool.name),
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
            pool: n.pool.as_deref(),
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
    state
        .timed_out
        .retain(|name, _| snap.machines.iter().any(|m| &m.name == name));
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

    // In flight: machines not timed out, plus replicas no Machine stands for yet.
    let mut flight_bins = Vec::new();
    let mut flight_specs = Vec::new();
    let mut per_stage: BTreeMap<(String, Option<crate::model::Stage>), u32> = BTreeMap::new();
    for (m, _) in snap.machines.iter().zip(&timed).filter(|(_, t)| !**t) {
        let Some(pool) = pools.get(m.pool.as_str()) else {
            continue;
        };
        let (b, s) = template_bin(m.name.clone(), pool);
        flight_bins.push(b);
        flight_specs.push(s);
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
            let (b, s) = template_bin(format!("{}#{}", pool.name, k + 1), pool);
            flight_bins.push(b);
            flight_specs.push(s);
            *per_stage.entry((pool.name.clone(), None)).or_default() += 1;
        }
    }
    out.in_flight = per_stage
        .into_iter()
        .map(|((pool, stage), count)| InFlight { pool, stage, count })
        .collect();

    let (mut existing, existing_index) = existing_group(&snap.nodes);
    let mut flight = Group::new(flight_bins, &flight_specs);
    let mut fresh: Vec<Group<'_>> = Vec::new();
    let mut opened: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    let mut used_existing = vec![false; snap.nodes.len()];

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

    // Static feasibility per class of pods, and per exact shape the first bin worth trying:
    // capacity only shrinks during a decision, so a bin that refused a shape refuses it again.
    let mut classes: HashMap<ClassKey, (Vec<usize>, bool)> = HashMap::new();
    let mut cursor: HashMap<(ClassKey, PodReq, Vec<(String, u64)>), usize> = HashMap::new();
    let mut plans: Vec<Option<PodPlan>> = vec![None; snap.pending.len()];

    for &pi in &order {
        let pod = &snap.pending[pi];
        let class: ClassKey = (
            pod.tolerations.clone(),
            pod.constraints.clone(),
            pod.gpu_resource.clone(),
        );
        let (candidates, replicas_differ) = classes.entry(class.clone()).or_insert_with(|| {
            let list: Vec<usize> = existing
                .bins
                .iter()
                .enumerate()
                .filter(|(_, b)| {
                    static_misfit(pod, &b.name, b.labels, b.taints, b.gpu_resource).is_none()
                })
                .map(|(i, _)| i)
                .collect();
            // With mixed replica counts one pod's demand differs per node, so the cursor is
            // only sound when every candidate shares the same count.
            let differ = list
                .windows(2)
                .any(|w| existing.bins[w[0]].gpu_replicas != existing.bins[w[1]].gpu_replicas);
            (list, differ)
        });
        let replicas_differ = *replicas_differ;
        // 1. Free capacity on ready nodes.
        let mut placed = None;
        {
            let shape_req = pod.ask().request(1);
            let scal: Vec<(String, u64)> =
                pod.scalars.iter().map(|(k, v)| (k.clone(), *v)).collect();
            let key = (class.clone(), shape_req, scal);
            let start = if replicas_differ {
                0
            } else {
                cursor.get(&key).copied().unwrap_or(0)
            };
            for (ci, &bi) in candidates.iter().enumerate().skip(start) {
                let req = pod.ask().request(existing.bins[bi].gpu_replicas);
                if existing.fits(bi, pod, &req) && existing.place(bi, pod, &req) {
                    placed = Some(bi);
                    if !replicas_differ {
                        cursor.insert(key.clone(), ci);
                    }
                    break;
                }
            }
            if placed.is_none() && !replicas_differ {
                cursor.insert(key, candidates.len());
            }
        }
        if let Some(bi) = placed {
            used_existing[existing_index[bi]] = true;
            let node = existing.bins[bi].name.clone();
            plans[pi] = Some(PodPlan {
                pod: pod.key.clone(),
                message: format!("fits free capacity on node {node}"),
                plan: Plan::Existing { node },
            });
            continue;
        }
        // 2. Nodes in flight.
        if let Some(bi) = first_fit(&mut flight, pod) {
            let b = &flight.bins[bi];
            let pool = b.pool.unwrap_or_default().to_string();
            plans[pi] = Some(PodPlan {
                pod: pod.key.clone(),
                message: format!("waits for node {} of pool {pool} already in flight", b.name),
                plan: Plan::InFlight {
                    pool,
                    slot: b.name.clone(),
                },
            });
            continue;
        }
        // 3. New nodes opened by this decision, then the cheapest feasible pool.
        if let Some((gi, bi)) = fresh
            .iter_mut()
            .enumerate()
            .find_map(|(gi, g)| first_fit(g, pod).map(|bi| (gi, bi)))
        {
            let pool = fresh[gi].bins[bi].pool.unwrap_or_default().to_string();
            plans[pi] = Some(new_plan(pod, &pool, batch_open, &opened));
            if let Some(list) = opened.get_mut(pool.as_str()) {
                list.push(pod.key.clone());
            }
            continue;
        }
        let mut reasons = Vec::new();
        let mut best: Option<&Pool> = None;
        for pool in &snap.pools {
            let n_open = fresh_count(&fresh, &pool.name);
            let why = if let Some(why) = template_misfit(&pool.template, pod) {
                Some(why)
            } else if pool.replicas.saturating_add(n_open) >= pool.max {
                Some(format!("at its maximum size {}", pool.max))
            } else if let Some(b) = state.backoff.get(&pool.name).filter(|b| b.until > now) {
                Some(format!(
                    "backed off for {} more after {} timed-out node(s)",
                    human(b.until - now),
                    b.failures
                ))
            } else {
                None
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
                let (b, s) = template_bin(
                    format!("{}+{}", pool.name, fresh_count(&fresh, &pool.name) + 1),
                    pool,
                );
                let mut g = Group::new(vec![b], &[s]);
                let req = pod.ask().request(g.bins[0].gpu_replicas);
                if g.fits(0, pod, &req) && g.place(0, pod, &req) {
                    fresh.push(g);
                    opened
                        .entry(pool.name.as_str())
                        .or_default()
                        .push(pod.key.clone());
                    let mut plan = new_plan(pod, &pool.name, batch_open, &opened);
                    if !reasons.is_empty() {
                        plan.message =
                            format!("{} (other pools: {})", plan.message, reasons.join("; "));
                    }
                    plans[pi] = Some(plan);
                } else {
                    // The template check said it fits; a disagreement means the engine's
                    // limits (e.g. more than 64 GPUs) refuse the template.
                    plans[pi] = Some(unschedulable(
                        pod,
                        vec![format!(
                            "pool {}: the packing engine cannot model its nodes",
                            pool.name
                        )],
                        &snap.skipped_pools,
                    ));
                }
            }
            None => plans[pi] = Some(unschedulable(pod, reasons, &snap.skipped_pools)),
        }
    }

    // Scale-ups: one per pool, by the number of new nodes opened for it.
    if !batch_open {
        for pool in &snap.pools {
            let n = fresh_count(&fresh, &pool.name);
            if n == 0 {
                continue;
            }
            let pods = opened.get(pool.name.as_str()).cloned().unwrap_or_default();
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

fn first_fit(g: &mut Group<'_>, pod: &PendingPod) -> Option<usize> {
    (0..g.bins.len()).find(|&i| {
        let b = &g.bins[i];
        static_misfit(pod, &b.name, b.labels, b.taints, b.gpu_resource).is_none() && {
            let req = pod.ask().request(b.gpu_replicas);
            g.fits(i, pod, &req) && g.place(i, pod, &req)
        }
    })
}

fn fresh_count(fresh: &[Group<'_>], pool: &str) -> u32 {
    u32::try_from(
        fresh
            .iter()
            .filter(|g| g.bins.first().and_then(|b| b.pool) == Some(pool))
            .count(),
    )
    .unwrap_or(u32::MAX)
}

/// Cheaper per node-hour; ties go to fewer GPUs (less waste), then the name (determinism).
fn cheaper(a: &Pool, b: &Pool) -> bool {
    a.price_per_hour
        .total_cmp(&b.price_per_hour)
        .then(a.template.gpus.cmp(&b.template.gpus))
        .then(a.name.cmp(&b.name))
        .is_lt()
}

fn new_plan(
    pod: &PendingPod,
    pool: &str,
    batch_open: bool,
    _opened: &BTreeMap<&str, Vec<String>>,
) -> PodPlan {
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
