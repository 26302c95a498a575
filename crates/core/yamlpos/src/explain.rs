//! serde-saphyr's errors as messages that name the key, the value and what would be accepted:
//! its own say `invalid i64` (the Rust type), `budget breached: Nodes { nodes: 250001 }`, or
//! repeat the position the caller prints anyway.

use crate::{Node, SNode};
use serde_saphyr::budget::BudgetBreach;

/// A YAML problem, placed when serde-saphyr knows where (1-based line and column).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    pub line: Option<u64>,
    pub column: Option<u64>,
    pub message: String,
    /// The text is well-formed YAML over one of the reader's size limits (not a syntax error).
    pub size_limit: bool,
}

/// Explains `e`, an error reading `source`. `tree`, the same text read untyped (when that
/// succeeded), lets a type error name the key and the value (as written) at the error's position.
pub fn explain(e: &serde_saphyr::Error, tree: Option<&SNode>, source: &str) -> Problem {
    let loc = e.location().filter(|l| l.line() > 0);
    let (line, column) = (loc.map(|l| l.line()), loc.map(|l| l.column()));
    let found = match (tree, line, column) {
        (Some(t), Some(l), Some(c)) => find_at(t, l, c).map(|mut f| {
            if let Some(text) = scalar_at(source, l, c) {
                f.value = Some(text);
            }
            f
        }),
        _ => None,
    };
    let message = match e.without_snippet() {
        serde_saphyr::Error::Budget { breach, .. } => budget_message(breach),
        serde_saphyr::Error::InvalidScalar { ty, .. } => match &found {
            Some(f) => invalid_scalar(&f.path, &f.value, ty),
            None => format!("expected {}", accepted(ty)),
        },
        _ => {
            let msg = clean(e);
            match &found {
                Some(f) if !f.path.is_empty() && !msg.contains(&f.path) => match &f.value {
                    // A message that quotes the value already says what it is about.
                    Some(v) if msg.contains(v.as_str()) => msg,
                    Some(v) => format!("{}: {v}: {msg}", f.path),
                    None => format!("{}: {msg}", f.path),
                },
                _ => msg,
            }
        }
    };
    Problem {
        line,
        column,
        message,
        size_limit: matches!(e.without_snippet(), serde_saphyr::Error::Budget { .. }),
    }
}

/// What a Rust scalar type accepts, as a user reads it.
fn accepted(ty: &str) -> String {
    match int_range(ty) {
        Some((0, max)) => format!("a whole number from 0 to {max}"),
        Some((min, max)) => format!("a whole number from {min} to {max}"),
        None => match ty {
            "bool" | "boolean" => "true or false".into(),
            "f32" | "f64" => "a number".into(),
            "char" => "a single character".into(),
            other => format!("a {other}"),
        },
    }
}

fn int_range(ty: &str) -> Option<(i128, i128)> {
    Some(match ty {
        "u8" => (0, u8::MAX.into()),
        "u16" => (0, u16::MAX.into()),
        "u32" => (0, u32::MAX.into()),
        "u64" | "usize" => (0, u64::MAX.into()),
        "i8" => (i8::MIN.into(), i8::MAX.into()),
        "i16" => (i16::MIN.into(), i16::MAX.into()),
        "i32" => (i32::MIN.into(), i32::MAX.into()),
        "i64" | "isize" => (i64::MIN.into(), i64::MAX.into()),
        "u128" => (0, i128::MAX),
        "i128" => (i128::MIN, i128::MAX),
        _ => return None,
    })
}

fn invalid_scalar(path: &str, value: &Option<String>, ty: &str) -> String {
    let key = if path.is_empty() {
        "the value".to_string()
    } else {
        format!("`{path}`")
    };
    let Some(v) = value else {
        return format!("{key}: expected {}", accepted(ty));
    };
    // A number out of the type's range: say the bound instead of "not a number".
    if let (Some((min, max)), Ok(n)) = (int_range(ty), v.trim().parse::<i128>()) {
        if n > max {
            return format!("{key}: {v} is too large: at most {max}");
        }
        if n < min {
            return format!("{key}: {v} is too small: at least {min}");
        }
    }
    if int_range(ty).is_some() && looks_like_big_integer(v) {
        return format!(
            "{key}: {v} is too large: at most {}",
            int_range(ty).map_or(0, |r| r.1)
        );
    }
    format!("{key}: {v:?} is not valid: expected {}", accepted(ty))
}

fn looks_like_big_integer(v: &str) -> bool {
    let d = v.trim().strip_prefix('+').unwrap_or(v.trim());
    d.len() > 18 && d.bytes().all(|b| b.is_ascii_digit())
}

/// The budget serde-saphyr enforces, as a size limit with its number (its defaults; no parser of
/// ours changes them).
fn budget_message(breach: &BudgetBreach) -> String {
    let b = serde_saphyr::Budget::default();
    let (what, limit) = match breach {
        BudgetBreach::Events { .. } => ("parser events", b.max_events.to_string()),
        BudgetBreach::Nodes { .. } => (
            "values (scalars, lists and mappings)",
            b.max_nodes.to_string(),
        ),
        BudgetBreach::Depth { .. } => ("levels of nesting", b.max_depth.to_string()),
        BudgetBreach::Aliases { .. } => ("aliases (*name)", b.max_aliases.to_string()),
        BudgetBreach::Anchors { .. } => ("anchors (&name)", b.max_anchors.to_string()),
        BudgetBreach::Documents { .. } => ("YAML documents", b.max_documents.to_string()),
        BudgetBreach::ScalarBytes { .. } => (
            "bytes of text in values",
            b.max_total_scalar_bytes.to_string(),
        ),
        other => {
            return format!(
                "the YAML is over a size limit of the YAML reader ({other:?}); split or shorten the file"
            );
        }
    };
    format!(
        "the YAML is too large: it has more than {limit} {what}, the size limit of the YAML reader; split or shorten the file"
    )
}

/// serde-saphyr's message without its position suffix and library-specific advice.
pub fn clean(e: &serde_saphyr::Error) -> String {
    let mut msg = e.without_snippet().to_string();
    if let Some(first) = msg.lines().next() {
        msg = first.to_string();
    }
    if let Some(rest) = msg.strip_prefix("error: ") {
        msg = rest.to_string();
    }
    if let Some(l) = e.location().filter(|l| l.line() > 0) {
        let prefix = format!("line {} column {}: ", l.line(), l.column());
        if let Some(rest) = msg.strip_prefix(&prefix) {
            msg = rest.to_string();
        }
    }
    if let Some(at) = msg.rfind(" at line ") {
        let tail = &msg[at + " at line ".len()..];
        let is_position = tail.split_once(", column ").is_some_and(|(l, c)| {
            !l.is_empty()
                && !c.is_empty()
                && l.bytes().all(|b| b.is_ascii_digit())
                && c.bytes().all(|b| b.is_ascii_digit())
        });
        if is_position {
            msg.truncate(at);
        }
    }
    if let Some(at) = msg.find(", set DuplicateKeyPolicy") {
        msg.truncate(at);
    }
    if msg.starts_with("multiple YAML documents detected") {
        msg = "more than one YAML document".into();
    }
    msg
}

/// The plain scalar written at `line:column` of `source` (up to the end of the line, a comment,
/// or a flow collection's `,` `]` `}`), when it is one: a number as written, not as a float.
pub fn scalar_at(source: &str, line: u64, column: u64) -> Option<String> {
    let text = source
        .lines()
        .nth(usize::try_from(line.checked_sub(1)?).ok()?)?;
    let rest: String = text
        .chars()
        .skip(usize::try_from(column.checked_sub(1)?).ok()?)
        .collect();
    if rest.starts_with(['"', '\'', '[', '{', '|', '>', '&', '*', '!']) {
        return None;
    }
    let end = rest.find([',', ']', '}', '#']).unwrap_or(rest.len());
    let v = rest[..end].trim();
    (!v.is_empty()).then(|| v.to_string())
}

/// The node written at `line:column`: its dotted key path (`sharing.timeSlicing.resources[0].replicas`)
/// and its text as written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    pub path: String,
    pub value: Option<String>,
}

/// Finds the value (or key) at `line:column` in `tree`.
pub fn find_at(tree: &SNode, line: u64, column: u64) -> Option<Found> {
    fn at(n: &SNode, line: u64, column: u64) -> bool {
        n.referenced.line() == line && n.referenced.column() == column
    }
    fn walk(n: &SNode, path: &str, line: u64, column: u64) -> Option<Found> {
        match &n.value {
            Node::Map(items) => {
                for (k, v) in items {
                    let name = k.value.scalar_text().unwrap_or_else(|| "?".into());
                    let p = if path.is_empty() {
                        name
                    } else {
                        format!("{path}.{name}")
                    };
                    if at(v, line, column) || at(k, line, column) {
                        return Some(Found {
                            value: if at(v, line, column) {
                                v.value.scalar_text()
                            } else {
                                None
                            },
                            path: p,
                        });
                    }
                    if let Some(f) = walk(v, &p, line, column) {
                        return Some(f);
                    }
                }
                None
            }
            Node::Seq(items) => items.iter().enumerate().find_map(|(i, item)| {
                let p = format!("{path}[{i}]");
                if at(item, line, column) {
                    return Some(Found {
                        path: p,
                        value: item.value.scalar_text(),
                    });
                }
                walk(item, &p, line, column)
            }),
            _ => None,
        }
    }
    walk(tree, "", line, column)
}
