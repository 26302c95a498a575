//! What `gpuops doctor` and `gpuops top` print: the report with its header, the JSON document,
//! and the top tables.

use crate::top::{DeviceRow, NodeRow, PodRow};
use crate::{Finding, Snapshot, counts, report};
use gpuops_render::table;
use serde::Serialize;

/// How the doctor's read went, for its summary.
#[derive(Debug, Clone, Default)]
pub struct ReadStats {
    pub read_ms: u128,
    pub diagnose_ms: u128,
    /// The sources read besides the API server (metrics, logs).
    pub sources: Vec<String>,
    /// Sources that could not be read (flag or object, and why).
    pub unread: Vec<String>,
    /// Whether any metric source was given (else the report says what is missing).
    pub metrics_given: bool,
}

/// `gpuops doctor -o json|yaml`: the summary and every finding.
#[derive(Serialize)]
pub struct Document<'a> {
    summary: Summary<'a>,
    findings: &'a [Finding],
}

#[derive(Serialize)]
struct Summary<'a> {
    critical: usize,
    warning: usize,
    info: usize,
    nodes: usize,
    pods: usize,
    events: usize,
    metric_samples: usize,
    logs: usize,
    read_ms: u128,
    diagnose_ms: u128,
    sources: &'a [String],
    /// Sources that could not be read (flag or object, and why); the findings use the rest.
    unread: &'a [String],
}

/// The document `-o json|yaml` serialises.
pub fn document<'a>(
    snapshot: &Snapshot,
    findings: &'a [Finding],
    stats: &'a ReadStats,
) -> Document<'a> {
    let (critical, warning, info) = counts(findings);
    Document {
        summary: Summary {
            critical,
            warning,
            info,
            nodes: snapshot.nodes.len(),
            pods: snapshot.pods.len(),
            events: snapshot.events.len(),
            metric_samples: snapshot.metrics.len(),
            logs: snapshot.logs.len(),
            read_ms: stats.read_ms,
            diagnose_ms: stats.diagnose_ms,
            sources: &stats.sources,
            unread: &stats.unread,
        },
        findings,
    }
}

/// The report for people: what was read, then the findings by severity.
pub fn text(snapshot: &Snapshot, findings: &[Finding], stats: &ReadStats, colour: bool) -> String {
    let gpu_nodes = snapshot
        .nodes
        .iter()
        .filter(|n| {
            n.status
                .as_ref()
                .and_then(|s| s.capacity.as_ref())
                .is_some_and(|c| c.keys().any(|k| k.starts_with("nvidia.com/")))
        })
        .count();
    let mut header = format!(
        "Read {} nodes ({gpu_nodes} with GPUs), {} pods, {} events",
        snapshot.nodes.len(),
        snapshot.pods.len(),
        snapshot.events.len()
    );
    for f in &stats.sources {
        header.push_str(&format!(", {f}"));
    }
    header.push_str(&format!(
        " in {} ms; diagnosed in {} ms",
        stats.read_ms, stats.diagnose_ms
    ));
    for u in &stats.unread {
        header.push_str(&format!("\ncould not read {u}"));
    }
    if !stats.metrics_given {
        header.push_str("\n(no metrics: add --prometheus URL or --metrics-from agents for XIDs, memory and idle GPUs)");
    }
    report::render(findings, &header, colour)
}

fn opt(v: Option<f64>, unit: &str) -> String {
    v.map_or_else(|| "-".into(), |v| format!("{v:.0}{unit}"))
}

fn mem(used: Option<f64>, total: Option<f64>) -> String {
    match (used, total) {
        (Some(u), Some(t)) if t > 0.0 => format!("{u:.0}/{t:.0} MiB ({:.0}%)", 100.0 * u / t),
        (Some(u), _) => format!("{u:.0} MiB"),
        _ => "-".into(),
    }
}

/// `gpuops top nodes`.
pub fn nodes_table(rows: &[NodeRow]) -> String {
    // The DRA column only where claims hold devices, so a device-plugin cluster's table is as before.
    let claims = rows.iter().any(|r| r.claim_devices > 0);
    let mut header = vec![
        "NODE",
        "MODEL",
        "GPUS",
        "HEALTHY",
        "MIG",
        "ALLOCATED",
        "UTIL",
        "MEMORY",
        "PODS",
    ];
    if claims {
        header.push("CLAIMED (DRA)");
    }
    let mut t = table(&header);
    for r in rows {
        let mut row = vec![
            r.node.clone(),
            r.model.clone(),
            r.gpus.to_string(),
            opt(r.gpus_healthy, ""),
            r.mig_instances.to_string(),
            format!("{}/{}", r.devices_allocated, r.devices),
            opt(r.utilization_percent, "%"),
            mem(Some(r.memory_used_mib), Some(r.memory_total_mib)),
            r.pods.to_string(),
        ];
        if claims {
            row.push(r.claim_devices.to_string());
        }
        t.add_row(row);
    }
    format!("{t}\n")
}

/// `gpuops top gpus`.
pub fn devices_table(rows: &[DeviceRow]) -> String {
    let mut t = table(&[
        "NODE",
        "DEVICE",
        "UUID",
        "ALLOCATED",
        "HEALTHY",
        "UTIL",
        "MEMORY",
        "PODS",
    ]);
    let yn = |b: Option<bool>| b.map_or("-", |b| if b { "yes" } else { "no" }).to_string();
    for r in rows {
        t.add_row(vec![
            r.node.clone(),
            r.label(),
            r.uuid.clone(),
            yn(r.allocated),
            yn(r.healthy),
            opt(r.utilization_percent, "%"),
            mem(r.memory_used_mib, r.memory_total_mib),
            r.pods.join(", "),
        ]);
    }
    format!("{t}\n")
}

/// `gpuops top pods`.
pub fn pods_table(rows: &[PodRow]) -> String {
    let claims = rows.iter().any(|r| !r.claim_devices.is_empty());
    let mut header = vec![
        "NAMESPACE",
        "POD",
        "CONTAINER",
        "NODE",
        "DEVICES",
        "UTIL",
        "MEMORY",
        "SHARING WITH",
    ];
    if claims {
        header.push("CLAIMED (DRA)");
    }
    let mut t = table(&header);
    for r in rows {
        let mut row = vec![
            r.namespace.clone(),
            r.pod.clone(),
            r.container.clone(),
            r.node.clone(),
            r.devices.join(", "),
            opt(r.utilization_percent, "%"),
            mem(r.memory_used_mib, None),
            r.sharing_with.join(", "),
        ];
        if claims {
            row.push(r.claim_devices.join(", "));
        }
        t.add_row(row);
    }
    format!("{t}\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit::snapshot;

    #[test]
    fn memory_cells_show_what_is_known() {
        assert_eq!(mem(Some(512.0), Some(1024.0)), "512/1024 MiB (50%)");
        assert_eq!(mem(Some(512.0), None), "512 MiB");
        assert_eq!(mem(None, Some(1024.0)), "-");
        assert_eq!(opt(None, "%"), "-");
    }

    #[test]
    fn the_header_says_what_was_read_and_what_is_missing() {
        let stats = ReadStats {
            read_ms: 12,
            sources: vec!["3 metric samples".into()],
            unread: vec!["--prometheus: refused".into()],
            ..ReadStats::default()
        };
        let text = text(&snapshot(vec![], vec![], vec![]), &[], &stats, false);
        assert!(
            text.contains(
                "Read 0 nodes (0 with GPUs), 0 pods, 0 events, 3 metric samples in 12 ms"
            ),
            "{text}"
        );
        assert!(
            text.contains("could not read --prometheus: refused"),
            "{text}"
        );
        assert!(text.contains("(no metrics:"), "{text}");
        let json =
            serde_json::to_value(document(&snapshot(vec![], vec![], vec![]), &[], &stats)).unwrap();
        assert_eq!(json["summary"]["read_ms"], 12);
        assert_eq!(json["summary"]["unread"][0], "--prometheus: refused");
    }
}
