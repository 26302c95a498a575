//! Pod attribution on the test bed: pods the real scheduler placed and the kubelet's real device
//! manager allocated show up as `pod`/`namespace`/`container` labels on the agent's metrics, for a
//! whole GPU, a MIG instance and a time-slicing replica.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

mod common;

use gpuops_testbed::{ChildGuard, Cluster, ClusterOptions, HarnessNode, wait_until};
use std::io::{Read, Write};
use std::path::Path;
use std::time::Duration;

/// The agent on a harness node; stopped on drop.
struct Agent(ChildGuard);

impl Agent {
    fn start(node: &HarnessNode, gpus: &[&str], log: &Path, extra: &[&str]) -> Agent {
        let mut cmd = common::gpuops();
        cmd.arg("agent")
            .args(gpus)
            .args(["--interval", "1s", "--node-name", &node.name])
            .args(extra)
            .arg("--device-plugin-dir")
            .arg(node.plugin_dir())
            .arg("--pod-resources-socket")
            .arg(node.pod_resources_socket());
        Agent(ChildGuard::spawn("agent", cmd, log).unwrap())
    }

    fn log(&self) -> String {
        self.0.output()
    }

    fn address(&self) -> String {
        let mut address = None;
        wait_until("the metrics address", Duration::from_secs(30), || {
            address = self
                .log()
                .lines()
                .find_map(|l| l.split("metrics        http://").nth(1))
                .and_then(|s| s.split('/').next())
                .map(String::from);
            address.is_some()
        })
        .unwrap_or_else(|e| panic!("{e}\n{}", self.log()));
        address.unwrap()
    }

    fn metrics(&self) -> String {
        let address = self.address();
        let mut stream = std::net::TcpStream::connect(&address).unwrap();
        write!(stream, "GET /metrics HTTP/1.0\r\nHost: {address}\r\n\r\n").unwrap();
        let mut raw = String::new();
        stream.read_to_string(&mut raw).unwrap();
        raw.split_once("\r\n\r\n").unwrap().1.to_string()
    }
}

fn pod(name: &str, node: &str, resource: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  namespace: default\nspec:\n  affinity:\n    nodeAffinity:\n      requiredDuringSchedulingIgnoredDuringExecution:\n        nodeSelectorTerms:\n        - matchFields:\n          - key: metadata.name\n            operator: In\n            values: [{node}]\n  containers:\n  - name: worker\n    image: example.invalid/app:1\n    resources:\n      limits:\n        {resource}: \"1\"\n"
    )
}

/// The sample lines of `metric` that carry `pod="<pod>"`.
fn pod_series(body: &str, metric: &str, pod: &str) -> Vec<String> {
    body.lines()
        .filter(|l| l.starts_with(&format!("{metric}{{")) && l.contains(&format!("pod=\"{pod}\"")))
        .map(String::from)
        .collect()
}

#[test]
#[ignore = "needs the control plane (GPUOPS_K8S_BIN): run scripts/test"]
// Long on purpose: one scenario, its steps in order on one shared setup (a control plane, a node or a fleet costs seconds to start), so the cases read as the story they test.
fn pods_holding_a_gpu_a_mig_instance_and_a_replica_get_pod_labels_on_metrics() {
    let cluster = Cluster::start(ClusterOptions::default()).unwrap();
    let whole = HarnessNode::start(&cluster, "whole-node").unwrap();
    let whole_agent = Agent::start(
        &whole,
        &["--simulate", "l4x4"],
        &cluster.dir().join("agent-whole.log"),
        &[],
    );

    // Two GPUs partitioned 7x 1g.10gb, six whole GPUs time-sliced in two; strategy mixed.
    let mixed = HarnessNode::start(&cluster, "mixed-node").unwrap();
    let state = cluster.dir().join("mixed-sim");
    let o = common::run(&[
        "sim",
        "init",
        "--fleet",
        "dgx-h100",
        "--state",
        state.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", common::text(&o));
    let mig_config = cluster.dir().join("mig.yaml");
    std::fs::write(
        &mig_config,
        "version: v1\nmig-configs:\n  two:\n  - devices: [0, 1]\n    mig-enabled: true\n    mig-devices:\n      1g.10gb: 7\n  - devices: [2, 3, 4, 5, 6, 7]\n    mig-enabled: false\n",
    )
    .unwrap();
    let o = common::run(&[
        "mig",
        "apply",
        "-f",
        mig_config.to_str().unwrap(),
        "-c",
        "two",
        "--sim-state",
        state.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", common::text(&o));
    let plugin_config = cluster.dir().join("plugin.yaml");
    std::fs::write(
        &plugin_config,
        "version: v1\nflags:\n  migStrategy: mixed\nsharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 2\n",
    )
    .unwrap();
    let mixed_agent = Agent::start(
        &mixed,
        &["--sim-state", state.to_str().unwrap()],
        &cluster.dir().join("agent-mixed.log"),
        &["--config-file", plugin_config.to_str().unwrap()],
    );

    for (name, node, resource) in [
        ("whole-pod", "whole-node", "nvidia.com/gpu"),
        ("mig-pod", "mixed-node", "nvidia.com/mig-1g.10gb"),
        ("replica-pod", "mixed-node", "nvidia.com/gpu"),
    ] {
        cluster.apply(&pod(name, node, resource)).unwrap();
    }
    for name in ["whole-pod", "mig-pod", "replica-pod"] {
        wait_until(&format!("{name} running"), Duration::from_secs(90), || {
            cluster
                .kubectl(&["get", "pod", name, "-o", "jsonpath={.status.phase}"])
                .is_ok_and(|s| s == "Running")
        })
        .unwrap_or_else(|e| panic!("{e}\n{}\n{}", whole_agent.log(), mixed_agent.log()));
    }

    let whole_uuid = whole
        .allocation("default", "whole-pod")
        .unwrap()
        .devices("nvidia.com/gpu")[0]
        .clone();
    let mig_uuid = mixed
        .allocation("default", "mig-pod")
        .unwrap()
        .devices("nvidia.com/mig-1g.10gb")[0]
        .clone();
    let replica_id = mixed
        .allocation("default", "replica-pod")
        .unwrap()
        .devices("nvidia.com/gpu")[0]
        .clone();
    assert!(replica_id.contains("::"), "{replica_id}");
    let replica_uuid = replica_id.split("::").next().unwrap().to_string();

    // The MIG UUID's parent GPU and GPU-instance id, from the node's own inventory.
    let o = common::run(&[
        "inventory",
        "--sim-state",
        state.to_str().unwrap(),
        "-o",
        "json",
    ]);
    let inv: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let (parent, gi) = inv["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .find_map(|g| {
            g["mig_devices"]
                .as_array()
                .unwrap()
                .iter()
                .find(|m| m["uuid"] == mig_uuid.as_str())
                .map(|m| {
                    (
                        g["uuid"].as_str().unwrap().to_string(),
                        m["gi_id"].as_u64().unwrap(),
                    )
                })
        })
        .unwrap();

    let mut body = String::new();
    wait_until("pod labels on both nodes", Duration::from_secs(30), || {
        body = format!("{}{}", whole_agent.metrics(), mixed_agent.metrics());
        ["whole-pod", "mig-pod", "replica-pod"]
            .iter()
            .all(|p| !pod_series(&body, "gpuops_device_allocated", p).is_empty())
    })
    .unwrap_or_else(|e| panic!("{e}\n{body}\n{}\n{}", whole_agent.log(), mixed_agent.log()));

    let whole_temp = pod_series(&body, "DCGM_FI_DEV_GPU_TEMP", "whole-pod");
    assert_eq!(whole_temp.len(), 1, "{whole_temp:?}");
    assert!(
        whole_temp[0].contains(&format!("UUID=\"{whole_uuid}\""))
            && whole_temp[0]
                .contains(",container=\"worker\",namespace=\"default\",pod=\"whole-pod\"}"),
        "{}",
        whole_temp[0]
    );
    let mig_fb = pod_series(&body, "DCGM_FI_DEV_FB_USED", "mig-pod");
    assert_eq!(mig_fb.len(), 1, "{mig_fb:?}");
    assert!(
        mig_fb[0].contains(&format!("UUID=\"{parent}\""))
            && mig_fb[0].contains(&format!("GPU_I_PROFILE=\"1g.10gb\",GPU_I_ID=\"{gi}\"")),
        "the MIG UUID resolves to its parent GPU and GPU instance: {}",
        mig_fb[0]
    );
    let replica_util = pod_series(&body, "DCGM_FI_DEV_GPU_UTIL", "replica-pod");
    assert!(
        replica_util.len() == 1 && replica_util[0].contains(&format!("UUID=\"{replica_uuid}\"")),
        "the ::n replica suffix is stripped: {replica_util:?}"
    );
    // Devices nobody holds carry no pod labels.
    let allocated_ones = body
        .lines()
        .filter(|l| l.starts_with("gpuops_device_allocated{") && l.ends_with(" 1"))
        .count();
    assert_eq!(allocated_ones, 3, "{body}");
}
