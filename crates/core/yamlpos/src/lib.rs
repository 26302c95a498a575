//! A YAML node tree that keeps the line and column of every node and key (serde-saphyr's
//! `Spanned`), so config parsers can name the place of a problem; and edit-distance suggestions.
//!
//! Every input file of gpuops is read through [`read_text`] (size limit, encoding check) and its
//! YAML errors explained with [`explain`] (key, value, what is accepted, size limits named), so
//! every input gets the same messages.
#![forbid(unsafe_code)]

mod explain;
mod input;

pub use explain::{Found, Problem, clean, explain, find_at, scalar_at};
pub use input::{MAX_CONFIG_BYTES, MAX_TRACE_BYTES, decode, human_bytes, read_text};

use serde::de::{Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_saphyr::Spanned;
use std::fmt;

/// Why an input's bytes are not text we can read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum YamlposError {
    #[error("cannot read it: {message}")]
    Read { message: String },
    #[error("the file is larger than {limit}, the size limit for {what}")]
    TooLarge { what: String, limit: String },
    #[error(
        "the file is {encoding} text{}, not UTF-8: convert it, e.g. `iconv -f {iconv} -t UTF-8 FILE > FILE.utf8`",
        if *.bom { " (it starts with a byte order mark)" } else { "" }
    )]
    WideEncoding {
        encoding: &'static str,
        bom: bool,
        iconv: &'static str,
    },
    #[error(
        "the file is not UTF-8 text: byte 0x{byte:02X} at line {line}, column {column} is not valid UTF-8 (a binary file, or text in another encoding: convert it to UTF-8)"
    )]
    NotUtf8 { byte: u8, line: u64, column: u64 },
}

/// A node with its location.
pub type SNode = Spanned<Node>;

/// A YAML value; every child (keys included) carries its location.
#[derive(Debug)]
pub enum Node {
    Null,
    Bool(bool),
    Int(i128),
    Float(f64),
    Str(String),
    Seq(Vec<SNode>),
    Map(Vec<(SNode, SNode)>),
}

impl Node {
    /// A scalar as its text (`true`, `3`, `0.5`, `abc`); `None` for null, sequences and maps.
    pub fn scalar_text(&self) -> Option<String> {
        match self {
            Node::Bool(b) => Some(b.to_string()),
            Node::Int(i) => Some(i.to_string()),
            Node::Float(f) => Some(f.to_string()),
            Node::Str(s) => Some(s.clone()),
            Node::Null | Node::Seq(_) | Node::Map(_) => None,
        }
    }
}

/// The entry of a mapping node whose key is the string `key`.
pub fn map_get<'n>(node: &'n SNode, key: &str) -> Option<(&'n SNode, &'n SNode)> {
    match &node.value {
        Node::Map(items) => items
            .iter()
            .find(|(k, _)| matches!(&k.value, Node::Str(s) if s == key))
            .map(|(k, v)| (k, v)),
        _ => None,
    }
}

impl<'de> Deserialize<'de> for Node {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct NodeVisitor;
        impl<'de> Visitor<'de> for NodeVisitor {
            type Value = Node;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("any YAML value")
            }
            fn visit_unit<E>(self) -> Result<Node, E> {
                Ok(Node::Null)
            }
            fn visit_none<E>(self) -> Result<Node, E> {
                Ok(Node::Null)
            }
            fn visit_some<D2: Deserializer<'de>>(self, d: D2) -> Result<Node, D2::Error> {
                Node::deserialize(d)
            }
            fn visit_bool<E>(self, v: bool) -> Result<Node, E> {
                Ok(Node::Bool(v))
            }
            fn visit_i64<E>(self, v: i64) -> Result<Node, E> {
                Ok(Node::Int(v.into()))
            }
            fn visit_u64<E>(self, v: u64) -> Result<Node, E> {
                Ok(Node::Int(v.into()))
            }
            fn visit_i128<E>(self, v: i128) -> Result<Node, E> {
                Ok(Node::Int(v))
            }
            fn visit_u128<E>(self, v: u128) -> Result<Node, E> {
                // Beyond i128 only a float can hold it; a config never means such a number.
                Ok(i128::try_from(v).map_or(Node::Float(v as f64), Node::Int))
            }
            fn visit_f64<E>(self, v: f64) -> Result<Node, E> {
                Ok(Node::Float(v))
            }
            fn visit_str<E>(self, v: &str) -> Result<Node, E> {
                Ok(Node::Str(v.to_string()))
            }
            fn visit_string<E>(self, v: String) -> Result<Node, E> {
                Ok(Node::Str(v))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut a: A) -> Result<Node, A::Error> {
                let mut items = Vec::new();
                while let Some(item) = a.next_element()? {
                    items.push(item);
                }
                Ok(Node::Seq(items))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut a: A) -> Result<Node, A::Error> {
                let mut items = Vec::new();
                while let Some(entry) = a.next_entry()? {
                    items.push(entry);
                }
                Ok(Node::Map(items))
            }
        }
        d.deserialize_any(NodeVisitor)
    }
}

/// Levenshtein distance in characters.
pub fn edit_distance(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.iter().enumerate() {
        let mut cur = vec![i + 1; b.len() + 1];
        for (j, cb) in b.iter().enumerate() {
            let sub = prev[j] + usize::from(ca != cb);
            cur[j + 1] = sub.min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        prev = cur;
    }
    prev[b.len()]
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::panic)]
    use super::*;

    #[test]
    fn every_node_and_key_keeps_its_line_and_column() {
        let text =
            "version: v1\nitems:\n  - name: a\n    count: 3\n  - 0.5\nflag: true\nnothing:\n";
        let root: SNode = serde_saphyr::from_str(text).unwrap();
        let (key, items) = map_get(&root, "items").unwrap();
        assert_eq!((key.referenced.line(), key.referenced.column()), (2, 1));
        let Node::Seq(list) = &items.value else {
            panic!("{items:?}")
        };
        let (count_key, count) = map_get(&list[0], "count").unwrap();
        assert_eq!(count_key.referenced.line(), 4);
        assert_eq!(count.value.scalar_text().as_deref(), Some("3"));
        assert!(matches!(count.value, Node::Int(3)));
        assert_eq!(list[1].value.scalar_text().as_deref(), Some("0.5"));
        assert_eq!(list[1].referenced.line(), 5);
        let (_, flag) = map_get(&root, "flag").unwrap();
        assert!(matches!(flag.value, Node::Bool(true)));
        let (_, nothing) = map_get(&root, "nothing").unwrap();
        assert!(matches!(nothing.value, Node::Null));
        assert_eq!(nothing.value.scalar_text(), None);
        assert!(map_get(&root, "missing").is_none());
        assert!(map_get(count, "x").is_none());
    }

    #[test]
    fn text_inputs_name_their_encoding_and_size() {
        let max = MAX_CONFIG_BYTES;
        assert_eq!(decode(b"a: 1\n".to_vec(), max, "x").unwrap(), "a: 1\n");
        assert_eq!(
            decode(b"\xEF\xBB\xBFa: 1\n".to_vec(), max, "x").unwrap(),
            "a: 1\n"
        );
        let utf16 = |be: bool, bom: bool| {
            let mut out: Vec<u8> = if bom {
                if be {
                    vec![0xFE, 0xFF]
                } else {
                    vec![0xFF, 0xFE]
                }
            } else {
                Vec::new()
            };
            for u in "version: v1\n".encode_utf16() {
                out.extend(if be { u.to_be_bytes() } else { u.to_le_bytes() });
            }
            out
        };
        let utf32 = |be: bool, bom: bool| {
            let mut out = Vec::new();
            for c in (bom.then_some('\u{feff}').into_iter()).chain("version: v1\n".chars()) {
                let n = u32::from(c);
                out.extend(if be { n.to_be_bytes() } else { n.to_le_bytes() });
            }
            out
        };
        let cases = [
            (
                utf16(false, true),
                "UTF-16 (little-endian) text (it starts with a byte order mark)",
            ),
            (utf16(true, true), "UTF-16 (big-endian) text (it starts"),
            (
                utf16(false, false),
                "UTF-16 (little-endian) text, not UTF-8",
            ),
            (utf16(true, false), "UTF-16 (big-endian) text, not UTF-8"),
            (utf32(false, true), "UTF-32 (little-endian) text (it starts"),
            (utf32(true, true), "UTF-32 (big-endian) text (it starts"),
            (
                utf32(false, false),
                "UTF-32 (little-endian) text, not UTF-8",
            ),
            (utf32(true, false), "UTF-32 (big-endian) text, not UTF-8"),
        ];
        for (bytes, want) in cases {
            let e = decode(bytes, max, "x").unwrap_err().to_string();
            assert!(
                e.contains(want) && e.contains("iconv -f UTF-"),
                "{want}: {e}"
            );
        }
        let e = decode(b"a: 1\nb: \xC3\x28\n".to_vec(), max, "x").unwrap_err();
        assert_eq!(
            e,
            YamlposError::NotUtf8 {
                byte: 0xC3,
                line: 2,
                column: 4
            }
        );
        assert_eq!(e.to_string().matches("not UTF-8 text").count(), 1, "{e}");
        // Over the limit: named with the limit, and not read past it.
        let e = decode(vec![b'a'; 11], 10, "a test input")
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "the file is larger than 10 bytes, the size limit for a test input"
        );
        let endless = std::io::repeat(b'a');
        let e = read_text(endless, MAX_CONFIG_BYTES, "a config")
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "the file is larger than 4 MiB (4194304 bytes), the size limit for a config"
        );
        assert_eq!(read_text(&b"ok"[..], 2, "x").unwrap(), "ok");
    }

    #[derive(Debug, serde::Deserialize)]
    #[allow(dead_code)]
    struct Typed {
        outer: Inner,
    }
    #[derive(Debug, serde::Deserialize)]
    #[allow(dead_code)]
    struct Inner {
        items: Vec<Item>,
    }
    #[derive(Debug, serde::Deserialize)]
    #[allow(dead_code)]
    struct Item {
        count: Option<u32>,
        flag: Option<bool>,
        signed: Option<i64>,
    }

    fn problem(text: &str) -> Problem {
        let tree: Option<SNode> = serde_saphyr::from_str(text).ok();
        let e = serde_saphyr::from_str::<Typed>(text).unwrap_err();
        explain(&e, tree.as_ref(), text)
    }

    #[test]
    fn type_errors_name_the_key_the_value_and_what_is_accepted() {
        let doc = |item: &str| format!("outer:\n  items:\n    - count: 1\n    - {item}\n");
        let cases = [
            (
                "count: abc",
                (4, 14),
                "`outer.items[1].count`: \"abc\" is not valid: expected a whole number from 0 to 4294967295",
            ),
            (
                "count: 4294967296",
                (4, 14),
                "`outer.items[1].count`: 4294967296 is too large: at most 4294967295",
            ),
            (
                "count: -1",
                (4, 14),
                "`outer.items[1].count`: -1 is too small: at least 0",
            ),
            (
                "signed: 99999999999999999999999",
                (4, 15),
                "`outer.items[1].signed`: 99999999999999999999999 is too large: at most 9223372036854775807",
            ),
            (
                "flag: maybe",
                (4, 13),
                "`outer.items[1].flag`: \"maybe\" is not valid: expected true or false",
            ),
        ];
        for (item, (line, column), want) in cases {
            let p = problem(&doc(item));
            assert_eq!(p.message, want, "{item}");
            assert_eq!((p.line, p.column), (Some(line), Some(column)), "{item}");
        }
        // Other errors keep serde-saphyr's words, with the key when it is known.
        let p = problem("outer:\n  items: 3\n");
        assert!(p.message.starts_with("outer.items: 3: "), "{p:?}");
        assert!(!p.message.contains("line 2"), "{p:?}");
    }

    #[test]
    fn budget_breaches_are_named_as_size_limits() {
        let text = format!("[{}]", vec!["1"; 300_000].join(","));
        let e = serde_saphyr::from_str::<SNode>(&text).unwrap_err();
        let p = explain(&e, None, &text);
        assert!(
            p.message
                .starts_with("the YAML is too large: it has more than ")
                && p.message.contains("the size limit of the YAML reader"),
            "{p:?}"
        );
        assert!(!p.message.contains("budget breached"), "{p:?}");
        assert!(p.size_limit);
    }

    #[test]
    fn edit_distance_counts_characters() {
        assert_eq!(edit_distance("migStrategy", "migStrategy"), 0);
        assert_eq!(edit_distance("migStratgy", "migStrategy"), 1);
        assert_eq!(edit_distance("1g.10gb", "2g.20gb"), 2);
        assert_eq!(edit_distance("", "abc"), 3);
        assert_eq!(edit_distance("ä", "a"), 1);
    }
}
