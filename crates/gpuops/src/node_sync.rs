//! The agent's writes to its own Node: feature labels, MIG state, the `GPUHealthy` condition, the
//! unhealthy-GPU taint and events.
//!
//! Labels and the condition go through server-side apply, one field manager per set, so a key the
//! agent stops writing is removed and keys of other owners are never touched. Taints are a plain
//! list without merge keys, so the taint is added or removed with an optimistic-concurrency merge
//! patch of the list as read.

use anyhow::{Context, Result};
use k8s_openapi::api::core::v1::{Event, Node};
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::json;
use std::collections::BTreeMap;

/// Field manager of the GFD-compatible feature labels.
pub const FEATURE_MANAGER: &str = "gpuops-agent-labels";
/// Field manager of the MIG state label and annotations.
pub const MIG_MANAGER: &str = "gpuops-agent-mig";
/// Field manager of the `GPUHealthy` condition.
pub const HEALTH_MANAGER: &str = "gpuops-agent-health";
/// `source.component` of the agent's events.
const COMPONENT: &str = "gpuops-agent";

/// Writes to one Node object.
#[derive(Clone)]
pub struct NodeWriter {
    nodes: Api<Node>,
    events: Api<Event>,
    name: String,
}

impl NodeWriter {
    pub async fn connect(name: &str) -> Result<NodeWriter> {
        let client = kube::Client::try_default()
            .await
            .context("connecting to Kubernetes (KUBECONFIG or in-cluster) to label the node")?;
        Ok(NodeWriter {
            nodes: Api::all(client.clone()),
            events: Api::namespaced(client, "default"),
            name: name.to_string(),
        })
    }

    /// Makes `labels` and `annotations` the complete set this field manager owns on the node.
    pub async fn apply_metadata(
        &self,
        manager: &str,
        labels: &BTreeMap<String, String>,
        annotations: &BTreeMap<String, String>,
    ) -> Result<()> {
        let patch = json!({
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": { "name": self.name, "labels": labels, "annotations": annotations },
        });
        self.nodes
            .patch(
                &self.name,
                &PatchParams::apply(manager).force(),
                &Patch::Apply(&patch),
            )
            .await
            .with_context(|| format!("applying {manager}'s labels to node {}", self.name))?;
        Ok(())
    }

    /// Sets one node condition (server-side apply on the status).
    pub async fn apply_condition(
        &self,
        condition: &gpuops_labels::NodeCondition,
        last_transition: &str,
    ) -> Result<()> {
        let now = rfc3339(crate::gpu_source::now_ms() / 1000);
        let patch = json!({
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": { "name": self.name },
            "status": { "conditions": [{
                "type": condition.type_,
                "status": condition.status.as_str(),
                "reason": condition.reason,
                "message": condition.message,
                "lastTransitionTime": last_transition,
                "lastHeartbeatTime": now,
            }]},
        });
        self.nodes
            .patch_status(
                &self.name,
                &PatchParams::apply(HEALTH_MANAGER).force(),
                &Patch::Apply(&patch),
            )
            .await
            .with_context(|| {
                format!(
                    "setting condition {} on node {}",
                    condition.type_, self.name
                )
            })?;
        Ok(())
    }

    /// Makes the taint with `key` present as `taint`, or absent when `None`; other taints stay.
    pub async fn set_taint(&self, key: &str, taint: Option<&gpuops_labels::Taint>) -> Result<()> {
        for _ in 0..5 {
            let node = self
                .nodes
                .get(&self.name)
                .await
                .with_context(|| format!("reading node {}", self.name))?;
            let current = node
                .spec
                .as_ref()
                .and_then(|s| s.taints.clone())
                .unwrap_or_default();
            let mut wanted: Vec<serde_json::Value> = current
                .iter()
                .filter(|t| t.key != key)
                .map(|t| json!({"key": t.key, "value": t.value, "effect": t.effect, "timeAdded": t.time_added}))
                .collect();
            if let Some(t) = taint {
                wanted.push(json!({"key": t.key, "value": t.value, "effect": t.effect}));
            }
            let unchanged = match taint {
                Some(t) => current.iter().any(|c| {
                    c.key == t.key
                        && c.value.as_deref() == Some(t.value.as_str())
                        && c.effect == t.effect
                }),
                None => current.iter().all(|c| c.key != key),
            };
            if unchanged {
                return Ok(());
            }
            let patch = json!({
                "metadata": { "resourceVersion": node.resource_version() },
                "spec": { "taints": wanted },
            });
            match self
                .nodes
                .patch(&self.name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => return Ok(()),
                // Someone else changed the node in between: read it again.
                Err(kube::Error::Api(e)) if e.code == 409 => continue,
                Err(e) => {
                    return Err(e)
                        .with_context(|| format!("updating the taints of node {}", self.name));
                }
            }
        }
        anyhow::bail!(
            "node {} kept changing while its taint was updated",
            self.name
        )
    }

    /// Records an event on the node (`kubectl describe node` shows it).
    pub async fn event(&self, warning: bool, reason: &str, message: &str) -> Result<()> {
        let uid = self
            .nodes
            .get(&self.name)
            .await
            .with_context(|| format!("reading node {}", self.name))?
            .uid()
            .unwrap_or_default();
        let now = rfc3339(crate::gpu_source::now_ms() / 1000);
        let event: Event = serde_json::from_value(json!({
            "metadata": { "generateName": format!("{}.", self.name), "namespace": "default" },
            "involvedObject": { "kind": "Node", "name": self.name, "uid": uid, "apiVersion": "v1" },
            "reason": reason,
            "message": message,
            "type": if warning { "Warning" } else { "Normal" },
            "source": { "component": COMPONENT, "host": self.name },
            "reportingComponent": COMPONENT,
            "reportingInstance": self.name,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }))
        .context("building an event")?;
        self.events
            .create(&PostParams::default(), &event)
            .await
            .with_context(|| format!("recording event {reason} on node {}", self.name))?;
        Ok(())
    }
}

/// `2026-11-30T02:48:49Z` for unix seconds.
pub fn rfc3339(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        (rem / 60) % 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_dates() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339(1_796_000_929), "2026-11-30T01:08:49Z");
    }
}

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
}

/// Keeps the node's labels, condition and taint in step with the snapshots; writes only changes
/// and retries failed writes on the next sync.
pub struct NodeSync {
    writer: NodeWriter,
    opts: NodeOptions,
    labels: Option<BTreeMap<String, String>>,
    condition: Option<gpuops_labels::NodeCondition>,
    transition: String,
    taint: Option<Option<gpuops_labels::Taint>>,
    /// The last write error, so a lasting one is logged once.
    failing: Option<String>,
}

impl NodeSync {
    pub fn new(writer: NodeWriter, opts: NodeOptions) -> NodeSync {
        NodeSync {
            writer,
            opts,
            labels: None,
            condition: None,
            transition: rfc3339(crate::gpu_source::now_ms() / 1000),
            taint: None,
            failing: None,
        }
    }

    pub async fn sync(
        &mut self,
        inv: &gpuops_inventory::Inventory,
        config: &gpuops_resources::config::Config,
        health: &gpuops_resources::health::HealthTracker,
    ) {
        let result = self.try_sync(inv, config, health).await;
        let clock = crate::cmd::agent::clock();
        match result {
            Ok(()) => {
                if self.failing.take().is_some() {
                    println!(
                        "{clock} node {}: labels and condition written again",
                        self.writer.name
                    );
                }
            }
            Err(e) => {
                let message = format!("{e:#}");
                if self.failing.as_deref() != Some(message.as_str()) {
                    eprintln!("{clock} {message}; retrying on the next read");
                    self.failing = Some(message);
                }
            }
        }
    }

    async fn try_sync(
        &mut self,
        inv: &gpuops_inventory::Inventory,
        config: &gpuops_resources::config::Config,
        health: &gpuops_resources::health::HealthTracker,
    ) -> Result<()> {
        if self.opts.feature_labels {
            let ctx = gpuops_labels::LabelContext {
                machine_type: self.opts.machine_type.clone(),
                ..gpuops_labels::LabelContext::default()
            };
            let mut desired = gpuops_labels::gfd_labels(inv, config, &ctx)
                .context("computing the node's feature labels")?;
            desired.insert("nvidia.com/gpu.present".into(), "true".into());
            if self.labels.as_ref() != Some(&desired) {
                // The timestamp says when the labels last changed, so it does not churn the node.
                let mut with_time = desired.clone();
                with_time.insert(
                    "nvidia.com/gfd.timestamp".into(),
                    (crate::gpu_source::now_ms() / 1000).to_string(),
                );
                self.writer
                    .apply_metadata(FEATURE_MANAGER, &with_time, &BTreeMap::new())
                    .await?;
                if let Some(path) = &self.opts.nfd_file {
                    gpuops_atomicfile::write(path, gpuops_labels::nfd_feature_file(&with_time))?;
                }
                println!(
                    "{} node {}: {} feature labels written",
                    crate::cmd::agent::clock(),
                    self.writer.name,
                    with_time.len()
                );
                self.labels = Some(desired);
            }
        }
        let decision =
            gpuops_labels::gpu_health(inv, &unhealthy_devices(inv, health), &self.opts.health);
        if self.condition.as_ref() != Some(&decision.condition) {
            if self.condition.as_ref().map(|c| c.status) != Some(decision.condition.status) {
                self.transition = rfc3339(crate::gpu_source::now_ms() / 1000);
            }
            self.writer
                .apply_condition(&decision.condition, &self.transition)
                .await?;
            println!(
                "{} node {}: condition {}={} ({})",
                crate::cmd::agent::clock(),
                self.writer.name,
                decision.condition.type_,
                decision.condition.status.as_str(),
                decision.condition.reason
            );
            self.condition = Some(decision.condition.clone());
        }
        if self.opts.health.taint_enabled && self.taint.as_ref() != Some(&decision.taint) {
            self.writer
                .set_taint(&self.opts.health.taint_key, decision.taint.as_ref())
                .await?;
            self.taint = Some(decision.taint);
        }
        Ok(())
    }
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
