//! Rendering of simulation results as a text table, CSV and a hand-written SVG plot. Pure: every
//! function returns a `String`.

use crate::simulate::{Progress, SimConfig, Simulation};
use std::fmt::Write as _;

/// A fixed-width text table: one row per policy with mean allocation and unallocated GPU % at the
/// final load, their spread over seeds and the mean number of dropped pods.
#[must_use]
pub fn table(sim: &Simulation) -> String {
    let mut s = String::new();
    let seeds = sim.summaries.first().map_or(0, |x| x.per_seed.len());
    let _ = writeln!(
        s,
        "GPU allocation at {:.0}% arrived workload (mean of {seeds} seed{}):",
        sim.load * 100.0,
        if seeds == 1 { "" } else { "s" }
    );
    let _ = writeln!(
        s,
        "{:<14} {:>11} {:>14} {:>9} {:>9} {:>12}",
        "policy", "allocated %", "unallocated %", "min", "max", "failed pods"
    );
    for x in &sim.summaries {
        let _ = writeln!(
            s,
            "{:<14} {:>11.2} {:>14.2} {:>9.2} {:>9.2} {:>12.1}",
            x.policy.name(),
            x.mean_allocation_pct,
            x.mean_unallocated_pct,
            x.min_unallocated_pct,
            x.max_unallocated_pct,
            x.mean_pods_failed
        );
    }
    s
}

/// CSV of every curve: `policy,seed,arrived_pct,allocation_pct`, per seed and `mean`.
#[must_use]
pub fn csv(sim: &Simulation) -> String {
    let mut s = String::from("policy,seed,arrived_pct,allocation_pct\n");
    for r in &sim.runs {
        for (k, a) in r.curve.iter().enumerate() {
            let _ = writeln!(s, "{},{},{k},{a:.4}", r.policy.name(), r.seed);
        }
    }
    for x in &sim.summaries {
        for (k, a) in x.mean_curve.iter().enumerate() {
            let _ = writeln!(s, "{},mean,{k},{a:.4}", x.policy.name());
        }
    }
    s
}

/// CSV of the final figures: `policy,seed,allocation_pct,unallocated_pct,pods_failed`.
#[must_use]
pub fn summary_csv(sim: &Simulation) -> String {
    let mut s = String::from("policy,seed,allocation_pct,unallocated_pct,pods_failed\n");
    for r in &sim.runs {
        let _ = writeln!(
            s,
            "{},{},{:.4},{:.4},{}",
            r.policy.name(),
            r.seed,
            r.allocation_pct,
            r.unallocated_pct,
            r.pods_failed
        );
    }
    s
}

const COLORS: [&str; 8] = [
    "#7f7f7f", "#1f77b4", "#2ca02c", "#9467bd", "#ff7f0e", "#d62728", "#000000", "#8c564b",
];

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// An SVG line plot of the mean allocation curve of each policy against arrived workload, with
/// the ideal (all arrived GPU allocated, capped at 100%) as a dashed line and an inset legend with
/// the final unallocated %.
#[must_use]
pub fn svg(sim: &Simulation) -> String {
    let (w, h) = (760.0_f64, 480.0_f64);
    let (left, right, top, bottom) = (60.0, 200.0, 30.0, 50.0);
    let pw = w - left - right;
    let ph = h - top - bottom;
    let xmax = (sim.load * 100.0).max(1.0);
    let x = |v: f64| left + pw * v / xmax;
    let y = |v: f64| top + ph * (1.0 - v / 100.0);
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="{w}" height="{h}" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="{}" y="18" text-anchor="middle" font-size="14">GPU allocation vs arrived workload</text>"#,
        left + pw / 2.0
    );
    // Grid and ticks.
    let mut t = 0.0;
    while t <= xmax + 1e-9 {
        let _ = writeln!(
            s,
            r##"<line x1="{0:.1}" y1="{1:.1}" x2="{0:.1}" y2="{2:.1}" stroke="#e0e0e0"/><text x="{0:.1}" y="{3:.1}" text-anchor="middle">{4}</text>"##,
            x(t),
            y(0.0),
            y(100.0),
            y(0.0) + 16.0,
            t
        );
        t += 10.0;
    }
    for v in (0..=100).step_by(10) {
        let v = f64::from(v);
        let _ = writeln!(
            s,
            r##"<line x1="{0:.1}" y1="{1:.1}" x2="{2:.1}" y2="{1:.1}" stroke="#e0e0e0"/><text x="{3:.1}" y="{4:.1}" text-anchor="end">{5}</text>"##,
            x(0.0),
            y(v),
            x(xmax),
            x(0.0) - 6.0,
            y(v) + 4.0,
            v
        );
    }
    let _ = writeln!(
        s,
        r##"<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="none" stroke="#333"/>"##
    );
    let _ = writeln!(
        s,
        r#"<text x="{}" y="{}" text-anchor="middle">arrived workload (% of cluster GPU capacity)</text>"#,
        left + pw / 2.0,
        h - 12.0
    );
    let _ = writeln!(
        s,
        r#"<text x="16" y="{}" text-anchor="middle" transform="rotate(-90 16 {})">GPU allocation (%)</text>"#,
        top + ph / 2.0,
        top + ph / 2.0
    );
    // Ideal line.
    let _ = writeln!(
        s,
        r##"<polyline fill="none" stroke="#aaaaaa" stroke-dasharray="4 3" points="{:.1},{:.1} {:.1},{:.1} {:.1},{:.1}"/>"##,
        x(0.0),
        y(0.0),
        x(100.0_f64.min(xmax)),
        y(100.0_f64.min(xmax)),
        x(xmax),
        y(100.0_f64.min(xmax))
    );
    for (i, sum) in sim.summaries.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let pts: Vec<String> = sum
            .mean_curve
            .iter()
            .enumerate()
            .map(|(k, a)| format!("{:.1},{:.1}", x(k as f64), y(*a)))
            .collect();
        let _ = writeln!(
            s,
            r#"<polyline fill="none" stroke="{color}" stroke-width="1.5" points="{}"/>"#,
            pts.join(" ")
        );
        let ly = top + 14.0 + 18.0 * i as f64;
        let lx = left + pw + 12.0;
        let _ = writeln!(
            s,
            r#"<line x1="{lx}" y1="{ly}" x2="{}" y2="{ly}" stroke="{color}" stroke-width="2"/><text x="{}" y="{}">{} ({:.2}% unalloc.)</text>"#,
            lx + 18.0,
            lx + 22.0,
            ly + 4.0,
            esc(sum.policy.name()),
            sum.mean_unallocated_pct
        );
    }
    s.push_str("</svg>\n");
    s
}

/// `12.3s` under a minute, else `4m05s`.
pub fn secs(s: f64) -> String {
    if s < 60.0 {
        format!("{s:.1}s")
    } else {
        format!("{}m{:02}s", (s / 60.0).floor(), (s % 60.0).floor())
    }
}

/// The progress line said before the runs start.
pub fn start_line(config: &SimConfig, nodes: usize, pods: usize) -> String {
    let runs_total = config.policies.len() * config.seeds.len();
    format!(
        "simulating {nodes} nodes, {pods} trace pods, load {:.0}%: {} polic{} x {} seed{} = {runs_total} run{}",
        config.load * 100.0,
        config.policies.len(),
        if config.policies.len() == 1 {
            "y"
        } else {
            "ies"
        },
        config.seeds.len(),
        if config.seeds.len() == 1 { "" } else { "s" },
        if runs_total == 1 { "" } else { "s" },
    )
}

/// The progress line of a finished run: `done` runs finished after `elapsed` seconds.
pub fn run_done_line(p: &Progress, done: usize, elapsed: f64) -> String {
    let eta = elapsed / done as f64 * (p.runs_total.saturating_sub(done)) as f64;
    format!(
        "[{done}/{}] {} seed {} done ({} pods)  elapsed {}  ETA {}",
        p.runs_total,
        p.policy.name(),
        p.seed,
        p.pods_total,
        secs(elapsed),
        secs(eta)
    )
}

/// The summary table, then the mean allocation curve at every 10% of arrived workload.
pub fn text(sim: &Simulation, nodes: usize, pods: usize) -> String {
    let mut s = format!(
        "{nodes} nodes, {} GPUs, {pods} trace pods\n\n",
        sim.gpu_capacity_milli / 1000
    );
    s.push_str(&table(sim));
    let max = (sim.load * 100.0).round() as usize;
    let steps: Vec<usize> = (10..=max)
        .step_by(10)
        .chain((!max.is_multiple_of(10)).then_some(max))
        .collect();
    let _ = writeln!(
        s,
        "\nGPU allocation % by arrived workload (% of GPU capacity, mean over seeds):"
    );
    let _ = write!(s, "{:<14}", "policy");
    for k in &steps {
        let _ = write!(s, " {:>6}", format!("{k}%"));
    }
    s.push('\n');
    for x in &sim.summaries {
        let _ = write!(s, "{:<14}", x.policy.name());
        for &k in &steps {
            let v = x
                .mean_curve
                .get(k)
                .or(x.mean_curve.last())
                .copied()
                .unwrap_or(0.0);
            let _ = write!(s, " {v:>6.1}");
        }
        s.push('\n');
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::PolicyKind;
    use crate::simulate::{RunResult, summarize};

    fn sim() -> Simulation {
        let runs: Vec<RunResult> = [(PolicyKind::Fgd, 1, 90.0), (PolicyKind::Fgd, 2, 92.0)]
            .iter()
            .map(|&(p, seed, a)| RunResult {
                policy: p,
                seed,
                curve: vec![0.0, 1.0, a],
                allocation_pct: a,
                unallocated_pct: 100.0 - a,
                pods_arrived: 10,
                pods_failed: 1,
                failed_gpu_milli: 100,
            })
            .collect();
        Simulation {
            load: 0.02,
            gpu_capacity_milli: 1000,
            summaries: vec![summarize(PolicyKind::Fgd, &runs)],
            runs,
        }
    }

    #[test]
    fn table_csv_svg() {
        let s = sim();
        let t = table(&s);
        assert!(t.contains("FGD"), "{t}");
        assert!(t.contains("91.00"), "{t}");
        assert!(t.contains("9.00"), "{t}");
        let c = csv(&s);
        assert!(c.starts_with("policy,seed,arrived_pct,allocation_pct\n"));
        assert!(c.contains("FGD,1,2,90.0000"));
        assert!(c.contains("FGD,mean,2,91.0000"));
        assert!(summary_csv(&s).contains("FGD,2,92.0000,8.0000,1"));
        let g = svg(&s);
        assert!(g.starts_with("<svg") && g.trim_end().ends_with("</svg>"));
        assert!(g.contains("FGD (9.00% unalloc.)"));
        assert_eq!(g.matches("<polyline").count(), 2);
    }

    #[test]
    fn durations_read_as_seconds_then_minutes() {
        assert_eq!(secs(12.34), "12.3s");
        assert_eq!(secs(245.0), "4m05s");
    }
}
