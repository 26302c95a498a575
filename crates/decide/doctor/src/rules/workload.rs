//! Pod specs that cannot work: GPUs in requests but not limits, more than one shared replica.

use crate::Options;
use crate::cluster::{Cluster, NodeView, PodView, describe_event, list_some};
use crate::finding::{Category, Finding, ObjectRef, Severity};
use crate::resources::{self, GpuMap};

/// The kubelet's Allocate error when a pod asks for several replicas of a shared resource.
const MAX_ONE: &str = "maximum request size for shared resources is 1";

pub(super) fn check(c: &Cluster<'_>, _o: &Options) -> Vec<Finding> {
    let mut out = Vec::new();
    // Per resource: the GPU nodes offering it (what decides for an unbound pod), found once.
    let mut offering: Offering<'_, '_> = std::collections::HashMap::new();
    for p in &c.gpu_pods {
        if let Some(f) = request_without_limit(p) {
            out.push(f);
        }
        if let Some(f) = shared_over_one(c, p, &mut offering) {
            out.push(f);
        }
    }
    out.extend(rejected_by_validation(c));
    out.extend(quota_exceeded(c));
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

/// What the API server answers (pkg/apis/core/validation) for a request of a non-overcommitable
/// resource (extended resources such as `nvidia.com/gpu`, hugepages) without a limit; it names
/// the field path but not the resource.
const NO_LIMIT: &str = "Limit must be set for non overcommitable resources";
/// ... and for a request different from its limit (`must be equal to nvidia.com/gpu limit of 1`).
const NOT_EQUAL: &str = "must be equal to nvidia.com/";

/// Controllers that could not create pods because the API server rejected the GPU request.
fn rejected_by_validation(c: &Cluster<'_>) -> Vec<Finding> {
    let mut seen = std::collections::BTreeSet::new();
    c.all_events()
        .filter(|e| e.reason.as_deref() == Some("FailedCreate"))
        .filter(|e| {
            let m = e.message.as_deref().unwrap_or("");
            m.contains(NO_LIMIT) || m.contains(NOT_EQUAL)
        })
        .filter(|e| {
            let o = &e.involved_object;
            seen.insert((o.kind.clone(), o.namespace.clone(), o.name.clone()))
        })
        .map(|e| {
            let o = &e.involved_object;
            let kind = o.kind.as_deref().unwrap_or("Object");
            let ns = o.namespace.as_deref().unwrap_or("default");
            let name = o.name.as_deref().unwrap_or("");
            let m = e.message.as_deref().unwrap_or("");
            // `spec.containers[0].resources.limits: Required value: ...`: the container's path.
            let path = m
                .split(": ")
                .find(|p| p.contains("resources.limits") || p.contains("resources.requests"))
                .map(|p| p.trim_start_matches(['[', ' ']).to_string());
            let mut f = Finding::new(
                Severity::Critical,
                Category::Workload,
                "gpu-request-without-limit",
                format!("{kind} {ns}/{name} cannot create pods: a GPU request is not equal to a limit"),
            )
            .object(ObjectRef::namespaced(kind, ns, name))
            .evidence(describe_event(e, c.now()));
            if m.contains(NO_LIMIT) {
                f = f.evidence(format!(
                    "the API server names no resource: {} is a request of a non-overcommitable resource \
                     (an nvidia.com/ GPU, another extended resource, or hugepages) with no limit",
                    path.as_deref().unwrap_or("a container")
                ));
            }
            let owner = match kind {
                "ReplicaSet" => " (and of the Deployment that owns it)",
                _ => "",
            };
            f.fix(format!(
                "put the nvidia.com/ resource under resources.limits of the pod template{owner} \
                 (requests, if set, must equal limits); see the template: kubectl -n {ns} describe {} {name}",
                kind.to_ascii_lowercase()
            ))
            .command(format!("kubectl -n {ns} describe {} {name}", kind.to_ascii_lowercase()))
        })
        .collect()
}

/// Controllers whose GPU pods a ResourceQuota refuses (`exceeded quota`): the quota, its use, and
/// the pods holding it.
fn quota_exceeded(c: &Cluster<'_>) -> Vec<Finding> {
    let mut seen = std::collections::BTreeSet::new();
    let mut out = Vec::new();
    for e in c.all_events() {
        if e.reason.as_deref() != Some("FailedCreate") {
            continue;
        }
        let m = e.message.as_deref().unwrap_or("");
        let Some(rest) = m.split("exceeded quota: ").nth(1) else {
            continue;
        };
        if !rest.contains("nvidia.com/") {
            continue;
        }
        let quota = rest.split(',').next().unwrap_or("").trim();
        let o = &e.involved_object;
        let kind = o.kind.as_deref().unwrap_or("Object");
        let ns = o.namespace.as_deref().unwrap_or("default");
        let name = o.name.as_deref().unwrap_or("");
        if !seen.insert((
            ns.to_string(),
            quota.to_string(),
            kind.to_string(),
            name.to_string(),
        )) {
            continue;
        }
        let mut f = Finding::new(
            Severity::Warning,
            Category::Workload,
            "gpu-quota-exceeded",
            format!("{kind} {ns}/{name} cannot create GPU pods: ResourceQuota {quota} is used up"),
        )
        .object(ObjectRef::namespaced(kind, ns, name))
        .object(ObjectRef::namespaced("ResourceQuota", ns, quota))
        .evidence(describe_event(e, c.now()));
        let q = c.snapshot.quotas.iter().find(|q| {
            q.metadata.name.as_deref() == Some(quota) && q.metadata.namespace.as_deref() == Some(ns)
        });
        let mut keys: Vec<(String, String, String)> = Vec::new();
        if let Some(q) = q {
            let status = q.status.as_ref();
            for (k, hard) in status
                .and_then(|s| s.hard.as_ref())
                .or(q.spec.as_ref().and_then(|s| s.hard.as_ref()))
                .into_iter()
                .flatten()
                .filter(|(k, _)| k.contains("nvidia.com/"))
            {
                let used = status
                    .and_then(|s| s.used.as_ref())
                    .and_then(|u| u.get(k))
                    .map_or("0".to_string(), |u| u.0.clone());
                keys.push((k.clone(), used, hard.0.clone()));
            }
        }
        for (k, used, hard) in &keys {
            f = f.evidence(format!(
                "ResourceQuota {ns}/{quota}: {k} used {used} of {hard}"
            ));
        }
        // Who holds the namespace's GPUs: its running GPU pods, largest first.
        let mut holders: Vec<(&str, i64)> = c
            .gpu_pods
            .iter()
            .filter(|p| p.namespace == ns && p.active())
            .map(|p| (p.name, p.gpus.values().sum::<i64>()))
            .collect();
        holders.sort_by_key(|(n, g)| (std::cmp::Reverse(*g), *n));
        if !holders.is_empty() {
            f = f.evidence(format!(
                "held by: {}",
                list_some(holders.iter().map(|(n, g)| format!("{ns}/{n} ({g})")), 8)
            ));
        }
        // The patch raises every exceeded GPU key to what the blocked pods need: used plus the
        // missing replicas times one pod's request (at least one replica), from the message's
        // own numbers, which are the apiserver's at the time of the refusal.
        let numbers = QuotaNumbers::parse(m);
        let ctl = c
            .snapshot
            .controllers
            .iter()
            .find(|x| x.kind == kind && x.namespace == ns && x.name == name);
        let blocked = ctl
            .and_then(|x| Some(x.replicas? - x.current.unwrap_or(0)))
            .filter(|b| *b > 0)
            .unwrap_or(1);
        let raised: Vec<(String, i64)> = numbers
            .exceeded()
            .into_iter()
            .filter(|(k, ..)| k.contains("nvidia.com/"))
            .map(|(k, requested, used, limited)| (k, limited.max(used + blocked * requested)))
            .collect();
        if !raised.is_empty() {
            f = f.evidence(format!(
                "{blocked} pod{} blocked, each asking for {}",
                if blocked == 1 { "" } else { "s" },
                numbers
                    .requested
                    .iter()
                    .filter(|(k, _)| k.contains("nvidia.com/"))
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        let raise = if raised.is_empty() {
            // The message did not parse: one more than the quota's hard limit, as before.
            keys.first().map(|(k, _, hard)| {
                let more = resources::count(
                    &k8s_openapi::apimachinery::pkg::api::resource::Quantity(hard.clone()),
                )
                .map_or(1, |h| h + 1);
                (k.clone(), patch(ns, quota, &[(k.clone(), more)]))
            })
        } else {
            let names = raised
                .iter()
                .map(|(k, v)| format!("{k} to {v}"))
                .collect::<Vec<_>>()
                .join(" and ");
            Some((names, patch(ns, quota, &raised)))
        };
        f = f.fix(match &raise {
            Some((k, cmd)) => format!(
                "the quota is working as set: free GPUs in {ns} (finished or idle pods above), or raise \
                 {k} if the team should have more: {cmd}"
            ),
            None => format!(
                "free GPUs in {ns} or raise the quota's nvidia.com/ limit: kubectl -n {ns} describe resourcequota {quota}"
            ),
        });
        f = match raise {
            Some((_, cmd)) => f.command(cmd),
            None => f.command(format!("kubectl -n {ns} describe resourcequota {quota}")),
        };
        out.push(f);
    }
    out
}

/// `kubectl patch resourcequota` setting `spec.hard` keys.
fn patch(ns: &str, quota: &str, keys: &[(String, i64)]) -> String {
    let hard = keys
        .iter()
        .map(|(k, v)| format!("\"{k}\":\"{v}\""))
        .collect::<Vec<_>>()
        .join(",");
    format!(
        "kubectl -n {ns} patch resourcequota {quota} --type=merge -p '{{\"spec\":{{\"hard\":{{{hard}}}}}}}'"
    )
}

/// The numbers of the quota admission's refusal: `requested: k=v,k=v, used: ..., limited: ...`.
#[derive(Debug, Default, PartialEq)]
struct QuotaNumbers {
    requested: Vec<(String, i64)>,
    used: Vec<(String, i64)>,
    limited: Vec<(String, i64)>,
}

impl QuotaNumbers {
    fn parse(m: &str) -> QuotaNumbers {
        let list = |label: &str| -> Vec<(String, i64)> {
            let Some(rest) = m.split(&format!("{label}: ")).nth(1) else {
                return Vec::new();
            };
            // The list ends where the next `word: ` starts.
            let end = [", used: ", ", limited: "]
                .iter()
                .filter_map(|s| rest.find(s))
                .min()
                .unwrap_or(rest.len());
            rest[..end]
                .split(',')
                .filter_map(|kv| {
                    let (k, v) = kv.trim().split_once('=')?;
                    let q = k8s_openapi::apimachinery::pkg::api::resource::Quantity(v.to_string());
                    Some((k.to_string(), resources::count(&q)?))
                })
                .collect()
        };
        QuotaNumbers {
            requested: list("requested"),
            used: list("used"),
            limited: list("limited"),
        }
    }

    /// (key, requested, used, limited) of the keys the request would take over their limit.
    fn exceeded(&self) -> Vec<(String, i64, i64, i64)> {
        let get = |l: &[(String, i64)], k: &str| l.iter().find(|(x, _)| x == k).map(|(_, v)| *v);
        self.limited
            .iter()
            .filter_map(|(k, limited)| {
                let requested = get(&self.requested, k)?;
                let used = get(&self.used, k).unwrap_or(0);
                (used + requested > *limited).then(|| (k.clone(), requested, used, *limited))
            })
            .collect()
    }
}

/// Per resource: whether every GPU node offering it shares it, and those nodes.
type Offering<'c, 'a> = std::collections::HashMap<String, (bool, Vec<&'c NodeView<'a>>)>;

fn shared_over_one<'c, 'a>(
    c: &'c Cluster<'a>,
    p: &PodView<'_>,
    offering: &mut Offering<'c, 'a>,
) -> Option<Finding> {
    for (r, n) in &p.gpus {
        if *n <= 1 {
            continue;
        }
        // The nodes that decide: the one it is bound to, else every node offering the resource.
        let nodes: Vec<&NodeView<'_>> = match p.node.and_then(|n| c.node(n)) {
            Some(node) => vec![node],
            None => {
                let (all_shared, list) = offering.entry(r.clone()).or_insert_with(|| {
                    let list: Vec<&NodeView<'_>> =
                        c.gpu_nodes().filter(|node| node.offers(r)).collect();
                    let all = !list.is_empty() && list.iter().all(|node| node.is_shared(r));
                    (all, list)
                });
                if !*all_shared {
                    continue;
                }
                list.clone()
            }
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
    fn gpu_pods_a_quota_refuses() {
        use k8s_openapi::api::core::v1::{ResourceQuota, ResourceQuotaSpec, ResourceQuotaStatus};
        let q = |n: &str| Quantity(n.into());
        let quota = ResourceQuota {
            metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                name: Some("gpu-quota".into()),
                namespace: Some("ml".into()),
                ..Default::default()
            },
            spec: Some(ResourceQuotaSpec {
                hard: Some([("requests.nvidia.com/gpu".to_string(), q("2"))].into()),
                ..Default::default()
            }),
            status: Some(ResourceQuotaStatus {
                hard: Some([("requests.nvidia.com/gpu".to_string(), q("2"))].into()),
                used: Some([("requests.nvidia.com/gpu".to_string(), q("2"))].into()),
            }),
        };
        let msg = "Error creating: pods \"train-7d9-x2\" is forbidden: exceeded quota: gpu-quota, requested: requests.nvidia.com/gpu=1, used: requests.nvidia.com/gpu=2, limited: requests.nvidia.com/gpu=2";
        let e = event("ReplicaSet", "ml", "train-7d9", "FailedCreate", msg, 30);
        let n = gpu_node("g", "nvidia.com/gpu", 8);
        let holders = vec![
            running(pod("ml", "a", &[("nvidia.com/gpu", 1)]), "g"),
            running(pod("ml", "b", &[("nvidia.com/gpu", 1)]), "g"),
        ];
        let mut s = snapshot(vec![n.clone()], holders, vec![e.clone(), e]);
        s.quotas = vec![quota];
        let f = run(&s);
        let got = one(&f, "gpu-quota-exceeded");
        let all = got.evidence.join("\n");
        assert!(
            all.contains("ResourceQuota ml/gpu-quota: requests.nvidia.com/gpu used 2 of 2")
                && all.contains("held by: ml/a (1), ml/b (1)"),
            "{all}"
        );
        assert_eq!(
            got.commands,
            vec![
                r#"kubectl -n ml patch resourcequota gpu-quota --type=merge -p '{"spec":{"hard":{"requests.nvidia.com/gpu":"3"}}}'"#
            ]
        );
        // Look-alike: a CPU quota exceeded is no GPU finding.
        let cpu = event(
            "ReplicaSet",
            "ml",
            "web",
            "FailedCreate",
            "Error creating: pods \"web-x\" is forbidden: exceeded quota: cpu, requested: requests.cpu=1, used: requests.cpu=4, limited: requests.cpu=4",
            30,
        );
        assert!(
            with_code(
                &run(&snapshot(vec![n], vec![], vec![cpu])),
                "gpu-quota-exceeded"
            )
            .is_empty()
        );
    }

    #[test]
    fn a_quota_fix_makes_room_for_every_blocked_replica() {
        // Two GPUs per pod, 3 replicas wanted, 1 created: the patch must fit 2 more pods, not +1.
        let msg = "Error creating: pods \"train-7d9-x2\" is forbidden: exceeded quota: gpu-quota, requested: limits.nvidia.com/gpu=2,requests.nvidia.com/gpu=2, used: limits.nvidia.com/gpu=2,requests.nvidia.com/gpu=2, limited: limits.nvidia.com/gpu=3,requests.nvidia.com/gpu=3";
        let e = event("ReplicaSet", "ml", "train-7d9", "FailedCreate", msg, 30);
        let mut s = snapshot(vec![], vec![], vec![e.clone()]);
        s.controllers = vec![crate::Controller {
            kind: "ReplicaSet".into(),
            namespace: "ml".into(),
            name: "train-7d9".into(),
            replicas: Some(3),
            current: Some(1),
            ..crate::Controller::default()
        }];
        let f = run(&s);
        let got = one(&f, "gpu-quota-exceeded");
        assert_eq!(
            got.commands,
            vec![
                r#"kubectl -n ml patch resourcequota gpu-quota --type=merge -p '{"spec":{"hard":{"limits.nvidia.com/gpu":"6","requests.nvidia.com/gpu":"6"}}}'"#
            ]
        );
        assert!(
            got.evidence.join("\n").contains("2 pods blocked"),
            "{got:#?}"
        );
        // Without the controller: at least one replica's request (2 + 2), never just +1.
        let f = run(&snapshot(vec![], vec![], vec![e]));
        assert!(
            one(&f, "gpu-quota-exceeded").commands[0]
                .contains(r#""limits.nvidia.com/gpu":"4","requests.nvidia.com/gpu":"4""#),
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
            "Error creating: Pod \"serve-7d9-x\" is invalid: spec.containers[0].resources.limits: Required value: Limit must be set for non overcommitable resources",
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
