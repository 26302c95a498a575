//! mig-parted hooks files: commands run at fixed points of an apply.
//!
//! Order, as mig-parted: `apply-start`, then `pre-apply-mode` (only when a mode changes), then
//! `pre-apply-config` (only when a layout changes), and `apply-exit` always, even after a failure.

use crate::MigError;
use serde::Deserialize;
use std::collections::BTreeMap;

/// The points at which hooks run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HookPoint {
    ApplyStart,
    PreApplyMode,
    PreApplyConfig,
    ApplyExit,
}

impl HookPoint {
    pub fn name(self) -> &'static str {
        match self {
            HookPoint::ApplyStart => "apply-start",
            HookPoint::PreApplyMode => "pre-apply-mode",
            HookPoint::PreApplyConfig => "pre-apply-config",
            HookPoint::ApplyExit => "apply-exit",
        }
    }
}

/// One command to run.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Hook {
    pub command: String,
    #[serde(default)]
    pub args: Vec<String>,
    /// Extra environment for the command.
    #[serde(default)]
    pub envs: BTreeMap<String, String>,
    /// Working directory (default: the current one).
    #[serde(default)]
    pub workdir: Option<String>,
}

/// A parsed hooks file.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Hooks {
    pub version: String,
    #[serde(default)]
    pub hooks: HookLists,
}

/// Hooks per point.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct HookLists {
    #[serde(default)]
    pub apply_start: Vec<Hook>,
    #[serde(default)]
    pub pre_apply_mode: Vec<Hook>,
    #[serde(default)]
    pub pre_apply_config: Vec<Hook>,
    #[serde(default)]
    pub apply_exit: Vec<Hook>,
}

impl Hooks {
    /// Parses a hooks file; `origin` names it in errors.
    /// Reads a hooks file's text from `reader` through the shared size and encoding check (at
    /// most [`gpuops_yamlpos::MAX_CONFIG_BYTES`], UTF-8) and parses it as [`Hooks::parse`] does.
    pub fn read(reader: impl std::io::Read, origin: &str) -> Result<Hooks, MigError> {
        let text = gpuops_yamlpos::read_text(
            reader,
            gpuops_yamlpos::MAX_CONFIG_BYTES,
            "a mig-parted hooks file",
        )
        .map_err(|e| MigError::Hooks {
            origin: origin.to_string(),
            message: e.to_string(),
        })?;
        Hooks::parse(&text, origin)
    }

    pub fn parse(text: &str, origin: &str) -> Result<Hooks, MigError> {
        let err = |message: String| MigError::Hooks {
            origin: origin.to_string(),
            message,
        };
        let hooks: Hooks = serde_saphyr::from_str(text).map_err(|e| {
            let tree: Option<gpuops_yamlpos::SNode> = serde_saphyr::from_str(text).ok();
            let p = gpuops_yamlpos::explain(&e, tree.as_ref(), text);
            match (p.line, p.column) {
                (Some(l), Some(c)) => err(format!("line {l} column {c}: {}", p.message)),
                _ => err(p.message),
            }
        })?;
        if hooks.version != "v1" {
            return Err(err(format!(
                "version {:?} is not supported (use v1)",
                hooks.version
            )));
        }
        for point in [
            HookPoint::ApplyStart,
            HookPoint::PreApplyMode,
            HookPoint::PreApplyConfig,
            HookPoint::ApplyExit,
        ] {
            if hooks.at(point).iter().any(|h| h.command.trim().is_empty()) {
                return Err(err(format!("a {} hook has an empty command", point.name())));
            }
        }
        Ok(hooks)
    }

    /// The hooks to run at a point, in file order.
    pub fn at(&self, point: HookPoint) -> &[Hook] {
        match point {
            HookPoint::ApplyStart => &self.hooks.apply_start,
            HookPoint::PreApplyMode => &self.hooks.pre_apply_mode,
            HookPoint::PreApplyConfig => &self.hooks.pre_apply_config,
            HookPoint::ApplyExit => &self.hooks.apply_exit,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_point_and_rejects_bad_files() {
        let text = "version: v1\nhooks:\n  apply-start:\n    - command: /bin/echo\n      args: [start]\n      envs: {A: b}\n  apply-exit:\n    - command: /bin/true\n      workdir: /\n";
        let h = Hooks::parse(text, "hooks.yaml").unwrap();
        assert_eq!(h.at(HookPoint::ApplyStart)[0].args, vec!["start"]);
        assert_eq!(h.at(HookPoint::ApplyStart)[0].envs["A"], "b");
        assert_eq!(h.at(HookPoint::ApplyExit)[0].workdir.as_deref(), Some("/"));
        assert!(h.at(HookPoint::PreApplyMode).is_empty());
        for (bad, needle) in [
            ("version: v2\n", "version"),
            ("version: v1\nhooks:\n  apply-begin: []\n", "unknown field"),
            (
                "version: v1\nhooks:\n  apply-start:\n    - args: [x]\n",
                "command",
            ),
            (
                "version: v1\nhooks:\n  apply-start:\n    - command: ' '\n",
                "empty command",
            ),
            (
                "version: v1\nhooks:\n  apply-start:\n    - command: /bin/true\n      args: 3\n",
                "line 5 column 13: hooks.apply-start[0].args: 3: ",
            ),
        ] {
            let e = Hooks::parse(bad, "h.yaml").unwrap_err().to_string();
            assert!(e.contains("h.yaml") && e.contains(needle), "{bad:?}: {e}");
        }
        let utf16: Vec<u8> = text.encode_utf16().flat_map(u16::to_le_bytes).collect();
        let e = Hooks::read(&utf16[..], "h.yaml").unwrap_err().to_string();
        assert!(
            e.starts_with("hooks file h.yaml: the file is UTF-16 (little-endian) text"),
            "{e}"
        );
        assert!(Hooks::read(text.as_bytes(), "h.yaml").is_ok());
    }
}
