//! The workspace's layers: every crate sits in `crates/<layer>/<crate>`, and a crate may depend
//! (as a normal or build dependency) only on crates of the layers its own layer allows. Tests
//! (dev-dependencies) may use anything: the simulator and the test bed are what they run on.

use crate::CheckError;
use std::fmt;
use std::path::{Path, PathBuf};

/// A folder under `crates/`, lowest first for the product.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Layer {
    /// Facts and models, pure (GPU catalog, snapshot types, small formats).
    Core,
    /// The driver edge: the only NVML caller.
    Driver,
    /// Decisions, pure and table-tested.
    Decide,
    /// Everything that talks to the outside: kubelet, API server, HTTP, MIG actions.
    Edge,
    /// Long-running loops that join the edges and the decisions.
    Runtime,
    /// The binary and what only it wires in (which GPUs a command opens).
    Bin,
    /// The simulated driver, for tests and demos.
    Sim,
    /// Developer tools that are not shipped.
    Tools,
    /// Test support.
    Testing,
}

impl Layer {
    pub const ALL: [Layer; 9] = [
        Layer::Core,
        Layer::Driver,
        Layer::Decide,
        Layer::Edge,
        Layer::Runtime,
        Layer::Bin,
        Layer::Sim,
        Layer::Tools,
        Layer::Testing,
    ];

    pub fn folder(self) -> &'static str {
        match self {
            Layer::Core => "core",
            Layer::Driver => "driver",
            Layer::Decide => "decide",
            Layer::Edge => "edge",
            Layer::Runtime => "runtime",
            Layer::Bin => "bin",
            Layer::Sim => "sim",
            Layer::Tools => "tools",
            Layer::Testing => "testing",
        }
    }

    pub fn from_folder(name: &str) -> Option<Layer> {
        Layer::ALL.into_iter().find(|l| l.folder() == name)
    }

    /// Whether a crate of this layer may depend on one of `other` outside its tests. Decisions
    /// stay pure (no driver, no edge); only the binary links the simulator, for `--simulate`;
    /// nothing shipped links tools or test support.
    pub fn may_depend_on(self, other: Layer) -> bool {
        use Layer::*;
        match self {
            Core => matches!(other, Core),
            Driver => matches!(other, Core | Driver),
            Decide => matches!(other, Core | Decide),
            Edge => matches!(other, Core | Driver | Decide | Edge),
            Runtime => matches!(other, Core | Driver | Decide | Edge | Runtime),
            Bin => !matches!(other, Tools | Testing),
            Sim => matches!(other, Core | Sim),
            Tools => other != Testing,
            Testing => true,
        }
    }
}

impl fmt::Display for Layer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.folder())
    }
}

/// One dependency a manifest declares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dependency {
    /// The package depended on (a `package = "…"` rename resolved).
    pub package: String,
    /// `dependencies`, `build-dependencies` or `dev-dependencies`, a `target.…` prefix kept.
    pub section: String,
    /// 1-based line of the entry in the manifest.
    pub line: usize,
}

impl Dependency {
    pub fn is_dev(&self) -> bool {
        self.section.ends_with("dev-dependencies")
    }
}

/// A workspace crate as its folder and manifest say.
#[derive(Debug, Clone)]
pub struct Member {
    pub name: String,
    pub layer: Layer,
    pub dir: PathBuf,
    pub manifest: PathBuf,
    pub dependencies: Vec<Dependency>,
}

/// A dependency that crosses layers the wrong way.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    pub manifest: PathBuf,
    pub line: usize,
    pub from: String,
    pub from_layer: Layer,
    pub to: String,
    pub to_layer: Layer,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}:{}: {} ({}) depends on {} ({}); a {} crate may depend only on {}",
            self.manifest.display(),
            self.line,
            self.from,
            self.from_layer,
            self.to,
            self.to_layer,
            self.from_layer,
            allowed_list(self.from_layer)
        )
    }
}

fn allowed_list(layer: Layer) -> String {
    Layer::ALL
        .into_iter()
        .filter(|l| layer.may_depend_on(*l))
        .map(Layer::folder)
        .collect::<Vec<_>>()
        .join(", ")
}

/// Every crate under `root/crates/<layer>/`. A folder directly under `crates/` that names no
/// layer, or a crate outside a layer folder, is an error: the tree is the map.
pub fn members(root: &Path) -> Result<Vec<Member>, CheckError> {
    let crates = root.join("crates");
    let mut out = Vec::new();
    for layer_dir in sorted_dirs(&crates)? {
        let folder = layer_dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        if layer_dir.join("Cargo.toml").is_file() {
            return Err(CheckError::Layout {
                path: layer_dir,
                message: "a crate directly under crates/; move it into its layer's folder"
                    .to_string(),
            });
        }
        let Some(layer) = Layer::from_folder(&folder) else {
            return Err(CheckError::Layout {
                path: layer_dir,
                message: format!(
                    "`{folder}` is not a layer; the folders under crates/ are {}",
                    Layer::ALL.map(Layer::folder).join(", ")
                ),
            });
        };
        for dir in sorted_dirs(&layer_dir)? {
            let manifest = dir.join("Cargo.toml");
            if !manifest.is_file() {
                continue;
            }
            let text = std::fs::read_to_string(&manifest).map_err(|source| CheckError::Read {
                path: manifest.clone(),
                source,
            })?;
            let (name, dependencies) = parse_manifest(&manifest, &text)?;
            out.push(Member {
                name,
                layer,
                dir,
                manifest,
                dependencies,
            });
        }
    }
    Ok(out)
}

/// Every normal or build dependency between workspace crates that its layer does not allow.
pub fn violations(members: &[Member]) -> Vec<Violation> {
    let mut out = Vec::new();
    for m in members {
        for d in m.dependencies.iter().filter(|d| !d.is_dev()) {
            let Some(to) = members.iter().find(|o| o.name == d.package) else {
                continue;
            };
            if !m.layer.may_depend_on(to.layer) {
                out.push(Violation {
                    manifest: m.manifest.clone(),
                    line: d.line,
                    from: m.name.clone(),
                    from_layer: m.layer,
                    to: to.name.clone(),
                    to_layer: to.layer,
                });
            }
        }
    }
    out
}

fn sorted_dirs(dir: &Path) -> Result<Vec<PathBuf>, CheckError> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|source| CheckError::Read {
            path: dir.to_path_buf(),
            source,
        })?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_dir())
        .collect();
    dirs.sort();
    Ok(dirs)
}

const SECTIONS: [&str; 3] = ["dependencies", "build-dependencies", "dev-dependencies"];

/// The package name and dependencies of one manifest.
fn parse_manifest(path: &Path, text: &str) -> Result<(String, Vec<Dependency>), CheckError> {
    let table: toml::Table = text.parse().map_err(|e: toml::de::Error| {
        let (line, column) = e.span().map(|s| line_col(text, s.start)).unwrap_or((0, 0));
        CheckError::Parse {
            path: path.to_path_buf(),
            line,
            column,
            message: e.message().to_string(),
        }
    })?;
    let name = table
        .get("package")
        .and_then(|p| p.get("name"))
        .and_then(toml::Value::as_str)
        .ok_or_else(|| CheckError::Layout {
            path: path.to_path_buf(),
            message: "no [package] name".to_string(),
        })?
        .to_string();
    let mut deps = Vec::new();
    let mut collect = |prefix: &str, t: &toml::Table| {
        for section in SECTIONS {
            let Some(entries) = t.get(section).and_then(toml::Value::as_table) else {
                continue;
            };
            for (key, value) in entries {
                let package = value
                    .get("package")
                    .and_then(toml::Value::as_str)
                    .unwrap_or(key)
                    .to_string();
                deps.push(Dependency {
                    package,
                    section: format!("{prefix}{section}"),
                    line: entry_line(text, key),
                });
            }
        }
    };
    collect("", &table);
    if let Some(targets) = table.get("target").and_then(toml::Value::as_table) {
        for (cfg, t) in targets {
            if let Some(t) = t.as_table() {
                collect(&format!("target.{cfg}."), t);
            }
        }
    }
    Ok((name, deps))
}

/// The line of the first entry `key` (as `key =` or `key.workspace`), for messages; 0 when not
/// found as such (an inline table of a table, say).
fn entry_line(text: &str, key: &str) -> usize {
    text.lines()
        .position(|l| {
            let l = l.trim_start();
            l.strip_prefix(key)
                .is_some_and(|rest| rest.trim_start().starts_with(['=', '.']))
        })
        .map_or(0, |i| i + 1)
}

fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let column = before.len() - before.rfind('\n').map_or(0, |i| i + 1) + 1;
    (line, column)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_product_layers_only_look_down_and_decisions_stay_pure() {
        use Layer::*;
        assert!(Runtime.may_depend_on(Edge));
        assert!(Edge.may_depend_on(Driver));
        assert!(!Decide.may_depend_on(Driver));
        assert!(!Decide.may_depend_on(Edge));
        assert!(!Core.may_depend_on(Decide));
        assert!(!Edge.may_depend_on(Runtime));
        for product in [Core, Driver, Decide, Edge, Runtime] {
            assert!(!product.may_depend_on(Sim), "{product}");
            assert!(!product.may_depend_on(Tools), "{product}");
            assert!(!product.may_depend_on(Testing), "{product}");
        }
        assert!(Bin.may_depend_on(Sim));
        assert!(!Bin.may_depend_on(Testing));
        assert!(Testing.may_depend_on(Bin));
    }

    #[test]
    fn a_manifest_gives_its_dependencies_renames_and_lines() {
        let text = "[package]\nname = \"a\"\n\n[dependencies]\nb.workspace = true\nrenamed = { package = \"c\", path = \"../c\" }\n\n[dev-dependencies]\nd = { path = \"../d\" }\n\n[target.'cfg(unix)'.build-dependencies]\ne = \"1\"\n";
        let (name, deps) = parse_manifest(Path::new("x/Cargo.toml"), text).unwrap();
        assert_eq!(name, "a");
        let got: Vec<_> = deps
            .iter()
            .map(|d| (d.package.as_str(), d.section.as_str(), d.line, d.is_dev()))
            .collect();
        assert_eq!(
            got,
            [
                ("b", "dependencies", 5, false),
                ("c", "dependencies", 6, false),
                ("d", "dev-dependencies", 9, true),
                ("e", "target.cfg(unix).build-dependencies", 12, false),
            ]
        );
    }

    #[test]
    fn a_broken_manifest_is_an_error_naming_its_line() {
        let err = parse_manifest(Path::new("x/Cargo.toml"), "[package]\nname = \n").unwrap_err();
        let msg = err.to_string();
        assert!(msg.starts_with("x/Cargo.toml:2:"), "{msg}");
    }
}
