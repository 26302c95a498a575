//! GPU pods the API server refuses to create for a controller, for reasons other than a quota
//! (the workload rule has those and requests without limits): a LimitRange's maximum or minimum on
//! an `nvidia.com/` resource, a RuntimeClass that does not exist, a ValidatingAdmissionPolicy or
//! an admission webhook that denies the pod, Pod Security.
//!
//! The texts are the apiserver's: plugin/pkg/admission/limitranger ("maximum %s usage per %s is
//! %s, but limit is %s"), plugin/pkg/admission/runtimeclass ("pod rejected: RuntimeClass %q not
//! found"), the validating admission policy plugin ("ValidatingAdmissionPolicy '%s' with binding
//! '%s' denied request: %s"), webhooks ("admission webhook %q denied the request: %s") and Pod
//! Security ("violates PodSecurity %q: %s"); the controllers put them in FailedCreate events.

use crate::Options;
use crate::cluster::{Cluster, describe_event};
use crate::finding::{Category, Finding, ObjectRef, Severity};
use crate::resources;
use crate::snapshot::Controller;
use k8s_openapi::api::core::v1::{Event, PodSpec};
use std::collections::BTreeSet;

/// Controller kinds whose FailedCreate events are about pods they could not create.
const CONTROLLERS: &[&str] = &["ReplicaSet", "Job", "StatefulSet", "DaemonSet"];

pub(super) fn check(c: &Cluster<'_>, _o: &Options) -> Vec<Finding> {
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    for e in c.all_events() {
        if e.reason.as_deref() != Some("FailedCreate") {
            continue;
        }
        let o = &e.involved_object;
        let kind = o.kind.as_deref().unwrap_or("");
        if !CONTROLLERS.contains(&kind) {
            continue;
        }
        let ns = o.namespace.as_deref().unwrap_or("default");
        let name = o.name.as_deref().unwrap_or("");
        let m = e.message.as_deref().unwrap_or("");
        let Some(refusal) = Refusal::of(m) else {
            continue;
        };
        // Once per controller and refusal: the check below walks the pods, and a controller
        // retrying for an hour leaves hundreds of events.
        if !seen.insert((
            kind.to_string(),
            ns.to_string(),
            name.to_string(),
            refusal.code(),
        )) {
            continue;
        }
        let ctl = controller_of(c, kind, ns, name);
        if has_every_pod(ctl) {
            continue;
        }
        if !refusal.about_gpus() && !gpu_workload(c, ctl, kind, ns, name) {
            continue;
        }
        out.push(finding(c, e, &refusal, kind, ns, name, ctl));
    }
    out
}

/// One refusal, parsed from the event's message.
#[derive(Debug, Clone, PartialEq)]
enum Refusal {
    /// `maximum|minimum <resource> usage per <Container|Pod> is <bound>, but limit|request is <asked>`.
    LimitRange {
        bound_kind: String,
        resource: String,
        per: String,
        bound: String,
        asked: String,
    },
    RuntimeClass(String),
    Policy {
        policy: String,
        binding: String,
        says: String,
    },
    Webhook {
        webhook: String,
        says: String,
    },
    PodSecurity {
        level: String,
        says: String,
    },
}

impl Refusal {
    fn of(m: &str) -> Option<Refusal> {
        for bound_kind in ["maximum", "minimum"] {
            let key = format!("{bound_kind} ");
            if let Some(at) = m.find(&key) {
                let rest = &m[at + key.len()..];
                let mut words = rest.split_whitespace();
                let resource = words.next()?.to_string();
                if words.next() != Some("usage") || words.next() != Some("per") {
                    continue;
                }
                let per = words.next()?.to_string();
                let _is = words.next();
                let bound = words.next()?.trim_end_matches(',').to_string();
                let asked = rest
                    .rsplit(" is ")
                    .next()?
                    .trim()
                    .trim_end_matches('.')
                    .to_string();
                return Some(Refusal::LimitRange {
                    bound_kind: bound_kind.to_string(),
                    resource,
                    per,
                    bound,
                    asked,
                });
            }
        }
        if let Some(rest) = m.split("RuntimeClass \"").nth(1)
            && m.contains("not found")
        {
            return Some(Refusal::RuntimeClass(rest.split('"').next()?.to_string()));
        }
        if let Some(rest) = m.split("ValidatingAdmissionPolicy '").nth(1) {
            let policy = rest.split('\'').next()?.to_string();
            let binding = rest
                .split("with binding '")
                .nth(1)
                .and_then(|b| b.split('\'').next())
                .unwrap_or("")
                .to_string();
            let says = rest
                .split("denied request: ")
                .nth(1)
                .unwrap_or("")
                .to_string();
            return Some(Refusal::Policy {
                policy,
                binding,
                says,
            });
        }
        if let Some(rest) = m.split("admission webhook \"").nth(1) {
            let webhook = rest.split('"').next()?.to_string();
            let says = rest
                .split("denied the request: ")
                .nth(1)
                .unwrap_or("")
                .to_string();
            return Some(Refusal::Webhook { webhook, says });
        }
        if let Some(rest) = m.split("violates PodSecurity \"").nth(1) {
            let level = rest.split('"').next()?.to_string();
            let says = rest.split("\": ").nth(1).unwrap_or("").to_string();
            return Some(Refusal::PodSecurity { level, says });
        }
        None
    }

    fn code(&self) -> &'static str {
        match self {
            Refusal::LimitRange { .. } => "gpu-limitrange",
            Refusal::RuntimeClass(_) => "runtimeclass-not-found",
            Refusal::Policy { .. } => "admission-policy-denied",
            Refusal::Webhook { .. } => "admission-webhook-denied",
            Refusal::PodSecurity { .. } => "podsecurity-denied",
        }
    }

    /// Whether the text itself names a GPU resource or a runtime class.
    fn about_gpus(&self) -> bool {
        match self {
            Refusal::LimitRange { resource, .. } => resources::is_gpu_resource(resource),
            Refusal::RuntimeClass(_) => true,
            Refusal::Policy { says, .. }
            | Refusal::Webhook { says, .. }
            | Refusal::PodSecurity { says, .. } => {
                says.contains("nvidia.com/") || says.to_ascii_lowercase().contains("runtimeclass")
            }
        }
    }
}

/// The controller a FailedCreate or Warning event is about, when the snapshot has it.
pub(crate) fn controller_of<'a>(
    c: &'a Cluster<'_>,
    kind: &str,
    ns: &str,
    name: &str,
) -> Option<&'a Controller> {
    c.snapshot
        .controllers
        .iter()
        .find(|x| x.kind == kind && x.namespace == ns && x.name == name)
}

/// Whether the controller says it has every pod it wants: its Warning and FailedCreate events
/// (events stay an hour) then describe a failure that is over, such as a refusal since lifted.
pub(crate) fn has_every_pod(ctl: Option<&Controller>) -> bool {
    ctl.is_some_and(|x| x.replicas.is_some_and(|w| x.current.unwrap_or(0) >= w))
}

/// The Deployment that owns a ReplicaSet (the object to change), else the controller itself.
fn target<'a>(c: &'a Cluster<'_>, kind: &'a str, ns: &str, name: &'a str) -> (&'a str, &'a str) {
    controller_of(c, kind, ns, name)
        .and_then(|x| x.owner.as_ref())
        .filter(|(k, _)| k == "Deployment")
        .map_or((kind, name), |(k, n)| (k.as_str(), n.as_str()))
}

/// Whether the controller makes GPU pods: its template asks for GPUs, or pods it owns do.
pub(crate) fn gpu_workload(
    c: &Cluster<'_>,
    ctl: Option<&Controller>,
    kind: &str,
    ns: &str,
    name: &str,
) -> bool {
    ctl.and_then(|x| x.template.as_ref())
        .and_then(|t| t.spec.as_ref())
        .is_some_and(|s| {
            s.containers
                .iter()
                .any(|k| !resources::container_gpus(k).is_empty())
        })
        || c.gpu_pods.iter().any(|p| {
            p.namespace == ns
                && p.pod
                    .metadata
                    .owner_references
                    .iter()
                    .flatten()
                    .any(|o| o.kind == kind && o.name == name)
        })
}

/// The object to change: the Deployment above a ReplicaSet, else the controller itself.
struct Target<'a> {
    ns: &'a str,
    kind: &'a str,
    name: &'a str,
    /// `kind` as kubectl's resource argument.
    resource: String,
}

fn finding(
    c: &Cluster<'_>,
    e: &Event,
    refusal: &Refusal,
    kind: &str,
    ns: &str,
    name: &str,
    ctl: Option<&Controller>,
) -> Finding {
    let (tkind, tname) = target(c, kind, ns, name);
    let t = Target {
        ns,
        kind: tkind,
        name: tname,
        resource: tkind.to_ascii_lowercase(),
    };
    let f = header(c, e, refusal, kind, ns, name, ctl, &t);
    let template = ctl
        .and_then(|x| x.template.as_ref())
        .and_then(|t| t.spec.as_ref());
    match refusal {
        Refusal::LimitRange {
            bound_kind,
            resource,
            per,
            bound,
            asked,
        } => limitrange_fix(
            f,
            &t,
            template,
            bound_kind == "maximum",
            resource,
            per,
            bound,
            asked,
        ),
        Refusal::RuntimeClass(rc) => runtimeclass_fix(f, &t, template, rc),
        Refusal::Policy {
            policy,
            binding,
            says,
        } => policy_fix(f, policy, binding, says),
        Refusal::Webhook { webhook, says } => {
            let get = "kubectl get validatingwebhookconfigurations,mutatingwebhookconfigurations";
            f.evidence(format!("the webhook says: {says}"))
                .fix(format!(
                    "the admission webhook {webhook} rejects the pod template: change the template so \
                     it passes ({says}), or ask the webhook's owner; find its configuration with {get}"
                ))
                .command(get.to_string())
        }
        Refusal::PodSecurity { level, says } => {
            let get = format!("kubectl get namespace {ns} --show-labels");
            f.evidence(format!("Pod Security {level}: {says}"))
                .fix(format!(
                    "namespace {ns} enforces Pod Security {level}, and the template breaks it ({says}): \
                     set the template's securityContext to meet it (GPU pods need no privileges \
                     through the device plugin), or label the namespace with the level the workload \
                     needs (pod-security.kubernetes.io/enforce); see {get}"
                ))
                .command(get)
        }
    }
}

/// Title, objects and the evidence every refusal shares: the event and the replicas wanted.
#[allow(clippy::too_many_arguments)] // the event's controller, parsed apart, and its target
fn header(
    c: &Cluster<'_>,
    e: &Event,
    refusal: &Refusal,
    kind: &str,
    ns: &str,
    name: &str,
    ctl: Option<&Controller>,
    t: &Target<'_>,
) -> Finding {
    let title_what = match refusal {
        Refusal::LimitRange {
            bound_kind,
            resource,
            per,
            bound,
            ..
        } => format!("a LimitRange's {bound_kind} of {bound} {resource} per {per}"),
        Refusal::RuntimeClass(rc) => format!("RuntimeClass {rc} does not exist"),
        Refusal::Policy { policy, .. } => format!("ValidatingAdmissionPolicy {policy} denies them"),
        Refusal::Webhook { webhook, .. } => format!("admission webhook {webhook} denies them"),
        Refusal::PodSecurity { level, .. } => format!("Pod Security {level} denies them"),
    };
    let mut f = Finding::new(
        Severity::Critical,
        Category::Workload,
        refusal.code(),
        format!("{kind} {ns}/{name} cannot create GPU pods: {title_what}"),
    )
    .object(ObjectRef::namespaced(kind, ns, name))
    .evidence(describe_event(e, c.now()));
    if (t.kind, t.name) != (kind, name) {
        f = f.object(ObjectRef::namespaced(t.kind, ns, t.name));
    }
    if let Some(line) = replicas_line(kind, ns, name, ctl) {
        f = f.evidence(line);
    }
    f
}

/// "ReplicaSet ns/x wants 2 pods, has 0", when the controller says how many it wants.
pub(crate) fn replicas_line(
    kind: &str,
    ns: &str,
    name: &str,
    ctl: Option<&Controller>,
) -> Option<String> {
    let x = ctl?;
    let want = x.replicas?;
    Some(format!(
        "{kind} {ns}/{name} wants {want} pod{}, has {}",
        if want == 1 { "" } else { "s" },
        x.current.unwrap_or(0)
    ))
}

#[allow(clippy::too_many_arguments)] // the LimitRange message's fields, parsed apart
fn limitrange_fix(
    f: Finding,
    t: &Target<'_>,
    template: Option<&PodSpec>,
    max: bool,
    resource: &str,
    per: &str,
    bound: &str,
    asked: &str,
) -> Finding {
    let Target {
        ns,
        kind: tkind,
        name: tname,
        ..
    } = *t;
    let resource_kind = &t.resource;
    // Containers of the template over (or under) the bound, by name.
    let off: Vec<&str> = template
        .map(|s| {
            s.containers
                .iter()
                .filter(|k| {
                    let n = resources::container_gpus(k)
                        .get(resource)
                        .copied()
                        .unwrap_or(0);
                    let b = bound.parse::<i64>().unwrap_or(0);
                    if max { n > b } else { n < b }
                })
                .map(|k| k.name.as_str())
                .collect()
        })
        .unwrap_or_default();
    let set = (per == "Container" && off.len() == 1).then(|| {
        format!(
            "kubectl -n {ns} set resources {resource_kind} {tname} -c {} --limits={resource}={bound} --requests={resource}={bound}",
            off[0]
        )
    });
    let change = match &set {
        Some(cmd) => format!("set the container's {resource} to {bound} ({cmd})"),
        None => format!(
            "set {resource} in the pod template of {tkind} {ns}/{tname} to {} {bound} per {per}",
            if max { "at most" } else { "at least" }
        ),
    };
    f.evidence(format!(
        "the template asks for {asked} {resource}; the namespace's LimitRange allows {} {bound} per {per}",
        if max { "at most" } else { "at least" }
    ))
    .fix(format!(
        "the LimitRange in {ns} is working as set: {change}; or, if this workload should \
         have {asked}, change the LimitRange's {} for {resource} (kubectl -n {ns} get \
         limitrange -o yaml shows it)",
        if max { "max" } else { "min" }
    ))
    .commands_from(set)
    .command(format!("kubectl -n {ns} get limitrange -o yaml"))
}

fn runtimeclass_fix(f: Finding, t: &Target<'_>, template: Option<&PodSpec>, rc: &str) -> Finding {
    let Target {
        ns,
        kind: tkind,
        name: tname,
        ..
    } = *t;
    let resource_kind = &t.resource;
    let uses = template
        .and_then(|s| s.runtime_class_name.as_deref())
        .is_some_and(|r| r == rc);
    // Only controllers with a pod template can have it removed by a patch.
    let patchable = matches!(
        tkind,
        "Job" | "StatefulSet" | "DaemonSet" | "Deployment" | "ReplicaSet"
    );
    let remove = format!(
        "kubectl -n {ns} patch {resource_kind} {tname} --type=json -p '[{{\"op\":\"remove\",\"path\":\"/spec/template/spec/runtimeClassName\"}}]'"
    );
    let job = tkind == "Job";
    let mut f = f
        .evidence(format!(
            "no RuntimeClass {rc} exists; the pod template {} runtimeClassName: {rc}",
            if uses {
                "sets"
            } else {
                "(as the event says) sets"
            }
        ))
        .fix(format!(
            "create the RuntimeClass if the GPU nodes' container runtime has an `{rc}` handler \
             (apiVersion: node.k8s.io/v1, kind: RuntimeClass, metadata.name: {rc}, handler: \
             {rc}), or, where the device plugin injects GPUs through CDI or the default \
             runtime is NVIDIA's, remove runtimeClassName from the template{}{}",
            if !patchable || job {
                String::new()
            } else {
                format!(": {remove}")
            },
            if job {
                " (a Job's template cannot be changed: delete and re-create the Job without it)"
            } else {
                ""
            }
        ));
    if patchable && !job {
        f = f.command(remove);
    }
    f
}

fn policy_fix(f: Finding, policy: &str, binding: &str, says: &str) -> Finding {
    let get = format!("kubectl get validatingadmissionpolicy {policy} -o yaml");
    let binding_cmd = (!binding.is_empty())
        .then(|| format!("kubectl get validatingadmissionpolicybinding {binding} -o yaml"));
    f.evidence(format!("the policy says: {says}"))
        .fix(format!(
            "the policy's validation rejects the pod template: change the template so it \
             passes ({says}), or, if the policy is wrong for this namespace, change its \
             binding; see {get}{}",
            binding_cmd
                .as_ref()
                .map_or(String::new(), |b| format!(" and {b}"))
        ))
        .command(get)
        .commands_from(binding_cmd)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit::*;
    use k8s_openapi::api::core::v1::{Container, PodSpec, PodTemplateSpec, ResourceRequirements};
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

    fn rs(name: &str, gpus: i64, runtime_class: Option<&str>) -> Controller {
        let limits: std::collections::BTreeMap<String, Quantity> =
            [("nvidia.com/gpu".to_string(), Quantity(gpus.to_string()))].into();
        Controller {
            kind: "ReplicaSet".into(),
            namespace: "ml".into(),
            name: format!("{name}-7d9"),
            replicas: Some(2),
            current: Some(0),
            owner: Some(("Deployment".into(), name.into())),
            template: Some(PodTemplateSpec {
                metadata: None,
                spec: Some(PodSpec {
                    runtime_class_name: runtime_class.map(Into::into),
                    containers: vec![Container {
                        name: "cuda".into(),
                        resources: Some(ResourceRequirements {
                            limits: Some(limits),
                            ..ResourceRequirements::default()
                        }),
                        ..Container::default()
                    }],
                    ..PodSpec::default()
                }),
            }),
        }
    }

    #[test]
    fn the_replicas_line_counts_pods_in_words_that_read() {
        // Shared by this rule and the unexplained one, which said "wants 1 pods".
        let mut x = rs("one", 1, None);
        x.replicas = Some(1);
        assert_eq!(
            replicas_line("ReplicaSet", "ml", "one-7d9", Some(&x)).as_deref(),
            Some("ReplicaSet ml/one-7d9 wants 1 pod, has 0")
        );
        x.replicas = None;
        assert_eq!(replicas_line("ReplicaSet", "ml", "one-7d9", Some(&x)), None);
        assert_eq!(replicas_line("ReplicaSet", "ml", "one-7d9", None), None);
    }

    fn failed_create(name: &str, why: &str) -> Event {
        let mut e = event(
            "ReplicaSet",
            "ml",
            name,
            "FailedCreate",
            &format!("Error creating: pods \"{name}-x2\" is forbidden: {why}"),
            30,
        );
        e.reporting_component = Some("replicaset-controller".into());
        e
    }

    #[test]
    fn limitrange_maximum_on_gpus() {
        let e = failed_create(
            "train-7d9",
            "maximum nvidia.com/gpu usage per Container is 2, but limit is 4",
        );
        let mut s = snapshot(vec![], vec![], vec![e.clone()]);
        s.controllers = vec![rs("train", 4, None)];
        let f = run(&s);
        let got = one(&f, "gpu-limitrange");
        assert_eq!(got.severity, Severity::Critical);
        assert!(
            got.title
                .contains("maximum of 2 nvidia.com/gpu per Container"),
            "{}",
            got.title
        );
        assert_eq!(
            got.commands[0],
            "kubectl -n ml set resources deployment train -c cuda --limits=nvidia.com/gpu=2 --requests=nvidia.com/gpu=2"
        );
        assert!(
            got.evidence.join("\n").contains("wants 2 pods, has 0"),
            "{got:#?}"
        );
        // Look-alike: the same event while the ReplicaSet has both its pods (the LimitRange
        // was changed since) is a failure that is over.
        let mut done = rs("train", 4, None);
        done.current = Some(2);
        s.controllers = vec![done];
        assert!(with_code(&run(&s), "gpu-limitrange").is_empty());
        // Without the controller read: words and the LimitRange to read, no guessed command.
        let f = run(&snapshot(vec![], vec![], vec![e]));
        let got = one(&f, "gpu-limitrange");
        assert_eq!(got.commands, vec!["kubectl -n ml get limitrange -o yaml"]);
        // Minimum too; a CPU maximum is not a GPU finding.
        let e = failed_create(
            "train-7d9",
            "minimum nvidia.com/gpu usage per Pod is 2, but request is 1",
        );
        one(&run(&snapshot(vec![], vec![], vec![e])), "gpu-limitrange");
        let e = failed_create(
            "web-1",
            "maximum cpu usage per Container is 2, but limit is 4",
        );
        assert!(run(&snapshot(vec![], vec![], vec![e])).is_empty());
    }

    #[test]
    fn runtimeclass_that_does_not_exist() {
        let e = failed_create(
            "serve-7d9",
            "pod rejected: RuntimeClass \"nvidia\" not found",
        );
        let mut s = snapshot(vec![], vec![], vec![e.clone()]);
        s.controllers = vec![rs("serve", 1, Some("nvidia"))];
        let got = run(&s);
        let got = one(&got, "runtimeclass-not-found");
        assert_eq!(
            got.commands,
            vec![
                r#"kubectl -n ml patch deployment serve --type=json -p '[{"op":"remove","path":"/spec/template/spec/runtimeClassName"}]'"#
            ]
        );
        assert!(
            got.objects
                .contains(&ObjectRef::namespaced("Deployment", "ml", "serve"))
        );
        // Without the controller: the ReplicaSet is what can be named.
        one(
            &run(&snapshot(vec![], vec![], vec![e])),
            "runtimeclass-not-found",
        );
    }

    #[test]
    fn admission_denials_of_gpu_workloads() {
        let vap = failed_create(
            "train-7d9",
            "ValidatingAdmissionPolicy 'gpu-cap' with binding 'gpu-cap-binding' denied request: at most 2 nvidia.com/gpu per pod",
        );
        let got = run(&snapshot(vec![], vec![], vec![vap]));
        let got = one(&got, "admission-policy-denied");
        assert_eq!(
            got.commands,
            vec![
                "kubectl get validatingadmissionpolicy gpu-cap -o yaml",
                "kubectl get validatingadmissionpolicybinding gpu-cap-binding -o yaml"
            ]
        );
        let hook = failed_create(
            "train-7d9",
            "admission webhook \"gpu.example.com\" denied the request: runtimeClassName nvidia is not allowed",
        );
        one(
            &run(&snapshot(vec![], vec![], vec![hook])),
            "admission-webhook-denied",
        );
        // Pod Security names no GPU: only for a controller whose template asks for GPUs.
        let pss = failed_create(
            "train-7d9",
            "violates PodSecurity \"restricted:latest\": allowPrivilegeEscalation != false (container \"cuda\" must set securityContext.allowPrivilegeEscalation=false)",
        );
        assert!(run(&snapshot(vec![], vec![], vec![pss.clone()])).is_empty());
        let mut s = snapshot(vec![], vec![], vec![pss]);
        s.controllers = vec![rs("train", 1, None)];
        one(&run(&s), "podsecurity-denied");
    }
}
