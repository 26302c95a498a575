//! `gpuops top`: allocation and live use per node, GPU, MIG instance and pod, aggregated from
//! DCGM-compatible samples (one agent's exposition or Prometheus).

use crate::snapshot::Sample;
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};

/// One GPU or MIG instance.
#[derive(Debug, Clone, PartialEq, Serialize, Default)]
pub struct DeviceRow {
    pub node: String,
    pub gpu: String,
    pub uuid: String,
    pub model: String,
    /// MIG instance: profile and GPU instance id.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mig_profile: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gi_id: Option<String>,
    pub utilization_percent: Option<f64>,
    pub memory_used_mib: Option<f64>,
    pub memory_total_mib: Option<f64>,
    pub allocated: Option<bool>,
    pub healthy: Option<bool>,
    /// `namespace/pod/container` holding it.
    pub pods: Vec<String>,
}

impl DeviceRow {
    /// `GPU 3` or `GPU 3 / 3g.40gb (GI 2)`.
    pub fn label(&self) -> String {
        match (&self.mig_profile, &self.gi_id) {
            (Some(p), Some(gi)) => format!("GPU {} / {p} (GI {gi})", self.gpu),
            (Some(p), None) => format!("GPU {} / {p}", self.gpu),
            _ => format!("GPU {}", self.gpu),
        }
    }
}

/// One node.
#[derive(Debug, Clone, PartialEq, Serialize, Default)]
pub struct NodeRow {
    pub node: String,
    pub model: String,
    pub gpus: usize,
    pub gpus_healthy: Option<f64>,
    pub mig_instances: usize,
    /// Schedulable devices (MIG instances and whole GPUs without instances).
    pub devices: usize,
    pub devices_allocated: usize,
    pub utilization_percent: Option<f64>,
    pub memory_used_mib: f64,
    pub memory_total_mib: f64,
    pub pods: usize,
    /// GPUs (and MIG devices) allocated through DRA ResourceClaims of driver `gpu.nvidia.com`.
    #[serde(skip_serializing_if = "is_zero")]
    pub claim_devices: usize,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

/// One container holding GPU devices.
#[derive(Debug, Clone, PartialEq, Serialize, Default)]
pub struct PodRow {
    pub namespace: String,
    pub pod: String,
    pub container: String,
    pub node: String,
    pub devices: Vec<String>,
    pub utilization_percent: Option<f64>,
    pub memory_used_mib: Option<f64>,
    /// Other pods on the same physical GPU (time-slicing or MIG neighbours).
    pub sharing_with: Vec<String>,
    /// Devices its ResourceClaims were allocated (`<claim>: <device>`), whether or not the
    /// metrics attribute them to a container.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub claim_devices: Vec<String>,
}

/// One device a ResourceClaim was allocated, from `status.allocation.devices.results`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ClaimDevice {
    pub namespace: String,
    pub claim: String,
    /// The pods it is reserved for.
    pub pods: Vec<String>,
    /// The pool, which is the node for gpuops' (and NVIDIA's) driver.
    pub node: String,
    pub device: String,
}

/// The devices of driver `gpu.nvidia.com` allocated to claims, sorted by node and device.
pub fn claim_devices(claims: &[k8s_openapi::api::resource::v1::ResourceClaim]) -> Vec<ClaimDevice> {
    let mut out = Vec::new();
    for c in claims {
        let Some(status) = &c.status else { continue };
        let pods: Vec<String> = status
            .reserved_for
            .iter()
            .flatten()
            .filter(|r| r.resource == "pods")
            .map(|r| r.name.clone())
            .collect();
        let results = status
            .allocation
            .as_ref()
            .and_then(|a| a.devices.as_ref())
            .and_then(|d| d.results.as_deref())
            .unwrap_or_default();
        for r in results.iter().filter(|r| r.driver == "gpu.nvidia.com") {
            out.push(ClaimDevice {
                namespace: c.metadata.namespace.clone().unwrap_or_default(),
                claim: c.metadata.name.clone().unwrap_or_default(),
                pods: pods.clone(),
                node: r.pool.clone(),
                device: r.device.clone(),
            });
        }
    }
    out.sort_by(|a, b| (&a.node, &a.device, &a.claim).cmp(&(&b.node, &b.device, &b.claim)));
    out
}

/// Counts claim-allocated devices per node; a node the metrics did not show gets its own row.
pub fn add_claims_to_nodes(rows: &mut Vec<NodeRow>, claims: &[ClaimDevice]) {
    for c in claims {
        match rows.iter_mut().find(|r| r.node == c.node) {
            Some(r) => r.claim_devices += 1,
            None => rows.push(NodeRow {
                node: c.node.clone(),
                claim_devices: 1,
                ..NodeRow::default()
            }),
        }
    }
    rows.sort_by(|a, b| a.node.cmp(&b.node));
}

/// Names each pod's claim-allocated devices on its rows; a pod the metrics did not attribute
/// devices to gets a row of its own (container `-`).
pub fn add_claims_to_pods(rows: &mut Vec<PodRow>, claims: &[ClaimDevice]) {
    for c in claims {
        let label = format!("{}: {}", c.claim, c.device);
        for pod in &c.pods {
            let mut found = false;
            for r in rows
                .iter_mut()
                .filter(|r| r.namespace == c.namespace && &r.pod == pod)
            {
                found = true;
                if !r.claim_devices.contains(&label) {
                    r.claim_devices.push(label.clone());
                }
            }
            if !found {
                rows.push(PodRow {
                    namespace: c.namespace.clone(),
                    pod: pod.clone(),
                    container: "-".into(),
                    node: c.node.clone(),
                    claim_devices: vec![label.clone()],
                    ..PodRow::default()
                });
            }
        }
    }
    rows.sort_by(|a, b| {
        (&a.namespace, &a.pod, &a.container).cmp(&(&b.namespace, &b.pod, &b.container))
    });
}

type Key = (String, String, String); // host, UUID (or gpu index), GI id

fn key(s: &Sample) -> Option<Key> {
    let host = s.host().unwrap_or("").to_string();
    let uuid = s.label("UUID").or_else(|| s.label("gpu"))?.to_string();
    Some((host, uuid, s.label("GPU_I_ID").unwrap_or("").to_string()))
}

/// Every device, sorted by node, GPU index, MIG instance.
pub fn devices(samples: &[Sample]) -> Vec<DeviceRow> {
    let mut rows: BTreeMap<Key, DeviceRow> = BTreeMap::new();
    let mut free: BTreeMap<Key, f64> = BTreeMap::new();
    let mut reserved: BTreeMap<Key, f64> = BTreeMap::new();
    for s in samples {
        let Some(k) = key(s) else { continue };
        let known = matches!(
            s.name.as_str(),
            "DCGM_FI_DEV_GPU_UTIL"
                | "DCGM_FI_DEV_FB_USED"
                | "DCGM_FI_DEV_FB_FREE"
                | "DCGM_FI_DEV_FB_RESERVED"
                | "gpuops_device_allocated"
                | "gpuops_device_healthy"
        );
        if !known {
            continue;
        }
        let row = rows.entry(k.clone()).or_insert_with(|| DeviceRow {
            node: k.0.clone(),
            gpu: s.label("gpu").unwrap_or("?").to_string(),
            uuid: s.label("UUID").unwrap_or("").to_string(),
            model: s.label("modelName").unwrap_or("").to_string(),
            mig_profile: s.label("GPU_I_PROFILE").map(str::to_string),
            gi_id: s.label("GPU_I_ID").map(str::to_string),
            ..DeviceRow::default()
        });
        if let (Some(ns), Some(pod)) = (s.label("namespace"), s.label("pod")) {
            let holder = format!("{ns}/{pod}/{}", s.label("container").unwrap_or(""));
            if !row.pods.contains(&holder) {
                row.pods.push(holder);
            }
        }
        match s.name.as_str() {
            "DCGM_FI_DEV_GPU_UTIL" => row.utilization_percent = Some(s.value),
            "DCGM_FI_DEV_FB_USED" => row.memory_used_mib = Some(s.value),
            "DCGM_FI_DEV_FB_FREE" => {
                free.insert(k, s.value);
            }
            "DCGM_FI_DEV_FB_RESERVED" => {
                reserved.insert(k, s.value);
            }
            "gpuops_device_allocated" => {
                row.allocated = Some(row.allocated.unwrap_or(false) || s.value >= 1.0);
            }
            "gpuops_device_healthy" => row.healthy = Some(s.value >= 1.0),
            _ => {}
        }
    }
    for (k, row) in rows.iter_mut() {
        if let (Some(used), Some(f)) = (row.memory_used_mib, free.get(k)) {
            row.memory_total_mib = Some(used + f + reserved.get(k).copied().unwrap_or(0.0));
        }
        if row.allocated.is_none() && !row.pods.is_empty() {
            row.allocated = Some(true);
        }
        row.pods.sort();
    }
    let mut out: Vec<DeviceRow> = rows.into_values().collect();
    out.sort_by(|a, b| {
        let idx = |r: &DeviceRow| r.gpu.parse::<u32>().unwrap_or(u32::MAX);
        let gi = |r: &DeviceRow| r.gi_id.as_deref().and_then(|g| g.parse::<u32>().ok());
        (a.node.as_str(), idx(a), gi(a)).cmp(&(b.node.as_str(), idx(b), gi(b)))
    });
    out
}

/// One row per node.
pub fn nodes(samples: &[Sample]) -> Vec<NodeRow> {
    let devs = devices(samples);
    let mut out: BTreeMap<String, NodeRow> = BTreeMap::new();
    let with_mig: BTreeSet<(String, String)> = devs
        .iter()
        .filter(|d| d.gi_id.is_some())
        .map(|d| (d.node.clone(), d.uuid.clone()))
        .collect();
    let mut util: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    let mut pods: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for d in &devs {
        let row = out.entry(d.node.clone()).or_insert_with(|| NodeRow {
            node: d.node.clone(),
            ..NodeRow::default()
        });
        if row.model.is_empty() {
            row.model.clone_from(&d.model);
        }
        let whole = d.gi_id.is_none();
        if whole {
            row.gpus += 1;
            row.memory_used_mib += d.memory_used_mib.unwrap_or(0.0);
            row.memory_total_mib += d.memory_total_mib.unwrap_or(0.0);
            if let Some(u) = d.utilization_percent {
                util.entry(d.node.clone()).or_default().push(u);
            }
        } else {
            row.mig_instances += 1;
        }
        // Schedulable devices: instances, and whole GPUs that have none.
        if !whole || !with_mig.contains(&(d.node.clone(), d.uuid.clone())) {
            row.devices += 1;
            if d.allocated == Some(true) {
                row.devices_allocated += 1;
            }
        }
        for p in &d.pods {
            let pod = p.rsplit_once('/').map_or(p.as_str(), |(np, _)| np);
            pods.entry(d.node.clone())
                .or_default()
                .insert(pod.to_string());
        }
    }
    for s in samples {
        if s.name == "gpuops_node_gpus_healthy"
            && let Some(row) = s.host().and_then(|h| out.get_mut(h))
        {
            row.gpus_healthy = Some(s.value);
        }
    }
    for (node, row) in out.iter_mut() {
        if let Some(us) = util.get(node).filter(|u| !u.is_empty()) {
            row.utilization_percent = Some(us.iter().sum::<f64>() / us.len() as f64);
        }
        row.pods = pods.get(node).map_or(0, BTreeSet::len);
    }
    out.into_values().collect()
}

/// One row per container holding devices.
pub fn pods(samples: &[Sample]) -> Vec<PodRow> {
    let devs = devices(samples);
    // Holders per physical GPU, for the neighbours column.
    let mut per_gpu: BTreeMap<(String, String), BTreeSet<String>> = BTreeMap::new();
    for d in &devs {
        for p in &d.pods {
            let pod = p.rsplit_once('/').map_or(p.as_str(), |(np, _)| np);
            per_gpu
                .entry((d.node.clone(), d.uuid.clone()))
                .or_default()
                .insert(pod.to_string());
        }
    }
    let mut out: BTreeMap<(String, String, String), PodRow> = BTreeMap::new();
    let mut util: BTreeMap<(String, String, String), Vec<f64>> = BTreeMap::new();
    for d in &devs {
        for holder in &d.pods {
            let mut parts = holder.splitn(3, '/');
            let (ns, pod, ctr) = (
                parts.next().unwrap_or("").to_string(),
                parts.next().unwrap_or("").to_string(),
                parts.next().unwrap_or("").to_string(),
            );
            let k = (ns.clone(), pod.clone(), ctr.clone());
            let row = out.entry(k.clone()).or_insert_with(|| PodRow {
                namespace: ns.clone(),
                pod: pod.clone(),
                container: ctr,
                node: d.node.clone(),
                ..PodRow::default()
            });
            row.devices.push(d.label());
            if let Some(m) = d.memory_used_mib {
                *row.memory_used_mib.get_or_insert(0.0) += m;
            }
            if let Some(u) = d.utilization_percent {
                util.entry(k).or_default().push(u);
            }
            let me = format!("{ns}/{pod}");
            for other in per_gpu
                .get(&(d.node.clone(), d.uuid.clone()))
                .into_iter()
                .flatten()
            {
                if *other != me && !row.sharing_with.contains(other) {
                    row.sharing_with.push(other.clone());
                }
            }
        }
    }
    for (k, row) in out.iter_mut() {
        if let Some(us) = util.get(k).filter(|u| !u.is_empty()) {
            row.utilization_percent = Some(us.iter().sum::<f64>() / us.len() as f64);
        }
    }
    out.into_values().collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::parse_exposition;

    /// An agent's exposition: GPU 0 whole and held by one pod, GPU 1 in MIG with two instances
    /// (one held), GPU 2 time-sliced between two pods.
    const FIXTURE: &str = r#"# TYPE DCGM_FI_DEV_GPU_UTIL gauge
DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-0",pci_bus_id="00000000:18:00.0",device="nvidia0",modelName="NVIDIA H100 80GB HBM3",Hostname="node-1",DCGM_FI_DRIVER_VERSION="580.105.08",container="train",namespace="ml",pod="trainer-0"} 97
DCGM_FI_DEV_GPU_UTIL{gpu="2",UUID="GPU-2",pci_bus_id="00000000:1A:00.0",device="nvidia2",modelName="NVIDIA H100 80GB HBM3",Hostname="node-1",DCGM_FI_DRIVER_VERSION="580.105.08",container="c",namespace="web",pod="a"} 30
DCGM_FI_DEV_GPU_UTIL{gpu="2",UUID="GPU-2",pci_bus_id="00000000:1A:00.0",device="nvidia2",modelName="NVIDIA H100 80GB HBM3",Hostname="node-1",DCGM_FI_DRIVER_VERSION="580.105.08",container="c",namespace="web",pod="b"} 30
# TYPE DCGM_FI_DEV_FB_USED gauge
DCGM_FI_DEV_FB_USED{gpu="0",UUID="GPU-0",pci_bus_id="00000000:18:00.0",device="nvidia0",modelName="NVIDIA H100 80GB HBM3",Hostname="node-1",DCGM_FI_DRIVER_VERSION="580.105.08",container="train",namespace="ml",pod="trainer-0"} 70000
DCGM_FI_DEV_FB_USED{gpu="1",UUID="GPU-1",pci_bus_id="00000000:19:00.0",device="nvidia1",modelName="NVIDIA H100 80GB HBM3",Hostname="node-1",DCGM_FI_DRIVER_VERSION="580.105.08"} 1000
DCGM_FI_DEV_FB_USED{gpu="1",UUID="GPU-1",pci_bus_id="00000000:19:00.0",device="nvidia1",modelName="NVIDIA H100 80GB HBM3",GPU_I_PROFILE="3g.40gb",GPU_I_ID="1",Hostname="node-1",DCGM_FI_DRIVER_VERSION="580.105.08",container="llm",namespace="serve",pod="llm-0"} 30000
DCGM_FI_DEV_FB_USED{gpu="1",UUID="GPU-1",pci_bus_id="00000000:19:00.0",device="nvidia1",modelName="NVIDIA H100 80GB HBM3",GPU_I_PROFILE="3g.40gb",GPU_I_ID="2",Hostname="node-1",DCGM_FI_DRIVER_VERSION="580.105.08"} 0
DCGM_FI_DEV_FB_USED{gpu="2",UUID="GPU-2",pci_bus_id="00000000:1A:00.0",device="nvidia2",modelName="NVIDIA H100 80GB HBM3",Hostname="node-1",DCGM_FI_DRIVER_VERSION="580.105.08",container="c",namespace="web",pod="a"} 20000
DCGM_FI_DEV_FB_USED{gpu="2",UUID="GPU-2",pci_bus_id="00000000:1A:00.0",device="nvidia2",modelName="NVIDIA H100 80GB HBM3",Hostname="node-1",DCGM_FI_DRIVER_VERSION="580.105.08",container="c",namespace="web",pod="b"} 20000
# TYPE DCGM_FI_DEV_FB_FREE gauge
DCGM_FI_DEV_FB_FREE{gpu="0",UUID="GPU-0",pci_bus_id="00000000:18:00.0",device="nvidia0",modelName="NVIDIA H100 80GB HBM3",Hostname="node-1",DCGM_FI_DRIVER_VERSION="580.105.08",container="train",namespace="ml",pod="trainer-0"} 10559
DCGM_FI_DEV_FB_FREE{gpu="1",UUID="GPU-1",pci_bus_id="00000000:19:00.0",device="nvidia1",modelName="NVIDIA H100 80GB HBM3",Hostname="node-1",DCGM_FI_DRIVER_VERSION="580.105.08"} 79559
DCGM_FI_DEV_FB_FREE{gpu="2",UUID="GPU-2",pci_bus_id="00000000:1A:00.0",device="nvidia2",modelName="NVIDIA H100 80GB HBM3",Hostname="node-1",DCGM_FI_DRIVER_VERSION="580.105.08",container="c",namespace="web",pod="a"} 40559
# TYPE gpuops_device_allocated gauge
gpuops_device_allocated{gpu="0",UUID="GPU-0",pci_bus_id="00000000:18:00.0",device="nvidia0",modelName="NVIDIA H100 80GB HBM3",Hostname="node-1",DCGM_FI_DRIVER_VERSION="580.105.08",container="train",namespace="ml",pod="trainer-0"} 1
gpuops_device_allocated{gpu="1",UUID="GPU-1",pci_bus_id="00000000:19:00.0",device="nvidia1",modelName="NVIDIA H100 80GB HBM3",GPU_I_PROFILE="3g.40gb",GPU_I_ID="1",Hostname="node-1",DCGM_FI_DRIVER_VERSION="580.105.08",container="llm",namespace="serve",pod="llm-0"} 1
gpuops_device_allocated{gpu="1",UUID="GPU-1",pci_bus_id="00000000:19:00.0",device="nvidia1",modelName="NVIDIA H100 80GB HBM3",GPU_I_PROFILE="3g.40gb",GPU_I_ID="2",Hostname="node-1",DCGM_FI_DRIVER_VERSION="580.105.08"} 0
gpuops_device_allocated{gpu="2",UUID="GPU-2",pci_bus_id="00000000:1A:00.0",device="nvidia2",modelName="NVIDIA H100 80GB HBM3",Hostname="node-1",DCGM_FI_DRIVER_VERSION="580.105.08",container="c",namespace="web",pod="a"} 1
gpuops_device_allocated{gpu="2",UUID="GPU-2",pci_bus_id="00000000:1A:00.0",device="nvidia2",modelName="NVIDIA H100 80GB HBM3",Hostname="node-1",DCGM_FI_DRIVER_VERSION="580.105.08",container="c",namespace="web",pod="b"} 1
gpuops_node_gpus{Hostname="node-1"} 3
gpuops_node_gpus_healthy{Hostname="node-1"} 3
"#;

    #[test]
    fn devices_nodes_and_pods_from_an_exposition() {
        let s = parse_exposition(FIXTURE).unwrap();
        let d = devices(&s);
        assert_eq!(d.len(), 5, "{d:#?}");
        assert_eq!(d[0].label(), "GPU 0");
        assert_eq!(d[0].memory_total_mib, Some(80559.0));
        assert_eq!(d[2].label(), "GPU 1 / 3g.40gb (GI 1)");
        assert_eq!(d[2].pods, vec!["serve/llm-0/llm"]);
        assert_eq!(d[3].allocated, Some(false));
        assert_eq!(d[4].pods.len(), 2);

        let n = nodes(&s);
        assert_eq!(n.len(), 1);
        let n = &n[0];
        assert_eq!(
            (n.gpus, n.mig_instances, n.devices, n.devices_allocated),
            (3, 2, 4, 3)
        );
        assert_eq!(n.pods, 4);
        assert_eq!(n.utilization_percent, Some((97.0 + 30.0) / 2.0));
        assert_eq!(n.memory_used_mib, 70000.0 + 1000.0 + 20000.0);
        assert_eq!(n.gpus_healthy, Some(3.0));

        let p = pods(&s);
        assert_eq!(p.len(), 4);
        let a = p.iter().find(|r| r.pod == "a").unwrap();
        assert_eq!(a.sharing_with, vec!["web/b"]);
        assert_eq!(a.utilization_percent, Some(30.0));
        let llm = p.iter().find(|r| r.pod == "llm-0").unwrap();
        assert_eq!(llm.devices, vec!["GPU 1 / 3g.40gb (GI 1)"]);
        assert_eq!(llm.memory_used_mib, Some(30000.0));
    }

    #[test]
    fn claim_allocated_gpus_per_node_and_pod() {
        use k8s_openapi::api::resource::v1::{
            AllocationResult, DeviceAllocationResult, DeviceRequestAllocationResult, ResourceClaim,
            ResourceClaimConsumerReference, ResourceClaimStatus,
        };
        let claim = |ns: &str, name: &str, pod: &str, devs: &[(&str, &str, &str)]| ResourceClaim {
            metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                namespace: Some(ns.into()),
                name: Some(name.into()),
                ..Default::default()
            },
            status: Some(ResourceClaimStatus {
                allocation: Some(AllocationResult {
                    devices: Some(DeviceAllocationResult {
                        results: Some(
                            devs.iter()
                                .map(|(driver, pool, device)| DeviceRequestAllocationResult {
                                    request: "gpu".into(),
                                    driver: (*driver).into(),
                                    pool: (*pool).into(),
                                    device: (*device).into(),
                                    ..Default::default()
                                })
                                .collect(),
                        ),
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                reserved_for: Some(vec![ResourceClaimConsumerReference {
                    resource: "pods".into(),
                    name: pod.into(),
                    uid: "u".into(),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            ..Default::default()
        };
        let claims = vec![
            claim(
                "ml",
                "trainer-0-gpu",
                "trainer-0",
                &[("gpu.nvidia.com", "node-1", "gpu-0")],
            ),
            claim(
                "ml",
                "big-gpu",
                "big",
                &[
                    ("gpu.nvidia.com", "node-2", "gpu-0"),
                    ("gpu.nvidia.com", "node-2", "gpu-1"),
                    // Another driver's device is not a GPU of ours.
                    ("net.example.com", "node-2", "nic-0"),
                ],
            ),
            // Not allocated yet: nothing.
            ResourceClaim::default(),
        ];
        let got = claim_devices(&claims);
        assert_eq!(got.len(), 3, "{got:#?}");
        let samples = parse_exposition(FIXTURE).unwrap();
        let mut nodes = nodes(&samples);
        add_claims_to_nodes(&mut nodes, &got);
        let n = |name: &str| nodes.iter().find(|r| r.node == name).unwrap().claim_devices;
        assert_eq!((n("node-1"), n("node-2")), (1, 2));
        let mut pods = pods(&samples);
        add_claims_to_pods(&mut pods, &got);
        let trainer = pods.iter().find(|r| r.pod == "trainer-0").unwrap();
        assert_eq!(trainer.claim_devices, vec!["trainer-0-gpu: gpu-0"]);
        assert_eq!(trainer.container, "train");
        let big = pods.iter().find(|r| r.pod == "big").unwrap();
        assert_eq!(big.container, "-");
        assert_eq!(big.claim_devices, vec!["big-gpu: gpu-0", "big-gpu: gpu-1"]);
        let table = crate::render::nodes_table(&nodes);
        assert!(table.contains("CLAIMED (DRA)"), "{table}");
        assert!(crate::render::pods_table(&pods).contains("big-gpu: gpu-1"));
        // Without claims the tables are as they were, and JSON has no claim fields.
        let plain = super::nodes(&samples);
        assert!(!crate::render::nodes_table(&plain).contains("CLAIMED"));
        assert!(
            !serde_json::to_string(&plain)
                .unwrap()
                .contains("claim_devices")
        );
    }
}
