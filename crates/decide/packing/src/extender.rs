//! The scheduler-extender and device-plugin entry points: filter nodes for a pod, score them
//! 0..=100 with any policy, and pick GPUs on one node with our GPU-level rule.
//!
//! The HTTP layer (kube-scheduler extender `filter` / `prioritize` verbs) and the device plugin's
//! `GetPreferredAllocation` live in the binary; these functions are their pure core.

use crate::cluster::{Cluster, GpuChoice, MILLI, PodReq};
use crate::policy::{Policy, TypicalPods, ours};
use serde::Serialize;

/// Outcome of filtering: nodes that fit and, for the others, why not.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
pub struct FilterResult {
    /// Indices of fitting nodes, in the order given.
    pub fit: Vec<usize>,
    /// (index, reason) of nodes that do not fit.
    pub failed: Vec<(usize, String)>,
}

/// A node's extender priority (0..=100, higher preferred).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct HostScore {
    /// Node index.
    pub node: usize,
    /// Score in 0..=100.
    pub score: i64,
}

/// Why `pod` does not fit node `i`, or None when it fits.
#[must_use]
pub fn misfit(cluster: &Cluster, i: usize, pod: &PodReq) -> Option<String> {
    let n = cluster.node(i);
    if n.cpu_left < pod.cpu_milli {
        return Some(format!(
            "insufficient cpu: {}m free, {}m requested",
            n.cpu_left, pod.cpu_milli
        ));
    }
    if n.memory_left < pod.memory_mib {
        return Some(format!(
            "insufficient memory: {} MiB free, {} MiB requested",
            n.memory_left, pod.memory_mib
        ));
    }
    if pod.num_gpu == 0 {
        return None;
    }
    if !pod.models.allows(n.model) {
        let model = n
            .model
            .and_then(|m| cluster.models().get(usize::from(m)))
            .map_or("none", String::as_str);
        return Some(format!("GPU model {model} not accepted by the pod"));
    }
    if pod.is_fractional() {
        if n.max_gpu_free < pod.gpu_milli {
            return Some(format!(
                "no GPU with {} milli free (most free: {})",
                pod.gpu_milli, n.max_gpu_free
            ));
        }
    } else if n.full_free < pod.num_gpu {
        return Some(format!(
            "{} fully free GPUs, {} requested",
            n.full_free, pod.num_gpu
        ));
    }
    None
}

/// Filters `candidates` (node indices) for `pod`.
#[must_use]
pub fn filter(cluster: &Cluster, pod: &PodReq, candidates: &[usize]) -> FilterResult {
    let mut out = FilterResult::default();
    for &i in candidates {
        if i >= cluster.len() {
            out.failed.push((i, "unknown node".into()));
            continue;
        }
        match misfit(cluster, i, pod) {
            None => out.fit.push(i),
            Some(r) => out.failed.push((i, r)),
        }
    }
    out
}

/// Scores `candidates` for `pod` with `policy`, min-max normalised to 0..=100 (the best node gets
/// 100; all equal gives 100 for all). Nodes that do not fit score 0.
#[must_use]
pub fn prioritize(
    cluster: &Cluster,
    policy: &dyn Policy,
    pod: &PodReq,
    candidates: &[usize],
) -> Vec<HostScore> {
    let raw: Vec<Option<f64>> = candidates
        .iter()
        .map(|&i| {
            (i < cluster.len() && cluster.fits(i, pod))
                .then(|| policy.score(cluster, i, pod).map(|s| s.score))
                .flatten()
        })
        .collect();
    let (lo, hi) = raw
        .iter()
        .flatten()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(l, h), &v| {
            (l.min(v), h.max(v))
        });
    candidates
        .iter()
        .zip(raw)
        .map(|(&node, r)| {
            let score = match r {
                None => 0,
                Some(_) if hi - lo <= f64::EPSILON * hi.abs().max(1.0) => 100,
                Some(v) => (100.0 * (v - lo) / (hi - lo)).round() as i64,
            };
            HostScore { node, score }
        })
        .collect()
}

/// GPUs our policy would use for a pod on a node whose GPUs have `gpu_free` milli free (the
/// device plugin's `GetPreferredAllocation`). With a typical-pod distribution the choice
/// minimises the node's fragmentation (see [`ours`]); without one it is the best-fit GPU for a
/// shared pod and the fully free GPUs in index order for whole-GPU pods. None when the pod does
/// not fit.
#[must_use]
pub fn preferred_gpus(
    gpu_free: &[u16],
    num_gpu: u8,
    gpu_milli: u16,
    typical: Option<&TypicalPods>,
) -> Option<Vec<usize>> {
    let choice: GpuChoice =
        ours::gpu_choice(gpu_free, num_gpu, gpu_milli.min(MILLI as u16), typical)?;
    Some(choice.to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::ModelSet;
    use crate::policy::baselines::BestFit;
    use crate::trace::NodeSpec;

    fn cluster() -> Cluster {
        let spec = |n: &str, cpu, g, m: &str| NodeSpec {
            name: n.into(),
            cpu_milli: cpu,
            memory_mib: 1000,
            gpus: g,
            model: m.into(),
        };
        Cluster::new(&[
            spec("a", 8000, 2, "T4"),
            spec("b", 2000, 2, "T4"),
            spec("c", 8000, 1, "A10"),
        ])
        .unwrap()
    }

    fn pod(cpu: u32, num: u8, milli: u16, models: ModelSet) -> PodReq {
        PodReq {
            cpu_milli: cpu,
            memory_mib: 10,
            num_gpu: num,
            gpu_milli: milli,
            models,
        }
    }

    #[test]
    fn filter_reports_reasons() {
        let c = cluster();
        let t4 = ModelSet {
            any: false,
            mask: 1,
        };
        let r = filter(&c, &pod(4000, 1, 500, t4), &[0, 1, 2, 9]);
        assert_eq!(r.fit, vec![0]);
        assert!(r.failed[0].1.starts_with("insufficient cpu"));
        assert!(r.failed[1].1.contains("GPU model A10"));
        assert_eq!(r.failed[2].1, "unknown node");
        let r = filter(&c, &pod(1000, 2, 1000, ModelSet::ANY), &[0, 2]);
        assert_eq!(r.fit, vec![0]);
        assert_eq!(r.failed[0].1, "1 fully free GPUs, 2 requested");
    }

    #[test]
    fn prioritize_normalises() {
        let c = cluster();
        let p = pod(1000, 1, 500, ModelSet::ANY);
        let s = prioritize(&c, &BestFit, &p, &[0, 1, 2]);
        // BestFit raw: a: 1-((7000/128000)+(1500/8000))/2 -> 87; b: 1000 cpu left -> 90;
        // c: 7000 cpu, 500 gpu -> 94.
        assert_eq!(
            s.iter().map(|h| h.score).collect::<Vec<_>>(),
            vec![0, 43, 100]
        );
        let s = prioritize(&c, &BestFit, &pod(9000, 0, 0, ModelSet::ANY), &[0]);
        assert_eq!(s[0].score, 0);
    }

    #[test]
    fn preferred_gpus_without_distribution_is_best_fit() {
        assert_eq!(
            preferred_gpus(&[1000, 300, 600], 1, 250, None),
            Some(vec![1])
        );
        assert_eq!(
            preferred_gpus(&[1000, 300, 1000], 2, 1000, None),
            Some(vec![0, 2])
        );
        assert_eq!(preferred_gpus(&[1000, 300], 2, 1000, None), None);
        assert_eq!(preferred_gpus(&[1000], 0, 0, None), Some(vec![]));
    }
}
