//! `gpuops-modcheck [WORKSPACE] [--allow FILE]`: prints every dependency that crosses the
//! workspace's layers the wrong way and every module cycle of every crate, and exits 1 when there
//! is such a dependency or a cycle not covered by the allow-list.

use gpuops_modcheck::{Allowed, allowed_by, cycles, layers, load_crate, parse_allow_list};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

fn main() -> ExitCode {
    let mut root = PathBuf::from(".");
    let mut allow_file: Option<PathBuf> = None;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--allow" => match args.next() {
                Some(f) => allow_file = Some(PathBuf::from(f)),
                None => {
                    eprintln!("error: --allow needs a file");
                    return ExitCode::from(2);
                }
            },
            "-h" | "--help" => {
                println!(
                    "usage: gpuops-modcheck [WORKSPACE] [--allow FILE]\n\n\
                     Checks that every crate under WORKSPACE/crates/<layer>/ depends only on the\n\
                     layers its own allows (core < driver < decide < edge < runtime < bin; only\n\
                     the binary links sim; nothing shipped links tools or testing; tests may use\n\
                     anything), and that no crate has a module cycle not named in FILE.\n\
                     Exit: 0 clean, 1 a violation or cycle, 2 the workspace could not be read."
                );
                return ExitCode::SUCCESS;
            }
            _ => root = PathBuf::from(a),
        }
    }
    match run(&root, allow_file.as_deref()) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}

/// Ok(true) when no dependency crosses the layers the wrong way and every cycle found is allowed.
fn run(root: &Path, allow_file: Option<&Path>) -> Result<bool, gpuops_modcheck::CheckError> {
    let allowed: Vec<Allowed> = match allow_file {
        Some(f) => {
            let text =
                std::fs::read_to_string(f).map_err(|source| gpuops_modcheck::CheckError::Read {
                    path: f.to_path_buf(),
                    source,
                })?;
            parse_allow_list(f, &text)?
        }
        None => Vec::new(),
    };
    let members = layers::members(root)?;
    let crossing = layers::violations(&members);
    for v in &crossing {
        println!("{v}");
    }
    println!(
        "{} crate(s), {} dependency(ies) across layers the wrong way",
        members.len(),
        crossing.len()
    );
    let (mut total, mut refused, mut used) = (0, 0, vec![false; allowed.len()]);
    for member in &members {
        let (krate, dir) = (&member.name, &member.dir);
        for root_file in ["src/lib.rs", "src/main.rs"] {
            let file = dir.join(root_file);
            if !file.is_file() {
                continue;
            }
            for cycle in cycles(&load_crate(&file)?) {
                total += 1;
                match allowed_by(&allowed, krate, &cycle) {
                    Some(a) => {
                        if let Some(i) = allowed.iter().position(|x| x == a) {
                            used[i] = true;
                        }
                        print!(
                            "{krate} (allowed, {}:{}): {cycle}",
                            show(allow_file),
                            a.line
                        );
                    }
                    None => {
                        refused += 1;
                        print!("{krate}: {cycle}");
                    }
                }
            }
        }
    }
    for (a, used) in allowed.iter().zip(&used) {
        if !*used {
            println!(
                "note: {}:{}: {}: {} is no cycle any more; remove the entry",
                show(allow_file),
                a.line,
                a.krate,
                a.modules.join(" ")
            );
        }
    }
    println!(
        "{total} module cycle(s), {} allowed, {refused} not allowed",
        total - refused
    );
    Ok(refused == 0 && crossing.is_empty())
}

fn show(p: Option<&Path>) -> String {
    p.map(|p| p.display().to_string()).unwrap_or_default()
}
