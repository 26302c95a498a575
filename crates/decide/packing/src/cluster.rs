//! Cluster model with incremental state: per-node free CPU, memory and per-GPU free milli,
//! plus the aggregates the policies read (free GPU milli, fully-free GPUs, GPU "affinity" tags).
//!
//! Scoring a node only ever looks at that node's own state, so it costs O(GPUs on the node).

use crate::error::{PackingError, Result};
use crate::trace::{NodeSpec, PodSpec};
use serde::Serialize;

/// One whole GPU in milli-GPU.
pub const MILLI: u32 = 1000;
/// Index of a GPU model in [`Cluster::models`].
pub type ModelId = u8;

/// The set of GPU models a pod accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub struct ModelSet {
    /// True when the pod accepts any model.
    pub any: bool,
    /// Bit `i` set when model `i` is accepted (meaningful only when `any` is false).
    pub mask: u64,
}

impl ModelSet {
    /// Accepts every model.
    pub const ANY: Self = Self { any: true, mask: 0 };

    /// True when a node with `model` (None: no GPU model) is acceptable.
    #[must_use]
    pub fn allows(&self, model: Option<ModelId>) -> bool {
        if self.any {
            return true;
        }
        match model {
            Some(m) => self.mask & (1u64 << m) != 0,
            None => false,
        }
    }
}

/// A pod's resource request, resolved against a cluster's model table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub struct PodReq {
    /// CPU milli-cores.
    pub cpu_milli: u32,
    /// Memory MiB.
    pub memory_mib: u64,
    /// Number of GPUs (0: CPU-only).
    pub num_gpu: u8,
    /// Milli per GPU (1..=1000; < 1000 only with one GPU).
    pub gpu_milli: u16,
    /// Accepted GPU models.
    pub models: ModelSet,
}

impl PodReq {
    /// True when the pod shares one GPU (`num_gpu == 1 && gpu_milli < 1000`).
    #[must_use]
    pub fn is_fractional(&self) -> bool {
        self.num_gpu == 1 && u32::from(self.gpu_milli) < MILLI
    }

    /// Total GPU milli requested.
    #[must_use]
    pub fn total_gpu_milli(&self) -> u32 {
        u32::from(self.num_gpu) * u32::from(self.gpu_milli)
    }

    /// The GpuClustering "affinity" tag: 0 for shared GPUs, k for k whole GPUs; None for CPU pods.
    #[must_use]
    pub fn affinity_tag(&self) -> Option<u8> {
        if self.num_gpu == 0 {
            None
        } else if self.is_fractional() {
            Some(0)
        } else {
            Some(self.num_gpu)
        }
    }
}

/// A set of GPU indices on one node (bit i = GPU i).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize)]
pub struct GpuChoice(pub u64);

impl GpuChoice {
    /// No GPU (CPU-only pods).
    pub const NONE: Self = Self(0);

    /// A single GPU.
    #[must_use]
    pub fn one(i: usize) -> Self {
        Self(1u64 << i)
    }

    /// Number of GPUs chosen.
    #[must_use]
    pub fn len(&self) -> usize {
        self.0.count_ones() as usize
    }

    /// True when no GPU is chosen.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.0 == 0
    }

    /// Adds GPU `i`.
    pub fn insert(&mut self, i: usize) {
        self.0 |= 1u64 << i;
    }

    /// The chosen GPU indices in increasing order.
    pub fn iter(&self) -> impl Iterator<Item = usize> + '_ {
        let bits = self.0;
        (0..64).filter(move |i| bits & (1u64 << i) != 0)
    }

    /// The chosen GPU indices as a vector.
    #[must_use]
    pub fn to_vec(&self) -> Vec<usize> {
        self.iter().collect()
    }
}

/// Static description and dynamic state of one node.
#[derive(Debug, Clone, Serialize)]
pub struct Node {
    /// Name from the trace.
    pub name: String,
    /// CPU capacity (milli).
    pub cpu_capacity: u32,
    /// Memory capacity (MiB).
    pub memory_capacity: u64,
    /// GPU model (None when the node has no GPU model).
    pub model: Option<ModelId>,
    /// Free CPU milli.
    pub cpu_left: u32,
    /// Free memory MiB.
    pub memory_left: u64,
    /// Sum of the GPUs' free milli.
    pub gpu_left: u32,
    /// Number of GPUs with all 1000 milli free.
    pub full_free: u8,
    /// Largest free milli on one GPU.
    pub max_gpu_free: u16,
    /// Count of placed GPU pods per affinity tag (index 0: shared, k: k whole GPUs, 65 others).
    affinity: Vec<(u8, u32)>,
    gpu_start: u32,
    gpu_count: u8,
}

impl Node {
    /// Number of GPUs.
    #[must_use]
    pub fn gpu_count(&self) -> usize {
        usize::from(self.gpu_count)
    }

    /// GPU capacity in milli.
    #[must_use]
    pub fn gpu_capacity(&self) -> u32 {
        u32::from(self.gpu_count) * MILLI
    }

    /// Placed-pod count with GPU affinity tag `tag`.
    #[must_use]
    pub fn affinity_count(&self, tag: u8) -> u32 {
        self.affinity
            .iter()
            .find(|(t, _)| *t == tag)
            .map_or(0, |(_, c)| *c)
    }

    /// Number of distinct affinity tags present on the node.
    #[must_use]
    pub fn affinity_kinds(&self) -> usize {
        self.affinity.iter().filter(|(_, c)| *c > 0).count()
    }
}

/// The cluster: nodes with incremental free-resource state.
#[derive(Debug, Clone, Serialize)]
pub struct Cluster {
    models: Vec<String>,
    nodes: Vec<Node>,
    gpu_free: Vec<u16>,
    gpu_capacity_milli: u64,
    gpu_allocated_milli: u64,
}

impl Cluster {
    /// Builds an empty cluster from a node list.
    ///
    /// # Errors
    /// [`PackingError::Cluster`] with no nodes, more than 64 models, more than 64 GPUs on a node,
    /// or a capacity that does not fit the engine's integer types.
    pub fn new(specs: &[NodeSpec]) -> Result<Self> {
        if specs.is_empty() {
            return Err(PackingError::Cluster("no nodes".into()));
        }
        let mut models: Vec<String> = Vec::new();
        let mut nodes = Vec::with_capacity(specs.len());
        let mut gpu_free = Vec::new();
        for s in specs {
            let model = if s.model.is_empty() {
                None
            } else {
                let idx = match models.iter().position(|m| *m == s.model) {
                    Some(i) => i,
                    None => {
                        models.push(s.model.clone());
                        models.len() - 1
                    }
                };
                Some(
                    ModelId::try_from(idx)
                        .ok()
                        .filter(|i| *i < 64)
                        .ok_or_else(|| PackingError::Cluster("more than 64 GPU models".into()))?,
                )
            };
            let gpu_count = u8::try_from(s.gpus)
                .ok()
                .filter(|g| *g <= 64)
                .ok_or_else(|| {
                    PackingError::Cluster(format!("node {}: more than 64 GPUs", s.name))
                })?;
            let cpu = u32::try_from(s.cpu_milli)
                .map_err(|_| PackingError::Cluster(format!("node {}: CPU too large", s.name)))?;
            let gpu_start = u32::try_from(gpu_free.len())
                .map_err(|_| PackingError::Cluster("too many GPUs".into()))?;
            gpu_free.extend(std::iter::repeat_n(MILLI as u16, usize::from(gpu_count)));
            nodes.push(Node {
                name: s.name.clone(),
                cpu_capacity: cpu,
                memory_capacity: s.memory_mib,
                model,
                cpu_left: cpu,
                memory_left: s.memory_mib,
                gpu_left: u32::from(gpu_count) * MILLI,
                full_free: gpu_count,
                max_gpu_free: if gpu_count > 0 { MILLI as u16 } else { 0 },
                affinity: Vec::new(),
                gpu_start,
                gpu_count,
            });
        }
        let gpu_capacity_milli = gpu_free.len() as u64 * u64::from(MILLI);
        Ok(Self {
            models,
            nodes,
            gpu_free,
            gpu_capacity_milli,
            gpu_allocated_milli: 0,
        })
    }

    /// GPU model names; a [`ModelId`] indexes this list.
    #[must_use]
    pub fn models(&self) -> &[String] {
        &self.models
    }

    /// All nodes.
    #[must_use]
    pub fn nodes(&self) -> &[Node] {
        &self.nodes
    }

    /// Node `i`.
    #[must_use]
    pub fn node(&self, i: usize) -> &Node {
        &self.nodes[i]
    }

    /// Number of nodes.
    #[must_use]
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// True when there are no nodes (never, for a constructed cluster).
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// Index of the node named `name`.
    #[must_use]
    pub fn position(&self, name: &str) -> Option<usize> {
        self.nodes.iter().position(|n| n.name == name)
    }

    /// Free milli of each GPU of node `i`.
    #[must_use]
    pub fn gpus(&self, i: usize) -> &[u16] {
        let n = &self.nodes[i];
        let s = n.gpu_start as usize;
        &self.gpu_free[s..s + n.gpu_count()]
    }

    /// Total GPU capacity in milli.
    #[must_use]
    pub fn gpu_capacity_milli(&self) -> u64 {
        self.gpu_capacity_milli
    }

    /// Allocated GPU milli.
    #[must_use]
    pub fn gpu_allocated_milli(&self) -> u64 {
        self.gpu_allocated_milli
    }

    /// Allocated GPU milli as a percentage of capacity.
    #[must_use]
    pub fn allocation_pct(&self) -> f64 {
        if self.gpu_capacity_milli == 0 {
            return 0.0;
        }
        100.0 * self.gpu_allocated_milli as f64 / self.gpu_capacity_milli as f64
    }

    /// Resolves a trace pod's request against this cluster's model table. Models the cluster does
    /// not have are ignored; a pod that names only unknown models fits nowhere.
    #[must_use]
    pub fn resolve(&self, pod: &PodSpec) -> PodReq {
        let models = if pod.gpu_spec.is_empty() {
            ModelSet::ANY
        } else {
            let mut mask = 0u64;
            for name in &pod.gpu_spec {
                if let Some(i) = self.models.iter().position(|m| m == name) {
                    mask |= 1u64 << i;
                }
            }
            ModelSet { any: false, mask }
        };
        PodReq {
            cpu_milli: u32::try_from(pod.cpu_milli).unwrap_or(u32::MAX),
            memory_mib: pod.memory_mib,
            num_gpu: u8::try_from(pod.num_gpu).unwrap_or(u8::MAX),
            gpu_milli: u16::try_from(pod.gpu_milli.min(MILLI)).unwrap_or(MILLI as u16),
            models,
        }
    }

    /// True when `pod` fits on node `i`: CPU, memory, GPU model, and either one GPU with enough
    /// free milli (fractional pods) or enough fully free GPUs (whole-GPU pods).
    #[must_use]
    pub fn fits(&self, i: usize, pod: &PodReq) -> bool {
        let n = &self.nodes[i];
        if n.cpu_left < pod.cpu_milli || n.memory_left < pod.memory_mib {
            return false;
        }
        if pod.num_gpu == 0 {
            return true;
        }
        if !pod.models.allows(n.model) {
            return false;
        }
        if pod.is_fractional() {
            n.max_gpu_free >= pod.gpu_milli
        } else {
            n.full_free >= pod.num_gpu
        }
    }

    /// Indices of all nodes `pod` fits on.
    #[must_use]
    pub fn feasible_nodes(&self, pod: &PodReq) -> Vec<usize> {
        (0..self.nodes.len())
            .filter(|&i| self.fits(i, pod))
            .collect()
    }

    /// Commits `pod` on node `i` using the GPUs in `gpus`.
    ///
    /// # Errors
    /// [`PackingError::Placement`] when the pod does not fit or `gpus` is not a valid choice
    /// (wrong count, index out of range, not enough free milli); the state is then unchanged.
    pub fn place(&mut self, i: usize, pod: &PodReq, gpus: GpuChoice) -> Result<()> {
        let bad = |reason: String| PackingError::Placement { node: i, reason };
        let Some(n) = self.nodes.get(i) else {
            return Err(bad("no such node".into()));
        };
        if !self.fits(i, pod) {
            return Err(bad("pod does not fit".into()));
        }
        if gpus.len() != usize::from(pod.num_gpu) {
            return Err(bad(format!(
                "{} GPUs chosen for a pod requesting {}",
                gpus.len(),
                pod.num_gpu
            )));
        }
        let start = n.gpu_start as usize;
        let count = n.gpu_count();
        for g in gpus.iter() {
            if g >= count {
                return Err(bad(format!("GPU {g} out of range ({count} GPUs)")));
            }
            if self.gpu_free[start + g] < pod.gpu_milli {
                return Err(bad(format!(
                    "GPU {g} has {} milli free, pod needs {}",
                    self.gpu_free[start + g],
                    pod.gpu_milli
                )));
            }
        }
        for g in gpus.iter() {
            self.gpu_free[start + g] -= pod.gpu_milli;
        }
        let total = pod.total_gpu_milli();
        self.gpu_allocated_milli += u64::from(total);
        let slice = &self.gpu_free[start..start + count];
        let full_free = slice.iter().filter(|&&f| u32::from(f) == MILLI).count() as u8;
        let max_gpu_free = slice.iter().copied().max().unwrap_or(0);
        let n = &mut self.nodes[i];
        n.cpu_left -= pod.cpu_milli;
        n.memory_left -= pod.memory_mib;
        n.gpu_left -= total;
        n.full_free = full_free;
        n.max_gpu_free = max_gpu_free;
        if let Some(tag) = pod.affinity_tag() {
            match n.affinity.iter_mut().find(|(t, _)| *t == tag) {
                Some((_, c)) => *c += 1,
                None => n.affinity.push((tag, 1)),
            }
        }
        Ok(())
    }

    /// Sets node `i`'s used resources directly (for the scheduler extender, which learns the
    /// current allocation from the API server): CPU and memory in use and each GPU's free milli.
    /// Affinity tags are left empty unless given.
    ///
    /// # Errors
    /// [`PackingError::Placement`] when the usage exceeds the node's capacity or `gpu_free` has
    /// the wrong length or a value above 1000.
    pub fn set_usage(
        &mut self,
        i: usize,
        cpu_used: u32,
        memory_used: u64,
        gpu_free: &[u16],
        affinity: &[(u8, u32)],
    ) -> Result<()> {
        let bad = |reason: String| PackingError::Placement { node: i, reason };
        let Some(n) = self.nodes.get(i) else {
            return Err(bad("no such node".into()));
        };
        if cpu_used > n.cpu_capacity || memory_used > n.memory_capacity {
            return Err(bad("usage exceeds capacity".into()));
        }
        if gpu_free.len() != n.gpu_count() || gpu_free.iter().any(|&f| u32::from(f) > MILLI) {
            return Err(bad(format!(
                "expected {} GPU free values in 0..=1000",
                n.gpu_count()
            )));
        }
        let start = n.gpu_start as usize;
        let old: u64 = self.gpu_free[start..start + gpu_free.len()]
            .iter()
            .map(|&f| u64::from(f))
            .sum();
        let new: u64 = gpu_free.iter().map(|&f| u64::from(f)).sum();
        self.gpu_free[start..start + gpu_free.len()].copy_from_slice(gpu_free);
        self.gpu_allocated_milli = self.gpu_allocated_milli + old - new;
        let n = &mut self.nodes[i];
        n.cpu_left = n.cpu_capacity - cpu_used;
        n.memory_left = n.memory_capacity - memory_used;
        n.gpu_left = u32::try_from(new).unwrap_or(u32::MAX);
        n.full_free = gpu_free.iter().filter(|&&f| u32::from(f) == MILLI).count() as u8;
        n.max_gpu_free = gpu_free.iter().copied().max().unwrap_or(0);
        n.affinity = affinity.to_vec();
        Ok(())
    }
}

/// The first `k` fully free GPUs in index order (the simulator's exclusive-GPU rule).
#[must_use]
pub fn first_free_gpus(gpus: &[u16], k: usize) -> Option<GpuChoice> {
    let mut c = GpuChoice::NONE;
    for (i, &f) in gpus.iter().enumerate() {
        if c.len() == k {
            break;
        }
        if u32::from(f) == MILLI {
            c.insert(i);
        }
    }
    (c.len() == k).then_some(c)
}

/// Best-fit GPU for a fractional request: the GPU with the least free milli that still fits;
/// ties go to the lowest index.
#[must_use]
pub fn best_fit_gpu(gpus: &[u16], milli: u16) -> Option<usize> {
    let mut best: Option<usize> = None;
    for (i, &f) in gpus.iter().enumerate() {
        if f >= milli && best.is_none_or(|b| f < gpus[b]) {
            best = Some(i);
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn spec(name: &str, cpu: u64, gpus: u32, model: &str) -> NodeSpec {
        NodeSpec {
            name: name.into(),
            cpu_milli: cpu,
            memory_mib: 100_000,
            gpus,
            model: model.into(),
        }
    }

    fn pod(cpu: u64, num: u32, milli: u32, spec: &[&str]) -> PodSpec {
        PodSpec {
            name: "p".into(),
            cpu_milli: cpu,
            memory_mib: 10,
            num_gpu: num,
            gpu_milli: milli,
            gpu_spec: spec.iter().map(|s| s.to_string()).collect(),
        }
    }

    #[test]
    fn fit_and_place_update_aggregates() {
        let mut c = Cluster::new(&[spec("a", 8000, 2, "T4"), spec("b", 8000, 1, "V100")]).unwrap();
        assert_eq!(c.gpu_capacity_milli(), 3000);
        let frac = c.resolve(&pod(1000, 1, 600, &[]));
        c.place(0, &frac, GpuChoice::one(1)).unwrap();
        assert_eq!(c.gpus(0), &[1000, 400]);
        let n = c.node(0);
        assert_eq!(
            (n.cpu_left, n.gpu_left, n.full_free, n.max_gpu_free),
            (7000, 1400, 1, 1000)
        );
        assert_eq!(n.affinity_count(0), 1);
        assert_eq!(c.gpu_allocated_milli(), 600);
        // A 2-GPU pod no longer fits node 0.
        let two = c.resolve(&pod(1000, 2, 1000, &[]));
        assert!(!c.fits(0, &two));
        // Model constraint.
        let v100 = c.resolve(&pod(1000, 1, 1000, &["V100"]));
        assert!(!c.fits(0, &v100));
        assert!(c.fits(1, &v100));
        let unknown = c.resolve(&pod(1000, 1, 1000, &["H100"]));
        assert!(c.feasible_nodes(&unknown).is_empty());
        // CPU pods ignore GPU models.
        let cpu = c.resolve(&pod(8000, 0, 0, &["H100"]));
        assert!(c.fits(1, &cpu));
        assert!(!c.fits(0, &cpu));
    }

    #[test]
    fn bad_placements_are_rejected_without_change() {
        let mut c = Cluster::new(&[spec("a", 8000, 2, "T4")]).unwrap();
        let frac = c.resolve(&pod(1000, 1, 600, &[]));
        c.place(0, &frac, GpuChoice::one(0)).unwrap();
        assert!(c.place(0, &frac, GpuChoice::one(0)).is_err());
        assert!(c.place(0, &frac, GpuChoice::one(5)).is_err());
        assert!(c.place(0, &frac, GpuChoice(0b11)).is_err());
        assert_eq!(c.gpus(0), &[400, 1000]);
        assert_eq!(c.gpu_allocated_milli(), 600);
    }

    #[test]
    fn gpu_helpers() {
        assert_eq!(best_fit_gpu(&[1000, 300, 500, 300], 250), Some(1));
        assert_eq!(best_fit_gpu(&[100, 200], 250), None);
        assert_eq!(
            first_free_gpus(&[1000, 500, 1000, 1000], 2),
            Some(GpuChoice(0b101))
        );
        assert_eq!(first_free_gpus(&[1000, 500], 2), None);
        assert_eq!(GpuChoice(0b1010).to_vec(), vec![1, 3]);
    }

    #[test]
    fn set_usage_reflects_external_state() {
        let mut c = Cluster::new(&[spec("a", 8000, 2, "T4")]).unwrap();
        c.set_usage(0, 2000, 10, &[1000, 250], &[(0, 3)]).unwrap();
        assert_eq!(c.node(0).cpu_left, 6000);
        assert_eq!(c.gpu_allocated_milli(), 750);
        assert_eq!(c.node(0).affinity_count(0), 3);
        assert!(c.set_usage(0, 9000, 0, &[1000, 1000], &[]).is_err());
        assert!(c.set_usage(0, 0, 0, &[1000], &[]).is_err());
    }
}
