//! The catalog as `gpuops catalog` prints it: every model, or one model with its MIG profiles.

use crate::{GpuModel, ci_sizes, models};
use gpuops_render::Columns;

fn pci_ids(m: &GpuModel) -> Vec<String> {
    m.pci_device_ids
        .iter()
        .map(|d| format!("0x{d:04X}"))
        .collect()
}

/// One row per known model; `wide` adds PCI ids, MIG slices, power and NVLinks.
pub fn models_table(wide: bool) -> String {
    let mut t = Columns::new(
        &[
            ("MODEL", false),
            ("NVML NAME", false),
            ("PCI IDS", true),
            ("MEMORY (MiB)", false),
            ("SMS", false),
            ("CC", false),
            ("FAMILY", false),
            ("MIG", false),
            ("MIG SLICES", true),
            ("POWER", true),
            ("NVLINKS", true),
            ("MIN DRIVER", false),
        ],
        wide,
    );
    for m in models() {
        t.row(vec![
            m.key.to_string(),
            m.nvml_name.to_string(),
            pci_ids(m).join(","),
            m.memory_mib.to_string(),
            m.sm_count.to_string(),
            format!("{}.{}", m.compute_capability.0, m.compute_capability.1),
            m.family.as_str().to_string(),
            if m.mig_capable() { "yes" } else { "no" }.to_string(),
            m.mig.as_ref().map_or_else(
                || "-".to_string(),
                |g| format!("{}m/{}c", g.memory_slices, g.compute_slices),
            ),
            format!("{}W", m.power_limit_mw / 1000),
            m.nvlinks.to_string(),
            format!("R{}", m.min_driver_major),
        ]);
    }
    t.render() + "\n"
}

/// One model's facts, then its MIG profiles; `wide` adds each profile's engines.
pub fn model(model: &GpuModel, wide: bool) -> String {
    let mut out = format!(
        "{} ({}): {} MiB, {} SMs, compute {}.{}, {}, PCI {}, driver R{}+\n",
        model.key,
        model.nvml_name,
        model.memory_mib,
        model.sm_count,
        model.compute_capability.0,
        model.compute_capability.1,
        model.family.as_str(),
        pci_ids(model).join("/"),
        model.min_driver_major
    );
    let Some(geo) = &model.mig else {
        out.push_str("MIG: not supported\n");
        return out;
    };
    out.push_str(&format!(
        "MIG: {} memory slices, {} compute slices\n\n",
        geo.memory_slices, geo.compute_slices
    ));
    let mut t = Columns::new(
        &[
            ("PROFILE", false),
            ("ID", false),
            ("ENUM", false),
            ("MAX", false),
            ("MEM SLICES", false),
            ("PLACEMENTS", false),
            ("MEMORY (MiB)", false),
            ("SMS", false),
            ("CI SIZES", false),
            ("CE", true),
            ("DEC", true),
            ("ENC", true),
            ("JPG", true),
            ("OFA", true),
        ],
        wide,
    );
    for p in geo.gi_profiles {
        let starts: Vec<String> = p.placement_starts.iter().map(u32::to_string).collect();
        let ci: Vec<String> = ci_sizes(p.compute_slices)
            .iter()
            .map(u32::to_string)
            .collect();
        t.row(vec![
            p.name.to_string(),
            p.nvml_id.to_string(),
            p.nvml_enum.to_string(),
            p.max_count.to_string(),
            p.memory_slices.to_string(),
            starts.join(","),
            p.memory_mib.to_string(),
            p.sm_count.to_string(),
            ci.join(","),
            p.copy_engines.to_string(),
            p.decoders.to_string(),
            p.encoders.to_string(),
            p.jpegs.to_string(),
            p.ofas.to_string(),
        ]);
    }
    out + &t.render() + "\n"
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wide_adds_engines_and_ids() {
        let h100 = crate::lookup("h100-sxm5-80gb").unwrap();
        let narrow = model(h100, false);
        let wide = model(h100, true);
        assert!(
            narrow.contains("1g.10gb") && !narrow.contains(" OFA"),
            "{narrow}"
        );
        assert!(wide.contains(" OFA"), "{wide}");
        assert!(!models_table(false).contains("PCI IDS"));
        assert!(models_table(true).contains("PCI IDS"));
        let l4 = model(crate::lookup("l4").unwrap(), false);
        assert!(l4.ends_with("MIG: not supported\n"), "{l4}");
    }
}
