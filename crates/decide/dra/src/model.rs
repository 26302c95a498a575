//! The devices a node publishes, built from its inventory snapshot: our own plain types, so the
//! agent can compare, log and test them; [`crate::slices`] turns them into ResourceSlices.
//!
//! Per GPU, exactly one of:
//! - MIG mode off (and not dynamic): the whole GPU `gpu-<minor>`;
//! - MIG mode on (static): only the MIG devices that exist, never the whole GPU beside them
//!   (NVIDIA's issue 719 is a node offering both);
//! - dynamic MIG: every valid placement as a partitionable device consuming the GPU's counter set,
//!   plus the whole GPU consuming all of it, so the scheduler can never hand out both. The whole
//!   GPU is left out where leaving MIG mode needs a GPU reset (MIG mode on before Hopper).

use crate::health::{Taint, TaintEffect, Unhealthy, taint_for};
use crate::names::{self, ATTR_NUMA_NODE, ATTR_PCI_BUS_ID, ATTR_PCIE_ROOT, DEFAULT_BRAND};
use gpuops_catalog::{GiProfile, GpuModel};
use gpuops_inventory::{Gpu, Health, Inventory, MigDevice};
use gpuops_mig::{Instance, Layout};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

const MIB: u64 = 1024 * 1024;

/// The longest string or version attribute value the API accepts.
pub const MAX_ATTRIBUTE_VALUE_LEN: usize = 64;

/// What the node publishes, decided by the agent's flags and the cluster's feature gates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Options {
    /// Publish every MIG placement as a partitionable device (gate `DRAPartitionableDevices`).
    pub dynamic_mig: bool,
    /// Mark unhealthy devices with taints (gate `DRADeviceTaints`); without it they leave the slice.
    pub device_taints: bool,
    /// The effect of health taints.
    pub unhealthy_effect: TaintEffect,
}

/// What the agent knows beyond the inventory snapshot (it reads these from sysfs and its XID
/// watcher; this crate does no I/O).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct NodeFacts {
    /// PCIe root per PCI bus id (either spelling, see [`names::normalize_pci_bus_id`]), e.g.
    /// `pci0000:00`, from [`names::pcie_root_from_sysfs_link`]. GPUs without one get no
    /// `resource.kubernetes.io/pcieRoot`, as NVIDIA's driver does when sysfs does not tell.
    pub pcie_roots: BTreeMap<String, String>,
    /// NVML's brand per GPU UUID where it is not [`DEFAULT_BRAND`].
    pub brands: BTreeMap<String, String>,
    /// Unhealthy GPUs and MIG devices, by UUID (a GPU's mark covers every device on it). GPUs
    /// the inventory reports lost or unreachable count as [`Unhealthy::GpuLost`] without an entry.
    pub unhealthy: BTreeMap<String, Unhealthy>,
}

/// `type` attribute values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DeviceType {
    Gpu,
    Mig,
}

impl DeviceType {
    pub fn as_str(self) -> &'static str {
        match self {
            DeviceType::Gpu => "gpu",
            DeviceType::Mig => "mig",
        }
    }
}

/// One attribute value; DRA has exactly these four kinds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AttrValue {
    String(String),
    Int(i64),
    Bool(bool),
    /// Semantic version 2.0.0 (`580.105.8`).
    Version(String),
}

/// Where a MIG device sits on its GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MigPlacement {
    /// The profile as published in the `profile` attribute (`1g.10gb`, `1c.3g.40gb` for a
    /// compute instance smaller than its GPU instance).
    pub profile: String,
    /// NVML GPU-instance profile id (`nvidia-smi mig -lgip`), the one in the device name.
    pub gi_profile_id: u32,
    pub placement_start: u32,
    pub placement_size: u32,
    /// The MIG device's UUID where it exists: always in static MIG; in dynamic MIG once an
    /// instance sits at this placement (for the preparer; never published as an attribute there,
    /// so the slice does not change when a claim's instance is created).
    pub uuid: Option<String>,
}

/// What a device takes from its GPU's counter set when allocated (dynamic MIG).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CounterConsumption {
    pub counter_set: String,
    pub counters: BTreeMap<String, u64>,
}

/// A GPU's shared counters (dynamic MIG): one per capacity plus one per memory slice.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CounterSet {
    pub name: String,
    pub counters: BTreeMap<String, u64>,
}

/// One device as published.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Device {
    pub name: String,
    pub device_type: DeviceType,
    /// The GPU it is or lives on.
    pub gpu_uuid: String,
    pub gpu_minor: u32,
    pub gpu_index: u32,
    pub mig: Option<MigPlacement>,
    pub attributes: BTreeMap<String, AttrValue>,
    /// Capacities in their units (bytes for `memory`, counts otherwise).
    pub capacity: BTreeMap<String, u64>,
    pub consumes: Option<CounterConsumption>,
    pub taints: Vec<Taint>,
}

/// Everything one node publishes: devices in publishing order (GPUs by PCI bus id, then device
/// names in byte order, as NVIDIA's driver sorts them in dynamic MIG; its static order is Go's map
/// order, so any fixed order matches it; the scheduler takes the first match), the counter sets of
/// dynamic MIG, and what was left out and why.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct DeviceModel {
    pub devices: Vec<Device>,
    pub counter_sets: Vec<CounterSet>,
    pub warnings: Vec<String>,
}

impl DeviceModel {
    pub fn device(&self, name: &str) -> Option<&Device> {
        self.devices.iter().find(|d| d.name == name)
    }
}

/// The devices `inv` publishes under `opts`.
pub fn build(inv: &Inventory, facts: &NodeFacts, opts: &Options) -> DeviceModel {
    let mut out = DeviceModel::default();
    let mut gpus: Vec<&Gpu> = inv.gpus.iter().collect();
    gpus.sort_by_key(|g| {
        (
            names::normalize_pci_bus_id(&g.pci_bus_id).unwrap_or_else(|| g.pci_bus_id.clone()),
            g.index,
        )
    });
    for gpu in gpus {
        add_gpu(inv, gpu, facts, opts, &mut out);
    }
    out
}

fn add_gpu(inv: &Inventory, gpu: &Gpu, facts: &NodeFacts, opts: &Options, out: &mut DeviceModel) {
    let Some(minor) = gpu.minor_number else {
        out.warnings.push(format!(
            "GPU {} ({}): no minor number, so no device name; not published",
            gpu.index, gpu.pci_bus_id
        ));
        return;
    };
    if gpu.uuid.is_empty() {
        out.warnings.push(format!(
            "GPU {} ({}): never read (no UUID); not published",
            gpu.index, gpu.pci_bus_id
        ));
        return;
    }
    let gpu_mark = facts
        .unhealthy
        .get(&gpu.uuid)
        .cloned()
        .or(match gpu.health {
            Health::Healthy => None,
            Health::Lost | Health::Unreachable { .. } => Some(Unhealthy::GpuLost),
        });
    if gpu_mark.is_some() && !opts.device_taints {
        out.warnings.push(format!(
            "GPU {} ({}): unhealthy; its devices leave the slice until it recovers",
            gpu.index, gpu.uuid
        ));
        return;
    }
    let gpu_taints: Vec<Taint> = gpu_mark
        .iter()
        .map(|m| taint_for(m, opts.unhealthy_effect))
        .collect();
    let model = gpu
        .model
        .as_deref()
        .and_then(|k| gpuops_catalog::lookup(k).ok());
    let common = common_attributes(inv, gpu, facts, &mut out.warnings);
    let mut devices = Vec::new();

    let dynamic = opts.dynamic_mig && gpu.mig.capable && model.is_some_and(|m| m.mig.is_some());
    // Before Hopper, leaving MIG mode needs a GPU reset: such a GPU in MIG mode cannot become
    // whole at prepare time, and one out of MIG mode cannot be partitioned.
    let toggles = model
        .and_then(|m| m.mig.as_ref())
        .is_some_and(|g| !g.mode_persists_across_reload);
    match model {
        Some(model) if dynamic && (toggles || gpu.mig.current_enabled) => {
            let parts = dynamic_devices(gpu, minor, model, &common, facts, opts, &gpu_taints);
            let (set, parts) = match parts {
                Some(p) => p,
                None => return,
            };
            if toggles || !gpu.mig.current_enabled {
                let mut whole = whole_gpu(gpu, minor, &common, gpu_taints.clone());
                whole.capacity = set.max_capacities.clone();
                whole.consumes = Some(CounterConsumption {
                    counter_set: set.counters.name.clone(),
                    counters: set.counters.counters.clone(),
                });
                devices.push(whole);
            }
            devices.extend(parts);
            out.counter_sets.push(set.counters);
        }
        _ if !gpu.mig.current_enabled => {
            let mut whole = whole_gpu(gpu, minor, &common, gpu_taints);
            whole
                .capacity
                .insert("memory".into(), gpu.memory.total_mib * MIB);
            devices.push(whole);
        }
        _ => {
            if gpu.mig_devices.is_empty() {
                out.warnings.push(format!(
                    "GPU {} ({}): MIG mode is on but it has no MIG devices; nothing to publish",
                    gpu.index, gpu.uuid
                ));
            }
            for mig in &gpu.mig_devices {
                if !opts.device_taints && facts.unhealthy.contains_key(&mig.uuid) {
                    out.warnings.push(format!(
                        "GPU {}: MIG device {} is unhealthy; it leaves the slice until it recovers",
                        gpu.index, mig.uuid
                    ));
                    continue;
                }
                let dev = static_mig(gpu, minor, model, mig, &common, facts, opts, &gpu_taints);
                if devices.iter().any(|d: &Device| d.name == dev.name) {
                    out.warnings.push(format!(
                        "GPU {}: {} is a second compute instance in one GPU instance; only the first is published (device names identify GPU instances)",
                        gpu.index, mig.uuid
                    ));
                    continue;
                }
                devices.push(dev);
            }
        }
    }
    devices.sort_by(|a, b| a.name.cmp(&b.name));
    // The API refuses a whole slice over one string longer than 64 characters: leave the value out.
    let mut too_long = BTreeMap::new();
    for d in &mut devices {
        d.attributes.retain(|k, v| match v {
            AttrValue::String(s) | AttrValue::Version(s) if s.len() > MAX_ATTRIBUTE_VALUE_LEN => {
                too_long.insert(k.clone(), s.clone());
                false
            }
            _ => true,
        });
    }
    for (k, v) in too_long {
        out.warnings.push(format!(
            "GPU {}: {k} {v:?} is longer than {MAX_ATTRIBUTE_VALUE_LEN} characters; attribute left out",
            gpu.index
        ));
    }
    out.devices.extend(devices);
}

/// Attributes every device of a GPU carries (the MIG ones add theirs).
fn common_attributes(
    inv: &Inventory,
    gpu: &Gpu,
    facts: &NodeFacts,
    warnings: &mut Vec<String>,
) -> BTreeMap<String, AttrValue> {
    let mut a = BTreeMap::new();
    let s = |v: &str| AttrValue::String(v.to_string());
    a.insert("productName".into(), s(&gpu.name));
    a.insert(
        "brand".into(),
        s(facts
            .brands
            .get(&gpu.uuid)
            .map_or(DEFAULT_BRAND, String::as_str)),
    );
    a.insert(
        "architecture".into(),
        s(names::architecture_name(gpu.compute_capability)),
    );
    let mut version = |key: &str, raw: Option<String>| match raw.as_deref().and_then(names::semver)
    {
        Some(v) => {
            a.insert(key.to_string(), AttrValue::Version(v));
        }
        None => warnings.push(format!(
            "GPU {}: {key} {:?} is not a version; attribute left out",
            gpu.index,
            raw.unwrap_or_default()
        )),
    };
    version(
        "cudaComputeCapability",
        gpu.compute_capability.map(|(ma, mi)| format!("{ma}.{mi}")),
    );
    version("driverVersion", Some(inv.driver_version.clone()));
    version("cudaDriverVersion", Some(inv.cuda_driver_version.clone()));
    match names::normalize_pci_bus_id(&gpu.pci_bus_id) {
        Some(id) => {
            let root = facts
                .pcie_roots
                .get(&id)
                .or_else(|| facts.pcie_roots.get(&gpu.pci_bus_id));
            if let Some(root) = root {
                a.insert(ATTR_PCIE_ROOT.into(), s(root));
            }
            a.insert(ATTR_PCI_BUS_ID.into(), AttrValue::String(id));
        }
        None => warnings.push(format!(
            "GPU {}: PCI bus id {:?} is not a PCI address; {ATTR_PCI_BUS_ID} left out",
            gpu.index, gpu.pci_bus_id
        )),
    }
    if let Some(numa) = gpu.numa_node {
        a.insert(ATTR_NUMA_NODE.into(), AttrValue::Int(i64::from(numa)));
    }
    a
}

fn whole_gpu(
    gpu: &Gpu,
    minor: u32,
    common: &BTreeMap<String, AttrValue>,
    taints: Vec<Taint>,
) -> Device {
    let mut attributes = common.clone();
    attributes.insert("type".into(), AttrValue::String("gpu".into()));
    attributes.insert("uuid".into(), AttrValue::String(gpu.uuid.clone()));
    Device {
        name: names::gpu_device_name(minor),
        device_type: DeviceType::Gpu,
        gpu_uuid: gpu.uuid.clone(),
        gpu_minor: minor,
        gpu_index: gpu.index,
        mig: None,
        attributes,
        capacity: BTreeMap::new(),
        consumes: None,
        taints,
    }
}

fn mig_attributes(
    common: &BTreeMap<String, AttrValue>,
    gpu: &Gpu,
    profile: &str,
) -> BTreeMap<String, AttrValue> {
    let mut attributes = common.clone();
    attributes.insert("type".into(), AttrValue::String("mig".into()));
    attributes.insert("parentUUID".into(), AttrValue::String(gpu.uuid.clone()));
    attributes.insert("profile".into(), AttrValue::String(profile.to_string()));
    attributes
}

/// NVIDIA's MIG capacities of a GPU-instance profile (memory in bytes; NVML's `memorySizeMB` is MiB).
fn profile_capacities(p: &GiProfile) -> BTreeMap<String, u64> {
    BTreeMap::from([
        ("multiprocessors".to_string(), u64::from(p.sm_count)),
        ("copyEngines".to_string(), u64::from(p.copy_engines)),
        ("decoders".to_string(), u64::from(p.decoders)),
        ("encoders".to_string(), u64::from(p.encoders)),
        ("jpegEngines".to_string(), u64::from(p.jpegs)),
        ("ofaEngines".to_string(), u64::from(p.ofas)),
        ("memory".to_string(), p.memory_mib * MIB),
    ])
}

#[allow(clippy::too_many_arguments)]
fn static_mig(
    gpu: &Gpu,
    minor: u32,
    model: Option<&GpuModel>,
    mig: &MigDevice,
    common: &BTreeMap<String, AttrValue>,
    facts: &NodeFacts,
    opts: &Options,
    gpu_taints: &[Taint],
) -> Device {
    let profile = if mig.ci_profile.is_empty() {
        mig.profile.clone()
    } else {
        mig.ci_profile.clone()
    };
    let mut attributes = mig_attributes(common, gpu, &profile);
    attributes.insert("uuid".into(), AttrValue::String(mig.uuid.clone()));
    // The catalog knows the engine counts; for a model it lacks, what NVML said is all there is.
    let mut capacity = match model.and_then(|m| m.gi_profile_by_id(mig.gi_profile_id)) {
        Some(p) => profile_capacities(p),
        None => BTreeMap::from([
            ("multiprocessors".to_string(), u64::from(mig.sm_count)),
            ("memory".to_string(), mig.memory_mib * MIB),
        ]),
    };
    for i in mig.placement_start..mig.placement_start + mig.placement_size {
        capacity.insert(names::memory_slice_capacity(i), 1);
    }
    let mut taints = gpu_taints.to_vec();
    if taints.is_empty()
        && let Some(mark) = facts.unhealthy.get(&mig.uuid)
    {
        taints.push(taint_for(mark, opts.unhealthy_effect));
    }
    Device {
        name: names::mig_device_name(minor, &profile, mig.gi_profile_id, mig.placement_start),
        device_type: DeviceType::Mig,
        gpu_uuid: gpu.uuid.clone(),
        gpu_minor: minor,
        gpu_index: gpu.index,
        mig: Some(MigPlacement {
            profile,
            gi_profile_id: mig.gi_profile_id,
            placement_start: mig.placement_start,
            placement_size: mig.placement_size,
            uuid: Some(mig.uuid.clone()),
        }),
        attributes,
        capacity,
        consumes: None,
        taints,
    }
}

struct GpuCounters {
    counters: CounterSet,
    /// The most of each capacity any profile has: the whole GPU's capacity in dynamic MIG.
    max_capacities: BTreeMap<String, u64>,
}

/// Every valid placement of every GPU-instance profile of `model`, as the placement planner sees
/// them: a placement is published when the planner keeps it as the one instance of a layout.
pub fn valid_placements(model: &GpuModel) -> Vec<(&'static GiProfile, u32)> {
    let Some(geometry) = model.mig.as_ref() else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for p in geometry.gi_profiles {
        for &start in p.placement_starts {
            let current = Layout::new(vec![Instance::new(p.name, start)]);
            let wanted = BTreeMap::from([(p.name.to_string(), 1)]);
            let kept = gpuops_mig::planner::plan(model, &wanted, &current)
                .is_ok_and(|plan| plan.keep.len() == 1 && plan.create.is_empty());
            if kept {
                out.push((p, start));
            }
        }
    }
    out
}

fn dynamic_devices(
    gpu: &Gpu,
    minor: u32,
    model: &GpuModel,
    common: &BTreeMap<String, AttrValue>,
    facts: &NodeFacts,
    opts: &Options,
    gpu_taints: &[Taint],
) -> Option<(GpuCounters, Vec<Device>)> {
    let geometry = model.mig.as_ref()?;
    let set_name = names::counter_set_name(minor);
    let placements = valid_placements(model);
    let mut max_capacities: BTreeMap<String, u64> = BTreeMap::new();
    let mut devices = Vec::new();
    for (p, start) in placements {
        let capacity = profile_capacities(p);
        for (k, v) in &capacity {
            let e = max_capacities.entry(k.clone()).or_insert(0);
            *e = (*e).max(*v);
        }
        let mut counters: BTreeMap<String, u64> = capacity
            .iter()
            .map(|(k, v)| (names::counter_name(k), *v))
            .collect();
        for i in start..start + p.memory_slices {
            counters.insert(names::memory_slice_counter(i), 1);
        }
        // A prepared claim's instance has a UUID: a mark on it taints this placement, or takes
        // it out of the slice without the taints gate.
        let mut taints = gpu_taints.to_vec();
        let mut existing = gpu
            .mig_devices
            .iter()
            .filter(|m| m.gi_profile_id == p.nvml_id && m.placement_start == start);
        let uuid = existing.clone().next().map(|m| m.uuid.clone());
        let mark = existing.find_map(|m| facts.unhealthy.get(&m.uuid));
        match mark {
            Some(_) if !opts.device_taints => continue,
            Some(mark) if taints.is_empty() => taints.push(taint_for(mark, opts.unhealthy_effect)),
            _ => {}
        }
        devices.push(Device {
            name: names::mig_device_name(minor, p.name, p.nvml_id, start),
            device_type: DeviceType::Mig,
            gpu_uuid: gpu.uuid.clone(),
            gpu_minor: minor,
            gpu_index: gpu.index,
            mig: Some(MigPlacement {
                profile: p.name.to_string(),
                gi_profile_id: p.nvml_id,
                placement_start: start,
                placement_size: p.memory_slices,
                uuid,
            }),
            attributes: mig_attributes(common, gpu, p.name),
            capacity,
            consumes: Some(CounterConsumption {
                counter_set: set_name.clone(),
                counters,
            }),
            taints,
        });
    }
    let mut counters: BTreeMap<String, u64> = max_capacities
        .iter()
        .map(|(k, v)| (names::counter_name(k), *v))
        .collect();
    for i in 0..geometry.memory_slices {
        counters.insert(names::memory_slice_counter(i), 1);
    }
    Some((
        GpuCounters {
            counters: CounterSet {
                name: set_name,
                counters,
            },
            max_capacities,
        },
        devices,
    ))
}
