//! `gpuops simulate` on small hand-written traces: table, CSV, SVG and JSON outputs agree, and bad
//! inputs fail with messages that name the flag, the file, the line and the column.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::path::{Path, PathBuf};

const NODES: &str = "sn,cpu_milli,memory_mib,gpu,model
n0,32000,131072,2,T4
n1,32000,131072,4,T4
n2,64000,262144,8,V100
n3,16000,65536,1,P100
";

const PODS: &str = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time
p0,4000,8192,1,500,,LS,Running,0,10,0
p1,2000,4096,1,250,,LS,Running,0,10,0
p2,8000,16384,1,1000,,LS,Running,0,10,0
p3,8000,16384,2,1000,,LS,Running,0,10,0
p4,1000,2048,1,810,,LS,Running,0,10,0
p5,1000,2048,0,0,,LS,Running,0,10,0
p6,4000,8192,1,1000,V100,LS,Running,0,10,0
p7,2000,4096,1,300,T4|V100,LS,Running,0,10,0
";

fn fixtures() -> (tempfile::TempDir, PathBuf, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let nodes = dir.path().join("nodes.csv");
    let pods = dir.path().join("pods.csv");
    std::fs::write(&nodes, NODES).unwrap();
    std::fs::write(&pods, PODS).unwrap();
    (dir, nodes, pods)
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn table_csv_svg_and_json_agree() {
    let (dir, nodes, pods) = fixtures();
    let csv = dir.path().join("curves.csv");
    let summary = dir.path().join("summary.csv");
    let plot = dir.path().join("plot.svg");
    let o = common::run(&[
        "simulate",
        "--nodes",
        s(&nodes),
        "--pods",
        s(&pods),
        "--policy",
        "bestfit,fgd,ours",
        "--seeds",
        "1-3",
        "--csv",
        s(&csv),
        "--summary-csv",
        s(&summary),
        "--plot",
        s(&plot),
    ]);
    let out = String::from_utf8_lossy(&o.stdout).to_string();
    assert!(o.status.success(), "{}", common::text(&o));
    // Progress goes to stderr only when asked for (or on a terminal).
    assert!(!String::from_utf8_lossy(&o.stderr).contains("ETA"));
    assert!(out.starts_with("4 nodes, 15 GPUs, 8 trace pods"), "{out}");
    assert!(out.contains("GPU allocation at 130% arrived workload (mean of 3 seeds)"));
    for p in ["BestFit", "FGD", "Ours"] {
        assert_eq!(
            out.matches(p).count(),
            2,
            "{p} in the table and the curve: {out}"
        );
    }
    assert!(!out.contains("Random"));
    // The curve header has 10% steps up to the load.
    let curve_header = out
        .lines()
        .find(|l| l.starts_with("policy") && l.contains("10%"))
        .unwrap();
    assert!(curve_header.trim_end().ends_with("130%"), "{curve_header}");

    // The summary CSV has one row per run and its unallocated % match the table's means.
    let summary = std::fs::read_to_string(&summary).unwrap();
    let mut lines = summary.lines();
    assert_eq!(
        lines.next(),
        Some("policy,seed,allocation_pct,unallocated_pct,pods_failed")
    );
    let rows: Vec<Vec<String>> = lines
        .map(|l| l.split(',').map(str::to_string).collect())
        .collect();
    assert_eq!(rows.len(), 9);
    for policy in ["BestFit", "FGD", "Ours"] {
        let un: Vec<f64> = rows
            .iter()
            .filter(|r| r[0] == policy)
            .map(|r| r[3].parse().unwrap())
            .collect();
        let mean = un.iter().sum::<f64>() / un.len() as f64;
        let row = out
            .lines()
            .find(|l| l.split_whitespace().next() == Some(policy))
            .unwrap();
        let cols: Vec<&str> = row.split_whitespace().collect();
        assert_eq!(cols[2], format!("{mean:.2}"), "{row} vs {un:?}");
    }

    // Curves: per seed and mean, 0..=130 arrived %.
    let curves = std::fs::read_to_string(&csv).unwrap();
    assert!(curves.starts_with("policy,seed,arrived_pct,allocation_pct\n"));
    assert_eq!(curves.lines().count(), 1 + 3 * (3 + 1) * 131);
    assert!(curves.contains("FGD,mean,130,"));

    let svg = std::fs::read_to_string(&plot).unwrap();
    assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
    assert!(svg.contains("Ours ("));

    // JSON: the same runs.
    let o = common::run(&[
        "simulate",
        "--nodes",
        s(&nodes),
        "--pods",
        s(&pods),
        "--policy",
        "fgd",
        "--seeds",
        "7",
        "--load",
        "1.0",
        "-o",
        "json",
        "--progress",
    ]);
    assert!(o.status.success(), "{}", common::text(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["runs"].as_array().unwrap().len(), 1);
    assert_eq!(v["runs"][0]["seed"], 7);
    assert_eq!(v["runs"][0]["curve"].as_array().unwrap().len(), 101);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(stderr.contains("[1/1] FGD seed 7 done"), "{stderr}");
    assert!(stderr.contains("ETA"), "{stderr}");
}

#[test]
fn the_same_seed_gives_the_same_figures() {
    let (_dir, nodes, pods) = fixtures();
    let args = [
        "simulate",
        "--nodes",
        s(&nodes),
        "--pods",
        s(&pods),
        "--seeds",
        "42-43",
        "--threads",
        "2",
    ];
    let a = common::run(&args);
    let b = common::run(&args);
    assert!(a.status.success(), "{}", common::text(&a));
    assert_eq!(a.stdout, b.stdout);
    // All seven policies by default.
    let out = String::from_utf8_lossy(&a.stdout);
    for p in [
        "Random",
        "DotProd",
        "GpuClustering",
        "GpuPacking",
        "BestFit",
        "FGD",
        "Ours",
    ] {
        assert!(out.contains(p), "{p}: {out}");
    }
}

#[test]
fn bad_inputs_are_named() {
    let (dir, nodes, pods) = fixtures();
    // Missing flags name the flag and where the traces are.
    let o = common::run(&["simulate", "--pods", s(&pods)]);
    assert!(!o.status.success());
    let t = common::text(&o);
    assert!(t.contains("--nodes FILE is required"), "{t}");
    assert!(t.contains("openb_node_list_gpu_node.csv"), "{t}");
    let o = common::run(&["simulate", "--nodes", s(&nodes)]);
    assert!(common::text(&o).contains("--pods FILE is required"));

    // A bad row: file, line and column.
    let bad = dir.path().join("bad_pods.csv");
    let text = PODS.replace("p4,1000,2048,1,810", "p4,1000,2048,1,abc");
    std::fs::write(&bad, text).unwrap();
    let o = common::run(&["simulate", "--nodes", s(&nodes), "--pods", s(&bad)]);
    assert!(!o.status.success());
    let t = common::text(&o);
    assert!(t.contains(&format!("{}:6:", bad.display())), "{t}");
    assert!(t.contains("gpu_milli"), "{t}");
    assert!(t.contains("abc"), "{t}");

    // An unterminated quote used to drop the rows after it silently; now the row is refused.
    let quoted = dir.path().join("quoted_pods.csv");
    std::fs::write(&quoted, PODS.replace("p3,8000", "\"p3,8000")).unwrap();
    let o = common::run(&["simulate", "--nodes", s(&nodes), "--pods", s(&quoted)]);
    assert!(!o.status.success());
    let t = common::text(&o);
    assert!(
        t.contains(&format!(
            "{}:5: column name: a quoted value runs past",
            quoted.display()
        )),
        "{t}"
    );
    // So is a row with a column too few.
    let short = dir.path().join("short_pods.csv");
    std::fs::write(
        &short,
        PODS.replace("p5,1000,2048,0,0,,LS,", "p5,1000,2048,0,0,LS,"),
    )
    .unwrap();
    let t = common::text(&common::run(&[
        "simulate",
        "--nodes",
        s(&nodes),
        "--pods",
        s(&short),
    ]));
    assert!(
        t.contains(&format!(
            "{}:7: row has 10 fields, header has 11",
            short.display()
        )),
        "{t}"
    );

    let bad_nodes = dir.path().join("bad_nodes.csv");
    std::fs::write(&bad_nodes, "sn,cpu_milli,memory_mib,gpu\nn0,1,1,1\n").unwrap();
    let t = common::text(&common::run(&[
        "simulate",
        "--nodes",
        s(&bad_nodes),
        "--pods",
        s(&pods),
    ]));
    assert!(t.contains("--nodes: "), "{t}");
    assert!(t.contains("model"), "{t}");

    let t = common::text(&common::run(&[
        "simulate",
        "--nodes",
        s(&dir.path().join("missing.csv")),
        "--pods",
        s(&pods),
    ]));
    assert!(t.contains("--nodes: cannot read"), "{t}");
    assert!(t.contains("missing.csv"), "{t}");

    // Unknown policy lists the valid ones; bad seeds and load.
    let t = common::text(&common::run(&[
        "simulate",
        "--nodes",
        s(&nodes),
        "--pods",
        s(&pods),
        "--policy",
        "fgd,tetris",
    ]));
    assert!(t.contains("unknown policy \"tetris\""), "{t}");
    assert!(t.contains("random, dotprod, gpuclustering, gpupacking, bestfit, fgd, ours, all"));
    let t = common::text(&common::run(&[
        "simulate",
        "--nodes",
        s(&nodes),
        "--pods",
        s(&pods),
        "--seeds",
        "9-3",
    ]));
    assert!(
        t.contains("--seeds") && t.contains("bad seeds \"9-3\""),
        "{t}"
    );
    let t = common::text(&common::run(&[
        "simulate",
        "--nodes",
        s(&nodes),
        "--pods",
        s(&pods),
        "--load",
        "0",
    ]));
    assert!(t.contains("--load 0"), "{t}");
}

#[test]
fn help_teaches_where_the_traces_are() {
    let o = common::run(&["simulate", "--help"]);
    let t = common::text(&o);
    assert!(o.status.success());
    assert!(
        t.contains("/work/shared/traces/openb/openb_node_list_gpu_node.csv"),
        "{t}"
    );
    assert!(t.contains("Examples:"));
}

/// The paper's trace, when this machine has it (GPUOPS_TRACES_DIR or /work/shared/traces):
/// FGD and ours on one seed, ours leaving less GPU unallocated.
#[test]
fn openb_default_trace_when_present() {
    let dir = std::env::var_os("GPUOPS_TRACES_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/work/shared/traces"))
        .join("openb");
    let nodes = dir.join("openb_node_list_gpu_node.csv");
    let pods = dir.join("openb_pod_list_default.csv");
    if !nodes.exists() || !pods.exists() {
        eprintln!("no openb traces in {}: nothing to compare", dir.display());
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let summary = dir.path().join("s.csv");
    let o = common::run(&[
        "simulate",
        "--nodes",
        s(&nodes),
        "--pods",
        s(&pods),
        "--policy",
        "fgd,ours",
        "--seeds",
        "42",
        "--summary-csv",
        s(&summary),
    ]);
    assert!(o.status.success(), "{}", common::text(&o));
    let text = std::fs::read_to_string(&summary).unwrap();
    let un = |p: &str| -> f64 {
        text.lines()
            .find(|l| l.starts_with(&format!("{p},")))
            .unwrap()
            .split(',')
            .nth(3)
            .unwrap()
            .parse()
            .unwrap()
    };
    assert!(un("Ours") < un("FGD"), "{text}");
    assert!(un("FGD") < 6.0, "{text}");
}
