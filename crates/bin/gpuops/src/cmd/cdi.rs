//! `gpuops cdi`: CDI specs for the node's GPUs, in place of `nvidia-ctk cdi generate`.

use crate::gpu_source::{self, GpuArgs};
use anyhow::{Context, Result};
use clap::Subcommand;
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
    #[command(subcommand)]
    Hook(HookCmd),
}

/// What a container runtime runs from a CDI spec's hooks (not for interactive use).
#[derive(Debug, Subcommand)]
enum HookCmd {
    /// A createContainer hook: reads the OCI state on stdin, writes the --folder directories to
    /// the container's /etc/ld.so.conf.d/00-gpuops-cdi.conf and runs ldconfig on the container's
    /// root (`ldconfig -r`), so its loader cache knows the driver's libraries.
    UpdateLdcache {
        /// A directory holding the driver's libraries in the container (repeatable).
        #[arg(long = "folder", value_name = "DIR")]
        folders: Vec<String>,
        /// The ldconfig to run (the host's; it chroots into the container's root).
        #[arg(long, default_value = "/sbin/ldconfig", value_name = "FILE")]
        ldconfig: PathBuf,
    },
}

/// Write a CDI spec (kind k8s.device-plugin.nvidia.com/gpu, the names the device plugin's
/// cdi-annotations and cdi-cri strategies emit) for this node's GPUs and MIG devices: each GPU by
/// UUID and by index ("0"), each MIG device by MIG UUID and by "i:j", and "all", with their device
/// nodes; what every device needs: the control nodes (/dev/nvidiactl, /dev/nvidia-uvm, ...) that
/// exist, the driver's libraries (with their soname links) and programs found under
/// --driver-root as read-only mounts, the persistenced / fabric manager sockets and the MPS pipe
/// directory when present, and an ldcache hook (docs/cdi.md). The spec is validated before it is
/// written; an invalid one is not written (exit 1). The agent writes the same spec itself
/// (--cdi-spec-dir).
///
/// Examples:
///   gpuops cdi generate --simulate dgx-h100
///   gpuops cdi generate --output /var/run/cdi/k8s.device-plugin.nvidia.com-gpu.json
///   gpuops cdi generate --dev-root /run/nvidia/driver --driver-root /run/nvidia/driver --format yaml
///   gpuops cdi generate --kind nvidia.com/gpu -o /etc/cdi/nvidia.yaml --format yaml   (nvidia-ctk's kind)
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
    /// Root the driver's files (libraries, programs, IPC sockets) are searched under, and
    /// prefixed with in the spec's host paths [with --simulate: driver/ in the simulator state].
    #[arg(long, value_name = "DIR", default_value = "/")]
    driver_root: String,
    /// Where --driver-root is on the host, when this runs in a container that sees it elsewhere
    /// [default: --driver-root].
    #[arg(long, value_name = "DIR")]
    host_driver_root: Option<String>,
    /// The CDI kind, vendor/class.
    #[arg(long, default_value = gpuops_resources::allocate::CDI_KIND)]
    kind: String,
    /// A gpuops binary on the host for the ldcache hook [default: NVIDIA's nvidia-cdi-hook when
    /// found under --driver-root, else no hook].
    #[arg(long, value_name = "FILE")]
    hook_path: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum SpecFormat {
    Json,
    Yaml,
}

pub fn run(args: Args) -> Result<ExitCode> {
    match args.command {
        Cmd::Generate(a) => generate(a),
        Cmd::Hook(HookCmd::UpdateLdcache { folders, ldconfig }) => {
            update_ldcache(&folders, &ldconfig)
        }
    }
}

fn update_ldcache(folders: &[String], ldconfig: &Path) -> Result<ExitCode> {
    let mut state = String::new();
    std::io::Read::read_to_string(&mut std::io::stdin(), &mut state)
        .context("reading the OCI state on stdin")?;
    gpuops_agent::update_ldcache(&state, folders, ldconfig)?;
    Ok(ExitCode::SUCCESS)
}

fn generate(args: GenerateArgs) -> Result<ExitCode> {
    let opened = gpu_source::open(&args.gpus)?;
    let inventory = opened.gpus.snapshot()?;
    let sim_state = opened
        .simulation
        .as_ref()
        .filter(|_| args.gpus.sim_state.is_some())
        .map(|s| {
            (
                s.state_dir.clone(),
                s.state_dir.join(gpuops_sim::devnodes::DRIVER_ROOT),
            )
        });
    let (host, driver, options) = gpuops_agent::generate_inputs(
        &inventory,
        opened.simulation.is_some(),
        sim_state
            .as_ref()
            .map(|(dir, driver)| (dir.as_path(), driver.as_path())),
        gpuops_agent::GenerateRoots {
            dev_root: args.dev_root,
            driver_root: args.driver_root,
            host_driver_root: args.host_driver_root,
            kind: args.kind,
            hook_path: args.hook_path,
        },
    )?;
    let spec = cdi::spec(&inventory, &host, &driver, &options)?;
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
