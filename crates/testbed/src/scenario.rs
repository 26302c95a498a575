//! Autoscaling scenarios measured the same way whichever autoscaler runs in the test bed: pending
//! GPU pods go in, and out come the instances launched (vs the fewest that fit, computed
//! independently), time to capacity per pod (created -> Running) and GPU-hours bought until every
//! pod runs (instance-seconds from launch x its GPUs).

use crate::{BedError, Cluster};
use serde_json::json;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// The GPU resource the scenarios ask for.
pub const GPU: &str = "nvidia.com/gpu";

/// An instance (a Karpenter NodeClaim, a Cluster API Machine) an autoscaler launched.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Instance {
    pub name: String,
    pub gpus: u32,
}

/// What a scenario needs from an autoscaler under test.
pub trait Autoscaler {
    /// For the table: "karpenter", "karpenter+startup-taint", "gpuops".
    fn name(&self) -> String;
    /// The instances that exist now; the runner records when each first appeared.
    fn instances(&self) -> Result<Vec<Instance>, BedError>;
}

/// One batch of pending pods.
#[derive(Debug, Clone)]
pub struct Scenario {
    pub name: String,
    /// GPUs asked by each pod.
    pub pods: Vec<u32>,
    /// GPUs of the largest instance available, for the minimum that fits.
    pub node_gpus: u32,
}

impl Scenario {
    /// (a) Scale from zero for one pod asking 4 GPUs.
    pub fn scale_from_zero(node_gpus: u32) -> Scenario {
        Scenario {
            name: "a: 1 pod x 4 GPUs from zero".into(),
            pods: vec![4],
            node_gpus,
        }
    }

    /// (b) A burst of 20 pods: 8 x 1, 6 x 2, 4 x 4 and 2 x 8 GPUs (52 GPUs).
    pub fn burst(node_gpus: u32) -> Scenario {
        let mut pods = Vec::new();
        for (count, gpus) in [(8, 1), (6, 2), (4, 4), (2, 8)] {
            pods.extend(std::iter::repeat_n(gpus, count));
        }
        Scenario {
            name: "b: burst of 20 pods (52 GPUs)".into(),
            pods,
            node_gpus,
        }
    }

    /// The fewest instances of `node_gpus` GPUs that hold every pod: first-fit decreasing,
    /// which here meets the lower bound ceil(sum / node_gpus) (checked in the tests).
    pub fn min_instances(&self) -> usize {
        let mut sizes = self.pods.clone();
        sizes.sort_unstable_by(|a, b| b.cmp(a));
        let mut free: Vec<u32> = Vec::new();
        for s in sizes {
            match free.iter_mut().find(|f| **f >= s) {
                Some(f) => *f -= s,
                None => free.push(self.node_gpus.saturating_sub(s)),
            }
        }
        free.len()
    }
}

/// What one scenario measured.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub scenario: String,
    pub autoscaler: String,
    pub pods: usize,
    pub all_running: bool,
    /// Instances seen until the settle window after the last pod ran closed.
    pub launched: usize,
    pub min_instances: usize,
    /// Per pod: created -> Running (None: it never ran).
    pub time_to_capacity: Vec<Option<Duration>>,
    /// Sum over instances of (all pods Running - first seen) x GPUs, in GPU-hours.
    pub gpu_hours_bought: f64,
    /// The pods' GPUs x their time to capacity, for scale.
    pub gpu_hours_requested_while_pending: f64,
    /// When the first new Node appeared, and the first Node with GPUs in allocatable (the
    /// device-plugin delay shows between the two).
    pub first_node: Option<Duration>,
    pub first_gpus: Option<Duration>,
}

impl Outcome {
    /// The slowest pod's time to capacity.
    pub fn max_time_to_capacity(&self) -> Option<Duration> {
        self.time_to_capacity.iter().flatten().max().copied()
    }

    /// One row of the side-by-side table.
    pub fn row(&self) -> String {
        let ttc =
            |d: Option<Duration>| d.map_or("-".to_string(), |d| format!("{:.1}", d.as_secs_f64()));
        let mut sorted: Vec<Duration> = self.time_to_capacity.iter().flatten().copied().collect();
        sorted.sort();
        let p50 = sorted.get(sorted.len() / 2).copied();
        format!(
            "| {} | {} | {}/{} | {} | {} | {} | {} | {} | {} | {:.4} |",
            self.scenario,
            self.autoscaler,
            self.time_to_capacity.iter().flatten().count(),
            self.pods,
            self.launched,
            self.min_instances,
            ttc(self.first_node),
            ttc(self.first_gpus),
            ttc(p50),
            ttc(self.max_time_to_capacity()),
            self.gpu_hours_bought,
        )
    }

    /// The table's header.
    pub fn header() -> &'static str {
        "| scenario | autoscaler | pods running | instances launched | fewest that fit | first node (s) | first GPUs (s) | time to capacity p50 (s) | max (s) | GPU-hours bought |\n|---|---|---|---|---|---|---|---|---|---|"
    }
}

/// Creates the scenario's pods in `namespace`, then watches until all run (or `timeout`), and
/// `settle` longer to catch instances launched late.
pub fn run(
    cluster: &Cluster,
    autoscaler: &dyn Autoscaler,
    scenario: &Scenario,
    namespace: &str,
    timeout: Duration,
    settle: Duration,
) -> Result<Outcome, BedError> {
    let names: Vec<String> = (0..scenario.pods.len())
        .map(|i| format!("gpu-pod-{i}"))
        .collect();
    let items: Vec<_> = names
        .iter()
        .zip(&scenario.pods)
        .map(|(name, gpus)| {
            json!({"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name, "namespace": namespace, "labels": {"gpuops.io/scenario": "1"}},
                "spec": {"containers": [{"name": "cuda", "image": "example.invalid/cuda:12",
                    "resources": {"requests": {"cpu": "1"}, "limits": {GPU: gpus.to_string()}}}]}})
        })
        .collect();
    let list = json!({"apiVersion": "v1", "kind": "List", "items": items}).to_string();
    let start = Instant::now();
    cluster.apply(&list)?;

    let mut running: BTreeMap<String, Duration> = BTreeMap::new();
    let mut instances: BTreeMap<String, (Duration, u32)> = BTreeMap::new();
    let mut all_at: Option<Duration> = None;
    let (mut first_node, mut first_gpus) = (None, None);
    let before: Vec<String> = node_names(cluster)?.into_iter().map(|(n, _)| n).collect();
    loop {
        let now = start.elapsed();
        for (name, gpus) in node_names(cluster)? {
            if before.contains(&name) {
                continue;
            }
            first_node.get_or_insert(now);
            if gpus {
                first_gpus.get_or_insert(now);
            }
        }
        for i in autoscaler.instances()? {
            instances.entry(i.name).or_insert((now, i.gpus));
        }
        let pods = cluster.get_json(&["pods", "-n", namespace, "-l", "gpuops.io/scenario=1"])?;
        for p in pods["items"].as_array().into_iter().flatten() {
            if p["status"]["phase"] == "Running"
                && let Some(name) = p["metadata"]["name"].as_str()
            {
                running.entry(name.to_string()).or_insert(now);
            }
        }
        if all_at.is_none() && running.len() == names.len() {
            all_at = Some(now);
        }
        match all_at {
            Some(at) if now >= at + settle => break,
            None if now >= timeout => break,
            _ => {}
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    let end = all_at.unwrap_or_else(|| start.elapsed());
    let gpu_hours_bought = instances
        .values()
        .filter(|(seen, _)| *seen <= end)
        .map(|(seen, gpus)| (end - *seen).as_secs_f64() * f64::from(*gpus) / 3600.0)
        .sum();
    let time_to_capacity: Vec<Option<Duration>> =
        names.iter().map(|n| running.get(n).copied()).collect();
    let gpu_hours_requested_while_pending = time_to_capacity
        .iter()
        .zip(&scenario.pods)
        .map(|(t, g)| t.unwrap_or(end).as_secs_f64() * f64::from(*g) / 3600.0)
        .sum();
    Ok(Outcome {
        scenario: scenario.name.clone(),
        autoscaler: autoscaler.name(),
        pods: names.len(),
        all_running: all_at.is_some(),
        launched: instances.len(),
        min_instances: scenario.min_instances(),
        time_to_capacity,
        gpu_hours_bought,
        gpu_hours_requested_while_pending,
        first_node,
        first_gpus,
    })
}

/// Every Node, and whether it has GPUs in allocatable.
fn node_names(cluster: &Cluster) -> Result<Vec<(String, bool)>, BedError> {
    let nodes = cluster.get_json(&["nodes"])?;
    Ok(nodes["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|n| {
            let gpus = n["status"]["allocatable"][GPU]
                .as_str()
                .is_some_and(|g| g != "0");
            Some((n["metadata"]["name"].as_str()?.to_string(), gpus))
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fewest_instances_meet_the_lower_bound() {
        for s in [Scenario::scale_from_zero(8), Scenario::burst(8)] {
            let total: u32 = s.pods.iter().sum();
            let lower = total.div_ceil(s.node_gpus) as usize;
            assert_eq!(s.min_instances(), lower, "{}", s.name);
        }
        assert_eq!(Scenario::burst(8).pods.len(), 20);
        assert_eq!(Scenario::burst(8).min_instances(), 7);
        assert_eq!(Scenario::scale_from_zero(8).min_instances(), 1);
        let odd = Scenario {
            name: "x".into(),
            pods: vec![5, 5, 5],
            node_gpus: 8,
        };
        assert_eq!(
            odd.min_instances(),
            3,
            "no two 5-GPU pods share an 8-GPU node"
        );
    }
}
