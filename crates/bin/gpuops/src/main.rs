//! gpuops: one binary for the GPU node agent, the cluster controller and the CLI.
//!
//! Installed as `kubectl-gpu` it also works as a kubectl plugin (`kubectl gpu ...`).

mod cmd;
mod gpu_source;
use gpuops_render as output;

use clap::{CommandFactory, Parser, Subcommand};
use std::process::ExitCode;

/// `0.1.0 (commit 1a2b3c4d5e6f)`: the commit comes from build.rs (`unknown` without git).
const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("GPUOPS_GIT_COMMIT"),
    ")"
);

/// Resilient, cost-effective GPU clusters on Kubernetes: node agent, MIG partitioning, metrics and
/// diagnosis in one binary.
///
/// Start here without a GPU or a cluster:
///   gpuops agent --simulate dgx-h100        run the node agent on a simulated 8x H100 node
///   gpuops inventory --simulate dgx-h100    print what the agent sees, once
#[derive(Debug, Parser)]
#[command(
    name = "gpuops",
    version = VERSION,
    propagate_version = true,
    verbatim_doc_comment
)]
struct Cli {
    /// Log filter (e.g. `info`, `gpuops_agent=debug`); also read from RUST_LOG [default: `info`
    /// for `agent` and `exporter`, whose events are their output; `warn` for the rest].
    #[arg(long, global = true, env = "GPUOPS_LOG")]
    log: Option<String>,
    /// Log lines as `text` or `json` (one object per line with the event's fields, for log
    /// pipelines).
    #[arg(long, global = true, env = "GPUOPS_LOG_FORMAT", default_value = "text", value_parser = ["text", "json"])]
    log_format: String,
    #[command(subcommand)]
    command: Command,
}

// Parsed once at start-up and moved out at once: the size difference costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
enum Command {
    Agent(cmd::agent::Args),
    Exporter(cmd::agent::ExporterArgs),
    Inventory(cmd::inventory::Args),
    Sim(cmd::sim::Args),
    Mig(cmd::mig::Args),
    Migrate(cmd::migrate::Args),
    Catalog(cmd::catalog::Args),
    Cdi(cmd::cdi::Args),
    Simulate(cmd::simulate::Args),
    SchedulerExtender(cmd::extender::Args),
    Controller(cmd::controller::Args),
    Autoscaler(cmd::autoscaler::Args),
    Doctor(cmd::doctor::Args),
    Top(cmd::top::Args),
    Manifests(cmd::manifests::Args),
    Completion(cmd::completion::CompletionArgs),
    Man(cmd::completion::ManArgs),
}

/// `gpuops catalog | head -1`: once the reader is gone, end as coreutils do (killed by SIGPIPE,
/// status 141) instead of panicking in `println!`. Rust ignores SIGPIPE so that a write to a
/// closed socket is an error, not death; the servers (agent, exporter, extender) keep that.
fn die_quietly_on_broken_pipe() {
    // SAFETY: called once at start-up, before any thread exists; SIG_DFL is a valid disposition
    // and no handler runs Rust code.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

fn main() -> ExitCode {
    // kubectl runs plugins as `kubectl-gpu`: same binary, same commands.
    let cli = Cli::parse();
    let default_level = match cli.command {
        // `agent --once` prints and exits like any CLI command.
        Command::Agent(ref a) if a.once() => {
            die_quietly_on_broken_pipe();
            "info"
        }
        Command::Agent(_)
        | Command::Exporter(_)
        | Command::SchedulerExtender(_)
        | Command::Controller(_) => "info",
        _ => {
            die_quietly_on_broken_pipe();
            "warn"
        }
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .or_else(|_| {
            tracing_subscriber::EnvFilter::try_new(cli.log.as_deref().unwrap_or(default_level))
        })
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_level));
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    if cli.log_format == "json" {
        logs.json().init();
    } else {
        // Colour codes only for a terminal: logs piped to files and collectors stay plain.
        logs.with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .init();
    }
    let result = match cli.command {
        Command::Agent(args) => cmd::agent::run(args),
        Command::Exporter(args) => cmd::agent::run_exporter(args),
        Command::Inventory(args) => cmd::inventory::run(args),
        Command::Sim(args) => cmd::sim::run(args),
        Command::Mig(args) => cmd::mig::run(args),
        Command::Migrate(args) => cmd::migrate::run(args),
        Command::Catalog(args) => cmd::catalog::run(args),
        Command::Cdi(args) => cmd::cdi::run(args),
        Command::Simulate(args) => cmd::simulate::run(args),
        Command::SchedulerExtender(args) => cmd::extender::run(args),
        Command::Controller(args) => cmd::controller::run(args),
        Command::Autoscaler(args) => cmd::autoscaler::run(args),
        Command::Doctor(args) => cmd::doctor::run(args),
        Command::Top(args) => cmd::top::run(args),
        Command::Manifests(args) => cmd::manifests::run(args),
        Command::Completion(args) => cmd::completion::completion(args, Cli::command()),
        Command::Man(args) => cmd::completion::man(args, Cli::command()),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
