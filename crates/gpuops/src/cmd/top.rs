//! `gpuops top` (being written).

use anyhow::Result;
use std::process::ExitCode;

/// Not available yet.
#[derive(Debug, clap::Args)]
pub struct Args {}

pub fn run(_args: Args) -> Result<ExitCode> {
    anyhow::bail!("gpuops top is not available yet")
}
