//! Parsing a workload mix: the demand ("12x 10GiB, 3x 3g.40gb") and the fleet ("8x H100-SXM5-80GB").

use crate::MigError;
use gpuops_catalog::{GpuModel, ProfileName};
use std::fmt;

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
/// text without such a prefix is returned whole with no count. `bad` turns a reason into the
/// error of the list the item is in.
fn split_count<'a>(
    item: &'a str,
    bad: &dyn Fn(String) -> MigError,
) -> Result<(Option<u32>, &'a str), MigError> {
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
    let count: u32 = digits.parse().map_err(|_| {
        bad(format!(
            "count {digits} is too large (at most {})",
            u32::MAX
        ))
    })?;
    let what = after.trim();
    if what.is_empty() {
        return Err(bad(format!("nothing after the count {digits}x")));
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
fn parse_memory(s: &str, bad: &dyn Fn(String) -> MigError) -> Result<u64, MigError> {
    let t = s.trim();
    let num_end = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = (&t[..num_end], t[num_end..].trim());
    if num.is_empty() {
        return Err(bad(format!(
            "expected a MIG profile (e.g. 3g.40gb) or a memory size (e.g. 10GiB), got {t:?}"
        )));
    }
    let value: f64 = num
        .parse()
        .map_err(|_| bad(format!("invalid number {num:?} in memory size")))?;
    let mib_per_unit = match unit.to_ascii_lowercase().as_str() {
        "mib" | "mi" => 1.0,
        "gib" | "gi" => 1024.0,
        "tib" | "ti" => 1024.0 * 1024.0,
        "mb" => 1e6 / 1_048_576.0,
        "gb" => 1e9 / 1_048_576.0,
        "tb" => 1e12 / 1_048_576.0,
        "" => {
            return Err(bad(format!(
                "memory size {num} has no unit: write GiB, GB or MiB (e.g. {num}GiB)"
            )));
        }
        "g" | "m" | "t" => {
            return Err(bad(format!(
                "ambiguous unit {unit:?}: write {u}iB (binary) or {u}B (decimal)",
                u = unit.to_ascii_uppercase()
            )));
        }
        other => {
            return Err(bad(format!(
                "unknown memory unit {other:?}: use GiB, GB, MiB, MB, TiB or TB"
            )));
        }
    };
    let mib = (value * mib_per_unit - 1e-9).ceil();
    if !mib.is_finite() || mib < 1.0 {
        return Err(bad("memory size must be at least 1 MiB".into()));
    }
    if mib > 1e12 {
        return Err(bad(format!("memory size {t} is implausibly large")));
    }
    Ok(mib as u64)
}

/// Parses one demand item's text (already split from its neighbours), the `index`th of its list.
fn parse_demand_item(index: usize, item: &str) -> Result<DemandItem, MigError> {
    let bad = |reason: String| MigError::BadDemandItem {
        index,
        item: item.to_string(),
        reason,
    };
    let (count, what) = split_count(item, &bad)?;
    let count = count.unwrap_or(1);
    if count == 0 {
        return Err(bad("count must be at least 1".into()));
    }
    if looks_like_profile(what) {
        let name: ProfileName = what
            .parse()
            .map_err(|e: gpuops_catalog::ProfileNameError| {
                bad(format!("invalid MIG profile name: {}", e.kind))
            })?;
        Ok(DemandItem::Profile {
            profile: name.to_string(),
            count,
        })
    } else {
        Ok(DemandItem::Memory {
            mib: parse_memory(what, &bad)?,
            count,
        })
    }
}

/// Parses demand such as `12x 10GiB, 3x 40GiB`, `7x 1g.10gb, 2x 3g.40gb`, `12 x 10GB`,
/// `2x 1g.10gb + 1x 3g.40gb` or mixes. Items are separated by `,`, `;`, newlines or a stand-alone
/// `+`; an item without a count means one. Units: GiB/GB/MiB/MB/TiB/TB (case-insensitive).
pub fn parse_demand(text: &str) -> Result<Demand, MigError> {
    let mut items = Vec::new();
    for (index, item) in split_list(text).into_iter().enumerate() {
        items.push(parse_demand_item(index, &item)?);
    }
    if items.is_empty() {
        return Err(MigError::EmptyDemand);
    }
    Ok(Demand { items })
}

/// Parses a fleet such as `H100-SXM5-80GB` (as many as needed) or
/// `8x H100-SXM5-80GB, 4x A100-SXM4-40GB`. Models are catalog keys or NVML names.
pub fn parse_fleet(text: &str) -> Result<Vec<FleetOffer>, MigError> {
    let mut out = Vec::new();
    for item in split_list(text) {
        let bad = |reason: String| MigError::BadFleetItem {
            item: item.clone(),
            reason,
        };
        let (count, name) = split_count(&item, &bad)?;
        let model = gpuops_catalog::lookup(name).map_err(|_| MigError::UnknownModel {
            name: name.to_string(),
            known: gpuops_catalog::known_keys(),
        })?;
        out.push(FleetOffer {
            model,
            available: count,
        });
    }
    if out.is_empty() {
        return Err(MigError::EmptyFleet);
    }
    Ok(out)
}
