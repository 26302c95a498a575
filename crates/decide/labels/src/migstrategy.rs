//! The `GPUMIGStrategyValid` node condition: whether the GPUs' MIG layout fits the device plugin's
//! MIG strategy. Under `single` a node with mixed profiles, mixed MIG modes or an empty
//! MIG-enabled GPU can offer nothing; GFD labels it `<product>-MIG-INVALID` with zero counts and
//! keeps running, and so does the agent, which says why here (and in an event when it changes).

use crate::health::{ConditionStatus, NodeCondition};
use gpuops_inventory::Inventory;
use gpuops_resources::config::{Config, MigStrategy};

/// The condition's type.
pub const MIG_STRATEGY_CONDITION: &str = "GPUMIGStrategyValid";
/// Its reason when the layout fits the strategy.
pub const MIG_LAYOUT_FITS: &str = "MIGLayoutFitsStrategy";
/// Its reason when it does not (strategy `single` only: `none` and `mixed` fit every layout).
pub const MIG_LAYOUT_INVALID: &str = "MIGLayoutInvalidForStrategy";

/// The condition for `inv` under `cfg`'s MIG strategy.
pub fn mig_strategy_condition(inv: &Inventory, cfg: &Config) -> NodeCondition {
    let strategy = cfg.mig_strategy();
    let name = strategy_name(strategy);
    match gpuops_resources::mig_strategy_check(inv, strategy) {
        Err(e) if gpuops_resources::is_invalid_mig_layout(&e) => NodeCondition {
            type_: MIG_STRATEGY_CONDITION.into(),
            status: ConditionStatus::False,
            reason: MIG_LAYOUT_INVALID.into(),
            message: format!(
                "{e}. Nothing is advertised and nvidia.com/gpu.product ends in -MIG-INVALID (as GFD labels it) until the layout or the strategy changes"
            ),
        },
        // Other errors are not about the layout; the feed and the labels report them.
        _ => NodeCondition {
            type_: MIG_STRATEGY_CONDITION.into(),
            status: ConditionStatus::True,
            reason: MIG_LAYOUT_FITS.into(),
            message: format!("the GPUs' MIG layout fits MIG strategy {name}"),
        },
    }
}

fn strategy_name(s: MigStrategy) -> &'static str {
    match s {
        MigStrategy::None => "none",
        MigStrategy::Single => "single",
        MigStrategy::Mixed => "mixed",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuops_inventory::{Gpu, MigDevice};

    fn gpu(index: u32, profiles: Option<&[&str]>) -> Gpu {
        let mut g = Gpu {
            index,
            uuid: format!("GPU-{index}"),
            name: "NVIDIA H100 80GB HBM3".into(),
            ..Gpu::default()
        };
        if let Some(profiles) = profiles {
            g.mig.capable = true;
            g.mig.current_enabled = true;
            g.mig_devices = profiles
                .iter()
                .enumerate()
                .map(|(i, p)| MigDevice {
                    index: i as u32,
                    uuid: format!("MIG-{index}-{i}"),
                    profile: (*p).into(),
                    ..MigDevice::default()
                })
                .collect();
        }
        g
    }

    fn cfg(yaml: &str) -> Config {
        Config::effective(
            Some(Config::parse(yaml, "test").unwrap()),
            &Default::default(),
            &Default::default(),
        )
        .unwrap()
    }

    #[test]
    fn single_with_mixed_profiles_is_false_and_says_why() {
        let inv = Inventory {
            gpus: vec![
                gpu(0, Some(&["3g.40gb", "2g.20gb"])),
                gpu(1, Some(&["1g.10gb"])),
            ],
            ..Inventory::default()
        };
        let c = mig_strategy_condition(&inv, &cfg("flags: {migStrategy: single}"));
        assert_eq!(c.type_, "GPUMIGStrategyValid");
        assert_eq!(c.status, ConditionStatus::False);
        assert_eq!(c.reason, "MIGLayoutInvalidForStrategy");
        assert!(c.message.contains("needs one MIG profile"), "{}", c.message);
        assert!(c.message.contains("-MIG-INVALID"), "{}", c.message);

        let mixed = mig_strategy_condition(&inv, &cfg("flags: {migStrategy: mixed}"));
        assert_eq!(
            (mixed.status, mixed.reason.as_str()),
            (ConditionStatus::True, "MIGLayoutFitsStrategy")
        );
        assert!(
            mixed.message.contains("strategy mixed"),
            "{}",
            mixed.message
        );
    }

    #[test]
    fn single_with_one_profile_or_no_mig_is_true() {
        let single = cfg("flags: {migStrategy: single}");
        for gpus in [
            vec![
                gpu(0, Some(&["1g.10gb", "1g.10gb"])),
                gpu(1, Some(&["1g.10gb"])),
            ],
            vec![gpu(0, None), gpu(1, None)],
        ] {
            let inv = Inventory {
                gpus,
                ..Inventory::default()
            };
            let c = mig_strategy_condition(&inv, &single);
            assert_eq!(c.status, ConditionStatus::True, "{c:?}");
        }
        // Mixed modes and an empty MIG GPU are invalid under single too.
        for gpus in [
            vec![gpu(0, Some(&["1g.10gb"])), gpu(1, None)],
            vec![gpu(0, Some(&["1g.10gb"])), gpu(1, Some(&[]))],
        ] {
            let inv = Inventory {
                gpus,
                ..Inventory::default()
            };
            let c = mig_strategy_condition(&inv, &single);
            assert_eq!(c.status, ConditionStatus::False, "{c:?}");
        }
    }
}
