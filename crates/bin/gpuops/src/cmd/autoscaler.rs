//! `gpuops autoscaler status`: reads the controller's status ConfigMap.

use crate::output::{self, Format};
use anyhow::{Context, Result};
use std::process::ExitCode;

/// Inspect the GPU node-pool autoscaler (`gpuops controller`).
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, clap::Subcommand)]
enum Command {
    /// Pools, nodes in flight with their stage, pending GPU pods with the plan for each, and the
    /// last decisions, from the controller's status ConfigMap.
    Status(StatusArgs),
}

#[derive(Debug, clap::Args)]
struct StatusArgs {
    #[command(flatten)]
    kube: super::flags::KubeArgs,
    /// Namespace the controller runs in.
    #[arg(long, short = 'n', env = "GPUOPS_NAMESPACE", default_value = "gpuops")]
    namespace: String,
    /// Output format.
    #[arg(short, long, value_enum, default_value_t = Format::Table)]
    output: Format,
}

pub fn run(args: Args) -> Result<ExitCode> {
    let Command::Status(a) = args.command;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let status = runtime.block_on(async {
        let client = a.kube.client().await?;
        gpuops_controller::run::read_status(&client, &a.namespace)
            .await
            .context("is `gpuops controller` running in this namespace (--namespace)?")
    })?;
    match output::structured(&status, a.output)? {
        Some(text) => print!("{text}"),
        None => print!("{}", gpuops_controller::status::render_table(&status)),
    }
    Ok(ExitCode::SUCCESS)
}
