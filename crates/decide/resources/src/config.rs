//! NVIDIA's device plugin config file (`version: v1`), its env vars / CLI flags, and their precedence.
//!
//! Fields that may come from a file, an env var or a flag are `Option`s: `None` means "not set here",
//! so [`Config::effective`] can layer flag > env > file > defaults exactly as NVIDIA's plugin does.
//! After `effective`, every such field is `Some`; the accessors (`mig_strategy()`, ...) give the
//! default for `None` either way.

use crate::ResourcesError;
use gpuops_yamlpos::{Node, SNode, edit_distance};
use serde::de::{self, Deserializer, SeqAccess, Visitor};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use std::fmt;

/// Default MPS root: where NVIDIA's Helm chart puts MPS pipes and shared memory.
pub const DEFAULT_MPS_ROOT: &str = "/run/nvidia/mps";
/// Default CDI annotation prefix.
pub const DEFAULT_CDI_ANNOTATION_PREFIX: &str = "cdi.k8s.io/";
/// Prefix of every resource name.
pub const RESOURCE_PREFIX: &str = "nvidia.com";
/// Longest fully qualified resource name NVIDIA accepts.
pub const MAX_RESOURCE_NAME_LEN: usize = 63;

/// Most time-slicing replicas per device (`replicas`, `DEVICE_SPLIT_COUNT`). Each replica is a
/// device the kubelet is told about, so the count sizes the agent's memory and the device
/// plugin's messages: 1,000,000,000 replicas asked 32 GB and aborted the agent. NVIDIA's plugin
/// sets no bound; the kubelet runs at most 110 pods per node by default (`--max-pods`, a few
/// hundred at most in practice), so more than 1024 replicas of one GPU can never all be used,
/// while 16 GPUs x 7 MIG devices x 1024 replicas (115,000 devices) stays a few MiB.
pub const MAX_TIME_SLICING_REPLICAS: i64 = 1024;
/// Most MPS replicas per device: the MPS control daemon serves at most 48 clients per GPU
/// (Volta and later; NVIDIA's MPS docs), so more replicas could never all run.
pub const MAX_MPS_REPLICAS: i64 = 48;
/// Most devices `devices: N` may select: no node has more than 16 GPUs of 7 MIG devices each.
pub const MAX_DEVICES_COUNT: u64 = 1024;

/// The replica limit of a sharing section (`sharing.timeSlicing` or `sharing.mps`).
fn replicas_limit(section: &str) -> (i64, &'static str) {
    if section.ends_with("mps") {
        (
            MAX_MPS_REPLICAS,
            "the MPS control daemon serves at most 48 clients per GPU",
        )
    } else {
        (
            MAX_TIME_SLICING_REPLICAS,
            "more than a node's pods could ever use",
        )
    }
}

/// `sharing.mps: nvidia.com/gpu: replicas 100 is more than 48 ...`: the message for a replica
/// count over the limit, also for counts too large to read as a number.
fn replicas_too_large(section: &str, name: &str, given: &str) -> String {
    let (max, why) = replicas_limit(section);
    format!(
        "{section}: {name}: replicas {given} is more than {max}, the limit per device ({why}); accepted: 2 to {max}"
    )
}

fn config_error(origin: &str, at: Option<Position>, problem: impl Into<String>) -> ResourcesError {
    ResourcesError::Config {
        origin: origin.to_string(),
        line: at.map(|p| p.line),
        column: at.map(|p| p.column),
        problem: problem.into(),
    }
}

/// A line/column in the config file (1-based).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Position {
    pub line: u64,
    pub column: u64,
}

/// A value with where it was written, when it came from a file. Compares and serialises as the value.
#[derive(Debug, Clone, Default)]
pub struct Located<T> {
    pub value: T,
    pub at: Option<Position>,
}

impl<T> From<T> for Located<T> {
    fn from(value: T) -> Self {
        Located { value, at: None }
    }
}

impl<T: PartialEq> PartialEq for Located<T> {
    fn eq(&self, other: &Self) -> bool {
        self.value == other.value
    }
}

impl<T: Serialize> Serialize for Located<T> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.value.serialize(s)
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Located<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = serde_saphyr::Spanned::<T>::deserialize(d)?;
        let loc = s.referenced;
        let at = (loc.line() > 0).then(|| Position {
            line: loc.line(),
            column: loc.column(),
        });
        Ok(Located { value: s.value, at })
    }
}

/// The whole config file.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Config {
    /// `v1`, or empty (means v1).
    #[serde(default)]
    pub version: Located<String>,
    #[serde(default)]
    pub flags: Flags,
    #[serde(default)]
    pub sharing: Sharing,
    /// NVIDIA's `resources` (custom GPU/MIG naming patterns): accepted and kept, not used.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<serde_json::Value>,
    /// NVIDIA's `imex` section: accepted and kept, not used.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub imex: Option<serde_json::Value>,
    /// Fields we do not know (ignored, as NVIDIA's plugin ignores them), as `flags.plugin.foo` paths.
    #[serde(skip)]
    pub unknown_fields: Vec<String>,
    /// The same fields with where they are written and the known key they probably meant, for
    /// the runtime to warn about (once per file) and count.
    #[serde(skip)]
    pub unknown_keys: Vec<UnknownKey>,
}

/// A key of the config file that NVIDIA's schema does not have: accepted (NVIDIA's parser is
/// lenient too) but most likely a typo, so the runtime warns with its position.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownKey {
    /// Dotted path, `[]` for list items: `flags.migStratagy`, `sharing.timeSlicing.resources[].nmae`.
    pub path: String,
    /// Where the key is written, when known.
    pub at: Option<Position>,
    /// The known key at the same place it is closest to (`migStrategy`), if one is close.
    pub did_you_mean: Option<&'static str>,
    /// For a key inside a list item (`resources[]`), the item's index in its list.
    pub item: Option<usize>,
}

impl UnknownKey {
    /// `f.yaml:3:3: unknown key flags.migStratagy (did you mean flags.migStrategy?); ignored, as
    /// NVIDIA's device plugin ignores it`.
    pub fn warning(&self, origin: &str) -> String {
        let mut at = origin.to_string();
        if let Some(p) = self.at {
            at.push_str(&format!(":{}:{}", p.line, p.column));
        }
        let hint = self.did_you_mean.map_or_else(String::new, |k| {
            let parent = self.path.rsplit_once('.').map_or("", |(parent, _)| parent);
            if parent.is_empty() {
                format!(" (did you mean {k}?)")
            } else {
                format!(" (did you mean {parent}.{k}?)")
            }
        });
        format!(
            "{at}: unknown key {}{hint}; ignored, as NVIDIA's device plugin ignores it",
            self.path
        )
    }
}

/// `flags:`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Flags {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mig_strategy: Option<MigStrategy>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fail_on_init_error: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nvidia_driver_root: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nvidia_dev_root: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mps_root: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gds_enabled: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mofed_enabled: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gdrcopy_enabled: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_discovery_strategy: Option<DeviceDiscoveryStrategy>,
    #[serde(
        default,
        rename = "useNodeFeatureAPI",
        skip_serializing_if = "Option::is_none"
    )]
    pub use_node_feature_api: Option<bool>,
    #[serde(default)]
    pub plugin: PluginFlags,
    #[serde(default)]
    pub gfd: GfdFlags,
}

/// `flags.plugin:`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PluginFlags {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pass_device_specs: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_list_strategy: Option<DeviceListStrategies>,
    #[serde(
        default,
        rename = "deviceIDStrategy",
        skip_serializing_if = "Option::is_none"
    )]
    pub device_id_strategy: Option<DeviceIdStrategy>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cdi_annotation_prefix: Option<String>,
    #[serde(
        default,
        rename = "nvidiaCTKPath",
        skip_serializing_if = "Option::is_none"
    )]
    pub nvidia_ctk_path: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container_driver_root: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shared_devices_allocation_policy: Option<AllocationPolicy>,
}

/// `flags.gfd:` (GPU Feature Discovery's own flags; accepted and kept).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GfdFlags {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oneshot: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub no_timestamp: Option<bool>,
    /// A Go duration, e.g. `60s`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sleep_interval: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_file: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub machine_type_file: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MigStrategy {
    #[default]
    None,
    Single,
    Mixed,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DeviceDiscoveryStrategy {
    #[default]
    Auto,
    Nvml,
    Tegra,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DeviceIdStrategy {
    #[default]
    Uuid,
    Index,
}

/// `sharedDevicesAllocationPolicy`: how replicas of shared GPUs are picked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AllocationPolicy {
    /// NVIDIA's default: spread replicas over the least used devices.
    #[default]
    Distributed,
    /// NVIDIA's: fill the most used devices first.
    Packed,
    /// gpuops: keep a request's replicas on one device, chosen by the packing engine's GPU-level
    /// rule (the best-fit device that holds the whole share; see docs/packing.md).
    #[serde(rename = "fragmentation-aware")]
    FragmentationAware,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DeviceListStrategy {
    Envvar,
    VolumeMounts,
    CdiAnnotations,
    CdiCri,
}

impl DeviceListStrategy {
    pub const ALL: [DeviceListStrategy; 4] = [
        DeviceListStrategy::Envvar,
        DeviceListStrategy::VolumeMounts,
        DeviceListStrategy::CdiAnnotations,
        DeviceListStrategy::CdiCri,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            DeviceListStrategy::Envvar => "envvar",
            DeviceListStrategy::VolumeMounts => "volume-mounts",
            DeviceListStrategy::CdiAnnotations => "cdi-annotations",
            DeviceListStrategy::CdiCri => "cdi-cri",
        }
    }

    pub fn parse(s: &str) -> Result<Self, ResourcesError> {
        Self::ALL
            .into_iter()
            .find(|d| d.as_str() == s.trim())
            .ok_or_else(|| ResourcesError::UnknownDeviceListStrategy(s.to_string()))
    }

    pub fn is_cdi(self) -> bool {
        matches!(
            self,
            DeviceListStrategy::CdiAnnotations | DeviceListStrategy::CdiCri
        )
    }
}

/// `deviceListStrategy`: a single string or a list (NVIDIA accepts both).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct DeviceListStrategies(pub Vec<DeviceListStrategy>);

impl DeviceListStrategies {
    pub fn includes(&self, s: DeviceListStrategy) -> bool {
        self.0.contains(&s)
    }
    pub fn any_cdi(&self) -> bool {
        self.0.iter().any(|s| s.is_cdi())
    }
    pub fn all_cdi(&self) -> bool {
        !self.0.is_empty() && self.0.iter().all(|s| s.is_cdi())
    }
    /// Parses `envvar,volume-mounts` (the env var / flag form).
    pub fn parse_list(s: &str) -> Result<Self, ResourcesError> {
        let items: Vec<DeviceListStrategy> = s
            .split(',')
            .filter(|p| !p.trim().is_empty())
            .map(DeviceListStrategy::parse)
            .collect::<Result<_, _>>()?;
        if items.is_empty() {
            return Err(ResourcesError::EmptyDeviceListStrategy);
        }
        Ok(DeviceListStrategies(items))
    }
}

impl<'de> Deserialize<'de> for DeviceListStrategies {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = DeviceListStrategies;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a device list strategy or a list of them")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
                DeviceListStrategy::parse(v)
                    .map(|s| DeviceListStrategies(vec![s]))
                    .map_err(E::custom)
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                let mut out = Vec::new();
                while let Some(s) = seq.next_element::<String>()? {
                    out.push(DeviceListStrategy::parse(&s).map_err(de::Error::custom)?);
                }
                if out.is_empty() {
                    return Err(de::Error::custom("deviceListStrategy is an empty list"));
                }
                Ok(DeviceListStrategies(out))
            }
        }
        d.deserialize_any(V)
    }
}

/// `sharing:`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Sharing {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_slicing: Option<ReplicatedResources>,
    #[serde(default, rename = "mps", skip_serializing_if = "Option::is_none")]
    pub mps: Option<ReplicatedResources>,
}

/// Which kind of sharing applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SharingStrategy {
    #[default]
    None,
    TimeSlicing,
    Mps,
}

impl SharingStrategy {
    /// The GFD label value (`none`, `time-slicing`, `mps`).
    pub fn as_str(self) -> &'static str {
        match self {
            SharingStrategy::None => "none",
            SharingStrategy::TimeSlicing => "time-slicing",
            SharingStrategy::Mps => "mps",
        }
    }
}

impl Sharing {
    fn replicated(r: &Option<ReplicatedResources>) -> bool {
        r.as_ref().is_some_and(|r| !r.resources.is_empty())
    }

    /// The active strategy and its section (MPS wins if both were set; validation rejects that).
    pub fn active(&self) -> (SharingStrategy, Option<&ReplicatedResources>) {
        if Self::replicated(&self.mps) {
            (SharingStrategy::Mps, self.mps.as_ref())
        } else if Self::replicated(&self.time_slicing) {
            (SharingStrategy::TimeSlicing, self.time_slicing.as_ref())
        } else {
            (SharingStrategy::None, None)
        }
    }
}

/// `sharing.timeSlicing` / `sharing.mps`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReplicatedResources {
    #[serde(default)]
    pub rename_by_default: bool,
    /// Forced true for MPS (see [`ReplicatedResources::fail_requests_greater_than_one`]).
    #[serde(default)]
    pub fail_requests_greater_than_one: bool,
    #[serde(default)]
    pub resources: Vec<ReplicatedResource>,
}

/// One entry of `resources:` in a sharing section.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReplicatedResource {
    /// `nvidia.com/gpu`, `gpu` (prefix added), `nvidia.com/mig-1g.10gb`, ...
    pub name: Located<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rename: Option<Located<String>>,
    #[serde(default)]
    pub devices: Located<ReplicatedDevices>,
    #[serde(default)]
    pub replicas: Located<Option<i64>>,
}

/// `devices:` of a replicated resource.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum ReplicatedDevices {
    #[default]
    All,
    /// The first N devices (by GPU index, then MIG index).
    Count(u32),
    List(Vec<DeviceRef>),
}

/// One entry of a `devices:` list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeviceRef {
    /// A GPU index (`0`): the GPU, or every MIG device on it.
    GpuIndex(u32),
    /// A MIG device as `i:j` (GPU index : MIG device index).
    MigIndex(u32, u32),
    /// A `GPU-…` or `MIG-…` UUID.
    Uuid(String),
}

impl DeviceRef {
    pub fn parse(s: &str) -> Result<Self, ResourcesError> {
        let s = s.trim();
        if let Ok(i) = s.parse::<u32>() {
            return Ok(DeviceRef::GpuIndex(i));
        }
        if let Some((a, b)) = s.split_once(':')
            && let (Ok(a), Ok(b)) = (a.parse::<u32>(), b.parse::<u32>())
        {
            return Ok(DeviceRef::MigIndex(a, b));
        }
        if s.starts_with("GPU-") || s.starts_with("MIG-") {
            return Ok(DeviceRef::Uuid(s.to_string()));
        }
        Err(ResourcesError::BadDeviceRef(s.to_string()))
    }
}

impl fmt::Display for DeviceRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceRef::GpuIndex(i) => write!(f, "{i}"),
            DeviceRef::MigIndex(i, j) => write!(f, "{i}:{j}"),
            DeviceRef::Uuid(u) => f.write_str(u),
        }
    }
}

impl Serialize for ReplicatedDevices {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            ReplicatedDevices::All => s.serialize_str("all"),
            ReplicatedDevices::Count(n) => s.serialize_u32(*n),
            ReplicatedDevices::List(l) => s.collect_seq(l.iter().map(|d| d.to_string())),
        }
    }
}

impl<'de> Deserialize<'de> for ReplicatedDevices {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = ReplicatedDevices;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str(
                    "\"all\", a device count, or a list of GPU indices, i:j MIG indices or UUIDs",
                )
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
                if v == "all" {
                    Ok(ReplicatedDevices::All)
                } else {
                    Err(E::custom(format!(
                        "devices {v:?}: expected \"all\", a count or a list"
                    )))
                }
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
                match u32::try_from(v) {
                    Ok(n) if n > 0 && u64::from(n) <= MAX_DEVICES_COUNT => {
                        Ok(ReplicatedDevices::Count(n))
                    }
                    _ if v == 0 => Err(E::custom(format!(
                        "devices count {v}: must be at least 1 (accepted: 1 to {MAX_DEVICES_COUNT}, \"all\" or a list)"
                    ))),
                    _ => Err(E::custom(format!(
                        "devices count {v} is more than {MAX_DEVICES_COUNT}, the limit (no node has more than 16 GPUs of 7 MIG devices); accepted: 1 to {MAX_DEVICES_COUNT}, \"all\" or a list"
                    ))),
                }
            }
            fn visit_u128<E: de::Error>(self, v: u128) -> Result<Self::Value, E> {
                self.visit_u64(u64::try_from(v).unwrap_or(u64::MAX))
            }
            fn visit_i128<E: de::Error>(self, v: i128) -> Result<Self::Value, E> {
                match u64::try_from(v) {
                    Ok(v) => self.visit_u64(v),
                    Err(_) if v > 0 => self.visit_u64(u64::MAX),
                    Err(_) => Err(E::custom(format!("devices count {v}: must be at least 1"))),
                }
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Self::Value, E> {
                match u64::try_from(v) {
                    Ok(v) => self.visit_u64(v),
                    Err(_) => Err(E::custom(format!("devices count {v}: must be at least 1"))),
                }
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                let mut out = Vec::new();
                while let Some(item) = seq.next_element::<IntOrString>()? {
                    let r = match item {
                        IntOrString::Int(i) => u32::try_from(i)
                            .map(DeviceRef::GpuIndex)
                            .map_err(|_| format!("device index {i} out of range")),
                        IntOrString::Str(s) => DeviceRef::parse(&s).map_err(|e| e.to_string()),
                    };
                    out.push(r.map_err(de::Error::custom)?);
                }
                if out.is_empty() {
                    return Err(de::Error::custom("devices is an empty list"));
                }
                Ok(ReplicatedDevices::List(out))
            }
        }
        d.deserialize_any(V)
    }
}

enum IntOrString {
    Int(i64),
    Str(String),
}

impl<'de> Deserialize<'de> for IntOrString {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = IntOrString;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a GPU index, an i:j MIG index or a UUID")
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Self::Value, E> {
                Ok(IntOrString::Int(v))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
                i64::try_from(v)
                    .map(IntOrString::Int)
                    .map_err(|_| E::custom("device index out of range"))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
                Ok(IntOrString::Str(v.to_string()))
            }
        }
        d.deserialize_any(V)
    }
}

/// Fully qualifies and checks a resource name the way NVIDIA does (`gpu` -> `nvidia.com/gpu`).
pub fn qualify_resource_name(name: &str) -> Result<String, ResourcesError> {
    let full = if name.starts_with(&format!("{RESOURCE_PREFIX}/")) {
        name.to_string()
    } else if name.contains('/') {
        return Err(ResourcesError::NameDomain {
            name: name.to_string(),
            domain: RESOURCE_PREFIX,
        });
    } else {
        format!("{RESOURCE_PREFIX}/{name}")
    };
    if full.len() > MAX_RESOURCE_NAME_LEN {
        return Err(ResourcesError::NameTooLong {
            name: full,
            max: MAX_RESOURCE_NAME_LEN,
        });
    }
    let short = &full[RESOURCE_PREFIX.len() + 1..];
    if short.is_empty() {
        return Err(ResourcesError::NameEmpty);
    }
    if let Some(bad) = short
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')))
    {
        return Err(ResourcesError::NameCharacter { name: full, bad });
    }
    if !short.starts_with(|c: char| c.is_ascii_alphanumeric())
        || !short.ends_with(|c: char| c.is_ascii_alphanumeric())
    {
        return Err(ResourcesError::NameEnds { name: full });
    }
    Ok(full)
}

/// Known field names per section, to report the ones we ignore.
const KNOWN: &[(&str, &[&str])] = &[
    ("", &["version", "flags", "sharing", "resources", "imex"]),
    (
        "flags",
        &[
            "migStrategy",
            "failOnInitError",
            "nvidiaDriverRoot",
            "nvidiaDevRoot",
            "mpsRoot",
            "gdsEnabled",
            "mofedEnabled",
            "gdrcopyEnabled",
            "deviceDiscoveryStrategy",
            "useNodeFeatureAPI",
            "plugin",
            "gfd",
        ],
    ),
    (
        "flags.plugin",
        &[
            "passDeviceSpecs",
            "deviceListStrategy",
            "deviceIDStrategy",
            "cdiAnnotationPrefix",
            "nvidiaCTKPath",
            "containerDriverRoot",
            "sharedDevicesAllocationPolicy",
        ],
    ),
    (
        "flags.gfd",
        &[
            "oneshot",
            "noTimestamp",
            "sleepInterval",
            "outputFile",
            "machineTypeFile",
        ],
    ),
    ("sharing", &["timeSlicing", "mps"]),
    (
        "sharing.timeSlicing",
        &["renameByDefault", "failRequestsGreaterThanOne", "resources"],
    ),
    (
        "sharing.mps",
        &["renameByDefault", "failRequestsGreaterThanOne", "resources"],
    ),
    (
        "sharing.timeSlicing.resources[]",
        &["name", "rename", "devices", "replicas"],
    ),
    (
        "sharing.mps.resources[]",
        &["name", "rename", "devices", "replicas"],
    ),
];

/// Unknown keys across the config files a process has read: warns once per file and key (a
/// reload of an unchanged file says nothing new) and keeps each file's current count for the
/// `gpuops_config_unknown_keys{file}` gauge.
#[derive(Debug, Clone, Default)]
pub struct UnknownKeyReport {
    warned: std::collections::BTreeSet<(String, String)>,
    counts: BTreeMap<String, usize>,
}

impl UnknownKeyReport {
    /// Records a freshly parsed `config` read from `origin`; returns the warnings not given
    /// before for this file (one line each, with file:line:col and a did-you-mean).
    pub fn record(&mut self, origin: &str, config: &Config) -> Vec<String> {
        self.counts
            .insert(origin.to_string(), config.unknown_keys.len());
        config
            .unknown_keys
            .iter()
            .filter(|k| self.warned.insert((origin.to_string(), k.path.clone())))
            .map(|k| k.warning(origin))
            .collect()
    }

    /// Unknown keys per file, as last read.
    pub fn counts(&self) -> &BTreeMap<String, usize> {
        &self.counts
    }
}

fn collect_unknown(path: &str, item: Option<usize>, node: &SNode, out: &mut Vec<UnknownKey>) {
    match &node.value {
        Node::Map(items) => {
            let Some((_, known)) = KNOWN.iter().find(|(p, _)| *p == path) else {
                return;
            };
            for (k, child) in items {
                let name = k.value.scalar_text().unwrap_or_else(|| "?".to_string());
                let child_path = if path.is_empty() {
                    name.clone()
                } else {
                    format!("{path}.{name}")
                };
                if known.contains(&name.as_str()) {
                    collect_unknown(&child_path, None, child, out);
                } else {
                    let loc = k.referenced;
                    out.push(UnknownKey {
                        path: child_path,
                        at: (loc.line() > 0).then(|| Position {
                            line: loc.line(),
                            column: loc.column(),
                        }),
                        did_you_mean: closest_key(&name, known),
                        item,
                    });
                }
            }
        }
        Node::Seq(items) => {
            for (i, item) in items.iter().enumerate() {
                collect_unknown(&format!("{path}[]"), Some(i), item, out);
            }
        }
        _ => {}
    }
}

/// The known key within edit distance 2 of `word` (case-insensitively), if exactly one is nearest.
fn closest_key(word: &str, known: &[&'static str]) -> Option<&'static str> {
    let w = word.to_ascii_lowercase();
    let mut best: Option<(usize, &'static str)> = None;
    let mut tied = false;
    for &k in known {
        let d = edit_distance(&w, &k.to_ascii_lowercase());
        match best {
            Some((bd, _)) if d == bd => tied = true,
            Some((bd, _)) if d > bd => {}
            _ => {
                best = Some((d, k));
                tied = false;
            }
        }
    }
    match best {
        Some((d, k)) if d <= 2 && !tied => Some(k),
        _ => None,
    }
}

/// Turns a serde-saphyr error into ours, keeping its line and column; `raw` (the same text read
/// untyped) lets a type error name the key and the value.
fn syntax_error(
    origin: &str,
    e: &serde_saphyr::Error,
    raw: Option<&SNode>,
    text: &str,
) -> ResourcesError {
    let p = gpuops_yamlpos::explain(e, raw, text);
    let at = p.line.map(|line| Position {
        line,
        column: p.column.unwrap_or(0),
    });
    // A replica count that is not a number, or too large for its type, gets the limits of
    // replicas rather than those of the Rust type.
    if let (Some(raw), Some(pos)) = (raw, at)
        && let Some(found) = gpuops_yamlpos::find_at(raw, pos.line, pos.column)
        && let Some(value) = gpuops_yamlpos::scalar_at(text, pos.line, pos.column)
        && let Some((section, _)) = found.path.split_once(".resources[")
        && found.path.ends_with("].replicas")
    {
        let name = found
            .path
            .strip_suffix(".replicas")
            .and_then(|item| {
                let (_, entry) = raw_entry(raw, item)?;
                let name = gpuops_yamlpos::map_get(entry, "name")?
                    .1
                    .value
                    .scalar_text()?;
                Some(qualify_resource_name(&name).unwrap_or(name))
            })
            .unwrap_or_else(|| "?".to_string());
        if value.parse::<u128>().is_ok() {
            return config_error(origin, at, replicas_too_large(section, &name, &value));
        }
        let (max, _) = replicas_limit(section);
        return config_error(
            origin,
            at,
            format!(
                "{section}: {name}: replicas {value:?} is not a whole number; accepted: 2 to {max}"
            ),
        );
    }
    config_error(origin, at, p.message)
}

/// The node at a dotted path with list indices (`sharing.mps.resources[0]`).
fn raw_entry<'n>(root: &'n SNode, path: &str) -> Option<(String, &'n SNode)> {
    let mut node = root;
    for part in path.split('.') {
        let (key, index) = match part.split_once('[') {
            Some((k, rest)) => (k, rest.strip_suffix(']')?.parse::<usize>().ok()),
            None => (part, None),
        };
        node = gpuops_yamlpos::map_get(node, key)?.1;
        if let Some(i) = index {
            let Node::Seq(items) = &node.value else {
                return None;
            };
            node = items.get(i)?;
        }
    }
    Some((path.to_string(), node))
}

/// A config file's bytes that are not text we read (too large, UTF-16, not UTF-8), placed at
/// the line and column when known.
fn input_error(origin: &str, e: &gpuops_yamlpos::YamlposError) -> ResourcesError {
    let at = match e {
        gpuops_yamlpos::YamlposError::NotUtf8 { line, column, .. } => Some(Position {
            line: *line,
            column: *column,
        }),
        _ => None,
    };
    config_error(origin, at, e.to_string())
}

impl Config {
    /// Reads a config file's text from `reader` (at most
    /// [`gpuops_yamlpos::MAX_CONFIG_BYTES`], UTF-8) and parses it as [`Config::parse`] does.
    pub fn read(reader: impl std::io::Read, origin: &str) -> Result<Config, ResourcesError> {
        let text = gpuops_yamlpos::read_text(
            reader,
            gpuops_yamlpos::MAX_CONFIG_BYTES,
            "a device plugin config",
        )
        .map_err(|e| input_error(origin, &e))?;
        Config::parse(&text, origin)
    }

    /// Parses and validates a config file (YAML or JSON). `origin` names the file in errors. A
    /// file with nothing in it (empty, blanks or comments only) is an error naming the file: a
    /// config file that says nothing is a mount or templating mistake, not a wish for defaults.
    pub fn parse(text: &str, origin: &str) -> Result<Config, ResourcesError> {
        let empty = || {
            config_error(
                origin,
                None,
                "the file is empty: expected a device plugin config (version: v1, flags: ..., sharing: ...)",
            )
        };
        if text.trim().is_empty() {
            return Err(empty());
        }
        let raw: SNode =
            serde_saphyr::from_str(text).map_err(|e| syntax_error(origin, &e, None, text))?;
        if matches!(raw.value, Node::Null) {
            return Err(empty());
        }
        let mut cfg: Config =
            serde_saphyr::from_str(text).map_err(|e| syntax_error(origin, &e, Some(&raw), text))?;
        // A second, untyped pass to list the fields NVIDIA's newer versions may have and we ignore.
        collect_unknown("", None, &raw, &mut cfg.unknown_keys);
        cfg.unknown_fields = cfg.unknown_keys.iter().map(|k| k.path.clone()).collect();
        cfg.validate(origin)?;
        Ok(cfg)
    }

    /// Checks the rules NVIDIA's plugin enforces (and a few it should).
    pub fn validate(&self, origin: &str) -> Result<(), ResourcesError> {
        let v = self.version.value.as_str();
        if !(v.is_empty() || v == "v1") {
            return Err(config_error(
                origin,
                self.version.at,
                format!("unknown version {v:?}; only \"v1\" is supported"),
            ));
        }
        if let Some(list) = &self.flags.plugin.device_list_strategy
            && list.0.is_empty()
        {
            return Err(config_error(origin, None, "deviceListStrategy is empty"));
        }
        for (section, r) in [
            ("sharing.timeSlicing", &self.sharing.time_slicing),
            ("sharing.mps", &self.sharing.mps),
        ] {
            let Some(r) = r else { continue };
            if r.resources.is_empty() {
                return Err(config_error(
                    origin,
                    None,
                    format!("{section}: no resources specified"),
                ));
            }
            for (index, res) in r.resources.iter().enumerate() {
                let name = qualify_resource_name(&res.name.value)
                    .map_err(|p| config_error(origin, res.name.at, format!("{section}: {p}")))?;
                if let Some(rename) = &res.rename {
                    qualify_resource_name(&rename.value).map_err(|p| {
                        config_error(origin, rename.at, format!("{section}: rename: {p}"))
                    })?;
                }
                let (max, _) = replicas_limit(section);
                match res.replicas.value {
                    None => {
                        // A misspelt `replicas` is why it is missing: point at the misspelling.
                        let typo = self.unknown_keys.iter().find(|k| {
                            k.item == Some(index)
                                && k.did_you_mean == Some("replicas")
                                && k.path.starts_with(&format!("{section}.resources[]."))
                        });
                        if let Some(k) = typo {
                            let key = k.path.rsplit_once('.').map_or(k.path.as_str(), |(_, k)| k);
                            let line =
                                k.at.map_or_else(String::new, |p| format!(" at line {}", p.line));
                            return Err(config_error(
                                origin,
                                k.at.or(res.name.at),
                                format!(
                                    "{section}: {name}: unknown key `{key}`{line} (did you mean `replicas`?); replicas is required (2 to {max})"
                                ),
                            ));
                        }
                        return Err(config_error(
                            origin,
                            res.name.at,
                            format!("{section}: {name}: replicas is required (2 to {max})"),
                        ));
                    }
                    Some(n) if n < 2 => {
                        return Err(config_error(
                            origin,
                            res.replicas.at,
                            format!("{section}: {name}: replicas must be >= 2 (got {n})"),
                        ));
                    }
                    Some(n) if n > max => {
                        return Err(config_error(
                            origin,
                            res.replicas.at,
                            replicas_too_large(section, &name, &n.to_string()),
                        ));
                    }
                    Some(_) => {}
                }
            }
        }
        let ts = Sharing::replicated(&self.sharing.time_slicing);
        let mps = Sharing::replicated(&self.sharing.mps);
        if ts && mps {
            return Err(config_error(
                origin,
                self.mps_position(),
                "sharing.timeSlicing and sharing.mps are exclusive; configure only one",
            ));
        }
        if mps && self.mig_strategy() == MigStrategy::Mixed {
            return Err(config_error(
                origin,
                self.mps_position(),
                "MPS sharing is not supported with the mixed MIG strategy",
            ));
        }
        if let Some(prefix) = &self.flags.plugin.cdi_annotation_prefix
            && prefix.is_empty()
        {
            return Err(config_error(origin, None, "cdiAnnotationPrefix is empty"));
        }
        Ok(())
    }

    fn mps_position(&self) -> Option<Position> {
        self.sharing
            .mps
            .as_ref()
            .and_then(|m| m.resources.first())
            .and_then(|r| r.name.at)
    }

    pub fn mig_strategy(&self) -> MigStrategy {
        self.flags.mig_strategy.unwrap_or_default()
    }
    pub fn fail_on_init_error(&self) -> bool {
        self.flags.fail_on_init_error.unwrap_or(true)
    }
    pub fn nvidia_driver_root(&self) -> &str {
        self.flags.nvidia_driver_root.as_deref().unwrap_or("/")
    }
    /// Where `/dev` lives on the host: `nvidiaDevRoot`, defaulting to the driver root.
    pub fn nvidia_dev_root(&self) -> &str {
        self.flags
            .nvidia_dev_root
            .as_deref()
            .unwrap_or_else(|| self.nvidia_driver_root())
    }
    pub fn mps_root(&self) -> &str {
        self.flags.mps_root.as_deref().unwrap_or(DEFAULT_MPS_ROOT)
    }
    pub fn pass_device_specs(&self) -> bool {
        self.flags.plugin.pass_device_specs.unwrap_or(false)
    }
    pub fn device_list_strategies(&self) -> DeviceListStrategies {
        self.flags
            .plugin
            .device_list_strategy
            .clone()
            .unwrap_or_else(|| DeviceListStrategies(vec![DeviceListStrategy::Envvar]))
    }
    pub fn device_id_strategy(&self) -> DeviceIdStrategy {
        self.flags.plugin.device_id_strategy.unwrap_or_default()
    }
    pub fn cdi_annotation_prefix(&self) -> &str {
        self.flags
            .plugin
            .cdi_annotation_prefix
            .as_deref()
            .unwrap_or(DEFAULT_CDI_ANNOTATION_PREFIX)
    }
    pub fn shared_devices_allocation_policy(&self) -> AllocationPolicy {
        self.flags
            .plugin
            .shared_devices_allocation_policy
            .unwrap_or_default()
    }
    pub fn sharing_strategy(&self) -> SharingStrategy {
        self.sharing.active().0
    }

    /// The config in force: `flags` over `env` over `file` over defaults, validated, with every
    /// optional flag filled in. `DEVICE_SPLIT_COUNT` (>= 2) sets time-slicing replicas for
    /// `nvidia.com/gpu` (replacing a file entry for that name); `1` adds no sharing and leaves
    /// a file's sharing alone.
    pub fn effective(
        file: Option<Config>,
        env: &Overrides,
        flags: &Overrides,
    ) -> Result<Config, ResourcesError> {
        let mut cfg = file.unwrap_or_default();
        for o in [env, flags] {
            o.apply(&mut cfg);
        }
        let f = &mut cfg.flags;
        f.mig_strategy.get_or_insert_default();
        f.fail_on_init_error.get_or_insert(true);
        let driver_root = f
            .nvidia_driver_root
            .get_or_insert_with(|| "/".to_string())
            .clone();
        f.nvidia_dev_root.get_or_insert(driver_root);
        f.mps_root
            .get_or_insert_with(|| DEFAULT_MPS_ROOT.to_string());
        f.gds_enabled.get_or_insert(false);
        f.mofed_enabled.get_or_insert(false);
        f.gdrcopy_enabled.get_or_insert(false);
        f.device_discovery_strategy.get_or_insert_default();
        let p = &mut f.plugin;
        p.pass_device_specs.get_or_insert(false);
        p.device_list_strategy
            .get_or_insert_with(|| DeviceListStrategies(vec![DeviceListStrategy::Envvar]));
        p.device_id_strategy.get_or_insert_default();
        p.cdi_annotation_prefix
            .get_or_insert_with(|| DEFAULT_CDI_ANNOTATION_PREFIX.to_string());
        p.nvidia_ctk_path
            .get_or_insert_with(|| "/usr/bin/nvidia-ctk".to_string());
        p.container_driver_root
            .get_or_insert_with(|| "/driver-root".to_string());
        p.shared_devices_allocation_policy.get_or_insert_default();
        if let Some(mps) = &mut cfg.sharing.mps {
            mps.fail_requests_greater_than_one = true;
        }
        cfg.validate("config")?;
        Ok(cfg)
    }
}

/// Values set by env vars or CLI flags (`None` = not set). Same names as NVIDIA's plugin.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Overrides {
    pub mig_strategy: Option<MigStrategy>,
    pub fail_on_init_error: Option<bool>,
    pub nvidia_driver_root: Option<String>,
    pub nvidia_dev_root: Option<String>,
    pub pass_device_specs: Option<bool>,
    pub device_list_strategy: Option<DeviceListStrategies>,
    pub device_id_strategy: Option<DeviceIdStrategy>,
    pub cdi_annotation_prefix: Option<String>,
    pub nvidia_ctk_path: Option<String>,
    pub container_driver_root: Option<String>,
    pub mps_root: Option<String>,
    pub shared_devices_allocation_policy: Option<AllocationPolicy>,
    pub gds_enabled: Option<bool>,
    pub mofed_enabled: Option<bool>,
    pub gdrcopy_enabled: Option<bool>,
    pub device_discovery_strategy: Option<DeviceDiscoveryStrategy>,
    /// `DEVICE_SPLIT_COUNT` (from HAMi; the seed's DaemonSet sets it): time-slicing replicas of
    /// `nvidia.com/gpu`; 1 = no sharing.
    pub device_split_count: Option<u32>,
}

/// Go's `strconv.ParseBool`, which NVIDIA's CLI uses for env vars.
pub fn parse_go_bool(s: &str) -> Result<bool, ResourcesError> {
    match s {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Ok(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Ok(false),
        _ => Err(ResourcesError::NotBoolean(s.to_string())),
    }
}

fn parse_enum<T: for<'de> Deserialize<'de>>(
    s: &str,
    expected: &'static str,
) -> Result<T, ResourcesError> {
    serde_json::from_value(serde_json::Value::String(s.to_string())).map_err(|_| {
        ResourcesError::NotOneOf {
            given: s.to_string(),
            expected,
        }
    })
}

impl Overrides {
    /// The env var names read by [`Overrides::from_env`].
    pub const ENV_VARS: &[&str] = &[
        "MIG_STRATEGY",
        "FAIL_ON_INIT_ERROR",
        "NVIDIA_DRIVER_ROOT",
        "NVIDIA_DEV_ROOT",
        "PASS_DEVICE_SPECS",
        "DEVICE_LIST_STRATEGY",
        "DEVICE_ID_STRATEGY",
        "CDI_ANNOTATION_PREFIX",
        "NVIDIA_CTK_PATH",
        "CONTAINER_DRIVER_ROOT",
        "MPS_ROOT",
        "SHARED_DEVICES_ALLOCATION_POLICY",
        "GDS_ENABLED",
        "MOFED_ENABLED",
        "GDRCOPY_ENABLED",
        "DEVICE_DISCOVERY_STRATEGY",
        "DEVICE_SPLIT_COUNT",
    ];

    /// Reads NVIDIA's env vars (plus `DEVICE_SPLIT_COUNT`) from `vars`; others are ignored, and an
    /// empty value counts as unset (as with NVIDIA's CLI library).
    pub fn from_env<I, K, V>(vars: I) -> Result<Overrides, ResourcesError>
    where
        I: IntoIterator<Item = (K, V)>,
        K: AsRef<str>,
        V: AsRef<str>,
    {
        let mut o = Overrides::default();
        for (k, v) in vars {
            let (k, v) = (k.as_ref(), v.as_ref().trim());
            if v.is_empty() {
                continue;
            }
            o.set(k, v).map_err(|p| ResourcesError::Config {
                origin: "env".into(),
                line: None,
                column: None,
                problem: format!("{k}={v}: {p}"),
            })?;
        }
        Ok(o)
    }

    /// [`Overrides::from_env`] over a map.
    pub fn from_env_map(vars: &HashMap<String, String>) -> Result<Overrides, ResourcesError> {
        Self::from_env(vars.iter())
    }

    /// The device plugin's flags (`--mig-strategy`, ...), each given as its env var's name and
    /// the value when the flag was given; an error names the flag.
    pub fn from_flags<'a>(
        flags: impl IntoIterator<Item = (&'a str, Option<&'a str>)>,
    ) -> Result<Overrides, ResourcesError> {
        let mut o = Overrides::default();
        for (var, value) in flags {
            if let Some(v) = value {
                o.set(var, v).map_err(|e| ResourcesError::Flag {
                    flag: var.to_lowercase().replace('_', "-"),
                    value: v.to_string(),
                    source: Box::new(e),
                })?;
            }
        }
        Ok(o)
    }

    /// Sets one value by its env var name; unknown names are ignored.
    pub fn set(&mut self, var: &str, v: &str) -> Result<(), ResourcesError> {
        match var {
            "MIG_STRATEGY" => {
                self.mig_strategy = Some(parse_enum(v, "none, single, mixed")?);
            }
            "FAIL_ON_INIT_ERROR" => self.fail_on_init_error = Some(parse_go_bool(v)?),
            "NVIDIA_DRIVER_ROOT" => self.nvidia_driver_root = Some(v.to_string()),
            "NVIDIA_DEV_ROOT" => self.nvidia_dev_root = Some(v.to_string()),
            "PASS_DEVICE_SPECS" => self.pass_device_specs = Some(parse_go_bool(v)?),
            "DEVICE_LIST_STRATEGY" => {
                self.device_list_strategy = Some(DeviceListStrategies::parse_list(v)?);
            }
            "DEVICE_ID_STRATEGY" => {
                self.device_id_strategy = Some(parse_enum(v, "uuid, index")?);
            }
            "CDI_ANNOTATION_PREFIX" => self.cdi_annotation_prefix = Some(v.to_string()),
            "NVIDIA_CTK_PATH" => self.nvidia_ctk_path = Some(v.to_string()),
            "CONTAINER_DRIVER_ROOT" => self.container_driver_root = Some(v.to_string()),
            "MPS_ROOT" => self.mps_root = Some(v.to_string()),
            "SHARED_DEVICES_ALLOCATION_POLICY" => {
                self.shared_devices_allocation_policy =
                    Some(parse_enum(v, "distributed, packed, fragmentation-aware")?);
            }
            "GDS_ENABLED" => self.gds_enabled = Some(parse_go_bool(v)?),
            "MOFED_ENABLED" => self.mofed_enabled = Some(parse_go_bool(v)?),
            "GDRCOPY_ENABLED" => self.gdrcopy_enabled = Some(parse_go_bool(v)?),
            "DEVICE_DISCOVERY_STRATEGY" => {
                self.device_discovery_strategy = Some(parse_enum(v, "auto, nvml, tegra")?);
            }
            "DEVICE_SPLIT_COUNT" => {
                // Digits too many for a u32 are a count over the limit, not "not a number".
                let n: u32 = match v.parse::<u128>() {
                    Ok(n) => u32::try_from(n).unwrap_or(u32::MAX),
                    Err(_) => return Err(ResourcesError::NotWholeNumber(v.to_string())),
                };
                if n == 0 {
                    return Err(ResourcesError::SplitCountZero);
                }
                if i64::from(n) > MAX_TIME_SLICING_REPLICAS {
                    return Err(ResourcesError::SplitCountTooLarge {
                        given: v.to_string(),
                        max: MAX_TIME_SLICING_REPLICAS,
                    });
                }
                self.device_split_count = Some(n);
            }
            _ => {}
        }
        Ok(())
    }

    fn apply(&self, cfg: &mut Config) {
        fn put<T: Clone>(dst: &mut Option<T>, src: &Option<T>) {
            if let Some(v) = src {
                *dst = Some(v.clone());
            }
        }
        let f = &mut cfg.flags;
        put(&mut f.mig_strategy, &self.mig_strategy);
        put(&mut f.fail_on_init_error, &self.fail_on_init_error);
        put(&mut f.nvidia_driver_root, &self.nvidia_driver_root);
        put(&mut f.nvidia_dev_root, &self.nvidia_dev_root);
        put(&mut f.mps_root, &self.mps_root);
        put(&mut f.gds_enabled, &self.gds_enabled);
        put(&mut f.mofed_enabled, &self.mofed_enabled);
        put(&mut f.gdrcopy_enabled, &self.gdrcopy_enabled);
        put(
            &mut f.device_discovery_strategy,
            &self.device_discovery_strategy,
        );
        let p = &mut f.plugin;
        put(&mut p.pass_device_specs, &self.pass_device_specs);
        put(&mut p.device_list_strategy, &self.device_list_strategy);
        put(&mut p.device_id_strategy, &self.device_id_strategy);
        put(&mut p.cdi_annotation_prefix, &self.cdi_annotation_prefix);
        put(&mut p.nvidia_ctk_path, &self.nvidia_ctk_path);
        put(&mut p.container_driver_root, &self.container_driver_root);
        put(
            &mut p.shared_devices_allocation_policy,
            &self.shared_devices_allocation_policy,
        );
        if let Some(n) = self.device_split_count
            && n >= 2
        {
            let ts = cfg
                .sharing
                .time_slicing
                .get_or_insert_with(Default::default);
            ts.resources.retain(|r| {
                qualify_resource_name(&r.name.value).ok().as_deref() != Some("nvidia.com/gpu")
            });
            ts.resources.push(ReplicatedResource {
                name: "nvidia.com/gpu".to_string().into(),
                rename: None,
                devices: ReplicatedDevices::All.into(),
                replicas: Some(i64::from(n)).into(),
            });
        }
    }
}

/// What a node runs after looking at its `nvidia.com/device-plugin.config` label.
#[derive(Debug, Clone, PartialEq)]
pub struct Selection {
    /// The chosen config's name; `None` for the empty default config.
    pub name: Option<String>,
    pub config: Config,
}

/// Picks the named config for a node, with NVIDIA's config-manager fallbacks: the label's value,
/// else `default_name` (NVIDIA's `--default-config`), else a config named `default`, else the only
/// config, else an empty config. A label or default naming a config that does not exist is an error.
pub fn select_named(
    configs: &BTreeMap<String, Config>,
    label: Option<&str>,
    default_name: Option<&str>,
) -> Result<Selection, ResourcesError> {
    let wanted = label
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(|l| (l, "node label nvidia.com/device-plugin.config"))
        .or_else(|| {
            default_name
                .filter(|d| !d.is_empty())
                .map(|d| (d, "default config"))
        });
    if let Some((name, source)) = wanted {
        return match configs.get(name) {
            Some(c) => Ok(Selection {
                name: Some(name.to_string()),
                config: c.clone(),
            }),
            None => Err(config_error(
                "config",
                None,
                format!(
                    "{source} names config {name:?}, which does not exist (have: {})",
                    if configs.is_empty() {
                        "none".to_string()
                    } else {
                        configs.keys().cloned().collect::<Vec<_>>().join(", ")
                    }
                ),
            )),
        };
    }
    if let Some(c) = configs.get("default") {
        return Ok(Selection {
            name: Some("default".into()),
            config: c.clone(),
        });
    }
    if configs.len() == 1
        && let Some((name, c)) = configs.iter().next()
    {
        return Ok(Selection {
            name: Some(name.clone()),
            config: c.clone(),
        });
    }
    Ok(Selection {
        name: None,
        config: Config::default(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const FULL_YAML: &str = r#"version: v1
flags:
  migStrategy: mixed
  failOnInitError: false
  nvidiaDriverRoot: /run/nvidia/driver
  mpsRoot: /run/nvidia/mps
  gdsEnabled: true
  mofedEnabled: false
  deviceDiscoveryStrategy: nvml
  plugin:
    passDeviceSpecs: true
    deviceListStrategy: [envvar, cdi-annotations]
    deviceIDStrategy: index
    cdiAnnotationPrefix: cdi.example.com/
    nvidiaCTKPath: /usr/local/bin/nvidia-ctk
    containerDriverRoot: /driver-root
    sharedDevicesAllocationPolicy: packed
  gfd:
    oneshot: false
    noTimestamp: true
    sleepInterval: 60s
    outputFile: /etc/kubernetes/node-feature-discovery/features.d/gfd
    machineTypeFile: /sys/class/dmi/id/product_name
sharing:
  timeSlicing:
    renameByDefault: true
    failRequestsGreaterThanOne: true
    resources:
      - name: nvidia.com/gpu
        replicas: 4
      - name: mig-1g.10gb
        rename: small
        devices: ["0:1", 2, GPU-00000003-1111-2222-3333-444444444444]
        replicas: 2
      - name: nvidia.com/mig-2g.20gb
        devices: 2
        replicas: 3
"#;

    const FULL_JSON: &str = r#"{
  "version": "v1",
  "flags": {
    "migStrategy": "mixed", "failOnInitError": false, "nvidiaDriverRoot": "/run/nvidia/driver",
    "mpsRoot": "/run/nvidia/mps", "gdsEnabled": true, "mofedEnabled": false,
    "deviceDiscoveryStrategy": "nvml",
    "plugin": {
      "passDeviceSpecs": true, "deviceListStrategy": ["envvar", "cdi-annotations"],
      "deviceIDStrategy": "index", "cdiAnnotationPrefix": "cdi.example.com/",
      "nvidiaCTKPath": "/usr/local/bin/nvidia-ctk", "containerDriverRoot": "/driver-root",
      "sharedDevicesAllocationPolicy": "packed"
    },
    "gfd": {"oneshot": false, "noTimestamp": true, "sleepInterval": "60s",
            "outputFile": "/etc/kubernetes/node-feature-discovery/features.d/gfd",
            "machineTypeFile": "/sys/class/dmi/id/product_name"}
  },
  "sharing": {"timeSlicing": {"renameByDefault": true, "failRequestsGreaterThanOne": true,
    "resources": [
      {"name": "nvidia.com/gpu", "replicas": 4},
      {"name": "mig-1g.10gb", "rename": "small",
       "devices": ["0:1", 2, "GPU-00000003-1111-2222-3333-444444444444"], "replicas": 2},
      {"name": "nvidia.com/mig-2g.20gb", "devices": 2, "replicas": 3}
    ]}}
}"#;

    #[test]
    fn flags_are_named_in_their_errors() {
        let o =
            Overrides::from_flags([("MIG_STRATEGY", Some("mixed")), ("MPS_ROOT", None)]).unwrap();
        assert_eq!(o.mig_strategy, Some(MigStrategy::Mixed));
        let e = Overrides::from_flags([("DEVICE_ID_STRATEGY", Some("serial"))])
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("--device-id-strategy \"serial\": "), "{e}");
    }

    #[test]
    fn parses_every_field_from_yaml_and_json_alike() {
        let y = Config::parse(FULL_YAML, "c.yaml").unwrap();
        let j = Config::parse(FULL_JSON, "c.json").unwrap();
        assert_eq!(y, j);
        assert_eq!(y.mig_strategy(), MigStrategy::Mixed);
        assert!(!y.fail_on_init_error());
        assert_eq!(y.nvidia_dev_root(), "/run/nvidia/driver");
        assert_eq!(
            y.device_list_strategies().0,
            vec![
                DeviceListStrategy::Envvar,
                DeviceListStrategy::CdiAnnotations
            ]
        );
        assert_eq!(y.device_id_strategy(), DeviceIdStrategy::Index);
        assert_eq!(y.cdi_annotation_prefix(), "cdi.example.com/");
        assert_eq!(
            y.shared_devices_allocation_policy(),
            AllocationPolicy::Packed
        );
        assert_eq!(y.flags.gfd.sleep_interval.as_deref(), Some("60s"));
        assert_eq!(
            y.flags.device_discovery_strategy,
            Some(DeviceDiscoveryStrategy::Nvml)
        );
        let ts = y.sharing.time_slicing.as_ref().unwrap();
        assert!(ts.rename_by_default && ts.fail_requests_greater_than_one);
        assert_eq!(ts.resources[0].devices.value, ReplicatedDevices::All);
        assert_eq!(ts.resources[0].replicas.value, Some(4));
        assert_eq!(
            ts.resources[1].devices.value,
            ReplicatedDevices::List(vec![
                DeviceRef::MigIndex(0, 1),
                DeviceRef::GpuIndex(2),
                DeviceRef::Uuid("GPU-00000003-1111-2222-3333-444444444444".into()),
            ])
        );
        assert_eq!(ts.resources[2].devices.value, ReplicatedDevices::Count(2));
        assert_eq!(y.sharing_strategy(), SharingStrategy::TimeSlicing);
        assert!(y.unknown_fields.is_empty(), "{:?}", y.unknown_fields);
        // Serialises back to something that parses to the same config.
        let again = Config::parse(&serde_json::to_string(&y).unwrap(), "x").unwrap();
        assert_eq!(again, y);
    }

    #[test]
    fn empty_files_are_errors_naming_the_file_and_versionless_files_are_v1() {
        for empty in ["", "  \n", "# only a comment\n", "---\n", "~\n"] {
            let e = Config::parse(empty, "/etc/nvidia/config.yaml").unwrap_err();
            assert_eq!(
                e.to_string(),
                "/etc/nvidia/config.yaml: the file is empty: expected a device plugin config (version: v1, flags: ..., sharing: ...)",
                "{empty:?}"
            );
        }
        let c = Config::parse("flags:\n  migStrategy: single\n", "f").unwrap();
        assert_eq!(c.mig_strategy(), MigStrategy::Single);
        assert!(Config::parse("version: \"\"\n", "f").is_ok());
    }

    #[test]
    fn single_string_device_list_strategy() {
        let c = Config::parse(
            "flags:\n  plugin:\n    deviceListStrategy: volume-mounts\n",
            "f",
        )
        .unwrap();
        assert_eq!(
            c.device_list_strategies().0,
            vec![DeviceListStrategy::VolumeMounts]
        );
    }

    #[test]
    fn unknown_fields_are_listed_not_fatal() {
        let c = Config::parse(
            "flags:\n  plugin:\n    fooBar: 1\n  migStrategy: none\nextra: 2\nimex:\n  channelIDs: [0]\n",
            "f",
        )
        .unwrap();
        assert_eq!(c.unknown_fields, vec!["flags.plugin.fooBar", "extra"]);
        assert!(c.imex.is_some());
    }

    #[test]
    fn unknown_keys_are_warned_once_per_file_and_counted() {
        let mut report = UnknownKeyReport::default();
        let typo = Config::parse("flags:\n  migStratagy: mixed\n", "a.yaml").unwrap();
        let w = report.record("a.yaml", &typo);
        assert_eq!(w.len(), 1);
        assert!(
            w[0].starts_with("a.yaml:2:3: unknown key flags.migStratagy"),
            "{w:?}"
        );
        // Read again (a reload, another GPU pass): counted, not warned again.
        assert!(report.record("a.yaml", &typo).is_empty());
        // The same key in another file is that file's warning.
        assert_eq!(report.record("b.yaml", &typo).len(), 1);
        assert_eq!(report.counts().get("a.yaml"), Some(&1));
        // Fixed: the count drops to zero.
        let fixed = Config::parse("flags:\n  migStrategy: mixed\n", "a.yaml").unwrap();
        assert!(report.record("a.yaml", &fixed).is_empty());
        assert_eq!(report.counts().get("a.yaml"), Some(&0));
    }

    #[test]
    fn unknown_keys_carry_their_position_and_a_did_you_mean() {
        let text = "version: v1\nflags:\n  migStratagy: mixed\n  plugin:\n    deviceListStrategy: envvar\n    passDeviceSpec: true\nbogusTop: 1\nsharing:\n  timeSlicing:\n    resources:\n      - name: nvidia.com/gpu\n        replicas: 2\n        nmae: x\n";
        let c = Config::parse(text, "cfg.yaml").unwrap();
        // Accepted: the misspelt key is ignored (migStrategy keeps its default), as NVIDIA does.
        assert_eq!(c.mig_strategy(), MigStrategy::None);
        let warnings: Vec<String> = c
            .unknown_keys
            .iter()
            .map(|k| k.warning("cfg.yaml"))
            .collect();
        assert_eq!(
            warnings,
            [
                "cfg.yaml:3:3: unknown key flags.migStratagy (did you mean flags.migStrategy?); ignored, as NVIDIA's device plugin ignores it",
                "cfg.yaml:6:5: unknown key flags.plugin.passDeviceSpec (did you mean flags.plugin.passDeviceSpecs?); ignored, as NVIDIA's device plugin ignores it",
                "cfg.yaml:7:1: unknown key bogusTop; ignored, as NVIDIA's device plugin ignores it",
                "cfg.yaml:13:9: unknown key sharing.timeSlicing.resources[].nmae (did you mean sharing.timeSlicing.resources[].name?); ignored, as NVIDIA's device plugin ignores it",
            ]
        );
        // JSON files have positions too.
        let c = Config::parse("{\"flags\": {\"migstrategy\": \"single\"}}", "c.json").unwrap();
        assert_eq!(c.unknown_keys.len(), 1);
        assert_eq!(c.unknown_keys[0].did_you_mean, Some("migStrategy"));
        assert!(c.unknown_keys[0].at.is_some());
    }

    #[test]
    fn bad_files_say_where_and_what() {
        let ts = |body: &str| format!("sharing:\n  timeSlicing:\n    resources:\n{body}");
        let cases: Vec<(String, &str, &str)> = vec![
            ("version: v2\n".into(), "t.yaml:1:10", "unknown version \"v2\""),
            (
                "flags:\n  migStrategy: foo\n".into(),
                "t.yaml:2:16",
                "unknown variant `foo`",
            ),
            (
                "flags:\n  failOnInitError: maybe\n".into(),
                "t.yaml:2:",
                "",
            ),
            (
                "flags:\n  plugin:\n    deviceListStrategy: bogus\n".into(),
                "t.yaml:3:",
                "unknown device list strategy \"bogus\"",
            ),
            (
                "flags:\n  plugin:\n    deviceListStrategy: [envvar, cdi]\n".into(),
                "t.yaml:3:",
                "unknown device list strategy \"cdi\"",
            ),
            (
                "flags:\n  plugin:\n    deviceIDStrategy: serial\n".into(),
                "t.yaml:3:",
                "unknown variant `serial`",
            ),
            ("flags: [\n".into(), "t.yaml:1:", ""),
            (
                ts("      - name: nvidia.com/gpu\n        replicas: 1\n"),
                "t.yaml:5:19",
                "replicas must be >= 2 (got 1)",
            ),
            (
                ts("      - name: nvidia.com/gpu\n"),
                "t.yaml:4:15",
                "nvidia.com/gpu: replicas is required",
            ),
            (
                ts("      - name: gpu!\n        replicas: 2\n"),
                "t.yaml:4:15",
                "contains '!'",
            ),
            (
                ts("      - name: example.com/gpu\n        replicas: 2\n"),
                "t.yaml:4:15",
                "nvidia.com/ domain",
            ),
            (
                ts("      - name: gpu\n        rename: a/b\n        replicas: 2\n"),
                "t.yaml:5:17",
                "rename",
            ),
            (
                ts("      - name: gpu\n        devices: some\n        replicas: 2\n"),
                "t.yaml:5:18",
                "expected \"all\", a count or a list",
            ),
            (
                ts("      - name: gpu\n        devices: [0, foo]\n        replicas: 2\n"),
                "t.yaml:5:",
                "\"foo\" is not a GPU index",
            ),
            (
                ts("      - name: gpu\n        devices: 0\n        replicas: 2\n"),
                "t.yaml:5:",
                "must be at least 1",
            ),
            (
                ts("      - name: gpu\n        devices: []\n        replicas: 2\n"),
                "t.yaml:5:",
                "empty list",
            ),
            (
                "sharing:\n  timeSlicing:\n    renameByDefault: true\n".into(),
                "t.yaml",
                "sharing.timeSlicing: no resources specified",
            ),
            (
                "sharing:\n  timeSlicing:\n    resources: [{name: gpu, replicas: 2}]\n  mps:\n    resources: [{name: gpu, replicas: 2}]\n".into(),
                "t.yaml:5:",
                "exclusive",
            ),
            (
                "flags:\n  migStrategy: mixed\nsharing:\n  mps:\n    resources: [{name: gpu, replicas: 2}]\n".into(),
                "t.yaml:5:",
                "not supported with the mixed MIG strategy",
            ),
        ];
        for (text, place, problem) in cases {
            let err = Config::parse(&text, "t.yaml").unwrap_err().to_string();
            assert!(
                err.starts_with(place) && err.contains(problem),
                "{text:?}: got {err:?}, want {place:?} .. {problem:?}"
            );
        }
    }

    #[test]
    fn counts_that_size_memory_are_bounded_and_named_with_their_limit() {
        let ts = |body: &str| format!("sharing:\n  timeSlicing:\n    resources:\n{body}");
        let mps = |body: &str| format!("sharing:\n  mps:\n    resources:\n{body}");
        let over = "sharing.timeSlicing: nvidia.com/gpu: replicas";
        let cases: Vec<(String, &str, String)> = vec![
            (
                ts("      - name: gpu\n        replicas: 1000000000\n"),
                "t.yaml:5:19",
                format!("{over} 1000000000 is more than 1024, the limit per device (more than a node's pods could ever use); accepted: 2 to 1024"),
            ),
            (
                ts("      - name: gpu\n        replicas: 99999999999999999999999\n"),
                "t.yaml:5:19",
                format!("{over} 99999999999999999999999 is more than 1024"),
            ),
            (
                ts("      - {name: gpu, replicas: 18446744073709551616}\n"),
                "t.yaml:4:",
                format!("{over} 18446744073709551616 is more than 1024"),
            ),
            (
                mps("      - name: gpu\n        replicas: 49\n"),
                "t.yaml:5:19",
                "sharing.mps: nvidia.com/gpu: replicas 49 is more than 48, the limit per device (the MPS control daemon serves at most 48 clients per GPU); accepted: 2 to 48".into(),
            ),
            (
                ts("      - name: gpu\n        devices: 99999999999\n        replicas: 2\n"),
                "t.yaml:5:18",
                "devices count 99999999999 is more than 1024, the limit".into(),
            ),
            (
                ts("      - name: gpu\n        devices: 1025\n        replicas: 2\n"),
                "t.yaml:5:18",
                "accepted: 1 to 1024, \"all\" or a list".into(),
            ),
        ];
        for (text, place, problem) in cases {
            let err = Config::parse(&text, "t.yaml").unwrap_err().to_string();
            assert!(
                err.starts_with(place) && err.contains(&problem),
                "{text:?}: got {err:?}, want {place:?} .. {problem:?}"
            );
        }
        // The limits themselves are accepted.
        for text in [
            ts("      - name: gpu\n        replicas: 1024\n        devices: 1024\n"),
            mps("      - name: gpu\n        replicas: 48\n"),
        ] {
            Config::parse(&text, "t.yaml").unwrap();
        }
        let e = Overrides::from_env([("DEVICE_SPLIT_COUNT", "1000000000")])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("1000000000 is more than 1024, the most time-slicing replicas per GPU"),
            "{e}"
        );
        let e = Overrides::from_env([("DEVICE_SPLIT_COUNT", "99999999999999999999")])
            .unwrap_err()
            .to_string();
        assert!(e.contains("is more than 1024"), "{e}");
        assert_eq!(
            env(&[("DEVICE_SPLIT_COUNT", "1024")]).device_split_count,
            Some(1024)
        );
    }

    #[test]
    fn parse_errors_name_the_key_the_value_and_what_is_accepted() {
        let ts = |body: &str| format!("sharing:\n  timeSlicing:\n    resources:\n{body}");
        let cases: Vec<(String, &str, &str)> = vec![
            (
                ts("      - name: gpu\n        replicas: abc\n"),
                "t.yaml:5:19: ",
                "sharing.timeSlicing: nvidia.com/gpu: replicas \"abc\" is not a whole number; accepted: 2 to 1024",
            ),
            (
                ts("      - name: gpu\n        replica: 4\n"),
                "t.yaml:5:9: ",
                "sharing.timeSlicing: nvidia.com/gpu: unknown key `replica` at line 5 (did you mean `replicas`?); replicas is required (2 to 1024)",
            ),
            (
                ts("      - name: a\n        replicas: 2\n      - replica: 4\n        name: b\n"),
                "t.yaml:6:9: ",
                "nvidia.com/b: unknown key `replica` at line 6 (did you mean `replicas`?)",
            ),
            (
                "flags:\n  failOnInitError: maybe\n".into(),
                "t.yaml:2:20: ",
                "`flags.failOnInitError`: \"maybe\" is not valid: expected true or false",
            ),
        ];
        for (text, place, problem) in cases {
            let err = Config::parse(&text, "t.yaml").unwrap_err().to_string();
            assert!(
                err.starts_with(place) && err.contains(problem),
                "{text:?}: got {err:?}, want {place:?} .. {problem:?}"
            );
            assert!(!err.contains("invalid i64"), "{err}");
        }
        // A typo of another key than replicas still names replicas as the missing one.
        let err = Config::parse(&ts("      - name: gpu\n        devics: 2\n"), "t.yaml")
            .unwrap_err()
            .to_string();
        assert!(err.contains("replicas is required"), "{err}");
    }

    #[test]
    fn files_that_are_not_utf8_text_or_too_large_say_so_once() {
        let mut utf16 = vec![0xFF, 0xFE];
        for u in "version: v1\n".encode_utf16() {
            utf16.extend(u.to_le_bytes());
        }
        let e = Config::read(&utf16[..], "c.yaml").unwrap_err().to_string();
        assert!(
            e.starts_with("c.yaml: the file is UTF-16 (little-endian) text (it starts with a byte order mark), not UTF-8"),
            "{e}"
        );
        let e = Config::read(&b"version: v1\nflags: \xFF\x00\x01\n"[..], "c.yaml")
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("c.yaml:2:8: the file is not UTF-8 text: byte 0xFF"),
            "{e}"
        );
        assert_eq!(e.matches("UTF-8 text").count(), 1, "{e}");
        // 50 MB of valid YAML: a size limit, named with the limit.
        let big = format!("version: v1\n{}", "# padding\n".repeat(5_000_000));
        let e = Config::read(big.as_bytes(), "c.yaml")
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "c.yaml: the file is larger than 4 MiB (4194304 bytes), the size limit for a device plugin config"
        );
        assert!(Config::read(&b"version: v1\n"[..], "c.yaml").is_ok());
    }

    fn env(pairs: &[(&str, &str)]) -> Overrides {
        Overrides::from_env(pairs.iter().copied()).unwrap()
    }

    #[test]
    fn the_seeds_daemonset_env_gives_plain_gpus() {
        let vars: HashMap<String, String> = [
            ("FAIL_ON_INIT_ERROR", "false"),
            ("DEVICE_SPLIT_COUNT", "1"),
            ("DEVICE_LIST_STRATEGY", "envvar"),
            ("PATH", "/usr/bin"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let e = Overrides::from_env_map(&vars).unwrap();
        let c = Config::effective(None, &e, &Overrides::default()).unwrap();
        assert!(!c.fail_on_init_error());
        assert_eq!(c.sharing_strategy(), SharingStrategy::None);
        assert!(c.sharing.time_slicing.is_none());
        assert_eq!(
            c.device_list_strategies().0,
            vec![DeviceListStrategy::Envvar]
        );
        assert_eq!(c.mig_strategy(), MigStrategy::None);
    }

    #[test]
    fn effective_fills_every_default() {
        let c = Config::effective(None, &Overrides::default(), &Overrides::default()).unwrap();
        let f = &c.flags;
        assert_eq!(f.mig_strategy, Some(MigStrategy::None));
        assert_eq!(f.fail_on_init_error, Some(true));
        assert_eq!(f.nvidia_driver_root.as_deref(), Some("/"));
        assert_eq!(f.nvidia_dev_root.as_deref(), Some("/"));
        assert_eq!(f.mps_root.as_deref(), Some(DEFAULT_MPS_ROOT));
        assert_eq!(f.plugin.pass_device_specs, Some(false));
        assert_eq!(f.plugin.device_id_strategy, Some(DeviceIdStrategy::Uuid));
        assert_eq!(
            f.plugin.cdi_annotation_prefix.as_deref(),
            Some("cdi.k8s.io/")
        );
        assert_eq!(
            f.plugin.shared_devices_allocation_policy,
            Some(AllocationPolicy::Distributed)
        );
        // The dev root follows a driver root set anywhere.
        let e = env(&[("NVIDIA_DRIVER_ROOT", "/run/nvidia/driver")]);
        let c = Config::effective(None, &e, &Overrides::default()).unwrap();
        assert_eq!(c.nvidia_dev_root(), "/run/nvidia/driver");
    }

    #[test]
    fn precedence_is_flag_then_env_then_file_then_default() {
        let file = || Some(Config::parse("flags:\n  migStrategy: single\n", "f").unwrap());
        let e = env(&[("MIG_STRATEGY", "mixed")]);
        let fl = Overrides {
            mig_strategy: Some(MigStrategy::None),
            ..Overrides::default()
        };
        let none = Overrides::default();
        let cases = [
            (file(), &e, &fl, MigStrategy::None),
            (file(), &e, &none, MigStrategy::Mixed),
            (file(), &none, &none, MigStrategy::Single),
            (None, &none, &none, MigStrategy::None),
            (None, &none, &fl, MigStrategy::None),
        ];
        for (i, (f, e, fl, want)) in cases.into_iter().enumerate() {
            let c = Config::effective(f, e, fl).unwrap();
            assert_eq!(c.mig_strategy(), want, "case {i}");
        }
    }

    #[test]
    fn env_vars_parse_like_nvidias_cli() {
        let o = env(&[
            ("PASS_DEVICE_SPECS", "True"),
            ("DEVICE_LIST_STRATEGY", "envvar, volume-mounts"),
            ("DEVICE_ID_STRATEGY", "index"),
            ("CDI_ANNOTATION_PREFIX", "x.io/"),
            ("MPS_ROOT", "/mps"),
            ("SHARED_DEVICES_ALLOCATION_POLICY", "packed"),
            ("GDS_ENABLED", "1"),
            ("MIG_STRATEGY", ""),
        ]);
        assert_eq!(o.pass_device_specs, Some(true));
        assert_eq!(
            o.device_list_strategy.unwrap().0,
            vec![DeviceListStrategy::Envvar, DeviceListStrategy::VolumeMounts]
        );
        assert_eq!(o.device_id_strategy, Some(DeviceIdStrategy::Index));
        assert_eq!(o.cdi_annotation_prefix.as_deref(), Some("x.io/"));
        assert_eq!(o.mps_root.as_deref(), Some("/mps"));
        assert_eq!(
            o.shared_devices_allocation_policy,
            Some(AllocationPolicy::Packed)
        );
        assert_eq!(o.gds_enabled, Some(true));
        assert_eq!(o.mig_strategy, None, "empty counts as unset");

        for (k, v, want) in [
            (
                "MIG_STRATEGY",
                "foo",
                "env: MIG_STRATEGY=foo: \"foo\": expected one of none, single, mixed",
            ),
            (
                "FAIL_ON_INIT_ERROR",
                "maybe",
                "FAIL_ON_INIT_ERROR=maybe: \"maybe\" is not a boolean",
            ),
            (
                "DEVICE_LIST_STRATEGY",
                "envvar,nope",
                "unknown device list strategy",
            ),
            ("DEVICE_SPLIT_COUNT", "0", "must be at least 1"),
            ("DEVICE_SPLIT_COUNT", "two", "not a whole number"),
            (
                "DEVICE_ID_STRATEGY",
                "serial",
                "expected one of uuid, index",
            ),
        ] {
            let err = Overrides::from_env([(k, v)]).unwrap_err().to_string();
            assert!(err.contains(want), "{k}={v}: {err}");
        }
    }

    #[test]
    fn device_split_count_is_time_slicing_of_nvidia_gpu() {
        let none = Overrides::default();
        let c = Config::effective(None, &env(&[("DEVICE_SPLIT_COUNT", "4")]), &none).unwrap();
        let ts = c.sharing.time_slicing.as_ref().unwrap();
        assert_eq!(ts.resources.len(), 1);
        assert_eq!(ts.resources[0].name.value, "nvidia.com/gpu");
        assert_eq!(ts.resources[0].replicas.value, Some(4));
        assert!(!ts.rename_by_default);

        // Replaces the file's entry for nvidia.com/gpu, keeps the others.
        let file = Config::parse(
            "sharing:\n  timeSlicing:\n    resources:\n      - {name: gpu, replicas: 2}\n      - {name: mig-1g.10gb, replicas: 2}\n",
            "f",
        )
        .unwrap();
        let c = Config::effective(
            Some(file.clone()),
            &env(&[("DEVICE_SPLIT_COUNT", "8")]),
            &none,
        )
        .unwrap();
        let ts = c.sharing.time_slicing.as_ref().unwrap();
        let reps: Vec<_> = ts
            .resources
            .iter()
            .map(|r| (r.name.value.as_str(), r.replicas.value))
            .collect();
        assert_eq!(
            reps,
            vec![("mig-1g.10gb", Some(2)), ("nvidia.com/gpu", Some(8))]
        );
        // 1 leaves the file's sharing alone.
        let c = Config::effective(Some(file), &env(&[("DEVICE_SPLIT_COUNT", "1")]), &none).unwrap();
        assert_eq!(c.sharing.time_slicing.unwrap().resources.len(), 2);
        // And cannot be combined with MPS.
        let mps = Config::parse(
            "sharing:\n  mps:\n    resources: [{name: gpu, replicas: 2}]\n",
            "f",
        )
        .unwrap();
        let err = Config::effective(Some(mps), &env(&[("DEVICE_SPLIT_COUNT", "2")]), &none)
            .unwrap_err()
            .to_string();
        assert!(err.contains("exclusive"), "{err}");
    }

    #[test]
    fn mps_forces_fail_requests_greater_than_one_and_checks_env_mig_strategy() {
        let none = Overrides::default();
        let mps = || {
            Config::parse(
                "sharing:\n  mps:\n    failRequestsGreaterThanOne: false\n    resources: [{name: gpu, replicas: 2}]\n",
                "f",
            )
            .unwrap()
        };
        let c = Config::effective(Some(mps()), &none, &none).unwrap();
        assert!(c.sharing.mps.unwrap().fail_requests_greater_than_one);
        assert_eq!(
            Config::effective(Some(mps()), &none, &none)
                .unwrap()
                .sharing_strategy(),
            SharingStrategy::Mps
        );
        let err = Config::effective(Some(mps()), &env(&[("MIG_STRATEGY", "mixed")]), &none)
            .unwrap_err()
            .to_string();
        assert!(err.contains("mixed MIG strategy"), "{err}");
    }

    #[test]
    fn named_config_selection_follows_nvidias_fallbacks() {
        let named = |names: &[&str]| -> BTreeMap<String, Config> {
            names
                .iter()
                .map(|n| {
                    let mut c = Config::default();
                    c.flags.nvidia_driver_root = Some(format!("/{n}"));
                    (n.to_string(), c)
                })
                .collect()
        };
        type Case<'a> = (
            &'a [&'a str],
            Option<&'a str>,
            Option<&'a str>,
            Result<Option<&'a str>, &'a str>,
        );
        let cases: [Case; 9] = [
            (&["a", "b", "default"], Some("a"), None, Ok(Some("a"))),
            (&["a", "b", "default"], None, None, Ok(Some("default"))),
            (&["a", "b", "default"], Some(""), None, Ok(Some("default"))),
            (&["a", "b"], None, Some("b"), Ok(Some("b"))),
            (&["a", "b", "default"], None, Some("b"), Ok(Some("b"))),
            (&["only"], None, None, Ok(Some("only"))),
            (&["a", "b"], None, None, Ok(None)),
            (&[], None, None, Ok(None)),
            (
                &["a", "b"],
                Some("c"),
                None,
                Err("names config \"c\", which does not exist (have: a, b)"),
            ),
        ];
        for (names, label, default, want) in cases {
            let got = select_named(&named(names), label, default);
            match (got, want) {
                (Ok(s), Ok(w)) => {
                    assert_eq!(s.name.as_deref(), w, "{names:?} {label:?} {default:?}");
                    match w {
                        Some(n) => assert_eq!(
                            s.config.flags.nvidia_driver_root.as_deref(),
                            Some(format!("/{n}").as_str())
                        ),
                        None => assert_eq!(s.config, Config::default()),
                    }
                }
                (Err(e), Err(w)) => assert!(e.to_string().contains(w), "{e}"),
                (got, want) => panic!("{names:?} {label:?}: got {got:?}, want {want:?}"),
            }
        }
    }

    #[test]
    fn fragmentation_aware_allocation_policy() {
        let c = Config::parse(
            "flags:\n  plugin:\n    sharedDevicesAllocationPolicy: fragmentation-aware\n",
            "f.yaml",
        )
        .unwrap();
        assert_eq!(
            c.shared_devices_allocation_policy(),
            AllocationPolicy::FragmentationAware
        );
        let o = env(&[("SHARED_DEVICES_ALLOCATION_POLICY", "fragmentation-aware")]);
        assert_eq!(
            o.shared_devices_allocation_policy,
            Some(AllocationPolicy::FragmentationAware)
        );
        let e = Overrides::from_env([("SHARED_DEVICES_ALLOCATION_POLICY", "tight")])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("\"tight\": expected one of distributed, packed, fragmentation-aware"),
            "{e}"
        );
        let e = Config::parse(
            "flags:\n  plugin:\n    sharedDevicesAllocationPolicy: tight\n",
            "f.yaml",
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("f.yaml:3:") && e.contains("unknown variant `tight`"),
            "{e}"
        );
        assert!(e.contains("fragmentation-aware"), "{e}");
        // Defaults unchanged.
        assert_eq!(
            Config::default().shared_devices_allocation_policy(),
            AllocationPolicy::Distributed
        );
    }
}
