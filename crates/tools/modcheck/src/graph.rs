//! Resolves the named paths to modules and finds the rings (strongly connected components).

use crate::load::{CrateModules, ModPath};
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

/// One dependency between two modules, at its first place.
#[derive(Debug, Clone, PartialEq)]
pub struct Edge {
    pub from: String,
    pub to: String,
    pub file: PathBuf,
    pub line: usize,
    pub column: usize,
}

/// Modules that depend on each other in a ring, and the edges that close it.
#[derive(Debug, Clone, PartialEq)]
pub struct Cycle {
    /// Sorted module names (`cmd::agent`).
    pub modules: Vec<String>,
    pub edges: Vec<Edge>,
}

impl std::fmt::Display for Cycle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "cycle {}", self.modules.join(" <-> "))?;
        for e in &self.edges {
            writeln!(
                f,
                "    {} -> {}  ({}:{}:{})",
                e.from,
                e.to,
                e.file.display(),
                e.line,
                e.column
            )?;
        }
        Ok(())
    }
}

fn name(path: &[String]) -> String {
    if path.is_empty() {
        "crate".to_string()
    } else {
        path.join("::")
    }
}

fn related(a: &[String], b: &[String]) -> bool {
    a.starts_with(b) || b.starts_with(a)
}

/// The module `segments` lands in when named from `from`, if it is one of this crate's.
fn resolve(
    c: &CrateModules,
    aliases: &BTreeMap<ModPath, BTreeMap<String, ModPath>>,
    from: &[String],
    segments: &[String],
) -> Option<(ModPath, usize)> {
    let (mut base, mut rest): (ModPath, &[String]) = match segments.first()?.as_str() {
        "crate" => (Vec::new(), &segments[1..]),
        "self" => (from.to_vec(), &segments[1..]),
        "super" => {
            let mut base = from.to_vec();
            let mut rest = segments;
            while rest.first().is_some_and(|s| s == "super") {
                base.pop()?;
                rest = &rest[1..];
            }
            (base, rest)
        }
        first => {
            let mut child = from.to_vec();
            child.push(first.to_string());
            if c.is_module(&child) {
                (child, &segments[1..])
            } else if let Some(target) = aliases.get(from).and_then(|a| a.get(first)) {
                (target.clone(), &segments[1..])
            } else {
                return None;
            }
        }
    };
    while let Some(next) = rest.first() {
        let mut deeper = base.clone();
        deeper.push(next.clone());
        if !c.is_module(&deeper) {
            break;
        }
        base = deeper;
        rest = &rest[1..];
    }
    Some((base, rest.len()))
}

/// The edges between unrelated modules (neither an ancestor of the other), first place each.
pub fn edges(c: &CrateModules) -> Vec<Edge> {
    // Module aliases from `use` first, so `use crate::cmd; cmd::agent::f()` lands in cmd::agent.
    let mut aliases: BTreeMap<ModPath, BTreeMap<String, ModPath>> = BTreeMap::new();
    for _ in 0..3 {
        for (module, refs) in &c.modules {
            for r in refs {
                let Some(alias) = &r.alias else { continue };
                // Only a use whose whole path is a module binds a module name.
                if let Some((target, 0)) = resolve(c, &aliases, module, &r.segments) {
                    aliases
                        .entry(module.clone())
                        .or_default()
                        .insert(alias.clone(), target);
                }
            }
        }
    }
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    for (module, refs) in &c.modules {
        for r in refs {
            let Some((target, _)) = resolve(c, &aliases, module, &r.segments) else {
                continue;
            };
            if related(module, &target) {
                continue;
            }
            if seen.insert((module.clone(), target.clone())) {
                out.push(Edge {
                    from: name(module),
                    to: name(&target),
                    file: r.file.clone(),
                    line: r.line,
                    column: r.column,
                });
            }
        }
    }
    out
}

/// Every ring of modules in the crate, with the edges inside it.
pub fn cycles(c: &CrateModules) -> Vec<Cycle> {
    let all = edges(c);
    let nodes: BTreeSet<&str> = all
        .iter()
        .flat_map(|e| [e.from.as_str(), e.to.as_str()])
        .collect();
    let index: BTreeMap<&str, usize> = nodes.iter().enumerate().map(|(i, n)| (*n, i)).collect();
    let names: Vec<&str> = nodes.iter().copied().collect();
    let mut adjacency = vec![Vec::new(); names.len()];
    for e in &all {
        adjacency[index[e.from.as_str()]].push(index[e.to.as_str()]);
    }
    let components = tarjan(&adjacency);
    let mut out = Vec::new();
    for comp in components {
        if comp.len() < 2 {
            continue;
        }
        let members: BTreeSet<&str> = comp.iter().map(|&i| names[i]).collect();
        let mut modules: Vec<String> = members.iter().map(|s| s.to_string()).collect();
        modules.sort();
        let edges = all
            .iter()
            .filter(|e| members.contains(e.from.as_str()) && members.contains(e.to.as_str()))
            .cloned()
            .collect();
        out.push(Cycle { modules, edges });
    }
    out.sort_by(|a, b| a.modules.cmp(&b.modules));
    out
}

/// Strongly connected components, iteratively (no recursion depth to worry about).
fn tarjan(adjacency: &[Vec<usize>]) -> Vec<Vec<usize>> {
    let n = adjacency.len();
    let mut index = vec![usize::MAX; n];
    let mut low = vec![0; n];
    let mut on_stack = vec![false; n];
    let mut stack = Vec::new();
    let mut next = 0;
    let mut out = Vec::new();
    for start in 0..n {
        if index[start] != usize::MAX {
            continue;
        }
        // (node, next child position)
        let mut work = vec![(start, 0usize)];
        index[start] = next;
        low[start] = next;
        next += 1;
        stack.push(start);
        on_stack[start] = true;
        while let Some(&mut (v, ref mut child)) = work.last_mut() {
            if let Some(&w) = adjacency[v].get(*child) {
                *child += 1;
                if index[w] == usize::MAX {
                    index[w] = next;
                    low[w] = next;
                    next += 1;
                    stack.push(w);
                    on_stack[w] = true;
                    work.push((w, 0));
                } else if on_stack[w] {
                    low[v] = low[v].min(index[w]);
                }
                continue;
            }
            work.pop();
            if let Some(&(parent, _)) = work.last() {
                low[parent] = low[parent].min(low[v]);
            }
            if low[v] == index[v] {
                let mut comp = Vec::new();
                while let Some(w) = stack.pop() {
                    on_stack[w] = false;
                    comp.push(w);
                    if w == v {
                        break;
                    }
                }
                out.push(comp);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;
    use crate::load_crate;

    fn krate(files: &[(&str, &str)]) -> (tempfile::TempDir, CrateModules) {
        let dir = tempfile::tempdir().unwrap();
        for (path, text) in files {
            let p = dir.path().join(path);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, text).unwrap();
        }
        let c = load_crate(&dir.path().join("src/lib.rs")).unwrap();
        (dir, c)
    }

    #[test]
    fn two_siblings_naming_each_other_are_a_cycle_with_both_places() {
        let (_d, c) = krate(&[
            ("src/lib.rs", "mod a;\nmod b;\n"),
            ("src/a.rs", "use crate::b::thing;\npub fn clock() {}\n"),
            ("src/b.rs", "pub fn thing() { super::a::clock(); }\n"),
        ]);
        let found = cycles(&c);
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].modules, ["a", "b"]);
        let text = found[0].to_string();
        assert!(
            text.contains("a -> b") && text.contains("a.rs:1:15"),
            "{text}"
        );
        assert!(
            text.contains("b -> a") && text.contains("b.rs:1:18"),
            "{text}"
        );
    }

    #[test]
    fn parents_and_children_and_one_way_siblings_are_no_cycle() {
        let (_d, c) = krate(&[
            (
                "src/lib.rs",
                "mod a;\nmod b;\npub struct Shared;\npub use a::f;\n",
            ),
            (
                "src/a.rs",
                "use crate::Shared;\nuse crate::b::g;\npub fn f() {}\n#[cfg(test)]\nmod tests { use super::*; }\n",
            ),
            ("src/b.rs", "pub fn g(_: crate::Shared) {}\n"),
        ]);
        assert!(cycles(&c).is_empty(), "{:?}", cycles(&c));
        assert_eq!(edges(&c).len(), 1, "{:?}", edges(&c));
    }

    #[test]
    fn module_aliases_macros_and_nested_directories_resolve() {
        let (_d, c) = krate(&[
            ("src/lib.rs", "mod cmd;\nmod exporter;\n"),
            ("src/cmd/mod.rs", "pub mod agent;\n"),
            (
                "src/cmd/agent.rs",
                "pub fn clock() {}\nfn run() { crate::exporter::go(); }\n",
            ),
            (
                "src/exporter.rs",
                "use crate::cmd;\npub fn go() { println!(\"{}\", 1); tokio::select! { _ = x => cmd::agent::clock() } }\n",
            ),
        ]);
        // The alias edge goes to `cmd` (the use) and, inside the macro, `cmd::agent` is not
        // a crate:: path: the use edge alone makes exporter -> cmd, an ancestor of cmd::agent.
        let found = cycles(&c);
        assert!(found.is_empty(), "{found:?}");
        let (_d, c) = krate(&[
            ("src/lib.rs", "mod cmd;\nmod exporter;\n"),
            ("src/cmd/mod.rs", "pub mod agent;\n"),
            (
                "src/cmd/agent.rs",
                "pub fn clock() {}\nfn run() { crate::exporter::go(); }\n",
            ),
            (
                "src/exporter.rs",
                "pub fn go() { tokio::select! { _ = x => crate::cmd::agent::clock() } }\n",
            ),
        ]);
        let found = cycles(&c);
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].modules, ["cmd::agent", "exporter"]);
    }

    #[test]
    fn path_attributes_and_three_module_rings() {
        let (_d, c) = krate(&[
            ("src/lib.rs", "mod cmd;\n"),
            (
                "src/cmd/mod.rs",
                "#[path = \"../ext/p.rs\"]\npub mod p;\n#[path = \"../ext/q.rs\"]\npub mod q;\npub mod r;\n",
            ),
            ("src/ext/p.rs", "use super::q::x;\n"),
            ("src/ext/q.rs", "pub fn x() { super::r::y() }\n"),
            ("src/cmd/r.rs", "pub fn y() { crate::cmd::p::z() }\n"),
        ]);
        let found = cycles(&c);
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].modules, ["cmd::p", "cmd::q", "cmd::r"]);
    }

    #[test]
    fn a_missing_module_file_names_the_declaration() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("src")).unwrap();
        std::fs::write(dir.path().join("src/lib.rs"), "\nmod gone;\n").unwrap();
        let err = load_crate(&dir.path().join("src/lib.rs")).unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("lib.rs:2:5") && text.contains("gone.rs"),
            "{text}"
        );
        std::fs::write(dir.path().join("src/lib.rs"), "fn x( {}\n").unwrap();
        let err = load_crate(&dir.path().join("src/lib.rs")).unwrap_err();
        assert!(err.to_string().contains("lib.rs:1:"), "{err}");
    }

    #[test]
    fn the_allow_list_covers_only_cycles_inside_an_entry() {
        let list = crate::parse_allow_list(
            std::path::Path::new("allow"),
            "# known\ngpuops: cmd::agent exporter mig_flow\n",
        )
        .unwrap();
        let cycle = |m: &[&str]| Cycle {
            modules: m.iter().map(|s| s.to_string()).collect(),
            edges: Vec::new(),
        };
        assert!(crate::allowed_by(&list, "gpuops", &cycle(&["cmd::agent", "exporter"])).is_some());
        assert!(crate::allowed_by(&list, "gpuops", &cycle(&["cmd::agent", "watch"])).is_none());
        assert!(crate::allowed_by(&list, "other", &cycle(&["cmd::agent", "exporter"])).is_none());
        let err =
            crate::parse_allow_list(std::path::Path::new("allow"), "\nnocolon\n").unwrap_err();
        assert!(err.to_string().starts_with("allow:2:"), "{err}");
    }
}
