//! FGD (fragmentation gradient descent, USENIX ATC'23), measuring fragmentation against the
//! typical-pod distribution ([`super::typical`]). Score of a node: `int(100 * sigmoid((F_before - F_after) / 1000))` where F is the
//! node's fragmentation ([`super::frag`]); a shared pod tries every GPU that fits and keeps the
//! first with the highest score.

use super::frag::{FragModel, after};
use super::typical::TypicalPods;
use super::{Policy, Scored};
use crate::cluster::{Cluster, GpuChoice, PodReq, first_free_gpus};

/// FGD scoring of one node: the best GPU choice and its integer score, as in the artifact.
pub(crate) fn fgd_choice(
    frag: &FragModel,
    cluster: &Cluster,
    node: usize,
    before: f64,
    pod: &PodReq,
) -> Option<(i64, GpuChoice)> {
    let n = cluster.node(node);
    let gpus = cluster.gpus(node);
    let cpu_after = n.cpu_left - pod.cpu_milli;
    let score = |f_after: f64| (100.0 * sigmoid((before - f_after) / 1000.0)) as i64;
    let mut buf = [0u16; 64];
    if pod.is_fractional() {
        let mut best: Option<(i64, usize)> = None;
        for (i, &f) in gpus.iter().enumerate() {
            if f < pod.gpu_milli || gpus[..i].contains(&f) {
                continue; // does not fit, or same state as an earlier GPU (same score)
            }
            let len = after(gpus, 1u64 << i, pod.gpu_milli, &mut buf);
            let s = score(frag.frag(n.model, cpu_after, &buf[..len]));
            if best.is_none_or(|(b, _)| s > b) {
                best = Some((s, i));
            }
        }
        best.map(|(s, i)| (s, GpuChoice::one(i)))
    } else {
        let choice = if pod.num_gpu == 0 {
            GpuChoice::NONE
        } else {
            first_free_gpus(gpus, usize::from(pod.num_gpu))?
        };
        let len = after(gpus, choice.0, pod.gpu_milli, &mut buf);
        Some((score(frag.frag(n.model, cpu_after, &buf[..len])), choice))
    }
}

pub(crate) fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

/// The FGD policy with a per-node cache of the current fragmentation.
#[derive(Debug, Clone)]
pub struct Fgd {
    frag: FragModel,
    current: Vec<f64>,
}

impl Fgd {
    /// Builds FGD for `cluster`'s current state.
    #[must_use]
    pub fn new(cluster: &Cluster, typical: &TypicalPods) -> Self {
        let frag = FragModel::new(cluster, typical);
        let current = (0..cluster.len())
            .map(|i| frag.node_frag(cluster, i))
            .collect();
        Self { frag, current }
    }
}

impl Policy for Fgd {
    fn name(&self) -> &'static str {
        "FGD"
    }

    fn score(&self, cluster: &Cluster, node: usize, pod: &PodReq) -> Option<Scored> {
        let (s, gpus) = fgd_choice(&self.frag, cluster, node, self.current[node], pod)?;
        Some(Scored {
            score: s as f64,
            gpus,
        })
    }

    fn on_place(&mut self, cluster: &Cluster, node: usize) {
        self.current[node] = self.frag.node_frag(cluster, node);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::{NodeSpec, PodSpec};

    fn spec_pod(cpu: u64, num: u32, milli: u32) -> PodSpec {
        PodSpec {
            name: "p".into(),
            cpu_milli: cpu,
            memory_mib: 1,
            num_gpu: num,
            gpu_milli: milli,
            gpu_spec: vec![],
        }
    }

    fn cluster(gpus: u32) -> Cluster {
        Cluster::new(&[NodeSpec {
            name: "a".into(),
            cpu_milli: 32_000,
            memory_mib: 100_000,
            gpus,
            model: "T4".into(),
        }])
        .unwrap()
    }

    #[test]
    fn typical_pods_cover_threshold_and_normalise() {
        let c = cluster(2);
        let mut pods = Vec::new();
        pods.extend(std::iter::repeat_n(spec_pod(1000, 1, 500), 60));
        pods.extend(std::iter::repeat_n(spec_pod(2000, 1, 1000), 36));
        pods.extend(std::iter::repeat_n(spec_pod(3000, 0, 0), 3));
        pods.push(spec_pod(4000, 2, 1000));
        let t = TypicalPods::from_trace(&c, &pods);
        // 60 + 36 = 96 >= 95: two shapes.
        assert_eq!(t.pods.len(), 2);
        assert!((t.pods[0].weight - 60.0 / 96.0).abs() < 1e-12);
        assert_eq!(t.pods[1].gpu_milli, 1000);
    }

    #[test]
    fn frag_hand_computed() {
        // Typical: 50% half-GPU pods (cpu 1000), 50% whole-GPU pods (cpu 1000).
        let c = cluster(2);
        let mut pods = Vec::new();
        pods.extend(std::iter::repeat_n(spec_pod(1000, 1, 500), 50));
        pods.extend(std::iter::repeat_n(spec_pod(1000, 1, 1000), 50));
        let t = TypicalPods::from_trace(&c, &pods);
        let f = FragModel::new(&c, &t);
        // Free [1000, 1000]: nothing is fragment.
        assert_eq!(f.frag(Some(0), 32_000, &[1000, 1000]), 0.0);
        // Free [1000, 300]: half pods see 300 as fragment, whole pods see 300 as fragment.
        assert!((f.frag(Some(0), 32_000, &[1000, 300]) - 300.0).abs() < 1e-9);
        // Free [600, 300]: half: 300 is fragment; whole: cannot run -> all 900.
        assert!((f.frag(Some(0), 32_000, &[600, 300]) - (0.5 * 300.0 + 0.5 * 900.0)).abs() < 1e-9);
        // No CPU left: everything is fragment.
        assert!((f.frag(Some(0), 0, &[600, 300]) - 900.0).abs() < 1e-9);
    }

    #[test]
    fn fgd_prefers_the_gpu_that_keeps_whole_gpus_usable() {
        let mut c = cluster(2);
        let mut pods = Vec::new();
        pods.extend(std::iter::repeat_n(spec_pod(1000, 1, 500), 50));
        pods.extend(std::iter::repeat_n(spec_pod(1000, 1, 1000), 50));
        let t = TypicalPods::from_trace(&c, &pods);
        let half = c.resolve(&spec_pod(1000, 1, 500));
        c.place(0, &half, GpuChoice::one(1)).unwrap();
        let mut fgd = Fgd::new(&c, &t);
        fgd.on_place(&c, 0);
        // Free [1000, 500]: F = whole pods see 500 as fragment = 0.5*500 = 250. Another half pod
        // on GPU 1 -> [1000, 0]: F = 0, delta +250 -> int(100*sigmoid(0.25)) = 56; on GPU 0 ->
        // [500, 500]: whole pods cannot run -> 0.5*1000 = 500, delta -250 -> 43.
        let s = fgd.score(&c, 0, &half).unwrap();
        assert_eq!(s.gpus.to_vec(), vec![1]);
        assert_eq!(s.score as i64, 56);
        let quarter = c.resolve(&spec_pod(1000, 1, 250));
        // Quarter pod: GPU 1 -> [1000, 250]: half sees 250 frag, whole sees 250: F=250, before: F
        // of [1000,500] = half: 0, whole: 500*0.5 = 250 -> delta 0 -> 50.
        // GPU 0 -> [750, 500]: half 0, whole: cannot -> 0.5*1250 = 625 -> delta -375 -> 40.
        let s = fgd.score(&c, 0, &quarter).unwrap();
        assert_eq!((s.score as i64, s.gpus.to_vec()), (50, vec![1]));
    }
}
