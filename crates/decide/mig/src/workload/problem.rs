//! Setting up the problem: demand items grouped into classes, each fleet model's device kinds and
//! maximal layouts, and the allocation of a layout's devices to the demand.

use super::demand::{Demand, DemandItem, FleetOffer};
use super::patterns::{Kind, enumerate_patterns};
use crate::MigError;
use gpuops_catalog::{GiProfile, GpuModel, MigGeometry, ProfileName};

/// One fleet model's part of the problem.
#[derive(Debug)]
pub(super) struct Ctx {
    pub(super) model: &'static GpuModel,
    pub(super) geo: &'static MigGeometry,
    pub(super) avail: Option<u32>,
    pub(super) kinds: Vec<Kind>,
    /// Per class: the kind serving it on this model.
    pub(super) class_kind: Vec<Option<usize>>,
    /// Per kind: the classes it serves, most constrained first.
    pub(super) kind_classes: Vec<Vec<usize>>,
    /// Maximal feasible layouts as counts per kind.
    pub(super) patterns: Vec<Vec<u32>>,
    /// Per kind: the most devices one GPU can hold.
    pub(super) max_per_gpu: Vec<u32>,
}

/// Demand items with the same mapping on every model.
#[derive(Debug)]
pub(super) struct Class {
    pub(super) items: Vec<usize>,
    pub(super) demand: u32,
    /// Models that can serve it.
    pub(super) options: usize,
    /// Smallest fraction of a GPU's memory / compute slices one unit takes on any model.
    pub(super) mem_frac: f64,
    pub(super) comp_frac: f64,
    /// Most units of it one GPU of any model can hold.
    pub(super) max_per_gpu: u32,
}

/// `(class, kind, count)` allocations of one GPU's devices.
pub(super) type Alloc = Vec<(usize, usize, u32)>;

/// A planned GPU: its model context and `(class, kind, count)` allocations.
#[derive(Debug, Clone)]
pub(super) struct Gpu {
    pub(super) ctx: usize,
    pub(super) alloc: Alloc,
}

/// A model context and per-kind device counts: one distinct layout.
pub(super) type GroupKey = (usize, Vec<u32>);

pub(super) struct Problem {
    pub(super) ctxs: Vec<Ctx>,
    pub(super) classes: Vec<Class>,
}

/// The smallest plain profile on `model` whose nominal size (the NN of `NNgb`, in GiB) is at
/// least `mib` MiB. Nominal, because that is how people and NVIDIA's names size instances
/// ("a 10 GB slice" is `1g.10gb`); the usable memory is a few percent less (an H100 `1g.10gb` has
/// 9.75 GiB), which the plan's summary says.
pub(super) fn profile_for_memory(model: &GpuModel, mib: u64) -> Option<&'static GiProfile> {
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

/// A MIG-capable model of the fleet: its geometry and how many GPUs (`None`: unlimited).
type MigOffer = (&'static GpuModel, &'static MigGeometry, Option<u32>);

/// Per MIG model, the device kind (name, GI profile) a demand item maps to there, `None` where
/// the model cannot serve it.
type Signature = Vec<Option<(String, &'static GiProfile)>>;

/// Demand item `index` mapped onto each MIG model; an error naming what is offered when no
/// model can serve it.
fn signature(index: usize, item: &DemandItem, mig: &[MigOffer]) -> Result<Signature, MigError> {
    let sig: Signature = match item {
        DemandItem::Profile { profile, .. } => {
            let name: ProfileName =
                profile
                    .parse()
                    .map_err(
                        |e: gpuops_catalog::ProfileNameError| MigError::BadDemandItem {
                            index,
                            item: item.to_string(),
                            reason: format!("invalid MIG profile name: {}", e.kind),
                        },
                    )?;
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
            DemandItem::Profile { profile, .. } => MigError::UnknownProfile {
                index,
                item: item.to_string(),
                profile: profile.clone(),
                offered: mig
                    .iter()
                    .map(|(m, g, _)| {
                        let names: Vec<&str> = g.gi_profiles.iter().map(|p| p.name).collect();
                        format!("{}: {}", m.key, names.join(", "))
                    })
                    .collect(),
            },
            DemandItem::Memory { mib, .. } => MigError::MemoryTooLarge {
                index,
                item: item.to_string(),
                mib: *mib,
                largest: mig
                    .iter()
                    .filter_map(|(m, g, _)| {
                        g.gi_profiles
                            .iter()
                            .max_by_key(|p| p.memory_mib)
                            .map(|p| format!("{}: {} ({} MiB)", m.key, p.name, p.memory_mib))
                    })
                    .collect(),
            },
        });
    }
    Ok(sig)
}

impl Problem {
    pub(super) fn build(demand: &Demand, fleet: &[FleetOffer]) -> Result<Problem, MigError> {
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
        let mig: Vec<MigOffer> = offers
            .iter()
            .filter_map(|&(m, a)| m.mig.as_ref().map(|g| (m, g, a)))
            .collect();
        if mig.is_empty() {
            return Err(MigError::NoMigModel {
                models: offers.iter().map(|o| o.0.key).collect(),
                mig_models: gpuops_catalog::models()
                    .iter()
                    .filter(|m| m.mig_capable())
                    .map(|m| m.key)
                    .collect(),
            });
        }

        // Map each item on each model to a device kind (name, GI profile).
        let mut signatures: Vec<Signature> = Vec::new();
        for (index, item) in demand.items.iter().enumerate() {
            signatures.push(signature(index, item, &mig)?);
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
            return Err(MigError::EmptyDemand);
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
                return Err(MigError::Internal(format!(
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
    pub(super) fn prefer_by_price(&mut self, y: &[f64]) {
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
    pub(super) fn active_ctxs(&self) -> usize {
        self.ctxs.iter().filter(|c| !c.patterns.is_empty()).count()
    }

    /// Allocates one GPU of `pat` on ctx `ci` to residual demand `r`, `first` served first.
    pub(super) fn alloc(&self, ci: usize, pat: &[u32], r: &[u32], first: Option<usize>) -> Alloc {
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
    pub(super) fn alloc_quota(
        &self,
        ci: usize,
        pat: &[u32],
        r: &[u32],
        quota: &mut [f64],
    ) -> Alloc {
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
    pub(super) fn lb_units(&self, r: &[u32]) -> u64 {
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
}

pub(super) fn ceil_eps(x: f64) -> u64 {
    let c = (x - 1e-7).ceil();
    if c <= 0.0 { 0 } else { c as u64 }
}
