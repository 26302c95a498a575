//! MIG rules of the simulated driver: mode changes, GPU/compute instance creation and placement.
//!
//! Follows the behaviour `nvml.h` documents for each call, including the error codes. The driver's
//! default placement (used when no placement is given) is order dependent: it takes the highest free
//! valid start. That reproduces the documented observations (the first 1g lands at slot 6;
//! `19,19,14,9` fails while `9,19,14,19` works); beyond those observations it is *presumed*.

use crate::state::{SimCi, SimGi, SimGpu};
use gpuops_catalog::{EngineCounts, GiProfile, MigGeometry};

/// The NVML return codes the simulator produces (values from `nvml.h`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NvmlCode {
    Success = 0,
    Uninitialized = 1,
    InvalidArgument = 2,
    NotSupported = 3,
    NoPermission = 4,
    NotFound = 6,
    InsufficientSize = 7,
    DriverNotLoaded = 9,
    Timeout = 10,
    GpuIsLost = 15,
    ResetRequired = 16,
    InUse = 19,
    ArgumentVersionMismatch = 25,
    InsufficientResources = 23,
    Unknown = 999,
}

impl NvmlCode {
    /// The numeric `nvmlReturn_t`.
    pub fn code(self) -> u32 {
        self as u32
    }
}

pub use gpuops_catalog::nvml_enum::ci_profile_for_slices;

/// Compute slices of a CI profile enum/id (the inverse of [`ci_profile_for_slices`]).
pub fn ci_slices_for_profile(profile: u32) -> Option<u32> {
    match profile {
        0 => Some(1),
        1 => Some(2),
        2 => Some(3),
        3 => Some(4),
        4 => Some(7),
        5 => Some(8),
        6 => Some(6),
        _ => None,
    }
}

/// What `nvmlGpuInstanceGetComputeInstanceProfileInfo` reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CiProfileInfo {
    pub id: u32,
    pub slice_count: u32,
    pub instance_count: u32,
    pub sm_count: u32,
    /// The engines every compute instance of the GPU instance shares: the GI's own.
    pub shared: SharedEngines,
}

/// Copy engines, decoders, encoders, JPEG and OFA units a GPU instance owns. Compute instances do
/// not split them: the driver reports the GI's counts as "shared" for every CI profile in it
/// (`nvidia-smi mig -lcip` shows the same Shared CE/DEC/ENC/JPG/OFA on each row of one GI).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SharedEngines {
    pub copy_engines: u32,
    pub decoders: u32,
    pub encoders: u32,
    pub jpegs: u32,
    pub ofas: u32,
}

impl SharedEngines {
    /// The engines of a GPU-instance profile.
    pub fn of(p: &GiProfile) -> Self {
        SharedEngines {
            copy_engines: p.copy_engines,
            decoders: p.decoders,
            encoders: p.encoders,
            jpegs: p.jpegs,
            ofas: p.ofas,
        }
    }
}

/// What `nvmlDeviceGetAttributes_v2` reports for a MIG device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MigAttributes {
    pub sm_count: u32,
    pub shared: SharedEngines,
    pub gi_slices: u32,
    pub ci_slices: u32,
    pub memory_mib: u64,
}

/// Number of distinct GPU-instance profile enums (0..=0x11, `NVML_GPU_INSTANCE_PROFILE_3_SLICE_GFX`
/// being the newest; older headers stop at 0x10).
pub const GI_PROFILE_ENUM_COUNT: u32 = 0x12;
/// Number of distinct compute-instance profile enums (`NVML_COMPUTE_INSTANCE_PROFILE_COUNT`).
pub const CI_PROFILE_ENUM_COUNT: u32 = 8;

impl SimGpu {
    /// `Err(GpuIsLost)` once the GPU fell off the bus: every call on it fails so.
    pub fn live(&self) -> Result<(), NvmlCode> {
        if self.lost {
            Err(NvmlCode::GpuIsLost)
        } else {
            Ok(())
        }
    }

    /// The MIG geometry; `NotSupported` on GPUs without MIG.
    pub fn mig_geometry(&self) -> Result<&'static MigGeometry, NvmlCode> {
        self.live()?;
        self.catalog()
            .and_then(|m| m.mig.as_ref())
            .ok_or(NvmlCode::NotSupported)
    }

    fn require_mig_enabled(&self) -> Result<&'static MigGeometry, NvmlCode> {
        let geometry = self.mig_geometry()?;
        if self.mig_current {
            Ok(geometry)
        } else {
            Err(NvmlCode::NotSupported)
        }
    }

    /// `nvmlDeviceSetMigMode`; returns the activation status. Applies at once (bare metal: the
    /// driver resets the GPU itself) unless a client holds the GPU, in which case the change stays
    /// pending and the status is `RESET_REQUIRED`. Refuses while processes run or GPU instances exist.
    pub fn set_mig_mode(&mut self, enable: bool) -> Result<NvmlCode, NvmlCode> {
        self.mig_geometry()?;
        if self.mig_current == enable && self.mig_pending == enable {
            return Ok(NvmlCode::Success);
        }
        if !self.processes.is_empty() || !self.gpu_instances.is_empty() {
            return Err(NvmlCode::InUse);
        }
        self.mig_pending = enable;
        if self.held {
            return Ok(NvmlCode::ResetRequired);
        }
        self.mig_current = enable;
        Ok(NvmlCode::Success)
    }

    /// `nvmlDeviceGetGpuInstanceProfileInfo`: by profile *enum*.
    pub fn gi_profile_by_enum(&self, profile_enum: u32) -> Result<&'static GiProfile, NvmlCode> {
        if profile_enum >= GI_PROFILE_ENUM_COUNT {
            return Err(NvmlCode::InvalidArgument);
        }
        let geometry = self.mig_geometry()?;
        geometry
            .gi_profiles
            .iter()
            .find(|p| p.nvml_enum == profile_enum)
            .ok_or(NvmlCode::NotSupported)
    }

    /// A GI profile by its NVML *id* (what create/list/placement calls take).
    pub fn gi_profile_by_id(&self, profile_id: u32) -> Result<&'static GiProfile, NvmlCode> {
        let geometry = self.mig_geometry()?;
        geometry
            .gi_profiles
            .iter()
            .find(|p| p.nvml_id == profile_id)
            .ok_or(NvmlCode::InvalidArgument)
    }

    fn profile_of(&self, gi: &SimGi) -> Option<&'static GiProfile> {
        self.catalog()?.gi_profile_by_id(gi.profile_id)
    }

    fn memory_free(&self, start: u32, size: u32) -> bool {
        self.gpu_instances
            .iter()
            .all(|gi| start + size <= gi.start || gi.start + gi.size <= start)
    }

    fn compute_slices_used(&self) -> u32 {
        self.gpu_instances
            .iter()
            .filter_map(|gi| self.profile_of(gi))
            .map(|p| p.compute_slices)
            .sum()
    }

    /// The engines the existing GPU instances take.
    fn engines_used(&self) -> EngineCounts {
        self.gpu_instances
            .iter()
            .filter_map(|gi| self.profile_of(gi))
            .fold(EngineCounts::default(), |sum, p| sum.plus(p.engines(), 1))
    }

    /// Whether one more instance of `p` would need more of some engine type than the GPU has:
    /// instances share the GPU's engines, so the driver refuses (a second `+me` on an A30, which
    /// has one NVJPG and one OFA) with `INSUFFICIENT_RESOURCES`.
    fn engines_short(&self, geometry: &MigGeometry, p: &GiProfile) -> bool {
        self.engines_used()
            .plus(p.engines(), 1)
            .exceeds(&geometry.engine_budget())
            .is_some()
    }

    fn count_of(&self, profile_id: u32) -> u32 {
        self.gpu_instances
            .iter()
            .filter(|gi| gi.profile_id == profile_id)
            .count() as u32
    }

    /// `nvmlDeviceGetGpuInstancePossiblePlacements_v2`: every valid placement, free or not.
    pub fn possible_placements(&self, profile_id: u32) -> Result<Vec<(u32, u32)>, NvmlCode> {
        self.require_mig_enabled()?;
        let p = self.gi_profile_by_id(profile_id)?;
        Ok(p.placement_starts
            .iter()
            .map(|&s| (s, p.memory_slices))
            .collect())
    }

    /// `nvmlDeviceGetGpuInstanceRemainingCapacity`: how many more instances of the profile fit now.
    pub fn remaining_capacity(&self, profile_id: u32) -> Result<u32, NvmlCode> {
        let geometry = self.require_mig_enabled()?;
        let p = self.gi_profile_by_id(profile_id)?;
        let mut taken: Vec<(u32, u32)> = self
            .gpu_instances
            .iter()
            .map(|g| (g.start, g.size))
            .collect();
        let mut compute_left = geometry
            .compute_slices
            .saturating_sub(self.compute_slices_used());
        let mut left = p.max_count.saturating_sub(self.count_of(profile_id));
        let mut fits = 0;
        let mut engines = self.engines_used();
        let budget = geometry.engine_budget();
        // Same-size aligned intervals: taking the lowest free start first is optimal.
        for &start in p.placement_starts {
            let with = engines.plus(p.engines(), 1);
            if left == 0 || compute_left < p.compute_slices || with.exceeds(&budget).is_some() {
                break;
            }
            let end = start + p.memory_slices;
            if taken.iter().all(|&(s, z)| end <= s || s + z <= start) {
                taken.push((start, p.memory_slices));
                compute_left -= p.compute_slices;
                engines = with;
                left -= 1;
                fits += 1;
            }
        }
        Ok(fits)
    }

    /// `nvmlDeviceCreateGpuInstance[WithPlacement]`; returns the new GI id.
    pub fn create_gi(&mut self, profile_id: u32, placement: Option<u32>) -> Result<u32, NvmlCode> {
        let geometry = self.require_mig_enabled()?;
        let p = self.gi_profile_by_id(profile_id)?;
        if let Some(start) = placement
            && !p.placement_starts.contains(&start)
        {
            return Err(NvmlCode::InvalidArgument);
        }
        if self.count_of(profile_id) >= p.max_count
            || self.compute_slices_used() + p.compute_slices > geometry.compute_slices
            || self.engines_short(geometry, p)
        {
            return Err(NvmlCode::InsufficientResources);
        }
        let start = match placement {
            Some(start) if self.memory_free(start, p.memory_slices) => start,
            Some(_) => return Err(NvmlCode::InsufficientResources),
            None => p
                .placement_starts
                .iter()
                .rev()
                .copied()
                .find(|&s| self.memory_free(s, p.memory_slices))
                .ok_or(NvmlCode::InsufficientResources)?,
        };
        let id = gi_id_for(geometry.memory_slices, start, p.memory_slices);
        self.gpu_instances.push(SimGi {
            id,
            profile_id,
            start,
            size: p.memory_slices,
            compute_instances: Vec::new(),
        });
        self.gpu_instances.sort_by_key(|g| g.id);
        Ok(id)
    }

    /// The GI with this id.
    pub fn gi(&self, gi_id: u32) -> Result<&SimGi, NvmlCode> {
        self.live()?;
        self.gpu_instances
            .iter()
            .find(|g| g.id == gi_id)
            .ok_or(NvmlCode::InvalidArgument)
    }

    fn gi_mut(&mut self, gi_id: u32) -> Result<&mut SimGi, NvmlCode> {
        self.live()?;
        self.gpu_instances
            .iter_mut()
            .find(|g| g.id == gi_id)
            .ok_or(NvmlCode::InvalidArgument)
    }

    /// `nvmlGpuInstanceDestroy`: refused while compute instances or processes remain.
    pub fn destroy_gi(&mut self, gi_id: u32) -> Result<(), NvmlCode> {
        let gi = self.gi(gi_id)?;
        if !gi.compute_instances.is_empty() || self.processes.iter().any(|p| p.gi_id == Some(gi_id))
        {
            return Err(NvmlCode::InUse);
        }
        self.gpu_instances.retain(|g| g.id != gi_id);
        Ok(())
    }

    /// GI compute slices and SM count, from the catalog profile.
    fn gi_compute(&self, gi: &SimGi) -> Result<(u32, u32), NvmlCode> {
        let p = self.profile_of(gi).ok_or(NvmlCode::Unknown)?;
        Ok((p.compute_slices, p.sm_count))
    }

    /// The name `nvmlGpuInstanceGetComputeInstanceProfileInfoV` gives a CI profile: the GI's
    /// profile name for the CI that spans it, `<c>c.<gi profile>` for a smaller one (as
    /// `nvidia-smi mig -lcip` prints them, without its `MIG ` prefix).
    pub fn ci_profile_name(&self, gi_id: u32, ci_enum: u32) -> Result<String, NvmlCode> {
        let info = self.ci_profile_info(gi_id, ci_enum)?;
        let p = self.profile_of(self.gi(gi_id)?).ok_or(NvmlCode::Unknown)?;
        Ok(if info.slice_count == p.compute_slices {
            p.name.to_string()
        } else {
            format!("{}c.{}", info.slice_count, p.name)
        })
    }

    /// `nvmlDeviceGetAttributes_v2` for the MIG device (GI, CI).
    pub fn mig_attributes(&self, gi: &SimGi, ci: &SimCi) -> Result<MigAttributes, NvmlCode> {
        let info = self.ci_profile_info(gi.id, ci.profile_id)?;
        let p = self.profile_of(gi).ok_or(NvmlCode::Unknown)?;
        Ok(MigAttributes {
            sm_count: info.sm_count,
            shared: info.shared,
            gi_slices: p.compute_slices,
            ci_slices: info.slice_count,
            memory_mib: p.memory_mib,
        })
    }

    /// `nvmlGpuInstanceGetComputeInstanceProfileInfo`: by CI profile enum.
    pub fn ci_profile_info(&self, gi_id: u32, ci_enum: u32) -> Result<CiProfileInfo, NvmlCode> {
        if ci_enum >= CI_PROFILE_ENUM_COUNT {
            return Err(NvmlCode::InvalidArgument);
        }
        let gi = self.gi(gi_id)?;
        let (g, gi_sms) = self.gi_compute(gi)?;
        let shared = self
            .profile_of(gi)
            .map(SharedEngines::of)
            .unwrap_or_default();
        let c = ci_slices_for_profile(ci_enum).ok_or(NvmlCode::NotSupported)?;
        if !gpuops_catalog::ci_sizes(g).contains(&c) {
            return Err(NvmlCode::NotSupported);
        }
        // A CI of c slices gets the SMs of a c-slice GI, except the full-size CI, which gets them all.
        let sm_count = if c == g {
            gi_sms
        } else {
            self.catalog()
                .and_then(|m| m.mig.as_ref())
                .and_then(|geo| geo.gi_profiles.iter().find(|p| p.compute_slices == c))
                .map_or(gi_sms * c / g, |p| p.sm_count.min(gi_sms))
        };
        Ok(CiProfileInfo {
            id: ci_enum,
            slice_count: c,
            instance_count: g / c,
            sm_count,
            shared,
        })
    }

    /// `nvmlGpuInstanceCreateComputeInstance[WithPlacement]`; returns the new CI id.
    pub fn create_ci(
        &mut self,
        gi_id: u32,
        ci_profile_id: u32,
        placement: Option<u32>,
        uuid: String,
    ) -> Result<u32, NvmlCode> {
        let info = self
            .ci_profile_info(gi_id, ci_profile_id)
            .map_err(|e| match e {
                NvmlCode::NotSupported => NvmlCode::InvalidArgument,
                other => other,
            })?;
        let (g, _) = self.gi_compute(self.gi(gi_id)?)?;
        let c = info.slice_count;
        let gi = self.gi_mut(gi_id)?;
        let free = |start: u32| {
            gi.compute_instances
                .iter()
                .all(|ci| start + c <= ci.start || ci.start + ci.size <= start)
        };
        let valid_starts: Vec<u32> = (0..g).step_by(c as usize).filter(|s| s + c <= g).collect();
        let start = match placement {
            Some(s) if !valid_starts.contains(&s) => return Err(NvmlCode::InvalidArgument),
            Some(s) if free(s) => s,
            Some(_) => return Err(NvmlCode::InsufficientResources),
            None => valid_starts
                .iter()
                .copied()
                .find(|&s| free(s))
                .ok_or(NvmlCode::InsufficientResources)?,
        };
        let id = (0..)
            .find(|i| gi.compute_instances.iter().all(|ci| ci.id != *i))
            .unwrap_or(0);
        gi.compute_instances.push(SimCi {
            id,
            profile_id: ci_profile_id,
            start,
            size: c,
            uuid,
        });
        gi.compute_instances.sort_by_key(|ci| ci.id);
        Ok(id)
    }

    /// `nvmlComputeInstanceDestroy`: refused while processes run in it.
    pub fn destroy_ci(&mut self, gi_id: u32, ci_id: u32) -> Result<(), NvmlCode> {
        if self
            .processes
            .iter()
            .any(|p| p.gi_id == Some(gi_id) && p.ci_id == Some(ci_id))
        {
            return Err(NvmlCode::InUse);
        }
        let gi = self.gi_mut(gi_id)?;
        let before = gi.compute_instances.len();
        gi.compute_instances.retain(|ci| ci.id != ci_id);
        if gi.compute_instances.len() == before {
            return Err(NvmlCode::InvalidArgument);
        }
        Ok(())
    }

    /// MIG devices (GI id, CI id) in the order `nvmlDeviceGetMigDeviceHandleByIndex` walks them.
    pub fn mig_devices(&self) -> Vec<(&SimGi, &SimCi)> {
        if !self.mig_current {
            return Vec::new();
        }
        self.gpu_instances
            .iter()
            .flat_map(|gi| gi.compute_instances.iter().map(move |ci| (gi, ci)))
            .collect()
    }

    /// Memory (MiB) and SMs of the MIG device for (GI, CI).
    pub fn mig_device_size(&self, gi: &SimGi, ci: &SimCi) -> (u64, u32) {
        let memory = self.profile_of(gi).map_or(0, |p| p.memory_mib);
        let sms = self
            .ci_profile_info(gi.id, ci.profile_id)
            .map_or(0, |i| i.sm_count);
        (memory, sms)
    }
}

/// GPU-instance ids follow the slice tree: the whole GPU is 0, halves 1-2, quarters 3-6, eighths
/// 7-14 (A30: whole 0, halves 1-2, quarters 3-6). Matches `nvidia-smi mig -lgi` on A100/H100
/// (7x 1g -> ids 7..13, 3g at 0/4 -> 1/2); *presumed* for other models.
pub fn gi_id_for(total_slices: u32, start: u32, size: u32) -> u32 {
    let parts = (total_slices / size.max(1)).max(1);
    (parts - 1) + start / size.max(1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Fleet, SimState};

    fn h100() -> SimGpu {
        let mut s = SimState::from_fleet(&Fleet::resolve("dgx-h100").unwrap(), 0).unwrap();
        let mut g = s.gpus.remove(0);
        g.set_mig_mode(true).unwrap();
        g
    }

    fn starts(g: &SimGpu) -> Vec<(u32, u32)> {
        g.gpu_instances
            .iter()
            .map(|gi| (gi.profile_id, gi.start))
            .collect()
    }

    #[test]
    fn default_placement_is_order_dependent_like_the_driver() {
        let mut g = h100();
        assert_eq!(g.create_gi(19, None), Ok(13)); // first 1g lands at slot 6
        assert_eq!(g.gpu_instances[0].start, 6);
        g.create_gi(19, None).unwrap();
        g.create_gi(14, None).unwrap();
        assert_eq!(g.create_gi(9, None), Err(NvmlCode::InsufficientResources));

        let mut g = h100();
        for p in [9, 19, 14, 19] {
            g.create_gi(p, None).unwrap();
        }
        assert_eq!(g.gpu_instances.len(), 4);
    }

    #[test]
    fn explicit_placements_and_their_errors() {
        let mut g = h100();
        assert_eq!(g.create_gi(5, Some(0)), Ok(1)); // 4g at 0
        assert_eq!(
            g.create_gi(9, Some(0)),
            Err(NvmlCode::InsufficientResources)
        );
        assert_eq!(g.create_gi(9, Some(2)), Err(NvmlCode::InvalidArgument));
        assert_eq!(g.create_gi(9, Some(4)), Ok(2));
        assert_eq!(starts(&g), vec![(5, 0), (9, 4)]);
        assert_eq!(g.remaining_capacity(19), Ok(0)); // compute slices exhausted (4 + 3)
        assert_eq!(g.create_gi(1234, None), Err(NvmlCode::InvalidArgument));
    }

    #[test]
    fn max_counts_and_remaining_capacity() {
        let mut g = h100();
        assert_eq!(g.remaining_capacity(19), Ok(7));
        assert_eq!(g.remaining_capacity(20), Ok(1));
        assert_eq!(g.remaining_capacity(15), Ok(4));
        for _ in 0..7 {
            g.create_gi(19, None).unwrap();
        }
        assert_eq!(g.create_gi(19, None), Err(NvmlCode::InsufficientResources));
        let mut ids: Vec<u32> = g.gpu_instances.iter().map(|gi| gi.id).collect();
        ids.sort_unstable();
        assert_eq!(ids, vec![7, 8, 9, 10, 11, 12, 13]);
    }

    #[test]
    fn a_second_media_extension_instance_is_refused_for_its_engines() {
        let fleet = Fleet::parse(
            "hostname: a30-sim\ngpus:\n  - model: A30\n    count: 1\n",
            "t",
        )
        .unwrap();
        let mut s = SimState::from_fleet(&fleet, 0).unwrap();
        let mut g = s.gpus.remove(0);
        g.set_mig_mode(true).unwrap();
        let a30 = gpuops_catalog::lookup("A30").unwrap();
        let id = |name: &str| a30.gi_profile(name).unwrap().nvml_id;
        assert_eq!(g.remaining_capacity(id("2g.12gb+me")), Ok(1));
        g.create_gi(id("1g.6gb+me"), Some(0)).unwrap();
        // Slices are free and each profile is under its maximum; the one NVJPG and OFA are not.
        assert_eq!(g.remaining_capacity(id("2g.12gb+me")), Ok(0));
        assert_eq!(
            g.create_gi(id("2g.12gb+me"), Some(2)),
            Err(NvmlCode::InsufficientResources)
        );
        assert_eq!(
            g.create_gi(id("2g.12gb+me"), None),
            Err(NvmlCode::InsufficientResources)
        );
        // Plain profiles, which take neither, still fit beside it.
        assert_eq!(g.remaining_capacity(id("2g.12gb")), Ok(1));
        g.create_gi(id("2g.12gb"), Some(2)).unwrap();
        g.create_gi(id("1g.6gb"), Some(1)).unwrap();
        assert_eq!(g.gpu_instances.len(), 3);
        // H100: the +me beside six plain 1g uses all seven NVJPGs and the OFA, and is accepted.
        let mut g = h100();
        g.create_gi(20, None).unwrap();
        for _ in 0..6 {
            g.create_gi(19, None).unwrap();
        }
        assert_eq!(g.gpu_instances.len(), 7);
    }

    #[test]
    fn mig_mode_and_capability_errors() {
        let mut s = SimState::from_fleet(&Fleet::resolve("l4x4").unwrap(), 0).unwrap();
        assert_eq!(s.gpus[0].set_mig_mode(true), Err(NvmlCode::NotSupported));
        let mut g = h100();
        g.set_mig_mode(false).unwrap();
        assert_eq!(g.create_gi(19, None), Err(NvmlCode::NotSupported));
        g.held = true;
        assert_eq!(g.set_mig_mode(true), Ok(NvmlCode::ResetRequired));
        assert!(!g.mig_current && g.mig_pending);
        g.held = false;
        g.set_mig_mode(true).unwrap();
        g.create_gi(0, None).unwrap();
        assert_eq!(g.set_mig_mode(false), Err(NvmlCode::InUse));
        g.lost = true;
        assert_eq!(g.create_gi(19, None), Err(NvmlCode::GpuIsLost));
    }

    #[test]
    fn compute_instances_inside_a_gpu_instance() {
        let mut g = h100();
        let gi = g.create_gi(0, None).unwrap(); // 7g
        assert_eq!(g.ci_profile_info(gi, 4).unwrap().sm_count, 132);
        assert_eq!(g.ci_profile_info(gi, 5), Err(NvmlCode::NotSupported)); // 8 slices
        let a = g.create_ci(gi, 2, None, "MIG-a".into()).unwrap(); // 3c at 0
        let b = g.create_ci(gi, 2, None, "MIG-b".into()).unwrap(); // 3c at 3
        assert_eq!((a, b), (0, 1));
        assert_eq!(
            g.create_ci(gi, 2, None, "MIG-c".into()),
            Err(NvmlCode::InsufficientResources)
        );
        assert_eq!(g.mig_devices().len(), 2);
        assert_eq!(g.destroy_gi(gi), Err(NvmlCode::InUse));
        g.processes.push(crate::SimProcess {
            pid: 1,
            used_memory_mib: 1,
            gi_id: Some(gi),
            ci_id: Some(a),
        });
        assert_eq!(g.destroy_ci(gi, a), Err(NvmlCode::InUse));
        g.processes.clear();
        g.destroy_ci(gi, a).unwrap();
        g.destroy_ci(gi, b).unwrap();
        assert_eq!(g.destroy_ci(gi, b), Err(NvmlCode::InvalidArgument));
        g.destroy_gi(gi).unwrap();
        assert!(g.gpu_instances.is_empty());
    }

    #[test]
    fn every_ci_profile_shares_the_engines_of_its_gpu_instance() {
        let mut g = h100();
        for gi_profile in [P_7G, P_3G, P_1G] {
            let gi = g.create_gi(gi_profile, None).unwrap();
            let p = g.gi_profile_by_id(gi_profile).unwrap();
            let engines = SharedEngines::of(p);
            assert!(engines.copy_engines > 0, "{p:?}");
            let mut seen = 0;
            for ci_enum in 0..CI_PROFILE_ENUM_COUNT {
                let Ok(info) = g.ci_profile_info(gi, ci_enum) else {
                    continue;
                };
                seen += 1;
                assert_eq!(info.shared, engines, "{} ci enum {ci_enum}", p.name);
            }
            assert!(seen >= 1, "{}", p.name);
            g.destroy_gi(gi).unwrap();
        }
        // The 7g's 3-slice CI is named after its GI; the whole-GI CI carries the GI's name.
        let gi = g.create_gi(P_7G, None).unwrap();
        assert_eq!(g.ci_profile_name(gi, 2).unwrap(), "3c.7g.80gb");
        assert_eq!(g.ci_profile_name(gi, 4).unwrap(), "7g.80gb");
        let ci = g.create_ci(gi, 0, None, "MIG-x".into()).unwrap();
        let (sgi, sci) = g.mig_devices()[0];
        assert_eq!(sci.id, ci);
        let a = g.mig_attributes(sgi, sci).unwrap();
        assert_eq!((a.gi_slices, a.ci_slices), (7, 1));
        assert_eq!(a.memory_mib, g.gi_profile_by_id(P_7G).unwrap().memory_mib);
        assert_eq!(
            a.shared,
            SharedEngines::of(g.gi_profile_by_id(P_7G).unwrap())
        );
        assert_eq!(a.sm_count, g.ci_profile_info(gi, 0).unwrap().sm_count);
    }

    const P_7G: u32 = 0;
    const P_3G: u32 = 9;
    const P_1G: u32 = 19;

    #[test]
    fn gi_ids_follow_the_slice_tree() {
        assert_eq!(gi_id_for(8, 0, 8), 0);
        assert_eq!(gi_id_for(8, 4, 4), 2);
        assert_eq!(gi_id_for(8, 6, 2), 6);
        assert_eq!(gi_id_for(8, 6, 1), 13);
        assert_eq!(gi_id_for(4, 2, 2), 2);
    }
}
