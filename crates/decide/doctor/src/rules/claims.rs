//! Pods that wait on a DRA ResourceClaim, explained in terms of devices: the claim's class has
//! no device in any ResourceSlice; its CEL selector matches none (with the attribute values that
//! do exist, so a typo shows); every matching device is allocated (to which claims and pods);
//! the driver has no slice on the GPU nodes (not registered); or the kubelet's prepare failed
//! (`FailedPrepareDynamicResources`, with the driver's message). Without the DRA objects (an
//! older cluster, RBAC) only the scheduler's and the kubelet's words are explained.

use crate::Options;
use crate::cluster::{Cluster, GPU_PRESENT, describe_event, list_some};
use crate::finding::{Category, Finding, ObjectRef, Severity};
use crate::sched::{self, DraReason};
use gpuops_claims::ClaimError;
use gpuops_claims::cel::{Functions, Verdict as Cel};
use gpuops_claims::published::{Operand, PublishedDevice, SliceSelector, value_of};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::{
    Device, DeviceClass, DeviceSelector, ResourceClaim, ResourceSlice,
};
use std::cell::OnceCell;
use std::collections::{BTreeMap, BTreeSet};

/// The driver gpuops (and NVIDIA's DRA driver) publishes GPUs as; its pools are node names.
pub(crate) const GPU_DRIVER: &str = "gpu.nvidia.com";
/// The kubelet's event when NodePrepareResources fails (pkg/kubelet/events, v1.35.4).
pub(crate) const PREPARE_FAILED: &str = "FailedPrepareDynamicResources";

/// A device of a slice: driver, pool, the device, and the `device` variable selectors see (built
/// on first use: only pending claims need it).
struct SliceDevice<'a> {
    driver: &'a str,
    pool: &'a str,
    device: &'a Device,
    var: OnceCell<PublishedDevice>,
}

impl SliceDevice<'_> {
    fn var(&self) -> &PublishedDevice {
        self.var
            .get_or_init(|| PublishedDevice::new(self.driver, self.device))
    }
}

fn devices(slices: &[ResourceSlice]) -> Vec<SliceDevice<'_>> {
    slices
        .iter()
        .flat_map(|s| {
            s.spec.devices.iter().flatten().map(|d| SliceDevice {
                driver: s.spec.driver.as_str(),
                pool: s.spec.pool.name.as_str(),
                device: d,
                var: OnceCell::new(),
            })
        })
        .collect()
}

fn expressions(selectors: Option<&Vec<DeviceSelector>>) -> Vec<&str> {
    selectors
        .into_iter()
        .flatten()
        .filter_map(|s| s.cel.as_ref().map(|c| c.expression.as_str()))
        .collect()
}

/// The claim names of a pod: `(name in the pod, claim object name if known, from a template)`.
fn pod_claims(pod: &Pod) -> Vec<(String, Option<String>, bool)> {
    let statuses: BTreeMap<&str, Option<&str>> = pod
        .status
        .as_ref()
        .and_then(|s| s.resource_claim_statuses.as_ref())
        .into_iter()
        .flatten()
        .map(|s| (s.name.as_str(), s.resource_claim_name.as_deref()))
        .collect();
    pod.spec
        .as_ref()
        .and_then(|s| s.resource_claims.as_ref())
        .into_iter()
        .flatten()
        .map(
            |c| match (&c.resource_claim_name, &c.resource_claim_template_name) {
                (Some(n), _) => (c.name.clone(), Some(n.clone()), false),
                (None, _) => (
                    c.name.clone(),
                    statuses
                        .get(c.name.as_str())
                        .copied()
                        .flatten()
                        .map(str::to_string),
                    true,
                ),
            },
        )
        .collect()
}

/// Who holds a device: `claim ns/name (pod ns/p)`.
fn holders(claims: &[ResourceClaim]) -> BTreeMap<(String, String, String), String> {
    let mut out = BTreeMap::new();
    for c in claims {
        let ns = c.metadata.namespace.as_deref().unwrap_or("default");
        let name = c.metadata.name.as_deref().unwrap_or("");
        let Some(status) = &c.status else { continue };
        let pods: Vec<String> = status
            .reserved_for
            .iter()
            .flatten()
            .filter(|r| r.resource == "pods")
            .map(|r| format!("pod {ns}/{}", r.name))
            .collect();
        let who = if pods.is_empty() {
            format!("claim {ns}/{name}")
        } else {
            format!("claim {ns}/{name} ({})", pods.join(", "))
        };
        let results = status
            .allocation
            .as_ref()
            .and_then(|a| a.devices.as_ref())
            .and_then(|d| d.results.as_deref())
            .unwrap_or_default();
        for r in results {
            out.insert(
                (r.driver.clone(), r.pool.clone(), r.device.clone()),
                who.clone(),
            );
        }
    }
    out
}

/// Why one request of a claim cannot be served, in terms of devices.
enum Verdict {
    NoClass(String),
    NoDeviceOfClass {
        class: String,
        drivers: Vec<String>,
    },
    SelectorNone {
        class: String,
        expression: String,
        existing: Vec<String>,
    },
    /// The selector does not parse or stops with an error: what the evaluator said.
    Unknown {
        class: String,
        expression: String,
        error: String,
    },
    Allocated {
        class: String,
        want: i64,
        matching: usize,
        held_by: Vec<String>,
    },
}

/// The CEL error's own text (the finding quotes the expression once, apart).
fn cel_error(e: ClaimError, device: Option<&SliceDevice<'_>>) -> String {
    let reason = match e {
        ClaimError::Cel { reason, .. } => reason,
        other => other.to_string(),
    };
    match device {
        Some(d) => format!(
            "{reason} (on device {}/{} of {})",
            d.pool, d.device.name, d.driver
        ),
        None => reason,
    }
}

/// The verdict on one request (`None` when enough free devices match it).
fn request_verdict(
    class_name: &str,
    selectors: Option<&Vec<DeviceSelector>>,
    count: i64,
    classes: &[DeviceClass],
    all: &[SliceDevice<'_>],
    held: &BTreeMap<(String, String, String), String>,
    fns: &Functions,
) -> Option<Verdict> {
    let Some(class) = classes
        .iter()
        .find(|c| c.metadata.name.as_deref() == Some(class_name))
    else {
        return Some(Verdict::NoClass(class_name.to_string()));
    };
    let unknown = |expression: &str, error: String| {
        Some(Verdict::Unknown {
            class: class_name.to_string(),
            expression: expression.to_string(),
            error,
        })
    };
    // The allocator stops on a selector's error rather than skipping the device, so the first
    // error is the verdict.
    let mut class_sels = Vec::new();
    for e in expressions(class.spec.selectors.as_ref()) {
        match SliceSelector::compile(e) {
            Ok(s) => class_sels.push(s),
            Err(err) => return unknown(e, cel_error(err, None)),
        }
    }
    let mut of_class = Vec::new();
    for d in all {
        let mut ok = true;
        for s in &class_sels {
            match s.matches(fns, d.var()) {
                Ok(Cel::Match) => {}
                Ok(Cel::NoMatch) => ok = false,
                Err(err) => return unknown(s.expression(), cel_error(err, Some(d))),
            }
            if !ok {
                break;
            }
        }
        if ok {
            of_class.push(d);
        }
    }
    if of_class.is_empty() {
        let drivers: BTreeSet<String> = all.iter().map(|d| d.driver.to_string()).collect();
        return Some(Verdict::NoDeviceOfClass {
            class: class_name.to_string(),
            drivers: drivers.into_iter().collect(),
        });
    }
    let mut matching = of_class;
    for e in expressions(selectors) {
        let sel = match SliceSelector::compile(e) {
            Ok(s) => s,
            Err(err) => return unknown(e, cel_error(err, None)),
        };
        let mut kept: Vec<&SliceDevice<'_>> = Vec::new();
        for d in &matching {
            match sel.matches(fns, d.var()) {
                Ok(Cel::Match) => kept.push(d),
                Ok(Cel::NoMatch) => {}
                Err(err) => return unknown(e, cel_error(err, Some(d))),
            }
        }
        if kept.is_empty() {
            let existing = sel
                .reads()
                .iter()
                .filter(|o| !matches!(o, Operand::Driver))
                .map(|o| {
                    let values: BTreeSet<String> = matching
                        .iter()
                        .filter_map(|d| value_of(o, d.driver, d.device))
                        .collect();
                    format!(
                        "{o}: {}",
                        if values.is_empty() {
                            "no device has it".to_string()
                        } else {
                            list_some(values.iter().map(|v| format!("{v:?}")), 8)
                        }
                    )
                })
                .collect();
            return Some(Verdict::SelectorNone {
                class: class_name.to_string(),
                expression: e.to_string(),
                existing,
            });
        }
        matching = kept;
    }
    let free = matching
        .iter()
        .filter(|d| {
            !held.contains_key(&(
                d.driver.to_string(),
                d.pool.to_string(),
                d.device.name.clone(),
            ))
        })
        .count();
    if (free as i64) < count.max(1) {
        let held_by: BTreeSet<String> = matching
            .iter()
            .filter_map(|d| {
                held.get(&(
                    d.driver.to_string(),
                    d.pool.to_string(),
                    d.device.name.clone(),
                ))
                .map(|who| format!("{}/{} to {who}", d.pool, d.device.name))
            })
            .collect();
        return Some(Verdict::Allocated {
            class: class_name.to_string(),
            want: count.max(1),
            matching: matching.len(),
            held_by: held_by.into_iter().collect(),
        });
    }
    None
}

fn finding_for(v: &Verdict, ns: &str, pod: &str, claim: &str, request: &str) -> Finding {
    let what = format!("Pod {ns}/{pod}: claim {claim}, request {request}");
    let (code, title, fix) = match v {
        Verdict::NoClass(class) => (
            "claim-no-class",
            format!("{what} asks for DeviceClass {class}, which does not exist"),
            format!(
                "create DeviceClass {class} (the gpuops chart with dra.enabled creates gpu.nvidia.com and mig.nvidia.com) or fix deviceClassName in the claim"
            ),
        ),
        Verdict::NoDeviceOfClass { class, drivers } => (
            "claim-no-device",
            format!("{what}: no device of class {class} exists in any ResourceSlice"),
            format!(
                "no DRA driver publishes a device that class {class} selects (drivers with slices: {}); turn on the agent's DRA mode on the GPU nodes (chart value dra.enabled), or ask for a class those drivers serve",
                if drivers.is_empty() {
                    "none".to_string()
                } else {
                    drivers.join(", ")
                }
            ),
        ),
        Verdict::SelectorNone { class, expression, .. } => (
            "claim-selector-matches-none",
            format!("{what}: the CEL selector matches none of the devices of class {class}"),
            format!(
                "no device has the value the selector asks for (a typo?): compare {expression} with the values the devices have, listed above, and fix the claim or its template"
            ),
        ),
        Verdict::Unknown {
            class, expression, ..
        } => (
            "claim-selector-not-evaluated",
            format!("{what}: a CEL selector of class {class} or the claim cannot be evaluated"),
            format!(
                "the CEL error above says why: fix `{expression}` where it is wrong; if the API server accepted it and the scheduler allocates with it, it uses what the doctor's evaluator lacks (regular expressions, for one): check it by hand against kubectl get resourceslices -o yaml"
            ),
        ),
        Verdict::Allocated {
            class,
            want,
            matching,
            ..
        } => (
            "claim-devices-allocated",
            format!(
                "{what}: every device of class {class} that matches is allocated ({matching} matching, {want} wanted)"
            ),
            "wait for the claims holding them to be released (their pods to end), add GPU nodes with the DRA driver, or widen the selector".to_string(),
        ),
    };
    let mut f = Finding::new(Severity::Critical, Category::Scheduling, code, title)
        .object(ObjectRef::pod(ns, pod))
        .object(ObjectRef::namespaced("ResourceClaim", ns, claim))
        .fix(format!(
            "{fix}; the claim: kubectl describe resourceclaim -n {ns} {claim}"
        ))
        .command(format!("kubectl describe resourceclaim -n {ns} {claim}"));
    match v {
        Verdict::SelectorNone {
            expression,
            existing,
            ..
        } => {
            f = f.evidence(format!("selector: {expression}"));
            for e in existing {
                f = f.evidence(format!("values that exist: {e}"));
            }
        }
        Verdict::Unknown {
            expression, error, ..
        } => {
            f = f.evidence(format!("selector not evaluated: {expression}"));
            f = f.evidence(format!("CEL: {error}"));
        }
        Verdict::Allocated { held_by, .. } if !held_by.is_empty() => {
            f = f.evidence(format!("allocated: {}", list_some(held_by.iter(), 8)));
        }
        _ => {}
    }
    f
}

/// The scheduler's DynamicResources reasons in the pod's FailedScheduling message.
fn scheduler_dra(pod: &Pod) -> Vec<(String, DraReason)> {
    let Some(message) = crate::cluster::unscheduled(pod).and_then(|c| c.message.as_deref()) else {
        return Vec::new();
    };
    let Some(m) = sched::parse(message) else {
        return DraReason::of(message)
            .map(|r| vec![(message.to_string(), r)])
            .unwrap_or_default();
    };
    let mut texts: Vec<String> = m.prefilter.into_iter().collect();
    texts.extend(m.reasons.iter().map(|r| r.to_string()));
    texts
        .into_iter()
        .filter_map(|t| DraReason::of(&t).map(|r| (t, r)))
        .collect()
}

// Long on purpose: the claim reasons are tried in the order that makes each finding the most
// specific one true (class, devices, selector, holders, driver, prepare); one walk keeps that order visible.
pub(super) fn check(c: &Cluster<'_>, o: &Options) -> Vec<Finding> {
    let dra = &c.snapshot.dra;
    let all = devices(&dra.slices);
    let held = holders(&dra.claims);
    let fns = Functions::new();
    // GPU nodes the driver has no slice for: its kubelet plugin is not registered there.
    let with_slice: BTreeSet<&str> = dra
        .slices
        .iter()
        .filter(|s| s.spec.driver == GPU_DRIVER)
        .filter_map(|s| {
            s.spec
                .node_name
                .as_deref()
                .or(Some(s.spec.pool.name.as_str()))
        })
        .collect();
    let unregistered: Vec<&str> = c
        .nodes
        .iter()
        .filter(|n| n.label(GPU_PRESENT) == Some("true") && !with_slice.contains(n.name))
        .map(|n| n.name)
        .collect();
    let mut out = Vec::new();
    for pod in &c.snapshot.pods {
        let claims = pod_claims(pod);
        if claims.is_empty() {
            continue;
        }
        let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
        let name = pod.metadata.name.as_deref().unwrap_or("");
        let phase = pod
            .status
            .as_ref()
            .and_then(|s| s.phase.as_deref())
            .unwrap_or("");
        let bound = pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.as_deref())
            .filter(|n| !n.is_empty());
        if !matches!(phase, "Pending" | "") {
            continue;
        }
        if let Some(node) = bound {
            // Bound: only the kubelet's prepare can hold it back on claims.
            if let Some(e) = c
                .events_for("Pod", ns, name)
                .iter()
                .find(|e| e.reason.as_deref() == Some(PREPARE_FAILED))
            {
                out.push(
                    Finding::new(
                        Severity::Critical,
                        Category::Workload,
                        "claim-prepare-failed",
                        format!(
                            "Pod {ns}/{name}: the DRA driver failed to prepare its claims on {node}"
                        ),
                    )
                    .object(ObjectRef::pod(ns, name))
                    .object(ObjectRef::node(node))
                    .evidence(describe_event(e, c.now()))
                    .fix(format!("the driver's message above says why NodePrepareResources failed (a bad opaque config names its field; a device gone unhealthy needs the claim re-allocated: delete the pod so its template claim is recreated); the agent's log on the node has the details; the pod's events: kubectl describe pod -n {ns} {name}"))
                    .command(format!("kubectl describe pod -n {ns} {name}")),
                );
            }
            continue;
        }
        let reasons = scheduler_dra(pod);
        let mut explained = false;
        if dra.unread.is_none() {
            for (pod_claim, object, template) in &claims {
                let Some(object) = object else {
                    // The ResourceClaim controller needs a moment to create a template's claim.
                    let young = pod.metadata.creation_timestamp.as_ref().is_some_and(|t| {
                        crate::cluster::seconds_between(c.now(), t.0)
                            < o.pending_grace.as_secs() as i64
                    });
                    if *template && !young {
                        out.push(missing(
                            ns,
                            name,
                            pod_claim,
                            "its ResourceClaimTemplate's claim has not been created yet",
                        ));
                        explained = true;
                    }
                    continue;
                };
                let Some(claim) = dra.claims.iter().find(|k| {
                    k.metadata.namespace.as_deref().unwrap_or("default") == ns
                        && k.metadata.name.as_deref() == Some(object.as_str())
                }) else {
                    out.push(missing(ns, name, object, "ResourceClaim does not exist"));
                    explained = true;
                    continue;
                };
                if claim
                    .status
                    .as_ref()
                    .is_some_and(|s| s.allocation.is_some())
                {
                    continue;
                }
                for r in &claim
                    .spec
                    .devices
                    .as_ref()
                    .and_then(|d| d.requests.clone())
                    .unwrap_or_default()
                {
                    let alternatives: Vec<(String, Option<&Vec<DeviceSelector>>, i64)> =
                        match (&r.exactly, &r.first_available) {
                            (Some(x), _) => vec![(
                                x.device_class_name.clone(),
                                x.selectors.as_ref(),
                                if x.allocation_mode.as_deref() == Some("All") {
                                    1
                                } else {
                                    x.count.unwrap_or(1)
                                },
                            )],
                            (None, Some(subs)) => subs
                                .iter()
                                .map(|s| {
                                    (
                                        s.device_class_name.clone(),
                                        s.selectors.as_ref(),
                                        s.count.unwrap_or(1),
                                    )
                                })
                                .collect(),
                            _ => Vec::new(),
                        };
                    // A request with alternatives is served when any one is; report the first's
                    // reason only when none can be.
                    let verdicts: Vec<Verdict> = alternatives
                        .iter()
                        .filter_map(|(class, sel, n)| {
                            request_verdict(class, *sel, *n, &dra.classes, &all, &held, &fns)
                        })
                        .collect();
                    if !alternatives.is_empty() && verdicts.len() == alternatives.len() {
                        let mut f = finding_for(&verdicts[0], ns, name, object, &r.name);
                        for (text, _) in &reasons {
                            f = f.evidence(format!("scheduler: {text}"));
                        }
                        out.push(f);
                        explained = true;
                    }
                }
            }
            if !explained
                && !unregistered.is_empty()
                && reasons.iter().any(|(_, r)| {
                    matches!(r, DraReason::CannotAllocate | DraReason::WaitingForDriver)
                })
            {
                out.push(
                    Finding::new(
                        Severity::Critical,
                        Category::Scheduling,
                        "claim-driver-not-registered",
                        format!(
                            "Pod {ns}/{name}: the DRA driver {GPU_DRIVER} is not registered on GPU nodes {}",
                            list_some(unregistered.iter(), 5)
                        ),
                    )
                    .object(ObjectRef::pod(ns, name))
                    .objects(unregistered.iter().map(|n| ObjectRef::node(n)))
                    .evidence(format!(
                        "no ResourceSlice of driver {GPU_DRIVER} for {} (its pool is the node's name)",
                        list_some(unregistered.iter(), 5)
                    ))
                    .fix(format!("the agent's DRA kubelet plugin publishes a node's slice once the kubelet registered it: check that the agent runs with --dra on those nodes (chart value dra.enabled for their pool) and its log for the registration; the slices there are: kubectl get resourceslices --field-selector spec.driver={GPU_DRIVER}"))
                    .command(format!("kubectl get resourceslices --field-selector spec.driver={GPU_DRIVER}")),
                );
                explained = true;
            }
        }
        if !explained && let Some((text, r)) = reasons.first() {
            let mut f = Finding::new(
                Severity::Critical,
                Category::Scheduling,
                "claim-unschedulable",
                format!(
                    "Pod {ns}/{name}: its ResourceClaims hold it back: {}",
                    r.explain()
                ),
            )
            .object(ObjectRef::pod(ns, name))
            .evidence(format!("scheduler: {text}"));
            if let Some(why) = &dra.unread {
                f = f.evidence(format!(
                    "cannot know which devices: the DRA objects could not be read ({why})"
                ));
            }
            out.push(
                f.fix(format!(
                    "{}; the pod's events: kubectl describe pod -n {ns} {name}",
                    r.explain()
                ))
                .command(format!("kubectl describe pod -n {ns} {name}")),
            );
        }
    }
    out
}

fn missing(ns: &str, pod: &str, claim: &str, why: &str) -> Finding {
    Finding::new(
        Severity::Critical,
        Category::Scheduling,
        "claim-missing",
        format!("Pod {ns}/{pod}: claim {claim}: {why}"),
    )
    .object(ObjectRef::pod(ns, pod))
    .fix(format!(
        "{}; the claims there: kubectl get resourceclaims -n {ns}",
        DraReason::ClaimMissing.explain()
    ))
    .command(format!("kubectl get resourceclaims -n {ns}"))
}

#[cfg(test)]
mod tests;
