//! Puts the git commit the binary is built from into `GPUOPS_GIT_COMMIT` for `--version`.
//!
//! Order: the `GPUOPS_GIT_COMMIT` environment variable (image builds from a tarball pass it),
//! else `git rev-parse` (with `-dirty` when the tree has changes), else `unknown`, so a build
//! without git or outside a checkout still succeeds.

use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    if !out.status.success() {
        return None;
    }
    let text = String::from_utf8(out.stdout).ok()?.trim().to_string();
    (!text.is_empty()).then_some(text)
}

fn main() {
    println!("cargo:rerun-if-env-changed=GPUOPS_GIT_COMMIT");
    let commit = match std::env::var("GPUOPS_GIT_COMMIT") {
        Ok(c) if !c.trim().is_empty() => c.trim().to_string(),
        _ => match git(&["rev-parse", "--short=12", "HEAD"]) {
            Some(c) => {
                // Rebuild when HEAD moves: the HEAD file, and the branch it points at.
                for path in [
                    Some("HEAD".to_string()),
                    git(&["symbolic-ref", "-q", "HEAD"]),
                ]
                .into_iter()
                .flatten()
                {
                    if let Some(file) = git(&["rev-parse", "--git-path", &path]) {
                        println!("cargo:rerun-if-changed={file}");
                    }
                }
                let dirty = git(&["status", "--porcelain", "--untracked-files=no"]).is_some();
                if dirty { format!("{c}-dirty") } else { c }
            }
            None => "unknown".to_string(),
        },
    };
    println!("cargo:rustc-env=GPUOPS_GIT_COMMIT={commit}");
}
