//! `gpuops simulate autoscale`: replays a pod trace with arrival and departure times through
//! gpuops's autoscaling decisions, a Cluster Autoscaler-like baseline and static MIG, and
//! prints what each bought against what was asked. A thin layer over `gpuops_replay`.

use anyhow::{Context, Result, anyhow};
use gpuops_replay::{PolicyName, Progress, ReplayOptions, report};
use std::io::{IsTerminal, Write as _};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

/// Replay a pod trace in simulated time through the autoscaler and price what it buys.
///
/// Pods arrive at their creation_time, run for deletion_time - creation_time once bound to a
/// ready node (so a pod that waited departs that much later), and leave. Nodes are bought by
/// the policy, boot, get their GPUs advertised after the device-plugin delay, and are billed
/// from purchase to removal. Policies, all in one run:
///   ours        gpuops's controller decision (gpuops_autoscale::decide), plus demand-driven
///               MIG re-partitioning (decide_mig) with --mig on
///   ca-like     Cluster Autoscaler's documented algorithm (template simulation, least-waste,
///               scale-down below 0.5 utilization after 10 min, 10 min after a scale-up)
///   static-mig  gpuops's decision with every MIG pool kept at its configured layout
/// Prints GPU-hours bought and requested, their ratio, pending pod-hours, p50/p99 wait, scale
/// actions and MIG changes. See docs/autoscaling-replay.md for the pools file format.
///
/// Examples:
///   T=/work/shared/traces/openb
///   gpuops simulate autoscale --pods $T/openb_pod_list_default.csv \
///       --pools docs/autoscaling-replay-pools.yaml --svg bought.svg
///   gpuops simulate autoscale --pods $T/openb_pod_list_gpushare40.csv \
///       --pools docs/autoscaling-replay-pools.yaml --mig off -o csv
#[derive(Debug, clap::Args)]
#[command(verbatim_doc_comment)]
pub struct Args {
    /// Pod list CSV with creation_time and deletion_time columns (the openb pod lists).
    #[arg(long, value_name = "FILE")]
    pods: PathBuf,
    /// Pools file (YAML; see docs/autoscaling-replay.md).
    #[arg(long, value_name = "FILE")]
    pools: PathBuf,
    /// MIG re-partitioning for ours.
    #[arg(long, value_enum, default_value_t = OnOff::On)]
    mig: OnOff,
    /// Policies to run: a comma list of ours, ca-like, static-mig.
    #[arg(long, default_value = "ours,ca-like,static-mig", value_name = "P")]
    policies: String,
    /// Write an SVG of GPUs bought (per policy) and requested over time.
    #[arg(long, value_name = "FILE.svg")]
    svg: Option<PathBuf>,
    /// Progress on stderr (on by default when stderr is a terminal).
    #[arg(long)]
    progress: bool,
    /// Output: table, csv or json.
    #[arg(short, long, value_enum, default_value_t = Out::Table)]
    output: Out,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum OnOff {
    On,
    Off,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Out {
    Table,
    Csv,
    Json,
}

fn parse_policies(s: &str) -> Result<Vec<PolicyName>> {
    let mut out = Vec::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let p = PolicyName::ALL
            .into_iter()
            .find(|p| p.name() == part)
            .ok_or_else(|| {
                anyhow!("--policies: {part:?} is not a policy (ours, ca-like, static-mig)")
            })?;
        if !out.contains(&p) {
            out.push(p);
        }
    }
    if out.is_empty() {
        anyhow::bail!("--policies {s:?} names no policy (ours, ca-like, static-mig)");
    }
    Ok(out)
}

pub fn run(args: Args) -> Result<ExitCode> {
    let policies = parse_policies(&args.policies)?;
    let pools_text = super::read_input(
        &args.pools,
        "--pools",
        gpuops_yamlpos::MAX_CONFIG_BYTES,
        "a pools file",
    )?;
    let pools = gpuops_replay::parse_pools(&args.pools.display().to_string(), &pools_text)
        .map_err(|e| anyhow!("--pools: {e}"))?;
    let pods_text = super::read_input(
        &args.pods,
        "--pods",
        gpuops_yamlpos::MAX_TRACE_BYTES,
        "a trace",
    )?;
    let trace = gpuops_replay::parse_timed_pods(&args.pods.display().to_string(), &pods_text)
        .map_err(|e| anyhow!("--pods: {e}"))?;
    let show = args.progress || std::io::stderr().is_terminal();
    let started = Instant::now();
    let mut on_progress = |p: &Progress| {
        if !show {
            return;
        }
        let pct = if p.end > 0 {
            (p.now as f64 / p.end as f64 * 100.0).min(100.0)
        } else {
            100.0
        };
        if p.done {
            eprintln!(
                "{}: done, {:.1} simulated days in {:.1}s",
                p.policy.name(),
                p.now as f64 / 86_400_000.0,
                started.elapsed().as_secs_f64()
            );
        } else {
            eprintln!(
                "{}: day {:.0} ({pct:.0}% of the trace)",
                p.policy.name(),
                p.now as f64 / 86_400_000.0
            );
        }
    };
    let options = ReplayOptions {
        mig: args.mig == OnOff::On,
        policies,
    };
    let r = gpuops_replay::replay(&pools, &trace, &options, &mut on_progress);
    if let Some(path) = &args.svg {
        std::fs::write(path, report::svg(&r))
            .with_context(|| format!("--svg: cannot write {}", path.display()))?;
    }
    let text = match args.output {
        Out::Table => report::table(&r),
        Out::Csv => report::csv(&r),
        Out::Json => serde_json::to_string_pretty(&r)? + "\n",
    };
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())
        .and_then(|()| out.flush())
        .context("writing to stdout")?;
    Ok(ExitCode::SUCCESS)
}
