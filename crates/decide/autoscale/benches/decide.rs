//! One decision for 1,000 nodes and 10,000 pending GPU pods: p50/p99 latency and the RSS of
//! the process holding that state. `cargo bench -p gpuops-autoscale`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use gpuops_autoscale::{Config, Node, PODS, PendingPod, Pool, Snapshot, State, decide, pool};
use gpuops_kubemodel::fit::{NodeConstraints, Toleration};
use serde_json::json;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

fn mk_pool(name: &str, gpus: u32, price: f64, extra: &[(&str, &str)]) -> Pool {
    let mut a = serde_json::Map::new();
    for (k, v) in [
        (pool::MIN_SIZE, "0"),
        (pool::MAX_SIZE, "2000"),
        (pool::CPU, "96"),
        (pool::MEMORY, "1024Gi"),
        (pool::GPU_COUNT, &gpus.to_string()),
        (pool::PRICE, &price.to_string()),
        (pool::GPU_PRODUCT, "NVIDIA-H100-80GB-HBM3"),
    ] {
        a.insert(k.into(), json!(v));
    }
    for (k, v) in extra {
        a.insert((*k).into(), json!(v));
    }
    pool::parse_pool(&json!({"metadata": {"name": name, "namespace": "capi", "annotations": a}, "spec": {"replicas": 250}})).unwrap()
}

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse().ok()))
        })
        .unwrap_or(0)
}

/// Nanoseconds this thread has spent on a CPU (`/proc/thread-self/schedstat`, first field).
fn on_cpu_ns() -> Option<u64> {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

fn main() {
    let before = rss_kib();
    let pools = vec![
        mk_pool("whole8", 8, 30.0, &[]),
        mk_pool("whole1", 1, 4.0, &[]),
        mk_pool("shared", 4, 8.0, &[(pool::GPU_REPLICAS, "4")]),
        mk_pool("mig", 8, 28.0, &[(pool::MIG_CONFIG, "all-1g.10gb")]),
    ];
    let mut nodes = Vec::new();
    for i in 0..1000usize {
        let p = &pools[i % pools.len()];
        let t = &p.template;
        let mut free = vec![1000u16; t.gpus as usize];
        for (g, f) in free.iter_mut().enumerate() {
            // Mostly full, some room left: the realistic case that makes every pod scan.
            if (i + g) % 5 != 0 {
                *f = 0;
            }
        }
        nodes.push(Node {
            name: format!("node-{i:04}"),
            pool: Some(p.name.clone()),
            machine: Some(format!("capi/m-{i}")),
            labels: t.labels.clone(),
            taints: t.taints.clone(),
            unschedulable: false,
            cpu_free_milli: t.cpu_milli / 2,
            memory_free_mib: t.memory_mib / 2,
            gpu_resource: t.gpu_resource.clone(),
            gpu_replicas: t.gpu_replicas,
            gpu_free: free,
            gpu_product: t.gpu_product.clone(),
            scalars_free: t
                .scalars
                .iter()
                .map(|(k, v)| (k.clone(), if k == PODS { *v } else { v / 4 }))
                .collect(),
            pods: vec![],
            gpu_util: Some(50.0),
            removing: false,
        });
    }
    let mut pending = Vec::new();
    for i in 0..10_000u64 {
        let mut p = PendingPod {
            key: format!("ns{}/pod-{i}", i % 50),
            created: i,
            cpu_milli: 1000 + (i % 4) * 500,
            memory_mib: 4096,
            gpu_resource: "nvidia.com/gpu".into(),
            gpu_count: [1, 1, 2, 4, 8][(i % 5) as usize],
            gpu_milli: None,
            scalars: BTreeMap::new(),
            tolerations: vec![],
            constraints: NodeConstraints::default(),
        };
        match i % 7 {
            0 => {
                p.gpu_resource = String::new();
                p.gpu_count = 0;
                p.scalars.insert("nvidia.com/mig-1g.10gb".into(), 1);
            }
            1 => {
                p.gpu_resource = "nvidia.com/gpu.shared".into();
                p.gpu_count = 1;
            }
            2 => p.tolerations.push(Toleration {
                key: format!("team-{}", i % 3),
                operator: "Exists".into(),
                ..Toleration::default()
            }),
            3 => {
                p.constraints.node_selector.insert(
                    "nvidia.com/gpu.product".into(),
                    "NVIDIA-H100-80GB-HBM3".into(),
                );
            }
            _ => {}
        }
        pending.push(p);
    }
    let snap = Snapshot {
        pools,
        nodes,
        pending,
        ..Snapshot::default()
    };
    let cfg = Config {
        batch_idle: Duration::ZERO,
        batch_max: Duration::ZERO,
        ..Config::default()
    };
    let held = rss_kib();
    let runs = std::env::var("BENCH_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(30usize);
    measure("decide", &snap, &cfg, runs);
    println!(
        "RSS: {} MiB before the snapshot, {} MiB holding it, {} MiB after deciding",
        before / 1024,
        held / 1024,
        rss_kib() / 1024
    );
    // The same cluster with whole-GPU pools of 8, 4 and 1 GPUs at the same price per GPU, so
    // every whole-GPU pod has pools competing for it and the packing has most to do.
    let mut equal = snap.clone();
    let mut whole4 = mk_pool("whole4", 4, 15.0, &[]);
    whole4.replicas = 0;
    equal.pools.push(whole4);
    for p in &mut equal.pools {
        if p.name == "capi/whole1" {
            p.price_per_hour = 3.75;
        }
    }
    measure("decide, 8x/4x/1x at one price per GPU", &equal, &cfg, runs);
}

fn measure(label: &str, snap: &Snapshot, cfg: &Config, runs: usize) {
    let mut times = Vec::with_capacity(runs);
    let mut cpu = Vec::with_capacity(runs);
    let mut last = None;
    for _ in 0..runs {
        let mut state = State::default();
        let c = on_cpu_ns();
        let t = Instant::now();
        let d = decide(snap, &mut state, 1_000_000, cfg);
        times.push(t.elapsed());
        cpu.push(on_cpu_ns().zip(c).map(|(b, a)| b.saturating_sub(a)));
        last = Some(d);
    }
    times.sort();
    let pct = |q: f64| times[((times.len() as f64 - 1.0) * q).round() as usize];
    // On a machine shared with builds the wall clock measures the neighbours too; the time
    // this thread was on a CPU (the scheduler's own count) is what the decision costs.
    let mut cpu: Vec<u64> = cpu.into_iter().flatten().collect();
    cpu.sort_unstable();
    let on_cpu = if cpu.is_empty() {
        "not readable".to_string()
    } else {
        let q = |q: f64| cpu[((cpu.len() as f64 - 1.0) * q).round() as usize] as f64 / 1e6;
        format!("p50 {:.1} ms, p99 {:.1} ms", q(0.5), q(0.99))
    };
    let d = last.unwrap();
    let bought: u32 = d.scale_ups.iter().map(|s| s.to - s.from).sum();
    let cost: f64 = d
        .scale_ups
        .iter()
        .map(|s| {
            let p = snap.pools.iter().find(|p| p.name == s.pool).unwrap();
            p.price_per_hour * f64::from(s.to - s.from)
        })
        .sum();
    println!(
        "{label}: 1000 nodes, 10000 pending pods, {runs} runs: wall p50 {:.1} ms, p99 {:.1} ms; on-CPU {on_cpu} (target < 200 ms); {} scale-ups buying {bought} nodes for {cost:.0}/h, {} plans",
        pct(0.5).as_secs_f64() * 1e3,
        pct(0.99).as_secs_f64() * 1e3,
        d.scale_ups.len(),
        d.plans.len()
    );
}
