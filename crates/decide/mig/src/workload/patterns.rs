//! Enumerating the feasible layouts of the demanded device kinds on one GPU geometry, with real
//! placements (a backtracking search over placement starts with a bitmask of occupied slices).

use gpuops_catalog::{GiProfile, MigGeometry};
use std::collections::HashSet;

/// A MIG device kind on one model: its name and GPU-instance profile.
#[derive(Debug, Clone)]
pub(super) struct Kind {
    pub(super) name: String,
    pub(super) gi: &'static GiProfile,
}

/// Places `counts` of `kinds` on a GPU: `(kind, start)` per device, or `None` if it does not fit.
/// Largest devices first, each at its lowest free valid start, backtracking.
pub(super) fn place(
    geo: &MigGeometry,
    kinds: &[Kind],
    counts: &[u32],
) -> Option<Vec<(usize, u32)>> {
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

pub(super) fn place_rec(
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
pub(super) fn enumerate_patterns(geo: &MigGeometry, kinds: &[Kind]) -> Vec<Vec<u32>> {
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

pub(super) fn enum_rec(
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
