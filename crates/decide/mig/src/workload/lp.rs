//! A small dense simplex: max c·t s.t. G t <= h, t >= 0, with h >= 0 (the origin is feasible).

pub(super) struct LpOut {
    pub(super) value: f64,
    /// Dual prices of the classes (GPU fraction per unit).
    pub(super) y: Vec<f64>,
    /// Per ctx, per pattern: GPUs of that layout in the LP optimum.
    pub(super) x: Vec<Vec<f64>>,
    /// Per ctx, per class: units the LP serves there.
    pub(super) z: Vec<Vec<f64>>,
    /// Units the LP leaves unmet.
    pub(super) unmet: f64,
}

pub(super) struct LpSolution {
    pub(super) value: f64,
    pub(super) vars: Vec<f64>,
    /// The optimal dual value of each row (for our use: the primal cutting-stock variables).
    pub(super) row_duals: Vec<f64>,
}

pub(super) fn lp_max(c: &[f64], rows: &[Vec<(usize, f64)>], rhs: &[f64]) -> Option<LpSolution> {
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
