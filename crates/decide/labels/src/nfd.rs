//! Labels as a Node Feature Discovery local feature file (`features.d/`), as GFD writes them.

use std::collections::BTreeMap;

/// Where nfd-worker's `local` source reads feature files (GFD writes `<dir>/gfd`).
pub const NFD_FEATURES_DIR: &str = "/etc/kubernetes/node-feature-discovery/features.d/";

/// nfd-worker skips feature files larger than this (bytes).
pub const NFD_MAX_FILE_SIZE: usize = 65536;

/// Whether nfd-worker would read `key=value` back as this same key and value: it trims each line,
/// treats lines starting with `#` as comments, and splits at the first `=`.
fn representable(key: &str, value: &str) -> bool {
    !key.is_empty()
        && !key.starts_with('#')
        && !key.contains('=')
        && !key.chars().any(char::is_whitespace)
        && value.trim() == value
        && !value.contains(['\n', '\r'])
}

/// The NFD local feature file for `labels`: one `key=value` line per label, sorted by key, each
/// ending in `\n` (empty string for no labels). nfd-worker turns each line into a node label
/// (keys with a namespace such as `nvidia.com/` are used as they are).
///
/// Entries nfd-worker could not read back unchanged (empty key, key with `=`, whitespace or a
/// leading `#`, value with surrounding whitespace or a line break) are left out; valid Kubernetes
/// labels never have those. Write the file atomically (temporary file, then rename) and keep it
/// under [`NFD_MAX_FILE_SIZE`].
pub fn nfd_feature_file(labels: &BTreeMap<String, String>) -> String {
    labels
        .iter()
        .filter(|(k, v)| representable(k, v))
        .map(|(k, v)| format!("{k}={v}\n"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_per_label() {
        let labels: BTreeMap<String, String> = [
            ("nvidia.com/gpu.product", "NVIDIA-H100-80GB-HBM3"),
            ("nvidia.com/gpu.count", "8"),
            ("nvidia.com/cuda.driver.rev", ""),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        assert_eq!(
            nfd_feature_file(&labels),
            "nvidia.com/cuda.driver.rev=\nnvidia.com/gpu.count=8\nnvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3\n"
        );
        assert_eq!(nfd_feature_file(&BTreeMap::new()), "");
    }

    #[test]
    fn leaves_out_what_nfd_would_misread() {
        let labels: BTreeMap<String, String> = [
            ("ok", "v"),
            ("", "v"),
            ("# +no-label", "x"),
            ("a=b", "c"),
            ("sp ace", "v"),
            ("nl", "two\nlines"),
            ("pad", " v"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        assert_eq!(nfd_feature_file(&labels), "ok=v\n");
    }
}
