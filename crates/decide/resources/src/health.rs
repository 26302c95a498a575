//! Device health from XID events: which XIDs count (NVIDIA's ignore list and the
//! DP_DISABLE_HEALTHCHECKS / DP_ENABLE_HEALTHCHECKS env vars), which devices an XID hits (a MIG
//! instance, or the whole GPU), and recovery once no XID recurred for a quiet period — NVIDIA's
//! plugin never recovers without a restart.

use crate::ResourcesError;
use crate::model::Resource;
use std::collections::{BTreeMap, BTreeSet};

/// XIDs NVIDIA's device plugin ignores for health by default: application faults.
pub const DEFAULT_IGNORED_XIDS: [u64; 6] = [13, 31, 43, 45, 68, 109];

/// Which XIDs make a device unhealthy, and for how long.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthPolicy {
    /// XID health checks off entirely (`DP_DISABLE_HEALTHCHECKS=all` or `xids`).
    pub disabled: bool,
    pub ignored: BTreeSet<u64>,
    /// A device is healthy again once no counted XID hit it for this long.
    pub quiet_period_ms: u64,
}

impl HealthPolicy {
    /// NVIDIA's semantics: `DP_DISABLE_HEALTHCHECKS` is `all`, `xids`, or a comma list of XIDs to
    /// ignore in addition to the defaults; `DP_ENABLE_HEALTHCHECKS` lists XIDs to count even if
    /// ignored (it wins).
    pub fn from_env(
        disable: Option<&str>,
        enable: Option<&str>,
        quiet_period_ms: u64,
    ) -> Result<HealthPolicy, ResourcesError> {
        let mut policy = HealthPolicy {
            disabled: false,
            ignored: DEFAULT_IGNORED_XIDS.into_iter().collect(),
            quiet_period_ms,
        };
        let list = |var: &'static str, text: &str| -> Result<Vec<u64>, ResourcesError> {
            text.split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(|s| {
                    s.parse::<u64>().map_err(|_| ResourcesError::NotAnXid {
                        var,
                        given: s.to_string(),
                    })
                })
                .collect()
        };
        if let Some(d) = disable.map(str::trim).filter(|d| !d.is_empty()) {
            if d.eq_ignore_ascii_case("all") || d.eq_ignore_ascii_case("xids") {
                policy.disabled = true;
            } else {
                policy.ignored.extend(list("DP_DISABLE_HEALTHCHECKS", d)?);
            }
        }
        if let Some(e) = enable.map(str::trim).filter(|e| !e.is_empty()) {
            for xid in list("DP_ENABLE_HEALTHCHECKS", e)? {
                policy.ignored.remove(&xid);
            }
        }
        Ok(policy)
    }

    /// Whether an XID makes its device unhealthy.
    pub fn counts(&self, xid: u64) -> bool {
        !self.disabled && !self.ignored.contains(&xid)
    }
}

/// What an XID hit.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Target {
    Gpu(u32),
    Mig { gpu: u32, gi: u32, ci: Option<u32> },
}

/// Devices made unhealthy by recent XIDs.
#[derive(Debug, Clone, Default)]
pub struct HealthTracker {
    /// Target -> (last counted XID, when in ms).
    hits: BTreeMap<Target, (u64, u64)>,
}

impl HealthTracker {
    /// Records an XID on GPU `gpu` (index), attributed to a MIG instance when `gi` is given.
    /// Returns whether it counted.
    pub fn record(
        &mut self,
        policy: &HealthPolicy,
        gpu: u32,
        gi: Option<u32>,
        ci: Option<u32>,
        xid: u64,
        now_ms: u64,
    ) -> bool {
        if !policy.counts(xid) {
            return false;
        }
        let target = match gi {
            Some(gi) => Target::Mig { gpu, gi, ci },
            None => Target::Gpu(gpu),
        };
        self.hits.insert(target, (xid, now_ms));
        true
    }

    /// Forgets hits older than the quiet period; returns whether anything recovered.
    pub fn expire(&mut self, policy: &HealthPolicy, now_ms: u64) -> bool {
        let before = self.hits.len();
        self.hits
            .retain(|_, (_, at)| now_ms.saturating_sub(*at) < policy.quiet_period_ms);
        self.hits.len() != before
    }

    /// Every recent counted XID: (GPU index, GPU instance, compute instance, XID).
    pub fn hits(&self) -> Vec<(u32, Option<u32>, Option<u32>, u64)> {
        self.hits
            .iter()
            .map(|(t, (xid, _))| match t {
                Target::Gpu(g) => (*g, None, None, *xid),
                Target::Mig { gpu, gi, ci } => (*gpu, Some(*gi), *ci, *xid),
            })
            .collect()
    }

    /// The XID keeping a GPU (`mig: None`) or a MIG device (`Some((gi, ci))`) unhealthy, if any.
    pub fn xid_for(&self, gpu: u32, mig: Option<(u32, u32)>) -> Option<u64> {
        self.hits.iter().find_map(|(t, (xid, _))| {
            let hit = match (t, mig) {
                (Target::Gpu(g), _) => *g == gpu,
                (Target::Mig { gpu: g, gi, ci }, Some((m_gi, m_ci))) => {
                    *g == gpu && *gi == m_gi && ci.is_none_or(|c| c == m_ci)
                }
                // A MIG-attributed XID does not touch a whole-GPU device of another strategy.
                (Target::Mig { .. }, None) => false,
            };
            hit.then_some(*xid)
        })
    }

    /// Marks the devices of `resources` that recent XIDs hit as unhealthy.
    pub fn apply(&self, resources: &mut [Resource]) {
        for r in resources {
            for d in &mut r.devices {
                let mig = d.backing.mig.as_ref().map(|m| (m.gi_id, m.ci_id));
                if self.xid_for(d.backing.gpu_index, mig).is_some() {
                    d.health_ok = false;
                }
            }
        }
    }

    /// The XID keeping each unhealthy GPU (or MIG instance) down, for messages.
    pub fn describe(&self) -> Vec<String> {
        self.hits
            .iter()
            .map(|(t, (xid, _))| match t {
                Target::Gpu(g) => format!("GPU {g}: XID {xid}"),
                Target::Mig { gpu, gi, ci } => format!(
                    "GPU {gpu} MIG gi {gi}{}: XID {xid}",
                    ci.map(|c| format!(" ci {c}")).unwrap_or_default()
                ),
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::SharingStrategy;
    use crate::model::{Backing, Device, MigBacking};

    fn device(id: &str, gpu: u32, mig: Option<(u32, u32)>) -> Device {
        Device {
            id: id.into(),
            health_ok: true,
            numa_node: None,
            backing: Backing {
                gpu_index: gpu,
                gpu_uuid: format!("GPU-{gpu}"),
                gpu_minor: Some(gpu),
                mig: mig.map(|(gi, ci)| MigBacking {
                    uuid: format!("MIG-{gpu}-{gi}"),
                    gi_id: gi,
                    ci_id: ci,
                    index: 0,
                    profile: "1g.10gb".into(),
                }),
            },
            replica: None,
        }
    }

    fn resource(devices: Vec<Device>) -> Resource {
        Resource {
            name: "nvidia.com/gpu".into(),
            socket_name: "nvidia-gpu.sock".into(),
            devices,
            replicas: 1,
            sharing: SharingStrategy::None,
            fail_requests_greater_than_one: false,
        }
    }

    #[test]
    fn env_vars_follow_nvidias_semantics() {
        let p = HealthPolicy::from_env(None, None, 1000).unwrap();
        assert!(!p.counts(13) && !p.counts(109) && p.counts(48) && p.counts(79));
        let p = HealthPolicy::from_env(Some("all"), None, 1000).unwrap();
        assert!(!p.counts(48));
        let p = HealthPolicy::from_env(Some("48, 94"), Some("13"), 1000).unwrap();
        assert!(!p.counts(48) && !p.counts(94) && p.counts(13) && p.counts(79));
        assert!(
            HealthPolicy::from_env(Some("x1"), None, 1)
                .unwrap_err()
                .to_string()
                .contains("DP_DISABLE_HEALTHCHECKS")
        );
    }

    #[test]
    fn xids_hit_their_gpu_or_mig_instance_and_recover_after_the_quiet_period() {
        let policy = HealthPolicy::from_env(None, None, 5_000).unwrap();
        let mut t = HealthTracker::default();
        assert!(
            !t.record(&policy, 0, None, None, 13, 0),
            "application XIDs do not count"
        );
        assert!(t.record(&policy, 1, None, None, 48, 1_000));
        assert!(t.record(&policy, 2, Some(7), Some(0), 94, 1_000));
        let mut rs = vec![resource(vec![
            device("GPU-0", 0, None),
            device("GPU-1", 1, None),
            device("MIG-2-7", 2, Some((7, 0))),
            device("MIG-2-8", 2, Some((8, 0))),
        ])];
        t.apply(&mut rs);
        let health: Vec<bool> = rs[0].devices.iter().map(|d| d.health_ok).collect();
        assert_eq!(health, vec![true, false, false, true]);
        assert_eq!(
            t.describe(),
            vec!["GPU 1: XID 48", "GPU 2 MIG gi 7 ci 0: XID 94"]
        );
        assert!(!t.expire(&policy, 5_999));
        assert!(t.expire(&policy, 6_000));
        let mut rs = vec![resource(vec![device("GPU-1", 1, None)])];
        t.apply(&mut rs);
        assert!(rs[0].devices[0].health_ok, "recovered");
        // A recurring XID restarts the quiet period.
        t.record(&policy, 1, None, None, 48, 10_000);
        t.record(&policy, 1, None, None, 48, 14_000);
        assert!(!t.expire(&policy, 18_000));
    }

    /// Where gpuops deliberately differs from NVIDIA's device plugin (docs/compatibility.md): an
    /// XID for the whole GPU marks every MIG device on it (NVIDIA's health.go keeps one device
    /// per parent UUID, the last registered, and marks that one), an XID naming an instance marks
    /// that instance only (NVIDIA's marks nothing unless it is that kept device), and nothing on
    /// another GPU is touched (NVIDIA's marks every device when the event wait fails).
    #[test]
    fn a_whole_gpu_xid_marks_all_its_mig_devices_and_only_them() {
        let policy = HealthPolicy::from_env(None, None, 5_000).unwrap();
        let mut t = HealthTracker::default();
        assert!(t.record(&policy, 2, None, None, 79, 1_000));
        let mut rs = vec![resource(vec![
            device("MIG-1-7", 1, Some((7, 0))),
            device("MIG-2-7", 2, Some((7, 0))),
            device("MIG-2-8", 2, Some((8, 0))),
            device("MIG-2-9", 2, Some((9, 1))),
            device("MIG-3-7", 3, Some((7, 0))),
        ])];
        t.apply(&mut rs);
        let health: Vec<bool> = rs[0].devices.iter().map(|d| d.health_ok).collect();
        assert_eq!(health, vec![true, false, false, false, true]);

        let mut t = HealthTracker::default();
        assert!(t.record(&policy, 2, Some(8), Some(0), 48, 1_000));
        let mut rs = vec![resource(vec![
            device("MIG-2-7", 2, Some((7, 0))),
            device("MIG-2-8", 2, Some((8, 0))),
            device("MIG-2-9", 2, Some((9, 1))),
        ])];
        t.apply(&mut rs);
        let health: Vec<bool> = rs[0].devices.iter().map(|d| d.health_ok).collect();
        assert_eq!(health, vec![true, false, true]);
    }
}
