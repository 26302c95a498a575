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

use gpuops_testbed::{Cluster, ClusterOptions, RealNode, RealNodeOptions, wait_until};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const NAMESPACE: &str = "gpuops";

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../..")
}

/// GPUOPS_IMAGE / GPUOPS_IMAGE_REF when set, else scripts/image packing this build of gpuops.
fn image() -> (PathBuf, String) {
    if let (Some(file), Some(r)) = (
        std::env::var_os("GPUOPS_IMAGE"),
        std::env::var("GPUOPS_IMAGE_REF").ok(),
    ) {
        return (PathBuf::from(file), r);
    }
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_gpuops"));
    let dir = bin.parent().unwrap();
    let sim = [dir.join("libnvml_sim.so"), dir.join("deps/libnvml_sim.so")]
        .into_iter()
        .filter(|p| p.is_file())
        .max_by_key(|p| std::fs::metadata(p).and_then(|m| m.modified()).ok())
        .expect("libnvml_sim.so next to the gpuops test binary");
    let out = Command::new(repo().join("scripts/image"))
        .arg("--binary")
        .arg(&bin)
        .arg("--sim-lib")
        .arg(&sim)
        .stderr(Stdio::inherit())
        .output()
        .expect("running scripts/image");
    assert!(out.status.success(), "scripts/image failed");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let get = |k: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{k}=")))
            .unwrap_or_else(|| panic!("scripts/image printed no {k}: {text}"))
            .to_string()
    };
    (PathBuf::from(get("GPUOPS_IMAGE")), get("GPUOPS_IMAGE_REF"))
}

fn figure(name: &str, value: impl std::fmt::Display) {
    println!("FIGURE {name}: {value}");
}

fn node_address(cluster: &Cluster, node: &str) -> String {
    let json = cluster.get_json(&["node", node]).unwrap();
    json["status"]["addresses"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|a| a["type"] == "InternalIP")
        .and_then(|a| a["address"].as_str())
        .map(str::to_string)
        .unwrap_or_else(|| panic!("node {node} has no InternalIP: {}", json["status"]))
}

/// Fields drop in order: the node goes before the cluster.
struct Bed {
    node: RealNode,
    cluster: Cluster,
}

impl Bed {
    fn helm(&self, args: &[String]) {
        let home = self.cluster.dir().join("helm-home");
        let out = Command::new(self.cluster.bin().join("helm"))
            .args(args)
            .arg(format!(
                "--kubeconfig={}",
                self.cluster.kubeconfig().display()
            ))
            .env("HELM_CACHE_HOME", home.join("cache"))
            .env("HELM_CONFIG_HOME", home.join("config"))
            .env("HELM_DATA_HOME", home.join("data"))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "helm {args:?} failed:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
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
        .apply(&format!(
            r#"apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata:
  name: one-gpu
spec:
  spec:
    devices:
      requests:
      - name: gpu
        exactly:
          deviceClassName: gpu.nvidia.com
---
apiVersion: v1
kind: Pod
metadata:
  name: claimer
spec:
  terminationGracePeriodSeconds: 1
  resourceClaims:
  - name: gpu
    resourceClaimTemplateName: one-gpu
  containers:
  - name: model
    image: {image}
    imagePullPolicy: Never
    command: ["sh", "-c", "ls /dev; exec sleep 3600"]
    resources:
      claims:
      - name: gpu
"#,
            image = bed.node.images().busybox_ref
        ))
        .unwrap();
    bed.wait("the claiming pod Running", 120, || {
        bed.cluster
            .kubectl(&["get", "pod", "claimer", "-o", "jsonpath={.status.phase}"])
            .is_ok_and(|p| p == "Running")
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
    let dev = bed
        .cluster
        .kubectl(&["exec", "claimer", "--", "ls", "/dev"])
        .unwrap();
    let gpus: Vec<&str> = dev
        .split_whitespace()
        .filter(|n| {
            n.strip_prefix("nvidia")
                .is_some_and(|m| !m.is_empty() && m.chars().all(|c| c.is_ascii_digit()))
        })
        .collect();
    assert_eq!(gpus, [format!("nvidia{minor}")], "{dev}");
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
    let claimer = |name: &str, expression: &str| {
        format!(
            r#"apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata:
  name: {name}
spec:
  spec:
    devices:
      requests:
      - name: gpu
        exactly:
          deviceClassName: gpu.nvidia.com
          selectors:
          - cel:
              expression: "{expression}"
---
apiVersion: v1
kind: Pod
metadata:
  name: {name}
spec:
  terminationGracePeriodSeconds: 1
  resourceClaims:
  - name: gpu
    resourceClaimTemplateName: {name}
  containers:
  - name: model
    image: {image}
    imagePullPolicy: Never
    command: ["sh", "-c", "exec sleep 3600"]
    resources:
      claims:
      - name: gpu
"#
        )
    };
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
        .apply(&format!(
            r#"apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata:
  name: one-mig
spec:
  spec:
    devices:
      requests:
      - name: mig
        exactly:
          deviceClassName: mig.nvidia.com
          selectors:
          - cel:
              expression: "device.attributes['gpu.nvidia.com'].profile == '1g.10gb'"
---
apiVersion: v1
kind: Pod
metadata:
  name: mig
spec:
  terminationGracePeriodSeconds: 1
  resourceClaims:
  - name: mig
    resourceClaimTemplateName: one-mig
  containers:
  - name: model
    image: {image}
    imagePullPolicy: Never
    command: ["sh", "-c", "exec sleep 3600"]
    resources:
      claims:
      - name: mig
"#,
            image = bed.node.images().busybox_ref
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

/// The MIG devices the simulated driver holds now, as `profile@start`.
fn mig_devices(bed: &Bed) -> Vec<String> {
    let sim = bed.node.dir().join("sim");
    let out = common::run(&[
        "inventory",
        "--sim-state",
        sim.to_str().unwrap(),
        "-o",
        "json",
    ]);
    assert!(out.status.success(), "{}", common::text(&out));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    v["gpus"]
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

#[test]
#[ignore = "needs root and the test bed with kubelet and containerd (GPUOPS_K8S_BIN): run scripts/test"]
fn with_dynamic_mig_a_claims_mig_device_is_made_at_prepare_and_destroyed_when_the_pod_is_gone() {
    let (bed, _) = start_fleet("dgx-h100", &["dra.dynamicMig=true"]);
    // Every placement of every GPU offered from the GPUs' counter sets, and nothing made yet.
    bed.wait("the placements in the slices", 120, || {
        bed.slices().iter().any(|s| {
            s["spec"]["devices"].as_array().is_some_and(|d| {
                d.iter().any(|d| {
                    d["name"]
                        .as_str()
                        .is_some_and(|n| n.contains("-mig-3g40gb-"))
                })
            })
        })
    });
    assert!(mig_devices(&bed).is_empty(), "{:?}", mig_devices(&bed));
    let t0 = Instant::now();
    bed.cluster
        .apply(&format!(
            r#"apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata:
  name: half-a-gpu
spec:
  spec:
    devices:
      requests:
      - name: mig
        exactly:
          deviceClassName: mig.nvidia.com
          selectors:
          - cel:
              expression: "device.attributes['gpu.nvidia.com'].profile == '3g.40gb'"
---
apiVersion: v1
kind: Pod
metadata:
  name: dyn
spec:
  terminationGracePeriodSeconds: 1
  resourceClaims:
  - name: mig
    resourceClaimTemplateName: half-a-gpu
  containers:
  - name: model
    image: {image}
    imagePullPolicy: Never
    command: ["sh", "-c", "exec sleep 3600"]
    resources:
      claims:
      - name: mig
"#,
            image = bed.node.images().busybox_ref
        ))
        .unwrap();
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
