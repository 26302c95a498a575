//! Hand-written objects for the rules' table-driven tests.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::snapshot::{Sample, Snapshot};
use crate::{Finding, Options, diagnose};
use k8s_openapi::api::core::v1::{
    Container, ContainerState, ContainerStateTerminated, ContainerStatus, Event, Node,
    NodeCondition, NodeSpec, NodeStatus, ObjectReference, Pod, PodCondition, PodSpec, PodStatus,
    ResourceRequirements, Taint, Toleration,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use std::collections::BTreeMap;

pub fn now() -> Timestamp {
    "2026-11-20T12:00:00Z".parse().unwrap()
}

pub fn ago(secs: i64) -> Time {
    Time(now() - SignedDuration::from_secs(secs))
}

pub fn node(name: &str) -> Node {
    Node {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some(BTreeMap::new()),
            creation_timestamp: Some(ago(86_400)),
            ..ObjectMeta::default()
        },
        spec: Some(NodeSpec::default()),
        status: Some(NodeStatus {
            capacity: Some(BTreeMap::new()),
            allocatable: Some(BTreeMap::new()),
            conditions: Some(vec![NodeCondition {
                type_: "Ready".into(),
                status: "True".into(),
                ..NodeCondition::default()
            }]),
            ..NodeStatus::default()
        }),
    }
}

/// A GPU node offering `n` of `resource` (capacity and allocatable), H100 labels, driver 550.
pub fn gpu_node(name: &str, resource: &str, n: i64) -> Node {
    let mut node = node(name);
    set_resource(&mut node, resource, n, n);
    label(&mut node, "nvidia.com/gpu.present", "true");
    label(&mut node, "nvidia.com/gpu.product", "NVIDIA-H100-80GB-HBM3");
    label(&mut node, "nvidia.com/gpu.count", "8");
    label(
        &mut node,
        "nvidia.com/cuda.driver-version.full",
        "550.107.02",
    );
    label(&mut node, "nvidia.com/cuda.driver-version.major", "550");
    node
}

pub fn set_resource(node: &mut Node, resource: &str, capacity: i64, allocatable: i64) {
    let s = node.status.as_mut().unwrap();
    s.capacity
        .get_or_insert_default()
        .insert(resource.into(), Quantity(capacity.to_string()));
    s.allocatable
        .get_or_insert_default()
        .insert(resource.into(), Quantity(allocatable.to_string()));
}

pub fn label(node: &mut Node, k: &str, v: &str) {
    node.metadata
        .labels
        .get_or_insert_default()
        .insert(k.into(), v.into());
}

pub fn unlabel(node: &mut Node, k: &str) {
    node.metadata.labels.get_or_insert_default().remove(k);
}

pub fn annotate(node: &mut Node, k: &str, v: &str) {
    node.metadata
        .annotations
        .get_or_insert_default()
        .insert(k.into(), v.into());
}

pub fn taint(node: &mut Node, key: &str, value: &str, effect: &str) {
    node.spec
        .get_or_insert_default()
        .taints
        .get_or_insert_default()
        .push(Taint {
            key: key.into(),
            value: Some(value.into()).filter(|v: &String| !v.is_empty()),
            effect: effect.into(),
            ..Taint::default()
        });
}

pub fn condition(node: &mut Node, type_: &str, status: &str, reason: &str, message: &str) {
    node.status
        .get_or_insert_default()
        .conditions
        .get_or_insert_default()
        .push(NodeCondition {
            type_: type_.into(),
            status: status.into(),
            reason: Some(reason.into()),
            message: Some(message.into()),
            last_transition_time: Some(ago(600)),
            ..NodeCondition::default()
        });
}

/// Sets the node's Ready condition (the node lifecycle controller's Unknown, a kubelet's False).
pub fn ready(node: &mut Node, status: &str, reason: &str, message: &str, secs_ago: i64) {
    let conds = node
        .status
        .get_or_insert_default()
        .conditions
        .get_or_insert_default();
    conds.retain(|c| c.type_ != "Ready");
    conds.push(NodeCondition {
        type_: "Ready".into(),
        status: status.into(),
        reason: Some(reason.into()),
        message: Some(message.into()),
        last_transition_time: Some(ago(secs_ago)),
        ..NodeCondition::default()
    });
}

/// Adds CPU and memory requests to every container of the pod.
pub fn with_cpu_memory(mut p: Pod, cpu: &str, memory: &str) -> Pod {
    for c in &mut p.spec.as_mut().unwrap().containers {
        let r = c.resources.get_or_insert_default();
        let req = r.requests.get_or_insert_default();
        req.insert("cpu".into(), Quantity(cpu.into()));
        req.insert("memory".into(), Quantity(memory.into()));
    }
    p
}

/// A pod asking for `gpus` (resource, count) in limits, pending and unbound, created 10 min ago.
pub fn pod(ns: &str, name: &str, gpus: &[(&str, i64)]) -> Pod {
    let limits: BTreeMap<String, Quantity> = gpus
        .iter()
        .map(|(r, n)| ((*r).to_string(), Quantity(n.to_string())))
        .collect();
    Pod {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(ns.into()),
            creation_timestamp: Some(ago(600)),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            containers: vec![Container {
                name: "main".into(),
                resources: Some(ResourceRequirements {
                    limits: Some(limits.clone()),
                    requests: Some(limits),
                    ..ResourceRequirements::default()
                }),
                ..Container::default()
            }],
            ..PodSpec::default()
        }),
        status: Some(PodStatus {
            phase: Some("Pending".into()),
            ..PodStatus::default()
        }),
    }
}

/// The pod bound to `node` and running.
pub fn running(mut p: Pod, node: &str) -> Pod {
    p.spec.as_mut().unwrap().node_name = Some(node.into());
    let s = p.status.as_mut().unwrap();
    s.phase = Some("Running".into());
    s.start_time = Some(ago(7200));
    s.container_statuses = Some(vec![ContainerStatus {
        name: "main".into(),
        ready: true,
        ..ContainerStatus::default()
    }]);
    p
}

pub fn tolerate(mut p: Pod, key: &str) -> Pod {
    p.spec
        .as_mut()
        .unwrap()
        .tolerations
        .get_or_insert_default()
        .push(Toleration {
            key: Some(key.into()),
            operator: Some("Exists".into()),
            ..Toleration::default()
        });
    p
}

pub fn select(mut p: Pod, k: &str, v: &str) -> Pod {
    p.spec
        .as_mut()
        .unwrap()
        .node_selector
        .get_or_insert_default()
        .insert(k.into(), v.into());
    p
}

pub fn created(mut p: Pod, secs_ago: i64) -> Pod {
    p.metadata.creation_timestamp = Some(ago(secs_ago));
    p
}

/// The scheduler's verdict on the pod: condition PodScheduled=False Unschedulable.
pub fn unschedulable(mut p: Pod, message: &str) -> Pod {
    p.status
        .as_mut()
        .unwrap()
        .conditions
        .get_or_insert_default()
        .push(PodCondition {
            type_: "PodScheduled".into(),
            status: "False".into(),
            reason: Some("Unschedulable".into()),
            message: Some(message.into()),
            ..PodCondition::default()
        });
    p
}

pub fn terminated(mut p: Pod, reason: &str, exit_code: i32, last: bool) -> Pod {
    let s = p.status.as_mut().unwrap();
    let statuses = s.container_statuses.get_or_insert_default();
    if statuses.is_empty() {
        statuses.push(ContainerStatus {
            name: "main".into(),
            ..ContainerStatus::default()
        });
    }
    let t = ContainerState {
        terminated: Some(ContainerStateTerminated {
            reason: Some(reason.into()),
            exit_code,
            finished_at: Some(ago(120)),
            ..ContainerStateTerminated::default()
        }),
        ..ContainerState::default()
    };
    if last {
        statuses[0].last_state = Some(t);
        statuses[0].restart_count = 3;
    } else {
        statuses[0].state = Some(t);
    }
    p
}

pub fn event(
    kind: &str,
    ns: &str,
    name: &str,
    reason: &str,
    message: &str,
    secs_ago: i64,
) -> Event {
    Event {
        metadata: ObjectMeta {
            name: Some(format!("{name}.{reason}")),
            namespace: Some(if ns.is_empty() {
                "default".into()
            } else {
                ns.into()
            }),
            ..ObjectMeta::default()
        },
        involved_object: ObjectReference {
            kind: Some(kind.into()),
            namespace: Some(ns.into()).filter(|s: &String| !s.is_empty()),
            name: Some(name.into()),
            ..ObjectReference::default()
        },
        reason: Some(reason.into()),
        message: Some(message.into()),
        type_: Some("Warning".into()),
        last_timestamp: Some(ago(secs_ago)),
        count: Some(1),
        reporting_component: Some("default-scheduler".into()),
        ..Event::default()
    }
}

pub fn sample(name: &str, labels: &[(&str, &str)], value: f64) -> Sample {
    Sample {
        name: name.into(),
        labels: labels
            .iter()
            .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
            .collect(),
        value,
    }
}

pub fn snapshot(nodes: Vec<Node>, pods: Vec<Pod>, events: Vec<Event>) -> Snapshot {
    Snapshot {
        nodes,
        pods,
        events,
        ..Snapshot::at(now())
    }
}

/// Every finding with the given code.
pub fn run(s: &Snapshot) -> Vec<Finding> {
    diagnose(s, &Options::default())
}

pub fn codes(findings: &[Finding]) -> Vec<&'static str> {
    findings.iter().map(|f| f.code).collect()
}

pub fn with_code<'a>(findings: &'a [Finding], code: &str) -> Vec<&'a Finding> {
    findings.iter().filter(|f| f.code == code).collect()
}

/// The single finding with `code`; panics with every finding when there is not exactly one.
pub fn one<'a>(findings: &'a [Finding], code: &str) -> &'a Finding {
    let found = with_code(findings, code);
    assert_eq!(found.len(), 1, "want one {code}, got {findings:#?}");
    found[0]
}
