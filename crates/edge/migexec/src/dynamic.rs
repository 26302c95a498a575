//! Dynamic MIG: one MIG device created for one DRA claim at prepare and destroyed at unprepare,
//! at exactly the placement the scheduler allocated (the DRA driver's device name carries it).
//!
//! Unlike a layout apply there is no plan: the scheduler's shared counters already guarantee the
//! placement is free of other claims' devices. What can still be there is this claim's own device
//! from a prepare cut short (adopted, so a retried prepare is idempotent) and a GPU instance
//! without a compute instance from a crash between the two creates (removed before retrying).
//! The caller serializes calls per node: two creates on one GPU at once could take each other's
//! empty GPU instance for a leftover.

use crate::{ExecError, nvml};
use gpuops_inventory::MigDevice;
use gpuops_nvml::{Gpus, MigModeChange, PlacementSlot};

/// A MIG device a claim needs: GPU-instance profile at a placement, with one compute instance
/// spanning the whole GPU instance (the only shape dynamic MIG publishes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Wanted {
    /// NVML index of the parent GPU.
    pub gpu: u32,
    pub gi_profile_id: u32,
    pub start: u32,
    pub size: u32,
}

/// The MIG device that serves a claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Created {
    pub gi_id: u32,
    pub ci_id: u32,
    /// `MIG-…`.
    pub uuid: String,
    /// It was there already (a prepare retried after a crash): nothing was created.
    pub adopted: bool,
}

fn at_placement<'a>(devices: &'a [MigDevice], w: &Wanted) -> Option<&'a MigDevice> {
    devices
        .iter()
        .find(|m| m.gi_profile_id == w.gi_profile_id && m.placement_start == w.start)
}

/// Creates the MIG device `w` (MIG mode is turned on first where it is off and the GPU allows
/// that without a reset), or adopts the one already there.
pub fn create(gpus: &Gpus, w: &Wanted) -> Result<Created, ExecError> {
    let gpu = w.gpu;
    let enabled = gpus
        .mig_mode_enabled(gpu)
        .map_err(nvml(format!("reading the MIG mode of GPU {gpu}")))?;
    if !enabled {
        match gpus
            .set_mig_mode(gpu, true)
            .map_err(nvml(format!("enabling MIG mode on GPU {gpu}")))?
        {
            MigModeChange::Active => {}
            MigModeChange::NeedsReset { reason } => {
                return Err(ExecError::ModePending { gpu, reason });
            }
        }
    }
    let devices = gpus
        .mig_devices_of(gpu)
        .map_err(nvml(format!("listing the MIG devices of GPU {gpu}")))?;
    if let Some(m) = at_placement(&devices, w) {
        return Ok(Created {
            gi_id: m.gi_id,
            ci_id: m.ci_id,
            uuid: m.uuid.clone(),
            adopted: true,
        });
    }
    // A GPU instance with no compute instance holds its slices but is no device: a create cut
    // short between its two steps. Calls are serialized, so none of them is being made now.
    for gi in gpus
        .empty_gpu_instances(gpu)
        .map_err(nvml(format!("listing the GPU instances of GPU {gpu}")))?
    {
        gpus.destroy_gpu_instance(gpu, gi).map_err(nvml(format!(
            "destroying GPU instance {gi} on GPU {gpu}, left without a compute instance"
        )))?;
    }
    let slices = gpus
        .gi_profiles(gpu)
        .map_err(nvml(format!("reading the MIG profiles of GPU {gpu}")))?
        .iter()
        .find(|p| p.id == w.gi_profile_id)
        .map(|p| p.slice_count)
        .ok_or_else(|| {
            ExecError::Profile(format!(
                "GPU {gpu} has no GPU-instance profile with id {}",
                w.gi_profile_id
            ))
        })?;
    let ci_profile = gpuops_catalog::nvml_enum::ci_profile_for_slices(slices).ok_or_else(|| {
        ExecError::Profile(format!(
            "no compute-instance profile has {slices} slices (GPU-instance profile {})",
            w.gi_profile_id
        ))
    })?;
    let what = format!(
        "GPU-instance profile {} at placement {} on GPU {gpu}",
        w.gi_profile_id, w.start
    );
    let gi_id = gpus
        .create_gpu_instance(
            gpu,
            w.gi_profile_id,
            Some(PlacementSlot {
                start: w.start,
                size: w.size,
            }),
        )
        .map_err(nvml(format!("creating {what}")))?;
    let ci_id = match gpus.create_compute_instance(gpu, gi_id, ci_profile, None) {
        Ok(ci) => ci,
        Err(source) => {
            // Not left holding the slices: the claim fails whole and may be retried.
            let _ = gpus.destroy_gpu_instance(gpu, gi_id);
            return Err(ExecError::Nvml {
                what: format!("creating the compute instance of {what}"),
                source,
            });
        }
    };
    let uuid = gpus
        .mig_devices_of(gpu)
        .map_err(nvml(format!("reading back {what}")))?
        .iter()
        .find(|m| m.gi_id == gi_id && m.ci_id == ci_id)
        .map(|m| m.uuid.clone())
        .ok_or_else(|| {
            ExecError::NotConverged(format!(
                "{what}: created as GPU instance {gi_id}, compute instance {ci_id}, but the driver does not list it"
            ))
        })?;
    Ok(Created {
        gi_id,
        ci_id,
        uuid,
        adopted: false,
    })
}

/// Destroys the MIG device a claim held: by UUID where it was read back (GPU- and compute-instance
/// ids are reused after a destroy, UUIDs are not), else the device at the placement of `w`.
/// Returns false when it is already gone, which is what unprepare wants too.
pub fn destroy(gpus: &Gpus, w: &Wanted, uuid: &str) -> Result<bool, ExecError> {
    let gpu = w.gpu;
    let devices = gpus
        .mig_devices_of(gpu)
        .map_err(nvml(format!("listing the MIG devices of GPU {gpu}")))?;
    let found = if uuid.is_empty() {
        at_placement(&devices, w)
    } else {
        devices.iter().find(|m| m.uuid == uuid)
    };
    let Some(m) = found else {
        return Ok(false);
    };
    gpus.destroy_compute_instance(gpu, m.gi_id, m.ci_id)
        .map_err(nvml(format!(
            "destroying compute instance {} of {} on GPU {gpu}",
            m.ci_id, m.uuid
        )))?;
    gpus.destroy_gpu_instance(gpu, m.gi_id)
        .map_err(nvml(format!(
            "destroying GPU instance {} of {} on GPU {gpu}",
            m.gi_id, m.uuid
        )))?;
    Ok(true)
}

/// Turns MIG mode off for a whole-GPU claim on a GPU with no MIG device left (dynamic MIG offers
/// the whole GPU and its placements from one counter set, so none is allocated beside it).
pub fn make_whole(gpus: &Gpus, gpu: u32) -> Result<(), ExecError> {
    if !gpus
        .mig_mode_enabled(gpu)
        .map_err(nvml(format!("reading the MIG mode of GPU {gpu}")))?
    {
        return Ok(());
    }
    let left = gpus
        .mig_devices_of(gpu)
        .map_err(nvml(format!("listing the MIG devices of GPU {gpu}")))?;
    if !left.is_empty() {
        return Err(ExecError::Busy(
            left.iter()
                .map(|m| format!("GPU {gpu} still has MIG device {}", m.uuid))
                .collect(),
        ));
    }
    match gpus
        .set_mig_mode(gpu, false)
        .map_err(nvml(format!("disabling MIG mode on GPU {gpu}")))?
    {
        MigModeChange::Active => Ok(()),
        MigModeChange::NeedsReset { reason } => Err(ExecError::ModePending { gpu, reason }),
    }
}
