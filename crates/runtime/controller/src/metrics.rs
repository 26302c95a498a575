//! The controller's own metrics, in the Prometheus text format.

use std::fmt::Write;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

/// Counters and gauges the loop updates and `/metrics` reads.
#[derive(Debug, Default)]
pub struct Metrics {
    pub decisions: AtomicU64,
    pub scale_ups: AtomicU64,
    pub nodes_bought: AtomicU64,
    pub removals: AtomicU64,
    pub timed_out: AtomicU64,
    pub action_errors: AtomicU64,
    pub pool_errors: AtomicU64,
    pub pending_pods: AtomicU64,
    pub is_leader: AtomicU64,
    /// Last decision's latency in microseconds, and their sum.
    pub decision_us_last: AtomicU64,
    pub decision_us_sum: AtomicU64,
    /// (pool, stage) -> nodes in flight, from the last decision.
    pub in_flight: Mutex<Vec<(String, String, u32)>>,
    /// Seconds since Prometheus last answered the utilization query (-1 before the first);
    /// `None` without --prometheus-url.
    pub gpu_util_age: Mutex<Option<f64>>,
}

impl Metrics {
    /// The exposition text.
    pub fn render(&self) -> String {
        let mut s = String::new();
        let c = |s: &mut String, name: &str, help: &str, kind: &str, v: u64| {
            let _ = writeln!(s, "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {v}");
        };
        let l = Ordering::Relaxed;
        c(
            &mut s,
            "gpuops_autoscaler_decisions_total",
            "Decisions run.",
            "counter",
            self.decisions.load(l),
        );
        c(
            &mut s,
            "gpuops_autoscaler_scale_ups_total",
            "Scale-ups applied (one per pool per decision).",
            "counter",
            self.scale_ups.load(l),
        );
        c(
            &mut s,
            "gpuops_autoscaler_nodes_bought_total",
            "Replicas added by scale-ups.",
            "counter",
            self.nodes_bought.load(l),
        );
        c(
            &mut s,
            "gpuops_autoscaler_scale_downs_total",
            "Nodes whose removal was started.",
            "counter",
            self.removals.load(l),
        );
        c(
            &mut s,
            "gpuops_autoscaler_timed_out_machines_total",
            "Machines removed after a stage timeout or failure.",
            "counter",
            self.timed_out.load(l),
        );
        c(
            &mut s,
            "gpuops_autoscaler_action_errors_total",
            "API requests of actions that failed (retried).",
            "counter",
            self.action_errors.load(l),
        );
        c(
            &mut s,
            "gpuops_autoscaler_pool_errors",
            "MachineDeployments skipped for invalid annotations.",
            "gauge",
            self.pool_errors.load(l),
        );
        c(
            &mut s,
            "gpuops_autoscaler_pending_gpu_pods",
            "Pending pods asking for a GPU resource.",
            "gauge",
            self.pending_pods.load(l),
        );
        c(
            &mut s,
            "gpuops_autoscaler_leader",
            "1 while this replica holds the Lease.",
            "gauge",
            self.is_leader.load(l),
        );
        let last = self.decision_us_last.load(l) as f64 / 1e6;
        let sum = self.decision_us_sum.load(l) as f64 / 1e6;
        let _ = writeln!(
            s,
            "# HELP gpuops_autoscaler_decision_seconds Latency of the last decision.\n# TYPE gpuops_autoscaler_decision_seconds gauge\ngpuops_autoscaler_decision_seconds {last}"
        );
        let _ = writeln!(
            s,
            "# HELP gpuops_autoscaler_decision_seconds_sum Total time spent deciding.\n# TYPE gpuops_autoscaler_decision_seconds_sum counter\ngpuops_autoscaler_decision_seconds_sum {sum}"
        );
        let _ = writeln!(
            s,
            "# HELP gpuops_autoscaler_nodes_in_flight Nodes launched and not yet ready, per pool and stage.\n# TYPE gpuops_autoscaler_nodes_in_flight gauge"
        );
        if let Ok(list) = self.in_flight.lock() {
            for (pool, stage, n) in list.iter() {
                let _ = writeln!(
                    s,
                    "gpuops_autoscaler_nodes_in_flight{{pool=\"{pool}\",stage=\"{stage}\"}} {n}"
                );
            }
        }
        if let Ok(Some(age)) = self.gpu_util_age.lock().map(|a| *a) {
            let _ = writeln!(
                s,
                "# HELP gpuops_autoscaler_gpu_util_age_seconds Seconds since Prometheus last answered the GPU utilization query (-1: never).\n# TYPE gpuops_autoscaler_gpu_util_age_seconds gauge\ngpuops_autoscaler_gpu_util_age_seconds {age}"
            );
        }
        s
    }
}
