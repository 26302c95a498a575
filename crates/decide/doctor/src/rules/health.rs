//! GPU health: the agent's GPUHealthy condition, XID counters, lost GPUs and devices withheld as
//! unhealthy, with the action per XID class.

use crate::Options;
use crate::cluster::{Cluster, NodeView};
use crate::finding::{Category, Finding, ObjectRef, Severity};
use crate::snapshot::Sample;
use gpuops_catalog::xid::{self, XidClass};
use std::collections::{BTreeMap, BTreeSet};

pub const CONDITION: &str = "GPUHealthy";
pub const TAINT: &str = super::HEALTH_TAINT;

#[derive(Default)]
struct Host {
    /// (gpu, UUID, xid) -> (count, pods)
    xids: BTreeMap<(String, String, u64), (f64, BTreeSet<String>)>,
    unhealthy: BTreeSet<String>,
    gpus: Option<f64>,
    healthy: Option<f64>,
}

fn device(s: &Sample) -> String {
    let gpu = s.label("gpu").unwrap_or("?");
    let uuid = s.label("UUID").unwrap_or("");
    match s.label("GPU_I_ID") {
        Some(gi) => format!("GPU {gpu} ({uuid}) MIG instance {gi}"),
        None if uuid.is_empty() => format!("GPU {gpu}"),
        None => format!("GPU {gpu} ({uuid})"),
    }
}

fn hosts(samples: &[Sample]) -> BTreeMap<String, Host> {
    let mut out: BTreeMap<String, Host> = BTreeMap::new();
    for s in samples {
        let Some(host) = s.host() else { continue };
        match s.name.as_str() {
            "gpuops_xid_errors_total" if s.value > 0.0 => {
                let Some(code) = s.label("err_code").and_then(|c| c.parse::<u64>().ok()) else {
                    continue;
                };
                let e = out
                    .entry(host.to_string())
                    .or_default()
                    .xids
                    .entry((
                        s.label("gpu").unwrap_or("?").to_string(),
                        s.label("UUID").unwrap_or("").to_string(),
                        code,
                    ))
                    .or_default();
                e.0 = e.0.max(s.value);
                if let (Some(ns), Some(pod)) = (s.label("namespace"), s.label("pod")) {
                    e.1.insert(format!("{ns}/{pod}"));
                }
            }
            "gpuops_device_healthy" if s.value < 1.0 => {
                out.entry(host.to_string())
                    .or_default()
                    .unhealthy
                    .insert(device(s));
            }
            "gpuops_node_gpus" => out.entry(host.to_string()).or_default().gpus = Some(s.value),
            "gpuops_node_gpus_healthy" => {
                out.entry(host.to_string()).or_default().healthy = Some(s.value);
            }
            _ => {}
        }
    }
    out
}

/// GPU indexes named in a condition message (`GPU 3 (GPU-...)`); not the `GPU` of
/// `1 of 1 GPU unhealthy` or `reset the GPU`.
fn gpus_in(message: &str) -> BTreeSet<String> {
    message
        .match_indices("GPU ")
        .filter_map(|(i, _)| {
            let idx: String = message[i + 4..]
                .chars()
                .take_while(char::is_ascii_digit)
                .collect();
            (!idx.is_empty()).then_some(idx)
        })
        .collect()
}

/// XID numbers named in a condition message (`XID 48`, `Xid 79`).
fn xids_in(message: &str) -> Vec<u64> {
    let lower = message.to_ascii_lowercase();
    let mut out = Vec::new();
    let mut rest = lower.as_str();
    while let Some(i) = rest.find("xid") {
        rest = &rest[i + 3..];
        let digits: String = rest
            .trim_start_matches([' ', ':', '='])
            .chars()
            .take_while(char::is_ascii_digit)
            .collect();
        if let Ok(x) = digits.parse() {
            out.push(x);
        }
    }
    out.sort_unstable();
    out.dedup();
    out
}

fn class_rank(c: XidClass) -> u8 {
    match c {
        XidClass::RebootNode => 6,
        XidClass::Drain => 5,
        XidClass::ResetGpu => 4,
        XidClass::Unknown => 3,
        XidClass::RestartApp => 2,
        XidClass::Watch => 1,
        XidClass::Application => 0,
    }
}

fn fix_for(class: XidClass, n: &NodeView<'_>, gpus: &str, lost: bool) -> String {
    let node = n.name;
    let drain = format!("kubectl cordon {node} && {}{}", n.drain(), n.drain_note());
    if lost || class == XidClass::RebootNode {
        return format!(
            "{drain}; reboot the node (a GPU off the bus needs it); if the GPU is still missing after the reboot, \
             have it replaced; then kubectl uncordon {node}"
        );
    }
    // No index reported: after a drain no process holds any GPU, so resetting them all is safe.
    if gpus.is_empty() && matches!(class, XidClass::Drain | XidClass::ResetGpu) {
        return format!(
            "{drain}; reset the node's GPUs (nvidia-smi -r; no index was reported, and \
             nvidia-smi -q on the node shows which GPU has the errors) or reboot; if it repeats, \
             replace the GPU; then kubectl uncordon {node}"
        );
    }
    match class {
        XidClass::Drain => format!(
            "{drain}; reset the GPU (nvidia-smi -r -i {gpus}) or reboot; if it repeats, replace the GPU; then kubectl uncordon {node}"
        ),
        XidClass::ResetGpu => format!(
            "move the pods off {gpus} (or {drain}), reset it: nvidia-smi -r -i {gpus}; the agent marks it healthy again after its quiet period"
        ),
        XidClass::RestartApp => {
            "restart the pods that hit it (delete them; their controllers recreate them); the GPU itself is usable"
                .into()
        }
        XidClass::Watch | XidClass::Unknown | XidClass::RebootNode => format!(
            "watch for repeats (gpuops_xid_errors_total on {node}); look the XID up in NVIDIA's catalogue"
        ),
        XidClass::Application => {
            "fix the application (illegal memory access, bad kernel); the GPU is fine".into()
        }
    }
}

/// What the agent's `gpuops.io/gpu-health` annotation says, or why it could not be read.
enum Published {
    /// An older agent, or another one: only the condition's prose is there.
    Absent,
    Report(gpuops_labels::HealthReport),
    Invalid(String),
}

fn published(n: &NodeView<'_>) -> Published {
    let Some(value) = n
        .node
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(gpuops_labels::GPU_HEALTH_ANNOTATION))
    else {
        return Published::Absent;
    };
    match gpuops_labels::HealthReport::from_annotation(value) {
        Ok(r) => Published::Report(r),
        Err(e) => Published::Invalid(e.to_string()),
    }
}

fn describe_problem(p: &gpuops_labels::GpuProblem) -> String {
    use gpuops_labels::ProblemKind;
    let mut who = match (p.gpu_index, p.gpu_uuid.is_empty()) {
        (Some(i), false) => format!("GPU {i} ({})", p.gpu_uuid),
        (Some(i), true) => format!("GPU {i}"),
        (None, false) => format!("GPU {}", p.gpu_uuid),
        (None, true) => "an unidentified GPU".to_string(),
    };
    if let Some(m) = &p.mig_uuid {
        who.push_str(&format!(" MIG device {m}"));
    }
    match &p.kind {
        ProblemKind::Xid { xid: x } => {
            let info = xid::describe(*x);
            format!("{who}: XID {x} ({})", info.meaning)
        }
        ProblemKind::Lost => format!("{who}: lost (fell off the bus)"),
        ProblemKind::Unreachable { reason } => format!("{who}: unreachable ({reason})"),
    }
}

pub(super) fn check(c: &Cluster<'_>, _o: &Options) -> Vec<Finding> {
    let mut hosts = hosts(&c.snapshot.metrics);
    let mut out = Vec::new();
    for n in c.gpu_nodes() {
        let host = hosts.remove(n.name);
        out.extend(node_health(n, host.as_ref()));
    }
    // Metrics from nodes the cluster does not list (yet, or any more).
    for (name, host) in hosts {
        out.extend(metrics_only(&name, &host));
    }
    out
}

/// What a node's annotation, condition, taint, metrics and capacity say about its GPUs' health.
#[derive(Default)]
struct Signs {
    evidence: Vec<String>,
    /// The worst seen, if any sign was.
    severity: Option<Severity>,
    classes: Vec<XidClass>,
    lost: bool,
    gpus: BTreeSet<String>,
    /// Only application XIDs: the GPUs themselves are fine.
    app_only: bool,
}

impl Signs {
    fn raise(&mut self, s: Severity) {
        self.severity = Some(self.severity.map_or(s, |cur| cur.min(s)));
    }
}

/// The node's GPU health: gather the signs, then the one finding they add up to (and one for an
/// annotation that cannot be read).
fn node_health(n: &NodeView<'_>, host: Option<&Host>) -> Vec<Finding> {
    let mut s = Signs {
        app_only: true,
        ..Signs::default()
    };
    let cond = n.condition(CONDITION);
    let report = published(n);
    let mut out = Vec::new();
    if let Published::Invalid(why) = &report {
        out.push(annotation_invalid(n, why));
    }
    from_report(&mut s, &report, cond);
    if let Some(t) = n.taints.iter().find(|t| t.key == TAINT) {
        s.evidence
            .push(format!("taint {}", crate::fit::describe_taint(t)));
    }
    if let Some(h) = host {
        from_host(&mut s, h);
    }
    from_capacity(&mut s, n);
    if let Some(f) = health_finding(n, s, &report, cond) {
        out.push(f);
    }
    out
}

/// The agent's health annotation that does not parse.
fn annotation_invalid(n: &NodeView<'_>, why: &str) -> Finding {
    Finding::new(
                Severity::Warning,
                Category::Health,
                "gpu-health-annotation-invalid",
                format!(
                    "Node {}: the agent's {} annotation cannot be read",
                    n.name,
                    gpuops_labels::GPU_HEALTH_ANNOTATION
                ),
            )
            .object(ObjectRef::node(n.name))
            .evidence(format!("{}: {why}", gpuops_labels::GPU_HEALTH_ANNOTATION))
            .evidence(format!(
                "health judged from the {CONDITION} condition's message instead"
            ))
            .fix(format!(
                "the annotation is the agent's to write: run the same gpuops version on every node                  (an older or newer agent writes another format), or remove a hand-written value:                  kubectl annotate node {} {}-",
                n.name,
                gpuops_labels::GPU_HEALTH_ANNOTATION
            ))
            .command(format!(
                "kubectl annotate node {} {}-",
                n.name,
                gpuops_labels::GPU_HEALTH_ANNOTATION
            ))
}

/// The agent's report when it has one, else the condition's prose.
fn from_report(
    s: &mut Signs,
    report: &Published,
    cond: Option<&k8s_openapi::api::core::v1::NodeCondition>,
) {
    if let Published::Report(r) = &report
        && !r.problems.is_empty()
    {
        // The structured report names GPUs and XIDs; the condition is only shown.
        if let Some(cond) = cond.filter(|c| c.status == "False") {
            s.evidence.push(format!(
                "condition {CONDITION}=False {}: {}",
                cond.reason.as_deref().unwrap_or(""),
                cond.message.as_deref().unwrap_or("")
            ));
        }
        s.evidence.push(format!(
            "{}: {}",
            gpuops_labels::GPU_HEALTH_ANNOTATION,
            r.problems
                .iter()
                .map(describe_problem)
                .collect::<Vec<_>>()
                .join("; ")
        ));
        s.raise(Severity::Critical);
        s.app_only = false;
        for p in &r.problems {
            if let Some(i) = p.gpu_index {
                s.gpus.insert(i.to_string());
            }
            match &p.kind {
                gpuops_labels::ProblemKind::Xid { xid: x } => {
                    s.classes.push(xid::describe(*x).class)
                }
                gpuops_labels::ProblemKind::Lost
                | gpuops_labels::ProblemKind::Unreachable { .. } => {
                    s.lost = true;
                }
            }
        }
    } else if matches!(report, Published::Report(_)) {
        // The agent says no GPU is unhealthy: a False condition is then stale or someone else's.
        if let Some(cond) = cond.filter(|c| c.status == "False") {
            s.evidence.push(format!(
                "condition {CONDITION}=False {}: {} (but {} lists no problem)",
                cond.reason.as_deref().unwrap_or(""),
                cond.message.as_deref().unwrap_or(""),
                gpuops_labels::GPU_HEALTH_ANNOTATION
            ));
            s.raise(Severity::Warning);
            s.app_only = false;
        }
    } else if let Some(cond) = cond.filter(|c| c.status == "False") {
        // No (readable) annotation: an older agent; read the condition's prose.
        let reason = cond.reason.as_deref().unwrap_or("");
        let msg = cond.message.as_deref().unwrap_or("");
        s.evidence
            .push(format!("condition {CONDITION}=False {reason}: {msg}"));
        s.raise(Severity::Critical);
        s.app_only = false;
        s.lost |= reason == "GPULost" || msg.contains("lost") || msg.contains("fell off the bus");
        for x in xids_in(msg) {
            s.classes.push(xid::describe(x).class);
        }
        s.gpus.extend(gpus_in(msg));
    }
}

/// The node's XIDs and health metrics.
fn from_host(s: &mut Signs, h: &Host) {
    for ((gpu, uuid, code), (count, pods)) in &h.xids {
        let info = xid::describe(*code);
        let on = if pods.is_empty() {
            String::new()
        } else {
            format!(" (pods: {})", crate::cluster::list_some(pods, 4))
        };
        s.evidence.push(format!(
            "XID {code} x{count} on GPU {gpu} {uuid}: {}; action: {}{on}",
            info.meaning, info.action
        ));
        s.classes.push(info.class);
        if info.class == XidClass::Application {
            s.raise(Severity::Info);
        } else {
            s.app_only = false;
            s.gpus.insert(gpu.clone());
            let sev = if xid::is_fatal(*code) && !h.unhealthy.is_empty() {
                Severity::Critical
            } else {
                Severity::Warning
            };
            s.raise(sev);
        }
    }
    if !h.unhealthy.is_empty() {
        s.evidence.push(format!(
            "gpuops_device_healthy=0: {}",
            crate::cluster::list_some(&h.unhealthy, 8)
        ));
        s.raise(Severity::Critical);
        s.app_only = false;
    }
    if let (Some(all), Some(ok)) = (h.gpus, h.healthy)
        && ok < all
    {
        s.evidence.push(format!(
            "gpuops_node_gpus_healthy {ok} < gpuops_node_gpus {all}"
        ));
        s.raise(Severity::Critical);
        s.app_only = false;
        if h.xids.is_empty() && h.unhealthy.is_empty() {
            s.lost = true;
        }
    }
}

/// Devices the device plugin withholds: capacity above allocatable.
fn from_capacity(s: &mut Signs, n: &NodeView<'_>) {
    for (r, cap) in &n.capacity {
        let alloc = n.allocatable_of(r);
        if alloc > 0 && alloc < *cap {
            s.evidence.push(format!(
                "{r}: capacity {cap}, allocatable {alloc}: the device plugin withholds {} unhealthy device(s)",
                cap - alloc
            ));
            s.raise(Severity::Warning);
            s.app_only = false;
        }
    }
}

/// The one finding the signs add up to, if any sign was seen.
fn health_finding(
    n: &NodeView<'_>,
    s: Signs,
    report: &Published,
    cond: Option<&k8s_openapi::api::core::v1::NodeCondition>,
) -> Option<Finding> {
    let Signs {
        evidence,
        severity,
        classes,
        lost,
        gpus,
        app_only,
    } = s;
    let severity = severity?;
    let worst = classes
        .iter()
        .copied()
        .filter(|c| *c != XidClass::Application || app_only)
        .max_by_key(|c| class_rank(*c))
        .unwrap_or(XidClass::ResetGpu);
    let gpu_list = gpus.iter().cloned().collect::<Vec<_>>().join(",");
    // Without an index, the title counts what the device plugin withholds instead.
    let withheld: i64 = n
        .capacity
        .iter()
        .map(|(r, cap)| (cap - n.allocatable_of(r)).max(0))
        .max()
        .unwrap_or(0);
    let which = match (gpus.len(), withheld) {
        (0, 0) => "a GPU (no index reported)".to_string(),
        (0, 1) => "1 GPU device".to_string(),
        (0, w) => format!("{w} GPU devices"),
        _ => format!("GPU {gpu_list}"),
    };
    let (code, title) = if app_only {
        (
            "xid-application",
            format!("Node {}: application XIDs (the GPUs are fine)", n.name),
        )
    } else if lost {
        (
            "gpu-lost",
            format!("Node {}: a GPU fell off the bus or is lost", n.name),
        )
    } else if cond.is_some_and(|c| c.status == "False")
        || matches!(report, Published::Report(r) if !r.problems.is_empty())
        || classes.iter().any(|c| class_rank(*c) >= 4)
    {
        (
            "gpu-unhealthy",
            format!("Node {}: {which} unhealthy", n.name),
        )
    } else {
        (
            "unhealthy-devices",
            format!(
                "Node {}: unhealthy GPU devices withheld from scheduling",
                n.name
            ),
        )
    };
    let mut f =
        Finding::new(severity, Category::Health, code, title).object(ObjectRef::node(n.name));
    f.evidence = evidence;
    let fix = if code == "unhealthy-devices" && classes.is_empty() {
        withheld_fix(n)
    } else {
        fix_for(worst, n, &gpu_list, lost)
    };
    f = f.fix(fix);
    for cmd in health_commands(worst, n, lost, code) {
        f = f.command(cmd);
    }
    Some(f)
}

/// The complete commands [`fix_for`] / [`withheld_fix`] name (nvidia-smi runs on the node, so
/// only the kubectl ones).
fn health_commands(class: XidClass, n: &NodeView<'_>, lost: bool, code: &str) -> Vec<String> {
    let node = n.name;
    if code == "unhealthy-devices" && !lost {
        return vec![
            match n.agents.first() {
                Some(a) => format!(
                    "kubectl -n {} logs {}",
                    a.metadata.namespace.as_deref().unwrap_or("default"),
                    a.metadata.name.as_deref().unwrap_or("")
                ),
                None => {
                    format!("kubectl get pods -A -o wide --field-selector spec.nodeName={node}")
                }
            },
            format!("kubectl describe node {node}"),
        ];
    }
    let drain = vec![
        format!("kubectl cordon {node}"),
        n.drain(),
        format!("kubectl uncordon {node}"),
    ];
    if lost || matches!(class, XidClass::RebootNode | XidClass::Drain) {
        return drain;
    }
    match class {
        XidClass::ResetGpu => drain[..2].to_vec(),
        _ => Vec::new(),
    }
}

/// Devices withheld with no condition or XID saying which: the agent's log does.
fn withheld_fix(n: &NodeView<'_>) -> String {
    let log = match n.agents.first() {
        Some(a) => format!(
            "kubectl -n {} logs {}",
            a.metadata.namespace.as_deref().unwrap_or("NS"),
            a.metadata.name.as_deref().unwrap_or("POD")
        ),
        None => format!(
            "find its pod with kubectl get pods -A -o wide --field-selector spec.nodeName={}",
            n.name
        ),
    };
    format!(
        "the device plugin's log says which devices it marks unhealthy and why ({log}); so does \
         kubectl describe node {0} when the agent sets GPUHealthy; reset a faulty GPU \
         (nvidia-smi -r -i with the index the log names) or drain and reboot {0}; the plugin advertises the device again \
         once it is healthy",
        n.name
    )
}

fn metrics_only(name: &str, host: &Host) -> Vec<Finding> {
    let fatal: Vec<&(String, String, u64)> = host
        .xids
        .keys()
        .filter(|(_, _, x)| xid::is_fatal(*x))
        .collect();
    if fatal.is_empty() && host.unhealthy.is_empty() {
        return Vec::new();
    }
    let mut f = Finding::new(
        Severity::Warning,
        Category::Health,
        "gpu-unhealthy",
        format!("Host {name} (in metrics, not a cluster node) reports GPU faults"),
    )
    .object(ObjectRef::node(name));
    for (gpu, uuid, x) in fatal {
        let info = xid::describe(*x);
        f = f.evidence(format!(
            "XID {x} on GPU {gpu} {uuid}: {}; action: {}",
            info.meaning, info.action
        ));
    }
    vec![f.fix(format!(
        "check the host {name}: its metrics name it, but no node of that name exists"
    ))]
}

#[cfg(test)]
mod tests {
    use super::{gpus_in, xids_in};
    use crate::testkit::*;

    #[test]
    fn xids_from_condition_messages() {
        assert_eq!(
            xids_in("GPU 3 (GPU-a): XID 48 (double-bit ECC error): drain; GPU 4: Xid 79"),
            vec![48, 79]
        );
        assert!(xids_in("all healthy").is_empty());
    }

    #[test]
    fn no_index_reported_is_counted_not_printed_as_a_placeholder() {
        // The agent's wording on a node where it names no index; the plugin withholds 2 of 8.
        let mut n = gpu_node("g1", "nvidia.com/gpu", 8);
        set_resource(&mut n, "nvidia.com/gpu", 8, 6);
        condition(
            &mut n,
            "GPUHealthy",
            "False",
            "XidError",
            "GPU unhealthy: XID 48",
        );
        let f = run(&snapshot(vec![n.clone()], vec![], vec![]));
        let got = one(&f, "gpu-unhealthy");
        assert_eq!(got.title, "Node g1: 2 GPU devices unhealthy");
        assert!(
            !format!("{f:?}").contains("<index>") && got.fix.contains("nvidia-smi -r;"),
            "{got:#?}"
        );
        // Nothing withheld and no index: said in words.
        let mut n = gpu_node("g2", "nvidia.com/gpu", 8);
        condition(
            &mut n,
            "GPUHealthy",
            "False",
            "XidError",
            "GPU unhealthy: XID 48",
        );
        let f = run(&snapshot(vec![n], vec![], vec![]));
        assert_eq!(
            one(&f, "gpu-unhealthy").title,
            "Node g2: a GPU (no index reported) unhealthy"
        );
    }

    #[test]
    fn gpu_indexes_from_condition_messages() {
        let got = |m: &str| gpus_in(m).into_iter().collect::<Vec<_>>();
        // The agent's wording on a one-GPU node: `GPU unhealthy` is no index.
        assert_eq!(
            got(
                "1 of 1 GPU unhealthy: GPU 0 (GPU-0): XID 79 (GPU has fallen off the bus): reboot the node"
            ),
            vec!["0"]
        );
        assert_eq!(
            got(
                "2 of 8 GPUs unhealthy: GPU 2 (GPU-2): XID 48 (double-bit ECC error): drain the node and reset the GPU; GPU 6 (GPU-6): lost"
            ),
            vec!["2", "6"]
        );
        assert!(got("all 8 GPUs are healthy").is_empty());
    }

    fn report(problems: &str) -> String {
        format!("{{\"version\":1,\"problems\":[{problems}]}}")
    }

    #[test]
    fn the_agents_health_annotation_wins_over_the_conditions_prose() {
        // The condition's wording changed (no "GPU n" in it): the annotation still names GPU 3.
        let mut n = gpu_node("gpu-1", "nvidia.com/gpu", 8);
        set_resource(&mut n, "nvidia.com/gpu", 8, 7);
        condition(
            &mut n,
            "GPUHealthy",
            "False",
            "XidError",
            "one device is unwell",
        );
        annotate(
            &mut n,
            "gpuops.io/gpu-health",
            &report(r#"{"gpu_index":3,"gpu_uuid":"GPU-3","kind":"xid","xid":48}"#),
        );
        let f = run(&snapshot(vec![n.clone()], vec![], vec![]));
        let got = one(&f, "gpu-unhealthy");
        assert_eq!(got.severity, crate::Severity::Critical);
        assert!(got.title.contains("GPU 3 unhealthy"), "{got:#?}");
        assert!(got.fix.contains("nvidia-smi -r -i 3"), "{}", got.fix);
        assert!(
            got.evidence
                .iter()
                .any(|e| e.contains("gpuops.io/gpu-health: GPU 3 (GPU-3): XID 48")),
            "{got:#?}"
        );
        assert!(
            got.commands
                .iter()
                .any(|c| c == "kubectl drain gpu-1 --ignore-daemonsets --delete-emptydir-data")
        );

        // A lost GPU in the annotation, whatever the condition says.
        let mut lost = gpu_node("gpu-2", "nvidia.com/gpu", 8);
        condition(
            &mut lost,
            "GPUHealthy",
            "False",
            "GPUProblems",
            "see annotation",
        );
        annotate(
            &mut lost,
            "gpuops.io/gpu-health",
            &report(r#"{"gpu_index":5,"kind":"lost"}"#),
        );
        one(&run(&snapshot(vec![lost], vec![], vec![])), "gpu-lost");

        // Look-alike: the annotation lists no problem and the condition is True: quiet.
        let mut ok = gpu_node("gpu-3", "nvidia.com/gpu", 8);
        condition(
            &mut ok,
            "GPUHealthy",
            "True",
            "AllGPUsHealthy",
            "all 8 GPUs are healthy",
        );
        annotate(&mut ok, "gpuops.io/gpu-health", &report(""));
        assert!(
            run(&snapshot(vec![ok], vec![], vec![]))
                .iter()
                .all(|f| f.category != crate::Category::Health)
        );
    }

    #[test]
    fn a_malformed_health_annotation_is_a_finding_and_the_condition_still_counts() {
        for bad in ["{not json", r#"{"version":7,"problems":[]}"#] {
            let mut n = gpu_node("gpu-1", "nvidia.com/gpu", 8);
            condition(
                &mut n,
                "GPUHealthy",
                "False",
                "XidError",
                "1 of 8 GPUs unhealthy: GPU 2 (GPU-2): XID 48 (double-bit ECC error): drain the node and reset the GPU",
            );
            annotate(&mut n, "gpuops.io/gpu-health", bad);
            let f = run(&snapshot(vec![n], vec![], vec![]));
            let got = one(&f, "gpu-health-annotation-invalid");
            assert_eq!(got.severity, crate::Severity::Warning);
            assert!(
                got.evidence[0].starts_with("gpuops.io/gpu-health: ")
                    && got.evidence[0].len() > "gpuops.io/gpu-health: ".len(),
                "{got:#?}"
            );
            assert_eq!(
                got.commands,
                vec!["kubectl annotate node gpu-1 gpuops.io/gpu-health-"]
            );
            // Fallback: the older reading of the condition.
            assert!(one(&f, "gpu-unhealthy").fix.contains("nvidia-smi -r -i 2"));
        }
    }

    #[test]
    fn withheld_devices_without_a_cause_point_at_the_plugin_log() {
        let mut n = gpu_node("gpu-1", "nvidia.com/gpu", 8);
        set_resource(&mut n, "nvidia.com/gpu", 8, 6);
        let f = run(&snapshot(vec![n], vec![], vec![]));
        let got = one(&f, "unhealthy-devices");
        assert_eq!(got.severity, crate::Severity::Warning);
        assert!(got.evidence[0].contains("withholds 2"), "{got:#?}");
        assert!(
            got.fix.contains("--field-selector spec.nodeName=gpu-1")
                && got.fix.contains("kubectl describe node gpu-1")
                && !got.fix.contains("  "),
            "{}",
            got.fix
        );
    }

    #[test]
    fn condition_false_with_a_fatal_xid() {
        let mut n = gpu_node("gpu-1", "nvidia.com/gpu", 8);
        set_resource(&mut n, "nvidia.com/gpu", 8, 7);
        condition(
            &mut n,
            "GPUHealthy",
            "False",
            "XidError",
            "GPU 3 (GPU-3): XID 48 (double-bit ECC error): drain the node and reset the GPU",
        );
        taint(&mut n, "gpuops.io/gpu-unhealthy", "XidError", "NoSchedule");
        let f = run(&snapshot(vec![n], vec![], vec![]));
        let got = one(&f, "gpu-unhealthy");
        assert_eq!(got.severity, crate::Severity::Critical);
        assert!(
            got.fix.contains("kubectl drain gpu-1") && got.fix.contains("nvidia-smi -r -i 3"),
            "{}",
            got.fix
        );
        assert!(
            got.evidence.iter().any(|e| e.contains("withholds 1")),
            "{got:#?}"
        );
    }

    #[test]
    fn lost_gpu_from_metrics_and_condition() {
        let mut n = gpu_node("gpu-1", "nvidia.com/gpu", 8);
        condition(
            &mut n,
            "GPUHealthy",
            "False",
            "GPULost",
            "GPU 5 (GPU-5): lost, fell off the bus: reboot the node",
        );
        let mut s = snapshot(vec![n], vec![], vec![]);
        s.metrics = vec![
            sample("gpuops_node_gpus", &[("Hostname", "gpu-1")], 8.0),
            sample("gpuops_node_gpus_healthy", &[("Hostname", "gpu-1")], 7.0),
        ];
        let f = run(&s);
        assert!(one(&f, "gpu-lost").fix.contains("reboot"));
    }

    #[test]
    fn application_xids_are_info_and_healthy_nodes_are_quiet() {
        let n = gpu_node("gpu-1", "nvidia.com/gpu", 8);
        let mut s = snapshot(vec![n.clone()], vec![], vec![]);
        s.metrics = vec![sample(
            "gpuops_xid_errors_total",
            &[
                ("Hostname", "gpu-1"),
                ("gpu", "0"),
                ("UUID", "GPU-0"),
                ("err_code", "13"),
                ("namespace", "ml"),
                ("pod", "t"),
            ],
            2.0,
        )];
        let f = run(&s);
        let got = one(&f, "xid-application");
        assert_eq!(got.severity, crate::Severity::Info);
        assert!(got.evidence[0].contains("ml/t"));

        let mut healthy = n;
        condition(
            &mut healthy,
            "GPUHealthy",
            "True",
            "AllGPUsHealthy",
            "8 GPUs healthy",
        );
        let mut s = snapshot(vec![healthy], vec![], vec![]);
        s.metrics = vec![
            sample("gpuops_node_gpus", &[("Hostname", "gpu-1")], 8.0),
            sample("gpuops_node_gpus_healthy", &[("Hostname", "gpu-1")], 8.0),
            sample(
                "gpuops_device_healthy",
                &[("Hostname", "gpu-1"), ("gpu", "0")],
                1.0,
            ),
        ];
        assert!(
            run(&s)
                .iter()
                .all(|f| f.category != crate::Category::Health)
        );
    }

    #[test]
    fn fatal_xid_that_recovered_is_a_warning() {
        let n = gpu_node("gpu-1", "nvidia.com/gpu", 8);
        let mut s = snapshot(vec![n], vec![], vec![]);
        s.metrics = vec![sample(
            "gpuops_xid_errors_total",
            &[
                ("Hostname", "gpu-1"),
                ("gpu", "2"),
                ("UUID", "GPU-2"),
                ("err_code", "79"),
            ],
            1.0,
        )];
        let f = run(&s);
        let got = one(&f, "gpu-unhealthy");
        assert_eq!(got.severity, crate::Severity::Warning);
        assert!(got.fix.contains("reboot"));
    }
}
