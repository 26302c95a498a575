//! The five simple baselines of the FGD paper's simulator: Random, DotProd, GpuClustering,
//! GpuPacking and BestFit, with the simulator's integer score arithmetic.
//!
//! Unless a policy says otherwise the GPU choice is the simulator's default "best" selection:
//! the best-fit GPU for a shared pod, the first fully free GPUs for whole-GPU pods.

use super::{Policy, Scored};
use crate::cluster::{Cluster, GpuChoice, MILLI, PodReq, best_fit_gpu, first_free_gpus};
use crate::rng::Rng;

/// CPU normaliser of the simulator (`MaxSpecCpu`, milli).
pub const MAX_SPEC_CPU: f64 = 128_000.0;
/// GPU normaliser of the simulator (`MaxSpecGpu`, milli).
pub const MAX_SPEC_GPU: f64 = 8_000.0;
/// kube-scheduler's maximum node score.
pub const MAX_NODE_SCORE: i64 = 100;

/// Best-fit GPU for shared pods, first fully free GPUs otherwise.
#[must_use]
pub fn default_gpus(gpus: &[u16], pod: &PodReq) -> Option<GpuChoice> {
    if pod.num_gpu == 0 {
        Some(GpuChoice::NONE)
    } else if pod.is_fractional() {
        best_fit_gpu(gpus, pod.gpu_milli).map(GpuChoice::one)
    } else {
        first_free_gpus(gpus, usize::from(pod.num_gpu))
    }
}

fn scored(score: i64, gpus: Option<GpuChoice>) -> Option<Scored> {
    gpus.map(|gpus| Scored {
        score: score as f64,
        gpus,
    })
}

/// Every feasible node scores the same, so selection is uniform over feasible nodes (the
/// simulator's Random plugin picks one filtered node at random in PreScore); shared pods go to a
/// uniformly random fitting GPU.
#[derive(Debug, Clone, Copy, Default)]
pub struct RandomPolicy;

impl Policy for RandomPolicy {
    fn name(&self) -> &'static str {
        "Random"
    }

    fn uniform(&self) -> bool {
        true
    }

    fn score(&self, cluster: &Cluster, node: usize, pod: &PodReq) -> Option<Scored> {
        scored(0, default_gpus(cluster.gpus(node), pod))
    }

    fn choose_gpus(
        &self,
        cluster: &Cluster,
        node: usize,
        pod: &PodReq,
        scored: &Scored,
        rng: &mut Rng,
    ) -> GpuChoice {
        if !pod.is_fractional() {
            return scored.gpus;
        }
        let mut pick = scored.gpus;
        let mut n = 0u64;
        for (i, &f) in cluster.gpus(node).iter().enumerate() {
            if f >= pod.gpu_milli {
                n += 1;
                if rng.below(n) == 0 {
                    pick = GpuChoice::one(i);
                }
            }
        }
        pick
    }
}

/// Tetris-style dot product (`dimExt=merge`, `norm=max`): node free vector
/// (cpu/128000, gpu/8000) · pod request vector, halved; score `int(100 * (1 - product))`.
#[derive(Debug, Clone, Copy, Default)]
pub struct DotProd;

impl Policy for DotProd {
    fn name(&self) -> &'static str {
        "DotProd"
    }

    fn score(&self, cluster: &Cluster, node: usize, pod: &PodReq) -> Option<Scored> {
        let n = cluster.node(node);
        let dot = (f64::from(n.cpu_left) / MAX_SPEC_CPU)
            * (f64::from(pod.cpu_milli) / MAX_SPEC_CPU)
            + (f64::from(n.gpu_left) / MAX_SPEC_GPU)
                * (f64::from(pod.total_gpu_milli()) / MAX_SPEC_GPU);
        let s = 1.0 - dot / 2.0;
        scored(
            (MAX_NODE_SCORE as f64 * s) as i64,
            default_gpus(cluster.gpus(node), pod),
        )
    }
}

/// GpuClustering: nodes already hosting only pods of the same GPU shape score (75, 100], nodes
/// hosting that shape among others (50, 75], idle nodes (25, 50], other nodes (0, 25]; within a
/// band, less free GPU scores higher. CPU-only pods score 0 everywhere.
#[derive(Debug, Clone, Copy, Default)]
pub struct GpuClustering;

impl Policy for GpuClustering {
    fn name(&self) -> &'static str {
        "GpuClustering"
    }

    fn score(&self, cluster: &Cluster, node: usize, pod: &PodReq) -> Option<Scored> {
        let gpus = default_gpus(cluster.gpus(node), pod);
        let Some(tag) = pod.affinity_tag() else {
            return scored(0, gpus);
        };
        let n = cluster.node(node);
        let quarter = MAX_NODE_SCORE / 4;
        let used = MAX_SPEC_GPU as i64 - i64::from(n.gpu_left);
        let base = quarter * used / MAX_SPEC_GPU as i64;
        let band = if n.affinity_count(tag) > 0 {
            if n.affinity_kinds() == 1 { 3 } else { 2 }
        } else if n.affinity_kinds() == 0 {
            1
        } else {
            0
        };
        scored(base + band * quarter, gpus)
    }
}

/// GpuPacking: prefer shared GPUs already in use (score 100 minus their free share, at least 50),
/// then fully free GPUs on used nodes (50 minus GPUs used, at least 33), then idle nodes
/// (`max(33 - gpus, gpus)`). CPU-only pods score 0 everywhere.
#[derive(Debug, Clone, Copy, Default)]
pub struct GpuPacking;

impl Policy for GpuPacking {
    fn name(&self) -> &'static str {
        "GpuPacking"
    }

    fn score(&self, cluster: &Cluster, node: usize, pod: &PodReq) -> Option<Scored> {
        let free = cluster.gpus(node);
        let gpus = default_gpus(free, pod);
        if pod.num_gpu == 0 {
            return scored(0, gpus);
        }
        let n = cluster.node(node);
        let full = i64::from(n.full_free);
        if usize::from(n.full_free) == n.gpu_count() {
            return scored((MAX_NODE_SCORE / 3 - full).max(full), gpus);
        }
        // GPUs in ascending free order (stable), taking those that fit.
        let mut order: Vec<usize> = (0..free.len()).collect();
        order.sort_by_key(|&i| free[i]);
        let mut need = usize::from(pod.num_gpu);
        let mut full_used = 0i64;
        let mut free_ratio = 0i64;
        for i in order {
            if need == 0 {
                break;
            }
            if free[i] >= pod.gpu_milli {
                need -= 1;
                if u32::from(free[i]) == MILLI {
                    full_used += 1;
                }
                free_ratio += i64::from(free[i]) * 100 / i64::from(MILLI);
            }
        }
        if need != 0 {
            return None;
        }
        if full_used > 0 {
            return scored(
                (MAX_NODE_SCORE / 2 - full_used).max(MAX_NODE_SCORE / 3),
                gpus,
            );
        }
        scored(
            (MAX_NODE_SCORE - free_ratio / 10).max(MAX_NODE_SCORE / 2),
            gpus,
        )
    }
}

/// BestFit: `int(100 * (1 - ((cpu_free - cpu)/128000 + (gpu_free - gpu)/8000) / 2))`, i.e. least
/// leftover first. (The simulator's min-max normalisation keeps the order and the ties.)
#[derive(Debug, Clone, Copy, Default)]
pub struct BestFit;

impl Policy for BestFit {
    fn name(&self) -> &'static str {
        "BestFit"
    }

    fn score(&self, cluster: &Cluster, node: usize, pod: &PodReq) -> Option<Scored> {
        let n = cluster.node(node);
        let cpu = f64::from(n.cpu_left - pod.cpu_milli) / MAX_SPEC_CPU * 0.5;
        let gpu = f64::from(n.gpu_left - pod.total_gpu_milli()) / MAX_SPEC_GPU * 0.5;
        let s = (1.0 - (cpu + gpu)) * MAX_NODE_SCORE as f64;
        scored(s as i64, default_gpus(cluster.gpus(node), pod))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::ModelSet;
    use crate::trace::NodeSpec;

    fn node(name: &str, cpu: u64, gpus: u32) -> NodeSpec {
        NodeSpec {
            name: name.into(),
            cpu_milli: cpu,
            memory_mib: 1_000_000,
            gpus,
            model: "G2".into(),
        }
    }

    fn pod(cpu: u32, num: u8, milli: u16) -> PodReq {
        PodReq {
            cpu_milli: cpu,
            memory_mib: 1,
            num_gpu: num,
            gpu_milli: milli,
            models: ModelSet::ANY,
        }
    }

    fn score(p: &dyn Policy, c: &Cluster, node: usize, pod: &PodReq) -> (i64, Vec<usize>) {
        let s = p.score(c, node, pod).unwrap();
        (s.score as i64, s.gpus.to_vec())
    }

    /// Node 0: 8 GPUs, 64 cores, GPU 2 has 300 milli free, GPU 5 500. Node 1: idle 2-GPU, 16 cores.
    fn cluster() -> Cluster {
        let mut c = Cluster::new(&[node("a", 64_000, 8), node("b", 16_000, 2)]).unwrap();
        c.place(0, &pod(4_000, 1, 700), GpuChoice::one(2)).unwrap();
        c.place(0, &pod(4_000, 1, 500), GpuChoice::one(5)).unwrap();
        c
    }

    #[test]
    fn dotprod_hand_computed() {
        let c = cluster();
        let p = pod(8_000, 1, 250);
        // node a: cpu 56000, gpu 6800: (56000/128000)(8000/128000) + (6800/8000)(250/8000)
        //   = 0.02734375 + 0.0265625 = 0.05390625; 1 - /2 = 0.973046875 -> 97
        assert_eq!(score(&DotProd, &c, 0, &p), (97, vec![2]));
        // node b: (16000/128000)(8000/128000) + (2000/8000)(250/8000) = 0.0078125+0.0078125 -> 99
        assert_eq!(score(&DotProd, &c, 1, &p), (99, vec![0]));
    }

    #[test]
    fn bestfit_hand_computed() {
        let c = cluster();
        let p = pod(8_000, 1, 250);
        // node a: ((48000/128000) + (6550/8000))/2 = (0.375 + 0.81875)/2 = 0.596875 -> 40
        assert_eq!(score(&BestFit, &c, 0, &p), (40, vec![2]));
        // node b: ((8000/128000) + (1750/8000))/2 = (0.0625+0.21875)/2 = 0.140625 -> 85
        assert_eq!(score(&BestFit, &c, 1, &p), (85, vec![0]));
    }

    #[test]
    fn gpupacking_cases() {
        let c = cluster();
        // shared pod that fits the 300-milli GPU: case 1, 100 - (30)/10 = 97
        assert_eq!(score(&GpuPacking, &c, 0, &pod(1, 1, 250)), (97, vec![2]));
        // shared pod that needs the 500 GPU: 100 - 50/10 = 95
        assert_eq!(score(&GpuPacking, &c, 0, &pod(1, 1, 400)), (95, vec![5]));
        // needs a fully free GPU on a used node: 50 - 1 = 49
        assert_eq!(score(&GpuPacking, &c, 0, &pod(1, 1, 600)), (49, vec![0]));
        // 2 whole GPUs on used node: 48
        assert_eq!(
            score(&GpuPacking, &c, 0, &pod(1, 2, 1000)),
            (48, vec![0, 1])
        );
        // idle 2-GPU node: max(33 - 2, 2) = 31
        assert_eq!(score(&GpuPacking, &c, 1, &pod(1, 1, 250)), (31, vec![0]));
        // CPU pod: 0
        assert_eq!(score(&GpuPacking, &c, 1, &pod(1, 0, 0)).0, 0);
    }

    #[test]
    fn gpuclustering_bands() {
        let c = cluster();
        // node a hosts only shared pods: band 3; used = 8000 - 6800 = 1200 -> 25*1200/8000 = 3
        assert_eq!(score(&GpuClustering, &c, 0, &pod(1, 1, 100)).0, 78);
        // a 1-GPU pod on node a: other shape present only -> band 0 -> 3
        assert_eq!(score(&GpuClustering, &c, 0, &pod(1, 1, 1000)).0, 3);
        // idle node b: band 1; used = 8000 - 2000 = 6000 -> 18 + 25 = 43
        assert_eq!(score(&GpuClustering, &c, 1, &pod(1, 1, 1000)).0, 43);
        let mut c2 = c.clone();
        c2.place(0, &pod(1, 1, 1000), GpuChoice::one(0)).unwrap();
        // now node a has two shapes: band 2 for shared pods; used 2200 -> 6 + 50
        assert_eq!(score(&GpuClustering, &c2, 0, &pod(1, 1, 100)).0, 56);
        assert_eq!(score(&GpuClustering, &c2, 0, &pod(1, 0, 0)).0, 0);
    }

    #[test]
    fn random_gpu_choice_is_a_fitting_gpu() {
        let c = cluster();
        let p = pod(1, 1, 400);
        let s = RandomPolicy.score(&c, 0, &p).unwrap();
        let mut rng = Rng::new(3);
        let mut seen = std::collections::BTreeSet::new();
        for _ in 0..200 {
            let g = RandomPolicy.choose_gpus(&c, 0, &p, &s, &mut rng).to_vec();
            assert_eq!(g.len(), 1);
            assert!(c.gpus(0)[g[0]] >= 400);
            seen.insert(g[0]);
        }
        assert_eq!(seen.len(), 7); // every GPU except the 300-milli one
    }

    #[test]
    fn random_selects_uniformly_and_ties_follow_rank() {
        use super::super::{TieBreak, select};
        let c = Cluster::new(&[
            node("a", 8_000, 1),
            node("b", 8_000, 1),
            node("c", 8_000, 1),
        ])
        .unwrap();
        let p = pod(1, 1, 1000);
        let mut counts = [0u32; 3];
        let mut rng = Rng::new(9);
        let tie = TieBreak::by_index(3);
        for _ in 0..3000 {
            let pl = select(&c, &RandomPolicy, &p, &tie, &mut rng).unwrap();
            counts[pl.node] += 1;
        }
        assert!(
            counts.iter().all(|&n| (850..1150).contains(&n)),
            "{counts:?}"
        );
        // BestFit ties (all idle, equal) go to the lowest rank.
        assert_eq!(select(&c, &BestFit, &p, &tie, &mut rng).unwrap().node, 0);
        let mut r = Rng::new(5);
        let shuffled = TieBreak::shuffled(3, &mut r);
        let first = (0..3).min_by_key(|&i| shuffled.rank(i)).unwrap();
        assert_eq!(
            select(&c, &BestFit, &p, &shuffled, &mut rng).unwrap().node,
            first
        );
    }
}
