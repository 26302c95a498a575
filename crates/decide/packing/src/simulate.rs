//! The trace simulator, following the FGD artifact's procedure: seeded shuffle of the trace's
//! pods, sampling with replacement until the requested GPU reaches `load x` cluster capacity
//! (or random removal when the trace already exceeds it), one-by-one arrival, no departures,
//! pods that fit nowhere are dropped. The GPU allocation ratio is recorded at each 1% of arrived
//! workload.

use crate::cluster::{Cluster, PodReq};
use crate::error::{PackingError, Result};
use crate::policy::{Policy, PolicyKind, TieBreak, TypicalPods, select};
use crate::rng::Rng;
use crate::trace::{NodeSpec, PodSpec};
use serde::Serialize;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;

/// Stream labels for [`Rng::derive`], so each purpose has its own stream per seed.
const STREAM_WORKLOAD: u64 = 1;
const STREAM_SCHEDULE: u64 = 2;
const STREAM_NODE_ORDER: u64 = 3;

/// Simulation parameters.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SimConfig {
    /// Policies to run.
    pub policies: Vec<PolicyKind>,
    /// Seeds, one run per policy and seed.
    pub seeds: Vec<u64>,
    /// Arrived GPU demand as a multiple of cluster GPU capacity (the paper: 1.3).
    pub load: f64,
    /// Worker threads (0: one per available core).
    pub threads: usize,
}

impl Default for SimConfig {
    fn default() -> Self {
        Self {
            policies: PolicyKind::ALL.to_vec(),
            seeds: (42..52).collect(),
            load: 1.3,
            threads: 0,
        }
    }
}

/// Parses a seed list: `42`, `42-51` (inclusive) or `1,5,9`.
///
/// # Errors
/// [`PackingError::Input`] on malformed text or an empty / reversed range.
pub fn parse_seeds(s: &str) -> Result<Vec<u64>> {
    let bad = || {
        PackingError::Input(format!(
            "bad seeds {s:?} (expected e.g. 42, 42-51 or 1,2,3)"
        ))
    };
    let mut out = Vec::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        if let Some((a, b)) = part.split_once('-') {
            let a: u64 = a.trim().parse().map_err(|_| bad())?;
            let b: u64 = b.trim().parse().map_err(|_| bad())?;
            if b < a || b - a > 100_000 {
                return Err(bad());
            }
            out.extend(a..=b);
        } else {
            out.push(part.parse().map_err(|_| bad())?);
        }
    }
    if out.is_empty() {
        return Err(bad());
    }
    Ok(out)
}

/// Progress of a (multi-run) simulation, reported to the caller's callback.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Progress {
    /// Policy of the run that advanced.
    pub policy: PolicyKind,
    /// Seed of that run.
    pub seed: u64,
    /// Pods processed in that run.
    pub pods_done: usize,
    /// Pods in that run.
    pub pods_total: usize,
    /// Runs finished so far (all policies and seeds).
    pub runs_done: usize,
    /// Runs in total.
    pub runs_total: usize,
}

/// Result of one run (one policy, one seed).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RunResult {
    /// Policy.
    pub policy: PolicyKind,
    /// Seed.
    pub seed: u64,
    /// GPU allocation % at arrived workload 0%, 1%, ..., `load*100`%.
    pub curve: Vec<f64>,
    /// Final GPU allocation % (at `load*100`% arrived).
    pub allocation_pct: f64,
    /// `100 - allocation_pct`.
    pub unallocated_pct: f64,
    /// Pods that arrived.
    pub pods_arrived: usize,
    /// Pods that fit nowhere and were dropped.
    pub pods_failed: usize,
    /// GPU milli requested by the dropped pods.
    pub failed_gpu_milli: u64,
}

/// Per-policy aggregate over seeds.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PolicySummary {
    /// Policy.
    pub policy: PolicyKind,
    /// Mean curve over seeds.
    pub mean_curve: Vec<f64>,
    /// Mean final allocation %.
    pub mean_allocation_pct: f64,
    /// Mean final unallocated %.
    pub mean_unallocated_pct: f64,
    /// Smallest and largest unallocated % over seeds.
    pub min_unallocated_pct: f64,
    /// Largest unallocated % over seeds.
    pub max_unallocated_pct: f64,
    /// Mean number of dropped pods.
    pub mean_pods_failed: f64,
    /// (seed, unallocated %) per seed.
    pub per_seed: Vec<(u64, f64)>,
}

/// All runs of a simulation and their summaries.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Simulation {
    /// Load factor used.
    pub load: f64,
    /// Cluster GPU capacity in milli.
    pub gpu_capacity_milli: u64,
    /// Runs, ordered by policy (as configured) then seed.
    pub runs: Vec<RunResult>,
    /// One summary per policy, in configured order.
    pub summaries: Vec<PolicySummary>,
}

impl Simulation {
    /// The summary of `policy`, if it was run.
    #[must_use]
    pub fn summary(&self, policy: PolicyKind) -> Option<&PolicySummary> {
        self.summaries.iter().find(|s| s.policy == policy)
    }
}

/// The arrival sequence: indices into `pods`. The trace is shuffled with `seed`; then pods are
/// sampled with replacement while the total requested GPU stays within `load x capacity`
/// (sampling stops at the first pod that would exceed it); if the trace alone exceeds the target,
/// random pods are removed until it does not.
#[must_use]
pub fn workload(pods: &[PodSpec], gpu_capacity_milli: u64, load: f64, seed: u64) -> Vec<usize> {
    let mut rng = Rng::derive(seed, STREAM_WORKLOAD);
    let mut order: Vec<usize> = (0..pods.len()).collect();
    rng.shuffle(&mut order);
    if pods.is_empty() {
        return order;
    }
    let target = load * gpu_capacity_milli as f64;
    let mut total: u64 = pods.iter().map(PodSpec::total_gpu_milli).sum();
    if total as f64 > target {
        while total as f64 > target && !order.is_empty() {
            let i = rng.index(order.len());
            total -= pods[order[i]].total_gpu_milli();
            order.remove(i);
        }
    } else {
        loop {
            let i = rng.index(pods.len());
            let t = pods[i].total_gpu_milli();
            if (total + t) as f64 > target {
                break;
            }
            total += t;
            order.push(i);
        }
    }
    order
}

/// Runs one policy over one arrival sequence on a copy of `cluster`.
///
/// `progress` is called with (pods done, pods total) about every 1% of pods.
///
/// # Errors
/// [`PackingError::Placement`] if the policy returns an invalid GPU choice (a bug).
#[allow(clippy::too_many_arguments)]
pub fn run_one(
    cluster: &Cluster,
    requests: &[PodReq],
    order: &[usize],
    mut policy: Box<dyn Policy>,
    kind: PolicyKind,
    seed: u64,
    load: f64,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<RunResult> {
    let mut cluster = cluster.clone();
    let mut rng = Rng::derive(seed, STREAM_SCHEDULE);
    let tie = TieBreak::shuffled(cluster.len(), &mut Rng::derive(seed, STREAM_NODE_ORDER));
    let capacity = cluster.gpu_capacity_milli().max(1) as f64;
    let points = (load * 100.0).round().max(0.0) as usize;
    let mut curve = Vec::with_capacity(points + 1);
    curve.push(cluster.allocation_pct());
    let mut arrived: u64 = 0;
    let mut failed = 0usize;
    let mut failed_milli = 0u64;
    let step = (order.len() / 100).max(1);
    for (k, &idx) in order.iter().enumerate() {
        let pod = &requests[idx];
        arrived += u64::from(pod.total_gpu_milli());
        match select(&cluster, policy.as_ref(), pod, &tie, &mut rng) {
            Some(p) => {
                cluster.place(p.node, pod, p.gpus)?;
                policy.on_place(&cluster, p.node);
            }
            None => {
                failed += 1;
                failed_milli += u64::from(pod.total_gpu_milli());
            }
        }
        let arrived_pct = 100.0 * arrived as f64 / capacity;
        while curve.len() <= points && arrived_pct + 1e-9 >= curve.len() as f64 {
            curve.push(cluster.allocation_pct());
        }
        if (k + 1) % step == 0 {
            progress(k + 1, order.len());
        }
    }
    let final_pct = cluster.allocation_pct();
    while curve.len() <= points {
        curve.push(final_pct);
    }
    progress(order.len(), order.len());
    Ok(RunResult {
        policy: kind,
        seed,
        curve,
        allocation_pct: final_pct,
        unallocated_pct: 100.0 - final_pct,
        pods_arrived: order.len(),
        pods_failed: failed,
        failed_gpu_milli: failed_milli,
    })
}

enum Msg {
    Progress(Progress),
    Done(usize, Result<RunResult>),
}

/// Runs every configured policy on every seed (in parallel over `config.threads` workers) and
/// summarises. `progress` is called on the caller's thread.
///
/// # Errors
/// [`PackingError::Input`] for an empty pod list, no policy, no seed or a bad load; cluster
/// errors from the node list; placement errors from a faulty policy.
pub fn simulate(
    nodes: &[NodeSpec],
    pods: &[PodSpec],
    config: &SimConfig,
    progress: &mut dyn FnMut(&Progress),
) -> Result<Simulation> {
    if pods.is_empty() {
        return Err(PackingError::Input("no pods".into()));
    }
    if config.policies.is_empty() || config.seeds.is_empty() {
        return Err(PackingError::Input("no policy or no seed".into()));
    }
    if !(config.load.is_finite() && config.load > 0.0 && config.load <= 100.0) {
        return Err(PackingError::Input(format!(
            "load {} must be in (0, 100]",
            config.load
        )));
    }
    let cluster = Cluster::new(nodes)?;
    let requests: Vec<PodReq> = pods.iter().map(|p| cluster.resolve(p)).collect();
    let typical = if config.policies.iter().any(PolicyKind::needs_typical_pods) {
        TypicalPods::from_trace(&cluster, pods)
    } else {
        TypicalPods::default()
    };
    let jobs: Vec<(PolicyKind, u64)> = config
        .policies
        .iter()
        .flat_map(|&p| config.seeds.iter().map(move |&s| (p, s)))
        .collect();
    let orders: Vec<(u64, Vec<usize>)> = config
        .seeds
        .iter()
        .map(|&s| {
            (
                s,
                workload(pods, cluster.gpu_capacity_milli(), config.load, s),
            )
        })
        .collect();
    let threads = if config.threads == 0 {
        std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
    } else {
        config.threads
    }
    .min(jobs.len())
    .max(1);

    let next = AtomicUsize::new(0);
    let mut results: Vec<Option<Result<RunResult>>> = (0..jobs.len()).map(|_| None).collect();
    let runs_total = jobs.len();
    std::thread::scope(|scope| {
        let (tx, rx) = mpsc::channel::<Msg>();
        for _ in 0..threads {
            let tx = tx.clone();
            let (jobs, orders, next) = (&jobs, &orders, &next);
            let (cluster, requests, typical) = (&cluster, &requests, &typical);
            let load = config.load;
            scope.spawn(move || {
                loop {
                    let j = next.fetch_add(1, Ordering::Relaxed);
                    let Some(&(kind, seed)) = jobs.get(j) else {
                        break;
                    };
                    let order = orders
                        .iter()
                        .find(|(s, _)| *s == seed)
                        .map_or(&[][..], |(_, o)| o.as_slice());
                    let policy = kind.build_with_typical(cluster, typical);
                    let mut report = |done: usize, total: usize| {
                        let _ = tx.send(Msg::Progress(Progress {
                            policy: kind,
                            seed,
                            pods_done: done,
                            pods_total: total,
                            runs_done: 0,
                            runs_total,
                        }));
                    };
                    let r = run_one(
                        cluster,
                        requests,
                        order,
                        policy,
                        kind,
                        seed,
                        load,
                        &mut report,
                    );
                    let _ = tx.send(Msg::Done(j, r));
                }
            });
        }
        drop(tx);
        let mut done = 0usize;
        for msg in rx {
            match msg {
                Msg::Progress(mut p) => {
                    p.runs_done = done;
                    progress(&p);
                }
                Msg::Done(j, r) => {
                    done += 1;
                    results[j] = Some(r);
                }
            }
        }
    });
    let mut runs = Vec::with_capacity(jobs.len());
    for r in results {
        match r {
            Some(r) => runs.push(r?),
            None => return Err(PackingError::Input("a simulation worker stopped".into())),
        }
    }
    let summaries = config
        .policies
        .iter()
        .map(|&p| summarize(p, &runs))
        .collect();
    Ok(Simulation {
        load: config.load,
        gpu_capacity_milli: cluster.gpu_capacity_milli(),
        runs,
        summaries,
    })
}

/// Aggregates the runs of `policy`.
#[must_use]
pub fn summarize(policy: PolicyKind, runs: &[RunResult]) -> PolicySummary {
    let mine: Vec<&RunResult> = runs.iter().filter(|r| r.policy == policy).collect();
    let n = mine.len().max(1) as f64;
    let len = mine.iter().map(|r| r.curve.len()).max().unwrap_or(0);
    let mean_curve = (0..len)
        .map(|k| {
            mine.iter()
                .map(|r| r.curve.get(k).copied().unwrap_or(r.allocation_pct))
                .sum::<f64>()
                / n
        })
        .collect();
    let un: Vec<f64> = mine.iter().map(|r| r.unallocated_pct).collect();
    PolicySummary {
        policy,
        mean_curve,
        mean_allocation_pct: mine.iter().map(|r| r.allocation_pct).sum::<f64>() / n,
        mean_unallocated_pct: un.iter().sum::<f64>() / n,
        min_unallocated_pct: un.iter().copied().fold(f64::INFINITY, f64::min),
        max_unallocated_pct: un.iter().copied().fold(f64::NEG_INFINITY, f64::max),
        mean_pods_failed: mine.iter().map(|r| r.pods_failed as f64).sum::<f64>() / n,
        per_seed: mine.iter().map(|r| (r.seed, r.unallocated_pct)).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nodes() -> Vec<NodeSpec> {
        (0..6)
            .map(|i| NodeSpec {
                name: format!("n{i}"),
                cpu_milli: 32_000,
                memory_mib: 64_000,
                gpus: [1, 2, 4, 8, 2, 4][i],
                model: if i % 2 == 0 { "T4" } else { "G2" }.into(),
            })
            .collect()
    }

    fn pods() -> Vec<PodSpec> {
        let shapes: [(u64, u32, u32, &[&str]); 7] = [
            (4_000, 1, 1000, &[]),
            (2_000, 1, 500, &[]),
            (2_000, 1, 250, &["T4"]),
            (8_000, 2, 1000, &[]),
            (16_000, 4, 1000, &["G2"]),
            (6_000, 0, 0, &[]),
            (1_000, 1, 700, &[]),
        ];
        (0..40)
            .map(|i| {
                let (c, n, m, s) = shapes[i % shapes.len()];
                PodSpec {
                    name: format!("p{i}"),
                    cpu_milli: c,
                    memory_mib: 1_000,
                    num_gpu: n,
                    gpu_milli: m,
                    gpu_spec: s.iter().map(|x| x.to_string()).collect(),
                }
            })
            .collect()
    }

    #[test]
    fn seeds_parse() {
        assert_eq!(parse_seeds("42-44").unwrap(), vec![42, 43, 44]);
        assert_eq!(parse_seeds("1,5").unwrap(), vec![1, 5]);
        assert!(parse_seeds("5-1").is_err());
        assert!(parse_seeds("x").is_err());
        assert!(parse_seeds("").is_err());
    }

    #[test]
    fn workload_reaches_load_and_is_deterministic() {
        let p = pods();
        let cap = 50_000u64;
        let w = workload(&p, cap, 1.3, 42);
        assert_eq!(w, workload(&p, cap, 1.3, 42));
        assert_ne!(w, workload(&p, cap, 1.3, 43));
        let total: u64 = w.iter().map(|&i| p[i].total_gpu_milli()).sum();
        assert!(total as f64 <= 1.3 * cap as f64);
        assert!(total as f64 > 1.3 * cap as f64 - 4000.0);
        // Every trace pod appears at least once (the trace is below the target).
        for i in 0..p.len() {
            assert!(w.contains(&i));
        }
        // Tuning down when the trace exceeds the target.
        let w = workload(&p, 10_000, 0.5, 1);
        let total: u64 = w.iter().map(|&i| p[i].total_gpu_milli()).sum();
        assert!(total <= 5_000);
    }

    #[test]
    fn invariants_hold_for_every_policy() {
        let n = nodes();
        let p = pods();
        let cfg = SimConfig {
            policies: PolicyKind::ALL.to_vec(),
            seeds: vec![1, 2],
            load: 1.3,
            threads: 2,
        };
        let mut calls = 0;
        let sim = simulate(&n, &p, &cfg, &mut |_| calls += 1).unwrap();
        assert!(calls > 0);
        assert_eq!(sim.runs.len(), 14);
        for r in &sim.runs {
            assert_eq!(r.curve.len(), 131);
            assert!(r.curve.iter().all(|&a| (0.0..=100.0).contains(&a)));
            assert!(r.curve.windows(2).all(|w| w[1] >= w[0]), "no departures");
            assert!(r.allocation_pct <= 100.0);
            assert!(r.pods_failed > 0, "overloaded cluster drops pods");
            // Allocation never exceeds what arrived.
            for (k, a) in r.curve.iter().enumerate() {
                assert!(*a <= k as f64 + 1e-9 + 100.0 / 21.0 * 4.0);
            }
        }
        // Reproducible.
        let again = simulate(&n, &p, &cfg, &mut |_| {}).unwrap();
        assert_eq!(sim, again);
    }

    #[test]
    fn failed_pods_are_dropped_and_state_is_consistent() {
        let n = nodes();
        let p = pods();
        let cluster = Cluster::new(&n).unwrap();
        let req: Vec<PodReq> = p.iter().map(|x| cluster.resolve(x)).collect();
        let order = workload(&p, cluster.gpu_capacity_milli(), 1.3, 7);
        let policy = PolicyKind::BestFit.build(&cluster, &p);
        let r = run_one(
            &cluster,
            &req,
            &order,
            policy,
            PolicyKind::BestFit,
            7,
            1.3,
            &mut |_, _| {},
        )
        .unwrap();
        let requested: u64 = order
            .iter()
            .map(|&i| u64::from(req[i].total_gpu_milli()))
            .sum();
        let allocated = r.allocation_pct / 100.0 * cluster.gpu_capacity_milli() as f64;
        assert!((requested as f64 - r.failed_gpu_milli as f64 - allocated).abs() < 1e-6);
    }

    #[test]
    fn bad_input() {
        let cfg = SimConfig::default();
        assert!(simulate(&nodes(), &[], &cfg, &mut |_| {}).is_err());
        let cfg = SimConfig {
            load: -1.0,
            ..SimConfig::default()
        };
        assert!(simulate(&nodes(), &pods(), &cfg, &mut |_| {}).is_err());
    }
}
