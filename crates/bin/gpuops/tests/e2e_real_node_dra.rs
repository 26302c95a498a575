//! gpuops as a DRA driver on a real node: the control plane and a kubelet with containerd with
//! the 1.35 DRA gates on, the chart installed with `dra.enabled` and the image scripts/image
//! builds, the agent on simulated GPUs with real device nodes. The node's ResourceSlice shows its
//! GPUs under NVIDIA's names; the real scheduler allocates a claim from a ResourceClaimTemplate
//! of class `gpu.nvidia.com`; the kubelet calls the agent's plugin, whose CDI spec gives the
//! container exactly its one GPU; deleting the pod unprepares it (the spec is gone).
//!
//! Needs root, the test bed (GPUOPS_K8S_BIN with kubelet and containerd), runc and the CNI
//! plugins: `cargo test -p gpuops --test e2e_real_node_dra -- --ignored --test-threads=1`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

mod common;

use common::real_node::{figure, image, node_address, repo};

use gpuops_testbed::{Cluster, ClusterOptions, RealNode, RealNodeOptions, wait_until};
use serde_json::Value;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

const NAMESPACE: &str = "gpuops";

/// Fields drop in order: the node goes before the cluster.
struct Bed {
    node: RealNode,
    cluster: Cluster,
}

impl Bed {
    fn helm(&self, args: &[String]) {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        self.cluster.helm(&args).unwrap_or_else(|e| panic!("{e}"));
    }

    fn report(&self) -> String {
        let kubelet = std::fs::read_to_string(self.node.kubelet_log()).unwrap_or_default();
        let tail: Vec<&str> = kubelet
            .lines()
            .rev()
            .filter(|l| {
                ["dra", "DRA", "CDI", "plugin", "gpu.nvidia.com"]
                    .iter()
                    .any(|w| l.contains(w))
            })
            .filter(|l| !l.contains("is not registered"))
            .take(40)
            .collect();
        let pods = self
            .cluster
            .kubectl(&["get", "pods", "-A", "-o", "wide"])
            .unwrap_or_default();
        let events = self
            .cluster
            .kubectl(&["get", "events", "-A", "--sort-by=.lastTimestamp"])
            .unwrap_or_default();
        let events: Vec<&str> = events.lines().rev().take(15).collect();
        let logs = self
            .cluster
            .kubectl(&[
                "logs",
                "-n",
                NAMESPACE,
                "-l",
                "app.kubernetes.io/component=node-agent",
                "--tail=60",
            ])
            .unwrap_or_else(|e| format!("(no logs: {e})"));
        format!(
            "pods:\n{pods}\nevents (newest first):\n{}\nagent logs:\n{logs}\nkubelet DRA lines (newest first):\n{}",
            events.join("\n"),
            tail.join("\n")
        )
    }

    fn wait(&self, what: &str, seconds: u64, mut check: impl FnMut() -> bool) {
        if let Err(e) = wait_until(what, Duration::from_secs(seconds), &mut check) {
            panic!("{e}\n{}", self.report());
        }
    }

    fn slices(&self) -> Vec<Value> {
        self.cluster
            .get_json(&[
                "resourceslices",
                "--field-selector",
                &format!("spec.nodeName={}", self.node.name),
            ])
            .map(|l| l["items"].as_array().cloned().unwrap_or_default())
            .unwrap_or_default()
    }

    /// Every device of the node's slices.
    fn devices(&self) -> Vec<Value> {
        self.slices()
            .iter()
            .flat_map(|s| s["spec"]["devices"].as_array().cloned().unwrap_or_default())
            .collect()
    }

    /// The names of the devices in the node's slices.
    fn device_names(&self) -> Vec<String> {
        self.devices()
            .iter()
            .filter_map(|d| d["name"].as_str().map(str::to_string))
            .collect()
    }

    /// `gpuops sim ARGS --state DIR` on the node's simulated driver (the agent's container
    /// mounts the same directory).
    fn sim(&self, args: &[&str]) {
        let state = self.node.dir().join("sim");
        let out = common::gpuops()
            .arg("sim")
            .args(args)
            .arg("--state")
            .arg(&state)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", common::text(&out));
    }

    /// The agent's DRA claim checkpoint as it last replaced it (null before its first claim):
    /// `<kubeletRootDir>/plugins/gpu.nvidia.com/checkpoint.json`, which is the node's
    /// `kubelet` directory on the host.
    fn checkpoint(&self) -> Value {
        let file = self
            .node
            .dir()
            .join("kubelet/plugins/gpu.nvidia.com/checkpoint.json");
        // Replaced by rename, so a read sees the old file or the new one, never half of one.
        std::fs::read(&file)
            .ok()
            .map(|b| serde_json::from_slice(&b).unwrap())
            .unwrap_or(Value::Null)
    }

    /// The claim's state in the checkpoint (`Preparing`, `Prepared`), or None without an entry.
    fn checkpointed(&self, uid: &str) -> Option<String> {
        self.checkpoint()["claims"][uid]["state"]
            .as_str()
            .map(str::to_string)
    }

    /// The agent's pod on the node (the DaemonSet has one).
    fn agent_pod(&self) -> Value {
        let pods = self
            .cluster
            .get_json(&[
                "pods",
                "-n",
                NAMESPACE,
                "-l",
                "app.kubernetes.io/component=node-agent",
            ])
            .unwrap();
        let items = pods["items"].as_array().cloned().unwrap_or_default();
        assert_eq!(items.len(), 1, "one agent pod: {pods}");
        items[0].clone()
    }

    /// The name and uid of the claim a pod's first `resourceClaims` entry got, once it has one.
    fn claim_of(&self, pod: &str) -> Option<(String, String)> {
        let pod = self.cluster.get_json(&["pod", pod]).ok()?;
        let name = pod["status"]["resourceClaimStatuses"][0]["resourceClaimName"].as_str()?;
        let claim = self.cluster.get_json(&["resourceclaim", name]).ok()?;
        let uid = claim["metadata"]["uid"].as_str()?;
        Some((name.to_string(), uid.to_string()))
    }

    /// The claim specs the agent left in the node's CDI directory.
    fn claim_specs(&self) -> Vec<String> {
        std::fs::read_dir(self.node.cdi_spec_dir())
            .unwrap()
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter(|n| n.starts_with("k8s.gpu.nvidia.com-claim_"))
            .collect()
    }
}

/// A control plane and a real node with the DRA gates, the simulated `fleet` with real device
/// nodes, and the chart installed with DRA on plus `extra` values (`key=value`); when the
/// install began.
fn start_fleet(fleet: &str, extra: &[&str]) -> (Bed, Instant) {
    let (archive, image_ref) = image();
    let cluster = Cluster::start(
        ClusterOptions {
            controller_manager: true,
            all_addresses: true,
            ..ClusterOptions::default()
        }
        .with_dra(),
    )
    .unwrap();
    let node = RealNode::start(
        &cluster,
        RealNodeOptions {
            labels: vec![("nvidia.com/gpu.present".into(), "true".into())],
            images: vec![archive],
            ..RealNodeOptions::default()
        }
        .with_dra(),
    )
    .unwrap();
    let bed = Bed { node, cluster };

    // Four simulated L4s with real device nodes, at the same path on the host and in the agent's
    // container, so the claim's CDI spec names paths the runtime finds.
    let sim = bed.node.dir().join("sim");
    let sim_arg = sim.to_str().unwrap().to_string();
    for args in [
        vec!["sim", "init", "--fleet", fleet, "--state", &sim_arg],
        vec!["sim", "dev-nodes", "--state", &sim_arg],
    ] {
        let out = common::run(&args);
        assert!(out.status.success(), "{}", common::text(&out));
        assert!(
            !common::text(&out).contains("regular files"),
            "real device nodes: {}",
            common::text(&out)
        );
    }
    let address = node_address(&bed.cluster, &bed.node.name);
    let kubeconfig = bed.cluster.kubeconfig_at("admin", &address).unwrap();
    let kube_dir = kubeconfig.parent().unwrap().display().to_string();
    let kube_file = kubeconfig
        .file_name()
        .unwrap()
        .to_str()
        .unwrap()
        .to_string();
    let (repository, tag) = image_ref.rsplit_once(':').unwrap();
    let volumes = format!(
        r#"[{{"name":"sim","hostPath":{{"path":"{sim_arg}"}}}},{{"name":"bed-kubeconfig","hostPath":{{"path":"{kube_dir}"}}}}]"#
    );
    let mounts = format!(
        r#"[{{"name":"sim","mountPath":"{sim_arg}"}},{{"name":"bed-kubeconfig","mountPath":"/bed","readOnly":true}}]"#
    );
    let env = format!(r#"[{{"name":"KUBECONFIG","value":"/bed/{kube_file}"}}]"#);
    let t0 = Instant::now();
    let set = |kv: &str| vec!["--set".to_string(), kv.to_string()];
    let mut args: Vec<String> = vec![
        "install".into(),
        "gpuops".into(),
        repo().join("deploy/helm/gpuops").display().to_string(),
        "--namespace".into(),
        NAMESPACE.into(),
        "--create-namespace".into(),
    ];
    for kv in [
        format!("image.repository={repository}"),
        format!("image.tag={tag}"),
        "image.pullPolicy=Never".into(),
        "interval=1s".into(),
        "mig.enabled=false".into(),
        "dra.enabled=true".into(),
        "devicePlugin.enabled=false".into(),
        format!("mig.stateDir={}", bed.node.dir().join("state").display()),
    ] {
        args.extend(set(&kv));
    }
    for (k, v) in [
        ("extraArgs", format!(r#"["--sim-state={sim_arg}"]"#)),
        ("extraEnv", env),
        ("extraVolumes", volumes),
        ("extraVolumeMounts", mounts),
    ] {
        args.push("--set-json".into());
        args.push(format!("{k}={v}"));
    }
    for kv in extra {
        args.extend(set(kv));
    }
    bed.helm(&args);
    (bed, t0)
}

#[test]
#[ignore = "needs root and the test bed with kubelet and containerd (GPUOPS_K8S_BIN): run scripts/test"]
// Long on purpose: one scenario, its steps in order on one shared setup (a control plane, a node and the chart cost tens of seconds), so the cases read as the story they test.
fn a_claim_from_a_template_gets_exactly_its_gpu_through_the_agents_dra_driver() {
    let (bed, t0) = start(&[]);

    // The node's slice: its four GPUs under NVIDIA's names, in its own pool.
    let mut names: Vec<String> = Vec::new();
    bed.wait("the node's ResourceSlice with 4 GPUs", 120, || {
        names = bed
            .slices()
            .iter()
            .flat_map(|s| s["spec"]["devices"].as_array().cloned().unwrap_or_default())
            .filter_map(|d| d["name"].as_str().map(str::to_string))
            .collect();
        names.len() == 4
    });
    figure(
        "helm install -> ResourceSlice with the node's GPUs (s)",
        format!("{:.1}", t0.elapsed().as_secs_f64()),
    );
    names.sort();
    assert_eq!(names, ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]);
    let slice = &bed.slices()[0];
    assert_eq!(slice["spec"]["driver"], "gpu.nvidia.com");
    assert_eq!(slice["spec"]["pool"]["name"], bed.node.name.as_str());
    let device = &slice["spec"]["devices"][0];
    assert_eq!(device["attributes"]["type"]["string"], "gpu", "{device}");
    assert!(
        device["attributes"]["productName"]["string"]
            .as_str()
            .is_some_and(|p| p.contains("L4")),
        "{device}"
    );

    // A pod with a claim from a template of class gpu.nvidia.com.
    let t0 = Instant::now();
    bed.cluster
        .apply(&template_pod(&bed, "claimer", "gpu.nvidia.com", None))
        .unwrap();
    bed.wait("the claiming pod Running", 120, || {
        phase(&bed, "claimer") == "Running"
    });
    figure(
        "pod with a claim created -> Running through DRA (s)",
        format!("{:.1}", t0.elapsed().as_secs_f64()),
    );
    let pod = bed.cluster.get_json(&["pod", "claimer"]).unwrap();
    let claim_name = pod["status"]["resourceClaimStatuses"][0]["resourceClaimName"]
        .as_str()
        .unwrap()
        .to_string();
    let claim = bed
        .cluster
        .get_json(&["resourceclaim", &claim_name])
        .unwrap();
    let uid = claim["metadata"]["uid"].as_str().unwrap().to_string();
    let result = &claim["status"]["allocation"]["devices"]["results"][0];
    assert_eq!(result["driver"], "gpu.nvidia.com");
    let device = result["device"].as_str().unwrap().to_string();
    let minor: u32 = device.strip_prefix("gpu-").unwrap().parse().unwrap();

    // Exactly its GPU: one /dev/nvidiaN, the allocated one.
    let gpus = gpus_seen(&bed, "claimer");
    assert_eq!(gpus, [format!("nvidia{minor}")], "{gpus:?}");
    let spec = bed
        .node
        .cdi_spec_dir()
        .join(format!("k8s.gpu.nvidia.com-claim_{uid}.json"));
    let text = std::fs::read_to_string(&spec).unwrap();
    assert!(text.contains(&format!("\"{uid}-{device}\"")), "{text}");

    // Deleting the pod unprepares the claim: its spec is gone.
    let t0 = Instant::now();
    bed.cluster
        .kubectl(&["delete", "pod", "claimer", "--wait=false"])
        .unwrap();
    bed.wait("the claim's CDI spec removed", 90, || !spec.exists());
    figure(
        "pod deleted -> claim unprepared (s)",
        format!("{:.1}", t0.elapsed().as_secs_f64()),
    );
}

/// [`start_fleet`] with four L4s.
fn start(extra: &[&str]) -> (Bed, Instant) {
    start_fleet("l4x4", extra)
}

/// The pod's phase, or "" while it has none.
fn phase(bed: &Bed, pod: &str) -> String {
    bed.cluster
        .kubectl(&["get", "pod", pod, "-o", "jsonpath={.status.phase}"])
        .unwrap_or_default()
}

/// The GPU device nodes a pod's container sees (`nvidia<N>`).
fn gpus_seen(bed: &Bed, pod: &str) -> Vec<String> {
    let dev = bed
        .cluster
        .kubectl(&["exec", pod, "--", "ls", "/dev"])
        .unwrap();
    dev.split_whitespace()
        .filter(|n| {
            n.strip_prefix("nvidia")
                .is_some_and(|m| !m.is_empty() && m.chars().all(|c| c.is_ascii_digit()))
        })
        .map(str::to_string)
        .collect()
}

#[test]
#[ignore = "needs root and the test bed with kubelet and containerd (GPUOPS_K8S_BIN): run scripts/test"]
// Long on purpose: one scenario, its steps in order on one shared setup (a control plane, a node and the chart cost tens of seconds), so the cases read as the story they test.
fn a_cel_selector_on_product_name_and_an_unchanged_nvidia_gpu_pod_are_served_through_dra() {
    let (bed, _) = start(&["dra.extendedResourceName=nvidia.com/gpu"]);
    bed.wait("the node's ResourceSlice", 120, || !bed.slices().is_empty());
    let image = bed.node.images().busybox_ref.clone();
    let claimer =
        |name: &str, expression: &str| template_pod(&bed, name, "gpu.nvidia.com", Some(expression));
    // A selector NVIDIA's users write: the product name. L4 matches; H100 matches nothing here.
    bed.cluster
        .apply(&claimer(
            "l4",
            "device.attributes['gpu.nvidia.com'].productName.contains('L4')",
        ))
        .unwrap();
    bed.cluster
        .apply(&claimer(
            "h100",
            "device.attributes['gpu.nvidia.com'].productName.contains('H100')",
        ))
        .unwrap();
    bed.wait("the L4 pod Running", 120, || phase(&bed, "l4") == "Running");
    assert_eq!(gpus_seen(&bed, "l4").len(), 1);
    let h100 = bed.cluster.get_json(&["pod", "h100"]).unwrap();
    assert_eq!(h100["status"]["phase"], "Pending", "{h100}");
    assert!(
        h100["spec"]["nodeName"].is_null(),
        "no node has an H100: {h100}"
    );

    // An unchanged pod that asks for nvidia.com/gpu: the scheduler makes it a claim of the
    // gpu.nvidia.com class (extendedResourceName), the agent prepares it.
    bed.cluster
        .apply(&format!(
            r#"apiVersion: v1
kind: Pod
metadata:
  name: legacy
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: model
    image: {image}
    imagePullPolicy: Never
    command: ["sh", "-c", "exec sleep 3600"]
    resources:
      limits:
        nvidia.com/gpu: 1
"#
        ))
        .unwrap();
    bed.wait("the nvidia.com/gpu pod Running through DRA", 120, || {
        phase(&bed, "legacy") == "Running"
    });
    let seen = gpus_seen(&bed, "legacy");
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_ne!(
        seen,
        gpus_seen(&bed, "l4"),
        "two claims, two different GPUs"
    );
    let legacy = bed.cluster.get_json(&["pod", "legacy"]).unwrap();
    assert!(
        !legacy["status"]["extendedResourceClaimStatus"].is_null(),
        "the scheduler's claim for nvidia.com/gpu: {}",
        legacy["status"]
    );
}

#[test]
#[ignore = "needs root and the test bed with kubelet and containerd (GPUOPS_K8S_BIN): run scripts/test"]
// Long on purpose: one scenario, its steps in order on one shared setup (a control plane, a node and the chart cost tens of seconds), so the cases read as the story they test.
fn after_a_mig_change_the_slice_offers_only_the_mig_devices_and_a_claim_by_profile_gets_one() {
    let (bed, _) = start_fleet("dgx-h100", &["mig.enabled=true"]);
    let names = |bed: &Bed| -> Vec<String> {
        bed.slices()
            .iter()
            .flat_map(|s| s["spec"]["devices"].as_array().cloned().unwrap_or_default())
            .filter_map(|d| d["name"].as_str().map(str::to_string))
            .collect()
    };
    bed.wait("8 whole GPUs in the slices", 120, || names(&bed).len() == 8);
    let t0 = Instant::now();
    bed.cluster
        .kubectl(&[
            "label",
            "node",
            &bed.node.name,
            "nvidia.com/mig.config=all-1g.10gb",
        ])
        .unwrap();
    // Level-triggered: after the MIG change only the MIG devices, never the whole GPUs beside
    // them (NVIDIA's issue 719).
    let mut now = Vec::new();
    bed.wait("56 MIG devices and no whole GPU in the slices", 240, || {
        now = names(&bed);
        now.len() == 56 && now.iter().all(|n| n.contains("-mig-1g10gb-"))
    });
    figure(
        "mig.config label -> slices with 56 MIG devices (s)",
        format!("{:.1}", t0.elapsed().as_secs_f64()),
    );
    bed.cluster
        .apply(&template_pod(
            &bed,
            "mig",
            "mig.nvidia.com",
            Some("device.attributes['gpu.nvidia.com'].profile == '1g.10gb'"),
        ))
        .unwrap();
    bed.wait("the MIG pod Running", 120, || {
        phase(&bed, "mig") == "Running"
    });
    assert_eq!(
        gpus_seen(&bed, "mig").len(),
        1,
        "its MIG device's parent GPU"
    );
    let caps = bed
        .cluster
        .kubectl(&["exec", "mig", "--", "ls", "/dev/nvidia-caps"])
        .unwrap();
    assert_eq!(
        caps.split_whitespace().count(),
        2,
        "the GPU and compute instance capabilities of its one MIG device: {caps}"
    );
}

/// The simulated driver's node as `gpuops inventory` reads it (on the host, beside the agent).
fn inventory(bed: &Bed) -> Value {
    let sim = bed.node.dir().join("sim");
    let out = common::run(&[
        "inventory",
        "--sim-state",
        sim.to_str().unwrap(),
        "-o",
        "json",
    ]);
    assert!(out.status.success(), "{}", common::text(&out));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The MIG devices the simulated driver holds now, as `profile@start`.
fn mig_devices(bed: &Bed) -> Vec<String> {
    inventory(bed)["gpus"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|g| g["mig_devices"].as_array().cloned().unwrap_or_default())
        .map(|m| {
            format!(
                "{}@{}",
                m["profile"].as_str().unwrap_or("?"),
                m["placement_start"]
            )
        })
        .collect()
}

/// The DRA device name (`gpu-<minor>`) of the GPU with NVML index `index`.
fn gpu_device(bed: &Bed, index: u64) -> String {
    let inv = inventory(bed);
    let gpu = inv["gpus"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|g| g["index"] == index)
        .unwrap_or_else(|| panic!("no GPU {index}: {inv}"));
    format!("gpu-{}", gpu["minor_number"])
}

/// A selector for dynamic MIG's half-GPU placements.
const HALF_A_GPU: &str = "device.attributes['gpu.nvidia.com'].profile == '3g.40gb'";

/// A ResourceClaimTemplate `name` with one request `device` of `class`, narrowed by a CEL
/// `expression` when given.
fn claim_template(name: &str, class: &str, expression: Option<&str>) -> String {
    let selectors = expression
        .map(|e| {
            format!("\n          selectors:\n          - cel:\n              expression: \"{e}\"")
        })
        .unwrap_or_default();
    format!(
        r#"apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata:
  name: {name}
spec:
  spec:
    devices:
      requests:
      - name: device
        exactly:
          deviceClassName: {class}{selectors}
"#
    )
}

/// A pod `name` whose one container holds one claim; `source` says which:
/// `resourceClaimTemplateName: T` (its own claim) or `resourceClaimName: C` (a shared one).
fn claim_pod(bed: &Bed, name: &str, source: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: {name}
spec:
  terminationGracePeriodSeconds: 1
  resourceClaims:
  - name: device
    {source}
  containers:
  - name: model
    image: {image}
    imagePullPolicy: Never
    command: ["sh", "-c", "exec sleep 3600"]
    resources:
      claims:
      - name: device
"#,
        image = bed.node.images().busybox_ref
    )
}

/// A template `name` of one `mig.nvidia.com` device with [`HALF_A_GPU`] and a pod `name` with
/// a claim from it.
fn half_a_gpu_pod(bed: &Bed, name: &str) -> String {
    template_pod(bed, name, "mig.nvidia.com", Some(HALF_A_GPU))
}

/// A ResourceClaimTemplate `name` of `class` (with a CEL selector) and a pod `name` holding a
/// claim from it.
fn template_pod(bed: &Bed, name: &str, class: &str, expression: Option<&str>) -> String {
    format!(
        "{}---\n{}",
        claim_template(name, class, expression),
        claim_pod(bed, name, &format!("resourceClaimTemplateName: {name}"))
    )
}

/// Dynamic MIG is on: every placement of every GPU is offered (a 3g.40gb among them).
fn wait_placements(bed: &Bed) {
    bed.wait("the placements in the slices", 120, || {
        bed.device_names()
            .iter()
            .any(|n| n.contains("-mig-3g40gb-"))
    });
}

#[test]
#[ignore = "needs root and the test bed with kubelet and containerd (GPUOPS_K8S_BIN): run scripts/test"]
fn with_dynamic_mig_a_claims_mig_device_is_made_at_prepare_and_destroyed_when_the_pod_is_gone() {
    let (bed, _) = start_fleet("dgx-h100", &["dra.dynamicMig=true"]);
    // Every placement of every GPU offered from the GPUs' counter sets, and nothing made yet.
    wait_placements(&bed);
    assert!(mig_devices(&bed).is_empty(), "{:?}", mig_devices(&bed));
    let t0 = Instant::now();
    bed.cluster.apply(&half_a_gpu_pod(&bed, "dyn")).unwrap();
    bed.wait("the dynamic-MIG pod Running", 120, || {
        phase(&bed, "dyn") == "Running"
    });
    figure(
        "dynamic MIG: pod created -> Running, its 3g.40gb made at prepare (s)",
        format!("{:.1}", t0.elapsed().as_secs_f64()),
    );
    let made = mig_devices(&bed);
    assert_eq!(made.len(), 1, "exactly the claim's MIG device: {made:?}");
    assert!(made[0].starts_with("3g.40gb@"), "{made:?}");
    let caps = bed
        .cluster
        .kubectl(&["exec", "dyn", "--", "ls", "/dev/nvidia-caps"])
        .unwrap();
    assert_eq!(
        caps.split_whitespace().count(),
        2,
        "the GPU and compute instance capabilities of its MIG device: {caps}"
    );
    let t1 = Instant::now();
    bed.cluster
        .kubectl(&["delete", "pod", "dyn", "--wait=false"])
        .unwrap();
    bed.wait("the claim's MIG device destroyed at unprepare", 120, || {
        mig_devices(&bed).is_empty()
    });
    figure(
        "dynamic MIG: pod deleted -> its MIG device destroyed (s)",
        format!("{:.1}", t1.elapsed().as_secs_f64()),
    );
}

/// The taints of the node's device `name` as `key=value`; None while it is not in the slices.
fn taints(bed: &Bed, name: &str) -> Option<Vec<String>> {
    bed.devices()
        .into_iter()
        .find(|d| d["name"] == name)
        .map(|d| {
            d["taints"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|t| {
                    format!(
                        "{}={}",
                        t["key"].as_str().unwrap_or_default(),
                        t["value"].as_str().unwrap_or_default()
                    )
                })
                .collect()
        })
}

/// The agent's pods (two while a rollout replaces one) and the current log of each.
fn agent_logs(bed: &Bed) -> Vec<(Value, String)> {
    let pods = bed
        .cluster
        .get_json(&[
            "pods",
            "-n",
            NAMESPACE,
            "-l",
            "app.kubernetes.io/component=node-agent",
        ])
        .unwrap();
    pods["items"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .map(|p| {
            let name = p["metadata"]["name"].as_str().unwrap_or_default();
            let log = bed
                .cluster
                .kubectl(&["logs", "-n", NAMESPACE, name])
                .unwrap_or_default();
            (p, log)
        })
        .collect()
}

/// The agent's one pod has `flag` and watches the node's `gpus` GPUs for XIDs (an XID sent
/// before that would not be seen).
fn agent_watching(bed: &Bed, flag: bool, gpus: usize) -> bool {
    let agents = agent_logs(bed);
    agents.len() == 1
        && agents.iter().all(|(pod, log)| {
            let has = pod["spec"]["containers"][0]["args"]
                .as_array()
                .is_some_and(|a| a.iter().any(|a| a == "--dra-device-taints"));
            has == flag && log.contains(&format!("watching {gpus} GPUs"))
        })
}

#[test]
#[ignore = "needs root and the test bed with kubelet and containerd (GPUOPS_K8S_BIN): run scripts/test"]
// Long on purpose: one scenario, its steps in order on one shared setup (a control plane, a node and the chart cost tens of seconds), so the cases read as the story they test.
fn a_fatal_xid_takes_the_device_out_of_the_slice_or_taints_it_and_recovery_brings_it_back() {
    // A short quiet period: the recovery is part of the scenario.
    let (bed, _) = start(&["healthQuietPeriod=5s"]);
    bed.wait("the node's ResourceSlice with 4 GPUs", 120, || {
        bed.device_names().len() == 4
    });
    bed.wait("the agent watching its GPUs for XIDs", 60, || {
        agent_watching(&bed, false, 4)
    });
    let sick = gpu_device(&bed, 2);

    // Without device taints (dra.deviceTaints=false): the device leaves the slice.
    let t0 = Instant::now();
    bed.sim(&["xid", "--gpu", "2", "--xid", "48"]);
    let mut left = Vec::new();
    bed.wait("the XID's GPU out of the slice", 30, || {
        left = bed.device_names();
        left.len() == 3
    });
    figure(
        "XID -> device gone from the slice (s)",
        format!("{:.1}", t0.elapsed().as_secs_f64()),
    );
    assert!(!left.contains(&sick), "{sick} left, not another: {left:?}");
    bed.wait(
        "the GPU back in the slice after the quiet period",
        60,
        || bed.device_names().contains(&sick),
    );
    figure(
        "XID -> device back in the slice, 5 s quiet period (s)",
        format!("{:.1}", t0.elapsed().as_secs_f64()),
    );
    assert!(
        t0.elapsed() >= Duration::from_secs(5),
        "not before the quiet period"
    );
    assert_eq!(taints(&bed, &sick), Some(vec![]), "back untainted");

    // With device taints (gate DRADeviceTaints, on in the test bed): the device stays, tainted.
    bed.helm(&[
        "upgrade".into(),
        "gpuops".into(),
        repo().join("deploy/helm/gpuops").display().to_string(),
        "--namespace".into(),
        NAMESPACE.into(),
        "--reuse-values".into(),
        "--set".into(),
        "dra.deviceTaints=true".into(),
    ]);
    bed.wait(
        "the agent restarted with --dra-device-taints, watching its GPUs",
        120,
        || agent_watching(&bed, true, 4),
    );
    let t0 = Instant::now();
    bed.sim(&["xid", "--gpu", "2", "--xid", "48"]);
    bed.wait("the XID's GPU tainted in the slice", 30, || {
        taints(&bed, &sick).is_some_and(|t| t.contains(&"gpu.nvidia.com/xid=48".to_string()))
    });
    figure(
        "XID -> device tainted in the slice, dra.deviceTaints (s)",
        format!("{:.1}", t0.elapsed().as_secs_f64()),
    );
    assert_eq!(bed.device_names().len(), 4, "{:?}", bed.device_names());
    bed.wait("the taint gone after the quiet period", 60, || {
        taints(&bed, &sick).is_some_and(|t| t.is_empty())
    });
    figure(
        "XID -> device taint removed, 5 s quiet period (s)",
        format!("{:.1}", t0.elapsed().as_secs_f64()),
    );
}

#[test]
#[ignore = "needs root and the test bed with kubelet and containerd (GPUOPS_K8S_BIN): run scripts/test"]
// Long on purpose: one scenario, its steps in order on one shared setup (a control plane, a node and the chart cost tens of seconds), so the cases read as the story they test.
fn kill_9_of_the_agent_during_prepare_then_the_pod_starts_and_nothing_leaks() {
    // Dynamic MIG: its prepare calls the driver, which the simulator can hang, so the kill lands
    // inside prepare every time rather than by timing.
    let (bed, _) = start_fleet("dgx-h100", &["dra.dynamicMig=true"]);
    wait_placements(&bed);
    // Prepare records the claim as Preparing (with the placement it will hold), then blocks in
    // its MIG create until the driver answers again.
    bed.sim(&["hang-driver"]);
    let t0 = Instant::now();
    bed.cluster.apply(&half_a_gpu_pod(&bed, "crash")).unwrap();
    let mut uid = String::new();
    bed.wait("the claim Preparing in the agent's checkpoint", 120, || {
        bed.claim_of("crash").is_some_and(|(_, u)| {
            uid = u;
            bed.checkpointed(&uid).as_deref() == Some("Preparing")
        })
    });
    let agent = bed.agent_pod();
    let pid = bed
        .node
        .container_pid(agent["metadata"]["uid"].as_str().unwrap(), "agent")
        .unwrap()
        .expect("the agent's process");
    let killed = Instant::now();
    let status = Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success(), "kill -9 {pid}");
    bed.wait("the killed agent gone", 30, || {
        !Path::new(&format!("/proc/{pid}")).exists()
    });
    assert_eq!(
        bed.checkpointed(&uid).as_deref(),
        Some("Preparing"),
        "the kill left the prepare unfinished"
    );
    assert!(bed.claim_specs().is_empty(), "{:?}", bed.claim_specs());
    bed.sim(&["hang-driver", "--clear"]);

    // The kubelet restarts the agent's container; its retried prepare finishes the claim.
    bed.wait("the pod Running after the agent's restart", 180, || {
        phase(&bed, "crash") == "Running"
    });
    figure(
        "kill -9 of the agent during prepare -> pod Running (s)",
        format!("{:.1}", killed.elapsed().as_secs_f64()),
    );
    figure(
        "with kill -9 during prepare: pod created -> Running (s)",
        format!("{:.1}", t0.elapsed().as_secs_f64()),
    );
    let agent = bed.agent_pod();
    assert!(
        agent["status"]["containerStatuses"][0]["restartCount"]
            .as_u64()
            .is_some_and(|n| n >= 1),
        "the same agent pod, its container restarted: {}",
        agent["status"]
    );
    assert_eq!(bed.checkpointed(&uid).as_deref(), Some("Prepared"));
    let made = mig_devices(&bed);
    assert_eq!(made.len(), 1, "one MIG device, not one per try: {made:?}");
    assert_eq!(
        bed.claim_specs(),
        [format!("k8s.gpu.nvidia.com-claim_{uid}.json")]
    );

    // Nothing leaks: after the pod, no spec, no checkpoint entry, no MIG device.
    let t1 = Instant::now();
    bed.cluster
        .kubectl(&["delete", "pod", "crash", "--wait=false"])
        .unwrap();
    bed.wait(
        "the claim unprepared: spec, entry and MIG device gone",
        120,
        || {
            bed.claim_specs().is_empty()
                && bed.checkpointed(&uid).is_none()
                && mig_devices(&bed).is_empty()
        },
    );
    figure(
        "after the kill: pod deleted -> claim unprepared (s)",
        format!("{:.1}", t1.elapsed().as_secs_f64()),
    );
    let claims = bed.checkpoint()["claims"].clone();
    assert!(
        claims.as_object().is_some_and(|c| c.is_empty()),
        "no entry left: {claims}"
    );
}

#[test]
#[ignore = "needs root and the test bed with kubelet and containerd (GPUOPS_K8S_BIN): run scripts/test"]
fn one_time_sliced_claim_is_shared_by_two_pods_that_see_the_same_gpu() {
    let (bed, _) = start(&[]);
    bed.wait("the node's ResourceSlice", 120, || !bed.slices().is_empty());
    // One ResourceClaim (not a template): both pods name it, NVIDIA's opaque config shares it.
    let claim = r#"apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata:
  name: shared-gpu
spec:
  devices:
    requests:
    - name: device
      exactly:
        deviceClassName: gpu.nvidia.com
    config:
    - requests: [device]
      opaque:
        driver: gpu.nvidia.com
        parameters:
          apiVersion: resource.nvidia.com/v1beta1
          kind: GpuConfig
          sharing:
            strategy: TimeSlicing
            timeSlicingConfig:
              interval: Long
"#;
    let pods =
        ["shared-a", "shared-b"].map(|p| claim_pod(&bed, p, "resourceClaimName: shared-gpu"));
    let t0 = Instant::now();
    bed.cluster
        .apply(&format!("{claim}---\n{}", pods.join("---\n")))
        .unwrap();
    bed.wait("both pods Running", 120, || {
        phase(&bed, "shared-a") == "Running" && phase(&bed, "shared-b") == "Running"
    });
    figure(
        "one time-sliced claim, two pods created -> both Running (s)",
        format!("{:.1}", t0.elapsed().as_secs_f64()),
    );
    let claim = bed
        .cluster
        .get_json(&["resourceclaim", "shared-gpu"])
        .unwrap();
    let results = claim["status"]["allocation"]["devices"]["results"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert_eq!(results.len(), 1, "one device: {}", claim["status"]);
    let minor = results[0]["device"]
        .as_str()
        .and_then(|d| d.strip_prefix("gpu-"))
        .unwrap()
        .to_string();
    let users = claim["status"]["reservedFor"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert_eq!(
        users.len(),
        2,
        "reserved for both pods: {}",
        claim["status"]
    );
    let a = gpus_seen(&bed, "shared-a");
    assert_eq!(a, [format!("nvidia{minor}")], "the claim's one GPU");
    assert_eq!(gpus_seen(&bed, "shared-b"), a, "the same GPU in both pods");
    let uid = claim["metadata"]["uid"].as_str().unwrap().to_string();
    assert_eq!(
        bed.claim_specs(),
        [format!("k8s.gpu.nvidia.com-claim_{uid}.json")],
        "prepared once for both"
    );

    // Unprepared once neither pod uses it.
    bed.cluster
        .kubectl(&["delete", "pod", "shared-a", "shared-b", "--wait=false"])
        .unwrap();
    bed.wait("the shared claim unprepared", 90, || {
        bed.claim_specs().is_empty() && bed.checkpointed(&uid).is_none()
    });
}
