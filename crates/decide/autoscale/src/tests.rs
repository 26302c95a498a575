#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
use super::*;
use gpuops_kubemodel::fit::{NodeConstraints, Taint, Toleration};
use serde_json::json;
use std::collections::BTreeMap;
use std::time::Duration;

const S: Millis = 1000;

fn md(name: &str, replicas: u32, ann: &[(&str, &str)]) -> serde_json::Value {
    let mut a = serde_json::Map::new();
    for (k, v) in ann {
        a.insert((*k).into(), json!(v));
    }
    json!({"metadata": {"name": name, "namespace": "capi", "annotations": a}, "spec": {"replicas": replicas}})
}

fn base_ann<'a>(
    min: &'a str,
    max: &'a str,
    gpus: &'a str,
    price: &'a str,
) -> Vec<(&'a str, &'a str)> {
    vec![
        (pool::MIN_SIZE, min),
        (pool::MAX_SIZE, max),
        (pool::CPU, "32"),
        (pool::MEMORY, "128Gi"),
        (pool::GPU_TYPE, "nvidia.com/gpu"),
        (pool::GPU_COUNT, gpus),
        (pool::PRICE, price),
        (pool::GPU_PRODUCT, "NVIDIA-H100-80GB-HBM3"),
    ]
}

fn gpu_pool(name: &str, max: u32, gpus: u32, price: f64, replicas: u32) -> Pool {
    let (max, gpus, price) = (max.to_string(), gpus.to_string(), price.to_string());
    pool::parse_pool(&md(name, replicas, &base_ann("0", &max, &gpus, &price))).unwrap()
}

fn gpu_pod(key: &str, gpus: u64) -> PendingPod {
    PendingPod {
        key: key.into(),
        created: 0,
        cpu_milli: 1000,
        memory_mib: 1024,
        gpu_resource: "nvidia.com/gpu".into(),
        gpu_count: gpus,
        gpu_milli: None,
        scalars: BTreeMap::new(),
        tolerations: vec![],
        constraints: NodeConstraints::default(),
    }
}

fn mig_pod(key: &str, profile: &str, n: u64) -> PendingPod {
    let mut p = gpu_pod(key, 0);
    p.gpu_resource = String::new();
    p.scalars.insert(format!("nvidia.com/mig-{profile}"), n);
    p
}

fn shared_pod(key: &str) -> PendingPod {
    let mut p = gpu_pod(key, 1);
    p.gpu_resource = "nvidia.com/gpu.shared".into();
    p
}

/// A ready node of `pool` built from its template, with nothing running.
fn ready_node(name: &str, pool: &Pool) -> Node {
    let t = &pool.template;
    Node {
        name: name.into(),
        pool: Some(pool.name.clone()),
        machine: Some(format!("capi/{name}")),
        labels: t.labels.clone(),
        taints: t.taints.clone(),
        unschedulable: false,
        cpu_free_milli: t.cpu_milli,
        memory_free_mib: t.memory_mib,
        gpu_resource: t.gpu_resource.clone(),
        gpu_replicas: t.gpu_replicas,
        gpu_free: vec![1000; t.gpus as usize],
        gpu_product: t.gpu_product.clone(),
        scalars_free: t.scalars.clone(),
        pods: vec![],
        gpu_util: None,
        removing: false,
    }
}

fn cfg() -> Config {
    Config {
        batch_idle: Duration::ZERO,
        batch_max: Duration::ZERO,
        ..Config::default()
    }
}

/// What the controller does with a decision, in the snapshot: raised replicas.
fn apply(snap: &mut Snapshot, d: &Decision) {
    for su in &d.scale_ups {
        let p = snap.pools.iter_mut().find(|p| p.name == su.pool).unwrap();
        assert_eq!(p.replicas, su.from);
        p.replicas = su.to;
    }
}

fn launched(d: &Decision) -> u32 {
    d.scale_ups.iter().map(|s| s.to - s.from).sum()
}

// ---- pools ----

#[test]
fn pool_from_ca_annotations() {
    let p = gpu_pool("h100", 4, 8, 30.0, 1);
    assert_eq!(p.name, "capi/h100");
    assert_eq!((p.min, p.max, p.replicas), (0, 4, 1));
    assert_eq!(p.template.cpu_milli, 32_000);
    assert_eq!(p.template.memory_mib, 128 * 1024);
    assert_eq!(
        (p.template.gpus, p.template.gpu_resource.as_str()),
        (8, "nvidia.com/gpu")
    );
    assert_eq!(
        p.template.labels["nvidia.com/gpu.product"],
        "NVIDIA-H100-80GB-HBM3"
    );
    assert_eq!(p.template.scalars[PODS], 110);
    assert_eq!(p.price_per_hour, 30.0);
}

#[test]
fn pool_taints_labels_timeouts() {
    let mut a = base_ann("1", "3", "4", "2.5");
    a.push((pool::TAINTS, "gpu=true:NoSchedule,dedicated:NoExecute"));
    a.push((pool::LABELS, "team=ml, zone=a"));
    a.push((pool::PROVISION_TIMEOUT, "5m"));
    a.push((pool::DEVICES_TIMEOUT, "90s"));
    a.push((pool::MAX_PODS, "20"));
    let p = pool::parse_pool(&md("t", 1, &a)).unwrap();
    assert_eq!(p.template.taints.len(), 2);
    assert_eq!(p.template.taints[0].to_string(), "gpu=true:NoSchedule");
    assert_eq!(p.template.taints[1].to_string(), "dedicated:NoExecute");
    assert_eq!(p.template.labels["team"], "ml");
    assert_eq!(p.template.labels["zone"], "a");
    assert_eq!(p.timeouts.provision, Duration::from_secs(300));
    assert_eq!(p.timeouts.devices, Duration::from_secs(90));
    assert_eq!(p.template.scalars[PODS], 20);
}

#[test]
fn pool_with_mig_config_offers_slices() {
    let mut a = base_ann("0", "2", "8", "30");
    a.push((pool::MIG_CONFIG, "all-1g.10gb"));
    let p = pool::parse_pool(&md("mig", 0, &a)).unwrap();
    assert_eq!(p.template.gpus, 0, "every GPU is in MIG mode");
    assert_eq!(p.template.scalars["nvidia.com/mig-1g.10gb"], 7 * 8);
    assert_eq!(p.template.labels["nvidia.com/mig.config"], "all-1g.10gb");
    let mut a = base_ann("0", "2", "2", "30");
    a.push((pool::MIG_DEVICES, "3g.40gb=2"));
    let p = pool::parse_pool(&md("mig2", 0, &a)).unwrap();
    assert_eq!(p.template.scalars["nvidia.com/mig-3g.40gb"], 4);
}

#[test]
fn pool_with_shared_replicas() {
    let mut a = base_ann("0", "2", "2", "3");
    a.push((pool::GPU_REPLICAS, "4"));
    let p = pool::parse_pool(&md("ts", 0, &a)).unwrap();
    assert_eq!(p.template.gpu_resource, "nvidia.com/gpu.shared");
    assert_eq!((p.template.gpus, p.template.gpu_replicas), (2, 4));
    assert_eq!(p.template.labels["nvidia.com/gpu.replicas"], "4");
}

#[test]
fn malformed_annotations_name_the_pool_and_annotation() {
    let cases: Vec<(&str, &str, &str)> = vec![
        (pool::MIN_SIZE, "two", "whole number"),
        (pool::MAX_SIZE, "-1", "whole number"),
        (pool::MIN_SIZE, "9", "above the maximum"),
        (pool::CPU, "lots", "quantity"),
        (pool::MEMORY, "0", "more than zero"),
        (pool::GPU_COUNT, "4.5", "whole number"),
        (pool::GPU_COUNT, "65", "more than 64"),
        (pool::GPU_TYPE, "gpu", "resource name"),
        (pool::PRICE, "cheap", "number"),
        (pool::PRICE, "-3", "number"),
        (pool::TAINTS, "gpu=true", "key=value:Effect"),
        (pool::TAINTS, "gpu=true:Sometimes", "effect"),
        (pool::LABELS, "team", "key=value"),
        (pool::MIG_CONFIG, "all-9g.99gb", "no MIG config named"),
        (pool::GPU_REPLICAS, "0", "1 or more"),
        (pool::PROVISION_TIMEOUT, "soon", "duration"),
        (pool::REGISTRATION_TIMEOUT, "0s", "longer than zero"),
        (pool::MIG_DEVICES, "1g.10gb", "profile=count"),
        (pool::GPU_PRODUCT, "NVIDIA-Nonexistent", "catalog"),
    ];
    for (key, value, expect) in cases {
        let mut a = base_ann("0", "4", "4", "1");
        a.retain(|(k, _)| *k != key);
        a.push((key, value));
        if key == pool::GPU_PRODUCT {
            a.push((pool::MIG_CONFIG, "all-1g.10gb"));
        }
        let e = pool::parse_pool(&md("bad", 0, &a)).unwrap_err();
        let text = e.to_string();
        assert!(text.contains("MachineDeployment capi/bad"), "{key}: {text}");
        assert!(text.contains(key), "{key}: {text}");
        assert!(
            text.contains(expect),
            "{key}={value}: expected {expect:?} in {text}"
        );
        assert_eq!(e.pool(), Some("capi/bad"));
    }
}

#[test]
fn missing_annotations_are_errors() {
    let mut a = base_ann("0", "4", "4", "1");
    a.retain(|(k, _)| *k != pool::CPU);
    let e = pool::parse_pool(&md("nocpu", 0, &a))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("capi/nocpu") && e.contains(pool::CPU) && e.contains("scale-from-zero"),
        "{e}"
    );
    let e = pool::parse_pool(&md("half", 0, &[(pool::MIN_SIZE, "0")]))
        .unwrap_err()
        .to_string();
    assert!(e.contains(pool::MAX_SIZE), "{e}");
    let mut a = base_ann("0", "4", "4", "1");
    a.retain(|(k, _)| *k != pool::GPU_PRODUCT);
    a.push((pool::MIG_CONFIG, "all-1g.10gb"));
    let e = pool::parse_pool(&md("noproduct", 0, &a))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains(pool::MIG_CONFIG) && e.contains(pool::GPU_PRODUCT),
        "{e}"
    );
}

#[test]
fn a_bad_pool_is_skipped_and_the_others_keep_scaling() {
    let good = md("good", 0, &base_ann("0", "3", "4", "5"));
    let mut bad_ann = base_ann("0", "3", "4", "5");
    bad_ann.push((pool::MIG_CONFIG, "no-such-config"));
    let bad = md("bad", 0, &bad_ann);
    let unmanaged =
        json!({"metadata": {"name": "plain", "namespace": "capi"}, "spec": {"replicas": 3}});
    let (pools, errors) = pool::parse_pools(&[bad, unmanaged, good]);
    assert_eq!(pools.len(), 1);
    assert_eq!(errors.len(), 1);
    assert_eq!(errors[0].pool(), Some("capi/bad"));
    let snap = Snapshot {
        pools,
        pending: vec![gpu_pod("ml/train", 4)],
        skipped_pools: vec!["capi/bad".into()],
        ..Snapshot::default()
    };
    let d = decide(&snap, &mut State::default(), 10 * S, &cfg());
    assert_eq!(d.scale_ups.len(), 1);
    assert_eq!(d.scale_ups[0].pool, "capi/good");
}

// ---- scale-up ----

#[test]
fn scale_from_zero_buys_exactly_one_node_across_the_lifecycle() {
    let mut snap = Snapshot {
        pools: vec![gpu_pool("h100", 5, 8, 30.0, 0)],
        pending: vec![gpu_pod("ml/train", 4)],
        ..Snapshot::default()
    };
    let mut state = State::default();
    let d = decide(&snap, &mut state, 10 * S, &cfg());
    assert_eq!(d.scale_ups.len(), 1);
    assert_eq!((d.scale_ups[0].from, d.scale_ups[0].to), (0, 1));
    assert!(
        d.scale_ups[0]
            .message
            .starts_with("triggered scale-up of pool capi/h100 by 1 node"),
        "{}",
        d.scale_ups[0].message
    );
    assert!(
        d.events
            .iter()
            .any(|e| e.target == Target::Pod("ml/train".into()) && e.reason == "TriggeredScaleUp")
    );
    apply(&mut snap, &d);
    // Replicas raised, no Machine yet; then Machine provisioning; then node registered; then
    // Ready without devices: never a second node.
    let stages = [
        None,
        Some(Stage::Provisioning),
        Some(Stage::Registered),
        Some(Stage::Devices),
    ];
    for (i, stage) in stages.iter().enumerate() {
        snap.machines = stage
            .map(|s| Machine {
                name: "capi/h100-abc".into(),
                pool: "capi/h100".into(),
                node: (s != Stage::Provisioning).then(|| "n1".into()),
                stage: s,
                stage_since: 10 * S,
                failed: false,
            })
            .into_iter()
            .collect();
        let now = (20 + i as u64 * 10) * S;
        let d = decide(&snap, &mut state, now, &cfg());
        assert!(d.scale_ups.is_empty(), "stage {stage:?}: {:?}", d.scale_ups);
        assert!(
            matches!(d.plans[0].plan, Plan::InFlight { .. }),
            "{:?}",
            d.plans[0]
        );
        assert_eq!(d.in_flight.iter().map(|f| f.count).sum::<u32>(), 1);
    }
    // The node is ready: the pod goes there.
    snap.machines.clear();
    snap.nodes = vec![ready_node("n1", &snap.pools[0])];
    let d = decide(&snap, &mut state, 60 * S, &cfg());
    assert!(d.scale_ups.is_empty());
    assert_eq!(d.plans[0].plan, Plan::Existing { node: "n1".into() });
}

#[test]
fn cheapest_feasible_pool_is_chosen() {
    let snap = Snapshot {
        pools: vec![
            gpu_pool("big", 5, 8, 40.0, 0),
            gpu_pool("small", 5, 2, 8.0, 0),
            gpu_pool("tiny", 5, 1, 3.0, 0),
        ],
        pending: vec![gpu_pod("ml/two", 2)],
        ..Snapshot::default()
    };
    let d = decide(&snap, &mut State::default(), S, &cfg());
    assert_eq!(d.scale_ups.len(), 1);
    assert_eq!(d.scale_ups[0].pool, "capi/small");
    let msg = &d.plans[0].message;
    assert!(msg.contains("pool capi/tiny: a node has 1 GPUs"), "{msg}");
}

#[test]
fn free_capacity_and_in_flight_nodes_come_before_buying() {
    let p = gpu_pool("h100", 5, 8, 30.0, 2);
    let mut n = ready_node("n1", &p);
    n.gpu_free = vec![0, 0, 0, 0, 0, 0, 1000, 1000];
    let snap = Snapshot {
        nodes: vec![n],
        pending: vec![
            gpu_pod("a/two", 2),
            gpu_pod("a/eight", 8),
            gpu_pod("a/one", 1),
        ],
        pools: vec![p],
        ..Snapshot::default()
    };
    let d = decide(&snap, &mut State::default(), S, &cfg());
    let plan = |k: &str| d.plans.iter().find(|p| p.pod == k).unwrap().plan.clone();
    // 8 GPUs: the in-flight replica (replicas 2, one node); 2 GPUs: the free ones; 1 GPU: a new node.
    assert!(
        matches!(plan("a/eight"), Plan::InFlight { .. }),
        "{:?}",
        plan("a/eight")
    );
    assert_eq!(plan("a/two"), Plan::Existing { node: "n1".into() });
    assert_eq!(
        plan("a/one"),
        Plan::NewNode {
            pool: "capi/h100".into()
        }
    );
    assert_eq!(launched(&d), 1);
}

#[test]
fn never_above_max_and_the_pod_is_told_why() {
    let snap = Snapshot {
        pools: vec![gpu_pool("h100", 2, 8, 30.0, 2)],
        nodes: vec![],
        pending: (0..3).map(|i| gpu_pod(&format!("a/p{i}"), 8)).collect(),
        ..Snapshot::default()
    };
    let d = decide(&snap, &mut State::default(), S, &cfg());
    assert!(d.scale_ups.is_empty());
    let unsched: Vec<_> = d
        .plans
        .iter()
        .filter(|p| matches!(p.plan, Plan::Unschedulable { .. }))
        .collect();
    assert_eq!(unsched.len(), 1, "two ride the in-flight replicas");
    assert_eq!(
        unsched[0].message,
        "no pool can run this pod: pool capi/h100: at its maximum size 2"
    );
    assert!(
        d.events
            .iter()
            .any(|e| e.reason == "NotTriggerScaleUp" && e.warning)
    );
}

#[test]
fn unchanged_explanations_are_not_repeated() {
    let snap = Snapshot {
        pools: vec![gpu_pool("h100", 0, 8, 30.0, 0)],
        pending: vec![gpu_pod("a/p", 1)],
        ..Snapshot::default()
    };
    let mut state = State::default();
    let d1 = decide(&snap, &mut state, S, &cfg());
    let d2 = decide(&snap, &mut state, 2 * S, &cfg());
    assert_eq!(d1.events.len(), 1);
    assert!(d2.events.is_empty());
}

#[test]
fn taints_selectors_and_products_are_honoured() {
    let mut a = base_ann("0", "4", "4", "1");
    a.push((pool::TAINTS, "dedicated=ml:NoSchedule"));
    let tainted = pool::parse_pool(&md("tainted", 0, &a)).unwrap();
    let mut a = base_ann("0", "4", "4", "9");
    a.retain(|(k, _)| *k != pool::GPU_PRODUCT);
    a.push((pool::GPU_PRODUCT, "NVIDIA-A100-SXM4-80GB"));
    let a100 = pool::parse_pool(&md("a100", 0, &a)).unwrap();
    let mut plain = gpu_pod("a/plain", 1);
    plain.constraints.node_selector.insert(
        "nvidia.com/gpu.product".into(),
        "NVIDIA-H100-80GB-HBM3".into(),
    );
    let mut tolerant = plain.clone();
    tolerant.key = "a/tolerant".into();
    tolerant.tolerations.push(Toleration {
        key: "dedicated".into(),
        operator: "Exists".into(),
        ..Toleration::default()
    });
    let mut wants_a100 = gpu_pod("a/a100", 1);
    wants_a100.constraints.node_selector.insert(
        "nvidia.com/gpu.product".into(),
        "NVIDIA-A100-SXM4-80GB".into(),
    );
    let snap = Snapshot {
        pools: vec![tainted, a100],
        pending: vec![plain, tolerant, wants_a100],
        ..Snapshot::default()
    };
    let d = decide(&snap, &mut State::default(), S, &cfg());
    let plan = |k: &str| d.plans.iter().find(|p| p.pod == k).unwrap();
    assert_eq!(
        plan("a/tolerant").plan,
        Plan::NewNode {
            pool: "capi/tainted".into()
        }
    );
    assert_eq!(
        plan("a/a100").plan,
        Plan::NewNode {
            pool: "capi/a100".into()
        }
    );
    let m = &plan("a/plain").message;
    assert!(
        m.contains("pool capi/tainted: taint dedicated=ml:NoSchedule not tolerated"),
        "{m}"
    );
    assert!(
        m.contains("pool capi/a100: nodeSelector nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3"),
        "{m}"
    );
}

#[test]
fn mixed_burst_buys_the_minimum() {
    let mut a = base_ann("0", "10", "1", "4");
    a.push((pool::MIG_CONFIG, "all-1g.10gb"));
    let mig = pool::parse_pool(&md("mig", 0, &a)).unwrap(); // 7 slices per node
    let mut a = base_ann("0", "10", "1", "2");
    a.push((pool::GPU_REPLICAS, "4"));
    let shared = pool::parse_pool(&md("shared", 0, &a)).unwrap(); // 4 shares per node
    let whole = gpu_pool("whole", 10, 2, 6.0, 0); // 2 GPUs per node
    let mut pending = Vec::new();
    for i in 0..8 {
        pending.push(mig_pod(&format!("a/mig{i}"), "1g.10gb", 1));
    }
    for i in 0..7 {
        pending.push(shared_pod(&format!("a/sh{i}")));
    }
    for i in 0..5 {
        pending.push(gpu_pod(&format!("a/w{i}"), 1));
    }
    let snap = Snapshot {
        pools: vec![mig, shared, whole],
        pending,
        ..Snapshot::default()
    };
    let d = decide(&snap, &mut State::default(), S, &cfg());
    let by = |p: &str| {
        d.scale_ups
            .iter()
            .find(|s| s.pool == p)
            .map_or(0, |s| s.to - s.from)
    };
    // ceil(8/7) + ceil(7/4) + ceil(5/2)
    assert_eq!(
        (by("capi/mig"), by("capi/shared"), by("capi/whole")),
        (2, 2, 3)
    );
}

#[test]
fn batch_window_waits_then_buys_once() {
    let snap = Snapshot {
        pools: vec![gpu_pool("h100", 5, 8, 30.0, 0)],
        pending: vec![PendingPod {
            created: 100 * S,
            ..gpu_pod("a/p", 1)
        }],
        ..Snapshot::default()
    };
    let c = Config {
        batch_idle: Duration::from_secs(2),
        batch_max: Duration::from_secs(10),
        ..Config::default()
    };
    let mut state = State::default();
    let d = decide(&snap, &mut state, 101 * S, &c);
    assert!(d.scale_ups.is_empty());
    assert!(matches!(d.plans[0].plan, Plan::Waiting { .. }));
    // The caller is told when to look again: the idle period ends at 102 s.
    assert_eq!(d.batch_closes_in, Some(Duration::from_secs(1)));
    let d = decide(&snap, &mut state, 103 * S, &c);
    assert_eq!(launched(&d), 1);
    assert_eq!(d.batch_closes_in, None);
}

#[test]
fn the_batch_window_closes_at_the_maximum_when_pods_keep_coming() {
    // A pod every second since 100 s: the idle period never runs out, the maximum (10 s from
    // the oldest) does, at 110 s.
    let pending: Vec<PendingPod> = (0..10)
        .map(|i| PendingPod {
            created: (100 + i) * S,
            ..gpu_pod(&format!("a/p{i}"), 1)
        })
        .collect();
    let snap = Snapshot {
        pools: vec![gpu_pool("h100", 5, 8, 30.0, 0)],
        pending,
        ..Snapshot::default()
    };
    let c = Config {
        batch_idle: Duration::from_secs(2),
        batch_max: Duration::from_secs(10),
        ..Config::default()
    };
    let d = decide(&snap, &mut State::default(), 109 * S + 500, &c);
    assert!(d.scale_ups.is_empty());
    assert_eq!(d.batch_closes_in, Some(Duration::from_millis(500)));
    let d = decide(&snap, &mut State::default(), 110 * S, &c);
    assert_eq!(launched(&d), 2, "10 one-GPU pods on 8-GPU nodes");
}

#[test]
fn timed_out_machine_backs_off_its_pool_only() {
    let mut snap = Snapshot {
        pools: vec![
            gpu_pool("flaky", 5, 8, 1.0, 1),
            gpu_pool("solid", 5, 8, 2.0, 0),
        ],
        machines: vec![Machine {
            name: "capi/flaky-1".into(),
            pool: "capi/flaky".into(),
            node: Some("f1".into()),
            stage: Stage::Devices,
            stage_since: 0,
            failed: false,
        }],
        pending: vec![gpu_pod("a/p", 8)],
        ..Snapshot::default()
    };
    let mut state = State::default();
    let now = 11 * 60 * S; // devices limit is 10 minutes
    let d = decide(&snap, &mut state, now, &cfg());
    assert_eq!(d.timed_out.len(), 1);
    assert!(
        d.timed_out[0]
            .message
            .contains("exceeded the devices limit of 10m"),
        "{}",
        d.timed_out[0].message
    );
    assert_eq!(d.scale_ups.len(), 1);
    assert_eq!(
        d.scale_ups[0].pool, "capi/solid",
        "the cheaper pool is backed off"
    );
    assert!(
        d.plans[0].message.contains("pool capi/flaky: backed off"),
        "{}",
        d.plans[0].message
    );
    assert_eq!(state.backoff["capi/flaky"].failures, 1);
    // The same machine reported again does not back off twice.
    let d2 = decide(&snap, &mut state, now + S, &cfg());
    assert_eq!(state.backoff["capi/flaky"].failures, 1);
    assert_eq!(d2.timed_out.len(), 1);
    // Deleted, and the back-off over: the cheap pool is used again.
    snap.machines.clear();
    snap.pools[0].replicas = 0;
    let later = state.backoff["capi/flaky"].until + S;
    let d3 = decide(&snap, &mut state, later, &cfg());
    assert_eq!(d3.scale_ups[0].pool, "capi/flaky");
}

#[test]
fn backoff_grows_exponentially_with_jitter() {
    let mut state = State::default();
    let mut snap = Snapshot {
        pools: vec![gpu_pool("flaky", 5, 8, 1.0, 1)],
        ..Snapshot::default()
    };
    let mut waits = Vec::new();
    for k in 0..4u64 {
        snap.machines = vec![Machine {
            name: format!("capi/m{k}"),
            pool: "capi/flaky".into(),
            node: None,
            stage: Stage::Provisioning,
            stage_since: 0,
            failed: true,
        }];
        let now = (k + 1) * 3600 * S;
        decide(&snap, &mut state, now, &cfg());
        waits.push(state.backoff["capi/flaky"].until - now);
    }
    let c = cfg();
    for (k, w) in waits.iter().enumerate() {
        let nominal = (c.backoff_base.as_millis() as f64 * 2f64.powi(k as i32))
            .min(c.backoff_max.as_millis() as f64);
        let ratio = *w as f64 / nominal;
        assert!((0.8..1.2).contains(&ratio), "failure {k}: {w} vs {nominal}");
    }
}

// ---- scale-down ----

fn running(key: &str, gpu: bool) -> RunningPod {
    RunningPod {
        key: key.into(),
        labels: BTreeMap::from([("app".to_string(), "train".to_string())]),
        gpu,
        do_not_disrupt: false,
    }
}

fn idle_cluster() -> Snapshot {
    let p = gpu_pool("h100", 5, 8, 30.0, 2);
    let mut busy = ready_node("busy", &p);
    busy.pods = vec![running("a/busy", true)];
    busy.gpu_util = Some(80.0);
    let mut idle = ready_node("idle", &p);
    idle.pods = vec![running("a/web", false)];
    Snapshot {
        nodes: vec![busy, idle],
        pools: vec![p],
        ..Snapshot::default()
    }
}

#[test]
fn idle_node_is_removed_after_the_idle_period() {
    let snap = idle_cluster();
    let mut state = State::default();
    let c = cfg();
    assert!(decide(&snap, &mut state, 0, &c).removals.is_empty());
    assert!(
        decide(&snap, &mut state, 9 * 60 * S, &c)
            .removals
            .is_empty()
    );
    let d = decide(&snap, &mut state, 10 * 60 * S, &c);
    assert_eq!(d.removals.len(), 1);
    assert_eq!(d.removals[0].node, "idle");
    assert_eq!(d.removals[0].machine.as_deref(), Some("capi/idle"));
    assert_eq!(d.removals[0].evict, vec!["a/web".to_string()]);
    assert!(
        d.removals[0].message.contains("no GPU pod for 10m"),
        "{}",
        d.removals[0].message
    );
}

#[test]
fn a_wall_clock_jump_shifted_out_keeps_the_idle_time_left() {
    const H: u64 = 3600 * S;
    let snap = idle_cluster();
    let c = cfg();
    // Jump forward by an hour 5 min into the idle period: without the shift the node would go at
    // once; with it, it still has its 5 min left.
    let mut state = State::default();
    decide(&snap, &mut state, 0, &c);
    decide(&snap, &mut state, 5 * 60 * S, &c);
    let mut unshifted = state.clone();
    state.shift(i64::try_from(H).unwrap());
    assert!(
        decide(&snap, &mut state, H + 6 * 60 * S, &c)
            .removals
            .is_empty()
    );
    assert_eq!(
        decide(&snap, &mut state, H + 10 * 60 * S, &c)
            .removals
            .len(),
        1
    );
    assert_eq!(
        decide(&snap, &mut unshifted, H + 6 * 60 * S, &c)
            .removals
            .len(),
        1,
        "the unshifted state must show the bug the shift prevents"
    );
    // A jump back by an hour: the node still goes 10 min after it became idle, not 70.
    let mut state = State::default();
    decide(&snap, &mut state, 2 * H, &c);
    state.shift(-i64::try_from(H).unwrap());
    assert_eq!(
        decide(&snap, &mut state, H + 10 * 60 * S, &c)
            .removals
            .len(),
        1
    );
    // Back-offs move too.
    let mut state = State::default();
    state.backoff.insert(
        "p".into(),
        Backoff {
            failures: 1,
            until: 10 * S,
        },
    );
    state.shift(-5_000);
    assert_eq!(state.backoff["p"].until, 5 * S);
}

#[test]
fn measured_idle_gpus_make_a_node_unneeded() {
    let mut snap = idle_cluster();
    snap.nodes[0].gpu_util = Some(0.0);
    snap.pools[0].min = 0;
    let mut state = State::default();
    decide(&snap, &mut state, 0, &cfg());
    let d = decide(&snap, &mut state, 600 * S, &cfg());
    assert_eq!(d.removals.len(), 2);
    assert!(
        d.removals
            .iter()
            .any(|r| r.node == "busy" && r.message.contains("utilization 0%"))
    );
    // Use in between resets the clock.
    snap.nodes[0].gpu_util = Some(50.0);
    decide(&snap, &mut state, 601 * S, &cfg());
    snap.nodes[0].gpu_util = Some(0.0);
    let d = decide(&snap, &mut state, 602 * S, &cfg());
    assert!(d.removals.iter().all(|r| r.node != "busy"));
}

#[test]
fn never_below_min() {
    let mut snap = idle_cluster();
    snap.pools[0].min = 2;
    let mut state = State::default();
    decide(&snap, &mut state, 0, &cfg());
    let d = decide(&snap, &mut state, 600 * S, &cfg());
    assert!(d.removals.is_empty());
    assert!(
        d.events
            .iter()
            .any(|e| e.message.contains("at its minimum size 2"))
    );
}

#[test]
fn do_not_disrupt_blocks_removal() {
    let mut snap = idle_cluster();
    snap.nodes[1].pods[0].do_not_disrupt = true;
    let mut state = State::default();
    decide(&snap, &mut state, 0, &cfg());
    let d = decide(&snap, &mut state, 600 * S, &cfg());
    assert!(d.removals.is_empty());
    assert!(
        d.events
            .iter()
            .any(|e| e.message.contains("pod a/web is annotated do-not-disrupt"))
    );
}

#[test]
fn pdb_blocks_removal() {
    let mut snap = idle_cluster();
    snap.pdbs = vec![Pdb {
        key: "a/train".into(),
        namespace: "a".into(),
        match_labels: BTreeMap::from([("app".to_string(), "train".to_string())]),
        disruptions_allowed: 0,
    }];
    let mut state = State::default();
    decide(&snap, &mut state, 0, &cfg());
    let d = decide(&snap, &mut state, 600 * S, &cfg());
    assert!(d.removals.is_empty());
    assert!(
        d.events
            .iter()
            .any(|e| e.message.contains("PodDisruptionBudget a/train"))
    );
    snap.pdbs[0].disruptions_allowed = 1;
    assert_eq!(decide(&snap, &mut state, 601 * S, &cfg()).removals.len(), 1);
}

#[test]
fn a_node_pending_pods_will_use_is_kept() {
    let mut snap = idle_cluster();
    snap.nodes[0].gpu_free = vec![0; 8];
    snap.pending = vec![gpu_pod("a/new", 2)];
    let mut state = State::default();
    decide(&snap, &mut state, 0, &cfg());
    let d = decide(&snap, &mut state, 600 * S, &cfg());
    assert!(d.removals.is_empty(), "{:?}", d.removals);
    assert_eq!(
        d.plans[0].plan,
        Plan::Existing {
            node: "idle".into()
        }
    );
}

// ---- properties over random clusters ----

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn random_cluster(r: &mut Rng) -> Snapshot {
    let mut pools = Vec::new();
    let npools = 1 + r.below(4);
    for i in 0..npools {
        let gpus = [1u32, 2, 4, 8][r.below(4) as usize];
        let max = r.below(6) as u32;
        let replicas = r.below(u64::from(max) + 1) as u32;
        let mut p = gpu_pool(
            &format!("p{i}"),
            max,
            gpus,
            (1 + r.below(50)) as f64,
            replicas,
        );
        p.min = r.below(u64::from(replicas) + 1) as u32;
        if r.below(3) == 0 {
            p.template.taints.push(Taint {
                key: "t".into(),
                value: String::new(),
                effect: "NoSchedule".into(),
            });
        }
        pools.push(p);
    }
    let mut nodes = Vec::new();
    for p in &pools {
        // Some of the replicas are ready nodes, the rest in flight.
        for k in 0..r.below(u64::from(p.replicas) + 1) {
            let mut n = ready_node(&format!("{}-n{k}", p.name), p);
            for f in n.gpu_free.iter_mut() {
                *f = [0u16, 1000][r.below(2) as usize];
            }
            if n.gpu_free.iter().all(|f| *f == 1000) && r.below(2) == 0 {
                n.pods.push(running(&format!("x/{k}"), false));
            } else {
                n.pods.push(running(&format!("x/{k}"), true));
                n.gpu_util = Some(r.below(3) as f64 * 10.0);
            }
            nodes.push(n);
        }
    }
    let pending = (0..r.below(15))
        .map(|i| {
            let mut p = gpu_pod(&format!("q/{i}"), 1 + r.below(8));
            if r.below(3) == 0 {
                p.tolerations.push(Toleration {
                    key: "t".into(),
                    operator: "Exists".into(),
                    ..Toleration::default()
                });
            }
            p
        })
        .collect();
    Snapshot {
        pools,
        nodes,
        pending,
        ..Snapshot::default()
    }
}

#[test]
fn property_bounds_and_one_scale_up_per_need() {
    let mut r = Rng(0x9e37_79b9_7f4a_7c15);
    for case in 0..400 {
        let mut snap = random_cluster(&mut r);
        let mut state = State::default();
        let c = Config {
            scale_down_idle: Duration::ZERO,
            ..cfg()
        };
        let d = decide(&snap, &mut state, 1000 * S, &c);
        // Never above max.
        for su in &d.scale_ups {
            let p = snap.pools.iter().find(|p| p.name == su.pool).unwrap();
            assert!(su.to <= p.max, "case {case}: {su:?} above max {}", p.max);
            assert!(su.to > su.from);
        }
        // Never below min.
        for p in &snap.pools {
            let removed = d.removals.iter().filter(|x| x.pool == p.name).count() as u32;
            assert!(
                p.replicas.saturating_sub(removed) >= p.min.min(p.replicas),
                "case {case}: pool {} below min",
                p.name
            );
            assert!(p.replicas - removed >= p.min || removed == 0, "case {case}");
        }
        // Every new node was opened by a pod that an empty node of its pool can run, and no
        // node is bought empty: its pool gets at least as many pods planned onto new nodes as
        // it gets nodes. (Which pool is the cheapest packing is checked against an optimum
        // computed independently: `property_the_purchase_is_near_the_cheapest`.)
        for su in &d.scale_ups {
            let chosen = snap.pools.iter().find(|p| p.name == su.pool).unwrap();
            assert_eq!(su.triggered_by.len() as u32, su.to - su.from, "case {case}");
            for opener in &su.triggered_by {
                let pod = snap.pending.iter().find(|p| &p.key == opener).unwrap();
                assert_eq!(
                    template_misfit(&chosen.template, pod),
                    None,
                    "case {case}: {opener} opened a node of {} that cannot run it",
                    su.pool
                );
            }
            let planned = d
                .plans
                .iter()
                .filter(|p| {
                    p.plan
                        == Plan::NewNode {
                            pool: su.pool.clone(),
                        }
                })
                .count() as u32;
            assert!(
                planned >= su.to - su.from,
                "case {case}: {} nodes of {} for {planned} pods",
                su.to - su.from,
                su.pool
            );
        }
        // One need, one scale-up: applying the decision and deciding again buys nothing more.
        apply(&mut snap, &d);
        let again = decide(&snap, &mut state, 1001 * S, &c);
        assert!(
            again.scale_ups.is_empty(),
            "case {case}: second scale-up {:?}",
            again.scale_ups
        );
        let again = decide(&snap, &mut State::default(), 1002 * S, &c);
        assert!(
            again.scale_ups.is_empty(),
            "case {case}: after a restart {:?}",
            again.scale_ups
        );
    }
}

/// Minimum nodes of one template that hold `pods` (each needing `g` GPUs of `gpus`), by brute
/// force over bin assignments: independent of the decision's first-fit-decreasing.
fn brute_min_nodes(pods: &[u32], gpus: u32) -> u32 {
    fn go(i: usize, pods: &[u32], bins: &mut Vec<u32>, cap: u32, best: &mut u32) {
        if bins.len() as u32 >= *best {
            return;
        }
        if i == pods.len() {
            *best = bins.len() as u32;
            return;
        }
        for b in 0..bins.len() {
            if bins[b] + pods[i] <= cap {
                bins[b] += pods[i];
                go(i + 1, pods, bins, cap, best);
                bins[b] -= pods[i];
            }
        }
        bins.push(pods[i]);
        go(i + 1, pods, bins, cap, best);
        bins.pop();
    }
    let mut best = u32::MAX;
    go(0, pods, &mut Vec::new(), gpus, &mut best);
    best
}

#[test]
fn property_nodes_bought_are_close_to_the_minimum() {
    let mut r = Rng(42);
    for case in 0..200 {
        let gpus = [2u32, 4, 8][r.below(3) as usize];
        let sizes: Vec<u32> = (0..1 + r.below(9))
            .map(|_| 1 + r.below(u64::from(gpus)) as u32)
            .collect();
        let snap = Snapshot {
            pools: vec![gpu_pool("p", 100, gpus, 1.0, 0)],
            pending: sizes
                .iter()
                .enumerate()
                .map(|(i, g)| gpu_pod(&format!("a/{i}"), u64::from(*g)))
                .collect(),
            ..Snapshot::default()
        };
        let d = decide(&snap, &mut State::default(), S, &cfg());
        let min = brute_min_nodes(&sizes, gpus);
        let got = launched(&d);
        // First-fit-decreasing is within 11/9 OPT + 6/9 of the optimum; with whole GPUs on
        // small nodes it is almost always optimal.
        assert!(
            got >= min,
            "case {case}: bought {got} below the minimum {min}?"
        );
        assert!(
            f64::from(got) <= 11.0 / 9.0 * f64::from(min) + 6.0 / 9.0,
            "case {case}: {sizes:?} on {gpus}: {got} vs {min}"
        );
    }
}

// ---- the cost of what is bought, against an optimum computed here ----

/// The cheapest purchase for whole-GPU pods of `sizes` from pools of `(GPUs per node, price)`
/// (no size limits), and the fewest nodes among the purchases at that cost, independent of the
/// decision's greedy: a DP over the multisets of pods left (counts per size), where each node
/// holds a multiset whose GPUs fit it, priced by the cheapest pool that does. Prices are whole
/// numbers, so sums compare exactly.
fn optimum(sizes: &[u32], pools: &[(u32, u64)]) -> (u64, u32) {
    let mut kinds: Vec<(u32, usize)> = Vec::new();
    for &g in sizes {
        match kinds.iter_mut().find(|k| k.0 == g) {
            Some(k) => k.1 += 1,
            None => kinds.push((g, 1)),
        }
    }
    let node_price = |g: u32| pools.iter().filter(|(c, _)| *c >= g).map(|(_, p)| *p).min();
    // Counts as a mixed-radix index.
    let radix: Vec<usize> = kinds.iter().map(|k| k.1 + 1).collect();
    let states: usize = radix.iter().product();
    let decode = |mut i: usize| -> Vec<usize> {
        radix
            .iter()
            .map(|r| {
                let d = i % r;
                i /= r;
                d
            })
            .collect()
    };
    let encode =
        |c: &[usize]| -> usize { c.iter().zip(&radix).rev().fold(0, |i, (d, r)| i * r + d) };
    let mut best: Vec<Option<(u64, u32)>> = vec![None; states];
    best[0] = Some((0, 0));
    for i in 1..states {
        let c = decode(i);
        // The node holding one pod of the first kind left: every sub-multiset with it.
        let first = c.iter().position(|&d| d > 0).unwrap();
        let mut s = vec![0usize; c.len()];
        loop {
            // Next sub-multiset s <= c (odometer).
            let mut k = 0;
            while k < c.len() {
                if s[k] < c[k] {
                    s[k] += 1;
                    break;
                }
                s[k] = 0;
                k += 1;
            }
            if k == c.len() {
                break;
            }
            if s[first] == 0 {
                continue;
            }
            let g: u32 = s.iter().zip(&kinds).map(|(n, k)| *n as u32 * k.0).sum();
            let rest: Vec<usize> = c.iter().zip(&s).map(|(a, b)| a - b).collect();
            if let (Some(p), Some((cost, nodes))) = (node_price(g), best[encode(&rest)]) {
                let cand = (cost + p, nodes + 1);
                if best[i].is_none_or(|b| cand < b) {
                    best[i] = Some(cand);
                }
            }
        }
    }
    best[states - 1].unwrap()
}

/// What a decision bought: its cost by the snapshot's prices, and the nodes.
fn bought_cost(snap: &Snapshot, d: &Decision) -> (f64, u32) {
    let mut cost = 0.0;
    for su in &d.scale_ups {
        let p = snap.pools.iter().find(|p| p.name == su.pool).unwrap();
        cost += p.price_per_hour * f64::from(su.to - su.from);
    }
    (cost, launched(d))
}

fn burst_pods() -> Vec<PendingPod> {
    let mut pending = Vec::new();
    for (count, gpus) in [(8, 1u64), (6, 2), (4, 4), (2, 8)] {
        for i in 0..count {
            pending.push(gpu_pod(&format!("burst/g{gpus}-{i}"), gpus));
        }
    }
    pending
}

#[test]
fn a_burst_over_pools_at_the_same_price_per_gpu_buys_the_fewest_nodes() {
    // The bench's burst: 20 pods asking 52 GPUs; 8x, 4x and 1x pools at $12.29 per GPU-hour.
    // Picking per pod the cheapest node that fits bought 18 nodes here (every 1-GPU pod its own
    // 1x node); packing the batch needs 7.
    let pools = [(8u32, 9832u64), (4, 4916), (1, 1229)];
    let mut snap = Snapshot {
        pools: pools
            .iter()
            .map(|(g, cents)| gpu_pool(&format!("h100-{g}x"), 100, *g, *cents as f64 / 100.0, 0))
            .collect(),
        pending: burst_pods(),
        ..Snapshot::default()
    };
    let sizes: Vec<u32> = snap.pending.iter().map(|p| p.gpu_count as u32).collect();
    let d = decide(&snap, &mut State::default(), S, &cfg());
    let (cost, nodes) = bought_cost(&snap, &d);
    assert_eq!(optimum(&sizes, &pools), (52 * 1229, 7));
    assert_eq!(
        ((cost * 100.0).round() as u64, nodes),
        optimum(&sizes, &pools),
        "{:?}",
        d.scale_ups
    );
    // Half the burst (26 GPUs): 4 nodes cannot hold exactly 26 GPUs of 8x/4x/1x, so the
    // cheapest purchase takes 5.
    let half: Vec<u32> = sizes.iter().step_by(2).copied().collect();
    snap.pending = snap.pending.into_iter().step_by(2).collect();
    let d = decide(&snap, &mut State::default(), S, &cfg());
    let (cost, nodes) = bought_cost(&snap, &d);
    assert_eq!(
        ((cost * 100.0).round() as u64, nodes),
        optimum(&half, &pools),
        "{:?}",
        d.scale_ups
    );
    // And the full burst buys once.
    snap.pending = burst_pods();
    let d = decide(&snap, &mut State::default(), S, &cfg());
    apply(&mut snap, &d);
    let again = decide(&snap, &mut State::default(), 2 * S, &cfg());
    assert!(again.scale_ups.is_empty(), "{:?}", again.scale_ups);
    assert!(
        again
            .plans
            .iter()
            .all(|p| matches!(p.plan, Plan::InFlight { .. })),
        "{:?}",
        again.plans
    );
}

#[test]
fn a_small_node_cheaper_per_gpu_wins_and_a_big_one_cheaper_per_gpu_wins_the_batch() {
    let big = |price: f64| gpu_pool("big", 10, 8, price, 0);
    let small = |price: f64| gpu_pool("small", 10, 1, price, 0);
    let buy = |pools: Vec<Pool>, pods: usize| {
        let snap = Snapshot {
            pools,
            pending: (0..pods).map(|i| gpu_pod(&format!("a/p{i}"), 1)).collect(),
            ..Snapshot::default()
        };
        let d = decide(&snap, &mut State::default(), S, &cfg());
        d.scale_ups
            .iter()
            .map(|s| (s.pool.clone(), s.to - s.from))
            .collect::<Vec<_>>()
    };
    // The 1x node is cheaper per GPU: one pod, and eight, go on 1x nodes.
    assert_eq!(
        buy(vec![big(98.32), small(10.0)], 1),
        vec![("capi/small".to_string(), 1)]
    );
    assert_eq!(
        buy(vec![big(98.32), small(10.0)], 8),
        vec![("capi/small".to_string(), 8)]
    );
    // The 8x node is cheaper per GPU: one pod still costs less on a 1x node, eight fill an 8x.
    assert_eq!(
        buy(vec![big(80.0), small(12.29)], 1),
        vec![("capi/small".to_string(), 1)]
    );
    assert_eq!(
        buy(vec![big(80.0), small(12.29)], 8),
        vec![("capi/big".to_string(), 1)]
    );
    // Nine: one 8x and one 1x (92.29), not two 8x nor nine 1x.
    let mut nine = buy(vec![big(80.0), small(12.29)], 9);
    nine.sort();
    assert_eq!(
        nine,
        vec![("capi/big".to_string(), 1), ("capi/small".to_string(), 1)]
    );
}

#[test]
fn property_the_purchase_is_near_the_cheapest() {
    // Small random batches of whole-GPU pods over 1-3 pools with random prices; the decision's
    // purchase against the optimum of `optimum`. Bound per case, from the greedy's analysis
    // (decide.rs, `pack`): the set-cover greedy pays per GPU served at most twice OPT over the
    // GPUs left, so it costs at most 2·H(W)·OPT for W GPUs requested, and the decision takes
    // the cheaper of it and the anchored greedy. That bound is loose; over all cases together
    // the purchase must also be the optimum in nearly every case and buy about the fewest
    // nodes, which the rule before (per pod the cheapest node that fits) fails.
    let mut r = Rng(0x5eed_cafe_f00d);
    let (mut total, mut total_opt, mut exact, mut worst) = (0.0, 0.0, 0, 1.0f64);
    let (mut nodes, mut nodes_opt) = (0u32, 0u32);
    let mut off = Vec::new();
    const CASES: usize = 300;
    for case in 0..CASES {
        let npools = 1 + r.below(3) as usize;
        let pools: Vec<(u32, u64)> = (0..npools)
            .map(|_| {
                let g = [1u32, 2, 4, 8][r.below(4) as usize];
                // Every other case the same price per GPU (only the packing decides, as in the
                // bench); else per-GPU prices between 8 and 16 plus a per-node part of 0-5.
                if case % 2 == 0 {
                    (g, u64::from(g) * 12)
                } else {
                    (g, u64::from(g) * (8 + r.below(9)) + r.below(6))
                }
            })
            .collect();
        let cap = pools.iter().map(|p| p.0).max().unwrap();
        let sizes: Vec<u32> = (0..1 + r.below(9))
            .map(|_| 1 + r.below(u64::from(cap)) as u32)
            .collect();
        let snap = Snapshot {
            pools: pools
                .iter()
                .enumerate()
                .map(|(i, (g, p))| gpu_pool(&format!("p{i}"), 100, *g, *p as f64, 0))
                .collect(),
            pending: sizes
                .iter()
                .enumerate()
                .map(|(i, g)| gpu_pod(&format!("a/{i}"), u64::from(*g)))
                .collect(),
            ..Snapshot::default()
        };
        let d = decide(&snap, &mut State::default(), S, &cfg());
        assert!(
            d.plans
                .iter()
                .all(|p| matches!(p.plan, Plan::NewNode { .. })),
            "case {case}: {:?}",
            d.plans
        );
        let (cost, got_nodes) = bought_cost(&snap, &d);
        let (opt, opt_nodes) = optimum(&sizes, &pools);
        let opt = opt as f64;
        nodes += got_nodes;
        nodes_opt += opt_nodes;
        let h: f64 = (1..=sizes.iter().sum::<u32>())
            .map(|i| 1.0 / f64::from(i))
            .sum();
        assert!(
            cost >= opt - 1e-9,
            "case {case}: {cost} below the optimum {opt}?"
        );
        assert!(
            cost <= 2.0 * h * opt + 1e-9,
            "case {case}: {sizes:?} on {pools:?}: {cost} vs {opt}"
        );
        if cost > opt + 1e-9 {
            let got: Vec<_> = d
                .scale_ups
                .iter()
                .map(|s| (s.pool.clone(), s.to - s.from))
                .collect();
            off.push(format!(
                "case {case}: {sizes:?} on {pools:?}: {cost} {got:?} vs {opt} in {opt_nodes} nodes"
            ));
        }
        total += cost;
        total_opt += opt;
        exact += usize::from((cost - opt).abs() < 1e-9);
        worst = worst.max(cost / opt);
    }
    println!(
        "{CASES} cases: bought {:.4}x the optimum in total, {exact} exactly optimal, worst case {worst:.3}x; {nodes} nodes where the cheapest purchases take {nodes_opt}",
        total / total_opt
    );
    // Measured with this seed: 297 of 300 exactly optimal, 1.0004x in total, 1150 nodes for
    // 1145. The rule before (per pod the cheapest node that fits): 283, 1.0047x, 1205 nodes.
    assert!(
        exact * 100 >= CASES * 97 && total <= 1.002 * total_opt,
        "{exact} of {CASES} optimal, {:.4}x in total; not optimal:\n{}",
        total / total_opt,
        off.join("\n")
    );
    assert!(
        f64::from(nodes) <= 1.01 * f64::from(nodes_opt),
        "{nodes} nodes where the cheapest purchases take {nodes_opt}"
    );
}

#[test]
fn shared_replicas_count_the_same_whichever_pool_serves_them() {
    // Four 1-replica pods: a 1-GPU pool split 4 ways ($4) or a 2-GPU pool split 2 ways ($6)
    // holds all four. Measured in each pool's own replicas, the second would serve "2 GPUs"
    // and look cheaper per unit; measured once for all pools, the cheaper node wins.
    let mut a = base_ann("0", "10", "1", "4");
    a.push((pool::GPU_REPLICAS, "4"));
    let quarter = pool::parse_pool(&md("quarter", 0, &a)).unwrap();
    let mut a = base_ann("0", "10", "2", "6");
    a.push((pool::GPU_REPLICAS, "2"));
    let half = pool::parse_pool(&md("half", 0, &a)).unwrap();
    let snap = Snapshot {
        pools: vec![half, quarter],
        pending: (0..4).map(|i| shared_pod(&format!("a/s{i}"))).collect(),
        ..Snapshot::default()
    };
    let d = decide(&snap, &mut State::default(), S, &cfg());
    let got: Vec<_> = d
        .scale_ups
        .iter()
        .map(|s| (s.pool.as_str(), s.to - s.from))
        .collect();
    assert_eq!(got, vec![("capi/quarter", 1)]);
}

#[test]
fn pool_sizes_and_replicas_that_size_memory_are_bounded_with_the_limit_named() {
    let ann = |min: &'static str, max: &'static str| base_ann(min, max, "8", "10");
    let err = |replicas: u32, a: &[(&str, &str)]| {
        pool::parse_pool(&md("p", replicas, a))
            .unwrap_err()
            .to_string()
    };
    assert_eq!(
        err(0, &ann("0", "4000000000")),
        format!(
            "MachineDeployment capi/p: annotation {}=\"4000000000\": must be at most 10000 (twice the 5,000 nodes Kubernetes supports per cluster); accepted: 0 to 10000",
            pool::MAX_SIZE
        )
    );
    assert!(
        err(0, &ann("10001", "10002")).contains("must be at most 10000"),
        "min"
    );
    assert!(
        err(0, &ann("0", "99999999999999999999999")).contains("must be at most 10000"),
        "beyond u64"
    );
    let e = err(4_000_000_000, &ann("0", "10"));
    assert!(
        e.contains("spec.replicas 4000000000 is more than 10000, the most nodes a pool may have (twice the 5,000 nodes Kubernetes supports per cluster)"),
        "{e}"
    );
    let mut shared = ann("0", "10");
    shared.push((pool::GPU_REPLICAS, "1000000000"));
    assert!(
        err(0, &shared).contains(
            "must be at most 1024 (the device plugin config's limit of time-slicing replicas per GPU)"
        ),
        "{}",
        err(0, &shared)
    );
    // The limits themselves are accepted.
    let mut at_limit = ann("0", "10000");
    at_limit.push((pool::GPU_REPLICAS, "1024"));
    let p = pool::parse_pool(&md("p", 10_000, &at_limit)).unwrap();
    assert_eq!((p.max, p.replicas), (10_000, 10_000));
    let mut mig = ann("0", "10");
    mig.push((pool::MIG_DEVICES, "1g.10gb=4000000000"));
    let e = err(0, &mig);
    assert!(
        e.contains("\"1g.10gb=4000000000\": the count must be at most 64 per GPU"),
        "{e}"
    );
    // Not a number at all keeps its message.
    assert!(err(0, &ann("0", "ten")).contains("must be a whole number (0 or more)"));
}

// ---- restart and failover ----

mod restart;
