//! `gpuops catalog`: the GPU models gpuops knows, and their MIG profiles.

use crate::output::{self, Format};
use anyhow::Result;
use gpuops_catalog::render;
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
    let text = match args.model {
        None => output::structured(gpuops_catalog::models(), args.output)?
            .unwrap_or_else(|| render::models_table(args.output.wide())),
        Some(name) => {
            let model = gpuops_catalog::lookup(&name)?;
            output::structured(model, args.output)?
                .unwrap_or_else(|| render::model(model, args.output.wide()))
        }
    };
    print!("{text}");
    Ok(ExitCode::SUCCESS)
}
