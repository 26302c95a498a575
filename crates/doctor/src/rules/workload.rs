//! Pod specs that cannot work: GPUs in requests but not limits, more than one shared replica.

use crate::Options;
use crate::cluster::{Cluster, NodeView, PodView, describe_event, list_some};
use crate::finding::{Category, Finding, ObjectRef, Severity};
use crate::resources::{self, GpuMap};

/// The kubelet's Allocate error when a pod asks for several replicas of a shared resource.
const MAX_ONE: &str = "maximum request size for shared resources is 1";

pub(super) fn check(c: &Cluster<'_>, _o: &Options) -> Vec<Finding> {
    let mut out = Vec::new();
    for p in &c.gpu_pods {
        if let Some(f) = request_without_limit(p) {
            out.push(f);
        }
        if let Some(f) = shared_over_one(c, p) {
            out.push(f);
        }
    }
    out.extend(rejected_by_validation(c));
    out
}

fn request_without_limit(p: &PodView<'_>) -> Option<Finding> {
    let spec = p.pod.spec.as_ref()?;
    let mut missing = Vec::new();
    for ctr in spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
    {
        let r = ctr.resources.as_ref();
        let requests: GpuMap = resources::gpu_map(r.and_then(|r| r.requests.as_ref()));
        let limits: GpuMap = resources::gpu_map(r.and_then(|r| r.limits.as_ref()));
        for (res, n) in &requests {
            if limits.get(res) != Some(n) {
                missing.push((ctr.name.clone(), res.clone(), *n, limits.get(res).copied()));
            }
        }
    }
    let (ctr, res, n, _) = missing.first()?.clone();
    let mut f = Finding::new(
        Severity::Critical,
        Category::Workload,
        "gpu-request-without-limit",
        format!(
            "Pod {}/{}: {res} in requests but not (equally) in limits",
            p.namespace, p.name
        ),
    )
    .object(ObjectRef::pod(p.namespace, p.name));
    for (c, r, n, l) in &missing {
        f = f.evidence(format!(
            "container {c}: requests {r}: {n}, limits {r}: {}",
            l.map_or("<none>".to_string(), |l| l.to_string())
        ));
    }
    Some(f.fix(format!(
        "GPUs cannot be overcommitted: set them in limits (requests may be left out):\n\
         containers:\n- name: {ctr}\n  resources:\n    limits:\n      {res}: {n}"
    )))
}

/// Controllers that could not create pods because the API server rejected the GPU request.
fn rejected_by_validation(c: &Cluster<'_>) -> Vec<Finding> {
    c.all_events()
        .filter(|e| e.reason.as_deref() == Some("FailedCreate"))
        .filter(|e| {
            let m = e.message.as_deref().unwrap_or("");
            m.contains("nvidia.com/")
                && (m.contains("Limit must be set for non overcommitable resources")
                    || m.contains("must be equal to") || m.contains("must be less than or equal to"))
        })
        .map(|e| {
            let o = &e.involved_object;
            let kind = o.kind.as_deref().unwrap_or("Object");
            let ns = o.namespace.as_deref().unwrap_or("default");
            let name = o.name.as_deref().unwrap_or("");
            Finding::new(
                Severity::Critical,
                Category::Workload,
                "gpu-request-without-limit",
                format!("{kind} {ns}/{name} cannot create pods: its GPU request is not in limits"),
            )
            .object(ObjectRef::namespaced(kind, ns, name))
            .evidence(describe_event(e, c.now()))
            .fix("put the nvidia.com/ resource under resources.limits of the pod template (requests, if set, must equal limits)")
        })
        .collect()
}

fn shared_over_one(c: &Cluster<'_>, p: &PodView<'_>) -> Option<Finding> {
    for (r, n) in &p.gpus {
        if *n <= 1 {
            continue;
        }
        // The nodes that decide: the one it is bound to, else every node offering the resource.
        let nodes: Vec<&NodeView<'_>> = match p.node.and_then(|n| c.node(n)) {
            Some(node) => vec![node],
            None => c.gpu_nodes().filter(|node| node.offers(r)).collect(),
        };
        if nodes.is_empty() || !nodes.iter().all(|node| node.is_shared(r)) {
            continue;
        }
        let rejected = c
            .events_for("Pod", p.namespace, p.name)
            .iter()
            .find(|e| e.message.as_deref().is_some_and(|m| m.contains(MAX_ONE)));
        let status_says = p
            .pod
            .status
            .as_ref()
            .and_then(|s| s.message.as_deref())
            .filter(|m| m.contains(MAX_ONE));
        let mps = nodes
            .iter()
            .any(|node| node.sharing_strategy(r) == Some("mps"));
        let severity = if rejected.is_some() || status_says.is_some() || mps {
            Severity::Critical
        } else {
            Severity::Warning
        };
        let mut f = Finding::new(
            severity,
            Category::Workload,
            "shared-request-over-one",
            format!(
                "Pod {}/{} asks for {n} replicas of shared {r}",
                p.namespace, p.name
            ),
        )
        .object(ObjectRef::pod(p.namespace, p.name))
        .evidence(format!(
            "{r} is shared on {}: replicas {} per GPU, sharing strategy {}",
            list_some(nodes.iter().map(|n| n.name), 4),
            nodes[0].replicas(r),
            nodes[0]
                .sharing_strategy(r)
                .unwrap_or(if resources::is_shared_name(r) {
                    "time-slicing"
                } else {
                    "?"
                })
        ));
        if let Some(e) = rejected {
            f = f.evidence(describe_event(e, c.now()));
        } else if let Some(m) = status_says {
            f = f.evidence(format!("pod status: {m}"));
        } else if mps {
            f = f.evidence("MPS forces failRequestsGreaterThanOne: Allocate will fail".to_string());
        } else {
            f = f.evidence(
                "with failRequestsGreaterThanOne the kubelet rejects the pod; without it the replicas may all be slices of one GPU"
                    .to_string(),
            );
        }
        return Some(f.fix(format!(
            "replicas are time slices, not more GPUs: request `{r}: 1`; for {n} real GPUs request \
             whole GPUs on nodes without sharing"
        )));
    }
    None
}

#[cfg(test)]
mod tests {
    use crate::testkit::*;
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

    #[test]
    fn requests_without_limits() {
        let mut p = pod("ml", "t", &[("nvidia.com/gpu", 1)]);
        p.spec.as_mut().unwrap().containers[0]
            .resources
            .as_mut()
            .unwrap()
            .limits = None;
        let f = run(&snapshot(
            vec![gpu_node("g", "nvidia.com/gpu", 8)],
            vec![created(p, 5)],
            vec![],
        ));
        let got = one(&f, "gpu-request-without-limit");
        assert!(
            got.fix.contains("limits:\n      nvidia.com/gpu: 1"),
            "{}",
            got.fix
        );

        // Look-alike: limits only (requests defaulted from them) is right.
        let mut p = pod("ml", "t", &[("nvidia.com/gpu", 1)]);
        p.spec.as_mut().unwrap().containers[0]
            .resources
            .as_mut()
            .unwrap()
            .requests = None;
        let f = run(&snapshot(
            vec![gpu_node("g", "nvidia.com/gpu", 8)],
            vec![created(p, 5)],
            vec![],
        ));
        assert!(
            with_code(&f, "gpu-request-without-limit").is_empty(),
            "{f:#?}"
        );
    }

    #[test]
    fn controllers_rejected_by_validation() {
        let e = event(
            "ReplicaSet",
            "ml",
            "serve-7d9",
            "FailedCreate",
            "Error creating: Pod \"serve-7d9-x\" is invalid: spec.containers[0].resources.limits: Required value: Limit must be set for non overcommitable resources: nvidia.com/gpu",
            60,
        );
        let f = run(&snapshot(vec![], vec![], vec![e]));
        assert_eq!(
            one(&f, "gpu-request-without-limit").objects[0].kind,
            "ReplicaSet"
        );
    }

    #[test]
    fn several_replicas_of_a_shared_gpu() {
        let mut ts = gpu_node("ts-1", "nvidia.com/gpu", 32);
        label(&mut ts, "nvidia.com/gpu.replicas", "4");
        label(&mut ts, "nvidia.com/gpu.sharing-strategy", "time-slicing");
        let p = running(pod("ml", "t", &[("nvidia.com/gpu", 2)]), "ts-1");
        let f = run(&snapshot(vec![ts.clone()], vec![p], vec![]));
        assert_eq!(
            one(&f, "shared-request-over-one").severity,
            crate::Severity::Warning
        );

        // The kubelet said so: critical, with its words.
        let mut p = pod("ml", "t", &[("nvidia.com/gpu", 2)]);
        p.spec.as_mut().unwrap().node_name = Some("ts-1".into());
        p.status.as_mut().unwrap().phase = Some("Failed".into());
        p.status.as_mut().unwrap().reason = Some("UnexpectedAdmissionError".into());
        p.status.as_mut().unwrap().message = Some("Allocate failed due to rpc error: code = Unknown desc = request for 'nvidia.com/gpu: 2' too large: maximum request size for shared resources is 1, which is unexpected".into());
        let f = run(&snapshot(vec![ts.clone()], vec![p], vec![]));
        assert_eq!(
            one(&f, "shared-request-over-one").severity,
            crate::Severity::Critical
        );

        // Look-alikes: one replica; two whole GPUs on an unshared node.
        let p = running(pod("ml", "t", &[("nvidia.com/gpu", 1)]), "ts-1");
        assert!(
            with_code(
                &run(&snapshot(vec![ts], vec![p], vec![])),
                "shared-request-over-one"
            )
            .is_empty()
        );
        let mut whole = gpu_node("g", "nvidia.com/gpu", 8);
        label(&mut whole, "nvidia.com/gpu.replicas", "1");
        let p = running(pod("ml", "t", &[("nvidia.com/gpu", 2)]), "g");
        assert!(
            with_code(
                &run(&snapshot(vec![whole], vec![p], vec![])),
                "shared-request-over-one"
            )
            .is_empty()
        );
        let _ = Quantity("1".into());
    }
}
