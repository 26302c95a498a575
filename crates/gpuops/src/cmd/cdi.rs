//! `gpuops cdi`: CDI specs for the node's GPUs, in place of `nvidia-ctk cdi generate`.

use crate::gpu_source::{self, GpuArgs};
use anyhow::Result;
use clap::Subcommand;
use gpuops_resources::HostDevices;
use gpuops_resources::cdi::{self, CdiSpec};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// Container Device Interface (CDI) specs for the device plugin's `cdi-annotations` and `cdi-cri`
/// device list strategies.
#[derive(Debug, clap::Args)]
#[command(verbatim_doc_comment)]
pub struct Args {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    Generate(GenerateArgs),
}

/// Write a CDI spec (kind k8s.device-plugin.nvidia.com/gpu) for this node's GPUs and MIG devices:
/// each GPU by UUID and by index ("0"), each MIG device by MIG UUID and by "i:j", with their device
/// nodes; the control nodes (/dev/nvidiactl, /dev/nvidia-uvm, ...) that exist go to every device.
/// The spec is validated before it is written; an invalid one is not written (exit 1).
///
/// Examples:
///   gpuops cdi generate --simulate dgx-h100
///   gpuops cdi generate --output /var/run/cdi/k8s.device-plugin.nvidia.com-gpu.json
///   gpuops cdi generate --dev-root /run/nvidia/driver --format yaml
///   gpuops cdi generate --sim-state /tmp/sim     (after `gpuops mig apply ... --sim-state /tmp/sim`)
#[derive(Debug, clap::Args)]
#[command(verbatim_doc_comment)]
struct GenerateArgs {
    #[command(flatten)]
    gpus: GpuArgs,
    /// Write the spec to this file (atomically) instead of stdout; the runtime reads
    /// /var/run/cdi/ and /etc/cdi/.
    #[arg(long, short = 'o', value_name = "FILE")]
    output: Option<PathBuf>,
    /// Spec format.
    #[arg(long, value_enum, default_value_t = SpecFormat::Json)]
    format: SpecFormat,
    /// Root the host's /dev lives under (a containerized driver: /run/nvidia/driver). Control nodes
    /// are looked for there; host paths in the spec are prefixed with it.
    #[arg(long, value_name = "DIR", default_value = "/")]
    dev_root: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum SpecFormat {
    Json,
    Yaml,
}

pub fn run(args: Args) -> Result<ExitCode> {
    match args.command {
        Cmd::Generate(a) => generate(a),
    }
}

fn generate(args: GenerateArgs) -> Result<ExitCode> {
    let simulated = args.gpus.simulate.is_some() || args.gpus.sim_state.is_some();
    let opened = gpu_source::open(&args.gpus)?;
    let inventory = opened.gpus.snapshot()?;
    let host = if simulated {
        HostDevices::default()
    } else {
        gpuops_deviceplugin::probe_host(Path::new(&args.dev_root), Path::new("/proc"))
    };
    let spec = cdi::spec(&inventory, &host, &args.dev_root);
    if let Err(problems) = cdi::validate(&spec) {
        eprintln!("error: the generated CDI spec is invalid; not writing it:");
        for p in problems {
            eprintln!("  - {p}");
        }
        return Ok(ExitCode::FAILURE);
    }
    let text = render(&spec, args.format)?;
    match &args.output {
        None => print!("{text}"),
        Some(path) => {
            gpuops_atomicfile::write(path, &text)?;
            eprintln!(
                "wrote {} ({} devices) to {}",
                spec.kind,
                spec.devices.len(),
                path.display()
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn render(spec: &CdiSpec, format: SpecFormat) -> Result<String> {
    Ok(match format {
        SpecFormat::Json => serde_json::to_string_pretty(spec)? + "\n",
        SpecFormat::Yaml => serde_saphyr::to_string(spec)?,
    })
}
