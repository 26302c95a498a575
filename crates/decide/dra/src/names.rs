//! Names and value formats exactly as NVIDIA's DRA driver (`cmd/gpu-kubelet-plugin`) writes them,
//! so claims, CEL selectors and DeviceClasses written for it match ours unchanged. docs/dra.md has
//! the table of every name and where it comes from.

use crate::DraError;
use gpuops_catalog::Family;

/// The driver name, and the prefix of unqualified attribute names in CEL
/// (`device.attributes['gpu.nvidia.com'].type`).
pub const DRIVER_NAME: &str = "gpu.nvidia.com";
/// Kubernetes' standard attribute for the PCIe root complex (`pci0000:00`).
pub const ATTR_PCIE_ROOT: &str = "resource.kubernetes.io/pcieRoot";
/// Kubernetes' standard attribute for the PCI address (`0000:53:00.0`).
pub const ATTR_PCI_BUS_ID: &str = "resource.kubernetes.io/pciBusID";
/// Kubernetes' standard attribute for the NUMA node (an int).
pub const ATTR_NUMA_NODE: &str = "resource.kubernetes.io/numaNode";

/// `gpu-<minor>`: NVIDIA names whole GPUs by their `/dev/nvidiaN` minor, not the NVML index.
pub fn gpu_device_name(minor: u32) -> String {
    format!("gpu-{minor}")
}

/// `gpu-<minor>-mig-<profile>-<giProfileId>-<placementStart>`, the profile written as
/// [`profile_token`] (`gpu-0-mig-1g10gb-19-0`, `gpu-3-mig-1g10gb-me-20-6`).
pub fn mig_device_name(
    minor: u32,
    profile: &str,
    gi_profile_id: u32,
    placement_start: u32,
) -> String {
    format!(
        "gpu-{minor}-mig-{}-{gi_profile_id}-{placement_start}",
        profile_token(profile)
    )
}

/// A MIG profile as it appears inside a device name: dots dropped, then lower-cased with every
/// character outside `[a-z0-9-]` replaced by `-` and dashes trimmed at both ends (`1g.10gb+me`
/// becomes `1g10gb-me`, `1g.10gb+me.all` becomes `1g10gb-meall`). `+me` and `-me` give the same
/// token; the profile id after it keeps the names apart.
pub fn profile_token(profile: &str) -> String {
    let mapped: String = profile
        .chars()
        .filter(|&c| c != '.')
        .map(|c| {
            let c = c.to_ascii_lowercase();
            if c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' {
                c
            } else {
                '-'
            }
        })
        .collect();
    mapped.trim_matches('-').to_string()
}

/// `gpu-<minor>-counter-set`: the one shared counter set per MIG-capable GPU in dynamic MIG.
pub fn counter_set_name(minor: u32) -> String {
    format!("gpu-{minor}-counter-set")
}

/// The counter of memory slice `i` (`memory-slice-0`); counters may have dashes, capacities not.
pub fn memory_slice_counter(i: u32) -> String {
    format!("memory-slice-{i}")
}

/// The capacity of memory slice `i` on a static MIG device (`memorySlice0`).
pub fn memory_slice_capacity(i: u32) -> String {
    format!("memorySlice{i}")
}

/// A capacity name as a counter name: camelCase to dash-case (`copyEngines` to `copy-engines`).
pub fn counter_name(capacity: &str) -> String {
    let mut out = String::with_capacity(capacity.len() + 4);
    let mut prev_lower_or_digit = false;
    for c in capacity.chars() {
        if c.is_ascii_uppercase() && prev_lower_or_digit {
            out.push('-');
        }
        prev_lower_or_digit = c.is_ascii_lowercase() || c.is_ascii_digit();
        out.push(c.to_ascii_lowercase());
    }
    out
}

/// What a device name of this driver says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeviceName {
    Gpu {
        minor: u32,
    },
    Mig {
        minor: u32,
        /// The [`profile_token`], not the profile (the token loses the dots).
        profile_token: String,
        gi_profile_id: u32,
        placement_start: u32,
    },
}

/// Parses `gpu-<minor>` or `gpu-<minor>-mig-<token>-<giProfileId>-<placementStart>`.
pub fn parse_device_name(name: &str) -> Result<DeviceName, DraError> {
    let bad = || DraError::DeviceName(name.to_string());
    let rest = name.strip_prefix("gpu-").ok_or_else(bad)?;
    let (minor, mig) = match rest.split_once("-mig-") {
        Some((minor, mig)) => (minor, Some(mig)),
        None => (rest, None),
    };
    let minor = number(minor).ok_or_else(bad)?;
    let Some(mig) = mig else {
        return Ok(DeviceName::Gpu { minor });
    };
    let (head, start) = mig.rsplit_once('-').ok_or_else(bad)?;
    let (token, id) = head.rsplit_once('-').ok_or_else(bad)?;
    if token.is_empty() {
        return Err(bad());
    }
    Ok(DeviceName::Mig {
        minor,
        profile_token: token.to_string(),
        gi_profile_id: number(id).ok_or_else(bad)?,
        placement_start: number(start).ok_or_else(bad)?,
    })
}

fn number(s: &str) -> Option<u32> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

/// NVML's PCI bus id as NVIDIA's driver publishes it: lower case, a 4-digit domain
/// (`00000000:53:00.0` becomes `0000:53:00.0`). `None` when the result is not a PCI address
/// (Kubernetes' `pciBusID` attribute accepts only `dddd:bb:dd.f`).
pub fn normalize_pci_bus_id(bus_id: &str) -> Option<String> {
    let id = bus_id.trim().to_ascii_lowercase();
    let id = match id.split_once(':') {
        Some((domain, rest)) if domain.len() == 8 && domain.starts_with("0000") => {
            format!("{}:{rest}", &domain[4..])
        }
        _ => id,
    };
    is_bdf(&id).then_some(id)
}

fn is_bdf(id: &str) -> bool {
    let b = id.as_bytes();
    let hex = |r: std::ops::Range<usize>| {
        b[r].iter()
            .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(c))
    };
    b.len() == 12
        && b[4] == b':'
        && b[7] == b':'
        && b[10] == b'.'
        && hex(0..4)
        && hex(5..7)
        && hex(8..10)
        && hex(11..12)
}

/// The PCIe root of a GPU from where `/sys/bus/pci/devices/<bus id>` links to
/// (`../../../devices/pci0000:00/0000:00:01.0/0000:53:00.0` gives `pci0000:00`), as Kubernetes'
/// `deviceattribute` package resolves it. `None` when the link does not end at the device or does
/// not lead into `devices/pci…`. The agent reads the link; this only interprets it.
pub fn pcie_root_from_sysfs_link(link_target: &str, bus_id: &str) -> Option<String> {
    let parts: Vec<&str> = link_target
        .split('/')
        .filter(|p| !p.is_empty() && *p != "." && *p != "..")
        .collect();
    if parts.last() != Some(&bus_id) {
        return None;
    }
    let devices = parts.iter().position(|p| *p == "devices")?;
    let root = parts.get(devices + 1)?;
    (root.starts_with("pci") && devices + 2 < parts.len()).then(|| root.to_string())
}

/// A version as a DRA version attribute (semantic versioning 2.0.0), the way NVIDIA's driver
/// normalises it: missing minor and patch become 0 and leading zeros go (`580.105.08` becomes
/// `580.105.8`, `9.0` becomes `9.0.0`). `None` when it is not 1-3 dot-separated numbers.
pub fn semver(version: &str) -> Option<String> {
    let v = version.trim().trim_start_matches('v');
    let parts: Vec<&str> = v.split('.').collect();
    if parts.is_empty() || parts.len() > 3 {
        return None;
    }
    let mut nums = [0u64; 3];
    for (slot, part) in nums.iter_mut().zip(&parts) {
        if part.is_empty() || !part.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        *slot = part.parse().ok()?;
    }
    Some(format!("{}.{}.{}", nums[0], nums[1], nums[2]))
}

/// NVML's architecture as go-nvlib names it (`Hopper`, `Ada Lovelace`), from the compute
/// capability; `Unknown` where NVML would say so.
pub fn architecture_name(compute_capability: Option<(u32, u32)>) -> &'static str {
    match compute_capability
        .and_then(|(major, minor)| Family::from_compute_capability(major, minor))
    {
        Some(Family::Volta) => "Volta",
        Some(Family::Turing) => "Turing",
        Some(Family::Ampere) => "Ampere",
        Some(Family::AdaLovelace) => "Ada Lovelace",
        Some(Family::Hopper) => "Hopper",
        Some(Family::Blackwell) => "Blackwell",
        None => "Unknown",
    }
}

/// The brand every data-center GPU reports (`NVML_BRAND_NVIDIA`, which go-nvlib writes as
/// `Nvidia`); the inventory does not carry the brand, so the agent passes another one only when
/// NVML says otherwise.
pub const DEFAULT_BRAND: &str = "Nvidia";
