//! The one node state every task reads, and the agent's probes.

use gpuops_inventory::Inventory;
use gpuops_metrics::XidCounters;
use gpuops_resources::health::HealthTracker;
use std::sync::Arc;
use std::time::Instant;

/// What every task reads: the last snapshot and what the agent knows about the devices' health.
#[derive(Debug, Clone)]
pub struct NodeState {
    pub inventory: Arc<Inventory>,
    pub health: HealthTracker,
    pub xids: XidCounters,
    /// When the collection that produced this state began; `None` when only health changed.
    pub collection: Option<Instant>,
    /// NVML reads that failed since start.
    pub nvml_errors: u64,
    /// False while NVML could not be loaded (FAIL_ON_INIT_ERROR=false): nothing is advertised
    /// or written on the node, the agent serves only its own health and metrics.
    pub nvml_loaded: bool,
}

/// The agent's liveness and readiness, served at `/healthz` and `/readyz` on the metrics port.
#[derive(Debug, Clone)]
pub struct Probes {
    /// The server's latches.
    pub serve: Arc<gpuops_serve::Probes>,
    /// When the snapshot loop last went round (ms since the epoch).
    pub last_loop_ms: Arc<std::sync::atomic::AtomicU64>,
    /// The loop is stuck when it has not gone round for this long.
    pub stale_after_ms: u64,
}

impl Probes {
    /// Liveness: the snapshot loop goes round (a hung NVML call or a dead loop fails it).
    pub fn loop_alive(&self) -> bool {
        let last = self.last_loop_ms.load(std::sync::atomic::Ordering::Relaxed);
        now_ms().saturating_sub(last) <= self.stale_after_ms
    }
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};

    #[test]
    fn the_loop_is_alive_until_it_has_not_gone_round_for_the_stale_period() {
        let probes = Probes {
            serve: gpuops_serve::Probes::new(),
            last_loop_ms: Arc::new(AtomicU64::new(now_ms())),
            stale_after_ms: 60_000,
        };
        assert!(probes.loop_alive());
        probes
            .last_loop_ms
            .store(now_ms().saturating_sub(61_000), Ordering::Relaxed);
        assert!(
            !probes.loop_alive(),
            "a loop stuck for 61 s of 60 is not alive"
        );
    }
}
