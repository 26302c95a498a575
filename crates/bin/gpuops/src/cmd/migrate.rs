//! `gpuops migrate`: NVIDIA's GPU Operator or standalone node stack to gpuops Helm values, and
//! `--check` per node. Reads (files or the cluster) and prints; gpuops-migrate translates.

use anyhow::{Context, Result};
use gpuops_migrate::{Migration, NodeCheck, Options, check_nodes, migrate, parse_documents};
use std::io::Read;
use std::path::PathBuf;
use std::process::ExitCode;

/// Exit code when the values were written but some setting could not be carried over.
pub const EXIT_NOT_CARRIED: u8 = 3;
/// Exit code of `--check` when some node's labels or resources would change.
pub const EXIT_NODES_CHANGE: u8 = 4;

/// Print the gpuops Helm values that replace NVIDIA's GPU Operator or its standalone device
/// plugin, GPU Feature Discovery, MIG manager and dcgm-exporter, keeping every resource name,
/// label, MIG config, sharing config and metric.
///
/// Reads the GPU Operator's ClusterPolicy (nvidia.com/v1) and the ConfigMaps it names, or, without
/// one, NVIDIA's DaemonSets (their env vars, arguments and ConfigMap volumes). Configs are parsed
/// with the agent's own parsers. Whatever cannot be carried over is listed on stderr (and in the
/// values' header) with its object and field. --check instead shows, per GPU node, which labels
/// and resources would change once gpuops serves it. See docs/migrate.md for the whole switch.
///
/// Exit codes: 0 everything carried over (--check: no node changes); 1 bad or partial input
/// (a ClusterPolicy of another version, a missing ConfigMap or config key, a config the agent
/// refuses) or the cluster could not be read; 2 bad arguments; 3 values written, but something
/// could not be carried over; 4 (--check) some node would change.
///
/// Examples:
///   gpuops migrate > values.yaml                      read the cluster (KUBECONFIG or in-cluster)
///   gpuops migrate -n gpu-operator --check            per node: what changes
///   gpuops migrate -f clusterpolicy.yaml -f cm.yaml   from files, without a cluster
///   kubectl get clusterpolicy,cm -n gpu-operator -o yaml | gpuops migrate -f -
///   helm install gpuops deploy/helm/gpuops -f values.yaml
#[derive(Debug, clap::Args)]
#[command(verbatim_doc_comment)]
pub struct Args {
    /// Read objects from this file (YAML or JSON, several documents, `kubectl get -o yaml` lists)
    /// instead of the cluster; `-` is stdin. Repeatable.
    #[arg(short = 'f', long = "filename", value_name = "FILE")]
    files: Vec<PathBuf>,
    /// The namespace of NVIDIA's ConfigMaps (the GPU Operator's, e.g. gpu-operator); default:
    /// the namespace of NVIDIA's DaemonSets.
    #[arg(short, long)]
    namespace: Option<String>,
    /// Show per node (Nodes among the files, or every node of the cluster) which labels and
    /// resources would change, instead of printing the values.
    #[arg(long)]
    check: bool,
    /// Write the values to this file instead of stdout.
    #[arg(short, long, value_name = "FILE")]
    output: Option<PathBuf>,
    #[command(flatten)]
    kube: super::flags::KubeArgs,
}

fn read_files(files: &[PathBuf]) -> Result<Vec<serde_json::Value>> {
    let mut out = Vec::new();
    for f in files {
        let (text, origin) = if f.as_os_str() == "-" {
            let mut s = String::new();
            std::io::stdin()
                .read_to_string(&mut s)
                .context("reading stdin")?;
            (s, "stdin".to_string())
        } else {
            let s =
                std::fs::read_to_string(f).with_context(|| format!("reading {}", f.display()))?;
            (s, f.display().to_string())
        };
        out.extend(parse_documents(&text, &origin)?);
    }
    Ok(out)
}

fn read_cluster(args: &Args) -> Result<Vec<serde_json::Value>> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(async {
        let client = gpuops_observe::client(&args.kube.options()).await?;
        let objects =
            gpuops_observe::migrate::nvidia_objects(&client, args.namespace.as_deref(), args.check)
                .await?;
        Ok(objects)
    })
}

pub fn run(args: Args) -> Result<ExitCode> {
    let objects = if args.files.is_empty() {
        read_cluster(&args)?
    } else {
        read_files(&args.files)?
    };
    let options = Options {
        namespace: args.namespace.clone(),
    };
    let m = migrate(&objects, &options)?;
    for w in &m.warnings {
        eprintln!("warning: {w}");
    }
    if args.check {
        let checks = check_nodes(&objects, &m.plan)?;
        print!("{}", render_checks(&checks));
        return Ok(if checks.iter().any(|c| !c.changes.is_empty()) {
            ExitCode::from(EXIT_NODES_CHANGE)
        } else {
            ExitCode::SUCCESS
        });
    }
    write_values(&m, args.output.as_deref())?;
    Ok(if m.warnings.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(EXIT_NOT_CARRIED)
    })
}

fn write_values(m: &Migration, to: Option<&std::path::Path>) -> Result<()> {
    let yaml = m.values_yaml()?;
    match to {
        Some(p) => std::fs::write(p, yaml).with_context(|| format!("writing {}", p.display())),
        None => {
            print!("{yaml}");
            Ok(())
        }
    }
}

fn render_checks(checks: &[NodeCheck]) -> String {
    let mut out = String::new();
    if checks.is_empty() {
        out.push_str("no node with an nvidia.com/ label or resource\n");
    }
    for c in checks {
        let config = c
            .config
            .as_deref()
            .map(|n| format!(" (device plugin config {n})"))
            .unwrap_or_default();
        if c.changes.is_empty() {
            out.push_str(&format!(
                "{}{config}: no change ({} labels and resources kept as they are)\n",
                c.node, c.same
            ));
            continue;
        }
        out.push_str(&format!(
            "{}{config}: {} change(s), {} kept\n",
            c.node,
            c.changes.len(),
            c.same
        ));
        for ch in &c.changes {
            let show = |v: &Option<String>| v.clone().unwrap_or_else(|| "(none)".into());
            out.push_str(&format!(
                "  {} {}: {} -> {}: {}\n",
                ch.kind,
                ch.key,
                show(&ch.now),
                show(&ch.after),
                ch.why
            ));
        }
    }
    out
}
