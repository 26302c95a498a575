//! Cluster API in the test bed: the real core controllers scale a MachineDeployment of gpuops's
//! test provider, whose machines become KWOK nodes that are Ready before their GPUs appear.
//!
//! Needs the control plane (GPUOPS_K8S_BIN) and `eval $(tests/k8s/build.sh capi)`
//! (GPUOPS_CAPI_BIN); scripts/test sets both and runs these with `--ignored`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use gpuops_testbed::{
    CapiOptions, Cluster, ClusterOptions, NodeShape, PoolSpec, STARTUP_TAINT, wait_until,
};
use serde_json::Value;
use std::time::{Duration, Instant};

const T: Duration = Duration::from_secs(180);

/// What to look at when a wait fails: the objects and the logs' tails.
fn dump(cluster: &Cluster, capi: &gpuops_testbed::ClusterApi) -> String {
    let mut out = String::new();
    for what in [
        "machinedeployments.cluster.x-k8s.io",
        "machinesets.cluster.x-k8s.io",
        "machines.cluster.x-k8s.io",
        "gpuopstestmachines",
        "clusters.cluster.x-k8s.io",
    ] {
        out += &cluster
            .kubectl(&["get", what, "-A", "-o", "yaml"])
            .unwrap_or_else(|e| e.to_string());
    }
    out += &cluster
        .kubectl(&["get", "nodes", "-o", "wide"])
        .unwrap_or_else(|e| e.to_string());
    for log in ["capi-manager.log", "provider.log"] {
        let text = std::fs::read_to_string(capi.dir().join(log)).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        out += &format!(
            "--- {log} (last 60 lines)\n{}\n",
            lines[lines.len().saturating_sub(60)..].join("\n")
        );
    }
    out
}

fn node(cluster: &Cluster, name: &str) -> Option<Value> {
    cluster.get_json(&["node", name]).ok()
}

fn ready(node: &Value) -> bool {
    node["status"]["conditions"].as_array().is_some_and(|cs| {
        cs.iter()
            .any(|c| c["type"] == "Ready" && c["status"] == "True")
    })
}

fn gpus(node: &Value) -> Option<&str> {
    node["status"]["allocatable"]["nvidia.com/gpu"].as_str()
}

fn has_startup_taint(node: &Value) -> bool {
    node["spec"]["taints"]
        .as_array()
        .is_some_and(|ts| ts.iter().any(|t| t["key"] == STARTUP_TAINT))
}

#[test]
#[ignore = "needs the control plane and Cluster API (GPUOPS_K8S_BIN, GPUOPS_CAPI_BIN): run scripts/test"]
// Long on purpose: one scenario, its steps in order on one shared setup (a control plane, a node or a fleet costs seconds to start), so the cases read as the story they test.
fn a_machine_deployment_scaled_from_zero_gets_nodes_that_are_ready_before_their_gpus_and_a_chosen_machine_goes_first()
 {
    let cluster = Cluster::start(ClusterOptions {
        kwok: true,
        // Its node lifecycle controller lifts node.kubernetes.io/not-ready once KWOK makes a
        // node Ready (the apiserver taints every new node with it).
        controller_manager: true,
        ..ClusterOptions::default()
    })
    .unwrap();
    let capi = cluster.start_cluster_api(CapiOptions::default()).unwrap();
    let mut shape = NodeShape::gpu("NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu", 8);
    shape.boot_delay = Duration::from_secs(2);
    shape.devices_delay = Duration::from_secs(6);
    let mut pool = PoolSpec::new("h100", shape);
    pool.annotations
        .insert("gpuops.io/test-price".into(), "98.32".into());
    capi.add_pool(&pool).unwrap();

    // A pool whose template is malformed: its machine is rejected with the field named, and the
    // good pool keeps working.
    cluster
        .apply(
            "apiVersion: infrastructure.cluster.x-k8s.io/v1alpha1\nkind: GpuopsTestMachineTemplate\n\
             metadata: {name: broken, namespace: default}\n\
             spec: {template: {spec: {bootDelayMs: \"2s\"}}}\n",
        )
        .unwrap();
    // add_pool would write a good template; the MachineDeployment alone, pointing at it:
    let md = capi.machine_deployment("h100").unwrap();
    assert_eq!(md["spec"]["replicas"], 0);
    assert_eq!(
        md["metadata"]["annotations"]["capacity.cluster-autoscaler.kubernetes.io/gpu-count"],
        "8"
    );
    let mut broken_md = md.clone();
    broken_md["metadata"] = serde_json::json!({"name": "broken", "namespace": "default"});
    broken_md["spec"]["replicas"] = 1.into();
    for path in ["selector", "template"] {
        let labels = if path == "selector" {
            &mut broken_md["spec"]["selector"]["matchLabels"]
        } else {
            &mut broken_md["spec"]["template"]["metadata"]["labels"]
        };
        labels["cluster.x-k8s.io/deployment-name"] = "broken".into();
    }
    broken_md["spec"]["template"]["spec"]["infrastructureRef"]["name"] = "broken".into();
    broken_md.as_object_mut().unwrap().remove("status");
    cluster.apply(&broken_md.to_string()).unwrap();

    // Scale from zero through the scale subresource, as an autoscaler does.
    let t0 = Instant::now();
    capi.scale("h100", 2).unwrap();
    let mut seen_ready_without_gpus = Vec::new();
    let mut machines = Vec::new();
    wait_until("2 Machines with a nodeRef", T, || {
        machines = capi.machines("h100").unwrap_or_default();
        for m in &machines {
            if let Some(n) = m.node.as_deref().and_then(|n| node(&cluster, n))
                && ready(&n)
                && gpus(&n).is_none()
                && has_startup_taint(&n)
                && !seen_ready_without_gpus.contains(&m.name)
            {
                seen_ready_without_gpus.push(m.name.clone());
            }
        }
        machines.len() == 2 && machines.iter().all(|m| m.node.is_some())
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", dump(&cluster, &capi)));
    let to_nodes = t0.elapsed();
    for m in &machines {
        let id = m.provider_id.as_deref().unwrap();
        assert_eq!(id, format!("gpuops-test://default/{}", m.name));
        let n = node(&cluster, m.node.as_deref().unwrap()).unwrap();
        assert_eq!(n["spec"]["providerID"], id, "nodeRef found by providerID");
        assert_eq!(
            n["metadata"]["annotations"]["cluster.x-k8s.io/machine"], m.name,
            "CAPI annotated the Node with its Machine"
        );
    }

    // The GPUs come later, and with them the startup taint goes.
    wait_until(
        "8 GPUs allocatable and no startup taint on both nodes",
        T,
        || {
            let mut done = true;
            for m in &machines {
                let Some(n) = m.node.as_deref().and_then(|n| node(&cluster, n)) else {
                    done = false;
                    continue;
                };
                if ready(&n)
                    && gpus(&n).is_none()
                    && has_startup_taint(&n)
                    && !seen_ready_without_gpus.contains(&m.name)
                {
                    seen_ready_without_gpus.push(m.name.clone());
                }
                done &= gpus(&n) == Some("8") && !has_startup_taint(&n);
            }
            done
        },
    )
    .unwrap();
    let to_gpus = t0.elapsed();
    let usable = capi.wait_usable_nodes("h100", 2, T).unwrap();
    assert_eq!(usable.len(), 2, "{usable:?}");
    assert_eq!(
        seen_ready_without_gpus.len(),
        2,
        "each node was Ready with its startup taint and no GPUs first"
    );
    assert!(to_gpus >= to_nodes);
    eprintln!("scale 0->2: nodeRefs after {to_nodes:?}, GPUs after {to_gpus:?}");
    wait_until(
        "the MachineDeployment to report 2 ready replicas",
        T,
        || {
            capi.machine_deployment("h100")
                .is_ok_and(|md| md["status"]["readyReplicas"] == 2)
        },
    )
    .unwrap();

    // The scheduler places a 4-GPU pod on one of them.
    cluster
        .apply(
            "apiVersion: v1\nkind: Pod\nmetadata: {name: four, namespace: default}\nspec:\n  containers:\n  - name: c\n    image: example.invalid/cuda\n    resources: {limits: {nvidia.com/gpu: \"4\"}}\n",
        )
        .unwrap();
    wait_until("the 4-GPU pod to be bound", T, || {
        cluster
            .kubectl(&["get", "pod", "four", "-o", "jsonpath={.spec.nodeName}"])
            .is_ok_and(|n| {
                machines
                    .iter()
                    .any(|m| m.node.as_deref() == Some(n.as_str()))
            })
    })
    .unwrap_or_else(|e| {
        let pod = cluster
            .kubectl(&["describe", "pod", "four"])
            .unwrap_or_default();
        let nodes = cluster
            .kubectl(&["get", "nodes", "-o", "yaml"])
            .unwrap_or_default();
        panic!("{e}\n{pod}\n{nodes}")
    });

    // The bad pool's machine was rejected with the field named, and no node made for it.
    wait_until("the broken pool's machine to be rejected", T, || {
        cluster
            .get_json(&[
                "gpuopstestmachines",
                "-n",
                "default",
                "-l",
                "cluster.x-k8s.io/deployment-name=broken",
            ])
            .is_ok_and(|l| {
                l["items"].as_array().is_some_and(|items| {
                    items.len() == 1
                        && items[0]["status"]["gpuopsError"]
                            .as_str()
                            .is_some_and(|e| e.starts_with("spec.bootDelayMs: want a whole number"))
                })
            })
    })
    .unwrap();
    assert!(
        capi.machines("broken")
            .unwrap()
            .iter()
            .all(|m| m.node.is_none())
    );

    // Remove a chosen node: annotate its Machine, then replicas - 1.
    let (keep, drop) = (&machines[0], &machines[1]);
    capi.mark_for_deletion(&drop.name).unwrap();
    capi.scale("h100", 1).unwrap();
    wait_until("the chosen Machine and its Node to go", T, || {
        let left = capi.machines("h100").unwrap_or_default();
        left.len() == 1
            && left[0].name == keep.name
            && node(&cluster, drop.node.as_deref().unwrap()).is_none()
    })
    .unwrap();
    assert!(
        node(&cluster, keep.node.as_deref().unwrap()).is_some(),
        "the other node stays"
    );
}
