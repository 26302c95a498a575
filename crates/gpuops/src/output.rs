//! Rendering for people (tables) and programs (`-o json|yaml`).

use anyhow::Result;
use comfy_table::{Table, presets};
use gpuops_inventory::{Health, Inventory, PcieLevel};
use serde::Serialize;

/// Output format of commands that print data, as kubectl spells them (`-o wide`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    Table,
    /// The table with the columns that do not fit a narrow terminal.
    Wide,
    Json,
    Yaml,
}

impl Format {
    /// Whether a table should carry its extra columns.
    pub fn wide(self) -> bool {
        self == Format::Wide
    }
}

/// Serialises for `-o json|yaml`; `None` for tables (plain or wide), which each command renders
/// itself.
pub fn structured<T: Serialize>(value: &T, format: Format) -> Result<Option<String>> {
    Ok(match format {
        Format::Json => Some(serde_json::to_string_pretty(value)? + "\n"),
        Format::Yaml => Some(serde_saphyr::to_string(value)?),
        Format::Table | Format::Wide => None,
    })
}

/// A table whose `wide` columns appear only with `-o wide`, like kubectl's: rows are given with
/// every column and the narrow view drops the wide ones.
pub struct Columns {
    header: Vec<(&'static str, bool)>,
    rows: Vec<Vec<String>>,
    wide: bool,
}

impl Columns {
    /// `header` pairs each column name with whether it is a wide-only column.
    pub fn new(header: &[(&'static str, bool)], wide: bool) -> Columns {
        Columns {
            header: header.to_vec(),
            rows: Vec::new(),
            wide,
        }
    }

    /// A row with a cell for every column, wide ones included.
    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    fn keep(&self, i: usize) -> bool {
        self.wide || self.header.get(i).is_some_and(|(_, wide)| !wide)
    }

    /// The rendered table.
    pub fn render(&self) -> String {
        let names: Vec<&str> = self
            .header
            .iter()
            .enumerate()
            .filter(|(i, _)| self.keep(*i))
            .map(|(_, (n, _))| *n)
            .collect();
        let mut t = table(&names);
        for r in &self.rows {
            t.add_row(
                r.iter()
                    .enumerate()
                    .filter(|(i, _)| self.keep(*i))
                    .map(|(_, c)| c.clone())
                    .collect::<Vec<_>>(),
            );
        }
        t.to_string()
    }
}

/// A borderless, kubectl-style table.
pub fn table(header: &[&str]) -> Table {
    let mut t = Table::new();
    t.load_preset(presets::NOTHING).set_header(header.to_vec());
    t
}

fn opt<T: std::fmt::Display>(v: Option<T>, unit: &str) -> String {
    v.map_or_else(|| "-".into(), |v| format!("{v}{unit}"))
}

fn health(h: &Health) -> String {
    match h {
        Health::Healthy => "ok".into(),
        Health::Lost => "LOST (fell off the bus)".into(),
        Health::Unreachable { reason } => format!("ERROR: {reason}"),
    }
}

/// The inventory as tables: GPUs, MIG devices, topology.
pub fn inventory_tables(inv: &Inventory) -> String {
    inventory_tables_with(inv, false)
}

/// [`inventory_tables`]; `wide` adds model, compute capability, SMs, serial and PCI ids to the
/// GPU table and the placement start to the MIG table (`-o wide`).
pub fn inventory_tables_with(inv: &Inventory, wide: bool) -> String {
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
    use gpuops_inventory::{Gpu, GpuLink};

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
        let text = inventory_tables(&inv());
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
        let narrow = inventory_tables_with(&i, false);
        let wide = inventory_tables_with(&i, true);
        for column in ["MODEL", "PCI ID", "SERIAL", "CC", "SMS"] {
            assert!(!narrow.contains(column), "{column} in narrow:\n{narrow}");
            assert!(wide.contains(column), "{column} not in wide:\n{wide}");
        }
        assert!(
            wide.contains("0x27B810DE") && wide.contains("8.9"),
            "{wide}"
        );
        assert_eq!(narrow, inventory_tables(&i));
        assert!(structured(&i, Format::Wide).unwrap().is_none());
    }

    #[test]
    fn structured_output_round_trips() {
        let json = structured(&inv(), Format::Json).unwrap().unwrap();
        let back: Inventory = serde_json::from_str(&json).unwrap();
        assert_eq!(back, inv());
        let yaml = structured(&inv(), Format::Yaml).unwrap().unwrap();
        assert!(structured(&inv(), Format::Table).unwrap().is_none());
        let back: Inventory = serde_saphyr::from_str(&yaml).unwrap();
        assert_eq!(back, inv());
    }
}
