#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! From API objects to the decision: Machines' stages, nodes' pools and free capacity, pending
//! GPU pods, and a full decision on top.

use gpuops_autoscale::snapshot::{Objects, STARTUP_TAINT, build};
use gpuops_autoscale::status;
use gpuops_autoscale::{Config, Plan, Stage, State, decide, pool};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use serde_json::{Value, json};
use std::collections::HashMap;
use std::time::Duration;

fn md(name: &str, replicas: u32, extra: &[(&str, &str)]) -> Value {
    let mut a = json!({
        pool::MIN_SIZE: "0", pool::MAX_SIZE: "5", pool::CPU: "32", pool::MEMORY: "128Gi",
        pool::GPU_COUNT: "4", pool::PRICE: "10", pool::GPU_PRODUCT: "NVIDIA-H100-80GB-HBM3",
    });
    for (k, v) in extra {
        a[*k] = json!(v);
    }
    json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "MachineDeployment",
           "metadata": {"name": name, "namespace": "capi", "annotations": a, "resourceVersion": "7"},
           "spec": {"replicas": replicas}})
}

fn machine(name: &str, md: &str, node: Option<&str>, phase: &str) -> Value {
    let mut m = json!({"metadata": {"name": name, "namespace": "capi",
                       "labels": {"cluster.x-k8s.io/deployment-name": md},
                       "creationTimestamp": "2026-01-01T00:00:00Z"},
                       "status": {"phase": phase}});
    if let Some(n) = node {
        m["status"]["nodeRef"] = json!({"name": n});
    }
    m
}

fn node(name: &str, ready: bool, gpus: u32, startup_taint: bool) -> Node {
    let mut taints = vec![];
    if startup_taint {
        taints.push(json!({"key": STARTUP_TAINT, "effect": "NoSchedule"}));
    }
    serde_json::from_value(json!({
        "metadata": {"name": name, "creationTimestamp": "2026-01-01T00:01:00Z",
                     "labels": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu.count": gpus.to_string()},
                     "annotations": {"cluster.x-k8s.io/machine": format!("m-{name}"), "cluster.x-k8s.io/cluster-namespace": "capi"}},
        "spec": {"taints": taints},
        "status": {
            "allocatable": {"cpu": "32", "memory": "128Gi", "pods": "110", "nvidia.com/gpu": gpus.to_string()},
            "conditions": [{"type": "Ready", "status": if ready {"True"} else {"False"},
                            "lastTransitionTime": "2026-01-01T00:02:00Z"}]
        }
    }))
    .unwrap()
}

fn pod(name: &str, node: Option<&str>, gpus: u32, extra: Value) -> Pod {
    let mut p = json!({
        "metadata": {"name": name, "namespace": "ml", "creationTimestamp": "2026-01-01T00:00:00Z"},
        "spec": {"nodeName": node, "containers": [{"name": "c", "resources": {"requests": {"cpu": "1", "memory": "1Gi", "nvidia.com/gpu": gpus.to_string()}}}]},
        "status": {"phase": if node.is_some() {"Running"} else {"Pending"}}
    });
    if let Value::Object(e) = extra {
        for (k, v) in e {
            match k.as_str() {
                "annotations" | "labels" => p["metadata"][k] = v,
                _ => p["spec"][k] = v,
            }
        }
    }
    serde_json::from_value(p).unwrap()
}

const NOW: u64 = 1_767_225_600_000 + 600_000; // 2026-01-01T00:10:00Z

#[test]
fn stages_pools_and_pending_pods() {
    let mds = vec![
        md("gpu", 4, &[]),
        md("bad", 0, &[(pool::MIG_CONFIG, "nope")]),
    ];
    let machines = vec![
        machine("m-prov", "gpu", None, "Provisioning"),
        machine("m-reg", "gpu", Some("reg"), "Provisioned"),
        machine("m-dev", "gpu", Some("dev"), "Running"),
        machine("m-ready", "gpu", Some("ready"), "Running"),
    ];
    let nodes = vec![
        node("reg", false, 0, true),
        node("dev", true, 0, true),
        node("ready", true, 4, false),
        node("other", true, 2, false),
    ];
    let pods = vec![
        pod("running", Some("ready"), 3, json!({})),
        pod(
            "waiting",
            None,
            2,
            json!({"tolerations": [{"key": "x", "operator": "Exists"}], "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}}),
        ),
        pod("cpu-only", None, 0, json!({})),
    ];
    let pdbs: Vec<PodDisruptionBudget> = vec![];
    let util = HashMap::from([("ready".to_string(), 12.0)]);
    let (snap, errors) = build(
        &Objects {
            machine_deployments: &mds,
            machines: &machines,
            nodes: &nodes,
            pods: &pods,
            pdbs: &pdbs,
            gpu_util: &util,
        },
        NOW,
    );
    assert_eq!(errors.len(), 1);
    assert!(errors[0].to_string().contains("capi/bad"), "{}", errors[0]);
    assert_eq!(snap.skipped_pools, vec!["capi/bad".to_string()]);
    let stage = |m: &str| snap.machines.iter().find(|x| x.name == m).map(|x| x.stage);
    assert_eq!(stage("capi/m-prov"), Some(Stage::Provisioning));
    assert_eq!(stage("capi/m-reg"), Some(Stage::Registered));
    assert_eq!(stage("capi/m-dev"), Some(Stage::Devices));
    assert_eq!(stage("capi/m-ready"), None, "a ready node is not in flight");
    let ready = snap.nodes.iter().find(|n| n.name == "ready").unwrap();
    assert_eq!(ready.pool.as_deref(), Some("capi/gpu"));
    assert_eq!(ready.machine.as_deref(), Some("capi/m-ready"));
    assert_eq!(
        ready.gpu_free.iter().filter(|f| **f == 1000).count(),
        1,
        "3 of 4 GPUs used"
    );
    assert_eq!(ready.gpu_util, Some(12.0));
    assert!(ready.pods[0].gpu);
    let other = snap.nodes.iter().find(|n| n.name == "other").unwrap();
    assert_eq!(
        other.pool, None,
        "a node no pool manages still offers capacity"
    );
    assert_eq!(snap.pending.len(), 1);
    let w = &snap.pending[0];
    assert_eq!(
        (w.key.as_str(), w.gpu_count, w.gpu_resource.as_str()),
        ("ml/waiting", 2, "nvidia.com/gpu")
    );
    assert_eq!(w.tolerations[0].key, "x");
    assert_eq!(
        w.constraints.node_selector["nvidia.com/gpu.product"],
        "NVIDIA-H100-80GB-HBM3"
    );

    // The pod fits the 2 free GPUs of the unmanaged node: nothing is bought, and the in-flight
    // machines are counted (3 machines in flight, replicas 4 = 3 + the ready one).
    let c = Config {
        batch_idle: Duration::ZERO,
        batch_max: Duration::ZERO,
        ..Config::default()
    };
    let d = decide(&snap, &mut State::default(), NOW, &c);
    assert!(d.scale_ups.is_empty());
    assert_eq!(
        d.plans[0].plan,
        Plan::Existing {
            node: "other".into()
        }
    );
    assert_eq!(d.in_flight.iter().map(|f| f.count).sum::<u32>(), 3);

    let st = status::build(
        &snap,
        &errors.iter().map(ToString::to_string).collect::<Vec<_>>(),
        &d,
        NOW,
        "me",
        None,
    );
    let text = status::render_table(&st);
    assert!(text.contains("capi/gpu"), "{text}");
    assert!(text.contains("devices"), "{text}");
    assert!(text.contains("ml/waiting"), "{text}");
    assert!(
        text.contains("skipped: MachineDeployment capi/bad"),
        "{text}"
    );
    let back: status::Status = serde_json::from_str(&serde_json::to_string(&st).unwrap()).unwrap();
    assert_eq!(back, st);
}

#[test]
fn do_not_disrupt_and_pdbs_reach_the_decision() {
    let mds = vec![md("gpu", 1, &[])];
    let machines = vec![machine("m-idle", "gpu", Some("idle"), "Running")];
    let nodes = vec![node("idle", true, 4, false)];
    let pods = vec![pod(
        "web",
        Some("idle"),
        0,
        json!({"annotations": {"karpenter.sh/do-not-disrupt": "true"}, "labels": {"app": "web"}}),
    )];
    let pdbs: Vec<PodDisruptionBudget> = vec![serde_json::from_value(json!({
        "metadata": {"name": "web", "namespace": "ml"},
        "spec": {"selector": {"matchLabels": {"app": "web"}}},
        "status": {"disruptionsAllowed": 0, "currentHealthy": 1, "desiredHealthy": 1, "expectedPods": 1}
    })).unwrap()];
    let util = HashMap::new();
    let (snap, _) = build(
        &Objects {
            machine_deployments: &mds,
            machines: &machines,
            nodes: &nodes,
            pods: &pods,
            pdbs: &pdbs,
            gpu_util: &util,
        },
        NOW,
    );
    assert!(snap.nodes[0].pods[0].do_not_disrupt);
    assert_eq!(snap.pdbs[0].disruptions_allowed, 0);
    assert_eq!(snap.pdbs[0].match_labels["app"], "web");
    let c = Config {
        scale_down_idle: Duration::ZERO,
        ..Config::default()
    };
    let d = decide(&snap, &mut State::default(), NOW, &c);
    assert!(d.removals.is_empty());
    assert!(
        d.events
            .iter()
            .any(|e| e.message.contains("do-not-disrupt"))
    );
}

/// A MIG pool's node relabelled at boot with a generated config is ready once it advertises
/// MIG devices, not the template's (it may never offer those).
#[test]
fn a_mig_node_bought_with_a_generated_config_is_ready_on_its_own_devices() {
    let mds = vec![md(
        "mig",
        2,
        &[(pool::GPU_COUNT, "1"), (pool::MIG_CONFIG, "all-1g.10gb")],
    )];
    let machines = vec![
        machine("m-gen", "mig", Some("gen"), "Running"),
        machine("m-tpl", "mig", Some("tpl"), "Running"),
    ];
    let mig_node = |name: &str, config: &str, devices: &[(&str, &str)]| -> Node {
        let mut n = node(name, true, 0, false);
        n.metadata
            .labels
            .get_or_insert_with(Default::default)
            .insert("nvidia.com/mig.config".into(), config.into());
        let a = n
            .status
            .as_mut()
            .unwrap()
            .allocatable
            .get_or_insert_with(Default::default);
        for (k, v) in devices {
            a.insert(
                format!("nvidia.com/mig-{k}"),
                k8s_openapi::apimachinery::pkg::api::resource::Quantity((*v).to_string()),
            );
        }
        n
    };
    let nodes = vec![
        mig_node("gen", "gpuops-1234abcd", &[("3g.40gb", "2")]),
        // Still on the template's config and without its devices: not ready.
        mig_node("tpl", "all-1g.10gb", &[("3g.40gb", "2")]),
    ];
    let (snap, errors) = build(
        &Objects {
            machine_deployments: &mds,
            machines: &machines,
            nodes: &nodes,
            pods: &Vec::<Pod>::new(),
            pdbs: &Vec::<PodDisruptionBudget>::new(),
            gpu_util: &HashMap::new(),
        },
        NOW,
    );
    assert!(errors.is_empty(), "{errors:?}");
    assert!(snap.nodes.iter().any(|n| n.name == "gen"), "{snap:?}");
    let stage = |m: &str| snap.machines.iter().find(|x| x.name == m).map(|x| x.stage);
    assert_eq!(stage("capi/m-gen"), None);
    assert_eq!(stage("capi/m-tpl"), Some(Stage::Devices));
}

/// Cluster API sets a Machine's nodeRef only at its next reconcile after the Node registers;
/// until then the Node is still the Machine's by `spec.providerID` (the match Cluster API makes
/// itself), so a registered node is in flight for its pool at once and never a pool-less node.
#[test]
fn a_node_is_its_machines_by_provider_id_before_the_node_ref_is_set() {
    let mds = vec![md("gpu", 2, &[])];
    let mut m_reg = machine("m-a", "gpu", None, "Provisioned");
    m_reg["spec"]["providerID"] = json!("test://capi/m-a");
    let mut m_ready = machine("m-b", "gpu", None, "Provisioned");
    m_ready["spec"]["providerID"] = json!("test://capi/m-b");
    let with_id = |name: &str, ready: bool, gpus: u32, id: &str| {
        let mut n = node(name, ready, gpus, false);
        n.metadata.annotations = None;
        n.spec.get_or_insert_default().provider_id = Some(id.to_string());
        n
    };
    let nodes = vec![
        with_id("a", false, 0, "test://capi/m-a"),
        with_id("b", true, 4, "test://capi/m-b"),
        // Another Machine's id: no Machine has it, so no pool.
        with_id("c", true, 4, "test://capi/elsewhere"),
    ];
    let pdbs: Vec<PodDisruptionBudget> = vec![];
    let pods: Vec<Pod> = vec![];
    let (snap, errors) = build(
        &Objects {
            machine_deployments: &mds,
            machines: &[m_reg, m_ready],
            nodes: &nodes,
            pods: &pods,
            pdbs: &pdbs,
            gpu_util: &HashMap::new(),
        },
        NOW,
    );
    assert!(errors.is_empty(), "{errors:?}");
    let a = snap.machines.iter().find(|m| m.name == "capi/m-a").unwrap();
    assert_eq!(a.node.as_deref(), Some("a"));
    assert_eq!(a.stage, Stage::Registered);
    let pool_of = |n: &str| {
        snap.nodes
            .iter()
            .find(|x| x.name == n)
            .map(|x| x.pool.clone())
    };
    assert_eq!(pool_of("b"), Some(Some("capi/gpu".to_string())));
    assert_eq!(pool_of("c"), Some(None));
}

/// `meta_time` reads the timestamp directly; it must give what parsing the API server's text
/// gives (whole seconds, truncated; nothing before the epoch), as it did when it went through
/// that text.
#[test]
fn meta_time_is_the_start_of_the_second_the_text_names() {
    use gpuops_autoscale::snapshot::meta_time;
    use gpuops_autoscale::time::parse_rfc3339;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use k8s_openapi::jiff::Timestamp;
    let via_text = |t: &Time| {
        let v = serde_json::to_value(t).unwrap();
        parse_rfc3339(v.as_str().unwrap())
    };
    for (secs, nanos) in [
        (1_767_225_600, 0),
        (1_767_225_600, 999_999_999),
        (1_767_225_601, 1_000_000),
        (0, 0),
        (0, 500_000_000),
        (-1, 0),
        (0, -500_000_000),
        (-1, -500_000_000),
        (-86_400 * 365, 0),
        (253_402_000_000, 999_000_000),
    ] {
        let t = Time(Timestamp::new(secs, nanos).unwrap());
        assert_eq!(meta_time(Some(&t)), via_text(&t), "{t:?}");
    }
    assert_eq!(
        meta_time(Some(&Time(
            Timestamp::new(1_767_225_600, 999_999_999).unwrap()
        ))),
        Some(1_767_225_600_000)
    );
    assert_eq!(meta_time(None), None);
}
