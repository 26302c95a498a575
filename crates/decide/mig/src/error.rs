//! The crate's one error type: why a config, a hooks file, a demand or a node's targets were
//! rejected. Each message names the problem and where it is.

use crate::planner::Infeasible;
use gpuops_yamlpos::edit_distance;
use std::fmt;

/// Where a problem is: file (`-` is shown as `<stdin>`), and line and column when known (1-based).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Position {
    pub origin: String,
    pub line: Option<u64>,
    pub column: Option<u64>,
}

impl fmt::Display for Position {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.origin == "-" {
            f.write_str("<stdin>")?;
        } else {
            f.write_str(&self.origin)?;
        }
        if let Some(line) = self.line {
            write!(f, ":{line}")?;
            if let Some(column) = self.column {
                write!(f, ":{column}")?;
            }
        }
        Ok(())
    }
}

/// Why a mig-parted config, a hooks file, a demand or fleet, or a node's MIG targets were
/// rejected. Config errors carry their file position ([`MigError::position`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MigError {
    /// The text is not well-formed YAML.
    #[error("{at}: invalid YAML: {message}")]
    Yaml { at: Position, message: String },
    /// Well-formed YAML that is not a valid mig-parted v1 config.
    #[error("{at}: {}{message}", config_prefix(.config.as_deref()))]
    Invalid {
        at: Position,
        /// The named config the problem is in, when it is inside one.
        config: Option<String>,
        message: String,
    },
    /// `MigPartedConfig::get` with a name the file does not define.
    #[error("no MIG config named {name:?}{}; known configs: {}", did_you_mean(.name, .known), .known.join(", "))]
    UnknownConfig { name: String, known: Vec<String> },
    // A config that cannot apply to a node's GPUs. `entry` is 1-based (as shown to users);
    // `line` is the entry's line in the config file, 0 when unknown.
    #[error("{}: GPU {index} is listed in devices, but this node has {}", where_(.config, *.entry, *.line), gpu_count(.indices))]
    ListedGpuMissing {
        config: String,
        entry: usize,
        line: u64,
        index: u32,
        /// Indices of the GPUs the node has, sorted.
        indices: Vec<u32>,
    },
    #[error("{}: GPU {index} ({name}) does not support MIG", where_(.config, *.entry, *.line))]
    NotMigCapable {
        config: String,
        entry: usize,
        line: u64,
        index: u32,
        /// The GPU's name (`NVIDIA L4`), or its catalog model, or `unknown model`.
        name: String,
    },
    /// A hooks file that cannot be used.
    #[error("hooks file {origin}: {message}")]
    Hooks { origin: String, message: String },
    // Parsing demand and fleets, and planning for them.
    #[error("empty demand: give items such as \"12x 10GiB, 3x 3g.40gb\"")]
    EmptyDemand,
    #[error("demand item {index} ({item:?}): {reason}")]
    BadDemandItem {
        index: usize,
        item: String,
        reason: String,
    },
    #[error("empty fleet: give GPU models such as \"8x H100-SXM5-80GB, A100-SXM4-80GB\"")]
    EmptyFleet,
    #[error("fleet item {item:?}: {reason}")]
    BadFleetItem { item: String, reason: String },
    #[error("unknown GPU model {name:?}; known models: {}", known.join(", "))]
    UnknownModel {
        name: String,
        known: Vec<&'static str>,
    },
    #[error(
        "no MIG-capable GPU model in the fleet ({}); MIG-capable models: {}",
        models.join(", "),
        mig_models.join(", ")
    )]
    NoMigModel {
        models: Vec<&'static str>,
        mig_models: Vec<&'static str>,
    },
    #[error(
        "demand item {index} ({item}): no fleet model offers MIG profile {profile}; offered: {}",
        offered.join("; ")
    )]
    UnknownProfile {
        index: usize,
        item: String,
        profile: String,
        /// One entry per fleet model: `H100-SXM5-80GB: 1g.10gb, 1g.10gb+me, ...`.
        offered: Vec<String>,
    },
    #[error(
        "demand item {index} ({item}): {mib} MiB is more than the largest MIG profile of any fleet model ({})",
        largest.join(", ")
    )]
    MemoryTooLarge {
        index: usize,
        item: String,
        mib: u64,
        /// One entry per fleet model: `H100-SXM5-80GB: 7g.80gb (81152 MiB)`.
        largest: Vec<String>,
    },
    #[error("internal planner error: {0}")]
    Internal(String),
    /// No layout with the wanted MIG devices exists on a model.
    #[error("{0}")]
    Infeasible(Infeasible),
    // A node's targets that cannot be planned.
    #[error("GPU {0} is not on this node")]
    NoSuchGpu(u32),
    #[error("cannot apply:\n  {}", .0.join("\n  "))]
    Cannot(Vec<String>),
    /// A MIG checkpoint file that is not JSON of the checkpoint's shape (`message` is
    /// serde_json's).
    #[error("checkpoint {origin}: {message}")]
    CheckpointJson { origin: String, message: String },
    #[error(
        "checkpoint {origin}: version {version:?} is not {}",
        crate::checkpoint::Checkpoint::VERSION
    )]
    CheckpointVersion { origin: String, version: String },
    /// A mig-parted `device-filter` that is not `0xDDDDVVVV[:0xSSSSVVVV]`.
    #[error("device-filter {text:?}{part} {problem}")]
    DeviceFilter {
        text: String,
        part: FilterPart,
        problem: HexIdProblem,
    },
    #[error("checkpointed GPU {index} ({uuid}) is not on this node")]
    CheckpointedGpuMissing { index: u32, uuid: String },
}

/// Which part of a `device-filter` a problem is in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FilterPart {
    /// A filter without a subsystem part.
    Whole,
    Device(String),
    Subsystem(String),
}

impl fmt::Display for FilterPart {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FilterPart::Whole => Ok(()),
            FilterPart::Device(d) => write!(f, ": the device part {d:?}"),
            FilterPart::Subsystem(s) => write!(f, ": the subsystem part {s:?}"),
        }
    }
}

/// What is wrong with one hex id of a `device-filter`; shown after the part it is in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HexIdProblem {
    NoPrefix,
    /// A bare 16-bit PCI id (its hex digits), without the vendor id.
    Bare16Bit(String),
    NotEightDigits,
}

impl fmt::Display for HexIdProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HexIdProblem::NoPrefix => f.write_str(
                "must be 0x followed by 8 hex digits (PCI id, then vendor id 10DE), e.g. \"0x233010DE\"",
            ),
            HexIdProblem::Bare16Bit(digits) => write!(
                f,
                "is a bare 16-bit PCI id; write it followed by the vendor id: \"0x{:0>4}10DE\"",
                digits.to_ascii_uppercase()
            ),
            HexIdProblem::NotEightDigits => {
                f.write_str("must be 0x followed by exactly 8 hex digits, e.g. \"0x233010DE\"")
            }
        }
    }
}

impl From<Infeasible> for MigError {
    fn from(e: Infeasible) -> MigError {
        MigError::Infeasible(e)
    }
}

impl MigError {
    /// The file position, for errors that have one.
    pub fn position(&self) -> Option<&Position> {
        match self {
            MigError::Yaml { at, .. } | MigError::Invalid { at, .. } => Some(at),
            _ => None,
        }
    }
}

fn config_prefix(config: Option<&str>) -> String {
    config.map_or_else(String::new, |c| format!("config {c}: "))
}

fn did_you_mean(name: &str, known: &[String]) -> String {
    closest(name, known.iter().map(String::as_str))
        .map_or_else(String::new, |k| format!(" (did you mean {k:?}?)"))
}

/// The candidate within edit distance 2 (or equal ignoring case and `_`/`-`), if exactly one is best.
pub(crate) fn closest<'a>(
    word: &str,
    candidates: impl Iterator<Item = &'a str>,
) -> Option<&'a str> {
    let norm = |s: &str| s.to_ascii_lowercase().replace('_', "-");
    let mut best: Option<(usize, &str)> = None;
    for c in candidates {
        let d = if norm(c) == norm(word) {
            0
        } else {
            edit_distance(word, c)
        };
        if d <= 2 && best.is_none_or(|(bd, _)| d < bd) {
            best = Some((d, c));
        }
    }
    best.map(|(_, c)| c)
}

fn where_(config: &str, entry: usize, line: u64) -> String {
    if line > 0 {
        format!("config {config} entry {entry} (line {line})")
    } else {
        format!("config {config} entry {entry}")
    }
}

/// `4 GPUs (0-3)`, `1 GPU (0)`, `no GPUs`, `3 GPUs (0, 2, 5)`.
fn gpu_count(indices: &[u32]) -> String {
    match indices {
        [] => "no GPUs".into(),
        [one] => format!("1 GPU ({one})"),
        [first, .., last] if indices.windows(2).all(|w| w[1] == w[0] + 1) => {
            format!("{} GPUs ({first}-{last})", indices.len())
        }
        _ => format!(
            "{} GPUs ({})",
            indices.len(),
            indices
                .iter()
                .map(u32::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}
