//! The constant world the handler targets run against: an 8-GPU NVLink node, its plugin state
//! under two configs, and a small cluster for the extender.

use gpuops_extender::protocol::Engine;
use gpuops_inventory::{Gpu, GpuLink, Inventory, PcieLevel};
use gpuops_resources::{Config, HostDevices, Resource};
use k8s_openapi::api::core::v1::{Node, Pod};
use std::sync::OnceLock;

/// The device plugin's state for one resource, as the gRPC service holds it.
pub struct PluginNode {
    pub resource: Resource,
    pub config: Config,
    pub host: HostDevices,
}

/// Eight GPUs, two NVLink islands of four (so topology-aware choices have something to choose).
pub fn inventory() -> &'static Inventory {
    static INV: OnceLock<Inventory> = OnceLock::new();
    INV.get_or_init(|| {
        let gpus = (0..8)
            .map(|i| Gpu {
                index: i,
                uuid: format!("GPU-{i:08x}-0000-0000-0000-000000000000"),
                name: "NVIDIA H100 80GB HBM3".into(),
                minor_number: Some(i),
                numa_node: Some(i / 4),
                ..Gpu::default()
            })
            .collect();
        let mut topology = Vec::new();
        for a in 0..8u32 {
            for b in a + 1..8 {
                let same = a / 4 == b / 4;
                topology.push(GpuLink {
                    a,
                    b,
                    nvlinks: if same { 18 } else { 0 },
                    pcie: if same {
                        PcieLevel::SameNumaNode
                    } else {
                        PcieLevel::CrossCpu
                    },
                });
            }
        }
        Inventory {
            driver_version: "580.105.08".into(),
            cuda_driver_version: "13.0".into(),
            gpus,
            topology,
            ..Inventory::default()
        }
    })
}

/// `nvidia.com/gpu` under the default config, and time-sliced into 4 replicas per GPU.
pub fn nodes() -> &'static [PluginNode; 2] {
    static NODES: OnceLock<[PluginNode; 2]> = OnceLock::new();
    NODES.get_or_init(|| {
        let sliced = "version: v1\nsharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 4\n";
        [Config::default(), Config::parse(sliced, "fixture").unwrap()].map(|config| {
            let resource = gpuops_resources::resources(inventory(), &config)
                .unwrap()
                .into_iter()
                .next()
                .unwrap();
            PluginNode {
                resource,
                config,
                host: HostDevices {
                    nvidiactl: true,
                    nvidia_uvm: true,
                    nvidia_uvm_tools: true,
                    nvidia_modeset: false,
                    mig_minors: None,
                },
            }
        })
    })
}

/// Three nodes (whole GPUs, shared GPUs, none) and pods on them, as the extender's watch has them.
pub fn cluster() -> &'static (Vec<Node>, Vec<Pod>) {
    use gpuops_kubemodel::testkit::{node, pod};
    use gpuops_kubemodel::{GPU, GPU_SHARED};
    static CLUSTER: OnceLock<(Vec<Node>, Vec<Pod>)> = OnceLock::new();
    CLUSTER.get_or_init(|| {
        (
            vec![
                node("node-a", 4, 1, false),
                node("node-b", 2, 4, true),
                node("node-c", 0, 1, false),
            ],
            vec![
                pod("p1", Some("node-a"), GPU, 2, None),
                pod("p2", Some("node-b"), GPU_SHARED, 1, Some(250)),
                pod("p3", None, GPU_SHARED, 1, Some(500)),
            ],
        )
    })
}

pub fn engine() -> &'static Engine {
    static ENGINE: OnceLock<Engine> = OnceLock::new();
    ENGINE.get_or_init(|| Engine {
        policy: gpuops_packing::PolicyKind::Ours,
        workload: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The kubelet seeds (fuzz/seeds/make_seeds.py) name these IDs; if the model's IDs change,
    /// the seeds would only reach the "unknown device" error.
    #[test]
    fn the_plugin_fixture_has_the_ids_the_seeds_use() {
        let [whole, sliced] = nodes();
        let uuid0 = "GPU-00000000-0000-0000-0000-000000000000";
        assert_eq!(whole.resource.devices.len(), 8);
        assert!(whole.resource.device(uuid0).is_some());
        assert_eq!(sliced.resource.devices.len(), 32);
        assert!(sliced.resource.device(&format!("{uuid0}::3")).is_some());
        let a = gpuops_resources::allocate(
            &whole.resource,
            &[uuid0.to_string()],
            &whole.config,
            &whole.host,
        )
        .unwrap();
        assert_eq!(a.envs["NVIDIA_VISIBLE_DEVICES"], uuid0);
    }
}
