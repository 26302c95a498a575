//! The agent's device plugin against the kubelet's real device manager (harness node) and the real
//! scheduler: registration, capacity, Allocate, and re-registration after a kubelet restart.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

mod common;

use gpuops_testbed::{ChildGuard, Cluster, ClusterOptions, HarnessNode, wait_until};
use std::time::Duration;

/// The agent on a simulated node, serving the harness node's plugin directory; stopped on drop.
struct Agent {
    _process: ChildGuard,
}

impl Agent {
    fn start(node: &HarnessNode, fleet: &str, log: &std::path::Path) -> Agent {
        Agent::start_with(node, fleet, log, &[])
    }

    fn start_with(node: &HarnessNode, fleet: &str, log: &std::path::Path, extra: &[&str]) -> Agent {
        let mut cmd = common::gpuops();
        cmd.args([
            "agent",
            "--simulate",
            fleet,
            "--interval",
            "1s",
            "--node-name",
            &node.name,
        ])
        .args(extra)
        .arg("--device-plugin-dir")
        .arg(node.plugin_dir());
        Agent::spawn(cmd, log)
    }

    fn spawn(cmd: std::process::Command, log: &std::path::Path) -> Agent {
        Agent {
            _process: ChildGuard::spawn("agent", cmd, log).unwrap(),
        }
    }
}

fn allocatable(cluster: &Cluster, node: &str, resource: &str) -> Option<String> {
    let path = format!(
        "jsonpath={{.status.allocatable.{}}}",
        resource.replace('.', "\\.")
    );
    cluster
        .kubectl(&["get", "node", node, "-o", &path])
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
}

#[test]
#[ignore = "needs the control plane (GPUOPS_K8S_BIN): run scripts/test"]
fn the_agent_registers_whole_gpus_the_scheduler_places_a_pod_and_a_kubelet_restart_recovers() {
    let cluster = Cluster::start(ClusterOptions::default()).unwrap();
    let mut node = HarnessNode::start(&cluster, "gpu-node-1").unwrap();
    let log = cluster.dir().join("agent.log");
    let _agent = Agent::start(&node, "dgx-h100", &log);
    let agent_log = || std::fs::read_to_string(&log).unwrap_or_default();
    wait_until(
        "8 GPUs allocatable from the agent",
        Duration::from_secs(60),
        || allocatable(&cluster, "gpu-node-1", "nvidia.com/gpu").as_deref() == Some("8"),
    )
    .unwrap_or_else(|e| panic!("{e}\nagent log:\n{}", agent_log()));

    cluster
        .apply("apiVersion: v1\nkind: Pod\nmetadata:\n  name: two-gpus\n  namespace: default\nspec:\n  containers:\n  - name: cuda\n    image: example.invalid/cuda:12\n    resources:\n      limits:\n        nvidia.com/gpu: \"2\"\n")
        .unwrap();
    wait_until("the pod to run", Duration::from_secs(60), || {
        cluster
            .kubectl(&["get", "pod", "two-gpus", "-o", "jsonpath={.status.phase}"])
            .is_ok_and(|s| s == "Running")
    })
    .unwrap_or_else(|e| panic!("{e}\nagent log:\n{}", agent_log()));
    let alloc = node
        .allocation("default", "two-gpus")
        .expect("allocation recorded");
    let devices = alloc.devices("nvidia.com/gpu");
    assert_eq!(devices.len(), 2, "{:?}", alloc.0);
    assert!(devices.iter().all(|d| d.starts_with("GPU-")), "{devices:?}");
    let env = alloc
        .env("NVIDIA_VISIBLE_DEVICES")
        .expect("envvar strategy");
    let mut visible: Vec<&str> = env.split(',').collect();
    visible.sort_unstable();
    let mut expected: Vec<&str> = devices.iter().map(String::as_str).collect();
    expected.sort_unstable();
    assert_eq!(
        visible, expected,
        "NVIDIA_VISIBLE_DEVICES names exactly the allocated GPUs"
    );

    // A kubelet restart deletes every socket: the agent must notice and register again by itself.
    node.restart(&cluster, true).unwrap();
    // The restarted device manager starts with no plugins: capacity comes back only through a
    // new registration, which its log records.
    let restarted = cluster.dir().join("nodes/gpu-node-1/harness-restarted.log");
    wait_until(
        "re-registration after the kubelet restart",
        Duration::from_secs(30),
        || {
            std::fs::read_to_string(&restarted).is_ok_and(|l| l.contains("nvidia.com/gpu=8/8"))
                && allocatable(&cluster, "gpu-node-1", "nvidia.com/gpu").as_deref() == Some("8")
        },
    )
    .unwrap_or_else(|e| panic!("{e}\nagent log:\n{}", agent_log()));
}

#[test]
#[ignore = "needs the control plane (GPUOPS_K8S_BIN): run scripts/test"]
fn a_fatal_xid_makes_the_gpu_unhealthy_within_a_second_and_it_recovers_after_the_quiet_period() {
    let cluster = Cluster::start(ClusterOptions::default()).unwrap();
    let node = HarnessNode::start(&cluster, "gpu-node-1").unwrap();
    let state = cluster.dir().join("sim");
    let log = cluster.dir().join("agent.log");
    let _agent = Agent::start_with(
        &node,
        "dgx-h100",
        &log,
        &[
            "--sim-state",
            state.to_str().unwrap(),
            "--health-quiet-period",
            "4s",
        ],
    );
    let agent_log = || std::fs::read_to_string(&log).unwrap_or_default();
    let gpus = || allocatable(&cluster, "gpu-node-1", "nvidia.com/gpu");
    wait_until("8 GPUs", Duration::from_secs(60), || {
        gpus().as_deref() == Some("8")
    })
    .unwrap_or_else(|e| panic!("{e}\nagent log:\n{}", agent_log()));
    wait_until("the XID watch", Duration::from_secs(20), || {
        agent_log().contains("watching 8 GPUs")
    })
    .unwrap_or_else(|e| panic!("{e}\nagent log:\n{}", agent_log()));
    let sim = |args: &[&str]| {
        let o = common::gpuops()
            .arg("sim")
            .args(args)
            .arg("--state")
            .arg(&state)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", common::text(&o));
    };
    // An application XID leaves the GPU healthy.
    sim(&["xid", "--gpu", "2", "--xid", "13"]);
    // Handled once the agent logs it (a GPU it marked unhealthy would be withdrawn next).
    wait_until(
        "the agent to keep GPU 2 after XID 13",
        Duration::from_secs(20),
        || {
            agent_log()
                .lines()
                .any(|l| l.contains("XID 13 on GPU 2") && l.contains("GPU stays healthy"))
        },
    )
    .unwrap_or_else(|e| panic!("{e}\nagent log:\n{}", agent_log()));
    assert_eq!(gpus().as_deref(), Some("8"), "XID 13 is ignored by default");

    let injected = std::time::Instant::now();
    sim(&["xid", "--gpu", "3", "--xid", "48"]);
    wait_until(
        "the kubelet to see 7 healthy GPUs",
        Duration::from_secs(10),
        || gpus().as_deref() == Some("7"),
    )
    .unwrap_or_else(|e| panic!("{e}\nagent log:\n{}", agent_log()));
    // Includes kubectl polling (200 ms) and the harness's 1 s capacity sync; the agent's own part
    // is measured by the benchmark.
    println!("XID to allocatable 7: {:?}", injected.elapsed());
    wait_until(
        "recovery after the quiet period",
        Duration::from_secs(20),
        || gpus().as_deref() == Some("8"),
    )
    .unwrap_or_else(|e| panic!("{e}\nagent log:\n{}", agent_log()));
    assert!(
        injected.elapsed() >= Duration::from_secs(4),
        "not before the quiet period"
    );
}

#[test]
#[ignore = "needs the control plane (GPUOPS_K8S_BIN): run scripts/test"]
fn mig_devices_and_shared_gpus_are_advertised_scheduled_and_allocated_like_nvidia() {
    let cluster = Cluster::start(ClusterOptions::default()).unwrap();
    // Node 1: MIG strategy mixed on a DGX H100 partitioned with the seed's mixed-inference layout.
    let mig_node = HarnessNode::start(&cluster, "mig-node").unwrap();
    let state = cluster.dir().join("mig-sim");
    let sim = common::run(&[
        "sim",
        "init",
        "--fleet",
        "dgx-h100",
        "--state",
        state.to_str().unwrap(),
    ]);
    assert!(sim.status.success(), "{}", common::text(&sim));
    let seed = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/seed-mig-parted-config.yaml"
    );
    let o = common::run(&[
        "mig",
        "apply",
        "-f",
        seed,
        "-c",
        "mixed-inference",
        "--sim-state",
        state.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", common::text(&o));
    let mig_log = cluster.dir().join("agent-mig.log");
    let mut cmd = common::gpuops();
    cmd.args([
        "agent",
        "--sim-state",
        state.to_str().unwrap(),
        "--interval",
        "1s",
    ])
    .arg("--device-plugin-dir")
    .arg(mig_node.plugin_dir())
    .env("MIG_STRATEGY", "mixed");
    let _mig_agent = Agent::spawn(cmd, &mig_log);

    // Node 2: time-slicing with renameByDefault, from NVIDIA's config file format.
    let shared_node = HarnessNode::start(&cluster, "shared-node").unwrap();
    let config = cluster.dir().join("plugin-config.yaml");
    std::fs::write(
        &config,
        "version: v1\nsharing:\n  timeSlicing:\n    renameByDefault: true\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 4\n",
    )
    .unwrap();
    let _shared_agent = Agent::start_with(
        &shared_node,
        "l4x4",
        &cluster.dir().join("agent-shared.log"),
        &["--config-file", config.to_str().unwrap()],
    );

    let logs = || {
        format!(
            "mig agent:\n{}\nshared agent:\n{}",
            std::fs::read_to_string(&mig_log).unwrap_or_default(),
            std::fs::read_to_string(cluster.dir().join("agent-shared.log")).unwrap_or_default()
        )
    };
    wait_until("MIG and shared resources", Duration::from_secs(60), || {
        allocatable(&cluster, "mig-node", "nvidia.com/mig-1g.10gb").as_deref() == Some("32")
            && allocatable(&cluster, "mig-node", "nvidia.com/mig-3g.40gb").as_deref() == Some("8")
            && allocatable(&cluster, "shared-node", "nvidia.com/gpu.shared").as_deref()
                == Some("16")
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", logs()));
    assert_eq!(
        allocatable(&cluster, "mig-node", "nvidia.com/gpu"),
        None,
        "mixed: no whole GPUs on a MIG node"
    );

    let pod = |name: &str, resource: &str| {
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  namespace: default\nspec:\n  containers:\n  - name: c\n    image: example.invalid/app:1\n    resources:\n      limits:\n        {resource}: \"1\"\n"
        )
    };
    cluster
        .apply(&pod("mig-pod", "nvidia.com/mig-1g.10gb"))
        .unwrap();
    cluster
        .apply(&pod("shared-pod", "nvidia.com/gpu.shared"))
        .unwrap();
    for (pod, node) in [("mig-pod", "mig-node"), ("shared-pod", "shared-node")] {
        wait_until(&format!("{pod} running"), Duration::from_secs(60), || {
            cluster
                .kubectl(&[
                    "get",
                    "pod",
                    pod,
                    "-o",
                    "jsonpath={.status.phase} {.spec.nodeName}",
                ])
                .is_ok_and(|s| s == format!("Running {node}"))
        })
        .unwrap_or_else(|e| panic!("{e}\n{}", logs()));
    }
    let mig = mig_node.allocation("default", "mig-pod").unwrap();
    let ids = mig.devices("nvidia.com/mig-1g.10gb");
    assert!(ids.len() == 1 && ids[0].starts_with("MIG-"), "{ids:?}");
    assert_eq!(
        mig.env("NVIDIA_VISIBLE_DEVICES").as_deref(),
        Some(ids[0].as_str()),
        "envvar: the MIG UUID"
    );
    let shared = shared_node.allocation("default", "shared-pod").unwrap();
    let ids = shared.devices("nvidia.com/gpu.shared");
    assert!(
        ids.len() == 1 && ids[0].contains("::"),
        "replica ids are <uuid>::<n>: {ids:?}"
    );
    let uuid = ids[0].split("::").next().unwrap();
    assert_eq!(
        shared.env("NVIDIA_VISIBLE_DEVICES").as_deref(),
        Some(uuid),
        "replica suffix stripped, as NVIDIA does"
    );
}

#[test]
#[ignore = "needs the control plane (GPUOPS_K8S_BIN): run scripts/test"]
fn an_agent_started_before_the_kubelet_registers_once_the_kubelet_appears() {
    let cluster = Cluster::start(ClusterOptions::default()).unwrap();
    // The harness's plugin directory, known before the harness (the "kubelet") runs.
    let plugin_dir = cluster.dir().join("nodes/late-node/device-plugins");
    std::fs::create_dir_all(&plugin_dir).unwrap();
    let log = cluster.dir().join("agent-early.log");
    let mut cmd = common::gpuops();
    cmd.args([
        "agent",
        "--simulate",
        "l4x4",
        "--interval",
        "1s",
        "--node-name",
        "late-node",
    ])
    .arg("--device-plugin-dir")
    .arg(&plugin_dir);
    let _agent = Agent::spawn(cmd, &log);
    let agent_log = || std::fs::read_to_string(&log).unwrap_or_default();
    wait_until(
        "the agent to serve without a kubelet",
        Duration::from_secs(30),
        || {
            plugin_dir.join("nvidia-gpu.sock").exists()
                && agent_log().contains("waiting for the kubelet")
        },
    )
    .unwrap_or_else(|e| panic!("{e}\nagent log:\n{}", agent_log()));
    // Now the kubelet starts: it wipes the directory and opens kubelet.sock.
    let _node = HarnessNode::start(&cluster, "late-node").unwrap();
    wait_until(
        "registration with the late kubelet",
        Duration::from_secs(30),
        || allocatable(&cluster, "late-node", "nvidia.com/gpu").as_deref() == Some("4"),
    )
    .unwrap_or_else(|e| panic!("{e}\nagent log:\n{}", agent_log()));
}

#[test]
#[ignore = "needs the control plane (GPUOPS_K8S_BIN): run scripts/test"]
fn the_node_label_picks_a_named_config_and_a_change_applies_without_a_restart() {
    let cluster = Cluster::start(ClusterOptions::default()).unwrap();
    let node = HarnessNode::start(&cluster, "labelled-node").unwrap();
    let configs = cluster.dir().join("plugin-configs");
    std::fs::create_dir_all(&configs).unwrap();
    std::fs::write(configs.join("default.yaml"), "version: v1\n").unwrap();
    std::fs::write(
        configs.join("shared-4"),
        "version: v1\nsharing:\n  timeSlicing:\n    renameByDefault: true\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 4\n",
    )
    .unwrap();
    let log = cluster.dir().join("agent-labelled.log");
    let mut cmd = common::gpuops();
    cmd.args([
        "agent",
        "--simulate",
        "l4x4",
        "--interval",
        "1s",
        "--node-name",
        "labelled-node",
    ])
    .arg("--config-dir")
    .arg(&configs)
    .arg("--device-plugin-dir")
    .arg(node.plugin_dir())
    .env("KUBECONFIG", cluster.kubeconfig());
    let _agent = Agent::spawn(cmd, &log);
    let agent_log = || std::fs::read_to_string(&log).unwrap_or_default();
    wait_until(
        "the default config's 4 whole GPUs",
        Duration::from_secs(60),
        || allocatable(&cluster, "labelled-node", "nvidia.com/gpu").as_deref() == Some("4"),
    )
    .unwrap_or_else(|e| panic!("{e}\nagent log:\n{}", agent_log()));
    cluster
        .kubectl(&[
            "label",
            "node",
            "labelled-node",
            "nvidia.com/device-plugin.config=shared-4",
        ])
        .unwrap();
    wait_until(
        "16 shared GPUs after the label change",
        Duration::from_secs(30),
        || allocatable(&cluster, "labelled-node", "nvidia.com/gpu.shared").as_deref() == Some("16"),
    )
    .unwrap_or_else(|e| panic!("{e}\nagent log:\n{}", agent_log()));
    assert!(
        agent_log().contains("nvidia.com/device-plugin.config=shared-4"),
        "{}",
        agent_log()
    );
    // A label naming no config is reported; the last good config stays.
    cluster
        .kubectl(&[
            "label",
            "node",
            "labelled-node",
            "--overwrite",
            "nvidia.com/device-plugin.config=nope",
        ])
        .unwrap();
    wait_until(
        "the bad label to be reported",
        Duration::from_secs(30),
        || agent_log().contains("keeping the last good device plugin config"),
    )
    .unwrap_or_else(|e| panic!("{e}\nagent log:\n{}", agent_log()));
    assert_eq!(
        allocatable(&cluster, "labelled-node", "nvidia.com/gpu.shared").as_deref(),
        Some("16")
    );
}
