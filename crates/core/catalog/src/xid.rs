//! What each XID means and what to do about it (facts from NVIDIA's XID catalogue).

use serde::Serialize;

/// How serious an XID is for the GPU (not for the application that caused it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum XidClass {
    /// Caused by the application; the GPU is fine (NVIDIA's plugin ignores these by default).
    Application,
    /// Restart the application; the GPU is usable.
    RestartApp,
    /// Worth watching, no action yet.
    Watch,
    /// The GPU needs a reset before it can be trusted again.
    ResetGpu,
    /// Take the node out of service (drain), then repair.
    Drain,
    /// The node must be rebooted.
    RebootNode,
    /// Not in the catalogue.
    Unknown,
}

/// One XID's meaning and the recommended action.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct XidInfo {
    pub xid: u64,
    pub meaning: &'static str,
    pub class: XidClass,
    pub action: &'static str,
}

/// XIDs NVIDIA's device plugin ignores for health by default: application-level faults.
pub const DEFAULT_IGNORED_XIDS: &[u64] = &[13, 31, 43, 45, 68, 109];

const TABLE: &[(u64, &str, XidClass, &str)] = &[
    (
        13,
        "graphics engine exception",
        XidClass::Application,
        "fix the application; the GPU is fine",
    ),
    (
        31,
        "GPU memory page fault",
        XidClass::Application,
        "fix the application (illegal address); the GPU is fine",
    ),
    (
        32,
        "invalid or corrupted push buffer stream (PBDMA error)",
        XidClass::RestartApp,
        "restart the application",
    ),
    (
        43,
        "GPU stopped processing",
        XidClass::Application,
        "application fault; the GPU is fine",
    ),
    (
        45,
        "preemptive cleanup after previous errors",
        XidClass::Application,
        "follows another error; look at the XID before it",
    ),
    (
        48,
        "double-bit ECC error",
        XidClass::Drain,
        "drain the node and reset the GPU",
    ),
    (
        61,
        "internal micro-controller breakpoint",
        XidClass::ResetGpu,
        "reset the GPU",
    ),
    (
        62,
        "internal micro-controller halt",
        XidClass::ResetGpu,
        "reset the GPU",
    ),
    (
        63,
        "ECC page retirement or row remapping recorded",
        XidClass::ResetGpu,
        "reset the GPU to activate the remapping",
    ),
    (
        64,
        "ECC page retirement or row remapping failure",
        XidClass::ResetGpu,
        "reset the GPU; replace it if it repeats",
    ),
    (
        68,
        "NVDEC0 exception",
        XidClass::Application,
        "video decode application fault; the GPU is fine",
    ),
    (
        69,
        "graphics engine class error",
        XidClass::RestartApp,
        "restart the application",
    ),
    (
        74,
        "NVLink error",
        XidClass::Drain,
        "drain the node; check NVLink/NVSwitch health",
    ),
    (
        79,
        "GPU has fallen off the bus",
        XidClass::RebootNode,
        "reboot the node; check power and PCIe seating if it repeats",
    ),
    (
        92,
        "high single-bit ECC error rate",
        XidClass::Watch,
        "watch; plan a GPU replacement if it continues",
    ),
    (
        94,
        "contained ECC error",
        XidClass::RestartApp,
        "restart the affected application",
    ),
    (
        95,
        "uncontained ECC error",
        XidClass::ResetGpu,
        "reset the GPU; drain if it repeats",
    ),
    (
        109,
        "context switch timeout",
        XidClass::Application,
        "application fault; ignored by NVIDIA's plugin by default",
    ),
    (119, "GSP RPC timeout", XidClass::ResetGpu, "reset the GPU"),
    (120, "GSP error", XidClass::ResetGpu, "reset the GPU"),
    (
        140,
        "unrecovered ECC error",
        XidClass::ResetGpu,
        "reset the GPU",
    ),
    (
        143,
        "GPU initialisation failure",
        XidClass::ResetGpu,
        "reset the GPU",
    ),
    (
        154,
        "GPU recovery action changed",
        XidClass::Watch,
        "read NVML field 230 for the action (none, reset, reboot, drain)",
    ),
];

/// What an XID means; unknown XIDs get a generic answer rather than none.
pub fn describe(xid: u64) -> XidInfo {
    TABLE.iter().find(|(x, ..)| *x == xid).map_or(
        XidInfo {
            xid,
            meaning: "XID not in the catalogue",
            class: XidClass::Unknown,
            action: "look it up in NVIDIA's XID catalogue; watch for repeats",
        },
        |&(xid, meaning, class, action)| XidInfo {
            xid,
            meaning,
            class,
            action,
        },
    )
}

/// Whether an XID means the GPU (not just an application) is in trouble.
pub fn is_fatal(xid: u64) -> bool {
    matches!(
        describe(xid).class,
        XidClass::ResetGpu | XidClass::Drain | XidClass::RebootNode
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_and_unknown_xids() {
        assert_eq!(describe(79).class, XidClass::RebootNode);
        assert!(is_fatal(48) && is_fatal(79) && is_fatal(64));
        for x in DEFAULT_IGNORED_XIDS {
            assert_eq!(describe(*x).class, XidClass::Application, "{x}");
            assert!(!is_fatal(*x));
        }
        assert_eq!(describe(4242).class, XidClass::Unknown);
        let mut seen: Vec<u64> = TABLE.iter().map(|t| t.0).collect();
        seen.dedup();
        assert_eq!(seen.len(), TABLE.len(), "sorted, no duplicates");
    }
}
