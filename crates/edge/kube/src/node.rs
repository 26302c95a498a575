//! Writes to one Node: labels and annotations by server-side apply (one field manager per concern,
//! so a key the agent stops writing is removed and other owners' keys are never touched), one
//! condition by server-side apply on the status, one taint by a resourceVersion-guarded merge patch
//! (taints are a list without merge keys), and events through kube's `Recorder`.
//!
//! Every write returns the Node as the API server now has it, so a reconciler compares its next
//! desired state with what is there, not with what it believes it wrote.

use crate::error::{KubeError, bounded};
use crate::watch::strip_managed_fields;
use k8s_openapi::api::core::v1::{Node, ObjectReference};
use kube::api::{Patch, PatchParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::{Api, ResourceExt};
use serde_json::json;
use std::collections::BTreeMap;
use std::time::Duration;

/// Writes to one Node object, each request bounded by the client options' timeout.
#[derive(Clone)]
pub struct NodeWriter {
    nodes: Api<Node>,
    recorder: Recorder,
    name: String,
    timeout: Duration,
}

/// The taint a writer should leave on the node under one key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaintWanted {
    pub key: String,
    pub value: String,
    pub effect: String,
}

impl NodeWriter {
    /// A writer for node `name`; events are reported as `component` from this node.
    pub fn new(client: kube::Client, name: &str, component: &str, timeout: Duration) -> Self {
        let reporter = Reporter {
            controller: component.to_string(),
            instance: Some(name.to_string()),
        };
        NodeWriter {
            nodes: Api::all(client.clone()),
            recorder: Recorder::new(client, reporter),
            name: name.to_string(),
            timeout,
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The node as the API server has it now.
    pub async fn get(&self) -> Result<Node, KubeError> {
        let node = bounded(
            self.timeout,
            || format!("reading node {}", self.name),
            self.nodes.get(&self.name),
        )
        .await?;
        Ok(strip_managed_fields(node))
    }

    /// Makes `labels` and `annotations` the complete set `manager` owns on the node.
    pub async fn apply_metadata(
        &self,
        manager: &str,
        labels: &BTreeMap<String, String>,
        annotations: &BTreeMap<String, String>,
    ) -> Result<Node, KubeError> {
        let patch = json!({
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": { "name": self.name, "labels": labels, "annotations": annotations },
        });
        let params = PatchParams::apply(manager).force();
        let node = bounded(
            self.timeout,
            || format!("applying {manager}'s labels to node {}", self.name),
            self.nodes.patch(&self.name, &params, &Patch::Apply(&patch)),
        )
        .await?;
        Ok(strip_managed_fields(node))
    }

    /// Makes `condition` (a JSON NodeCondition) the one condition `manager` owns on the status.
    pub async fn apply_condition(
        &self,
        manager: &str,
        condition: serde_json::Value,
    ) -> Result<Node, KubeError> {
        let type_ = condition["type"].as_str().unwrap_or_default().to_string();
        let patch = json!({
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": { "name": self.name },
            "status": { "conditions": [condition] },
        });
        let params = PatchParams::apply(manager).force();
        let node = bounded(
            self.timeout,
            || format!("setting condition {type_} on node {}", self.name),
            self.nodes
                .patch_status(&self.name, &params, &Patch::Apply(&patch)),
        )
        .await?;
        Ok(strip_managed_fields(node))
    }

    /// Makes the taint with `key` present as `taint`, or absent when `None`; other taints stay.
    /// `observed` is the node as last seen: when it already agrees nothing is sent.
    pub async fn set_taint(
        &self,
        key: &str,
        taint: Option<&TaintWanted>,
        observed: Option<Node>,
    ) -> Result<Node, KubeError> {
        const ATTEMPTS: u32 = 5;
        let mut node = match observed {
            Some(n) => n,
            None => self.get().await?,
        };
        for _ in 0..ATTEMPTS {
            let current = node
                .spec
                .as_ref()
                .and_then(|s| s.taints.clone())
                .unwrap_or_default();
            if taint_agrees(&current, key, taint) {
                return Ok(node);
            }
            let mut wanted: Vec<serde_json::Value> = current
                .iter()
                .filter(|t| t.key != key)
                .map(|t| json!({"key": t.key, "value": t.value, "effect": t.effect, "timeAdded": t.time_added}))
                .collect();
            if let Some(t) = taint {
                wanted.push(json!({"key": t.key, "value": t.value, "effect": t.effect}));
            }
            // The resourceVersion makes this a compare-and-swap of the whole list.
            let patch = json!({
                "metadata": { "resourceVersion": node.resource_version() },
                "spec": { "taints": wanted },
            });
            let sent = tokio::time::timeout(
                self.timeout,
                self.nodes
                    .patch(&self.name, &PatchParams::default(), &Patch::Merge(&patch)),
            )
            .await;
            match sent {
                Ok(Ok(n)) => return Ok(strip_managed_fields(n)),
                // Someone else changed the node in between: read it again.
                Ok(Err(kube::Error::Api(e))) if e.code == 409 => node = self.get().await?,
                Ok(Err(source)) => {
                    return Err(KubeError::Api {
                        what: format!("updating the taints of node {}", self.name),
                        source,
                    });
                }
                Err(_) => {
                    return Err(KubeError::Timeout {
                        what: format!("updating the taints of node {}", self.name),
                        timeout: self.timeout,
                    });
                }
            }
        }
        Err(KubeError::Conflict {
            what: format!("updating the taints of node {}", self.name),
            attempts: ATTEMPTS,
        })
    }

    /// Records an event on the node (`kubectl describe node` shows it); repeats of the same
    /// reason are folded into one event series by the recorder.
    pub async fn event(
        &self,
        warning: bool,
        reason: &str,
        action: &str,
        message: &str,
    ) -> Result<(), KubeError> {
        let uid = self.get().await?.uid();
        let reference = ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Node".into()),
            name: Some(self.name.clone()),
            uid,
            // Nodes are cluster-scoped; their events live in `default`, as the kubelet's do.
            namespace: Some("default".into()),
            ..ObjectReference::default()
        };
        let event = Event {
            type_: if warning {
                EventType::Warning
            } else {
                EventType::Normal
            },
            reason: reason.to_string(),
            note: Some(message.to_string()),
            action: action.to_string(),
            secondary: None,
        };
        bounded(
            self.timeout,
            || format!("recording event {reason} on node {}", self.name),
            self.recorder.publish(&event, &reference),
        )
        .await
    }
}

/// Whether the taints already hold exactly `taint` under `key` (or nothing under it).
fn taint_agrees(
    current: &[k8s_openapi::api::core::v1::Taint],
    key: &str,
    taint: Option<&TaintWanted>,
) -> bool {
    match taint {
        Some(t) => {
            current.iter().filter(|c| c.key == key).count() == 1
                && current.iter().any(|c| {
                    c.key == t.key
                        && c.value.as_deref() == Some(t.value.as_str())
                        && c.effect == t.effect
                })
        }
        None => current.iter().all(|c| c.key != key),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Taint;

    fn taint(key: &str, value: &str) -> Taint {
        Taint {
            key: key.into(),
            value: Some(value.into()),
            effect: "NoSchedule".into(),
            time_added: None,
        }
    }

    #[test]
    fn taints_agree_only_when_the_key_holds_exactly_the_wanted_value() {
        let wanted = TaintWanted {
            key: "gpuops.io/gpu-unhealthy".into(),
            value: "XidError".into(),
            effect: "NoSchedule".into(),
        };
        let other = taint("dedicated", "ml");
        assert!(taint_agrees(
            std::slice::from_ref(&other),
            "gpuops.io/gpu-unhealthy",
            None
        ));
        assert!(!taint_agrees(
            std::slice::from_ref(&other),
            "gpuops.io/gpu-unhealthy",
            Some(&wanted)
        ));
        let ours = taint("gpuops.io/gpu-unhealthy", "XidError");
        assert!(taint_agrees(
            &[other.clone(), ours.clone()],
            &wanted.key,
            Some(&wanted)
        ));
        assert!(!taint_agrees(
            std::slice::from_ref(&ours),
            &wanted.key,
            None
        ));
        let stale = taint("gpuops.io/gpu-unhealthy", "GpuLost");
        assert!(!taint_agrees(&[stale], &wanted.key, Some(&wanted)));
    }
}
