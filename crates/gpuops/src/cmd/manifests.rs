//! `gpuops manifests` (being written).

use anyhow::Result;
use std::process::ExitCode;

/// Not available yet.
#[derive(Debug, clap::Args)]
pub struct Args {}

pub fn run(_args: Args) -> Result<ExitCode> {
    anyhow::bail!("gpuops manifests is not available yet")
}
