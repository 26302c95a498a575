//! The change from a node's current labels to the desired ones: keys to set, owned keys to remove.

use crate::keys::owned_label_key;
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};

/// What to change on the node. Empty when the node already carries the desired labels.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
pub struct LabelPatch {
    /// Keys missing from the node or with another value there, with the desired value.
    pub set: BTreeMap<String, String>,
    /// Keys the agent owns ([`owned_label_key`]) that are on the node but no longer desired.
    pub remove: BTreeSet<String>,
}

impl LabelPatch {
    pub fn is_empty(&self) -> bool {
        self.set.is_empty() && self.remove.is_empty()
    }
}

/// The patch taking `current` (the node's labels, all of them) to `desired` (what
/// [`crate::gfd_labels`] returned). Labels the agent does not own are never removed; every desired
/// key is set, owned or not.
pub fn label_patch(
    current: &BTreeMap<String, String>,
    desired: &BTreeMap<String, String>,
) -> LabelPatch {
    let set = desired
        .iter()
        .filter(|(k, v)| current.get(*k) != Some(*v))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let remove = current
        .keys()
        .filter(|k| owned_label_key(k) && !desired.contains_key(*k))
        .cloned()
        .collect();
    LabelPatch { set, remove }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
            .collect()
    }

    #[test]
    fn removes_only_owned_keys() {
        let current = map(&[
            ("kubernetes.io/hostname", "node-1"),
            ("nvidia.com/gpu.present", "true"),
            ("nvidia.com/gpu.deploy.device-plugin", "true"),
            ("nvidia.com/mig.config", "all-1g.10gb"),
            ("nvidia.com/gpu.product", "NVIDIA-A100-SXM4-80GB"),
            ("nvidia.com/gpu.count", "1"),
            ("nvidia.com/mig-1g.10gb.count", "7"),
            (
                "nvidia.com/mig-1g.10gb.product",
                "NVIDIA-A100-SXM4-80GB-MIG-1g.10gb",
            ),
            ("nvidia.com/mig.strategy", "mixed"),
        ]);
        let desired = map(&[
            ("nvidia.com/gpu.product", "NVIDIA-A100-SXM4-80GB"),
            ("nvidia.com/gpu.count", "2"),
            ("nvidia.com/gpu.replicas", "1"),
        ]);
        let p = label_patch(&current, &desired);
        assert_eq!(
            p.set,
            map(&[
                ("nvidia.com/gpu.count", "2"),
                ("nvidia.com/gpu.replicas", "1")
            ])
        );
        let removed: Vec<&str> = p.remove.iter().map(String::as_str).collect();
        assert_eq!(
            removed,
            vec![
                "nvidia.com/mig-1g.10gb.count",
                "nvidia.com/mig-1g.10gb.product",
                "nvidia.com/mig.strategy",
            ]
        );
        assert!(!p.is_empty());
    }

    #[test]
    fn nothing_to_do_when_in_sync() {
        let labels = map(&[
            ("nvidia.com/gpu.count", "8"),
            ("kubernetes.io/hostname", "n"),
        ]);
        let desired = map(&[("nvidia.com/gpu.count", "8")]);
        assert!(label_patch(&labels, &desired).is_empty());
        // No GPUs any more: every owned key goes, nothing else.
        let p = label_patch(&labels, &BTreeMap::new());
        assert!(p.set.is_empty());
        assert_eq!(p.remove.len(), 1);
        assert!(p.remove.contains("nvidia.com/gpu.count"));
    }
}
