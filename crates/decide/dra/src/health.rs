//! Device health as DRA device taints, with NVIDIA's taint keys.

use serde::{Deserialize, Serialize};

/// Taint key of a device hit by an XID the agent counts as fatal; the value is the XID number.
pub const TAINT_KEY_XID: &str = "gpu.nvidia.com/xid";
/// Taint key of a GPU that fell off the bus (and every device on it).
pub const TAINT_KEY_GPU_LOST: &str = "gpu.nvidia.com/gpu-lost";

/// Why a device must not take new claims.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "reason", rename_all = "kebab-case")]
pub enum Unhealthy {
    /// A fatal XID on the GPU (or on this MIG device).
    Xid { xid: u64 },
    /// NVML answers `GPU_IS_LOST`, or the GPU could not be read at all.
    GpuLost,
}

/// `DeviceTaint.effect`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum TaintEffect {
    /// No new claims; claims already allocated stay (NVIDIA's choice for both keys).
    #[default]
    NoSchedule,
    /// Also evicts the pods using the device.
    NoExecute,
}

impl TaintEffect {
    pub fn as_str(self) -> &'static str {
        match self {
            TaintEffect::NoSchedule => "NoSchedule",
            TaintEffect::NoExecute => "NoExecute",
        }
    }
}

/// One taint on a published device. `timeAdded` is left to the API server.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Taint {
    pub key: String,
    pub value: Option<String>,
    pub effect: TaintEffect,
}

/// The taint a device gets for `why`.
pub fn taint_for(why: &Unhealthy, effect: TaintEffect) -> Taint {
    match why {
        Unhealthy::Xid { xid } => Taint {
            key: TAINT_KEY_XID.to_string(),
            value: Some(xid.to_string()),
            effect,
        },
        Unhealthy::GpuLost => Taint {
            key: TAINT_KEY_GPU_LOST.to_string(),
            value: None,
            effect,
        },
    }
}
