//! `--check`: per node, what gpuops would write differently from what NVIDIA's stack wrote, from
//! the node's current labels and allocatable and the agent's own config and label-key code.

use crate::MigrateError;
use crate::objects::{at, flatten};
use crate::translate::Plan;
use gpuops_resources::config::{
    Config, Overrides, ReplicatedDevices, qualify_resource_name, select_named,
};
use serde_json::Value;
use std::collections::{BTreeMap, HashMap};

/// One label or resource that changes on a node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    /// `label` or `resource`.
    pub kind: &'static str,
    pub key: String,
    /// The value (label) or allocatable count (resource) now; `None` when absent.
    pub now: Option<String>,
    /// What gpuops would have; `None` when it would not write or advertise it.
    pub after: Option<String>,
    pub why: String,
}

/// One node's result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeCheck {
    pub node: String,
    /// The device plugin config the node selects (`None`: no config).
    pub config: Option<String>,
    pub changes: Vec<Change>,
    /// NVIDIA labels and resources gpuops writes under the same key.
    pub same: usize,
}

const PRESENT: &str = "nvidia.com/gpu.present";
const PREFIX: &str = "nvidia.com/";

/// Checks every node with an `nvidia.com/` label or resource among `objects`.
pub fn check_nodes(objects: &[Value], plan: &Plan) -> Result<Vec<NodeCheck>, MigrateError> {
    let env: HashMap<String, String> = plan
        .env
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let overrides = Overrides::from_env_map(&env).map_err(|e| MigrateError::BadValue {
        object: "the migrated values".into(),
        field: "device plugin env".into(),
        problem: e.to_string(),
    })?;
    let mut out = Vec::new();
    for node in flatten(objects)?.iter().filter(|o| o.kind == "Node") {
        let labels = string_map(node.v, "metadata.labels");
        let alloc = string_map(node.v, "status.allocatable");
        if !labels
            .keys()
            .chain(alloc.keys())
            .any(|k| k.starts_with(PREFIX))
        {
            continue;
        }
        out.push(check_node(node.name, &labels, &alloc, plan, &overrides));
    }
    Ok(out)
}

fn string_map(v: &Value, path: &str) -> BTreeMap<String, String> {
    at(v, path)
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .filter_map(|(k, v)| v.as_str().map(|s| (k.clone(), s.to_string())))
                .collect()
        })
        .unwrap_or_default()
}

// Long on purpose: one comparison per label family and resource, read top to bottom as the
// table `--check` prints.
fn check_node(
    node: &str,
    labels: &BTreeMap<String, String>,
    alloc: &BTreeMap<String, String>,
    plan: &Plan,
    overrides: &Overrides,
) -> NodeCheck {
    let mut changes = Vec::new();
    let mut same = 0;
    let selector = labels
        .get("nvidia.com/device-plugin.config")
        .map(String::as_str);
    let (config_name, cfg) =
        match select_named(&plan.configs, selector, plan.default_config.as_deref()).and_then(|s| {
            Config::effective(Some(s.config), overrides, &Overrides::default()).map(|c| (s.name, c))
        }) {
            Ok(x) => x,
            Err(e) => {
                changes.push(Change {
                    kind: "config",
                    key: "nvidia.com/device-plugin.config".into(),
                    now: selector.map(str::to_string),
                    after: None,
                    why: format!("the agent would not start its device plugin: {e}"),
                });
                return NodeCheck {
                    node: node.to_string(),
                    config: None,
                    changes,
                    same,
                };
            }
        };

    // Resources: the same names unless a sharing entry renames (NVIDIA ignores rename).
    let (strategy_kind, section) = cfg.sharing.active();
    let renames: BTreeMap<String, String> = section
        .map(|s| {
            s.resources
                .iter()
                .filter_map(|r| {
                    let base = qualify_resource_name(&r.name.value).ok()?;
                    let nvidia = if s.rename_by_default {
                        format!("{base}.shared")
                    } else {
                        base
                    };
                    let to = qualify_resource_name(&r.rename.as_ref()?.value).ok()?;
                    Some((nvidia, to))
                })
                .collect()
        })
        .unwrap_or_default();
    for (key, count) in alloc.iter().filter(|(k, _)| k.starts_with(PREFIX)) {
        match renames.get(key) {
            Some(to) if to != key => changes.push(Change {
                kind: "resource",
                key: key.clone(),
                now: Some(count.clone()),
                after: None,
                why: format!(
                    "advertised as {to} instead: the config's rename, which NVIDIA's plugin ignores"
                ),
            }),
            _ => same += 1,
        }
    }

    // Labels.
    let strategy = match cfg.mig_strategy() {
        gpuops_resources::config::MigStrategy::None => None,
        gpuops_resources::config::MigStrategy::Single => Some("single"),
        gpuops_resources::config::MigStrategy::Mixed => Some("mixed"),
    };
    let invalid = labels
        .get("nvidia.com/gpu.product")
        .is_some_and(|p| p.ends_with("-MIG-INVALID"));
    let gpu_replicas = section.and_then(|s| {
        s.resources
            .iter()
            .find(|r| {
                qualify_resource_name(&r.name.value).ok().as_deref() == Some("nvidia.com/gpu")
                    && matches!(r.devices.value, ReplicatedDevices::All)
            })
            .and_then(|r| r.replicas.value)
    });
    for (key, now) in labels.iter().filter(|(k, _)| k.starts_with(PREFIX)) {
        let expect = |after: Option<String>, why: &str| Change {
            kind: "label",
            key: key.clone(),
            now: Some(now.clone()),
            after,
            why: why.to_string(),
        };
        if gpuops_labels::owned_label_key(key) {
            if !plan.feature_labels {
                changes.push(expect(
                    Some(now.clone()),
                    "featureLabels is false: gpuops leaves it as it is and no longer updates it",
                ));
                continue;
            }
            let want: Option<String> = match key.as_str() {
                "nvidia.com/mig.strategy" => Some(strategy.unwrap_or("none").to_string()),
                "nvidia.com/gpu.sharing-strategy" if !invalid => {
                    Some(strategy_kind.as_str().to_string())
                }
                "nvidia.com/gpu.replicas" if !invalid => {
                    Some(gpu_replicas.unwrap_or(1).to_string())
                }
                _ => None,
            };
            match want {
                Some(w) if key == "nvidia.com/mig.strategy" && strategy.is_none() => {
                    changes.push(expect(
                        None,
                        &format!(
                            "strategy {w}: GFD and gpuops write the key only for single and mixed"
                        ),
                    ));
                }
                Some(w) if w != *now => {
                    changes.push(expect(Some(w), "the migrated config says otherwise"));
                }
                _ => same += 1,
            }
        } else if key == "nvidia.com/vgpu.present" || key.starts_with("nvidia.com/vgpu.") {
            changes.push(expect(
                Some(now.clone()),
                "not written by gpuops (docs/compatibility.md): stays as GFD left it, no longer updated",
            ));
        } else {
            // gpu.present, mig.config, mig.config.state, device-plugin.config, gpu.deploy.*:
            // set by others or read by both; gpuops keeps their meaning.
            same += 1;
        }
    }
    if !labels.contains_key(PRESENT) {
        changes.push(Change {
            kind: "label",
            key: PRESENT.into(),
            now: None,
            after: Some("true".into()),
            why: "the agent writes it (the chart's DaemonSet selects it); label the node before installing".into(),
        });
    }
    NodeCheck {
        node: node.to_string(),
        config: config_name,
        changes,
        same,
    }
}
