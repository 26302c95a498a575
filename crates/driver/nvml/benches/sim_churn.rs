//! NVML calls on nvml-sim while another process keeps changing its state, as `gpuops sim` and the
//! XID storm of the fault matrix do: how long one live snapshot of a DGX H100 takes on a state
//! just written (as every sim-backed test begins), on one left alone, and on one rewritten 20
//! times a second, and how many of 1,000 XIDs per second an event-set reader receives. It measures the simulator (every sim-backed test pays its per-call
//! cost), not a driver.
//!
//! Run: `cargo bench -p gpuops-nvml --bench sim_churn --profile dev` (the profile the tests use;
//! GPUOPS_BENCH_SECS sets each phase's length, default 5).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // benchmark harness

#[path = "../tests/common/mod.rs"]
mod common;

use gpuops_nvml::{GpuEvent, Scope};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Rewrites the state every 50 ms with as many XIDs as 1,000 per second makes due (the storm
/// test's writer), or with none (`rate` 0: a plain rewrite, as a fault injection is).
fn churn(sim: &common::Sim, rate: u64, stop: Arc<AtomicBool>, sent: Arc<AtomicU64>) {
    let store = sim.store.clone();
    std::thread::spawn(move || {
        let begun = Instant::now();
        let mut n = 0u64;
        while !stop.load(Ordering::Relaxed) {
            let due = if rate == 0 {
                0
            } else {
                (begun.elapsed().as_millis() as u64 * rate / 1000)
                    .saturating_sub(n)
                    .min(1000)
            };
            store
                .update(|s| {
                    (0..due).try_for_each(|_| {
                        n += 1;
                        s.inject_xid((n % 8) as u32, 13, None, None)
                    })?;
                    Ok::<(), gpuops_sim::SimError>(())
                })
                .unwrap()
                .unwrap();
            sent.fetch_add(due, Ordering::Relaxed);
            std::thread::sleep(Duration::from_millis(50));
        }
    });
}

fn snapshots(gpus: &gpuops_nvml::Gpus, secs: u64) -> (u64, Duration) {
    let begun = Instant::now();
    let mut n = 0;
    while begun.elapsed() < Duration::from_secs(secs) {
        gpus.snapshot_with(Scope::Live).unwrap();
        n += 1;
    }
    (n, begun.elapsed() / n as u32)
}

fn main() {
    let secs: u64 = std::env::var("GPUOPS_BENCH_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(5);
    let _serial = common::serial();
    let sim = common::Sim::fleet("dgx-h100");
    // A full event queue, as a storm leaves it: the state a reader parses is at its largest.
    sim.apply(|s| {
        (0..gpuops_sim::state::MAX_EVENTS as u32)
            .try_for_each(|i| s.inject_xid(i % 8, 13, None, None))
    });
    let bytes = std::fs::metadata(sim.store.state_path()).unwrap().len();
    let gpus = common::open_at(Some(sim.dir())).unwrap();

    let written = Instant::now();
    // Every sim-backed test starts here: its state saved a moment ago.
    let (n, per) = snapshots(&gpus, 2);
    println!(
        "state just written: {n} live snapshots in 2 s, {per:?} each (state.json {bytes} bytes)"
    );
    std::thread::sleep(Duration::from_secs(3).saturating_sub(written.elapsed()));
    let (n, per) = snapshots(&gpus, secs);
    println!("state 3 s old: {n} live snapshots in {secs} s, {per:?} each");

    let stop = Arc::new(AtomicBool::new(false));
    churn(&sim, 0, Arc::clone(&stop), Arc::new(AtomicU64::new(0)));
    let (n, per) = snapshots(&gpus, secs);
    stop.store(true, Ordering::Relaxed);
    println!("state rewritten every 50 ms: {n} live snapshots in {secs} s, {per:?} each");
    std::thread::sleep(Duration::from_millis(100));

    let (watcher, skipped) = gpus.watch_xids(&(0..8).collect::<Vec<_>>()).unwrap();
    assert!(skipped.is_empty(), "{skipped:?}");
    let stop = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(AtomicU64::new(0));
    churn(&sim, 1000, Arc::clone(&stop), Arc::clone(&sent));
    let begun = Instant::now();
    let mut received = 0u64;
    while begun.elapsed() < Duration::from_secs(secs) {
        if let Some(GpuEvent::Xid { .. }) = watcher.wait(100).unwrap() {
            received += 1;
        }
    }
    stop.store(true, Ordering::Relaxed);
    let sent = sent.load(Ordering::Relaxed);
    println!(
        "XID storm: {received} of {sent} XIDs received in {secs} s ({:.0}/s, {:.0}%)",
        received as f64 / secs as f64,
        100.0 * received as f64 / sent.max(1) as f64
    );
    drop(watcher);
    drop(gpus);
}
