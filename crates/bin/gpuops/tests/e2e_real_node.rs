//! The seed's workflow on a real node: a kubelet with containerd and runc (crates/testing/testbed's
//! RealNode), the chart installed with real Helm and the image scripts/image builds, the agent on
//! simulated GPUs whose state lives on a hostPath. The DaemonSet becomes Ready, the node
//! advertises `nvidia.com/gpu`, `kubectl label ... nvidia.com/mig.config=all-1g.10gb` repartitions
//! it, the seed's `inference-small` pod runs on a MIG device and sees it, a `kill -9` of the agent
//! inside its pod is survived, and a real Prometheus scrapes the agent pod.
//!
//! Figures are printed as `FIGURE <name>: <value>` lines (scripts/bench-real-node collects them).
//! Needs root, the test bed (GPUOPS_K8S_BIN with kubelet and containerd), runc and the CNI plugins:
//! run scripts/test, or `eval "$(tests/k8s/build.sh)"` and `cargo test -p gpuops --test
//! e2e_real_node -- --ignored --test-threads=1`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

mod common;

use common::real_node::{figure, image, node_address, repo};

use gpuops_testbed::{ChildGuard, Cluster, ClusterOptions, RealNode, RealNodeOptions, wait_until};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const NAMESPACE: &str = "gpuops";
const RELEASE: &str = "gpuops";

/// A control plane, one real node with gpuops's image, a simulated fleet on a host directory.
/// Fields drop in order: the node goes before the cluster.
struct Bed {
    node: RealNode,
    cluster: Cluster,
    image_ref: String,
    sim_state: PathBuf,
    pod_kubeconfig: PathBuf,
}

impl Bed {
    fn start(fleet: &str) -> Bed {
        let (archive, image_ref) = image();
        let cluster = Cluster::start(ClusterOptions {
            controller_manager: true,
            all_addresses: true,
            ..ClusterOptions::default()
        })
        .unwrap();
        let t0 = Instant::now();
        let node = RealNode::start(
            &cluster,
            RealNodeOptions {
                labels: vec![("nvidia.com/gpu.present".into(), "true".into())],
                images: vec![archive],
                ..RealNodeOptions::default()
            },
        )
        .unwrap();
        figure(
            "real node start -> Ready (s)",
            format!("{:.1}", t0.elapsed().as_secs_f64()),
        );
        // The GPUs exist before the agent, as on a real machine: the agent attaches to this state.
        let sim_state = node.dir().join("sim");
        let out = common::run(&[
            "sim",
            "init",
            "--fleet",
            fleet,
            "--state",
            sim_state.to_str().unwrap(),
        ]);
        assert!(out.status.success(), "{}", common::text(&out));
        // Pods reach the apiserver at the node's address (no kube-proxy here).
        let address = node_address(&cluster, &node.name);
        let pod_kubeconfig = cluster.kubeconfig_at("admin", &address).unwrap();
        Bed {
            node,
            cluster,
            image_ref,
            sim_state,
            pod_kubeconfig,
        }
    }

    fn helm(&self, args: &[&str]) -> String {
        self.cluster.helm(args).unwrap_or_else(|e| panic!("{e}"))
    }

    /// `helm install` of the chart with this bed's image, sim state and kubeconfig, plus `extra`
    /// (`--set ...` arguments).
    fn install(&self, extra: &[&str]) {
        let (repository, tag) = self.image_ref.rsplit_once(':').unwrap();
        let kube_dir = self.pod_kubeconfig.parent().unwrap();
        let kube_file = self.pod_kubeconfig.file_name().unwrap().to_str().unwrap();
        let volumes = format!(
            r#"[{{"name":"sim","hostPath":{{"path":"{}"}}}},{{"name":"bed-kubeconfig","hostPath":{{"path":"{}"}}}}]"#,
            self.sim_state.display(),
            kube_dir.display()
        );
        let mounts = r#"[{"name":"sim","mountPath":"/sim"},{"name":"bed-kubeconfig","mountPath":"/bed","readOnly":true}]"#;
        let env = format!(r#"[{{"name":"KUBECONFIG","value":"/bed/{kube_file}"}}]"#);
        let mig_state = self.node.dir().join("mig-state");
        let mut args = vec![
            "install".to_string(),
            RELEASE.into(),
            repo().join("deploy/helm/gpuops").display().to_string(),
            "--namespace".into(),
            NAMESPACE.into(),
            "--create-namespace".into(),
            "--set".into(),
            format!("image.repository={repository}"),
            "--set".into(),
            format!("image.tag={tag}"),
            // Imported, not pullable.
            "--set".into(),
            "image.pullPolicy=Never".into(),
            "--set".into(),
            "interval=1s".into(),
            "--set".into(),
            format!("mig.stateDir={}", mig_state.display()),
            "--set-json".into(),
            r#"extraArgs=["--sim-state=/sim"]"#.into(),
            "--set-json".into(),
            format!("extraEnv={env}"),
            "--set-json".into(),
            format!("extraVolumes={volumes}"),
            "--set-json".into(),
            format!("extraVolumeMounts={mounts}"),
        ];
        args.extend(extra.iter().map(|s| s.to_string()));
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        self.helm(&refs);
    }

    fn node_json(&self) -> Value {
        self.cluster.get_json(&["node", &self.node.name]).unwrap()
    }

    fn allocatable(&self, resource: &str) -> Option<String> {
        self.node_json()["status"]["allocatable"][resource]
            .as_str()
            .map(str::to_string)
    }

    fn agent_pod(&self) -> Option<Value> {
        let pods = self
            .cluster
            .get_json(&[
                "pods",
                "-n",
                NAMESPACE,
                "-l",
                "app.kubernetes.io/component=node-agent",
            ])
            .ok()?;
        pods["items"].as_array()?.first().cloned()
    }

    fn agent_logs(&self) -> String {
        self.cluster
            .kubectl(&[
                "logs",
                "-n",
                NAMESPACE,
                "-l",
                "app.kubernetes.io/component=node-agent",
                "--tail=60",
            ])
            .unwrap_or_else(|e| format!("(no logs: {e})"))
    }

    /// What went wrong, for assertion messages: the agent pod, its logs, the kubelet's log tail.
    fn report(&self) -> String {
        let kubelet = std::fs::read_to_string(self.node.kubelet_log()).unwrap_or_default();
        let tail: Vec<&str> = kubelet.lines().rev().take(25).collect();
        let pods = self
            .cluster
            .kubectl(&["get", "pods", "-A", "-o", "wide"])
            .unwrap_or_default();
        let events = self
            .cluster
            .kubectl(&["get", "events", "-A", "--sort-by=.lastTimestamp"])
            .unwrap_or_default();
        let events: Vec<&str> = events.lines().rev().take(15).collect();
        format!(
            "pods:\n{pods}\nevents (newest first):\n{}\nagent pod: {}\nagent logs:\n{}\nkubelet log (last lines, newest first):\n{}",
            events.join("\n"),
            self.agent_pod()
                .map(|p| p["status"].to_string())
                .unwrap_or_else(|| "none".into()),
            self.agent_logs(),
            tail.join("\n")
        )
    }

    fn wait(&self, what: &str, seconds: u64, mut check: impl FnMut() -> bool) {
        if let Err(e) = wait_until(what, Duration::from_secs(seconds), &mut check) {
            panic!("{e}\n{}", self.report());
        }
    }

    fn wait_agent_ready(&self) {
        self.wait("the agent DaemonSet Ready", 120, || {
            self.cluster
                .get_json(&["daemonset", "-n", NAMESPACE, RELEASE])
                .is_ok_and(|ds| ds["status"]["numberReady"] == 1)
        });
    }

    fn pod_phase(&self, name: &str) -> String {
        self.cluster
            .kubectl(&["get", "pod", name, "-o", "jsonpath={.status.phase}"])
            .unwrap_or_default()
    }

    fn exec(&self, pod: &str, command: &[&str]) -> String {
        let mut args = vec!["exec", pod, "--"];
        args.extend_from_slice(command);
        self.cluster
            .kubectl(&args)
            .unwrap_or_else(|e| panic!("kubectl exec {pod} {command:?}: {e}\n{}", self.report()))
    }

    /// A pod of the busybox test image that prints its environment and devices, then waits.
    fn workload(&self, name: &str, resource: &str) -> String {
        format!(
            r#"apiVersion: v1
kind: Pod
metadata:
  name: {name}
spec:
  terminationGracePeriodSeconds: 1
  containers:
    - name: model
      image: {image}
      imagePullPolicy: Never
      command: ["sh", "-c", "env | sort; ls /dev; exec sleep 3600"]
      resources:
        limits:
          {resource}: 1
"#,
            image = self.node.images().busybox_ref
        )
    }
}

fn cgroup_working_set(pod_uid: &str) -> Option<u64> {
    fn find(dir: &Path, name: &str) -> Option<PathBuf> {
        for e in std::fs::read_dir(dir).ok()?.flatten() {
            let p = e.path();
            if !p.is_dir() {
                continue;
            }
            if e.file_name().to_str() == Some(name) {
                return Some(p);
            }
            if let Some(found) = find(&p, name) {
                return Some(found);
            }
        }
        None
    }
    let dir = find(
        Path::new("/sys/fs/cgroup/memory/kubepods"),
        &format!("pod{pod_uid}"),
    )?;
    let usage: u64 = std::fs::read_to_string(dir.join("memory.usage_in_bytes"))
        .ok()?
        .trim()
        .parse()
        .ok()?;
    let stat = std::fs::read_to_string(dir.join("memory.stat")).ok()?;
    let inactive: u64 = stat
        .lines()
        .find_map(|l| l.strip_prefix("total_inactive_file "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    // What the kubelet and `kubectl top` call the working set.
    Some(usage.saturating_sub(inactive))
}

fn http_get(address: &str, path: &str) -> Option<String> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(address).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: {address}\r\n\r\n").ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    text.split_once("\r\n\r\n")
        .map(|(_, body)| body.to_string())
}

#[test]
#[ignore = "needs root and the test bed with kubelet and containerd (GPUOPS_K8S_BIN): run scripts/test"]
// Long on purpose: one scenario, its steps in order on one shared setup (a control plane, a node or a fleet costs seconds to start), so the cases read as the story they test.
fn the_seeds_workflow_runs_on_a_real_node_from_the_chart_and_the_image() {
    let bed = Bed::start("dgx-h100");

    // helm install -> the DaemonSet Ready on the agent with simulated GPUs -> nvidia.com/gpu.
    let t0 = Instant::now();
    bed.install(&["--set", "migStrategy=mixed"]);
    bed.wait("8 nvidia.com/gpu allocatable", 120, || {
        bed.allocatable("nvidia.com/gpu").as_deref() == Some("8")
    });
    figure(
        "helm install -> node allocatable nvidia.com/gpu (s)",
        format!("{:.1}", t0.elapsed().as_secs_f64()),
    );
    bed.wait_agent_ready();
    let labels = bed.node_json()["metadata"]["labels"].clone();
    assert_eq!(
        labels["nvidia.com/gpu.product"], "NVIDIA-H100-80GB-HBM3",
        "GFD labels from the pod: {labels}"
    );

    // The seed: kubectl label nodes <node> nvidia.com/mig.config=all-1g.10gb --overwrite.
    let t0 = Instant::now();
    bed.cluster
        .kubectl(&[
            "label",
            "nodes",
            &bed.node.name,
            "nvidia.com/mig.config=all-1g.10gb",
            "--overwrite",
        ])
        .unwrap();
    let mut states = Vec::new();
    bed.wait("mig.config.state success", 180, || {
        let state = bed.node_json()["metadata"]["labels"]["nvidia.com/mig.config.state"]
            .as_str()
            .unwrap_or("")
            .to_string();
        if states.last() != Some(&state) {
            states.push(state.clone());
        }
        state == "success"
    });
    assert!(
        states.iter().any(|s| s == "pending"),
        "the state went through pending: {states:?}"
    );
    bed.wait("56 nvidia.com/mig-1g.10gb allocatable", 60, || {
        bed.allocatable("nvidia.com/mig-1g.10gb").as_deref() == Some("56")
    });
    figure(
        "mig.config label -> 56 mig-1g.10gb allocatable (s)",
        format!("{:.1}", t0.elapsed().as_secs_f64()),
    );

    // The seed's inference-small pod (limits nvidia.com/mig-1g.10gb: 1), our test image.
    let t0 = Instant::now();
    bed.cluster
        .apply(&bed.workload("inference-small", "nvidia.com/mig-1g.10gb"))
        .unwrap();
    bed.wait("inference-small Running", 120, || {
        bed.pod_phase("inference-small") == "Running"
    });
    figure(
        "GPU pod create -> Running (s)",
        format!("{:.1}", t0.elapsed().as_secs_f64()),
    );
    let env = bed.exec("inference-small", &["env"]);
    let visible = env
        .lines()
        .find_map(|l| l.strip_prefix("NVIDIA_VISIBLE_DEVICES="))
        .unwrap_or_else(|| panic!("no NVIDIA_VISIBLE_DEVICES in the container:\n{env}"))
        .to_string();
    assert!(
        visible.starts_with("MIG-") && !visible.contains(','),
        "one MIG device: {visible}"
    );
    let inventory = |bed: &Bed| {
        let out = common::run(&[
            "inventory",
            "--sim-state",
            bed.sim_state.to_str().unwrap(),
            "-o",
            "json",
        ]);
        assert!(out.status.success(), "{}", common::text(&out));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let show = inventory(&bed);
    assert!(
        show.contains(&format!("\"{visible}\"")),
        "{visible} is a MIG device of the node:\n{show}"
    );

    // A real Prometheus scrapes the agent pod and sees the GPU pod's labels.
    let agent = bed.agent_pod().unwrap();
    let pod_ip = agent["status"]["podIP"].as_str().unwrap().to_string();
    let prometheus = Prometheus::start(bed.node.dir(), &format!("{pod_ip}:9400"));
    // Framebuffer use is per MIG device (DCGM has no GPU_UTIL for MIG instances).
    let query =
        "DCGM_FI_DEV_FB_USED{pod=\"inference-small\",namespace=\"default\",container=\"model\"}";
    let mut result = Value::Null;
    let seen = wait_until(
        "Prometheus to see inference-small on a GPU metric",
        Duration::from_secs(90),
        || {
            result = prometheus.query(query);
            result["data"]["result"]
                .as_array()
                .is_some_and(|r| !r.is_empty())
        },
    );
    if let Err(e) = seen {
        panic!(
            "{e}\nlast answer: {result}\ntargets: {}\nseries with a pod label: {}\n{}",
            prometheus.get("/api/v1/targets"),
            prometheus.query("count by (__name__, pod) ({pod!=\"\"})"),
            bed.report()
        );
    }
    let series = &result["data"]["result"][0]["metric"];
    assert_eq!(series["GPU_I_PROFILE"], "1g.10gb", "{series}");
    // dcgm-exporter 4.6+'s spelling, the chart's default.
    assert_eq!(series["hostname"], bed.node.name.as_str(), "{series}");
    drop(prometheus);

    let agent_uid = agent["metadata"]["uid"].as_str().unwrap().to_string();
    if let Some(bytes) = cgroup_working_set(&agent_uid) {
        figure(
            "agent pod working set, 8 GPUs x 7 MIG, 1 GPU pod (MiB)",
            format!("{:.1}", bytes as f64 / 1048576.0),
        );
    }

    // kill -9 of the agent inside its pod: the kubelet restarts it, it registers again, the
    // allocation and the MIG layout are intact.
    let registrations = "Got registration request from device plugin";
    let before = bed.node.kubelet_log_count(registrations);
    assert!(before > 0, "the agent registered with the kubelet");
    let pid = bed
        .node
        .container_pid(&agent_uid, "agent")
        .unwrap()
        .expect("the agent container's pid");
    if let Some(rss) = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .map(|v| v.trim().to_string())
        })
    {
        figure("agent process RSS, 8 GPUs x 7 MIG, 1 GPU pod", rss);
    }
    let t0 = Instant::now();
    let killed = Command::new("kill")
        .args(["-9", &pid.to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    bed.wait("the agent to register again", 120, || {
        bed.node.kubelet_log_count(registrations) > before
    });
    figure(
        "agent kill -9 -> re-registered (s)",
        format!("{:.1}", t0.elapsed().as_secs_f64()),
    );
    bed.wait("the agent restarted once and Ready", 60, || {
        bed.agent_pod().is_some_and(|p| {
            p["status"]["containerStatuses"][0]["restartCount"] == 1
                && p["status"]["containerStatuses"][0]["ready"] == true
        })
    });
    assert_eq!(
        bed.agent_pod().unwrap()["metadata"]["uid"],
        agent_uid.as_str(),
        "the same pod, its container restarted"
    );
    assert_eq!(bed.pod_phase("inference-small"), "Running");
    let env_after = bed.exec("inference-small", &["env"]);
    assert!(env_after.contains(&format!("NVIDIA_VISIBLE_DEVICES={visible}")));
    let labels = bed.node_json()["metadata"]["labels"].clone();
    assert_eq!(labels["nvidia.com/mig.config.state"], "success", "{labels}");
    bed.wait("56 MIG devices still allocatable", 30, || {
        bed.allocatable("nvidia.com/mig-1g.10gb").as_deref() == Some("56")
    });
    let show_after = inventory(&bed);
    assert!(show.matches("\"MIG-").count() >= 56, "{show}");
    assert_eq!(
        show.matches("\"MIG-").count(),
        show_after.matches("\"MIG-").count(),
        "the MIG layout is the same after the restart"
    );
}

#[test]
#[ignore = "needs root and the test bed with kubelet and containerd (GPUOPS_K8S_BIN): run scripts/test"]
fn time_slicing_on_an_l4_node_lets_four_pods_share_one_gpu() {
    let fleet_dir = tempfile::tempdir().unwrap();
    let fleet = fleet_dir.path().join("one-l4.yaml");
    std::fs::write(
        &fleet,
        "hostname: l4-node\ngpus:\n  - model: L4\n    count: 1\n",
    )
    .unwrap();
    let bed = Bed::start(fleet.to_str().unwrap());
    let config = r#"{"default":"version: v1\nsharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 4\n"}"#;
    bed.install(&[
        "--set",
        "mig.enabled=false",
        "--set-json",
        &format!("devicePlugin.configs={config}"),
    ]);
    bed.wait("4 nvidia.com/gpu replicas allocatable", 120, || {
        bed.allocatable("nvidia.com/gpu").as_deref() == Some("4")
    });
    bed.wait_agent_ready();
    for i in 0..4 {
        bed.cluster
            .apply(&bed.workload(&format!("shared-{i}"), "nvidia.com/gpu"))
            .unwrap();
    }
    bed.wait("4 pods Running", 120, || {
        (0..4).all(|i| bed.pod_phase(&format!("shared-{i}")) == "Running")
    });
    let mut seen = Vec::new();
    for i in 0..4 {
        let env = bed.exec(&format!("shared-{i}"), &["env"]);
        let visible = env
            .lines()
            .find_map(|l| l.strip_prefix("NVIDIA_VISIBLE_DEVICES="))
            .unwrap_or_else(|| panic!("shared-{i} has no NVIDIA_VISIBLE_DEVICES:\n{env}"))
            .to_string();
        seen.push(visible);
    }
    assert!(seen[0].starts_with("GPU-"), "{seen:?}");
    assert!(
        seen.iter().all(|v| v == &seen[0]),
        "all four share the one L4: {seen:?}"
    );
    // A fifth finds no replica left: the real scheduler says so.
    bed.cluster
        .apply(&bed.workload("shared-4", "nvidia.com/gpu"))
        .unwrap();
    bed.wait("the fifth pod unschedulable", 60, || {
        bed.cluster
            .kubectl(&[
                "get",
                "events",
                "--field-selector",
                "involvedObject.name=shared-4,reason=FailedScheduling",
                "-o",
                "jsonpath={.items[*].message}",
            ])
            .is_ok_and(|m| m.contains("Insufficient nvidia.com/gpu"))
    });
}

/// A real Prometheus scraping one target every second; stopped on drop.
struct Prometheus {
    _process: ChildGuard,
    address: String,
}

impl Prometheus {
    fn start(dir: &Path, target: &str) -> Prometheus {
        let port = gpuops_testbed::free_port().unwrap();
        let config = dir.join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\nscrape_configs:\n- job_name: gpuops\n  static_configs:\n  - targets: ['{target}']\n"
            ),
        )
        .unwrap();
        let mut cmd = Command::new("prometheus");
        cmd.arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("prometheus-tsdb").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"));
        let process = ChildGuard::spawn("prometheus", cmd, &dir.join("prometheus.log"))
            .unwrap_or_else(|e| panic!("{e}: scripts/test installs Debian's prometheus package"));
        Prometheus {
            _process: process,
            address: format!("127.0.0.1:{port}"),
        }
    }

    fn get(&self, path: &str) -> String {
        http_get(&self.address, path).unwrap_or_default()
    }

    fn query(&self, q: &str) -> Value {
        let encoded: String = q
            .bytes()
            .map(|b| match b {
                b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'_' => (b as char).to_string(),
                _ => format!("%{b:02X}"),
            })
            .collect();
        http_get(&self.address, &format!("/api/v1/query?query={encoded}"))
            .and_then(|body| serde_json::from_str(&body).ok())
            .unwrap_or(Value::Null)
    }
}

#[test]
#[ignore = "needs root and the test bed with kubelet and containerd (GPUOPS_K8S_BIN): run scripts/test"]
fn the_seeds_standalone_device_plugin_daemonset_runs_with_our_image() {
    let bed = Bed::start("l4x4");
    // The seed's nvidia-device-plugin.yaml as written (namespace, env vars, privileged, the
    // device-plugins hostPath), with our image instead of nvcr.io/nvidia/k8s-device-plugin. The
    // only additions stand in for real GPUs: the simulated driver's state and where it serves.
    let text = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/seed-nvidia-device-plugin.yaml"),
    )
    .unwrap();
    let mut ds: Value = serde_saphyr::from_str(&text).unwrap();
    let spec = &mut ds["spec"]["template"]["spec"];
    let seed_env = spec["containers"][0]["env"].clone();
    spec["containers"][0]["image"] = Value::from(bed.image_ref.as_str());
    spec["containers"][0]["imagePullPolicy"] = Value::from("Never");
    spec["containers"][0]["env"]
        .as_array_mut()
        .unwrap()
        .extend([
            serde_json::json!({"name": "GPUOPS_NVML_SIM_STATE", "value": "/sim"}),
            // A simulated node serves its plugin under the sim state unless told (so a demo
            // touches no system path); here the kubelet's directory, as on a GPU node.
            serde_json::json!({"name": "DEVICE_PLUGIN_PATH", "value": "/var/lib/kubelet/device-plugins"}),
        ]);
    spec["containers"][0]["volumeMounts"]
        .as_array_mut()
        .unwrap()
        .push(serde_json::json!({"name": "sim", "mountPath": "/sim"}));
    spec["volumes"].as_array_mut().unwrap().push(
        serde_json::json!({"name": "sim", "hostPath": {"path": bed.sim_state.display().to_string()}}),
    );
    assert_eq!(
        seed_env,
        serde_json::json!([
            {"name": "FAIL_ON_INIT_ERROR", "value": "false"},
            {"name": "DEVICE_SPLIT_COUNT", "value": "1"},
            {"name": "DEVICE_LIST_STRATEGY", "value": "envvar"},
        ]),
        "the seed's env vars, unchanged"
    );
    bed.cluster.apply(&ds.to_string()).unwrap();
    bed.wait("4 nvidia.com/gpu from the seed's DaemonSet", 120, || {
        bed.allocatable("nvidia.com/gpu").as_deref() == Some("4")
    });
    bed.cluster
        .apply(&bed.workload("one-l4", "nvidia.com/gpu"))
        .unwrap();
    bed.wait("the GPU pod Running", 120, || {
        bed.pod_phase("one-l4") == "Running"
    });
    let env = bed.exec("one-l4", &["env"]);
    let visible = env
        .lines()
        .find_map(|l| l.strip_prefix("NVIDIA_VISIBLE_DEVICES="))
        .unwrap_or_else(|| {
            panic!("no NVIDIA_VISIBLE_DEVICES (DEVICE_LIST_STRATEGY=envvar):\n{env}")
        });
    assert!(
        visible.starts_with("GPU-") && !visible.contains(','),
        "one whole L4: {visible}"
    );
}

#[test]
#[ignore = "needs root and the test bed with kubelet and containerd (GPUOPS_K8S_BIN): run scripts/test"]
fn fifty_mig_pods_get_distinct_devices_and_the_agent_attributes_them_all() {
    let bed = Bed::start("dgx-h100");
    bed.install(&[
        "--set",
        "migStrategy=mixed",
        "--set",
        "mig.defaultConfig=all-1g.10gb",
    ]);
    bed.wait("56 nvidia.com/mig-1g.10gb allocatable", 180, || {
        bed.allocatable("nvidia.com/mig-1g.10gb").as_deref() == Some("56")
    });
    bed.wait_agent_ready();
    let replicas = 50;
    let t0 = Instant::now();
    bed.cluster
        .apply(&format!(
            r#"apiVersion: apps/v1
kind: Deployment
metadata:
  name: inference
spec:
  replicas: {replicas}
  selector:
    matchLabels: {{app: inference}}
  template:
    metadata:
      labels: {{app: inference}}
    spec:
      terminationGracePeriodSeconds: 1
      containers:
        - name: model
          image: {image}
          imagePullPolicy: Never
          command: ["sleep", "3600"]
          resources:
            limits:
              nvidia.com/mig-1g.10gb: 1
"#,
            image = bed.node.images().busybox_ref
        ))
        .unwrap();
    bed.wait("50 MIG pods available", 400, || {
        bed.cluster
            .get_json(&["deployment", "inference"])
            .is_ok_and(|d| d["status"]["availableReplicas"] == replicas)
    });
    figure(
        "50 MIG pods create -> all Running (s)",
        format!("{:.1}", t0.elapsed().as_secs_f64()),
    );
    // Through the agent's metrics (from the kubelet's PodResources): every pod on its own device.
    let agent = bed.agent_pod().unwrap();
    let pod_ip = agent["status"]["podIP"].as_str().unwrap().to_string();
    let mut by_device = std::collections::BTreeMap::new();
    bed.wait("the agent's metrics to name all 50 pods", 60, || {
        by_device.clear();
        let text = http_get(&format!("{pod_ip}:9400"), "/metrics").unwrap_or_default();
        for line in text
            .lines()
            .filter(|l| l.starts_with("DCGM_FI_DEV_FB_USED{") && l.contains("pod=\"inference-"))
        {
            let label = |name: &str| {
                line.split(&format!("{name}=\""))
                    .nth(1)?
                    .split('"')
                    .next()
                    .map(str::to_string)
            };
            if let (Some(uuid), Some(gi), Some(pod)) =
                (label("UUID"), label("GPU_I_ID"), label("pod"))
            {
                by_device.insert((uuid, gi), pod);
            }
        }
        by_device.len() == replicas
    });
    let pods: std::collections::BTreeSet<&String> = by_device.values().collect();
    assert_eq!(pods.len(), replicas, "one device per pod: {by_device:?}");
    let agent_uid = agent["metadata"]["uid"].as_str().unwrap();
    let bytes = cgroup_working_set(agent_uid).expect("the agent pod's memory cgroup");
    figure(
        "agent pod working set, 8 GPUs x 7 MIG, 50 GPU pods (MiB)",
        format!("{:.1}", bytes as f64 / 1048576.0),
    );
}

#[test]
#[ignore = "needs Debian's package index for scripts/image (apt-get download): run scripts/test"]
fn the_image_is_a_docker_archive_of_the_binary_and_exactly_what_it_links() {
    let (archive, image_ref) = image();
    let dir = tempfile::tempdir().unwrap();
    let untar = |file: &Path, into: &Path| {
        std::fs::create_dir_all(into).unwrap();
        let ok = Command::new("tar")
            .arg("-xf")
            .arg(file)
            .arg("-C")
            .arg(into)
            .status()
            .unwrap();
        assert!(ok.success(), "tar -xf {}", file.display());
    };
    untar(&archive, dir.path());
    let manifest: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("manifest.json")).unwrap())
            .unwrap();
    assert_eq!(manifest.as_array().map(Vec::len), Some(1), "{manifest}");
    assert_eq!(manifest[0]["RepoTags"], serde_json::json!([image_ref]));
    let config_file = manifest[0]["Config"].as_str().unwrap();
    let config_text = std::fs::read(dir.path().join(config_file)).unwrap();
    let config: Value = serde_json::from_slice(&config_text).unwrap();
    // Content-addressed: the config's name is its sha256, the layer's diff_id the layer's.
    let sha = |bytes: &[u8]| {
        use std::io::Write;
        let mut child = Command::new("sha256sum")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(bytes).unwrap();
        let out = child.wait_with_output().unwrap();
        String::from_utf8_lossy(&out.stdout)[..64].to_string()
    };
    assert_eq!(format!("{}.json", sha(&config_text)), config_file);
    let layer = dir.path().join(manifest[0]["Layers"][0].as_str().unwrap());
    let layer_bytes = std::fs::read(&layer).unwrap();
    assert_eq!(
        config["rootfs"]["diff_ids"],
        serde_json::json!([format!("sha256:{}", sha(&layer_bytes))])
    );
    // As NVIDIA's device plugin image: root, the agent; the non-root user for everything else.
    assert_eq!(config["config"]["User"], "0:0");
    assert_eq!(
        config["config"]["Entrypoint"],
        serde_json::json!(["/usr/bin/gpuops"])
    );
    assert_eq!(config["config"]["Cmd"], serde_json::json!(["agent"]));
    let labels = &config["config"]["Labels"];
    for key in [
        "title", "version", "revision", "created", "source", "licenses",
    ] {
        assert!(
            labels[format!("org.opencontainers.image.{key}")].is_string(),
            "OCI label {key}: {labels}"
        );
    }
    // `gpuops --version` of the packed binary: the version and the commit it was built from.
    let version = labels["io.gpuops.version"].as_str().unwrap_or_default();
    assert!(
        version.starts_with(&format!("gpuops {} (commit ", env!("CARGO_PKG_VERSION"))),
        "io.gpuops.version: {labels}"
    );

    let root = dir.path().join("rootfs");
    untar(&layer, &root);
    let mut files = Vec::new();
    fn walk(base: &Path, dir: &Path, out: &mut Vec<String>) {
        for e in std::fs::read_dir(dir).unwrap().flatten() {
            let p = e.path();
            let meta = std::fs::symlink_metadata(&p).unwrap();
            if meta.is_dir() {
                walk(base, &p, out);
            } else {
                out.push(p.strip_prefix(base).unwrap().display().to_string());
            }
        }
    }
    walk(&root, &root, &mut files);
    files.sort();
    let libs: Vec<&String> = files
        .iter()
        .filter(|f| f.starts_with("lib") && !f.starts_with("lib64"))
        .collect();
    assert_eq!(
        libs,
        [
            "lib/x86_64-linux-gnu/ld-linux-x86-64.so.2",
            "lib/x86_64-linux-gnu/libc.so.6",
            "lib/x86_64-linux-gnu/libdl.so.2",
            "lib/x86_64-linux-gnu/libgcc_s.so.1",
            "lib/x86_64-linux-gnu/libm.so.6",
            "lib/x86_64-linux-gnu/libpthread.so.0",
            "lib/x86_64-linux-gnu/librt.so.1",
        ],
        "exactly what gpuops, the simulator and the driver's NVML link"
    );
    for wanted in [
        "usr/bin/gpuops",
        "usr/bin/kubectl-gpu",
        "usr/lib/gpuops/libnvml_sim.so",
        "lib64/ld-linux-x86-64.so.2",
        "etc/ssl/certs/ca-certificates.crt",
        "etc/passwd",
        "usr/share/doc/libc6/copyright",
    ] {
        assert!(files.iter().any(|f| f == wanted), "{wanted} in {files:?}");
    }
    let passwd = std::fs::read_to_string(root.join("etc/passwd")).unwrap();
    assert!(passwd.contains("nonroot:x:65532:65532:"), "{passwd}");
    let bundle = std::fs::read_to_string(root.join("etc/ssl/certs/ca-certificates.crt")).unwrap();
    assert!(
        bundle.matches("BEGIN CERTIFICATE").count() > 100,
        "Debian's CA bundle"
    );
    // The packed binary runs with only the packed loader and libraries.
    let out = Command::new(root.join("lib/x86_64-linux-gnu/ld-linux-x86-64.so.2"))
        .arg("--inhibit-cache")
        .arg("--library-path")
        .arg(root.join("lib/x86_64-linux-gnu"))
        .arg(root.join("usr/bin/gpuops"))
        .args(["sim", "fleets"])
        .env_clear()
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", common::text(&out));
    assert!(common::text(&out).contains("dgx-h100"));
}

#[test]
#[ignore = "needs root and the test bed with kubelet and containerd (GPUOPS_K8S_BIN): run scripts/test"]
fn on_a_node_without_gpus_the_seeds_daemonset_stays_running_and_says_why() {
    let bed = Bed::start("l4x4"); // the simulated GPUs are not given to the pod: no NVML in it
    let text = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/seed-nvidia-device-plugin.yaml"),
    )
    .unwrap();
    let mut ds: Value = serde_saphyr::from_str(&text).unwrap();
    let container = &mut ds["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(
        container["env"][0],
        serde_json::json!({"name": "FAIL_ON_INIT_ERROR", "value": "false"})
    );
    container["image"] = Value::from(bed.image_ref.as_str());
    container["imagePullPolicy"] = Value::from("Never");
    bed.cluster.apply(&ds.to_string()).unwrap();
    let logs = || {
        bed.cluster
            .kubectl(&[
                "logs",
                "-n",
                "kube-system",
                "daemonset/nvidia-device-plugin",
                "--tail=-1",
            ])
            .unwrap_or_default()
    };
    // Says why, with NVIDIA's hint for a node that is not a GPU node; then retries, still up.
    bed.wait("the agent to say NVML cannot be loaded", 120, || {
        logs().contains("FAIL_ON_INIT_ERROR=false")
    });
    bed.wait("the agent to retry NVML (still running)", 60, || {
        logs().contains("NVML still cannot be loaded")
    });
    let text = logs();
    assert!(
        text.contains("libnvidia-ml.so.1"),
        "names the library:\n{text}"
    );
    assert!(
        text.contains("nvidia.com/gpu.present"),
        "hints at deploying only to GPU nodes:\n{text}"
    );
    let pods = bed
        .cluster
        .get_json(&[
            "pods",
            "-n",
            "kube-system",
            "-l",
            "name=nvidia-device-plugin",
        ])
        .unwrap();
    let status = &pods["items"][0]["status"];
    assert_eq!(status["phase"], "Running", "{status}");
    assert_eq!(
        status["containerStatuses"][0]["restartCount"], 0,
        "{status}"
    );
    assert_eq!(status["containerStatuses"][0]["ready"], true, "{status}");
    assert_eq!(
        bed.allocatable("nvidia.com/gpu"),
        None,
        "nothing advertised"
    );
}

/// The chart's probes on a node whose agent cannot load NVML (FAIL_ON_INIT_ERROR=false): the
/// startup probe passes, /readyz says why it is not ready (the pod is Running, not Ready), and
/// liveness holds while the NVML retries back off, so the kubelet never restarts it. The
/// snapshot timeout and the liveness probe are cut to seconds so that a loop that stopped
/// beating between retries (gaps of 8 s and 16 s in this window) would be restarted here.
#[test]
#[ignore = "needs root and the test bed with kubelet and containerd (GPUOPS_K8S_BIN): run scripts/test"]
fn the_charts_probes_keep_an_agent_without_nvml_running_and_not_ready() {
    let bed = Bed::start("l4x4");
    let kube_file = bed.pod_kubeconfig.file_name().unwrap().to_str().unwrap();
    let env = format!(
        r#"[{{"name":"KUBECONFIG","value":"/bed/{kube_file}"}},{{"name":"FAIL_ON_INIT_ERROR","value":"false"}},{{"name":"GPUOPS_SNAPSHOT_TIMEOUT","value":"1s"}}]"#
    );
    bed.install(&[
        // No simulator: the pod has no NVML.
        "--set-json",
        "extraArgs=[]",
        "--set-json",
        &format!("extraEnv={env}"),
        "--set",
        "probes.liveness.periodSeconds=1,probes.liveness.failureThreshold=1,probes.liveness.timeoutSeconds=1",
        "--set",
        "probes.readiness.periodSeconds=1,probes.startup.periodSeconds=1",
    ]);
    bed.wait("the agent to say why it is not ready", 120, || {
        bed.agent_logs()
            .contains("not ready: NVML is not loaded; /readyz answers 503")
    });
    let status = || {
        bed.agent_pod()
            .map(|p| p["status"]["containerStatuses"][0].clone())
            .unwrap_or_default()
    };
    bed.wait("the startup probe to pass", 60, || {
        status()["started"] == true
    });
    let until = Instant::now() + Duration::from_secs(40);
    while Instant::now() < until {
        let s = status();
        assert_eq!(s["restartCount"], 0, "restarted: {s}\n{}", bed.report());
        assert_eq!(s["ready"], false, "ready without NVML: {s}");
        assert!(s["state"]["running"].is_object(), "{s}");
        // Sampling over a window is the test (it must hold for 40 s), not a wait for something.
        std::thread::sleep(Duration::from_secs(1));
    }
    let logs = bed.agent_logs();
    assert!(
        logs.contains("NVML still cannot be loaded"),
        "retrying NVML:\n{logs}"
    );
    assert!(!logs.contains("/healthz fails"), "{logs}");
}

/// What a pod's container has of the NVIDIA devices and the driver's files: its `/dev/nvidia*`
/// entries and the mount points of /proc/self/mountinfo under the driver's paths.
fn nvidia_view(bed: &Bed, pod: &str) -> (Vec<String>, Vec<String>) {
    let dev = bed.exec(pod, &["ls", "/dev"]);
    let mut nodes: Vec<String> = dev
        .split_whitespace()
        .filter(|n| n.starts_with("nvidia"))
        .map(str::to_string)
        .collect();
    nodes.sort();
    let info = bed.exec(pod, &["cat", "/proc/self/mountinfo"]);
    let mut mounts: Vec<String> = info
        .lines()
        .filter_map(|l| {
            let fields: Vec<&str> = l.split(' ').collect();
            // mount point, options (field 5 and 6 of mountinfo).
            let (point, options) = (fields.get(4)?, fields.get(5)?);
            (point.contains("nvidia") || point.contains("libcuda"))
                .then(|| format!("{point} {}", options.split(',').next().unwrap_or("")))
        })
        .collect();
    mounts.sort();
    (nodes, mounts)
}

#[test]
// Long on purpose: one scenario, its steps in order on one shared setup (a control plane, a node or a fleet costs seconds to start), so the cases read as the story they test.
#[ignore = "needs root and the test bed with kubelet and containerd (GPUOPS_K8S_BIN): run scripts/test"]
fn cdi_pods_get_exactly_their_devices_and_driver_files_and_others_none() {
    let bed = Bed::start("l4x4");
    // The simulated driver's device nodes and driver files, for the CDI spec.
    let out = common::run(&[
        "sim",
        "dev-nodes",
        "--state",
        bed.sim_state.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", common::text(&out));
    // The spec names the simulator's nodes and files at their host paths: the pod sees the
    // state at the same path.
    let sim = bed.sim_state.display().to_string();
    let mounts = format!(
        r#"[{{"name":"sim","mountPath":"{sim}"}},{{"name":"bed-kubeconfig","mountPath":"/bed","readOnly":true}}]"#
    );
    let args = format!(r#"["--sim-state={sim}"]"#);
    let install_args = |strategy: &str| -> Vec<String> {
        [
            "--set",
            "mig.enabled=false",
            "--set",
            "cdi.enabled=true",
            "--set",
            &format!("deviceListStrategy={strategy}"),
            "--set-json",
            &format!("extraArgs={args}"),
            "--set-json",
            &format!("extraVolumeMounts={mounts}"),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect()
    };
    let extra = install_args("cdi-cri");
    let refs: Vec<&str> = extra.iter().map(String::as_str).collect();
    bed.install(&refs);
    bed.wait("4 nvidia.com/gpu allocatable", 120, || {
        bed.allocatable("nvidia.com/gpu").as_deref() == Some("4")
    });
    bed.wait_agent_ready();

    // The agent wrote its spec into the node's /var/run/cdi, with every GPU, `all` and the
    // simulator's placeholder driver files.
    let spec_file = bed
        .node
        .cdi_spec_dir()
        .join("k8s.device-plugin.nvidia.com-gpu.json");
    bed.wait("the agent's CDI spec", 60, || spec_file.is_file());
    let spec: Value = serde_json::from_str(&std::fs::read_to_string(&spec_file).unwrap()).unwrap();
    assert_eq!(spec["kind"], "k8s.device-plugin.nvidia.com/gpu");
    let names: Vec<&str> = spec["devices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["name"].as_str().unwrap())
        .collect();
    assert_eq!(names.len(), 2 * 4 + 1, "{names:?}");
    assert!(names.contains(&"all") && names.contains(&"3"), "{names:?}");

    let check = |pod: &str| {
        bed.cluster
            .apply(&bed.workload(pod, "nvidia.com/gpu"))
            .unwrap();
        bed.wait(&format!("{pod} Running"), 120, || {
            bed.pod_phase(pod) == "Running"
        });
        let (nodes, mounts) = nvidia_view(&bed, pod);
        let gpus: Vec<&String> = nodes
            .iter()
            .filter(|n| n.trim_start_matches("nvidia").parse::<u32>().is_ok())
            .collect();
        assert_eq!(gpus.len(), 1, "{pod}: exactly one GPU node: {nodes:?}");
        let mut want = vec![
            gpus[0].clone(),
            "nvidia-modeset".into(),
            "nvidia-uvm".into(),
            "nvidia-uvm-tools".into(),
            "nvidiactl".into(),
        ];
        want.sort();
        assert_eq!(nodes, want, "{pod}: its GPU and the control nodes");
        // A character device with NVIDIA's major, as the simulator made it.
        let ls = bed.exec(pod, &["ls", "-l", &format!("/dev/{}", gpus[0])]);
        assert!(ls.starts_with('c') && ls.contains("195,"), "{pod}: {ls}");
        let lib = "/usr/lib/x86_64-linux-gnu";
        for m in [
            format!("{lib}/libcuda.so.1 ro"),
            "/usr/bin/nvidia-smi ro".to_string(),
        ] {
            assert!(mounts.contains(&m), "{pod}: {m} not in {mounts:?}");
        }
        assert!(
            mounts.iter().all(|m| m.ends_with(" ro")),
            "{pod}: read-only: {mounts:?}"
        );
        let text = bed.exec(pod, &["cat", &format!("{lib}/libcuda.so.1")]);
        assert!(text.contains("placeholder"), "{pod}: {text}");
        let env = bed.exec(pod, &["env"]);
        assert!(
            env.contains("NVIDIA_VISIBLE_DEVICES=void"),
            "{pod}: the spec's env: {env}"
        );
        (gpus[0].clone(), mounts)
    };
    let (first, cri_mounts) = check("cdi-cri");

    // A pod without a GPU request gets nothing of it.
    bed.cluster
        .apply(&format!(
            r#"apiVersion: v1
kind: Pod
metadata:
  name: no-gpu
spec:
  terminationGracePeriodSeconds: 1
  containers:
    - name: plain
      image: {image}
      imagePullPolicy: Never
      command: ["sh", "-c", "exec sleep 3600"]
"#,
            image = bed.node.images().busybox_ref
        ))
        .unwrap();
    bed.wait("no-gpu Running", 120, || {
        bed.pod_phase("no-gpu") == "Running"
    });
    let (nodes, mounts) = nvidia_view(&bed, "no-gpu");
    assert!(nodes.is_empty(), "no-gpu sees {nodes:?}");
    assert!(mounts.is_empty(), "no-gpu has {mounts:?}");
    let env = bed.exec("no-gpu", &["env"]);
    assert!(!env.contains("NVIDIA_VISIBLE_DEVICES"), "{env}");

    // The same through annotations.
    let extra = install_args("cdi-annotations");
    let mut upgrade = vec![
        "upgrade".to_string(),
        RELEASE.into(),
        repo().join("deploy/helm/gpuops").display().to_string(),
        "--namespace".into(),
        NAMESPACE.into(),
        "--reuse-values".into(),
    ];
    upgrade.extend(extra);
    let refs: Vec<&str> = upgrade.iter().map(String::as_str).collect();
    bed.helm(&refs);
    bed.wait("the upgraded agent Ready", 120, || {
        bed.cluster
            .get_json(&["daemonset", "-n", NAMESPACE, RELEASE])
            .is_ok_and(|ds| {
                ds["metadata"]["generation"] == ds["status"]["observedGeneration"]
                    && ds["status"]["updatedNumberScheduled"] == 1
                    && ds["status"]["numberReady"] == 1
                    && ds["status"]["numberUnavailable"].is_null()
            })
    });
    let (second, annotation_mounts) = check("cdi-annotations");
    assert_ne!(first, second, "the second pod gets another GPU");
    assert_eq!(cri_mounts, annotation_mounts);
}

#[test]
#[ignore = "needs root and the test bed with kubelet and containerd (GPUOPS_K8S_BIN): run scripts/test"]
fn after_a_mig_change_the_cdi_spec_names_the_mig_devices_and_a_mig_pod_gets_its_nodes() {
    let bed = Bed::start("dgx-h100");
    // The simulated driver's device nodes and driver files, for the CDI spec.
    let out = common::run(&[
        "sim",
        "dev-nodes",
        "--state",
        bed.sim_state.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", common::text(&out));
    let sim = bed.sim_state.display().to_string();
    let mounts = format!(
        r#"[{{"name":"sim","mountPath":"{sim}"}},{{"name":"bed-kubeconfig","mountPath":"/bed","readOnly":true}}]"#
    );
    bed.install(&[
        "--set",
        "migStrategy=mixed",
        "--set",
        "cdi.enabled=true",
        "--set",
        "deviceListStrategy=cdi-cri",
        "--set-json",
        &format!(r#"extraArgs=["--sim-state={sim}"]"#),
        "--set-json",
        &format!("extraVolumeMounts={mounts}"),
    ]);
    bed.wait("8 nvidia.com/gpu allocatable", 120, || {
        bed.allocatable("nvidia.com/gpu").as_deref() == Some("8")
    });
    let spec_file = bed
        .node
        .cdi_spec_dir()
        .join("k8s.device-plugin.nvidia.com-gpu.json");
    let names = || -> Vec<String> {
        std::fs::read_to_string(&spec_file)
            .ok()
            .and_then(|t| serde_json::from_str::<Value>(&t).ok())
            .and_then(|v| {
                v["devices"].as_array().map(|a| {
                    a.iter()
                        .filter_map(|d| d["name"].as_str().map(str::to_string))
                        .collect()
                })
            })
            .unwrap_or_default()
    };
    bed.wait("the spec with 8 GPUs", 60, || names().len() == 2 * 8 + 1);

    let t0 = Instant::now();
    bed.cluster
        .kubectl(&[
            "label",
            "nodes",
            &bed.node.name,
            "nvidia.com/mig.config=all-1g.10gb",
            "--overwrite",
        ])
        .unwrap();
    bed.wait("56 nvidia.com/mig-1g.10gb allocatable", 180, || {
        bed.allocatable("nvidia.com/mig-1g.10gb").as_deref() == Some("56")
    });
    // The agent rewrote its spec: 8 GPUs and 56 MIG devices, each by UUID and index, and `all`.
    bed.wait("the spec with the MIG devices", 60, || {
        names().len() == 2 * (8 + 56) + 1
    });
    figure(
        "mig.config label -> CDI spec with 56 MIG devices (s)",
        format!("{:.1}", t0.elapsed().as_secs_f64()),
    );
    let n = names();
    assert!(
        n.iter().any(|x| x.starts_with("MIG-")) && n.contains(&"7:6".to_string()),
        "{n:?}"
    );

    bed.cluster
        .apply(&bed.workload("mig-cdi", "nvidia.com/mig-1g.10gb"))
        .unwrap();
    bed.wait("mig-cdi Running", 120, || {
        bed.pod_phase("mig-cdi") == "Running"
    });
    let (nodes, _) = nvidia_view(&bed, "mig-cdi");
    let gpus: Vec<&String> = nodes
        .iter()
        .filter(|x| x.trim_start_matches("nvidia").parse::<u32>().is_ok())
        .collect();
    assert_eq!(gpus.len(), 1, "the MIG device's parent only: {nodes:?}");
    // The GI and CI capability nodes the simulated driver made for the new MIG device.
    let caps = bed.exec("mig-cdi", &["ls", "-l", "/dev/nvidia-caps"]);
    let cap_lines: Vec<&str> = caps.lines().filter(|l| l.contains("nvidia-cap")).collect();
    assert_eq!(cap_lines.len(), 2, "its GI and CI access nodes: {caps}");
    assert!(
        cap_lines.iter().all(|l| l.starts_with('c')),
        "character devices: {caps}"
    );
}
