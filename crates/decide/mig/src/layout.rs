//! Layouts: which MIG devices a GPU has, each a GPU instance at a placement with one compute instance.

use gpuops_catalog::{GiProfile, GpuModel, ProfileName};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;

/// One MIG device: a GPU instance of `profile`'s GI part placed at `start` (memory slices), with one
/// compute instance of `profile`'s C part (the whole GI when the name has no `Cc.` prefix).
///
/// This is what a mig-parted `mig-devices` entry of count N creates N times.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Instance {
    /// Canonical MIG device name, e.g. `1g.10gb`, `1g.10gb+me`, `1c.3g.40gb`.
    pub profile: String,
    /// First memory slice.
    pub start: u32,
}

impl Instance {
    pub fn new(profile: impl Into<String>, start: u32) -> Instance {
        Instance {
            profile: profile.into(),
            start,
        }
    }

    /// The GPU-instance part of the profile (`3g.40gb` for `1c.3g.40gb`).
    pub fn gi_profile(&self) -> String {
        gi_part(&self.profile)
    }
}

impl fmt::Display for Instance {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}@{}", self.profile, self.start)
    }
}

/// The GI part of a MIG device name; names that do not parse are returned unchanged so the caller's
/// own validation reports them.
pub fn gi_part(profile: &str) -> String {
    profile
        .parse::<ProfileName>()
        .map(|p| p.gi_name().to_string())
        .unwrap_or_else(|_| profile.to_string())
}

/// A whole GPU's MIG devices, sorted by start then name (the canonical order everywhere).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Layout {
    pub instances: Vec<Instance>,
}

impl Layout {
    pub fn new(mut instances: Vec<Instance>) -> Layout {
        instances.sort();
        instances.sort_by(|a, b| {
            a.start
                .cmp(&b.start)
                .then_with(|| a.profile.cmp(&b.profile))
        });
        Layout { instances }
    }

    pub fn is_empty(&self) -> bool {
        self.instances.is_empty()
    }

    /// Count of each MIG device profile, e.g. `{"1g.10gb": 2, "3g.40gb": 1}`.
    pub fn counts(&self) -> BTreeMap<String, u32> {
        let mut m = BTreeMap::new();
        for i in &self.instances {
            *m.entry(i.profile.clone()).or_insert(0) += 1;
        }
        m
    }
}

impl fmt::Display for Layout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.instances.is_empty() {
            return write!(f, "(empty)");
        }
        let parts: Vec<String> = self.instances.iter().map(ToString::to_string).collect();
        write!(f, "{}", parts.join(" "))
    }
}

/// `2x 1g.10gb + 1x 3g.40gb`, in name order.
pub fn describe_counts(counts: &BTreeMap<String, u32>) -> String {
    if counts.is_empty() {
        return "no MIG devices".into();
    }
    counts
        .iter()
        .map(|(p, n)| format!("{n}x {p}"))
        .collect::<Vec<_>>()
        .join(" + ")
}

/// The catalog GI profile of a MIG device name on a model (`None`: the model has no such profile).
pub fn gi_profile_of<'m>(model: &'m GpuModel, profile: &str) -> Option<&'m GiProfile> {
    model.gi_profile(&gi_part(profile))
}

/// One line per memory slice, e.g. for H100 with `1g.10gb@0 1g.10gb@1 2g.20gb@2 3g.40gb@4`:
///
/// ```text
/// slot  0        1        2        3        4        5        6        7
///       1g.10gb  1g.10gb  2g.20gb  ·······  3g.40gb  ·······  ·······  ·······
/// ```
///
/// A `·` run continues the instance to its left; `-` is a free slice.
pub fn slot_map(model: &GpuModel, layout: &Layout) -> String {
    let slices = model.mig.as_ref().map_or(8, |m| m.memory_slices) as usize;
    let mut cells = vec!["-".to_string(); slices];
    for inst in &layout.instances {
        let size = gi_profile_of(model, &inst.profile).map_or(1, |p| p.memory_slices) as usize;
        let start = inst.start as usize;
        for (offset, cell) in cells.iter_mut().skip(start).take(size).enumerate() {
            *cell = if offset == 0 {
                inst.profile.clone()
            } else {
                "·".into()
            };
        }
    }
    let width = cells
        .iter()
        .map(|c| c.chars().count())
        .max()
        .unwrap_or(1)
        .max(2);
    let head: Vec<String> = (0..slices).map(|s| format!("{s:<width$}")).collect();
    let row: Vec<String> = cells
        .iter()
        .map(|c| {
            if c == "·" {
                "·".repeat(width)
            } else {
                format!("{c:<width$}")
            }
        })
        .collect();
    format!(
        "slot  {}\n      {}",
        head.join("  ").trim_end(),
        row.join("  ").trim_end()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_sort_and_count() {
        let l = Layout::new(vec![
            Instance::new("3g.40gb", 4),
            Instance::new("1g.10gb", 1),
            Instance::new("1g.10gb", 0),
        ]);
        assert_eq!(l.to_string(), "1g.10gb@0 1g.10gb@1 3g.40gb@4");
        assert_eq!(describe_counts(&l.counts()), "2x 1g.10gb + 1x 3g.40gb");
        assert_eq!(Instance::new("1c.3g.40gb", 0).gi_profile(), "3g.40gb");
    }

    #[test]
    fn slot_map_marks_each_slice() {
        let h100 = gpuops_catalog::lookup("H100-SXM5-80GB").unwrap();
        let l = Layout::new(vec![
            Instance::new("2g.20gb", 2),
            Instance::new("3g.40gb", 4),
        ]);
        let map = slot_map(h100, &l);
        let lines: Vec<&str> = map.lines().collect();
        assert!(lines[0].starts_with("slot  0"), "{map}");
        assert!(lines[1].starts_with("      -"), "{map}");
        assert!(
            lines[1].contains("2g.20gb  ·······  3g.40gb  ·······  ·······  ·······"),
            "{map}"
        );
    }
}
