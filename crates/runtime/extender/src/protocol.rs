//! The kube-scheduler HTTP extender protocol (`k8s.io/kube-scheduler/extender/v1`) and the
//! `filter` / `prioritize` answers computed with the packing engine.
//!
//! The Go types carry no JSON tags, so the wire names are the Go field names: `Pod`, `Nodes`,
//! `NodeNames`, `FailedNodes`, `FailedAndUnresolvableNodes`, `Error`, `Host`, `Score`. Go decodes
//! field names case-insensitively; we accept the lower-case spellings too.
//!
//! `nodeCacheCapable: true` sends `NodeNames` and expects `NodeNames` back; `false` sends whole
//! `Nodes` and expects the passing `Nodes` back (we echo the objects we were given, unchanged).

use crate::ExtenderError;
use gpuops_kubemodel::{self as state, PodAsk, Snapshot};
use gpuops_packing::{PodSpec, PolicyKind};
use k8s_openapi::api::core::v1::{Node, Pod};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// `MaxExtenderPriority`: extender scores are 0..=10 (the scheduler multiplies by the weight and
/// by 10 to reach its 0..100 node scores).
pub const MAX_PRIORITY: i64 = 10;

/// `ExtenderArgs`: the pod and the candidate nodes.
#[derive(Debug, Deserialize)]
pub struct ExtenderArgs {
    #[serde(rename = "Pod", alias = "pod", default)]
    pub pod: Option<Pod>,
    #[serde(rename = "Nodes", alias = "nodes", default)]
    pub nodes: Option<NodeList>,
    #[serde(
        rename = "NodeNames",
        alias = "nodenames",
        alias = "nodeNames",
        default
    )]
    pub node_names: Option<Vec<String>>,
}

/// A `v1.NodeList`, items kept as given so they go back unchanged.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
pub struct NodeList {
    #[serde(default)]
    pub metadata: serde_json::Map<String, serde_json::Value>,
    #[serde(default, deserialize_with = "null_as_empty")]
    pub items: Vec<serde_json::Value>,
}

fn null_as_empty<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Vec<serde_json::Value>, D::Error> {
    Ok(Option::<Vec<serde_json::Value>>::deserialize(d)?.unwrap_or_default())
}

/// `ExtenderFilterResult`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct FilterResult {
    #[serde(rename = "Nodes", skip_serializing_if = "Option::is_none", default)]
    pub nodes: Option<NodeList>,
    #[serde(rename = "NodeNames", skip_serializing_if = "Option::is_none", default)]
    pub node_names: Option<Vec<String>>,
    #[serde(rename = "FailedNodes", default)]
    pub failed_nodes: BTreeMap<String, String>,
    #[serde(rename = "FailedAndUnresolvableNodes", default)]
    pub failed_and_unresolvable_nodes: BTreeMap<String, String>,
    #[serde(rename = "Error", default)]
    pub error: String,
}

impl PartialEq for NodeList {
    fn eq(&self, other: &Self) -> bool {
        self.items == other.items
    }
}

impl FilterResult {
    /// A result that reports only an error.
    pub fn error(message: impl Into<String>) -> FilterResult {
        FilterResult {
            error: message.into(),
            ..FilterResult::default()
        }
    }
}

/// `HostPriority`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostPriority {
    #[serde(rename = "Host")]
    pub host: String,
    #[serde(rename = "Score")]
    pub score: i64,
}

/// How the extender scores.
#[derive(Debug, Clone)]
pub struct Engine {
    pub policy: PolicyKind,
    /// Typical pods from a trace (`--workload`); None: from the cluster's own pods.
    pub workload: Option<Vec<PodSpec>>,
}

/// The candidates of a request: (name, the node object when `Nodes` was sent).
struct Candidates {
    names: Vec<String>,
    /// Parsed node objects from `Nodes`, to model nodes the watch has not seen yet.
    objects: Vec<Node>,
    /// Whether the scheduler sent `Nodes` (answer with `Nodes`) or `NodeNames`.
    as_objects: bool,
}

fn candidates(args: &ExtenderArgs) -> Result<Candidates, ExtenderError> {
    if let Some(list) = &args.nodes {
        let mut names = Vec::with_capacity(list.items.len());
        let mut objects = Vec::new();
        for (i, item) in list.items.iter().enumerate() {
            let name = item
                .pointer("/metadata/name")
                .and_then(|v| v.as_str())
                .ok_or(ExtenderError::UnnamedNode { index: i })?;
            names.push(name.to_string());
            if let Ok(n) = serde_json::from_value::<Node>(item.clone()) {
                objects.push(n);
            }
        }
        return Ok(Candidates {
            names,
            objects,
            as_objects: true,
        });
    }
    if let Some(names) = &args.node_names {
        return Ok(Candidates {
            names: names.clone(),
            objects: Vec::new(),
            as_objects: false,
        });
    }
    Err(ExtenderError::NoCandidates)
}

/// The nodes to model: the watched ones, replaced or completed by objects the request carried.
fn merged<'a>(watched: &'a [&'a Node], given: &'a [Node]) -> Vec<&'a Node> {
    let mut out: Vec<&Node> = given.iter().collect();
    for n in watched {
        if !given.iter().any(|g| g.metadata.name == n.metadata.name) {
            out.push(n);
        }
    }
    out
}

/// The pod and its ask.
fn pod_of(args: &ExtenderArgs) -> Result<(&Pod, PodAsk), ExtenderError> {
    let pod = args.pod.as_ref().ok_or(ExtenderError::NoPod)?;
    Ok((pod, state::pod_ask(pod)))
}

/// Answers a `filter` call: nodes where the pod's GPU share fits in the engine's model pass.
/// Pods that request no GPU resource pass everywhere (the extender does not handle them).
pub fn filter(
    args: &ExtenderArgs,
    nodes: &[&Node],
    pods: &[&Pod],
    engine: &Engine,
) -> FilterResult {
    let (pod, ask) = match pod_of(args) {
        Ok(x) => x,
        Err(e) => return FilterResult::error(e.to_string()),
    };
    let cands = match candidates(args) {
        Ok(c) => c,
        Err(e) => return FilterResult::error(e.to_string()),
    };
    if !ask.is_gpu() {
        let keep = vec![true; cands.names.len()];
        return finish(args, &cands, keep, BTreeMap::new(), BTreeMap::new());
    }
    let all = merged(nodes, &cands.objects);
    let snap = match state::snapshot(&all, pods, Some(&ask), engine.workload.as_deref()) {
        Ok(s) => s,
        Err(e) => return FilterResult::error(format!("{e:#}")),
    };
    let mut failed = BTreeMap::new();
    let mut unresolvable = BTreeMap::new();
    let keep = cands
        .names
        .iter()
        .map(|name| match misfit(&snap, name, &ask) {
            None => true,
            Some((reason, is_final)) => {
                let reason = format!("gpuops: {} does not fit: {reason}", state::pod_key(pod));
                if is_final {
                    unresolvable.insert(name.clone(), reason);
                } else {
                    failed.insert(name.clone(), reason);
                }
                false
            }
        })
        .collect();
    finish(args, &cands, keep, failed, unresolvable)
}

fn finish(
    args: &ExtenderArgs,
    cands: &Candidates,
    keep: Vec<bool>,
    failed: BTreeMap<String, String>,
    unresolvable: BTreeMap<String, String>,
) -> FilterResult {
    let mut out = FilterResult {
        failed_nodes: failed,
        failed_and_unresolvable_nodes: unresolvable,
        ..FilterResult::default()
    };
    if cands.as_objects {
        let given = args.nodes.clone().unwrap_or_default();
        let items = given
            .items
            .into_iter()
            .zip(&keep)
            .filter(|(_, k)| **k)
            .map(|(i, _)| i)
            .collect();
        out.nodes = Some(NodeList {
            metadata: given.metadata,
            items,
        });
    } else {
        out.node_names = Some(
            cands
                .names
                .iter()
                .zip(&keep)
                .filter(|(_, k)| **k)
                .map(|(n, _)| n.clone())
                .collect(),
        );
    }
    out
}

/// Why the pod does not fit node `name` and whether that is final (no GPU of the kind at all):
/// None when it fits or when the node is unknown to the model (it then passes: the scheduler's
/// own checks still apply).
fn misfit(snap: &Snapshot, name: &str, ask: &PodAsk) -> Option<(String, bool)> {
    let i = snap.position(name)?;
    let view = &snap.nodes[i];
    let req = ask.request(view.replicas);
    if view.gpus == 0 {
        return Some(("the node has no NVIDIA GPU".into(), true));
    }
    if u32::from(req.num_gpu) > view.gpus {
        return Some((
            format!("{} GPUs requested, the node has {}", req.num_gpu, view.gpus),
            true,
        ));
    }
    gpuops_packing::extender::misfit(&snap.cluster, i, &req).map(|r| (r, false))
}

/// Answers a `prioritize` call: the engine's policy scores each candidate, min-max normalised
/// to 0..=10 with only the best node(s) at 10 (scores are floored). Pods the extender does not
/// handle, and nodes it cannot model or where the pod does not fit, score 0.
pub fn prioritize(
    args: &ExtenderArgs,
    nodes: &[&Node],
    pods: &[&Pod],
    engine: &Engine,
) -> Result<Vec<HostPriority>, ExtenderError> {
    let (_, ask) = pod_of(args)?;
    let cands = candidates(args)?;
    let zero = |names: &[String]| {
        names
            .iter()
            .map(|n| HostPriority {
                host: n.clone(),
                score: 0,
            })
            .collect()
    };
    if !ask.is_gpu() {
        return Ok(zero(&cands.names));
    }
    let all = merged(nodes, &cands.objects);
    let snap = state::snapshot(&all, pods, Some(&ask), engine.workload.as_deref())
        .map_err(|source| ExtenderError::Model { source })?;
    for note in &snap.notes {
        tracing::debug!("{note}");
    }
    let policy = engine
        .policy
        .build_with_typical(&snap.cluster, &snap.typical);
    let raw: Vec<Option<f64>> = cands
        .names
        .iter()
        .map(|name| {
            let i = snap.position(name)?;
            let req = ask.request(snap.nodes[i].replicas);
            if !snap.cluster.fits(i, &req) {
                return None;
            }
            policy.score(&snap.cluster, i, &req).map(|s| s.score)
        })
        .collect();
    Ok(normalise(&cands.names, &raw))
}

/// Min-max normalisation to 0..=MAX_PRIORITY, floored so that only the best score gets the top.
pub fn normalise(names: &[String], raw: &[Option<f64>]) -> Vec<HostPriority> {
    let (lo, hi) = raw
        .iter()
        .flatten()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(l, h), &v| {
            (l.min(v), h.max(v))
        });
    names
        .iter()
        .zip(raw)
        .map(|(host, r)| {
            let score = match r {
                None => 0,
                Some(_) if hi - lo <= f64::EPSILON * hi.abs().max(1.0) => MAX_PRIORITY,
                Some(v) => ((MAX_PRIORITY as f64) * (v - lo) / (hi - lo)).floor() as i64,
            };
            HostPriority {
                host: host.clone(),
                score: score.clamp(0, MAX_PRIORITY),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;
    use gpuops_kubemodel::testkit::{node, pod};
    use gpuops_kubemodel::{GPU, GPU_SHARED};

    fn engine() -> Engine {
        Engine {
            policy: PolicyKind::Ours,
            workload: None,
        }
    }

    fn args(pod: &Pod, names: &[&str]) -> ExtenderArgs {
        let text = serde_json::json!({
            "Pod": pod,
            "Nodes": null,
            "NodeNames": names,
        })
        .to_string();
        serde_json::from_str(&text).unwrap()
    }

    #[test]
    fn wire_names_match_the_go_types() {
        let r = FilterResult {
            node_names: Some(vec!["a".into()]),
            failed_nodes: [("b".to_string(), "why".to_string())].into(),
            ..FilterResult::default()
        };
        let v = serde_json::to_value(&r).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"NodeNames": ["a"], "FailedNodes": {"b": "why"},
                "FailedAndUnresolvableNodes": {}, "Error": ""})
        );
        let h = serde_json::to_value(HostPriority {
            host: "a".into(),
            score: 7,
        })
        .unwrap();
        assert_eq!(h, serde_json::json!({"Host": "a", "Score": 7}));
        // Lower-case spellings decode too; a null NodeList items decodes as empty.
        let a: ExtenderArgs = serde_json::from_str(
            r#"{"pod": {"metadata": {"name": "p"}}, "nodes": {"items": null}}"#,
        )
        .unwrap();
        assert!(a.pod.is_some() && a.nodes.unwrap().items.is_empty());
    }

    #[test]
    fn bad_json_names_line_and_column() {
        let e = serde_json::from_str::<ExtenderArgs>("{\n \"Pod\": 3}").unwrap_err();
        assert!(e.to_string().contains("line 2 column"), "{e}");
    }

    #[test]
    fn filter_by_names_and_by_objects() {
        let a = node("a", 1, 4, false);
        let b = node("b", 1, 1, false);
        let c: Node =
            serde_json::from_value(serde_json::json!({"metadata": {"name": "c"}})).unwrap();
        // a: one GPU, 4 replicas, 3 bound (750 milli used); b: whole GPU free.
        let bound: Vec<Pod> = (0..3)
            .map(|i| pod(&format!("b{i}"), Some("a"), GPU, 1, None))
            .collect();
        let bound_refs: Vec<&Pod> = bound.iter().collect();
        let p = pod("new", None, GPU, 1, Some(500));
        let r = filter(
            &args(&p, &["a", "b", "c", "unknown"]),
            &[&a, &b, &c],
            &bound_refs,
            &engine(),
        );
        assert_eq!(r.error, "");
        assert_eq!(
            r.node_names,
            Some(vec!["b".to_string(), "unknown".to_string()])
        );
        assert!(
            r.failed_nodes["a"].contains("no GPU with 500 milli free (most free: 250)"),
            "{r:?}"
        );
        assert!(r.failed_and_unresolvable_nodes["c"].contains("no NVIDIA GPU"));

        // Nodes sent as objects come back as objects, unchanged.
        let text =
            serde_json::json!({"Pod": p, "Nodes": {"metadata": {}, "items": [a, b]}}).to_string();
        let with_objects: ExtenderArgs = serde_json::from_str(&text).unwrap();
        let r = filter(&with_objects, &[], &bound_refs, &engine());
        let items = r.nodes.unwrap().items;
        assert_eq!(items.len(), 1);
        assert_eq!(items[0], serde_json::to_value(&b).unwrap());
        assert!(r.node_names.is_none());
    }

    #[test]
    fn pods_without_gpu_requests_pass_through() {
        let a = node("a", 1, 1, false);
        let full = pod("full", Some("a"), GPU, 1, None);
        let lookalike = pod("x", None, GPU, 0, Some(300)); // annotation only
        let r = filter(&args(&lookalike, &["a"]), &[&a], &[&full], &engine());
        assert_eq!(r.node_names, Some(vec!["a".to_string()]));
        let s = prioritize(&args(&lookalike, &["a"]), &[&a], &[&full], &engine()).unwrap();
        assert_eq!(
            s,
            vec![HostPriority {
                host: "a".into(),
                score: 0
            }]
        );
    }

    #[test]
    fn errors_are_reported_not_panicked() {
        let r = filter(
            &serde_json::from_str::<ExtenderArgs>(r#"{"NodeNames": ["a"]}"#).unwrap(),
            &[],
            &[],
            &engine(),
        );
        assert!(r.error.contains("no Pod"), "{r:?}");
        let p = pod("p", None, GPU, 1, None);
        let r = filter(
            &serde_json::from_str::<ExtenderArgs>(&serde_json::json!({"Pod": p}).to_string())
                .unwrap(),
            &[],
            &[],
            &engine(),
        );
        assert!(r.error.contains("neither Nodes nor NodeNames"));
        // A GPU pod with no node the engine can model at all.
        let r = filter(&args(&p, &["a"]), &[], &[], &engine());
        assert!(r.error.contains("cannot model the nodes"), "{r:?}");
    }

    #[test]
    fn prioritize_prefers_completing_a_shared_gpu() {
        // a: one GPU with 750 milli used (3 of 4 replicas); b: idle GPU. A 250-milli pod
        // completes a's GPU: our policy scores a best; b keeps its whole GPU.
        let a = node("a", 1, 4, true);
        let b = node("b", 1, 4, true);
        let bound: Vec<Pod> = (0..3)
            .map(|i| pod(&format!("b{i}"), Some("a"), GPU_SHARED, 1, None))
            .collect();
        let refs: Vec<&Pod> = bound.iter().collect();
        let p = pod("new", None, GPU_SHARED, 1, None);
        let s = prioritize(&args(&p, &["a", "b", "zz"]), &[&a, &b], &refs, &engine()).unwrap();
        assert_eq!(
            s,
            vec![
                HostPriority {
                    host: "a".into(),
                    score: 10
                },
                HostPriority {
                    host: "b".into(),
                    score: 0
                },
                HostPriority {
                    host: "zz".into(),
                    score: 0
                },
            ]
        );
    }

    #[test]
    fn normalisation_floors_below_the_best() {
        let names: Vec<String> = ["a", "b", "c", "d"].iter().map(|s| s.to_string()).collect();
        let s = normalise(&names, &[Some(100.0), Some(99.0), Some(0.0), None]);
        assert_eq!(
            s.iter().map(|h| h.score).collect::<Vec<_>>(),
            vec![10, 9, 0, 0]
        );
        let s = normalise(&names[..2], &[Some(5.0), Some(5.0)]);
        assert_eq!(s.iter().map(|h| h.score).collect::<Vec<_>>(), vec![10, 10]);
    }
}
