//! The node reconciler: keeps the agent's labels, the `GPUHealthy` condition, the health
//! annotation, the unhealthy-GPU taint and the MIG state label on its Node.
//!
//! Level-triggered: every pass compares what the agent wants with the Node as observed (the
//! watched object, or the one a write returned), never with what it believes it wrote, so a key
//! someone removed or a write that failed is repaired at the next pass. Passes run when the state,
//! the config, the MIG report or the observed Node change, and every resync; a failed pass is
//! retried with jittered exponential backoff.

use crate::mig::MigReport;
use crate::startup::{MigWanted, Readiness, StartupTaint};
use crate::state::NodeState;
use gpuops_kube::{KubeError, NodeWriter, TaintWanted, now_secs, rfc3339};
use gpuops_labels::{ConditionStatus, GPU_HEALTH_ANNOTATION, HealthDecision, NodeCondition};
use gpuops_resources::config::Config;
use k8s_openapi::api::core::v1::Node;
use serde_json::json;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;

/// Field manager of the GFD-compatible feature labels.
pub const FEATURE_MANAGER: &str = "gpuops-agent-labels";
/// Field manager of the MIG state label and annotations.
pub const MIG_MANAGER: &str = "gpuops-agent-mig";
/// Field manager of the `GPUHealthy` condition and the health annotation.
pub const HEALTH_MANAGER: &str = "gpuops-agent-health";
/// Field manager of the `GPUMIGStrategyValid` condition.
pub const MIG_STRATEGY_MANAGER: &str = "gpuops-agent-mig-strategy";
/// Changes whenever the labels are written; ignored when comparing.
const TIMESTAMP_LABEL: &str = "nvidia.com/gfd.timestamp";

/// What the agent keeps on its Node besides MIG state.
#[derive(Debug, Clone)]
pub struct NodeOptions {
    /// Write GFD-compatible feature labels.
    pub feature_labels: bool,
    /// Also write them as a Node Feature Discovery local feature file.
    pub nfd_file: Option<std::path::PathBuf>,
    /// The `GPUHealthy` condition's taint.
    pub health: gpuops_labels::HealthPolicy,
    /// DMI product name, for `nvidia.com/gpu.machine`.
    pub machine_type: Option<String>,
    /// The startup taint removed once the node's devices are advertised and healthy.
    pub startup: Option<StartupOptions>,
}

/// The startup taint and where the MIG layout the node asks for comes from.
#[derive(Debug, Clone)]
pub struct StartupOptions {
    pub taint: StartupTaint,
    /// The MIG flow's config file (`None`: no MIG flow, the GPUs keep their layout).
    pub mig_config_file: Option<std::path::PathBuf>,
    /// The MIG flow's config for a node without `nvidia.com/mig.config`.
    pub mig_default_config: Option<String>,
}

/// The reconciler's loop; returns when `stop` turns true.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn run(
    writer: NodeWriter,
    opts: NodeOptions,
    resync: Duration,
    mut state: watch::Receiver<Arc<NodeState>>,
    mut config: watch::Receiver<Arc<Config>>,
    mut node: watch::Receiver<Option<Arc<Node>>>,
    mut mig: watch::Receiver<Option<MigReport>>,
    mut stop: watch::Receiver<bool>,
) {
    let mut r = Reconciler {
        writer,
        opts,
        resync,
        observed: None,
        labels_written: None,
        heartbeat_at: None,
        startup_waiting: None,
    };
    let mut delays = gpuops_backoff::Policy::new(
        Duration::from_millis(500),
        resync.min(Duration::from_secs(60)),
    )
    .jitter(1.0)
    .start();
    let mut failing: Option<String> = None;
    let mut retry_at: Option<Instant> = None;
    let mut next_resync = Instant::now() + resync;
    loop {
        let wake = retry_at.unwrap_or(next_resync);
        let woken_by_timer = tokio::select! {
            _ = stop.changed() => return,
            changed = state.changed() => { if changed.is_err() { return } false }
            changed = config.changed() => { if changed.is_err() { return } false }
            changed = mig.changed() => { if changed.is_err() { return } false }
            changed = node.changed() => {
                // No watch (the channel's sender is gone): keep going on writes' answers.
                if changed.is_ok() {
                    r.observed = node.borrow_and_update().clone();
                }
                false
            }
            () = tokio::time::sleep_until(wake) => true,
        };
        // While backing off only the timer retries: changes are picked up by that pass.
        if retry_at.is_some_and(|t| Instant::now() < t) && !woken_by_timer {
            continue;
        }
        if woken_by_timer && retry_at.is_none() {
            next_resync = Instant::now() + resync;
        }
        let now_state = state.borrow_and_update().clone();
        let now_config = config.borrow_and_update().clone();
        let now_mig = mig.borrow_and_update().clone();
        // A pass awaits the API server (each request up to its timeout); shutdown does not
        // wait for it, and what it left half-written is repaired by the next agent's pass.
        let Some(passed) = gpuops_kube::runtime::until_stopped(
            r.reconcile(&now_state, &now_config, now_mig.as_ref()),
            &stop,
        )
        .await
        else {
            return;
        };
        match passed {
            Ok(()) => {
                if failing.take().is_some() {
                    tracing::info!(
                        node = r.writer.name(),
                        "node {}: labels and condition written again",
                        r.writer.name()
                    );
                }
                retry_at = None;
                delays.reset();
            }
            Err(e) => {
                let wait = delays.failed();
                let message = e.to_string();
                // A lasting failure is logged once; the retries are not.
                if failing.as_deref() != Some(message.as_str()) {
                    tracing::warn!(node = r.writer.name(), error = %e, kind = e.kind(), retry_in = ?wait, "{message}; retrying with backoff");
                    failing = Some(message);
                }
                retry_at = Some(Instant::now() + wait);
            }
        }
    }
}

struct Reconciler {
    writer: NodeWriter,
    opts: NodeOptions,
    resync: Duration,
    /// The Node as last observed (watched, or returned by a write).
    observed: Option<Arc<Node>>,
    /// The feature labels last applied (to drop keys no longer wanted).
    labels_written: Option<BTreeMap<String, String>>,
    /// When the condition's heartbeat was last written.
    heartbeat_at: Option<Instant>,
    /// Why the startup taint was last kept (logged once per reason).
    startup_waiting: Option<String>,
}

impl Reconciler {
    async fn observed(&mut self) -> Result<Arc<Node>, KubeError> {
        match &self.observed {
            Some(n) => Ok(Arc::clone(n)),
            None => {
                let n = Arc::new(self.writer.get().await?);
                self.observed = Some(Arc::clone(&n));
                Ok(n)
            }
        }
    }

    fn written(&mut self, node: Node) {
        self.observed = Some(Arc::new(node));
    }

    async fn reconcile(
        &mut self,
        state: &NodeState,
        config: &Config,
        mig: Option<&MigReport>,
    ) -> Result<(), KubeError> {
        // A node whose driver cannot be loaded (a CPU node under a DaemonSet without a
        // nodeSelector) is not a GPU node: nothing to say about it.
        if !state.nvml_loaded {
            return Ok(());
        }
        let inv = &state.inventory;
        if self.opts.feature_labels {
            let ctx = gpuops_labels::LabelContext {
                machine_type: self.opts.machine_type.clone(),
                ..gpuops_labels::LabelContext::default()
            };
            match gpuops_labels::gfd_labels(inv, config, &ctx) {
                Ok(mut desired) => {
                    desired.insert("nvidia.com/gpu.present".into(), "true".into());
                    let node = self.observed().await?;
                    if labels_need_write(&desired, self.labels_written.as_ref(), &node) {
                        let mut with_time = desired.clone();
                        with_time.insert(TIMESTAMP_LABEL.into(), now_secs().to_string());
                        let written = self
                            .writer
                            .apply_metadata(FEATURE_MANAGER, &with_time, &BTreeMap::new())
                            .await?;
                        self.written(written);
                        if let Some(path) = &self.opts.nfd_file
                            && let Err(e) = gpuops_atomicfile::write(
                                path,
                                gpuops_labels::nfd_feature_file(&with_time),
                            )
                        {
                            tracing::error!(file = %path.display(), error = %e, "writing the NFD feature file: {e}");
                        }
                        tracing::info!(
                            node = self.writer.name(),
                            labels = with_time.len(),
                            "node {}: {} feature labels written",
                            self.writer.name(),
                            with_time.len()
                        );
                        self.labels_written = Some(desired);
                    }
                }
                Err(e) => {
                    tracing::error!(error = %e, "computing the node's feature labels: {e}");
                }
            }
        }

        let decision = gpuops_labels::gpu_health(
            inv,
            &unhealthy_devices(inv, &state.health),
            &self.opts.health,
        );
        let node = self.observed().await?;
        let annotation = decision.report.to_annotation();
        if annotation_of(&node, GPU_HEALTH_ANNOTATION) != Some(annotation.as_str()) {
            let annotations = BTreeMap::from([(GPU_HEALTH_ANNOTATION.to_string(), annotation)]);
            let written = self
                .writer
                .apply_metadata(HEALTH_MANAGER, &BTreeMap::new(), &annotations)
                .await?;
            self.written(written);
        }
        let node = self.observed().await?;
        let heartbeat_due = self.heartbeat_at.is_none_or(|t| t.elapsed() >= self.resync);
        if let Some(condition) = condition_to_write(
            &decision.condition,
            observed_condition(&node, &decision.condition.type_),
            heartbeat_due,
            &rfc3339(now_secs()),
        ) {
            let changed = observed_condition(&node, &decision.condition.type_).is_none_or(|c| {
                c.status != decision.condition.status.as_str()
                    || c.reason.as_deref() != Some(decision.condition.reason.as_str())
            });
            let written = self
                .writer
                .apply_condition(HEALTH_MANAGER, condition)
                .await?;
            self.written(written);
            self.heartbeat_at = Some(Instant::now());
            if changed {
                tracing::info!(
                    node = self.writer.name(),
                    condition = %decision.condition.type_,
                    status = decision.condition.status.as_str(),
                    reason = %decision.condition.reason,
                    "node {}: condition {}={} ({})",
                    self.writer.name(),
                    decision.condition.type_,
                    decision.condition.status.as_str(),
                    decision.condition.reason
                );
            }
        }
        self.mig_strategy_condition(state, config, heartbeat_due)
            .await?;
        if self.opts.health.taint_enabled {
            let wanted = wanted_taint(&decision);
            let node = self.observed().await?;
            let written = self
                .writer
                .set_taint(
                    &self.opts.health.taint_key,
                    wanted.as_ref(),
                    Some((*node).clone()),
                )
                .await?;
            self.written(written);
        }
        if let Some(startup) = self.opts.startup.clone() {
            self.startup_taint(&startup, state, config).await?;
        }
        if let Some(report) = mig {
            let node = self.observed().await?;
            if !metadata_agrees(&node, &report.labels, &report.annotations) {
                let written = self
                    .writer
                    .apply_metadata(MIG_MANAGER, &report.labels, &report.annotations)
                    .await?;
                self.written(written);
            }
        }
        Ok(())
    }
}

impl Reconciler {
    /// The `GPUMIGStrategyValid` condition: whether the MIG layout fits the strategy (single with
    /// mixed profiles does not: nothing is advertised and GFD's labels say `-MIG-INVALID`). Its
    /// own field manager, so the `GPUHealthy` condition is untouched; a Warning event when it turns
    /// False and a Normal one when it recovers, for `kubectl describe node`.
    async fn mig_strategy_condition(
        &mut self,
        state: &NodeState,
        config: &Config,
        heartbeat_due: bool,
    ) -> Result<(), KubeError> {
        let desired = gpuops_labels::mig_strategy_condition(&state.inventory, config);
        let node = self.observed().await?;
        let observed = observed_condition(&node, &desired.type_);
        let was_false = observed.is_some_and(|c| c.status == ConditionStatus::False.as_str());
        let changed = observed.is_none_or(|c| {
            c.status != desired.status.as_str()
                || c.reason.as_deref() != Some(desired.reason.as_str())
        });
        let Some(condition) =
            condition_to_write(&desired, observed, heartbeat_due, &rfc3339(now_secs()))
        else {
            return Ok(());
        };
        let written = self
            .writer
            .apply_condition(MIG_STRATEGY_MANAGER, condition)
            .await?;
        self.written(written);
        if !changed {
            return Ok(());
        }
        let invalid = desired.status == ConditionStatus::False;
        tracing::info!(
            node = self.writer.name(),
            condition = %desired.type_,
            status = desired.status.as_str(),
            reason = %desired.reason,
            "node {}: condition {}={} ({}): {}",
            self.writer.name(),
            desired.type_,
            desired.status.as_str(),
            desired.reason,
            desired.message
        );
        // A first True says nothing worth an event; a change to or from False does.
        if (invalid || was_false)
            && let Err(e) = self
                .writer
                .event(
                    invalid,
                    &desired.reason,
                    "CheckMIGStrategy",
                    &desired.message,
                )
                .await
        {
            tracing::warn!(error = %e, "recording the MIG strategy event: {e}");
        }
        Ok(())
    }

    /// Removes the startup taint once the node offers what it is configured to. Never adds it:
    /// a startup taint is only for startup. Autoscalers (Cluster Autoscaler, Karpenter) count a
    /// node that carries it as one still coming up; put back later (say, while a MIG change is
    /// pending) it would make them take a running node for one that never became ready and
    /// replace it. An agent restarted while the taint is still there removes it once ready.
    async fn startup_taint(
        &mut self,
        startup: &StartupOptions,
        state: &NodeState,
        config: &Config,
    ) -> Result<(), KubeError> {
        let node = self.observed().await?;
        let carried = node
            .spec
            .as_ref()
            .and_then(|s| s.taints.as_ref())
            .is_some_and(|ts| ts.iter().any(|t| t.key == startup.taint.key));
        if !carried {
            self.startup_waiting = None;
            return Ok(());
        }
        let allocatable: BTreeMap<String, String> = node
            .status
            .as_ref()
            .and_then(|s| s.allocatable.as_ref())
            .map(|a| a.iter().map(|(k, q)| (k.clone(), q.0.clone())).collect())
            .unwrap_or_default();
        let labels = node.metadata.labels.clone().unwrap_or_default();
        let wanted = startup.mig_config_file.as_ref().and_then(|file| {
            labels
                .get(crate::mig::CONFIG_LABEL)
                .cloned()
                .or_else(|| startup.mig_default_config.clone())
                .map(|name| (file, name))
        });
        let parsed = wanted.as_ref().map(|(file, name)| {
            let origin = file.display().to_string();
            std::fs::read_to_string(file)
                .map_err(|error| crate::AgentError::MigConfigRead {
                    path: file.to_path_buf(),
                    error,
                })
                .and_then(|text| Ok(gpuops_mig::config::parse(&text, &origin)?))
                .and_then(|all| {
                    all.get(name)
                        .cloned()
                        .map_err(|error| crate::AgentError::MigConfigIn {
                            file: file.to_path_buf(),
                            error: Box::new(error),
                        })
                })
        });
        // The reason is only shown (in the log and the wait's message).
        let broken: Option<String> = match &parsed {
            Some(Err(e)) => Some(e.to_string()),
            _ => None,
        };
        let mig = match (&parsed, &broken) {
            (Some(Ok(named)), _) => MigWanted::Config(named),
            (_, Some(why)) => MigWanted::Broken(why),
            _ => MigWanted::Current,
        };
        let key = &startup.taint.key;
        match crate::startup::readiness(&state.inventory, config, &state.health, mig, &allocatable)
        {
            Readiness::Ready(summary) => {
                let written = self
                    .writer
                    .set_taint(key, None, Some((*node).clone()))
                    .await?;
                self.written(written);
                self.startup_waiting = None;
                tracing::info!(
                    node = self.writer.name(),
                    taint = %key,
                    "node {}: startup taint {key} removed: {summary} advertised and healthy",
                    self.writer.name()
                );
            }
            Readiness::Waiting(why) => {
                if self.startup_waiting.as_deref() != Some(why.as_str()) {
                    tracing::info!(
                        node = self.writer.name(),
                        taint = %key,
                        "node {}: keeping startup taint {key}: {why}",
                        self.writer.name()
                    );
                    self.startup_waiting = Some(why);
                }
            }
        }
        Ok(())
    }
}

fn wanted_taint(decision: &HealthDecision) -> Option<TaintWanted> {
    decision.taint.as_ref().map(|t| TaintWanted {
        key: t.key.clone(),
        value: t.value.clone(),
        effect: t.effect.clone(),
    })
}

fn annotation_of<'a>(node: &'a Node, key: &str) -> Option<&'a str> {
    node.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(key))
        .map(String::as_str)
}

/// Whether the feature labels must be applied: a wanted label is missing or different on the
/// node, or a label applied before is no longer wanted (server-side apply then removes it).
fn labels_need_write(
    desired: &BTreeMap<String, String>,
    written: Option<&BTreeMap<String, String>>,
    node: &Node,
) -> bool {
    let empty = BTreeMap::new();
    let on_node = node.metadata.labels.as_ref().unwrap_or(&empty);
    let missing = desired.iter().any(|(k, v)| on_node.get(k) != Some(v))
        || !on_node.contains_key(TIMESTAMP_LABEL);
    let dropped = written.is_none_or(|w| w.keys().any(|k| !desired.contains_key(k)));
    missing || dropped
}

/// Whether `labels` and `annotations` are on the node as wanted.
fn metadata_agrees(
    node: &Node,
    labels: &BTreeMap<String, String>,
    annotations: &BTreeMap<String, String>,
) -> bool {
    let has = |map: &Option<BTreeMap<String, String>>, wanted: &BTreeMap<String, String>| {
        wanted
            .iter()
            .all(|(k, v)| map.as_ref().and_then(|m| m.get(k)) == Some(v))
    };
    has(&node.metadata.labels, labels) && has(&node.metadata.annotations, annotations)
}

fn observed_condition<'a>(
    node: &'a Node,
    type_: &str,
) -> Option<&'a k8s_openapi::api::core::v1::NodeCondition> {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == type_))
}

/// The condition to apply, or `None` when the node already has it and no heartbeat is due.
/// `lastTransitionTime` is kept from the observed condition while the status is unchanged (also
/// across agent restarts); the heartbeat is `now`.
fn condition_to_write(
    desired: &NodeCondition,
    observed: Option<&k8s_openapi::api::core::v1::NodeCondition>,
    heartbeat_due: bool,
    now: &str,
) -> Option<serde_json::Value> {
    let same_status = observed.is_some_and(|o| o.status == desired.status.as_str());
    let same = same_status
        && observed.is_some_and(|o| {
            o.reason.as_deref() == Some(desired.reason.as_str())
                && o.message.as_deref() == Some(desired.message.as_str())
        });
    if same && !heartbeat_due {
        return None;
    }
    let transition = observed
        .filter(|_| same_status)
        .and_then(|o| o.last_transition_time.as_ref())
        .and_then(|t| serde_json::to_value(t).ok())
        .unwrap_or_else(|| json!(now));
    Some(json!({
        "type": desired.type_,
        "status": desired.status.as_str(),
        "reason": desired.reason,
        "message": desired.message,
        "lastTransitionTime": transition,
        "lastHeartbeatTime": now,
    }))
}

/// The health tracker's recent XIDs as the labels crate wants them.
fn unhealthy_devices(
    inv: &gpuops_inventory::Inventory,
    health: &gpuops_resources::health::HealthTracker,
) -> Vec<gpuops_labels::UnhealthyDevice> {
    health
        .hits()
        .into_iter()
        .map(|(gpu, gi, ci, xid)| {
            let parent = inv.gpus.iter().find(|g| g.index == gpu);
            let uuid = match (parent, gi) {
                (Some(g), Some(gi)) => g
                    .mig_devices
                    .iter()
                    .find(|m| m.gi_id == gi && ci.is_none_or(|c| c == m.ci_id))
                    .map(|m| m.uuid.clone())
                    .unwrap_or_else(|| g.uuid.clone()),
                (Some(g), None) => g.uuid.clone(),
                (None, _) => String::new(),
            };
            gpuops_labels::UnhealthyDevice {
                uuid,
                gpu_index: Some(gpu),
                cause: gpuops_labels::UnhealthyCause::Xid(xid),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuops_labels::ConditionStatus;

    #[tokio::test]
    #[allow(clippy::unwrap_used, clippy::expect_used)]
    async fn an_api_server_that_never_answers_does_not_hold_shutdown_up() {
        let (api, client) = crate::hung::Hung::api_server().await;
        let writer = NodeWriter::new(client, "node-1", "gpuops-agent", Duration::from_secs(300));
        let opts = NodeOptions {
            feature_labels: false,
            nfd_file: None,
            health: gpuops_labels::HealthPolicy {
                taint_enabled: false,
                taint_key: "nvidia.com/gpu.unhealthy".into(),
            },
            machine_type: None,
            startup: None,
        };
        let state = NodeState {
            inventory: Arc::new(gpuops_inventory::Inventory::default()),
            health: gpuops_resources::health::HealthTracker::default(),
            xids: gpuops_metrics::XidCounters::default(),
            collection: Some(std::time::Instant::now()),
            nvml_errors: 0,
            nvml_loaded: true,
        };
        let (state_tx, state_rx) = watch::channel(Arc::new(state.clone()));
        let (_config_tx, config_rx) = watch::channel(Arc::new(Config::default()));
        let (_node_tx, node_rx) = watch::channel(None);
        let (_mig_tx, mig_rx) = watch::channel(None);
        let (stop_tx, stop_rx) = watch::channel(false);
        let task = tokio::spawn(run(
            writer,
            opts,
            Duration::from_secs(3600),
            state_rx,
            config_rx,
            node_rx,
            mig_rx,
            stop_rx,
        ));
        // A new state starts a pass, which reads the Node from a server that never answers.
        state_tx.send_replace(Arc::new(state));
        api.accepted().await;
        stop_tx.send(true).unwrap();
        tokio::time::timeout(Duration::from_secs(1), task)
            .await
            .expect("the node reconciler stops in the middle of a hung request")
            .unwrap();
    }
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn node_with_labels(labels: &[(&str, &str)]) -> Node {
        Node {
            metadata: ObjectMeta {
                labels: Some(
                    labels
                        .iter()
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .collect(),
                ),
                ..ObjectMeta::default()
            },
            ..Node::default()
        }
    }

    #[test]
    fn labels_are_written_when_one_is_missing_on_the_node_or_no_longer_wanted() {
        let desired: BTreeMap<String, String> = [("nvidia.com/gpu.count", "8")]
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let in_place = node_with_labels(&[("nvidia.com/gpu.count", "8"), (TIMESTAMP_LABEL, "1")]);
        assert!(!labels_need_write(&desired, Some(&desired), &in_place));
        // Someone removed it: the agent's memory says written, the node says otherwise.
        let removed = node_with_labels(&[(TIMESTAMP_LABEL, "1")]);
        assert!(labels_need_write(&desired, Some(&desired), &removed));
        let changed = node_with_labels(&[("nvidia.com/gpu.count", "7"), (TIMESTAMP_LABEL, "1")]);
        assert!(labels_need_write(&desired, Some(&desired), &changed));
        let mut before = desired.clone();
        before.insert("nvidia.com/mig.strategy".into(), "mixed".into());
        assert!(labels_need_write(&desired, Some(&before), &in_place));
        // After a restart the agent does not know what it applied: apply once.
        assert!(labels_need_write(&desired, None, &in_place));
    }

    fn desired(status: ConditionStatus, reason: &str) -> NodeCondition {
        NodeCondition {
            type_: "GPUHealthy".into(),
            status,
            reason: reason.into(),
            message: "8 GPUs healthy".into(),
        }
    }

    fn observed(
        status: &str,
        reason: &str,
        since: &str,
    ) -> k8s_openapi::api::core::v1::NodeCondition {
        serde_json::from_value(json!({
            "type": "GPUHealthy", "status": status, "reason": reason, "message": "8 GPUs healthy",
            "lastTransitionTime": since, "lastHeartbeatTime": since,
        }))
        .unwrap()
    }

    #[test]
    fn the_transition_time_survives_while_the_status_holds_and_the_heartbeat_moves() {
        let now = "2026-12-01T10:00:00Z";
        let before = observed("True", "AllGPUsHealthy", "2026-11-30T08:00:00Z");
        let want = desired(ConditionStatus::True, "AllGPUsHealthy");
        assert!(condition_to_write(&want, Some(&before), false, now).is_none());
        let beat = condition_to_write(&want, Some(&before), true, now).unwrap();
        assert_eq!(beat["lastTransitionTime"], "2026-11-30T08:00:00Z");
        assert_eq!(beat["lastHeartbeatTime"], now);
        let bad = desired(ConditionStatus::False, "XidError");
        let flipped = condition_to_write(&bad, Some(&before), false, now).unwrap();
        assert_eq!(flipped["lastTransitionTime"], now);
        assert_eq!(flipped["status"], "False");
        let fresh = condition_to_write(&want, None, false, now).unwrap();
        assert_eq!(fresh["lastTransitionTime"], now);
    }

    #[test]
    fn mig_metadata_agrees_only_when_every_key_matches() {
        let mut node = node_with_labels(&[("nvidia.com/mig.config.state", "pending")]);
        let labels = BTreeMap::from([(
            "nvidia.com/mig.config.state".to_string(),
            "success".to_string(),
        )]);
        let annotations = BTreeMap::new();
        assert!(!metadata_agrees(&node, &labels, &annotations));
        node.metadata.labels = Some(labels.clone());
        assert!(metadata_agrees(&node, &labels, &annotations));
    }
}
