//! `gpuops catalog`: the GPU models gpuops knows, and their MIG profiles.

use crate::output::{self, Columns, Format};
use anyhow::Result;
use std::process::ExitCode;

/// List known GPU models, or show one model's facts and MIG profiles.
///
/// Examples:
///   gpuops catalog
///   gpuops catalog h100-sxm5-80gb
///   gpuops catalog -o wide
///   gpuops catalog "NVIDIA H200" -o yaml
#[derive(Debug, clap::Args)]
#[command(verbatim_doc_comment)]
pub struct Args {
    /// A model key (case-insensitive) or the name NVML reports.
    model: Option<String>,
    /// Output format (`wide` adds PCI ids, power, NVLinks and MIG slices; per profile, engines).
    #[arg(short, long, value_enum, default_value_t = Format::Table)]
    output: Format,
}

pub fn run(args: Args) -> Result<ExitCode> {
    let Some(name) = args.model else {
        if let Some(text) = output::structured(&gpuops_catalog::models(), args.output)? {
            print!("{text}");
            return Ok(ExitCode::SUCCESS);
        }
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
            args.output.wide(),
        );
        for m in gpuops_catalog::models() {
            let ids: Vec<String> = m
                .pci_device_ids
                .iter()
                .map(|d| format!("0x{d:04X}"))
                .collect();
            t.row(vec![
                m.key.to_string(),
                m.nvml_name.to_string(),
                ids.join(","),
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
        let t = t.render();
        println!("{t}");
        return Ok(ExitCode::SUCCESS);
    };
    let model = gpuops_catalog::lookup(&name)?;
    if let Some(text) = output::structured(model, args.output)? {
        print!("{text}");
        return Ok(ExitCode::SUCCESS);
    }
    let ids: Vec<String> = model
        .pci_device_ids
        .iter()
        .map(|d| format!("0x{d:04X}"))
        .collect();
    println!(
        "{} ({}): {} MiB, {} SMs, compute {}.{}, {}, PCI {}, driver R{}+",
        model.key,
        model.nvml_name,
        model.memory_mib,
        model.sm_count,
        model.compute_capability.0,
        model.compute_capability.1,
        model.family.as_str(),
        ids.join("/"),
        model.min_driver_major
    );
    match &model.mig {
        None => println!("MIG: not supported"),
        Some(geo) => {
            println!(
                "MIG: {} memory slices, {} compute slices\n",
                geo.memory_slices, geo.compute_slices
            );
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
                args.output.wide(),
            );
            for p in geo.gi_profiles {
                let starts: Vec<String> = p.placement_starts.iter().map(u32::to_string).collect();
                let ci: Vec<String> = gpuops_catalog::ci_sizes(p.compute_slices)
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
            let t = t.render();
            println!("{t}");
        }
    }
    Ok(ExitCode::SUCCESS)
}
