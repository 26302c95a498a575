//! The real-node tier proves itself: a kubelet with containerd 2.x and runc runs a pod from an
//! image imported without a registry, `kubectl logs` and `exec` reach it, and dropping the node
//! leaves the host as it was (processes, sysctls, the bridge, cgroups, mount points).
//!
//! Needs root, runc and the CNI plugins, and the test bed's binaries with kubelet and containerd
//! (GPUOPS_K8S_BIN from tests/k8s/build.sh); ignored by a plain `cargo test`, run by scripts/test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use gpuops_testbed::{Cluster, ClusterOptions, RealNode, RealNodeOptions, wait_until};
use std::path::Path;
use std::time::Duration;

fn sysctl(key: &str) -> String {
    std::fs::read_to_string(format!("/proc/sys/{key}"))
        .unwrap()
        .trim()
        .to_string()
}

const SYSCTLS: [&str; 4] = [
    "vm/overcommit_memory",
    "kernel/panic",
    "kernel/panic_on_oops",
    "net/ipv4/ip_forward",
];

#[test]
#[ignore = "needs root and the test bed with kubelet and containerd (GPUOPS_K8S_BIN): run scripts/test"]
fn a_real_node_runs_a_pod_and_leaves_the_host_as_it_was() {
    let before: Vec<String> = SYSCTLS.iter().map(|k| sysctl(k)).collect();
    let host_dirs: Vec<bool> = ["/var/lib/kubelet", "/run/containerd"]
        .iter()
        .map(|d| Path::new(d).exists())
        .collect();
    let cluster = Cluster::start(ClusterOptions {
        controller_manager: true,
        ..ClusterOptions::default()
    })
    .unwrap();
    let node = RealNode::start(
        &cluster,
        RealNodeOptions {
            labels: vec![("gpuops.io/test".into(), "real".into())],
            ..RealNodeOptions::default()
        },
    )
    .unwrap();
    let labels = cluster
        .kubectl(&["get", "node", &node.name, "--show-labels"])
        .unwrap();
    assert!(labels.contains("gpuops.io/test=real"), "{labels}");

    let image = &node.images().busybox_ref;
    cluster
        .apply(&format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: hello\nspec:\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: hello\n    image: {image}\n    imagePullPolicy: Never\n    command: [sh, -c, 'echo hello from a real node; exec sleep 3600']\n"
        ))
        .unwrap();
    wait_until("the pod Running", Duration::from_secs(90), || {
        cluster
            .kubectl(&["get", "pod", "hello", "-o", "jsonpath={.status.phase}"])
            .is_ok_and(|p| p == "Running")
    })
    .unwrap_or_else(|e| {
        panic!(
            "{e}\n{}\nkubelet log: {}",
            cluster
                .kubectl(&["describe", "pod", "hello"])
                .unwrap_or_default(),
            node.kubelet_log().display()
        )
    });
    let mut logs = String::new();
    wait_until("the pod's log", Duration::from_secs(30), || {
        logs = cluster.kubectl(&["logs", "hello"]).unwrap_or_default();
        logs.contains("hello from a real node")
    })
    .unwrap_or_else(|e| panic!("{e}: {logs}"));
    let out = cluster
        .kubectl(&["exec", "hello", "--", "cat", "/proc/1/cmdline"])
        .unwrap();
    assert!(
        out.starts_with("sleep"),
        "exec reaches the container: {out:?}"
    );
    // The pod is on the bridge network, with an address of the node's subnet.
    let ip = cluster
        .kubectl(&["get", "pod", "hello", "-o", "jsonpath={.status.podIP}"])
        .unwrap();
    assert!(ip.starts_with("10.233."), "pod IP {ip}");

    // The host's /var/lib/kubelet is untouched: the kubelet's is a private bind mount.
    assert!(
        !Path::new("/var/lib/kubelet/device-plugins/kubelet.sock").exists(),
        "the kubelet socket is only visible inside the node's mount namespace"
    );
    assert!(
        node.dir()
            .join("kubelet/device-plugins/kubelet.sock")
            .exists()
    );

    let pids = node.pids();
    let container = node.container_pid(
        &cluster
            .kubectl(&["get", "pod", "hello", "-o", "jsonpath={.metadata.uid}"])
            .unwrap(),
        "hello",
    );
    let container = container.unwrap().expect("the container's pid");
    let bridge_count = links_named_gpo();
    assert_eq!(bridge_count, 1, "the bridge exists while the node runs");
    drop(node);

    for pid in pids.iter().chain(std::iter::once(&container)) {
        assert!(
            !Path::new(&format!("/proc/{pid}")).exists(),
            "process {pid} outlived the node"
        );
    }
    let after: Vec<String> = SYSCTLS.iter().map(|k| sysctl(k)).collect();
    assert_eq!(before, after, "sysctls {SYSCTLS:?} restored");
    assert_eq!(links_named_gpo(), 0, "the bridge is gone");
    for hierarchy in ["memory", "cpu", "pids", "systemd"] {
        let p = Path::new("/sys/fs/cgroup").join(hierarchy).join("kubepods");
        assert!(!p.exists(), "{} removed", p.display());
    }
    for (dir, existed) in ["/var/lib/kubelet", "/run/containerd"]
        .iter()
        .zip(host_dirs)
    {
        assert_eq!(Path::new(dir).exists(), existed, "{dir} as it was");
    }
}

fn links_named_gpo() -> usize {
    let out = std::process::Command::new("ip")
        .args(["-o", "link", "show"])
        .output()
        .unwrap();
    let own = format!("gpo{:06x}", std::process::id() & 0xff_ffff);
    String::from_utf8_lossy(&out.stdout)
        .lines()
        // `N: NAME: <flags>` (a veth on the bridge says `master NAME` further on)
        .filter(|l| l.split(": ").nth(1) == Some(own.as_str()))
        .count()
}

/// The DRA gates reach every component: the apiserver keeps the fields only the alpha gates
/// allow (a device's taints, shared counters, a DeviceClass's extendedResourceName; with a gate
/// off it drops them silently), the scheduler and controller-manager start with them, and the
/// kubelet runs with them and has its plugin registration directory.
#[test]
#[ignore = "needs root and the test bed with kubelet and containerd (GPUOPS_K8S_BIN): run scripts/test"]
fn the_dra_gates_reach_the_control_plane_and_the_kubelet() {
    let cluster = Cluster::start(
        ClusterOptions {
            controller_manager: true,
            ..ClusterOptions::default()
        }
        .with_dra(),
    )
    .unwrap();
    let node = RealNode::start(&cluster, RealNodeOptions::default().with_dra()).unwrap();
    cluster
        .apply(
            "apiVersion: resource.k8s.io/v1\nkind: DeviceClass\nmetadata:\n  name: gates.example.com\nspec:\n  extendedResourceName: example.com/gate\n  selectors:\n  - cel:\n      expression: device.driver == 'gates.example.com'\n",
        )
        .unwrap();
    let slice = format!(
        "apiVersion: resource.k8s.io/v1\nkind: ResourceSlice\nmetadata:\n  name: gates-counters\nspec:\n  driver: gates.example.com\n  nodeName: {n}\n  pool:\n    name: {n}\n    generation: 1\n    resourceSliceCount: 2\n  sharedCounters:\n  - name: gpu-0-counter-set\n    counters:\n      memory:\n        value: 80Gi\n---\napiVersion: resource.k8s.io/v1\nkind: ResourceSlice\nmetadata:\n  name: gates-devices\nspec:\n  driver: gates.example.com\n  nodeName: {n}\n  pool:\n    name: {n}\n    generation: 1\n    resourceSliceCount: 2\n  devices:\n  - name: gpu-0\n    consumesCounters:\n    - counterSet: gpu-0-counter-set\n      counters:\n        memory:\n          value: 80Gi\n    taints:\n    - key: gpu.nvidia.com/xid\n      value: \"79\"\n      effect: NoSchedule\n",
        n = node.name
    );
    cluster.apply(&slice).unwrap();
    let class = cluster
        .get_json(&["deviceclass", "gates.example.com"])
        .unwrap();
    assert_eq!(
        class["spec"]["extendedResourceName"], "example.com/gate",
        "DRAExtendedResource on in the apiserver: {class}"
    );
    let devices = cluster
        .get_json(&["resourceslice", "gates-devices"])
        .unwrap();
    let device = &devices["spec"]["devices"][0];
    assert_eq!(
        device["taints"][0]["key"], "gpu.nvidia.com/xid",
        "DRADeviceTaints on: {devices}"
    );
    assert_eq!(
        device["consumesCounters"][0]["counterSet"], "gpu-0-counter-set",
        "DRAPartitionableDevices on: {devices}"
    );
    let counters = cluster
        .get_json(&["resourceslice", "gates-counters"])
        .unwrap();
    assert_eq!(
        counters["spec"]["sharedCounters"][0]["name"], "gpu-0-counter-set",
        "{counters}"
    );
    let config = std::fs::read_to_string(node.dir().join("kubelet.yaml")).unwrap();
    assert!(
        config.contains("featureGates:\n  DRAPartitionableDevices: true"),
        "{config}"
    );
    assert!(
        node.dir().join("kubelet/plugins_registry").is_dir(),
        "the kubelet's plugin registration directory, where a DRA driver registers"
    );
}
