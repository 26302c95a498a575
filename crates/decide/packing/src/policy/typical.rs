//! The typical-pod distribution FGD and ours measure fragmentation against.
//!
//! Typical pods: the trace's pods grouped by shape (CPU, GPU milli, GPU count, GPU spec), most
//! frequent first, taken until they cover 95% of all pods (CPU-only pods included), probabilities
//! renormalised.

use crate::cluster::{Cluster, ModelSet};
use crate::trace::PodSpec;
use serde::Serialize;
use std::collections::HashMap;

/// Share of pods the typical pods must cover (the artifact's `podPopularityThreshold`).
pub const POPULARITY_THRESHOLD_PCT: f64 = 95.0;

/// One typical pod shape and its probability.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TypicalPod {
    /// CPU milli.
    pub cpu_milli: u32,
    /// GPU milli per GPU (0 for CPU-only).
    pub gpu_milli: u16,
    /// GPU count.
    pub num_gpu: u8,
    /// Accepted models.
    pub models: ModelSet,
    /// The `|`-joined GPU spec of the trace.
    pub gpu_spec: String,
    /// Probability (the list sums to 1).
    pub weight: f64,
}

/// The typical-pod distribution.
#[derive(Debug, Clone, PartialEq, Default, Serialize)]
pub struct TypicalPods {
    /// Shapes, most frequent first.
    pub pods: Vec<TypicalPod>,
}

impl TypicalPods {
    /// Builds the distribution from the trace's pods, resolving GPU specs against `cluster`.
    #[must_use]
    pub fn from_trace(cluster: &Cluster, pods: &[PodSpec]) -> Self {
        Self::from_trace_with_threshold(cluster, pods, POPULARITY_THRESHOLD_PCT)
    }

    /// As [`TypicalPods::from_trace`] with a custom coverage threshold (percent).
    #[must_use]
    pub fn from_trace_with_threshold(cluster: &Cluster, pods: &[PodSpec], pct: f64) -> Self {
        let mut counts: HashMap<(u64, u32, u32, String), u64> = HashMap::new();
        for p in pods {
            *counts
                .entry((p.cpu_milli, p.gpu_milli, p.num_gpu, p.gpu_spec_key()))
                .or_insert(0) += 1;
        }
        let total = pods.len() as f64;
        let mut list: Vec<((u64, u32, u32, String), u64)> = counts.into_iter().collect();
        // Most frequent first; equal counts in descending (cpu, milli, count, spec) order, as the
        // artifact's reverse sort does.
        list.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| b.0.cmp(&a.0)));
        let expected = pct * total / 100.0;
        let mut cum = 0.0;
        let mut taken = Vec::new();
        for (key, n) in list {
            if cum >= expected {
                break;
            }
            cum += n as f64;
            taken.push((key, n));
        }
        let covered: f64 = taken.iter().map(|(_, n)| *n as f64).sum();
        let pods = taken
            .into_iter()
            .map(|((cpu, milli, num, spec), n)| {
                let spec_pod = PodSpec {
                    name: String::new(),
                    cpu_milli: cpu,
                    memory_mib: 0,
                    num_gpu: num,
                    gpu_milli: milli,
                    gpu_spec: spec
                        .split('|')
                        .filter(|s| !s.is_empty())
                        .map(str::to_string)
                        .collect(),
                };
                let r = cluster.resolve(&spec_pod);
                TypicalPod {
                    cpu_milli: r.cpu_milli,
                    gpu_milli: r.gpu_milli,
                    num_gpu: r.num_gpu,
                    models: r.models,
                    gpu_spec: spec,
                    weight: n as f64 / covered,
                }
            })
            .collect();
        Self { pods }
    }
}
