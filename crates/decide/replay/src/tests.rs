#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::*;

const HEADER: &str = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time";

fn trace(rows: &[&str]) -> Vec<TimedPod> {
    let text = format!("{HEADER}\n{}\n", rows.join("\n"));
    parse_timed_pods("t.csv", &text).unwrap()
}

const ONE_T4: &str = "boot: 5m
device-plugin: 1m
scale-down-idle: 10m
pools:
  - {name: t4, model: T4, gpus: 1, cpu: 16, memory: 64Gi, price-per-hour: 2}
";

fn run(pools: &str, rows: &[&str], policies: &[PolicyName], mig: bool) -> Replay {
    let pools = parse_pools("pools.yaml", pools).unwrap();
    replay(
        &pools,
        &trace(rows),
        &ReplayOptions {
            mig,
            policies: policies.to_vec(),
        },
        &mut |_| {},
    )
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-9
}

#[test]
fn one_pod_of_an_hour_buys_boot_plus_hour_plus_idle() {
    let r = run(
        ONE_T4,
        &["p,4000,8192,1,1000,,LS,Running,0,3600,0"],
        &PolicyName::ALL,
        true,
    );
    // ours: the 1 s batch window, then the node: 5 min boot + 1 min device plugin, the hour,
    // then 10 min idle before removal. CA-like buys at its first scan (t = 0) and removes after
    // 10 min below 0.5 utilization: the same 6 min + 1 h + 10 min.
    let bought_h = (360.0 + 3600.0 + 600.0) / 3600.0;
    for x in &r.runs {
        assert!(
            close(x.gpu_hours_bought, bought_h),
            "{}: {} GPU-h, want {bought_h}",
            x.policy.name(),
            x.gpu_hours_bought
        );
        assert!(close(x.gpu_hours_requested, 1.0), "{x:?}");
        assert!(close(x.ratio, bought_h), "{x:?}");
        assert!(close(x.cost, 2.0 * bought_h), "{x:?}");
        assert_eq!((x.scale_ups, x.nodes_bought, x.nodes_removed), (1, 1, 1));
        assert_eq!(x.pods_run, 1);
    }
    let ours = &r.runs[0];
    assert!(close(ours.wait_p50_s, 361.0), "{ours:?}");
    assert!(close(ours.pending_pod_hours, 361.0 / 3600.0), "{ours:?}");
    let ca = &r.runs[1];
    assert!(close(ca.wait_p99_s, 360.0), "{ca:?}");
    // The series integrates to the totals.
    assert!(close(ours.series.bought.iter().sum::<f64>(), bought_h));
    assert!(close(ours.series.requested.iter().sum::<f64>(), 1.0));
}

#[test]
fn a_pod_departs_its_runtime_after_it_started() {
    // Two one-GPU pods at once on a pool of one-GPU nodes, max 1 node: the second waits for
    // the first to leave, then runs its full hour.
    let pools = ONE_T4.replace("price-per-hour: 2}", "price-per-hour: 2, max: 1}");
    let r = run(
        &pools,
        &[
            "a,4000,8192,1,1000,,LS,Running,0,3600,0",
            "b,4000,8192,1,1000,,LS,Running,0,3600,0",
        ],
        &[PolicyName::Ours],
        true,
    );
    let x = &r.runs[0];
    assert_eq!(x.nodes_bought, 1);
    // a waits 361 s, b waits 361 s + 3600 s; b departs at 361 + 7200 s, node gone 600 s later.
    assert!(close(x.wait_max_s, 3961.0), "{x:?}");
    assert!(
        close(x.gpu_hours_bought, (360.0 + 7200.0 + 600.0) / 3600.0),
        "{x:?}"
    );
    assert!(close(x.gpu_hours_requested, 2.0));
}

#[test]
fn shared_pods_share_one_gpu() {
    let r = run(
        ONE_T4,
        &[
            "a,2000,4096,1,500,,LS,Running,0,3600,0",
            "b,2000,4096,1,500,,LS,Running,0,3600,0",
        ],
        &[PolicyName::Ours, PolicyName::CaLike],
        true,
    );
    for x in &r.runs {
        assert_eq!(x.nodes_bought, 1, "{x:?}");
        assert!(close(x.gpu_hours_requested, 1.0));
    }
}

const MIG_POOLS: &str = "boot: 5m
device-plugin: 1m
mig-change: 1m
pools:
  - {name: a100-1g, model: A100-SXM4-80GB, gpus: 1, cpu: 32, memory: 128Gi, price-per-hour: 5, mig-config: all-1g.10gb}
  - {name: a100-3g, model: A100-SXM4-80GB, gpus: 1, cpu: 32, memory: 128Gi, price-per-hour: 5, mig-config: all-3g.40gb}
";

#[test]
fn mig_demand_repartitions_instead_of_buying() {
    // A 1g pod for 10 h, then a pod needing 3g for 1 h: ours re-partitions the free part of
    // the first node; static MIG buys a 3g node.
    let rows = [
        "small,2000,4096,1,100,,LS,Running,0,36000,0",
        "big,2000,4096,1,400,,LS,Running,3600,7200,0",
    ];
    let r = run(
        MIG_POOLS,
        &rows,
        &[PolicyName::Ours, PolicyName::StaticMig, PolicyName::CaLike],
        true,
    );
    let (ours, stat, ca) = (&r.runs[0], &r.runs[1], &r.runs[2]);
    assert_eq!(ours.nodes_bought, 1, "{ours:?}");
    assert_eq!(ours.mig_changes, 1, "{ours:?}");
    assert_eq!(stat.nodes_bought, 2, "{stat:?}");
    assert_eq!(stat.mig_changes, 0);
    assert_eq!(ca.nodes_bought, 2, "{ca:?}");
    assert!(ours.gpu_hours_bought < stat.gpu_hours_bought);
    // The small pod waited the 1 s batch window and a boot (361 s); the big one only the
    // window and the 1 min change (61 s), not another boot.
    assert!(
        close(ours.pending_pod_hours, (361.0 + 61.0) / 3600.0),
        "{ours:?}"
    );
    // Off, ours keeps layouts too.
    let off = run(MIG_POOLS, &rows, &[PolicyName::Ours], false);
    assert_eq!(off.runs[0].nodes_bought, 2);
    assert_eq!(off.runs[0].mig_changes, 0);
}

#[test]
fn pods_no_pool_can_run_are_counted_not_waited_for() {
    let r = run(
        ONE_T4,
        &[
            "huge,64000,8192,1,1000,,LS,Running,0,3600,0",
            "eight,1000,8192,8,1000,,LS,Running,0,3600,0",
            "v100,1000,8192,1,1000,V100M16,LS,Running,0,3600,0",
            "cpu,1000,1024,0,0,,LS,Running,0,3600,0",
            "nolife,1000,1024,1,1000,,LS,Running,10,10,0",
        ],
        &PolicyName::ALL,
        true,
    );
    assert_eq!((r.skipped_cpu_only, r.skipped_no_lifetime), (1, 1));
    for x in &r.runs {
        assert_eq!(x.pods_unschedulable, 3, "{x:?}");
        assert_eq!(x.nodes_bought, 0);
    }
}

#[test]
fn report_renders_every_policy() {
    let r = run(
        ONE_T4,
        &["p,4000,8192,1,1000,,LS,Running,0,3600,0"],
        &PolicyName::ALL,
        true,
    );
    let t = report::table(&r);
    for p in ["ours", "ca-like", "static-mig", "ratio"] {
        assert!(t.contains(p), "{t}");
    }
    let c = report::csv(&r);
    assert_eq!(c.lines().count(), 4, "{c}");
    assert!(
        c.lines()
            .nth(1)
            .unwrap()
            .starts_with("ours,1.267,1.000,1.2667"),
        "{c}"
    );
    let s = report::svg(&r);
    assert!(s.starts_with("<svg") && s.contains("bought: ca-like") && s.contains("requested"));
}

fn pools_err(text: &str) -> String {
    parse_pools("pools.yaml", text).unwrap_err().to_string()
}

#[test]
fn bad_pools_files_name_the_file_the_line_and_the_problem() {
    let cases: Vec<(String, &str)> = vec![
        (
            "pools:\n  - {name: a, model: T4, gpus: 1, cpu: 4, memory: 8Gi, price-per-hour: 1, colour: red}\n".into(),
            "pools.yaml:2:",
        ),
        (
            "pools:\n  - {name: a, model: T4, gpus: 1, cpu: 4, memory: 8Gi, price-per-hour: -1}\n".into(),
            "pools.yaml:2: pool \"a\": price-per-hour: -1 must be a number of 0 or more",
        ),
        (
            "pools:\n  - {name: a, model: T4, gpus: 0, cpu: 4, memory: 8Gi, price-per-hour: 1}\n".into(),
            "pools.yaml:2: pool \"a\": gpus: 0 is not in 1..=64",
        ),
        (
            "pools:\n  - {name: a, model: T4, gpus: 1, cpu: 4, memory: lots, price-per-hour: 1}\n".into(),
            "memory: \"lots\" is not a quantity",
        ),
        (
            "pools:\n  - {name: a, model: T4, gpus: 1, cpu: 4, memory: 8Gi, price-per-hour: 1}\n  - {name: a, model: T4, gpus: 1, cpu: 4, memory: 8Gi, price-per-hour: 1}\n".into(),
            "pools.yaml:3: pool name \"a\" is used twice",
        ),
        (
            "pools:\n  - {name: a, model: T4, gpus: 1, cpu: 4, memory: 8Gi, price-per-hour: 1, min: 3, max: 2}\n".into(),
            "min 3 and max 2",
        ),
        (
            "pools:\n  - {name: a, model: T4, gpus: 1, cpu: 4, memory: 8Gi, price-per-hour: 1, mig-config: all-1g.10gb}\n".into(),
            "pools.yaml:2: pool \"a\": model \"T4\" is not a MIG-capable GPU",
        ),
        (
            "pools:\n  - name: a\n    model: A100-SXM4-80GB\n    gpus: 1\n    cpu: 4\n    memory: 8Gi\n    price-per-hour: 1\n    mig-config: all-9g.99gb\n".into(),
            "pools.yaml:8: pool \"a\": mig-config:",
        ),
        (
            "boot: soon\npools:\n  - {name: a, model: T4, gpus: 1, cpu: 4, memory: 8Gi, price-per-hour: 1}\n".into(),
            "pools.yaml:1: boot:",
        ),
        ("pools: []\n".into(), "pools.yaml:1: pools: the list is empty"),
        (
            "fractional: half\npools:\n  - {name: a, model: T4, gpus: 1, cpu: 4, memory: 8Gi, price-per-hour: 1}\n".into(),
            "pools.yaml:1: fractional: \"half\" is not mig or shared",
        ),
        (
            "fractional: mig\npools:\n  - {name: a, model: T4, gpus: 1, cpu: 4, memory: 8Gi, price-per-hour: 1}\n".into(),
            "fractional: mig needs at least one pool with mig-config",
        ),
        (
            "pools:\n  - {name: a, model: A100-SXM4-80GB, gpus: 1, cpu: 4, memory: 8Gi, price-per-hour: 1, mig-config: all-1g.10gb}\n  - {name: b, model: H100-SXM5-80GB, gpus: 1, cpu: 4, memory: 8Gi, price-per-hour: 1, mig-config: all-1g.10gb}\n".into(),
            "pools.yaml:3: pool \"b\": MIG pools must share one GPU model",
        ),
        ("pools: {a: 1}\n".into(), "pools.yaml:1:"),
        // Issue 29: type errors name the key, the value and what is accepted, with the column.
        (
            "pools:\n  - {name: a, model: T4, gpus: many, cpu: 4, memory: 8Gi, price-per-hour: 1}\n".into(),
            "pools.yaml:2:32: `pools[0].gpus`: \"many\" is not valid: expected a whole number from 0 to 4294967295",
        ),
        (
            "pools:\n  - {name: a, model: T4, gpus: 1, cpu: 4, memory: 8Gi, price-per-hour: 1, max: 99999999999}\n".into(),
            "pools.yaml:2:80: `pools[0].max`: 99999999999 is too large: at most 4294967295",
        ),
        (
            "pools:\n  - {name: a, model: T4, gpus: 1, cpu: 4, memory: 8Gi, price-per-hour: 1, max: 4000000000}\n".into(),
            "pools.yaml:2: pool \"a\": min/max 4000000000: more than 10000, the most nodes a pool may have",
        ),
        (
            "pools:\n  - {name: a, model: T4, gpus: 1, cpu: 4, memory: 8Gi, price-per-hour: 1, min: 20000, max: 20000}\n".into(),
            "min/max 20000: more than 10000",
        ),
    ];
    for (text, want) in cases {
        let e = pools_err(&text);
        assert!(e.contains(want), "{text}\n-> {e}\nwant {want}");
    }
}

#[test]
fn the_example_pools_file_is_valid() {
    let text = include_str!("../../../../docs/autoscaling-replay-pools.yaml");
    let p = parse_pools("docs/autoscaling-replay-pools.yaml", text).unwrap();
    assert_eq!(p.fractional, Fractional::Mig);
    assert!(p.pools.iter().filter(|p| p.mig.is_some()).count() >= 2);
    assert!(p.pools.iter().any(|p| p.model == "G2"));
}

#[test]
fn bad_traces_name_the_file_and_the_line() {
    let e = parse_timed_pods(
        "t.csv",
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np,1,1,1,1000\n",
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.starts_with("t.csv:1:") && e.contains("creation_time"),
        "{e}"
    );
    let e = parse_timed_pods(
        "t.csv",
        &format!("{HEADER}\np,1,1,1,1000,,LS,Running,0,10,0\nq,1,1,1,1000,,LS,Running,soon,10,0\n"),
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.starts_with("t.csv:3:") && e.contains("creation_time") && e.contains("\"soon\""),
        "{e}"
    );
    let e = parse_timed_pods(
        "t.csv",
        &format!("{HEADER}\np,x,1,1,1000,,LS,Running,0,10,0\n"),
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("t.csv") && e.contains("cpu_milli"), "{e}");
}
