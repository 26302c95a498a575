//! The last rule: a GPU workload that is plainly broken while no other rule said why. A GPU pod
//! pending past the grace period, failed, or bound with a container that does not run, and a
//! controller of GPU pods with Warning events, get an `unexplained` finding quoting what was
//! seen, so the doctor never answers "No problems found" for them.

use super::kubelet::{pod_texts, working};
use super::refused::{controller_of, gpu_workload, has_every_pod, replicas_line};
use crate::Options;
use crate::cluster::{Cluster, PodView, describe_event, human_duration, seconds_between};
use crate::finding::{Category, Finding, ObjectRef, Severity};
use crate::snapshot::Controller;
use std::collections::BTreeSet;

/// Kinds of controllers whose Warning events count.
const CONTROLLERS: &[&str] = &[
    "ReplicaSet",
    "Deployment",
    "Job",
    "StatefulSet",
    "DaemonSet",
];

/// Lines of evidence quoted per object.
const QUOTED: usize = 6;

pub(super) fn check(c: &Cluster<'_>, o: &Options, found: &[Finding]) -> Vec<Finding> {
    let named: BTreeSet<(&str, Option<&str>, &str)> = found
        .iter()
        .flat_map(|f| f.objects.iter())
        .map(|r| (r.kind.as_str(), r.namespace.as_deref(), r.name.as_str()))
        .collect();
    let mut out: Vec<Finding> = c
        .gpu_pods
        .iter()
        .filter(|p| !named.contains(&("Pod", Some(p.namespace), p.name)))
        .filter(|p| !owner_named(p, &named))
        .filter_map(|p| pod(c, o, p))
        .collect();
    let mut seen = BTreeSet::new();
    for e in c.all_events() {
        let r = &e.involved_object;
        let kind = r.kind.as_deref().unwrap_or("");
        if e.type_.as_deref() != Some("Warning") || !CONTROLLERS.contains(&kind) {
            continue;
        }
        let ns = r.namespace.as_deref().unwrap_or("default");
        let name = r.name.as_deref().unwrap_or("");
        if named.contains(&(kind, Some(ns), name)) || !seen.insert((kind, ns, name)) {
            continue;
        }
        let ctl = controller_of(c, kind, ns, name);
        // It has every pod it wants: the Warning (a quota during a rollout's surge, a refusal
        // since lifted) is over, and events stay an hour. Its pods, if broken, are found above.
        if has_every_pod(ctl) {
            continue;
        }
        if ctl
            .and_then(|x| x.owner.as_ref())
            .is_some_and(|(k, n)| named.contains(&(k.as_str(), Some(ns), n.as_str())))
        {
            continue;
        }
        let mentions = e
            .message
            .as_deref()
            .is_some_and(|m| m.contains("nvidia.com/"));
        if !mentions && !gpu_workload(c, ctl, kind, ns, name) {
            continue;
        }
        out.push(controller(c, kind, ns, name, ctl));
    }
    out
}

/// Whether a finding already names the controller that owns the pod.
fn owner_named(p: &PodView<'_>, named: &BTreeSet<(&str, Option<&str>, &str)>) -> bool {
    p.pod
        .metadata
        .owner_references
        .iter()
        .flatten()
        .any(|r| named.contains(&(r.kind.as_str(), Some(p.namespace), r.name.as_str())))
}

/// Why the pod counts as broken, if it does.
fn broken(c: &Cluster<'_>, o: &Options, p: &PodView<'_>) -> Option<String> {
    if working(p) || p.pod.metadata.deletion_timestamp.is_some() {
        return None;
    }
    let age = p
        .created()
        .map_or(i64::MAX, |t| seconds_between(c.now(), t));
    let old = age >= o.pending_grace.as_secs() as i64;
    let waited = human_duration(age.min(10 * 365 * 86_400));
    match p.phase {
        "Failed" => Some("failed".to_string()),
        "Pending" | "" if p.node.is_none() => {
            let tried = c.pod_event(p, "FailedScheduling").is_some();
            (old || tried).then(|| format!("pending and unscheduled for {waited}"))
        }
        "Pending" | "" => old.then(|| {
            format!(
                "bound to {} but not started for {waited}",
                p.node.unwrap_or("")
            )
        }),
        "Running" => {
            let waiting: Vec<String> = p
                .pod
                .status
                .as_ref()
                .and_then(|s| s.container_statuses.as_ref())
                .into_iter()
                .flatten()
                .filter_map(|cs| {
                    let w = cs.state.as_ref()?.waiting.as_ref()?;
                    Some(format!(
                        "{} {}",
                        cs.name,
                        w.reason.as_deref().unwrap_or("waiting")
                    ))
                })
                .collect();
            (!waiting.is_empty() && old).then(|| {
                format!(
                    "running with containers not running ({})",
                    waiting.join(", ")
                )
            })
        }
        "Succeeded" => None,
        other => old.then(|| format!("in phase {other}")),
    }
}

fn pod(c: &Cluster<'_>, o: &Options, p: &PodView<'_>) -> Option<Finding> {
    let why = broken(c, o, p)?;
    let failed = p.phase == "Failed";
    let who = format!("{}/{}", p.namespace, p.name);
    let mut f = Finding::new(
        if failed {
            Severity::Critical
        } else {
            Severity::Warning
        },
        Category::Workload,
        "unexplained",
        format!("GPU pod {who} is {why}, and no rule explains it"),
    )
    .object(ObjectRef::pod(p.namespace, p.name));
    if let Some(n) = p.node {
        f = f.object(ObjectRef::node(n));
    }
    let texts = pod_texts(c, p);
    for (line, _) in texts.iter().take(QUOTED) {
        f = f.evidence(line.clone());
    }
    if let Some(cond) = p
        .pod
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .find(|cond| cond.status == "False" && cond.message.is_some())
        .filter(|_| texts.is_empty())
    {
        f = f.evidence(format!(
            "condition {}=False {}: {}",
            cond.type_,
            cond.reason.as_deref().unwrap_or(""),
            cond.message.as_deref().unwrap_or("")
        ));
    }
    // Nothing went wrong in words: the newest event says what it is doing (pulling a large image).
    if f.evidence.is_empty()
        && let Some(e) = c.events_for("Pod", p.namespace, p.name).first()
    {
        f = f.evidence(describe_event(e, c.now()));
    }
    if f.evidence.is_empty() {
        f = f.evidence(format!(
            "phase {}, no reason, message or Warning event recorded",
            if p.phase.is_empty() { "unset" } else { p.phase }
        ));
    }
    let describe = format!("kubectl -n {} describe pod {}", p.namespace, p.name);
    Some(
        f.fix(format!(
            "the doctor knows no cause for this: read the reasons and events above and the pod's \
             full state ({describe}){}",
            match p.node {
                Some(n) => format!(", and the node's (kubectl describe node {n})"),
                None => String::new(),
            }
        ))
        .command(describe)
        .commands_from(p.node.map(|n| format!("kubectl describe node {n}"))),
    )
}

fn controller(
    c: &Cluster<'_>,
    kind: &str,
    ns: &str,
    name: &str,
    ctl: Option<&Controller>,
) -> Finding {
    let mut f = Finding::new(
        Severity::Warning,
        Category::Workload,
        "unexplained",
        format!("GPU workload {kind} {ns}/{name} has Warning events, and no rule explains them"),
    )
    .object(ObjectRef::namespaced(kind, ns, name));
    let mut reasons = BTreeSet::new();
    for e in c
        .events_for(kind, ns, name)
        .iter()
        .filter(|e| e.type_.as_deref() == Some("Warning"))
    {
        // One line per reason and message shape: the newest of each.
        if reasons.insert((e.reason.clone(), e.message.as_deref().map(shape)))
            && reasons.len() <= QUOTED
        {
            f = f.evidence(describe_event(e, c.now()));
        }
    }
    if let Some(line) = replicas_line(kind, ns, name, ctl) {
        f = f.evidence(line);
    }
    let describe = format!(
        "kubectl -n {ns} describe {} {name}",
        kind.to_ascii_lowercase()
    );
    f.fix(format!(
        "the doctor knows no cause for this: read the events above and the object ({describe})"
    ))
    .command(describe)
}

/// A message with the generated pod names taken out, so one failure repeated reads once.
fn shape(m: &str) -> String {
    m.split('"')
        .enumerate()
        .filter(|(i, _)| i % 2 == 0)
        .map(|(_, s)| s)
        .collect::<Vec<_>>()
        .join("\"\"")
}

#[cfg(test)]
mod tests {
    use crate::Severity;
    use crate::testkit::*;
    use k8s_openapi::api::core::v1::{ContainerState, ContainerStateWaiting};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

    #[test]
    fn failed_gpu_pods_no_rule_explains_are_critical() {
        let n = gpu_node("g1", "nvidia.com/gpu", 8);
        let mut p = running(pod("ml", "t", &[("nvidia.com/gpu", 1)]), "g1");
        let s = p.status.as_mut().unwrap();
        s.phase = Some("Failed".into());
        s.reason = Some("UnexpectedAdmissionError".into());
        s.message = Some("Pod was rejected: Allocate failed due to rpc error: code = Unknown desc = plugin exploded, which is unexpected".into());
        s.container_statuses = None;
        let f = run(&snapshot(vec![n.clone()], vec![p], vec![]));
        let got = one(&f, "unexplained");
        assert_eq!(got.severity, Severity::Critical);
        assert!(got.evidence[0].contains("plugin exploded"), "{got:#?}");
        assert!(crate::has_critical(&f));
        // A failed pod with nothing recorded still says so.
        let mut p = running(pod("ml", "t", &[("nvidia.com/gpu", 1)]), "g1");
        p.status.as_mut().unwrap().phase = Some("Failed".into());
        p.status.as_mut().unwrap().container_statuses = None;
        let f = run(&snapshot(vec![n.clone()], vec![p], vec![]));
        assert!(
            one(&f, "unexplained").evidence[0].contains("no reason"),
            "{f:#?}"
        );
    }

    #[test]
    fn stuck_and_crashing_pods_are_quoted() {
        let n = gpu_node("g1", "nvidia.com/gpu", 8);
        let mut p = running(pod("ml", "t", &[("nvidia.com/gpu", 1)]), "g1");
        let s = p.status.as_mut().unwrap();
        s.phase = Some("Pending".into());
        s.container_statuses.as_mut().unwrap()[0].ready = false;
        s.container_statuses.as_mut().unwrap()[0].state = Some(ContainerState {
            waiting: Some(ContainerStateWaiting {
                reason: Some("ContainerCreating".into()),
                message: None,
            }),
            ..ContainerState::default()
        });
        let e = event(
            "Pod",
            "ml",
            "t",
            "FailedMount",
            "MountVolume.SetUp failed for volume \"data\" : secret \"x\" not found",
            20,
        );
        let f = run(&snapshot(vec![n.clone()], vec![p.clone()], vec![e]));
        let got = one(&f, "unexplained");
        assert_eq!(got.severity, Severity::Warning);
        assert!(got.evidence.join("\n").contains("FailedMount"), "{got:#?}");
        assert_eq!(got.commands[0], "kubectl -n ml describe pod t");
        // No Warning at all: the newest Normal event says what it is doing.
        let mut pulling = event(
            "Pod",
            "ml",
            "t",
            "Pulling",
            "Pulling image \"nvcr.io/nvidia/pytorch:25.01-py3\"",
            200,
        );
        pulling.type_ = Some("Normal".into());
        let f = run(&snapshot(vec![n.clone()], vec![p.clone()], vec![pulling]));
        assert!(
            one(&f, "unexplained")
                .evidence
                .join("\n")
                .contains("Pulling image"),
            "{f:#?}"
        );
        // Look-alikes: a new pod, a running ready pod, a succeeded one.
        let young = created(p, 5);
        assert!(
            with_code(
                &run(&snapshot(vec![n.clone()], vec![young], vec![])),
                "unexplained"
            )
            .is_empty()
        );
        let ok = running(pod("ml", "ok", &[("nvidia.com/gpu", 1)]), "g1");
        let mut done = running(pod("ml", "done", &[("nvidia.com/gpu", 1)]), "g1");
        done.status.as_mut().unwrap().phase = Some("Succeeded".into());
        assert!(run(&snapshot(vec![n], vec![ok, done], vec![])).is_empty());
    }

    #[test]
    fn explained_pods_get_no_second_finding() {
        // The pending rule explains a pod too big for any node.
        let n = gpu_node("g1", "nvidia.com/gpu", 8);
        let f = run(&snapshot(
            vec![n],
            vec![pod("ml", "huge", &[("nvidia.com/gpu", 16)])],
            vec![],
        ));
        assert!(with_code(&f, "unexplained").is_empty(), "{f:#?}");
    }

    #[test]
    fn controllers_of_gpu_pods_with_warning_events() {
        let n = gpu_node("g1", "nvidia.com/gpu", 8);
        let mut p = running(pod("ml", "train-0", &[("nvidia.com/gpu", 1)]), "g1");
        p.metadata.owner_references = Some(vec![OwnerReference {
            kind: "StatefulSet".into(),
            name: "train".into(),
            controller: Some(true),
            ..OwnerReference::default()
        }]);
        let e = |m: &str| event("StatefulSet", "ml", "train", "FailedCreate", m, 10);
        let events = vec![
            e(
                "create Pod train-1 in StatefulSet train failed error: pods \"train-1\" is forbidden: unable to validate against any security context constraint",
            ),
            e(
                "create Pod train-1 in StatefulSet train failed error: pods \"train-1\" is forbidden: unable to validate against any security context constraint",
            ),
        ];
        let f = run(&snapshot(vec![n.clone()], vec![p.clone()], events.clone()));
        let got = one(&f, "unexplained");
        assert_eq!(got.evidence.len(), 1, "{got:#?}");
        // Look-alike: the same events about a controller of CPU pods.
        let cpu = running(pod("ml", "train-0", &[]), "g1");
        let mut cpu = cpu;
        cpu.metadata.owner_references = p.metadata.owner_references.clone();
        let f = run(&snapshot(vec![n.clone()], vec![cpu], events.clone()));
        assert!(with_code(&f, "unexplained").is_empty(), "{f:#?}");

        // The StatefulSet short of a pod still gets the finding; with every pod it wants, the
        // events describe a failure that is over (a healthy cluster gets no finding).
        for (current, found) in [(1, true), (2, false)] {
            let mut s = snapshot(vec![n.clone()], vec![p.clone()], events.clone());
            s.controllers = vec![crate::snapshot::Controller {
                kind: "StatefulSet".into(),
                namespace: "ml".into(),
                name: "train".into(),
                replicas: Some(2),
                current: Some(current),
                owner: None,
                template: None,
            }];
            let f = run(&s);
            assert_eq!(!with_code(&f, "unexplained").is_empty(), found, "{f:#?}");
        }
    }
}
