//! The replay's output: a table, CSV (one row per policy, or the hourly series) and an SVG of
//! GPUs bought against GPUs requested over time.

use crate::sim::Replay;
use std::fmt::Write as _;

/// `1.2k`-free fixed formatting for the table.
fn f(v: f64, digits: usize) -> String {
    format!("{v:.digits$}")
}

/// A plain-text table, one row per policy, then what the numbers mean.
pub fn table(r: &Replay) -> String {
    let mut s = format!(
        "{} trace pods: {} GPU pods replayed, {} CPU-only and {} without a lifetime left out; MIG re-partitioning {}\n\n",
        r.trace_pods,
        r.gpu_pods,
        r.skipped_cpu_only,
        r.skipped_no_lifetime,
        if r.mig { "on" } else { "off" }
    );
    let head = [
        "policy",
        "GPU-h bought",
        "GPU-h requested",
        "ratio",
        "cost",
        "pending pod-h",
        "wait p50",
        "wait p99",
        "scale-ups",
        "nodes",
        "removed",
        "MIG changes",
        "evictions",
        "unschedulable",
    ];
    let rows: Vec<Vec<String>> = r
        .runs
        .iter()
        .map(|x| {
            vec![
                x.policy.name().to_string(),
                f(x.gpu_hours_bought, 0),
                f(x.gpu_hours_requested, 0),
                f(x.ratio, 2),
                f(x.cost, 0),
                f(x.pending_pod_hours, 1),
                format!("{}s", f(x.wait_p50_s, 0)),
                format!("{}s", f(x.wait_p99_s, 0)),
                x.scale_ups.to_string(),
                x.nodes_bought.to_string(),
                x.nodes_removed.to_string(),
                x.mig_changes.to_string(),
                x.evictions.to_string(),
                (x.pods_unschedulable + x.pods_stuck).to_string(),
            ]
        })
        .collect();
    let widths: Vec<usize> = (0..head.len())
        .map(|c| {
            rows.iter()
                .map(|r| r[c].len())
                .chain([head[c].len()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let line = |cells: Vec<&str>| -> String {
        cells
            .iter()
            .enumerate()
            .map(|(c, v)| {
                if c == 0 {
                    format!("{v:<w$}", w = widths[c])
                } else {
                    format!("{v:>w$}", w = widths[c])
                }
            })
            .collect::<Vec<_>>()
            .join("  ")
            .trim_end()
            .to_string()
    };
    let _ = writeln!(s, "{}", line(head.to_vec()));
    for row in &rows {
        let _ = writeln!(s, "{}", line(row.iter().map(String::as_str).collect()));
    }
    s.push_str(
        "\nratio = GPU-hours bought / GPU-hours requested (1.00 is the limit: every GPU bought was asked for every second).\n",
    );
    s
}

/// One CSV row per policy.
pub fn csv(r: &Replay) -> String {
    let mut s = String::from(
        "policy,gpu_hours_bought,gpu_hours_requested,ratio,cost,pending_pod_hours,wait_p50_s,wait_p99_s,wait_max_s,scale_ups,nodes_bought,nodes_removed,mig_changes,evictions,pods_run,pods_unschedulable,pods_stuck,hours\n",
    );
    for x in &r.runs {
        let _ = writeln!(
            s,
            "{},{:.3},{:.3},{:.4},{:.2},{:.3},{:.1},{:.1},{:.1},{},{},{},{},{},{},{},{},{:.2}",
            x.policy.name(),
            x.gpu_hours_bought,
            x.gpu_hours_requested,
            x.ratio,
            x.cost,
            x.pending_pod_hours,
            x.wait_p50_s,
            x.wait_p99_s,
            x.wait_max_s,
            x.scale_ups,
            x.nodes_bought,
            x.nodes_removed,
            x.mig_changes,
            x.evictions,
            x.pods_run,
            x.pods_unschedulable,
            x.pods_stuck,
            x.hours
        );
    }
    s
}

/// Bought GPUs per policy and requested GPUs (the same for every policy up to waits), per
/// simulated day (means), as an SVG line chart.
pub fn svg(r: &Replay) -> String {
    const W: f64 = 900.0;
    const H: f64 = 420.0;
    const L: f64 = 60.0;
    const B: f64 = 40.0;
    let colors = ["#d62728", "#1f77b4", "#2ca02c", "#9467bd"];
    let day = |v: &[f64]| -> Vec<f64> {
        v.chunks(24)
            .map(|c| c.iter().sum::<f64>() / c.len().max(1) as f64)
            .collect()
    };
    let mut lines: Vec<(String, Vec<f64>)> = r
        .runs
        .iter()
        .map(|x| {
            (
                format!("bought: {}", x.policy.name()),
                day(&x.series.bought),
            )
        })
        .collect();
    if let Some(x) = r.runs.first() {
        lines.push(("requested".into(), day(&x.series.requested)));
    }
    let days = lines.iter().map(|l| l.1.len()).max().unwrap_or(1).max(2);
    let top = lines
        .iter()
        .flat_map(|l| l.1.iter().copied())
        .fold(1.0f64, f64::max)
        * 1.1;
    let x = |i: usize| L + (W - L - 20.0) * i as f64 / (days - 1) as f64;
    let y = |v: f64| H - B - (H - B - 20.0) * v / top;
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{W}\" height=\"{H}\" font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
    );
    let _ = writeln!(
        s,
        "<line x1=\"{L}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"black\"/><line x1=\"{L}\" y1=\"20\" x2=\"{L}\" y2=\"{}\" stroke=\"black\"/>",
        H - B,
        W - 20.0,
        H - B,
        H - B
    );
    for k in 0..=4 {
        let v = top / 4.0 * f64::from(k);
        let _ = writeln!(
            s,
            "<text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\">{v:.0}</text>",
            L - 5.0,
            y(v) + 4.0
        );
    }
    let _ = writeln!(
        s,
        "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">simulated day (0 - {})</text><text x=\"15\" y=\"{}\" transform=\"rotate(-90 15 {})\" text-anchor=\"middle\">GPUs (daily mean)</text>",
        (L + W) / 2.0,
        H - 8.0,
        days - 1,
        H / 2.0,
        H / 2.0
    );
    for (k, (name, v)) in lines.iter().enumerate() {
        let color = if name == "requested" {
            "black"
        } else {
            colors[k % colors.len()]
        };
        let pts: Vec<String> = v
            .iter()
            .enumerate()
            .map(|(i, v)| format!("{:.1},{:.1}", x(i), y(*v)))
            .collect();
        let dash = if name == "requested" {
            " stroke-dasharray=\"4 3\""
        } else {
            ""
        };
        let _ = writeln!(
            s,
            "<polyline fill=\"none\" stroke=\"{color}\" stroke-width=\"1.5\"{dash} points=\"{}\"/>",
            pts.join(" ")
        );
        let _ = writeln!(
            s,
            "<text x=\"{}\" y=\"{}\" fill=\"{color}\">{name}</text>",
            L + 10.0,
            35.0 + 15.0 * k as f64
        );
    }
    s.push_str("</svg>\n");
    s
}
