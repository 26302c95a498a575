//! The test bed proves itself: the real scheduler, harness nodes with the kubelet's device manager,
//! KWOK at scale, RBAC identities, and cleanup.
//!
//! These need the control-plane binaries, so they are ignored by a plain `cargo test`; scripts/test
//! builds the binaries and runs them with `--ignored` (or: `eval $(tests/k8s/build.sh)` and
//! `cargo test -p gpuops-testbed -- --ignored`).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use gpuops_testbed::{Cluster, ClusterOptions, HarnessNode, User, wait_until};
use std::time::Duration;

fn pod(name: &str, gpus: u32) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  namespace: default\nspec:\n  containers:\n  - name: cuda\n    image: example.invalid/cuda:12\n    resources:\n      limits:\n        nvidia.com/gpu: \"{gpus}\"\n"
    )
}

fn allocatable_gpus(cluster: &Cluster, node: &str) -> Option<String> {
    cluster
        .kubectl(&[
            "get",
            "node",
            node,
            "-o",
            "jsonpath={.status.allocatable.nvidia\\.com/gpu}",
        ])
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
}

#[test]
#[ignore = "needs the control plane (GPUOPS_K8S_BIN): run scripts/test"]
fn the_scheduler_binds_a_gpu_pod_to_a_harness_node_and_the_device_manager_allocates() {
    let cluster = Cluster::start(ClusterOptions::default()).unwrap();
    let node = HarnessNode::start(&cluster, "gpu-node-1").unwrap();
    let _plugin = node.plugin("nvidia.com/gpu", 2).unwrap();
    wait_until("2 GPUs allocatable", Duration::from_secs(60), || {
        allocatable_gpus(&cluster, "gpu-node-1").as_deref() == Some("2")
    })
    .unwrap();

    cluster.apply(&pod("one-gpu", 1)).unwrap();
    wait_until("the pod to run", Duration::from_secs(60), || {
        cluster
            .kubectl(&["get", "pod", "one-gpu", "-o", "jsonpath={.status.phase}"])
            .is_ok_and(|s| s == "Running")
    })
    .unwrap();
    let bound = cluster
        .kubectl(&["get", "pod", "one-gpu", "-o", "jsonpath={.spec.nodeName}"])
        .unwrap();
    assert_eq!(bound, "gpu-node-1", "the real scheduler bound it");
    let alloc = node
        .allocation("default", "one-gpu")
        .expect("allocation recorded");
    let devices = alloc.devices("nvidia.com/gpu");
    assert_eq!(devices.len(), 1, "{:?}", alloc.0);
    assert_eq!(
        alloc.env("NVIDIA_VISIBLE_DEVICES").as_deref(),
        Some(devices[0].as_str())
    );
}

#[test]
#[ignore = "needs the control plane (GPUOPS_K8S_BIN): run scripts/test"]
fn a_pod_asking_for_more_gpus_than_exist_gets_the_schedulers_failed_scheduling_event() {
    let cluster = Cluster::start(ClusterOptions::default()).unwrap();
    let node = HarnessNode::start(&cluster, "gpu-node-1").unwrap();
    let _plugin = node.plugin("nvidia.com/gpu", 2).unwrap();
    wait_until("2 GPUs allocatable", Duration::from_secs(60), || {
        allocatable_gpus(&cluster, "gpu-node-1").as_deref() == Some("2")
    })
    .unwrap();
    cluster.apply(&pod("too-big", 3)).unwrap();
    let mut message = String::new();
    wait_until("FailedScheduling", Duration::from_secs(60), || {
        message = cluster
            .kubectl(&[
                "get",
                "events",
                "--field-selector",
                "involvedObject.name=too-big,reason=FailedScheduling",
                "-o",
                "jsonpath={.items[*].message}",
            ])
            .unwrap_or_default();
        !message.is_empty()
    })
    .unwrap();
    assert!(message.contains("Insufficient nvidia.com/gpu"), "{message}");
    assert!(message.contains("0/1 nodes are available"), "{message}");
}

#[test]
#[ignore = "needs the control plane (GPUOPS_K8S_BIN): run scripts/test"]
fn a_harness_restart_deletes_plugin_sockets_and_the_plugin_registers_again() {
    let cluster = Cluster::start(ClusterOptions::default()).unwrap();
    let mut node = HarnessNode::start(&cluster, "gpu-node-1").unwrap();
    let mut plugin = node.plugin("nvidia.com/gpu", 2).unwrap();
    wait_until("2 GPUs allocatable", Duration::from_secs(60), || {
        allocatable_gpus(&cluster, "gpu-node-1").as_deref() == Some("2")
    })
    .unwrap();
    let sockets_before: Vec<_> = std::fs::read_dir(node.plugin_dir())
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert!(
        sockets_before.len() >= 2,
        "kubelet.sock and the plugin's socket: {sockets_before:?}"
    );
    node.restart(&cluster, true).unwrap();
    // Capacity comes back only through a fresh registration of the (still running) plugin.
    wait_until(
        "the plugin to register again",
        Duration::from_secs(60),
        || {
            allocatable_gpus(&cluster, "gpu-node-1").as_deref() == Some("2")
                && std::fs::read_dir(node.plugin_dir())
                    .map(|d| d.count())
                    .unwrap_or(0)
                    >= 2
        },
    )
    .unwrap();
    plugin.check_alive().unwrap();
    // Two harness nodes at once.
    let second = HarnessNode::start(&cluster, "gpu-node-2").unwrap();
    let _p2 = second.plugin("nvidia.com/gpu", 4).unwrap();
    wait_until("node 2's GPUs", Duration::from_secs(60), || {
        allocatable_gpus(&cluster, "gpu-node-2").as_deref() == Some("4")
    })
    .unwrap();
}

#[test]
#[ignore = "needs the control plane (GPUOPS_K8S_BIN): run scripts/test"]
fn two_hundred_kwok_nodes_with_eight_gpus_come_up_ready() {
    let cluster = Cluster::start(ClusterOptions {
        kwok: true,
        ..ClusterOptions::default()
    })
    .unwrap();
    let nodes: String = (0..200)
        .map(|i| {
            format!(
                "---\napiVersion: v1\nkind: Node\nmetadata:\n  name: kwok-gpu-{i}\n  annotations:\n    kwok.x-k8s.io/node: fake\n  labels:\n    type: kwok\n    nvidia.com/gpu.product: NVIDIA-H100-80GB-HBM3\nstatus:\n  capacity: {{cpu: \"64\", memory: 512Gi, pods: \"110\", nvidia.com/gpu: \"8\"}}\n  allocatable: {{cpu: \"64\", memory: 512Gi, pods: \"110\", nvidia.com/gpu: \"8\"}}\n"
            )
        })
        .collect();
    cluster.apply(&nodes).unwrap();
    wait_until("200 Ready nodes", Duration::from_secs(180), || {
        cluster
            .kubectl(&[
                "get",
                "nodes",
                "-l",
                "type=kwok",
                "-o",
                "jsonpath={.items[*].status.conditions[?(@.type==\"Ready\")].status}",
            ])
            .is_ok_and(|s| s.split_whitespace().filter(|v| *v == "True").count() == 200)
    })
    .unwrap();
    let total: u64 = cluster.get_json(&["nodes", "-l", "type=kwok"]).unwrap()["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| {
            n["status"]["allocatable"]["nvidia.com/gpu"]
                .as_str()
                .unwrap()
                .parse::<u64>()
                .unwrap()
        })
        .sum();
    assert_eq!(total, 1600);
}

#[test]
#[ignore = "needs the control plane (GPUOPS_K8S_BIN): run scripts/test"]
fn identities_without_roles_are_forbidden_until_rbac_grants_them() {
    let cluster = Cluster::start(ClusterOptions {
        scheduler: false,
        users: vec![User::plain("viewer")],
        ..ClusterOptions::default()
    })
    .unwrap();
    let err = cluster
        .kubectl_as("viewer", &["get", "nodes"])
        .unwrap_err()
        .to_string();
    assert!(err.contains("forbidden") && err.contains("viewer"), "{err}");
    cluster
        .apply(
            "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata:\n  name: node-reader\nrules:\n- apiGroups: [\"\"]\n  resources: [nodes]\n  verbs: [get, list]\n---\napiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding\nmetadata:\n  name: viewer-reads-nodes\nroleRef:\n  apiGroup: rbac.authorization.k8s.io\n  kind: ClusterRole\n  name: node-reader\nsubjects:\n- apiGroup: rbac.authorization.k8s.io\n  kind: User\n  name: viewer\n",
        )
        .unwrap();
    wait_until("RBAC to allow the viewer", Duration::from_secs(20), || {
        cluster.kubectl_as("viewer", &["get", "nodes"]).is_ok()
    })
    .unwrap();
    let err = cluster
        .kubectl_as("viewer", &["delete", "node", "x"])
        .unwrap_err()
        .to_string();
    assert!(err.contains("forbidden"), "still least privilege: {err}");
}

#[test]
#[ignore = "needs the control plane (GPUOPS_K8S_BIN): run scripts/test"]
fn dropping_the_cluster_stops_every_process_and_removes_its_directory() {
    let cluster = Cluster::start(ClusterOptions::default()).unwrap();
    let node = HarnessNode::start(&cluster, "gpu-node-1").unwrap();
    let plugin = node.plugin("nvidia.com/gpu", 1).unwrap();
    let mut pids = cluster.pids();
    pids.extend(node.pid());
    pids.extend(plugin.pid());
    let dir = cluster.dir().to_path_buf();
    assert!(pids.len() >= 5);
    drop(plugin);
    drop(node);
    drop(cluster);
    for pid in pids {
        assert!(
            !std::path::Path::new(&format!("/proc/{pid}")).exists(),
            "process {pid} still running"
        );
    }
    assert!(!dir.exists());
}
