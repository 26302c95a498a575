//! Which resource labels a node gets under MIG strategy none, single or mixed.

use super::resource::{self, GPU_RESOURCE};
use super::{Labels, put};
use crate::error::LabelError;
use crate::keys;
use gpuops_inventory::{Gpu, MigDevice};
use gpuops_resources::model::{mig_profile_name, mig_resource_name};
use gpuops_resources::{Config, MigStrategy};
use std::collections::BTreeMap;

/// The resource labels for `gpus` (sorted by index, not empty) under `cfg`.
pub(super) fn resource_labels(gpus: &[&Gpu], cfg: &Config) -> Result<Labels, LabelError> {
    let mut out = whole_gpu_labels(gpus, cfg)?;
    match cfg.mig_strategy() {
        MigStrategy::None => {}
        MigStrategy::Single => {
            put(&mut out, keys::MIG_STRATEGY, "single");
            single(&mut out, gpus, cfg)?;
        }
        MigStrategy::Mixed => {
            put(&mut out, keys::MIG_STRATEGY, "mixed");
            for (profile, (parent, mig, count)) in by_profile(gpus) {
                let name = mig_resource_name(&profile);
                resource::mig_profile(&mut out, &name, parent, mig, count, cfg)?;
            }
        }
    }
    Ok(out)
}

/// `nvidia.com/gpu.*` from the GPUs seen whole, under every strategy.
///
/// As GFD: GPUs are grouped by name, and `count` is the number of GPUs with that name, MIG enabled
/// or not. Groups with MIG enabled are labelled first and without sharing (replicas 0); groups
/// without MIG then overwrite them with the sharing config applied. Within a group the last GPU
/// describes it. With several GPU names GFD's winner depends on Go map order; here the group
/// holding the lowest-index GPU wins.
fn whole_gpu_labels(gpus: &[&Gpu], cfg: &Config) -> Result<Labels, LabelError> {
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    // name -> (lowest index, last GPU), for MIG-enabled and for whole GPUs.
    let mut groups: [BTreeMap<&str, (u32, &Gpu)>; 2] = [BTreeMap::new(), BTreeMap::new()];
    for &g in gpus {
        *counts.entry(g.name.as_str()).or_default() += 1;
        let group = &mut groups[usize::from(!g.mig.current_enabled)];
        group
            .entry(g.name.as_str())
            .and_modify(|e| e.1 = g)
            .or_insert((g.index, g));
    }
    let mut out = Labels::new();
    for (group, sharing) in groups.iter().zip([None, Some(cfg)]) {
        let mut ordered: Vec<(&str, &(u32, &Gpu))> = group.iter().map(|(n, e)| (*n, e)).collect();
        ordered.sort_by_key(|(_, (first, _))| std::cmp::Reverse(*first));
        for (name, (_, rep)) in ordered {
            let count = counts.get(name).copied().unwrap_or_default();
            resource::whole_gpu(&mut out, rep, count, sharing)?;
        }
    }
    Ok(out)
}

/// MIG devices grouped by profile (as named in resources, `+` as `.`), each with the first device
/// (and its parent) in GPU-index then MIG-index order, and the count.
fn by_profile<'a>(gpus: &[&'a Gpu]) -> BTreeMap<String, (&'a Gpu, &'a MigDevice, usize)> {
    let mut out: BTreeMap<String, (&Gpu, &MigDevice, usize)> = BTreeMap::new();
    for g in gpus.iter().filter(|g| g.mig.current_enabled) {
        let mut migs: Vec<&MigDevice> = g.mig_devices.iter().collect();
        migs.sort_by_key(|m| m.index);
        for m in migs {
            let profile = mig_profile_name(m).replace('+', ".");
            out.entry(profile).or_insert((g, m, 0)).2 += 1;
        }
    }
    out
}

/// Strategy single: MIG devices become `nvidia.com/gpu` when every GPU has MIG enabled, has MIG
/// devices, and they all share one profile; otherwise the `-MIG-INVALID` labels. No MIG anywhere:
/// the whole-GPU labels stand.
fn single(out: &mut Labels, gpus: &[&Gpu], cfg: &Config) -> Result<(), LabelError> {
    let Some(first_mig) = gpus.iter().find(|g| g.mig.current_enabled) else {
        return Ok(());
    };
    let empty = gpus
        .iter()
        .any(|g| g.mig.current_enabled && g.mig_devices.is_empty());
    let mixed_modes = gpus.iter().any(|g| !g.mig.current_enabled);
    let profiles = by_profile(gpus);
    match profiles.values().next() {
        Some((parent, mig, count)) if !empty && !mixed_modes && profiles.len() == 1 => {
            resource::mig_profile(out, GPU_RESOURCE, parent, mig, *count, cfg)
        }
        _ => {
            resource::invalid_single(out, first_mig);
            Ok(())
        }
    }
}
