//! `gpuops inventory`: what the node's GPUs are, once.

use crate::gpu_source::{self, GpuArgs};
use crate::output::{self, Format};
use anyhow::Result;
use std::process::ExitCode;

/// Print the GPUs this node has: identity, memory, MIG devices, topology and health.
///
/// Examples:
///   gpuops inventory --simulate dgx-h100
///   gpuops inventory --simulate hgx-h200 -o json
///   gpuops inventory                      (on a GPU node: reads the NVIDIA driver)
#[derive(Debug, clap::Args)]
#[command(verbatim_doc_comment)]
pub struct Args {
    #[command(flatten)]
    gpus: GpuArgs,
    /// Output format.
    #[arg(short, long, value_enum, default_value_t = Format::Table)]
    output: Format,
}

pub fn run(args: Args) -> Result<ExitCode> {
    let opened = gpu_source::open(&args.gpus)?;
    let inventory = opened.gpus.snapshot()?;
    match output::structured(&inventory, args.output)? {
        Some(text) => print!("{text}"),
        None => print!(
            "{}",
            gpuops_inventory::render::tables_with(&inventory, args.output.wide())
        ),
    }
    Ok(ExitCode::SUCCESS)
}
