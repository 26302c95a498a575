//! The snapshot loop: the only task that reads the GPUs, and the one writer of [`NodeState`].
//!
//! A snapshot runs on a blocking thread and is awaited as one more event of the loop, so an NVML
//! call that hangs delays nothing else: XIDs still turn devices unhealthy, shutdown still stops.

use crate::changes::changes;
use crate::error::AgentError;
use crate::state::{NodeState, monotonic_ms};
use crate::xid::{Report, describe_event};
use gpuops_inventory::Inventory;
use gpuops_nvml::{GpuEvent, Gpus, Library, NvmlError, Scope};
use gpuops_resources::health::HealthPolicy;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

pub(crate) struct Loop {
    /// `None` while NVML could not be loaded (FAIL_ON_INIT_ERROR=false): retried with backoff.
    pub gpus: Option<Arc<Gpus>>,
    /// Where to look for NVML while it is not loaded, in order.
    pub libraries: Vec<Library>,
    /// The host's sysfs, for what NVML does not say (the PCI class on old drivers).
    pub sysfs_root: std::path::PathBuf,
    pub reports_tx: mpsc::Sender<Report>,
    pub stop_xids: Arc<AtomicBool>,
    pub interval: Duration,
    pub timeout: Duration,
    pub policy: HealthPolicy,
    /// The GPUs the XID thread should watch.
    pub healthy: Arc<Mutex<Vec<u32>>>,
    pub live: Arc<AtomicU64>,
    /// The NVML handle, for the MIG flow to apply through, once it is loaded here.
    pub opened: watch::Sender<Option<Arc<Gpus>>>,
}

type Snapshot = JoinHandle<Result<Inventory, NvmlError>>;
type Opening = JoinHandle<Result<Gpus, AgentError>>;

/// Starts the XID thread on `gpus`.
fn start_xids(l: &Loop, gpus: &Arc<Gpus>) -> Option<std::thread::JoinHandle<()>> {
    let (gpus, healthy, stop, tx) = (
        Arc::clone(gpus),
        Arc::clone(&l.healthy),
        Arc::clone(&l.stop_xids),
        l.reports_tx.clone(),
    );
    match std::thread::Builder::new()
        .name("xid-watch".into())
        .spawn(move || crate::xid::watch(&gpus, &healthy, &stop, &tx))
    {
        Ok(t) => Some(t),
        Err(e) => {
            tracing::error!(error = %e, "cannot start the XID watcher: {e}; XIDs are not watched");
            None
        }
    }
}

/// Tries each library in turn (paths that do not exist are skipped); the error names them all.
pub fn open_first(libraries: &[Library], sysfs_root: &std::path::Path) -> Result<Gpus, AgentError> {
    let mut errors = Vec::new();
    let mut missing = Vec::new();
    for library in libraries {
        // With several places to look, the absent ones are only listed; a single one says why.
        if let Library::Path(path) = library
            && libraries.len() > 1
            && !path.exists()
        {
            missing.push(path.clone());
            continue;
        }
        match Gpus::open(library.clone()) {
            Ok(g) => return Ok(g.with_sysfs_root(sysfs_root)),
            Err(e) => errors.push(e),
        }
    }
    Err(AgentError::NvmlOpen { missing, errors })
}

/// Runs until `shutdown` resolves; returns the XID thread to join.
// Long on purpose: one select over the loop's events (shutdown, a MIG change ending, the tick, NVML opening, a late read, a read done, XID reports) that share the in-flight read's state; each arm is short, and splitting would only hand that state around.
pub(crate) async fn run(
    mut l: Loop,
    state_tx: watch::Sender<Arc<NodeState>>,
    mut busy: watch::Receiver<bool>,
    mut reports: mpsc::Receiver<Report>,
    shutdown: impl Future<Output = ()>,
) -> Option<std::thread::JoinHandle<()>> {
    tokio::pin!(shutdown);
    let mut xid_thread = l.gpus.clone().and_then(|g| start_xids(&l, &g));
    let mut open_delays =
        gpuops_backoff::Policy::new(Duration::from_secs(1), Duration::from_secs(300))
            .jitter(1.0)
            .start();
    let mut open_at = tokio::time::Instant::now() + open_delays.failed();
    let mut opening: Option<Opening> = None;
    let mut open_error: Option<String> = None;
    let mut state: NodeState = (**state_tx.borrow()).clone();
    let mut ticker = tokio::time::interval(l.interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticker.tick().await;
    // The snapshot being read, when it began, and whether its lateness was reported.
    let mut in_flight: Option<(Snapshot, Instant, bool)> = None;
    // A GPU was reported lost while a read was in flight: read again once it ends.
    let mut reread = false;
    loop {
        // While a read is in flight the loop is only as alive as that read is young: a driver
        // call that never returns must age the beat from when it began, whatever else (the
        // lateness report, an XID) wakes the loop meanwhile.
        let beat = in_flight
            .as_ref()
            .map_or_else(monotonic_ms, |(_, started, _)| {
                monotonic_ms().saturating_sub(started.elapsed().as_millis() as u64)
            });
        l.live.store(beat, Ordering::Relaxed);
        let late_at = in_flight
            .as_ref()
            .map(|(_, started, _)| tokio::time::Instant::from_std(*started + l.timeout));
        tokio::select! {
            () = &mut shutdown => break,
            changed = busy.changed() => {
                // A MIG change ended: re-read the GPUs now (the feed withdraws devices by itself).
                if changed.is_ok() && !*busy.borrow_and_update() {
                    ticker.reset_immediately();
                }
            }
            // Also without NVML: the tick is the loop's heartbeat, and the retries to load NVML
            // back off to minutes, far past the liveness deadline, on a node without GPUs.
            _ = ticker.tick(), if in_flight.is_none() => {
                if let Some(g) = l.gpus.clone() {
                    let task = tokio::task::spawn_blocking(move || g.snapshot_with(Scope::Live));
                    in_flight = Some((task, Instant::now(), false));
                }
            }
            () = tokio::time::sleep_until(open_at), if l.gpus.is_none() && opening.is_none() => {
                let (libraries, root) = (l.libraries.clone(), l.sysfs_root.clone());
                opening = Some(tokio::task::spawn_blocking(move || open_first(&libraries, &root)));
            }
            opened = join_open(&mut opening), if opening.is_some() => {
                opening = None;
                match opened {
                    Ok(Ok(g)) => {
                        tracing::info!(library = %g.library().describe(), "NVML loaded from {}: reading the GPUs", g.library().describe());
                        let g = Arc::new(g);
                        l.opened.send_replace(Some(Arc::clone(&g)));
                        xid_thread = start_xids(&l, &g);
                        l.gpus = Some(g);
                        state.nvml_loaded = true;
                        ticker.reset_immediately();
                    }
                    Ok(Err(e)) => {
                        let wait = open_delays.failed();
                        let e = e.to_string();
                        if open_error.as_deref() != Some(e.as_str()) {
                            tracing::warn!(error = %e, retry_in = ?wait, "NVML still cannot be loaded: {e}; retrying with backoff");
                            open_error = Some(e);
                        }
                        open_at = tokio::time::Instant::now() + wait;
                    }
                    Err(e) => {
                        tracing::error!(error = %e, "loading NVML failed: {e}");
                        open_at = tokio::time::Instant::now() + open_delays.failed();
                    }
                }
            }
            () = sleep_until(late_at), if in_flight.as_ref().is_some_and(|(_, _, told)| !told) => {
                if let Some((_, started, told)) = in_flight.as_mut() {
                    *told = true;
                    tracing::error!(
                        waited = ?started.elapsed(),
                        "the NVIDIA driver has not answered a GPU read for {:?}; serving the last snapshot meanwhile",
                        started.elapsed()
                    );
                }
            }
            done = join(&mut in_flight), if in_flight.is_some() => {
                let started = in_flight.take().map_or_else(Instant::now, |(_, s, _)| s);
                if std::mem::take(&mut reread) {
                    ticker.reset_immediately();
                }
                match done {
                    Ok(Ok(mut next)) => {
                        keep_static_facts(&mut next, &state.inventory);
                        for change in changes(&state.inventory, &next) {
                            tracing::info!(change = ?change_kind(&change), "{change}");
                        }
                        if let Ok(mut h) = l.healthy.lock() {
                            *h = healthy_indices(&next);
                        }
                        if state.health.expire(&l.policy, monotonic_ms()) {
                            tracing::info!("no XID for the quiet period: devices healthy again where the driver agrees");
                        }
                        state.inventory = Arc::new(next);
                        state.collection = Some(started);
                        state_tx.send_replace(Arc::new(state.clone()));
                    }
                    Ok(Err(e)) => {
                        state.nvml_errors += 1;
                        state.collection = None;
                        state_tx.send_replace(Arc::new(state.clone()));
                        tracing::warn!(error = %e, "reading the GPUs failed: {e}; keeping the last snapshot");
                    }
                    Err(e) => tracing::error!(error = %e, "snapshot task failed: {e}"),
                }
            }
            Some(report) = reports.recv() => {
                // A storm queues XIDs faster than one publication each is worth (every task
                // watching the state wakes for each): take what is already waiting, up to a
                // bound so the loop still gets round to its other events, and publish once.
                let mut lost = is_lost(&report);
                let mut changed = note(report, &mut state, &l.policy);
                for _ in 1..REPORT_BATCH {
                    match reports.try_recv() {
                        Ok(report) => {
                            lost |= is_lost(&report);
                            changed |= note(report, &mut state, &l.policy);
                        }
                        Err(_) => break,
                    }
                }
                // The driver's "GPU is lost" names no GPU; only a read says which fell off.
                // Read now rather than at the next tick (up to an interval later), so a lost GPU
                // is marked as fast as an XID is; a read already in flight may have begun before
                // the loss, so another follows it.
                if lost {
                    if in_flight.is_some() {
                        reread = true;
                    } else {
                        ticker.reset_immediately();
                    }
                }
                if changed {
                    state.collection = None;
                    state_tx.send_replace(Arc::new(state.clone()));
                }
            }
        }
    }
    xid_thread
}

/// Whether the XID thread reports that a watched GPU fell off the bus.
fn is_lost(report: &Report) -> bool {
    matches!(report, Report::Event(GpuEvent::GpuLost))
}

/// How many queued reports one turn of the loop takes before it publishes.
const REPORT_BATCH: usize = 256;

/// Takes one report from the XID thread into `state`; whether the published state must change.
fn note(report: Report, state: &mut NodeState, policy: &HealthPolicy) -> bool {
    match report {
        Report::Event(event) => {
            let text = describe_event(&event, &state.inventory);
            if let GpuEvent::Xid {
                gpu,
                xid,
                gi_id,
                ci_id,
            } = event
            {
                tracing::warn!(gpu, xid, gi = gi_id, ci = ci_id, "{text}");
                state
                    .health
                    .record(policy, gpu, gi_id, ci_id, xid, monotonic_ms());
                state.xids.record(gpu, gi_id, xid);
                true
            } else {
                tracing::warn!("{text}");
                false
            }
        }
        Report::Watching(gpus) => {
            tracing::info!(
                gpus = gpus.len(),
                "watching {} GPUs for XID errors ({})",
                gpus.len(),
                gpus.iter()
                    .map(u32::to_string)
                    .collect::<Vec<_>>()
                    .join(",")
            );
            false
        }
        Report::Problem(p) => {
            tracing::warn!("{p}");
            false
        }
    }
}

async fn sleep_until(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

async fn join_open(
    opening: &mut Option<Opening>,
) -> Result<Result<Gpus, AgentError>, tokio::task::JoinError> {
    match opening {
        Some(task) => task.await,
        None => std::future::pending().await,
    }
}

async fn join(
    in_flight: &mut Option<(Snapshot, Instant, bool)>,
) -> Result<Result<Inventory, NvmlError>, tokio::task::JoinError> {
    match in_flight {
        Some((task, _, _)) => task.await,
        None => std::future::pending().await,
    }
}

fn change_kind(change: &crate::changes::Change) -> &'static str {
    match change {
        crate::changes::Change::GpuAppeared { .. } => "gpu_appeared",
        crate::changes::Change::GpuDisappeared { .. } => "gpu_disappeared",
        crate::changes::Change::HealthChanged { .. } => "health",
        crate::changes::Change::MigModeChanged { .. } => "mig_mode",
        crate::changes::Change::MigLayoutChanged { .. } => "mig_layout",
    }
}

/// NVLinks and the PCIe/NVLink topology do not change while the node runs: a [`Scope::Live`]
/// re-read takes them from the previous snapshot.
pub(crate) fn keep_static_facts(next: &mut Inventory, previous: &Inventory) {
    next.topology.clone_from(&previous.topology);
    for gpu in &mut next.gpus {
        if let Some(before) = previous.gpus.iter().find(|p| p.uuid == gpu.uuid) {
            gpu.nvlinks.clone_from(&before.nvlinks);
        }
    }
}

pub(crate) fn healthy_indices(inv: &Inventory) -> Vec<u32> {
    inv.healthy_gpus().map(|g| g.index).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuops_inventory::{Gpu, Health};

    fn gpu(index: u32) -> Gpu {
        Gpu {
            index,
            uuid: format!("GPU-{index}"),
            ..Gpu::default()
        }
    }

    #[test]
    fn live_rereads_keep_nvlinks_and_topology_of_the_same_gpus() {
        let mut before = gpu(0);
        before.nvlinks = vec![gpuops_inventory::NvLink {
            link: 0,
            remote_pci_bus_id: "00000000:05:00.0".into(),
            remote_is_switch: true,
        }];
        let previous = Inventory {
            gpus: vec![before.clone(), gpu(1)],
            topology: vec![gpuops_inventory::GpuLink {
                a: 0,
                b: 1,
                nvlinks: 18,
                pcie: gpuops_inventory::PcieLevel::CrossCpu,
            }],
            ..Inventory::default()
        };
        let mut replaced = gpu(1);
        replaced.uuid = "GPU-new".into();
        let mut next = Inventory {
            gpus: vec![gpu(0), replaced],
            ..Inventory::default()
        };
        keep_static_facts(&mut next, &previous);
        assert_eq!(next.gpus[0].nvlinks, before.nvlinks);
        assert!(
            next.gpus[1].nvlinks.is_empty(),
            "another GPU: nothing carried over"
        );
        assert_eq!(next.topology, previous.topology);
    }

    #[test]
    fn healthy_indices_skip_lost_gpus() {
        let mut lost = gpu(2);
        lost.health = Health::Lost;
        let inv = Inventory {
            gpus: vec![gpu(0), gpu(1), lost],
            ..Inventory::default()
        };
        assert_eq!(healthy_indices(&inv), vec![0, 1]);
    }

    /// XIDs queued faster than the loop goes round are all taken (in batches) into the state it
    /// publishes: every one counted, the fatal one marking its GPU.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_queue_of_xids_is_counted_in_full_and_marks_the_fatal_gpu() {
        let (reports_tx, reports_rx) = mpsc::channel(1024);
        for n in 0..600u32 {
            let (gpu, xid) = if n % 10 == 0 { (3, 48) } else { (n % 8, 13) };
            reports_tx
                .send(Report::Event(GpuEvent::Xid {
                    gpu,
                    xid,
                    gi_id: None,
                    ci_id: None,
                }))
                .await
                .unwrap();
        }
        let state = no_gpus();
        let (state_tx, mut state_rx) = watch::channel(Arc::new(state));
        let (_busy_tx, busy_rx) = watch::channel(false);
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let l = Loop {
            gpus: None,
            libraries: vec![Library::Path("/nonexistent/libnvidia-ml.so.1".into())],
            sysfs_root: "/nonexistent".into(),
            reports_tx: reports_tx.clone(),
            stop_xids: Arc::new(AtomicBool::new(false)),
            interval: Duration::from_secs(60),
            timeout: Duration::from_secs(1),
            policy: HealthPolicy::from_env(None, None, 60_000).unwrap(),
            healthy: Arc::new(Mutex::new(Vec::new())),
            live: Arc::new(AtomicU64::new(0)),
            opened: watch::channel(None).0,
        };
        let task = tokio::spawn(run(l, state_tx, busy_rx, reports_rx, async {
            let _ = stop_rx.await;
        }));
        let counted = |s: &NodeState| -> u64 {
            (0..8)
                .flat_map(|g| s.xids.counts(g, None).collect::<Vec<_>>())
                .map(|(_, n)| n)
                .sum()
        };
        let seen = tokio::time::timeout(Duration::from_secs(10), async {
            loop {
                let s = Arc::clone(&state_rx.borrow_and_update());
                if counted(&s) == 600 {
                    return s;
                }
                state_rx.changed().await.unwrap();
            }
        })
        .await
        .expect("all 600 XIDs counted within 10 s");
        assert_eq!(seen.health.xid_for(3, None), Some(48));
        assert_eq!(
            seen.health.xid_for(0, None),
            None,
            "XID 13 is an application fault"
        );
        assert_eq!(
            seen.xids.counts(3, None).collect::<Vec<_>>(),
            vec![(13, 75), (48, 60)]
        );
        let _ = stop_tx.send(());
        let _ = task.await;
    }

    /// The state of an agent that has not read any GPU.
    fn no_gpus() -> NodeState {
        NodeState {
            inventory: Arc::new(Inventory::default()),
            health: gpuops_resources::health::HealthTracker::default(),
            xids: gpuops_metrics::XidCounters::default(),
            collection: None,
            nvml_errors: 0,
            nvml_loaded: false,
        }
    }

    /// On a node without GPUs (FAIL_ON_INIT_ERROR=false) the loop still goes round every
    /// interval, though the retries to load NVML back off to minutes: liveness must not fail.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn without_nvml_the_loop_still_beats_every_interval() {
        let (reports_tx, reports_rx) = mpsc::channel(4);
        let live = Arc::new(AtomicU64::new(0));
        let state = no_gpus();
        let (state_tx, _state_rx) = watch::channel(Arc::new(state));
        let (_busy_tx, busy_rx) = watch::channel(false);
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let l = Loop {
            gpus: None,
            libraries: vec![Library::Path("/nonexistent/libnvidia-ml.so.1".into())],
            sysfs_root: "/nonexistent".into(),
            reports_tx,
            stop_xids: Arc::new(AtomicBool::new(false)),
            interval: Duration::from_millis(50),
            timeout: Duration::from_secs(1),
            policy: HealthPolicy::from_env(None, None, 60_000).unwrap(),
            healthy: Arc::new(Mutex::new(Vec::new())),
            live: Arc::clone(&live),
            opened: watch::channel(None).0,
        };
        let task = tokio::spawn(run(l, state_tx, busy_rx, reports_rx, async {
            let _ = stop_rx.await;
        }));
        // NVML retries come at 1 s, then about 2 s later: sample across them.
        let mut last = 0;
        let mut widest = 0;
        let until = std::time::Instant::now() + Duration::from_millis(2500);
        while std::time::Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(20)).await;
            let beat = live.load(Ordering::Relaxed);
            if last != 0 && beat == last {
                widest = widest.max(monotonic_ms().saturating_sub(beat));
            }
            last = beat;
        }
        let _ = stop_tx.send(());
        let _ = task.await;
        assert!(last != 0, "the loop never went round");
        assert!(
            widest < 500,
            "the loop went {widest} ms without a beat at a 50 ms interval"
        );
    }
}
