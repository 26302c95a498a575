//! The device plugin's MPS sharing: one NVIDIA MPS control daemon per MPS-shared resource,
//! kept level-triggered from the published config and inventory, between the config feed and
//! the plugin servers.
//!
//! Allocate points a container of resource `R` at `<mpsRoot>/R/pipe` and `<mpsRoot>/shm`
//! (`gpuops_resources::allocate`); the daemon named `R` under `mpsRoot` answers there. As with
//! NVIDIA's device plugin, which does not serve an MPS resource until its daemon is ready, a
//! resource is withheld from the plugin servers while its daemon is not running: without a
//! control binary, while it starts, after a failed start (retried with backoff) and while its
//! supervisor restarts it. Every other resource is served unchanged.

/// What the feed publishes and the plugin servers serve.
pub use gpuops_deviceplugin::Published;
use gpuops_inventory::Inventory;
use gpuops_mps::{Config, Daemon, DaemonSpec, State};
use gpuops_resources::SharingStrategy;
use gpuops_resources::config::Config as PluginConfig;
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;

const MIB: u64 = 1024 * 1024;

/// The daemons `config` wants on `inventory`, by resource name: one per MPS-shared resource,
/// over the GPUs (or MIG devices) behind its device IDs, each client limited to `100 /
/// replicas` percent of the threads and `memory / replicas` of each device, as NVIDIA's device
/// plugin sets them. Health plays no part (a daemon is not restarted, nor its clients cut off,
/// when a GPU turns unhealthy); a config the inventory cannot be served with wants none.
pub fn wanted(inventory: &Inventory, config: &PluginConfig) -> BTreeMap<String, DaemonSpec> {
    // From the config and inventory rather than from what is advertised: a MIG change empties
    // every advertised resource for a while, and that must not restart the daemons.
    let Ok(resources) = gpuops_resources::resources(inventory, config) else {
        return BTreeMap::new();
    };
    resources
        .iter()
        .filter(|r| r.sharing == SharingStrategy::Mps)
        .filter_map(|r| {
            let mut devices: Vec<(String, u64)> = Vec::new();
            for d in &r.devices {
                let uuid = d.backing_uuid();
                if devices.iter().any(|(u, _)| u == uuid) {
                    continue;
                }
                devices.push((uuid.to_string(), memory_bytes(inventory, uuid)));
            }
            (!devices.is_empty()).then(|| {
                (
                    r.name.clone(),
                    DaemonSpec::replicated(&r.name, &devices, r.replicas),
                )
            })
        })
        .collect()
}

/// The framebuffer of GPU or MIG device `uuid`; 0 (no limit) when unknown.
fn memory_bytes(inventory: &Inventory, uuid: &str) -> u64 {
    for g in &inventory.gpus {
        if g.uuid == uuid {
            return g.memory.total_mib * MIB;
        }
        if let Some(m) = g.mig_devices.iter().find(|m| m.uuid == uuid) {
            return m.memory_mib * MIB;
        }
    }
    0
}

/// What the plugin servers get: `published` without the MPS-shared resources in `withheld`.
pub fn served(published: &Published, withheld: &BTreeSet<String>) -> Published {
    let mut out = published.clone();
    out.resources.retain(|r| !withheld.contains(&r.name));
    out
}

struct Running {
    spec: DaemonSpec,
    root: PathBuf,
    daemon: Daemon,
}

/// The daemons of the device plugin's MPS sharing, run until `stop`: returns what the plugin
/// servers should serve (the feed's `published`, less the MPS resources whose daemon is not
/// running) and the task. `binary` is `nvidia-cuda-mps-control`; without one no daemon starts
/// and MPS-shared resources are not served, which the task says.
pub fn spawn(
    binary: Option<PathBuf>,
    published: watch::Receiver<Arc<Published>>,
    stop: watch::Receiver<bool>,
) -> (watch::Receiver<Arc<Published>>, JoinHandle<()>) {
    let first = published.borrow().clone();
    // Nothing MPS-shared is served before its daemon answers, not even at start.
    let withheld = wanted(&first.inventory, &first.config)
        .into_keys()
        .collect();
    let (tx, rx) = watch::channel(Arc::new(served(&first, &withheld)));
    let task = tokio::spawn(run(binary, published, stop, tx));
    (rx, task)
}

// Long on purpose: one level-triggered pass (release, forward, start, forward) and its waits;
// the steps share the running set, the retry timer and the status wake-up.
async fn run(
    binary: Option<PathBuf>,
    mut published: watch::Receiver<Arc<Published>>,
    mut stop: watch::Receiver<bool>,
    out: watch::Sender<Arc<Published>>,
) {
    let mut running: BTreeMap<String, Running> = BTreeMap::new();
    // Any daemon's state changed: one wake-up for all of them.
    let changed = Arc::new(Notify::new());
    let mut backoff = gpuops_backoff::Policy::new(Duration::from_secs(1), Duration::from_secs(60))
        .jitter(0.2)
        .start();
    let mut reported_missing: BTreeSet<String> = BTreeSet::new();
    loop {
        if *stop.borrow() {
            break;
        }
        let input = published.borrow_and_update().clone();
        let want = wanted(&input.inventory, &input.config);
        let root = PathBuf::from(input.config.mps_root());
        if binary.is_none() {
            let names: BTreeSet<String> = want.keys().cloned().collect();
            if !names.is_empty() && names != reported_missing {
                tracing::error!(
                    resources = ?names,
                    "MPS sharing of {names:?} needs NVIDIA's nvidia-cuda-mps-control (--mps-control-binary): not serving them"
                );
            }
            reported_missing = names;
        }
        // Gone, changed, moved to another root, or ended: released before anything starts, so
        // a replaced daemon never shares its pipe directory with the new one.
        let stale: Vec<String> = running
            .iter()
            .filter(|(name, r)| {
                want.get(*name) != Some(&r.spec)
                    || r.root != root
                    || r.daemon.status().borrow().state == State::Stopped
            })
            .map(|(name, _)| name.clone())
            .collect();
        for name in stale {
            if let Some(r) = running.remove(&name) {
                tracing::info!(resource = %name, "MPS control daemon no longer wanted as it runs: quitting it");
                r.daemon.release().await;
            }
        }
        forward(&input, &want, &running, &out);
        let mut failed = false;
        if let Some(binary) = &binary {
            for (name, spec) in &want {
                if running.contains_key(name) || *stop.borrow() {
                    continue;
                }
                let config = Config::new(binary.clone(), root.clone());
                match Daemon::start(config, spec.clone(), stop.clone()).await {
                    Ok(daemon) => {
                        tracing::info!(resource = %name, pipe = %daemon.dirs().pipe.display(), "MPS control daemon for {name} running");
                        tokio::spawn(follow(daemon.status(), Arc::clone(&changed)));
                        running.insert(
                            name.clone(),
                            Running {
                                spec: spec.clone(),
                                root: root.clone(),
                                daemon,
                            },
                        );
                    }
                    Err(e) => {
                        failed = true;
                        tracing::error!(resource = %name, error = %e, "MPS control daemon for {name}: {e}; not serving {name} until it starts");
                    }
                }
            }
        }
        forward(&input, &want, &running, &out);
        let retry_in = if failed {
            Some(backoff.failed())
        } else {
            backoff.reset();
            None
        };
        tokio::select! {
            c = published.changed() => if c.is_err() { break },
            _ = stop.wait_for(|s| *s) => break,
            _ = changed.notified() => {}
            _ = sleep_or_never(retry_in) => {}
        }
    }
    // The supervisors quit on the stop signal by themselves; waiting here keeps the agent's
    // drain until they did.
    let quits: Vec<JoinHandle<()>> = running
        .into_values()
        .map(|r| tokio::spawn(r.daemon.release()))
        .collect();
    for q in quits {
        let _ = q.await;
    }
}

/// Publishes what the plugin servers serve when it differs from what they have.
fn forward(
    input: &Arc<Published>,
    want: &BTreeMap<String, DaemonSpec>,
    running: &BTreeMap<String, Running>,
    out: &watch::Sender<Arc<Published>>,
) {
    let withheld: BTreeSet<String> = want
        .keys()
        .filter(|name| {
            running
                .get(*name)
                .is_none_or(|r| r.daemon.status().borrow().state != State::Running)
        })
        .cloned()
        .collect();
    let next = served(input, &withheld);
    out.send_if_modified(|have| {
        // A new input (inventory, config) goes through even with the same resources: Allocate
        // reads the config from it.
        if have.resources == next.resources && Arc::ptr_eq(&have.inventory, &input.inventory) {
            return false;
        }
        *have = Arc::new(next);
        true
    });
}

/// Wakes the loop whenever the daemon's state changes, until its supervisor ends.
async fn follow(mut status: watch::Receiver<gpuops_mps::Status>, changed: Arc<Notify>) {
    while status.changed().await.is_ok() {
        changed.notify_one();
    }
    changed.notify_one();
}

async fn sleep_or_never(wait: Option<Duration>) {
    match wait {
        Some(d) => tokio::time::sleep(d).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use gpuops_inventory::{Gpu, Memory};
    use gpuops_resources::config::Overrides;
    use gpuops_resources::health::HealthTracker;

    fn gpu(index: u32, mib: u64) -> Gpu {
        Gpu {
            index,
            uuid: format!("GPU-{index}"),
            memory: Memory {
                total_mib: mib,
                ..Memory::default()
            },
            ..Gpu::default()
        }
    }

    fn inventory() -> Inventory {
        Inventory {
            gpus: vec![gpu(0, 81920), gpu(1, 40960)],
            ..Inventory::default()
        }
    }

    fn config(yaml: &str) -> PluginConfig {
        PluginConfig::effective(
            Some(PluginConfig::parse(yaml, "test").unwrap()),
            &Overrides::default(),
            &Overrides::default(),
        )
        .unwrap()
    }

    const MPS4: &str =
        "version: v1\nsharing:\n  mps:\n    resources: [{name: nvidia.com/gpu, replicas: 4}]\n";

    fn published(yaml: &str) -> Published {
        crate::feed::publish(
            &inventory(),
            &config(yaml),
            &HealthTracker::default(),
            &Arc::new(gpuops_resources::HostDevices::default()),
        )
        .unwrap()
    }

    #[test]
    fn one_daemon_per_mps_resource_with_nvidias_limits() {
        let want = wanted(&inventory(), &config(MPS4));
        assert_eq!(want.keys().collect::<Vec<_>>(), ["nvidia.com/gpu"]);
        let spec = &want["nvidia.com/gpu"];
        assert_eq!(spec.name, "nvidia.com/gpu");
        // Every GPU behind the resource's replicas, once each.
        assert_eq!(spec.uuids, ["GPU-0", "GPU-1"]);
        assert_eq!(spec.active_thread_percentage, Some(25));
        assert_eq!(
            spec.pinned_limits,
            [
                ("GPU-0".to_string(), "20480M".to_string()),
                ("GPU-1".to_string(), "10240M".to_string())
            ]
            .into()
        );
        spec.validate().unwrap();
    }

    #[test]
    fn no_daemon_without_mps_sharing_or_when_the_config_cannot_be_served() {
        assert!(wanted(&inventory(), &config("version: v1\n")).is_empty());
        let slicing = "version: v1\nsharing:\n  timeSlicing:\n    resources: [{name: nvidia.com/gpu, replicas: 4}]\n";
        assert!(wanted(&inventory(), &config(slicing)).is_empty());
        assert!(wanted(&Inventory::default(), &config(MPS4)).is_empty());
    }

    #[test]
    fn a_renamed_resource_gets_its_own_daemon_name() {
        let renamed = "version: v1\nsharing:\n  mps:\n    renameByDefault: true\n    resources: [{name: nvidia.com/gpu, replicas: 2}]\n";
        let want = wanted(&inventory(), &config(renamed));
        assert_eq!(want.keys().collect::<Vec<_>>(), ["nvidia.com/gpu.shared"]);
        assert_eq!(
            want["nvidia.com/gpu.shared"].active_thread_percentage,
            Some(50)
        );
    }

    #[test]
    fn withheld_resources_are_left_out_and_the_rest_kept() {
        let p = published(MPS4);
        assert_eq!(p.resources.len(), 1);
        let none = served(&p, &BTreeSet::new());
        assert_eq!(none.resources, p.resources);
        let gone = served(&p, &["nvidia.com/gpu".to_string()].into());
        assert!(gone.resources.is_empty());
    }

    /// Without a control binary the MPS resource is not served (NVIDIA's device plugin does not
    /// serve it when its daemon is not ready), and dropping MPS from the config serves the GPUs
    /// again at once.
    #[tokio::test]
    async fn without_a_binary_mps_resources_are_withheld_and_the_rest_served() {
        let (tx, rx) = watch::channel(Arc::new(published(MPS4)));
        let (stop_tx, stop_rx) = watch::channel(false);
        let (mut out, task) = spawn(None, rx, stop_rx);
        assert!(out.borrow_and_update().resources.is_empty());
        tx.send(Arc::new(published("version: v1\n"))).unwrap();
        let within = Duration::from_secs(30);
        tokio::time::timeout(
            within,
            out.wait_for(|p| p.resources.iter().any(|r| r.name == "nvidia.com/gpu")),
        )
        .await
        .unwrap()
        .unwrap();
        stop_tx.send(true).unwrap();
        tokio::time::timeout(within, task).await.unwrap().unwrap();
    }
}
