//! Running the policies over the world: gpuops's own decisions (`decide`, `decide_mig`), the
//! CA-like baseline, and the event loop that drives them.

use crate::ca::{self, CaState};
use crate::pools::PoolsFile;
use crate::sim::{
    Action, Ask, Ev, PSt, PolicyName, Progress, Replay, ReplayOptions, RunResult, World, ms,
};
use crate::trace::TimedPod;
use gpuops_autoscale::mig_demand::{
    MigConfig, MigGpu, MigInstance, MigMemory, MigNode, MigNodeState, MigPod, MigPool, decide_mig,
};
use gpuops_autoscale::{Config, Plan, State};
use std::cmp::Reverse;
use std::time::Duration;

/// gpuops: the controller's decisions on the world's snapshot.
struct Ours {
    state: State,
    config: Config,
    mig: Option<(MigMemory, MigConfig)>,
}

impl Ours {
    fn step(&mut self, w: &mut World<'_>) -> Vec<Action> {
        let now = w.now;
        let mut actions = Vec::new();
        if let Some((mem, cfg)) = &mut self.mig {
            let (nodes, pods, pools) = mig_view(w);
            if !pods.is_empty() {
                let d = decide_mig(&nodes, &pods, &pools, mem, now, cfg);
                for c in &d.changes {
                    if let Some(ni) = w.nodes.iter().position(|n| n.name == c.node) {
                        actions.push(Action::Repartition {
                            node: ni,
                            config: c.config_name.clone(),
                            gpus: c
                                .plans
                                .iter()
                                .map(|(g, p)| {
                                    (
                                        *g as usize,
                                        p.target
                                            .instances
                                            .iter()
                                            .map(|i| (i.profile.clone(), i.start))
                                            .collect(),
                                    )
                                })
                                .collect(),
                        });
                    }
                }
                for su in &d.scale_ups {
                    if let Some(pi) = w.pools.pools.iter().position(|p| p.name == su.pool) {
                        actions.push(Action::Buy {
                            pool: pi,
                            n: su.nodes,
                            layout: Some((su.config_name.clone(), su.layout.clone())),
                        });
                    }
                }
                if !d.waiting.is_empty() {
                    let oldest = pods.iter().map(|p| p.created).min().unwrap_or(now);
                    w.wake_by(now + ms(cfg.batch_idle));
                    w.wake_by(oldest + ms(cfg.batch_max));
                }
                if !d.unserved.is_empty() {
                    w.wake_by(now + 60_000);
                }
            }
        }
        let snap = w.snapshot(self.mig.is_none());
        let d = gpuops_autoscale::decide(&snap, &mut self.state, now, &self.config);
        actions.extend(decision_actions(w, &d));
        if d.plans
            .iter()
            .any(|p| matches!(p.plan, Plan::Waiting { .. }))
        {
            w.wake_by(now + ms(self.config.batch_idle));
            let oldest = snap.pending.iter().map(|p| p.created).min().unwrap_or(now);
            w.wake_by(oldest + ms(self.config.batch_max));
        }
        if d.removals.len() >= self.config.max_scale_down_per_decision {
            w.wake_at(now + 1);
        }
        actions
    }
}

fn decision_actions(w: &World<'_>, d: &gpuops_autoscale::Decision) -> Vec<Action> {
    let mut out = Vec::new();
    for su in &d.scale_ups {
        if let Some(pi) = w.pools.pools.iter().position(|p| p.name == su.pool) {
            out.push(Action::Buy {
                pool: pi,
                n: su.to.saturating_sub(su.from),
                layout: None,
            });
        }
    }
    for r in &d.removals {
        if let Some(ni) = w.nodes.iter().position(|n| n.live() && n.name == r.node) {
            out.push(Action::Remove(ni));
        }
    }
    out
}

/// The MIG demand decision's view: MIG nodes (launched ones as in flight), pending MIG pods,
/// MIG pools with their room.
fn mig_view(w: &World<'_>) -> (Vec<MigNode>, Vec<MigPod>, Vec<MigPool>) {
    let now = w.now;
    let nodes = w
        .nodes
        .iter()
        .filter(|n| n.live() && w.pool(n.pool).mig.is_some())
        .map(|n| {
            let p = w.pool(n.pool);
            MigNode {
                name: n.name.clone(),
                pool: Some(p.name.clone()),
                model: p.model.clone(),
                price_per_hour: p.price_per_hour,
                config: n.config.clone(),
                state: if n.reconfig_until > now {
                    MigNodeState::Pending
                } else {
                    MigNodeState::Success
                },
                changed_at: n.changed_at,
                unschedulable: false,
                in_flight: !n.is_ready(now),
                cpu_free_milli: n.cpu_free,
                memory_free_mib: n.mem_free,
                gpus: n
                    .mig
                    .iter()
                    .map(|insts| MigGpu {
                        mig_enabled: true,
                        busy: false,
                        instances: insts
                            .iter()
                            .map(|i| MigInstance {
                                profile: i.profile.clone(),
                                start: i.start,
                                busy: i.pod.is_some(),
                            })
                            .collect(),
                    })
                    .collect(),
            }
        })
        .collect();
    let pods = w
        .pending
        .iter()
        .filter_map(|&pi| match &w.pods[pi].ask {
            Ask::Mig(p) => Some(MigPod {
                key: w.pods[pi].key.clone(),
                created: w.pods[pi].since,
                profile: p.clone(),
                count: 1,
                cpu_milli: w.pods[pi].cpu,
                memory_mib: w.pods[pi].mem,
            }),
            _ => None,
        })
        .collect();
    let pools = w
        .pools
        .pools
        .iter()
        .enumerate()
        .filter(|(_, p)| p.mig.is_some())
        .map(|(i, p)| {
            let live = w.nodes.iter().filter(|n| n.live() && n.pool == i).count();
            MigPool {
                name: p.name.clone(),
                model: p.model.clone(),
                gpus: p.gpus,
                price_per_hour: p.price_per_hour,
                room: p
                    .max
                    .saturating_sub(u32::try_from(live).unwrap_or(u32::MAX)),
                default_config: p
                    .mig
                    .as_ref()
                    .map(|m| (m.config.clone(), m.per_gpu.clone())),
                cpu_milli: p.cpu_milli,
                memory_mib: p.memory_mib,
            }
        })
        .collect();
    (nodes, pods, pools)
}

enum Runner {
    Ours(Box<Ours>),
    Ca(Box<CaState>),
}

/// Runs one policy over the trace.
fn run_one(
    pools: &PoolsFile,
    trace: &[TimedPod],
    policy: PolicyName,
    mig_on: bool,
    on_progress: &mut dyn FnMut(&Progress),
) -> (RunResult, usize, usize) {
    let (mut w, cpu_only, no_life) = World::new(pools, trace);
    let end_est = w
        .pods
        .iter()
        .map(|p| p.arrival + p.remaining)
        .max()
        .unwrap_or(0);
    let idle = ms(pools.scale_down_idle);
    let config = Config {
        scale_down_idle: pools.scale_down_idle,
        ..Config::default()
    };
    let mut runner = match policy {
        PolicyName::Ours => Runner::Ours(Box::new(Ours {
            state: State::default(),
            config,
            // The MIG demand batches like the scale-up (1 s idle, 10 s max): the replay
            // compares policies at equal batching.
            mig: mig_on.then(|| {
                (
                    MigMemory::default(),
                    MigConfig {
                        batch_idle: Duration::from_secs(1),
                        batch_max: Duration::from_secs(10),
                        ..MigConfig::default()
                    },
                )
            }),
        })),
        PolicyName::StaticMig => Runner::Ours(Box::new(Ours {
            state: State::default(),
            config,
            mig: None,
        })),
        PolicyName::CaLike => Runner::Ca(Box::default()),
    };
    let mut unschedulable = 0u64;
    let mut stuck = 0u64;
    let mut events = 0u64;
    let mut last_report = 0;
    while let Some(Reverse((t, _, _))) = w.heap.peek().copied() {
        // Nothing but wake-ups for a week while pods wait: they will never run.
        let live_work = w
            .pods
            .iter()
            .any(|p| matches!(p.st, PSt::Future | PSt::Running));
        if !live_work && !w.pending.is_empty() && t > w.last_activity + 7 * 86_400_000 {
            stuck = w.pending.len() as u64;
            break;
        }
        w.advance(t);
        w.now = t;
        while let Some(Reverse((t2, _, ev))) = w.heap.peek().copied() {
            if t2 != t {
                break;
            }
            w.heap.pop();
            events += 1;
            match ev {
                Ev::Arrive(pi) => {
                    if w.feasible(pi, policy, mig_on) {
                        let p = &mut w.pods[pi];
                        p.st = PSt::Pending;
                        p.since = t;
                        w.pending.push(pi);
                    } else {
                        w.pods[pi].st = PSt::Unschedulable;
                        unschedulable += 1;
                    }
                    w.last_activity = t;
                }
                Ev::Depart(pi, epoch) => {
                    if w.pods[pi].epoch == epoch && w.pods[pi].st == PSt::Running {
                        w.unbind(pi);
                        w.pods[pi].st = PSt::Done;
                        w.last_activity = t;
                    }
                }
                Ev::Ready(_) | Ev::MigDone(_) => w.capacity_changed = true,
                Ev::Wake => {}
            }
        }
        w.bind();
        let actions = match &mut runner {
            Runner::Ours(o) => o.step(&mut w),
            Runner::Ca(c) => ca::step(c, &mut w),
        };
        w.apply(actions);
        // Evicted pods go back to the scheduler at once.
        w.bind();
        w.capacity_changed = false;
        match &mut runner {
            Runner::Ours(_) => w.schedule_idle_wakes(idle),
            Runner::Ca(c) => ca::schedule(c, &mut w),
        }
        if t >= last_report + 86_400_000 * 7 {
            last_report = t;
            on_progress(&Progress {
                policy,
                now: t,
                end: end_est,
                done: false,
            });
        }
    }
    let _ = events;
    let end = w.now;
    w.advance(end);
    on_progress(&Progress {
        policy,
        now: end,
        end: end_est,
        done: true,
    });
    (w.result(policy, unschedulable, stuck), cpu_only, no_life)
}

/// Replays `trace` on `pools` with every policy of `options`.
pub fn replay(
    pools: &PoolsFile,
    trace: &[TimedPod],
    options: &ReplayOptions,
    on_progress: &mut dyn FnMut(&Progress),
) -> Replay {
    let mut runs = Vec::new();
    let (mut cpu_only, mut no_life) = (0, 0);
    for &p in &options.policies {
        let (r, c, n) = run_one(pools, trace, p, options.mig, on_progress);
        cpu_only = c;
        no_life = n;
        runs.push(r);
    }
    Replay {
        trace_pods: trace.len(),
        gpu_pods: trace.len() - cpu_only - no_life,
        skipped_cpu_only: cpu_only,
        skipped_no_lifetime: no_life,
        mig: options.mig,
        runs,
    }
}
