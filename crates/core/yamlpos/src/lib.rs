//! A YAML node tree that keeps the line and column of every node and key (serde-saphyr's
//! `Spanned`), so config parsers can name the place of a problem; and edit-distance suggestions.
#![forbid(unsafe_code)]

use serde::de::{Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_saphyr::Spanned;
use std::fmt;

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
    fn edit_distance_counts_characters() {
        assert_eq!(edit_distance("migStrategy", "migStrategy"), 0);
        assert_eq!(edit_distance("migStratgy", "migStrategy"), 1);
        assert_eq!(edit_distance("1g.10gb", "2g.20gb"), 2);
        assert_eq!(edit_distance("", "abc"), 3);
        assert_eq!(edit_distance("ä", "a"), 1);
    }
}
