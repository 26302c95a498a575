//! Finding few GPUs: greedy packing by the LP's prices, rounding the LP solution, and a bounded
//! branch-and-bound over the residual demand.

use super::lp::{LpOut, lp_max};
use super::problem::{Alloc, Gpu, Problem};
use std::collections::{BTreeMap, HashMap, HashSet};

impl Problem {
    /// Greedy packing of residual `r`: repeatedly the layout worth most under weights `w`
    /// (fewest free slices on ties), applied in halving batches.
    pub(super) fn greedy(
        &self,
        r: &mut [u32],
        avail: &mut [Option<u32>],
        w: &[f64],
        out: &mut Vec<Gpu>,
    ) {
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
    pub(super) fn lp(&self, with_avail: bool) -> Option<LpOut> {
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
    pub(super) fn solve(&self, lp: Option<&LpOut>, target: u64) -> Vec<Gpu> {
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
    pub(super) fn branch_and_bound(
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

pub(super) struct Bnb<'a> {
    pub(super) p: &'a Problem,
    pub(super) nodes: usize,
    pub(super) best_len: usize,
    pub(super) best: Option<Vec<Gpu>>,
    pub(super) path: Vec<Gpu>,
    pub(super) seen: HashMap<(Vec<u32>, Vec<Option<u32>>), usize>,
    pub(super) goal: usize,
}

impl Bnb<'_> {
    pub(super) fn dfs(&mut self, r: Vec<u32>, avail: Vec<Option<u32>>) {
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
