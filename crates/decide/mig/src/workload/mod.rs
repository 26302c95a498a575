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

mod demand;
mod lp;
mod patterns;
mod plan;
mod problem;
mod search;
#[cfg(test)]
mod tests;

pub use demand::{Demand, DemandItem, FleetOffer, parse_demand, parse_fleet};
pub use plan::{FleetPlan, GpuAssignment, PlanConfig, config_name};

use crate::MigError;
use crate::layout::{Instance, Layout};
use patterns::place;
use problem::{Gpu, GroupKey, Problem, ceil_eps};
use std::collections::HashMap;

/// Plans the fewest GPUs from `fleet` whose MIG layouts serve `demand`; see the module docs.
pub fn plan_fleet(demand: &Demand, fleet: &[FleetOffer]) -> Result<FleetPlan, MigError> {
    if demand.items.is_empty() {
        return Err(MigError::EmptyDemand);
    }
    if fleet.is_empty() {
        return Err(MigError::EmptyFleet);
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
    ) -> Result<FleetPlan, MigError> {
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
                MigError::Internal(format!(
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
