//! `gpuops simulate`: replays a cluster trace (the FGD paper's openb traces or your own) through
//! the packing engine with every placement policy and reports how much GPU each leaves
//! unallocated. A thin layer over `gpuops_packing::{simulate, report}`.

use crate::output::{self, Format};
use anyhow::{Context, Result, anyhow};
use gpuops_packing::{PolicyKind, Progress, SimConfig, report};
use std::collections::HashSet;
use std::io::{IsTerminal, Write as _};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

/// Replay a cluster trace with GPU packing policies and compare the GPU they leave unallocated.
///
/// Follows the FGD paper's procedure (USENIX ATC'23, "Beware of Fragmentation"): per seed the
/// trace's pods are shuffled and sampled until the arrived GPU demand reaches --load x the
/// cluster's GPU capacity; pods arrive one by one, never leave, and are dropped when they fit
/// nowhere. Prints, per policy, the mean GPU allocation and unallocated % at the final load, the
/// spread over seeds, dropped pods, and the allocation curve at every 10% of arrived workload.
/// See docs/packing.md for the procedure, the policies and the published figures.
///
/// Trace files are CSV with a header line (columns by name, any order):
///   nodes: sn,cpu_milli,memory_mib,gpu,model
///   pods:  name,cpu_milli,memory_mib,num_gpu,gpu_milli[,gpu_spec,...]
/// The openb traces of the paper (Alibaba, 1213 GPU nodes, 8152 pods) are in
/// /work/shared/traces/openb/ on the development machine, or from
/// https://github.com/alibaba/clusterdata (cluster-trace-gpu-v2023):
///   openb_node_list_gpu_node.csv                          the GPU nodes
///   openb_pod_list_default.csv                            the default workload
///   openb_pod_list_{gpushare40,gpushare60,multigpu20,gpuspec10,cpu050}.csv   variants
///
/// Policies: random, dotprod, gpuclustering, gpupacking, bestfit, fgd, ours (or all).
///
/// Examples:
///   T=/work/shared/traces/openb
///   gpuops simulate --nodes $T/openb_node_list_gpu_node.csv --pods $T/openb_pod_list_default.csv
///   gpuops simulate --nodes $T/openb_node_list_gpu_node.csv --pods $T/openb_pod_list_multigpu20.csv \
///       --policy fgd,ours --seeds 42-44 --plot curves.svg --csv curves.csv
///   gpuops simulate --nodes nodes.csv --pods pods.csv --load 1.0 --seeds 7 -o json
#[derive(Debug, clap::Args)]
#[command(verbatim_doc_comment, args_conflicts_with_subcommands = true)]
pub struct Args {
    /// `gpuops simulate autoscale`: the autoscaling cost replay.
    #[command(subcommand)]
    command: Option<Sub>,
    /// Node list CSV (e.g. /work/shared/traces/openb/openb_node_list_gpu_node.csv).
    #[arg(long, value_name = "FILE")]
    nodes: Option<PathBuf>,
    /// Pod list CSV (e.g. /work/shared/traces/openb/openb_pod_list_default.csv).
    #[arg(long, value_name = "FILE")]
    pods: Option<PathBuf>,
    /// Policies: one name, a comma list (fgd,ours) or all.
    #[arg(long, default_value = "all", value_name = "P")]
    policy: String,
    /// Seeds: 42, 42-51 (inclusive) or 1,5,9; one run per policy and seed.
    #[arg(long, default_value = "42-51")]
    seeds: String,
    /// Arrived GPU demand as a multiple of the cluster's GPU capacity (the paper: 1.3).
    #[arg(long, default_value_t = 1.3)]
    load: f64,
    /// Worker threads (0: one per CPU core).
    #[arg(long, default_value_t = 0)]
    threads: usize,
    /// Write every allocation curve (policy,seed,arrived_pct,allocation_pct; per seed and mean).
    #[arg(long, value_name = "FILE")]
    csv: Option<PathBuf>,
    /// Write the final figures per run (policy,seed,allocation_pct,unallocated_pct,pods_failed).
    #[arg(long, value_name = "FILE")]
    summary_csv: Option<PathBuf>,
    /// Write an SVG plot of the mean allocation curves.
    #[arg(long, value_name = "FILE.svg")]
    plot: Option<PathBuf>,
    /// Report progress on stderr (a line per finished run); on by default when stderr is a
    /// terminal.
    #[arg(long)]
    progress: bool,
    /// Output: table (default) or json / yaml (the full simulation: runs, curves, summaries).
    #[arg(short, long, value_enum, default_value_t = Format::Table)]
    output: Format,
}

const TRACES_HINT: &str = "the openb traces are in /work/shared/traces/openb/ (e.g. --nodes /work/shared/traces/openb/openb_node_list_gpu_node.csv --pods /work/shared/traces/openb/openb_pod_list_default.csv); see gpuops simulate --help";

/// Subcommands of `gpuops simulate`.
#[derive(Debug, clap::Subcommand)]
pub enum Sub {
    Autoscale(super::simulate_autoscale::Args),
}

pub fn run(args: Args) -> Result<ExitCode> {
    if let Some(Sub::Autoscale(a)) = args.command {
        return super::simulate_autoscale::run(a);
    }
    let nodes_path = args
        .nodes
        .as_deref()
        .ok_or_else(|| anyhow!("--nodes FILE is required: the node list CSV; {TRACES_HINT}"))?;
    let pods_path = args
        .pods
        .as_deref()
        .ok_or_else(|| anyhow!("--pods FILE is required: the pod list CSV; {TRACES_HINT}"))?;
    let policies = PolicyKind::parse_list(&args.policy).context("--policy")?;
    if policies.is_empty() {
        anyhow::bail!(
            "--policy {:?} names no policy (expected one of: random, dotprod, gpuclustering, gpupacking, bestfit, fgd, ours, all)",
            args.policy
        );
    }
    let seeds = gpuops_packing::parse_seeds(&args.seeds).context("--seeds")?;
    if !(args.load.is_finite() && args.load > 0.0 && args.load <= 100.0) {
        anyhow::bail!(
            "--load {}: must be more than 0 (a multiple of the cluster's GPU capacity, e.g. 1.3)",
            args.load
        );
    }
    let nodes = read_trace(nodes_path, "--nodes", gpuops_packing::parse_nodes)?;
    let pods = read_trace(pods_path, "--pods", gpuops_packing::parse_pods)?;
    let config = SimConfig {
        policies,
        seeds,
        load: args.load,
        threads: args.threads,
    };
    let show_progress = args.progress || std::io::stderr().is_terminal();
    let runs_total = config.policies.len() * config.seeds.len();
    if show_progress {
        eprintln!("{}", report::start_line(&config, nodes.len(), pods.len()));
    }
    let started = Instant::now();
    let mut finished: HashSet<(PolicyKind, u64)> = HashSet::new();
    let mut on_progress = |p: &Progress| {
        if p.pods_done < p.pods_total || !finished.insert((p.policy, p.seed)) {
            return;
        }
        if show_progress {
            let elapsed = started.elapsed().as_secs_f64();
            eprintln!("{}", report::run_done_line(p, finished.len(), elapsed));
        }
    };
    let sim = gpuops_packing::simulate(&nodes, &pods, &config, &mut on_progress)
        .context("simulation failed")?;
    if show_progress {
        eprintln!(
            "{runs_total} runs in {}",
            report::secs(started.elapsed().as_secs_f64())
        );
    }
    write_file(args.csv.as_deref(), "--csv", &report::csv(&sim))?;
    write_file(
        args.summary_csv.as_deref(),
        "--summary-csv",
        &report::summary_csv(&sim),
    )?;
    write_file(args.plot.as_deref(), "--plot", &report::svg(&sim))?;
    let text = match output::structured(&sim, args.output)? {
        Some(s) => s,
        None => report::text(&sim, nodes.len(), pods.len()),
    };
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())
        .and_then(|()| out.flush())
        .context("writing to stdout")?;
    Ok(ExitCode::SUCCESS)
}

/// Reads a trace file and parses it; errors name the path as given, the line and the column.
fn read_trace<T>(
    path: &Path,
    flag: &str,
    parse: fn(&str, &str) -> gpuops_packing::Result<Vec<T>>,
) -> Result<Vec<T>> {
    let text = super::read_input(path, flag, gpuops_yamlpos::MAX_TRACE_BYTES, "a trace")?;
    parse(&path.display().to_string(), &text).map_err(|e| anyhow!("{flag}: {e}"))
}

fn write_file(path: Option<&Path>, flag: &str, text: &str) -> Result<()> {
    let Some(path) = path else {
        return Ok(());
    };
    std::fs::write(path, text).with_context(|| format!("{flag}: cannot write {}", path.display()))
}
