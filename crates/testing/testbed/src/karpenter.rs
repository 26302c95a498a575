//! The real Karpenter (v1.15.0, its KWOK cloud provider, built by `tests/k8s/build.sh karpenter`)
//! against the test bed's apiserver, with GPU instance types and the same node lifecycle as the
//! Cluster API test provider: a Node registers without its GPUs (a MutatingAdmissionPolicy strips
//! them from the Node Karpenter creates), they appear in allocatable after the device-plugin delay,
//! and the startup taint (if the NodePool declares it) goes at that moment, as gpuops's agent does.
//!
//! ```no_run
//! # use gpuops_testbed::*;
//! let cluster = Cluster::start(ClusterOptions {
//!     kwok: true,
//!     controller_manager: true,
//!     apiserver_args: KarpenterOptions::apiserver_args(),
//!     ..ClusterOptions::default()
//! })?;
//! let karpenter = cluster.start_karpenter(KarpenterOptions::default())?;
//! // ... create pending GPU pods, then look at karpenter.node_claims()?
//! # Ok::<(), BedError>(())
//! ```

use crate::capi::http_ok;
use crate::child::ChildGuard;
use crate::infra::{
    FirstSeen, NodeView, STARTUP_TAINT, age_since_created, device_actions, execute_all,
};
use crate::kubectl::{Kubectl, Loop};
use crate::scenario::{Autoscaler, Instance, Offer};
use crate::{BedError, Cluster, free_port, wait_until};
use serde_json::{Value, json};
use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// The environment variable naming the directory `tests/k8s/build.sh karpenter` built.
pub const KARPENTER_BIN_ENV: &str = "GPUOPS_KARPENTER_BIN";

const READY: Duration = Duration::from_secs(120);
const NODE_CLASS: &str = "gpuops-test";
const NODE_POOL: &str = "gpu";
const POLICY: &str = "gpuops-test-device-plugin-lag";
const INSTANCE_TYPE_LABEL: &str = "node.kubernetes.io/instance-type";
const ZONE: &str = "test-zone-a";

/// One instance type of the KWOK provider's price list.
#[derive(Debug, Clone, PartialEq)]
pub struct InstanceType {
    pub name: String,
    pub cpu: String,
    pub memory: String,
    pub pods: u32,
    /// Extended resources (`nvidia.com/gpu`: "8"): what Karpenter plans with, and what appears
    /// in the Node's allocatable after the device-plugin delay.
    pub devices: BTreeMap<String, String>,
    /// On-demand price per hour.
    pub price: f64,
    /// Physical GPUs, for GPU-hours (a MIG or time-sliced type advertises more devices).
    pub gpus: u32,
}

impl InstanceType {
    /// A GPU instance: 64 CPUs, 512 GiB, 110 pods, `count` of `resource` on `count` GPUs.
    pub fn gpu(name: &str, resource: &str, count: u32, price: f64) -> InstanceType {
        InstanceType {
            name: name.to_string(),
            cpu: "64".into(),
            memory: "512Gi".into(),
            pods: 110,
            devices: [(resource.to_string(), count.to_string())].into(),
            price,
            gpus: count,
        }
    }

    /// The entry of the KWOK provider's `--instance-types-file-path` JSON.
    fn to_json(&self) -> Value {
        let mut resources = json!({"cpu": self.cpu, "memory": self.memory,
            "pods": self.pods.to_string(), "ephemeral-storage": "100Gi"});
        for (k, v) in &self.devices {
            resources[k] = json!(v);
        }
        json!({
            "name": self.name,
            "architecture": "amd64",
            "operatingSystems": ["linux"],
            "resources": resources,
            "offerings": [{
                "Price": self.price,
                "Available": true,
                "Requirements": [
                    {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["on-demand"]},
                    {"key": "topology.kubernetes.io/zone", "operator": "In", "values": [ZONE]},
                ],
            }],
        })
    }
}

/// How Karpenter runs.
#[derive(Debug, Clone)]
pub struct KarpenterOptions {
    pub instance_types: Vec<InstanceType>,
    /// Declare `gpuops.io/gpu-not-ready:NoSchedule` as a NodePool startup taint (the nodes then
    /// register with it and lose it when their GPUs appear).
    pub startup_taint: bool,
    /// KWOKNodeClass `nodeRegistrationDelay`: launch to Node object (the boot); whole seconds.
    pub registration_delay: Duration,
    /// Node registration to GPUs in allocatable (the device plugin).
    pub devices_delay: Duration,
    /// Karpenter's pod batching (`--batch-idle-duration`, `--batch-max-duration`).
    pub batch_idle: Duration,
    pub batch_max: Duration,
    /// NodePool `disruption.consolidateAfter`; None: never consolidate (scale-up scenarios).
    pub consolidate_after: Option<Duration>,
    /// How often the device-plugin lag is reconciled.
    pub lag_interval: Duration,
}

/// The offer as Karpenter's KWOK provider sells it: its device resource is an opaque extended
/// resource in the type's capacity (Karpenter itself knows nothing of MIG or time-slicing).
impl From<&Offer> for InstanceType {
    fn from(o: &Offer) -> InstanceType {
        InstanceType {
            gpus: o.gpus,
            ..InstanceType::gpu(&o.name, &o.resource, o.devices, o.price)
        }
    }
}

impl Default for KarpenterOptions {
    fn default() -> Self {
        KarpenterOptions {
            instance_types: Offer::h100_whole().iter().map(InstanceType::from).collect(),
            startup_taint: false,
            registration_delay: Duration::from_secs(2),
            devices_delay: Duration::from_secs(3),
            batch_idle: Duration::from_secs(1),
            batch_max: Duration::from_secs(10),
            consolidate_after: None,
            lag_interval: Duration::from_millis(250),
        }
    }
}

impl KarpenterOptions {
    /// The kube-apiserver flags Karpenter's device-plugin lag needs (the Beta
    /// MutatingAdmissionPolicy API, off by default in Kubernetes 1.35): put them in
    /// [`crate::ClusterOptions::apiserver_args`].
    pub fn apiserver_args() -> Vec<String> {
        vec![
            "--feature-gates=MutatingAdmissionPolicy=true".into(),
            "--runtime-config=admissionregistration.k8s.io/v1beta1=true".into(),
        ]
    }
}

/// A NodeClaim as the tests look at it.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeClaimInfo {
    pub name: String,
    pub instance_type: Option<String>,
    pub node: Option<String>,
    /// Its `metadata.creationTimestamp`: when Karpenter decided to launch it.
    pub created: Option<String>,
    pub launched: bool,
    pub registered: bool,
    pub initialized: bool,
}

/// Karpenter running against a [`Cluster`]; dropping it stops Karpenter and the lag loop.
#[derive(Debug)]
pub struct Karpenter {
    _lag: Loop,
    process: ChildGuard,
    kube: Kubectl,
    dir: PathBuf,
    gpus_by_type: BTreeMap<String, u32>,
    startup_taint: bool,
}

impl Cluster {
    /// Installs Karpenter's CRDs and the device-plugin-lag policy, starts Karpenter (leader
    /// election off) and creates the KWOKNodeClass and the NodePool `gpu`. Needs KWOK, the
    /// controller manager (it lifts the apiserver's not-ready taint from new nodes) and
    /// [`KarpenterOptions::apiserver_args`] in the [`crate::ClusterOptions`].
    pub fn start_karpenter(&self, options: KarpenterOptions) -> Result<Karpenter, BedError> {
        let bin = karpenter_bin()?;
        let dir = self.dir().join("karpenter");
        std::fs::create_dir_all(&dir)
            .map_err(|e| BedError::io(format!("creating {}", dir.display()), e))?;
        let kube = Kubectl::new(self.bin(), &self.kubeconfig());

        let resources = kube.run(
            &[
                "api-resources",
                "--api-group=admissionregistration.k8s.io",
                "-o",
                "name",
            ],
            None,
        )?;
        if !resources
            .lines()
            .any(|l| l.starts_with("mutatingadmissionpolicies"))
        {
            return Err(BedError::Kubectl {
                args: "api-resources --api-group=admissionregistration.k8s.io".into(),
                message: "no mutatingadmissionpolicies: start the Cluster with \
                          ClusterOptions::apiserver_args = KarpenterOptions::apiserver_args() \
                          (the device-plugin lag of Karpenter's nodes is modelled with one)"
                    .into(),
            });
        }
        let devices: BTreeMap<String, BTreeMap<String, String>> = options
            .instance_types
            .iter()
            .map(|t| (t.name.clone(), t.devices.clone()))
            .collect();
        let resource_names: Vec<String> = devices
            .values()
            .flat_map(|d| d.keys().cloned())
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect();
        kube.apply(&lag_policy(&resource_names).to_string())?;
        kube.run(
            &["create", "-f", &bin.join("crds").display().to_string()],
            None,
        )?;
        kube.run(
            &[
                "wait",
                "--for=condition=Established",
                "crd",
                "--all",
                "--timeout=60s",
            ],
            None,
        )?;
        prove_the_policy_strips(&kube, &resource_names)?;

        let types_file = dir.join("instance-types.json");
        let types: Vec<Value> = options
            .instance_types
            .iter()
            .map(InstanceType::to_json)
            .collect();
        std::fs::write(&types_file, Value::Array(types).to_string())
            .map_err(|e| BedError::io(format!("writing {}", types_file.display()), e))?;

        let health = free_port()?;
        let mut cmd = Command::new(bin.join("karpenter-kwok"));
        cmd.env("KUBECONFIG", self.kubeconfig())
            .env("SYSTEM_NAMESPACE", "kube-system")
            .args([
                "--disable-leader-election".to_string(),
                format!("--metrics-port={}", free_port()?),
                format!("--health-probe-port={health}"),
                format!("--instance-types-file-path={}", types_file.display()),
                format!("--batch-idle-duration={}ms", options.batch_idle.as_millis()),
                format!("--batch-max-duration={}ms", options.batch_max.as_millis()),
                "--log-level=debug".to_string(),
            ]);
        let mut process = ChildGuard::spawn("karpenter", cmd, &dir.join("karpenter.log"))?;
        let ready = wait_until("Karpenter", READY, || {
            process.check_alive().is_ok() && http_ok(health, "/readyz")
        });
        if ready.is_err() {
            process.check_alive()?;
            return Err(BedError::NotReady {
                what: "karpenter".into(),
                seconds: READY.as_secs(),
                log: process.log_path().to_path_buf(),
                tail: process.last_lines(20),
            });
        }

        kube.apply(&node_class(options.registration_delay).to_string())?;
        // Nothing in the KWOK provider reconciles its node class's status, and a NodePool whose
        // class is not Ready launches nothing: the test bed says it is.
        let ready_status = json!({"status": {"conditions": [{"type": "Ready", "status": "True",
            "reason": "Ready", "message": "", "observedGeneration": 1,
            "lastTransitionTime": rfc3339_now()}]}});
        kube.patch_status(
            "kwoknodeclasses.karpenter.kwok.sh",
            NODE_CLASS,
            None,
            &ready_status.to_string(),
        )?;
        kube.apply(&node_pool(&options).to_string())?;

        let lag_kube = kube.clone();
        let mut seen = FirstSeen::default();
        let delay = options.devices_delay;
        let lag = Loop::spawn(
            "karpenter-device-lag",
            options.lag_interval,
            &dir.join("device-lag.log"),
            move || lag_tick(&lag_kube, &mut seen, &devices, delay),
        )?;

        let karpenter = Karpenter {
            _lag: lag,
            process,
            kube,
            dir,
            gpus_by_type: options
                .instance_types
                .iter()
                .map(|t| (t.name.clone(), t.gpus))
                .collect(),
            startup_taint: options.startup_taint,
        };
        let what = "NodePool gpu to be Ready";
        wait_until(what, READY, || {
            karpenter
                .kube
                .get_json(&["nodepools.karpenter.sh", NODE_POOL])
                .is_ok_and(|p| condition_true(&p, "Ready"))
        })
        .map_err(|e| match e {
            BedError::Timeout { what, seconds } => BedError::NotReady {
                what,
                seconds,
                log: karpenter.process.log_path().to_path_buf(),
                tail: karpenter.process.last_lines(20),
            },
            other => other,
        })?;
        Ok(karpenter)
    }
}

impl Karpenter {
    /// Karpenter's log, the instance types file and the lag loop's log are here.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// An error if Karpenter died.
    pub fn check_alive(&mut self) -> Result<(), BedError> {
        self.process.check_alive()
    }

    /// The NodeClaims that exist now.
    pub fn node_claims(&self) -> Result<Vec<NodeClaimInfo>, BedError> {
        let list = self.kube.get_json(&["nodeclaims.karpenter.sh"])?;
        let mut out: Vec<NodeClaimInfo> = list["items"]
            .as_array()
            .map(|items| {
                items
                    .iter()
                    .filter_map(|c| {
                        Some(NodeClaimInfo {
                            name: c["metadata"]["name"].as_str()?.to_string(),
                            instance_type: c["metadata"]["labels"][INSTANCE_TYPE_LABEL]
                                .as_str()
                                .map(str::to_string),
                            node: c["status"]["nodeName"].as_str().map(str::to_string),
                            created: c["metadata"]["creationTimestamp"]
                                .as_str()
                                .map(str::to_string),
                            launched: condition_true(c, "Launched"),
                            registered: condition_true(c, "Registered"),
                            initialized: condition_true(c, "Initialized"),
                        })
                    })
                    .collect()
            })
            .unwrap_or_default();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }
}

impl Autoscaler for Karpenter {
    fn name(&self) -> String {
        if self.startup_taint {
            "karpenter + startup taint".into()
        } else {
            "karpenter".into()
        }
    }

    fn instances(&self) -> Result<Vec<Instance>, BedError> {
        Ok(self
            .node_claims()?
            .into_iter()
            .map(|c| Instance {
                gpus: c
                    .instance_type
                    .as_ref()
                    .and_then(|t| self.gpus_by_type.get(t))
                    .copied()
                    .unwrap_or(0),
                name: c.name,
                created: c.created,
                node: c.node,
            })
            .collect())
    }
}

fn condition_true(object: &Value, kind: &str) -> bool {
    object["status"]["conditions"].as_array().is_some_and(|cs| {
        cs.iter()
            .any(|c| c["type"] == kind && c["status"] == "True")
    })
}

/// One pass of the device-plugin lag over Karpenter's nodes.
fn lag_tick(
    kube: &Kubectl,
    seen: &mut FirstSeen,
    devices: &BTreeMap<String, BTreeMap<String, String>>,
    delay: Duration,
) -> Result<(), BedError> {
    let list = kube.get_json(&["nodes", "-l", "karpenter.sh/nodepool"])?;
    let now = Instant::now();
    let mut live = HashSet::new();
    let mut actions = Vec::new();
    for item in list["items"].as_array().into_iter().flatten() {
        let Some(name) = item["metadata"]["name"].as_str() else {
            continue;
        };
        live.insert(name.to_string());
        // From its registration, as the Cluster API provider counts from the Node it creates;
        // first seen by a slow pass alone ran late.
        let age = seen.age(name, now).max(age_since_created(item));
        let Some(node) = NodeView::from_json(item, age) else {
            continue;
        };
        let Some(wanted) = node
            .labels
            .get(INSTANCE_TYPE_LABEL)
            .and_then(|t| devices.get(t))
        else {
            continue;
        };
        actions.extend(device_actions(&node, wanted, delay));
    }
    seen.retain(&live);
    // Concurrently, as the Cluster API provider does: the same lag for both autoscalers.
    let errors = execute_all(kube, &actions);
    if errors.is_empty() {
        Ok(())
    } else {
        Err(BedError::Actions(errors))
    }
}

/// The policy that makes a Node Karpenter's KWOK provider creates register without its devices
/// (`resources` removed from capacity and allocatable), as a real node does before its device
/// plugin registers. In the apiserver, so no scheduler ever sees the GPUs early.
// Long on purpose: Karpenter's KWOK provider's stages written out one after another, so they can be read against its source.
fn lag_policy(resources: &[String]) -> Value {
    let mut parts: Vec<String> = Vec::new();
    for r in resources {
        let escaped = r.replace('~', "~0").replace('/', "~1");
        for field in ["allocatable", "capacity"] {
            parts.push(format!(
                "(has(object.status) && has(object.status.{field}) && '{r}' in object.status.{field} ? \
                 [JSONPatch{{op: \"remove\", path: \"/status/{field}/{escaped}\"}}] : [])"
            ));
        }
    }
    let expression = if parts.is_empty() {
        "[]".to_string()
    } else {
        parts.join(" + ")
    };
    json!({"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "admissionregistration.k8s.io/v1beta1", "kind": "MutatingAdmissionPolicy",
         "metadata": {"name": POLICY},
         "spec": {
            "failurePolicy": "Fail",
            "reinvocationPolicy": "Never",
            "matchConstraints": {"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"],
                "operations": ["CREATE"], "resources": ["nodes"]}]},
            "matchConditions": [{"name": "karpenter-node",
                "expression": "has(object.metadata.labels) && 'karpenter.sh/nodepool' in object.metadata.labels"}],
            "mutations": [{"patchType": "JSONPatch", "jsonPatch": {"expression": expression}}],
         }},
        {"apiVersion": "admissionregistration.k8s.io/v1beta1", "kind": "MutatingAdmissionPolicyBinding",
         "metadata": {"name": POLICY},
         "spec": {"policyName": POLICY}},
    ]})
}

/// Creates a throwaway Node labelled like Karpenter's and checks the policy removed its devices:
/// policies apply asynchronously after creation, so this also waits until it is in force.
fn prove_the_policy_strips(kube: &Kubectl, resources: &[String]) -> Result<(), BedError> {
    let Some(resource) = resources.first() else {
        return Ok(());
    };
    let name = "gpuops-testbed-policy-probe";
    let node = json!({"apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {"karpenter.sh/nodepool": "probe"}},
        "spec": {"unschedulable": true},
        "status": {"capacity": {resource.as_str(): "1"}, "allocatable": {resource.as_str(): "1"}}});
    let mut last = String::new();
    let proved = wait_until("the device-plugin-lag policy to be in force", READY, || {
        let _ = kube.run(&["delete", "node", name, "--ignore-not-found"], None);
        if kube
            .run(&["create", "-f", "-"], Some(&node.to_string()))
            .is_err()
        {
            return false;
        }
        match kube.get_json(&["node", name]) {
            Ok(n) => {
                last = n["status"]["allocatable"].to_string();
                n["status"]["allocatable"].get(resource.as_str()).is_none()
                    && n["status"]["capacity"].get(resource.as_str()).is_none()
            }
            Err(_) => false,
        }
    });
    let _ = kube.run(&["delete", "node", name, "--ignore-not-found"], None);
    proved.map_err(|_| BedError::Timeout {
        what: format!(
            "the MutatingAdmissionPolicy {POLICY} to strip {resource} from new Karpenter nodes \
             (last allocatable seen: {last})"
        ),
        seconds: READY.as_secs(),
    })
}

fn node_class(registration_delay: Duration) -> Value {
    json!({"apiVersion": "karpenter.kwok.sh/v1alpha1", "kind": "KWOKNodeClass",
        "metadata": {"name": NODE_CLASS},
        // The CRD takes whole seconds, minutes or hours only.
        "spec": {"nodeRegistrationDelay": format!("{}s", registration_delay.as_secs())}})
}

fn node_pool(options: &KarpenterOptions) -> Value {
    let names: Vec<&str> = options
        .instance_types
        .iter()
        .map(|t| t.name.as_str())
        .collect();
    let mut spec = json!({
        "nodeClassRef": {"group": "karpenter.kwok.sh", "kind": "KWOKNodeClass", "name": NODE_CLASS},
        "requirements": [
            {"key": INSTANCE_TYPE_LABEL, "operator": "In", "values": names},
            {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["on-demand"]},
        ],
        "expireAfter": "Never",
    });
    if options.startup_taint {
        spec["startupTaints"] = json!([{"key": STARTUP_TAINT, "effect": "NoSchedule"}]);
    }
    let consolidate_after = match options.consolidate_after {
        Some(d) => format!("{}s", d.as_secs()),
        None => "Never".into(),
    };
    json!({"apiVersion": "karpenter.sh/v1", "kind": "NodePool",
    "metadata": {"name": NODE_POOL},
    "spec": {
        "template": {"spec": spec},
        "disruption": {"consolidationPolicy": "WhenEmptyOrUnderutilized",
            "consolidateAfter": consolidate_after},
    }})
}

fn karpenter_bin() -> Result<PathBuf, BedError> {
    let dir = std::env::var_os(KARPENTER_BIN_ENV)
        .map(PathBuf::from)
        .ok_or(BedError::NoAddon {
            var: KARPENTER_BIN_ENV,
            part: "karpenter",
        })?;
    for name in ["karpenter-kwok", "crds"] {
        if !dir.join(name).exists() {
            return Err(BedError::MissingBinary {
                name: name.to_string(),
                dir,
            });
        }
    }
    Ok(dir)
}

/// Now as RFC 3339 UTC, for status conditions (the apiserver takes the microseconds too).
fn rfc3339_now() -> String {
    crate::infra::rfc3339_micro(std::time::SystemTime::now())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn the_instance_types_file_carries_gpus_and_one_on_demand_offering() {
        let t = InstanceType::gpu("gpu-h100-8x", "nvidia.com/gpu", 8, 98.32).to_json();
        assert_eq!(t["resources"]["nvidia.com/gpu"], "8");
        assert_eq!(t["resources"]["pods"], "110");
        assert_eq!(t["offerings"][0]["Price"], 98.32);
        let mig = InstanceType::from(&Offer::h100_mig_1g());
        assert_eq!(mig.gpus, 8);
        assert_eq!(mig.to_json()["resources"]["nvidia.com/mig-1g.10gb"], "56");
        assert!(mig.to_json()["resources"].get("nvidia.com/gpu").is_none());
        assert_eq!(
            t["offerings"][0]["Requirements"][0]["values"][0],
            "on-demand"
        );
    }

    #[test]
    fn the_policy_removes_each_device_resource_from_both_maps_when_present() {
        let p = lag_policy(&["nvidia.com/gpu".into()]);
        let expr = p["items"][0]["spec"]["mutations"][0]["jsonPatch"]["expression"]
            .as_str()
            .unwrap();
        assert!(
            expr.contains("\"/status/allocatable/nvidia.com~1gpu\""),
            "{expr}"
        );
        assert!(
            expr.contains("\"/status/capacity/nvidia.com~1gpu\""),
            "{expr}"
        );
        assert!(
            expr.contains("'nvidia.com/gpu' in object.status.allocatable"),
            "{expr}"
        );
        assert_eq!(
            lag_policy(&[])["items"][0]["spec"]["mutations"][0]["jsonPatch"]["expression"],
            "[]"
        );
    }

    #[test]
    fn the_node_pool_declares_the_startup_taint_only_when_asked() {
        let mut o = KarpenterOptions::default();
        assert!(
            node_pool(&o)["spec"]["template"]["spec"]
                .get("startupTaints")
                .is_none()
        );
        o.startup_taint = true;
        assert_eq!(
            node_pool(&o)["spec"]["template"]["spec"]["startupTaints"][0]["key"],
            STARTUP_TAINT
        );
        assert_eq!(
            node_pool(&o)["spec"]["disruption"]["consolidateAfter"],
            "Never"
        );
    }
}
