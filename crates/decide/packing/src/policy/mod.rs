//! Scheduling policies behind one trait, and the node selection loop shared by the simulator and
//! the scheduler extender.
//!
//! A policy scores one feasible node for one pod (higher is better) and names the GPU(s) it would
//! use there. Selection takes the highest score; exact ties go to the node with the lowest rank in
//! a [`TieBreak`] order. That is what the FGD artifact does: its vendored kube-scheduler
//! `selectHost` picks the lexicographically smallest node name among equal scores, and node names
//! are prefixed with a seeded random permutation index, so ties go to the first node of a random
//! (per-seed) but fixed order. (Upstream kube-scheduler breaks ties uniformly at random instead;
//! for policies with coarse integer scores this difference is worth several points.)

pub mod baselines;
pub mod fgd;
pub mod frag;
pub mod ours;
pub mod typical;

use crate::cluster::{Cluster, GpuChoice, PodReq};
use crate::error::{PackingError, Result};
use crate::rng::Rng;
use crate::trace::PodSpec;
use serde::Serialize;

pub use typical::TypicalPods;

/// A node's score for a pod and the GPUs the policy would use on it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Scored {
    /// Higher is better; equal scores are ties.
    pub score: f64,
    /// GPUs on the node (empty for CPU-only pods).
    pub gpus: GpuChoice,
}

/// A chosen node and GPUs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Placement {
    /// Node index in the cluster.
    pub node: usize,
    /// GPUs on that node.
    pub gpus: GpuChoice,
}

/// A packing policy.
pub trait Policy: Send {
    /// Display name (e.g. `"FGD"`).
    fn name(&self) -> &'static str;

    /// Scores node `node` for `pod`. Called only for nodes where `cluster.fits(node, pod)`;
    /// returns None if the policy refuses the node. Must only read node `node`'s state (plus
    /// per-run constants), so that it costs O(GPUs on the node).
    fn score(&self, cluster: &Cluster, node: usize, pod: &PodReq) -> Option<Scored>;

    /// Final GPU choice on the selected node (default: the one returned by [`Policy::score`]).
    /// Random GPU selection overrides this.
    fn choose_gpus(
        &self,
        _cluster: &Cluster,
        _node: usize,
        _pod: &PodReq,
        scored: &Scored,
        _rng: &mut Rng,
    ) -> GpuChoice {
        scored.gpus
    }

    /// Called after a pod was placed on `node`, for policies with per-node caches.
    fn on_place(&mut self, _cluster: &Cluster, _node: usize) {}

    /// True when the node is picked uniformly at random among feasible nodes (the Random
    /// baseline); scores are then ignored.
    fn uniform(&self) -> bool {
        false
    }
}

/// Tie-break order of nodes: among equal scores the node with the lowest rank wins.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TieBreak {
    rank: Vec<u32>,
}

impl TieBreak {
    /// Index order (node 0 first), e.g. for the scheduler extender.
    #[must_use]
    pub fn by_index(nodes: usize) -> Self {
        Self {
            rank: (0..nodes)
                .map(|i| u32::try_from(i).unwrap_or(u32::MAX))
                .collect(),
        }
    }

    /// A random permutation drawn from `rng` (the artifact's per-seed node-name prefixes).
    #[must_use]
    pub fn shuffled(nodes: usize, rng: &mut Rng) -> Self {
        let mut rank: Vec<u32> = (0..nodes)
            .map(|i| u32::try_from(i).unwrap_or(u32::MAX))
            .collect();
        rng.shuffle(&mut rank);
        Self { rank }
    }

    /// Rank of node `i` (lower wins ties); nodes beyond the order rank last.
    #[must_use]
    pub fn rank(&self, i: usize) -> u32 {
        self.rank.get(i).copied().unwrap_or(u32::MAX)
    }
}

/// Picks a node (and GPUs) for `pod`: the best score over all feasible nodes, ties to the lowest
/// rank of `tie`. Policies that select uniformly ([`Policy::uniform`]) draw from `rng`, which
/// also serves random GPU choices. None when the pod fits nowhere.
pub fn select(
    cluster: &Cluster,
    policy: &dyn Policy,
    pod: &PodReq,
    tie: &TieBreak,
    rng: &mut Rng,
) -> Option<Placement> {
    let mut best: Option<(usize, Scored)> = None;
    if policy.uniform() {
        let mut seen = 0u64;
        for i in 0..cluster.len() {
            if cluster.fits(i, pod) {
                seen += 1;
                if rng.below(seen) == 0 {
                    best = policy.score(cluster, i, pod).map(|s| (i, s)).or(best);
                }
            }
        }
    } else {
        for i in 0..cluster.len() {
            if !cluster.fits(i, pod) {
                continue;
            }
            let Some(s) = policy.score(cluster, i, pod) else {
                continue;
            };
            let better = match &best {
                None => true,
                Some((b, bs)) => {
                    s.score > bs.score || (s.score == bs.score && tie.rank(i) < tie.rank(*b))
                }
            };
            if better {
                best = Some((i, s));
            }
        }
    }
    let (node, scored) = best?;
    let gpus = policy.choose_gpus(cluster, node, pod, &scored, rng);
    Some(Placement { node, gpus })
}

/// The policies this crate implements.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub enum PolicyKind {
    /// Random feasible node; random fitting GPU for shared pods.
    Random,
    /// Tetris dot product of free and requested (CPU, GPU), smallest product first.
    DotProd,
    /// Group pods of the same GPU shape on the same nodes.
    GpuClustering,
    /// Prefer shared GPUs, then partially used nodes, then idle nodes.
    GpuPacking,
    /// Least leftover (CPU, GPU) after placement.
    BestFit,
    /// Fragmentation gradient descent (USENIX ATC'23).
    Fgd,
    /// Ours: exact fragmentation gradient with look-ahead tie-breaking (see docs/packing.md).
    Ours,
}

impl PolicyKind {
    /// Every policy, baselines first.
    pub const ALL: [PolicyKind; 7] = [
        PolicyKind::Random,
        PolicyKind::DotProd,
        PolicyKind::GpuClustering,
        PolicyKind::GpuPacking,
        PolicyKind::BestFit,
        PolicyKind::Fgd,
        PolicyKind::Ours,
    ];

    /// The six published baselines.
    pub const BASELINES: [PolicyKind; 6] = [
        PolicyKind::Random,
        PolicyKind::DotProd,
        PolicyKind::GpuClustering,
        PolicyKind::GpuPacking,
        PolicyKind::BestFit,
        PolicyKind::Fgd,
    ];

    /// Display name.
    #[must_use]
    pub fn name(&self) -> &'static str {
        match self {
            PolicyKind::Random => "Random",
            PolicyKind::DotProd => "DotProd",
            PolicyKind::GpuClustering => "GpuClustering",
            PolicyKind::GpuPacking => "GpuPacking",
            PolicyKind::BestFit => "BestFit",
            PolicyKind::Fgd => "FGD",
            PolicyKind::Ours => "Ours",
        }
    }

    /// Parses one policy name (case-insensitive; `-`/`_` ignored).
    ///
    /// # Errors
    /// [`PackingError::UnknownPolicy`].
    pub fn parse(s: &str) -> Result<Self> {
        let k: String = s
            .chars()
            .filter(|c| *c != '-' && *c != '_')
            .collect::<String>()
            .to_ascii_lowercase();
        Ok(match k.as_str() {
            "random" => PolicyKind::Random,
            "dotprod" | "dotproduct" => PolicyKind::DotProd,
            "gpuclustering" | "clustering" => PolicyKind::GpuClustering,
            "gpupacking" | "packing" => PolicyKind::GpuPacking,
            "bestfit" => PolicyKind::BestFit,
            "fgd" => PolicyKind::Fgd,
            "ours" => PolicyKind::Ours,
            _ => return Err(PackingError::UnknownPolicy(s.to_string())),
        })
    }

    /// Parses a comma-separated list, or `all`.
    ///
    /// # Errors
    /// [`PackingError::UnknownPolicy`].
    pub fn parse_list(s: &str) -> Result<Vec<Self>> {
        if s.trim().eq_ignore_ascii_case("all") {
            return Ok(Self::ALL.to_vec());
        }
        s.split(',')
            .filter(|p| !p.trim().is_empty())
            .map(|p| Self::parse(p.trim()))
            .collect()
    }

    /// True when the policy needs the typical-pod distribution.
    #[must_use]
    pub fn needs_typical_pods(&self) -> bool {
        matches!(self, PolicyKind::Fgd | PolicyKind::Ours)
    }

    /// Builds the policy for `cluster`'s current state. `workload` is the trace's pod list, from
    /// which FGD and ours derive the typical-pod distribution (ignored by the others).
    #[must_use]
    pub fn build(&self, cluster: &Cluster, workload: &[PodSpec]) -> Box<dyn Policy> {
        let typical = || TypicalPods::from_trace(cluster, workload);
        self.build_with(cluster, typical)
    }

    /// As [`PolicyKind::build`] with a precomputed typical-pod distribution.
    #[must_use]
    pub fn build_with_typical(&self, cluster: &Cluster, typical: &TypicalPods) -> Box<dyn Policy> {
        self.build_with(cluster, || typical.clone())
    }

    fn build_with(
        &self,
        cluster: &Cluster,
        typical: impl FnOnce() -> TypicalPods,
    ) -> Box<dyn Policy> {
        match self {
            PolicyKind::Random => Box::new(baselines::RandomPolicy),
            PolicyKind::DotProd => Box::new(baselines::DotProd),
            PolicyKind::GpuClustering => Box::new(baselines::GpuClustering),
            PolicyKind::GpuPacking => Box::new(baselines::GpuPacking),
            PolicyKind::BestFit => Box::new(baselines::BestFit),
            PolicyKind::Fgd => Box::new(fgd::Fgd::new(cluster, &typical())),
            PolicyKind::Ours => Box::new(ours::Ours::new(cluster, &typical())),
        }
    }
}

impl std::fmt::Display for PolicyKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_names() {
        assert_eq!(PolicyKind::parse("FGD").unwrap(), PolicyKind::Fgd);
        assert_eq!(PolicyKind::parse("best-fit").unwrap(), PolicyKind::BestFit);
        assert_eq!(PolicyKind::parse_list("all").unwrap().len(), 7);
        assert_eq!(
            PolicyKind::parse_list("fgd,ours").unwrap(),
            vec![PolicyKind::Fgd, PolicyKind::Ours]
        );
        assert!(matches!(
            PolicyKind::parse("tetris"),
            Err(PackingError::UnknownPolicy(_))
        ));
    }
}
