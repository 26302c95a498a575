//! The FGD fragmentation measure of one node against a typical-pod distribution.
//!
//! For each typical pod t (probability p_t), the node's free GPU milli L counts as fragment when t
//! cannot run on the node (GPU model, CPU or GPU shortage) or t is CPU-only; when t can run, only
//! the GPUs with less free milli than t requests per GPU count. The node's fragmentation is
//! `F = sum_t p_t * frag_t`. Typical pods are folded per GPU model into groups of equal GPU shape
//! (milli per GPU, GPU count) with their CPU requests sorted, so evaluating F costs
//! O(groups x GPUs on the node) however many typical pods there are.

use super::typical::TypicalPods;
use crate::cluster::{Cluster, ModelId};

#[derive(Debug, Clone)]
struct Group {
    milli: u16,
    num: u8,
    /// CPU requests ascending, and the cumulative probability up to each.
    cpu: Vec<u32>,
    cum: Vec<f64>,
    total: f64,
}

impl Group {
    /// Probability of the group's typical pods whose CPU request fits in `cpu_left`.
    fn fitting(&self, cpu_left: u32) -> f64 {
        let k = self.cpu.partition_point(|&c| c <= cpu_left);
        if k == 0 { 0.0 } else { self.cum[k - 1] }
    }
}

#[derive(Debug, Clone, Default)]
struct PerModel {
    /// Probability of typical pods that always see all free GPU as fragment on this model
    /// (CPU-only typical pods and those that do not accept the model).
    always: f64,
    groups: Vec<Group>,
}

/// Precomputed fragmentation evaluator for one cluster's models and one typical-pod list.
#[derive(Debug, Clone)]
pub struct FragModel {
    per_model: Vec<PerModel>,
}

impl FragModel {
    /// Folds `typical` per model of `cluster`.
    #[must_use]
    pub fn new(cluster: &Cluster, typical: &TypicalPods) -> Self {
        let mut per_model = Vec::with_capacity(cluster.models().len());
        for m in 0..cluster.models().len() {
            let model = ModelId::try_from(m).ok();
            let mut pm = PerModel::default();
            let mut raw: Vec<(u16, u8, u32, f64)> = Vec::new();
            for t in &typical.pods {
                if t.num_gpu == 0 || !t.models.allows(model) {
                    pm.always += t.weight;
                } else {
                    raw.push((t.gpu_milli, t.num_gpu, t.cpu_milli, t.weight));
                }
            }
            raw.sort_by_key(|a| (a.0, a.1, a.2));
            for (milli, num, cpu, w) in raw {
                let start_new = pm
                    .groups
                    .last()
                    .is_none_or(|g| g.milli != milli || g.num != num);
                if start_new {
                    pm.groups.push(Group {
                        milli,
                        num,
                        cpu: Vec::new(),
                        cum: Vec::new(),
                        total: 0.0,
                    });
                }
                if let Some(g) = pm.groups.last_mut() {
                    g.total += w;
                    g.cpu.push(cpu);
                    g.cum.push(g.total);
                }
            }
            per_model.push(pm);
        }
        Self { per_model }
    }

    /// A single-model evaluator that treats every typical pod as accepting the model (model id 0),
    /// for callers that know only a node's GPUs (the device plugin).
    #[must_use]
    pub fn ignoring_models(typical: &TypicalPods) -> Self {
        let mut t = typical.clone();
        for p in &mut t.pods {
            p.models = crate::cluster::ModelSet::ANY;
        }
        let spec = crate::trace::NodeSpec {
            name: String::new(),
            cpu_milli: 0,
            memory_mib: 0,
            gpus: 0,
            model: "any".into(),
        };
        match Cluster::new(&[spec]) {
            Ok(c) => Self::new(&c, &t),
            Err(_) => Self {
                per_model: Vec::new(),
            },
        }
    }

    /// Fragmentation (expected fragmented GPU milli) of a node with GPU `model`, `cpu_left` free
    /// CPU and per-GPU free milli `gpus`.
    #[must_use]
    pub fn frag(&self, model: Option<ModelId>, cpu_left: u32, gpus: &[u16]) -> f64 {
        let Some(pm) = model.and_then(|m| self.per_model.get(usize::from(m))) else {
            return 0.0;
        };
        let total: u32 = gpus.iter().map(|&g| u32::from(g)).sum();
        if total == 0 {
            return 0.0;
        }
        let l = f64::from(total);
        let mut f = pm.always * l;
        for g in &pm.groups {
            let mut count = 0u32;
            let mut below = 0u32;
            for &free in gpus {
                if free >= g.milli {
                    count += 1;
                } else {
                    below += u32::from(free);
                }
            }
            if count >= u32::from(g.num) {
                let p = g.fitting(cpu_left);
                f += p * f64::from(below) + (g.total - p) * l;
            } else {
                f += g.total * l;
            }
        }
        f
    }

    /// Fragmentation of node `node` of `cluster` in its current state.
    #[must_use]
    pub fn node_frag(&self, cluster: &Cluster, node: usize) -> f64 {
        let n = cluster.node(node);
        self.frag(n.model, n.cpu_left, cluster.gpus(node))
    }
}

/// Copies `gpus` to a stack buffer and subtracts `milli` from the GPUs in `choice`.
pub(crate) fn after(gpus: &[u16], choice: u64, milli: u16, buf: &mut [u16; 64]) -> usize {
    let n = gpus.len();
    buf[..n].copy_from_slice(gpus);
    for (i, b) in buf[..n].iter_mut().enumerate() {
        if choice & (1u64 << i) != 0 {
            *b -= milli;
        }
    }
    n
}
