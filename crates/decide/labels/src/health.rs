//! The node's `GPUHealthy` condition and `NoSchedule` taint, decided from the unhealthy devices.

use crate::LabelError;
use gpuops_catalog::xid;
use gpuops_inventory::{Health, Inventory};
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;
use std::fmt;

/// The node condition type the agent owns.
pub const GPU_HEALTHY_CONDITION: &str = "GPUHealthy";
/// Default key of the taint put on a node with an unhealthy GPU.
pub const DEFAULT_TAINT_KEY: &str = "gpuops.io/gpu-unhealthy";
/// Problems named one by one in the condition message; the rest are counted.
const MAX_LISTED: usize = 8;

/// Why a device is currently unhealthy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum UnhealthyCause {
    /// An XID event; only fatal ones ([`xid::is_fatal`]) count against the node.
    Xid(u64),
    /// The GPU fell off the bus (NVML `GPU_IS_LOST`).
    Lost,
}

/// A device the health watcher currently holds unhealthy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UnhealthyDevice {
    /// `GPU-…`, or `MIG-…` for one MIG device; empty when only the index is known.
    pub uuid: String,
    /// The (parent) GPU's index when known; found from the inventory by UUID otherwise.
    pub gpu_index: Option<u32>,
    pub cause: UnhealthyCause,
}

/// Whether an unhealthy GPU taints the node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HealthPolicy {
    pub taint_enabled: bool,
    pub taint_key: String,
}

impl Default for HealthPolicy {
    /// Tainting off, key [`DEFAULT_TAINT_KEY`].
    fn default() -> Self {
        HealthPolicy {
            taint_enabled: false,
            taint_key: DEFAULT_TAINT_KEY.to_string(),
        }
    }
}

/// A node condition's status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ConditionStatus {
    True,
    False,
}

impl ConditionStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            ConditionStatus::True => "True",
            ConditionStatus::False => "False",
        }
    }
}

/// The desired `GPUHealthy` node condition (the caller adds the transition and heartbeat times).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeCondition {
    #[serde(rename = "type")]
    pub type_: String,
    pub status: ConditionStatus,
    /// `AllGPUsHealthy`, `XidError`, `GPULost` or `GPUProblems` (fatal XIDs and lost GPUs).
    pub reason: String,
    pub message: String,
}

/// A node taint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Taint {
    pub key: String,
    /// The condition's reason.
    pub value: String,
    /// Always `NoSchedule`.
    pub effect: String,
}

/// What the node should show for its GPUs' health.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HealthDecision {
    pub condition: NodeCondition,
    /// The taint that should be on the node; `None`: the policy's taint key should be absent.
    pub taint: Option<Taint>,
    /// The same problems as data, for [`GPU_HEALTH_ANNOTATION`].
    pub report: HealthReport,
}

/// Node annotation holding [`HealthReport`] as JSON. Tools (the doctor) read this instead of the
/// condition's message, whose wording is for people and may change.
pub const GPU_HEALTH_ANNOTATION: &str = "gpuops.io/gpu-health";

/// The problems behind the `GPUHealthy` condition, as published in [`GPU_HEALTH_ANNOTATION`].
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct HealthReport {
    /// Format version; readers refuse versions they do not know.
    pub version: u32,
    /// Problems that make the condition `False` (fatal XIDs, lost or unreachable GPUs).
    pub problems: Vec<GpuProblem>,
    /// Non-fatal XIDs currently held, which do not count against the node.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ignored: Vec<GpuProblem>,
}

/// The [`HealthReport`] format this crate writes and reads.
pub const HEALTH_REPORT_VERSION: u32 = 1;

/// One problem on one GPU, or on one MIG device of it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuProblem {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_index: Option<u32>,
    /// `GPU-…`; empty when the driver gave only an index.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub gpu_uuid: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mig_uuid: Option<String>,
    #[serde(flatten)]
    pub kind: ProblemKind,
}

/// What is wrong with a GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum ProblemKind {
    Xid { xid: u64 },
    Lost,
    Unreachable { reason: String },
}

impl HealthReport {
    /// The annotation's value.
    pub fn to_annotation(&self) -> String {
        // A struct of strings and integers always serializes.
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Parses an annotation's value written by [`HealthReport::to_annotation`].
    pub fn from_annotation(value: &str) -> Result<Self, LabelError> {
        let report: HealthReport = serde_json::from_str(value)
            .map_err(|e| LabelError::InvalidHealthAnnotation(e.to_string()))?;
        if report.version != HEALTH_REPORT_VERSION {
            return Err(LabelError::InvalidHealthAnnotation(format!(
                "version {} is not the supported version {HEALTH_REPORT_VERSION}",
                report.version
            )));
        }
        Ok(report)
    }
}

impl From<&Problem> for GpuProblem {
    fn from(p: &Problem) -> Self {
        GpuProblem {
            gpu_index: p.index,
            gpu_uuid: p.gpu_uuid.clone(),
            mig_uuid: p.mig_uuid.clone(),
            kind: match &p.kind {
                Kind::Xid(x) => ProblemKind::Xid { xid: *x },
                Kind::Lost => ProblemKind::Lost,
                Kind::Unreachable(r) => ProblemKind::Unreachable { reason: r.clone() },
            },
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    Xid(u64),
    Lost,
    Unreachable(String),
}

/// One problem, on one GPU (or MIG device of it).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Problem {
    index: Option<u32>,
    gpu_uuid: String,
    /// The MIG device's UUID when the problem is on one.
    mig_uuid: Option<String>,
    kind: Kind,
}

impl Problem {
    fn gpu_key(&self) -> (Option<u32>, &str) {
        (self.index, &self.gpu_uuid)
    }
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.index, self.gpu_uuid.is_empty()) {
            (Some(i), false) => write!(f, "GPU {i} ({})", self.gpu_uuid)?,
            (Some(i), true) => write!(f, "GPU {i}")?,
            (None, false) => write!(f, "GPU {}", self.gpu_uuid)?,
            (None, true) => write!(f, "an unidentified GPU")?,
        }
        if let Some(m) = &self.mig_uuid {
            write!(f, " MIG device {m}")?;
        }
        let reboot = xid::describe(79).action;
        match &self.kind {
            Kind::Xid(x) => {
                let info = xid::describe(*x);
                write!(f, ": XID {x} ({}): {}", info.meaning, info.action)
            }
            Kind::Lost => write!(f, ": lost, fell off the bus: {reboot}"),
            Kind::Unreachable(why) => write!(f, ": unreachable ({why}): {reboot}"),
        }
    }
}

/// The `GPUHealthy` condition and taint for `inv`'s node, given the devices currently held
/// unhealthy.
///
/// Fatal XIDs ([`xid::is_fatal`]) and lost GPUs make the condition `False`; so does a GPU the
/// inventory reports lost or unreachable even when `unhealthy` does not list it. Non-fatal XIDs
/// (application faults) leave it `True` and are only mentioned in the message. The taint is
/// wanted when the condition is `False` and the policy enables tainting.
pub fn gpu_health(
    inv: &Inventory,
    unhealthy: &[UnhealthyDevice],
    policy: &HealthPolicy,
) -> HealthDecision {
    let mut problems: BTreeSet<Problem> = BTreeSet::new();
    let mut ignored: BTreeSet<Problem> = BTreeSet::new();
    for d in unhealthy {
        let gpu = if d.uuid.is_empty() {
            d.gpu_index
                .and_then(|i| inv.gpus.iter().find(|g| g.index == i))
        } else {
            inv.gpu_by_uuid(&d.uuid)
        };
        let gpu_uuid = gpu.map_or_else(
            || {
                if d.uuid.starts_with("MIG-") {
                    String::new()
                } else {
                    d.uuid.clone()
                }
            },
            |g| g.uuid.clone(),
        );
        let p = Problem {
            index: d.gpu_index.or(gpu.map(|g| g.index)),
            mig_uuid: d.uuid.starts_with("MIG-").then(|| d.uuid.clone()),
            gpu_uuid,
            kind: match d.cause {
                UnhealthyCause::Xid(x) => Kind::Xid(x),
                UnhealthyCause::Lost => Kind::Lost,
            },
        };
        match d.cause {
            UnhealthyCause::Xid(x) if !xid::is_fatal(x) => ignored.insert(p),
            _ => problems.insert(p),
        };
    }
    for g in &inv.gpus {
        let kind = match &g.health {
            Health::Healthy => continue,
            Health::Lost => Kind::Lost,
            Health::Unreachable { reason } => Kind::Unreachable(reason.clone()),
        };
        let already = problems.iter().any(|p| {
            p.index == Some(g.index) && matches!(p.kind, Kind::Lost | Kind::Unreachable(_))
        });
        if !already {
            problems.insert(Problem {
                index: Some(g.index),
                gpu_uuid: g.uuid.clone(),
                mig_uuid: None,
                kind,
            });
        }
    }

    let condition = if problems.is_empty() {
        healthy_condition(inv.gpus.len(), &ignored)
    } else {
        unhealthy_condition(inv.gpus.len(), &problems)
    };
    let taint =
        (policy.taint_enabled && condition.status == ConditionStatus::False).then(|| Taint {
            key: policy.taint_key.clone(),
            value: condition.reason.clone(),
            effect: "NoSchedule".to_string(),
        });
    let report = HealthReport {
        version: HEALTH_REPORT_VERSION,
        problems: problems.iter().map(GpuProblem::from).collect(),
        ignored: ignored.iter().map(GpuProblem::from).collect(),
    };
    HealthDecision {
        condition,
        taint,
        report,
    }
}

fn condition(status: ConditionStatus, reason: &str, message: String) -> NodeCondition {
    NodeCondition {
        type_: GPU_HEALTHY_CONDITION.to_string(),
        status,
        reason: reason.to_string(),
        message,
    }
}

fn listed(problems: &BTreeSet<Problem>) -> String {
    let mut parts: Vec<String> = problems
        .iter()
        .take(MAX_LISTED)
        .map(|p| p.to_string())
        .collect();
    if problems.len() > MAX_LISTED {
        parts.push(format!("and {} more", problems.len() - MAX_LISTED));
    }
    parts.join("; ")
}

fn healthy_condition(gpus: usize, ignored: &BTreeSet<Problem>) -> NodeCondition {
    let mut message = match gpus {
        0 => "no GPUs on this node".to_string(),
        1 => "the GPU is healthy".to_string(),
        n => format!("all {n} GPUs are healthy"),
    };
    if !ignored.is_empty() {
        message.push_str(&format!(
            "; non-fatal XIDs seen (not counted): {}",
            listed(ignored)
        ));
    }
    condition(ConditionStatus::True, "AllGPUsHealthy", message)
}

fn unhealthy_condition(gpus: usize, problems: &BTreeSet<Problem>) -> NodeCondition {
    let xids = problems.iter().any(|p| matches!(p.kind, Kind::Xid(_)));
    let lost = problems.iter().any(|p| !matches!(p.kind, Kind::Xid(_)));
    let reason = match (xids, lost) {
        (true, false) => "XidError",
        (false, true) => "GPULost",
        _ => "GPUProblems",
    };
    let bad: BTreeSet<(Option<u32>, &str)> = problems.iter().map(Problem::gpu_key).collect();
    let message = format!(
        "{} of {} GPU{} unhealthy: {}",
        bad.len(),
        gpus.max(bad.len()),
        if gpus.max(bad.len()) == 1 { "" } else { "s" },
        listed(problems)
    );
    condition(ConditionStatus::False, reason, message)
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuops_inventory::{Gpu, MigDevice};

    fn uuid(i: u32) -> String {
        format!("GPU-{i:08x}-1111-2222-3333-444444444444")
    }

    fn inv(n: u32) -> Inventory {
        Inventory {
            gpus: (0..n)
                .map(|i| Gpu {
                    index: i,
                    uuid: uuid(i),
                    name: "NVIDIA H100 80GB HBM3".into(),
                    ..Gpu::default()
                })
                .collect(),
            ..Inventory::default()
        }
    }

    fn dev(i: u32, cause: UnhealthyCause) -> UnhealthyDevice {
        UnhealthyDevice {
            uuid: uuid(i),
            gpu_index: None,
            cause,
        }
    }

    fn taint_on() -> HealthPolicy {
        HealthPolicy {
            taint_enabled: true,
            ..HealthPolicy::default()
        }
    }

    #[test]
    fn health_decisions() {
        let fell = "reboot the node; check power and PCIe seating if it repeats";
        // (unhealthy devices, status, reason, message)
        let cases: Vec<(Vec<UnhealthyDevice>, ConditionStatus, &str, String)> = vec![
            (
                vec![],
                ConditionStatus::True,
                "AllGPUsHealthy",
                "all 8 GPUs are healthy".into(),
            ),
            (
                vec![dev(3, UnhealthyCause::Xid(79))],
                ConditionStatus::False,
                "XidError",
                format!(
                    "1 of 8 GPUs unhealthy: GPU 3 ({}): XID 79 (GPU has fallen off the bus): {fell}",
                    uuid(3)
                ),
            ),
            (
                vec![dev(0, UnhealthyCause::Xid(13))],
                ConditionStatus::True,
                "AllGPUsHealthy",
                format!(
                    "all 8 GPUs are healthy; non-fatal XIDs seen (not counted): GPU 0 ({}): XID 13 (graphics engine exception): fix the application; the GPU is fine",
                    uuid(0)
                ),
            ),
            (
                vec![dev(5, UnhealthyCause::Lost)],
                ConditionStatus::False,
                "GPULost",
                format!(
                    "1 of 8 GPUs unhealthy: GPU 5 ({}): lost, fell off the bus: {fell}",
                    uuid(5)
                ),
            ),
            (
                vec![
                    dev(6, UnhealthyCause::Lost),
                    dev(2, UnhealthyCause::Xid(48)),
                ],
                ConditionStatus::False,
                "GPUProblems",
                format!(
                    "2 of 8 GPUs unhealthy: GPU 2 ({}): XID 48 (double-bit ECC error): drain the node and reset the GPU; GPU 6 ({}): lost, fell off the bus: {fell}",
                    uuid(2),
                    uuid(6)
                ),
            ),
            (
                // Two fatal XIDs on one GPU, one repeated: one GPU, two problems.
                vec![
                    dev(1, UnhealthyCause::Xid(95)),
                    dev(1, UnhealthyCause::Xid(64)),
                    dev(1, UnhealthyCause::Xid(95)),
                ],
                ConditionStatus::False,
                "XidError",
                format!(
                    "1 of 8 GPUs unhealthy: GPU 1 ({u}): XID 64 (ECC page retirement or row remapping failure): reset the GPU; replace it if it repeats; GPU 1 ({u}): XID 95 (uncontained ECC error): reset the GPU; drain if it repeats",
                    u = uuid(1)
                ),
            ),
        ];
        for (devs, status, reason, message) in cases {
            let d = gpu_health(&inv(8), &devs, &taint_on());
            assert_eq!(d.condition.type_, "GPUHealthy");
            assert_eq!(d.condition.status, status, "{devs:?}");
            assert_eq!(d.condition.reason, reason, "{devs:?}");
            assert_eq!(d.condition.message, message);
            let want_taint = (status == ConditionStatus::False).then(|| Taint {
                key: DEFAULT_TAINT_KEY.into(),
                value: reason.into(),
                effect: "NoSchedule".into(),
            });
            assert_eq!(d.taint, want_taint);
            // Tainting off: never a taint, same condition.
            let off = gpu_health(&inv(8), &devs, &HealthPolicy::default());
            assert_eq!(off.taint, None);
            assert_eq!(off.condition, d.condition);
        }
    }

    #[test]
    fn mig_devices_indices_and_inventory_losses() {
        let mut i = inv(2);
        i.gpus[1].mig_devices.push(MigDevice {
            uuid: "MIG-abc".into(),
            ..MigDevice::default()
        });
        i.gpus[0].health = Health::Unreachable {
            reason: "NVML: Unknown Error".into(),
        };
        let devs = [
            UnhealthyDevice {
                uuid: "MIG-abc".into(),
                gpu_index: None,
                cause: UnhealthyCause::Xid(94),
            },
            UnhealthyDevice {
                uuid: "MIG-abc".into(),
                gpu_index: None,
                cause: UnhealthyCause::Xid(95),
            },
        ];
        let policy = HealthPolicy {
            taint_enabled: true,
            taint_key: "example.com/gpu".into(),
        };
        let d = gpu_health(&i, &devs, &policy);
        assert_eq!(d.condition.status, ConditionStatus::False);
        assert_eq!(d.condition.reason, "GPUProblems");
        assert_eq!(
            d.condition.message,
            format!(
                "2 of 2 GPUs unhealthy: GPU 0 ({}): unreachable (NVML: Unknown Error): reboot the node; check power and PCIe seating if it repeats; GPU 1 ({}) MIG device MIG-abc: XID 95 (uncontained ECC error): reset the GPU; drain if it repeats",
                uuid(0),
                uuid(1)
            )
        );
        assert_eq!(d.taint.map(|t| t.key), Some("example.com/gpu".to_string()));

        // Known only by index, and a GPU lost in the inventory and reported lost: listed once.
        let mut i = inv(4);
        i.gpus[2].health = Health::Lost;
        let devs = [
            UnhealthyDevice {
                uuid: String::new(),
                gpu_index: Some(2),
                cause: UnhealthyCause::Lost,
            },
            UnhealthyDevice {
                uuid: String::new(),
                gpu_index: Some(3),
                cause: UnhealthyCause::Xid(79),
            },
        ];
        let d = gpu_health(&i, &devs, &HealthPolicy::default());
        assert_eq!(d.condition.reason, "GPUProblems");
        assert!(
            d.condition
                .message
                .starts_with(&format!("2 of 4 GPUs unhealthy: GPU 2 ({}): lost", uuid(2))),
            "{}",
            d.condition.message
        );
        assert_eq!(d.condition.message.matches("lost").count(), 1);
        assert!(
            d.condition
                .message
                .contains(&format!("GPU 3 ({}): XID 79", uuid(3)))
        );
    }

    #[test]
    fn long_lists_are_cut_and_no_gpus_is_healthy() {
        let devs: Vec<UnhealthyDevice> = (0..10).map(|i| dev(i, UnhealthyCause::Xid(79))).collect();
        let d = gpu_health(&inv(10), &devs, &HealthPolicy::default());
        assert!(d.condition.message.starts_with("10 of 10 GPUs unhealthy: "));
        assert!(d.condition.message.ends_with("; and 2 more"));
        let d = gpu_health(&Inventory::default(), &[], &HealthPolicy::default());
        assert_eq!(d.condition.status, ConditionStatus::True);
        assert_eq!(d.condition.message, "no GPUs on this node");
    }

    #[test]
    fn the_report_carries_every_problem_and_round_trips() {
        let mut i = inv(3);
        i.gpus[2].health = Health::Lost;
        let devs = [
            dev(0, UnhealthyCause::Xid(79)),
            dev(1, UnhealthyCause::Xid(13)),
        ];
        let d = gpu_health(&i, &devs, &HealthPolicy::default());
        assert_eq!(d.report.version, HEALTH_REPORT_VERSION);
        let kinds: Vec<(Option<u32>, &ProblemKind)> = d
            .report
            .problems
            .iter()
            .map(|p| (p.gpu_index, &p.kind))
            .collect();
        assert_eq!(
            kinds,
            [
                (Some(0), &ProblemKind::Xid { xid: 79 }),
                (Some(2), &ProblemKind::Lost)
            ]
        );
        assert_eq!(d.report.ignored.len(), 1);
        assert_eq!(d.report.ignored[0].kind, ProblemKind::Xid { xid: 13 });
        let text = d.report.to_annotation();
        assert!(text.contains(r#""kind":"xid","xid":79"#), "{text}");
        assert_eq!(HealthReport::from_annotation(&text), Ok(d.report.clone()));

        let healthy = gpu_health(&inv(2), &[], &HealthPolicy::default());
        assert!(healthy.report.problems.is_empty());
    }

    #[test]
    fn a_bad_or_newer_report_is_refused() {
        for bad in ["", "GPU 0: XID 79", r#"{"version":2,"problems":[]}"#] {
            let err = HealthReport::from_annotation(bad).unwrap_err();
            assert!(
                err.to_string().contains("gpuops.io/gpu-health"),
                "{bad}: {err}"
            );
        }
    }
}
