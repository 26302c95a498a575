//! The node agent's runtime: one task per job joined by `watch` channels from one node state.
//!
//! ```text
//!  snapshot loop (the only NVML caller, with a deadline) ──┐
//!  XID thread (blocking NVML event wait) ──────────────────┤──> NodeState ──┬─> config + device plugin feed ─> MPS daemons ─> plugin servers
//!                                                          │                ├─> exporter (PodResources, render) ─> /metrics
//!                                                          │                ├─> node reconciler (labels, condition, taint, annotation)
//!  node watch (API server) ─> observed Node ───────────────┴────────────────┴─> MIG reconciler + executor (gpuops-migexec, in-process)
//! ```
//!
//! Nothing that waits on the network sits in the snapshot loop, so a hung API server or kubelet
//! cannot delay XID handling, the device plugins' health, metrics or shutdown. The node reconciler
//! compares what it wants with the Node it observes (watched, and as returned by every write), so
//! whatever someone else removes, or a failed write left behind, is repaired at the next pass.

mod cdi;
mod changes;
mod config_warnings;
mod dra;
mod error;
mod exporter;
mod feed;
#[cfg(test)]
mod hung;
mod mig;
pub mod mps;
mod named;
mod node;
mod podresources;
pub mod prepare;
mod snapshot;
mod startup;
mod state;
mod xid;

pub use cdi::{CdiConfig, GenerateRoots, generate_inputs, probe_driver, update_ldcache};
pub use changes::{Change, changes};
pub use dra::{
    Allocated, CLAIM_CDI_KIND, DraConfig, Preparer, allocated_here, check_flags as check_dra_flags,
    claim_cdi_id, claim_spec, claim_spec_path, desired_slices,
};
pub use error::AgentError;
pub use exporter::Served;
pub use feed::{ConfigSource, publish};
/// What the DRA driver's flags configure, re-exported so the binary needs no crate of its own for them.
pub use gpuops_dra::Options as DraOptions;
pub use gpuops_draplugin::{DRIVER_NAME as DRA_DRIVER_NAME, PluginConfig as DraPluginConfig};
pub use gpuops_mps::Config as MpsConfig;
pub use mig::{FlowConfig, REASON_ANNOTATION, SINCE_ANNOTATION, STATE_LABEL};
pub use named::{LABEL as DEVICE_PLUGIN_CONFIG_LABEL, NamedConfigs, load_dir};
pub use node::{FEATURE_MANAGER, HEALTH_MANAGER, MIG_MANAGER, NodeOptions, StartupOptions};
pub use podresources::{MAX_MESSAGE_BYTES as POD_RESOURCES_MAX_MESSAGE_BYTES, list_pod_resources};
pub use snapshot::open_first as open_nvml;
pub use startup::{
    DEFAULT_STARTUP_TAINT, MigWanted, Readiness, StartupTaint, expected_devices, readiness,
};
pub use state::{NodeState, Probes, monotonic_ms, now_ms};
pub use xid::describe_event;

use gpuops_inventory::Inventory;
use gpuops_metrics::{HostnameLabel, XidCounters};
use gpuops_nvml::Gpus;
use gpuops_resources::health::{HealthPolicy, HealthTracker};
use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// Everything the agent does, as configured (the binary fills it from flags and env vars).
pub struct AgentConfig {
    pub node_name: String,
    /// How often the GPUs are re-read (and metrics collected).
    pub interval: Duration,
    /// How long one NVML snapshot may take before the agent says the driver hangs (the call
    /// cannot be cancelled; the loop keeps serving the last snapshot meanwhile).
    pub snapshot_timeout: Duration,
    pub health_policy: HealthPolicy,
    /// Where the device plugin config comes from; resolved the same way whether or not this agent
    /// serves the device plugin (labels need the MIG strategy either way).
    pub config: ConfigSource,
    /// The kubelet's device plugin directory; `None`: no device plugin.
    pub plugin_dir: Option<PathBuf>,
    /// The host's device nodes (`gpuops_deviceplugin::probe_host`), for Allocate's device specs.
    pub host_devices: gpuops_resources::HostDevices,
    pub metrics: Option<MetricsConfig>,
    pub kube: Option<KubeConfig>,
    /// Where to look for NVML while it is not loaded, in order.
    pub nvml_libraries: Vec<gpuops_nvml::Library>,
    /// The host's sysfs, for GPUs opened later.
    pub sysfs_root: PathBuf,
    /// Where and how the agent writes its CDI spec; `None`: it writes none.
    pub cdi: Option<CdiConfig>,
    /// Serve the GPUs as DRA driver `gpu.nvidia.com` (needs `kube`); `None`: no DRA.
    pub dra: Option<DraConfig>,
    /// `nvidia-cuda-mps-control`, for the device plugin's MPS sharing (one daemon per shared
    /// resource, under the config's `mpsRoot`); `None`: MPS-shared resources are not served.
    pub mps_control_binary: Option<PathBuf>,
}

/// The exporter.
pub struct MetricsConfig {
    pub hostname_label: HostnameLabel,
    pub pod_socket: Option<PathBuf>,
    /// The bound metrics socket (bound early, so a taken port fails the start).
    pub listener: gpuops_serve::Listener,
}

/// The agent's Kubernetes side.
#[derive(Debug)]
pub struct KubeConfig {
    pub client: gpuops_kube::ClientOptions,
    /// What the node reconciler keeps on the Node; `None`: nothing is written.
    pub node: Option<NodeOptions>,
    pub mig: Option<FlowConfig>,
    /// How often the node reconciler re-checks the Node even when nothing changed (and refreshes
    /// the condition's heartbeat).
    pub resync: Duration,
}

/// A configured agent on opened GPUs.
pub struct Agent {
    gpus: Option<Arc<Gpus>>,
    first: Inventory,
    config: AgentConfig,
    probes: Probes,
}

/// How long shutdown waits for tasks to drain before it abandons them.
const DRAIN: Duration = Duration::from_secs(1);

impl Agent {
    /// `first` is the snapshot the binary already printed. `gpus` is `None` when NVML could
    /// not be loaded and FAIL_ON_INIT_ERROR is false: the agent then retries
    /// [`AgentConfig::nvml_libraries`] with backoff.
    pub fn new(gpus: Option<Gpus>, first: Inventory, config: AgentConfig) -> Agent {
        Agent {
            gpus: gpus.map(Arc::new),
            first,
            probes: Probes {
                serve: gpuops_serve::Probes::new(),
                last_loop_ms: Arc::new(std::sync::atomic::AtomicU64::new(monotonic_ms())),
                // A loop blocked in NVML past its timeout for a few rounds is not alive.
                stale_after_ms: (config.interval * 3 + config.snapshot_timeout).as_millis() as u64,
                registered: config
                    .plugin_dir
                    .as_ref()
                    .map(|_| Arc::new(std::sync::atomic::AtomicBool::new(false))),
                // Two missed rounds: a slow read is not yet a reason to leave the Service.
                collection_stale_after: config.interval * 2 + config.snapshot_timeout,
            },
            config,
        }
    }

    pub fn probes(&self) -> Probes {
        self.probes.clone()
    }

    /// Runs every task until `shutdown` resolves, then drains them (bounded by [`DRAIN`]).
    // Long on purpose: it starts every job of the agent in dependency order and joins them; each step is a call, and splitting it would only hand the channels between them around.
    pub async fn run(self, shutdown: impl Future<Output = ()>) -> Result<(), AgentError> {
        let Agent {
            gpus,
            first,
            config,
            probes,
        } = self;
        let (stop_tx, stop_rx) = watch::channel(false);
        let mut tasks: Vec<(&'static str, tokio::task::JoinHandle<()>)> = Vec::new();
        let first_state = NodeState {
            inventory: Arc::new(first),
            health: HealthTracker::default(),
            xids: XidCounters::default(),
            collection: Some(Instant::now()),
            nvml_errors: 0,
            nvml_loaded: gpus.is_some(),
        };
        let (state_tx, state_rx) = watch::channel(Arc::new(first_state));
        let (node_tx, node_rx) = watch::channel(None);
        let mig_flow = config.kube.as_ref().and_then(|k| k.mig.clone());
        // With a MIG flow the plugin advertises nothing until its first decision.
        let (busy_tx, busy_rx) = watch::channel(mig_flow.is_some());
        let (mig_report_tx, mig_report_rx) = watch::channel(None);
        // The snapshot loop's NVML handle, shared with the MIG flow (one NVML per process).
        let (opened_tx, opened_rx) = watch::channel(gpus.clone());

        let mut writer = None;
        let mut resync = Duration::from_secs(300);
        let mut kube_client = None;
        if let Some(k) = &config.kube {
            let client = k.client.client().await?;
            kube_client = Some((client.clone(), k.client.request_timeout));
            if let Some((ns, name)) = k.mig.as_ref().and_then(|m| m.configmap.clone()) {
                let (tx, rx) = watch::channel(None);
                let ns_owned = ns.clone();
                let c = client.clone();
                tasks.push((
                    "MIG ConfigMap watch",
                    spawn_until_stopped(
                        async move { gpuops_kube::watch_configmap(c, &ns_owned, name, tx).await },
                        &stop_rx,
                    ),
                ));
                if let Some(file) = k.mig.as_ref().map(|m| m.config_file.clone()) {
                    tasks.push((
                        "MIG ConfigMap copy",
                        tokio::spawn(mig::mirror_configmap(file, rx, stop_rx.clone())),
                    ));
                }
            }
            resync = k.resync;
            let watch_client = client.clone();
            let name = config.node_name.clone();
            tasks.push((
                "node watch",
                spawn_until_stopped(
                    gpuops_kube::watch_node(watch_client, name, node_tx),
                    &stop_rx,
                ),
            ));
            writer = Some(gpuops_kube::NodeWriter::new(
                client,
                &config.node_name,
                "gpuops-agent",
                k.client.request_timeout,
            ));
        } else {
            drop(node_tx);
        }

        if let Some(c) = config.cdi {
            let host = Arc::new(config.host_devices.clone());
            let task = cdi::spawn(c, host, state_rx.clone(), stop_rx.clone())?;
            tasks.push(("CDI spec", task));
        }
        if let Some(d) = config.dra {
            let Some((client, timeout)) = kube_client.clone() else {
                return Err(AgentError::DraNeedsKubernetes);
            };
            let publisher = gpuops_kube::SlicePublisher::new(
                client.clone(),
                &config.node_name,
                &d.plugin.driver,
                timeout,
            );
            tasks.push((
                "DRA ResourceSlices",
                tokio::spawn(dra::publish_slices(
                    publisher,
                    config.node_name.clone(),
                    d.options,
                    d.resync,
                    state_rx.clone(),
                    stop_rx.clone(),
                )),
            ));
            // The kubelet's registration requests reach the plugin through the proxy
            // (gpuops_draplugin::regproxy says why); the plugin's own registration socket sits
            // in its private directory.
            let kubelet_registration = d.plugin.registration_socket();
            let mut plugin = d.plugin.clone();
            plugin.registry_dir = plugin.plugin_dir.join("registration");
            tasks.push((
                "DRA registration proxy",
                tokio::spawn(gpuops_draplugin::regproxy::serve(
                    kubelet_registration,
                    plugin.registration_socket(),
                    stop_rx.clone(),
                )),
            ));
            let mps = d
                .mps
                .clone()
                .map(|c| Arc::new(gpuops_mps::Daemons::new(c, stop_rx.clone())));
            let preparer = Arc::new(dra::Preparer::new(
                client,
                &config.node_name,
                d,
                state_rx.clone(),
                opened_rx.clone(),
                mps,
                Arc::new(config.host_devices.clone()),
                timeout,
            )?);
            let stop = stop_rx.clone();
            tasks.push((
                "DRA kubelet plugin",
                tokio::spawn(async move {
                    // Before the kubelet can ask for anything: a failure is said and serving
                    // goes on (what it left is retried at the next start).
                    if let Err(e) = preparer.destroy_unheld().await {
                        tracing::warn!(error = %e, "DRA: cleaning up MIG devices no claim holds failed: {e}");
                    }
                    if let Err(e) = gpuops_draplugin::serve(plugin, preparer, stop).await {
                        tracing::error!(error = %e, "DRA kubelet plugin stopped: {e}");
                    }
                }),
            ));
        }
        let (config_rx, published_rx, feed_task) = feed::spawn(
            config.config,
            config.host_devices,
            state_rx.clone(),
            busy_rx.clone(),
            node_rx.clone(),
            stop_rx.clone(),
        )
        .map_err(|e| AgentError::Config(Box::new(e)))?;
        tasks.push(("config feed", feed_task));

        if let Some(dir) = config.plugin_dir {
            // An MPS-shared resource reaches the plugin servers once its daemon answers.
            let (served_rx, mps_task) = mps::spawn(
                config.mps_control_binary,
                published_rx.clone(),
                stop_rx.clone(),
            );
            tasks.push(("MPS control daemons", mps_task));
            let (rx, stop) = (served_rx, stop_rx.clone());
            let registered = probes
                .registered
                .clone()
                .unwrap_or_else(|| Arc::new(std::sync::atomic::AtomicBool::new(false)));
            tasks.push((
                "device plugin",
                tokio::spawn(async move {
                    if let Err(e) =
                        gpuops_deviceplugin::serve_reporting(dir, rx, stop, registered).await
                    {
                        tracing::error!(error = %e, "device plugin stopped");
                    }
                }),
            ));
        }

        if let Some(m) = config.metrics {
            let (served, task) = exporter::spawn(
                &config.node_name,
                m.hostname_label,
                m.pod_socket,
                state_rx.clone(),
                stop_rx.clone(),
            );
            tasks.push(("exporter", task));
            tasks.push((
                "metrics server",
                tokio::spawn(exporter::serve(
                    m.listener,
                    served,
                    probes.clone(),
                    state_rx.clone(),
                    stop_rx.clone(),
                )),
            ));
        }

        if let (Some(w), Some(opts)) = (
            writer.clone(),
            config.kube.as_ref().and_then(|k| k.node.clone()),
        ) {
            tasks.push((
                "node reconciler",
                tokio::spawn(node::run(
                    w,
                    opts,
                    resync,
                    state_rx.clone(),
                    config_rx.clone(),
                    node_rx.clone(),
                    mig_report_rx,
                    stop_rx.clone(),
                )),
            ));
        }
        if let (Some(w), Some(cfg)) = (writer, mig_flow) {
            tasks.push((
                "MIG reconciler",
                tokio::spawn(mig::run(
                    cfg,
                    opened_rx,
                    w,
                    node_rx.clone(),
                    state_rx.clone(),
                    busy_tx,
                    mig_report_tx,
                    stop_rx.clone(),
                )),
            ));
        }

        let (reports_tx, reports_rx) = tokio::sync::mpsc::channel(64);
        let healthy = Arc::new(std::sync::Mutex::new(snapshot::healthy_indices(
            &state_rx.borrow().inventory,
        )));
        let stop_xids = Arc::new(std::sync::atomic::AtomicBool::new(false));
        tracing::info!(interval = ?config.interval, "re-reading the GPUs every {:?}", config.interval);
        let xid_thread = snapshot::run(
            snapshot::Loop {
                gpus,
                libraries: config.nvml_libraries,
                sysfs_root: config.sysfs_root,
                reports_tx,
                stop_xids: Arc::clone(&stop_xids),
                interval: config.interval,
                timeout: config.snapshot_timeout,
                policy: config.health_policy,
                healthy,
                live: Arc::clone(&probes.last_loop_ms),
                opened: opened_tx,
            },
            state_tx,
            busy_rx,
            reports_rx,
            shutdown,
        )
        .await;

        tracing::info!("stopping");
        probes.serve.set_ready(false);
        stop_xids.store(true, std::sync::atomic::Ordering::Relaxed);
        let _ = stop_tx.send(true);
        let deadline = tokio::time::Instant::now() + DRAIN;
        for (name, mut task) in tasks {
            if tokio::time::timeout_at(deadline, &mut task).await.is_err() {
                tracing::warn!(task = name, "did not stop in time; abandoned");
                task.abort();
            }
        }
        // The watcher wakes at least every 500 ms; joining it releases NVML cleanly.
        if let Some(thread) = xid_thread {
            let joined = tokio::task::spawn_blocking(move || thread.join());
            let _ = tokio::time::timeout(Duration::from_secs(1), joined).await;
        }
        Ok(())
    }
}

/// Runs `job` on its own task until it ends or `stop` turns true. For the watches: they end only
/// when every receiver of their channel is gone, and this function's caller holds one until the
/// end, so without the stop signal each would hold shutdown up for the whole drain.
fn spawn_until_stopped(
    job: impl Future<Output = ()> + Send + 'static,
    stop: &watch::Receiver<bool>,
) -> tokio::task::JoinHandle<()> {
    let stop = stop.clone();
    tokio::spawn(async move {
        gpuops_kube::runtime::until_stopped(job, &stop).await;
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[tokio::test]
    async fn the_node_watch_gives_way_to_shutdown_while_the_api_server_does_not_answer() {
        let (api, client) = hung::Hung::api_server().await;
        let (node_tx, _node_rx) = watch::channel(None);
        let (stop_tx, stop_rx) = watch::channel(false);
        let task = spawn_until_stopped(
            gpuops_kube::watch_node(client, "node-1".into(), node_tx),
            &stop_rx,
        );
        api.accepted().await;
        stop_tx.send(true).unwrap();
        // The agent's whole drain is DRAIN; the watch must not be what uses it up.
        tokio::time::timeout(DRAIN / 2, task)
            .await
            .expect("the node watch stops while its list is unanswered")
            .unwrap();
    }
}
