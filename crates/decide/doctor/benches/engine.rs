//! `cargo bench -p gpuops-doctor --bench engine`: reading and diagnosing 5,000 nodes and 100,000
//! pods (issue 19's scale target: under 3 s and under 1 GiB).
//!
//! Per 1,000 nodes (`GPUOPS_BENCH_SCALE`, default 5): 900 whole-GPU nodes (8 x H100 each, a tenth
//! tainted), 100 MIG nodes; 12,000 CPU pods, 6,000 running GPU pods, 2,000 pending GPU pods of
//! mixed shapes with their FailedScheduling events; 20,000 events and 7,200 utilization samples.
//! The objects are serialized as the API server's list pages (500 items, JSON); the benchmark
//! times decoding those pages (what the doctor does with a list answer) and `diagnose` (median of
//! 3), and prints the peak resident memory of that phase (VmHWM, reset through clear_refs once
//! the pages are built).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // benchmark harness

use gpuops_doctor::{Options, Sample, Snapshot, diagnose};
use k8s_openapi::api::core::v1::{
    Container, Event, Node, NodeSpec, NodeStatus, ObjectReference, Pod, PodSpec, PodStatus,
    ResourceRequirements, Taint, Toleration,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use std::collections::BTreeMap;
use std::time::Instant;

fn rss_kib(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        .unwrap_or(0)
}

fn q(n: u32) -> Quantity {
    Quantity(n.to_string())
}

fn node(i: usize, now: Timestamp) -> Node {
    let mig = i >= 900;
    let mut labels: BTreeMap<String, String> = [
        ("kubernetes.io/hostname", format!("node-{i}")),
        ("nvidia.com/gpu.present", "true".into()),
        ("nvidia.com/gpu.product", "NVIDIA-H100-80GB-HBM3".into()),
        ("nvidia.com/gpu.count", "8".into()),
        (
            "nvidia.com/cuda.driver-version.full",
            if i.is_multiple_of(97) {
                "550.54.15".into()
            } else {
                "550.107.02".into()
            },
        ),
        ("nvidia.com/cuda.driver-version.major", "550".into()),
        ("karpenter.sh/nodepool", format!("pool-{}", i % 10)),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    let mut res: BTreeMap<String, Quantity> = [
        ("cpu", q(96)),
        ("memory", Quantity("1Ti".into())),
        ("pods", q(110)),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    if mig {
        labels.insert("nvidia.com/mig.config".into(), "all-1g.10gb".into());
        labels.insert("nvidia.com/mig.config.state".into(), "success".into());
        labels.insert("nvidia.com/mig.strategy".into(), "mixed".into());
        res.insert("nvidia.com/mig-1g.10gb".into(), q(56));
    } else {
        res.insert("nvidia.com/gpu".into(), q(8));
    }
    let taints = (i % 10 == 3).then(|| {
        vec![Taint {
            key: "nvidia.com/gpu".into(),
            value: Some("present".into()),
            effect: "NoSchedule".into(),
            ..Taint::default()
        }]
    });
    Node {
        metadata: ObjectMeta {
            name: Some(format!("node-{i}")),
            labels: Some(labels),
            creation_timestamp: Some(Time(now - SignedDuration::from_hours(48))),
            ..ObjectMeta::default()
        },
        spec: Some(NodeSpec {
            taints,
            ..NodeSpec::default()
        }),
        status: Some(NodeStatus {
            capacity: Some(res.clone()),
            allocatable: Some(res),
            ..NodeStatus::default()
        }),
    }
}

fn pod(
    name: String,
    resource: Option<(&str, u32)>,
    node: Option<String>,
    now: Timestamp,
    tolerate: bool,
) -> Pod {
    let mut limits: BTreeMap<String, Quantity> = [
        ("cpu".to_string(), q(2)),
        ("memory".to_string(), Quantity("8Gi".into())),
    ]
    .into();
    if let Some((r, n)) = resource {
        limits.insert(r.to_string(), q(n));
    }
    let running = node.is_some();
    Pod {
        metadata: ObjectMeta {
            name: Some(name),
            namespace: Some("team".into()),
            creation_timestamp: Some(Time(now - SignedDuration::from_hours(3))),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            node_name: node,
            tolerations: tolerate.then(|| {
                vec![Toleration {
                    key: Some("nvidia.com/gpu".into()),
                    operator: Some("Exists".into()),
                    ..Toleration::default()
                }]
            }),
            containers: vec![Container {
                name: "main".into(),
                resources: Some(ResourceRequirements {
                    requests: Some(limits.clone()),
                    limits: Some(limits),
                    ..ResourceRequirements::default()
                }),
                ..Container::default()
            }],
            ..PodSpec::default()
        }),
        status: Some(PodStatus {
            phase: Some(if running { "Running" } else { "Pending" }.into()),
            start_time: running.then(|| Time(now - SignedDuration::from_hours(3))),
            ..PodStatus::default()
        }),
    }
}

fn event(i: usize, pod: Option<&str>, now: Timestamp) -> Event {
    let (kind, name, reason, message) = match pod {
        Some(p) => (
            "Pod",
            p.to_string(),
            "FailedScheduling",
            "0/1000 nodes are available: 100 Insufficient nvidia.com/gpu, 100 node(s) had untolerated taint {nvidia.com/gpu: present}, 800 Insufficient nvidia.com/gpu. preemption: not eligible".to_string(),
        ),
        None => ("Pod", format!("cpu-{i}"), "Pulled", "Successfully pulled image".to_string()),
    };
    Event {
        metadata: ObjectMeta {
            name: Some(format!("ev-{i}")),
            namespace: Some("team".into()),
            ..ObjectMeta::default()
        },
        involved_object: ObjectReference {
            kind: Some(kind.into()),
            namespace: Some("team".into()),
            name: Some(name),
            ..ObjectReference::default()
        },
        reason: Some(reason.into()),
        message: Some(message),
        last_timestamp: Some(Time(now - SignedDuration::from_mins(2))),
        count: Some(3),
        ..Event::default()
    }
}

fn samples(scale: usize) -> Vec<Sample> {
    (0..7_200 * scale)
        .map(|i: usize| Sample {
            name: "DCGM_FI_DEV_GPU_UTIL".into(),
            labels: [
                ("Hostname".to_string(), format!("node-{}", i / 8)),
                ("gpu".to_string(), (i % 8).to_string()),
                ("UUID".to_string(), format!("GPU-{i}")),
                ("namespace".to_string(), "team".to_string()),
                ("pod".to_string(), format!("gpu-{i}")),
            ]
            .into(),
            value: if i.is_multiple_of(5) { 0.0 } else { 80.0 },
        })
        .collect()
}

fn build(now: Timestamp, scale: usize) -> Snapshot {
    let nodes: Vec<Node> = (0..1000 * scale).map(|i| node(i, now)).collect();
    let mut pods = Vec::with_capacity(20_000 * scale);
    for i in 0..12_000 * scale {
        pods.push(pod(
            format!("cpu-{i}"),
            None,
            Some(format!("node-{}", i % (1000 * scale))),
            now,
            false,
        ));
    }
    // 6 running GPU pods per node: whole GPUs on whole-GPU nodes, MIG slices on the rest.
    for i in 0..6_000 * scale {
        let n = i % (1000 * scale);
        let r = if n % 1000 >= 900 {
            ("nvidia.com/mig-1g.10gb", 1)
        } else {
            ("nvidia.com/gpu", 1)
        };
        pods.push(pod(
            format!("gpu-{i}"),
            Some(r),
            Some(format!("node-{n}")),
            now,
            n % 10 == 3,
        ));
    }
    let mut events = Vec::with_capacity(20_000);
    let shapes: [(&str, u32); 5] = [
        ("nvidia.com/gpu", 4),
        ("nvidia.com/gpu", 8),
        ("nvidia.com/gpu", 16),
        ("nvidia.com/mig-3g.40gb", 1),
        ("nvidia.com/gpu", 2),
    ];
    for i in 0..2_000 * scale {
        let name = format!("pending-{i}");
        events.push(event(i, Some(&name), now));
        pods.push(pod(
            name,
            Some(shapes[i % shapes.len()]),
            None,
            now,
            i.is_multiple_of(2),
        ));
    }
    for i in events.len()..20_000 * scale {
        events.push(event(i, None, now));
    }
    let metrics = samples(scale);
    Snapshot {
        nodes,
        pods,
        events,
        metrics,
        utilization_window: Some(std::time::Duration::from_secs(3600)),
        logs: Vec::new(),
        quotas: Vec::new(),
        controllers: Vec::new(),
        dra: Default::default(),
        all_pods: true,
        now,
    }
}

/// The items as the API server's list pages of 500.
fn pages<T: serde::Serialize>(kind: &str, items: &[T]) -> Vec<Vec<u8>> {
    items
        .chunks(500)
        .map(|chunk| {
            serde_json::to_vec(&serde_json::json!({
                "apiVersion": "v1",
                "kind": format!("{kind}List"),
                "metadata": {"resourceVersion": "1", "continue": "x"},
                "items": chunk,
            }))
            .unwrap()
        })
        .collect()
}

#[derive(serde::Deserialize)]
struct List<T> {
    items: Vec<T>,
}

fn main() {
    let scale: usize = std::env::var("GPUOPS_BENCH_SCALE")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(5);
    let now: Timestamp = "2026-11-20T12:00:00Z".parse().unwrap();
    if let Some(dir) = std::env::var_os("GPUOPS_BENCH_PAGES") {
        return measure(std::path::Path::new(&dir), scale, now);
    }
    // Build the objects and write them as list pages, then measure in a fresh process: its peak
    // memory is the read and the diagnosis alone, not the fixture building.
    let t = Instant::now();
    let built = build(now, scale);
    let dir = tempfile::tempdir().unwrap();
    let mut bytes = 0;
    for (kind, pages) in [
        ("Node", pages("Node", &built.nodes)),
        ("Pod", pages("Pod", &built.pods)),
        ("Event", pages("Event", &built.events)),
    ] {
        for (i, page) in pages.iter().enumerate() {
            bytes += page.len();
            std::fs::write(dir.path().join(format!("{kind}-{i:05}.json")), page).unwrap();
        }
    }
    println!(
        "fixture: {} nodes, {} pods, {} events as {} MiB of list pages (500 items each), built in {:.0} ms",
        built.nodes.len(),
        built.pods.len(),
        built.events.len(),
        bytes >> 20,
        t.elapsed().as_secs_f64() * 1000.0
    );
    drop(built);
    let status = std::process::Command::new(std::env::current_exe().unwrap())
        .env("GPUOPS_BENCH_PAGES", dir.path())
        .env("GPUOPS_BENCH_SCALE", scale.to_string())
        .status()
        .unwrap();
    assert!(status.success());
}

/// Reads the pages one at a time (each dropped once decoded, as a paged list read does),
/// diagnoses, and prints the times and the process's peak memory.
fn measure(dir: &std::path::Path, scale: usize, now: Timestamp) {
    let read_kind = |kind: &str| -> Vec<std::path::PathBuf> {
        let mut files: Vec<_> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with(&format!("{kind}-")))
            })
            .collect();
        files.sort();
        files
    };
    fn decode_files<T: serde::de::DeserializeOwned>(files: Vec<std::path::PathBuf>) -> Vec<T> {
        let mut out = Vec::new();
        for f in files {
            let page = std::fs::read(&f).unwrap();
            let list: List<T> = serde_json::from_slice(&page).unwrap();
            out.extend(list.items);
        }
        out
    }
    let t = Instant::now();
    let snapshot = Snapshot {
        nodes: decode_files(read_kind("Node")),
        pods: decode_files(read_kind("Pod")),
        events: decode_files(read_kind("Event")),
        metrics: samples(scale),
        utilization_window: Some(std::time::Duration::from_secs(3600)),
        ..Snapshot::at(now)
    };
    let read = t.elapsed();
    let with_snapshot = rss_kib("VmRSS:");
    let mut times = Vec::new();
    let mut findings = Vec::new();
    for _ in 0..3 {
        let t = Instant::now();
        findings = diagnose(std::hint::black_box(&snapshot), &Options::default());
        times.push(t.elapsed());
    }
    times.sort();
    let (c, w, i) = gpuops_doctor::counts(&findings);
    let mut by_code: BTreeMap<&str, usize> = BTreeMap::new();
    for f in &findings {
        *by_code.entry(f.code).or_default() += 1;
    }
    println!(
        "doctor: {} nodes, {} pods, {} events, {} samples",
        snapshot.nodes.len(),
        snapshot.pods.len(),
        snapshot.events.len(),
        snapshot.metrics.len()
    );
    println!(
        "read and decode the list pages: {:.0} ms; diagnose: median {:.0} ms (min {:.0}, max {:.0}); read + diagnose {:.0} ms (target < 3000 ms)",
        read.as_secs_f64() * 1000.0,
        times[1].as_secs_f64() * 1000.0,
        times[0].as_secs_f64() * 1000.0,
        times[2].as_secs_f64() * 1000.0,
        (read + times[1]).as_secs_f64() * 1000.0
    );
    println!("findings: {c} critical, {w} warning, {i} info: {by_code:?}");
    println!(
        "memory: RSS {} MiB with the snapshot, peak {} MiB (target < 1024 MiB)",
        with_snapshot / 1024,
        rss_kib("VmHWM:") / 1024
    );
}
