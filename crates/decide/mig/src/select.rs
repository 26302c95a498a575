//! Which GPUs of a node each entry of a named mig-parted config applies to, and the MIG state each
//! selected GPU should end up in.
//!
//! mig-parted's rules: entries apply in order and a later entry overrides an earlier one for the
//! same GPU; an entry selects a GPU when the GPU matches one of its device filters (no filter
//! matches every GPU) and the entry says `devices: all` or lists the GPU's index. GPUs without
//! MIG support are skipped under `all`; listing one explicitly in an entry with `mig-enabled: true`
//! is an error. GPUs no entry selects are left alone.

use crate::MigError;
use crate::config::{Devices, NamedConfig};
use gpuops_inventory::Gpu;
use std::collections::BTreeMap;

/// The MIG state one GPU should have under a config.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Selected {
    /// NVML index of the GPU.
    pub gpu: u32,
    pub mig_enabled: bool,
    /// Canonical profile name to count; empty when `mig_enabled` is false.
    pub mig_devices: BTreeMap<String, u32>,
    /// Index (0-based) in [`NamedConfig::entries`] of the entry that decided this GPU.
    pub entry: usize,
}

fn gpu_name(gpu: &Gpu) -> String {
    if !gpu.name.is_empty() {
        gpu.name.clone()
    } else if let Some(model) = &gpu.model {
        model.clone()
    } else {
        "unknown model".into()
    }
}

/// The GPUs `config` applies to and the state each should have, sorted by GPU index.
///
/// A GPU listed explicitly but excluded by the entry's device filter is not selected (the filter
/// and the list must both match). A non-MIG-capable GPU listed in an entry with
/// `mig-enabled: false` is not selected either: it has no MIG mode to change.
pub fn select(config: &NamedConfig, gpus: &[Gpu]) -> Result<Vec<Selected>, MigError> {
    let mut chosen: BTreeMap<u32, Selected> = BTreeMap::new();
    for (i, entry) in config.entries.iter().enumerate() {
        let matches_filter = |gpu: &Gpu| {
            entry.filters.is_empty()
                || entry
                    .filters
                    .iter()
                    .any(|f| f.matches(gpu.pci_device_id, gpu.pci_subsystem_id))
        };
        let targets: Vec<&Gpu> = match &entry.devices {
            Devices::All => gpus
                .iter()
                .filter(|g| g.mig.capable && matches_filter(g))
                .collect(),
            Devices::List(indices) => {
                let mut targets = Vec::new();
                for &index in indices {
                    let Some(gpu) = gpus.iter().find(|g| g.index == index) else {
                        let mut have: Vec<u32> = gpus.iter().map(|g| g.index).collect();
                        have.sort_unstable();
                        have.dedup();
                        return Err(MigError::ListedGpuMissing {
                            config: config.name.clone(),
                            entry: i + 1,
                            line: entry.line,
                            index,
                            indices: have,
                        });
                    };
                    if !matches_filter(gpu) {
                        continue;
                    }
                    if !gpu.mig.capable {
                        if entry.mig_enabled {
                            return Err(MigError::NotMigCapable {
                                config: config.name.clone(),
                                entry: i + 1,
                                line: entry.line,
                                index,
                                name: gpu_name(gpu),
                            });
                        }
                        continue;
                    }
                    targets.push(gpu);
                }
                targets
            }
        };
        for gpu in targets {
            chosen.insert(
                gpu.index,
                Selected {
                    gpu: gpu.index,
                    mig_enabled: entry.mig_enabled,
                    mig_devices: if entry.mig_enabled {
                        entry.mig_devices.clone()
                    } else {
                        BTreeMap::new()
                    },
                    entry: i,
                },
            );
        }
    }
    Ok(chosen.into_values().collect())
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use crate::config::{DeviceFilter, DeviceSpec};
    use gpuops_inventory::MigState;

    const H100: u32 = 0x2330_10DE;
    const A100: u32 = 0x20B2_10DE;
    const L4: u32 = 0x27B8_10DE;

    fn gpu(index: u32, pci: u32, subsystem: u32) -> Gpu {
        let (name, capable) = match pci {
            H100 => ("NVIDIA H100 80GB HBM3", true),
            A100 => ("NVIDIA A100-SXM4-80GB", true),
            _ => ("NVIDIA L4", false),
        };
        Gpu {
            index,
            name: name.into(),
            pci_device_id: pci,
            pci_subsystem_id: subsystem,
            mig: MigState {
                capable,
                ..MigState::default()
            },
            ..Gpu::default()
        }
    }

    fn spec(devices: Devices, filters: &[&str], mig: Option<&[(&str, u32)]>) -> DeviceSpec {
        DeviceSpec {
            devices,
            filters: filters.iter().map(|f| f.parse().unwrap()).collect(),
            mig_enabled: mig.is_some(),
            mig_devices: mig
                .unwrap_or(&[])
                .iter()
                .map(|(p, n)| ((*p).to_string(), *n))
                .collect(),
            line: 0,
        }
    }

    fn named(entries: Vec<DeviceSpec>) -> NamedConfig {
        NamedConfig {
            name: "test".into(),
            entries: entries
                .into_iter()
                .enumerate()
                .map(|(i, mut e)| {
                    e.line = 3 + 4 * i as u64;
                    e
                })
                .collect(),
        }
    }

    /// `gpu:entry:state` per selected GPU, state `off` or the counts.
    fn summary(sel: &[Selected]) -> Vec<String> {
        sel.iter()
            .map(|s| {
                let state = if s.mig_enabled {
                    s.mig_devices
                        .iter()
                        .map(|(p, n)| format!("{n}x{p}"))
                        .collect::<Vec<_>>()
                        .join("+")
                } else {
                    "off".into()
                };
                format!("{}:{}:{state}", s.gpu, s.entry)
            })
            .collect()
    }

    #[test]
    fn selection_table() {
        let mixed = vec![
            gpu(0, H100, 0x16C1_10DE),
            gpu(1, H100, 0x16C2_10DE),
            gpu(2, A100, 0x1463_10DE),
            gpu(3, L4, 0),
        ];
        let small: &[(&str, u32)] = &[("1g.10gb", 7)];
        let big: &[(&str, u32)] = &[("3g.40gb", 2)];
        let empty: &[(&str, u32)] = &[];
        type Case = (&'static str, Vec<DeviceSpec>, Vec<&'static str>);
        let cases: Vec<Case> = vec![
            (
                "all skips the non-MIG GPU",
                vec![spec(Devices::All, &[], Some(small))],
                vec!["0:0:7x1g.10gb", "1:0:7x1g.10gb", "2:0:7x1g.10gb"],
            ),
            (
                "all-disabled also skips it",
                vec![spec(Devices::All, &[], None)],
                vec!["0:0:off", "1:0:off", "2:0:off"],
            ),
            (
                "mig-enabled with no devices",
                vec![spec(Devices::List(vec![1]), &[], Some(empty))],
                vec!["1:0:"],
            ),
            (
                "filter by device id",
                vec![spec(Devices::All, &["0x233010DE"], Some(small))],
                vec!["0:0:7x1g.10gb", "1:0:7x1g.10gb"],
            ),
            (
                "any of several filters",
                vec![spec(Devices::All, &["0x20B210DE", "0x233010DE"], Some(big))],
                vec!["0:0:2x3g.40gb", "1:0:2x3g.40gb", "2:0:2x3g.40gb"],
            ),
            (
                "filter with subsystem",
                vec![spec(Devices::All, &["0x233010DE:0x16C210DE"], Some(big))],
                vec!["1:0:2x3g.40gb"],
            ),
            (
                "filter that matches nothing",
                vec![spec(Devices::All, &["0x290110DE"], Some(big))],
                vec![],
            ),
            (
                "listed indices",
                vec![spec(Devices::List(vec![2, 0]), &[], Some(small))],
                vec!["0:0:7x1g.10gb", "2:0:7x1g.10gb"],
            ),
            (
                "list and filter must both match",
                vec![spec(
                    Devices::List(vec![0, 2]),
                    &["0x233010DE"],
                    Some(small),
                )],
                vec!["0:0:7x1g.10gb"],
            ),
            (
                "later entries override earlier ones",
                vec![
                    spec(Devices::All, &[], Some(small)),
                    spec(Devices::List(vec![1]), &[], Some(big)),
                    spec(Devices::All, &["0x20B210DE"], None),
                ],
                vec!["0:0:7x1g.10gb", "1:1:2x3g.40gb", "2:2:off"],
            ),
            (
                "non-MIG GPU listed with mig-enabled false is left alone",
                vec![spec(Devices::List(vec![3, 0]), &[], None)],
                vec!["0:0:off"],
            ),
            (
                "non-MIG GPU listed but filtered out is no error",
                vec![spec(Devices::List(vec![3]), &["0x233010DE"], Some(small))],
                vec![],
            ),
        ];
        for (what, entries, want) in cases {
            let got = select(&named(entries), &mixed).unwrap_or_else(|e| panic!("{what}: {e}"));
            assert_eq!(summary(&got), want, "{what}");
        }
    }

    #[test]
    fn errors_table() {
        let mixed = vec![
            gpu(0, H100, 0),
            gpu(1, H100, 0),
            gpu(2, A100, 0),
            gpu(3, L4, 0),
        ];
        let gappy = [mixed[0].clone(), mixed[2].clone()];
        let small: &[(&str, u32)] = &[("1g.10gb", 7)];
        let cases: Vec<(&str, Vec<DeviceSpec>, &[Gpu], &str)> = vec![
            (
                "non-MIG GPU listed with mig-enabled",
                vec![
                    spec(Devices::All, &[], None),
                    spec(Devices::List(vec![0, 3]), &[], Some(small)),
                ],
                &mixed,
                "config test entry 2 (line 7): GPU 3 (NVIDIA L4) does not support MIG",
            ),
            (
                "index past the end",
                vec![spec(Devices::List(vec![4]), &[], Some(small))],
                &mixed,
                "config test entry 1 (line 3): GPU 4 is listed in devices, but this node has 4 GPUs (0-3)",
            ),
            (
                "index on a node with gaps",
                vec![spec(Devices::List(vec![1]), &[], None)],
                &gappy,
                "config test entry 1 (line 3): GPU 1 is listed in devices, but this node has 2 GPUs (0, 2)",
            ),
            (
                "no GPUs at all",
                vec![spec(Devices::List(vec![0]), &[], None)],
                &[],
                "config test entry 1 (line 3): GPU 0 is listed in devices, but this node has no GPUs",
            ),
            (
                "single GPU",
                vec![spec(Devices::List(vec![1]), &[], None)],
                &mixed[..1],
                "config test entry 1 (line 3): GPU 1 is listed in devices, but this node has 1 GPU (0)",
            ),
        ];
        for (what, entries, gpus, want) in cases {
            match select(&named(entries), gpus) {
                Ok(got) => panic!("{what}: expected an error, got {got:?}"),
                Err(e) => assert_eq!(e.to_string(), want, "{what}"),
            }
        }
    }

    #[test]
    fn unknown_name_falls_back_to_model() {
        let mut g = gpu(3, L4, 0);
        g.name.clear();
        g.model = Some("L4".into());
        let c = named(vec![spec(Devices::List(vec![3]), &[], Some(&[]))]);
        let e = select(&c, &[g.clone()]).unwrap_err();
        assert!(
            e.to_string().ends_with("GPU 3 (L4) does not support MIG"),
            "{e}"
        );
        g.model = None;
        let mut c = c;
        c.entries[0].line = 0;
        let e = select(&c, &[g]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "config test entry 1: GPU 3 (unknown model) does not support MIG"
        );
    }

    #[test]
    fn filters_use_full_ids() {
        let f = DeviceFilter::nvidia(0x2330);
        assert!(f.matches(H100, 0));
        assert!(!f.matches(A100, 0));
    }
}
