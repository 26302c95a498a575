//! Building the kubelet's `ContainerAllocateResponse` for one container, as NVIDIA's plugin does.

use crate::ResourcesError;
use crate::config::{Config, DeviceIdStrategy, DeviceListStrategy, SharingStrategy};
use crate::model::{Backing, Resource};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Where `volume-mounts` puts its per-device marker files in the container.
pub const VOLUME_MOUNTS_ROOT: &str = "/var/run/nvidia-container-devices";
/// The env var the NVIDIA container runtime reads.
pub const VISIBLE_DEVICES_ENV: &str = "NVIDIA_VISIBLE_DEVICES";
/// CDI vendor/class of the device plugin's devices.
pub const CDI_KIND: &str = "k8s.device-plugin.nvidia.com/gpu";
/// Plugin name in CDI annotation keys.
pub const CDI_PLUGIN_NAME: &str = "nvidia-device-plugin";

/// One container's share of an Allocate response.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ContainerAllocation {
    pub envs: BTreeMap<String, String>,
    pub mounts: Vec<Mount>,
    pub device_specs: Vec<DeviceSpec>,
    pub annotations: BTreeMap<String, String>,
    /// Fully qualified CDI device names (`cdi-cri`).
    pub cdi_devices: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Mount {
    pub container_path: String,
    pub host_path: String,
    pub read_only: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceSpec {
    pub container_path: String,
    pub host_path: String,
    pub permissions: String,
}

/// What the agent knows about the host's device nodes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostDevices {
    /// Which of the optional control nodes exist (NVIDIA stats each and skips the missing ones).
    pub nvidiactl: bool,
    pub nvidia_uvm: bool,
    pub nvidia_uvm_tools: bool,
    pub nvidia_modeset: bool,
    /// `/proc/driver/nvidia-caps/mig-minors` parsed with [`parse_mig_minors`]; `None` to compute the
    /// minors from the driver's fixed layout ([`presumed_mig_cap_minors`]).
    pub mig_minors: Option<BTreeMap<String, u32>>,
}

impl Default for HostDevices {
    fn default() -> Self {
        HostDevices {
            nvidiactl: true,
            nvidia_uvm: true,
            nvidia_uvm_tools: true,
            nvidia_modeset: true,
            mig_minors: None,
        }
    }
}

/// Parses `/proc/driver/nvidia-caps/mig-minors` (`gpu0/gi1/access 12`, `gpu0/gi1/ci0/access 13`, ...).
pub fn parse_mig_minors(text: &str) -> BTreeMap<String, u32> {
    text.lines()
        .filter_map(|l| {
            let mut parts = l.split_whitespace();
            let name = parts.next()?;
            let minor = parts.next()?.parse().ok()?;
            Some((name.to_string(), minor))
        })
        .collect()
}

/// The capability minors for a MIG device's GI and CI access files, from the layout the driver
/// writes to `mig-minors`: `config` 1, `monitor` 2, then per GPU minor (0..) and GI id (0..15) one
/// `gpuN/giG/access` followed by eight `gpuN/giG/ciC/access`. Presumed from that file's fixed
/// layout; prefer [`parse_mig_minors`] on the real file.
pub fn presumed_mig_cap_minors(gpu_minor: u32, gi_id: u32, ci_id: u32) -> (u32, u32) {
    let gi = 3 + gpu_minor * 15 * 9 + gi_id * 9;
    (gi, gi + 1 + ci_id)
}

/// The capability device minors of a MIG device: from the host's `mig-minors` file when read,
/// else presumed.
pub(crate) fn mig_cap_minors(
    host: &HostDevices,
    gpu_minor: u32,
    gi_id: u32,
    ci_id: u32,
) -> (u32, u32) {
    let presumed = presumed_mig_cap_minors(gpu_minor, gi_id, ci_id);
    match &host.mig_minors {
        Some(m) => (
            m.get(&format!("gpu{gpu_minor}/gi{gi_id}/access"))
                .copied()
                .unwrap_or(presumed.0),
            m.get(&format!("gpu{gpu_minor}/gi{gi_id}/ci{ci_id}/access"))
                .copied()
                .unwrap_or(presumed.1),
        ),
        None => presumed,
    }
}

/// A stable, UUID-shaped id for a request (NVIDIA uses a random UUID; a hash of the request keeps
/// this pure and repeatable while staying unique per distinct request).
fn response_id(resource: &str, ids: &[String]) -> String {
    fn fnv(seed: u64, parts: &[&str]) -> u64 {
        let mut h = seed;
        for p in parts {
            for b in p.bytes().chain(std::iter::once(0)) {
                h ^= u64::from(b);
                h = h.wrapping_mul(0x0000_0100_0000_01b3);
            }
        }
        h
    }
    let mut parts: Vec<&str> = vec![resource];
    parts.extend(ids.iter().map(String::as_str));
    let a = fnv(0xcbf2_9ce4_8422_2325, &parts);
    let b = fnv(0x6c62_272e_07bb_0142, &parts);
    let hex = format!("{a:016x}{b:016x}");
    format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

fn join_root(root: &str, path: &str) -> String {
    let root = root.trim_end_matches('/');
    format!("{root}{path}")
}

/// The response for one container requesting `ids` of `resource`.
pub fn allocate(
    resource: &Resource,
    ids: &[String],
    cfg: &Config,
    host: &HostDevices,
) -> Result<ContainerAllocation, ResourcesError> {
    if ids.is_empty() {
        return Err(ResourcesError::EmptyRequest {
            resource: resource.name.clone(),
        });
    }
    let mut backings: Vec<&Backing> = Vec::new();
    for id in ids {
        let d = resource
            .device(id)
            .ok_or_else(|| ResourcesError::AllocateUnknownDevice {
                resource: resource.name.clone(),
                id: id.clone(),
            })?;
        if !backings.iter().any(|b| b.uuid() == d.backing.uuid()) {
            backings.push(&d.backing);
        }
    }
    if resource.sharing != SharingStrategy::None
        && resource.fail_requests_greater_than_one
        && ids.len() > 1
    {
        return Err(ResourcesError::SharedRequestTooLarge {
            resource: resource.name.clone(),
            count: ids.len(),
        });
    }
    let device_ids: Vec<String> = backings
        .iter()
        .map(|b| match cfg.device_id_strategy() {
            DeviceIdStrategy::Uuid => b.uuid().to_string(),
            DeviceIdStrategy::Index => b.index_id(),
        })
        .collect();

    let strategies = cfg.device_list_strategies();
    let mut out = ContainerAllocation::default();

    if strategies.any_cdi() {
        let names: Vec<String> = device_ids
            .iter()
            .map(|id| format!("{CDI_KIND}={id}"))
            .collect();
        if strategies.includes(DeviceListStrategy::CdiAnnotations) {
            let key = format!(
                "{}{CDI_PLUGIN_NAME}_{}",
                cfg.cdi_annotation_prefix(),
                response_id(&resource.name, ids)
            );
            out.annotations.insert(key, names.join(","));
        }
        if strategies.includes(DeviceListStrategy::CdiCri) {
            out.cdi_devices = names;
        }
    }

    if resource.sharing == SharingStrategy::Mps {
        let root = cfg.mps_root().trim_end_matches('/');
        let pipe = format!("{root}/{}/pipe", resource.name);
        out.envs
            .insert("CUDA_MPS_PIPE_DIRECTORY".into(), pipe.clone());
        out.mounts.push(Mount {
            container_path: pipe.clone(),
            host_path: pipe,
            read_only: false,
        });
        out.mounts.push(Mount {
            container_path: "/dev/shm".into(),
            host_path: format!("{root}/shm"),
            read_only: false,
        });
    }

    // The rest only applies when some non-CDI strategy is selected.
    if strategies.all_cdi() {
        return Ok(out);
    }
    if strategies.includes(DeviceListStrategy::Envvar) {
        out.envs
            .insert(VISIBLE_DEVICES_ENV.into(), device_ids.join(","));
    }
    if strategies.includes(DeviceListStrategy::VolumeMounts) {
        out.envs
            .insert(VISIBLE_DEVICES_ENV.into(), VOLUME_MOUNTS_ROOT.into());
        for id in &device_ids {
            out.mounts.push(Mount {
                container_path: format!("{VOLUME_MOUNTS_ROOT}/{id}"),
                host_path: "/dev/null".into(),
                read_only: false,
            });
        }
    }
    if cfg.pass_device_specs() {
        let mut paths: Vec<String> = Vec::new();
        for (present, p) in [
            (host.nvidiactl, "/dev/nvidiactl"),
            (host.nvidia_uvm, "/dev/nvidia-uvm"),
            (host.nvidia_uvm_tools, "/dev/nvidia-uvm-tools"),
            (host.nvidia_modeset, "/dev/nvidia-modeset"),
        ] {
            if present {
                paths.push(p.to_string());
            }
        }
        for b in &backings {
            let minor = b
                .gpu_minor
                .ok_or(ResourcesError::NoMinorNumber { gpu: b.gpu_index })?;
            let mut mine = vec![format!("/dev/nvidia{minor}")];
            if let Some(m) = &b.mig {
                let (gi, ci) = mig_cap_minors(host, minor, m.gi_id, m.ci_id);
                mine.push(format!("/dev/nvidia-caps/nvidia-cap{gi}"));
                mine.push(format!("/dev/nvidia-caps/nvidia-cap{ci}"));
            }
            for p in mine {
                if !paths.contains(&p) {
                    paths.push(p);
                }
            }
        }
        let dev_root = cfg.nvidia_dev_root();
        out.device_specs = paths
            .into_iter()
            .map(|p| DeviceSpec {
                host_path: join_root(dev_root, &p),
                container_path: p,
                permissions: "rw".into(),
            })
            .collect();
    }
    for (enabled, var) in [
        (cfg.flags.gds_enabled, "NVIDIA_GDS"),
        (cfg.flags.mofed_enabled, "NVIDIA_MOFED"),
        (cfg.flags.gdrcopy_enabled, "NVIDIA_GDRCOPY"),
    ] {
        if enabled == Some(true) {
            out.envs.insert(var.into(), "enabled".into());
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::resources;
    use crate::testutil::{cfg, gpu, inv, mig_gpu, mig_uuid, uuid};

    fn res(yaml: &str, gpus: Vec<gpuops_inventory::Gpu>) -> (Resource, Config) {
        let c = cfg(yaml);
        let mut rs = resources(&inv(gpus), &c).unwrap();
        (rs.remove(0), c)
    }

    fn s(v: &[String]) -> Vec<String> {
        v.to_vec()
    }

    #[test]
    fn envvar_lists_the_ids() {
        let (r, c) = res("", vec![gpu(0), gpu(1), gpu(2)]);
        let a = allocate(&r, &s(&[uuid(2), uuid(0)]), &c, &HostDevices::default()).unwrap();
        assert_eq!(
            a.envs,
            BTreeMap::from([(
                VISIBLE_DEVICES_ENV.to_string(),
                format!("{},{}", uuid(2), uuid(0))
            )])
        );
        assert!(a.mounts.is_empty() && a.device_specs.is_empty() && a.annotations.is_empty());
        assert!(a.cdi_devices.is_empty());
    }

    #[test]
    fn request_validation() {
        let host = HostDevices::default();
        let (r, c) = res("", vec![gpu(0)]);
        let err = allocate(&r, &s(&["GPU-nope".into()]), &c, &host).unwrap_err();
        assert_eq!(
            err.to_string(),
            "unknown device ID GPU-nope for resource nvidia.com/gpu"
        );
        assert!(allocate(&r, &[], &c, &host).is_err());

        let ts = "sharing:\n  timeSlicing:\n    failRequestsGreaterThanOne: true\n    resources: [{name: gpu, replicas: 4}]\n";
        let (r, c) = res(ts, vec![gpu(0), gpu(1)]);
        let ids = s(&[format!("{}::0", uuid(0)), format!("{}::1", uuid(0))]);
        let err = allocate(&r, &ids, &c, &host).unwrap_err().to_string();
        assert_eq!(
            err,
            "request for 'nvidia.com/gpu: 2' too large: maximum request size for shared resources is 1"
        );
        assert!(allocate(&r, &ids[..1], &c, &host).is_ok());

        // Without the flag, replicas of one GPU collapse to that GPU.
        let ts = "sharing:\n  timeSlicing:\n    resources: [{name: gpu, replicas: 4}]\n";
        let (r, c) = res(ts, vec![gpu(0), gpu(1)]);
        let ids = s(&[
            format!("{}::3", uuid(1)),
            format!("{}::0", uuid(0)),
            format!("{}::1", uuid(1)),
        ]);
        let a = allocate(&r, &ids, &c, &host).unwrap();
        assert_eq!(
            a.envs[VISIBLE_DEVICES_ENV],
            format!("{},{}", uuid(1), uuid(0))
        );
    }

    #[test]
    fn volume_mounts_hide_the_ids_from_env() {
        for strategies in ["volume-mounts", "[envvar, volume-mounts]"] {
            let (r, c) = res(
                &format!("flags:\n  plugin:\n    deviceListStrategy: {strategies}\n"),
                vec![gpu(0), gpu(1)],
            );
            let a = allocate(&r, &s(&[uuid(0), uuid(1)]), &c, &HostDevices::default()).unwrap();
            assert_eq!(a.envs[VISIBLE_DEVICES_ENV], VOLUME_MOUNTS_ROOT);
            assert_eq!(
                a.mounts,
                vec![
                    Mount {
                        container_path: format!("{VOLUME_MOUNTS_ROOT}/{}", uuid(0)),
                        host_path: "/dev/null".into(),
                        read_only: false
                    },
                    Mount {
                        container_path: format!("{VOLUME_MOUNTS_ROOT}/{}", uuid(1)),
                        host_path: "/dev/null".into(),
                        read_only: false
                    },
                ]
            );
        }
    }

    #[test]
    fn cdi_annotations_and_cri() {
        let host = HostDevices::default();
        let (r, c) = res(
            "flags:\n  plugin:\n    deviceListStrategy: [cdi-annotations, cdi-cri]\n    passDeviceSpecs: true\n",
            vec![gpu(0), gpu(1)],
        );
        let ids = s(&[uuid(0), uuid(1)]);
        let a = allocate(&r, &ids, &c, &host).unwrap();
        let want = format!("{CDI_KIND}={},{CDI_KIND}={}", uuid(0), uuid(1));
        assert_eq!(a.annotations.len(), 1);
        let (k, v) = a.annotations.iter().next().unwrap();
        assert_eq!(v, &want);
        let rid = k.strip_prefix("cdi.k8s.io/nvidia-device-plugin_").unwrap();
        let shape: Vec<usize> = rid.split('-').map(str::len).collect();
        assert_eq!(shape, vec![8, 4, 4, 4, 12], "{rid}");
        assert!(k.len() - "cdi.k8s.io/".len() <= 63);
        assert_eq!(
            a.cdi_devices,
            vec![
                format!("{CDI_KIND}={}", uuid(0)),
                format!("{CDI_KIND}={}", uuid(1))
            ]
        );
        // CDI only: no env, no device specs.
        assert!(a.envs.is_empty() && a.device_specs.is_empty());
        // Repeatable, and different for a different request.
        assert_eq!(allocate(&r, &ids, &c, &host).unwrap(), a);
        let other = allocate(&r, &ids[..1], &c, &host).unwrap();
        assert_ne!(other.annotations.keys().next(), Some(k));

        // A custom prefix, with envvar alongside.
        let (r, c) = res(
            "flags:\n  plugin:\n    deviceListStrategy: [envvar, cdi-annotations]\n    cdiAnnotationPrefix: cdi.example.com/\n",
            vec![gpu(0)],
        );
        let a = allocate(&r, &s(&[uuid(0)]), &c, &host).unwrap();
        assert!(
            a.annotations
                .keys()
                .all(|k| k.starts_with("cdi.example.com/nvidia-device-plugin_"))
        );
        assert_eq!(a.envs[VISIBLE_DEVICES_ENV], uuid(0));
    }

    #[test]
    fn index_id_strategy() {
        let host = HostDevices::default();
        let (r, c) = res(
            "flags:\n  plugin:\n    deviceIDStrategy: index\n    deviceListStrategy: [envvar, cdi-cri]\n",
            vec![gpu(0), gpu(1), gpu(2)],
        );
        let a = allocate(&r, &s(&[uuid(2), uuid(0)]), &c, &host).unwrap();
        assert_eq!(a.envs[VISIBLE_DEVICES_ENV], "2,0");
        assert_eq!(
            a.cdi_devices,
            vec![format!("{CDI_KIND}=2"), format!("{CDI_KIND}=0")]
        );
        let (r, c) = res(
            "flags:\n  migStrategy: single\n  plugin:\n    deviceIDStrategy: index\n",
            vec![mig_gpu(0, &["1g.10gb", "1g.10gb"])],
        );
        let a = allocate(&r, &s(&[mig_uuid(0, 1)]), &c, &host).unwrap();
        assert_eq!(a.envs[VISIBLE_DEVICES_ENV], "0:1");
    }

    #[test]
    fn device_specs_for_gpus_and_mig_devices() {
        let spec = |c: &str, h: &str| DeviceSpec {
            container_path: c.into(),
            host_path: h.into(),
            permissions: "rw".into(),
        };
        let (r, c) = res(
            "flags:\n  nvidiaDriverRoot: /run/nvidia/driver\n  plugin: {passDeviceSpecs: true}\n",
            vec![gpu(0), gpu(3)],
        );
        let a = allocate(&r, &s(&[uuid(3)]), &c, &HostDevices::default()).unwrap();
        assert_eq!(
            a.device_specs,
            vec![
                spec("/dev/nvidiactl", "/run/nvidia/driver/dev/nvidiactl"),
                spec("/dev/nvidia-uvm", "/run/nvidia/driver/dev/nvidia-uvm"),
                spec(
                    "/dev/nvidia-uvm-tools",
                    "/run/nvidia/driver/dev/nvidia-uvm-tools"
                ),
                spec(
                    "/dev/nvidia-modeset",
                    "/run/nvidia/driver/dev/nvidia-modeset"
                ),
                spec("/dev/nvidia3", "/run/nvidia/driver/dev/nvidia3"),
            ]
        );
        // Missing optional nodes are skipped; a GPU without a minor number is an error.
        let host = HostDevices {
            nvidia_modeset: false,
            nvidia_uvm_tools: false,
            ..HostDevices::default()
        };
        let (r, c) = res("flags: {plugin: {passDeviceSpecs: true}}", vec![gpu(0)]);
        let a = allocate(&r, &s(&[uuid(0)]), &c, &host).unwrap();
        let paths: Vec<&str> = a
            .device_specs
            .iter()
            .map(|d| d.host_path.as_str())
            .collect();
        assert_eq!(
            paths,
            vec!["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia0"]
        );
        let mut g = gpu(0);
        g.minor_number = None;
        let (r, c) = res("flags: {plugin: {passDeviceSpecs: true}}", vec![g]);
        assert_eq!(
            allocate(&r, &s(&[uuid(0)]), &c, &host).unwrap_err(),
            ResourcesError::NoMinorNumber { gpu: 0 }
        );

        // MIG: parent node plus GI and CI capability nodes.
        let (r, c) = res(
            "flags: {migStrategy: mixed, plugin: {passDeviceSpecs: true}}",
            vec![mig_gpu(1, &["1g.10gb", "1g.10gb"])],
        );
        assert_eq!(r.name, "nvidia.com/mig-1g.10gb");
        let only = HostDevices {
            nvidiactl: false,
            nvidia_uvm: false,
            nvidia_uvm_tools: false,
            nvidia_modeset: false,
            mig_minors: None,
        };
        let a = allocate(&r, &s(&[mig_uuid(1, 0), mig_uuid(1, 1)]), &c, &only).unwrap();
        let paths: Vec<&str> = a
            .device_specs
            .iter()
            .map(|d| d.container_path.as_str())
            .collect();
        // GPU minor 1: gpu1/gi1 = 3 + 135 + 9 = 147, gpu1/gi1/ci0 = 148; gi2 = 156, ci0 = 157.
        assert_eq!(
            paths,
            vec![
                "/dev/nvidia1",
                "/dev/nvidia-caps/nvidia-cap147",
                "/dev/nvidia-caps/nvidia-cap148",
                "/dev/nvidia-caps/nvidia-cap156",
                "/dev/nvidia-caps/nvidia-cap157",
            ]
        );
        // The driver's own mig-minors file wins.
        let with_file = HostDevices {
            mig_minors: Some(parse_mig_minors(
                "config 1\nmonitor 2\ngpu1/gi1/access 500\ngpu1/gi1/ci0/access 501\n",
            )),
            ..only
        };
        let a = allocate(&r, &s(&[mig_uuid(1, 0)]), &c, &with_file).unwrap();
        let paths: Vec<&str> = a
            .device_specs
            .iter()
            .map(|d| d.container_path.as_str())
            .collect();
        assert_eq!(
            paths,
            vec![
                "/dev/nvidia1",
                "/dev/nvidia-caps/nvidia-cap500",
                "/dev/nvidia-caps/nvidia-cap501",
            ]
        );
    }

    #[test]
    fn presumed_cap_minors_match_the_driver_layout() {
        assert_eq!(presumed_mig_cap_minors(0, 0, 0), (3, 4));
        assert_eq!(presumed_mig_cap_minors(0, 1, 0), (12, 13));
        assert_eq!(presumed_mig_cap_minors(0, 14, 7), (129, 137));
        assert_eq!(presumed_mig_cap_minors(1, 0, 0), (138, 139));
    }

    #[test]
    fn mps_pipe_and_shm() {
        let (r, c) = res(
            "flags: {mpsRoot: /run/nvidia/mps/}\nsharing:\n  mps:\n    renameByDefault: true\n    resources: [{name: gpu, replicas: 2}]\n",
            vec![gpu(0)],
        );
        let a = allocate(
            &r,
            &s(&[format!("{}::1", uuid(0))]),
            &c,
            &HostDevices::default(),
        )
        .unwrap();
        let pipe = "/run/nvidia/mps/nvidia.com/gpu.shared/pipe";
        assert_eq!(a.envs["CUDA_MPS_PIPE_DIRECTORY"], pipe);
        assert_eq!(a.envs[VISIBLE_DEVICES_ENV], uuid(0));
        assert_eq!(
            a.mounts,
            vec![
                Mount {
                    container_path: pipe.into(),
                    host_path: pipe.into(),
                    read_only: false
                },
                Mount {
                    container_path: "/dev/shm".into(),
                    host_path: "/run/nvidia/mps/shm".into(),
                    read_only: false
                },
            ]
        );
    }

    #[test]
    fn gds_mofed_gdrcopy_envs() {
        let (r, c) = res(
            "flags: {gdsEnabled: true, mofedEnabled: true, gdrcopyEnabled: false}",
            vec![gpu(0)],
        );
        let a = allocate(&r, &s(&[uuid(0)]), &c, &HostDevices::default()).unwrap();
        assert_eq!(
            a.envs.get("NVIDIA_GDS").map(String::as_str),
            Some("enabled")
        );
        assert_eq!(
            a.envs.get("NVIDIA_MOFED").map(String::as_str),
            Some("enabled")
        );
        assert!(!a.envs.contains_key("NVIDIA_GDRCOPY"));
    }
}
