//! The claim checkpoint's format: which claims are prepared, with what devices, CDI ids and MIG
//! instances created for them. The agent writes it atomically (part of the kubelet side); this is
//! the data and its reader.
//!
//! Compatibility rules, so an upgrade or a downgrade never fails on the file (NVIDIA's issue 1080):
//! fields are only ever added, with defaults, so an older file reads as a newer one; a newer file's
//! unknown fields are kept (`extra`) and written back unchanged; `version` is the writer's format
//! version and `minReaderVersion` the oldest reader that may use the file, raised only by a change
//! an older reader would misread. A reader refuses a file whose `minReaderVersion` it does not
//! reach, with an error that says so (never a crash loop).

use crate::DraError;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::BTreeMap;

/// The format this crate writes.
pub const CHECKPOINT_VERSION: u32 = 1;
/// The oldest reader that can use what this crate writes.
pub const CHECKPOINT_MIN_READER_VERSION: u32 = 1;

/// The whole checkpoint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Checkpoint {
    pub version: u32,
    pub min_reader_version: u32,
    /// Claims by UID.
    #[serde(default)]
    pub claims: BTreeMap<String, PreparedClaim>,
    /// Fields of a newer format, kept as read.
    #[serde(flatten)]
    pub extra: BTreeMap<String, Value>,
}

impl Default for Checkpoint {
    fn default() -> Self {
        Checkpoint {
            version: CHECKPOINT_VERSION,
            min_reader_version: CHECKPOINT_MIN_READER_VERSION,
            claims: BTreeMap::new(),
            extra: BTreeMap::new(),
        }
    }
}

/// Where a claim's prepare got to: a crash between the steps leaves `Preparing`, which the next
/// prepare or unprepare finishes or undoes (MIG instances listed here are the claim's even then).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum ClaimState {
    #[default]
    Preparing,
    Prepared,
}

/// One claim the agent prepared (or started to).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct PreparedClaim {
    pub namespace: String,
    pub name: String,
    #[serde(default)]
    pub state: ClaimState,
    #[serde(default)]
    pub devices: Vec<PreparedDevice>,
    #[serde(flatten)]
    pub extra: BTreeMap<String, Value>,
}

/// One device of a prepared claim, as returned to the kubelet.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct PreparedDevice {
    #[serde(default)]
    pub request_names: Vec<String>,
    pub pool: String,
    /// The device name as published (`gpu-0`, `gpu-0-mig-1g10gb-19-0`).
    pub device: String,
    #[serde(default)]
    pub cdi_device_ids: Vec<String>,
    /// Kubernetes 1.35's share id, for devices allocated more than once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub share_id: Option<String>,
    /// The MIG instance created for this device (dynamic MIG), to destroy on unprepare.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mig: Option<CreatedMig>,
    #[serde(flatten)]
    pub extra: BTreeMap<String, Value>,
}

/// A MIG instance created at prepare: enough to find it again and to know it is still the same
/// one (GI/CI ids are reused after a destroy; the UUID is not).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct CreatedMig {
    pub parent_uuid: String,
    pub gi_profile_id: u32,
    pub placement_start: u32,
    pub gi_id: u32,
    pub ci_id: u32,
    /// `MIG-…`; empty while created but not yet read back.
    #[serde(default)]
    pub uuid: String,
    #[serde(flatten)]
    pub extra: BTreeMap<String, Value>,
}

/// Reads a checkpoint. The error names the problem (the JSON position, or the versions); the
/// caller adds the file name.
pub fn parse(bytes: &[u8]) -> Result<Checkpoint, DraError> {
    let value: Value = serde_json::from_slice(bytes)
        .map_err(|e| DraError::Checkpoint(format!("not JSON: {e}")))?;
    let obj = value
        .as_object()
        .ok_or_else(|| DraError::Checkpoint("not a JSON object".into()))?;
    let number = |key: &str| -> Result<u32, DraError> {
        match obj.get(key) {
            None => Err(DraError::Checkpoint(format!("no {key:?} field"))),
            Some(v) => v
                .as_u64()
                .and_then(|n| u32::try_from(n).ok())
                .filter(|n| *n >= 1)
                .ok_or_else(|| {
                    DraError::Checkpoint(format!(
                        "{key:?} is {v}, not a version number (1 or more)"
                    ))
                }),
        }
    };
    let version = number("version")?;
    let min_reader = number("minReaderVersion")?;
    if min_reader > version {
        return Err(DraError::Checkpoint(format!(
            "minReaderVersion {min_reader} is newer than its own version {version}"
        )));
    }
    if min_reader > CHECKPOINT_VERSION {
        return Err(DraError::CheckpointTooNew {
            version,
            min_reader,
            supported: CHECKPOINT_VERSION,
        });
    }
    serde_json::from_value(value).map_err(|e| DraError::Checkpoint(e.to_string()))
}

/// The bytes to write. A file read from a newer agent keeps its version numbers, so an older
/// agent does not claim a newer file as its own format.
pub fn to_json(checkpoint: &Checkpoint) -> Result<Vec<u8>, DraError> {
    let mut c = checkpoint.clone();
    c.version = c.version.max(CHECKPOINT_VERSION);
    c.min_reader_version = c.min_reader_version.max(CHECKPOINT_MIN_READER_VERSION);
    serde_json::to_vec_pretty(&c).map_err(|e| DraError::Checkpoint(e.to_string()))
}

/// The MIG instances on the GPUs `managed` (by UUID: the GPUs dynamic MIG partitions) that no
/// claim in `checkpoint` holds: the only ones the agent may destroy, after a restart too. A claim
/// still `Preparing` (a crash mid-prepare) holds its instances as well; an instance is matched by
/// UUID, or by parent, GPU-instance profile id and placement while its UUID was not read back yet.
pub fn unheld_instances<'a>(
    inv: &'a gpuops_inventory::Inventory,
    checkpoint: &Checkpoint,
    managed: &[String],
) -> Vec<(&'a gpuops_inventory::Gpu, &'a gpuops_inventory::MigDevice)> {
    let held: Vec<&CreatedMig> = checkpoint
        .claims
        .values()
        .flat_map(|c| c.devices.iter().filter_map(|d| d.mig.as_ref()))
        .collect();
    let holds = |gpu: &gpuops_inventory::Gpu, m: &gpuops_inventory::MigDevice| {
        held.iter().any(|h| {
            if h.uuid.is_empty() {
                h.parent_uuid == gpu.uuid
                    && h.gi_profile_id == m.gi_profile_id
                    && h.placement_start == m.placement_start
            } else {
                h.uuid == m.uuid
            }
        })
    };
    inv.gpus
        .iter()
        .filter(|g| managed.contains(&g.uuid))
        .flat_map(|g| g.mig_devices.iter().map(move |m| (g, m)))
        .filter(|(g, m)| !holds(g, m))
        .collect()
}
