//! The controller's whole pure pass at scale: 5,000 GPU nodes in 6 Cluster API pools (whole GPUs
//! of 8, 4 and 1, shared, and two MIG pools) and 50,000 pending pods (whole GPUs, shared, MIG
//! profiles, with tolerations and product selectors; a share of them, 10% by default, asking
//! their GPUs through a ResourceClaim instead), built as API objects (Nodes, Pods,
//! MachineDeployments, Machines, ResourceClaims and templates, the driver's DeviceClasses) and
//! taken through the same steps as a controller pass: the snapshot from the objects, the
//! first-sighting times, the MIG view and decision, the node-pool decision, then the claim
//! demand (`gpuops-claims`, as the controller's `claim_demand` calls it). Prints p50/p99 of each
//! phase and of the whole (target p99 < 500 ms), and the peak heap the pass allocates, counted
//! by this binary's global allocator. Figures: docs/autoscaling.md, "At scale".
//! `cargo bench -p gpuops-autoscale --bench scale` (`BENCH_RUNS`, `BENCH_NODES`, `BENCH_PODS`,
//! `BENCH_CLAIMS`: percent of the pending pods with a claim, 0 for none).
#![allow(clippy::unwrap_used, clippy::expect_used, unsafe_code)]

use gpuops_autoscale::mig_demand::{MigConfig, MigMemory, decide_mig};
use gpuops_autoscale::mig_owed::{CONFIG_LABEL, LAYOUT_ANNOTATION, STATE_LABEL};
use gpuops_autoscale::mig_view::{Boot, is_mig_pod, view};
use gpuops_autoscale::snapshot::{Objects, build};
use gpuops_autoscale::{Config, State, decide, pool, time::latest_creation};
use gpuops_claims::k8s::ByName;
use gpuops_dra::DRIVER_NAME;
use gpuops_dra::classes::{CLASS_GPU, device_classes};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceClaimTemplate};
use serde_json::{Value, json};
use std::alloc::{GlobalAlloc, Layout, System};
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// Counts live heap bytes and their high-water mark, so the pass's own peak is measured apart
/// from the objects it reads (RSS would include both, and never shrinks back).
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call is forwarded unchanged to the system allocator; only counters are added.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: same contract as ours.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            let now = LIVE.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
            PEAK.fetch_max(now, Ordering::Relaxed);
        }
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as ours.
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: same contract as ours.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            if new_size >= layout.size() {
                let now = LIVE.fetch_add(new_size - layout.size(), Ordering::Relaxed)
                    + (new_size - layout.size());
                PEAK.fetch_max(now, Ordering::Relaxed);
            } else {
                LIVE.fetch_sub(layout.size() - new_size, Ordering::Relaxed);
            }
        }
        p
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

const NOW: u64 = 1_767_225_600_000 + 600_000; // 2026-01-01T00:10:00Z
/// The decisions run one second after the pods were first seen, as the pass that closes a
/// batch does: with the windows at zero a pod seen this very millisecond has not waited yet.
const DECIDE_AT: u64 = NOW + 1_000;
const H100: &str = "NVIDIA-H100-80GB-HBM3";
const A100: &str = "NVIDIA-A100-SXM4-80GB";

/// A pool: name, GPUs per node, price, GPU product, extra annotations.
struct PoolSpec {
    name: &'static str,
    gpus: u32,
    price: f64,
    product: &'static str,
    extra: &'static [(&'static str, &'static str)],
}

const POOLS: [PoolSpec; 6] = [
    PoolSpec {
        name: "whole8",
        gpus: 8,
        price: 30.0,
        product: H100,
        extra: &[],
    },
    PoolSpec {
        name: "whole4",
        gpus: 4,
        price: 15.5,
        product: H100,
        extra: &[],
    },
    PoolSpec {
        name: "whole1",
        gpus: 1,
        price: 4.0,
        product: H100,
        extra: &[],
    },
    PoolSpec {
        name: "shared",
        gpus: 4,
        price: 8.0,
        product: H100,
        extra: &[(pool::GPU_REPLICAS, "4")],
    },
    PoolSpec {
        name: "mig-h100",
        gpus: 8,
        price: 28.0,
        product: H100,
        extra: &[(pool::MIG_CONFIG, "all-1g.10gb")],
    },
    PoolSpec {
        name: "mig-a100",
        gpus: 8,
        price: 20.0,
        product: A100,
        extra: &[(pool::MIG_CONFIG, "all-3g.40gb")],
    },
];

/// Machines still provisioning per pool: in-flight capacity the decision must count.
const IN_FLIGHT: usize = 20;

fn md(p: &PoolSpec, replicas: usize) -> Value {
    let mut a = json!({
        pool::MIN_SIZE: "0", pool::MAX_SIZE: "10000", pool::CPU: "96", pool::MEMORY: "1024Gi",
        pool::GPU_COUNT: p.gpus.to_string(), pool::PRICE: p.price.to_string(),
        pool::GPU_PRODUCT: p.product,
    });
    for (k, v) in p.extra {
        a[*k] = json!(v);
    }
    json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "MachineDeployment",
           "metadata": {"name": p.name, "namespace": "capi", "annotations": a},
           "spec": {"replicas": replicas}})
}

fn machine(name: &str, md: &str, node: Option<&str>) -> Value {
    let mut m = json!({"metadata": {"name": name, "namespace": "capi",
                       "labels": {"cluster.x-k8s.io/deployment-name": md},
                       "creationTimestamp": "2026-01-01T00:09:30Z"},
                       "status": {"phase": if node.is_some() {"Running"} else {"Provisioning"}}});
    if let Some(n) = node {
        m["status"]["nodeRef"] = json!({"name": n});
    }
    m
}

/// The agent's layout annotation for a MIG node: every GPU in one profile, `busy` of them used.
fn layout(config: &str, model: &str, profile: &str, per_gpu: u32, width: u32, busy: u32) -> String {
    let gpus: Vec<Value> = (0..8)
        .map(|g| {
            let inst: Vec<Value> = (0..per_gpu)
                .map(|s| json!({"profile": profile, "start": s * width, "busy": g * per_gpu + s < busy}))
                .collect();
            json!({"mig_enabled": true, "busy": false, "instances": inst})
        })
        .collect();
    json!({"applied": config, "model": model, "gpus": gpus}).to_string()
}

/// A ready node of pool `p` and the pods bound on it (most GPUs used, some room left).
fn node_and_pods(i: usize, p: &PoolSpec) -> (Node, Vec<Pod>) {
    let name = format!("{}-{i:05}", p.name);
    let mut labels =
        json!({"nvidia.com/gpu.product": p.product, "nvidia.com/gpu.count": p.gpus.to_string()});
    let mut ann = json!({"cluster.x-k8s.io/machine": format!("m-{name}"), "cluster.x-k8s.io/cluster-namespace": "capi"});
    let mut alloc = json!({"cpu": "96", "memory": "1024Gi", "pods": "110"});
    // One to three GPUs free (never all of a 1-GPU node), independent of the pool.
    let used = p
        .gpus
        .saturating_sub(1 + ((i / POOLS.len()) % 3) as u32 % p.gpus);
    let (resource, total, ask) = match p.name {
        "shared" => ("nvidia.com/gpu.shared", p.gpus * 4, used * 4),
        "mig-h100" | "mig-a100" => {
            let (config, model, profile, per, width) = if p.name == "mig-h100" {
                ("all-1g.10gb", "H100-SXM5-80GB", "1g.10gb", 7, 1)
            } else {
                ("all-3g.40gb", "A100-SXM4-80GB", "3g.40gb", 2, 4)
            };
            labels[CONFIG_LABEL] = json!(config);
            labels[STATE_LABEL] = json!("success");
            let busy = used * per;
            ann[LAYOUT_ANNOTATION] = json!(layout(config, model, profile, per, width, busy));
            let r = if per == 7 {
                "nvidia.com/mig-1g.10gb"
            } else {
                "nvidia.com/mig-3g.40gb"
            };
            (r, 8 * per, busy)
        }
        _ => ("nvidia.com/gpu", p.gpus, used),
    };
    alloc[resource] = json!(total.to_string());
    let node = serde_json::from_value(json!({
        "metadata": {"name": name, "creationTimestamp": "2026-01-01T00:01:00Z", "labels": labels, "annotations": ann},
        "spec": {},
        "status": {"allocatable": alloc,
                   "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": "2026-01-01T00:02:00Z"}]}
    }))
    .unwrap();
    // Two pods share what is used, so bound pods outnumber nodes as in a real fleet.
    let halves = [ask / 2, ask - ask / 2];
    let pods = halves
        .iter()
        .enumerate()
        .filter(|(_, n)| **n > 0)
        .map(|(k, n)| {
            serde_json::from_value(json!({
                "metadata": {"name": format!("run-{name}-{k}"), "namespace": format!("team{}", i % 40),
                             "creationTimestamp": "2026-01-01T00:03:00Z"},
                "spec": {"nodeName": name, "containers": [{"name": "c", "resources": {"requests":
                    {"cpu": "8", "memory": "64Gi", resource: n.to_string()}}}]},
                "status": {"phase": "Running"}
            }))
            .unwrap()
        })
        .collect();
    (node, pods)
}

/// Pending pod `i` of the mix: whole GPUs of 1-8, shared, MIG 1g.10gb, 2g.20gb (no node has
/// one free: only a re-partition or a new node serves it) and 3g.40gb, some with a
/// toleration or a product selector.
fn pending(i: usize, claims_pct: usize) -> Pod {
    if i % 100 < claims_pct {
        return claim_pod(i);
    }
    let (resource, n) = match i % 10 {
        0 | 1 => ("nvidia.com/gpu", 1),
        2 => ("nvidia.com/gpu", 2),
        3 => ("nvidia.com/gpu", 4),
        4 => ("nvidia.com/gpu", 8),
        5 | 6 => ("nvidia.com/gpu.shared", 1),
        7 => ("nvidia.com/mig-1g.10gb", 1),
        8 => ("nvidia.com/mig-2g.20gb", 1),
        _ => ("nvidia.com/mig-3g.40gb", 1),
    };
    let mut spec = json!({"containers": [{"name": "c", "resources": {"requests":
        {"cpu": format!("{}m", 1000 + (i % 4) * 500), "memory": "4Gi", resource: n.to_string()}}}]});
    match i % 7 {
        0 => {
            spec["tolerations"] = json!([{"key": format!("team-{}", i % 3), "operator": "Exists"}])
        }
        1 => spec["nodeSelector"] = json!({"nvidia.com/gpu.product": H100}),
        _ => {}
    }
    serde_json::from_value(json!({
        "metadata": {"name": format!("pod-{i:06}"), "namespace": format!("ns{}", i % 50),
                     "creationTimestamp": format!("2026-01-01T00:0{}:{:02}Z", 5 + i % 4, i % 60)},
        "spec": spec,
        "status": {"phase": "Pending"}
    }))
    .unwrap()
}

/// The claim a pending pod with claims asks for (`i / 100` picks it): one GPU of any kind from
/// the namespace's template (its claim not made yet), two H100s, or one GPU with more than
/// 40 GiB (both as claims made and not allocated).
fn claim_kind(i: usize) -> usize {
    (i / 100) % 3
}

fn claim_spec(kind: usize) -> Value {
    let (count, selectors) = match kind {
        0 => (1, json!([])),
        1 => (
            2,
            json!([{"cel": {"expression":
                format!("device.attributes['{DRIVER_NAME}'].productName == '{}'", H100.replace('-', " "))}}]),
        ),
        _ => (
            1,
            json!([{"cel": {"expression":
                format!("device.capacity['{DRIVER_NAME}'].memory.isGreaterThan(quantity('40Gi'))")}}]),
        ),
    };
    json!({"devices": {"requests": [{"name": "gpu", "exactly": {
        "deviceClassName": CLASS_GPU, "allocationMode": "ExactCount", "count": count,
        "selectors": selectors}}]}})
}

fn claim_name(i: usize) -> String {
    format!("pod-{i:06}-gpu")
}

/// A pending pod whose GPUs are a ResourceClaim (no extended resource): the scheduler found
/// no node for it, so the controller's claim demand takes it.
fn claim_pod(i: usize) -> Pod {
    let kind = claim_kind(i);
    let claim = if kind == 0 {
        json!({"name": "gpu", "resourceClaimTemplateName": "one-gpu"})
    } else {
        json!({"name": "gpu", "resourceClaimTemplateName": format!("kind-{kind}")})
    };
    let mut status = json!({"phase": "Pending", "conditions": [{"type": "PodScheduled",
        "status": "False", "reason": "Unschedulable"}]});
    if kind != 0 {
        status["resourceClaimStatuses"] =
            json!([{"name": "gpu", "resourceClaimName": claim_name(i)}]);
    }
    serde_json::from_value(json!({
        "metadata": {"name": format!("pod-{i:06}"), "namespace": format!("ns{}", i % 50),
                     "creationTimestamp": format!("2026-01-01T00:0{}:{:02}Z", 5 + i % 4, i % 60)},
        "spec": {"containers": [{"name": "c", "resources": {"requests":
                    {"cpu": "2", "memory": "8Gi"}}}], "resourceClaims": [claim]},
        "status": status
    }))
    .unwrap()
}

/// The claims API objects: the namespaces' templates, the pending pods' claims (made, not
/// allocated), and claims holding the GPUs of whole-GPU nodes (all but one GPU of every
/// fourth node, all of the others), as pods running with claims would.
fn claim_objects(
    n_pods: usize,
    claims_pct: usize,
    nodes: &[Arc<Node>],
) -> (Vec<Arc<ResourceClaim>>, Vec<Arc<ResourceClaimTemplate>>) {
    let templates = (0..50)
        .flat_map(|ns| {
            [("one-gpu", 0), ("kind-1", 1), ("kind-2", 2)].map(|(name, kind)| {
                serde_json::from_value(json!({
                    "metadata": {"name": name, "namespace": format!("ns{ns}")},
                    "spec": {"spec": claim_spec(kind)}
                }))
                .map(Arc::new)
                .unwrap()
            })
        })
        .collect();
    let mut claims: Vec<Arc<ResourceClaim>> = (0..n_pods)
        .filter(|i| i % 100 < claims_pct && claim_kind(*i) != 0)
        .map(|i| {
            let c = serde_json::from_value(json!({
                "metadata": {"name": claim_name(i), "namespace": format!("ns{}", i % 50)},
                "spec": claim_spec(claim_kind(i))
            }));
            Arc::new(c.unwrap())
        })
        .collect();
    for (k, n) in nodes.iter().enumerate() {
        let name = n.metadata.name.clone().unwrap();
        let gpus: u32 = n.metadata.labels.as_ref().unwrap()["nvidia.com/gpu.count"]
            .parse()
            .unwrap();
        if !name.starts_with("whole") {
            continue;
        }
        let held = if k % 4 == 0 { gpus - 1 } else { gpus };
        let results: Vec<Value> = (0..held)
            .map(|g| json!({"request": "gpu", "driver": DRIVER_NAME, "pool": name, "device": format!("gpu-{g}")}))
            .collect();
        let c = serde_json::from_value(json!({
            "metadata": {"name": format!("run-{name}"), "namespace": format!("team{}", k % 40)},
            "spec": claim_spec(0),
            "status": {"allocation": {"devices": {"results": results}}}
        }));
        claims.push(Arc::new(c.unwrap()));
    }
    (claims, templates)
}

/// Whether the scheduler found no node for the pod (the controller's rule: only then are its
/// claims demand).
fn unschedulable(p: &Pod) -> bool {
    p.spec.as_ref().is_some_and(|s| s.node_name.is_none())
        && p.metadata.deletion_timestamp.is_none()
        && p.status.as_ref().is_some_and(|s| {
            s.conditions.iter().flatten().any(|c| {
                c.type_ == "PodScheduled"
                    && c.status == "False"
                    && c.reason.as_deref() == Some("Unschedulable")
            })
        })
}

/// What the claim demand decided, for the summary line.
#[derive(Default)]
struct ClaimCounts {
    pods: usize,
    in_flight: usize,
    buy: usize,
    no_pool: usize,
    errors: usize,
    bought: u32,
}

/// The controller's claim demand, as its pass runs it (`claim_demand` in the controller's
/// run.rs): pods with claims the scheduler refused, their unallocated claims from the watch
/// caches' objects (copied, as there), the devices claims hold, the decision, the merge.
fn claim_pass(
    pods: &[Arc<Pod>],
    objs: &ClaimObjects,
    snap: &gpuops_autoscale::Snapshot,
    d: &mut gpuops_autoscale::Decision,
) -> ClaimCounts {
    let with_claims: Vec<&Pod> = pods
        .iter()
        .map(AsRef::as_ref)
        .filter(|p| {
            p.spec
                .as_ref()
                .is_some_and(|s| s.resource_claims.as_ref().is_some_and(|c| !c.is_empty()))
                && unschedulable(p)
        })
        .collect();
    let mut out = ClaimCounts::default();
    if with_claims.is_empty() {
        return out;
    }
    let key = |m: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta| {
        (
            m.namespace.clone().unwrap_or_default(),
            m.name.clone().unwrap_or_default(),
        )
    };
    let claims: ByName<ResourceClaim> = objs
        .claims
        .iter()
        .map(|c| (key(&c.metadata), (**c).clone()))
        .collect();
    let templates: ByName<ResourceClaimTemplate> = objs
        .templates
        .iter()
        .map(|t| (key(&t.metadata), (**t).clone()))
        .collect();
    let classes = gpuops_claims::k8s::classes(&objs.classes);
    let mut demand = Vec::new();
    for p in with_claims {
        let pod = format!(
            "{}/{}",
            p.metadata.namespace.as_deref().unwrap_or_default(),
            p.metadata.name.as_deref().unwrap_or_default()
        );
        match gpuops_claims::k8s::pending_claims(p, &claims, &templates) {
            Ok(c) if c.is_empty() => {}
            Ok(c) => demand.push(gpuops_claims::PodClaims { pod, claims: c }),
            Err(_) => out.errors += 1,
        }
    }
    let allocated = gpuops_claims::k8s::allocated_devices(&claims);
    let cd = gpuops_claims::demand::decide(
        snap,
        &d.in_flight,
        &d.scale_ups,
        &demand,
        &classes,
        &allocated,
    );
    out.pods = demand.len();
    for (_, o) in &cd.plan.outcomes {
        match o {
            gpuops_claims::Outcome::InFlight { .. }
            | gpuops_claims::Outcome::Repartition { .. } => out.in_flight += 1,
            gpuops_claims::Outcome::Buy { .. } => out.buy += 1,
            gpuops_claims::Outcome::NoPool { .. } => out.no_pool += 1,
            gpuops_claims::Outcome::Error(_) => out.errors += 1,
        }
    }
    out.bought = cd.scale_ups.iter().map(|s| s.to - s.from).sum();
    gpuops_claims::demand::merge(&mut d.scale_ups, cd.scale_ups);
    out
}

/// The claims objects the controller's watch caches hold.
struct ClaimObjects {
    claims: Vec<Arc<ResourceClaim>>,
    templates: Vec<Arc<ResourceClaimTemplate>>,
    classes: Vec<DeviceClass>,
}

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse().ok()))
        })
        .unwrap_or(0)
}

/// Nanoseconds this thread has spent on a CPU (`/proc/thread-self/schedstat`, first field):
/// on a machine shared with builds the wall clock also measures the neighbours.
fn on_cpu_ns() -> u64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

const PHASES: [&str; 6] = [
    "snapshot",
    "first-seen",
    "mig view+decision",
    "pool decision",
    "claims",
    "whole pass",
];

/// One pass's results, for the summary line.
struct Pass {
    wall: [Duration; 6],
    cpu: [u64; 6],
    peak: usize,
    bought: u32,
    mig_changes: usize,
    mig_bought: u32,
    mig_waiting: usize,
    mig_free: usize,
    mig_unserved: Vec<(String, String)>,
    pending: usize,
    mig_pods: usize,
    claims: ClaimCounts,
}

fn one_pass(
    mds: &[Value],
    machines: &[Value],
    nodes: &[Arc<Node>],
    pods: &[Arc<Pod>],
    claim_objs: &ClaimObjects,
) -> Pass {
    let pdbs: Vec<PodDisruptionBudget> = Vec::new();
    let util = HashMap::new();
    let base = LIVE.load(Ordering::Relaxed);
    PEAK.store(base, Ordering::Relaxed);
    let (mut wall, mut cpu) = ([Duration::ZERO; 6], [0u64; 6]);
    let (t0, c0) = (Instant::now(), on_cpu_ns());
    let mut lap = |k: usize, t: &mut Instant, c: &mut u64| {
        let (tn, cn) = (Instant::now(), on_cpu_ns());
        wall[k] = tn - *t;
        cpu[k] = cn.saturating_sub(*c);
        (*t, *c) = (tn, cn);
    };
    let (mut t, mut c) = (t0, c0);
    let (mut snap, errors) = build(
        &Objects {
            machine_deployments: mds,
            machines,
            nodes,
            pods,
            pdbs: &pdbs,
            gpu_util: &util,
        },
        NOW,
    );
    assert!(errors.is_empty(), "{errors:?}");
    lap(0, &mut t, &mut c);
    // A fresh controller's first pass: every pod is seen for the first time.
    let mut seen: HashMap<String, u64> = HashMap::new();
    for p in &mut snap.pending {
        let first = *seen.entry(p.key.clone()).or_insert(NOW);
        p.created = latest_creation(p.created, first);
    }
    lap(1, &mut t, &mut c);
    let pending = snap.pending.len();
    let (mig_nodes, mig_pods, mig_pools, problems) = view(nodes, &snap, &Boot::default());
    assert!(problems.is_empty(), "{problems:?}");
    snap.pending.retain(|p| !is_mig_pod(p));
    let mig_cfg = MigConfig {
        batch_idle: Duration::ZERO,
        batch_max: Duration::ZERO,
        ..MigConfig::default()
    };
    let md_ = decide_mig(
        &mig_nodes,
        &mig_pods,
        &mig_pools,
        &mut MigMemory::default(),
        NOW,
        &mig_cfg,
    );
    lap(2, &mut t, &mut c);
    let cfg = Config {
        batch_idle: Duration::ZERO,
        batch_max: Duration::ZERO,
        ..Config::default()
    };
    // The controller keeps its state between passes: dropping it is no part of a pass.
    let mut state = State::default();
    let mut d = decide(&snap, &mut state, DECIDE_AT, &cfg);
    lap(3, &mut t, &mut c);
    let claims = claim_pass(pods, claim_objs, &snap, &mut d);
    lap(4, &mut t, &mut c);
    wall[5] = t - t0;
    cpu[5] = c.saturating_sub(c0);
    let peak = PEAK.load(Ordering::Relaxed).saturating_sub(base);
    Pass {
        wall,
        cpu,
        peak,
        bought: d.scale_ups.iter().map(|s| s.to - s.from).sum(),
        mig_changes: md_.changes.len(),
        mig_bought: md_.scale_ups.len() as u32,
        mig_waiting: md_.waiting.len(),
        mig_free: md_.served_by_free.len(),
        mig_unserved: md_.unserved.iter().take(2).cloned().collect(),
        pending,
        mig_pods: mig_pods.len(),
        claims,
    }
}

fn main() {
    let n_nodes = env("BENCH_NODES", 5000);
    let n_pods = env("BENCH_PODS", 50_000);
    let runs = env("BENCH_RUNS", 20);
    let claims_pct = env("BENCH_CLAIMS", 10).min(100);
    let rss0 = rss_kib();
    let mut per_pool = vec![0usize; POOLS.len()];
    let mut nodes = Vec::with_capacity(n_nodes);
    let mut pods: Vec<Arc<Pod>> = Vec::with_capacity(n_pods + 2 * n_nodes);
    let mut machines = Vec::with_capacity(n_nodes + IN_FLIGHT * POOLS.len());
    for i in 0..n_nodes {
        let k = i % POOLS.len();
        let (n, bound) = node_and_pods(i, &POOLS[k]);
        let name = n.metadata.name.clone().unwrap();
        machines.push(machine(&format!("m-{name}"), POOLS[k].name, Some(&name)));
        nodes.push(Arc::new(n));
        pods.extend(bound.into_iter().map(Arc::new));
        per_pool[k] += 1;
    }
    for (k, p) in POOLS.iter().enumerate() {
        for j in 0..IN_FLIGHT {
            machines.push(machine(&format!("m-{}-new-{j}", p.name), p.name, None));
        }
        per_pool[k] += IN_FLIGHT;
    }
    let mds: Vec<Value> = POOLS
        .iter()
        .zip(&per_pool)
        .map(|(p, n)| md(p, *n))
        .collect();
    let bound = pods.len();
    pods.extend((0..n_pods).map(|i| Arc::new(pending(i, claims_pct))));
    let (claims, templates) = claim_objects(n_pods, claims_pct, &nodes);
    let claim_objs = ClaimObjects {
        claims,
        templates,
        classes: device_classes(false),
    };
    let held = LIVE.load(Ordering::Relaxed);
    let rss_held = rss_kib();
    println!(
        "{n_nodes} nodes in {} pools ({} machines in flight), {bound} bound pods, {n_pods} pending pods ({claims_pct}% with a ResourceClaim; {} claims, {} templates); objects hold {} MiB of heap (RSS {} -> {} MiB)",
        POOLS.len(),
        IN_FLIGHT * POOLS.len(),
        claim_objs.claims.len(),
        claim_objs.templates.len(),
        held >> 20,
        rss0 / 1024,
        rss_held / 1024
    );
    let mut passes: Vec<Pass> = (0..runs)
        .map(|_| one_pass(&mds, &machines, &nodes, &pods, &claim_objs))
        .collect();
    let last = passes.last().unwrap();
    println!(
        "last pass: {} pending GPU pods ({} MIG), pool decision buys {} nodes, MIG decision {} changes and {} scale-ups, {} served by free instances, {} waiting, unserved e.g. {:?}",
        last.pending,
        last.mig_pods,
        last.bought,
        last.mig_changes,
        last.mig_bought,
        last.mig_free,
        last.mig_waiting,
        last.mig_unserved
    );
    let cc = &last.claims;
    println!(
        "claims: {} pending pods with unallocated claims: {} served by nodes in flight, {} buy a node ({} nodes bought), {} fit no pool, {} errors",
        cc.pods, cc.in_flight, cc.buy, cc.bought, cc.no_pool, cc.errors
    );
    let q = |v: &mut Vec<f64>, q: f64| {
        v.sort_by(f64::total_cmp);
        v[((v.len() as f64 - 1.0) * q).round() as usize]
    };
    for (k, phase) in PHASES.iter().enumerate() {
        let mut w: Vec<f64> = passes
            .iter()
            .map(|p| p.wall[k].as_secs_f64() * 1e3)
            .collect();
        let mut c: Vec<f64> = passes.iter().map(|p| p.cpu[k] as f64 / 1e6).collect();
        println!(
            "{phase:>18}: wall p50 {:7.1} ms p99 {:7.1} ms; on-CPU p50 {:7.1} ms p99 {:7.1} ms",
            q(&mut w, 0.5),
            q(&mut w, 0.99),
            q(&mut c, 0.5),
            q(&mut c, 0.99)
        );
    }
    passes.sort_by_key(|p| p.peak);
    println!(
        "peak heap allocated by one pass (above the objects): p50 {} MiB, max {} MiB; RSS after {runs} passes {} MiB (target p99 < 500 ms)",
        passes[passes.len() / 2].peak >> 20,
        passes.last().unwrap().peak >> 20,
        rss_kib() / 1024
    );
}
