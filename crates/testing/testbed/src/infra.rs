//! gpuops's test infrastructure provider for Cluster API: CRDs (`GpuopsTestCluster`,
//! `GpuopsTestMachine`, `GpuopsTestMachineTemplate`, `GpuopsTestControlPlane`) and a level-triggered
//! reconciler that turns each infra machine into a KWOK Node after a boot delay, with its GPU
//! devices appearing in allocatable after a second delay (the device plugin registering after the
//! node is Ready, as in real clusters) and the startup taint removed at that moment.
//!
//! The device-lag half ([`device_actions`]) is shared with the Karpenter runner, so both
//! autoscalers see the same node lifecycle.

use crate::BedError;
use crate::kubectl::Kubectl;
use serde_json::{Value, json};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Quantities, labels or devices by name, as a spec and a Node carry them.
type StringMap = BTreeMap<String, String>;

/// The startup taint gpuops's agent removes once every configured device is advertised.
pub const STARTUP_TAINT: &str = "gpuops.io/gpu-not-ready";
/// Node label naming the `GpuopsTestMachine` a Node was made for.
pub const MACHINE_LABEL: &str = "gpuops.io/test-machine";
/// Prefix of the providerID of the provider's nodes: `gpuops-test://<namespace>/<name>`.
pub const PROVIDER_ID_PREFIX: &str = "gpuops-test://";

/// Node annotation: when the test bed removed the startup taint (RFC 3339, microseconds).
pub const TAINT_REMOVED_AT: &str = "gpuops.io/test-startup-taint-removed-at";

const INFRA_GROUP: &str = "infrastructure.cluster.x-k8s.io";
const NAMESPACE_LABEL: &str = "gpuops.io/test-machine-namespace";
/// The provider's CRDs (tests/k8s/capi/provider-crds.yaml).
pub(crate) const PROVIDER_CRDS: &str =
    include_str!("../../../../tests/k8s/capi/provider-crds.yaml");

/// How one test node comes up: what it offers at registration, which devices appear later, and
/// when. Stored as the `spec` of a `GpuopsTestMachine` (and `spec.template.spec` of a template).
#[derive(Debug, Clone, PartialEq)]
pub struct NodeShape {
    /// Allocatable from registration on (cpu, memory, pods, ...).
    pub resources: BTreeMap<String, String>,
    /// Device resources (`nvidia.com/gpu`, `nvidia.com/mig-1g.10gb`, `nvidia.com/gpu.shared`, ...)
    /// added to capacity and allocatable `devices_delay` after the Node registered.
    pub devices: BTreeMap<String, String>,
    /// Node labels (GPU product, instance type, ...).
    pub labels: BTreeMap<String, String>,
    /// Register with `gpuops.io/gpu-not-ready:NoSchedule`, removed when the devices appear.
    pub startup_taint: bool,
    /// From the infra machine's creation to provisioned + Node registered.
    pub boot_delay: Duration,
    /// From Node registration to the devices in allocatable.
    pub devices_delay: Duration,
    /// `namespace/name` of a mig-parted ConfigMap (key `config.yaml`): the node's MIG devices
    /// then follow its `nvidia.com/mig.config` label, `devices_delay` after the label last
    /// changed, as the config of that name yields them on `nvidia.com/gpu.count` GPUs. The
    /// test provider standing in for gpuops's agent (harness nodes run the real one).
    pub mig_config_map: Option<String>,
}

impl NodeShape {
    /// A GPU node: 64 CPUs, 512 GiB, 110 pods, `count` of `resource`, the GPU product label, a
    /// 2 s boot and devices 3 s after registration, registering with the startup taint.
    pub fn gpu(product: &str, resource: &str, count: u32) -> NodeShape {
        NodeShape {
            resources: [("cpu", "64"), ("memory", "512Gi"), ("pods", "110")]
                .into_iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            devices: [(resource.to_string(), count.to_string())].into(),
            labels: [
                ("nvidia.com/gpu.product".to_string(), product.to_string()),
                ("nvidia.com/gpu.count".to_string(), count.to_string()),
            ]
            .into(),
            startup_taint: true,
            boot_delay: Duration::from_secs(2),
            devices_delay: Duration::from_secs(3),
            mig_config_map: None,
        }
    }

    /// The JSON stored in the CRDs.
    pub fn to_spec(&self) -> Value {
        let mut spec = json!({
            "resources": self.resources,
            "devices": self.devices,
            "labels": self.labels,
            "startupTaint": self.startup_taint,
            "bootDelayMs": millis(self.boot_delay),
            "devicesDelayMs": millis(self.devices_delay),
        });
        if let Some(cm) = &self.mig_config_map {
            spec["migConfigMap"] = json!(cm);
        }
        spec
    }

    /// Reads a `GpuopsTestMachine`'s `spec`; the error names the field at fault.
    pub fn from_spec(spec: &Value) -> Result<NodeShape, BedError> {
        let Value::Object(map) = spec else {
            return Err(spec_error(
                "spec".into(),
                format!("want an object, got {spec}"),
            ));
        };
        let known = [
            "resources",
            "devices",
            "labels",
            "startupTaint",
            "bootDelayMs",
            "devicesDelayMs",
            "migConfigMap",
            "providerID",
        ];
        if let Some(k) = map.keys().find(|k| !known.contains(&k.as_str())) {
            return Err(spec_error(
                format!("spec.{k}"),
                format!("unknown field (known: {})", known.join(", ")),
            ));
        }
        let devices = string_map(spec, "devices")?;
        if let Some(k) = devices.keys().find(|k| !k.contains('/')) {
            return Err(spec_error(
                format!("spec.devices.{k}"),
                "a device is an extended resource named domain/name, like nvidia.com/gpu".into(),
            ));
        }
        Ok(NodeShape {
            resources: string_map(spec, "resources")?,
            devices,
            labels: string_map(spec, "labels")?,
            startup_taint: match spec.get("startupTaint") {
                None => false,
                Some(Value::Bool(b)) => *b,
                Some(other) => {
                    return Err(spec_error(
                        "spec.startupTaint".into(),
                        format!("want true or false, got {other}"),
                    ));
                }
            },
            boot_delay: duration_ms(spec, "bootDelayMs")?,
            devices_delay: duration_ms(spec, "devicesDelayMs")?,
            mig_config_map: match spec.get("migConfigMap") {
                None | Some(Value::Null) => None,
                Some(Value::String(s))
                    if s.split_once('/')
                        .is_some_and(|(a, b)| !a.is_empty() && !b.is_empty()) =>
                {
                    Some(s.clone())
                }
                Some(other) => {
                    return Err(spec_error(
                        "spec.migConfigMap".into(),
                        format!("want \"namespace/name\" of a ConfigMap, got {other}"),
                    ));
                }
            },
        })
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

fn string_map(spec: &Value, field: &str) -> Result<StringMap, BedError> {
    match spec.get(field) {
        None | Some(Value::Null) => Ok(BTreeMap::new()),
        Some(Value::Object(m)) => m
            .iter()
            .map(|(k, v)| match v {
                Value::String(s) => Ok((k.clone(), s.clone())),
                Value::Number(n) if n.is_u64() => Ok((k.clone(), n.to_string())),
                other => Err(spec_error(
                    format!("spec.{field}.{k}"),
                    format!("want a string (a quantity or label value), got {other}"),
                )),
            })
            .collect(),
        Some(other) => Err(spec_error(
            format!("spec.{field}"),
            format!("want an object, got {other}"),
        )),
    }
}

fn duration_ms(spec: &Value, field: &str) -> Result<Duration, BedError> {
    match spec.get(field) {
        None => Ok(Duration::ZERO),
        Some(v) => v.as_u64().map(Duration::from_millis).ok_or_else(|| {
            spec_error(
                format!("spec.{field}"),
                format!("want a whole number of milliseconds >= 0, got {v}"),
            )
        }),
    }
}

/// A spec problem at `field`.
fn spec_error(field: String, problem: String) -> BedError {
    BedError::Spec { field, problem }
}

/// An infra machine as the reconciler sees it.
#[derive(Debug, Clone)]
pub(crate) struct MachineView {
    pub namespace: String,
    pub name: String,
    pub provisioned: bool,
    pub error: Option<String>,
    /// The spec read, or why it was rejected (shared: the view is cloned, the error is not).
    pub shape: Result<NodeShape, Arc<BedError>>,
    /// Since the reconciler first saw it.
    pub age: Duration,
}

/// A Node as the reconcilers see it.
#[derive(Debug, Clone)]
pub(crate) struct NodeView {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub taints: Vec<Value>,
    pub allocatable: BTreeMap<String, String>,
    /// Since the reconciler first saw it (or created it).
    pub age: Duration,
    /// Since it first saw its `nvidia.com/mig.config` label at the current value.
    pub label_age: Duration,
}

impl NodeView {
    pub(crate) fn from_json(node: &Value, age: Duration) -> Option<NodeView> {
        let name = node["metadata"]["name"].as_str()?.to_string();
        let strings = |v: &Value| -> BTreeMap<String, String> {
            v.as_object()
                .map(|m| {
                    m.iter()
                        .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
                        .collect()
                })
                .unwrap_or_default()
        };
        Some(NodeView {
            name,
            labels: strings(&node["metadata"]["labels"]),
            taints: node["spec"]["taints"]
                .as_array()
                .cloned()
                .unwrap_or_default(),
            allocatable: strings(&node["status"]["allocatable"]),
            age,
            label_age: age,
        })
    }

    fn has_taint(&self, key: &str) -> bool {
        self.taints.iter().any(|t| t["key"].as_str() == Some(key))
    }
}

/// What a reconciler does to converge.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Action {
    /// Mark an infra cluster provisioned / a control plane initialized (`resource` is the
    /// kubectl resource name).
    Ready {
        resource: &'static str,
        namespace: String,
        name: String,
        status: Value,
    },
    /// Set the providerID and mark the infra machine provisioned.
    Provision {
        namespace: String,
        name: String,
        provider_id: String,
    },
    /// Record why an infra machine cannot be provisioned (its status.gpuopsError).
    Reject {
        namespace: String,
        name: String,
        message: String,
    },
    CreateNode(Value),
    /// Merge-patch the node's status (devices into capacity and allocatable).
    PatchNodeStatus {
        name: String,
        patch: Value,
    },
    /// Replace the node's taints (the startup taint removed).
    SetTaints {
        name: String,
        taints: Vec<Value>,
    },
    DeleteNode(String),
}

/// The Node the provider registers for an infra machine: no devices yet, the startup taint if
/// configured, managed by KWOK (which makes it Ready and runs its pods).
pub(crate) fn node_for(machine: &MachineView, shape: &NodeShape) -> Value {
    let mut labels = shape.labels.clone();
    labels.insert("kubernetes.io/hostname".into(), machine.name.clone());
    labels.insert("type".into(), "kwok".into());
    labels.insert(MACHINE_LABEL.into(), machine.name.clone());
    labels.insert(NAMESPACE_LABEL.into(), machine.namespace.clone());
    let taints: Vec<Value> = if shape.startup_taint {
        vec![json!({"key": STARTUP_TAINT, "effect": "NoSchedule"})]
    } else {
        Vec::new()
    };
    json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": machine.name,
            "labels": labels,
            "annotations": {"kwok.x-k8s.io/node": "fake"},
        },
        "spec": {"providerID": provider_id(machine), "taints": taints},
        "status": {"capacity": shape.resources, "allocatable": shape.resources},
    })
}

fn provider_id(machine: &MachineView) -> String {
    format!("{PROVIDER_ID_PREFIX}{}/{}", machine.namespace, machine.name)
}

/// The device-plugin lag of one node: once it is `delay` old, its devices go into capacity and
/// allocatable; once they are there, the startup taint goes (as gpuops's agent does).
pub(crate) fn device_actions(
    node: &NodeView,
    devices: &BTreeMap<String, String>,
    delay: Duration,
) -> Vec<Action> {
    let advertised = devices
        .iter()
        .all(|(k, v)| node.allocatable.get(k) == Some(v));
    if !advertised {
        if node.age < delay {
            return Vec::new();
        }
        return vec![Action::PatchNodeStatus {
            name: node.name.clone(),
            patch: json!({"status": {"capacity": devices, "allocatable": devices}}),
        }];
    }
    if node.has_taint(STARTUP_TAINT) {
        let taints = node
            .taints
            .iter()
            .filter(|t| t["key"].as_str() != Some(STARTUP_TAINT))
            .cloned()
            .collect();
        return vec![Action::SetTaints {
            name: node.name.clone(),
            taints,
        }];
    }
    Vec::new()
}

/// The provider's whole plan for one observation of the cluster.
#[cfg(test)]
pub(crate) fn plan(machines: &[MachineView], nodes: &[NodeView]) -> Vec<Action> {
    plan_with(machines, nodes, &HashMap::new())
}

/// The MIG devices the named config `config` yields on `gpus` GPUs, with every other
/// `nvidia.com/mig-*` the node advertises set to 0 (what the agent would advertise after
/// applying it). Later entries win per GPU, as in mig-parted; device filters are not looked at
/// (the provider has no PCI ids).
///
/// # Errors
/// The config file does not parse or has no config of that name; the message names both.
pub(crate) fn mig_devices(
    text: &str,
    origin: &str,
    config: &str,
    gpus: u32,
    advertised: &BTreeMap<String, String>,
) -> Result<StringMap, BedError> {
    let all =
        gpuops_mig::config::parse(text, origin).map_err(|e| BedError::MigConfig(Box::new(e)))?;
    let cfg = all.get(config).map_err(|source| BedError::MigConfigName {
        origin: origin.to_string(),
        source: Box::new(source),
    })?;
    let mut per_gpu: Vec<BTreeMap<String, u32>> = vec![BTreeMap::new(); gpus as usize];
    for e in &cfg.entries {
        for (i, slot) in per_gpu.iter_mut().enumerate() {
            let selected = match &e.devices {
                gpuops_mig::config::Devices::All => true,
                gpuops_mig::config::Devices::List(l) => {
                    l.contains(&u32::try_from(i).unwrap_or(u32::MAX))
                }
            };
            if selected {
                *slot = if e.mig_enabled {
                    e.mig_devices.clone()
                } else {
                    BTreeMap::new()
                };
            }
        }
    }
    let mut out: BTreeMap<String, String> = advertised
        .keys()
        .filter(|k| k.starts_with("nvidia.com/mig-"))
        .map(|k| (k.clone(), "0".to_string()))
        .collect();
    let mut counts: BTreeMap<String, u32> = BTreeMap::new();
    for g in &per_gpu {
        for (p, n) in g {
            *counts.entry(format!("nvidia.com/mig-{p}")).or_insert(0) += n;
        }
    }
    out.extend(counts.into_iter().map(|(k, v)| (k, v.to_string())));
    Ok(out)
}

/// The provider's whole plan for one observation of the cluster, with the text of the
/// mig-parted ConfigMaps the shapes name (`namespace/name` -> text).
pub(crate) fn plan_with(
    machines: &[MachineView],
    nodes: &[NodeView],
    configs: &HashMap<String, String>,
) -> Vec<Action> {
    let mut actions = Vec::new();
    let by_name: HashMap<&str, &NodeView> = nodes.iter().map(|n| (n.name.as_str(), n)).collect();
    let mut wanted: HashSet<(String, String)> = HashSet::new();
    for m in machines {
        wanted.insert((m.namespace.clone(), m.name.clone()));
        let shape = match &m.shape {
            Ok(shape) => shape,
            Err(e) => {
                let message = e.to_string();
                if m.error.as_deref() != Some(message.as_str()) {
                    actions.push(Action::Reject {
                        namespace: m.namespace.clone(),
                        name: m.name.clone(),
                        message: message.clone(),
                    });
                }
                continue;
            }
        };
        match by_name.get(m.name.as_str()) {
            None if m.age >= shape.boot_delay => {
                actions.push(Action::CreateNode(node_for(m, shape)));
            }
            None => {}
            Some(node) => match &shape.mig_config_map {
                None => actions.extend(device_actions(node, &shape.devices, shape.devices_delay)),
                Some(cm) => {
                    let label = node.labels.get("nvidia.com/mig.config");
                    let gpus = node
                        .labels
                        .get("nvidia.com/gpu.count")
                        .and_then(|v| v.parse().ok())
                        .unwrap_or(1);
                    let mut devices = shape.devices.clone();
                    // No label or no ConfigMap yet: nothing but the shape's other devices.
                    if let (Some(label), Some(text)) = (label, configs.get(cm)) {
                        match mig_devices(
                            text,
                            &format!("ConfigMap {cm} key config.yaml"),
                            label,
                            gpus,
                            &node.allocatable,
                        ) {
                            Ok(d) => devices.extend(d),
                            Err(e) => {
                                eprintln!("test provider: node {}: {e}", node.name);
                                continue;
                            }
                        }
                    }
                    actions.extend(device_actions(
                        &NodeView {
                            age: node.label_age,
                            ..(*node).clone()
                        },
                        &devices,
                        shape.devices_delay,
                    ));
                }
            },
        }
        if m.age >= shape.boot_delay && !m.provisioned {
            actions.push(Action::Provision {
                namespace: m.namespace.clone(),
                name: m.name.clone(),
                provider_id: provider_id(m),
            });
        }
    }
    for n in nodes {
        if let (Some(name), Some(ns)) = (n.labels.get(MACHINE_LABEL), n.labels.get(NAMESPACE_LABEL))
            && !wanted.contains(&(ns.clone(), name.clone()))
        {
            actions.push(Action::DeleteNode(n.name.clone()));
        }
    }
    actions
}

/// Carries out one action with kubectl.
pub(crate) fn execute(kube: &Kubectl, action: &Action) -> Result<(), BedError> {
    match action {
        Action::Ready {
            resource,
            namespace,
            name,
            status,
        } => {
            let patch = json!({ "status": status }).to_string();
            kube.patch_status(resource, name, Some(namespace), &patch)?;
        }
        Action::Provision {
            namespace,
            name,
            provider_id,
        } => {
            let resource = format!("gpuopstestmachines.{INFRA_GROUP}");
            let spec = json!({"spec": {"providerID": provider_id}}).to_string();
            kube.run(
                &[
                    "patch",
                    &resource,
                    name,
                    "-n",
                    namespace,
                    "--type=merge",
                    "-p",
                    &spec,
                ],
                None,
            )?;
            // v1beta2 contract: status.initialization.provisioned; v1beta1: status.ready.
            let status = json!({"status": {"initialization": {"provisioned": true}, "ready": true,
                "addresses": [{"type": "Hostname", "address": name}]}})
            .to_string();
            kube.patch_status(&resource, name, Some(namespace), &status)?;
        }
        Action::Reject {
            namespace,
            name,
            message,
        } => {
            let resource = format!("gpuopstestmachines.{INFRA_GROUP}");
            let status = json!({"status": {"gpuopsError": message}}).to_string();
            kube.patch_status(&resource, name, Some(namespace), &status)?;
        }
        Action::CreateNode(node) => {
            if let Err(e) = kube.run(&["create", "-f", "-"], Some(&node.to_string())) {
                // Level-triggered: a node made by an earlier tick is fine.
                if !e.to_string().contains("AlreadyExists")
                    && !e.to_string().contains("already exists")
                {
                    return Err(e);
                }
            }
        }
        Action::PatchNodeStatus { name, patch } => {
            kube.patch_status("node", name, None, &patch.to_string())?;
        }
        Action::SetTaints { name, taints } => {
            // The time goes with it: an emptied taint list leaves no managedFields entry, and
            // the benchmark's stages need when the node became schedulable.
            let patch =
                json!({"metadata": {"annotations": {TAINT_REMOVED_AT: now_rfc3339_micro()}},
                "spec": {"taints": taints}})
                .to_string();
            kube.run(&["patch", "node", name, "--type=merge", "-p", &patch], None)?;
        }
        Action::DeleteNode(name) => {
            kube.run(
                &["delete", "node", name, "--ignore-not-found", "--wait=false"],
                None,
            )?;
        }
    }
    Ok(())
}

/// Seconds since the Unix epoch of an RFC 3339 UTC time (`2026-12-01T13:45:00Z`, or with a
/// fraction, as in an Event's `eventTime`); `None` for anything else.
pub fn parse_rfc3339(text: &str) -> Option<f64> {
    let t = text.strip_suffix('Z')?;
    let (date, time) = t.split_once('T')?;
    let mut d = date.splitn(3, '-').map(|x| x.parse::<i64>().ok());
    let (y, m, day) = (d.next()??, d.next()??, d.next()??);
    let (hms, frac) = match time.split_once('.') {
        Some((hms, f)) if !f.is_empty() && f.bytes().all(|b| b.is_ascii_digit()) => {
            (hms, format!("0.{f}").parse::<f64>().ok()?)
        }
        Some(_) => return None,
        None => (time, 0.0),
    };
    let mut h = hms.splitn(3, ':').map(|x| x.parse::<i64>().ok());
    let (hh, mm, ss) = (h.next()??, h.next()??, h.next()??);
    if !(1..=12).contains(&m) || !(1..=31).contains(&day) || hh > 23 || mm > 59 || ss > 60 {
        return None;
    }
    // Howard Hinnant's days-from-civil.
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let secs = days * 86_400 + hh * 3600 + mm * 60 + ss;
    Some(secs as f64 + frac)
}

/// How old an object is at least by its creationTimestamp: whole seconds, so counted from the
/// end of that second (an object never comes out older than it is). Zero without one.
pub(crate) fn age_since_created(object: &Value) -> Duration {
    object["metadata"]["creationTimestamp"]
        .as_str()
        .and_then(parse_rfc3339)
        .map_or(Duration::ZERO, |c| {
            Duration::from_secs_f64((unix_now() - c - 1.0).max(0.0))
        })
}

fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// Now as RFC 3339 UTC with microseconds, as the apiserver writes a MicroTime.
fn now_rfc3339_micro() -> String {
    rfc3339_micro(std::time::SystemTime::now())
}

pub(crate) fn rfc3339_micro(at: std::time::SystemTime) -> String {
    let now = at.duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    let secs = now.as_secs();
    let days = i64::try_from(secs / 86_400).unwrap_or(0);
    let rem = secs % 86_400;
    // Howard Hinnant's civil-from-days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{:06}Z",
        rem / 3600,
        (rem % 3600) / 60,
        rem % 60,
        now.subsec_micros()
    )
}

/// Kubectl calls in flight at once in [`execute_all`].
const PARALLEL: usize = 8;

/// Carries out `actions`: the new Nodes first, in one kubectl call (registration is what a boot
/// delay is about), then the rest [`PARALLEL`] at a time; the errors, in order. A kubectl call
/// costs a process start and a round trip (0.3-1 s of a loaded 2-core machine): one after the
/// other, a burst of 7 machines (create node + provision each) kept the last node 9 s behind
/// its boot delay. No two actions of one pass touch the same object, so the order is free.
pub(crate) fn execute_all(kube: &Kubectl, actions: &[Action]) -> Vec<String> {
    let mut errors = Vec::new();
    let nodes: Vec<&Value> = actions
        .iter()
        .filter_map(|a| match a {
            Action::CreateNode(node) => Some(node),
            _ => None,
        })
        .collect();
    if !nodes.is_empty() {
        let list = json!({"apiVersion": "v1", "kind": "List", "items": nodes}).to_string();
        if let Err(e) = kube.run(&["create", "-f", "-"], Some(&list)) {
            // Level-triggered: nodes made by an earlier pass are fine, any other error is not.
            let text = e.to_string();
            if text
                .lines()
                .any(|l| l.contains("Error") && !l.contains("already exists"))
                || !text.contains("already exists")
            {
                errors.push(text);
            }
        }
    }
    let rest: Vec<&Action> = actions
        .iter()
        .filter(|a| !matches!(a, Action::CreateNode(_)))
        .collect();
    for chunk in rest.chunks(PARALLEL) {
        std::thread::scope(|s| {
            let handles: Vec<_> = chunk
                .iter()
                .map(|a| s.spawn(move || execute(kube, a)))
                .collect();
            for h in handles {
                match h.join() {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => errors.push(e.to_string()),
                    Err(_) => errors.push("a kubectl call panicked".to_string()),
                }
            }
        });
    }
    errors
}

/// When the reconciler first saw each object (by uid or name): ages are measured from there.
#[derive(Debug, Default)]
pub(crate) struct FirstSeen(HashMap<String, Instant>);

impl FirstSeen {
    pub(crate) fn age(&mut self, key: &str, now: Instant) -> Duration {
        let at = *self.0.entry(key.to_string()).or_insert(now);
        now.saturating_duration_since(at)
    }

    /// Forgets what is gone, so the map does not grow without bound in long runs.
    pub(crate) fn retain(&mut self, live: &HashSet<String>) {
        self.0.retain(|k, _| live.contains(k));
    }
}

/// The provider's state between ticks: only first-seen times; everything else is read back.
#[derive(Debug, Default)]
pub(crate) struct Provider {
    machines: FirstSeen,
    nodes: FirstSeen,
    /// `node=label` of each node's `nvidia.com/mig.config`: MIG devices follow the label.
    labels: FirstSeen,
}

impl Provider {
    /// One level-triggered pass: observe, plan, act.
    pub(crate) fn tick(&mut self, kube: &Kubectl) -> Result<(), BedError> {
        // Both lists at once: each is a kubectl process, and a pass is only as quick as they are.
        let kinds = format!(
            "gpuopstestclusters.{INFRA_GROUP},gpuopstestcontrolplanes.controlplane.cluster.x-k8s.io,gpuopstestmachines.{INFRA_GROUP}"
        );
        let (list, nodes) = std::thread::scope(|s| {
            let list = s.spawn(|| kube.get_json(&[&kinds, "-A"]));
            // Only the provider's own nodes: a test bed may hold a thousand other KWOK nodes.
            let nodes = kube.get_json(&["nodes", "-l", MACHINE_LABEL]);
            (list.join(), nodes)
        });
        let list = list.map_err(|_| BedError::Panicked {
            what: "listing the provider's objects",
        })??;
        let nodes = nodes?;
        let now = Instant::now();
        let mut items = list["items"].as_array().cloned().unwrap_or_default();
        items.extend(nodes["items"].as_array().cloned().unwrap_or_default());
        let mut actions = Vec::new();
        let mut machines = Vec::new();
        let mut nodes = Vec::new();
        let (mut live_m, mut live_n, mut live_l) = (HashSet::new(), HashSet::new(), HashSet::new());
        for item in &items {
            let ns = item["metadata"]["namespace"]
                .as_str()
                .unwrap_or("")
                .to_string();
            let name = item["metadata"]["name"].as_str().unwrap_or("").to_string();
            match item["kind"].as_str() {
                Some("GpuopsTestCluster")
                    if item["status"]["initialization"]["provisioned"] != json!(true) =>
                {
                    actions.push(Action::Ready {
                        resource: "gpuopstestclusters.infrastructure.cluster.x-k8s.io",
                        namespace: ns,
                        name,
                        status: json!({"initialization": {"provisioned": true}, "ready": true}),
                    });
                }
                Some("GpuopsTestControlPlane")
                    if item["status"]["initialization"]["controlPlaneInitialized"]
                        != json!(true) =>
                {
                    actions.push(Action::Ready {
                        resource: "gpuopstestcontrolplanes.controlplane.cluster.x-k8s.io",
                        namespace: ns,
                        name,
                        status: json!({"initialization": {"controlPlaneInitialized": true},
                            "initialized": true, "ready": true}),
                    });
                }
                Some("GpuopsTestMachine") => {
                    let uid = item["metadata"]["uid"]
                        .as_str()
                        .unwrap_or(&name)
                        .to_string();
                    // From its creation, as Karpenter's KWOK provider counts from the launch:
                    // first seen by a slow pass alone ran up to 3 s late. The timestamp has
                    // whole seconds, so its end is used: a machine never boots early.
                    let age = self.machines.age(&uid, now).max(age_since_created(item));
                    live_m.insert(uid);
                    machines.push(MachineView {
                        provisioned: item["status"]["initialization"]["provisioned"] == json!(true),
                        error: item["status"]["gpuopsError"].as_str().map(str::to_string),
                        shape: NodeShape::from_spec(&item["spec"]).map_err(Arc::new),
                        namespace: ns,
                        name,
                        age,
                    });
                }
                Some("Node") => {
                    let age = self.nodes.age(&name, now);
                    let label = format!(
                        "{name}={}",
                        item["metadata"]["labels"]["nvidia.com/mig.config"]
                            .as_str()
                            .unwrap_or("")
                    );
                    let label_age = self.labels.age(&label, now);
                    live_l.insert(label);
                    live_n.insert(name);
                    if let Some(mut view) = NodeView::from_json(item, age) {
                        view.label_age = label_age.min(age);
                        nodes.push(view);
                    }
                }
                _ => {}
            }
        }
        self.machines.retain(&live_m);
        self.nodes.retain(&live_n);
        self.labels.retain(&live_l);
        let mut configs = HashMap::new();
        for cm in machines
            .iter()
            .filter_map(|m| m.shape.as_ref().ok()?.mig_config_map.clone())
            .collect::<HashSet<_>>()
        {
            let (ns, name) = cm.split_once('/').unwrap_or(("default", &cm));
            // A ConfigMap not there yet: the node gets its MIG devices once it is.
            if let Ok(text) = kube.run(
                &[
                    "get",
                    "configmap",
                    name,
                    "-n",
                    ns,
                    "-o",
                    "jsonpath={.data.config\\.yaml}",
                ],
                None,
            ) {
                configs.insert(cm, text);
            }
        }
        actions.extend(plan_with(&machines, &nodes, &configs));
        for action in &actions {
            if let Action::CreateNode(node) = action
                && let Some(name) = node["metadata"]["name"].as_str()
            {
                // Device delays count from registration, which is now.
                self.nodes.age(name, Instant::now());
            }
        }
        let errors = execute_all(kube, &actions);
        if errors.is_empty() {
            Ok(())
        } else {
            Err(BedError::Actions(errors))
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn machine(name: &str, age_ms: u64, shape: NodeShape) -> MachineView {
        MachineView {
            namespace: "default".into(),
            name: name.into(),
            provisioned: false,
            error: None,
            shape: Ok(shape),
            age: Duration::from_millis(age_ms),
        }
    }

    fn node_of(m: &MachineView, age_ms: u64) -> NodeView {
        let shape = m.shape.as_ref().unwrap().clone();
        NodeView::from_json(&node_for(m, &shape), Duration::from_millis(age_ms)).unwrap()
    }

    #[test]
    fn an_age_by_creation_never_comes_out_older_than_the_object() {
        let ago = |secs: u64| {
            let at = std::time::SystemTime::now() - Duration::from_secs(secs);
            json!({"metadata": {"creationTimestamp": rfc3339_micro(at)}})
        };
        let age = age_since_created(&ago(10));
        assert!(age <= Duration::from_secs(10), "{age:?}");
        assert!(age >= Duration::from_secs(8), "{age:?}");
        assert_eq!(age_since_created(&ago(0)), Duration::ZERO);
        assert_eq!(age_since_created(&json!({"metadata": {}})), Duration::ZERO);
        assert_eq!(
            age_since_created(&json!({"metadata": {"creationTimestamp": "yesterday"}})),
            Duration::ZERO
        );
        let stamp =
            rfc3339_micro(std::time::UNIX_EPOCH + Duration::from_micros(1_796_132_700_250_000));
        assert_eq!(stamp, "2026-12-01T13:45:00.250000Z");
    }

    #[test]
    fn a_shape_survives_its_json() {
        let mut shape = NodeShape::gpu("NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu", 8);
        assert_eq!(NodeShape::from_spec(&shape.to_spec()).unwrap(), shape);
        shape.mig_config_map = Some("default/gpuops-mig-config".into());
        assert_eq!(NodeShape::from_spec(&shape.to_spec()).unwrap(), shape);
    }

    const MIG_FILE: &str = "version: v1\nmig-configs:\n  all-1g.10gb:\n  - devices: all\n    mig-enabled: true\n    mig-devices: {1g.10gb: 7}\n  gpuops-abcd:\n  - devices: [0]\n    mig-enabled: true\n    mig-devices: {3g.40gb: 1, 1g.10gb: 2}\n  - devices: [1]\n    mig-enabled: false\n";

    #[test]
    fn mig_devices_follow_the_named_config_and_zero_what_it_drops() {
        let advertised: BTreeMap<String, String> =
            [("nvidia.com/mig-1g.10gb".to_string(), "14".to_string())].into();
        assert_eq!(
            mig_devices(MIG_FILE, "cm", "all-1g.10gb", 2, &BTreeMap::new()).unwrap(),
            BTreeMap::from([("nvidia.com/mig-1g.10gb".into(), "14".into())])
        );
        assert_eq!(
            mig_devices(MIG_FILE, "cm", "gpuops-abcd", 2, &advertised).unwrap(),
            BTreeMap::from([
                ("nvidia.com/mig-1g.10gb".into(), "2".into()),
                ("nvidia.com/mig-3g.40gb".into(), "1".into()),
            ])
        );
        let err = mig_devices(
            MIG_FILE,
            "ConfigMap default/x",
            "gpuops-none",
            2,
            &advertised,
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("ConfigMap default/x") && err.contains("gpuops-none"),
            "{err}"
        );
        let err = mig_devices(
            "version: v1\nmig-configs: [",
            "ConfigMap default/x",
            "a",
            1,
            &advertised,
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("ConfigMap default/x"), "{err}");
    }

    #[test]
    fn mig_devices_appear_a_delay_after_the_label_changes() {
        let mut shape = NodeShape::gpu("NVIDIA-A100-SXM4-80GB", "nvidia.com/mig-1g.10gb", 7);
        shape.devices.clear();
        shape
            .labels
            .insert("nvidia.com/gpu.count".into(), "2".into());
        shape
            .labels
            .insert("nvidia.com/mig.config".into(), "all-1g.10gb".into());
        shape.mig_config_map = Some("default/cm".into());
        let mut m = machine("m", 10_000, shape);
        m.provisioned = true;
        let configs = HashMap::from([("default/cm".to_string(), MIG_FILE.to_string())]);
        let mut n = node_of(&m, 60_000);
        n.label_age = Duration::from_millis(60_000);
        let actions = plan_with(std::slice::from_ref(&m), std::slice::from_ref(&n), &configs);
        assert_eq!(
            actions,
            vec![Action::PatchNodeStatus {
                name: "m".into(),
                patch: json!({"status": {
                    "capacity": {"nvidia.com/mig-1g.10gb": "14"},
                    "allocatable": {"nvidia.com/mig-1g.10gb": "14"},
                }}),
            }]
        );
        // Relabelled 1 s ago: nothing yet; after the delay, the new config's devices.
        n.labels
            .insert("nvidia.com/mig.config".into(), "gpuops-abcd".into());
        n.allocatable
            .insert("nvidia.com/mig-1g.10gb".into(), "14".into());
        n.label_age = Duration::from_secs(1);
        assert_eq!(
            plan_with(std::slice::from_ref(&m), std::slice::from_ref(&n), &configs),
            vec![]
        );
        n.label_age = Duration::from_secs(5);
        let actions = plan_with(std::slice::from_ref(&m), std::slice::from_ref(&n), &configs);
        assert_eq!(
            actions,
            vec![Action::PatchNodeStatus {
                name: "m".into(),
                patch: json!({"status": {
                    "capacity": {"nvidia.com/mig-1g.10gb": "2", "nvidia.com/mig-3g.40gb": "1"},
                    "allocatable": {"nvidia.com/mig-1g.10gb": "2", "nvidia.com/mig-3g.40gb": "1"},
                }}),
            }]
        );
    }

    #[test]
    fn bad_shapes_name_the_field() {
        let cases = [
            (json!([]), "spec: want an object"),
            (
                json!({"devices": {"gpu": "8"}}),
                "spec.devices.gpu: a device is an extended resource",
            ),
            (
                json!({"devices": {"nvidia.com/gpu": -1}}),
                "spec.devices.nvidia.com/gpu: want a string",
            ),
            (
                json!({"resources": "cpu=8"}),
                "spec.resources: want an object",
            ),
            (
                json!({"bootDelayMs": "2s"}),
                "spec.bootDelayMs: want a whole number of milliseconds",
            ),
            (
                json!({"startupTaint": "yes"}),
                "spec.startupTaint: want true or false",
            ),
            (json!({"bootdelay": 1}), "spec.bootdelay: unknown field"),
            (
                json!({"migConfigMap": "no-namespace"}),
                "spec.migConfigMap: want \"namespace/name\"",
            ),
        ];
        for (spec, want) in cases {
            let err = NodeShape::from_spec(&spec).unwrap_err().to_string();
            assert!(err.starts_with(want), "{spec}: {err}");
        }
    }

    #[test]
    fn a_machine_boots_after_its_delay_then_gets_devices_then_loses_the_taint() {
        let shape = NodeShape::gpu("H100", "nvidia.com/gpu", 8);
        let young = machine("m1", 1000, shape.clone());
        assert_eq!(plan(&[young], &[]), vec![]);

        let due = machine("m1", 2000, shape.clone());
        let actions = plan(std::slice::from_ref(&due), &[]);
        assert_eq!(actions.len(), 2, "{actions:?}");
        let Action::CreateNode(node) = &actions[0] else {
            panic!("{actions:?}")
        };
        assert_eq!(node["spec"]["providerID"], "gpuops-test://default/m1");
        assert_eq!(node["spec"]["taints"][0]["key"], STARTUP_TAINT);
        assert!(
            node["status"]["allocatable"]
                .get("nvidia.com/gpu")
                .is_none(),
            "no GPU at registration"
        );
        assert_eq!(
            node["metadata"]["annotations"]["kwok.x-k8s.io/node"],
            "fake"
        );
        assert!(
            matches!(&actions[1], Action::Provision { provider_id, .. } if provider_id == "gpuops-test://default/m1")
        );

        let mut provisioned = due.clone();
        provisioned.provisioned = true;
        let registered = node_of(&provisioned, 1000);
        assert_eq!(
            plan(
                std::slice::from_ref(&provisioned),
                std::slice::from_ref(&registered)
            ),
            vec![]
        );

        let later = node_of(&provisioned, 3000);
        let actions = plan(
            std::slice::from_ref(&provisioned),
            std::slice::from_ref(&later),
        );
        assert_eq!(
            actions,
            vec![Action::PatchNodeStatus {
                name: "m1".into(),
                patch: json!({"status": {"capacity": {"nvidia.com/gpu": "8"}, "allocatable": {"nvidia.com/gpu": "8"}}}),
            }]
        );

        let mut with_gpus = later.clone();
        with_gpus
            .allocatable
            .insert("nvidia.com/gpu".into(), "8".into());
        let actions = plan(
            std::slice::from_ref(&provisioned),
            std::slice::from_ref(&with_gpus),
        );
        assert_eq!(
            actions,
            vec![Action::SetTaints {
                name: "m1".into(),
                taints: vec![]
            }]
        );

        with_gpus.taints.clear();
        assert_eq!(plan(&[provisioned], &[with_gpus]), vec![]);
    }

    #[test]
    fn mig_and_shared_devices_appear_together_and_a_partial_set_is_completed() {
        let mut shape = NodeShape::gpu("A100", "nvidia.com/mig-1g.10gb", 56);
        shape
            .devices
            .insert("nvidia.com/gpu.shared".into(), "4".into());
        let m = machine("m1", 5000, shape);
        let mut n = node_of(&m, 5000);
        n.allocatable
            .insert("nvidia.com/mig-1g.10gb".into(), "56".into());
        let actions = device_actions(&n, &m.shape.clone().unwrap().devices, Duration::ZERO);
        assert_eq!(
            actions,
            vec![Action::PatchNodeStatus {
                name: "m1".into(),
                patch: json!({"status": {
                    "capacity": {"nvidia.com/gpu.shared": "4", "nvidia.com/mig-1g.10gb": "56"},
                    "allocatable": {"nvidia.com/gpu.shared": "4", "nvidia.com/mig-1g.10gb": "56"}}}),
            }],
            "the startup taint stays until every configured device is there"
        );
    }

    #[test]
    fn a_node_whose_machine_is_gone_is_deleted_and_other_nodes_are_left_alone() {
        let m = machine("m1", 5000, NodeShape::gpu("H100", "nvidia.com/gpu", 8));
        let orphan = node_of(&m, 5000);
        let foreign =
            NodeView::from_json(&json!({"metadata": {"name": "kwok-1"}}), Duration::ZERO).unwrap();
        assert_eq!(
            plan(&[], &[orphan, foreign]),
            vec![Action::DeleteNode("m1".into())]
        );
    }

    #[test]
    fn a_bad_machine_is_rejected_once_and_does_not_stop_the_others() {
        let mut bad = machine("bad", 5000, NodeShape::gpu("H100", "nvidia.com/gpu", 8));
        bad.shape = Err(Arc::new(BedError::Spec {
            field: "spec.bootDelayMs".into(),
            problem: "want a whole number".into(),
        }));
        let good = machine("good", 5000, NodeShape::gpu("H100", "nvidia.com/gpu", 8));
        let actions = plan(&[bad.clone(), good.clone()], &[]);
        assert!(matches!(&actions[0], Action::Reject { name, .. } if name == "bad"));
        assert!(matches!(&actions[1], Action::CreateNode(_)));
        bad.error = Some("spec.bootDelayMs: want a whole number".into());
        let actions = plan(&[bad, good], &[]);
        assert!(
            actions.iter().all(|a| !matches!(a, Action::Reject { .. })),
            "{actions:?}"
        );
    }
}
