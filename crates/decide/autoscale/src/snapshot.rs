//! From API objects to the autoscaler's snapshot (pure): which Machine and pool each Node
//! belongs to, the stage of every machine in flight, free capacity per node, pending GPU pods
//! with their constraints, and PDBs. The controller observes the objects; this reads them.

use crate::error::AutoscaleError;
use crate::model::{
    DO_NOT_DISRUPT, Machine, Millis, Node as ANode, PODS, Pdb, PendingPod, Pool, RunningPod,
    Snapshot, Stage,
};
use crate::time::{parse_rfc3339, second_end};
use gpuops_kubemodel::fit::Taint;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde_json::Value;
use std::borrow::Borrow;
use std::collections::{BTreeMap, HashMap, HashSet};

/// Node annotation naming its Machine (Cluster API).
pub const NODE_MACHINE: &str = "cluster.x-k8s.io/machine";
/// Node annotation with the Machine's namespace (Cluster API).
pub const NODE_CLUSTER_NAMESPACE: &str = "cluster.x-k8s.io/cluster-namespace";
/// Machine label naming its MachineDeployment (Cluster API).
pub const MACHINE_DEPLOYMENT: &str = "cluster.x-k8s.io/deployment-name";
/// Node annotation the controller writes when it starts removing the node.
pub const NODE_REMOVING: &str = "gpuops.io/scale-down";
/// The agent's startup taint: the node's devices are not all advertised yet.
pub const STARTUP_TAINT: &str = "gpuops.io/gpu-not-ready";

/// What the snapshot is built from.
#[derive(Debug)]
///
/// Nodes and pods may be the watch caches' `Arc`s: a pass then copies no API object.
pub struct Objects<'a, N: Borrow<Node> = Node, P: Borrow<Pod> = Pod> {
    pub machine_deployments: &'a [Value],
    pub machines: &'a [Value],
    pub nodes: &'a [N],
    pub pods: &'a [P],
    pub pdbs: &'a [PodDisruptionBudget],
    /// Node -> highest measured utilization (percent) of its allocated GPUs.
    pub gpu_util: &'a HashMap<String, f64>,
}

fn ts_ms(v: &Value) -> Option<Millis> {
    parse_rfc3339(v.as_str()?)
}

/// Milliseconds since the epoch of a Kubernetes time: the start of the whole second it names
/// (see [`crate::time`] for comparing it with the controller's clock). The same value as
/// parsing the text the API server gets (whole seconds, a time before the epoch is none),
/// read off the timestamp: serializing it to parse it again was a fifth of the snapshot's
/// time with 50,000 pending pods.
pub fn meta_time(t: Option<&Time>) -> Option<Millis> {
    let ts = t?.0;
    if ts.subsec_nanosecond() < 0 {
        // Between two seconds before the epoch: its text names a second before it.
        return None;
    }
    u64::try_from(ts.as_second()).ok()?.checked_mul(1000)
}

fn key(ns: Option<&str>, name: Option<&str>) -> String {
    format!("{}/{}", ns.unwrap_or("default"), name.unwrap_or(""))
}

/// GPU resources: whole, shared and MIG slices.
pub fn is_gpu_resource(name: &str) -> bool {
    name == "nvidia.com/gpu"
        || name == "nvidia.com/gpu.shared"
        || name.starts_with("nvidia.com/mig-")
}

fn is_done(p: &Pod) -> bool {
    matches!(
        p.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}

fn is_daemon_or_mirror(p: &Pod) -> bool {
    p.metadata
        .owner_references
        .iter()
        .flatten()
        .any(|o| o.kind == "DaemonSet")
        || p.metadata
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key("kubernetes.io/config.mirror"))
}

fn taints_of(n: &Node) -> Vec<Taint> {
    n.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .into_iter()
        .flatten()
        .map(|t| Taint {
            key: t.key.clone(),
            value: t.value.clone().unwrap_or_default(),
            effect: t.effect.clone(),
        })
        .collect()
}

fn condition<'a>(n: &'a Node, kind: &str) -> Option<&'a k8s_openapi::api::core::v1::NodeCondition> {
    n.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == kind))
}

fn allocatable(n: &Node, name: &str) -> f64 {
    n.status
        .as_ref()
        .and_then(|s| s.allocatable.as_ref())
        .and_then(|a| a.get(name))
        .and_then(|q| gpuops_kubemodel::quantity(&q.0))
        .unwrap_or(0.0)
}

/// Whether the node offers everything its pool's template says (devices advertised, the
/// startup taint gone).
fn devices_ready(n: &Node, pool: &Pool) -> bool {
    if taints_of(n).iter().any(|t| t.key == STARTUP_TAINT) {
        return false;
    }
    let t = &pool.template;
    let gpu_ok = t.gpus == 0 || allocatable(n, &t.gpu_resource) > 0.0;
    let label = "nvidia.com/mig.config";
    let relabelled = t
        .labels
        .get(label)
        .is_some_and(|want| n.metadata.labels.as_ref().and_then(|l| l.get(label)) != Some(want));
    let mig_ok = if relabelled {
        // Bought with a generated MIG config: its devices, not the template's.
        n.status
            .as_ref()
            .and_then(|s| s.allocatable.as_ref())
            .is_some_and(|a| {
                a.keys()
                    .any(|k| k.starts_with("nvidia.com/mig-") && allocatable(n, k) > 0.0)
            })
    } else {
        t.scalars
            .keys()
            .filter(|k| k.starts_with("nvidia.com/mig-"))
            .all(|k| allocatable(n, k) > 0.0)
    };
    gpu_ok && mig_ok
}

/// A pending pod asking a GPU resource, as the decision sees it; `None` for other pods. Its
/// `created` is the start of its creationTimestamp's second; the controller moves it to the
/// latest it can be ([`crate::time::latest_creation`]) with its first sighting.
pub fn pending_pod(p: &Pod, now: Millis) -> Option<PendingPod> {
    let spec = p.spec.as_ref()?;
    if spec.node_name.is_some() || is_done(p) || p.metadata.deletion_timestamp.is_some() {
        return None;
    }
    let req = gpuops_kubemodel::requests(p);
    if !req.iter().any(|(k, v)| is_gpu_resource(k) && *v > 0.0) {
        return None;
    }
    let count = |k: &str| req.get(k).map_or(0, |v| v.ceil() as u64);
    let (gpu_resource, gpu_count) = if count("nvidia.com/gpu.shared") > 0 {
        (
            "nvidia.com/gpu.shared".to_string(),
            count("nvidia.com/gpu.shared"),
        )
    } else if count("nvidia.com/gpu") > 0 {
        ("nvidia.com/gpu".to_string(), count("nvidia.com/gpu"))
    } else {
        (String::new(), 0)
    };
    let scalars = req
        .iter()
        .filter(|(k, v)| k.starts_with("nvidia.com/mig-") && **v > 0.0)
        .map(|(k, v)| (k.clone(), v.ceil() as u64))
        .collect();
    let (tolerations, constraints) = gpuops_kubemodel::pod_constraints(p);
    let ask = gpuops_kubemodel::pod_ask(p);
    Some(PendingPod {
        key: key(p.metadata.namespace.as_deref(), p.metadata.name.as_deref()),
        created: meta_time(p.metadata.creation_timestamp.as_ref()).unwrap_or(now),
        cpu_milli: ask.cpu_milli,
        memory_mib: ask.memory_mib,
        gpu_resource,
        gpu_count,
        gpu_milli: ask.milli,
        scalars,
        tolerations,
        constraints,
    })
}

/// The pool a Machine belongs to (`namespace/deployment`), from its labels.
fn machine_pool(m: &Value) -> Option<String> {
    let ns = m["metadata"]["namespace"].as_str().unwrap_or("default");
    let md = m["metadata"]["labels"][MACHINE_DEPLOYMENT].as_str()?;
    Some(format!("{ns}/{md}"))
}

fn machine_key(m: &Value) -> String {
    key(
        m["metadata"]["namespace"].as_str(),
        m["metadata"]["name"].as_str(),
    )
}

/// The Node a Machine points at: `status.nodeRef.name`, or else the Node whose
/// `spec.providerID` is the Machine's. Cluster API sets nodeRef by that same match, but only at
/// its next reconcile of the Machine; until then a registered node would belong to no pool, and
/// the MIG decision could re-partition it before the pool's owed layout is labelled at boot.
fn machine_node<'a>(m: &'a Value, by_provider: &HashMap<&str, &'a str>) -> Option<&'a str> {
    m["status"]["nodeRef"]["name"]
        .as_str()
        .filter(|s| !s.is_empty())
        .or_else(|| {
            let id = m["spec"]["providerID"].as_str().filter(|s| !s.is_empty())?;
            by_provider.get(id).copied()
        })
}

/// Node names by `spec.providerID`.
fn nodes_by_provider<'a>(nodes: &[&'a Node]) -> HashMap<&'a str, &'a str> {
    nodes
        .iter()
        .filter_map(|n| {
            let id = n.spec.as_ref()?.provider_id.as_deref()?;
            Some((id, n.metadata.name.as_deref()?))
        })
        .filter(|(id, _)| !id.is_empty())
        .collect()
}

/// Builds the snapshot. Pools with malformed annotations are returned as errors (and named
/// in the snapshot's `skipped_pools`); the rest are modelled.
pub fn build<N: Borrow<Node>, P: Borrow<Pod>>(
    objs: &Objects<'_, N, P>,
    now: Millis,
) -> (Snapshot, Vec<AutoscaleError>) {
    let nodes: Vec<&Node> = objs.nodes.iter().map(Borrow::borrow).collect();
    let (mut pools, errors) = crate::pool::parse_pools(objs.machine_deployments);
    let skipped: Vec<String> = errors
        .iter()
        .filter_map(AutoscaleError::pool)
        .map(str::to_string)
        .collect();
    pools.sort_by(|a, b| a.name.cmp(&b.name));
    let pool_of: HashMap<&str, &Pool> = pools.iter().map(|p| (p.name.as_str(), p)).collect();
    let node_machine = node_machines(objs.machines, &nodes);
    let (machines, in_flight_nodes) = machines_in_flight(objs.machines, &nodes, &pool_of, now);
    // Pods per node.
    let mut on_node: HashMap<&str, Vec<&Pod>> = HashMap::new();
    let mut pending = Vec::new();
    for p in objs.pods.iter().map(Borrow::borrow) {
        match p.spec.as_ref().and_then(|s| s.node_name.as_deref()) {
            Some(n) if !is_done(p) => on_node.entry(n).or_default().push(p),
            Some(_) => {}
            None => pending.extend(pending_pod(p, now)),
        }
    }

    // Ready nodes: free capacity from the packing engine's model of each node.
    let ready: Vec<&Node> = nodes
        .iter()
        .copied()
        .filter(|n| {
            n.metadata
                .name
                .as_deref()
                .is_some_and(|name| !in_flight_nodes.contains(name))
                && condition(n, "Ready").is_some_and(|c| c.status == "True")
                && !taints_of(n).iter().any(|t| t.key == STARTUP_TAINT)
        })
        .collect();
    let bound: Vec<&Pod> = on_node.values().flatten().copied().collect();
    let model = gpuops_kubemodel::snapshot(&ready, &bound, None, None).ok();
    let nodes = ready
        .iter()
        .map(|n| {
            let name = n.metadata.name.clone().unwrap_or_default();
            let (machine, pool) = node_machine
                .get(&name)
                .map_or((None, None), |(m, p)| (Some(m.clone()), p.clone()));
            let pool = pool.filter(|p| pool_of.contains_key(p.as_str()));
            let pods = on_node.get(name.as_str()).cloned().unwrap_or_default();
            ready_node(n, name, machine, pool, &pods, model.as_ref(), objs.gpu_util)
        })
        .collect();
    let pdbs = objs.pdbs.iter().map(pdb).collect();
    (
        Snapshot {
            pools,
            nodes,
            machines,
            pending,
            pdbs,
            skipped_pools: skipped,
        },
        errors,
    )
}

/// Node -> (machine key, pool) through the Machines (the authoritative link) and the Node's
/// own annotation as a fallback while the Machine's nodeRef is not set yet.
fn node_machines(machines: &[Value], nodes: &[&Node]) -> HashMap<String, (String, Option<String>)> {
    let by_provider = nodes_by_provider(nodes);
    let mut node_machine: HashMap<String, (String, Option<String>)> = HashMap::new();
    for m in machines {
        if let Some(node) = machine_node(m, &by_provider) {
            node_machine.insert(node.to_string(), (machine_key(m), machine_pool(m)));
        }
    }
    let machines_by_key: HashMap<String, &Value> =
        machines.iter().map(|m| (machine_key(m), m)).collect();
    for n in nodes.iter().copied() {
        let (Some(name), Some(a)) = (n.metadata.name.as_deref(), n.metadata.annotations.as_ref())
        else {
            continue;
        };
        if node_machine.contains_key(name) {
            continue;
        }
        if let Some(machine) = a.get(NODE_MACHINE) {
            let ns = a
                .get(NODE_CLUSTER_NAMESPACE)
                .map_or("default", String::as_str);
            let k = format!("{ns}/{machine}");
            let pool = machines_by_key.get(&k).and_then(|m| machine_pool(m));
            node_machine.insert(name.to_string(), (k, pool));
        }
    }
    node_machine
}

/// The Machines in flight with their stage, and their Nodes (registered, not ready yet).
/// Stages start at Kubernetes times (whole seconds): from the end of the second, so that a
/// stage's timeout never ends early (see [`crate::time`]).
fn machines_in_flight(
    objs_machines: &[Value],
    nodes: &[&Node],
    pool_of: &HashMap<&str, &Pool>,
    now: Millis,
) -> (Vec<Machine>, HashSet<String>) {
    let nodes_by_name: HashMap<&str, &Node> = nodes
        .iter()
        .filter_map(|n| n.metadata.name.as_deref().map(|name| (name, *n)))
        .collect();
    let by_provider = nodes_by_provider(nodes);
    let mut machines = Vec::new();
    let mut in_flight_nodes: HashSet<String> = HashSet::new();
    for m in objs_machines {
        let Some(pool_name) = machine_pool(m) else {
            continue;
        };
        let Some(pool) = pool_of.get(pool_name.as_str()) else {
            continue;
        };
        if m["metadata"]["deletionTimestamp"].is_string() {
            continue;
        }
        let phase = m["status"]["phase"].as_str().unwrap_or("");
        let failed = phase == "Failed";
        let created = ts_ms(&m["metadata"]["creationTimestamp"])
            .map(second_end)
            .unwrap_or(now);
        let node = machine_node(m, &by_provider).and_then(|n| nodes_by_name.get(n).copied());
        let (stage, since) = match node {
            None => (Stage::Provisioning, created),
            Some(n) => {
                let ready = condition(n, "Ready");
                let is_ready = ready.is_some_and(|c| c.status == "True");
                if !is_ready {
                    (
                        Stage::Registered,
                        meta_time(n.metadata.creation_timestamp.as_ref())
                            .map(second_end)
                            .unwrap_or(created),
                    )
                } else if !devices_ready(n, pool) {
                    (
                        Stage::Devices,
                        ready
                            .and_then(|c| meta_time(c.last_transition_time.as_ref()))
                            .map(second_end)
                            .unwrap_or(created),
                    )
                } else {
                    continue; // a ready node
                }
            }
        };
        if let Some(n) = node.and_then(|n| n.metadata.name.clone()) {
            in_flight_nodes.insert(n);
        }
        machines.push(Machine {
            name: machine_key(m),
            pool: pool_name,
            node: machine_node(m, &by_provider).map(str::to_string),
            stage,
            stage_since: since,
            failed,
        });
    }
    (machines, in_flight_nodes)
}

/// A ready node as the decision sees it: free capacity from the packing engine's `model`,
/// its pods, its pool and Machine.
fn ready_node(
    n: &Node,
    name: String,
    machine: Option<String>,
    pool: Option<String>,
    pods: &[&Pod],
    model: Option<&gpuops_kubemodel::Snapshot>,
    gpu_util: &HashMap<String, f64>,
) -> ANode {
    let labels = n.metadata.labels.clone().unwrap_or_default();
    // Each pod's requests once, not once per resource of the node.
    let requests: Vec<BTreeMap<String, f64>> =
        pods.iter().map(|p| gpuops_kubemodel::requests(p)).collect();
    let mut scalars_free: BTreeMap<String, u64> = BTreeMap::new();
    if let Some(a) = n.status.as_ref().and_then(|s| s.allocatable.as_ref()) {
        for (k, q) in a {
            if k.starts_with("nvidia.com/mig-") || k == PODS {
                let have = gpuops_kubemodel::quantity(&q.0).unwrap_or(0.0);
                let used: f64 = requests
                    .iter()
                    .map(|r| {
                        if k == PODS {
                            1.0
                        } else {
                            r.get(k).copied().unwrap_or(0.0)
                        }
                    })
                    .sum();
                scalars_free.insert(k.clone(), (have - used).max(0.0) as u64);
            }
        }
    }
    let (cpu_free, mem_free, gpu_free, replicas) =
        match model.and_then(|m| m.position(&name).map(|i| (m, i))) {
            Some((m, i)) => {
                let c = m.cluster.node(i);
                (
                    u64::from(c.cpu_left),
                    c.memory_left,
                    m.cluster.gpus(i).to_vec(),
                    m.nodes[i].replicas,
                )
            }
            None => (0, 0, Vec::new(), 1),
        };
    let gpu_resource = if allocatable(n, "nvidia.com/gpu.shared") > 0.0 {
        "nvidia.com/gpu.shared"
    } else if allocatable(n, "nvidia.com/gpu") > 0.0 {
        "nvidia.com/gpu"
    } else {
        ""
    };
    let running: Vec<RunningPod> = pods
        .iter()
        .zip(&requests)
        .filter(|(p, _)| !is_daemon_or_mirror(p))
        .map(|(p, r)| {
            let ann = p.metadata.annotations.as_ref();
            RunningPod {
                key: key(p.metadata.namespace.as_deref(), p.metadata.name.as_deref()),
                labels: p.metadata.labels.clone().unwrap_or_default(),
                gpu: r.iter().any(|(k, v)| is_gpu_resource(k) && *v > 0.0),
                do_not_disrupt: DO_NOT_DISRUPT
                    .iter()
                    .any(|a| ann.and_then(|m| m.get(*a)).is_some_and(|v| v == "true")),
            }
        })
        .collect();
    ANode {
        removing: n
            .metadata
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key(NODE_REMOVING)),
        unschedulable: n
            .spec
            .as_ref()
            .and_then(|s| s.unschedulable)
            .unwrap_or(false),
        gpu_product: labels
            .get("nvidia.com/gpu.product")
            .cloned()
            .unwrap_or_default(),
        labels,
        taints: taints_of(n),
        cpu_free_milli: cpu_free,
        memory_free_mib: mem_free,
        gpu_resource: gpu_resource.to_string(),
        gpu_replicas: replicas,
        gpu_free,
        scalars_free,
        pods: running,
        gpu_util: gpu_util.get(&name).copied(),
        name,
        pool,
        machine,
    }
}

fn pdb(p: &PodDisruptionBudget) -> Pdb {
    let sel = p.spec.as_ref().and_then(|s| s.selector.as_ref());
    let exprs = sel
        .and_then(|s| s.match_expressions.as_ref())
        .is_some_and(|e| !e.is_empty());
    let allowed = p.status.as_ref().map_or(0, |s| {
        u32::try_from(s.disruptions_allowed.max(0)).unwrap_or(0)
    });
    Pdb {
        key: key(p.metadata.namespace.as_deref(), p.metadata.name.as_deref()),
        namespace: p
            .metadata
            .namespace
            .clone()
            .unwrap_or_else(|| "default".into()),
        // A selector with expressions is not evaluated here: as an empty selector with
        // no disruptions allowed it blocks its namespace's pods, the safe side.
        match_labels: if exprs {
            BTreeMap::new()
        } else {
            sel.and_then(|s| s.match_labels.clone()).unwrap_or_default()
        },
        disruptions_allowed: if exprs { 0 } else { allowed },
    }
}
