//! `gpuops completion` and `gpuops man`: shell completions and man pages generated from the CLI
//! definition itself, so they never drift from the flags.

use anyhow::{Context, Result};
use clap_complete::Shell;
use std::path::PathBuf;
use std::process::ExitCode;

/// Print a shell completion script.
///
/// Examples:
///   source <(gpuops completion bash)
///   gpuops completion zsh > "${fpath[1]}/_gpuops"
///   gpuops completion fish > ~/.config/fish/completions/gpuops.fish
///   gpuops completion bash --name kubectl-gpu     # for the kubectl plugin's binary name
#[derive(Debug, clap::Args)]
#[command(verbatim_doc_comment)]
pub struct CompletionArgs {
    /// The shell.
    #[arg(value_enum)]
    shell: Shell,
    /// The command name to complete (the binary's name on your PATH).
    #[arg(long, default_value = "gpuops")]
    name: String,
}

/// Print the man page, or write one page per command into a directory.
///
/// Examples:
///   gpuops man | man -l -
///   gpuops man --dir /usr/local/share/man/man1     # gpuops.1, gpuops-agent.1, gpuops-mig-apply.1, ...
#[derive(Debug, clap::Args)]
#[command(verbatim_doc_comment)]
pub struct ManArgs {
    /// Write gpuops.1 and a page for every subcommand here instead of printing gpuops.1.
    #[arg(long, value_name = "DIR")]
    dir: Option<PathBuf>,
}

pub fn completion(args: CompletionArgs, mut cli: clap::Command) -> Result<ExitCode> {
    // Generated into memory first: clap_complete panics on a failed write (`| head`).
    let mut script = Vec::new();
    clap_complete::generate(args.shell, &mut cli, args.name, &mut script);
    write_stdout(&script)
}

/// Writes to stdout; a reader that went away (`| head`) is not an error.
fn write_stdout(bytes: &[u8]) -> Result<ExitCode> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match out.write_all(bytes).and_then(|()| out.flush()) {
        Ok(()) => Ok(ExitCode::SUCCESS),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(ExitCode::SUCCESS),
        Err(e) => Err(e).context("writing to stdout"),
    }
}

pub fn man(args: ManArgs, cli: clap::Command) -> Result<ExitCode> {
    match args.dir {
        None => {
            let mut page = Vec::new();
            clap_mangen::Man::new(cli)
                .render(&mut page)
                .context("rendering the man page")?;
            return write_stdout(&page);
        }
        Some(dir) => {
            std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
            clap_mangen::generate_to(cli, &dir)
                .with_context(|| format!("writing man pages to {}", dir.display()))?;
            let pages = std::fs::read_dir(&dir)
                .with_context(|| format!("reading {}", dir.display()))?
                .filter(|e| {
                    e.as_ref()
                        .is_ok_and(|e| e.path().extension().is_some_and(|x| x == "1"))
                })
                .count();
            println!("{pages} man pages in {}", dir.display());
        }
    }
    Ok(ExitCode::SUCCESS)
}
