//! Which pods to move to free GPUs on one node, computed against the cluster state: every moved
//! pod must fit on another node (its nodeSelector/affinity, its tolerations, free GPUs there), and
//! the room planned for one pending pod is not offered to the next.

use crate::cluster::{Cluster, NodeView, PodView};
use crate::fit;
use std::collections::HashMap;

/// Target nodes tried per pending pod (the closest to fitting first); keeps a cluster with
/// thousands of fragmented pods fast.
const TARGETS: usize = 4;

/// One planned move: pod (index into `Cluster::gpu_pods`) to node (index into `Cluster::nodes`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Move {
    pub pod: usize,
    pub to: usize,
    pub gpus: i64,
}

/// Moves that give a pending pod its GPUs on `target`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Plan {
    pub target: usize,
    pub moves: Vec<Move>,
}

/// Free GPUs per node and resource after the moves planned so far.
#[derive(Debug, Default)]
pub(crate) struct Ledger {
    /// node -> resource -> free, where a plan changed it.
    free: HashMap<usize, HashMap<String, i64>>,
    /// Pods already planned to move (not moved twice).
    moved: std::collections::HashSet<usize>,
    /// Per resource: the GPU nodes that are up and offer it (where a moved pod may go).
    hosts: HashMap<String, Vec<usize>>,
}

impl Ledger {
    pub fn new(_c: &Cluster<'_>) -> Ledger {
        Ledger::default()
    }

    fn free(&self, c: &Cluster<'_>, node: usize, r: &str) -> i64 {
        self.free
            .get(&node)
            .and_then(|m| m.get(r))
            .copied()
            .unwrap_or_else(|| c.nodes[node].free(r))
    }

    fn add(&mut self, c: &Cluster<'_>, node: usize, r: &str, delta: i64) {
        let now = self.free(c, node, r);
        self.free
            .entry(node)
            .or_default()
            .insert(r.to_string(), now + delta);
    }

    /// The fewest moves that free `need` of `r` on one of `candidates` for `pod`, committed to
    /// the ledger; `None` when no such set exists.
    pub fn plan(
        &mut self,
        c: &Cluster<'_>,
        pod: &PodView<'_>,
        r: &str,
        need: i64,
        candidates: &[&NodeView<'_>],
    ) -> Option<Plan> {
        let index = |n: &NodeView<'_>| c.node_index.get(n.name).copied();
        // Enough free in all? (stops counting once it is)
        let mut total = 0;
        for i in candidates.iter().filter_map(|n| index(n)) {
            total += self.free(c, i, r);
            if total >= need {
                break;
            }
        }
        if total < need {
            return None;
        }
        let mut targets: Vec<(i64, usize)> = candidates
            .iter()
            .filter(|n| n.allocatable_of(r) >= need)
            .filter_map(|n| index(n))
            .map(|i| (need - self.free(c, i, r), i))
            .collect();
        // The few closest to fitting, without sorting thousands.
        if targets.len() > TARGETS {
            targets.select_nth_unstable(TARGETS);
            targets.truncate(TARGETS);
        }
        targets.sort_unstable();
        // Nodes that can take a moved pod at all, found once per resource.
        if !self.hosts.contains_key(r) {
            let list: Vec<usize> = c
                .nodes
                .iter()
                .enumerate()
                .filter(|(_, n)| n.is_gpu && n.offers(r) && n.unavailable().is_none())
                .map(|(i, _)| i)
                .collect();
            self.hosts.insert(r.to_string(), list);
        }
        let hosts = std::mem::take(self.hosts.entry(r.to_string()).or_default());
        let mut best: Option<Plan> = None;
        for &(missing, t) in targets.iter().take(TARGETS) {
            if missing <= 0 {
                best = Some(Plan {
                    target: t,
                    moves: Vec::new(),
                });
                break;
            }
            if let Some(plan) = self.plan_on(c, pod, r, t, missing, &hosts)
                && best
                    .as_ref()
                    .is_none_or(|b| plan.moves.len() < b.moves.len())
            {
                best = Some(plan);
            }
        }
        self.hosts.insert(r.to_string(), hosts);
        let plan = best?;
        let moved: i64 = plan.moves.iter().map(|m| m.gpus).sum();
        self.add(c, plan.target, r, moved - need);
        for m in &plan.moves {
            self.add(c, m.to, r, -m.gpus);
            self.moved.insert(m.pod);
        }
        Some(plan)
    }

    fn plan_on(
        &self,
        c: &Cluster<'_>,
        pod: &PodView<'_>,
        r: &str,
        target: usize,
        missing: i64,
        hosts: &[usize],
    ) -> Option<Plan> {
        let t = &c.nodes[target];
        // Pods a controller recreates (deleting a bare pod loses it), holding `r` here.
        let mut victims: Vec<(i64, usize)> = t
            .gpu_pods
            .iter()
            .copied()
            .filter(|i| !self.moved.contains(i))
            .filter(|&i| {
                let q = &c.gpu_pods[i];
                !(q.namespace == pod.namespace && q.name == pod.name) && recreated(q)
            })
            .filter_map(|i| c.gpu_pods[i].gpus.get(r).map(|n| (*n, i)))
            .filter(|(n, _)| *n > 0)
            .collect();
        // Fewest moves: one pod just big enough, else the largest first.
        victims.sort_unstable();
        let chosen: Vec<(i64, usize)> = match victims.iter().find(|(n, _)| *n >= missing) {
            Some(v) => vec![*v],
            None => {
                let mut out = Vec::new();
                let mut freed = 0;
                for v in victims.iter().rev() {
                    if freed >= missing {
                        break;
                    }
                    freed += v.0;
                    out.push(*v);
                }
                if freed < missing {
                    return None;
                }
                out
            }
        };
        let mut taken: HashMap<usize, i64> = HashMap::new();
        let mut moves = Vec::new();
        for (gpus, q) in chosen {
            let qv = &c.gpu_pods[q];
            // Best fit (the node left fullest), stopping at an exact fit.
            let mut to: Option<(i64, usize)> = None;
            for &u in hosts {
                if u == target {
                    continue;
                }
                let slack = self.free(c, u, r) - taken.get(&u).copied().unwrap_or(0) - gpus;
                if slack < 0 || to.is_some_and(|(best, _)| slack >= best) {
                    continue;
                }
                let n = &c.nodes[u];
                if fit::selects(qv.pod, n.name, n.labels) && fit::tolerates_all(qv.pod, &n.taints) {
                    to = Some((slack, u));
                    if slack == 0 {
                        break;
                    }
                }
            }
            let (_, to) = to?;
            *taken.entry(to).or_default() += gpus;
            moves.push(Move { pod: q, to, gpus });
        }
        Some(Plan { target, moves })
    }
}

/// Whether deleting the pod makes its controller create it again (ReplicaSet, StatefulSet, Job...;
/// not a DaemonSet, whose pod comes back on the same node).
fn recreated(p: &PodView<'_>) -> bool {
    p.pod
        .metadata
        .owner_references
        .iter()
        .flatten()
        .any(|o| o.controller == Some(true) && o.kind != "DaemonSet" && o.kind != "Node")
}
