//! Kubernetes objects as JSON values: reading YAML documents, expanding `List`s, and the small
//! accessors the translation needs.

use crate::MigrateError;
use serde_json::Value;
use std::collections::BTreeMap;

/// One object with the fields every step needs.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Obj<'a> {
    pub kind: &'a str,
    pub api_version: &'a str,
    pub name: &'a str,
    pub namespace: Option<&'a str>,
    pub v: &'a Value,
}

impl Obj<'_> {
    /// `ClusterPolicy/cluster-policy`, `ConfigMap gpu-operator/time-slicing`.
    pub fn id(&self) -> String {
        match self.namespace {
            Some(ns) => format!("{} {ns}/{}", self.kind, self.name),
            None => format!("{}/{}", self.kind, self.name),
        }
    }

    pub fn at(&self, path: &str) -> Option<&Value> {
        at(self.v, path)
    }

    /// A ConfigMap's `data`.
    pub fn data(&self) -> BTreeMap<&str, &str> {
        self.at("data")
            .and_then(Value::as_object)
            .map(|m| {
                m.iter()
                    .filter_map(|(k, v)| v.as_str().map(|s| (k.as_str(), s)))
                    .collect()
            })
            .unwrap_or_default()
    }
}

/// The value at a dotted path (`spec.devicePlugin.config.name`).
pub(crate) fn at<'v>(v: &'v Value, path: &str) -> Option<&'v Value> {
    path.split('.').try_fold(v, |v, k| v.get(k))
}

/// A string at a path; numbers and booleans as the text YAML wrote.
pub(crate) fn text(v: &Value, path: &str) -> Option<String> {
    match at(v, path)? {
        Value::String(s) => Some(s.clone()),
        Value::Bool(b) => Some(b.to_string()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

/// Every object, `List`s expanded; an entry without `kind` or `metadata.name` is an error naming
/// its place in the input.
pub(crate) fn flatten(objects: &[Value]) -> Result<Vec<Obj<'_>>, MigrateError> {
    let mut out = Vec::new();
    for (i, o) in objects.iter().enumerate() {
        push(o, &format!("object {}", i + 1), &mut out)?;
    }
    Ok(out)
}

fn push<'a>(o: &'a Value, origin: &str, out: &mut Vec<Obj<'a>>) -> Result<(), MigrateError> {
    let bad = |problem: &str| MigrateError::NotAnObject {
        origin: origin.to_string(),
        problem: problem.to_string(),
    };
    if o.is_null() {
        return Ok(());
    }
    let kind = o
        .get("kind")
        .and_then(Value::as_str)
        .ok_or_else(|| bad("no kind: not a Kubernetes object"))?;
    if kind.ends_with("List") {
        if let Some(items) = o.get("items").and_then(Value::as_array) {
            for (j, item) in items.iter().enumerate() {
                push(item, &format!("{origin} item {}", j + 1), out)?;
            }
        }
        return Ok(());
    }
    let name = at(o, "metadata.name")
        .and_then(Value::as_str)
        .ok_or_else(|| bad(&format!("{kind} without metadata.name")))?;
    out.push(Obj {
        kind,
        api_version: o.get("apiVersion").and_then(Value::as_str).unwrap_or(""),
        name,
        namespace: at(o, "metadata.namespace").and_then(Value::as_str),
        v: o,
    });
    Ok(())
}

/// Parses a YAML or JSON file of one or more documents (`---`) into objects.
pub fn parse_documents(text: &str, origin: &str) -> Result<Vec<Value>, MigrateError> {
    let docs: Vec<Value> =
        serde_saphyr::from_multiple(text).map_err(|e| MigrateError::NotAnObject {
            origin: origin.to_string(),
            problem: format!("not YAML or JSON: {e}"),
        })?;
    Ok(docs.into_iter().filter(|d| !d.is_null()).collect())
}
