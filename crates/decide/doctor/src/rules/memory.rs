//! Memory: containers of GPU pods OOMKilled (host memory), CUDA out-of-memory in their logs, and
//! time-sliced pods that share one GPU's memory.

use crate::Options;
use crate::cluster::{Cluster, PodView, ago, list_some};
use crate::finding::{Category, Finding, ObjectRef, Severity};
use crate::resources;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use std::collections::BTreeSet;

/// Log lines that mean the GPU ran out of memory (PyTorch, CUDA runtime, cuBLAS, TensorFlow, JAX).
const CUDA_OOM: &[&str] = &[
    "cuda out of memory",
    "cuda error: out of memory",
    "cudaerrormemoryallocation",
    "torch.outofmemoryerror",
    "torch.cuda.outofmemoryerror",
    "cublas_status_alloc_failed",
    "resource_exhausted: out of memory",
    "failed to allocate memory on device",
    "out of memory while trying to allocate",
];

pub(super) fn check(c: &Cluster<'_>, _o: &Options) -> Vec<Finding> {
    let mut out: Vec<Finding> = c.gpu_pods.iter().filter_map(|p| oom_killed(c, p)).collect();
    out.extend(cuda_oom(c));
    out
}

fn oom_killed(c: &Cluster<'_>, p: &PodView<'_>) -> Option<Finding> {
    let statuses = p.pod.status.as_ref()?.container_statuses.as_ref()?;
    let mut evidence = Vec::new();
    let mut first = None;
    for cs in statuses {
        for (when, st) in [("now", cs.state.as_ref()), ("last", cs.last_state.as_ref())] {
            let Some(t) = st.and_then(|s| s.terminated.as_ref()) else {
                continue;
            };
            if t.reason.as_deref() != Some("OOMKilled") {
                continue;
            }
            let limit = p
                .pod
                .spec
                .as_ref()
                .and_then(|s| s.containers.iter().find(|k| k.name == cs.name))
                .and_then(|k| {
                    k.resources
                        .as_ref()?
                        .limits
                        .as_ref()?
                        .get("memory")
                        .map(|q| q.0.clone())
                });
            evidence.push(format!(
                "container {} ({when} state): OOMKilled, exit code {}, {}restarts {}; memory limit {}",
                cs.name,
                t.exit_code,
                t.finished_at.as_ref().map(|f| format!("{}, ", ago(c.now(), f.0))).unwrap_or_default(),
                cs.restart_count,
                limit.clone().unwrap_or_else(|| "none (the node ran out)".into())
            ));
            first.get_or_insert((cs.name.clone(), limit));
        }
    }
    let (container, limit) = first?;
    let mut f = Finding::new(
        Severity::Warning,
        Category::Memory,
        "oom-killed",
        format!(
            "Pod {}/{}: container {container} was OOMKilled (host memory, not GPU memory)",
            p.namespace, p.name
        ),
    )
    .object(ObjectRef::pod(p.namespace, p.name));
    f.evidence = evidence;
    let ns = p.namespace;
    let doubled = limit
        .as_ref()
        .and_then(|l| resources::value(&Quantity(l.clone())))
        .map(|b| resources::bytes(b * 2.0));
    let (target, how) = owner_target(p);
    Some(match (limit, doubled) {
        (Some(l), Some(d)) => match (target, how) {
            (Some(t), Editable::SetResources) => {
                let cmd = format!(
                    "kubectl -n {ns} set resources {t} -c {container} --limits=memory={d} --requests=memory={d}"
                );
                f.fix(format!(
                    "the container's RAM (page cache, data loaders, pinned host buffers) exceeded {l}: \
                     raise it in the owner's template (a pod's resources cannot be changed in place): \
                     {cmd}; or lower data-loader workers / prefetch"
                ))
                .command(cmd)
            }
            (Some(t), Editable::Recreate) => f.fix(format!(
                "the container's RAM exceeded {l}: {t}'s pod template cannot be changed; create it again \
                 with memory {d} for {container} (kubectl -n {ns} get {t} -o yaml, raise the limit, delete \
                 and apply it), or lower data-loader workers / prefetch"
            ))
            .command(format!("kubectl -n {ns} get {t} -o yaml")),
            (None, _) => f.fix(format!(
                "the container's RAM exceeded {l}: a bare pod's resources cannot be changed in place; \
                 recreate it with memory {d} for {container}: kubectl -n {ns} get pod {} -o yaml > pod.yaml, \
                 raise the limit in pod.yaml, then kubectl replace --force -f pod.yaml",
                p.name
            ))
            .command(format!("kubectl -n {ns} get pod {} -o yaml", p.name)),
        },
        _ => f.fix(format!(
            "set a memory request and limit for {container} sized for its peak (the node itself ran out of memory)"
        )),
    })
}

enum Editable {
    /// `kubectl set resources` changes the template (Deployment, StatefulSet, DaemonSet...).
    SetResources,
    /// The template is immutable (Job) or unknown: create it again.
    Recreate,
}

/// The object whose pod template makes this pod: a ReplicaSet's Deployment (from the
/// pod-template-hash the ReplicaSet's name ends with), else the controller itself.
fn owner_target(p: &PodView<'_>) -> (Option<String>, Editable) {
    let Some(o) = p
        .pod
        .metadata
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true))
    else {
        return (None, Editable::Recreate);
    };
    let hash = p
        .pod
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get("pod-template-hash"));
    match o.kind.as_str() {
        "ReplicaSet" => match hash.and_then(|h| o.name.strip_suffix(&format!("-{h}"))) {
            Some(d) => (Some(format!("deployment/{d}")), Editable::SetResources),
            None => (
                Some(format!("replicaset/{}", o.name)),
                Editable::SetResources,
            ),
        },
        "StatefulSet" | "DaemonSet" | "ReplicationController" => (
            Some(format!("{}/{}", o.kind.to_ascii_lowercase(), o.name)),
            Editable::SetResources,
        ),
        _ => (
            Some(format!("{}/{}", o.kind.to_ascii_lowercase(), o.name)),
            Editable::Recreate,
        ),
    }
}

fn cuda_oom(c: &Cluster<'_>) -> Vec<Finding> {
    let mut out = Vec::new();
    for log in &c.snapshot.logs {
        let hits: Vec<&str> = log
            .text
            .lines()
            .filter(|l| {
                let lower = l.to_ascii_lowercase();
                CUDA_OOM.iter().any(|p| lower.contains(p))
            })
            .collect();
        let Some(last) = hits.last() else { continue };
        let pod = c
            .gpu_pods
            .iter()
            .find(|p| p.namespace == log.namespace && p.name == log.pod);
        let mut f = Finding::new(
            Severity::Warning,
            Category::Memory,
            "cuda-oom",
            format!(
                "Pod {}/{}: CUDA out of memory in container {}",
                log.namespace, log.pod, log.container
            ),
        )
        .object(ObjectRef::pod(&log.namespace, &log.pod))
        .evidence(format!(
            "{} log{}: {}",
            log.container,
            if log.previous {
                " (previous instance)"
            } else {
                ""
            },
            truncate(last.trim(), 300)
        ));
        if hits.len() > 1 {
            f = f.evidence(format!("{} matching lines in the excerpt", hits.len()));
        }
        let mut fix = "the GPU's memory is too small for the batch/model: lower the batch size, use activation \
                       checkpointing or mixed precision, or request a larger GPU / MIG profile"
            .to_string();
        if let Some(p) = pod {
            if let Some(shared) = sharing(c, p) {
                f.title = format!(
                    "Pod {}/{}: CUDA out of memory on a time-sliced GPU shared with other pods",
                    log.namespace, log.pod
                );
                f = f.evidence(shared.0).objects(shared.1);
                fix = "time-slicing shares one GPU's memory with no isolation: request a whole GPU or a MIG \
                       instance (isolated memory), use MPS with a per-client memory limit, or cap each process \
                       (torch.cuda.set_per_process_memory_fraction, XLA_PYTHON_CLIENT_MEM_FRACTION)"
                    .to_string();
            }
            for (r, n) in &p.gpus {
                f = f.evidence(format!("requests {r}: {n}"));
            }
        }
        out.push(f.fix(fix));
    }
    out
}

/// Whether the pod holds a time-sliced replica, and the other pods on the same GPU (from metrics
/// when they name the pod's GPU, else the node's pods holding the same shared resource).
fn sharing(c: &Cluster<'_>, p: &PodView<'_>) -> Option<(String, Vec<ObjectRef>)> {
    let node = c.node(p.node?)?;
    let (r, _) = p.gpus.iter().find(|(r, _)| node.is_shared(r))?;
    let uuids: BTreeSet<&str> = c
        .snapshot
        .metrics
        .iter()
        .filter(|s| s.label("namespace") == Some(p.namespace) && s.label("pod") == Some(p.name))
        .filter_map(|s| s.label("UUID"))
        .collect();
    let mut others: BTreeSet<(String, String)> = BTreeSet::new();
    if uuids.is_empty() {
        for &i in &node.gpu_pods {
            let q = &c.gpu_pods[i];
            if q.gpus.contains_key(r) && !(q.namespace == p.namespace && q.name == p.name) {
                others.insert((q.namespace.to_string(), q.name.to_string()));
            }
        }
    } else {
        for s in &c.snapshot.metrics {
            if s.label("UUID").is_some_and(|u| uuids.contains(u))
                && let (Some(ns), Some(pod)) = (s.label("namespace"), s.label("pod"))
                && !(ns == p.namespace && pod == p.name)
            {
                others.insert((ns.to_string(), pod.to_string()));
            }
        }
    }
    let where_ = if uuids.is_empty() {
        format!("node {}", node.name)
    } else {
        uuids.iter().copied().collect::<Vec<_>>().join(", ")
    };
    let text = format!(
        "{r} is time-sliced ({} replicas per GPU): it shares {where_} with {}",
        node.replicas(r),
        if others.is_empty() {
            "no other pod right now".to_string()
        } else {
            list_some(others.iter().map(|(ns, n)| format!("{ns}/{n}")), 6)
        }
    );
    Some((
        text,
        others
            .iter()
            .take(6)
            .map(|(ns, n)| ObjectRef::pod(ns, n))
            .collect(),
    ))
}

fn truncate(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

#[cfg(test)]
mod tests {
    use crate::snapshot::LogExcerpt;
    use crate::testkit::*;
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

    #[test]
    fn oom_killed_gpu_containers() {
        let n = gpu_node("gpu-1", "nvidia.com/gpu", 8);
        let p = terminated(
            running(pod("ml", "t", &[("nvidia.com/gpu", 1)]), "gpu-1"),
            "OOMKilled",
            137,
            true,
        );
        let f = run(&snapshot(vec![n.clone()], vec![p.clone()], vec![]));
        let got = one(&f, "oom-killed");
        assert!(got.evidence[0].contains("exit code 137"), "{got:#?}");
        // A bare pod: no `set resources pod/...` (rejected); recreate it. No limit here: none advised.
        assert!(
            got.commands.is_empty() && !got.fix.contains("set resources"),
            "{got:#?}"
        );
        // With a limit, owned by a Deployment's ReplicaSet: the Deployment's template, doubled.
        let mut owned = p;
        owned.spec.as_mut().unwrap().containers[0]
            .resources
            .as_mut()
            .unwrap()
            .limits
            .as_mut()
            .unwrap()
            .insert("memory".into(), Quantity("8Gi".into()));
        owned.metadata.labels =
            Some([("pod-template-hash".to_string(), "7d9f".to_string())].into());
        owned.metadata.owner_references = Some(vec![OwnerReference {
            kind: "ReplicaSet".into(),
            name: "train-7d9f".into(),
            controller: Some(true),
            ..OwnerReference::default()
        }]);
        let f = run(&snapshot(vec![n.clone()], vec![owned.clone()], vec![]));
        assert_eq!(
            one(&f, "oom-killed").commands,
            vec![
                "kubectl -n ml set resources deployment/train -c main --limits=memory=16Gi --requests=memory=16Gi"
            ]
        );
        // Bare with a limit: recreate.
        owned.metadata.owner_references = None;
        let f = run(&snapshot(vec![n.clone()], vec![owned.clone()], vec![]));
        let got = one(&f, "oom-killed");
        assert!(
            got.fix.contains("recreate it with memory 16Gi"),
            "{}",
            got.fix
        );
        assert_eq!(got.commands, vec!["kubectl -n ml get pod t -o yaml"]);
        // A Job's template is immutable: recreate the Job.
        owned.metadata.owner_references = Some(vec![OwnerReference {
            kind: "Job".into(),
            name: "train".into(),
            controller: Some(true),
            ..OwnerReference::default()
        }]);
        let f = run(&snapshot(vec![n.clone()], vec![owned], vec![]));
        assert!(
            one(&f, "oom-killed")
                .fix
                .contains("job/train's pod template cannot be changed")
        );
        // Look-alike: exit 137 from a plain kill (Error), and a completed container.
        let p = terminated(
            running(pod("ml", "t", &[("nvidia.com/gpu", 1)]), "gpu-1"),
            "Error",
            137,
            true,
        );
        let q = terminated(
            running(pod("ml", "u", &[("nvidia.com/gpu", 1)]), "gpu-1"),
            "Completed",
            0,
            false,
        );
        assert!(with_code(&run(&snapshot(vec![n], vec![p, q], vec![])), "oom-killed").is_empty());
    }

    fn log(pod: &str, text: &str) -> LogExcerpt {
        LogExcerpt {
            namespace: "ml".into(),
            pod: pod.into(),
            container: "main".into(),
            previous: true,
            text: text.into(),
        }
    }

    #[test]
    fn cuda_oom_and_time_slicing() {
        let torch = "Traceback...\ntorch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.19 GiB of which 1.2 GiB is free.";
        let n = gpu_node("gpu-1", "nvidia.com/gpu", 8);
        let mut s = snapshot(
            vec![n],
            vec![running(pod("ml", "t", &[("nvidia.com/gpu", 1)]), "gpu-1")],
            vec![],
        );
        s.logs = vec![log("t", torch)];
        let f = run(&s);
        let got = one(&f, "cuda-oom");
        assert!(
            got.evidence[0].contains("Tried to allocate 2.00 GiB")
                && got.fix.contains("batch size"),
            "{got:#?}"
        );

        let mut ts = gpu_node("ts-1", "nvidia.com/gpu", 32);
        label(&mut ts, "nvidia.com/gpu.replicas", "4");
        label(&mut ts, "nvidia.com/gpu.sharing-strategy", "time-slicing");
        let mut s = snapshot(
            vec![ts],
            vec![
                running(pod("ml", "a", &[("nvidia.com/gpu", 1)]), "ts-1"),
                running(pod("ml", "b", &[("nvidia.com/gpu", 1)]), "ts-1"),
                running(pod("ml", "c", &[("nvidia.com/gpu", 1)]), "ts-1"),
            ],
            vec![],
        );
        s.metrics = ["a", "b"]
            .iter()
            .map(|p| {
                sample(
                    "DCGM_FI_DEV_FB_USED",
                    &[
                        ("Hostname", "ts-1"),
                        ("UUID", "GPU-0"),
                        ("namespace", "ml"),
                        ("pod", p),
                    ],
                    40000.0,
                )
            })
            .chain([sample(
                "DCGM_FI_DEV_FB_USED",
                &[
                    ("Hostname", "ts-1"),
                    ("UUID", "GPU-1"),
                    ("namespace", "ml"),
                    ("pod", "c"),
                ],
                1.0,
            )])
            .collect();
        s.logs = vec![log("a", "RuntimeError: CUDA error: out of memory")];
        let f = run(&s);
        let got = one(&f, "cuda-oom");
        assert!(got.title.contains("time-sliced"), "{got:#?}");
        assert!(
            got.evidence
                .iter()
                .any(|e| e.contains("shares GPU-0 with ml/b")),
            "{got:#?}"
        );
        assert!(!got.evidence.iter().any(|e| e.contains("ml/c")), "{got:#?}");

        // Look-alike: a log that talks about memory without an OOM.
        let mut s = snapshot(vec![], vec![], vec![]);
        s.logs = vec![log(
            "x",
            "allocated 30 GiB of GPU memory; cache hit rate 90%",
        )];
        assert!(run(&s).is_empty());
    }
}
