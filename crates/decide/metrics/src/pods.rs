//! Which pod holds which GPU or MIG device, from the kubelet's PodResources `List()`.

use gpuops_inventory::Inventory;
use std::collections::BTreeMap;

/// A container holding a device.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct PodRef {
    pub namespace: String,
    pub pod: String,
    pub container: String,
}

/// One container's devices of one resource, as PodResources reports them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Assignment {
    pub namespace: String,
    pub pod: String,
    pub container: String,
    pub resource: String,
    pub device_ids: Vec<String>,
}

/// Device UUID (`GPU-…` or `MIG-…`) -> the containers holding it, sorted, without duplicates.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodMap(BTreeMap<String, Vec<PodRef>>);

impl PodMap {
    /// Keeps the assignments whose device IDs are this node's GPUs or MIG devices, whatever the
    /// resource is called (renamed and `.shared` resources included). Replica IDs
    /// (`<uuid>::<n>`) count for their device; two replicas in one container count once.
    pub fn build(assignments: impl IntoIterator<Item = Assignment>, inv: &Inventory) -> PodMap {
        let known = |uuid: &str| {
            !uuid.is_empty()
                && inv
                    .gpus
                    .iter()
                    .any(|g| g.uuid == uuid || g.mig_devices.iter().any(|m| m.uuid == uuid))
        };
        let mut map: BTreeMap<String, Vec<PodRef>> = BTreeMap::new();
        for a in assignments {
            for id in &a.device_ids {
                let uuid = strip_replica(id);
                if !known(uuid) {
                    continue;
                }
                let holder = PodRef {
                    namespace: a.namespace.clone(),
                    pod: a.pod.clone(),
                    container: a.container.clone(),
                };
                let holders = map.entry(uuid.to_string()).or_default();
                if let Err(at) = holders.binary_search(&holder) {
                    holders.insert(at, holder);
                }
            }
        }
        PodMap(map)
    }

    /// The containers holding this device (empty when none).
    pub fn holders(&self, uuid: &str) -> &[PodRef] {
        self.0.get(uuid).map(Vec::as_slice).unwrap_or_default()
    }

    /// How many devices are held.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// `GPU-x::3` -> `GPU-x`: time-slicing and MPS replicas belong to their device.
pub fn strip_replica(id: &str) -> &str {
    id.split_once("::").map_or(id, |(uuid, _)| uuid)
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuops_inventory::{Gpu, MigDevice};

    fn inv() -> Inventory {
        let mut mig = Gpu {
            index: 1,
            uuid: "GPU-b".into(),
            ..Gpu::default()
        };
        mig.mig_devices.push(MigDevice {
            uuid: "MIG-1".into(),
            ..MigDevice::default()
        });
        Inventory {
            gpus: vec![
                Gpu {
                    index: 0,
                    uuid: "GPU-a".into(),
                    ..Gpu::default()
                },
                mig,
            ],
            ..Inventory::default()
        }
    }

    fn assign(pod: &str, container: &str, resource: &str, ids: &[&str]) -> Assignment {
        Assignment {
            namespace: "ml".into(),
            pod: pod.into(),
            container: container.into(),
            resource: resource.into(),
            device_ids: ids.iter().map(|s| s.to_string()).collect(),
        }
    }

    #[test]
    fn replicas_mig_devices_and_renamed_resources_map_to_their_device() {
        let map = PodMap::build(
            [
                assign(
                    "p1",
                    "c",
                    "nvidia.com/gpu.shared",
                    &["GPU-a::0", "GPU-a::3"],
                ),
                assign("p2", "c", "example.com/renamed-gpu", &["GPU-a::1"]),
                assign("p3", "main", "nvidia.com/mig-1g.10gb", &["MIG-1"]),
                assign("p4", "c", "example.com/nic", &["eth0", "GPU-unknown"]),
            ],
            &inv(),
        );
        let pods: Vec<&str> = map
            .holders("GPU-a")
            .iter()
            .map(|p| p.pod.as_str())
            .collect();
        assert_eq!(pods, ["p1", "p2"], "two replicas in p1 count once");
        assert_eq!(map.holders("MIG-1")[0].container, "main");
        assert!(
            map.holders("GPU-b").is_empty(),
            "a MIG pod does not hold the parent"
        );
        assert_eq!(
            map.len(),
            2,
            "devices of other nodes and other vendors are dropped"
        );
    }

    #[test]
    fn strip_replica_keeps_plain_ids() {
        assert_eq!(strip_replica("GPU-x::12"), "GPU-x");
        assert_eq!(strip_replica("MIG-y"), "MIG-y");
    }
}
