//! What changed between two snapshots, so the agent reports events rather than repeating state.

use gpuops_inventory::{Health, Inventory};
use std::fmt;

/// One change worth telling an operator about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    GpuAppeared {
        index: u32,
        uuid: String,
    },
    GpuDisappeared {
        index: u32,
        uuid: String,
    },
    HealthChanged {
        index: u32,
        uuid: String,
        from: String,
        to: String,
    },
    MigModeChanged {
        index: u32,
        enabled: bool,
    },
    MigLayoutChanged {
        index: u32,
        before: Vec<String>,
        after: Vec<String>,
    },
}

impl fmt::Display for Change {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Change::GpuAppeared { index, uuid } => write!(f, "GPU {index} ({uuid}) appeared"),
            Change::GpuDisappeared { index, uuid } => write!(f, "GPU {index} ({uuid}) disappeared"),
            Change::HealthChanged {
                index,
                uuid,
                from,
                to,
            } => {
                write!(f, "GPU {index} ({uuid}) health {from} -> {to}")
            }
            Change::MigModeChanged { index, enabled } => {
                write!(
                    f,
                    "GPU {index} MIG mode {}",
                    if *enabled { "enabled" } else { "disabled" }
                )
            }
            Change::MigLayoutChanged {
                index,
                before,
                after,
            } => write!(
                f,
                "GPU {index} MIG layout [{}] -> [{}]",
                before.join(", "),
                after.join(", ")
            ),
        }
    }
}

fn health_word(h: &Health) -> String {
    match h {
        Health::Healthy => "healthy".into(),
        Health::Lost => "lost".into(),
        Health::Unreachable { reason } => format!("unreachable ({reason})"),
    }
}

/// Changes from `before` to `after`, in GPU order.
pub fn changes(before: &Inventory, after: &Inventory) -> Vec<Change> {
    let mut out = Vec::new();
    for b in &before.gpus {
        if !after.gpus.iter().any(|a| a.index == b.index) {
            out.push(Change::GpuDisappeared {
                index: b.index,
                uuid: b.uuid.clone(),
            });
        }
    }
    for a in &after.gpus {
        let Some(b) = before.gpus.iter().find(|b| b.index == a.index) else {
            out.push(Change::GpuAppeared {
                index: a.index,
                uuid: a.uuid.clone(),
            });
            continue;
        };
        let uuid = if a.uuid.is_empty() {
            b.uuid.clone()
        } else {
            a.uuid.clone()
        };
        if a.health != b.health {
            out.push(Change::HealthChanged {
                index: a.index,
                uuid,
                from: health_word(&b.health),
                to: health_word(&a.health),
            });
            // A lost GPU reads as empty: its MIG state did not change, we just cannot see it.
            continue;
        }
        if a.mig.current_enabled != b.mig.current_enabled {
            out.push(Change::MigModeChanged {
                index: a.index,
                enabled: a.mig.current_enabled,
            });
        }
        let layout = |g: &gpuops_inventory::Gpu| -> Vec<String> {
            g.mig_devices
                .iter()
                .map(|m| format!("{}@{}", m.ci_profile, m.placement_start))
                .collect()
        };
        let (lb, la) = (layout(b), layout(a));
        if lb != la {
            out.push(Change::MigLayoutChanged {
                index: a.index,
                before: lb,
                after: la,
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuops_inventory::{Gpu, MigDevice, MigState};

    fn inv(gpus: Vec<Gpu>) -> Inventory {
        Inventory {
            gpus,
            ..Inventory::default()
        }
    }

    fn gpu(index: u32) -> Gpu {
        Gpu {
            index,
            uuid: format!("GPU-{index}"),
            ..Gpu::default()
        }
    }

    #[test]
    fn nothing_changed_means_no_changes() {
        let a = inv(vec![gpu(0), gpu(1)]);
        assert!(changes(&a, &a.clone()).is_empty());
    }

    #[test]
    fn lost_and_recovered_gpus_are_reported_with_their_uuid() {
        let before = inv(vec![gpu(0), gpu(1)]);
        let mut lost = Gpu {
            index: 1,
            health: Health::Lost,
            ..Gpu::default()
        };
        let after = inv(vec![gpu(0), lost.clone()]);
        let c = changes(&before, &after);
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].to_string(), "GPU 1 (GPU-1) health healthy -> lost");
        lost.uuid = "GPU-1".into();
        lost.health = Health::Healthy;
        assert_eq!(changes(&after, &inv(vec![gpu(0), lost])).len(), 1);
    }

    #[test]
    fn mig_mode_layout_and_gpu_count_changes() {
        let before = inv(vec![gpu(0), gpu(1)]);
        let mut g = gpu(0);
        g.mig = MigState {
            capable: true,
            current_enabled: true,
            pending_enabled: true,
        };
        g.mig_devices.push(MigDevice {
            ci_profile: "3g.40gb".into(),
            placement_start: 4,
            ..MigDevice::default()
        });
        let after = inv(vec![g, gpu(2)]);
        let text: Vec<String> = changes(&before, &after)
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(
            text,
            vec![
                "GPU 1 (GPU-1) disappeared",
                "GPU 0 MIG mode enabled",
                "GPU 0 MIG layout [] -> [3g.40gb@4]",
                "GPU 2 (GPU-2) appeared",
            ]
        );
    }
}
