//! MIG actions: mode changes, GPU/compute instance creation and destruction, placement queries.

use crate::error::{NvmlError, call};
use crate::{Gpus, raw};
use nvml_wrapper::Device;

/// Number of `NVML_GPU_INSTANCE_PROFILE_*` enum values (0..=0x11).
const GI_PROFILE_ENUMS: u32 = 0x12;

/// A GPU-instance profile as the driver reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GiProfileInfo {
    /// `NVML_GPU_INSTANCE_PROFILE_*` enum value.
    pub nvml_enum: u32,
    /// Profile id (`info.id`).
    pub id: u32,
    /// Compute slices.
    pub slice_count: u32,
    pub instance_count: u32,
    pub memory_mib: u64,
    pub sm_count: u32,
}

impl GiProfileInfo {
    pub(crate) fn from_wrapper(
        nvml_enum: u32,
        p: &nvml_wrapper::struct_wrappers::device::ProfileInfo,
    ) -> Self {
        GiProfileInfo {
            nvml_enum,
            id: p.id,
            slice_count: p.slice_count,
            instance_count: p.instance_count,
            memory_mib: p.memory_size_mb,
            sm_count: p.multiprocessor_count,
        }
    }
}

/// What a MIG mode change did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MigModeChange {
    /// The new mode is in effect.
    Active,
    /// Accepted, but pending until the GPU is reset; `reason` is the driver's activation status.
    NeedsReset { reason: String },
}

/// A placement: `start` and `size` in memory slices.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlacementSlot {
    pub start: u32,
    pub size: u32,
}

impl Gpus {
    fn device(&self, index: u32) -> Result<Device<'_>, NvmlError> {
        self.nvml
            .device_by_index(index)
            .map_err(|e| call("nvmlDeviceGetHandleByIndex", Some(index), e))
    }

    /// Enables or disables MIG mode on a GPU. The driver may accept the change but leave it pending
    /// until the GPU is reset (a client holds it, or a VM cannot reset it): that is reported, never
    /// acted on here.
    pub fn set_mig_mode(&self, index: u32, enabled: bool) -> Result<MigModeChange, NvmlError> {
        let d = self.device(index)?;
        let status = d
            .set_mig_mode(enabled)
            .map_err(|e| call("nvmlDeviceSetMigMode", Some(index), e))?;
        Ok(if status == crate::raw_codes::SUCCESS {
            MigModeChange::Active
        } else {
            MigModeChange::NeedsReset {
                reason: crate::error::describe_code(status).to_string(),
            }
        })
    }

    /// Whether MIG mode is currently enabled on a GPU.
    pub fn mig_mode_enabled(&self, index: u32) -> Result<bool, NvmlError> {
        let d = self.device(index)?;
        match d.mig_mode() {
            Ok(m) => Ok(m.current == 1),
            Err(e) => match call("nvmlDeviceGetMigMode", Some(index), e) {
                NvmlError::NotSupported { .. } => Ok(false),
                other => Err(other),
            },
        }
    }

    /// GI profiles the GPU offers, by enum (read from the driver once per MIG mode).
    pub fn gi_profiles(&self, index: u32) -> Result<Vec<GiProfileInfo>, NvmlError> {
        if let Some(cached) = self
            .gi_profiles
            .lock()
            .ok()
            .and_then(|c| c.get(&index).cloned())
        {
            return Ok(cached);
        }
        let d = self.device(index)?;
        let mut out = Vec::new();
        for e in 0..GI_PROFILE_ENUMS {
            match d.profile_info(e) {
                Ok(p) => out.push(GiProfileInfo::from_wrapper(e, &p)),
                Err(err) => match call("nvmlDeviceGetGpuInstanceProfileInfo", Some(index), err) {
                    NvmlError::NotSupported { .. } => {}
                    NvmlError::Call { code: Some(2), .. } => {}
                    other => return Err(other),
                },
            }
        }
        if let Ok(mut cache) = self.gi_profiles.lock() {
            cache.insert(index, out.clone());
        }
        Ok(out)
    }

    /// Every valid placement of a profile (by profile id), free or not.
    pub fn possible_placements(
        &self,
        index: u32,
        profile_id: u32,
    ) -> Result<Vec<PlacementSlot>, NvmlError> {
        let d = self.device(index)?;
        let list =
            raw::possible_placements(self.nvml.lib(), raw::handle(&d), profile_id, Some(index))?;
        Ok(list
            .into_iter()
            .map(|(start, size)| PlacementSlot { start, size })
            .collect())
    }

    /// How many more instances of a profile fit now.
    pub fn remaining_capacity(&self, index: u32, profile_id: u32) -> Result<u32, NvmlError> {
        let d = self.device(index)?;
        raw::remaining_capacity(self.nvml.lib(), raw::handle(&d), profile_id, Some(index))
    }

    /// Creates a GPU instance; with a placement it goes exactly there. Returns the GI id.
    pub fn create_gpu_instance(
        &self,
        index: u32,
        profile_id: u32,
        placement: Option<PlacementSlot>,
    ) -> Result<u32, NvmlError> {
        let d = self.device(index)?;
        let lib = self.nvml.lib();
        let gi = raw::create_gpu_instance(
            lib,
            raw::handle(&d),
            profile_id,
            placement.map(|p| p.start),
            placement.map_or(0, |p| p.size),
            Some(index),
        )?;
        Ok(raw::gpu_instance_info(lib, gi, Some(index))?.id)
    }

    /// Destroys a GPU instance (its compute instances must be gone).
    pub fn destroy_gpu_instance(&self, index: u32, gi_id: u32) -> Result<(), NvmlError> {
        let d = self.device(index)?;
        let lib = self.nvml.lib();
        let gi = raw::gpu_instance_by_id(lib, raw::handle(&d), gi_id, Some(index))?;
        raw::destroy_gpu_instance(lib, gi, Some(index))
    }

    /// Creates a compute instance of `ci_profile` (CI profile id) in a GPU instance. Returns its id.
    pub fn create_compute_instance(
        &self,
        index: u32,
        gi_id: u32,
        ci_profile: u32,
        start: Option<u32>,
    ) -> Result<u32, NvmlError> {
        let d = self.device(index)?;
        let lib = self.nvml.lib();
        let gi = raw::gpu_instance_by_id(lib, raw::handle(&d), gi_id, Some(index))?;
        let size = raw::compute_instance_profile_info(lib, gi, ci_profile, Some(index))?.sliceCount;
        let ci = raw::create_compute_instance(lib, gi, ci_profile, start, size, Some(index))?;
        Ok(raw::compute_instance_info(lib, ci, Some(index))?.id)
    }

    /// Destroys a compute instance.
    pub fn destroy_compute_instance(
        &self,
        index: u32,
        gi_id: u32,
        ci_id: u32,
    ) -> Result<(), NvmlError> {
        let d = self.device(index)?;
        let lib = self.nvml.lib();
        let gi = raw::gpu_instance_by_id(lib, raw::handle(&d), gi_id, Some(index))?;
        let ci = raw::compute_instance_by_id(lib, gi, ci_id, Some(index))?;
        raw::destroy_compute_instance(lib, ci, Some(index))
    }

    /// GPU instances without any compute instance: what an apply interrupted between creating a GI
    /// and its CI leaves behind. They hold slices but are no MIG device, so snapshots miss them.
    pub fn empty_gpu_instances(&self, index: u32) -> Result<Vec<u32>, NvmlError> {
        let with_ci: Vec<u32> = self
            .mig_devices_of(index)?
            .iter()
            .map(|m| m.gi_id)
            .collect();
        let mut empty = Vec::new();
        for p in self.gi_profiles(index)? {
            for gi in self.gpu_instance_ids(index, p.id)? {
                if !with_ci.contains(&gi) && !empty.contains(&gi) {
                    empty.push(gi);
                }
            }
        }
        Ok(empty)
    }

    /// GPU-instance ids of one profile (by profile id) on a GPU.
    pub fn gpu_instance_ids(&self, index: u32, profile_id: u32) -> Result<Vec<u32>, NvmlError> {
        let d = self.device(index)?;
        let lib = self.nvml.lib();
        let capacity = self
            .gi_profiles(index)?
            .iter()
            .find(|p| p.id == profile_id)
            .map_or(8, |p| p.instance_count);
        raw::gpu_instances(lib, raw::handle(&d), profile_id, capacity, Some(index))?
            .into_iter()
            .map(|gi| raw::gpu_instance_info(lib, gi, Some(index)).map(|i| i.id))
            .collect()
    }
}
