//! Reads a crate's module tree from its root file and collects the paths each module names.

use crate::CheckError;
use proc_macro2::{TokenStream, TokenTree};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use syn::visit::Visit;

/// A module's path from the crate root (`["cmd", "agent"]`; the root is empty).
pub type ModPath = Vec<String>;

/// A path named in a module, as written, with where.
#[derive(Debug, Clone)]
pub struct Reference {
    pub segments: Vec<String>,
    pub file: PathBuf,
    pub line: usize,
    pub column: usize,
    /// From a `use` item: its last segment may name a module, bound under `alias`.
    pub alias: Option<String>,
}

/// Every module of one crate with the paths it names.
#[derive(Debug, Default)]
pub struct CrateModules {
    pub modules: BTreeMap<ModPath, Vec<Reference>>,
    pub files: BTreeMap<ModPath, PathBuf>,
}

impl CrateModules {
    pub fn is_module(&self, path: &[String]) -> bool {
        self.modules.contains_key(path)
    }
}

/// Loads the crate whose root is `root` (`src/lib.rs`, `src/main.rs`).
pub fn load_crate(root: &Path) -> Result<CrateModules, CheckError> {
    let mut out = CrateModules::default();
    let dir = root.parent().unwrap_or(Path::new(".")).to_path_buf();
    load_file(root, Vec::new(), dir, &mut out)?;
    Ok(out)
}

fn load_file(
    file: &Path,
    module: ModPath,
    dir: PathBuf,
    out: &mut CrateModules,
) -> Result<(), CheckError> {
    let text = std::fs::read_to_string(file).map_err(|source| CheckError::Read {
        path: file.to_path_buf(),
        source,
    })?;
    let parsed = syn::parse_file(&text).map_err(|e| {
        let start = e.span().start();
        CheckError::Parse {
            path: file.to_path_buf(),
            line: start.line,
            column: start.column + 1,
            message: e.to_string(),
        }
    })?;
    out.files.insert(module.clone(), file.to_path_buf());
    load_items(file, &parsed.items, module, &dir, false, out)
}

/// `dir` is where the children of `module` live (`src/` for the root, `src/cmd/` for `cmd`).
fn load_items(
    file: &Path,
    items: &[syn::Item],
    module: ModPath,
    dir: &Path,
    inline: bool,
    out: &mut CrateModules,
) -> Result<(), CheckError> {
    out.modules.entry(module.clone()).or_default();
    // `#[path]` outside inline modules is relative to the declaring file's directory.
    let path_base = if inline {
        dir.to_path_buf()
    } else {
        file.parent().unwrap_or(dir).to_path_buf()
    };
    for item in items {
        match item {
            syn::Item::Mod(m) => {
                let name = m.ident.to_string();
                let mut child = module.clone();
                child.push(name.clone());
                let explicit = path_attribute(&m.attrs);
                match &m.content {
                    Some((_, inner)) => {
                        let child_dir = match &explicit {
                            Some(p) => path_base.join(p),
                            None => dir.join(&name),
                        };
                        out.files.insert(child.clone(), file.to_path_buf());
                        load_items(file, inner, child, &child_dir, true, out)?;
                    }
                    None => {
                        let candidates = match &explicit {
                            Some(p) => vec![path_base.join(p)],
                            None => vec![
                                dir.join(format!("{name}.rs")),
                                dir.join(&name).join("mod.rs"),
                            ],
                        };
                        let Some(found) = candidates.iter().find(|c| c.is_file()) else {
                            let start = m.ident.span().start();
                            return Err(CheckError::MissingModule {
                                path: file.to_path_buf(),
                                line: start.line,
                                column: start.column + 1,
                                module: name,
                                candidates: candidates
                                    .iter()
                                    .map(|c| c.display().to_string())
                                    .collect::<Vec<_>>()
                                    .join(", "),
                            });
                        };
                        // A `mod.rs` (or a `#[path]` file) keeps its children beside it; `x.rs`
                        // keeps them in `x/`.
                        let child_dir = if explicit.is_some()
                            || found.file_name().is_some_and(|f| f == "mod.rs")
                        {
                            found.parent().unwrap_or(dir).to_path_buf()
                        } else {
                            dir.join(&name)
                        };
                        load_file(found, child, child_dir, out)?;
                    }
                }
            }
            other => {
                let mut visitor = Collector {
                    file,
                    found: Vec::new(),
                };
                visitor.visit_item(other);
                out.modules
                    .entry(module.clone())
                    .or_default()
                    .extend(visitor.found);
            }
        }
    }
    Ok(())
}

fn path_attribute(attrs: &[syn::Attribute]) -> Option<String> {
    attrs.iter().find_map(|a| {
        if !a.path().is_ident("path") {
            return None;
        }
        match &a.meta {
            syn::Meta::NameValue(nv) => match &nv.value {
                syn::Expr::Lit(syn::ExprLit {
                    lit: syn::Lit::Str(s),
                    ..
                }) => Some(s.value()),
                _ => None,
            },
            _ => None,
        }
    })
}

struct Collector<'a> {
    file: &'a Path,
    found: Vec<Reference>,
}

impl Collector<'_> {
    fn push(&mut self, segments: Vec<String>, span: proc_macro2::Span, alias: Option<String>) {
        if segments.is_empty() {
            return;
        }
        let start = span.start();
        self.found.push(Reference {
            segments,
            file: self.file.to_path_buf(),
            line: start.line,
            column: start.column + 1,
            alias,
        });
    }

    fn use_tree(&mut self, prefix: &mut Vec<String>, tree: &syn::UseTree) {
        match tree {
            syn::UseTree::Path(p) => {
                prefix.push(p.ident.to_string());
                self.use_tree(prefix, &p.tree);
                prefix.pop();
            }
            syn::UseTree::Name(n) => {
                let name = n.ident.to_string();
                let mut segments = prefix.clone();
                let alias = if name == "self" {
                    prefix.last().cloned()
                } else {
                    segments.push(name.clone());
                    Some(name)
                };
                self.push(segments, n.ident.span(), alias);
            }
            syn::UseTree::Rename(r) => {
                let mut segments = prefix.clone();
                if r.ident != "self" {
                    segments.push(r.ident.to_string());
                }
                self.push(segments, r.ident.span(), Some(r.rename.to_string()));
            }
            syn::UseTree::Glob(g) => {
                self.push(prefix.clone(), g.star_token.spans[0], None);
            }
            syn::UseTree::Group(g) => {
                for t in &g.items {
                    self.use_tree(prefix, t);
                }
            }
        }
    }

    /// Paths inside macro calls (`tokio::select!`, `format!`) are tokens, not syntax: take every
    /// `crate::`/`super::`/`self::` run of identifiers.
    fn tokens(&mut self, tokens: TokenStream) {
        let trees: Vec<TokenTree> = tokens.into_iter().collect();
        let mut i = 0;
        while i < trees.len() {
            match &trees[i] {
                TokenTree::Group(g) => {
                    self.tokens(g.stream());
                    i += 1;
                }
                TokenTree::Ident(id) if id == "crate" || id == "super" || id == "self" => {
                    let span = id.span();
                    let mut segments = vec![id.to_string()];
                    let mut j = i + 1;
                    while let (Some(TokenTree::Punct(a)), Some(TokenTree::Punct(b))) =
                        (trees.get(j), trees.get(j + 1))
                    {
                        if a.as_char() != ':' || b.as_char() != ':' {
                            break;
                        }
                        match trees.get(j + 2) {
                            Some(TokenTree::Ident(next)) => {
                                segments.push(next.to_string());
                                j += 3;
                            }
                            _ => break,
                        }
                    }
                    if segments.len() > 1 {
                        self.push(segments, span, None);
                    }
                    i = j.max(i + 1);
                }
                _ => i += 1,
            }
        }
    }
}

impl<'ast> Visit<'ast> for Collector<'_> {
    fn visit_item_use(&mut self, u: &'ast syn::ItemUse) {
        let mut prefix = Vec::new();
        self.use_tree(&mut prefix, &u.tree);
    }

    fn visit_path(&mut self, p: &'ast syn::Path) {
        let segments: Vec<String> = p.segments.iter().map(|s| s.ident.to_string()).collect();
        if segments.len() > 1 || segments.first().is_some_and(|s| s == "super") {
            let span = p
                .segments
                .first()
                .map(|s| s.ident.span())
                .unwrap_or_else(proc_macro2::Span::call_site);
            self.push(segments, span, None);
        }
        syn::visit::visit_path(self, p);
    }

    fn visit_macro(&mut self, m: &'ast syn::Macro) {
        self.visit_path(&m.path);
        self.tokens(m.tokens.clone());
    }

    // Inline modules inside functions are rare and not part of the module tree: skip nothing,
    // their paths count for the enclosing module.
}
