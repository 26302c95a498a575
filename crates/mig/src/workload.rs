//! Layout planning for a workload mix (`gpuops mig plan`): from a demand ("12x 10GiB, 3x 3g.40gb")
//! and a fleet ("8x H100-SXM5-80GB, A100-SXM4-80GB") to the fewest GPUs and their MIG layouts, a
//! mig-parted config and the `nvidia.com/mig.config` label values, with a proved lower bound.
//!
//! # Semantics
//! - A profile item (`3g.40gb`, `1g.10gb+me`, `1c.3g.40gb`) needs one MIG device of exactly that
//!   name; it can only go to a model that offers the GPU-instance profile.
//! - A memory item (`10GiB`, `10GB`, `5000MiB`) needs one MIG device with at least that much
//!   memory. On each model it maps to the smallest plain (no `+me`/`-me` attribute) profile, by
//!   memory slices then compute slices, whose catalog `memory_mib` (what NVML reports) is at least
//!   the request. GiB = 1024 MiB; GB = 10^9 bytes. Note the strictness: a `1g.10gb` instance on an
//!   H100 has 9984 MiB, less than 10 GiB, so `10GiB` needs a `1g.20gb` there while `10GB`
//!   (9537 MiB) fits a `1g.10gb`.
//! - Each MIG device serves one unit of demand. Layouts contain only devices that serve demand;
//!   the rest of each GPU is left unpartitioned (reported as free slices).
//! - Objective: fewest GPUs; then fewest free memory slices; then a deterministic order. With a
//!   limited fleet, serving as many units as possible comes first and the rest is reported unmet.
//!
//! # Algorithm
//! 1. Demand items with the same mapping on every fleet model form a class. Per model, every
//!    feasible layout (a multiset of the demanded device kinds) is enumerated exactly: counts
//!    bounded by `max_count` per GPU-instance profile, memory and compute slices, and a
//!    backtracking search over `placement_starts` with a bitmask of occupied slices. Only maximal
//!    layouts are kept (tens to a few hundred).
//! 2. The cutting-stock LP relaxation over those layouts (all models at once, fleet limits as
//!    constraints, unmet demand as a penalised slack) is solved with a small dense simplex on its
//!    dual, whose origin is always feasible. Its ceiling is a valid lower bound, reported with the
//!    simple ones (memory slices, compute slices, per-profile maxima), whichever is strongest.
//! 3. The LP solution is rounded down, the residual demand (at most a few GPUs' worth) is packed
//!    greedily by the LP's dual prices, then improved by a bounded branch-and-bound; a plain greedy
//!    over the whole demand is the fallback candidate. The better plan wins.
//! 4. The answer is proven optimal when it equals the lower bound
//!    ([`FleetPlan::proven_optimal`]).

use crate::layout::{Instance, Layout, describe_counts, gi_profile_of};
use gpuops_catalog::{GiProfile, GpuModel, MigGeometry, ProfileName};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;

/// Errors from parsing demand and fleets, and from planning.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WorkloadError {
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
}

// ------------------------------------------------------------------------------------------------
// Demand and fleet
// ------------------------------------------------------------------------------------------------

/// What a workload mix needs: MIG devices by profile name or by memory size.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Demand {
    pub items: Vec<DemandItem>,
}

impl Demand {
    /// Total units (MIG devices) asked for.
    pub fn total_units(&self) -> u64 {
        self.items.iter().map(|i| u64::from(i.count())).sum()
    }
}

impl fmt::Display for Demand {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self.items.iter().map(ToString::to_string).collect();
        write!(f, "{}", parts.join(", "))
    }
}

/// One demand item: `count` MIG devices of a profile, or with at least `mib` MiB of memory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DemandItem {
    /// A canonical MIG device name (`1g.10gb`, `1g.10gb+me`, `1c.3g.40gb`).
    Profile { profile: String, count: u32 },
    /// A memory size in MiB.
    Memory { mib: u64, count: u32 },
}

impl DemandItem {
    pub fn count(&self) -> u32 {
        match self {
            DemandItem::Profile { count, .. } | DemandItem::Memory { count, .. } => *count,
        }
    }

    /// What one unit is, without the count: `3g.40gb` or `10GiB`.
    pub fn what(&self) -> String {
        match self {
            DemandItem::Profile { profile, .. } => profile.clone(),
            DemandItem::Memory { mib, .. } => format_mib(*mib),
        }
    }
}

impl fmt::Display for DemandItem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}x {}", self.count(), self.what())
    }
}

/// `10GiB` for whole GiB, `9537MiB` otherwise.
fn format_mib(mib: u64) -> String {
    if mib.is_multiple_of(1024) {
        format!("{}GiB", mib / 1024)
    } else {
        format!("{mib}MiB")
    }
}

/// GPUs offered for the plan: a model, and how many (`None`: as many as needed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FleetOffer {
    pub model: &'static GpuModel,
    pub available: Option<u32>,
}

/// Splits a list on `,`, `;`, newlines and stand-alone `+` (so `describe_counts` output parses).
fn split_list(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for piece in text.split([',', ';', '\n']) {
        let mut cur: Vec<&str> = Vec::new();
        for tok in piece.split_whitespace() {
            if tok == "+" {
                if !cur.is_empty() {
                    out.push(cur.join(" "));
                    cur.clear();
                }
            } else {
                cur.push(tok);
            }
        }
        if !cur.is_empty() {
            out.push(cur.join(" "));
        }
    }
    out
}

/// Splits `12x what`, `12 x what`, `12xwhat`, `12*what`, `12×what` into the count and the rest;
/// text without such a prefix is returned whole with no count.
fn split_count(item: &str) -> Result<(Option<u32>, &str), String> {
    let s = item.trim();
    let digits_end = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    if digits_end == 0 {
        return Ok((None, s));
    }
    let rest = s[digits_end..].trim_start();
    let Some(after) = rest.strip_prefix(['x', 'X', '×', '*']) else {
        return Ok((None, s));
    };
    let digits = &s[..digits_end];
    let count: u32 = digits
        .parse()
        .map_err(|_| format!("count {digits} is too large (at most {})", u32::MAX))?;
    let what = after.trim();
    if what.is_empty() {
        return Err(format!("nothing after the count {digits}x"));
    }
    Ok((Some(count), what))
}

/// Whether text looks like a MIG profile name: its first `.`-part is digits and `g` or `c`.
fn looks_like_profile(s: &str) -> bool {
    let Some((first, _)) = s.split_once('.') else {
        return false;
    };
    let bytes = first.as_bytes();
    bytes.len() >= 2
        && matches!(bytes[bytes.len() - 1], b'g' | b'G' | b'c' | b'C')
        && bytes[..bytes.len() - 1].iter().all(u8::is_ascii_digit)
}

/// Parses a memory size (`10GiB`, `10 GB`, `9.5GiB`, `5000MiB`) into MiB, rounded up.
fn parse_memory(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let num_end = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = (&t[..num_end], t[num_end..].trim());
    if num.is_empty() {
        return Err(format!(
            "expected a MIG profile (e.g. 3g.40gb) or a memory size (e.g. 10GiB), got {t:?}"
        ));
    }
    let value: f64 = num
        .parse()
        .map_err(|_| format!("invalid number {num:?} in memory size"))?;
    let mib_per_unit = match unit.to_ascii_lowercase().as_str() {
        "mib" | "mi" => 1.0,
        "gib" | "gi" => 1024.0,
        "tib" | "ti" => 1024.0 * 1024.0,
        "mb" => 1e6 / 1_048_576.0,
        "gb" => 1e9 / 1_048_576.0,
        "tb" => 1e12 / 1_048_576.0,
        "" => {
            return Err(format!(
                "memory size {num} has no unit: write GiB, GB or MiB (e.g. {num}GiB)"
            ));
        }
        "g" | "m" | "t" => {
            return Err(format!(
                "ambiguous unit {unit:?}: write {u}iB (binary) or {u}B (decimal)",
                u = unit.to_ascii_uppercase()
            ));
        }
        other => {
            return Err(format!(
                "unknown memory unit {other:?}: use GiB, GB, MiB, MB, TiB or TB"
            ));
        }
    };
    let mib = (value * mib_per_unit - 1e-9).ceil();
    if !mib.is_finite() || mib < 1.0 {
        return Err("memory size must be at least 1 MiB".into());
    }
    if mib > 1e12 {
        return Err(format!("memory size {t} is implausibly large"));
    }
    Ok(mib as u64)
}

/// Parses one demand item's text (already split from its neighbours).
fn parse_demand_item(item: &str) -> Result<DemandItem, String> {
    let (count, what) = split_count(item)?;
    let count = count.unwrap_or(1);
    if count == 0 {
        return Err("count must be at least 1".into());
    }
    if looks_like_profile(what) {
        let name: ProfileName = what
            .parse()
            .map_err(|e: gpuops_catalog::ProfileNameError| {
                format!("invalid MIG profile name: {}", e.kind)
            })?;
        Ok(DemandItem::Profile {
            profile: name.to_string(),
            count,
        })
    } else {
        Ok(DemandItem::Memory {
            mib: parse_memory(what)?,
            count,
        })
    }
}

/// Parses demand such as `12x 10GiB, 3x 40GiB`, `7x 1g.10gb, 2x 3g.40gb`, `12 x 10GB`,
/// `2x 1g.10gb + 1x 3g.40gb` or mixes. Items are separated by `,`, `;`, newlines or a stand-alone
/// `+`; an item without a count means one. Units: GiB/GB/MiB/MB/TiB/TB (case-insensitive).
pub fn parse_demand(text: &str) -> Result<Demand, WorkloadError> {
    let mut items = Vec::new();
    for (index, item) in split_list(text).into_iter().enumerate() {
        let parsed = parse_demand_item(&item).map_err(|reason| WorkloadError::BadDemandItem {
            index,
            item: item.clone(),
            reason,
        })?;
        items.push(parsed);
    }
    if items.is_empty() {
        return Err(WorkloadError::EmptyDemand);
    }
    Ok(Demand { items })
}

/// Parses a fleet such as `H100-SXM5-80GB` (as many as needed) or
/// `8x H100-SXM5-80GB, 4x A100-SXM4-40GB`. Models are catalog keys or NVML names.
pub fn parse_fleet(text: &str) -> Result<Vec<FleetOffer>, WorkloadError> {
    let mut out = Vec::new();
    for item in split_list(text) {
        let (count, name) = split_count(&item).map_err(|reason| WorkloadError::BadFleetItem {
            item: item.clone(),
            reason,
        })?;
        let model = gpuops_catalog::lookup(name).map_err(|_| WorkloadError::UnknownModel {
            name: name.to_string(),
            known: gpuops_catalog::known_keys(),
        })?;
        out.push(FleetOffer {
            model,
            available: count,
        });
    }
    if out.is_empty() {
        return Err(WorkloadError::EmptyFleet);
    }
    Ok(out)
}

// ------------------------------------------------------------------------------------------------
// The plan
// ------------------------------------------------------------------------------------------------

/// One GPU of the plan: its model, layout, and which demand it serves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuAssignment {
    pub model: &'static GpuModel,
    pub layout: Layout,
    /// `(demand item index, MIG device name, count)`.
    pub serves: Vec<(usize, String, u32)>,
}

/// The planner's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FleetPlan {
    /// The GPUs used, identical layouts adjacent (largest group first).
    pub gpus: Vec<GpuAssignment>,
    /// GPUs any plan serving the whole demand needs (ignoring fleet limits when they make the
    /// demand unservable).
    pub lower_bound: u32,
    /// Why, e.g. `memory slices: 37 needed, 8 per GPU -> at least 5 GPUs`.
    pub bound_reason: String,
    /// `(demand item index, units)` that no available GPU could take.
    pub unmet: Vec<(usize, u32)>,
}

/// One distinct layout of a plan, as a mig-parted config.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlanConfig {
    /// The mig-parted config name and `nvidia.com/mig.config` value.
    pub name: String,
    pub model: &'static GpuModel,
    pub layout: Layout,
    pub counts: BTreeMap<String, u32>,
    /// How many GPUs of the plan get it.
    pub gpus: u32,
}

/// The mig-parted config name for `counts` on `model`: `gpuops-<model>-<N>x<profile>-...`,
/// lowercase, `+` and `,` written as `.`, at most 63 characters (a label value); longer names are
/// cut and end in a hash of the full name so they stay distinct.
pub fn config_name(model: &GpuModel, counts: &BTreeMap<String, u32>) -> String {
    let mut raw = format!("gpuops-{}", model.key);
    for (p, n) in counts {
        raw.push_str(&format!("-{n}x{p}"));
    }
    let clean: String = raw
        .chars()
        .map(|c| match c.to_ascii_lowercase() {
            c @ ('a'..='z' | '0'..='9' | '.' | '-') => c,
            '+' | ',' => '.',
            _ => '-',
        })
        .collect();
    if clean.len() <= 63 {
        return clean;
    }
    // FNV-1a over the full name keeps truncated names distinct and deterministic.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in clean.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    let prefix = clean[..54].trim_end_matches(['-', '.']);
    format!("{prefix}-{:08x}", h as u32)
}

impl FleetPlan {
    /// Whether the answer equals the proved lower bound (and serves all demand).
    pub fn proven_optimal(&self) -> bool {
        self.unmet.is_empty() && self.gpus.len() as u64 == u64::from(self.lower_bound)
    }

    /// The distinct (model, layout) pairs in plan order, with config names and GPU counts.
    pub fn configs(&self) -> Vec<PlanConfig> {
        let mut out: Vec<PlanConfig> = Vec::new();
        for g in &self.gpus {
            if let Some(c) = out
                .iter_mut()
                .find(|c| c.model.key == g.model.key && c.layout == g.layout)
            {
                c.gpus += 1;
                continue;
            }
            let counts = g.layout.counts();
            out.push(PlanConfig {
                name: config_name(g.model, &counts),
                model: g.model,
                layout: g.layout.clone(),
                counts,
                gpus: 1,
            });
        }
        out
    }

    /// A mig-parted `version: v1` config with one named config per distinct (model, layout),
    /// each selecting the model by PCI device id.
    pub fn mig_parted_yaml(&self) -> String {
        let configs = self.configs();
        let mut y = String::new();
        y.push_str(&format!(
            "# gpuops mig plan: {} GPUs (lower bound {}: {})\n",
            self.gpus.len(),
            self.lower_bound,
            self.bound_reason
        ));
        y.push_str("version: v1\n");
        if configs.is_empty() {
            y.push_str("mig-configs: {}\n");
            return y;
        }
        y.push_str("mig-configs:\n");
        for c in &configs {
            y.push_str(&format!(
                "  # {}x {}: {}\n",
                c.gpus,
                c.model.key,
                describe_counts(&c.counts)
            ));
            y.push_str(&format!("  {}:\n", c.name));
            y.push_str("    - devices: all\n");
            let ids: Vec<String> = c
                .model
                .pci_device_ids
                .iter()
                .map(|id| format!("\"0x{id:04X}10DE\""))
                .collect();
            if !ids.is_empty() {
                y.push_str(&format!("      device-filter: [{}]\n", ids.join(", ")));
            }
            y.push_str("      mig-enabled: true\n");
            y.push_str("      mig-devices:\n");
            for (p, n) in &c.counts {
                y.push_str(&format!("        \"{p}\": {n}\n"));
            }
        }
        y
    }

    /// `(config name, GPUs that get it)`: the `nvidia.com/mig.config` values to set.
    pub fn node_labels(&self) -> Vec<(String, u32)> {
        self.configs()
            .into_iter()
            .map(|c| (c.name, c.gpus))
            .collect()
    }

    /// A human-readable table: GPUs per model and layout, the lower bound, slack and unmet demand.
    pub fn summary(&self) -> String {
        let configs = self.configs();
        let mut s = String::new();
        let verdict = if !self.unmet.is_empty() {
            "fleet too small"
        } else if self.proven_optimal() {
            "proven optimal"
        } else {
            "not proven optimal"
        };
        s.push_str(&format!(
            "{} GPUs; lower bound {} ({}); {verdict}\n",
            self.gpus.len(),
            self.lower_bound,
            self.bound_reason
        ));
        let rows: Vec<[String; 4]> = configs
            .iter()
            .map(|c| {
                [
                    c.gpus.to_string(),
                    c.model.key.to_string(),
                    describe_counts(&c.counts),
                    c.name.clone(),
                ]
            })
            .collect();
        let head = [
            "GPUs".to_string(),
            "model".to_string(),
            "layout".to_string(),
            "config (nvidia.com/mig.config)".to_string(),
        ];
        let mut widths = head.iter().map(String::len).collect::<Vec<_>>();
        for r in &rows {
            for (w, cell) in widths.iter_mut().zip(r) {
                *w = (*w).max(cell.chars().count());
            }
        }
        let line = |cells: &[String; 4]| -> String {
            let mut l = format!("{:>w$}", cells[0], w = widths[0]);
            for (i, cell) in cells.iter().enumerate().skip(1) {
                l.push_str(&format!("  {:<w$}", cell, w = widths[i]));
            }
            l.trim_end().to_string() + "\n"
        };
        s.push_str(&line(&head));
        for r in &rows {
            s.push_str(&line(r));
        }
        let (mut total, mut used) = (0u64, 0u64);
        for g in &self.gpus {
            total += u64::from(g.model.mig.as_ref().map_or(8, |m| m.memory_slices));
            for i in &g.layout.instances {
                used +=
                    u64::from(gi_profile_of(g.model, &i.profile).map_or(0, |p| p.memory_slices));
            }
        }
        let mut per_model: Vec<(&str, u32)> = Vec::new();
        for c in &configs {
            match per_model.iter_mut().find(|e| e.0 == c.model.key) {
                Some(e) => e.1 += c.gpus,
                None => per_model.push((c.model.key, c.gpus)),
            }
        }
        if per_model.len() > 1 {
            let parts: Vec<String> = per_model.iter().map(|(m, n)| format!("{n}x {m}")).collect();
            s.push_str(&format!(
                "per model: {}
",
                parts.join(", ")
            ));
        }
        let slack = (self.gpus.len() as u64).saturating_sub(u64::from(self.lower_bound));
        s.push_str(&format!(
            "slack: {slack} GPUs above the bound; {} of {total} memory slices left unpartitioned\n",
            total - used
        ));
        if self.unmet.is_empty() {
            s.push_str("unmet demand: none\n");
        } else {
            let parts: Vec<String> = self
                .unmet
                .iter()
                .map(|(i, n)| format!("item {i}: {n}"))
                .collect();
            s.push_str(&format!("unmet demand: {}\n", parts.join(", ")));
        }
        s.push_str(
            "memory sizes are matched to profiles by nominal size (1g.10gb serves 10GiB; its usable memory is a few percent less)\n",
        );
        s
    }
}

// ------------------------------------------------------------------------------------------------
// Problem set-up
// ------------------------------------------------------------------------------------------------

/// A MIG device kind on one model: its name and GPU-instance profile.
#[derive(Debug, Clone)]
struct Kind {
    name: String,
    gi: &'static GiProfile,
}

/// One fleet model's part of the problem.
#[derive(Debug)]
struct Ctx {
    model: &'static GpuModel,
    geo: &'static MigGeometry,
    avail: Option<u32>,
    kinds: Vec<Kind>,
    /// Per class: the kind serving it on this model.
    class_kind: Vec<Option<usize>>,
    /// Per kind: the classes it serves, most constrained first.
    kind_classes: Vec<Vec<usize>>,
    /// Maximal feasible layouts as counts per kind.
    patterns: Vec<Vec<u32>>,
    /// Per kind: the most devices one GPU can hold.
    max_per_gpu: Vec<u32>,
}

/// Demand items with the same mapping on every model.
#[derive(Debug)]
struct Class {
    items: Vec<usize>,
    demand: u32,
    /// Models that can serve it.
    options: usize,
    /// Smallest fraction of a GPU's memory / compute slices one unit takes on any model.
    mem_frac: f64,
    comp_frac: f64,
    /// Most units of it one GPU of any model can hold.
    max_per_gpu: u32,
}

/// `(class, kind, count)` allocations of one GPU's devices.
type Alloc = Vec<(usize, usize, u32)>;

/// A planned GPU: its model context and `(class, kind, count)` allocations.
#[derive(Debug, Clone)]
struct Gpu {
    ctx: usize,
    alloc: Alloc,
}

/// A model context and per-kind device counts: one distinct layout.
type GroupKey = (usize, Vec<u32>);

struct Problem {
    ctxs: Vec<Ctx>,
    classes: Vec<Class>,
}

/// The smallest plain profile on `model` whose nominal size (the NN of `NNgb`, in GiB) is at
/// least `mib` MiB. Nominal, because that is how people and NVIDIA's names size instances
/// ("a 10 GB slice" is `1g.10gb`); the usable memory is a few percent less (an H100 `1g.10gb` has
/// 9.75 GiB), which the plan's summary says.
fn profile_for_memory(model: &GpuModel, mib: u64) -> Option<&'static GiProfile> {
    let geo = model.mig.as_ref()?;
    geo.gi_profiles
        .iter()
        .filter(|p| !p.name.contains(['+', '-']))
        .filter(|p| {
            p.name
                .parse::<gpuops_catalog::ProfileName>()
                .is_ok_and(|n| u64::from(n.memory_gb) * 1024 >= mib)
        })
        .min_by_key(|p| (p.memory_slices, p.compute_slices, p.memory_mib, p.name))
}

/// Places `counts` of `kinds` on a GPU: `(kind, start)` per device, or `None` if it does not fit.
/// Largest devices first, each at its lowest free valid start, backtracking.
fn place(geo: &MigGeometry, kinds: &[Kind], counts: &[u32]) -> Option<Vec<(usize, u32)>> {
    let mut inst: Vec<usize> = Vec::new();
    for (k, &n) in counts.iter().enumerate() {
        inst.extend(std::iter::repeat_n(k, n as usize));
    }
    inst.sort_by_key(|&k| {
        (
            std::cmp::Reverse(kinds[k].gi.memory_slices),
            kinds[k].gi.placement_starts.len(),
            k,
        )
    });
    let mut starts = vec![0u32; inst.len()];
    if place_rec(0, 0, &inst, kinds, geo.memory_slices, &mut starts) {
        Some(inst.into_iter().zip(starts).collect())
    } else {
        None
    }
}

fn place_rec(
    i: usize,
    mask: u64,
    inst: &[usize],
    kinds: &[Kind],
    slices: u32,
    starts: &mut [u32],
) -> bool {
    let Some(&k) = inst.get(i) else {
        return true;
    };
    let gi = kinds[k].gi;
    // Devices of one kind are interchangeable: keep their starts increasing.
    let min_start = if i > 0 && inst[i - 1] == k {
        starts[i - 1] + 1
    } else {
        0
    };
    for &s in gi.placement_starts {
        if s < min_start || s + gi.memory_slices > slices || gi.memory_slices >= 64 {
            continue;
        }
        let m = ((1u64 << gi.memory_slices) - 1) << s;
        if mask & m != 0 {
            continue;
        }
        starts[i] = s;
        if place_rec(i + 1, mask | m, inst, kinds, slices, starts) {
            return true;
        }
    }
    false
}

/// Every maximal feasible layout over `kinds` on a model.
fn enumerate_patterns(geo: &MigGeometry, kinds: &[Kind]) -> Vec<Vec<u32>> {
    let mut feasible = Vec::new();
    let mut counts = vec![0u32; kinds.len()];
    enum_rec(0, 0, 0, geo, kinds, &mut counts, &mut feasible);
    let set: HashSet<Vec<u32>> = feasible.iter().cloned().collect();
    feasible
        .into_iter()
        .filter(|v| {
            (0..v.len()).all(|k| {
                let mut w = v.clone();
                w[k] += 1;
                !set.contains(&w)
            })
        })
        .collect()
}

fn enum_rec(
    i: usize,
    mem: u32,
    comp: u32,
    geo: &MigGeometry,
    kinds: &[Kind],
    counts: &mut Vec<u32>,
    out: &mut Vec<Vec<u32>>,
) {
    if i == kinds.len() {
        if counts.iter().any(|&n| n > 0) {
            out.push(counts.clone());
        }
        return;
    }
    let gi = kinds[i].gi;
    let same_gi: u32 = (0..i)
        .filter(|&j| kinds[j].gi.name == gi.name)
        .map(|j| counts[j])
        .sum();
    let mut n = 0u32;
    loop {
        counts[i] = n;
        if n > 0 && place(geo, kinds, counts).is_none() {
            break;
        }
        enum_rec(
            i + 1,
            mem + n * gi.memory_slices,
            comp + n * gi.compute_slices,
            geo,
            kinds,
            counts,
            out,
        );
        n += 1;
        if same_gi + n > gi.max_count
            || mem + n * gi.memory_slices > geo.memory_slices
            || comp + n * gi.compute_slices > geo.compute_slices
        {
            break;
        }
    }
    counts[i] = 0;
}

impl Problem {
    fn build(demand: &Demand, fleet: &[FleetOffer]) -> Result<Problem, WorkloadError> {
        // Merge repeated models; `None` (unlimited) wins.
        let mut offers: Vec<(&'static GpuModel, Option<u32>)> = Vec::new();
        for o in fleet {
            if let Some(e) = offers.iter_mut().find(|e| e.0.key == o.model.key) {
                e.1 = match (e.1, o.available) {
                    (Some(a), Some(b)) => Some(a.saturating_add(b)),
                    _ => None,
                };
            } else {
                offers.push((o.model, o.available));
            }
        }
        let mig: Vec<(&'static GpuModel, &'static MigGeometry, Option<u32>)> = offers
            .iter()
            .filter_map(|&(m, a)| m.mig.as_ref().map(|g| (m, g, a)))
            .collect();
        if mig.is_empty() {
            return Err(WorkloadError::NoMigModel {
                models: offers.iter().map(|o| o.0.key).collect(),
                mig_models: gpuops_catalog::models()
                    .iter()
                    .filter(|m| m.mig_capable())
                    .map(|m| m.key)
                    .collect(),
            });
        }

        // Map each item on each model to a device kind (name, GI profile).
        let mut signatures: Vec<Vec<Option<(String, &'static GiProfile)>>> = Vec::new();
        for (index, item) in demand.items.iter().enumerate() {
            let sig: Vec<Option<(String, &'static GiProfile)>> = match item {
                DemandItem::Profile { profile, .. } => {
                    let name: ProfileName =
                        profile
                            .parse()
                            .map_err(|e: gpuops_catalog::ProfileNameError| {
                                WorkloadError::BadDemandItem {
                                    index,
                                    item: item.to_string(),
                                    reason: format!("invalid MIG profile name: {}", e.kind),
                                }
                            })?;
                    let canonical = name.to_string();
                    let gi_name = name.gi_name();
                    mig.iter()
                        .map(|(m, _, _)| m.gi_profile(&gi_name).map(|g| (canonical.clone(), g)))
                        .collect()
                }
                DemandItem::Memory { mib, .. } => mig
                    .iter()
                    .map(|(m, _, _)| profile_for_memory(m, *mib).map(|g| (g.name.to_string(), g)))
                    .collect(),
            };
            if sig.iter().all(Option::is_none) {
                return Err(match item {
                    DemandItem::Profile { profile, .. } => WorkloadError::UnknownProfile {
                        index,
                        item: item.to_string(),
                        profile: profile.clone(),
                        offered: mig
                            .iter()
                            .map(|(m, g, _)| {
                                let names: Vec<&str> =
                                    g.gi_profiles.iter().map(|p| p.name).collect();
                                format!("{}: {}", m.key, names.join(", "))
                            })
                            .collect(),
                    },
                    DemandItem::Memory { mib, .. } => WorkloadError::MemoryTooLarge {
                        index,
                        item: item.to_string(),
                        mib: *mib,
                        largest: mig
                            .iter()
                            .filter_map(|(m, g, _)| {
                                g.gi_profiles.iter().max_by_key(|p| p.memory_mib).map(|p| {
                                    format!("{}: {} ({} MiB)", m.key, p.name, p.memory_mib)
                                })
                            })
                            .collect(),
                    },
                });
            }
            signatures.push(sig);
        }

        // Classes: items with identical mappings.
        let mut classes: Vec<Class> = Vec::new();
        let mut class_sig: Vec<Vec<Option<String>>> = Vec::new();
        let mut class_gis: Vec<Vec<Option<&'static GiProfile>>> = Vec::new();
        for (index, (item, sig)) in demand.items.iter().zip(&signatures).enumerate() {
            if item.count() == 0 {
                continue;
            }
            let key: Vec<Option<String>> = sig
                .iter()
                .map(|s| s.as_ref().map(|(n, _)| n.clone()))
                .collect();
            if let Some(c) = class_sig.iter().position(|k| *k == key) {
                classes[c].items.push(index);
                classes[c].demand = classes[c].demand.saturating_add(item.count());
            } else {
                class_sig.push(key);
                class_gis.push(sig.iter().map(|s| s.as_ref().map(|(_, g)| *g)).collect());
                classes.push(Class {
                    items: vec![index],
                    demand: item.count(),
                    options: sig.iter().filter(|s| s.is_some()).count(),
                    mem_frac: 1.0,
                    comp_frac: 1.0,
                    max_per_gpu: 1,
                });
            }
        }
        if classes.is_empty() {
            return Err(WorkloadError::EmptyDemand);
        }

        // Per model: kinds, their classes, and the maximal layouts.
        let mut ctxs = Vec::new();
        for (mi, &(model, geo, avail)) in mig.iter().enumerate() {
            let mut kinds: Vec<Kind> = Vec::new();
            let mut class_kind = vec![None; classes.len()];
            for (c, (sig, gis)) in class_sig.iter().zip(&class_gis).enumerate() {
                let (Some(name), Some(gi)) = (&sig[mi], gis[mi]) else {
                    continue;
                };
                let k = match kinds.iter().position(|k| k.name == *name) {
                    Some(k) => k,
                    None => {
                        kinds.push(Kind {
                            name: name.clone(),
                            gi,
                        });
                        kinds.len() - 1
                    }
                };
                class_kind[c] = Some(k);
            }
            let mut kind_classes = vec![Vec::new(); kinds.len()];
            for (c, k) in class_kind.iter().enumerate() {
                if let Some(k) = k {
                    kind_classes[*k].push(c);
                }
            }
            for list in &mut kind_classes {
                list.sort_by_key(|&c| (classes[c].options, c));
            }
            let patterns = if kinds.is_empty() {
                Vec::new()
            } else {
                enumerate_patterns(geo, &kinds)
            };
            let mut max_per_gpu = vec![0u32; kinds.len()];
            for p in &patterns {
                for (m, &n) in max_per_gpu.iter_mut().zip(p) {
                    *m = (*m).max(n);
                }
            }
            ctxs.push(Ctx {
                model,
                geo,
                avail,
                kinds,
                class_kind,
                kind_classes,
                patterns,
                max_per_gpu,
            });
        }

        // Per-class figures for the simple bounds.
        for (c, class) in classes.iter_mut().enumerate() {
            let mut mem_frac = f64::INFINITY;
            let mut comp_frac = f64::INFINITY;
            let mut max_per = 0u32;
            for ctx in &ctxs {
                let Some(k) = ctx.class_kind[c] else { continue };
                let gi = ctx.kinds[k].gi;
                mem_frac =
                    mem_frac.min(f64::from(gi.memory_slices) / f64::from(ctx.geo.memory_slices));
                comp_frac =
                    comp_frac.min(f64::from(gi.compute_slices) / f64::from(ctx.geo.compute_slices));
                max_per = max_per.max(ctx.max_per_gpu[k]);
            }
            if max_per == 0 || !mem_frac.is_finite() || !comp_frac.is_finite() {
                return Err(WorkloadError::Internal(format!(
                    "demand item {} fits no layout on any fleet model",
                    class.items.first().copied().unwrap_or(0)
                )));
            }
            class.mem_frac = mem_frac;
            class.comp_frac = comp_frac;
            class.max_per_gpu = max_per;
        }
        Ok(Problem { ctxs, classes })
    }

    /// Orders each kind's classes by LP price, dearest first: a class that is expensive to serve
    /// elsewhere should take a shared device kind here (the LP's reduced cost `v - y` is smallest).
    fn prefer_by_price(&mut self, y: &[f64]) {
        let options: Vec<usize> = self.classes.iter().map(|c| c.options).collect();
        for ctx in &mut self.ctxs {
            for list in &mut ctx.kind_classes {
                list.sort_by(|&a, &b| {
                    y[b].total_cmp(&y[a])
                        .then(options[a].cmp(&options[b]))
                        .then(a.cmp(&b))
                });
            }
        }
    }

    /// Ctxs that can serve anything.
    fn active_ctxs(&self) -> usize {
        self.ctxs.iter().filter(|c| !c.patterns.is_empty()).count()
    }

    /// Allocates one GPU of `pat` on ctx `ci` to residual demand `r`, `first` served first.
    fn alloc(&self, ci: usize, pat: &[u32], r: &[u32], first: Option<usize>) -> Alloc {
        let ctx = &self.ctxs[ci];
        let mut out = Vec::new();
        for (k, &a) in pat.iter().enumerate() {
            if a == 0 {
                continue;
            }
            let mut left = a;
            let forced = first.filter(|&f| ctx.class_kind[f] == Some(k));
            for c in forced.into_iter().chain(
                ctx.kind_classes[k]
                    .iter()
                    .copied()
                    .filter(|&c| Some(c) != forced),
            ) {
                if left == 0 {
                    break;
                }
                let t = left.min(r[c]);
                if t > 0 {
                    out.push((c, k, t));
                    left -= t;
                }
            }
        }
        out
    }

    /// Like [`Problem::alloc`], but first to the classes the LP serves on this model (`quota`,
    /// used up as devices are given), then to anyone.
    fn alloc_quota(&self, ci: usize, pat: &[u32], r: &[u32], quota: &mut [f64]) -> Alloc {
        let ctx = &self.ctxs[ci];
        let mut out = Vec::new();
        for (k, &a) in pat.iter().enumerate() {
            if a == 0 {
                continue;
            }
            let mut left = a;
            let mut taken: Vec<(usize, u32)> = Vec::new();
            for &c in &ctx.kind_classes[k] {
                let q = (quota[c] - 1e-6).ceil().max(0.0) as u32;
                let t = left.min(r[c]).min(q);
                if t > 0 {
                    taken.push((c, t));
                    left -= t;
                }
            }
            for &c in &ctx.kind_classes[k] {
                if left == 0 {
                    break;
                }
                let already = taken.iter().find(|e| e.0 == c).map_or(0, |e| e.1);
                let t = left.min(r[c] - already);
                if t > 0 {
                    match taken.iter_mut().find(|e| e.0 == c) {
                        Some(e) => e.1 += t,
                        None => taken.push((c, t)),
                    }
                    left -= t;
                }
            }
            for (c, t) in taken {
                quota[c] -= f64::from(t);
                out.push((c, k, t));
            }
        }
        out
    }

    /// A lower bound on GPUs for residual demand `r` (ignoring fleet limits).
    fn lb_units(&self, r: &[u32]) -> u64 {
        let (mut mem, mut comp, mut per) = (0.0f64, 0.0f64, 0u64);
        for (c, &n) in r.iter().enumerate() {
            if n == 0 {
                continue;
            }
            let cl = &self.classes[c];
            mem += f64::from(n) * cl.mem_frac;
            comp += f64::from(n) * cl.comp_frac;
            per = per.max(u64::from(n).div_ceil(u64::from(cl.max_per_gpu)));
        }
        if self.active_ctxs() == 1
            && let Some(ctx) = self.ctxs.iter().find(|c| !c.patterns.is_empty())
        {
            for (k, list) in ctx.kind_classes.iter().enumerate() {
                let d: u64 = list.iter().map(|&c| u64::from(r[c])).sum();
                if d > 0 && ctx.max_per_gpu[k] > 0 {
                    per = per.max(d.div_ceil(u64::from(ctx.max_per_gpu[k])));
                }
            }
        }
        ceil_eps(mem).max(ceil_eps(comp)).max(per)
    }

    /// Greedy packing of residual `r`: repeatedly the layout worth most under weights `w`
    /// (fewest free slices on ties), applied in halving batches.
    fn greedy(&self, r: &mut [u32], avail: &mut [Option<u32>], w: &[f64], out: &mut Vec<Gpu>) {
        loop {
            let mut best: Option<(f64, u32, usize, Alloc)> = None;
            for (ci, ctx) in self.ctxs.iter().enumerate() {
                if avail[ci] == Some(0) {
                    continue;
                }
                for pat in &ctx.patterns {
                    let alloc = self.alloc(ci, pat, r, None);
                    if alloc.is_empty() {
                        continue;
                    }
                    let value: f64 = alloc.iter().map(|&(c, _, n)| w[c] * f64::from(n)).sum();
                    let used: u32 = alloc
                        .iter()
                        .map(|&(_, k, n)| ctx.kinds[k].gi.memory_slices * n)
                        .sum();
                    let waste = ctx.geo.memory_slices.saturating_sub(used);
                    let better = match &best {
                        None => true,
                        Some((bv, bw, _, _)) => {
                            value > bv + 1e-12 || ((value - bv).abs() <= 1e-12 && waste < *bw)
                        }
                    };
                    if better {
                        best = Some((value, waste, ci, alloc));
                    }
                }
            }
            let Some((_, _, ci, alloc)) = best else {
                return;
            };
            let mut per_class: BTreeMap<usize, u32> = BTreeMap::new();
            for &(c, _, n) in &alloc {
                *per_class.entry(c).or_insert(0) += n;
            }
            let mut times = per_class.iter().map(|(&c, &n)| r[c] / n).min().unwrap_or(1);
            times = times.div_ceil(2).max(1);
            if let Some(a) = avail[ci] {
                times = times.min(a);
            }
            for (&c, &n) in &per_class {
                r[c] -= n * times;
            }
            if let Some(a) = avail[ci].as_mut() {
                *a -= times;
            }
            for _ in 0..times {
                out.push(Gpu {
                    ctx: ci,
                    alloc: alloc.clone(),
                });
            }
        }
    }

    /// The LP relaxation (solved through its dual). `with_avail`: honour fleet limits.
    fn lp(&self, with_avail: bool) -> Option<LpOut> {
        const UNMET_PENALTY: f64 = 16.0;
        let nc = self.classes.len();
        let mut ncols = nc;
        let mut v_col = Vec::new();
        for ctx in &self.ctxs {
            v_col.push(ncols);
            ncols += ctx.kinds.len();
        }
        let mut w_col = vec![None; self.ctxs.len()];
        for (ci, ctx) in self.ctxs.iter().enumerate() {
            if with_avail && ctx.avail.is_some() && !ctx.patterns.is_empty() {
                w_col[ci] = Some(ncols);
                ncols += 1;
            }
        }
        let mut obj = vec![0.0; ncols];
        for (c, cl) in self.classes.iter().enumerate() {
            obj[c] = f64::from(cl.demand);
        }
        for (ci, ctx) in self.ctxs.iter().enumerate() {
            if let (Some(col), Some(a)) = (w_col[ci], ctx.avail) {
                obj[col] = -f64::from(a);
            }
        }
        let mut rows: Vec<Vec<(usize, f64)>> = Vec::new();
        let mut rhs = Vec::new();
        let mut pattern_rows = Vec::new();
        for (ci, ctx) in self.ctxs.iter().enumerate() {
            let mut idx = Vec::new();
            for pat in &ctx.patterns {
                let mut row: Vec<(usize, f64)> = pat
                    .iter()
                    .enumerate()
                    .filter(|(_, n)| **n > 0)
                    .map(|(k, &n)| (v_col[ci] + k, f64::from(n)))
                    .collect();
                if let Some(col) = w_col[ci] {
                    row.push((col, -1.0));
                }
                idx.push(rows.len());
                rows.push(row);
                rhs.push(1.0);
            }
            pattern_rows.push(idx);
        }
        let mut link_rows: Vec<Vec<Option<usize>>> = vec![vec![None; nc]; self.ctxs.len()];
        for (ci, ctx) in self.ctxs.iter().enumerate() {
            if ctx.patterns.is_empty() {
                continue;
            }
            for (c, k) in ctx.class_kind.iter().enumerate() {
                if let Some(k) = k {
                    link_rows[ci][c] = Some(rows.len());
                    rows.push(vec![(c, 1.0), (v_col[ci] + k, -1.0)]);
                    rhs.push(0.0);
                }
            }
        }
        let unmet_start = rows.len();
        for c in 0..nc {
            rows.push(vec![(c, 1.0)]);
            rhs.push(UNMET_PENALTY);
        }
        let sol = lp_max(&obj, &rows, &rhs)?;
        let x = pattern_rows
            .iter()
            .map(|idx| idx.iter().map(|&r| sol.row_duals[r].max(0.0)).collect())
            .collect();
        let unmet: f64 = (unmet_start..rows.len())
            .map(|r| sol.row_duals[r].max(0.0))
            .sum();
        let z = link_rows
            .iter()
            .map(|per| {
                per.iter()
                    .map(|r| r.map_or(0.0, |r| sol.row_duals[r].max(0.0)))
                    .collect()
            })
            .collect();
        Some(LpOut {
            value: sol.value,
            y: sol.vars[..nc].to_vec(),
            x,
            z,
            unmet,
        })
    }

    /// Plans: LP rounding plus residual search, and a plain greedy; the better one.
    fn solve(&self, lp: Option<&LpOut>, target: u64) -> Vec<Gpu> {
        let nc = self.classes.len();
        let demand: Vec<u32> = self.classes.iter().map(|c| c.demand).collect();
        let avail0: Vec<Option<u32>> = self.ctxs.iter().map(|c| c.avail).collect();
        let w: Vec<f64> = (0..nc)
            .map(|c| {
                let y = lp.map_or(0.0, |l| l.y[c].max(0.0));
                y + 1e-3 * self.classes[c].mem_frac
            })
            .collect();

        let mut candidates: Vec<Vec<Gpu>> = Vec::new();
        if let Some(lp) = lp {
            let mut r = demand.clone();
            let mut avail = avail0.clone();
            let mut gpus = Vec::new();
            let mut quota = lp.z.clone();
            for (ci, xs) in lp.x.iter().enumerate() {
                let mut order: Vec<usize> = (0..xs.len()).collect();
                order.sort_by(|&a, &b| xs[b].total_cmp(&xs[a]).then(a.cmp(&b)));
                for p in order {
                    let mut n = (xs[p] + 1e-6).floor() as u64;
                    while n > 0 && avail[ci] != Some(0) {
                        let alloc =
                            self.alloc_quota(ci, &self.ctxs[ci].patterns[p], &r, &mut quota[ci]);
                        if alloc.is_empty() {
                            break;
                        }
                        for &(c, _, k) in &alloc {
                            r[c] -= k;
                        }
                        if let Some(a) = avail[ci].as_mut() {
                            *a -= 1;
                        }
                        gpus.push(Gpu { ctx: ci, alloc });
                        n -= 1;
                    }
                }
            }
            let floor_len = gpus.len() as u64;
            let mut rg = r.clone();
            let mut ag = avail.clone();
            let mut tail = Vec::new();
            self.greedy(&mut rg, &mut ag, &w, &mut tail);
            let served_all = rg.iter().all(|&n| n == 0);
            if served_all && floor_len + tail.len() as u64 > target {
                let goal = target.saturating_sub(floor_len);
                if let Some(better) = self.branch_and_bound(&r, &avail, tail.len(), goal) {
                    tail = better;
                }
            }
            gpus.extend(tail);
            candidates.push(gpus);
        }
        {
            let mut r = demand.clone();
            let mut avail = avail0.clone();
            let mut gpus = Vec::new();
            self.greedy(&mut r, &mut avail, &w, &mut gpus);
            candidates.push(gpus);
        }
        let score = |gpus: &Vec<Gpu>| -> (u64, usize, u64) {
            let mut served = vec![0u64; nc];
            let mut waste = 0u64;
            for g in gpus {
                let ctx = &self.ctxs[g.ctx];
                let mut used = 0u32;
                for &(c, k, n) in &g.alloc {
                    served[c] += u64::from(n);
                    used += ctx.kinds[k].gi.memory_slices * n;
                }
                waste += u64::from(ctx.geo.memory_slices.saturating_sub(used));
            }
            let unmet = (0..nc)
                .map(|c| u64::from(demand[c]).saturating_sub(served[c]))
                .sum();
            (unmet, gpus.len(), waste)
        };
        candidates
            .into_iter()
            .min_by_key(|g| score(g))
            .unwrap_or_default()
    }

    /// Depth-first branch-and-bound for residual `r` with fewer than `incumbent` GPUs; stops at
    /// `goal` GPUs or after a fixed number of nodes.
    fn branch_and_bound(
        &self,
        r: &[u32],
        avail: &[Option<u32>],
        incumbent: usize,
        goal: u64,
    ) -> Option<Vec<Gpu>> {
        let mut s = Bnb {
            p: self,
            nodes: 4000,
            best_len: incumbent,
            best: None,
            path: Vec::new(),
            seen: HashMap::new(),
            goal: goal as usize,
        };
        s.dfs(r.to_vec(), avail.to_vec());
        s.best
    }
}

fn ceil_eps(x: f64) -> u64 {
    let c = (x - 1e-7).ceil();
    if c <= 0.0 { 0 } else { c as u64 }
}

struct Bnb<'a> {
    p: &'a Problem,
    nodes: usize,
    best_len: usize,
    best: Option<Vec<Gpu>>,
    path: Vec<Gpu>,
    seen: HashMap<(Vec<u32>, Vec<Option<u32>>), usize>,
    goal: usize,
}

impl Bnb<'_> {
    fn dfs(&mut self, r: Vec<u32>, avail: Vec<Option<u32>>) {
        if self.best_len <= self.goal {
            return;
        }
        if r.iter().all(|&n| n == 0) {
            if self.path.len() < self.best_len {
                self.best_len = self.path.len();
                self.best = Some(self.path.clone());
            }
            return;
        }
        if self.nodes == 0 {
            return;
        }
        self.nodes -= 1;
        let depth = self.path.len();
        if depth as u64 + self.p.lb_units(&r) >= self.best_len as u64 {
            return;
        }
        let key = (r.clone(), avail.clone());
        if self.seen.get(&key).is_some_and(|&d| d <= depth) {
            return;
        }
        self.seen.insert(key, depth);

        // Branch on the biggest outstanding class: some GPU must serve it.
        let Some(cstar) = (0..r.len()).filter(|&c| r[c] > 0).max_by(|&a, &b| {
            let (ca, cb) = (&self.p.classes[a], &self.p.classes[b]);
            ca.mem_frac
                .total_cmp(&cb.mem_frac)
                .then(cb.options.cmp(&ca.options))
                .then(b.cmp(&a))
        }) else {
            return;
        };
        let mut children: Vec<(u64, u32, usize, Alloc, Vec<u32>)> = Vec::new();
        let mut child_seen: HashSet<(usize, Vec<u32>)> = HashSet::new();
        for (ci, ctx) in self.p.ctxs.iter().enumerate() {
            let Some(k) = ctx.class_kind[cstar] else {
                continue;
            };
            if avail[ci] == Some(0) {
                continue;
            }
            for pat in &ctx.patterns {
                if pat[k] == 0 {
                    continue;
                }
                let alloc = self.p.alloc(ci, pat, &r, Some(cstar));
                let mut r2 = r.clone();
                let mut used = 0u32;
                for &(c, kk, n) in &alloc {
                    r2[c] -= n;
                    used += ctx.kinds[kk].gi.memory_slices * n;
                }
                if !child_seen.insert((ci, r2.clone())) {
                    continue;
                }
                let lb = self.p.lb_units(&r2);
                children.push((
                    lb,
                    ctx.geo.memory_slices.saturating_sub(used),
                    ci,
                    alloc,
                    r2,
                ));
            }
        }
        children.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.cmp(&b.1)));
        for (lb, _, ci, alloc, r2) in children {
            if (depth + 1) as u64 + lb >= self.best_len as u64 {
                continue;
            }
            let mut a2 = avail.clone();
            if let Some(a) = a2[ci].as_mut() {
                *a -= 1;
            }
            self.path.push(Gpu { ctx: ci, alloc });
            self.dfs(r2, a2);
            self.path.pop();
            if self.nodes == 0 || self.best_len <= self.goal {
                return;
            }
        }
    }
}

// ------------------------------------------------------------------------------------------------
// A small dense simplex: max c·t s.t. G t <= h, t >= 0, with h >= 0 (the origin is feasible).
// ------------------------------------------------------------------------------------------------

struct LpOut {
    value: f64,
    /// Dual prices of the classes (GPU fraction per unit).
    y: Vec<f64>,
    /// Per ctx, per pattern: GPUs of that layout in the LP optimum.
    x: Vec<Vec<f64>>,
    /// Per ctx, per class: units the LP serves there.
    z: Vec<Vec<f64>>,
    /// Units the LP leaves unmet.
    unmet: f64,
}

struct LpSolution {
    value: f64,
    vars: Vec<f64>,
    /// The optimal dual value of each row (for our use: the primal cutting-stock variables).
    row_duals: Vec<f64>,
}

fn lp_max(c: &[f64], rows: &[Vec<(usize, f64)>], rhs: &[f64]) -> Option<LpSolution> {
    const EPS: f64 = 1e-9;
    let n = c.len();
    let m = rows.len();
    let w = n + m + 1;
    let mut t = vec![0.0f64; (m + 1) * w];
    for (j, &cj) in c.iter().enumerate() {
        t[j] = -cj;
    }
    for (i, row) in rows.iter().enumerate() {
        let base = (i + 1) * w;
        for &(j, v) in row {
            t[base + j] += v;
        }
        t[base + n + i] = 1.0;
        t[base + w - 1] = rhs[i];
    }
    let mut basis: Vec<usize> = (n..n + m).collect();
    let mut bland = false;
    let mut degenerate = 0usize;
    let mut pivot_row = vec![0.0f64; w];
    for _ in 0..50_000 {
        // Entering column.
        let mut enter = None;
        let mut most = -EPS;
        for (j, &v) in t[..n + m].iter().enumerate() {
            if v < most {
                enter = Some(j);
                if bland {
                    break;
                }
                most = v;
            }
        }
        let Some(j) = enter else {
            let mut vars = vec![0.0; n];
            for (i, &b) in basis.iter().enumerate() {
                if b < n {
                    vars[b] = t[(i + 1) * w + w - 1];
                }
            }
            return Some(LpSolution {
                value: t[w - 1],
                vars,
                row_duals: t[n..n + m].to_vec(),
            });
        };
        // Leaving row: minimum ratio, ties to the smallest basic index (Bland).
        let mut leave: Option<(usize, f64)> = None;
        for i in 0..m {
            let a = t[(i + 1) * w + j];
            if a > EPS {
                let ratio = t[(i + 1) * w + w - 1] / a;
                let better = match leave {
                    None => true,
                    Some((li, lr)) => {
                        ratio < lr - 1e-12 || (ratio <= lr + 1e-12 && basis[i] < basis[li])
                    }
                };
                if better {
                    leave = Some((i, ratio));
                }
            }
        }
        let (li, ratio) = leave?;
        if ratio <= EPS {
            degenerate += 1;
            if degenerate > 50 {
                bland = true;
            }
        } else {
            degenerate = 0;
        }
        let pr = (li + 1) * w;
        let piv = t[pr + j];
        for k in 0..w {
            t[pr + k] /= piv;
        }
        pivot_row.copy_from_slice(&t[pr..pr + w]);
        for r in 0..=m {
            if r == li + 1 {
                continue;
            }
            let base = r * w;
            let f = t[base + j];
            if f.abs() <= 1e-15 {
                continue;
            }
            for (k, &pv) in pivot_row.iter().enumerate() {
                if pv != 0.0 {
                    t[base + k] -= f * pv;
                }
            }
            t[base + j] = 0.0;
        }
        basis[li] = j;
    }
    None
}

// ------------------------------------------------------------------------------------------------
// Entry point
// ------------------------------------------------------------------------------------------------

/// Plans the fewest GPUs from `fleet` whose MIG layouts serve `demand`; see the module docs.
pub fn plan_fleet(demand: &Demand, fleet: &[FleetOffer]) -> Result<FleetPlan, WorkloadError> {
    if demand.items.is_empty() {
        return Err(WorkloadError::EmptyDemand);
    }
    if fleet.is_empty() {
        return Err(WorkloadError::EmptyFleet);
    }
    let mut p = Problem::build(demand, fleet)?;

    // Bounds.
    let (mut lower, mut reason) = p.simple_bound();
    let lp = p.lp(true);
    let layouts: usize = p.ctxs.iter().map(|c| c.patterns.len()).sum();
    let bound_lp = match &lp {
        Some(l) if l.unmet <= 1e-7 => Some(l.value),
        _ => p.lp(false).filter(|l| l.unmet <= 1e-7).map(|l| l.value),
    };
    if let Some(v) = bound_lp {
        let b = ceil_eps(v);
        if b > lower {
            reason = format!(
                "LP relaxation over {layouts} maximal layouts: {v:.2} GPUs -> at least {b} GPUs ({reason})"
            );
            lower = b;
        }
    }
    let lower = lower.max(1);

    if let Some(l) = &lp {
        p.prefer_by_price(&l.y);
    }
    let gpus = p.solve(lp.as_ref(), lower);
    p.assemble(demand, gpus, lower, reason)
}

impl Problem {
    /// The strongest of the memory-slice, compute-slice and per-profile bounds, with its reason.
    fn simple_bound(&self) -> (u64, String) {
        let single = if self.active_ctxs() == 1 {
            self.ctxs.iter().find(|c| !c.patterns.is_empty())
        } else {
            None
        };
        let mut best: (u64, String) = (0, String::new());
        let mut consider = |b: u64, why: String| {
            if b > best.0 || best.1.is_empty() {
                best = (b, why);
            }
        };
        if let Some(ctx) = single {
            let (mut mem, mut comp) = (0u64, 0u64);
            for (c, cl) in self.classes.iter().enumerate() {
                if let Some(k) = ctx.class_kind[c] {
                    mem += u64::from(cl.demand) * u64::from(ctx.kinds[k].gi.memory_slices);
                    comp += u64::from(cl.demand) * u64::from(ctx.kinds[k].gi.compute_slices);
                }
            }
            let (ms, cs) = (
                u64::from(ctx.geo.memory_slices),
                u64::from(ctx.geo.compute_slices),
            );
            let b = mem.div_ceil(ms);
            consider(
                b,
                format!("memory slices: {mem} needed, {ms} per GPU -> at least {b} GPUs"),
            );
            let b = comp.div_ceil(cs);
            consider(
                b,
                format!("compute slices: {comp} needed, {cs} per GPU -> at least {b} GPUs"),
            );
            for (k, list) in ctx.kind_classes.iter().enumerate() {
                let d: u64 = list
                    .iter()
                    .map(|&c| u64::from(self.classes[c].demand))
                    .sum();
                let m = u64::from(ctx.max_per_gpu[k]);
                if d > 0 && m > 0 {
                    let b = d.div_ceil(m);
                    consider(
                        b,
                        format!(
                            "{}: {d} needed, at most {m} per GPU -> at least {b} GPUs",
                            ctx.kinds[k].name
                        ),
                    );
                }
            }
        } else {
            let mem: f64 = self
                .classes
                .iter()
                .map(|c| f64::from(c.demand) * c.mem_frac)
                .sum();
            let comp: f64 = self
                .classes
                .iter()
                .map(|c| f64::from(c.demand) * c.comp_frac)
                .sum();
            let b = ceil_eps(mem);
            consider(
                b,
                format!(
                    "memory slices: {mem:.2} GPUs' worth even on each item's most compact model -> at least {b} GPUs"
                ),
            );
            let b = ceil_eps(comp);
            consider(
                b,
                format!(
                    "compute slices: {comp:.2} GPUs' worth even on each item's most compact model -> at least {b} GPUs"
                ),
            );
            for cl in &self.classes {
                let b = u64::from(cl.demand).div_ceil(u64::from(cl.max_per_gpu));
                let first = cl.items.first().copied().unwrap_or(0);
                consider(
                    b,
                    format!(
                        "item {first}: {} needed, at most {} per GPU on any model -> at least {b} GPUs",
                        cl.demand, cl.max_per_gpu
                    ),
                );
            }
        }
        best
    }

    /// Turns planned GPUs into the public plan: layouts, grouping, per-item service, unmet.
    fn assemble(
        &self,
        demand: &Demand,
        gpus: Vec<Gpu>,
        lower: u64,
        reason: String,
    ) -> Result<FleetPlan, WorkloadError> {
        // Group identical (model, kind counts), largest group first.
        let mut groups: Vec<(GroupKey, Vec<Gpu>)> = Vec::new();
        let mut index: HashMap<GroupKey, usize> = HashMap::new();
        for g in gpus {
            let mut counts = vec![0u32; self.ctxs[g.ctx].kinds.len()];
            for &(_, k, n) in &g.alloc {
                counts[k] += n;
            }
            if counts.iter().all(|&n| n == 0) {
                continue;
            }
            let key = (g.ctx, counts);
            match index.get(&key) {
                Some(&i) => groups[i].1.push(g),
                None => {
                    index.insert(key.clone(), groups.len());
                    groups.push((key, vec![g]));
                }
            }
        }
        let mut laid: Vec<(Layout, Vec<Gpu>, usize)> = Vec::new();
        for ((ci, counts), list) in groups {
            let ctx = &self.ctxs[ci];
            let placed = place(ctx.geo, &ctx.kinds, &counts).ok_or_else(|| {
                WorkloadError::Internal(format!(
                    "planned layout {counts:?} does not fit a {}",
                    ctx.model.key
                ))
            })?;
            let layout = Layout::new(
                placed
                    .into_iter()
                    .map(|(k, s)| Instance::new(ctx.kinds[k].name.clone(), s))
                    .collect(),
            );
            laid.push((layout, list, ci));
        }
        laid.sort_by(|a, b| {
            b.1.len()
                .cmp(&a.1.len())
                .then(a.2.cmp(&b.2))
                .then_with(|| a.0.to_string().cmp(&b.0.to_string()))
        });

        // Serve items of each class in order.
        let mut left: Vec<u32> = demand.items.iter().map(DemandItem::count).collect();
        let mut out = Vec::new();
        for (layout, list, ci) in laid {
            let ctx = &self.ctxs[ci];
            for g in list {
                let mut serves: Vec<(usize, String, u32)> = Vec::new();
                for &(c, k, n) in &g.alloc {
                    let mut need = n;
                    for &item in &self.classes[c].items {
                        if need == 0 {
                            break;
                        }
                        let t = need.min(left[item]);
                        if t == 0 {
                            continue;
                        }
                        left[item] -= t;
                        need -= t;
                        let name = &ctx.kinds[k].name;
                        match serves.iter_mut().find(|s| s.0 == item && s.1 == *name) {
                            Some(s) => s.2 += t,
                            None => serves.push((item, name.clone(), t)),
                        }
                    }
                }
                serves.sort();
                out.push(GpuAssignment {
                    model: ctx.model,
                    layout: layout.clone(),
                    serves,
                });
            }
        }
        let unmet: Vec<(usize, u32)> = left
            .iter()
            .enumerate()
            .filter(|(_, n)| **n > 0)
            .map(|(i, &n)| (i, n))
            .collect();
        let mut bound_reason = reason;
        if !unmet.is_empty() {
            let total: u64 = unmet.iter().map(|(_, n)| u64::from(*n)).sum();
            bound_reason.push_str(&format!(
                "; the fleet offered cannot serve it all: {total} units unmet"
            ));
        }
        Ok(FleetPlan {
            gpus: out,
            lower_bound: u32::try_from(lower).unwrap_or(u32::MAX),
            bound_reason,
            unmet,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A 4g.40gb sits at slot 0 only and a 2g.20gb cannot start at 6, so a GPU with a 4g holds
    /// one 2g: slices say 2 GPUs, placements say 3.
    const LP_CASE: &str = "3x 2g.20gb, 2x 4g.40gb";

    fn h100() -> &'static GpuModel {
        gpuops_catalog::lookup("H100-SXM5-80GB").unwrap()
    }

    fn plan(demand: &str, fleet: &str) -> FleetPlan {
        let d = parse_demand(demand).unwrap();
        let f = parse_fleet(fleet).unwrap();
        let p = plan_fleet(&d, &f).unwrap();
        check_plan(&d, &p);
        p
    }

    /// Independent checks: every layout obeys the hardware rules, serves match layouts, served
    /// devices suit their items, served + unmet = demand, the bound is not above the answer.
    fn check_plan(d: &Demand, p: &FleetPlan) {
        let mut served = vec![0u32; d.items.len()];
        for g in &p.gpus {
            let geo = g.model.mig.as_ref().unwrap();
            let mut occupied = vec![false; geo.memory_slices as usize];
            let mut compute = 0;
            let mut per_gi: BTreeMap<&str, u32> = BTreeMap::new();
            assert!(!g.layout.instances.is_empty());
            for inst in &g.layout.instances {
                let gi = gi_profile_of(g.model, &inst.profile)
                    .unwrap_or_else(|| panic!("{} not on {}", inst.profile, g.model.key));
                assert!(gi.placement_starts.contains(&inst.start), "{inst} start");
                for s in inst.start..inst.start + gi.memory_slices {
                    assert!(s < geo.memory_slices, "{inst} runs off the GPU");
                    assert!(!occupied[s as usize], "{} overlaps at {s}", g.layout);
                    occupied[s as usize] = true;
                }
                compute += gi.compute_slices;
                *per_gi.entry(gi.name).or_insert(0) += 1;
            }
            assert!(compute <= geo.compute_slices, "{} compute", g.layout);
            for (name, n) in per_gi {
                assert!(
                    n <= g.model.gi_profile(name).unwrap().max_count,
                    "{name} x{n}"
                );
            }
            let mut serve_counts: BTreeMap<String, u32> = BTreeMap::new();
            for (item, profile, n) in &g.serves {
                served[*item] += n;
                *serve_counts.entry(profile.clone()).or_insert(0) += n;
                match &d.items[*item] {
                    DemandItem::Profile { profile: want, .. } => assert_eq!(want, profile),
                    DemandItem::Memory { mib, .. } => {
                        let nominal = profile
                            .parse::<gpuops_catalog::ProfileName>()
                            .unwrap()
                            .memory_gb;
                        assert!(
                            u64::from(nominal) * 1024 >= *mib,
                            "{profile} too small for {mib} MiB"
                        );
                    }
                }
            }
            assert_eq!(serve_counts, g.layout.counts(), "serves match the layout");
        }
        for (i, item) in d.items.iter().enumerate() {
            let unmet: u32 = p.unmet.iter().filter(|u| u.0 == i).map(|u| u.1).sum();
            assert_eq!(served[i] + unmet, item.count(), "item {i} covered");
        }
        if p.unmet.is_empty() {
            assert!(
                p.gpus.len() as u32 >= p.lower_bound,
                "bound {} above answer {}",
                p.lower_bound,
                p.gpus.len()
            );
        }
        // Identical layouts are adjacent.
        let mut seen: Vec<(String, Layout)> = Vec::new();
        for w in p.gpus.windows(2) {
            if w[0].layout != w[1].layout || w[0].model.key != w[1].model.key {
                seen.push((w[0].model.key.to_string(), w[0].layout.clone()));
                assert!(
                    !seen.contains(&(w[1].model.key.to_string(), w[1].layout.clone())),
                    "layouts not grouped"
                );
            }
        }
    }

    #[test]
    fn parses_demand() {
        let d = parse_demand("12x 10GiB, 3x 40GiB").unwrap();
        assert_eq!(
            d.items,
            vec![
                DemandItem::Memory {
                    mib: 10240,
                    count: 12
                },
                DemandItem::Memory {
                    mib: 40960,
                    count: 3
                }
            ]
        );
        let d = parse_demand("7x 1g.10gb, 2x 3G.40GB; 1c.3g.40gb\n12 x 10GB, 3*512MiB, 2×1.5gib")
            .unwrap();
        assert_eq!(
            d.items,
            vec![
                DemandItem::Profile {
                    profile: "1g.10gb".into(),
                    count: 7
                },
                DemandItem::Profile {
                    profile: "3g.40gb".into(),
                    count: 2
                },
                DemandItem::Profile {
                    profile: "1c.3g.40gb".into(),
                    count: 1
                },
                DemandItem::Memory {
                    mib: 9537,
                    count: 12
                },
                DemandItem::Memory { mib: 512, count: 3 },
                DemandItem::Memory {
                    mib: 1536,
                    count: 2
                },
            ]
        );
        // describe_counts output and +me names round-trip.
        let d = parse_demand("2x 1g.10gb+me + 1x 3g.40gb").unwrap();
        assert_eq!(d.to_string(), "2x 1g.10gb+me, 1x 3g.40gb");
        assert_eq!(parse_demand("10gb").unwrap().items[0].count(), 1);
        assert_eq!(parse_demand("12X10GIB").unwrap().items[0].what(), "10GiB");
    }

    #[test]
    fn rejects_bad_demand() {
        assert_eq!(parse_demand("  , "), Err(WorkloadError::EmptyDemand));
        let cases = [
            ("12x 10", "no unit"),
            ("3x 10g", "ambiguous"),
            ("2x 10parsecs", "unknown memory unit"),
            ("0x 1g.10gb", "at least 1"),
            ("4x 3g.40", "gb"),
            ("4x", "nothing after the count"),
            ("5x foo", "expected a MIG profile"),
            ("99999999999x 1g.10gb", "too large"),
            ("2x 3c.4g.40gb", "compute instance"),
        ];
        for (text, want) in cases {
            let err = parse_demand(&format!("1x 1g.10gb, {text}")).unwrap_err();
            let msg = err.to_string();
            assert!(
                matches!(err, WorkloadError::BadDemandItem { index: 1, .. }),
                "{text}: {msg}"
            );
            assert!(msg.contains(want), "{text}: {msg}");
            assert!(msg.contains(text.trim()), "names the item: {msg}");
        }
    }

    #[test]
    fn parses_fleet() {
        let f = parse_fleet("H100-SXM5-80GB").unwrap();
        assert_eq!(f.len(), 1);
        assert_eq!(f[0].available, None);
        assert_eq!(f[0].model.key, "H100-SXM5-80GB");
        let f = parse_fleet("8x H100-SXM5-80GB, 4 x a100-sxm4-40gb").unwrap();
        assert_eq!(f[0].available, Some(8));
        assert_eq!(f[1].model.key, "A100-SXM4-40GB");
        assert_eq!(f[1].available, Some(4));
        match parse_fleet("2x H900") {
            Err(WorkloadError::UnknownModel { name, known }) => {
                assert_eq!(name, "H900");
                assert!(known.contains(&"H100-SXM5-80GB"));
            }
            other => panic!("{other:?}"),
        }
        assert!(
            parse_fleet("H900")
                .unwrap_err()
                .to_string()
                .contains("known models")
        );
        assert_eq!(parse_fleet(""), Err(WorkloadError::EmptyFleet));
    }

    #[test]
    fn plan_errors() {
        let f = parse_fleet("H100-SXM5-80GB").unwrap();
        assert_eq!(
            plan_fleet(&Demand::default(), &f),
            Err(WorkloadError::EmptyDemand)
        );
        let err = plan_fleet(&parse_demand("1x 1g.10gb, 2x 3g.20gb").unwrap(), &f).unwrap_err();
        assert!(
            matches!(&err, WorkloadError::UnknownProfile { index: 1, profile, .. } if profile == "3g.20gb"),
            "{err}"
        );
        assert!(err.to_string().contains("3g.40gb"), "lists offered: {err}");
        let err = plan_fleet(&parse_demand("1x 100GiB").unwrap(), &f).unwrap_err();
        assert!(
            matches!(err, WorkloadError::MemoryTooLarge { mib: 102400, .. }),
            "{err}"
        );
        assert!(err.to_string().contains("7g.80gb"), "{err}");
        let err = plan_fleet(
            &parse_demand("1x 10GiB").unwrap(),
            &parse_fleet("L4").unwrap(),
        )
        .unwrap_err();
        assert!(matches!(err, WorkloadError::NoMigModel { .. }), "{err}");
        assert_eq!(
            plan_fleet(&parse_demand("1x 10GiB").unwrap(), &[]),
            Err(WorkloadError::EmptyFleet)
        );
    }

    #[test]
    fn memory_maps_to_smallest_fitting_profile() {
        let m = h100();
        assert_eq!(profile_for_memory(m, 9537).unwrap().name, "1g.10gb");
        // Nominal sizes: 10 GiB is what 1g.10gb is sold as (its usable 9984 MiB is a bit less).
        assert_eq!(profile_for_memory(m, 10240).unwrap().name, "1g.10gb");
        assert_eq!(profile_for_memory(m, 10241).unwrap().name, "1g.20gb");
        assert_eq!(profile_for_memory(m, 20000).unwrap().name, "1g.20gb");
        assert_eq!(profile_for_memory(m, 40960).unwrap().name, "3g.40gb");
        assert_eq!(profile_for_memory(m, 40961).unwrap().name, "7g.80gb");
        assert!(profile_for_memory(m, 90000).is_none());
    }

    #[test]
    fn enumerates_layouts_exactly() {
        let m = h100();
        let geo = m.mig.as_ref().unwrap();
        let kinds: Vec<Kind> = geo
            .gi_profiles
            .iter()
            .map(|g| Kind {
                name: g.name.to_string(),
                gi: g,
            })
            .collect();
        let pats = enumerate_patterns(geo, &kinds);
        let idx = |n: &str| kinds.iter().position(|k| k.name == n).unwrap();
        let has = |spec: &[(&str, u32)]| {
            let mut v = vec![0u32; kinds.len()];
            for (n, c) in spec {
                v[idx(n)] = *c;
            }
            pats.contains(&v)
        };
        assert!(has(&[("1g.10gb", 7)]));
        assert!(has(&[("7g.80gb", 1)]));
        assert!(has(&[("3g.40gb", 2)]));
        assert!(has(&[("3g.40gb", 1), ("1g.10gb", 4)]));
        assert!(has(&[("4g.40gb", 1), ("3g.40gb", 1)]));
        assert!(has(&[("1g.10gb", 6), ("1g.10gb+me", 1)]));
        assert!(has(&[("1g.20gb", 4)]));
        assert!(has(&[("2g.20gb", 3), ("1g.20gb", 1)]));
        // 1g.10gb cannot use slot 7, so three 2g plus a 1g.10gb at 6 is maximal too.
        assert!(has(&[("2g.20gb", 3), ("1g.10gb", 1)]));
        // Not maximal: one 3g alone.
        assert!(!has(&[("3g.40gb", 1)]));
        assert!(pats.len() < 200, "{}", pats.len());
    }

    #[test]
    fn small_exact_cases() {
        let p = plan("7x 1g.10gb", "H100-SXM5-80GB");
        assert_eq!(p.gpus.len(), 1);
        assert!(p.proven_optimal());

        let p = plan("8x 1g.10gb", "H100-SXM5-80GB");
        assert_eq!(p.gpus.len(), 2);
        assert_eq!(p.lower_bound, 2);
        assert_eq!(
            p.bound_reason,
            "compute slices: 8 needed, 7 per GPU -> at least 2 GPUs"
        );

        let p = plan("3x 3g.40gb", "H100-SXM5-80GB");
        assert_eq!(p.gpus.len(), 2);
        assert_eq!(p.lower_bound, 2);

        let p = plan("1x 3g.40gb, 4x 1g.10gb", "H100-SXM5-80GB");
        assert_eq!(p.gpus.len(), 1);
        assert_eq!(
            p.gpus[0].layout.to_string(),
            "1g.10gb@0 1g.10gb@1 1g.10gb@2 1g.10gb@3 3g.40gb@4"
        );

        // 2g.20gb cannot start at 6, but a 2-slice 1g.20gb can: 3x 2g + 1g.20gb fills a GPU.
        let p = plan("3x 2g.20gb, 1x 1g.20gb", "H100-SXM5-80GB");
        assert_eq!(p.gpus.len(), 1);
        assert_eq!(
            p.gpus[0].layout.to_string(),
            "2g.20gb@0 2g.20gb@2 2g.20gb@4 1g.20gb@6"
        );
    }

    #[test]
    fn lp_bound_beats_simple_bounds() {
        let p = plan(LP_CASE, "H100-SXM5-80GB");
        assert!(
            p.bound_reason.starts_with("LP relaxation"),
            "{}",
            p.bound_reason
        );
        assert!(p.proven_optimal(), "{}", p.summary());
    }

    #[test]
    fn example_mix_on_h100() {
        let p = plan("12x 10GiB, 3x 40GiB", "H100-SXM5-80GB");
        println!("{}\n{}", p.summary(), p.mig_parted_yaml());
        // 10 GiB -> 1g.10gb, 40 GiB -> 3g.40gb: 12 + 12 memory slices = 3 GPUs.
        assert_eq!(p.lower_bound, 3);
        assert_eq!(p.gpus.len(), 3);
        assert!(p.proven_optimal());
        assert!(
            p.bound_reason
                .starts_with("memory slices: 24 needed, 8 per GPU")
        );
        // Beyond a nominal size, the next profile up.
        let p = plan("4x 11GiB", "H100-SXM5-80GB");
        assert_eq!(p.gpus.len(), 1);
        assert_eq!(p.gpus[0].layout.counts().get("1g.20gb"), Some(&4));

        let p = plan("12x 10GB, 3x 40GB", "H100-SXM5-80GB");
        println!("{}\n{}", p.summary(), p.mig_parted_yaml());
        assert_eq!(p.gpus.len(), 3);
        assert!(p.proven_optimal());
    }

    #[test]
    fn yaml_and_labels() {
        let p = plan("10x 1g.10gb, 3x 3g.40gb", "H100-SXM5-80GB");
        let y = p.mig_parted_yaml();
        assert!(y.contains("version: v1\n"), "{y}");
        for c in p.configs() {
            assert!(y.contains(&format!("  {}:\n", c.name)), "{y}");
            assert!(c.name.len() <= 63);
            assert!(c.name.starts_with("gpuops-h100-sxm5-80gb-"), "{}", c.name);
        }
        assert!(
            y.contains("device-filter: [\"0x233010DE\", \"0x232410DE\"]"),
            "{y}"
        );
        assert!(y.contains("\"1g.10gb\": "), "{y}");
        let labels = p.node_labels();
        assert_eq!(
            labels.iter().map(|l| l.1).sum::<u32>() as usize,
            p.gpus.len()
        );
        assert!(p.summary().contains("lower bound"));
        // The config text is a mig-parted v1 document our own parser reads back.
        let doc: serde_json::Value = serde_saphyr::from_str(&y).unwrap();
        let cfgs = doc["mig-configs"].as_object().unwrap();
        assert_eq!(cfgs.len(), p.configs().len());
        for (name, entries) in cfgs {
            let e = &entries[0];
            assert_eq!(e["devices"], "all", "{name}");
            assert_eq!(e["mig-enabled"], true);
            assert!(!e["mig-devices"].as_object().unwrap().is_empty());
        }
    }

    #[test]
    fn config_names_follow_label_rules() {
        let mut counts = BTreeMap::new();
        counts.insert("1g.10gb".to_string(), 2);
        counts.insert("3g.40gb".to_string(), 1);
        assert_eq!(
            config_name(h100(), &counts),
            "gpuops-h100-sxm5-80gb-2x1g.10gb-1x3g.40gb"
        );
        let mut many = BTreeMap::new();
        for p in [
            "1g.10gb",
            "1g.10gb+me",
            "1c.2g.20gb",
            "2g.20gb",
            "1c.3g.40gb",
        ] {
            many.insert(p.to_string(), 1);
        }
        let long = config_name(h100(), &many);
        assert!(long.len() <= 63, "{long}");
        assert!(
            long.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.')
        );
        assert!(long.chars().last().unwrap().is_ascii_alphanumeric());
        many.insert("1g.20gb".to_string(), 1);
        assert_ne!(long, config_name(h100(), &many), "hash keeps them distinct");
    }

    #[test]
    fn limited_fleet_reports_unmet() {
        let p = plan("20x 3g.40gb", "4x H100-SXM5-80GB");
        assert_eq!(p.gpus.len(), 4);
        assert_eq!(p.unmet, vec![(0, 12)]);
        assert_eq!(p.lower_bound, 10);
        assert!(p.bound_reason.contains("unmet"));
        assert!(!p.proven_optimal());
        assert!(p.summary().contains("unmet demand: item 0: 12"));

        let p = plan("4x 1g.10gb", "0x H100-SXM5-80GB");
        assert!(p.gpus.is_empty());
        assert_eq!(p.unmet, vec![(0, 4)]);
        assert!(p.mig_parted_yaml().contains("mig-configs: {}"));
    }

    #[test]
    fn mixed_fleet_uses_limits_then_the_rest() {
        // Only two H100s; the rest must go to A100 80GB (same profile names).
        let p = plan(
            "4x 3g.40gb, 14x 1g.10gb",
            "2x H100-SXM5-80GB, A100-SXM4-80GB",
        );
        let h = p
            .gpus
            .iter()
            .filter(|g| g.model.key == "H100-SXM5-80GB")
            .count();
        assert!(h <= 2);
        assert!(p.unmet.is_empty());
        assert_eq!(p.gpus.len() as u32, p.lower_bound, "{}", p.summary());

        // A profile only one model offers goes there; memory items map per model.
        let p = plan("2x 1g.5gb, 3x 15GiB", "A100-SXM4-40GB, H200");
        assert!(p.unmet.is_empty());
        for g in &p.gpus {
            for (item, profile, _) in &g.serves {
                if *item == 0 {
                    assert_eq!(g.model.key, "A100-SXM4-40GB");
                    assert_eq!(profile, "1g.5gb");
                }
            }
        }
        let y = p.mig_parted_yaml();
        assert!(y.contains("0x20B010DE") || y.contains("0x233510DE"), "{y}");
    }

    #[test]
    fn ci_variants_share_the_gi_limit() {
        // 3g.40gb and 1c.3g.40gb share the 3g GI: at most two per GPU together.
        let p = plan("2x 3g.40gb, 2x 1c.3g.40gb", "H100-SXM5-80GB");
        assert_eq!(p.gpus.len(), 2);
        let y = p.mig_parted_yaml();
        assert!(y.contains("\"1c.3g.40gb\": "), "{y}");
    }

    /// Deterministic pseudo-random mixes: plans are feasible, cover demand, and stay close to the
    /// lower bound.
    #[test]
    fn random_mixes_are_feasible_and_near_the_bound() {
        let names = [
            "1g.10gb",
            "1g.10gb+me",
            "1g.20gb",
            "2g.20gb",
            "3g.40gb",
            "4g.40gb",
            "7g.80gb",
            "1c.3g.40gb",
            "2c.4g.40gb",
            "5GiB",
            "10GiB",
            "9GB",
            "15GiB",
            "19GB",
            "30GiB",
            "70GiB",
        ];
        let fleets = [
            "H100-SXM5-80GB",
            "H100-SXM5-80GB, H200",
            "300x H100-SXM5-80GB, H200",
            "50x H100-SXM5-80GB, 40x A100-SXM4-80GB, H200",
            "A100-SXM4-40GB, H100-SXM5-80GB",
        ];
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut rnd = |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        let (mut planned, mut optimal) = (0, 0);
        for round in 0..150 {
            let kinds = 1 + rnd(8) as usize;
            let scale = [5, 40, 400][round % 3];
            let mut parts = Vec::new();
            for _ in 0..kinds {
                let name = names[rnd(names.len() as u64) as usize];
                parts.push(format!("{}x {name}", 1 + rnd(scale)));
            }
            let text = parts.join(", ");
            let fleet = fleets[rnd(fleets.len() as u64) as usize];
            let d = parse_demand(&text).unwrap();
            let Ok(p) = plan_fleet(&d, &parse_fleet(fleet).unwrap()) else {
                continue; // e.g. 1g.10gb+me on a fleet without it
            };
            check_plan(&d, &p);
            if !p.unmet.is_empty() {
                continue;
            }
            planned += 1;
            let gap = p.gpus.len() as u64 - u64::from(p.lower_bound);
            assert!(gap <= 1, "{text} on {fleet}: {}", p.summary());
            if gap == 0 {
                optimal += 1;
            }
        }
        println!("{optimal} of {planned} random mixes proven optimal, the rest within 1 GPU");
        assert!(
            planned > 100 && optimal * 10 >= planned * 9,
            "{optimal}/{planned}"
        );
    }

    #[test]
    fn thousand_gpu_mix_is_fast_enough_in_tests() {
        let text = "1200x 1g.10gb, 100x 1g.10gb+me, 800x 1g.20gb, 700x 2g.20gb, 200x 1c.2g.20gb, \
                    500x 3g.40gb, 100x 1c.3g.40gb, 100x 2c.3g.40gb, 100x 4g.40gb, 50x 7g.80gb";
        let p = plan(text, "H100-SXM5-80GB");
        assert!(p.gpus.len() > 900, "{}", p.gpus.len());
        assert!(p.gpus.len() as u32 <= p.lower_bound + 3, "{}", p.summary());
        assert!(p.configs().len() < 40);
    }
}
