//! The inventory as the tables `gpuops inventory` and `gpuops agent` print.

use crate::{Health, Inventory, PcieLevel};
use gpuops_render::comfy_table::{Table, presets};
use gpuops_render::{Columns, opt, table};

fn health(h: &Health) -> String {
    match h {
        Health::Healthy => "ok".into(),
        Health::Lost => "LOST (fell off the bus)".into(),
        Health::Unreachable { reason } => format!("ERROR: {reason}"),
    }
}

/// The inventory as tables: GPUs, MIG devices, topology.
pub fn tables(inv: &Inventory) -> String {
    tables_with(inv, false)
}

/// [`tables`]; `wide` adds model, compute capability, SMs, serial and PCI ids to the
/// GPU table and the placement start to the MIG table (`-o wide`).
pub fn tables_with(inv: &Inventory, wide: bool) -> String {
    let mut out = format!(
        "Driver {}  CUDA {}  NVML {}  GPUs {}\n\n",
        inv.driver_version,
        inv.cuda_driver_version,
        inv.nvml_version,
        inv.gpus.len()
    );
    let mut t = Columns::new(
        &[
            ("GPU", false),
            ("NAME", false),
            ("MODEL", true),
            ("UUID", false),
            ("BUS ID", false),
            ("PCI ID", true),
            ("SERIAL", true),
            ("CC", true),
            ("SMS", true),
            ("MEMORY (MiB)", false),
            ("UTIL", false),
            ("TEMP", false),
            ("POWER", false),
            ("NUMA", false),
            ("MIG", false),
            ("HEALTH", false),
        ],
        wide,
    );
    for g in &inv.gpus {
        let mig = match (g.mig.capable, g.mig.current_enabled) {
            (false, _) => "n/a".to_string(),
            (true, false) => "off".to_string(),
            (true, true) => format!("on ({} dev)", g.mig_devices.len()),
        };
        let memory = if g.memory.total_mib > 0 {
            format!("{} / {}", g.memory.used_mib, g.memory.total_mib)
        } else {
            "-".into()
        };
        t.row(vec![
            g.index.to_string(),
            if g.name.is_empty() {
                "?".into()
            } else {
                g.name.clone()
            },
            g.model.clone().unwrap_or_else(|| "-".into()),
            if g.uuid.is_empty() {
                "?".into()
            } else {
                g.uuid.clone()
            },
            if g.pci_bus_id.is_empty() {
                "-".into()
            } else {
                g.pci_bus_id.clone()
            },
            if g.pci_device_id == 0 {
                "-".into()
            } else {
                format!("0x{:08X}", g.pci_device_id)
            },
            g.serial.clone().unwrap_or_else(|| "-".into()),
            g.compute_capability
                .map_or_else(|| "-".into(), |(a, b)| format!("{a}.{b}")),
            opt(g.sm_count, ""),
            memory,
            opt(g.telemetry.gpu_utilization_pct, "%"),
            opt(g.telemetry.temperature_c, "C"),
            opt(g.telemetry.power_mw.map(|mw| mw / 1000), "W"),
            opt(g.numa_node, ""),
            mig,
            health(&g.health),
        ]);
    }
    out.push_str(&t.render());
    out.push('\n');
    let mig_rows: Vec<_> = inv
        .gpus
        .iter()
        .flat_map(|g| g.mig_devices.iter().map(move |m| (g, m)))
        .collect();
    if !mig_rows.is_empty() {
        let mut t = table(&[
            "MIG DEVICE",
            "PROFILE",
            "UUID",
            "GI",
            "CI",
            "SLICES",
            "MEMORY (MiB)",
            "SMS",
        ]);
        for (g, m) in mig_rows {
            t.add_row(vec![
                format!("{}:{}", g.index, m.index),
                m.ci_profile.clone(),
                m.uuid.clone(),
                m.gi_id.to_string(),
                m.ci_id.to_string(),
                format!(
                    "{}-{}",
                    m.placement_start,
                    m.placement_start + m.placement_size - 1
                ),
                m.memory_mib.to_string(),
                m.sm_count.to_string(),
            ]);
        }
        out.push('\n');
        out.push_str(&t.to_string());
        out.push('\n');
    }
    if inv.gpus.len() > 1 && !inv.topology.is_empty() {
        out.push('\n');
        out.push_str(&topology_matrix(inv));
    }
    for w in &inv.warnings {
        out.push_str(&format!("warning: {w}\n"));
    }
    out
}

/// `nvidia-smi topo -m` style matrix: NV<n> for NVLink, else the PCIe relation.
fn topology_matrix(inv: &Inventory) -> String {
    let idx: Vec<u32> = inv.gpus.iter().map(|g| g.index).collect();
    let mut header = vec!["TOPOLOGY".to_string()];
    header.extend(idx.iter().map(|i| format!("GPU{i}")));
    let mut t = Table::new();
    t.load_preset(presets::NOTHING).set_header(header);
    for &a in &idx {
        let mut row = vec![format!("GPU{a}")];
        for &b in &idx {
            row.push(if a == b {
                "X".into()
            } else {
                match inv.link(a, b) {
                    None => "-".into(),
                    Some(l) if l.nvlinks > 0 => format!("NV{}", l.nvlinks),
                    Some(l) => match l.pcie {
                        PcieLevel::SameBoard => "SELF",
                        PcieLevel::SingleSwitch => "PIX",
                        PcieLevel::MultipleSwitches => "PXB",
                        PcieLevel::HostBridge => "PHB",
                        PcieLevel::SameNumaNode => "NODE",
                        PcieLevel::CrossCpu => "SYS",
                    }
                    .into(),
                }
            });
        }
        t.add_row(row);
    }
    t.to_string() + "\n"
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Gpu, GpuLink};

    fn inv() -> Inventory {
        let gpu = |i: u32| Gpu {
            index: i,
            uuid: format!("GPU-{i}"),
            name: "NVIDIA L4".into(),
            ..Gpu::default()
        };
        let mut lost = gpu(2);
        lost.health = Health::Lost;
        Inventory {
            driver_version: "580.105.08".into(),
            gpus: vec![gpu(0), gpu(1), lost],
            topology: vec![GpuLink {
                a: 0,
                b: 1,
                nvlinks: 0,
                pcie: PcieLevel::SingleSwitch,
            }],
            warnings: vec!["GPU 2 is odd".into()],
            ..Inventory::default()
        }
    }

    #[test]
    fn tables_show_health_topology_and_warnings() {
        let text = tables(&inv());
        assert!(text.contains("Driver 580.105.08"), "{text}");
        assert!(text.contains("LOST (fell off the bus)"), "{text}");
        assert!(text.contains("PIX"), "{text}");
        assert!(text.contains("warning: GPU 2 is odd"), "{text}");
        assert!(
            !text.contains("MIG DEVICE"),
            "no MIG table without MIG devices"
        );
    }

    #[test]
    fn wide_adds_columns_and_plain_keeps_the_narrow_table() {
        let mut i = inv();
        i.gpus[0].model = Some("L4".into());
        i.gpus[0].pci_device_id = 0x27B8_10DE;
        i.gpus[0].compute_capability = Some((8, 9));
        let narrow = tables_with(&i, false);
        let wide = tables_with(&i, true);
        for column in ["MODEL", "PCI ID", "SERIAL", "CC", "SMS"] {
            assert!(!narrow.contains(column), "{column} in narrow:\n{narrow}");
            assert!(wide.contains(column), "{column} not in wide:\n{wide}");
        }
        assert!(
            wide.contains("0x27B810DE") && wide.contains("8.9"),
            "{wide}"
        );
        assert_eq!(narrow, tables(&i));
    }

    #[test]
    fn structured_output_round_trips() {
        use gpuops_render::{Format, structured};
        assert!(structured(&inv(), Format::Wide).unwrap().is_none());
        let json = structured(&inv(), Format::Json).unwrap().unwrap();
        let back: Inventory = serde_json::from_str(&json).unwrap();
        assert_eq!(back, inv());
        let yaml = structured(&inv(), Format::Yaml).unwrap().unwrap();
        assert!(structured(&inv(), Format::Table).unwrap().is_none());
        let back: Inventory = serde_saphyr::from_str(&yaml).unwrap();
        assert_eq!(back, inv());
    }
}
