//! Pending GPU pods: the real reason, computed from fits (GPUs free per node, CPU and memory,
//! taints, selectors, nodes that are down), with the scheduler's FailedScheduling text as evidence.

use super::moves::{Ledger, Plan};
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
    // Oldest first, as the scheduler's queue roughly goes: the room one pod's moves make is not
    // offered to the next.
    let mut pending: Vec<&PodView<'_>> =
        c.gpu_pods.iter().filter(|p| p.pending_unbound()).collect();
    pending.sort_by_key(|p| (p.created(), p.namespace, p.name));
    let mut ledger = Ledger::new(c);
    let mut waiting: BTreeMap<String, (usize, i64)> = BTreeMap::new();
    for p in &pending {
        for (r, n) in &p.gpus {
            let e = waiting.entry(r.clone()).or_default();
            e.0 += 1;
            e.1 += n;
        }
    }
    let mut ctx = Ctx {
        c,
        o,
        gpu_nodes: &gpu_nodes,
        configs: &mut configs,
        ledger: &mut ledger,
        shapes: std::collections::HashMap::new(),
        mismatches: std::collections::HashMap::new(),
        waiting: &waiting,
    };
    pending
        .iter()
        .filter_map(|p| {
            let f = diagnose_pod(&mut ctx, p)?;
            // Advice only from what accounts for every node the scheduler names.
            let said = scheduler_says(c, p).map(|s| s.1);
            Some(super::accounting::account(f, said.as_deref()))
        })
        .collect()
}

/// The nodes (indexes into `Cluster::nodes`) a pod shape can use, at each step of the diagnosis.
struct Shape {
    /// Picked by the constraints, could serve the GPUs, but down.
    down: Vec<usize>,
    /// GPU resources some node that is up offers.
    offered_up: std::collections::BTreeSet<String>,
    /// Offer every GPU resource the pod asks for.
    offering: Vec<usize>,
    /// ... and match its nodeSelector / required affinity.
    selected: Vec<usize>,
    /// ... and are up.
    up: Vec<usize>,
    /// ... and carry no taint it does not tolerate.
    tolerated: Vec<usize>,
    /// Up, with an untolerated taint, and room for the GPUs.
    tainted_with_room: Vec<usize>,
}

impl Shape {
    fn of(c: &Cluster<'_>, p: &PodView<'_>) -> Shape {
        let mut s = Shape {
            down: Vec::new(),
            offered_up: std::collections::BTreeSet::new(),
            offering: Vec::new(),
            selected: Vec::new(),
            up: Vec::new(),
            tolerated: Vec::new(),
            tainted_with_room: Vec::new(),
        };
        for (i, n) in c.nodes.iter().enumerate().filter(|(_, n)| n.is_gpu) {
            let is_up = n.unavailable().is_none();
            if is_up {
                for r in p.gpus.keys() {
                    if n.offers(r) {
                        s.offered_up.insert(r.clone());
                    }
                }
            }
            let selects = fit::selects(p.pod, n.name, n.labels);
            if selects && !is_up && could_serve(n, p) {
                s.down.push(i);
            }
            if !p.gpus.keys().all(|r| n.offers(r)) {
                continue;
            }
            s.offering.push(i);
            if !selects {
                continue;
            }
            s.selected.push(i);
            if !is_up {
                continue;
            }
            s.up.push(i);
            if fit::tolerates_all(p.pod, &n.taints) {
                s.tolerated.push(i);
            } else if p.gpus.iter().all(|(r, need)| n.free(r) >= *need) {
                s.tainted_with_room.push(i);
            }
        }
        s
    }
}

/// What the node lists depend on: the pod's GPUs, node selector, required affinity, tolerations.
fn shape_key(p: &PodView<'_>) -> String {
    let spec = p.pod.spec.as_ref();
    serde_json::to_string(&(
        &p.gpus,
        spec.and_then(|s| s.node_selector.as_ref()),
        spec.and_then(|s| s.affinity.as_ref())
            .and_then(|a| a.node_affinity.as_ref())
            .and_then(|a| {
                a.required_during_scheduling_ignored_during_execution
                    .as_ref()
            }),
        spec.and_then(|s| s.tolerations.as_ref()),
    ))
    .unwrap_or_default()
}

struct Ctx<'c, 'a> {
    c: &'c Cluster<'a>,
    o: &'c Options,
    gpu_nodes: &'c [&'c NodeView<'a>],
    configs: &'c mut Option<MigPartedConfig>,
    ledger: &'c mut Ledger,
    shapes: std::collections::HashMap<String, Shape>,
    /// Mismatch findings per shape, with the pod named in the first one.
    mismatches: std::collections::HashMap<String, (String, Finding)>,
    /// Per resource: pending pods asking for it, and how many they ask for together.
    waiting: &'c BTreeMap<String, (usize, i64)>,
}

/// What the scheduler said: the newest FailedScheduling event, else the PodScheduled condition.
fn scheduler_says(c: &Cluster<'_>, p: &PodView<'_>) -> Option<(String, String)> {
    if let Some(e) = c.pod_event(p, "FailedScheduling") {
        return Some((
            describe_event(e, c.now()),
            e.message.clone().unwrap_or_default(),
        ));
    }
    crate::cluster::unscheduled(p.pod).and_then(|cond| {
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

/// Whether a node could serve the pod's GPUs once it works again: it offers them, or it offers
/// nothing at all yet (no device plugin), says it has GPUs, and the pod asks for whole GPUs.
fn could_serve(n: &NodeView<'_>, p: &PodView<'_>) -> bool {
    p.gpus.keys().all(|r| n.offers(r))
        || (n.capacity.is_empty()
            && n.allocatable.is_empty()
            && (n.label(crate::cluster::GPU_PRESENT) == Some("true") || n.gpu_count() > 0)
            && p.gpus.keys().all(|r| r == GPU))
}

// Long on purpose: an ordered ladder of reasons (1-6, first match wins), kept together to read in order.
fn diagnose_pod(x: &mut Ctx<'_, '_>, p: &PodView<'_>) -> Option<Finding> {
    let c = x.c;
    let gpu_nodes = x.gpu_nodes;
    let said = scheduler_says(c, p);
    // Nominated after preempting pods there: waiting for the victims is not a shortage.
    if let Some(f) = super::preempt::in_progress(c, p) {
        return Some(with_scheduler(f, &said));
    }
    let want = resources::describe(&p.gpus);
    let who = format!("{}/{}", p.namespace, p.name);
    // The node lists depend only on the pod's shape (GPUs, selectors, tolerations): pods of one
    // Job or Deployment share them.
    let key = shape_key(p);
    if !x.shapes.contains_key(&key) {
        let shape = Shape::of(c, p);
        x.shapes.insert(key.clone(), shape);
    }
    let shape = &x.shapes[&key];
    let nodes = |ix: &[usize]| -> Vec<&NodeView<'_>> { ix.iter().map(|&i| &c.nodes[i]).collect() };
    // GPU nodes the pod's constraints pick that are down (NotReady, no plugin, MIG failed...).
    let down: Vec<(&NodeView<'_>, String)> = shape
        .down
        .iter()
        .map(|&i| {
            let n = &c.nodes[i];
            (n, n.unavailable().unwrap_or_default().to_string())
        })
        .collect();
    let offering_empty = shape.offering.is_empty();
    let up = nodes(&shape.up);
    let tolerated = nodes(&shape.tolerated);
    let tainted_with_room = nodes(&shape.tainted_with_room);
    let offered_up = shape.offered_up.clone();

    // A resource mismatch depends on the shape only: build it once, then name each pod.
    if let Some((first, f)) = x.mismatches.get(&key) {
        let mut f = f.clone();
        f.title = f.title.replace(first.as_str(), &who);
        f.objects[0] = ObjectRef::pod(p.namespace, p.name);
        return Some(with_scheduler(f, &said));
    }

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
            // A picked node whose failed MIG apply would have offered it is broken, not mismatched.
            let configs = x
                .configs
                .get_or_insert_with(gpuops_mig::config::nvidia_default_configs);
            if let Some(f) = super::broken::explains(c, p, configs) {
                return Some(with_scheduler(f, &said));
            }
            let (r, n) = p
                .gpus
                .iter()
                .find(|(r, _)| !picked.iter().any(|node| node.offers(r)))
                .map_or((GPU, 1), |(r, n)| (r.as_str(), *n));
            let configs = x
                .configs
                .get_or_insert_with(gpuops_mig::config::nvidia_default_configs);
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
            x.mismatches.insert(key, (who, f.clone()));
            return Some(with_scheduler(f, &said));
        }
    }

    // 2. A resource no node offers at all (unless nodes that would are down).
    for (r, n) in &p.gpus {
        if !offered_up.contains(r) {
            // Nodes that would offer it but for a strategy that cannot: name them rather than
            // ask for a resource or a config again.
            let configs = x
                .configs
                .get_or_insert_with(gpuops_mig::config::nvidia_default_configs);
            if let Some(f) = super::broken::strategy_conflict(c, p, configs) {
                return Some(with_scheduler(f, &said));
            }
            // Broken GPUs or a failed MIG apply that would offer it.
            let broken = super::broken::explains(c, p, configs);
            if !down.is_empty() {
                return Some(with_scheduler(unavailable(c, p, &down, None), &said));
            }
            let mut f = mismatch(p, r, *n, gpu_nodes, configs);
            if let Some(b) = broken {
                f = super::broken::instead_of(c, f, b);
            }
            x.mismatches.insert(key, (who, f.clone()));
            return Some(with_scheduler(f, &said));
        }
    }
    if offering_empty {
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

    // 3. nodeSelector / required node affinity, then the nodes that are up.
    if up.is_empty() {
        // The picked nodes advertise nothing because their MIG strategy cannot: say that.
        let configs = x
            .configs
            .get_or_insert_with(gpuops_mig::config::nvidia_default_configs);
        if let Some(f) = super::broken::strategy_conflict(c, p, configs) {
            return Some(with_scheduler(f, &said));
        }
        if !down.is_empty() {
            return Some(with_scheduler(unavailable(c, p, &down, None), &said));
        }
        let offering = nodes(&shape.offering);
        return Some(with_scheduler(
            selector_mismatch(p, &offering, &want),
            &said,
        ));
    }

    // 4. Taints.
    let has_room = |n: &NodeView<'_>| p.gpus.iter().all(|(r, need)| n.free(r) >= *need);
    if tolerated.is_empty()
        || (!tolerated.iter().any(|n| has_room(n)) && !tainted_with_room.is_empty())
    {
        let blocking = if tainted_with_room.is_empty() {
            &up
        } else {
            &tainted_with_room
        };
        let mut f = untolerated(p, blocking, &want);
        f = down_evidence(f, c, &down);
        return Some(with_scheduler(f, &said));
    }

    // 5. Larger than any node.
    let big_enough: Vec<&NodeView<'_>> = tolerated
        .iter()
        .copied()
        .filter(|n| p.gpus.iter().all(|(r, need)| n.allocatable_of(r) >= *need))
        .collect();
    if big_enough.is_empty() {
        let down_big: Vec<(&NodeView<'_>, String)> = down
            .iter()
            .filter(|(n, _)| p.gpus.values().all(|need| n.gpu_count() >= *need))
            .cloned()
            .collect();
        if !down_big.is_empty() {
            let why = format!(
                "the nodes that are up have at most {} allocatable",
                p.gpus
                    .keys()
                    .map(|r| {
                        let max = tolerated.iter().map(|n| n.allocatable_of(r)).max();
                        format!("{} {r}", max.unwrap_or(0))
                    })
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            return Some(with_scheduler(
                unavailable(c, p, &down_big, Some(why)),
                &said,
            ));
        }
        return Some(with_scheduler(too_big(p, &tolerated, &want), &said));
    }

    // 6. Room somewhere?
    if tolerated.iter().any(|n| has_room(n)) {
        return fits_anyway(x, p, &tolerated, &said, &want);
    }
    // No room: unhealthy GPUs withheld or a failed MIG apply on a node that would have it.
    {
        let configs = x
            .configs
            .get_or_insert_with(gpuops_mig::config::nvidia_default_configs);
        if let Some(f) = super::broken::explains(c, p, configs) {
            return Some(with_scheduler(down_evidence(f, c, &down), &said));
        }
    }
    let short: Vec<(&String, i64, i64)> = p
        .gpus
        .iter()
        .map(|(r, need)| (r, *need, tolerated.iter().map(|n| n.free(r)).sum::<i64>()))
        .collect();
    let f = if short.iter().all(|(_, need, free)| free >= need) {
        down_evidence(fragmentation(x, p, &tolerated, &want), c, &down)
    } else if !down.is_empty() {
        let why = short
            .iter()
            .map(|(r, need, free)| {
                format!("{r}: {need} needed, {free} free on the nodes that are up")
            })
            .collect::<Vec<_>>()
            .join("; ");
        unavailable(c, p, &down, Some(why))
    } else {
        insufficient(x, p, &tolerated, &short, &want)
    };
    Some(with_scheduler(f, &said))
}

/// The pod waits for GPU nodes that are down: say which and why, not "scale up" or "tolerate".
fn unavailable(
    c: &Cluster<'_>,
    p: &PodView<'_>,
    down: &[(&NodeView<'_>, String)],
    short: Option<String>,
) -> Finding {
    let who = format!("{}/{}", p.namespace, p.name);
    let gpus: i64 = down.iter().map(|(n, _)| n.gpu_count()).sum();
    let not_ready: Vec<&NodeView<'_>> = down
        .iter()
        .filter(|(n, _)| n.not_ready().is_some() || n.lifecycle_tainted())
        .map(|(n, _)| *n)
        .collect();
    let all_not_ready = not_ready.len() == down.len();
    let title = if all_not_ready {
        format!(
            "Pod {who} waits for {} NotReady GPU node{}",
            down.len(),
            if down.len() == 1 { "" } else { "s" }
        )
    } else {
        format!(
            "Pod {who} waits for GPU nodes that are unavailable: {gpus} GPUs on {} node{}",
            down.len(),
            if down.len() == 1 { "" } else { "s" }
        )
    };
    let mut f = base(Severity::Warning, "gpu-nodes-unavailable", title, p).evidence(format!(
        "{gpus} GPUs on {} node{} the pod could use {} unavailable: {}",
        down.len(),
        if down.len() == 1 { "" } else { "s" },
        if down.len() == 1 { "is" } else { "are" },
        list_some(
            down.iter().map(|(n, why)| format!("{} ({why})", n.name)),
            LISTED
        )
    ));
    if let Some(s) = short {
        f = f.evidence(s);
    }
    for (n, _) in down.iter().take(LISTED) {
        f = f.object(ObjectRef::node(n.name));
    }
    let describes = down
        .iter()
        .take(LISTED)
        .map(|(n, _)| format!("kubectl describe node {}", n.name))
        .collect::<Vec<_>>()
        .join(", ");
    let mut fix = if all_not_ready {
        format!(
            "do not add tolerations or remove the node.kubernetes.io taints: the node lifecycle \
             controller set them because the kubelet stopped reporting, and the pod schedules by \
             itself when the node{} {} Ready again. Check why: {describes} \
             (conditions, last heartbeat); on the node: systemctl status kubelet, journalctl -u \
             kubelet, its network to the API server, disk and memory pressure",
            if down.len() == 1 { "" } else { "s" },
            if down.len() == 1 { "is" } else { "are" },
        )
    } else {
        format!(
            "repair these nodes first (see their node, MIG and health findings: {describes}); the \
             pod fits once they are back, so adding nodes is not the fix"
        )
    };
    let _ = c;
    if !all_not_ready && !not_ready.is_empty() {
        fix.push_str("; NotReady nodes recover by themselves once their kubelet reports again");
    }
    f = f.fix(fix);
    for (n, _) in down.iter().take(LISTED) {
        f = f.command(format!("kubectl describe node {}", n.name));
    }
    f
}

/// Adds one line about the down nodes to another pending-pod finding.
fn down_evidence(f: Finding, c: &Cluster<'_>, down: &[(&NodeView<'_>, String)]) -> Finding {
    let _ = c;
    if down.is_empty() {
        return f;
    }
    let gpus: i64 = down.iter().map(|(n, _)| n.gpu_count()).sum();
    f.evidence(format!(
        "also {gpus} GPUs on {} node{} the pod could use are unavailable: {}",
        down.len(),
        if down.len() == 1 { "" } else { "s" },
        list_some(
            down.iter().map(|(n, why)| format!("{} ({why})", n.name)),
            LISTED
        )
    ))
}

fn fits_anyway(
    x: &mut Ctx<'_, '_>,
    p: &PodView<'_>,
    tolerated: &[&NodeView<'_>],
    said: &Option<(String, String)>,
    want: &str,
) -> Option<Finding> {
    let c = x.c;
    let o = x.o;
    let who = format!("{}/{}", p.namespace, p.name);
    let age = p
        .created()
        .map_or(i64::MAX, |t| seconds_between(c.now(), t));
    // Judge each node with room for the GPUs by its own CPU and memory, not the message's first
    // clause: CPU-only nodes say "Insufficient nvidia.com/gpu" while the GPU nodes lack CPU.
    let (cpu, memory) = resources::pod_cpu_memory(p.pod);
    let roomy: Vec<&NodeView<'_>> = tolerated
        .iter()
        .copied()
        .filter(|n| p.gpus.iter().all(|(r, need)| n.free(r) >= *need))
        .collect();
    let short_of = |n: &NodeView<'_>| -> Vec<String> {
        let (cpu_free, mem_free) = n.cpu_memory_free();
        let mut out = Vec::new();
        if let Some(f) = cpu_free
            && f + 1e-9 < cpu
        {
            out.push(format!(
                "cpu {} free of {} (needs {})",
                resources::cores(f.max(0.0)),
                resources::cores(n.cpu_allocatable.unwrap_or(0.0)),
                resources::cores(cpu)
            ));
        }
        if let Some(f) = mem_free
            && f + 0.5 < memory
        {
            out.push(format!(
                "memory {} free of {} (needs {})",
                resources::bytes(f.max(0.0)),
                resources::bytes(n.memory_allocatable.unwrap_or(0.0)),
                resources::bytes(memory)
            ));
        }
        out
    };
    if !roomy.iter().any(|n| short_of(n).is_empty()) {
        let mut f = base(
            Severity::Warning,
            "insufficient-cpu-memory",
            format!("Pod {who}: the GPU nodes with {want} free lack the CPU or memory it asks for"),
            p,
        );
        for n in roomy.iter().take(LISTED) {
            f = f
                .evidence(format!(
                    "{}: {want} free; {}",
                    n.name,
                    short_of(n).join(", ")
                ))
                .object(ObjectRef::node(n.name));
        }
        if roomy.len() > LISTED {
            f = f.evidence(format!(
                "and {} more nodes like these",
                roomy.len() - LISTED
            ));
        }
        f = f.evidence(
            "scheduler messages count CPU-only nodes as `Insufficient nvidia.com/gpu`: each node is judged by its own shortage here".to_string(),
        );
        return Some(with_scheduler(
            f.fix(format!(
                "the GPUs are free but the pod's CPU/memory requests ({} CPU, {}) do not fit beside \
                 the other pods on those nodes: lower the pod's requests, move CPU-only pods off the \
                 GPU nodes (taint them nvidia.com/gpu=present:NoSchedule so only GPU pods land), or \
                 add GPU nodes with more CPU/memory",
                resources::cores(cpu),
                resources::bytes(memory)
            )),
            said,
        ));
    }
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
            .fix("check that the scheduler named by spec.schedulerName runs: kubectl -n kube-system get pods -l component=kube-scheduler")
            .command("kubectl -n kube-system get pods -l component=kube-scheduler"),
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
                    .evidence(format!(
                        "room now, GPUs, CPU and memory together: {}",
                        list_some(roomy.iter().filter(|n| short_of(n).is_empty()).map(|n| n.name), LISTED)
                    ))
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
                    .fix("the GPUs are not the problem: fix what the scheduler names (volumes, pod affinity, topology spread, ports)"),
                )
            }
        }
    }
}

fn free_list(nodes: &[&NodeView<'_>], r: &str) -> String {
    let mut v: Vec<(std::cmp::Reverse<i64>, &str, i64)> = nodes
        .iter()
        .map(|n| (std::cmp::Reverse(n.free(r)), n.name, n.allocatable_of(r)))
        .collect();
    let total = v.len();
    // The LISTED roomiest, without sorting thousands of nodes.
    if v.len() > LISTED {
        v.select_nth_unstable(LISTED);
        v.truncate(LISTED);
    }
    v.sort_unstable();
    let mut text = v
        .iter()
        .map(|(free, name, alloc)| format!("{name} {}/{alloc} free", free.0))
        .collect::<Vec<_>>()
        .join(", ");
    if total > LISTED {
        text.push_str(&format!(" and {} more", total - LISTED));
    }
    text
}

const PACK_HINT: &str = "pack small GPU pods so whole nodes stay free: score GPU nodes MostAllocated \
     (kube-scheduler NodeResourcesFit scoringStrategy with nvidia.com/gpu weighted) or run `gpuops scheduler-extender`";

fn fragmentation(
    x: &mut Ctx<'_, '_>,
    p: &PodView<'_>,
    nodes: &[&NodeView<'_>],
    want: &str,
) -> Finding {
    let c = x.c;
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
    let (r, need) = p
        .gpus
        .iter()
        .next()
        .map_or((GPU, 1), |(r, n)| (r.as_str(), *n));
    // Moves planned against the cluster state, the room earlier pending pods' moves take
    // included: every moved pod must fit elsewhere (its selectors, tolerations, free GPUs).
    match x.ledger.plan(c, p, r, need, nodes) {
        Some(Plan { target, moves }) if moves.is_empty() => {
            let t = &c.nodes[target];
            f = f.object(ObjectRef::node(t.name));
            f.fix(format!(
                "{} has room for it once earlier moves are done; Lasting fix: {PACK_HINT}",
                t.name
            ))
        }
        Some(Plan { target, moves }) => {
            let t = &c.nodes[target];
            let freed: i64 = moves.iter().map(|m| m.gpus).sum();
            let text: Vec<String> = moves
                .iter()
                .map(|m| {
                    let q = &c.gpu_pods[m.pod];
                    format!(
                        "{}/{} ({} {r}) fits on {}",
                        q.namespace, q.name, m.gpus, c.nodes[m.to].name
                    )
                })
                .collect();
            f = f.object(ObjectRef::node(t.name));
            let free_now = need - freed;
            f = f.evidence(format!(
                "planned: {} moves free {freed} {r} on {} ({} free now): {}",
                moves.len(),
                t.name,
                free_now.max(0),
                text.join(", ")
            ));
            let mut cmds = Vec::new();
            for m in &moves {
                let q = &c.gpu_pods[m.pod];
                cmds.push(format!("kubectl -n {} delete pod {}", q.namespace, q.name));
            }
            f = f.fix(format!(
                "make room on {}: {} (their controllers recreate them, and each fits on another \
                 node: {}); {who} then fits on {}. Until pods are packed the scheduler may put a \
                 recreated pod back there: give {who} a higher priorityClassName so it preempts instead. \
                 Lasting fix: {PACK_HINT}",
                t.name,
                cmds.join("; "),
                text.join(", "),
                t.name
            ));
            for cmd in cmds {
                f = f.command(cmd);
            }
            f
        }
        None => {
            let (count, together) = x.waiting.get(r).copied().unwrap_or((1, need));
            let total: i64 = nodes.iter().map(|n| n.free(r)).sum();
            f.title = format!(
                "Pod {who} needs {want} on one node: GPUs are free only in pieces, and no move makes room"
            );
            if count > 1 {
                f = f.evidence(format!(
                    "{count} pending pods ask for {together} {r} together; {total} are free on the eligible nodes"
                ));
            }
            f = f.evidence(format!(
                "no set of moves frees {need} {r} on one node: the pods holding them are bare pods or fit nowhere else (room already planned for earlier pending pods counted)"
            ));
            f.fix(format!(
                "capacity is short: add a node with {need} free {r} (scale the pool up) or wait for \
                 running GPU pods to finish; moving pods cannot make room. Lasting fix: {PACK_HINT}"
            ))
        }
    }
}

fn insufficient(
    x: &mut Ctx<'_, '_>,
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
        if let Some((count, together)) = x.waiting.get(r.as_str())
            && *count > 1
        {
            f = f.evidence(format!(
                "{count} pending pods ask for {together} {r} together"
            ));
        }
    }
    let pool = products
        .iter()
        .max_by_key(|(_, n)| **n)
        .map_or("GPU", |(p, _)| *p);
    f.fix(format!(
        "capacity is short: add GPU capacity (scale the {pool} node pool up by at least one node) or free GPUs: \
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
             label the intended nodes with it"
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
    let mut uncordon = None;
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
        uncordon = Some(format!("kubectl uncordon {}", names.join(" ")));
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
    f.fix(fixes.join("\n")).commands_from(uncordon)
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
            let mig_node = gpu_nodes
                .iter()
                .find(|node| {
                    node.allocatable
                        .keys()
                        .any(|k| resources::mig_profile(k).is_some())
                })
                .map_or("NODE", |node| node.name);
            let off = format!(
                "kubectl label node {mig_node} nvidia.com/mig.config=all-disabled --overwrite"
            );
            return finding("resource-mismatch")
                .command(off.clone())
                .evidence("nodes run MIG with strategy mixed: whole GPUs are advertised as nvidia.com/mig-<profile>, not nvidia.com/gpu")
                .fix(format!(
                    "request a MIG instance instead, e.g. `{}: {n}` (offered: {}), or turn MIG off on a node: {off}",
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
        let cmd = format!(
            "kubectl label node {} nvidia.com/mig.config={config} --overwrite",
            nodes.first().copied().unwrap_or("NODE")
        );
        return f
            .fix(format!(
                "repartition a node: {cmd}{also}; or request a profile that is offered"
            ))
            .command(cmd);
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

    /// A pod a ReplicaSet owns (deleting it makes the controller create it again).
    fn owned(mut p: k8s_openapi::api::core::v1::Pod) -> k8s_openapi::api::core::v1::Pod {
        p.metadata.owner_references = Some(vec![
            k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
                api_version: "apps/v1".into(),
                kind: "ReplicaSet".into(),
                name: "rs".into(),
                uid: "u".into(),
                controller: Some(true),
                ..Default::default()
            },
        ]);
        p
    }

    #[test]
    fn no_move_is_advised_when_the_moved_pods_fit_nowhere_else() {
        // 2 free on each node, the holders need 6 each: moving them cannot make room.
        let (nodes, mut pods) = three_nodes_two_free_each();
        pods.push(pod("ml", "train", &[("nvidia.com/gpu", 4)]));
        let f = run(&snapshot(nodes, pods, vec![]));
        let got = one(&f, "fragmentation");
        assert!(
            got.fix.starts_with("capacity is short") && !got.fix.contains("make room on"),
            "{}",
            got.fix
        );
        assert!(got.commands.is_empty(), "{got:#?}");
    }

    #[test]
    fn moves_are_computed_and_the_room_is_not_promised_twice() {
        // gpu-1: three 2-GPU pods (2 free); gpu-2 and gpu-3: one 5-GPU pod each (3 free).
        let nodes: Vec<_> = (1..=3)
            .map(|i| gpu_node(&format!("gpu-{i}"), "nvidia.com/gpu", 8))
            .collect();
        let mut pods: Vec<_> = ["a", "b", "c"]
            .iter()
            .map(|n| owned(running(pod("ml", n, &[("nvidia.com/gpu", 2)]), "gpu-1")))
            .collect();
        pods.push(owned(running(
            pod("ml", "big-2", &[("nvidia.com/gpu", 5)]),
            "gpu-2",
        )));
        pods.push(owned(running(
            pod("ml", "big-3", &[("nvidia.com/gpu", 5)]),
            "gpu-3",
        )));
        pods.push(created(pod("ml", "first", &[("nvidia.com/gpu", 4)]), 900));
        pods.push(created(pod("ml", "second", &[("nvidia.com/gpu", 4)]), 800));
        let f = run(&snapshot(nodes, pods, vec![]));
        let frag = with_code(&f, "fragmentation");
        assert_eq!(frag.len(), 2, "{f:#?}");
        let first = frag.iter().find(|f| f.objects[0].name == "first").unwrap();
        assert!(first.fix.starts_with("make room on gpu-1"), "{}", first.fix);
        assert!(
            first.fix.contains("(2 nvidia.com/gpu) fits on gpu-2"),
            "{}",
            first.fix
        );
        assert_eq!(first.commands.len(), 1, "{first:#?}");
        assert!(first.commands[0].starts_with("kubectl -n ml delete pod "));
        // The second would need the same room: capacity is short, said plainly.
        let second = frag.iter().find(|f| f.objects[0].name == "second").unwrap();
        assert!(
            second.fix.starts_with("capacity is short"),
            "{}",
            second.fix
        );
        assert!(
            second
                .evidence
                .iter()
                .any(|e| e.contains("2 pending pods ask for 8 nvidia.com/gpu together")),
            "{second:#?}"
        );
    }

    #[test]
    fn not_ready_nodes_are_not_taints_to_tolerate() {
        // What the node lifecycle controller leaves: Ready=Unknown and the not-ready/unreachable
        // taints (NoSchedule beside the NoExecute ones).
        let mut a = gpu_node("gpu-1", "nvidia.com/gpu", 8);
        ready(
            &mut a,
            "Unknown",
            "NodeStatusUnknown",
            "Kubelet stopped posting node status.",
            300,
        );
        taint(&mut a, "node.kubernetes.io/unreachable", "", "NoSchedule");
        taint(&mut a, "node.kubernetes.io/unreachable", "", "NoExecute");
        let msg = "0/2 nodes are available: 1 node(s) had untolerated taint {node.kubernetes.io/unreachable: }, 1 Insufficient nvidia.com/gpu.";
        let p = unschedulable(pod("ml", "train", &[("nvidia.com/gpu", 2)]), msg);
        let f = run(&snapshot(vec![a, node("cpu-1")], vec![p], vec![]));
        assert!(with_code(&f, "untolerated-taint").is_empty(), "{f:#?}");
        let got = one(&f, "gpu-nodes-unavailable");
        assert!(
            got.title.contains("waits for 1 NotReady GPU node"),
            "{got:#?}"
        );
        assert!(
            got.evidence.iter().any(|e| e.contains(
                "gpu-1 (NotReady for 5m (Ready=Unknown NodeStatusUnknown: Kubelet stopped posting node status.))"
            )),
            "{got:#?}"
        );
        assert!(
            got.fix.contains("schedules by itself") && !got.fix.contains("tolerations:\n"),
            "{}",
            got.fix
        );
        assert_eq!(got.commands, vec!["kubectl describe node gpu-1"]);

        // Look-alike: a Ready node with a taint the pod lacks is still the taint's finding.
        let mut b = gpu_node("gpu-2", "nvidia.com/gpu", 8);
        taint(&mut b, "dedicated", "ml", "NoSchedule");
        let f = run(&snapshot(
            vec![b],
            vec![pod("ml", "train", &[("nvidia.com/gpu", 2)])],
            vec![],
        ));
        one(&f, "untolerated-taint");
    }

    #[test]
    fn pending_pods_point_at_the_broken_nodes_that_explain_them() {
        // One working node full, three broken: no plugin, MIG failed, NotReady.
        let full = gpu_node("ok-1", "nvidia.com/gpu", 8);
        let mut noplugin = node("np-1");
        label(&mut noplugin, "nvidia.com/gpu.present", "true");
        label(&mut noplugin, "nvidia.com/gpu.count", "8");
        let mut migfail = gpu_node("mf-1", "nvidia.com/gpu", 8);
        set_resource(&mut migfail, "nvidia.com/gpu", 8, 0);
        label(&mut migfail, "nvidia.com/mig.config", "all-1g.10gb");
        label(&mut migfail, "nvidia.com/mig.config.state", "failed");
        let mut down = gpu_node("nr-1", "nvidia.com/gpu", 8);
        ready(
            &mut down,
            "False",
            "KubeletNotReady",
            "container runtime is down",
            120,
        );
        let pods = vec![
            running(pod("a", "x", &[("nvidia.com/gpu", 8)]), "ok-1"),
            pod("ml", "train", &[("nvidia.com/gpu", 4)]),
        ];
        let f = run(&snapshot(
            vec![full.clone(), noplugin, migfail, down],
            pods,
            vec![],
        ));
        assert!(with_code(&f, "insufficient-gpus").is_empty(), "{f:#?}");
        let got = one(&f, "gpu-nodes-unavailable");
        assert!(
            got.evidence[1].starts_with("24 GPUs on 3 nodes the pod could use are unavailable: "),
            "{got:#?}"
        );
        let e = &got.evidence[1];
        assert!(
            e.contains("np-1 (no device plugin registered")
                && e.contains("mf-1 (MIG config all-1g.10gb failed, no GPU allocatable)")
                && e.contains("nr-1 (NotReady for 2m (Ready=False KubeletNotReady"),
            "{e}"
        );
        assert!(
            got.fix.contains("adding nodes is not the fix"),
            "{}",
            got.fix
        );

        // Look-alike: nothing broken, the cluster is just full: scale up.
        let pods = vec![
            running(pod("a", "x", &[("nvidia.com/gpu", 8)]), "ok-1"),
            pod("ml", "train", &[("nvidia.com/gpu", 4)]),
        ];
        let f = run(&snapshot(vec![full], pods, vec![]));
        assert!(one(&f, "insufficient-gpus").fix.contains("scale the"));
    }

    #[test]
    fn gpu_pod_blocked_by_cpu_on_the_gpu_nodes_is_not_gpus_freed() {
        // The GPU node has GPUs free but its CPU is taken; a CPU-only node makes the scheduler's
        // message start with `Insufficient nvidia.com/gpu`.
        let mut g = gpu_node("gpu-1", "nvidia.com/gpu", 8);
        set_resource(&mut g, "cpu", 64, 64);
        set_resource(&mut g, "memory", 1 << 40, 1 << 40);
        let mut cpu = node("cpu-1");
        set_resource(&mut cpu, "cpu", 64, 64);
        let msg = "0/2 nodes are available: 1 Insufficient cpu, 1 Insufficient nvidia.com/gpu. preemption: 0/2 nodes are available: 2 No preemption victims found for incoming pod.";
        let hog = running(
            with_cpu_memory(pod("a", "hog", &[("nvidia.com/gpu", 1)]), "60", "1Gi"),
            "gpu-1",
        );
        let p = unschedulable(
            with_cpu_memory(pod("ml", "train", &[("nvidia.com/gpu", 2)]), "8", "32Gi"),
            msg,
        );
        let f = run(&snapshot(
            vec![g.clone(), cpu.clone()],
            vec![hog, p],
            vec![],
        ));
        assert!(with_code(&f, "gpus-freed-since").is_empty(), "{f:#?}");
        let got = one(&f, "insufficient-cpu-memory");
        assert!(
            got.evidence
                .iter()
                .any(|e| e.contains("gpu-1: nvidia.com/gpu: 2 free; cpu 4 free of 64 (needs 8)")),
            "{got:#?}"
        );
        // Look-alike: the CPU is there now: the GPUs really were freed since.
        let small = running(
            with_cpu_memory(pod("a", "hog", &[("nvidia.com/gpu", 1)]), "4", "1Gi"),
            "gpu-1",
        );
        let p = unschedulable(
            with_cpu_memory(pod("ml", "train", &[("nvidia.com/gpu", 2)]), "8", "32Gi"),
            msg,
        );
        let f = run(&snapshot(vec![g, cpu], vec![small, p], vec![]));
        one(&f, "gpus-freed-since");
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
