//! `gpuops mig validate`: checks each entry of a mig-parted config against the GPU models it can
//! select (or one forced model), pure.

use crate::MigError;
use crate::config::{self, Devices, MigPartedConfig};
use crate::layout::describe_counts;
use crate::planner;

/// The checks' lines (`ok`, `skip`, `note`, `FAIL`) and their tally.
#[derive(Debug, Default)]
pub struct Report {
    pub lines: Vec<String>,
    pub ok: usize,
    pub skipped: usize,
    pub failed: usize,
}

impl Report {
    /// The lines, then the tally, as `gpuops mig validate` prints them.
    pub fn text(&self) -> String {
        let mut out: String = self.lines.iter().map(|l| format!("{l}\n")).collect();
        out.push_str(&format!(
            "{} entries: {} ok, {} skipped (device-filter), {} failed\n",
            self.ok + self.skipped + self.failed,
            self.ok,
            self.skipped,
            self.failed
        ));
        out
    }
}

/// Checks config `only` (every config when `None`) for `forced` (every MIG-capable model the
/// entries' device-filters name, else every MIG-capable model).
pub fn check(
    cfg: &MigPartedConfig,
    only: Option<&str>,
    forced: Option<&'static gpuops_catalog::GpuModel>,
) -> Result<Report, MigError> {
    let mut report = Report::default();
    let lines = &mut report.lines;
    let names: Vec<String> = match only {
        Some(n) => vec![cfg.get(n)?.name.clone()],
        None => cfg.names().into_iter().map(str::to_string).collect(),
    };
    for name in names {
        let named = cfg.get(&name)?;
        for (i, entry) in named.entries.iter().enumerate() {
            let at = format!("{name} entry {} (line {})", i + 1, entry.line);
            if let Some(m) = forced
                && !filter_selects(&entry.filters, m)
            {
                let filters: Vec<String> = entry.filters.iter().map(ToString::to_string).collect();
                lines.push(format!(
                    "skip  {at}: device-filter {} does not select {}",
                    filters.join(", "),
                    m.key
                ));
                report.skipped += 1;
                continue;
            }
            if !entry.mig_enabled {
                lines.push(format!("ok    {at}: MIG disabled"));
                report.ok += 1;
                continue;
            }
            let unknown: Vec<String> = entry
                .filters
                .iter()
                .filter(|f| gpuops_catalog::by_pci_device_id((f.device >> 16) as u16).is_none())
                .map(ToString::to_string)
                .collect();
            if !unknown.is_empty() && forced.is_none() {
                lines.push(format!(
                    "note  {at}: device-filter {} names no GPU model gpuops knows; not checked for it",
                    unknown.join(", ")
                ));
            }
            let filtered: Vec<&'static gpuops_catalog::GpuModel> = entry
                .filters
                .iter()
                .filter_map(|f| gpuops_catalog::by_pci_device_id((f.device >> 16) as u16))
                .collect();
            let (models, strict): (Vec<&'static gpuops_catalog::GpuModel>, bool) = match forced {
                Some(m) => (vec![m], true),
                None if !filtered.is_empty() => (filtered, true),
                None => (
                    gpuops_catalog::models()
                        .iter()
                        .filter(|m| m.mig_capable())
                        .collect(),
                    false,
                ),
            };
            let devices = match &entry.devices {
                Devices::All => "all GPUs".to_string(),
                Devices::List(l) => format!("GPUs {l:?}"),
            };
            let wanted = describe_counts(&entry.mig_devices);
            let mut fits = Vec::new();
            let mut misfits = Vec::new();
            for m in models {
                match planner::check(m, &entry.mig_devices) {
                    Ok(_) => fits.push(m.key),
                    Err(e) => misfits.push(e.to_string()),
                }
            }
            if strict {
                for e in &misfits {
                    lines.push(format!("FAIL  {at}: {e}"));
                }
                if misfits.is_empty() {
                    lines.push(format!(
                        "ok    {at}: {wanted} on {devices} ({})",
                        fits.join(", ")
                    ));
                    report.ok += 1;
                } else {
                    report.failed += 1;
                }
            } else if fits.is_empty() {
                lines.push(format!("FAIL  {at}: {wanted} fits no MIG-capable GPU:"));
                for e in &misfits {
                    lines.push(format!("        {e}"));
                }
                report.failed += 1;
            } else {
                lines.push(format!(
                    "ok    {at}: {wanted} fits {} (pass --gpu MODEL to check one model)",
                    fits.join(", ")
                ));
                report.ok += 1;
            }
        }
    }
    Ok(report)
}

/// Whether an entry's device-filter lets a GPU of this model through: no filter selects every
/// model; otherwise one of the filters must name one of the model's PCI device ids (a filter's
/// subsystem part depends on the board, so a device-id match is taken to select it).
fn filter_selects(filters: &[config::DeviceFilter], model: &gpuops_catalog::GpuModel) -> bool {
    filters.is_empty()
        || filters.iter().any(|f| {
            f.device & 0xFFFF == 0x10DE && model.pci_device_ids.contains(&((f.device >> 16) as u16))
        })
}
