//! The kube-scheduler's FailedScheduling message, read whole: every per-node reason with its
//! count, the PreFilter message, and the part after `preemption:`.
//!
//! The shape is the 1.35 scheduler's `FitError.Error()`:
//! `0/N nodes are available: <PreFilterMsg>. <count> <reason>, <count> <reason>. <PostFilterMsg>`,
//! where the PostFilter (DefaultPreemption) message is `preemption: 0/N nodes are available: ...`
//! or `preemption: not eligible due to ...`. Reasons are the filter plugins' texts, taken from
//! the kubernetes v1.35.4 source (pkg/scheduler/framework/plugins/*); older schedulers' texts
//! (`node(s) had untolerated taint {k: v}`) are known too.

use std::fmt;

/// The filter plugin a reason comes from, and what it means.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    /// NodeResourcesFit: `Insufficient <resource>` (cpu, memory, nvidia.com/gpu...).
    Insufficient(String),
    /// NodeResourcesFit: `Too many pods`.
    TooManyPods,
    /// NodeAffinity: nodeSelector / required node affinity (or the scheduler-enforced one).
    NodeAffinity,
    /// TaintToleration: a NoSchedule/NoExecute taint the pod does not tolerate.
    Taint,
    /// NodeUnschedulable: cordoned (`spec.unschedulable`).
    Unschedulable,
    /// NodeUnschedulable: `node(s) had unknown conditions`.
    UnknownCondition,
    /// NodeName: `spec.nodeName` names another node.
    NodeName,
    /// NodePorts: a hostPort is taken.
    Ports,
    /// PodTopologySpread: maxSkew would be broken, or the node lacks the topology key.
    TopologySpread {
        missing_label: bool,
    },
    /// InterPodAffinity: the pod's affinity, its anti-affinity, or running pods' anti-affinity.
    PodAffinity,
    PodAntiAffinity,
    ExistingAntiAffinity,
    /// VolumeBinding, VolumeZone, VolumeRestrictions, NodeVolumeLimits (the plugin's name).
    Volume(&'static str),
    /// DynamicResources: ResourceClaims (DRA) that cannot be allocated on the node.
    Claims,
    /// DefaultPreemption's per-node verdicts in the preemption part.
    NoVictims,
    PreemptionNotHelpful,
    /// Nothing this list knows (an out-of-tree plugin, a newer scheduler): quoted as is.
    Other,
}

impl Kind {
    /// The reason's kind from its text (without the count).
    pub fn of(text: &str) -> Kind {
        let t = text.trim();
        if let Some(r) = t.strip_prefix("Insufficient ") {
            return Kind::Insufficient(r.trim().to_string());
        }
        let has = |s: &str| t.contains(s);
        match t {
            "Too many pods" => Kind::TooManyPods,
            _ if has("didn't match Pod's node affinity/selector")
                || has("didn't match scheduler-enforced node affinity")
                || has("pod affinity terms conflict") =>
            {
                Kind::NodeAffinity
            }
            _ if has("untolerated taint") || has("had taints that the pod didn't tolerate") => {
                Kind::Taint
            }
            _ if has("were unschedulable") => Kind::Unschedulable,
            _ if has("had unknown conditions") => Kind::UnknownCondition,
            _ if has("didn't match the requested node name") => Kind::NodeName,
            _ if has("didn't have free ports") => Kind::Ports,
            _ if has("pod topology spread constraints") => Kind::TopologySpread {
                missing_label: has("missing required label"),
            },
            _ if has("didn't satisfy existing pods anti-affinity rules") => {
                Kind::ExistingAntiAffinity
            }
            _ if has("didn't match pod anti-affinity rules") => Kind::PodAntiAffinity,
            _ if has("didn't match pod affinity rules") => Kind::PodAffinity,
            _ if has("available persistent volumes to bind")
                || has("PersistentVolume's node affinity")
                || has("enough free storage")
                || has("bound to non-existent pv") =>
            {
                Kind::Volume("VolumeBinding")
            }
            _ if has("no available volume zone") => Kind::Volume("VolumeZone"),
            _ if has("had no available disk") || has("ReadWriteOncePod") => {
                Kind::Volume("VolumeRestrictions")
            }
            _ if has("exceed max volume count") => Kind::Volume("NodeVolumeLimits"),
            _ if has("cannot allocate all claims")
                || has("resourceclaim not available on the node")
                || has("resource claim")
                || has("resourceclaim")
                || has("ResourceClaim")
                || has("device class")
                || has("allocate devices")
                || has("waiting for resource driver") =>
            {
                Kind::Claims
            }
            _ if has("No preemption victims found") => Kind::NoVictims,
            _ if has("Preemption is not helpful") => Kind::PreemptionNotHelpful,
            _ => Kind::Other,
        }
    }

    /// The scheduler plugin that reports it.
    pub fn plugin(&self) -> &'static str {
        match self {
            Kind::Insufficient(_) | Kind::TooManyPods => "NodeResourcesFit",
            Kind::NodeAffinity => "NodeAffinity",
            Kind::Taint => "TaintToleration",
            Kind::Unschedulable | Kind::UnknownCondition => "NodeUnschedulable",
            Kind::NodeName => "NodeName",
            Kind::Ports => "NodePorts",
            Kind::TopologySpread { .. } => "PodTopologySpread",
            Kind::PodAffinity | Kind::PodAntiAffinity | Kind::ExistingAntiAffinity => {
                "InterPodAffinity"
            }
            Kind::Volume(p) => p,
            Kind::Claims => "DynamicResources",
            Kind::NoVictims | Kind::PreemptionNotHelpful => "DefaultPreemption",
            Kind::Other => "unknown plugin",
        }
    }

    /// Whether the doctor recomputes this reason from the objects (so it can say what would make
    /// room): GPU, CPU and memory requests against allocatable, nodeSelector and required node
    /// affinity, taints and cordons. Every other reason is quoted, never explained away.
    pub fn explained(&self) -> bool {
        match self {
            Kind::Insufficient(r) => r.starts_with("nvidia.com/") || r == "cpu" || r == "memory",
            Kind::NodeAffinity | Kind::Taint | Kind::Unschedulable => true,
            _ => false,
        }
    }

    /// Whether this is a per-node verdict of the preemption part (not a filter's reason).
    pub fn is_preemption(&self) -> bool {
        matches!(self, Kind::NoVictims | Kind::PreemptionNotHelpful)
    }

    /// What to do about a reason the doctor only quotes.
    pub fn advice(&self) -> &'static str {
        match self {
            Kind::TopologySpread {
                missing_label: true,
            } => {
                "PodTopologySpread: the nodes lack the constraint's topologyKey label; label the GPU nodes with it (e.g. topology.kubernetes.io/zone) or use a key they have"
            }
            Kind::TopologySpread { .. } => {
                "PodTopologySpread: placing the pod would break a topologySpreadConstraint's maxSkew (whenUnsatisfiable: DoNotSchedule); raise maxSkew, use whenUnsatisfiable: ScheduleAnyway, or give the pod's domains room (the matching pods per domain: kubectl get pods -o wide -l <the constraint's labelSelector>)"
            }
            Kind::PodAffinity => {
                "InterPodAffinity: no node with room runs the pods the required podAffinity names (in its topologyKey domain); start them, or relax the rule to preferredDuringScheduling"
            }
            Kind::PodAntiAffinity => {
                "InterPodAffinity: the pod's required podAntiAffinity excludes the nodes (or domains) where matching pods run; relax it to preferredDuringScheduling or add nodes outside those domains"
            }
            Kind::ExistingAntiAffinity => {
                "InterPodAffinity: pods already running have a required podAntiAffinity that excludes this pod from their nodes"
            }
            Kind::Ports => {
                "NodePorts: a hostPort the pod asks for is taken on those nodes; drop hostPort (use a Service) or free the port"
            }
            Kind::NodeName => {
                "NodeName: spec.nodeName pins the pod to one node; the other nodes cannot take it"
            }
            Kind::Volume("VolumeBinding") => {
                "VolumeBinding: the pod's PersistentVolumeClaims cannot bind on those nodes (no matching PV, PV node affinity, storage capacity); check kubectl get pvc and the PVs' nodeAffinity"
            }
            Kind::Volume("VolumeZone") => {
                "VolumeZone: the pod's volumes live in another zone than those nodes"
            }
            Kind::Volume("VolumeRestrictions") => {
                "VolumeRestrictions: a volume is in use by another pod (ReadWriteOncePod, or the same disk)"
            }
            Kind::Volume(_) => "NodeVolumeLimits: the nodes have their maximum of attached volumes",
            Kind::Claims => {
                "DynamicResources: the pod's ResourceClaims cannot be allocated on those nodes; check kubectl get resourceclaims and the ResourceSlices of the DRA driver"
            }
            Kind::TooManyPods => "NodeResourcesFit: the nodes run their maximum number of pods",
            Kind::Insufficient(_) => {
                "NodeResourcesFit: the nodes lack a resource the doctor does not count (e.g. ephemeral-storage or another extended resource); lower the request or add nodes that have it"
            }
            Kind::UnknownCondition => {
                "NodeUnschedulable: the nodes report unknown conditions; see kubectl describe node"
            }
            _ => {
                "the scheduler names a reason the doctor does not know: read it as the scheduler wrote it"
            }
        }
    }
}

/// A DynamicResources (DRA) text, read for what it says about the pod's claims. The texts are
/// the kubernetes v1.35.4 plugin's (pkg/scheduler/framework/plugins/dynamicresources and
/// k8s.io/dynamic-resource-allocation/resourceclaim), plus `waiting for resource driver` of the
/// pre-1.32 classic DRA, which older clusters still write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DraReason {
    /// Filter: no set of devices in the node's slices satisfies every claim (`cannot allocate
    /// all claims`): no device of the class, the selector matches none, or all are taken.
    CannotAllocate,
    /// Filter: the claim is already allocated, on another node (`resourceclaim not available on
    /// the node`).
    OtherNode,
    /// PreFilter: the claim is reserved for as many pods as it may be (`resourceclaim in use`).
    InUse,
    /// PreFilter: another pod's scheduling is allocating it right now.
    BeingAllocated,
    /// A request names a DeviceClass that does not exist.
    NoClass { class: String },
    /// The claim object is missing: the ResourceClaim controller has not created it from its
    /// template yet, or a named claim does not exist.
    ClaimMissing,
    /// The claim is being deleted.
    BeingDeleted,
    /// A claim from a template that belongs to another pod.
    NotOwner,
    /// The allocator gave up (`timed out trying to allocate devices`): too many candidates.
    TimedOut,
    /// Classic DRA (before 1.32): no driver controller answered.
    WaitingForDriver,
    /// A request shape this scheduler does not support (a feature gate off).
    Unsupported,
}

impl DraReason {
    /// The DRA reason of a per-node reason or PreFilter text; `None` when it is not one.
    pub fn of(text: &str) -> Option<DraReason> {
        let has = |s: &str| text.contains(s);
        Some(if has("cannot allocate all claims") {
            DraReason::CannotAllocate
        } else if has("resourceclaim not available on the node") {
            DraReason::OtherNode
        } else if has("resourceclaim in use") {
            DraReason::InUse
        } else if has("in the process of being allocated") {
            DraReason::BeingAllocated
        } else if let Some(class) = text
            .split_once("device class ")
            .and_then(|(_, r)| r.strip_suffix(" does not exist"))
        {
            DraReason::NoClass {
                class: class.trim().to_string(),
            }
        } else if has("ResourceClaim not created yet") || (has("resourceclaim") && has("not found"))
        {
            DraReason::ClaimMissing
        } else if has("is being deleted") && has("resourceclaim") {
            DraReason::BeingDeleted
        } else if has("(pod is not owner)") {
            DraReason::NotOwner
        } else if has("timed out trying to allocate devices") {
            DraReason::TimedOut
        } else if has("waiting for resource driver") {
            DraReason::WaitingForDriver
        } else if has("feature is disabled")
            || has("unknown request type")
            || has("none of the supported fields are set")
        {
            DraReason::Unsupported
        } else {
            return None;
        })
    }

    /// What it means, in terms of the claim and its devices.
    pub fn explain(&self) -> String {
        match self {
            DraReason::CannotAllocate => "no node's ResourceSlices hold free devices that satisfy every claim of the pod (no device of the class, the selector matches none, or every matching device is allocated)".into(),
            DraReason::OtherNode => "a claim of the pod is already allocated to devices of another node, so the pod can only run there".into(),
            DraReason::InUse => "a claim of the pod is already reserved for other pods (a claim from a template serves one pod; a shared claim at most 256)".into(),
            DraReason::BeingAllocated => "another pod's scheduling is allocating the same claim right now; this resolves itself unless that pod is stuck".into(),
            DraReason::NoClass { class } => format!("the claim asks for DeviceClass {class}, which does not exist (kubectl get deviceclasses); the DRA driver's chart creates gpu.nvidia.com and mig.nvidia.com"),
            DraReason::ClaimMissing => "the pod's ResourceClaim does not exist (yet): the ResourceClaim controller (kube-controller-manager) creates it from the template, or a named claim must be created by you".into(),
            DraReason::BeingDeleted => "the pod's ResourceClaim is being deleted; the pod needs a new one".into(),
            DraReason::NotOwner => "the ResourceClaim was generated for another pod (it is not this pod's owner): use a ResourceClaimTemplate or a shared named claim".into(),
            DraReason::TimedOut => "the scheduler gave up allocating devices (too many candidate devices for the selectors); narrow the selectors".into(),
            DraReason::WaitingForDriver => "no DRA driver answered for the claim (the driver is not registered or not running)".into(),
            DraReason::Unsupported => "the claim uses a request shape this cluster's feature gates do not allow".into(),
        }
    }
}

/// One `<count> <reason>` of the message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reason {
    pub count: u32,
    pub text: String,
    pub kind: Kind,
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.count, self.text)
    }
}

/// A FailedScheduling message, parsed.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Message {
    /// N of `0/N nodes are available`.
    pub nodes: Option<u32>,
    /// A PreFilter plugin's message (no per-node reasons then): `pod has unbound immediate
    /// PersistentVolumeClaims`, `waiting for scheduling gates`, a DRA claim not found...
    pub prefilter: Option<String>,
    /// The filters' per-node reasons, in the scheduler's order.
    pub reasons: Vec<Reason>,
    /// The part after `preemption:`, as written.
    pub preemption: Option<String>,
    /// Other PostFilter plugins' words before it (1.35's DynamicResources says `no new claims to
    /// deallocate`), as written.
    pub postfilter: Option<String>,
    /// The preemption part's per-node verdicts (when it lists any).
    pub preemption_reasons: Vec<Reason>,
}

impl Message {
    /// The reasons the doctor does not recompute (see [`Kind::explained`]).
    pub fn quoted(&self) -> impl Iterator<Item = &Reason> {
        self.reasons.iter().filter(|r| !r.kind.explained())
    }

    /// Whether a PreFilter message or a reason the doctor does not recompute holds some node back.
    pub fn has_unexplained(&self) -> bool {
        self.prefilter.is_some() || self.quoted().next().is_some()
    }

    /// Nodes the quoted reasons hold back (an upper bound: a node can have several reasons).
    pub fn quoted_nodes(&self) -> u32 {
        self.quoted()
            .map(|r| r.count)
            .sum::<u32>()
            .min(self.nodes.unwrap_or(u32::MAX))
    }
}

/// Splits `<count> <reason>, <count> <reason>` where a reason may itself hold `, ` (DRA messages
/// name claims and requests): a piece that does not start with a count belongs to the previous.
fn reasons(list: &str) -> Vec<Reason> {
    let mut out: Vec<Reason> = Vec::new();
    for piece in list.split(", ") {
        let counted = piece
            .split_once(' ')
            .and_then(|(n, rest)| Some((n.parse::<u32>().ok()?, rest)));
        match (counted, out.last_mut()) {
            (Some((count, rest)), _) => out.push(Reason {
                count,
                text: rest.trim().to_string(),
                kind: Kind::Other,
            }),
            (None, Some(last)) => {
                last.text.push_str(", ");
                last.text.push_str(piece);
            }
            (None, None) => {}
        }
    }
    for r in &mut out {
        r.kind = Kind::of(&r.text);
    }
    out
}

/// `0/N nodes are available: ` and what follows it, when `s` starts so.
fn available(s: &str) -> Option<(u32, &str)> {
    let rest = s.trim_start().strip_prefix("0/")?;
    let (n, rest) = rest.split_once(' ')?;
    let rest = rest.strip_prefix("nodes are available:")?;
    Some((n.parse().ok()?, rest.trim_start()))
}

/// Parses a FailedScheduling message; `None` when it is not the scheduler's fit error.
///
/// The filters' part ends at its first `. `: the reasons are `<count> <text>` joined by `, ` and
/// closed by `.`, a PreFilter message likewise; what follows is the PostFilter plugins' message
/// (`no new claims to deallocate, preemption: 0/N nodes are available: ...`). No reason text of
/// the 1.35 plugins holds `. ` (`nvidia.com/gpu` has a dot, never a dot and a space).
pub fn parse(message: &str) -> Option<Message> {
    let (nodes, rest) = available(message)?;
    let rest = rest.trim();
    let (filters, post) = match rest.find(". ") {
        Some(i) => (&rest[..i], Some(rest[i + 2..].trim())),
        None => (rest.trim_end_matches('.'), None),
    };
    let filters = filters.trim();
    let mut m = Message {
        nodes: Some(nodes),
        ..Message::default()
    };
    let starts_counted = filters
        .split_once(' ')
        .is_some_and(|(n, _)| n.parse::<u32>().is_ok());
    if starts_counted {
        m.reasons = reasons(filters);
    } else if !filters.is_empty() {
        m.prefilter = Some(filters.to_string());
    }
    let post = post.filter(|p| !p.is_empty());
    let (other, preemption) = match post {
        Some(p) => match p.find("preemption:") {
            Some(i) => (&p[..i], Some(p[i + "preemption:".len()..].trim())),
            None => (p, None),
        },
        None => ("", None),
    };
    let other = other
        .trim()
        .trim_end_matches(',')
        .trim()
        .trim_end_matches('.');
    if !other.is_empty() {
        m.postfilter = Some(other.to_string());
    }
    if let Some(p) = preemption {
        let p = p.trim_end_matches('.').trim();
        m.preemption = Some(p.to_string());
        if let Some((_, list)) = available(p) {
            m.preemption_reasons = reasons(list.trim_end_matches('.'));
        }
    }
    Some(m)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_whole_message_with_every_count_and_the_preemption_part() {
        let m = parse("0/7 nodes are available: 1 Insufficient nvidia.com/gpu, 1 node(s) had untolerated taint(s), 2 node(s) didn't match Pod's node affinity/selector, 3 node(s) didn't match pod topology spread constraints. preemption: 0/7 nodes are available: 1 No preemption victims found for incoming pod, 6 Preemption is not helpful for scheduling.").unwrap();
        assert_eq!(m.nodes, Some(7));
        let got: Vec<(u32, Kind)> = m
            .reasons
            .iter()
            .map(|r| (r.count, r.kind.clone()))
            .collect();
        assert_eq!(
            got,
            vec![
                (1, Kind::Insufficient("nvidia.com/gpu".into())),
                (1, Kind::Taint),
                (2, Kind::NodeAffinity),
                (
                    3,
                    Kind::TopologySpread {
                        missing_label: false
                    }
                ),
            ]
        );
        assert_eq!(m.quoted().count(), 1);
        assert_eq!(m.quoted_nodes(), 3);
        assert!(m.has_unexplained());
        let pre: Vec<(u32, Kind)> = m
            .preemption_reasons
            .iter()
            .map(|r| (r.count, r.kind.clone()))
            .collect();
        assert_eq!(
            pre,
            vec![(1, Kind::NoVictims), (6, Kind::PreemptionNotHelpful)]
        );
        assert!(pre.iter().all(|(_, k)| k.is_preemption()));
    }

    #[test]
    fn the_1_35_schedulers_own_messages_with_other_postfilter_words() {
        // Written by kube-scheduler v1.35.4 in the e2e scenarios (DynamicResources' PostFilter
        // speaks before DefaultPreemption).
        let m = parse("0/15 nodes are available: 13 node(s) didn't match Pod's node affinity/selector, 2 Insufficient nvidia.com/gpu. no new claims to deallocate, preemption: 0/15 nodes are available: 15 Preemption is not helpful for scheduling.").unwrap();
        assert_eq!(m.reasons.len(), 2, "{m:?}");
        assert_eq!(m.reasons[1].text, "Insufficient nvidia.com/gpu");
        assert_eq!(
            m.reasons[1].kind,
            Kind::Insufficient("nvidia.com/gpu".into())
        );
        assert_eq!(m.postfilter.as_deref(), Some("no new claims to deallocate"));
        assert_eq!(
            m.preemption.as_deref(),
            Some("0/15 nodes are available: 15 Preemption is not helpful for scheduling")
        );
        assert!(!m.has_unexplained());

        let m = parse("0/15 nodes are available: 1 Insufficient nvidia.com/gpu, 1 node(s) didn't have free ports for the requested pod ports, 13 node(s) didn't match Pod's node affinity/selector. no new claims to deallocate, preemption: 0/15 nodes are available: 13 Preemption is not helpful for scheduling, 2 No preemption victims found for incoming pod.").unwrap();
        assert_eq!(
            m.reasons[2].text,
            "node(s) didn't match Pod's node affinity/selector"
        );
        assert_eq!(
            m.quoted().map(|r| r.kind.plugin()).collect::<Vec<_>>(),
            vec!["NodePorts"]
        );
        assert_eq!(m.preemption_reasons.len(), 2);

        let m = parse(
            "0/15 nodes are available: pod has unbound immediate PersistentVolumeClaims. not found",
        )
        .unwrap();
        assert_eq!(
            m.prefilter.as_deref(),
            Some("pod has unbound immediate PersistentVolumeClaims")
        );
        assert_eq!(m.postfilter.as_deref(), Some("not found"));
        assert!(m.preemption.is_none() && m.has_unexplained());

        // After a preemption that nominated a node: no PostFilter words at all.
        let m = parse("0/15 nodes are available: 1 Insufficient nvidia.com/gpu, 14 node(s) didn't match Pod's node affinity/selector.").unwrap();
        assert!(m.postfilter.is_none() && m.preemption.is_none() && m.reasons.len() == 2);
    }

    #[test]
    fn every_1_35_filter_plugin_reason_is_known() {
        // Texts from kubernetes v1.35.4 pkg/scheduler/framework/plugins/*.
        for (text, plugin, explained) in [
            ("Insufficient nvidia.com/gpu", "NodeResourcesFit", true),
            ("Insufficient cpu", "NodeResourcesFit", true),
            ("Insufficient memory", "NodeResourcesFit", true),
            ("Insufficient ephemeral-storage", "NodeResourcesFit", false),
            ("Too many pods", "NodeResourcesFit", false),
            (
                "node(s) didn't match Pod's node affinity/selector",
                "NodeAffinity",
                true,
            ),
            (
                "node(s) didn't match scheduler-enforced node affinity",
                "NodeAffinity",
                true,
            ),
            ("node(s) had untolerated taint(s)", "TaintToleration", true),
            (
                "node(s) had untolerated taint {dedicated: ml}",
                "TaintToleration",
                true,
            ),
            (
                "node(s) had taints that the pod didn't tolerate",
                "TaintToleration",
                true,
            ),
            ("node(s) were unschedulable", "NodeUnschedulable", true),
            ("node(s) had unknown conditions", "NodeUnschedulable", false),
            (
                "node(s) didn't match the requested node name",
                "NodeName",
                false,
            ),
            (
                "node(s) didn't have free ports for the requested pod ports",
                "NodePorts",
                false,
            ),
            (
                "node(s) didn't match pod topology spread constraints",
                "PodTopologySpread",
                false,
            ),
            (
                "node(s) didn't match pod topology spread constraints (missing required label)",
                "PodTopologySpread",
                false,
            ),
            (
                "node(s) didn't match pod affinity rules",
                "InterPodAffinity",
                false,
            ),
            (
                "node(s) didn't match pod anti-affinity rules",
                "InterPodAffinity",
                false,
            ),
            (
                "node(s) didn't satisfy existing pods anti-affinity rules",
                "InterPodAffinity",
                false,
            ),
            (
                "node(s) didn't find available persistent volumes to bind",
                "VolumeBinding",
                false,
            ),
            (
                "node(s) didn't match PersistentVolume's node affinity",
                "VolumeBinding",
                false,
            ),
            (
                "node(s) did not have enough free storage",
                "VolumeBinding",
                false,
            ),
            (
                "node(s) unavailable due to one or more pvc(s) bound to non-existent pv(s)",
                "VolumeBinding",
                false,
            ),
            ("node(s) had no available volume zone", "VolumeZone", false),
            ("node(s) had no available disk", "VolumeRestrictions", false),
            (
                "node(s) unavailable due to PersistentVolumeClaim with ReadWriteOncePod access mode already in-use by another pod",
                "VolumeRestrictions",
                false,
            ),
            ("node(s) exceed max volume count", "NodeVolumeLimits", false),
            ("cannot allocate all claims", "DynamicResources", false),
            (
                "resourceclaim not available on the node",
                "DynamicResources",
                false,
            ),
            (
                "node(s) didn't satisfy plugin(s) [Foo]",
                "unknown plugin",
                false,
            ),
        ] {
            let k = Kind::of(text);
            assert_eq!((k.plugin(), k.explained()), (plugin, explained), "{text}");
        }
    }

    #[test]
    fn prefilter_messages_reasons_with_commas_and_ineligible_preemption() {
        let m = parse("0/3 nodes are available: pod has unbound immediate PersistentVolumeClaims. preemption: 0/3 nodes are available: 3 Preemption is not helpful for scheduling.").unwrap();
        assert_eq!(
            m.prefilter.as_deref(),
            Some("pod has unbound immediate PersistentVolumeClaims")
        );
        assert!(m.reasons.is_empty() && m.has_unexplained());

        let m = parse("0/2 nodes are available: 2 resource claim ml/c, request gpu: has subrequests, but the DRAPrioritizedList feature is disabled. preemption: not eligible due to preemptionPolicy=Never.").unwrap();
        assert_eq!(m.reasons.len(), 1, "{m:?}");
        assert_eq!(m.reasons[0].kind, Kind::Claims);
        assert_eq!(
            m.preemption.as_deref(),
            Some("not eligible due to preemptionPolicy=Never")
        );
        assert!(m.preemption_reasons.is_empty());
        assert_eq!(
            DraReason::of(&m.reasons[0].text),
            Some(DraReason::Unsupported)
        );

        // Only resources: nothing unexplained; no preemption part at all.
        let m = parse("0/3 nodes are available: 3 Insufficient nvidia.com/gpu.").unwrap();
        assert!(!m.has_unexplained() && m.preemption.is_none());
        assert_eq!(m.reasons[0].to_string(), "3 Insufficient nvidia.com/gpu");

        for not in [
            "",
            "Insufficient nvidia.com/gpu",
            "0/x nodes are available: 1 a",
            "pod is being deleted",
        ] {
            assert!(parse(not).is_none(), "{not}");
        }
    }

    #[test]
    fn dynamic_resources_texts_of_the_1_35_scheduler_are_read() {
        for (msg, want) in [
            (
                "0/3 nodes are available: 3 cannot allocate all claims. still not schedulable, preemption: 0/3 nodes are available: 3 Preemption is not helpful for scheduling.",
                DraReason::CannotAllocate,
            ),
            (
                "0/2 nodes are available: 1 resourceclaim not available on the node, 1 node(s) didn't match Pod's node affinity/selector.",
                DraReason::OtherNode,
            ),
            (
                "0/2 nodes are available: 2 timed out trying to allocate devices.",
                DraReason::TimedOut,
            ),
        ] {
            let m = parse(msg).unwrap();
            assert_eq!(m.reasons[0].kind, Kind::Claims, "{msg}");
            assert_eq!(DraReason::of(&m.reasons[0].text), Some(want), "{msg}");
            assert!(m.has_unexplained(), "{msg}");
        }
        for (msg, want) in [
            (
                "0/4 nodes are available: pod \"ml/train\": ResourceClaim not created yet. preemption: 0/4 nodes are available: 4 Preemption is not helpful for scheduling.",
                DraReason::ClaimMissing,
            ),
            (
                "0/4 nodes are available: resourceclaim.resource.k8s.io \"gpu-claim\" not found.",
                DraReason::ClaimMissing,
            ),
            (
                "0/4 nodes are available: request gpu: device class gpu.nvidia.comm does not exist.",
                DraReason::NoClass {
                    class: "gpu.nvidia.comm".into(),
                },
            ),
            (
                "0/4 nodes are available: resourceclaim in use.",
                DraReason::InUse,
            ),
            (
                "0/4 nodes are available: resource claim ml/c is in the process of being allocated.",
                DraReason::BeingAllocated,
            ),
            (
                "0/4 nodes are available: resourceclaim \"c\" is being deleted.",
                DraReason::BeingDeleted,
            ),
            (
                "0/1 nodes are available: ResourceClaim ml/c was not created for pod ml/p (pod is not owner).",
                DraReason::NotOwner,
            ),
        ] {
            let m = parse(msg).unwrap();
            let pre = m.prefilter.as_deref().unwrap_or_default();
            assert_eq!(DraReason::of(pre), Some(want.clone()), "{msg}");
            assert!(!want.explain().is_empty());
        }
        assert_eq!(
            DraReason::of("waiting for resource driver to provide information"),
            Some(DraReason::WaitingForDriver)
        );
        assert_eq!(
            Kind::of("waiting for resource driver to provide information"),
            Kind::Claims
        );
        // Look-alikes that are not DRA.
        for other in [
            "Insufficient nvidia.com/gpu",
            "pod has unbound immediate PersistentVolumeClaims",
            "node(s) had volume node affinity conflict",
        ] {
            assert_eq!(DraReason::of(other), None, "{other}");
        }
    }
}
