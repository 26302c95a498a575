//! Pure facts about NVIDIA GPU models: PCI IDs, memory, SMs, MIG geometry, profiles and placements.
//!
//! No I/O. Everything here is `'static` data plus small pure functions over it, so every other
//! crate (the simulator, the MIG planner, the device plugin) reads the same facts.
#![forbid(unsafe_code)]

mod models;
pub mod nvml_enum;
mod profile_name;
pub mod render;
#[cfg(test)]
mod tests;

pub use models::MODELS;
pub use profile_name::{ProfileName, ProfileNameError, ProfileNameErrorKind, memory_gb_for_name};

/// The crate's one error type: a model name or a MIG profile name it does not know.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CatalogError {
    #[error("unknown GPU model {name:?}; known models: {}", known.join(", "))]
    UnknownModel {
        name: String,
        known: Vec<&'static str>,
    },
    /// A MIG profile name that did not parse.
    #[error("{0}")]
    ProfileName(ProfileNameError),
}

impl From<ProfileNameError> for CatalogError {
    fn from(e: ProfileNameError) -> CatalogError {
        CatalogError::ProfileName(e)
    }
}

/// GPU architecture family as GPU Feature Discovery names it (`nvidia.com/gpu.family`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Family {
    Volta,
    Turing,
    Ampere,
    AdaLovelace,
    Hopper,
    Blackwell,
}

impl Family {
    /// The GFD label value, e.g. `ada-lovelace`.
    pub fn as_str(self) -> &'static str {
        match self {
            Family::Volta => "volta",
            Family::Turing => "turing",
            Family::Ampere => "ampere",
            Family::AdaLovelace => "ada-lovelace",
            Family::Hopper => "hopper",
            Family::Blackwell => "blackwell",
        }
    }

    /// Family from a CUDA compute capability, using GFD's mapping.
    pub fn from_compute_capability(major: u32, minor: u32) -> Option<Family> {
        match (major, minor) {
            (7, 0..=4) => Some(Family::Volta),
            (7, 5) => Some(Family::Turing),
            (8, 0..=8) => Some(Family::Ampere),
            (8, 9) => Some(Family::AdaLovelace),
            (9, _) => Some(Family::Hopper),
            (10, _) | (12, _) => Some(Family::Blackwell),
            _ => None,
        }
    }
}

/// One GPU model as NVML and users see it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct GpuModel {
    /// The key users type (`H100-SXM5-80GB`); matched case-insensitively.
    pub key: &'static str,
    /// `nvmlDeviceGetName` output, e.g. `NVIDIA H100 80GB HBM3`.
    pub nvml_name: &'static str,
    /// PCI device IDs (the upper 16 bits of NVML's `pciDeviceId`; vendor is 0x10DE).
    pub pci_device_ids: &'static [u16],
    /// Total framebuffer memory in MiB as `nvmlDeviceGetMemoryInfo` reports `total`.
    pub memory_mib: u64,
    pub sm_count: u32,
    /// CUDA compute capability (major, minor).
    pub compute_capability: (u32, u32),
    pub family: Family,
    /// Oldest driver branch that supports the model (e.g. 525 for H100).
    pub min_driver_major: u32,
    /// Default power limit in milliwatts (used by the simulator for load figures).
    pub power_limit_mw: u32,
    /// Maximum SM and memory clocks in MHz.
    pub max_sm_clock_mhz: u32,
    pub max_mem_clock_mhz: u32,
    /// NVLink links per GPU (0 for PCIe-only parts).
    pub nvlinks: u32,
    /// MIG geometry and profiles; `None` for GPUs without MIG.
    pub mig: Option<MigGeometry>,
}

/// How a MIG-capable GPU divides into slices, and which GPU-instance profiles it offers.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct MigGeometry {
    pub memory_slices: u32,
    pub compute_slices: u32,
    /// Whether MIG mode survives a driver reload (Ampere: stored in InfoROM) or not (Hopper and later).
    pub mode_persists_across_reload: bool,
    pub gi_profiles: &'static [GiProfile],
}

/// One GPU-instance profile, e.g. `1g.10gb` on an H100 80GB.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct GiProfile {
    /// Canonical name, e.g. `1g.10gb+me`.
    pub name: &'static str,
    /// The `NVML_GPU_INSTANCE_PROFILE_*` enum value passed to `nvmlDeviceGetGpuInstanceProfileInfo`.
    pub nvml_enum: u32,
    /// The profile id NVML returns in `info.id` (what `nvidia-smi mig -lgip` shows).
    pub nvml_id: u32,
    pub memory_slices: u32,
    pub compute_slices: u32,
    pub max_count: u32,
    /// Valid placement starts, in memory slices; each placement spans `memory_slices`.
    pub placement_starts: &'static [u32],
    /// `memorySizeMB` NVML reports for the instance.
    pub memory_mib: u64,
    pub sm_count: u32,
    pub copy_engines: u32,
    pub decoders: u32,
    pub encoders: u32,
    pub jpegs: u32,
    pub ofas: u32,
}

/// Engines by type, as `nvidia-smi mig -lgip` lists them (CE, DEC, ENC, JPEG, OFA).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct EngineCounts {
    pub copy_engines: u32,
    pub decoders: u32,
    pub encoders: u32,
    pub jpegs: u32,
    pub ofas: u32,
}

impl EngineCounts {
    /// Each type with the name the planner's and the simulator's refusals use.
    pub fn named(&self) -> [(&'static str, u32); 5] {
        [
            ("copy", self.copy_engines),
            ("NVDEC", self.decoders),
            ("NVENC", self.encoders),
            ("NVJPG", self.jpegs),
            ("OFA", self.ofas),
        ]
    }

    /// `self` plus `n` times `other`, saturating (counts are small; saturation only guards input).
    pub fn plus(self, other: EngineCounts, n: u32) -> EngineCounts {
        let add = |a: u32, b: u32| a.saturating_add(b.saturating_mul(n));
        EngineCounts {
            copy_engines: add(self.copy_engines, other.copy_engines),
            decoders: add(self.decoders, other.decoders),
            encoders: add(self.encoders, other.encoders),
            jpegs: add(self.jpegs, other.jpegs),
            ofas: add(self.ofas, other.ofas),
        }
    }

    /// The first type `self` needs more of than `budget` has: (name, needed, available).
    pub fn exceeds(&self, budget: &EngineCounts) -> Option<(&'static str, u32, u32)> {
        self.named()
            .into_iter()
            .zip(budget.named())
            .find(|((_, need), (_, have))| need > have)
            .map(|((name, need), (_, have))| (name, need, have))
    }
}

impl GiProfile {
    /// The engines an instance of this profile takes from the GPU.
    pub fn engines(&self) -> EngineCounts {
        EngineCounts {
            copy_engines: self.copy_engines,
            decoders: self.decoders,
            encoders: self.encoders,
            jpegs: self.jpegs,
            ofas: self.ofas,
        }
    }
}

impl MigGeometry {
    /// The engines the GPU has, per type: the most any one profile takes, since the whole-GPU
    /// instance owns every engine. The instances of a layout share these, which is why a GPU with
    /// one NVJPG and one OFA holds a single media-extension (`+me`) instance.
    pub fn engine_budget(&self) -> EngineCounts {
        let mut out = EngineCounts::default();
        for p in self.gi_profiles {
            out.copy_engines = out.copy_engines.max(p.copy_engines);
            out.decoders = out.decoders.max(p.decoders);
            out.encoders = out.encoders.max(p.encoders);
            out.jpegs = out.jpegs.max(p.jpegs);
            out.ofas = out.ofas.max(p.ofas);
        }
        out
    }
}

impl GpuModel {
    /// The MIG profile with this canonical name (`1g.10gb`, `1g.10gb+me`), if the model offers it.
    pub fn gi_profile(&self, name: &str) -> Option<&'static GiProfile> {
        self.mig.as_ref().and_then(|m| {
            m.gi_profiles
                .iter()
                .find(|p| p.name.eq_ignore_ascii_case(name))
        })
    }

    /// The MIG profile with this NVML profile enum value.
    pub fn gi_profile_by_enum(&self, nvml_enum: u32) -> Option<&'static GiProfile> {
        self.mig
            .as_ref()
            .and_then(|m| m.gi_profiles.iter().find(|p| p.nvml_enum == nvml_enum))
    }

    /// The MIG profile with this NVML profile id (`info.id`).
    pub fn gi_profile_by_id(&self, nvml_id: u32) -> Option<&'static GiProfile> {
        self.mig
            .as_ref()
            .and_then(|m| m.gi_profiles.iter().find(|p| p.nvml_id == nvml_id))
    }

    /// Whether this model is a board variant of an earlier catalog model: same PCI device id and
    /// NVML name, other memory (GB200's pre-production boards). PCI ids and names resolve to the
    /// earlier model; [`identify`] tells them apart by memory.
    pub fn is_board_variant(&self) -> bool {
        self.pci_device_ids
            .first()
            .and_then(|&id| by_pci_device_id(id))
            .is_some_and(|first| first.key != self.key)
    }

    /// Whether this model supports MIG at all.
    pub fn mig_capable(&self) -> bool {
        self.mig.is_some()
    }
}

/// Every model in the catalog.
pub fn models() -> &'static [GpuModel] {
    MODELS
}

/// The keys users can type, in catalog order.
pub fn known_keys() -> Vec<&'static str> {
    MODELS.iter().map(|m| m.key).collect()
}

/// Resolves a model by its key (case-insensitive) or by the exact NVML name (case-insensitive).
pub fn lookup(name: &str) -> Result<&'static GpuModel, CatalogError> {
    let wanted = name.trim();
    MODELS
        .iter()
        .find(|m| m.key.eq_ignore_ascii_case(wanted) || m.nvml_name.eq_ignore_ascii_case(wanted))
        .ok_or_else(|| CatalogError::UnknownModel {
            name: name.to_string(),
            known: known_keys(),
        })
}

/// Resolves a model by PCI device ID (e.g. 0x2330), as read from NVML's `pciDeviceId >> 16`.
pub fn by_pci_device_id(device_id: u16) -> Option<&'static GpuModel> {
    MODELS
        .iter()
        .find(|m| m.pci_device_ids.contains(&device_id))
}

/// Resolves a GPU by PCI device id and the total memory NVML reports: the model with that id
/// whose memory is nearest, so board variants sharing an id (GB200's pre-production boards
/// report 189 GiB, production ones 186) are told apart. `None` for an unknown id.
pub fn identify(device_id: u16, total_mib: u64) -> Option<&'static GpuModel> {
    MODELS
        .iter()
        .filter(|m| m.pci_device_ids.contains(&device_id))
        .min_by_key(|m| m.memory_mib.abs_diff(total_mib))
}

/// Valid compute-instance sizes (in compute slices) inside a GPU instance of `gi_compute_slices`:
/// C <= G and (C == G or 2C <= G+1).
pub fn ci_sizes(gi_compute_slices: u32) -> Vec<u32> {
    (1..=gi_compute_slices)
        .filter(|&c| c == gi_compute_slices || 2 * c <= gi_compute_slices + 1)
        .collect()
}

/// The canonical name of `profile` on `model`, computed from its memory and NVML enum rather than
/// copied from [`GiProfile::name`]: `<G>g.<N>gb` with `N` from [`memory_gb_for_name`] and the
/// suffix implied by the profile enum (`+me`, `+me.all`, `-me`, `+gfx`).
///
/// This is how a name is formed for a profile the catalog does not list (e.g. read from NVML on a
/// new GPU). Models without MIG geometry are treated as having 8 memory slices.
pub fn render_gi_name(model: &GpuModel, profile: &GiProfile) -> String {
    let slices = model.mig.as_ref().map_or(8, |m| m.memory_slices);
    ProfileName {
        compute_slices: None,
        gpu_slices: profile.compute_slices,
        memory_gb: memory_gb_for_name(profile.memory_mib, model.memory_mib, slices),
        attrs: nvml_enum::attrs_for_enum(profile.nvml_enum)
            .iter()
            .map(|a| (*a).to_string())
            .collect(),
    }
    .to_string()
}

pub mod xid;
