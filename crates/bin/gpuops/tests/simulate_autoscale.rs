//! `gpuops simulate autoscale` on a tiny trace: the table, CSV, JSON and SVG outputs, and bad
//! inputs failing with messages that name the flag, the file and the line.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::path::{Path, PathBuf};

const PODS: &str = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time
p0,4000,8192,1,1000,,LS,Running,0,3600,0
p1,2000,4096,1,100,,LS,Running,0,36000,0
p2,2000,4096,1,400,,LS,Running,3600,7200,0
p3,1000,2048,0,0,,LS,Running,0,10,0
";

const POOLS: &str = "boot: 5m
device-plugin: 1m
scale-down-idle: 10m
pools:
  - {name: t4, model: T4, gpus: 1, cpu: 16, memory: 64Gi, price-per-hour: 2}
  - {name: a100-1g, model: A100-SXM4-80GB, gpus: 1, cpu: 32, memory: 128Gi, price-per-hour: 5, mig-config: all-1g.10gb}
  - {name: a100-3g, model: A100-SXM4-80GB, gpus: 1, cpu: 32, memory: 128Gi, price-per-hour: 5, mig-config: all-3g.40gb}
";

fn fixtures(pools: &str) -> (tempfile::TempDir, PathBuf, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("pods.csv");
    let q = dir.path().join("pools.yaml");
    std::fs::write(&p, PODS).unwrap();
    std::fs::write(&q, pools).unwrap();
    (dir, p, q)
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn table_csv_json_and_svg() {
    let (dir, pods, pools) = fixtures(POOLS);
    let svg = dir.path().join("bought.svg");
    let o = common::run(&[
        "simulate",
        "autoscale",
        "--pods",
        s(&pods),
        "--pools",
        s(&pools),
        "--svg",
        s(&svg),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let table = String::from_utf8(o.stdout).unwrap();
    for want in [
        "ours",
        "ca-like",
        "static-mig",
        "GPU-h bought",
        "3 GPU pods replayed",
    ] {
        assert!(table.contains(want), "{want}:\n{table}");
    }
    let picture = std::fs::read_to_string(&svg).unwrap();
    assert!(picture.starts_with("<svg") && picture.contains("bought: ours"));

    let o = common::run(&[
        "simulate",
        "autoscale",
        "--pods",
        s(&pods),
        "--pools",
        s(&pools),
        "-o",
        "csv",
    ]);
    assert!(o.status.success());
    let csv = String::from_utf8(o.stdout).unwrap();
    let rows: Vec<Vec<&str>> = csv.lines().map(|l| l.split(',').collect()).collect();
    assert_eq!(rows.len(), 4, "{csv}");
    assert_eq!(rows[0][0], "policy");
    let col = |name: &str| rows[0].iter().position(|c| *c == name).unwrap();
    let (bought, changes) = (col("gpu_hours_bought"), col("mig_changes"));
    let ours: f64 = rows[1][bought].parse().unwrap();
    let stat: f64 = rows[3][bought].parse().unwrap();
    assert_eq!(rows[1][0], "ours");
    assert_eq!(rows[1][changes], "1", "{csv}");
    assert!(
        ours < stat,
        "re-partitioning buys less than static MIG: {csv}"
    );

    let o = common::run(&[
        "simulate",
        "autoscale",
        "--pods",
        s(&pods),
        "--pools",
        s(&pools),
        "-o",
        "json",
        "--mig",
        "off",
        "--policies",
        "ours",
    ]);
    assert!(o.status.success());
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["mig"], false);
    assert_eq!(v["runs"].as_array().unwrap().len(), 1);
    assert_eq!(v["runs"][0]["policy"], "ours");
    assert_eq!(v["runs"][0]["mig_changes"], 0);
}

#[test]
fn bad_inputs_name_the_flag_the_file_and_the_line() {
    let bad = POOLS.replace("price-per-hour: 2}", "price-per-hour: two}");
    let (_dir, pods, pools) = fixtures(&bad);
    let o = common::run(&[
        "simulate",
        "autoscale",
        "--pods",
        s(&pods),
        "--pools",
        s(&pools),
    ]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("--pools:") && err.contains(&format!("{}:5:", s(&pools))),
        "{err}"
    );

    let (dir, _, pools) = fixtures(POOLS);
    let no_times = dir.path().join("multigpu.csv");
    std::fs::write(
        &no_times,
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np,1,1,1,1000\n",
    )
    .unwrap();
    let o = common::run(&[
        "simulate",
        "autoscale",
        "--pods",
        s(&no_times),
        "--pools",
        s(&pools),
    ]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("--pods:") && err.contains("creation_time"),
        "{err}"
    );

    let o = common::run(&[
        "simulate",
        "autoscale",
        "--pods",
        s(&no_times),
        "--pools",
        s(&pools),
        "--policies",
        "karpenter",
    ]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("\"karpenter\" is not a policy"));

    let missing = dir.path().join("nope.yaml");
    let o = common::run(&[
        "simulate",
        "autoscale",
        "--pods",
        s(&no_times),
        "--pools",
        s(&missing),
    ]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("--pools: cannot read"));
}
