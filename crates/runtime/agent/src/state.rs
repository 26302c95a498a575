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
    /// Whether the kubelet knows every advertised resource (`gpuops_deviceplugin::serve_reporting`);
    /// `None`: this agent serves no device plugin.
    pub registered: Option<Arc<std::sync::atomic::AtomicBool>>,
    /// Not ready once the last successful collection is older than this.
    pub collection_stale_after: std::time::Duration,
}

/// What readiness is decided from, sampled once a second.
#[derive(Debug, Clone, Copy)]
pub struct ReadyInputs {
    pub nvml_loaded: bool,
    /// `None`: no device plugin.
    pub plugin_registered: Option<bool>,
    /// How long ago the last successful collection began; `None`: none yet.
    pub since_collection: Option<std::time::Duration>,
    pub collection_stale_after: std::time::Duration,
}

/// Why the agent is not ready.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotReady {
    NoNvml,
    NotRegistered,
    NoCollection,
    StaleCollection { age_s: u64, after_s: u64 },
}

impl NotReady {
    /// The same reason, whatever the numbers: a stale collection is reported once, not every
    /// second while its age grows.
    pub fn same_kind(a: Option<NotReady>, b: Option<NotReady>) -> bool {
        a.as_ref().map(std::mem::discriminant) == b.as_ref().map(std::mem::discriminant)
    }
}

impl std::fmt::Display for NotReady {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NotReady::NoNvml => write!(f, "NVML is not loaded"),
            NotReady::NotRegistered => {
                write!(f, "the device plugin is not registered with the kubelet")
            }
            NotReady::NoCollection => write!(f, "no GPU collection yet"),
            NotReady::StaleCollection { age_s, after_s } => write!(
                f,
                "the last GPU collection began {age_s}s ago (stale after {after_s}s)"
            ),
        }
    }
}

/// Why the agent is not ready, or `None` when it is: NVML loaded, the device plugin registered
/// with the kubelet, and a collection recent enough that /metrics is not stale.
pub fn not_ready(i: &ReadyInputs) -> Option<NotReady> {
    if !i.nvml_loaded {
        return Some(NotReady::NoNvml);
    }
    if i.plugin_registered == Some(false) {
        return Some(NotReady::NotRegistered);
    }
    match i.since_collection {
        None => Some(NotReady::NoCollection),
        Some(age) if age > i.collection_stale_after => Some(NotReady::StaleCollection {
            age_s: age.as_secs(),
            after_s: i.collection_stale_after.as_secs(),
        }),
        Some(_) => None,
    }
}

impl Probes {
    /// Liveness: the snapshot loop goes round (a hung NVML call or a dead loop fails it).
    pub fn loop_alive(&self) -> bool {
        self.loop_alive_at(monotonic_ms())
    }

    /// [`Probes::loop_alive`] at `now` on the [`monotonic_ms`] clock.
    pub fn loop_alive_at(&self, now: u64) -> bool {
        let last = self.last_loop_ms.load(std::sync::atomic::Ordering::Relaxed);
        now.saturating_sub(last) <= self.stale_after_ms
    }
}

/// Milliseconds on the monotonic clock since this process first asked. The quiet period of XID
/// health and the liveness probe measure with it: setting the wall clock (NTP stepping it, an
/// operator's `date -s`) must neither heal a GPU early, nor keep it unhealthy for an hour, nor
/// fail /healthz, and a stuck loop must not look alive after the clock went back.
pub fn monotonic_ms() -> u64 {
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    START
        .get_or_init(std::time::Instant::now)
        .elapsed()
        .as_millis() as u64
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
            last_loop_ms: Arc::new(AtomicU64::new(100_000)),
            stale_after_ms: 60_000,
            registered: None,
            collection_stale_after: std::time::Duration::from_secs(50),
        };
        assert!(probes.loop_alive_at(100_000 + 60_000));
        assert!(
            !probes.loop_alive_at(100_000 + 61_000),
            "a loop stuck for 61 s of 60 is not alive"
        );
        probes.last_loop_ms.store(161_000, Ordering::Relaxed);
        assert!(probes.loop_alive_at(161_000));
    }

    #[test]
    fn the_monotonic_clock_goes_forward_and_is_not_the_wall_clock() {
        let a = monotonic_ms();
        std::thread::sleep(std::time::Duration::from_millis(20));
        let b = monotonic_ms();
        assert!(b >= a + 20, "{a} then {b}");
        // Milliseconds since this process started, not since 1970: what the quiet period and
        // the liveness probe compare can never be a wall-clock reading, whatever the clock says.
        assert!(b < now_ms() / 2, "{b} looks like a wall-clock time");
    }

    #[test]
    fn ready_needs_nvml_the_registered_plugin_and_a_recent_collection() {
        use std::time::Duration;
        let ok = ReadyInputs {
            nvml_loaded: true,
            plugin_registered: Some(true),
            since_collection: Some(Duration::from_secs(3)),
            collection_stale_after: Duration::from_secs(50),
        };
        assert_eq!(not_ready(&ok), None);
        assert_eq!(
            not_ready(&ReadyInputs {
                plugin_registered: None,
                ..ok
            }),
            None,
            "without a device plugin there is nothing to register"
        );
        let cases = [
            (
                ReadyInputs {
                    nvml_loaded: false,
                    ..ok
                },
                "NVML is not loaded",
            ),
            (
                ReadyInputs {
                    plugin_registered: Some(false),
                    ..ok
                },
                "not registered with the kubelet",
            ),
            (
                ReadyInputs {
                    since_collection: None,
                    ..ok
                },
                "no GPU collection yet",
            ),
            (
                ReadyInputs {
                    since_collection: Some(Duration::from_secs(51)),
                    ..ok
                },
                "began 51s ago (stale after 50s)",
            ),
        ];
        for (inputs, want) in cases {
            let why = not_ready(&inputs)
                .map(|w| w.to_string())
                .unwrap_or_default();
            assert!(why.contains(want), "{inputs:?}: {want:?} in {why:?}");
        }
        // A growing age is the same reason (logged once); another reason is not.
        let stale = |s| {
            Some(NotReady::StaleCollection {
                age_s: s,
                after_s: 50,
            })
        };
        assert!(NotReady::same_kind(stale(51), stale(52)));
        assert!(!NotReady::same_kind(stale(51), Some(NotReady::NoNvml)));
        assert!(!NotReady::same_kind(stale(51), None));
        assert!(NotReady::same_kind(None, None));
    }
}
