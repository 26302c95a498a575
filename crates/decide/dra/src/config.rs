//! NVIDIA's opaque device configs (`resource.nvidia.com/v1beta1`, driver `gpu.nvidia.com`):
//! `GpuConfig` and `MigDeviceConfig`, read strictly (unknown fields are refused by name, as
//! NVIDIA's strict decoder does for claims) with the defaults NVIDIA's `Normalize` fills in.
//!
//! ```json
//! {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig",
//!  "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}}}
//! ```

use crate::DraError;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::collections::BTreeMap;

/// The API group and version of the configs.
pub const API_VERSION: &str = "resource.nvidia.com/v1beta1";
pub const KIND_GPU_CONFIG: &str = "GpuConfig";
pub const KIND_MIG_DEVICE_CONFIG: &str = "MigDeviceConfig";

/// A parsed opaque config.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum OpaqueConfig {
    /// For whole GPUs.
    Gpu(GpuConfig),
    /// For MIG devices.
    MigDevice(MigDeviceConfig),
}

/// `GpuConfig`: no sharing means the claim's containers share the GPU as CUDA does by default.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct GpuConfig {
    pub sharing: Option<GpuSharing>,
}

/// `GpuConfig.sharing`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum GpuSharing {
    TimeSlicing(TimeSlicingConfig),
    Mps(MpsConfig),
}

/// `MigDeviceConfig`: a MIG device can be shared only through MPS.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct MigDeviceConfig {
    pub sharing: Option<MpsConfig>,
}

/// `sharing.timeSlicingConfig`; absent means `interval: Default`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct TimeSlicingConfig {
    pub interval: TimeSliceInterval,
}

/// `sharing.timeSlicingConfig.interval`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum TimeSliceInterval {
    #[default]
    Default,
    Short,
    Medium,
    Long,
}

impl TimeSliceInterval {
    pub const ALL: [TimeSliceInterval; 4] = [
        TimeSliceInterval::Default,
        TimeSliceInterval::Short,
        TimeSliceInterval::Medium,
        TimeSliceInterval::Long,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            TimeSliceInterval::Default => "Default",
            TimeSliceInterval::Short => "Short",
            TimeSliceInterval::Medium => "Medium",
            TimeSliceInterval::Long => "Long",
        }
    }

    /// The value `nvidia-smi compute-policy --set-timeslice` takes (0-3).
    pub fn as_int(self) -> u32 {
        match self {
            TimeSliceInterval::Default => 0,
            TimeSliceInterval::Short => 1,
            TimeSliceInterval::Medium => 2,
            TimeSliceInterval::Long => 3,
        }
    }
}

/// `sharing.mpsConfig`; absent means all defaults (the control daemon's own).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct MpsConfig {
    /// 0-100.
    pub default_active_thread_percentage: Option<u32>,
    /// Bytes, for every device of the claim.
    pub default_pinned_device_memory_limit: Option<u64>,
    /// Bytes per device, keyed by device UUID or index in the claim; overrides the default.
    pub default_per_device_pinned_memory_limit: BTreeMap<String, u64>,
    /// Start the control daemon in multi-user mode.
    pub multi_user: Option<bool>,
}

impl MpsConfig {
    /// The pinned-memory limit per device UUID of the claim, in the control daemon's unit
    /// (`set_default_device_pinned_mem_limit <uuid> <N>M`, whole MiB), the defaults first and the
    /// per-device entries over them; a key that names no device of the claim is an error.
    pub fn pinned_limits(&self, uuids: &[String]) -> Result<BTreeMap<String, String>, DraError> {
        let mib = |bytes: u64| format!("{}M", bytes / (1024 * 1024));
        let mut out = BTreeMap::new();
        if let Some(limit) = self.default_pinned_device_memory_limit {
            for u in uuids {
                out.insert(u.clone(), mib(limit));
            }
        }
        for (key, limit) in &self.default_per_device_pinned_memory_limit {
            let uuid = if uuids.contains(key) {
                key.clone()
            } else {
                match key.parse::<usize>().ok().and_then(|i| uuids.get(i)) {
                    Some(u) => u.clone(),
                    None => {
                        return Err(DraError::UnknownDeviceKey {
                            path: "sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit".into(),
                            key: key.clone(),
                            last: uuids.len().saturating_sub(1),
                        });
                    }
                }
            };
            out.insert(uuid, mib(*limit));
        }
        Ok(out)
    }
}

/// Parses one opaque config's `parameters` (the raw JSON of `opaque.parameters`).
pub fn parse_opaque(json: &[u8]) -> Result<OpaqueConfig, DraError> {
    let value: Value =
        serde_json::from_slice(json).map_err(|e| DraError::ConfigSyntax(e.to_string()))?;
    parse_opaque_value(&value)
}

/// [`parse_opaque`] on JSON already decoded.
pub fn parse_opaque_value(value: &Value) -> Result<OpaqueConfig, DraError> {
    let obj = object(value, "")?;
    let api_version = string(obj.get("apiVersion"), "apiVersion", API_VERSION)?;
    if api_version != API_VERSION {
        return Err(bad("apiVersion", obj.get("apiVersion"), API_VERSION));
    }
    let kinds = format!("{KIND_GPU_CONFIG} or {KIND_MIG_DEVICE_CONFIG}");
    let kind = string(obj.get("kind"), "kind", &kinds)?;
    match kind {
        KIND_GPU_CONFIG => {
            only(obj, "", &["apiVersion", "kind", "sharing"])?;
            let sharing = match obj.get("sharing") {
                None | Some(Value::Null) => None,
                Some(s) => Some(gpu_sharing(s)?),
            };
            Ok(OpaqueConfig::Gpu(GpuConfig { sharing }))
        }
        KIND_MIG_DEVICE_CONFIG => {
            only(obj, "", &["apiVersion", "kind", "sharing"])?;
            let sharing = match obj.get("sharing") {
                None | Some(Value::Null) => None,
                Some(s) => Some(mig_sharing(s)?),
            };
            Ok(OpaqueConfig::MigDevice(MigDeviceConfig { sharing }))
        }
        _ => Err(bad("kind", obj.get("kind"), &kinds)),
    }
}

fn gpu_sharing(v: &Value) -> Result<GpuSharing, DraError> {
    let obj = object(v, "sharing")?;
    only(
        obj,
        "sharing",
        &["strategy", "timeSlicingConfig", "mpsConfig"],
    )?;
    let strategy = string(
        obj.get("strategy"),
        "sharing.strategy",
        "TimeSlicing or MPS",
    )?;
    let present = |k: &str| obj.get(k).is_some_and(|v| !v.is_null());
    match strategy {
        "TimeSlicing" => {
            if present("mpsConfig") {
                return Err(bad(
                    "sharing.mpsConfig",
                    obj.get("mpsConfig"),
                    "no mpsConfig with strategy TimeSlicing (use timeSlicingConfig, or strategy MPS)",
                ));
            }
            let config = match obj.get("timeSlicingConfig") {
                None | Some(Value::Null) => TimeSlicingConfig::default(),
                Some(c) => time_slicing(c)?,
            };
            Ok(GpuSharing::TimeSlicing(config))
        }
        "MPS" => {
            if present("timeSlicingConfig") {
                return Err(bad(
                    "sharing.timeSlicingConfig",
                    obj.get("timeSlicingConfig"),
                    "no timeSlicingConfig with strategy MPS (use mpsConfig, or strategy TimeSlicing)",
                ));
            }
            Ok(GpuSharing::Mps(mps_of(obj)?))
        }
        _ => Err(bad(
            "sharing.strategy",
            obj.get("strategy"),
            "TimeSlicing or MPS",
        )),
    }
}

fn mig_sharing(v: &Value) -> Result<MpsConfig, DraError> {
    let obj = object(v, "sharing")?;
    if obj.contains_key("timeSlicingConfig") {
        return Err(bad(
            "sharing.timeSlicingConfig",
            obj.get("timeSlicingConfig"),
            "MIG devices cannot be time-sliced; MigDeviceConfig takes only strategy MPS with mpsConfig",
        ));
    }
    only(obj, "sharing", &["strategy", "mpsConfig"])?;
    let accepted = "MPS (a MIG device cannot be time-sliced)";
    let strategy = string(obj.get("strategy"), "sharing.strategy", accepted)?;
    if strategy != "MPS" {
        return Err(bad("sharing.strategy", obj.get("strategy"), accepted));
    }
    mps_of(obj)
}

fn time_slicing(v: &Value) -> Result<TimeSlicingConfig, DraError> {
    let path = "sharing.timeSlicingConfig";
    let obj = object(v, path)?;
    only(obj, path, &["interval"])?;
    let accepted = "Default, Short, Medium or Long";
    let interval = match obj.get("interval") {
        None | Some(Value::Null) => TimeSliceInterval::Default,
        Some(i) => {
            let s = i.as_str();
            TimeSliceInterval::ALL
                .into_iter()
                .find(|t| Some(t.as_str()) == s)
                .ok_or_else(|| bad("sharing.timeSlicingConfig.interval", Some(i), accepted))?
        }
    };
    Ok(TimeSlicingConfig { interval })
}

fn mps_of(sharing: &Map<String, Value>) -> Result<MpsConfig, DraError> {
    let path = "sharing.mpsConfig";
    let obj = match sharing.get("mpsConfig") {
        None | Some(Value::Null) => return Ok(MpsConfig::default()),
        Some(v) => object(v, path)?,
    };
    only(
        obj,
        path,
        &[
            "defaultActiveThreadPercentage",
            "defaultPinnedDeviceMemoryLimit",
            "defaultPerDevicePinnedMemoryLimit",
            "multiUser",
        ],
    )?;
    let mut out = MpsConfig::default();
    if let Some(v) = obj
        .get("defaultActiveThreadPercentage")
        .filter(|v| !v.is_null())
    {
        let p = format!("{path}.defaultActiveThreadPercentage");
        let accepted = "an integer from 0 to 100";
        let n = v
            .as_u64()
            .filter(|n| *n <= 100)
            .ok_or_else(|| bad(&p, Some(v), accepted))?;
        out.default_active_thread_percentage = Some(n as u32);
    }
    if let Some(v) = obj
        .get("defaultPinnedDeviceMemoryLimit")
        .filter(|v| !v.is_null())
    {
        let p = format!("{path}.defaultPinnedDeviceMemoryLimit");
        out.default_pinned_device_memory_limit = Some(pinned_limit(v, &p)?);
    }
    if let Some(v) = obj
        .get("defaultPerDevicePinnedMemoryLimit")
        .filter(|v| !v.is_null())
    {
        let p = format!("{path}.defaultPerDevicePinnedMemoryLimit");
        for (key, limit) in object(v, &p)? {
            let bytes = pinned_limit(limit, &format!("{p}.{key}"))?;
            out.default_per_device_pinned_memory_limit
                .insert(key.clone(), bytes);
        }
    }
    if let Some(v) = obj.get("multiUser").filter(|v| !v.is_null()) {
        let p = format!("{path}.multiUser");
        out.multi_user = Some(
            v.as_bool()
                .ok_or_else(|| bad(&p, Some(v), "true or false"))?,
        );
    }
    Ok(out)
}

/// A pinned-memory limit: a Kubernetes quantity of at least 1Mi (the daemon takes whole MiB; NVIDIA
/// refuses less as "value set too low").
fn pinned_limit(v: &Value, path: &str) -> Result<u64, DraError> {
    let accepted = "a quantity of at least 1Mi, e.g. 4Gi or 512Mi";
    let bytes = match v {
        Value::String(s) => parse_quantity(s),
        Value::Number(n) => n.as_u64(),
        _ => None,
    };
    bytes
        .filter(|b| *b >= 1024 * 1024)
        .ok_or_else(|| bad(path, Some(v), accepted))
}

/// A Kubernetes quantity in bytes, whole numbers only (`4Gi`, `512M`, `1e9`, `1073741824`);
/// `None` for anything else or anything that overflows.
pub fn parse_quantity(s: &str) -> Option<u64> {
    let s = s.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (number, suffix) = s.split_at(split);
    if number.is_empty() {
        return None;
    }
    let (whole, frac) = number.split_once('.').unwrap_or((number, ""));
    if whole.is_empty() && frac.is_empty() {
        return None;
    }
    let scale: u128 = match suffix {
        "" => 1,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "Ti" => 1 << 40,
        "Pi" => 1 << 50,
        "Ei" => 1 << 60,
        "k" => 1_000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        "T" => 1_000_000_000_000,
        "P" => 1_000_000_000_000_000,
        "E" => 1_000_000_000_000_000_000,
        e if e.starts_with(['e', 'E']) => {
            let exp: u32 = e[1..].parse().ok()?;
            10u128.checked_pow(exp)?
        }
        _ => return None,
    };
    let whole: u128 = if whole.is_empty() {
        0
    } else {
        whole.parse().ok()?
    };
    let mut value = whole.checked_mul(scale)?;
    if !frac.is_empty() {
        let digits: u32 = frac.len().try_into().ok()?;
        let denom = 10u128.checked_pow(digits)?;
        let f: u128 = frac.parse().ok()?;
        let part = f.checked_mul(scale)?;
        if part % denom != 0 {
            return None;
        }
        value = value.checked_add(part / denom)?;
    }
    u64::try_from(value).ok()
}

fn object<'a>(v: &'a Value, path: &str) -> Result<&'a Map<String, Value>, DraError> {
    v.as_object().ok_or_else(|| {
        bad(
            if path.is_empty() { "(top level)" } else { path },
            Some(v),
            "an object",
        )
    })
}

fn string<'a>(v: Option<&'a Value>, path: &str, accepted: &str) -> Result<&'a str, DraError> {
    v.and_then(Value::as_str)
        .ok_or_else(|| bad(path, v, accepted))
}

/// Refuses the first field of `obj` outside `known`, naming it and the fields that exist there.
fn only(obj: &Map<String, Value>, path: &str, known: &[&str]) -> Result<(), DraError> {
    match obj.keys().find(|k| !known.contains(&k.as_str())) {
        None => Ok(()),
        Some(k) => Err(DraError::Config {
            path: if path.is_empty() {
                k.clone()
            } else {
                format!("{path}.{k}")
            },
            value: "an unknown field".into(),
            accepted: format!("fields here are {}", known.join(", ")),
        }),
    }
}

fn bad(path: &str, value: Option<&Value>, accepted: &str) -> DraError {
    DraError::Config {
        path: path.to_string(),
        value: value.map_or_else(|| "missing".to_string(), Value::to_string),
        accepted: accepted.to_string(),
    }
}
