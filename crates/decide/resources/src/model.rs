//! Which kubelet resources a node's GPUs become: MIG strategies, sharing (replicas, renames, device
//! selection), health and NUMA placement.

use crate::ResourcesError;
use crate::config::{
    Config, DeviceRef, MigStrategy, RESOURCE_PREFIX, ReplicatedDevices, SharingStrategy,
    qualify_resource_name,
};
use gpuops_inventory::{Gpu, Health, Inventory, MigDevice};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The longest device ID we hand to the kubelet.
pub const MAX_DEVICE_ID_LEN: usize = 63;

/// One kubelet extended resource served over its own socket.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Resource {
    /// `nvidia.com/gpu`, `nvidia.com/mig-1g.10gb`, `nvidia.com/gpu.shared`, ...
    pub name: String,
    /// File name in the kubelet's device-plugins directory: `nvidia-gpu.sock`, ...
    pub socket_name: String,
    /// Ordered by GPU index, MIG index, replica.
    pub devices: Vec<Device>,
    /// Replicas per physical device (1 = not shared).
    pub replicas: u32,
    pub sharing: SharingStrategy,
    pub fail_requests_greater_than_one: bool,
}

impl Resource {
    pub fn device(&self, id: &str) -> Option<&Device> {
        self.devices.iter().find(|d| d.id == id)
    }

    /// Whether the devices are MIG devices.
    pub fn is_mig(&self) -> bool {
        self.devices.iter().any(|d| d.backing.mig.is_some())
    }

    /// Number of devices the kubelet may allocate now.
    pub fn healthy_count(&self) -> usize {
        self.devices.iter().filter(|d| d.health_ok).count()
    }
}

/// One device ID advertised to the kubelet.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Device {
    /// `GPU-…`, `MIG-…`, or `<uuid>::<n>` for replicas.
    pub id: String,
    pub health_ok: bool,
    pub numa_node: Option<u32>,
    pub backing: Backing,
    /// `n` of `<uuid>::<n>`.
    pub replica: Option<u32>,
}

impl Device {
    /// The UUID of the physical device (GPU or MIG device) behind this ID.
    pub fn backing_uuid(&self) -> &str {
        self.backing.uuid()
    }
}

/// The physical device behind a device ID.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Backing {
    pub gpu_index: u32,
    pub gpu_uuid: String,
    /// `/dev/nvidiaN`'s N of the (parent) GPU.
    pub gpu_minor: Option<u32>,
    pub mig: Option<MigBacking>,
}

impl Backing {
    /// The MIG UUID for MIG devices, else the GPU UUID.
    pub fn uuid(&self) -> &str {
        self.mig.as_ref().map_or(&self.gpu_uuid, |m| &m.uuid)
    }

    /// The `index` device-ID strategy's form: `i` or `i:j`.
    pub fn index_id(&self) -> String {
        match &self.mig {
            Some(m) => format!("{}:{}", self.gpu_index, m.index),
            None => self.gpu_index.to_string(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MigBacking {
    pub uuid: String,
    pub gi_id: u32,
    pub ci_id: u32,
    /// Index among the parent's MIG devices (`j` of `i:j`).
    pub index: u32,
    /// The profile as NVIDIA names the resource (`1g.10gb`, `1c.3g.40gb`, `1g.10gb+me`).
    pub profile: String,
}

/// The MIG profile as it appears in NVIDIA's resource names.
pub fn mig_profile_name(m: &MigDevice) -> &str {
    if m.ci_profile.is_empty() {
        &m.profile
    } else {
        &m.ci_profile
    }
}

/// `nvidia.com/mig-<profile>` with `+` replaced by `.`.
pub fn mig_resource_name(profile: &str) -> String {
    format!("{RESOURCE_PREFIX}/mig-{}", profile.replace('+', "."))
}

/// `nvidia.com/gpu.shared` -> `nvidia-gpu.shared.sock`.
pub fn socket_name(resource: &str) -> String {
    let short = resource
        .strip_prefix(RESOURCE_PREFIX)
        .and_then(|s| s.strip_prefix('/'))
        .unwrap_or(resource);
    format!("nvidia-{}.sock", short.replace('/', "-"))
}

const GPU_RESOURCE: &str = "nvidia.com/gpu";

struct BaseDevice {
    resource: String,
    backing: Backing,
    health_ok: bool,
    numa_node: Option<u32>,
}

fn whole(g: &Gpu) -> BaseDevice {
    BaseDevice {
        resource: GPU_RESOURCE.to_string(),
        backing: Backing {
            gpu_index: g.index,
            gpu_uuid: g.uuid.clone(),
            gpu_minor: g.minor_number,
            mig: None,
        },
        health_ok: g.health == Health::Healthy,
        numa_node: g.numa_node,
    }
}

fn mig(g: &Gpu, m: &MigDevice, resource: String) -> BaseDevice {
    BaseDevice {
        resource,
        backing: Backing {
            gpu_index: g.index,
            gpu_uuid: g.uuid.clone(),
            gpu_minor: g.minor_number,
            mig: Some(MigBacking {
                uuid: m.uuid.clone(),
                gi_id: m.gi_id,
                ci_id: m.ci_id,
                index: m.index,
                profile: mig_profile_name(m).to_string(),
            }),
        },
        health_ok: g.health == Health::Healthy,
        numa_node: g.numa_node,
    }
}

fn base_devices(inv: &Inventory, strategy: MigStrategy) -> Result<Vec<BaseDevice>, ResourcesError> {
    // A GPU lost before we ever read it has no UUID to advertise.
    let mut gpus: Vec<&Gpu> = inv.gpus.iter().filter(|g| !g.uuid.is_empty()).collect();
    gpus.sort_by_key(|g| g.index);
    let mut out = Vec::new();
    match strategy {
        MigStrategy::None => out.extend(gpus.iter().map(|g| whole(g))),
        MigStrategy::Single => {
            let (enabled, disabled): (Vec<&Gpu>, Vec<&Gpu>) =
                gpus.iter().partition(|g| g.mig.current_enabled);
            if enabled.is_empty() {
                out.extend(gpus.iter().map(|g| whole(g)));
                return Ok(out);
            }
            if !disabled.is_empty() {
                return Err(ResourcesError::MixedMigModes {
                    enabled: enabled.iter().map(|g| g.index).collect(),
                    disabled: disabled.iter().map(|g| g.index).collect(),
                });
            }
            let empty: Vec<u32> = enabled
                .iter()
                .filter(|g| g.mig_devices.is_empty())
                .map(|g| g.index)
                .collect();
            if !empty.is_empty() {
                return Err(ResourcesError::NoMigDevices { gpus: empty });
            }
            let mut profiles: BTreeMap<String, Vec<u32>> = BTreeMap::new();
            for g in &enabled {
                for m in &g.mig_devices {
                    let e = profiles.entry(mig_profile_name(m).to_string()).or_default();
                    if !e.contains(&g.index) {
                        e.push(g.index);
                    }
                }
            }
            if profiles.len() > 1 {
                return Err(ResourcesError::MultipleMigProfiles { profiles });
            }
            for g in &enabled {
                let mut migs: Vec<&MigDevice> = g.mig_devices.iter().collect();
                migs.sort_by_key(|m| m.index);
                out.extend(migs.iter().map(|m| mig(g, m, GPU_RESOURCE.to_string())));
            }
        }
        MigStrategy::Mixed => {
            for g in &gpus {
                if g.mig.current_enabled {
                    let mut migs: Vec<&MigDevice> = g.mig_devices.iter().collect();
                    migs.sort_by_key(|m| m.index);
                    out.extend(
                        migs.iter()
                            .map(|m| mig(g, m, mig_resource_name(mig_profile_name(m)))),
                    );
                } else {
                    out.push(whole(g));
                }
            }
        }
    }
    Ok(out)
}

fn matches_ref(b: &Backing, r: &DeviceRef) -> bool {
    match r {
        DeviceRef::GpuIndex(i) => b.gpu_index == *i,
        DeviceRef::MigIndex(i, j) => {
            b.gpu_index == *i && b.mig.as_ref().is_some_and(|m| m.index == *j)
        }
        DeviceRef::Uuid(u) => b.gpu_uuid == *u || b.mig.as_ref().is_some_and(|m| m.uuid == *u),
    }
}

#[derive(Clone, PartialEq, Eq)]
struct Sharing {
    replicas: u32,
    strategy: SharingStrategy,
    fail_gt1: bool,
}

impl Sharing {
    fn describe(&self) -> String {
        if self.replicas <= 1 {
            "not shared".into()
        } else {
            format!("{} with {} replicas", self.strategy.as_str(), self.replicas)
        }
    }
}

/// Whether the GPUs' MIG layout fits the MIG strategy: `single` needs every GPU in one MIG mode,
/// no MIG-enabled GPU without MIG devices, and one profile node-wide. The error says what does
/// not fit; see [`is_invalid_mig_layout`].
pub fn mig_strategy_check(inv: &Inventory, strategy: MigStrategy) -> Result<(), ResourcesError> {
    base_devices(inv, strategy).map(|_| ())
}

/// Whether `e` says the node's MIG layout does not fit the strategy (a state of the GPUs that a
/// repartition or another strategy fixes), not that the config or the inventory is wrong. GFD
/// labels such a node `<product>-MIG-INVALID` and keeps running; so does the agent.
pub fn is_invalid_mig_layout(e: &ResourcesError) -> bool {
    matches!(
        e,
        ResourcesError::MixedMigModes { .. }
            | ResourcesError::MultipleMigProfiles { .. }
            | ResourcesError::NoMigDevices { .. }
    )
}

/// The resources `inv`'s GPUs become under `cfg`, ordered by name. Resources with no devices are
/// left out. Unhealthy GPUs' devices are present with `health_ok: false`.
pub fn resources(inv: &Inventory, cfg: &Config) -> Result<Vec<Resource>, ResourcesError> {
    let base = base_devices(inv, cfg.mig_strategy())?;
    let (strategy, section) = cfg.sharing.active();
    // Which sharing entry (index, display name) each base device belongs to.
    let mut assigned: Vec<Option<usize>> = vec![None; base.len()];
    let mut targets: Vec<(String, Sharing)> = Vec::new();
    if let Some(section) = section {
        for (ei, entry) in section.resources.iter().enumerate() {
            let name = qualify_resource_name(&entry.name.value)
                .map_err(|e| ResourcesError::InvalidName(Box::new(e)))?;
            let target = match &entry.rename {
                Some(r) => qualify_resource_name(&r.value)
                    .map_err(|e| ResourcesError::InvalidName(Box::new(e)))?,
                None if section.rename_by_default => {
                    qualify_resource_name(&format!("{name}.shared"))
                        .map_err(|e| ResourcesError::InvalidName(Box::new(e)))?
                }
                None => name.clone(),
            };
            let replicas = entry
                .replicas
                .value
                .and_then(|n| u32::try_from(n).ok())
                .unwrap_or(1)
                .max(1);
            targets.push((
                target,
                Sharing {
                    replicas,
                    strategy,
                    fail_gt1: section.fail_requests_greater_than_one
                        || strategy == SharingStrategy::Mps,
                },
            ));
            let candidates: Vec<usize> = (0..base.len())
                .filter(|&i| base[i].resource == name)
                .collect();
            let selected: Vec<usize> = match &entry.devices.value {
                ReplicatedDevices::All => candidates,
                ReplicatedDevices::Count(n) => candidates.into_iter().take(*n as usize).collect(),
                ReplicatedDevices::List(refs) => candidates
                    .into_iter()
                    .filter(|&i| refs.iter().any(|r| matches_ref(&base[i].backing, r)))
                    .collect(),
            };
            for i in selected {
                if let Some(prev) = assigned[i] {
                    return Err(ResourcesError::DeviceSharedTwice {
                        device: base[i].backing.uuid().to_string(),
                        gpu: base[i].backing.gpu_index,
                        first: format!("#{} ({})", prev + 1, section.resources[prev].name.value),
                        second: format!("#{} ({})", ei + 1, entry.name.value),
                    });
                }
                assigned[i] = Some(ei);
            }
        }
    }

    let not_shared = Sharing {
        replicas: 1,
        strategy: SharingStrategy::None,
        fail_gt1: false,
    };
    let mut out: BTreeMap<String, Resource> = BTreeMap::new();
    for (i, d) in base.iter().enumerate() {
        let (name, sharing) = match assigned[i] {
            Some(e) => (&targets[e].0, &targets[e].1),
            None => (&d.resource, &not_shared),
        };
        let r = out.entry(name.clone()).or_insert_with(|| Resource {
            name: name.clone(),
            socket_name: socket_name(name),
            devices: Vec::new(),
            replicas: sharing.replicas,
            sharing: if sharing.replicas > 1 {
                sharing.strategy
            } else {
                SharingStrategy::None
            },
            fail_requests_greater_than_one: sharing.replicas > 1 && sharing.fail_gt1,
        });
        let existing = Sharing {
            replicas: r.replicas,
            strategy: r.sharing,
            fail_gt1: r.fail_requests_greater_than_one,
        };
        let mine = if sharing.replicas > 1 {
            sharing.clone()
        } else {
            not_shared.clone()
        };
        if existing != mine {
            return Err(ResourcesError::ConflictingSharing {
                name: name.clone(),
                a: existing.describe(),
                b: mine.describe(),
            });
        }
        let uuid = d.backing.uuid();
        let ids: Vec<(String, Option<u32>)> = if sharing.replicas > 1 {
            (0..sharing.replicas)
                .map(|n| (format!("{uuid}::{n}"), Some(n)))
                .collect()
        } else {
            vec![(uuid.to_string(), None)]
        };
        for (id, replica) in ids {
            if id.len() > MAX_DEVICE_ID_LEN {
                return Err(ResourcesError::IdTooLong {
                    id,
                    gpu: d.backing.gpu_index,
                    max: MAX_DEVICE_ID_LEN,
                });
            }
            r.devices.push(Device {
                id,
                health_ok: d.health_ok,
                numa_node: d.numa_node,
                backing: d.backing.clone(),
                replica,
            });
        }
    }
    Ok(out
        .into_values()
        .filter(|r| !r.devices.is_empty())
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{cfg, gpu, inv, mig_gpu, mig_uuid, uuid};
    use gpuops_inventory::Health;

    fn names(rs: &[Resource]) -> Vec<(&str, &str, usize)> {
        rs.iter()
            .map(|r| (r.name.as_str(), r.socket_name.as_str(), r.devices.len()))
            .collect()
    }

    fn ids(r: &Resource) -> Vec<&str> {
        r.devices.iter().map(|d| d.id.as_str()).collect()
    }

    #[test]
    fn whole_gpus_with_numa_and_health() {
        let mut lost = gpu(2);
        lost.health = Health::Lost;
        let mut never_read = gpu(3);
        never_read.uuid.clear();
        never_read.health = Health::Lost;
        let mut bad = gpu(5);
        bad.health = Health::Unreachable { reason: "x".into() };
        let i = inv(vec![gpu(4), gpu(0), lost, never_read, bad]);
        let rs = resources(&i, &cfg("")).unwrap();
        assert_eq!(names(&rs), vec![("nvidia.com/gpu", "nvidia-gpu.sock", 4)]);
        let r = &rs[0];
        assert_eq!(ids(r), vec![uuid(0), uuid(2), uuid(4), uuid(5)]);
        let ok: Vec<bool> = r.devices.iter().map(|d| d.health_ok).collect();
        assert_eq!(ok, vec![true, false, true, false]);
        let numa: Vec<Option<u32>> = r.devices.iter().map(|d| d.numa_node).collect();
        assert_eq!(numa, vec![Some(0), Some(0), Some(1), Some(1)]);
        assert_eq!(r.replicas, 1);
        assert_eq!(r.sharing, SharingStrategy::None);
        assert!(!r.fail_requests_greater_than_one);
        assert_eq!(r.healthy_count(), 2);
        assert_eq!(r.devices[2].backing.gpu_minor, Some(4));
    }

    #[test]
    fn the_seeds_daemonset_env_gives_plain_nvidia_gpu() {
        use crate::config::Overrides;
        let env = Overrides::from_env([
            ("FAIL_ON_INIT_ERROR", "false"),
            ("DEVICE_SPLIT_COUNT", "1"),
            ("DEVICE_LIST_STRATEGY", "envvar"),
        ])
        .unwrap();
        let c = Config::effective(None, &env, &Overrides::default()).unwrap();
        let rs = resources(&inv(vec![gpu(0), gpu(1)]), &c).unwrap();
        assert_eq!(names(&rs), vec![("nvidia.com/gpu", "nvidia-gpu.sock", 2)]);
        assert_eq!(ids(&rs[0]), vec![uuid(0), uuid(1)]);
        assert_eq!((rs[0].replicas, rs[0].sharing), (1, SharingStrategy::None));
    }

    #[test]
    fn strategy_none_shows_mig_gpus_whole() {
        let i = inv(vec![gpu(0), mig_gpu(1, &["1g.10gb", "1g.10gb"])]);
        let rs = resources(&i, &cfg("flags: {migStrategy: none}")).unwrap();
        assert_eq!(names(&rs), vec![("nvidia.com/gpu", "nvidia-gpu.sock", 2)]);
        assert!(rs[0].devices.iter().all(|d| d.backing.mig.is_none()));
    }

    #[test]
    fn strategy_single_advertises_mig_devices_as_gpus() {
        let single = cfg("flags: {migStrategy: single}");
        let i = inv(vec![
            mig_gpu(1, &["1g.10gb", "1g.10gb"]),
            mig_gpu(0, &["1g.10gb"]),
        ]);
        let rs = resources(&i, &single).unwrap();
        assert_eq!(names(&rs), vec![("nvidia.com/gpu", "nvidia-gpu.sock", 3)]);
        assert_eq!(
            ids(&rs[0]),
            vec![mig_uuid(0, 0), mig_uuid(1, 0), mig_uuid(1, 1)]
        );
        let b = &rs[0].devices[2].backing;
        assert_eq!((b.gpu_index, b.index_id()), (1, "1:1".to_string()));
        assert_eq!(b.mig.as_ref().map(|m| (m.gi_id, m.ci_id)), Some((2, 0)));
        // No MIG anywhere: whole GPUs.
        let rs = resources(&inv(vec![gpu(0), gpu(1)]), &single).unwrap();
        assert_eq!(ids(&rs[0]), vec![uuid(0), uuid(1)]);
    }

    #[test]
    fn strategy_single_errors_name_the_gpus() {
        let single = cfg("flags: {migStrategy: single}");
        let cases = [
            (
                inv(vec![mig_gpu(0, &["1g.10gb"]), gpu(1), gpu(2)]),
                "MIG is enabled on GPU 0 and disabled on GPU 1, 2",
            ),
            (
                inv(vec![
                    mig_gpu(0, &["1g.10gb"]),
                    mig_gpu(1, &["2g.20gb", "1g.10gb"]),
                ]),
                "found 1g.10gb (GPU 0, 1), 2g.20gb (GPU 1)",
            ),
            (
                inv(vec![mig_gpu(0, &["1g.10gb"]), mig_gpu(3, &[])]),
                "MIG is enabled on GPU 3 but it has no MIG devices",
            ),
        ];
        for (i, want) in cases {
            let err = resources(&i, &single).unwrap_err().to_string();
            assert!(err.contains(want), "{err}");
        }
    }

    /// The layouts single cannot serve are told apart from config errors: the agent keeps
    /// running on them (advertising nothing), as GFD keeps labelling them `-MIG-INVALID`.
    #[test]
    fn invalid_single_layouts_are_classified_and_checked_alone() {
        let single = cfg("flags: {migStrategy: single}");
        let mixed_profiles = inv(vec![
            mig_gpu(0, &["1g.10gb"]),
            mig_gpu(1, &["2g.20gb", "1g.10gb"]),
        ]);
        for i in [
            mixed_profiles.clone(),
            inv(vec![mig_gpu(0, &["1g.10gb"]), gpu(1)]),
            inv(vec![mig_gpu(0, &["1g.10gb"]), mig_gpu(1, &[])]),
        ] {
            let err = mig_strategy_check(&i, MigStrategy::Single).unwrap_err();
            assert!(is_invalid_mig_layout(&err), "{err}");
            let via_resources = resources(&i, &single).unwrap_err();
            assert!(is_invalid_mig_layout(&via_resources));
        }
        // The same layouts fit mixed, and one profile fits single.
        mig_strategy_check(&mixed_profiles, MigStrategy::Mixed).unwrap();
        mig_strategy_check(&mixed_profiles, MigStrategy::None).unwrap();
        mig_strategy_check(&inv(vec![mig_gpu(0, &["1g.10gb"])]), MigStrategy::Single).unwrap();
        // A bad resource name is a config error, not a layout.
        let bad =
            ResourcesError::InvalidName(Box::new(ResourcesError::NoMigDevices { gpus: vec![0] }));
        assert!(!is_invalid_mig_layout(&bad));
    }

    #[test]
    fn strategy_mixed_has_one_resource_per_profile() {
        let mut g1 = mig_gpu(1, &["3g.40gb", "3g.40gb"]);
        g1.mig_devices[1].ci_profile = "1c.3g.40gb".into();
        let i = inv(vec![
            mig_gpu(0, &["1g.10gb", "2g.20gb", "1g.10gb", "1g.10gb+me"]),
            g1,
            gpu(2),
            mig_gpu(3, &[]),
        ]);
        let rs = resources(&i, &cfg("flags: {migStrategy: mixed}")).unwrap();
        assert_eq!(
            names(&rs),
            vec![
                ("nvidia.com/gpu", "nvidia-gpu.sock", 1),
                ("nvidia.com/mig-1c.3g.40gb", "nvidia-mig-1c.3g.40gb.sock", 1),
                ("nvidia.com/mig-1g.10gb", "nvidia-mig-1g.10gb.sock", 2),
                ("nvidia.com/mig-1g.10gb.me", "nvidia-mig-1g.10gb.me.sock", 1),
                ("nvidia.com/mig-2g.20gb", "nvidia-mig-2g.20gb.sock", 1),
                ("nvidia.com/mig-3g.40gb", "nvidia-mig-3g.40gb.sock", 1),
            ]
        );
        assert_eq!(ids(&rs[0]), vec![uuid(2)]);
        assert_eq!(ids(&rs[2]), vec![mig_uuid(0, 0), mig_uuid(0, 2)]);
    }

    #[test]
    fn replicas_renames_and_device_selection() {
        let ts = |body: &str| format!("sharing:\n  timeSlicing:\n{body}");
        let two = || inv(vec![gpu(0), gpu(1)]);
        // (inventory, config, expected (name, replicas, ids))
        type Want = Vec<(&'static str, u32, Vec<String>)>;
        let r = |g: u32, n: u32| -> Vec<String> {
            (0..n).map(|k| format!("{}::{k}", uuid(g))).collect()
        };
        let cases: Vec<(Inventory, String, Want)> = vec![
            (
                two(),
                ts("    resources: [{name: nvidia.com/gpu, replicas: 2}]\n"),
                vec![("nvidia.com/gpu", 2, [r(0, 2), r(1, 2)].concat())],
            ),
            (
                two(),
                ts("    renameByDefault: true\n    resources: [{name: gpu, replicas: 3}]\n"),
                vec![("nvidia.com/gpu.shared", 3, [r(0, 3), r(1, 3)].concat())],
            ),
            (
                two(),
                ts(
                    "    renameByDefault: true\n    resources: [{name: gpu, rename: gpu-small, replicas: 2}]\n",
                ),
                vec![("nvidia.com/gpu-small", 2, [r(0, 2), r(1, 2)].concat())],
            ),
            (
                two(),
                ts(
                    "    renameByDefault: true\n    resources: [{name: gpu, devices: [1], replicas: 2}]\n",
                ),
                vec![
                    ("nvidia.com/gpu", 1, vec![uuid(0)]),
                    ("nvidia.com/gpu.shared", 2, r(1, 2)),
                ],
            ),
            (
                two(),
                ts(
                    "    renameByDefault: true\n    resources: [{name: gpu, devices: 1, replicas: 2}]\n",
                ),
                vec![
                    ("nvidia.com/gpu", 1, vec![uuid(1)]),
                    ("nvidia.com/gpu.shared", 2, r(0, 2)),
                ],
            ),
            (
                two(),
                ts(&format!(
                    "    resources:\n      - {{name: gpu, rename: a, devices: [{}], replicas: 2}}\n      - {{name: gpu, rename: b, devices: [1], replicas: 4}}\n",
                    uuid(0)
                )),
                vec![("nvidia.com/a", 2, r(0, 2)), ("nvidia.com/b", 4, r(1, 4))],
            ),
            (
                // A sharing entry for a resource this node lacks is ignored.
                two(),
                ts("    resources: [{name: mig-1g.10gb, replicas: 2}]\n"),
                vec![("nvidia.com/gpu", 1, vec![uuid(0), uuid(1)])],
            ),
            (
                inv(vec![mig_gpu(0, &["1g.10gb", "1g.10gb"]), gpu(1)]),
                format!(
                    "flags: {{migStrategy: mixed}}\n{}",
                    ts(
                        "    renameByDefault: true\n    resources: [{name: mig-1g.10gb, devices: [\"0:1\"], replicas: 2}]\n"
                    )
                ),
                vec![
                    ("nvidia.com/gpu", 1, vec![uuid(1)]),
                    ("nvidia.com/mig-1g.10gb", 1, vec![mig_uuid(0, 0)]),
                    (
                        "nvidia.com/mig-1g.10gb.shared",
                        2,
                        vec![
                            format!("{}::0", mig_uuid(0, 1)),
                            format!("{}::1", mig_uuid(0, 1)),
                        ],
                    ),
                ],
            ),
        ];
        for (i, (inventory, text, want)) in cases.into_iter().enumerate() {
            let rs = resources(&inventory, &cfg(&text)).unwrap();
            let got: Vec<(&str, u32, Vec<String>)> = rs
                .iter()
                .map(|r| {
                    (
                        r.name.as_str(),
                        r.replicas,
                        ids(r).iter().map(|s| s.to_string()).collect(),
                    )
                })
                .collect();
            assert_eq!(got, want, "case {i}: {text}");
            for r in &rs {
                assert_eq!(r.socket_name, socket_name(&r.name));
                let shared = r.replicas > 1;
                assert_eq!(r.sharing == SharingStrategy::TimeSlicing, shared);
                for d in &r.devices {
                    assert_eq!(d.replica.is_some(), shared);
                }
            }
        }
    }

    #[test]
    fn sharing_flags_follow_the_section() {
        let two = inv(vec![gpu(0), gpu(1)]);
        let rs = resources(
            &two,
            &cfg("sharing:\n  timeSlicing:\n    failRequestsGreaterThanOne: true\n    resources: [{name: gpu, replicas: 2}]\n"),
        )
        .unwrap();
        assert!(rs[0].fail_requests_greater_than_one);
        let rs = resources(
            &two,
            &cfg("sharing:\n  mps:\n    resources: [{name: gpu, replicas: 2}]\n"),
        )
        .unwrap();
        assert_eq!(rs[0].sharing, SharingStrategy::Mps);
        assert!(rs[0].fail_requests_greater_than_one);
        // The config as parsed (not made effective) still forces it for MPS.
        let raw = Config::parse(
            "sharing:\n  mps:\n    resources: [{name: gpu, replicas: 2}]\n",
            "f",
        )
        .unwrap();
        assert!(resources(&two, &raw).unwrap()[0].fail_requests_greater_than_one);
    }

    #[test]
    fn unhealthy_gpus_replicas_are_all_unhealthy() {
        let mut g = gpu(1);
        g.health = Health::Lost;
        let rs = resources(
            &inv(vec![gpu(0), g]),
            &cfg("sharing:\n  timeSlicing:\n    resources: [{name: gpu, replicas: 3}]\n"),
        )
        .unwrap();
        let ok: Vec<bool> = rs[0].devices.iter().map(|d| d.health_ok).collect();
        assert_eq!(ok, vec![true, true, true, false, false, false]);
    }

    #[test]
    fn sharing_errors() {
        let two = || inv(vec![gpu(0), gpu(1)]);
        let ts = |body: &str| format!("sharing:\n  timeSlicing:\n{body}");
        let mut long = gpu(0);
        long.uuid = format!("GPU-{}", "a".repeat(58));
        let cases = [
            (
                two(),
                ts("    resources: [{name: gpu, devices: [0], replicas: 2}]\n"),
                "resource nvidia.com/gpu would mix devices with different sharing (time-slicing with 2 replicas and not shared)",
            ),
            (
                two(),
                ts(
                    "    resources:\n      - {name: gpu, rename: a, devices: [0], replicas: 2}\n      - {name: gpu, rename: b, devices: all, replicas: 2}\n",
                ),
                "device GPU-00000000-1111-2222-3333-444444444444 (GPU 0) is selected by two sharing entries: #1 (gpu) and #2 (gpu)",
            ),
            (
                two(),
                ts(
                    "    resources:\n      - {name: gpu, rename: a, devices: [0], replicas: 2}\n      - {name: gpu, rename: a, devices: [1], replicas: 3}\n",
                ),
                "resource nvidia.com/a would mix devices with different sharing",
            ),
            (
                inv(vec![long]),
                ts("    resources: [{name: gpu, replicas: 2}]\n"),
                "(GPU 0) is longer than 63 characters",
            ),
        ];
        for (inventory, text, want) in cases {
            let err = resources(&inventory, &cfg(&text)).unwrap_err().to_string();
            assert!(err.contains(want), "{text}: {err}");
        }
        // Replicas of the same count under one name merge fine.
        let rs = resources(
            &two(),
            &cfg(&ts("    resources:\n      - {name: gpu, rename: a, devices: [0], replicas: 2}\n      - {name: gpu, rename: a, devices: [1], replicas: 2}\n")),
        )
        .unwrap();
        assert_eq!(rs.len(), 1);
        assert_eq!(rs[0].devices.len(), 4);
    }
}
