//! gpuops-modcheck: checks the workspace's shape: crates depend only on the layers below theirs
//! (`layers`), and no crate has a module dependency cycle.
//!
//! A crate's modules form a tree; a module that names another (`use crate::a::b`, `super::x::f()`,
//! `crate::a::f` inside a macro call) depends on it. A cycle is a set of modules that depend on
//! each other in a ring (a strongly connected component of that graph). Edges between a module and
//! its own ancestors or descendants do not count: a parent declares its children and a child
//! using its parent's shared types is the tree, not a cycle.
//!
//! The reading is syntactic (paths are resolved through the module tree and `use` aliases of
//! modules, not through re-exports), which is what a module cycle is about.

mod graph;
pub mod layers;
mod load;

pub use graph::{Cycle, Edge, cycles};
pub use load::{CrateModules, Reference, load_crate};

use std::path::PathBuf;

/// Failures reading a crate.
#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    #[error("{path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}:{line}:{column}: not Rust this check can parse: {message}")]
    Parse {
        path: PathBuf,
        line: usize,
        column: usize,
        message: String,
    },
    #[error("{path}:{line}:{column}: module {module} has no file (looked for {candidates})")]
    MissingModule {
        path: PathBuf,
        line: usize,
        column: usize,
        module: String,
        candidates: String,
    },
    #[error("{path}: {message}")]
    Layout { path: PathBuf, message: String },
    #[error("{path}:{line}: {message}")]
    AllowList {
        path: PathBuf,
        line: usize,
        message: String,
    },
}

/// One allowed cycle: every module of a found cycle in `modules` lets it through.
#[derive(Debug, Clone, PartialEq)]
pub struct Allowed {
    pub krate: String,
    pub modules: Vec<String>,
    pub line: usize,
}

/// Parses an allow-list: `crate-name: module module ...` per line, `#` comments.
pub fn parse_allow_list(path: &std::path::Path, text: &str) -> Result<Vec<Allowed>, CheckError> {
    let mut out = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let line = raw.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let Some((krate, modules)) = line.split_once(':') else {
            return Err(CheckError::AllowList {
                path: path.to_path_buf(),
                line: i + 1,
                message: format!("expected `crate: module module ...`, got {raw:?}"),
            });
        };
        let modules: Vec<String> = modules.split_whitespace().map(str::to_string).collect();
        if modules.len() < 2 {
            return Err(CheckError::AllowList {
                path: path.to_path_buf(),
                line: i + 1,
                message: "a cycle has at least two modules".to_string(),
            });
        }
        out.push(Allowed {
            krate: krate.trim().to_string(),
            modules,
            line: i + 1,
        });
    }
    Ok(out)
}

/// The allow-list entry that covers `cycle` of `krate`, if any.
pub fn allowed_by<'a>(allowed: &'a [Allowed], krate: &str, cycle: &Cycle) -> Option<&'a Allowed> {
    allowed
        .iter()
        .find(|a| a.krate == krate && cycle.modules.iter().all(|m| a.modules.contains(m)))
}
