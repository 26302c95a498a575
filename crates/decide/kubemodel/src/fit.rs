//! The scheduler's node filters (taints and tolerations, nodeSelector, required node affinity)
//! over plain values, so the doctor (Kubernetes objects) and the autoscaler (its own model, also
//! fed by trace replays) share one implementation of the scheduler's rules.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// A node taint.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Taint {
    pub key: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub value: String,
    /// `NoSchedule`, `PreferNoSchedule` or `NoExecute`.
    pub effect: String,
}

impl Taint {
    /// Whether the taint keeps pods that do not tolerate it off the node (`PreferNoSchedule` does not).
    pub fn blocks(&self) -> bool {
        self.effect == "NoSchedule" || self.effect == "NoExecute"
    }
}

impl std::fmt::Display for Taint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.value.is_empty() {
            write!(f, "{}:{}", self.key, self.effect)
        } else {
            write!(f, "{}={}:{}", self.key, self.value, self.effect)
        }
    }
}

/// A pod toleration (empty strings stand for absent fields).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub struct Toleration {
    #[serde(default)]
    pub key: String,
    /// `Equal` (the default when empty) or `Exists`.
    #[serde(default)]
    pub operator: String,
    #[serde(default)]
    pub value: String,
    /// Empty: every effect.
    #[serde(default)]
    pub effect: String,
}

/// One requirement of a node selector term (`key In [a, b]`, `key Exists`, `key Gt 3`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Requirement {
    pub key: String,
    pub operator: String,
    #[serde(default)]
    pub values: Vec<String>,
}

/// What a pod demands of a node's labels: its nodeSelector and its required node affinity (terms
/// OR'd, requirements inside a term AND'd; `metadata.name` field requirements are in `fields`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub struct NodeConstraints {
    #[serde(default)]
    pub node_selector: BTreeMap<String, String>,
    /// `None`: no required node affinity.
    #[serde(default)]
    pub affinity: Option<Vec<Term>>,
}

/// One node selector term.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub struct Term {
    #[serde(default)]
    pub expressions: Vec<Requirement>,
    #[serde(default)]
    pub fields: Vec<Requirement>,
}

/// The scheduler's toleration rule over borrowed fields (`effect` empty: any effect; `operator`
/// empty: `Equal`).
pub fn tolerates_parts(
    key: &str,
    operator: &str,
    value: &str,
    effect: &str,
    taint_key: &str,
    taint_value: &str,
    taint_effect: &str,
) -> bool {
    if !effect.is_empty() && effect != taint_effect {
        return false;
    }
    let op = if operator.is_empty() {
        "Equal"
    } else {
        operator
    };
    if key.is_empty() {
        return op == "Exists";
    }
    if key != taint_key {
        return false;
    }
    match op {
        "Exists" => true,
        _ => value == taint_value,
    }
}

/// Whether `t` tolerates `taint`.
pub fn tolerates(t: &Toleration, taint: &Taint) -> bool {
    tolerates_parts(
        &t.key,
        &t.operator,
        &t.value,
        &t.effect,
        &taint.key,
        &taint.value,
        &taint.effect,
    )
}

/// The blocking taints among `taints` that no toleration in `tols` tolerates.
pub fn untolerated<'a>(tols: &[Toleration], taints: &'a [Taint]) -> Vec<&'a Taint> {
    taints
        .iter()
        .filter(|taint| taint.blocks() && !tols.iter().any(|t| tolerates(t, taint)))
        .collect()
}

/// The scheduler's rule for one requirement given the node's value for its key (or field).
pub fn requirement_matches(operator: &str, values: &[String], value: Option<&str>) -> bool {
    let number = |s: &str| s.parse::<i64>().ok();
    match operator {
        "In" => value.is_some_and(|v| values.iter().any(|x| x == v)),
        "NotIn" => value.is_none_or(|v| !values.iter().any(|x| x == v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        "Gt" => matches!(
            (value.and_then(number), values.first().and_then(|x| number(x))),
            (Some(a), Some(b)) if a > b
        ),
        "Lt" => matches!(
            (value.and_then(number), values.first().and_then(|x| number(x))),
            (Some(a), Some(b)) if a < b
        ),
        _ => false,
    }
}

impl Term {
    /// Whether a node with this name and these labels satisfies the term; a term without
    /// requirements matches nothing (the scheduler's rule).
    pub fn matches(&self, node_name: &str, labels: &BTreeMap<String, String>) -> bool {
        if self.expressions.is_empty() && self.fields.is_empty() {
            return false;
        }
        self.expressions.iter().all(|r| {
            requirement_matches(
                &r.operator,
                &r.values,
                labels.get(&r.key).map(String::as_str),
            )
        }) && self.fields.iter().all(|r| {
            let value = (r.key == "metadata.name").then_some(node_name);
            requirement_matches(&r.operator, &r.values, value)
        })
    }
}

impl NodeConstraints {
    /// Whether a node with this name and these labels is admitted.
    pub fn admits(&self, node_name: &str, labels: &BTreeMap<String, String>) -> bool {
        self.node_selector
            .iter()
            .all(|(k, v)| labels.get(k) == Some(v))
            && self
                .affinity
                .as_ref()
                .is_none_or(|terms| terms.iter().any(|t| t.matches(node_name, labels)))
    }

    /// The first reason a node with these labels is not admitted, for explanations.
    pub fn mismatch(&self, node_name: &str, labels: &BTreeMap<String, String>) -> Option<String> {
        if let Some((k, v)) = self
            .node_selector
            .iter()
            .find(|(k, v)| labels.get(*k) != Some(*v))
        {
            return Some(match labels.get(k) {
                Some(have) => format!("nodeSelector {k}={v} (node has {k}={have})"),
                None => format!("nodeSelector {k}={v} (node has no label {k})"),
            });
        }
        match &self.affinity {
            Some(terms) if !terms.iter().any(|t| t.matches(node_name, labels)) => {
                let text: Vec<String> = terms
                    .iter()
                    .map(|t| {
                        t.expressions
                            .iter()
                            .chain(&t.fields)
                            .map(|r| {
                                if r.values.is_empty() {
                                    format!("{} {}", r.key, r.operator)
                                } else {
                                    format!("{} {} [{}]", r.key, r.operator, r.values.join(", "))
                                }
                            })
                            .collect::<Vec<_>>()
                            .join(" and ")
                    })
                    .collect();
                Some(format!("required node affinity {}", text.join(" or ")))
            }
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
            .collect()
    }

    #[test]
    fn tolerations() {
        let t = Taint {
            key: "gpu".into(),
            value: "x".into(),
            effect: "NoSchedule".into(),
        };
        let tol = |key: &str, op: &str, value: &str, effect: &str| Toleration {
            key: key.into(),
            operator: op.into(),
            value: value.into(),
            effect: effect.into(),
        };
        assert!(tolerates(&tol("gpu", "Exists", "", ""), &t));
        assert!(tolerates(&tol("gpu", "", "x", "NoSchedule"), &t));
        assert!(!tolerates(&tol("gpu", "", "y", ""), &t));
        assert!(!tolerates(&tol("gpu", "Exists", "", "NoExecute"), &t));
        assert!(tolerates(&tol("", "Exists", "", ""), &t));
        assert!(!tolerates(&tol("", "", "", ""), &t));
        let soft = Taint {
            effect: "PreferNoSchedule".into(),
            ..t.clone()
        };
        assert!(untolerated(&[], &[soft]).is_empty());
        assert_eq!(untolerated(&[], std::slice::from_ref(&t)).len(), 1);
        assert_eq!(t.to_string(), "gpu=x:NoSchedule");
    }

    #[test]
    fn constraints() {
        let l = labels(&[("zone", "a"), ("gpus", "4")]);
        let mut c = NodeConstraints::default();
        assert!(c.admits("n", &l));
        c.node_selector.insert("zone".into(), "b".into());
        assert!(!c.admits("n", &l));
        assert_eq!(
            c.mismatch("n", &l).as_deref(),
            Some("nodeSelector zone=b (node has zone=a)")
        );
        c.node_selector.clear();
        let req = |key: &str, op: &str, values: &[&str]| Requirement {
            key: key.into(),
            operator: op.into(),
            values: values.iter().map(|v| (*v).to_string()).collect(),
        };
        c.affinity = Some(vec![Term {
            expressions: vec![req("gpus", "Gt", &["3"]), req("zone", "In", &["a", "c"])],
            fields: vec![],
        }]);
        assert!(c.admits("n", &l));
        c.affinity = Some(vec![Term {
            expressions: vec![req("gpus", "Lt", &["3"])],
            fields: vec![],
        }]);
        assert!(!c.admits("n", &l));
        assert!(
            c.mismatch("n", &l)
                .unwrap_or_default()
                .contains("gpus Lt [3]")
        );
        c.affinity = Some(vec![Term::default()]);
        assert!(!c.admits("n", &l), "an empty term matches nothing");
        c.affinity = Some(vec![Term {
            expressions: vec![],
            fields: vec![req("metadata.name", "In", &["n"])],
        }]);
        assert!(c.admits("n", &l));
        assert!(!c.admits("m", &l));
    }
}
