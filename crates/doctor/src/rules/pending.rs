//! Pending GPU pods: the real reason, computed from fits (GPUs free per node, taints, selectors),
//! with the scheduler's FailedScheduling text as evidence.

use super::{configs_offering, node_model};
use crate::Options;
use crate::cluster::{
    Cluster, MIG_CONFIG, MIG_STRATEGY, NodeView, PodView, describe_event, human_duration,
    list_some, seconds_between,
};
use crate::finding::{Category, Finding, ObjectRef, Severity};
use crate::fit;
use crate::resources::{self, GPU, GPU_SHARED};
use gpuops_mig::config::MigPartedConfig;
use k8s_openapi::api::core::v1::Taint;
use std::collections::BTreeMap;

/// Nodes named one by one in evidence; the rest are counted.
const LISTED: usize = 6;

pub(super) fn check(c: &Cluster<'_>, o: &Options) -> Vec<Finding> {
    let gpu_nodes: Vec<&NodeView<'_>> = c.gpu_nodes().collect();
    let mut configs: Option<MigPartedConfig> = None;
    c.gpu_pods
        .iter()
        .filter(|p| p.pending_unbound())
        .filter_map(|p| diagnose_pod(c, o, p, &gpu_nodes, &mut configs))
        .collect()
}

/// What the scheduler said: the newest FailedScheduling event, else the PodScheduled condition.
fn scheduler_says(c: &Cluster<'_>, p: &PodView<'_>) -> Option<(String, String)> {
    if let Some(e) = c.pod_event(p, "FailedScheduling") {
        return Some((
            describe_event(e, c.now()),
            e.message.clone().unwrap_or_default(),
        ));
    }
    p.pod
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .find(|cond| cond.type_ == "PodScheduled" && cond.status == "False")
        .and_then(|cond| {
            let msg = cond.message.clone()?;
            Some((
                format!(
                    "PodScheduled=False {}: {msg}",
                    cond.reason.as_deref().unwrap_or("")
                ),
                msg,
            ))
        })
}

fn base(severity: Severity, code: &'static str, title: String, p: &PodView<'_>) -> Finding {
    Finding::new(severity, Category::Scheduling, code, title)
        .object(ObjectRef::pod(p.namespace, p.name))
}

fn with_scheduler(mut f: Finding, said: &Option<(String, String)>) -> Finding {
    match said {
        Some((text, _)) => f.evidence.insert(0, text.clone()),
        None => f
            .evidence
            .insert(0, "no FailedScheduling event yet".to_string()),
    }
    f
}

fn diagnose_pod(
    c: &Cluster<'_>,
    o: &Options,
    p: &PodView<'_>,
    gpu_nodes: &[&NodeView<'_>],
    configs: &mut Option<MigPartedConfig>,
) -> Option<Finding> {
    let said = scheduler_says(c, p);
    let want = resources::describe(&p.gpus);
    let who = format!("{}/{}", p.namespace, p.name);

    // 1. The nodes the pod's constraints pick offer other GPU resources (a MIG pool asked for whole
    // GPUs, a shared pool asked for several replicas...).
    if fit::has_node_constraints(p.pod) {
        let picked: Vec<&NodeView<'_>> = gpu_nodes
            .iter()
            .copied()
            .filter(|n| !n.capacity.is_empty() || !n.allocatable.is_empty())
            .filter(|n| fit::selects(p.pod, n.name, n.labels))
            .collect();
        if !picked.is_empty() && !picked.iter().any(|n| p.gpus.keys().all(|r| n.offers(r))) {
            let (r, n) = p
                .gpus
                .iter()
                .find(|(r, _)| !picked.iter().any(|node| node.offers(r)))
                .map_or((GPU, 1), |(r, n)| (r.as_str(), *n));
            let configs = configs.get_or_insert_with(gpuops_mig::config::nvidia_default_configs);
            let mut f = mismatch(p, r, n, &picked, configs);
            f.title = format!("Pod {who} asks for {r}, which the nodes it selects do not offer");
            f.evidence.insert(
                1,
                format!(
                    "pod constraints ({}) pick {}",
                    fit::describe_constraints(p.pod),
                    list_some(picked.iter().map(|n| n.name), LISTED)
                ),
            );
            return Some(with_scheduler(f, &said));
        }
    }

    // 2. A resource no node offers at all.
    for (r, n) in &p.gpus {
        if !gpu_nodes.iter().any(|node| node.offers(r)) {
            let configs = configs.get_or_insert_with(gpuops_mig::config::nvidia_default_configs);
            let f = mismatch(p, r, *n, gpu_nodes, configs);
            return Some(with_scheduler(f, &said));
        }
    }
    let offering: Vec<&NodeView<'_>> = gpu_nodes
        .iter()
        .copied()
        .filter(|node| p.gpus.keys().all(|r| node.offers(r)))
        .collect();
    if offering.is_empty() {
        let f = base(
            Severity::Critical,
            "resource-mismatch",
            format!("Pod {who} asks for {want}, which no single node offers together"),
            p,
        )
        .evidence(format!("asks for {want}"))
        .fix("request one kind of GPU resource per pod (whole GPUs, one MIG profile, or shared replicas)");
        return Some(with_scheduler(f, &said));
    }

    // 2. nodeSelector / required node affinity.
    let selected: Vec<&NodeView<'_>> = offering
        .iter()
        .copied()
        .filter(|n| fit::selects(p.pod, n.name, n.labels))
        .collect();
    if selected.is_empty() {
        return Some(with_scheduler(
            selector_mismatch(p, &offering, &want),
            &said,
        ));
    }

    // 3. Taints.
    let has_room = |n: &NodeView<'_>| p.gpus.iter().all(|(r, need)| n.free(r) >= *need);
    let tolerated: Vec<&NodeView<'_>> = selected
        .iter()
        .copied()
        .filter(|n| fit::untolerated(p.pod, &n.taints).is_empty())
        .collect();
    let tainted_with_room: Vec<&NodeView<'_>> = selected
        .iter()
        .copied()
        .filter(|n| !fit::untolerated(p.pod, &n.taints).is_empty() && has_room(n))
        .collect();
    if tolerated.is_empty()
        || (!tolerated.iter().any(|n| has_room(n)) && !tainted_with_room.is_empty())
    {
        let blocking = if tainted_with_room.is_empty() {
            &selected
        } else {
            &tainted_with_room
        };
        return Some(with_scheduler(untolerated(p, blocking, &want), &said));
    }

    // 4. Larger than any node.
    let big_enough: Vec<&NodeView<'_>> = tolerated
        .iter()
        .copied()
        .filter(|n| p.gpus.iter().all(|(r, need)| n.allocatable_of(r) >= *need))
        .collect();
    if big_enough.is_empty() {
        return Some(with_scheduler(too_big(p, &tolerated, &want), &said));
    }

    // 5. Room somewhere?
    if tolerated.iter().any(|n| has_room(n)) {
        return fits_anyway(c, o, p, &said, &want);
    }
    let short: Vec<(&String, i64, i64)> = p
        .gpus
        .iter()
        .map(|(r, need)| (r, *need, tolerated.iter().map(|n| n.free(r)).sum::<i64>()))
        .collect();
    let f = if short.iter().all(|(_, need, free)| free >= need) {
        fragmentation(c, p, &tolerated, &want)
    } else {
        insufficient(p, &tolerated, &short, &want)
    };
    Some(with_scheduler(f, &said))
}

fn fits_anyway(
    c: &Cluster<'_>,
    o: &Options,
    p: &PodView<'_>,
    said: &Option<(String, String)>,
    want: &str,
) -> Option<Finding> {
    let who = format!("{}/{}", p.namespace, p.name);
    let age = p
        .created()
        .map_or(i64::MAX, |t| seconds_between(c.now(), t));
    match said {
        // Merely new: the scheduler has not tried yet, and it will fit.
        None if age < o.pending_grace.as_secs() as i64 => None,
        None => Some(
            base(
                Severity::Warning,
                "not-scheduled",
                format!("Pod {who} has waited {} with no scheduling attempt, though it fits", human_duration(age)),
                p,
            )
            .evidence(format!(
                "schedulerName: {}",
                p.pod
                    .spec
                    .as_ref()
                    .and_then(|s| s.scheduler_name.as_deref())
                    .unwrap_or("default-scheduler")
            ))
            .fix("check that the scheduler named by spec.schedulerName runs: kubectl -n kube-system get pods -l component=kube-scheduler"),
        ),
        Some((text, message)) => {
            let gpu_words = message.contains("nvidia.com/");
            if gpu_words {
                // The last attempt failed on GPUs, which have been freed since: the next retry places it.
                Some(
                    base(
                        Severity::Info,
                        "gpus-freed-since",
                        format!("Pod {who} failed to schedule earlier, but {want} is free now"),
                        p,
                    )
                    .evidence(text.clone())
                    .fix("nothing to do: the scheduler retries and should place it; if it stays pending, look at the newest FailedScheduling event"),
                )
            } else {
                Some(
                    base(
                        Severity::Warning,
                        "pending-non-gpu",
                        format!("Pod {who} has room for its GPUs but is pending for another reason"),
                        p,
                    )
                    .evidence(text.clone())
                    .fix("the GPUs are not the problem: fix what the scheduler names (CPU, memory, volumes, pod affinity or topology spread)"),
                )
            }
        }
    }
}

fn free_list(nodes: &[&NodeView<'_>], r: &str) -> String {
    let mut v: Vec<(&str, i64, i64)> = nodes
        .iter()
        .map(|n| (n.name, n.free(r), n.allocatable_of(r)))
        .collect();
    v.sort_by_key(|(name, free, _)| (std::cmp::Reverse(*free), *name));
    list_some(
        v.iter()
            .map(|(name, free, alloc)| format!("{name} {free}/{alloc} free")),
        LISTED,
    )
}

fn fragmentation(c: &Cluster<'_>, p: &PodView<'_>, nodes: &[&NodeView<'_>], want: &str) -> Finding {
    let who = format!("{}/{}", p.namespace, p.name);
    let mut f = base(
        Severity::Warning,
        "fragmentation",
        format!(
            "Pod {who} needs {want} on one node: enough GPUs are free in total, but spread over nodes"
        ),
        p,
    );
    for (r, need) in &p.gpus {
        let total: i64 = nodes.iter().map(|n| n.free(r)).sum();
        let most = nodes.iter().map(|n| n.free(r)).max().unwrap_or(0);
        f = f.evidence(format!(
            "{r}: {total} free across {} eligible nodes, at most {most} on one node, {need} needed on one: {}",
            nodes.iter().filter(|n| n.free(r) > 0).count(),
            free_list(nodes, r)
        ));
    }
    // The node closest to fitting, and the smallest pods on it whose eviction would make room.
    let (r, need) = p
        .gpus
        .iter()
        .next()
        .map_or((GPU, 1), |(r, n)| (r.as_str(), *n));
    let best = nodes
        .iter()
        .filter(|n| n.allocatable_of(r) >= need)
        .max_by_key(|n| (n.free(r), std::cmp::Reverse(n.name)));
    let mut fix = String::from(
        "pack small GPU pods so whole nodes stay free: score GPU nodes MostAllocated (kube-scheduler \
         NodeResourcesFit scoringStrategy with nvidia.com/gpu weighted) or run `gpuops scheduler-extender`",
    );
    if let Some(node) = best {
        let missing = need - node.free(r);
        let mut holders: Vec<&PodView<'_>> = node
            .gpu_pods
            .iter()
            .map(|&i| &c.gpu_pods[i])
            .filter(|q| q.gpus.contains_key(r))
            .collect();
        holders.sort_by_key(|q| (q.gpus.get(r).copied().unwrap_or(0), q.name));
        let mut freed = 0;
        let mut evict = Vec::new();
        for q in holders {
            if freed >= missing {
                break;
            }
            freed += q.gpus.get(r).copied().unwrap_or(0);
            evict.push(format!("{}/{}", q.namespace, q.name));
        }
        if freed >= missing && !evict.is_empty() {
            fix = format!(
                "make room on {}: it has {} of {need} free; moving {} elsewhere frees {missing} more \
                 (kubectl delete pod -n NS NAME lets its controller recreate it elsewhere). Lasting fix: {fix}",
                node.name,
                node.free(r),
                evict.join(", ")
            );
        }
        f = f.object(ObjectRef::node(node.name));
    }
    f.fix(fix)
}

fn insufficient(
    p: &PodView<'_>,
    nodes: &[&NodeView<'_>],
    short: &[(&String, i64, i64)],
    want: &str,
) -> Finding {
    let who = format!("{}/{}", p.namespace, p.name);
    let mut f = base(
        Severity::Warning,
        "insufficient-gpus",
        format!("Pod {who} needs {want}: not enough free in the whole cluster"),
        p,
    );
    let mut products: BTreeMap<&str, usize> = BTreeMap::new();
    for n in nodes {
        *products
            .entry(n.label(crate::cluster::PRODUCT).unwrap_or("GPU"))
            .or_default() += 1;
    }
    for (r, need, free) in short {
        let alloc: i64 = nodes.iter().map(|n| n.allocatable_of(r)).sum();
        f = f.evidence(format!(
            "{r}: {need} needed, {free} free of {alloc} allocatable on {} eligible nodes: {}",
            nodes.len(),
            free_list(nodes, r)
        ));
    }
    let pool = products
        .iter()
        .max_by_key(|(_, n)| **n)
        .map_or("GPU", |(p, _)| *p);
    f.fix(format!(
        "add GPU capacity (scale the {pool} node pool up by at least one node) or free GPUs: \
         look for idle allocated GPUs (`gpuops top pods`) and finished jobs holding them"
    ))
}

fn too_big(p: &PodView<'_>, nodes: &[&NodeView<'_>], want: &str) -> Finding {
    let who = format!("{}/{}", p.namespace, p.name);
    let mut f = base(
        Severity::Critical,
        "request-exceeds-node",
        format!("Pod {who} asks for {want}, more than any eligible node has"),
        p,
    );
    for (r, need) in &p.gpus {
        let max = nodes.iter().map(|n| n.allocatable_of(r)).max().unwrap_or(0);
        f = f.evidence(format!(
            "{r}: asks for {need}, the largest eligible node has {max} allocatable ({})",
            free_list(nodes, r)
        ));
        if max == 0 {
            f = f.evidence(
                "the eligible nodes have no allocatable GPUs: see the node findings".to_string(),
            );
        }
    }
    f.fix(
        "a pod runs on one node: ask for at most one node's GPUs per pod (split the job into \
         several pods, e.g. one per node with torchrun/MPI), or add nodes with more GPUs",
    )
}

fn selector_mismatch(p: &PodView<'_>, offering: &[&NodeView<'_>], want: &str) -> Finding {
    let who = format!("{}/{}", p.namespace, p.name);
    let mut f = base(
        Severity::Critical,
        "selector-matches-no-gpu-node",
        format!("Pod {who}'s nodeSelector/affinity matches none of the nodes offering {want}"),
        p,
    )
    .evidence(format!(
        "pod constraints: {}",
        fit::describe_constraints(p.pod)
    ));
    let mut suggestion = None;
    for key in fit::constraint_keys(p.pod) {
        let mut values: BTreeMap<&str, usize> = BTreeMap::new();
        for n in offering {
            *values
                .entry(n.label(&key).unwrap_or("<absent>"))
                .or_default() += 1;
        }
        if suggestion.is_none()
            && let Some((v, _)) = values
                .iter()
                .filter(|(v, _)| **v != "<absent>")
                .max_by_key(|(_, n)| **n)
        {
            suggestion = Some(format!("{key}: {v}"));
        }
        f = f.evidence(format!(
            "{key} on the {} GPU nodes: {}",
            offering.len(),
            list_some(values.iter().map(|(v, n)| format!("{v} ({n})")), LISTED)
        ));
    }
    f.fix(match suggestion {
        Some(s) => format!(
            "change the pod's nodeSelector/affinity to a value the GPU nodes have, e.g. `{s}`, or \
             label the intended nodes (kubectl label node NODE KEY=VALUE)"
        ),
        None => {
            "remove or correct the pod's nodeSelector/affinity, or label the intended GPU nodes"
                .to_string()
        }
    })
}

fn untolerated(p: &PodView<'_>, nodes: &[&NodeView<'_>], want: &str) -> Finding {
    let who = format!("{}/{}", p.namespace, p.name);
    let mut taints: BTreeMap<String, (Taint, Vec<&str>)> = BTreeMap::new();
    for n in nodes {
        for t in fit::untolerated(p.pod, &n.taints) {
            taints
                .entry(fit::describe_taint(t))
                .or_insert_with(|| (t.clone(), Vec::new()))
                .1
                .push(n.name);
        }
    }
    let keys: Vec<&str> = taints.values().map(|(t, _)| t.key.as_str()).collect();
    let title = if keys.iter().all(|k| *k == fit::UNSCHEDULABLE_TAINT) {
        format!("Pod {who} can only run on cordoned GPU nodes")
    } else {
        format!(
            "Pod {who} does not tolerate the taint{} on the GPU nodes with room",
            if taints.len() > 1 { "s" } else { "" }
        )
    };
    let mut f = base(Severity::Critical, "untolerated-taint", title, p);
    for (text, (_, names)) in &taints {
        f = f.evidence(format!(
            "{text} on {} node(s) offering {want}: {}",
            names.len(),
            list_some(names, LISTED)
        ));
    }
    let mut fixes = Vec::new();
    let tolerable: Vec<&Taint> = taints
        .values()
        .map(|(t, _)| t)
        .filter(|t| t.key != fit::UNSCHEDULABLE_TAINT && t.key != "gpuops.io/gpu-unhealthy")
        .collect();
    if !tolerable.is_empty() {
        let yaml: Vec<String> = tolerable.iter().map(|t| fit::toleration_yaml(t)).collect();
        let mut s = format!("add to the pod spec:\ntolerations:\n{}", yaml.join("\n"));
        if tolerable.iter().any(|t| t.key.starts_with("nvidia.com/")) {
            s.push_str(
                "\n(or enable the ExtendedResourceToleration admission plugin, which adds it to every pod requesting nvidia.com/ resources)",
            );
        }
        fixes.push(s);
    }
    if taints
        .values()
        .any(|(t, _)| t.key == fit::UNSCHEDULABLE_TAINT)
    {
        let names: Vec<&str> = taints
            .values()
            .filter(|(t, _)| t.key == fit::UNSCHEDULABLE_TAINT)
            .flat_map(|(_, n)| n.iter().copied())
            .collect();
        fixes.push(format!(
            "uncordon when maintenance is done: kubectl uncordon {}",
            names.join(" ")
        ));
    }
    if taints
        .values()
        .any(|(t, _)| t.key == "gpuops.io/gpu-unhealthy")
    {
        fixes.push("do not tolerate gpuops.io/gpu-unhealthy: repair the GPU (see the health finding); the agent removes the taint when it recovers".into());
    }
    for n in nodes {
        f = f.object(ObjectRef::node(n.name));
        if f.objects.len() > LISTED {
            break;
        }
    }
    f.fix(fixes.join("\n"))
}

/// Everything GPU-ish the nodes offer: resource -> (nodes, allocatable in total).
fn offered(nodes: &[&NodeView<'_>]) -> BTreeMap<String, (usize, i64)> {
    let mut out: BTreeMap<String, (usize, i64)> = BTreeMap::new();
    for n in nodes {
        for r in n.capacity.keys().chain(n.allocatable.keys()) {
            out.entry(r.clone()).or_default();
        }
    }
    for (r, (count, total)) in out.iter_mut() {
        for n in nodes.iter().filter(|n| n.offers(r)) {
            *count += 1;
            *total += n.allocatable_of(r);
        }
    }
    out
}

fn describe_offered(offered: &BTreeMap<String, (usize, i64)>) -> String {
    if offered.is_empty() {
        return "no node offers any nvidia.com/ resource".into();
    }
    format!(
        "the GPU nodes offer: {}",
        list_some(
            offered
                .iter()
                .map(|(r, (nodes, total))| format!("{r} ({total} on {nodes} node(s))")),
            8
        )
    )
}

fn mismatch(
    p: &PodView<'_>,
    r: &str,
    n: i64,
    gpu_nodes: &[&NodeView<'_>],
    configs: &MigPartedConfig,
) -> Finding {
    let who = format!("{}/{}", p.namespace, p.name);
    let offered = offered(gpu_nodes);
    let evidence = describe_offered(&offered);
    let migs: Vec<&String> = offered
        .keys()
        .filter(|k| resources::mig_profile(k).is_some())
        .collect();
    let title = format!("Pod {who} asks for {r}, which no node offers");
    let finding = |code| {
        base(Severity::Critical, code, title.clone(), p)
            .evidence(format!("asks for {r}: {n}"))
            .evidence(evidence.clone())
    };

    if let Some(profile) = resources::mig_profile(r) {
        // Single strategy: MIG devices are advertised as nvidia.com/gpu.
        let single: Vec<&NodeView<'_>> = gpu_nodes
            .iter()
            .copied()
            .filter(|node| node.label(MIG_STRATEGY) == Some("single") && node.offers(GPU))
            .collect();
        if single.iter().any(|node| {
            node.label(crate::cluster::PRODUCT)
                .is_some_and(|v| v.ends_with(&format!("-MIG-{profile}")))
        }) {
            return finding("resource-mismatch")
                .evidence(format!(
                    "nodes with nvidia.com/mig.strategy=single advertise their {profile} instances as nvidia.com/gpu: {}",
                    list_some(single.iter().map(|s| s.name), LISTED)
                ))
                .fix(format!(
                    "request `nvidia.com/gpu: {n}` instead of `{r}` (MIG strategy single), or run the device plugin with migStrategy mixed"
                ));
        }
        return mig_not_offered(
            finding("mig-profile-not-offered"),
            &profile,
            r,
            n,
            gpu_nodes,
            configs,
        );
    }
    if r == GPU {
        if !migs.is_empty() {
            return finding("resource-mismatch")
                .evidence("nodes run MIG with strategy mixed: whole GPUs are advertised as nvidia.com/mig-<profile>, not nvidia.com/gpu")
                .fix(format!(
                    "request a MIG instance instead, e.g. `{}: {n}` (offered: {}), or turn MIG off on a node: \
                     kubectl label node NODE nvidia.com/mig.config=all-disabled --overwrite",
                    migs[migs.len() - 1],
                    list_some(migs.iter(), 8)
                ));
        }
        if offered.contains_key(GPU_SHARED) {
            return finding("resource-mismatch")
                .evidence("the GPUs are time-sliced with renameByDefault: they are advertised as nvidia.com/gpu.shared")
                .fix("request `nvidia.com/gpu.shared: 1` instead (a replica, not a whole GPU), or keep whole GPUs on some nodes with a per-node device plugin config (label nvidia.com/device-plugin.config)");
        }
    }
    if resources::is_shared_name(r) {
        let base_name = r.strip_suffix(".shared").unwrap_or(r);
        if offered.contains_key(base_name) {
            return finding("resource-mismatch")
                .evidence(format!("no node renames shared replicas to {r}; {base_name} is offered (whole, or shared without renameByDefault)"))
                .fix(format!(
                    "request `{base_name}: 1` instead, or enable sharing with renameByDefault: true in the device plugin config (sharing.timeSlicing)"
                ));
        }
    }
    finding("resource-mismatch").fix(format!(
        "request a resource the nodes offer ({}), or deploy the device plugin that provides {r}",
        list_some(offered.keys(), 8)
    ))
}

fn mig_not_offered(
    mut f: Finding,
    profile: &str,
    r: &str,
    n: i64,
    gpu_nodes: &[&NodeView<'_>],
    configs: &MigPartedConfig,
) -> Finding {
    // Nodes whose GPU model has the profile, and the default config that would create it.
    let mut capable: Vec<(&NodeView<'_>, Vec<String>)> = Vec::new();
    let mut models: BTreeMap<&str, &gpuops_catalog::GpuModel> = BTreeMap::new();
    let mut offering_configs: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for node in gpu_nodes {
        let Some(model) = node_model(node) else {
            continue;
        };
        models.insert(model.key, model);
        if model.gi_profile(profile).is_some() && !node.allocatable.is_empty() {
            let names = offering_configs
                .entry(model.key)
                .or_insert_with(|| configs_offering(configs, profile, model))
                .clone();
            capable.push((node, names));
        }
    }
    // Best first: nodes already in MIG mode, then those with the fewest GPUs in use (MIG changes
    // need free GPUs).
    capable.sort_by_key(|(node, _)| {
        let in_mig = node.label(MIG_CONFIG).is_some_and(|c| c != "all-disabled")
            || node
                .allocatable
                .keys()
                .any(|r| resources::mig_profile(r).is_some());
        (!in_mig, node.requested.values().sum::<i64>(), node.name)
    });
    if let Some((_, names)) = capable.iter().find(|(_, names)| !names.is_empty()) {
        let config = &names[0];
        let nodes: Vec<&str> = capable.iter().map(|(node, _)| node.name).collect();
        for (node, _) in capable.iter().take(LISTED) {
            f = f.evidence(format!(
                "{} ({}) can offer {profile}; its nvidia.com/mig.config is {}",
                node.name,
                node.label(crate::cluster::PRODUCT).unwrap_or("?"),
                node.label(MIG_CONFIG).unwrap_or("<unset>")
            ));
            f = f.object(ObjectRef::node(node.name));
        }
        let also = if names.len() > 1 {
            format!(" (other configs with {profile}: {})", names[1..].join(", "))
        } else {
            String::new()
        };
        return f.fix(format!(
            "repartition a node: kubectl label node {} nvidia.com/mig.config={config} --overwrite{also}; \
             or request a profile that is offered",
            nodes.first().copied().unwrap_or("NODE")
        ));
    }
    // No model in the cluster has it: suggest the same-size profile of the models present.
    let slices = profile
        .parse::<gpuops_catalog::ProfileName>()
        .ok()
        .map(|p| p.gpu_slices);
    let mut alternatives = Vec::new();
    for model in models.values() {
        let Some(mig) = &model.mig else { continue };
        let names: Vec<&str> = mig.gi_profiles.iter().map(|g| g.name).collect();
        f = f.evidence(format!(
            "{} offers MIG profiles {}",
            model.key,
            names.join(", ")
        ));
        if let Some(same) = mig.gi_profiles.iter().find(|g| {
            g.name
                .parse::<gpuops_catalog::ProfileName>()
                .ok()
                .map(|p| p.gpu_slices)
                == slices
        }) {
            alternatives.push(format!("{}: {n}", resources::mig_resource(same.name)));
        }
    }
    let owners: Vec<&str> = gpuops_catalog::models()
        .iter()
        .filter(|m| m.gi_profile(profile).is_some())
        .map(|m| m.key)
        .collect();
    if !owners.is_empty() {
        f = f.evidence(format!("{profile} is a profile of {}", owners.join(", ")));
    }
    f.fix(match alternatives.first() {
        Some(a) => format!("request the profile this cluster's GPUs have: `{a}` instead of `{r}`"),
        None => format!("no GPU in the cluster can offer {profile}: add MIG-capable nodes ({}), or request whole GPUs", owners.join(", ")),
    })
}

#[cfg(test)]
mod tests {
    use crate::testkit::*;

    const INSUFFICIENT: &str = "0/3 nodes are available: 3 Insufficient nvidia.com/gpu. preemption: 0/3 nodes are available: 3 No preemption victims found for incoming pod.";

    fn three_nodes_two_free_each() -> (
        Vec<k8s_openapi::api::core::v1::Node>,
        Vec<k8s_openapi::api::core::v1::Pod>,
    ) {
        let nodes = (1..=3)
            .map(|i| gpu_node(&format!("gpu-{i}"), "nvidia.com/gpu", 8))
            .collect();
        let pods = (1..=3)
            .map(|i| {
                running(
                    pod("ml", &format!("busy-{i}"), &[("nvidia.com/gpu", 6)]),
                    &format!("gpu-{i}"),
                )
            })
            .collect();
        (nodes, pods)
    }

    #[test]
    fn fragmentation_versus_not_enough_is_computed() {
        // 3 x 2 free: 4 fits in total but not on one node; 7 does not fit at all.
        for (need, code) in [(4, "fragmentation"), (7, "insufficient-gpus")] {
            let (nodes, mut pods) = three_nodes_two_free_each();
            pods.push(unschedulable(
                pod("ml", "train", &[("nvidia.com/gpu", need)]),
                INSUFFICIENT,
            ));
            let s = snapshot(
                nodes,
                pods,
                vec![event(
                    "Pod",
                    "ml",
                    "train",
                    "FailedScheduling",
                    INSUFFICIENT,
                    30,
                )],
            );
            let f = run(&s);
            let got = one(&f, code);
            assert!(
                got.evidence[0].contains("3 Insufficient nvidia.com/gpu"),
                "{got:#?}"
            );
            assert!(
                got.evidence[1].contains("6 free across 3 eligible nodes")
                    || code != "fragmentation",
                "{got:#?}"
            );
            assert_eq!(
                codes(&f)
                    .iter()
                    .filter(|c| c.starts_with("frag") || c.starts_with("insuff"))
                    .count(),
                1
            );
        }
    }

    #[test]
    fn fragmentation_fix_names_pods_to_move() {
        let (nodes, mut pods) = three_nodes_two_free_each();
        pods.push(pod("ml", "train", &[("nvidia.com/gpu", 4)]));
        let f = run(&snapshot(nodes, pods, vec![]));
        let got = one(&f, "fragmentation");
        assert!(got.fix.contains("make room on gpu-"), "{}", got.fix);
        assert!(got.fix.contains("ml/busy-"), "{}", got.fix);
    }

    #[test]
    fn request_larger_than_any_node() {
        let (nodes, pods) = three_nodes_two_free_each();
        let mut pods = pods;
        pods.push(pod("ml", "huge", &[("nvidia.com/gpu", 16)]));
        let f = run(&snapshot(nodes, pods, vec![]));
        assert!(
            one(&f, "request-exceeds-node")
                .evidence
                .iter()
                .any(|e| e.contains("largest eligible node has 8"))
        );
    }

    #[test]
    fn missing_toleration_for_the_gpu_taint() {
        let mut a = gpu_node("gpu-1", "nvidia.com/gpu", 8);
        taint(&mut a, "nvidia.com/gpu", "present", "NoSchedule");
        let msg = "0/2 nodes are available: 1 node(s) had untolerated taint {nvidia.com/gpu: present}, 1 Insufficient nvidia.com/gpu.";
        let cpu = node("cpu-1");
        let p = unschedulable(pod("ml", "train", &[("nvidia.com/gpu", 1)]), msg);
        let f = run(&snapshot(vec![a.clone(), cpu.clone()], vec![p], vec![]));
        let got = one(&f, "untolerated-taint");
        assert!(
            got.fix.contains("key: nvidia.com/gpu") && got.fix.contains("value: present"),
            "{}",
            got.fix
        );
        assert!(
            got.evidence
                .iter()
                .any(|e| e.contains("nvidia.com/gpu=present:NoSchedule"))
        );

        // Look-alike: the pod tolerates it and there is room: nothing to report.
        let p = tolerate(
            pod("ml", "train", &[("nvidia.com/gpu", 1)]),
            "nvidia.com/gpu",
        );
        let f = run(&snapshot(vec![a.clone(), cpu], vec![created(p, 5)], vec![]));
        assert!(
            f.iter().all(|f| f.category != crate::Category::Scheduling),
            "{f:#?}"
        );
    }

    #[test]
    fn taint_on_the_only_node_with_room_is_the_cause() {
        let full = gpu_node("gpu-1", "nvidia.com/gpu", 8);
        let mut free = gpu_node("gpu-2", "nvidia.com/gpu", 8);
        taint(&mut free, "nvidia.com/gpu", "present", "NoSchedule");
        let pods = vec![
            running(pod("a", "x", &[("nvidia.com/gpu", 8)]), "gpu-1"),
            pod("ml", "train", &[("nvidia.com/gpu", 2)]),
        ];
        let f = run(&snapshot(vec![full, free], pods, vec![]));
        assert!(
            one(&f, "untolerated-taint")
                .evidence
                .iter()
                .any(|e| e.contains("gpu-2"))
        );
    }

    #[test]
    fn cordoned_nodes_get_uncordon() {
        let mut a = gpu_node("gpu-1", "nvidia.com/gpu", 8);
        a.spec.as_mut().unwrap().unschedulable = Some(true);
        let f = run(&snapshot(
            vec![a],
            vec![pod("ml", "t", &[("nvidia.com/gpu", 1)])],
            vec![],
        ));
        let got = one(&f, "untolerated-taint");
        assert!(
            got.title.contains("cordoned") && got.fix.contains("kubectl uncordon gpu-1"),
            "{got:#?}"
        );
    }

    #[test]
    fn node_selector_matching_no_gpu_node() {
        let a = gpu_node("gpu-1", "nvidia.com/gpu", 8);
        let mut cpu = node("cpu-1");
        label(&mut cpu, "nvidia.com/gpu.product", "NVIDIA-A100-SXM4-80GB");
        unlabel(&mut cpu, "nvidia.com/gpu.present");
        let p = select(
            pod("ml", "t", &[("nvidia.com/gpu", 1)]),
            "nvidia.com/gpu.product",
            "NVIDIA-A100-SXM4-80GB",
        );
        let f = run(&snapshot(vec![a.clone(), cpu], vec![p], vec![]));
        let got = one(&f, "selector-matches-no-gpu-node");
        assert!(
            got.fix
                .contains("nvidia.com/gpu.product: NVIDIA-H100-80GB-HBM3"),
            "{}",
            got.fix
        );
        assert!(
            got.evidence
                .iter()
                .any(|e| e.contains("NVIDIA-H100-80GB-HBM3 (1)")),
            "{got:#?}"
        );

        // Look-alike: a selector that matches.
        let p = select(
            created(pod("ml", "t", &[("nvidia.com/gpu", 1)]), 5),
            "nvidia.com/gpu.product",
            "NVIDIA-H100-80GB-HBM3",
        );
        assert!(run(&snapshot(vec![a], vec![p], vec![])).is_empty());
    }

    #[test]
    fn whole_gpu_requested_where_nodes_expose_mig_or_shared() {
        let mut mig = gpu_node("mig-1", "nvidia.com/mig-1g.10gb", 14);
        set_resource(&mut mig, "nvidia.com/mig-3g.40gb", 2, 2);
        label(&mut mig, "nvidia.com/mig.strategy", "mixed");
        let f = run(&snapshot(
            vec![mig.clone()],
            vec![pod("ml", "t", &[("nvidia.com/gpu", 1)])],
            vec![],
        ));
        let got = one(&f, "resource-mismatch");
        assert!(
            got.fix.contains("nvidia.com/mig-3g.40gb: 1") && got.fix.contains("all-disabled"),
            "{}",
            got.fix
        );

        let shared = gpu_node("ts-1", "nvidia.com/gpu.shared", 32);
        let f = run(&snapshot(
            vec![shared.clone()],
            vec![pod("ml", "t", &[("nvidia.com/gpu", 1)])],
            vec![],
        ));
        assert!(
            one(&f, "resource-mismatch")
                .fix
                .contains("nvidia.com/gpu.shared: 1")
        );

        // The reverse: shared replicas asked, whole GPUs offered.
        let whole = gpu_node("gpu-1", "nvidia.com/gpu", 8);
        let f = run(&snapshot(
            vec![whole],
            vec![pod("ml", "t", &[("nvidia.com/gpu.shared", 1)])],
            vec![],
        ));
        assert!(
            one(&f, "resource-mismatch")
                .fix
                .contains("`nvidia.com/gpu: 1`")
        );
    }

    #[test]
    fn mig_profile_no_node_offers_names_the_config_that_would() {
        let mut a = gpu_node("gpu-1", "nvidia.com/mig-1g.10gb", 14);
        label(&mut a, "nvidia.com/mig.config", "all-1g.10gb");
        let f = run(&snapshot(
            vec![a.clone()],
            vec![pod("ml", "t", &[("nvidia.com/mig-3g.40gb", 1)])],
            vec![],
        ));
        let got = one(&f, "mig-profile-not-offered");
        assert!(
            got.fix
                .contains("kubectl label node gpu-1 nvidia.com/mig.config=all-3g.40gb --overwrite"),
            "{}",
            got.fix
        );
        assert!(
            got.evidence
                .iter()
                .any(|e| e.contains("its nvidia.com/mig.config is all-1g.10gb"))
        );

        // A profile of another model: the H100's same-size profile is suggested.
        let f = run(&snapshot(
            vec![a],
            vec![pod("ml", "t", &[("nvidia.com/mig-1g.5gb", 1)])],
            vec![],
        ));
        let got = one(&f, "mig-profile-not-offered");
        assert!(got.fix.contains("nvidia.com/mig-1g.10gb: 1"), "{}", got.fix);
    }

    #[test]
    fn single_strategy_exposes_mig_as_gpu() {
        let mut a = gpu_node("gpu-1", "nvidia.com/gpu", 56);
        label(&mut a, "nvidia.com/mig.strategy", "single");
        label(
            &mut a,
            "nvidia.com/gpu.product",
            "NVIDIA-H100-80GB-HBM3-MIG-1g.10gb",
        );
        let f = run(&snapshot(
            vec![a],
            vec![pod("ml", "t", &[("nvidia.com/mig-1g.10gb", 1)])],
            vec![],
        ));
        assert!(
            one(&f, "resource-mismatch")
                .fix
                .contains("`nvidia.com/gpu: 1`")
        );
    }

    #[test]
    fn new_schedulable_pods_and_stale_failures() {
        let a = gpu_node("gpu-1", "nvidia.com/gpu", 8);
        // Merely new: not flagged.
        let f = run(&snapshot(
            vec![a.clone()],
            vec![created(pod("ml", "new", &[("nvidia.com/gpu", 1)]), 3)],
            vec![],
        ));
        assert!(f.is_empty(), "{f:#?}");
        // Old, never tried: the scheduler may be missing.
        let f = run(&snapshot(
            vec![a.clone()],
            vec![pod("ml", "old", &[("nvidia.com/gpu", 1)])],
            vec![],
        ));
        one(&f, "not-scheduled");
        // Failed on GPUs earlier, room now: info only.
        let p = unschedulable(pod("ml", "retry", &[("nvidia.com/gpu", 1)]), INSUFFICIENT);
        let f = run(&snapshot(vec![a.clone()], vec![p], vec![]));
        assert_eq!(one(&f, "gpus-freed-since").severity, crate::Severity::Info);
        // Room for the GPUs, stuck on CPU.
        let p = unschedulable(
            pod("ml", "cpu", &[("nvidia.com/gpu", 1)]),
            "0/1 nodes are available: 1 Insufficient cpu.",
        );
        let f = run(&snapshot(vec![a], vec![p], vec![]));
        one(&f, "pending-non-gpu");
    }

    #[test]
    fn a_full_node_is_not_a_problem_without_pending_pods() {
        let a = gpu_node("gpu-1", "nvidia.com/gpu", 8);
        let p = running(pod("ml", "all", &[("nvidia.com/gpu", 8)]), "gpu-1");
        let f = run(&snapshot(vec![a], vec![p], vec![]));
        assert!(
            f.iter().all(|f| f.severity == crate::Severity::Info),
            "{f:#?}"
        );
    }
}

#[cfg(test)]
mod picked_tests {
    use crate::testkit::*;

    #[test]
    fn the_selected_pool_exposes_mig_not_whole_gpus() {
        let whole = gpu_node("gpu-1", "nvidia.com/gpu", 8);
        let mut mig = gpu_node("mig-1", "nvidia.com/mig-1g.10gb", 14);
        label(&mut mig, "pool", "mig");
        let p = select(pod("ml", "t", &[("nvidia.com/gpu", 1)]), "pool", "mig");
        let f = run(&snapshot(vec![whole, mig], vec![p], vec![]));
        let got = one(&f, "resource-mismatch");
        assert!(got.title.contains("the nodes it selects"), "{got:#?}");
        assert!(got.fix.contains("nvidia.com/mig-1g.10gb: 1"), "{}", got.fix);
    }
}
