//! Failures the kubelet and the container runtime report on GPU pods bound to a node: pods
//! rejected at admission (the device manager's Allocate errors, a resource the node no longer has)
//! and containers that cannot start because the NVIDIA container stack fails (driver/library
//! mismatch, no driver, unresolvable CDI devices, no `nvidia` runtime handler...).
//!
//! The texts are the kubelet's (pkg/kubelet/cm/devicemanager, pkg/kubelet/lifecycle), containerd's
//! and the NVIDIA container toolkit's (libnvidia-container's `nvidia-container-cli` errors), matched
//! by the stable part of each message; the whole text is quoted as evidence.

use crate::Options;
use crate::cluster::{Cluster, NodeView, PodView, describe_event};
use crate::finding::{Category, Finding, ObjectRef, Severity};

/// What went wrong, from the most specific text to the least.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Cause {
    /// The device manager had fewer healthy devices than the node advertised when the pod came.
    DevicesUnavailable,
    /// The topology manager could not align the devices on one NUMA node.
    Topology,
    /// `libnvidia-container` loads a newer NVML than the kernel module (driver upgraded, not reloaded).
    DriverMismatch,
    /// No driver: NVML cannot be loaded or the kernel module is not loaded.
    NoDriver,
    /// The image's `NVIDIA_REQUIRE_CUDA` needs a newer driver than the node has.
    CudaTooNew,
    /// A device the pod was given is not in the node's CDI specs.
    CdiUnresolvable,
    /// The container runtime has no NVIDIA runtime (handler, hook or Docker's GPU driver).
    NoNvidiaRuntime,
    /// A device the pod was given is gone (MIG layout changed, GPU lost).
    UnknownDevice,
    /// Another `nvidia-container-cli` failure.
    ToolkitOther,
}

impl Cause {
    pub(crate) fn code(self) -> &'static str {
        match self {
            Cause::DevicesUnavailable => "admission-devices-unavailable",
            Cause::Topology => "admission-topology",
            Cause::DriverMismatch => "runtime-driver-mismatch",
            Cause::NoDriver => "runtime-no-driver",
            Cause::CudaTooNew => "runtime-cuda-too-new",
            Cause::CdiUnresolvable => "runtime-cdi-unresolvable",
            Cause::NoNvidiaRuntime => "runtime-no-nvidia-runtime",
            Cause::UnknownDevice => "runtime-unknown-device",
            Cause::ToolkitOther => "runtime-nvidia-toolkit",
        }
    }
}

/// The stable parts of the texts, lower-cased, and what they mean.
const TEXTS: &[(&str, Cause)] = &[
    // devicemanager: "requested number of devices unavailable for %s. Requested: %d, Available: %d",
    // wrapped by the admit handler in "Allocate failed due to %v, which is unexpected".
    (
        "requested number of devices unavailable for",
        Cause::DevicesUnavailable,
    ),
    (
        "no healthy devices present; cannot allocate unhealthy devices",
        Cause::DevicesUnavailable,
    ),
    (
        "pre-allocated devices are unhealthy",
        Cause::DevicesUnavailable,
    ),
    (
        "cannot allocate unregistered device",
        Cause::DevicesUnavailable,
    ),
    // lifecycle predicate: reason OutOf<resource>, "Node didn't have enough resource: %s, ...".
    (
        "node didn't have enough resource: nvidia.com/",
        Cause::DevicesUnavailable,
    ),
    (
        "resources cannot be allocated with topology locality",
        Cause::Topology,
    ),
    ("driver/library version mismatch", Cause::DriverMismatch),
    ("nvml error: driver not loaded", Cause::NoDriver),
    ("load library failed: libnvidia-ml.so", Cause::NoDriver),
    (
        "libnvidia-ml.so.1: cannot open shared object file",
        Cause::NoDriver,
    ),
    (
        "requirement error: unsatisfied condition: cuda",
        Cause::CudaTooNew,
    ),
    ("unresolvable cdi devices", Cause::CdiUnresolvable),
    (
        "no runtime for \"nvidia\" is configured",
        Cause::NoNvidiaRuntime,
    ),
    ("could not select device driver", Cause::NoNvidiaRuntime),
    (
        "\"nvidia-container-runtime\": executable file not found",
        Cause::NoNvidiaRuntime,
    ),
    (
        "nvidia-container-runtime-hook\": executable file not found",
        Cause::NoNvidiaRuntime,
    ),
    ("nvidia-container-cli: device error", Cause::UnknownDevice),
    ("unknown device", Cause::UnknownDevice),
    ("nvidia-container-cli:", Cause::ToolkitOther),
];

/// What a text means, if it is one of the known ones.
pub(crate) fn classify(text: &str) -> Option<Cause> {
    let lower = text.to_ascii_lowercase();
    // `unknown device` alone is too common a phrase: only with the toolkit's words around it.
    TEXTS
        .iter()
        .filter(|(t, c)| {
            *c != Cause::UnknownDevice || *t != "unknown device" || lower.contains("nvidia")
        })
        .find(|(t, _)| lower.contains(t))
        .map(|(_, c)| *c)
}

/// Every status text and Warning event of a pod, as evidence lines with their raw text.
pub(crate) fn pod_texts(c: &Cluster<'_>, p: &PodView<'_>) -> Vec<(String, String)> {
    let mut out = Vec::new();
    if let Some(s) = p.pod.status.as_ref() {
        if s.reason.is_some() || s.message.is_some() {
            let reason = s.reason.as_deref().unwrap_or("");
            let message = s.message.as_deref().unwrap_or("");
            out.push((
                format!("pod status: phase {}, reason {reason}: {message}", p.phase),
                format!("{reason} {message}"),
            ));
        }
        for cs in s
            .init_container_statuses
            .iter()
            .flatten()
            .chain(s.container_statuses.iter().flatten())
        {
            for (when, st) in [
                ("state", cs.state.as_ref()),
                ("last state", cs.last_state.as_ref()),
            ] {
                let Some(st) = st else { continue };
                if let Some(w) = st.waiting.as_ref()
                    && let Some(m) = w.message.as_deref()
                {
                    let reason = w.reason.as_deref().unwrap_or("");
                    out.push((
                        format!("container {} {when}: waiting, {reason}: {m}", cs.name),
                        format!("{reason} {m}"),
                    ));
                }
                if let Some(t) = st.terminated.as_ref()
                    && let Some(m) = t.message.as_deref()
                {
                    let reason = t.reason.as_deref().unwrap_or("");
                    out.push((
                        format!(
                            "container {} {when}: terminated, {reason} (exit code {}): {m}",
                            cs.name, t.exit_code
                        ),
                        format!("{reason} {m}"),
                    ));
                }
            }
        }
    }
    for e in c.events_for("Pod", p.namespace, p.name) {
        if e.type_.as_deref() == Some("Warning") {
            let text = format!(
                "{} {}",
                e.reason.as_deref().unwrap_or(""),
                e.message.as_deref().unwrap_or("")
            );
            out.push((describe_event(e, c.now()), text));
        }
    }
    out
}

/// Whether the pod works now: running with every container ready, or finished well. Old Warning
/// events of such a pod describe a failure that is over.
pub(crate) fn working(p: &PodView<'_>) -> bool {
    match p.phase {
        "Succeeded" => true,
        "Running" => p
            .pod
            .status
            .as_ref()
            .and_then(|s| s.container_statuses.as_ref())
            .is_some_and(|l| !l.is_empty() && l.iter().all(|cs| cs.ready)),
        _ => false,
    }
}

pub(super) fn check(c: &Cluster<'_>, _o: &Options) -> Vec<Finding> {
    c.gpu_pods
        .iter()
        .filter(|p| p.node.is_some() && !working(p))
        .filter_map(|p| diagnose(c, p))
        .collect()
}

fn diagnose(c: &Cluster<'_>, p: &PodView<'_>) -> Option<Finding> {
    let texts = pod_texts(c, p);
    // The workload rule owns "maximum request size for shared resources is 1".
    let matched: Vec<(Cause, &(String, String))> = texts
        .iter()
        .filter(|(_, raw)| !raw.contains("maximum request size for shared resources"))
        .filter_map(|t| classify(&t.1).map(|cause| (cause, t)))
        .collect();
    let cause = matched.iter().map(|(c, _)| *c).min()?;
    let node_name = p.node.unwrap_or("");
    let node = c.node(node_name);
    let who = format!("{}/{}", p.namespace, p.name);
    let failed = p.phase == "Failed";
    let severity = if failed || cause != Cause::ToolkitOther {
        Severity::Critical
    } else {
        Severity::Warning
    };
    let title = title(cause, &who, node_name);
    let mut f = Finding::new(severity, Category::Node, cause.code(), title)
        .object(ObjectRef::pod(p.namespace, p.name))
        .object(ObjectRef::node(node_name));
    for (_, (line, _)) in matched.iter().filter(|(c, _)| *c == cause).take(4) {
        f = f.evidence(line.clone());
    }
    if let Some(n) = node {
        f = f.evidence(node_line(n, p));
    }
    let (fix, commands) = advice(cause, c, p, &matched);
    f = f.fix(fix);
    for cmd in commands {
        f = f.command(cmd);
    }
    Some(f)
}

/// The finding's title: what failed, where.
fn title(cause: Cause, who: &str, node_name: &str) -> String {
    match cause {
        Cause::DevicesUnavailable => format!(
            "Pod {who} was rejected by the kubelet on {node_name}: the device plugin had fewer devices than the node advertised"
        ),
        Cause::Topology => format!(
            "Pod {who} was rejected on {node_name}: the topology manager cannot align its devices"
        ),
        Cause::DriverMismatch => {
            format!("Pod {who} cannot start on {node_name}: NVIDIA driver/library version mismatch")
        }
        Cause::NoDriver => format!(
            "Pod {who} cannot start on {node_name}: no NVIDIA driver loaded for the container toolkit"
        ),
        Cause::CudaTooNew => {
            format!("Pod {who} cannot start on {node_name}: its image needs a newer CUDA driver")
        }
        Cause::CdiUnresolvable => format!(
            "Pod {who} cannot start on {node_name}: its GPU devices are not in the node's CDI spec"
        ),
        Cause::NoNvidiaRuntime => format!(
            "Pod {who} cannot start on {node_name}: the container runtime has no NVIDIA runtime"
        ),
        Cause::UnknownDevice => {
            format!("Pod {who} cannot start on {node_name}: a GPU it was given no longer exists")
        }
        Cause::ToolkitOther => {
            format!("Pod {who} cannot start on {node_name}: the NVIDIA container toolkit failed")
        }
    }
}

/// The fix and the commands for a cause, computed from the pod, its node and the texts matched.
fn advice(
    cause: Cause,
    c: &Cluster<'_>,
    p: &PodView<'_>,
    matched: &[(Cause, &(String, String))],
) -> (String, Vec<String>) {
    let node_name = p.node.unwrap_or("");
    let node = c.node(node_name);
    let recreate = recreate(p);
    let describe = format!("kubectl describe node {node_name}");
    match cause {
        Cause::DevicesUnavailable => {
            let log = agent_log(node);
            (
                format!(
                    "the kubelet does not retry a rejected pod: {recreate}. It happened because the \
                 device plugin on {node_name} offered fewer healthy devices than the node \
                 advertised when the pod was admitted (a plugin restart or re-registration, \
                 devices turned unhealthy): check that the plugin runs and what it marks \
                 unhealthy ({log}; {describe})"
                ),
                vec![recreate_command(p), log, describe.clone()]
                    .into_iter()
                    .filter(|c| c.starts_with("kubectl"))
                    .collect(),
            )
        }
        Cause::Topology => (
            format!(
                "the kubelet's topology manager policy (single-numa-node or restricted) found no \
             NUMA-aligned set of the devices and CPUs the pod asks for: ask for fewer GPUs per \
             pod or for CPUs that fit one NUMA node, or run such pods on nodes with the \
             best-effort policy; then {recreate}"
            ),
            vec![recreate_command(p)],
        ),
        Cause::DriverMismatch => {
            let n = node;
            let drain = n.map_or_else(
                || format!("kubectl drain {node_name} --ignore-daemonsets --delete-emptydir-data"),
                NodeView::drain,
            );
            (
                format!(
                    "the NVIDIA driver on {node_name} was upgraded but the old kernel module is \
                 still loaded, so NVML refuses every container: cordon the node (kubectl \
                 cordon {node_name}), drain it ({drain}){} and reboot it (or unload and reload \
                 the nvidia kernel modules), then kubectl uncordon {node_name}",
                    n.map(NodeView::drain_note).unwrap_or_default()
                ),
                vec![
                    format!("kubectl cordon {node_name}"),
                    drain,
                    format!("kubectl uncordon {node_name}"),
                ],
            )
        }
        Cause::NoDriver => (
            format!(
                "the container toolkit on {node_name} finds no NVIDIA driver (libnvidia-ml.so.1 or \
             the kernel module): install or load the driver on the node (or fix the toolkit's \
             driver root when the driver runs in a container), and keep GPU pods off it \
             meanwhile: kubectl cordon {node_name}; the node's GPU labels and conditions: \
             {describe}"
            ),
            vec![format!("kubectl cordon {node_name}"), describe.clone()],
        ),
        Cause::CudaTooNew => {
            let want = matched
                .iter()
                .find(|(c, _)| *c == Cause::CudaTooNew)
                .and_then(|(_, (_, raw))| required_cuda(raw))
                .unwrap_or_else(|| "a newer CUDA".to_string());
            let has = node
                .and_then(|n| {
                    n.label(crate::cluster::DRIVER_FULL)
                        .or_else(|| n.label(crate::cluster::DRIVER_MAJOR))
                })
                .map_or(String::new(), |d| format!(" (driver {d})"));
            (
                format!(
                    "the image requires {want}, more than the driver on {node_name}{has} supports: \
                 use an image built for an older CUDA, or run the pod on nodes with a newer \
                 driver (nodeSelector on nvidia.com/cuda.driver-version.major), or upgrade \
                 the driver; then {recreate}"
                ),
                vec![recreate_command(p)],
            )
        }
        Cause::CdiUnresolvable => (
            format!(
                "the runtime on {node_name} resolves GPUs through CDI, and the spec there does not \
             name the devices the pod was given (the spec was never written, or is stale after \
             a MIG change): regenerate it (the gpuops agent rewrites it when it starts; with \
             NVIDIA's toolkit: nvidia-ctk cdi generate --output=/var/run/cdi/nvidia.yaml on \
             the node; {describe} shows its MIG state), then {recreate}"
            ),
            vec![recreate_command(p), describe.clone()],
        ),
        Cause::NoNvidiaRuntime => (
            format!(
                "the container runtime on {node_name} has no NVIDIA runtime: configure it on the \
             node (nvidia-ctk runtime configure --runtime=containerd, then restart \
             containerd), or, where the device plugin injects GPUs through CDI, drop the \
             pod's runtimeClassName; then {recreate}"
            ),
            vec![recreate_command(p)],
        ),
        Cause::UnknownDevice => (
            format!(
                "the device the kubelet allocated is not on {node_name} any more (the MIG layout \
             changed or the GPU fell off the bus): see the node's health and MIG state \
             ({describe}), then {recreate}"
            ),
            vec![describe.clone(), recreate_command(p)],
        ),
        Cause::ToolkitOther => (
            format!(
                "the NVIDIA container toolkit on {node_name} failed with the error quoted above: \
             check its installation and configuration on the node \
             (/etc/nvidia-container-runtime/config.toml), then {recreate}"
            ),
            vec![recreate_command(p)],
        ),
    }
}

/// `cuda>=12.4` from the toolkit's requirement error.
fn required_cuda(raw: &str) -> Option<String> {
    let at = raw.find("cuda>=")?;
    let rest = &raw[at..];
    let end = rest
        .find(|ch: char| !(ch.is_ascii_alphanumeric() || matches!(ch, '.' | '>' | '=')))
        .unwrap_or(rest.len());
    Some(rest[..end].to_string())
}

fn node_line(n: &NodeView<'_>, p: &PodView<'_>) -> String {
    let gpus: Vec<String> = p
        .gpus
        .keys()
        .map(|r| {
            format!(
                "{r} capacity {}, allocatable {}",
                n.capacity.get(r).copied().unwrap_or(0),
                n.allocatable_of(r)
            )
        })
        .collect();
    let driver = n
        .label(crate::cluster::DRIVER_FULL)
        .map_or(String::new(), |d| format!("; driver {d}"));
    format!("node {}: {}{driver}", n.name, gpus.join(", "))
}

fn owned(p: &PodView<'_>) -> bool {
    p.pod
        .metadata
        .owner_references
        .iter()
        .flatten()
        .any(|o| o.controller == Some(true))
}

/// How the pod comes back, in words.
fn recreate(p: &PodView<'_>) -> String {
    if owned(p) {
        format!(
            "delete the pod so its controller creates a new one (kubectl -n {} delete pod {})",
            p.namespace, p.name
        )
    } else {
        format!(
            "no controller recreates it: save its manifest (kubectl -n {0} get pod {1} -o yaml), \
             delete it (kubectl -n {0} delete pod {1}) and create it again",
            p.namespace, p.name
        )
    }
}

fn recreate_command(p: &PodView<'_>) -> String {
    format!("kubectl -n {} delete pod {}", p.namespace, p.name)
}

/// The command that shows the device plugin's log on the node, else the pods on the node.
fn agent_log(n: Option<&NodeView<'_>>) -> String {
    match n.and_then(|n| n.agents.first().map(|a| (n, a))) {
        Some((_, a)) => format!(
            "kubectl -n {} logs {}",
            a.metadata.namespace.as_deref().unwrap_or("default"),
            a.metadata.name.as_deref().unwrap_or("")
        ),
        None => format!(
            "kubectl get pods -A -o wide --field-selector spec.nodeName={}",
            n.map_or("", |n| n.name)
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit::*;
    use k8s_openapi::api::core::v1::{ContainerState, ContainerStateWaiting, ContainerStatus};

    /// The kubelet's rejection, as `rejectPod` writes it.
    fn rejected(
        mut p: k8s_openapi::api::core::v1::Pod,
        node: &str,
        reason: &str,
        msg: &str,
    ) -> k8s_openapi::api::core::v1::Pod {
        p.spec.as_mut().unwrap().node_name = Some(node.into());
        let s = p.status.as_mut().unwrap();
        s.phase = Some("Failed".into());
        s.reason = Some(reason.into());
        s.message = Some(format!("Pod was rejected: {msg}"));
        p
    }

    /// A container the runtime could not create: ContainerCreating with a kubelet event.
    fn creating(
        mut p: k8s_openapi::api::core::v1::Pod,
        node: &str,
        reason: &str,
    ) -> k8s_openapi::api::core::v1::Pod {
        p.spec.as_mut().unwrap().node_name = Some(node.into());
        let s = p.status.as_mut().unwrap();
        s.phase = Some("Pending".into());
        s.container_statuses = Some(vec![ContainerStatus {
            name: "main".into(),
            state: Some(ContainerState {
                waiting: Some(ContainerStateWaiting {
                    reason: Some(reason.into()),
                    message: None,
                }),
                ..ContainerState::default()
            }),
            ..ContainerStatus::default()
        }]);
        p
    }

    fn kubelet_event(pod: &str, reason: &str, msg: &str) -> k8s_openapi::api::core::v1::Event {
        let mut e = event("Pod", "ml", pod, reason, msg, 30);
        e.reporting_component = Some("kubelet".into());
        e
    }

    const HOOK: &str = "failed to create containerd task: failed to create shim task: OCI runtime create failed: runc create failed: unable to start container process: error during container init: error running prestart hook #0: exit status 1, stdout: , stderr: Auto-detected mode as 'legacy'\nnvidia-container-cli: ";

    #[test]
    fn pods_rejected_at_admission() {
        let n = gpu_node("g1", "nvidia.com/gpu", 8);
        let msg = "Allocate failed due to requested number of devices unavailable for nvidia.com/gpu. Requested: 1, Available: 0, which is unexpected";
        let p = rejected(
            pod("ml", "t", &[("nvidia.com/gpu", 1)]),
            "g1",
            "UnexpectedAdmissionError",
            msg,
        );
        let e = kubelet_event("t", "UnexpectedAdmissionError", msg);
        let f = run(&snapshot(vec![n.clone()], vec![p], vec![e]));
        let got = one(&f, "admission-devices-unavailable");
        assert_eq!(got.severity, Severity::Critical);
        assert!(
            got.evidence
                .join("\n")
                .contains("Requested: 1, Available: 0"),
            "{got:#?}"
        );
        assert!(
            got.commands
                .contains(&"kubectl -n ml delete pod t".to_string()),
            "{got:#?}"
        );
        assert!(
            got.fix.contains("no controller recreates it"),
            "{}",
            got.fix
        );

        // OutOf<resource>: the node's allocatable dropped under the pods already bound.
        let p = rejected(
            pod("ml", "u", &[("nvidia.com/gpu", 2)]),
            "g1",
            "OutOfnvidia.com/gpu",
            "Node didn't have enough resource: nvidia.com/gpu, requested: 2, used: 7, capacity: 8",
        );
        one(
            &run(&snapshot(vec![n.clone()], vec![p], vec![])),
            "admission-devices-unavailable",
        );

        let p = rejected(
            pod("ml", "v", &[("nvidia.com/gpu", 4)]),
            "g1",
            "TopologyAffinityError",
            "Resources cannot be allocated with Topology locality",
        );
        one(
            &run(&snapshot(vec![n.clone()], vec![p], vec![])),
            "admission-topology",
        );

        // Look-alike: the shared-replica rejection belongs to the workload rule alone.
        let p = rejected(
            pod("ml", "w", &[("nvidia.com/gpu", 2)]),
            "g1",
            "UnexpectedAdmissionError",
            "Allocate failed due to rpc error: code = Unknown desc = request for 'nvidia.com/gpu: 2' too large: maximum request size for shared resources is 1, which is unexpected",
        );
        let f = run(&snapshot(vec![n], vec![p], vec![]));
        assert!(
            with_code(&f, "admission-devices-unavailable").is_empty(),
            "{f:#?}"
        );
    }

    #[test]
    fn containers_the_nvidia_stack_cannot_start() {
        let mut n = gpu_node("g1", "nvidia.com/gpu", 8);
        label(&mut n, "nvidia.com/cuda.driver-version.full", "535.104.05");
        for (reason, msg, code) in [
            ("Failed", format!("Error: {HOOK}initialization error: nvml error: driver/library version mismatch: unknown"), "runtime-driver-mismatch"),
            ("Failed", format!("Error: {HOOK}initialization error: load library failed: libnvidia-ml.so.1: cannot open shared object file: no such file or directory: unknown"), "runtime-no-driver"),
            ("Failed", format!("Error: {HOOK}initialization error: nvml error: driver not loaded: unknown"), "runtime-no-driver"),
            ("Failed", format!("Error: {HOOK}requirement error: unsatisfied condition: cuda>=12.4, please update your driver to a newer version, or use an earlier cuda container: unknown"), "runtime-cuda-too-new"),
            ("Failed", "Error: failed to create containerd container: CDI device injection failed: unresolvable CDI devices nvidia.com/gpu=GPU-8f1c2d3e".to_string(), "runtime-cdi-unresolvable"),
            ("FailedCreatePodSandBox", "Failed to create pod sandbox: rpc error: code = Unknown desc = failed to get sandbox runtime: no runtime for \"nvidia\" is configured".to_string(), "runtime-no-nvidia-runtime"),
            ("Failed", "Error: could not select device driver \"\" with capabilities: [[gpu]]".to_string(), "runtime-no-nvidia-runtime"),
            ("Failed", format!("Error: {HOOK}device error: GPU-8f1c2d3e: unknown device: unknown"), "runtime-unknown-device"),
            ("Failed", format!("Error: {HOOK}mount error: file creation failed: /run/x: permission denied: unknown"), "runtime-nvidia-toolkit"),
        ] {
            let p = creating(pod("ml", "t", &[("nvidia.com/gpu", 1)]), "g1", "ContainerCreating");
            let e = kubelet_event("t", reason, &msg);
            let f = run(&snapshot(vec![n.clone()], vec![p], vec![e]));
            let got = one(&f, code);
            assert!(got.evidence.join("\n").contains(reason), "{code}: {got:#?}");
            assert!(got.objects.contains(&ObjectRef::node("g1")), "{code}");
            if code == "runtime-cuda-too-new" {
                assert!(got.fix.contains("cuda>=12.4") && got.fix.contains("535.104.05"), "{}", got.fix);
            }
            if code == "runtime-driver-mismatch" {
                assert!(got.commands.contains(&"kubectl cordon g1".to_string()), "{got:#?}");
            }
            for cmd in &got.commands {
                assert!(got.fix.contains(cmd.as_str()), "{code}: `{cmd}` not in {}", got.fix);
            }
        }

        // The same text in the container's status (StartError after the hook failed).
        let mut p = creating(
            pod("ml", "t", &[("nvidia.com/gpu", 1)]),
            "g1",
            "CrashLoopBackOff",
        );
        p.status.as_mut().unwrap().phase = Some("Running".into());
        p.status
            .as_mut()
            .unwrap()
            .container_statuses
            .as_mut()
            .unwrap()[0]
            .last_state = Some(ContainerState {
            terminated: Some(k8s_openapi::api::core::v1::ContainerStateTerminated {
                reason: Some("StartError".into()),
                exit_code: 128,
                message: Some(format!(
                    "{HOOK}initialization error: nvml error: driver/library version mismatch: unknown"
                )),
                ..Default::default()
            }),
            ..ContainerState::default()
        });
        one(
            &run(&snapshot(vec![n.clone()], vec![p], vec![])),
            "runtime-driver-mismatch",
        );

        // Look-alikes: a pod running and ready whose old event is over; a non-GPU pod.
        let p = running(pod("ml", "t", &[("nvidia.com/gpu", 1)]), "g1");
        let e = kubelet_event(
            "t",
            "Failed",
            &format!(
                "Error: {HOOK}initialization error: nvml error: driver/library version mismatch: unknown"
            ),
        );
        assert!(
            with_code(
                &run(&snapshot(vec![n.clone()], vec![p], vec![e.clone()])),
                "runtime-driver-mismatch"
            )
            .is_empty()
        );
        let p = creating(pod("ml", "t", &[]), "g1", "ContainerCreating");
        assert!(
            with_code(
                &run(&snapshot(vec![n], vec![p], vec![e])),
                "runtime-driver-mismatch"
            )
            .is_empty()
        );
    }

    #[test]
    fn texts_are_classified_by_their_stable_part() {
        assert_eq!(classify("unknown device"), None);
        assert_eq!(
            classify("Error: nvidia-container-cli: device error: 3: unknown device"),
            Some(Cause::UnknownDevice)
        );
        assert_eq!(classify("Back-off restarting failed container"), None);
        assert_eq!(
            required_cuda("unsatisfied condition: cuda>=12.4, please"),
            Some("cuda>=12.4".into())
        );
    }
}
