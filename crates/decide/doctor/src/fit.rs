//! The scheduler's node filters the doctor recomputes: taints/tolerations, nodeSelector and
//! required node affinity.

use k8s_openapi::api::core::v1::{Node, NodeSelectorRequirement, Pod, Taint, Toleration};
use std::collections::BTreeMap;

/// The taint the node lifecycle puts on a cordoned node; the doctor treats `spec.unschedulable` as it.
pub const UNSCHEDULABLE_TAINT: &str = "node.kubernetes.io/unschedulable";

/// Whether `t` tolerates `taint` (the scheduler's rule; `PreferNoSchedule` never blocks).
pub fn tolerates(t: &Toleration, taint: &Taint) -> bool {
    gpuops_kubemodel::fit::tolerates_parts(
        t.key.as_deref().unwrap_or(""),
        t.operator.as_deref().unwrap_or(""),
        t.value.as_deref().unwrap_or(""),
        t.effect.as_deref().unwrap_or(""),
        &taint.key,
        taint.value.as_deref().unwrap_or(""),
        &taint.effect,
    )
}

/// The node's taints that block scheduling, with `spec.unschedulable` as its taint.
pub fn blocking_taints(node: &Node) -> Vec<Taint> {
    let spec = node.spec.as_ref();
    let mut out: Vec<Taint> = spec
        .and_then(|s| s.taints.as_ref())
        .into_iter()
        .flatten()
        .filter(|t| t.effect == "NoSchedule" || t.effect == "NoExecute")
        .cloned()
        .collect();
    if spec.and_then(|s| s.unschedulable).unwrap_or(false) {
        out.push(Taint {
            key: UNSCHEDULABLE_TAINT.into(),
            effect: "NoSchedule".into(),
            ..Taint::default()
        });
    }
    out
}

/// The taints in `taints` the pod does not tolerate.
pub fn untolerated<'a>(pod: &Pod, taints: &'a [Taint]) -> Vec<&'a Taint> {
    let tols: &[Toleration] = pod
        .spec
        .as_ref()
        .and_then(|s| s.tolerations.as_deref())
        .unwrap_or(&[]);
    taints
        .iter()
        .filter(|taint| !tols.iter().any(|t| tolerates(t, taint)))
        .collect()
}

/// Whether the pod tolerates every one of `taints` (as [`untolerated`] is empty, without allocating).
pub fn tolerates_all(pod: &Pod, taints: &[Taint]) -> bool {
    let tols: &[Toleration] = pod
        .spec
        .as_ref()
        .and_then(|s| s.tolerations.as_deref())
        .unwrap_or(&[]);
    taints
        .iter()
        .all(|taint| tols.iter().any(|t| tolerates(t, taint)))
}

/// Whether the pod's nodeSelector and required node affinity admit a node with these labels.
pub fn selects(pod: &Pod, node_name: &str, labels: &BTreeMap<String, String>) -> bool {
    gpuops_kubemodel::pod_constraints(pod)
        .1
        .admits(node_name, labels)
}

/// Whether the pod constrains nodes at all (nodeSelector or required node affinity).
pub fn has_node_constraints(pod: &Pod) -> bool {
    pod.spec.as_ref().is_some_and(|s| {
        s.node_selector.as_ref().is_some_and(|m| !m.is_empty())
            || s.affinity
                .as_ref()
                .and_then(|a| a.node_affinity.as_ref())
                .and_then(|a| {
                    a.required_during_scheduling_ignored_during_execution
                        .as_ref()
                })
                .is_some()
    })
}

/// The label keys the pod's constraints look at.
pub fn constraint_keys(pod: &Pod) -> Vec<String> {
    let Some(spec) = pod.spec.as_ref() else {
        return Vec::new();
    };
    let mut keys: Vec<String> = spec
        .node_selector
        .iter()
        .flatten()
        .map(|(k, _)| k.clone())
        .collect();
    if let Some(req) = spec
        .affinity
        .as_ref()
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|a| {
            a.required_during_scheduling_ignored_during_execution
                .as_ref()
        })
    {
        for t in &req.node_selector_terms {
            for e in t.match_expressions.iter().flatten() {
                keys.push(e.key.clone());
            }
        }
    }
    keys.sort();
    keys.dedup();
    keys
}

/// The pod's constraints in one line (`nodeSelector {a=b}; affinity: k In [x, y]`).
pub fn describe_constraints(pod: &Pod) -> String {
    let Some(spec) = pod.spec.as_ref() else {
        return String::new();
    };
    let mut parts = Vec::new();
    if let Some(sel) = spec.node_selector.as_ref().filter(|m| !m.is_empty()) {
        let pairs: Vec<String> = sel.iter().map(|(k, v)| format!("{k}={v}")).collect();
        parts.push(format!("nodeSelector {{{}}}", pairs.join(", ")));
    }
    if let Some(req) = spec
        .affinity
        .as_ref()
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|a| {
            a.required_during_scheduling_ignored_during_execution
                .as_ref()
        })
    {
        let terms: Vec<String> = req
            .node_selector_terms
            .iter()
            .map(|t| {
                t.match_expressions
                    .iter()
                    .flatten()
                    .chain(t.match_fields.iter().flatten())
                    .map(describe_requirement)
                    .collect::<Vec<_>>()
                    .join(" and ")
            })
            .collect();
        parts.push(format!("required node affinity: {}", terms.join(" or ")));
    }
    parts.join("; ")
}

fn describe_requirement(r: &NodeSelectorRequirement) -> String {
    match r.values.as_deref() {
        Some(v) if !v.is_empty() => format!("{} {} [{}]", r.key, r.operator, v.join(", ")),
        _ => format!("{} {}", r.key, r.operator),
    }
}

/// A taint as `key=value:Effect`.
pub fn describe_taint(t: &Taint) -> String {
    match t.value.as_deref().filter(|v| !v.is_empty()) {
        Some(v) => format!("{}={v}:{}", t.key, t.effect),
        None => format!("{}:{}", t.key, t.effect),
    }
}

/// The toleration that admits `t`, as pod-spec YAML.
pub fn toleration_yaml(t: &Taint) -> String {
    match t.value.as_deref().filter(|v| !v.is_empty()) {
        Some(v) => format!(
            "- key: {}\n  operator: Equal\n  value: {v}\n  effect: {}",
            t.key, t.effect
        ),
        None => format!(
            "- key: {}\n  operator: Exists\n  effect: {}",
            t.key, t.effect
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{
        Affinity, NodeAffinity, NodeSelector, NodeSelectorTerm, PodSpec,
    };

    fn taint(key: &str, value: Option<&str>, effect: &str) -> Taint {
        Taint {
            key: key.into(),
            value: value.map(Into::into),
            effect: effect.into(),
            ..Taint::default()
        }
    }

    fn tol(
        key: Option<&str>,
        op: Option<&str>,
        value: Option<&str>,
        effect: Option<&str>,
    ) -> Toleration {
        Toleration {
            key: key.map(Into::into),
            operator: op.map(Into::into),
            value: value.map(Into::into),
            effect: effect.map(Into::into),
            ..Toleration::default()
        }
    }

    #[test]
    fn tolerations_match_like_the_scheduler() {
        let gpu = taint("nvidia.com/gpu", Some("present"), "NoSchedule");
        let cases = [
            (
                tol(Some("nvidia.com/gpu"), Some("Exists"), None, None),
                true,
            ),
            (
                tol(
                    Some("nvidia.com/gpu"),
                    Some("Exists"),
                    None,
                    Some("NoSchedule"),
                ),
                true,
            ),
            (
                tol(
                    Some("nvidia.com/gpu"),
                    Some("Exists"),
                    None,
                    Some("NoExecute"),
                ),
                false,
            ),
            (
                tol(Some("nvidia.com/gpu"), None, Some("present"), None),
                true,
            ),
            (
                tol(Some("nvidia.com/gpu"), Some("Equal"), Some("absent"), None),
                false,
            ),
            (tol(None, Some("Exists"), None, None), true),
            (tol(None, None, None, None), false),
            (tol(Some("other"), Some("Exists"), None, None), false),
        ];
        for (i, (t, want)) in cases.iter().enumerate() {
            assert_eq!(tolerates(t, &gpu), *want, "case {i}: {t:?}");
        }
    }

    fn pod_with(selector: &[(&str, &str)], exprs: Vec<NodeSelectorRequirement>) -> Pod {
        let affinity = (!exprs.is_empty()).then(|| Affinity {
            node_affinity: Some(NodeAffinity {
                required_during_scheduling_ignored_during_execution: Some(NodeSelector {
                    node_selector_terms: vec![NodeSelectorTerm {
                        match_expressions: Some(exprs),
                        match_fields: None,
                    }],
                }),
                ..NodeAffinity::default()
            }),
            ..Affinity::default()
        });
        Pod {
            spec: Some(PodSpec {
                node_selector: (!selector.is_empty()).then(|| {
                    selector
                        .iter()
                        .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
                        .collect()
                }),
                affinity,
                ..PodSpec::default()
            }),
            ..Pod::default()
        }
    }

    fn req(key: &str, op: &str, values: &[&str]) -> NodeSelectorRequirement {
        NodeSelectorRequirement {
            key: key.into(),
            operator: op.into(),
            values: Some(values.iter().map(|v| (*v).to_string()).collect()),
        }
    }

    #[test]
    fn selectors_and_required_affinity() {
        let labels: BTreeMap<String, String> = [
            ("nvidia.com/gpu.product", "NVIDIA-H100-80GB-HBM3"),
            ("nvidia.com/gpu.count", "8"),
        ]
        .iter()
        .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
        .collect();
        let cases = [
            (pod_with(&[], vec![]), true),
            (
                pod_with(
                    &[("nvidia.com/gpu.product", "NVIDIA-H100-80GB-HBM3")],
                    vec![],
                ),
                true,
            ),
            (
                pod_with(
                    &[("nvidia.com/gpu.product", "NVIDIA-A100-SXM4-80GB")],
                    vec![],
                ),
                false,
            ),
            (
                pod_with(
                    &[],
                    vec![req(
                        "nvidia.com/gpu.product",
                        "In",
                        &["NVIDIA-H100-80GB-HBM3", "x"],
                    )],
                ),
                true,
            ),
            (
                pod_with(
                    &[],
                    vec![req(
                        "nvidia.com/gpu.product",
                        "NotIn",
                        &["NVIDIA-H100-80GB-HBM3"],
                    )],
                ),
                false,
            ),
            (
                pod_with(&[], vec![req("nvidia.com/gpu.count", "Gt", &["4"])]),
                true,
            ),
            (
                pod_with(&[], vec![req("nvidia.com/gpu.count", "Lt", &["4"])]),
                false,
            ),
            (
                pod_with(&[], vec![req("missing", "DoesNotExist", &[])]),
                true,
            ),
            (pod_with(&[], vec![req("missing", "Exists", &[])]), false),
        ];
        for (i, (pod, want)) in cases.iter().enumerate() {
            assert_eq!(selects(pod, "n", &labels), *want, "case {i}");
        }
    }
}
