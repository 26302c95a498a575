//! The replay engine: arrivals, departures, node lifecycles and policy decisions in simulated
//! time, event by event (no ticks), with a ledger of what was bought and what was asked.
//!
//! Pods run only once bound to a ready node (whole and shared GPUs through the packing
//! engine's best-fit, MIG slices first-fit on a free device); a pod departs its runtime after it
//! started (the trace's deletion time offset by the wait it suffered), and an evicted pod
//! continues with the runtime it had left once bound again.

use crate::pools::{Fractional, PoolsFile, ReplayPool};
use crate::trace::TimedPod;
use gpuops_autoscale::{
    Machine, Millis, Node, NodeTemplate, PODS, PendingPod, Pool, RunningPod, Snapshot, Stage,
    StageTimeouts,
};
use gpuops_catalog::GpuModel;
use gpuops_kubemodel::fit::{NodeConstraints, Requirement, Term};
use gpuops_packing::policy::TieBreak;
use gpuops_packing::{Cluster, NodeSpec, PodSpec, PolicyKind};
use serde::Serialize;
use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};
use std::time::Duration;

/// Milliseconds of simulated time.
pub type Ms = Millis;

const PRODUCT: &str = "nvidia.com/gpu.product";
const GPU: &str = "nvidia.com/gpu";
const HOUR: f64 = 3_600_000.0;

/// The policies a replay compares.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum PolicyName {
    /// gpuops: `gpuops_autoscale::decide` plus, with MIG on, `decide_mig`.
    Ours,
    /// Cluster Autoscaler's documented algorithm.
    CaLike,
    /// `gpuops_autoscale::decide` with every MIG pool kept at its configured layout.
    StaticMig,
}

impl PolicyName {
    pub const ALL: [PolicyName; 3] = [PolicyName::Ours, PolicyName::CaLike, PolicyName::StaticMig];

    pub fn name(self) -> &'static str {
        match self {
            PolicyName::Ours => "ours",
            PolicyName::CaLike => "ca-like",
            PolicyName::StaticMig => "static-mig",
        }
    }
}

/// What to run.
#[derive(Debug, Clone, PartialEq)]
pub struct ReplayOptions {
    /// MIG re-partitioning for `ours` (off: `ours` keeps MIG pools at their layout too).
    pub mig: bool,
    pub policies: Vec<PolicyName>,
}

impl Default for ReplayOptions {
    fn default() -> Self {
        Self {
            mig: true,
            policies: PolicyName::ALL.to_vec(),
        }
    }
}

/// Progress of one policy's run.
#[derive(Debug, Clone, Copy)]
pub struct Progress {
    pub policy: PolicyName,
    /// Simulated time reached and the trace's last departure (an estimate of the end).
    pub now: Ms,
    pub end: Ms,
    pub done: bool,
}

/// Bought and requested GPUs per simulated hour (means over the hour).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Series {
    pub bought: Vec<f64>,
    pub requested: Vec<f64>,
}

/// The figures of one policy.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RunResult {
    pub policy: PolicyName,
    pub gpu_hours_bought: f64,
    pub gpu_hours_requested: f64,
    /// Bought / requested (1.0 is the limit: every bought GPU-second asked for).
    pub ratio: f64,
    /// Sum of node-hours x price.
    pub cost: f64,
    pub pending_pod_hours: f64,
    pub wait_p50_s: f64,
    pub wait_p99_s: f64,
    pub wait_max_s: f64,
    /// Scale-up actions and the nodes they bought.
    pub scale_ups: u64,
    pub nodes_bought: u64,
    pub nodes_removed: u64,
    pub mig_changes: u64,
    /// Running pods evicted by a scale-down.
    pub evictions: u64,
    pub pods_run: u64,
    /// Pods no pool can run under this policy (left out of the waits).
    pub pods_unschedulable: u64,
    /// Pods still pending when the replay gave up (a week with nothing else happening).
    pub pods_stuck: u64,
    /// Simulated end (last node removed or the last event), hours.
    pub hours: f64,
    #[serde(skip)]
    pub series: Series,
}

/// A whole replay: one result per policy.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Replay {
    pub trace_pods: usize,
    /// GPU pods replayed.
    pub gpu_pods: usize,
    /// CPU-only pods (no GPU pool is for them) and pods without a positive lifetime.
    pub skipped_cpu_only: usize,
    pub skipped_no_lifetime: usize,
    pub mig: bool,
    pub runs: Vec<RunResult>,
}

/// What a pod asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Ask {
    Whole(u32),
    Shared(u32),
    Mig(String),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PSt {
    Future,
    Pending,
    Running,
    Done,
    Unschedulable,
}

#[derive(Debug, Clone)]
pub(crate) struct Pod {
    pub key: String,
    pub spec: PodSpec,
    pub cpu: u64,
    pub mem: u64,
    pub ask: Ask,
    /// GPUs requested (the trace's num_gpu x gpu_milli / 1000).
    pub req: f64,
    pub(crate) arrival: Ms,
    pub(crate) remaining: Ms,
    pub(crate) st: PSt,
    pub(crate) since: Ms,
    pub(crate) wait: Ms,
    pub(crate) started: Ms,
    pub(crate) node: usize,
    pub(crate) gpus: Vec<usize>,
    pub(crate) inst: (usize, usize),
    pub(crate) epoch: u32,
}

#[derive(Debug, Clone)]
pub(crate) struct Inst {
    pub profile: String,
    pub start: u32,
    pub pod: Option<usize>,
}

#[derive(Debug, Clone)]
pub(crate) struct SNode {
    pub name: String,
    pub pool: usize,
    pub(crate) created: Ms,
    pub(crate) registered: Ms,
    pub ready: Ms,
    pub removed: Option<Ms>,
    pub cpu_free: u64,
    pub mem_free: u64,
    /// Whole-GPU nodes: free milli per GPU.
    pub gpu_free: Vec<u16>,
    /// MIG nodes: per GPU, its devices.
    pub mig: Vec<Vec<Inst>>,
    pub(crate) config: String,
    pub(crate) reconfig_until: Ms,
    pub(crate) changed_at: Option<Ms>,
    pub pods: Vec<usize>,
    pub(crate) empty_wake: bool,
}

impl SNode {
    pub fn live(&self) -> bool {
        self.removed.is_none()
    }
    pub fn is_ready(&self, now: Ms) -> bool {
        self.live() && now >= self.ready
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Ev {
    Arrive(usize),
    Depart(usize, u32),
    Ready(usize),
    MigDone(usize),
    Wake,
}

/// A MIG config name and the devices per GPU it gives.
pub(crate) type NamedLayout = (String, Vec<BTreeMap<String, u32>>);

/// An action of a policy, applied by the engine.
#[derive(Debug, Clone)]
pub(crate) enum Action {
    /// Buy `n` nodes of a pool, optionally with a MIG layout other than the pool's.
    Buy {
        pool: usize,
        n: u32,
        layout: Option<NamedLayout>,
    },
    Remove(usize),
    /// Re-partition: per changed GPU, the target devices (profile, start).
    Repartition {
        node: usize,
        config: String,
        gpus: Vec<(usize, Vec<(String, u32)>)>,
    },
}

pub(crate) struct World<'a> {
    pub pools: &'a PoolsFile,
    pub pods: Vec<Pod>,
    pub nodes: Vec<SNode>,
    pub now: Ms,
    pub(crate) heap: BinaryHeap<Reverse<(Ms, u64, Ev)>>,
    pub(crate) seq: u64,
    pub pending: Vec<usize>,
    /// Pool -> MIG devices its nodes come up with (profile -> count per node).
    pub pool_mig_totals: Vec<BTreeMap<String, u32>>,
    pub(crate) node_seq: Vec<u32>,
    // Ledger.
    pub(crate) last: Ms,
    pub(crate) bought_now: f64,
    pub(crate) price_now: f64,
    pub(crate) requested_now: f64,
    pub(crate) bought_ms: f64,
    pub(crate) requested_ms: f64,
    pub(crate) cost: f64,
    pub(crate) series: Series,
    pub scale_ups: u64,
    pub nodes_bought: u64,
    pub nodes_removed: u64,
    pub mig_changes: u64,
    pub evictions: u64,
    pub(crate) capacity_changed: bool,
    pub(crate) last_activity: Ms,
    pub(crate) wakes: std::collections::BTreeSet<Ms>,
}

pub(crate) fn ms(d: Duration) -> Ms {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// The smallest profile among `offered` with at least `milli`/1000 of the GPU's compute slices.
fn mig_profile(model: &GpuModel, offered: &[String], milli: u32) -> Option<String> {
    let total = model.mig.as_ref().map_or(7, |m| m.compute_slices);
    offered
        .iter()
        .filter_map(|p| {
            let gi = gpuops_mig::layout::gi_profile_of(model, p)?;
            (u64::from(gi.compute_slices) * 1000 >= u64::from(milli) * u64::from(total))
                .then_some((gi.compute_slices, gi.memory_slices, p.clone()))
        })
        .min()
        .map(|(_, _, p)| p)
}

/// Per-profile MIG devices of a layout.
fn totals(per_gpu: &[BTreeMap<String, u32>]) -> BTreeMap<String, u32> {
    let mut t = BTreeMap::new();
    for g in per_gpu {
        for (k, v) in g {
            *t.entry(k.clone()).or_insert(0) += v;
        }
    }
    t
}

impl<'a> World<'a> {
    pub(crate) fn new(pools: &'a PoolsFile, trace: &[TimedPod]) -> (Self, usize, usize) {
        let mig_model = pools.mig_model();
        let mut offered: Vec<String> = pools
            .pools
            .iter()
            .filter_map(|p| p.mig.as_ref())
            .flat_map(|m| m.per_gpu.iter().flat_map(|g| g.keys().cloned()))
            .collect();
        offered.sort();
        offered.dedup();
        let mut pods = Vec::new();
        let (mut cpu_only, mut no_life) = (0, 0);
        for t in trace {
            let s = &t.spec;
            if s.num_gpu == 0 || s.gpu_milli == 0 {
                cpu_only += 1;
                continue;
            }
            let Some(del) = t.deletion.filter(|d| *d > t.creation) else {
                no_life += 1;
                continue;
            };
            let fractional = s.num_gpu == 1 && s.gpu_milli < 1000;
            let mig_allowed = mig_model.is_some_and(|m| {
                s.gpu_spec.is_empty()
                    || s.gpu_spec.iter().any(|g| {
                        g.eq_ignore_ascii_case(m.key)
                            || pools
                                .pools
                                .iter()
                                .any(|p| p.mig.is_some() && p.model.eq_ignore_ascii_case(g))
                    })
            });
            let ask = match (fractional, pools.fractional, mig_model) {
                (true, Fractional::Mig, Some(m)) if mig_allowed => {
                    match mig_profile(m, &offered, s.gpu_milli) {
                        Some(p) => Ask::Mig(p),
                        None => Ask::Shared(s.gpu_milli),
                    }
                }
                (true, _, _) => Ask::Shared(s.gpu_milli),
                (false, _, _) => Ask::Whole(s.num_gpu),
            };
            pods.push(Pod {
                key: format!("trace/{}", s.name),
                spec: s.clone(),
                cpu: s.cpu_milli,
                mem: s.memory_mib,
                ask,
                req: s.total_gpu_milli() as f64 / 1000.0,
                arrival: t.creation * 1000,
                remaining: (del - t.creation) * 1000,
                st: PSt::Future,
                since: 0,
                wait: 0,
                started: 0,
                node: usize::MAX,
                gpus: Vec::new(),
                inst: (0, 0),
                epoch: 0,
            });
        }
        let pool_mig_totals = pools
            .pools
            .iter()
            .map(|p| {
                p.mig
                    .as_ref()
                    .map(|m| totals(&m.per_gpu))
                    .unwrap_or_default()
            })
            .collect();
        let mut w = World {
            pools,
            pods,
            nodes: Vec::new(),
            now: 0,
            heap: BinaryHeap::new(),
            seq: 0,
            pending: Vec::new(),
            pool_mig_totals,
            node_seq: vec![0; pools.pools.len()],
            last: 0,
            bought_now: 0.0,
            price_now: 0.0,
            requested_now: 0.0,
            bought_ms: 0.0,
            requested_ms: 0.0,
            cost: 0.0,
            series: Series::default(),
            scale_ups: 0,
            nodes_bought: 0,
            nodes_removed: 0,
            mig_changes: 0,
            evictions: 0,
            capacity_changed: false,
            last_activity: 0,
            wakes: std::collections::BTreeSet::new(),
        };
        for i in 0..w.pods.len() {
            let t = w.pods[i].arrival;
            w.push(t, Ev::Arrive(i));
        }
        (w, cpu_only, no_life)
    }

    pub(crate) fn push(&mut self, t: Ms, ev: Ev) {
        self.seq += 1;
        self.heap.push(Reverse((t, self.seq, ev)));
    }

    /// A decision at `t` exactly (one wake per time).
    pub fn wake_at(&mut self, t: Ms) {
        let t = t.max(self.now + 1);
        self.wakes.retain(|w| *w > self.now);
        if self.wakes.insert(t) {
            self.push(t, Ev::Wake);
        }
    }

    /// A decision at `t` or before: every decision re-requests what it still waits for, so an
    /// earlier wake-up already covers this one (and retries never multiply).
    pub fn wake_by(&mut self, t: Ms) {
        self.wakes.retain(|w| *w > self.now);
        if self.wakes.range(..=t).next().is_none() {
            self.wake_at(t);
        }
    }

    pub fn pool(&self, i: usize) -> &ReplayPool {
        &self.pools.pools[i]
    }

    /// Whether the pod's GPU kind and model constraint allow a pool (resources aside).
    pub fn model_ok(&self, pod: &Pod, pool: usize) -> bool {
        let p = self.pool(pool);
        let kind_ok = match pod.ask {
            Ask::Mig(_) => p.mig.is_some(),
            Ask::Whole(_) | Ask::Shared(_) => p.mig.is_none(),
        };
        kind_ok
            && (pod.spec.gpu_spec.is_empty()
                || pod
                    .spec
                    .gpu_spec
                    .iter()
                    .any(|g| g.eq_ignore_ascii_case(&p.model)))
    }

    /// Integrates the ledger up to `t`.
    pub(crate) fn advance(&mut self, t: Ms) {
        if t <= self.last {
            return;
        }
        let mut a = self.last;
        while a < t {
            let hour = (a as f64 / HOUR) as usize;
            let end = (((hour + 1) as f64) * HOUR) as Ms;
            let b = end.min(t);
            let span = (b - a) as f64;
            if self.series.bought.len() <= hour {
                self.series.bought.resize(hour + 1, 0.0);
                self.series.requested.resize(hour + 1, 0.0);
            }
            self.series.bought[hour] += self.bought_now * span / HOUR;
            self.series.requested[hour] += self.requested_now * span / HOUR;
            a = b;
        }
        let span = (t - self.last) as f64;
        self.bought_ms += self.bought_now * span;
        self.requested_ms += self.requested_now * span;
        self.cost += self.price_now * span / HOUR;
        self.last = t;
    }

    pub(crate) fn create_node(&mut self, pool: usize, layout: Option<NamedLayout>) {
        let p = &self.pools.pools[pool];
        self.node_seq[pool] += 1;
        let name = format!("{}-{}", p.name, self.node_seq[pool]);
        let registered = self.now + ms(p.boot);
        let ready = registered + ms(p.device_plugin);
        let (config, per_gpu) = match (layout, &p.mig) {
            (Some((c, l)), _) => (c, l),
            (None, Some(m)) => (m.config.clone(), m.per_gpu.clone()),
            (None, None) => (String::new(), Vec::new()),
        };
        let mig: Vec<Vec<Inst>> = match (p.mig.is_some(), p.catalog()) {
            (true, Some(model)) => per_gpu
                .iter()
                .map(|counts| {
                    gpuops_mig::planner::check(model, counts)
                        .map(|l| {
                            l.instances
                                .into_iter()
                                .map(|i| Inst {
                                    profile: i.profile,
                                    start: i.start,
                                    pod: None,
                                })
                                .collect()
                        })
                        .unwrap_or_default()
                })
                .collect(),
            _ => Vec::new(),
        };
        let gpus = p.gpus;
        self.nodes.push(SNode {
            name,
            pool,
            created: self.now,
            registered,
            ready,
            removed: None,
            cpu_free: p.cpu_milli,
            mem_free: p.memory_mib,
            gpu_free: if p.mig.is_some() {
                Vec::new()
            } else {
                vec![1000; gpus as usize]
            },
            mig,
            config,
            reconfig_until: 0,
            changed_at: None,
            pods: Vec::new(),
            empty_wake: false,
        });
        let id = self.nodes.len() - 1;
        self.push(ready, Ev::Ready(id));
        self.bought_now += f64::from(gpus);
        self.price_now += p.price_per_hour;
        self.nodes_bought += 1;
    }

    pub(crate) fn unbind(&mut self, pi: usize) {
        let (ni, ask) = (self.pods[pi].node, self.pods[pi].ask.clone());
        let (cpu, mem) = (self.pods[pi].cpu, self.pods[pi].mem);
        let gpus = std::mem::take(&mut self.pods[pi].gpus);
        let inst = self.pods[pi].inst;
        let n = &mut self.nodes[ni];
        n.cpu_free += cpu;
        n.mem_free += mem;
        match ask {
            Ask::Whole(_) => gpus.iter().for_each(|&g| n.gpu_free[g] = 1000),
            Ask::Shared(m) => gpus
                .iter()
                .for_each(|&g| n.gpu_free[g] = (n.gpu_free[g] + m as u16).min(1000)),
            Ask::Mig(_) => {
                if let Some(i) = n.mig.get_mut(inst.0).and_then(|g| g.get_mut(inst.1)) {
                    i.pod = None;
                }
            }
        }
        n.pods.retain(|&p| p != pi);
        self.requested_now -= self.pods[pi].req;
        self.capacity_changed = true;
    }

    pub(crate) fn remove_node(&mut self, ni: usize) {
        if !self.nodes[ni].live() {
            return;
        }
        for pi in self.nodes[ni].pods.clone() {
            let ran = self.now - self.pods[pi].started;
            self.unbind(pi);
            let p = &mut self.pods[pi];
            p.remaining = p.remaining.saturating_sub(ran).max(1);
            p.st = PSt::Pending;
            p.since = self.now;
            p.epoch += 1;
            self.pending.push(pi);
            self.evictions += 1;
        }
        let p = &self.pools.pools[self.nodes[ni].pool];
        self.bought_now -= f64::from(p.gpus);
        self.price_now -= p.price_per_hour;
        self.nodes[ni].removed = Some(self.now);
        self.nodes_removed += 1;
    }

    pub(crate) fn start(&mut self, pi: usize, ni: usize) {
        let now = self.now;
        let p = &mut self.pods[pi];
        p.st = PSt::Running;
        p.wait += now - p.since;
        p.started = now;
        p.node = ni;
        let end = now + p.remaining;
        let epoch = p.epoch;
        self.requested_now += p.req;
        self.nodes[ni].pods.push(pi);
        self.nodes[ni].empty_wake = false;
        self.push(end, Ev::Depart(pi, epoch));
    }

    /// Binds pending pods (oldest first) onto ready nodes.
    pub(crate) fn bind(&mut self) {
        if self.pending.is_empty() {
            return;
        }
        let now = self.now;
        let mut order = std::mem::take(&mut self.pending);
        order.sort_by_key(|&p| (self.pods[p].since, p));
        // Whole and shared GPUs: the packing engine over the ready whole-GPU nodes.
        let idx: Vec<usize> = (0..self.nodes.len())
            .filter(|&i| self.nodes[i].is_ready(now) && !self.nodes[i].gpu_free.is_empty())
            .collect();
        let mut cluster = if idx.is_empty()
            || order
                .iter()
                .all(|&p| matches!(self.pods[p].ask, Ask::Mig(_)))
        {
            None
        } else {
            let specs: Vec<NodeSpec> = idx
                .iter()
                .map(|&i| {
                    let p = self.pool(self.nodes[i].pool);
                    NodeSpec {
                        name: self.nodes[i].name.clone(),
                        cpu_milli: p.cpu_milli,
                        memory_mib: p.memory_mib,
                        gpus: p.gpus,
                        model: p.model.clone(),
                    }
                })
                .collect();
            Cluster::new(&specs).ok().map(|mut c| {
                for (ci, &ni) in idx.iter().enumerate() {
                    let n = &self.nodes[ni];
                    let p = self.pool(n.pool);
                    let _ = c.set_usage(
                        ci,
                        u32::try_from(p.cpu_milli - n.cpu_free).unwrap_or(u32::MAX),
                        p.memory_mib - n.mem_free,
                        &n.gpu_free,
                        &[],
                    );
                }
                c
            })
        };
        let policy = cluster.as_ref().map(|c| PolicyKind::BestFit.build(c, &[]));
        let tie = TieBreak::by_index(idx.len());
        let mut rng = gpuops_packing::rng::Rng::new(1);
        let mut left = Vec::new();
        for pi in order {
            let placed = match self.pods[pi].ask.clone() {
                Ask::Mig(profile) => self.bind_mig(pi, &profile),
                Ask::Whole(_) | Ask::Shared(_) => {
                    match (&mut cluster, &policy) {
                        (Some(c), Some(pol)) => {
                            let mut spec = self.pods[pi].spec.clone();
                            // The pool constraint of MIG-only pods never applies here.
                            spec.gpu_spec.retain(|g| !g.is_empty());
                            let req = c.resolve(&spec);
                            match gpuops_packing::select(c, pol.as_ref(), &req, &tie, &mut rng) {
                                Some(pl) if c.place(pl.node, &req, pl.gpus).is_ok() => {
                                    let ni = idx[pl.node];
                                    let n = &mut self.nodes[ni];
                                    n.cpu_free -= u64::from(req.cpu_milli);
                                    n.mem_free -= req.memory_mib;
                                    n.gpu_free = c.gpus(pl.node).to_vec();
                                    self.pods[pi].gpus = pl.gpus.to_vec();
                                    self.start(pi, ni);
                                    true
                                }
                                _ => false,
                            }
                        }
                        _ => false,
                    }
                }
            };
            if !placed {
                left.push(pi);
            }
        }
        self.pending = left;
    }

    pub(crate) fn bind_mig(&mut self, pi: usize, profile: &str) -> bool {
        let now = self.now;
        let (cpu, mem) = (self.pods[pi].cpu, self.pods[pi].mem);
        for ni in 0..self.nodes.len() {
            let n = &self.nodes[ni];
            if !n.is_ready(now)
                || n.reconfig_until > now
                || n.cpu_free < cpu
                || n.mem_free < mem
                || !self.model_ok(&self.pods[pi], n.pool)
            {
                continue;
            }
            let found = n.mig.iter().enumerate().find_map(|(g, insts)| {
                insts
                    .iter()
                    .position(|i| i.pod.is_none() && i.profile == profile)
                    .map(|k| (g, k))
            });
            if let Some((g, k)) = found {
                let n = &mut self.nodes[ni];
                n.cpu_free -= cpu;
                n.mem_free -= mem;
                n.mig[g][k].pod = Some(pi);
                self.pods[pi].inst = (g, k);
                self.start(pi, ni);
                return true;
            }
        }
        false
    }

    pub(crate) fn apply(&mut self, actions: Vec<Action>) {
        for a in actions {
            match a {
                Action::Buy { pool, n, layout } => {
                    if n == 0 {
                        continue;
                    }
                    self.scale_ups += 1;
                    for _ in 0..n {
                        self.create_node(pool, layout.clone());
                    }
                    self.last_activity = self.now;
                }
                Action::Remove(ni) => {
                    // A node with a MIG change under way is not drained: the change is for
                    // pending pods.
                    if self.nodes[ni].reconfig_until > self.now {
                        continue;
                    }
                    self.remove_node(ni);
                    self.last_activity = self.now;
                }
                Action::Repartition { node, config, gpus } => {
                    let until = self.now + ms(self.pools.mig_change);
                    let n = &mut self.nodes[node];
                    for (g, target) in gpus {
                        let Some(old) = n.mig.get(g) else {
                            continue;
                        };
                        let new: Vec<Inst> = target
                            .into_iter()
                            .map(|(profile, start)| {
                                let pod = old
                                    .iter()
                                    .find(|i| i.profile == profile && i.start == start)
                                    .and_then(|i| i.pod);
                                Inst {
                                    profile,
                                    start,
                                    pod,
                                }
                            })
                            .collect();
                        n.mig[g] = new;
                    }
                    // The pods' device indices moved with the layout.
                    for (g, insts) in n.mig.iter().enumerate() {
                        for (k, i) in insts.iter().enumerate() {
                            if let Some(p) = i.pod {
                                self.pods[p].inst = (g, k);
                            }
                        }
                    }
                    n.config = config;
                    n.reconfig_until = until;
                    n.changed_at = Some(self.now);
                    self.mig_changes += 1;
                    self.push(until, Ev::MigDone(node));
                    self.last_activity = self.now;
                }
            }
        }
    }

    /// Ready nodes with no pod get a wake-up after `idle`, so scale-down is seen.
    pub(crate) fn schedule_idle_wakes(&mut self, idle: Ms) {
        let now = self.now;
        let mut at = Vec::new();
        for n in &mut self.nodes {
            if n.is_ready(now) && n.pods.is_empty() && !n.empty_wake {
                n.empty_wake = true;
                at.push(now + idle);
            }
        }
        for t in at {
            self.wake_at(t);
        }
    }

    /// The gpuops snapshot of the world.
    pub(crate) fn snapshot(&self, include_mig_pods: bool) -> Snapshot {
        let now = self.now;
        let pools = self
            .pools
            .pools
            .iter()
            .enumerate()
            .map(|(i, p)| Pool {
                name: p.name.clone(),
                min: p.min,
                max: p.max,
                replicas: u32::try_from(
                    self.nodes
                        .iter()
                        .filter(|n| n.live() && n.pool == i)
                        .count(),
                )
                .unwrap_or(u32::MAX),
                price_per_hour: p.price_per_hour,
                template: self.template(i),
                timeouts: StageTimeouts {
                    provision: Duration::from_secs(86_400),
                    registration: Duration::from_secs(86_400),
                    devices: Duration::from_secs(86_400),
                },
            })
            .collect();
        let mut nodes = Vec::new();
        let mut machines = Vec::new();
        for n in self.nodes.iter().filter(|n| n.live()) {
            let p = self.pool(n.pool);
            if n.is_ready(now) {
                let mut scalars = BTreeMap::new();
                scalars.insert(PODS.to_string(), 110u64.saturating_sub(n.pods.len() as u64));
                if n.reconfig_until <= now {
                    for i in n.mig.iter().flatten().filter(|i| i.pod.is_none()) {
                        *scalars
                            .entry(format!("nvidia.com/mig-{}", i.profile))
                            .or_insert(0) += 1;
                    }
                }
                nodes.push(Node {
                    name: n.name.clone(),
                    pool: Some(p.name.clone()),
                    machine: Some(n.name.clone()),
                    labels: BTreeMap::from([(PRODUCT.to_string(), p.model.clone())]),
                    taints: Vec::new(),
                    unschedulable: false,
                    cpu_free_milli: n.cpu_free,
                    memory_free_mib: n.mem_free,
                    gpu_resource: if n.gpu_free.is_empty() {
                        String::new()
                    } else {
                        GPU.into()
                    },
                    gpu_replicas: 1,
                    gpu_free: n.gpu_free.clone(),
                    gpu_product: p.model.clone(),
                    scalars_free: scalars,
                    pods: n
                        .pods
                        .iter()
                        .map(|&pi| RunningPod {
                            key: self.pods[pi].key.clone(),
                            labels: BTreeMap::new(),
                            gpu: true,
                            do_not_disrupt: false,
                        })
                        .collect(),
                    gpu_util: None,
                    removing: false,
                });
            } else {
                let (stage, since) = if now < n.registered {
                    (Stage::Provisioning, n.created)
                } else {
                    (Stage::Devices, n.registered)
                };
                machines.push(Machine {
                    name: n.name.clone(),
                    pool: p.name.clone(),
                    node: (stage != Stage::Provisioning).then(|| n.name.clone()),
                    stage,
                    stage_since: since,
                    failed: false,
                });
            }
        }
        let pending = self
            .pending
            .iter()
            .filter(|&&pi| include_mig_pods || !matches!(self.pods[pi].ask, Ask::Mig(_)))
            .map(|&pi| self.pending_pod(pi))
            .collect();
        Snapshot {
            pools,
            nodes,
            machines,
            pending,
            pdbs: Vec::new(),
            skipped_pools: Vec::new(),
        }
    }

    /// What a new node of pool `i` offers, as the controller reads it from the pool's
    /// annotations.
    pub(crate) fn template(&self, i: usize) -> NodeTemplate {
        let p = self.pool(i);
        let mut scalars = BTreeMap::from([(PODS.to_string(), 110u64)]);
        for (k, v) in &self.pool_mig_totals[i] {
            scalars.insert(format!("nvidia.com/mig-{k}"), u64::from(*v));
        }
        NodeTemplate {
            cpu_milli: p.cpu_milli,
            memory_mib: p.memory_mib,
            gpus: if p.mig.is_some() { 0 } else { p.gpus },
            gpu_resource: if p.mig.is_some() {
                String::new()
            } else {
                GPU.into()
            },
            gpu_replicas: 1,
            gpu_product: p.model.clone(),
            scalars,
            labels: BTreeMap::from([(PRODUCT.to_string(), p.model.clone())]),
            taints: Vec::new(),
        }
    }

    pub(crate) fn pending_pod(&self, pi: usize) -> PendingPod {
        let p = &self.pods[pi];
        let (gpu_resource, gpu_count, gpu_milli, scalars) = match &p.ask {
            Ask::Whole(n) => (GPU.to_string(), u64::from(*n), None, BTreeMap::new()),
            Ask::Shared(m) => (GPU.to_string(), 1, Some(*m), BTreeMap::new()),
            Ask::Mig(prof) => (
                String::new(),
                0,
                None,
                BTreeMap::from([(format!("nvidia.com/mig-{prof}"), 1u64)]),
            ),
        };
        let mut products: Vec<String> = p.spec.gpu_spec.clone();
        if let Ask::Mig(_) = p.ask {
            products.retain(|g| {
                self.pools
                    .pools
                    .iter()
                    .any(|q| q.mig.is_some() && q.model.eq_ignore_ascii_case(g))
            });
        }
        PendingPod {
            key: p.key.clone(),
            created: p.since,
            cpu_milli: p.cpu,
            memory_mib: p.mem,
            gpu_resource,
            gpu_count,
            gpu_milli,
            scalars,
            tolerations: Vec::new(),
            constraints: NodeConstraints {
                node_selector: BTreeMap::new(),
                affinity: (!products.is_empty()).then(|| {
                    vec![Term {
                        expressions: vec![Requirement {
                            key: PRODUCT.into(),
                            operator: "In".into(),
                            values: products,
                        }],
                        fields: Vec::new(),
                    }]
                }),
            },
        }
    }

    /// Whether some pool could ever run the pod under `policy`.
    pub(crate) fn feasible(&self, pi: usize, policy: PolicyName, mig_on: bool) -> bool {
        let pod = &self.pods[pi];
        (0..self.pools.pools.len()).any(|i| {
            let p = self.pool(i);
            if !self.model_ok(pod, i) || pod.cpu > p.cpu_milli || pod.mem > p.memory_mib {
                return false;
            }
            match &pod.ask {
                Ask::Whole(n) => *n <= p.gpus,
                Ask::Shared(_) => p.gpus >= 1,
                Ask::Mig(prof) => {
                    let repartitions = policy == PolicyName::Ours && mig_on;
                    if repartitions {
                        p.catalog()
                            .is_some_and(|m| gpuops_mig::layout::gi_profile_of(m, prof).is_some())
                    } else {
                        self.pool_mig_totals[i].get(prof).copied().unwrap_or(0) > 0
                    }
                }
            }
        })
    }

    pub(crate) fn result(&self, policy: PolicyName, unschedulable: u64, stuck: u64) -> RunResult {
        let mut waits: Vec<Ms> = self
            .pods
            .iter()
            .filter(|p| p.st == PSt::Done || p.st == PSt::Running)
            .map(|p| p.wait)
            .collect();
        waits.sort_unstable();
        let q = |f: f64| {
            if waits.is_empty() {
                0.0
            } else {
                let k = ((waits.len() - 1) as f64 * f).round() as usize;
                waits[k] as f64 / 1000.0
            }
        };
        let bought = self.bought_ms / HOUR;
        let requested = self.requested_ms / HOUR;
        RunResult {
            policy,
            gpu_hours_bought: bought,
            gpu_hours_requested: requested,
            ratio: if requested > 0.0 {
                bought / requested
            } else {
                0.0
            },
            cost: self.cost,
            pending_pod_hours: waits.iter().map(|w| *w as f64).sum::<f64>() / HOUR,
            wait_p50_s: q(0.5),
            wait_p99_s: q(0.99),
            wait_max_s: q(1.0),
            scale_ups: self.scale_ups,
            nodes_bought: self.nodes_bought,
            nodes_removed: self.nodes_removed,
            mig_changes: self.mig_changes,
            evictions: self.evictions,
            pods_run: waits.len() as u64,
            pods_unschedulable: unschedulable,
            pods_stuck: stuck,
            hours: self.last as f64 / HOUR,
            series: self.series.clone(),
        }
    }
}
