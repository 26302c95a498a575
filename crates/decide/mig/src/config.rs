//! mig-parted `version: v1` configs: parsing (plain files, and Kubernetes ConfigMaps that hold one),
//! validation with `file:line:column` errors, rendering back to YAML, and NVIDIA's shipped named
//! configs for the catalog's MIG-capable models.
//!
//! The format, exactly as mig-parted reads it:
//!
//! ```yaml
//! version: v1
//! mig-configs:
//!   <name>:
//!     - devices: all            # or a list of GPU indices [0, 1]
//!       device-filter: ["0x233010DE"]   # optional; a string or a list; optional ":0xSSSSVVVV"
//!       mig-enabled: true
//!       mig-devices:            # required when mig-enabled (may be {}), absent/empty when false
//!         "1g.10gb": 2
//!         "3g.40gb": 1
//! ```
//!
//! The text is read into a location-carrying YAML tree first and validated by hand, so every
//! problem is reported with the file, line and column it comes from and the config it is in,
//! rather than as a generic deserialization error. Profile names are checked for syntax only;
//! whether a GPU model offers a profile is the planner's business.

pub use crate::error::Position;
use crate::error::closest;
use crate::error::{FilterPart, HexIdProblem, MigError};
use gpuops_catalog::{GpuModel, ProfileName};
use gpuops_yamlpos::{Node, SNode, map_get};
use serde_saphyr::Location;
use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

/// A whole mig-parted config file: named configs in file order.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct MigPartedConfig {
    pub configs: Vec<NamedConfig>,
}

/// One named config (`all-1g.10gb`): its device entries, applied in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamedConfig {
    pub name: String,
    pub entries: Vec<DeviceSpec>,
}

/// One entry of a named config: which GPUs it selects and the MIG state it asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceSpec {
    pub devices: Devices,
    /// Empty: every GPU model. Otherwise a GPU matches if any filter matches.
    pub filters: Vec<DeviceFilter>,
    pub mig_enabled: bool,
    /// Canonical profile name (`1g.10gb`, `1c.3g.40gb`, `1g.10gb+me`) to count. Zero counts are
    /// dropped while parsing; empty when `mig_enabled` is false.
    pub mig_devices: BTreeMap<String, u32>,
    /// Line where the entry starts (in the outer file for ConfigMaps); 0 when built in code.
    pub line: u64,
}

/// The `devices` field: `all`, or explicit GPU indices (deduplicated, in the order written).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Devices {
    All,
    List(Vec<u32>),
}

/// One `device-filter` value: `0xDDDDVVVV` (PCI device id << 16 | vendor id), optionally followed
/// by `:0xSSSSVVVV` (the PCI subsystem id).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DeviceFilter {
    /// Full 32-bit id as NVML's `pciDeviceId` reports it, e.g. `0x233010DE`.
    pub device: u32,
    /// Full 32-bit `pciSubSystemId`; `None` matches any subsystem.
    pub subsystem: Option<u32>,
}

impl DeviceFilter {
    /// Whether a GPU with these NVML ids matches the filter.
    pub fn matches(&self, pci_device_id: u32, pci_subsystem_id: u32) -> bool {
        self.device == pci_device_id && self.subsystem.is_none_or(|s| s == pci_subsystem_id)
    }

    /// The filter for an NVIDIA PCI device id (the upper 16 bits, e.g. `0x2330`).
    pub fn nvidia(device_id: u16) -> DeviceFilter {
        DeviceFilter {
            device: (u32::from(device_id) << 16) | 0x10DE,
            subsystem: None,
        }
    }
}

impl fmt::Display for DeviceFilter {
    /// `0x233010DE` or `0x233010DE:0x16C110DE` (upper-case hex digits, as NVIDIA writes them).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "0x{:08X}", self.device)?;
        if let Some(s) = self.subsystem {
            write!(f, ":0x{s:08X}")?;
        }
        Ok(())
    }
}

impl FromStr for DeviceFilter {
    type Err = MigError;

    /// Parses `0xDDDDVVVV[:0xSSSSVVVV]` (hex digits and the `0x` prefix in either case); the
    /// error says what is wrong and how to write it.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let text = s.trim();
        let (device, subsystem) = match text.split_once(':') {
            Some((d, sub)) => (d, Some(sub)),
            None => (text, None),
        };
        let bad = |part: FilterPart, problem: HexIdProblem| MigError::DeviceFilter {
            text: s.to_string(),
            part,
            problem,
        };
        let device = hex32(device).map_err(|problem| match subsystem {
            None => bad(FilterPart::Whole, problem),
            Some(_) => bad(FilterPart::Device(device.to_string()), problem),
        })?;
        let subsystem = subsystem
            .map(|sub| hex32(sub).map_err(|p| bad(FilterPart::Subsystem(sub.to_string()), p)))
            .transpose()?;
        Ok(DeviceFilter { device, subsystem })
    }
}

/// Parses `0x` + exactly 8 hex digits.
fn hex32(part: &str) -> Result<u32, HexIdProblem> {
    let Some(digits) = part.strip_prefix("0x").or_else(|| part.strip_prefix("0X")) else {
        return Err(HexIdProblem::NoPrefix);
    };
    let hex = !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_hexdigit());
    if hex && digits.len() <= 4 {
        return Err(HexIdProblem::Bare16Bit(digits.to_string()));
    }
    if !hex || digits.len() != 8 {
        return Err(HexIdProblem::NotEightDigits);
    }
    u32::from_str_radix(digits, 16).map_err(|_| HexIdProblem::NotEightDigits)
}

impl MigPartedConfig {
    /// The named config, or an error listing the names the file defines.
    pub fn get(&self, name: &str) -> Result<&NamedConfig, MigError> {
        self.configs
            .iter()
            .find(|c| c.name == name)
            .ok_or_else(|| MigError::UnknownConfig {
                name: name.to_string(),
                known: self.configs.iter().map(|c| c.name.clone()).collect(),
            })
    }

    /// Config names in file order.
    pub fn names(&self) -> Vec<&str> {
        self.configs.iter().map(|c| c.name.as_str()).collect()
    }

    /// Renders mig-parted v1 YAML, in the style of NVIDIA's shipped files; [`parse`] reads it back
    /// to an equal config (except `line`).
    pub fn to_yaml(&self) -> String {
        if self.configs.is_empty() {
            return "version: v1\nmig-configs: {}\n".to_string();
        }
        let mut out = String::from("version: v1\nmig-configs:\n");
        for config in &self.configs {
            out.push_str(&format!("  {}:\n", yaml_key(&config.name)));
            for entry in &config.entries {
                let devices = match &entry.devices {
                    Devices::All => "all".to_string(),
                    Devices::List(list) => format!(
                        "[{}]",
                        list.iter()
                            .map(u32::to_string)
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                };
                out.push_str(&format!("    - devices: {devices}\n"));
                if !entry.filters.is_empty() {
                    let filters: Vec<String> =
                        entry.filters.iter().map(|f| format!("\"{f}\"")).collect();
                    out.push_str(&format!("      device-filter: [{}]\n", filters.join(", ")));
                }
                out.push_str(&format!("      mig-enabled: {}\n", entry.mig_enabled));
                if entry.mig_enabled {
                    if entry.mig_devices.is_empty() {
                        out.push_str("      mig-devices: {}\n");
                    } else {
                        out.push_str("      mig-devices:\n");
                        for (profile, count) in &entry.mig_devices {
                            out.push_str(&format!("        {}: {count}\n", quote(profile)));
                        }
                    }
                }
            }
        }
        out
    }

    /// The same config as mig-parted's `export -o json` shape:
    /// `{"version": "v1", "mig-configs": {name: [{devices, device-filter?, mig-enabled, mig-devices?}]}}`.
    /// (JSON object keys come out sorted.)
    pub fn to_json(&self) -> serde_json::Value {
        use serde_json::{Map, Value, json};
        let mut configs = Map::new();
        for config in &self.configs {
            let entries: Vec<Value> = config
                .entries
                .iter()
                .map(|e| {
                    let mut m = Map::new();
                    m.insert(
                        "devices".into(),
                        match &e.devices {
                            Devices::All => json!("all"),
                            Devices::List(l) => json!(l),
                        },
                    );
                    if !e.filters.is_empty() {
                        let f: Vec<String> = e.filters.iter().map(ToString::to_string).collect();
                        m.insert("device-filter".into(), json!(f));
                    }
                    m.insert("mig-enabled".into(), json!(e.mig_enabled));
                    if e.mig_enabled {
                        m.insert("mig-devices".into(), json!(e.mig_devices));
                    }
                    Value::Object(m)
                })
                .collect();
            configs.insert(config.name.clone(), Value::Array(entries));
        }
        json!({"version": "v1", "mig-configs": configs})
    }
}

/// A double-quoted YAML string (JSON string syntax is valid YAML).
fn quote(s: &str) -> String {
    serde_json::Value::String(s.to_string()).to_string()
}

/// A mapping key: plain when that reads back as the same string, else double-quoted.
fn yaml_key(s: &str) -> String {
    let plain = s.chars().next().is_some_and(|c| c.is_ascii_alphabetic())
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        && !matches!(
            s.to_ascii_lowercase().as_str(),
            "y" | "n" | "yes" | "no" | "on" | "off" | "true" | "false" | "null" | "nan" | "inf"
        );
    if plain { s.to_string() } else { quote(s) }
}

// ---------------------------------------------------------------------------------------------
// Parsing

/// Parses and validates a mig-parted v1 config, or a Kubernetes ConfigMap manifest holding one in
/// `data."config.yaml"` (or in its only data key). `origin` names the file in errors (`-` = stdin).
///
/// A multi-document file (NVIDIA's mig-manager manifests: a DaemonSet, RBAC and several
/// ConfigMaps) is accepted when exactly one document is a mig-parted config or a ConfigMap holding
/// one; [`parse_selecting`] picks a ConfigMap by name when there are several.
pub fn parse(text: &str, origin: &str) -> Result<MigPartedConfig, MigError> {
    parse_selecting(text, origin, None)
}

/// Reads a mig-parted config's text from `reader` (at most
/// [`gpuops_yamlpos::MAX_CONFIG_BYTES`], UTF-8; a UTF-16 file or a binary one is named as such)
/// and parses it as [`parse_selecting`] does.
pub fn read_selecting(
    reader: impl std::io::Read,
    origin: &str,
    configmap: Option<&str>,
) -> Result<MigPartedConfig, MigError> {
    let text = gpuops_yamlpos::read_text(
        reader,
        gpuops_yamlpos::MAX_CONFIG_BYTES,
        "a mig-parted config",
    )
    .map_err(|e| {
        let (line, column) = match e {
            gpuops_yamlpos::YamlposError::NotUtf8 { line, column, .. } => {
                (Some(line), Some(column))
            }
            _ => (None, None),
        };
        MigError::Invalid {
            at: Position {
                origin: origin.to_string(),
                line,
                column,
            },
            config: None,
            message: e.to_string(),
        }
    })?;
    parse_selecting(&text, origin, configmap)
}

/// [`parse`], taking the config from the ConfigMap whose `metadata.name` is `configmap` when
/// given (an error lists the file's ConfigMaps and their lines when none has that name).
pub fn parse_selecting(
    text: &str,
    origin: &str,
    configmap: Option<&str>,
) -> Result<MigPartedConfig, MigError> {
    let file = Ctx {
        origin,
        source: text,
        place: Place::File,
        config: None,
    };
    let docs: Vec<SNode> = serde_saphyr::from_multiple(text).map_err(|e| file.yaml_err(&e))?;
    let docs: Vec<&SNode> = docs
        .iter()
        .filter(|d| !matches!(d.value, Node::Null))
        .collect();
    if docs.is_empty() {
        return Err(file.invalid_nowhere(
            "the file is empty: expected a mig-parted config (version: v1, mig-configs: ...)",
        ));
    }
    if let Some(name) = configmap {
        let maps: Vec<&SNode> = docs.iter().copied().filter(|d| is_configmap(d)).collect();
        return match maps.iter().find(|d| configmap_name(d) == Some(name)) {
            Some(doc) => parse_configmap(&file, doc),
            None => Err(file.invalid_nowhere(format!(
                "no ConfigMap named {} in the file ({})",
                quote(name),
                if maps.is_empty() {
                    "it has none".to_string()
                } else {
                    format!("it has {}", file.list_configmaps(&maps))
                }
            ))),
        };
    }
    let doc = match docs.as_slice() {
        [one] => *one,
        many => {
            let holding: Vec<&SNode> = many
                .iter()
                .copied()
                .filter(|d| is_plain_config(d) || holds_mig_config(d))
                .collect();
            match holding.as_slice() {
                [one] => *one,
                [] => {
                    let maps: Vec<&SNode> =
                        many.iter().copied().filter(|d| is_configmap(d)).collect();
                    let seen = if maps.is_empty() {
                        String::new()
                    } else {
                        format!(" (ConfigMaps: {})", file.list_configmaps(&maps))
                    };
                    return Err(file.invalid(
                        &many[0].referenced,
                        format!(
                            "none of the file's {} YAML documents is a mig-parted config or a ConfigMap holding one{seen}",
                            many.len()
                        ),
                    ));
                }
                several => {
                    let listed: Vec<String> = several
                        .iter()
                        .map(|d| match configmap_name(d) {
                            Some(n) if is_configmap(d) => {
                                format!("ConfigMap {} (line {})", quote(n), d.referenced.line())
                            }
                            _ if is_configmap(d) => {
                                format!("an unnamed ConfigMap (line {})", d.referenced.line())
                            }
                            _ => format!("a mig-parted config (line {})", d.referenced.line()),
                        })
                        .collect();
                    let maps = several.iter().filter(|d| is_configmap(d)).count();
                    let hint = if maps == several.len() {
                        "pick one with --configmap NAME"
                    } else if maps == 0 {
                        "keep one per file"
                    } else {
                        "keep one per file, or pick a ConfigMap with --configmap NAME"
                    };
                    return Err(file.invalid(
                        &several[1].referenced,
                        format!(
                            "{} YAML documents hold a mig-parted config: {}; {hint}",
                            several.len(),
                            listed.join(", ")
                        ),
                    ));
                }
            }
        }
    };
    let manifest = map_get(doc, "kind").is_some() || map_get(doc, "apiVersion").is_some();
    if manifest && !is_plain_config(doc) {
        return parse_configmap(&file, doc);
    }
    file.clone().document(doc)
}

/// A document that is a mig-parted config itself (not a manifest holding one).
fn is_plain_config(doc: &SNode) -> bool {
    map_get(doc, "version").is_some() || map_get(doc, "mig-configs").is_some()
}

fn is_configmap(doc: &SNode) -> bool {
    map_get(doc, "kind").is_some_and(|(_, v)| matches!(&v.value, Node::Str(s) if s == "ConfigMap"))
}

/// `metadata.name` of a manifest.
fn configmap_name(doc: &SNode) -> Option<&str> {
    let (_, meta) = map_get(doc, "metadata")?;
    match &map_get(meta, "name")?.1.value {
        Node::Str(s) => Some(s),
        _ => None,
    }
}

/// A ConfigMap whose `config.yaml` (or any data value) is text with a `mig-configs` key, as
/// opposed to the other ConfigMaps NVIDIA's manifests carry (GPU clients, hooks).
fn holds_mig_config(doc: &SNode) -> bool {
    if !is_configmap(doc) {
        return false;
    }
    let Some((_, data)) = map_get(doc, "data") else {
        return false;
    };
    let Node::Map(items) = &data.value else {
        return false;
    };
    items.iter().any(|(_, v)| match &v.value {
        Node::Str(text) => text
            .lines()
            .any(|l| l.trim_start().starts_with("mig-configs:")),
        _ => false,
    })
}

/// Takes the config text out of a ConfigMap and parses it with positions in the outer file.
fn parse_configmap(file: &Ctx<'_>, doc: &SNode) -> Result<MigPartedConfig, MigError> {
    match map_get(doc, "kind") {
        None => {
            return Err(file.invalid(
                &doc.referenced,
                "a Kubernetes manifest without `kind`: expected a mig-parted config (version: v1) or a ConfigMap holding one",
            ));
        }
        Some((_, kind)) => match &kind.value {
            Node::Str(s) if s == "ConfigMap" => {}
            _ => {
                return Err(file.invalid(
                    &kind.referenced,
                    format!(
                        "a Kubernetes {} manifest: expected a mig-parted config (version: v1) or a ConfigMap holding one",
                        file.describe(kind)
                    ),
                ));
            }
        },
    }
    let Some((data_key, data)) = map_get(doc, "data") else {
        return Err(file.invalid(
            &doc.referenced,
            "the ConfigMap has no `data`: expected data.\"config.yaml\" holding the mig-parted config",
        ));
    };
    let Node::Map(items) = &data.value else {
        return Err(file.invalid(
            &data_key.referenced,
            format!(
                "the ConfigMap's data must be a mapping, got {}",
                file.describe(data)
            ),
        ));
    };
    let chosen = match map_get(data, "config.yaml") {
        Some(found) => found,
        None => match items.as_slice() {
            [(k, v)] => (k, v),
            _ => {
                let keys: Vec<String> = items.iter().map(|(k, _)| file.key_text(k)).collect();
                let listed = if keys.is_empty() {
                    "it has none".to_string()
                } else {
                    format!("it has {}", keys.join(", "))
                };
                return Err(file.invalid(
                    &data_key.referenced,
                    format!("the ConfigMap's data has no \"config.yaml\" key ({listed})"),
                ));
            }
        },
    };
    let (key, value) = chosen;
    let key_name = file.key_text(key);
    let Node::Str(inner) = &value.value else {
        return Err(file.invalid(
            &value.referenced,
            format!(
                "data.{} must be a string holding the mig-parted config, got {}",
                quote(&key_name),
                file.describe(value)
            ),
        ));
    };
    let place = embedded_place(file.source, inner, &value.referenced, &key_name);
    let ctx = Ctx {
        origin: file.origin,
        source: inner,
        place,
        config: None,
    };
    let doc: SNode = serde_saphyr::from_str(inner).map_err(|e| ctx.yaml_err(&e))?;
    if matches!(doc.value, Node::Null) {
        return Err(file.invalid(
            &value.referenced,
            format!("data.{} is empty", quote(&key_name)),
        ));
    }
    ctx.clone().document(&doc)
}

/// How positions inside an embedded string map to the outer file.
///
/// serde-saphyr places a block scalar at its first non-blank content line, at the content
/// indentation. When every content line is found verbatim at that indentation in the outer file
/// (a literal `|` block), lines and columns map exactly; otherwise (quoted or folded strings)
/// errors point at the value and name the inner position.
fn embedded_place(outer: &str, inner: &str, at: &Location, key: &str) -> Place {
    let approx = Place::Embedded {
        line: at.line(),
        column: at.column(),
        key: key.to_string(),
    };
    let leading_blank = inner.bytes().take_while(|&b| b == b'\n').count() as u64;
    if at.line() == 0 || at.column() == 0 || at.line() <= leading_blank {
        return approx;
    }
    let first_line = at.line() - leading_blank;
    let indent = at.column() - 1;
    let Ok(indent_bytes) = usize::try_from(indent) else {
        return approx;
    };
    let Ok(skip) = usize::try_from(first_line - 1) else {
        return approx;
    };
    let mut outer_lines = outer.lines().skip(skip);
    for inner_line in inner.lines() {
        let Some(outer_line) = outer_lines.next() else {
            return approx;
        };
        if inner_line.is_empty() {
            continue;
        }
        let matches = outer_line.len() >= indent_bytes
            && outer_line.as_bytes()[..indent_bytes]
                .iter()
                .all(|&b| b == b' ')
            && outer_line.get(indent_bytes..) == Some(inner_line);
        if !matches {
            return approx;
        }
    }
    Place::Block { first_line, indent }
}

/// Where the text being validated sits in the file the user gave.
#[derive(Debug, Clone)]
enum Place {
    /// The text is the file.
    File,
    /// A literal block scalar whose content line 1 is outer line `first_line`, indented `indent`.
    Block { first_line: u64, indent: u64 },
    /// Some other string value at `line:column`; inner positions are named in the message.
    Embedded { line: u64, column: u64, key: String },
}

/// Validation context: the text being read, where it sits, and the config being validated.
#[derive(Debug, Clone)]
struct Ctx<'a> {
    origin: &'a str,
    /// The text the nodes' byte spans index into.
    source: &'a str,
    place: Place,
    config: Option<String>,
}

/// The most MIG devices of one profile an entry may ask per GPU. No GPU has more than 7 slices
/// (A100 to B200), so the planner, which knows the model, rejects any count above 7; this bound
/// is only there so that no count reaches the planner's per-instance lists (a count of
/// 4,000,000,000 would be a list of 4 billion instances), and leaves room for future models.
pub const MAX_MIG_COUNT: u32 = 64;

const TOP_KEYS: &[&str] = &["version", "mig-configs"];
const ENTRY_KEYS: &[&str] = &["devices", "device-filter", "mig-enabled", "mig-devices"];

impl Ctx<'_> {
    /// Outer-file position of an inner location, plus a note for approximate placements.
    fn position(&self, loc: &Location) -> (Position, Option<String>) {
        let known = loc.line() > 0;
        let pos = |line: u64, column: u64| Position {
            origin: self.origin.to_string(),
            line: (line > 0).then_some(line),
            column: (line > 0 && column > 0).then_some(column),
        };
        match &self.place {
            Place::File => (pos(loc.line(), loc.column()), None),
            Place::Block { first_line, indent } if known => (
                pos(
                    first_line + loc.line() - 1,
                    if loc.column() > 0 {
                        loc.column() + indent
                    } else {
                        0
                    },
                ),
                None,
            ),
            Place::Block { .. } => (pos(0, 0), None),
            Place::Embedded { line, column, key } => (
                pos(*line, *column),
                known.then(|| {
                    format!(
                        " (line {}, column {} of data.{})",
                        loc.line(),
                        loc.column(),
                        quote(key)
                    )
                }),
            ),
        }
    }

    fn invalid(&self, loc: &Location, message: impl Into<String>) -> MigError {
        let (at, note) = self.position(loc);
        MigError::Invalid {
            at,
            config: self.config.clone(),
            message: message.into() + note.as_deref().unwrap_or(""),
        }
    }

    fn invalid_nowhere(&self, message: impl Into<String>) -> MigError {
        MigError::Invalid {
            at: Position {
                origin: self.origin.to_string(),
                line: None,
                column: None,
            },
            config: self.config.clone(),
            message: message.into(),
        }
    }

    fn yaml_err(&self, e: &serde_saphyr::Error) -> MigError {
        let loc = e.location().unwrap_or(Location::UNKNOWN);
        let (at, note) = self.position(&loc);
        let problem = gpuops_yamlpos::explain(e, None, self.source);
        let message = problem.message + note.as_deref().unwrap_or("");
        if problem.size_limit {
            // Well-formed, only too large: not "invalid YAML".
            return MigError::Invalid {
                at,
                config: None,
                message,
            };
        }
        MigError::Yaml { at, message }
    }

    /// The source text of a scalar, as written.
    fn raw(&self, loc: &Location) -> Option<&str> {
        let span = loc.span();
        let start = usize::try_from(span.byte_offset()?).ok()?;
        let len = usize::try_from(span.byte_len()?).ok()?;
        let text = self.source.get(start..start.checked_add(len)?)?.trim();
        (!text.is_empty()).then_some(text)
    }

    /// A value for "got ..." in messages: scalars as written, strings quoted, collections named.
    fn describe(&self, node: &SNode) -> String {
        match &node.value {
            Node::Str(s) => quote(s),
            Node::Seq(_) => "a list".into(),
            Node::Map(_) => "a mapping".into(),
            Node::Null => self
                .raw(&node.referenced)
                .map_or_else(|| "nothing".into(), str::to_string),
            Node::Bool(b) => self
                .raw(&node.referenced)
                .map_or_else(|| b.to_string(), str::to_string),
            Node::Int(i) => self
                .raw(&node.referenced)
                .map_or_else(|| i.to_string(), str::to_string),
            Node::Float(x) => self
                .raw(&node.referenced)
                .map_or_else(|| x.to_string(), str::to_string),
        }
    }

    /// `"a" (line 3), "b" (line 40)`: the ConfigMaps of a file, for messages.
    fn list_configmaps(&self, maps: &[&SNode]) -> String {
        maps.iter()
            .map(|d| {
                let name = configmap_name(d).map_or_else(|| "(unnamed)".to_string(), quote);
                format!("{name} (line {})", d.referenced.line())
            })
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// A mapping key as text: strings as they are, other scalars as written (`yes`, `0`).
    fn key_text(&self, key: &SNode) -> String {
        match &key.value {
            Node::Str(s) => s.clone(),
            _ => self.describe(key),
        }
    }

    /// A mapping key that must be a scalar.
    fn scalar_key(&self, key: &SNode, what: &str) -> Result<String, MigError> {
        match &key.value {
            Node::Seq(_) | Node::Map(_) => Err(self.invalid(
                &key.referenced,
                format!("{what} must be a plain string, got {}", self.describe(key)),
            )),
            _ => Ok(self.key_text(key)),
        }
    }

    fn unknown_key(&self, key: &SNode, name: &str, known: &[&str], within: &str) -> MigError {
        let hint = closest(name, known.iter().copied())
            .map_or_else(String::new, |k| format!(" (did you mean {k}?)"));
        self.invalid(
            &key.referenced,
            format!(
                "unknown key {} {within}{hint}; allowed keys: {}",
                quote(name),
                known.join(", ")
            ),
        )
    }

    /// Validates a whole config document (the top-level mapping).
    fn document(mut self, doc: &SNode) -> Result<MigPartedConfig, MigError> {
        let Node::Map(items) = &doc.value else {
            return Err(self.invalid(
                &doc.referenced,
                format!(
                    "expected a mig-parted config (a mapping with version: v1 and mig-configs), got {}",
                    self.describe(doc)
                ),
            ));
        };
        let mut version = None;
        let mut mig_configs = None;
        for (k, v) in items {
            let key = self.scalar_key(k, "a top-level key")?;
            match key.as_str() {
                "version" => version = Some(v),
                "mig-configs" => mig_configs = Some((k, v)),
                other => return Err(self.unknown_key(k, other, TOP_KEYS, "at the top level")),
            }
        }
        let Some(version) = version else {
            return Err(self.invalid(&doc.referenced, "missing `version: v1`"));
        };
        match &version.value {
            Node::Str(v) if v == "v1" => {}
            _ => {
                return Err(self.invalid(
                    &version.referenced,
                    format!(
                        "unsupported version {}: expected v1",
                        self.describe(version)
                    ),
                ));
            }
        }
        let Some((configs_key, configs)) = mig_configs else {
            return Err(self.invalid(
                &doc.referenced,
                "missing `mig-configs`: expected a mapping of config names to device entries",
            ));
        };
        let items = match &configs.value {
            Node::Map(items) if !items.is_empty() => items,
            Node::Map(_) | Node::Null => {
                return Err(self.invalid(
                    &configs_key.referenced,
                    "mig-configs is empty: define at least one named config",
                ));
            }
            _ => {
                return Err(self.invalid(
                    &configs.referenced,
                    format!(
                        "mig-configs must be a mapping of config names to device entries, got {}",
                        self.describe(configs)
                    ),
                ));
            }
        };
        let mut out = MigPartedConfig::default();
        for (k, v) in items {
            let name = self.scalar_key(k, "a config name")?;
            if name.is_empty() {
                return Err(self.invalid(&k.referenced, "a config name is empty"));
            }
            self.config = Some(name.clone());
            let entries = self.named_config(k, v)?;
            self.config = None;
            out.configs.push(NamedConfig { name, entries });
        }
        Ok(out)
    }

    fn named_config(&self, key: &SNode, node: &SNode) -> Result<Vec<DeviceSpec>, MigError> {
        let items = match &node.value {
            Node::Seq(items) if !items.is_empty() => items,
            Node::Seq(_) | Node::Null => {
                return Err(self.invalid(
                    &key.referenced,
                    "the config is empty: expected a list of device entries (- devices: all ...)",
                ));
            }
            _ => {
                return Err(self.invalid(
                    &node.referenced,
                    format!(
                        "a config must be a list of device entries (- devices: all ...), got {}",
                        self.describe(node)
                    ),
                ));
            }
        };
        items.iter().map(|item| self.entry(item)).collect()
    }

    fn entry(&self, node: &SNode) -> Result<DeviceSpec, MigError> {
        let Node::Map(items) = &node.value else {
            return Err(self.invalid(
                &node.referenced,
                format!(
                    "a device entry must be a mapping with devices, mig-enabled and mig-devices, got {}",
                    self.describe(node)
                ),
            ));
        };
        let mut devices = None;
        let mut filters = Vec::new();
        let mut mig_enabled = None;
        let mut mig_devices: Option<(&SNode, BTreeMap<String, u32>)> = None;
        for (k, v) in items {
            let key = self.scalar_key(k, "a key")?;
            match key.as_str() {
                "devices" => devices = Some(self.devices(v)?),
                "device-filter" => filters = self.filters(v)?,
                "mig-enabled" => match &v.value {
                    Node::Bool(b) => mig_enabled = Some(*b),
                    _ => {
                        return Err(self.invalid(
                            &v.referenced,
                            format!(
                                "mig-enabled must be true or false, got {}",
                                self.describe(v)
                            ),
                        ));
                    }
                },
                "mig-devices" => mig_devices = Some((k, self.mig_devices(v)?)),
                other => {
                    return Err(self.unknown_key(k, other, ENTRY_KEYS, "in a device entry"));
                }
            }
        }
        let Some(devices) = devices else {
            return Err(self.invalid(
                &node.referenced,
                "the device entry has no `devices` (write `devices: all` or a list of GPU indices)",
            ));
        };
        let Some(mig_enabled) = mig_enabled else {
            return Err(self.invalid(
                &node.referenced,
                "the device entry has no `mig-enabled` (true or false)",
            ));
        };
        let mig_devices = match (mig_enabled, mig_devices) {
            (true, Some((_, m))) => m,
            (true, None) => {
                return Err(self.invalid(
                    &node.referenced,
                    "mig-enabled is true but mig-devices is missing (write `mig-devices: {}` to enable MIG mode without MIG devices)",
                ));
            }
            (false, Some((k, m))) if !m.is_empty() => {
                return Err(self.invalid(
                    &k.referenced,
                    format!(
                        "mig-devices lists {} but mig-enabled is false: set mig-enabled: true or remove mig-devices",
                        describe_counts(&m)
                    ),
                ));
            }
            (false, _) => BTreeMap::new(),
        };
        let (at, _) = self.position(&node.referenced);
        Ok(DeviceSpec {
            devices,
            filters,
            mig_enabled,
            mig_devices,
            line: at.line.unwrap_or(0),
        })
    }

    fn devices(&self, node: &SNode) -> Result<Devices, MigError> {
        let expected = "devices must be \"all\" or a list of GPU indices like [0, 1]";
        match &node.value {
            Node::Str(s) if s == "all" => Ok(Devices::All),
            Node::Seq(items) if items.is_empty() => Err(self.invalid(
                &node.referenced,
                "devices is an empty list: list GPU indices or write `devices: all`",
            )),
            Node::Seq(items) => {
                let mut list = Vec::new();
                for item in items {
                    let index = match &item.value {
                        Node::Int(i) => u32::try_from(*i).ok(),
                        _ => None,
                    };
                    let Some(index) = index else {
                        return Err(self.invalid(
                            &item.referenced,
                            match &item.value {
                                Node::Int(i) if *i > 0 => format!(
                                    "a GPU index in devices must be at most {}, got {}",
                                    u32::MAX,
                                    self.describe(item)
                                ),
                                _ => format!(
                                    "a GPU index in devices must be a non-negative integer, got {}",
                                    self.describe(item)
                                ),
                            },
                        ));
                    };
                    if !list.contains(&index) {
                        list.push(index);
                    }
                }
                Ok(Devices::List(list))
            }
            Node::Int(i) => Err(self.invalid(
                &node.referenced,
                format!("{expected}, got {i} (write [{i}] for one GPU)"),
            )),
            _ => Err(self.invalid(
                &node.referenced,
                format!("{expected}, got {}", self.describe(node)),
            )),
        }
    }

    fn filters(&self, node: &SNode) -> Result<Vec<DeviceFilter>, MigError> {
        match &node.value {
            // mig-parted treats an empty string or list as "no filter".
            Node::Null => Ok(Vec::new()),
            Node::Seq(items) => items
                .iter()
                .filter(|i| !matches!(&i.value, Node::Str(s) if s.is_empty()))
                .map(|item| self.filter(item))
                .collect(),
            _ => Ok(match &node.value {
                Node::Str(s) if s.is_empty() => Vec::new(),
                _ => vec![self.filter(node)?],
            }),
        }
    }

    fn filter(&self, node: &SNode) -> Result<DeviceFilter, MigError> {
        match &node.value {
            Node::Str(s) => s
                .parse::<DeviceFilter>()
                .map_err(|why| self.invalid(&node.referenced, why.to_string())),
            Node::Int(_) => Err(self.invalid(
                &node.referenced,
                format!(
                    "device-filter {} was read as a number: quote it (\"{}\")",
                    self.describe(node),
                    self.describe(node)
                ),
            )),
            _ => Err(self.invalid(
                &node.referenced,
                format!(
                    "device-filter must be a string like \"0x233010DE\" or a list of them, got {}",
                    self.describe(node)
                ),
            )),
        }
    }

    fn mig_devices(&self, node: &SNode) -> Result<BTreeMap<String, u32>, MigError> {
        let items = match &node.value {
            Node::Map(items) => items.as_slice(),
            Node::Null => &[],
            _ => {
                return Err(self.invalid(
                    &node.referenced,
                    format!(
                        "mig-devices must be a mapping of MIG profile to count (\"1g.10gb\": 2), got {}",
                        self.describe(node)
                    ),
                ));
            }
        };
        let mut out = BTreeMap::new();
        let mut written: BTreeMap<String, String> = BTreeMap::new();
        for (k, v) in items {
            let name = self.scalar_key(k, "a MIG profile name")?;
            let profile = name.parse::<ProfileName>().map_err(|e| {
                self.invalid(
                    &k.referenced,
                    format!("mig-devices: invalid MIG profile name {e}"),
                )
            })?;
            let canonical = profile.to_string();
            let count = match &v.value {
                Node::Int(i) => u32::try_from(*i).ok().filter(|n| *n <= MAX_MIG_COUNT),
                _ => None,
            };
            let Some(count) = count else {
                let hint = match &v.value {
                    Node::Str(s) if s.trim().parse::<u32>().is_ok() => {
                        format!(" (write {} without quotes)", s.trim())
                    }
                    _ => String::new(),
                };
                let too_large = match &v.value {
                    Node::Int(i) => *i > i128::from(MAX_MIG_COUNT),
                    Node::Float(x) => *x > f64::from(MAX_MIG_COUNT),
                    _ => false,
                };
                let message = if too_large {
                    format!(
                        "mig-devices count for {} must be at most {MAX_MIG_COUNT}, the limit per profile and GPU (no GPU has more than 7 MIG slices), got {}",
                        quote(&name),
                        self.describe(v)
                    )
                } else {
                    format!(
                        "mig-devices count for {} must be a non-negative integer, got {}{hint}",
                        quote(&name),
                        self.describe(v)
                    )
                };
                return Err(self.invalid(&v.referenced, message));
            };
            if let Some(first) = written.get(&canonical) {
                return Err(self.invalid(
                    &k.referenced,
                    format!(
                        "mig-devices lists {} twice (as {} and {})",
                        quote(&canonical),
                        quote(first),
                        quote(&name)
                    ),
                ));
            }
            written.insert(canonical.clone(), name);
            if count > 0 {
                out.insert(canonical, count);
            }
        }
        Ok(out)
    }
}

/// `2x 1g.10gb + 1x 3g.40gb`.
fn describe_counts(counts: &BTreeMap<String, u32>) -> String {
    counts
        .iter()
        .map(|(p, n)| format!("{n}x {p}"))
        .collect::<Vec<_>>()
        .join(" + ")
}

// ---------------------------------------------------------------------------------------------
// NVIDIA's shipped configs

/// `all-balanced` per model (catalog key), as NVIDIA ships it.
/// Catalog keys, and the profile counts NVIDIA's `all-balanced` gives them.
type Recipe = (&'static [&'static str], &'static [(&'static str, u32)]);

const BALANCED: &[Recipe] = &[
    (
        &["A100-SXM4-40GB", "A100-PCIE-40GB"],
        &[("1g.5gb", 2), ("2g.10gb", 1), ("3g.20gb", 1)],
    ),
    (
        &[
            "A100-SXM4-80GB",
            "A100-PCIE-80GB",
            "H100-SXM5-80GB",
            "H100-PCIE-80GB",
        ],
        &[("1g.10gb", 2), ("2g.20gb", 1), ("3g.40gb", 1)],
    ),
    (
        &["H100-NVL"],
        &[("1g.12gb", 2), ("2g.24gb", 1), ("3g.47gb", 1)],
    ),
    (
        &["H200", "H200-NVL"],
        &[("1g.18gb", 2), ("2g.35gb", 1), ("3g.71gb", 1)],
    ),
    (&["B200"], &[("1g.23gb", 2), ("2g.45gb", 1), ("3g.90gb", 1)]),
    (&["A30"], &[("1g.6gb", 2), ("2g.12gb", 1)]),
    // The rest as NVIDIA's default config (mig-parted v0.15.0) has them.
    (
        &["GB200"],
        &[("1g.23gb", 2), ("2g.47gb", 1), ("3g.93gb", 1)],
    ),
    (
        &["GB300"],
        &[("1g.35gb", 2), ("2g.70gb", 1), ("3g.139gb", 1)],
    ),
    (&["RTX-PRO-6000-BSE"], &[("1g.24gb", 2), ("2g.48gb", 1)]),
    (
        &["B300"],
        &[("1g.34gb", 2), ("2g.67gb", 1), ("3g.135gb", 1)],
    ),
    (
        &["GH200-144GB"],
        &[("1g.18gb", 2), ("2g.36gb", 1), ("3g.72gb", 1)],
    ),
    (
        &["GH200", "H100-96GB", "PG506-96GB", "H20"],
        &[("1g.12gb", 2), ("2g.24gb", 1), ("3g.48gb", 1)],
    ),
];

/// The device filter list for every PCI id of a model.
fn model_filters(model: &GpuModel) -> Vec<DeviceFilter> {
    model
        .pci_device_ids
        .iter()
        .map(|&id| DeviceFilter::nvidia(id))
        .collect()
}

fn model_entry(model: &GpuModel, mig_devices: BTreeMap<String, u32>) -> DeviceSpec {
    DeviceSpec {
        devices: Devices::All,
        filters: model_filters(model),
        mig_enabled: true,
        mig_devices,
        line: 0,
    }
}

/// NVIDIA's named configs for every MIG-capable catalog model: `all-disabled`, `all-enabled`,
/// `all-<profile>` (every profile at its maximum count; `+` written as `.`, so `all-1g.10gb.me`)
/// and `all-balanced`. Each per-profile and balanced config has one entry per model offering it,
/// filtered to that model's PCI ids, so a node with several models gets each its own counts.
pub fn nvidia_default_configs() -> MigPartedConfig {
    // A board variant shares its PCI id with the production model, so an entry filtered to it
    // would also select the production board; NVIDIA ships the production figures.
    let models: Vec<&GpuModel> = gpuops_catalog::models()
        .iter()
        .filter(|m| m.mig.is_some() && !m.is_board_variant())
        .collect();
    let mut configs = vec![
        NamedConfig {
            name: "all-disabled".into(),
            entries: vec![DeviceSpec {
                devices: Devices::All,
                filters: Vec::new(),
                mig_enabled: false,
                mig_devices: BTreeMap::new(),
                line: 0,
            }],
        },
        NamedConfig {
            name: "all-enabled".into(),
            entries: vec![DeviceSpec {
                devices: Devices::All,
                filters: Vec::new(),
                mig_enabled: true,
                mig_devices: BTreeMap::new(),
                line: 0,
            }],
        },
    ];

    // Profile name -> entries, ordered by slices, then memory, then name.
    let mut per_profile: BTreeMap<(u32, u32, String), Vec<DeviceSpec>> = BTreeMap::new();
    for model in &models {
        let Some(mig) = &model.mig else { continue };
        for profile in mig.gi_profiles {
            let sort = profile
                .name
                .parse::<ProfileName>()
                .map_or((u32::MAX, u32::MAX), |p| (p.gpu_slices, p.memory_gb));
            per_profile
                .entry((sort.0, sort.1, profile.name.to_string()))
                .or_default()
                .push(model_entry(
                    model,
                    BTreeMap::from([(profile.name.to_string(), profile.max_count)]),
                ));
        }
    }
    for ((_, _, profile), entries) in per_profile {
        configs.push(NamedConfig {
            name: format!("all-{}", profile.replace('+', ".")),
            entries,
        });
    }

    let mut balanced = Vec::new();
    for model in &models {
        let Some((_, recipe)) = BALANCED.iter().find(|(keys, _)| keys.contains(&model.key)) else {
            continue;
        };
        if recipe.iter().all(|(p, _)| model.gi_profile(p).is_some()) {
            balanced.push(model_entry(
                model,
                recipe.iter().map(|(p, n)| ((*p).to_string(), *n)).collect(),
            ));
        }
    }
    if !balanced.is_empty() {
        configs.push(NamedConfig {
            name: "all-balanced".into(),
            entries: balanced,
        });
    }
    MigPartedConfig { configs }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    fn err(text: &str) -> String {
        match parse(text, "c.yaml") {
            Ok(c) => panic!("expected an error, parsed {c:?}"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn filter_syntax() {
        let f: DeviceFilter = "0x233010de".parse().unwrap();
        assert_eq!(f.device, 0x2330_10DE);
        assert_eq!(f.subsystem, None);
        assert_eq!(f.to_string(), "0x233010DE");
        let f: DeviceFilter = "0x233010DE:0x16C110DE".parse().unwrap();
        assert_eq!(f.subsystem, Some(0x16C1_10DE));
        assert!(f.matches(0x2330_10DE, 0x16C1_10DE));
        assert!(!f.matches(0x2330_10DE, 0x16C2_10DE));
        assert!(DeviceFilter::nvidia(0x2330).matches(0x2330_10DE, 7));
        for bad in [
            "233010DE",
            "0x2330",
            "0x233010DE0",
            "0xZZ3010DE",
            "0x233010DE:",
            "",
        ] {
            assert!(bad.parse::<DeviceFilter>().is_err(), "{bad}");
        }
        let e = "0x2330".parse::<DeviceFilter>().unwrap_err();
        assert!(e.to_string().contains("\"0x233010DE\""), "{e}");
    }

    #[test]
    fn messages_drop_library_location() {
        let e = err("a: [1\n");
        assert_eq!(e, "c.yaml:1:4: invalid YAML: unclosed bracket '['");
        let e = err("version: v1\nversion: v1\n");
        assert_eq!(
            e,
            "c.yaml:2:1: invalid YAML: duplicate mapping key: version"
        );
    }

    #[test]
    fn yaml_keys_quote_when_needed() {
        assert_eq!(yaml_key("all-1g.10gb"), "all-1g.10gb");
        assert_eq!(yaml_key("yes"), "\"yes\"");
        assert_eq!(yaml_key("1g-only"), "\"1g-only\"");
        assert_eq!(yaml_key("a b"), "\"a b\"");
    }

    #[test]
    fn closest_names() {
        assert_eq!(
            closest("mig_devices", ENTRY_KEYS.iter().copied()),
            Some("mig-devices")
        );
        assert_eq!(
            closest("device", ENTRY_KEYS.iter().copied()),
            Some("devices")
        );
        assert_eq!(closest("zzz", ENTRY_KEYS.iter().copied()), None);
    }

    #[test]
    fn counts_over_the_limit_and_inputs_over_the_size_limit_are_named() {
        let doc = |count: &str| {
            format!(
                "version: v1\nmig-configs:\n  a:\n    - devices: all\n      mig-enabled: true\n      mig-devices:\n        \"1g.10gb\": {count}\n"
            )
        };
        for (count, want) in [
            (
                "4000000000",
                "c.yaml:7:20: config a: mig-devices count for \"1g.10gb\" must be at most 64, the limit per profile and GPU (no GPU has more than 7 MIG slices), got 4000000000",
            ),
            (
                "99999999999999999999999",
                "c.yaml:7:20: config a: mig-devices count for \"1g.10gb\" must be at most 64, the limit per profile and GPU (no GPU has more than 7 MIG slices), got 99999999999999999999999",
            ),
            (
                "65",
                "c.yaml:7:20: config a: mig-devices count for \"1g.10gb\" must be at most 64",
            ),
        ] {
            let e = parse(&doc(count), "c.yaml").unwrap_err().to_string();
            assert!(e.starts_with(want), "{count}: {e}");
        }
        assert!(parse(&doc("64"), "c.yaml").is_ok());
        let e = parse(
            &doc("1").replace("devices: all", "devices: [99999999999]"),
            "c.yaml",
        )
        .unwrap_err()
        .to_string();
        assert_eq!(
            e,
            "c.yaml:4:17: config a: a GPU index in devices must be at most 4294967295, got 99999999999"
        );
        // Well-formed YAML over the reader's budget: a size limit, not "invalid YAML".
        let many = format!(
            "version: v1\nmig-configs:\n  a: [{}]\n",
            vec!["{}"; 300_000].join(",")
        );
        let e = parse(&many, "c.yaml").unwrap_err().to_string();
        assert!(
            e.contains("the YAML is too large: it has more than") && !e.contains("invalid YAML"),
            "{e}"
        );
        // Bytes: over the size limit, UTF-16, not UTF-8.
        let big = format!("{}{}", doc("1"), "# pad\n".repeat(800_000));
        let e = read_selecting(big.as_bytes(), "c.yaml", None)
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "c.yaml: the file is larger than 4 MiB (4194304 bytes), the size limit for a mig-parted config"
        );
        let utf16: Vec<u8> = doc("1").encode_utf16().flat_map(u16::to_le_bytes).collect();
        let e = read_selecting(&utf16[..], "c.yaml", None)
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("c.yaml: the file is UTF-16 (little-endian) text, not UTF-8"),
            "{e}"
        );
        let e = read_selecting(&b"version: v1\n\x00\xFF\xFE\n"[..], "c.yaml", None)
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("c.yaml:2:2: the file is not UTF-8 text"),
            "{e}"
        );
        assert!(read_selecting(doc("1").as_bytes(), "c.yaml", None).is_ok());
    }
}
