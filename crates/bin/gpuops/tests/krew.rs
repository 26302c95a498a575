//! deploy/krew/gpu.yaml against krew's manifest rules (pkg/index/validation in
//! kubernetes-sigs/krew) and against this crate: the plugin installs this binary as kubectl-gpu.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use serde_json::Value;

const MANIFEST: &str = include_str!("../../../../deploy/krew/gpu.yaml");

fn manifest() -> Value {
    serde_saphyr::from_str(MANIFEST).unwrap()
}

fn str_at<'a>(v: &'a Value, path: &str) -> &'a str {
    let mut at = v;
    for part in path.split('.') {
        at = &at[part];
    }
    at.as_str()
        .unwrap_or_else(|| panic!("{path} is not a string: {at}"))
}

#[test]
fn the_krew_manifest_follows_krews_rules_and_names_this_binary() {
    let m = manifest();
    assert_eq!(
        str_at(&m, "apiVersion"),
        "krew.googlecontainertools.github.com/v1alpha2"
    );
    assert_eq!(str_at(&m, "kind"), "Plugin");
    // krew: the name is the file's name, lowercase letters, digits and dashes; `kubectl gpu`.
    let name = str_at(&m, "metadata.name");
    assert_eq!(name, "gpu");
    assert!(
        name.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
    );
    // krew: a semantic version with a `v`; ours is the crate's.
    assert_eq!(
        str_at(&m, "spec.version"),
        format!("v{}", env!("CARGO_PKG_VERSION"))
    );
    let short = str_at(&m, "spec.shortDescription");
    assert!(!short.is_empty() && short.len() <= 50, "{short:?}");
    assert!(!str_at(&m, "spec.description").trim().is_empty());
    assert!(str_at(&m, "spec.homepage").starts_with("https://"));
    let platforms = m["spec"]["platforms"].as_array().unwrap();
    let mut seen = Vec::new();
    for p in platforms {
        let labels = &p["selector"]["matchLabels"];
        let os = labels["os"].as_str().unwrap();
        let arch = labels["arch"].as_str().unwrap();
        seen.push(format!("{os}/{arch}"));
        let uri = p["uri"].as_str().unwrap();
        assert!(uri.starts_with("https://"), "{uri}");
        assert!(
            uri.contains(&format!("v{}", env!("CARGO_PKG_VERSION")))
                && uri.contains(&format!("{os}-{arch}"))
                && uri.ends_with(".tar.gz"),
            "{uri}"
        );
        let sha = p["sha256"].as_str().unwrap();
        assert!(
            sha.len() == 64
                && sha
                    .bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)),
            "{sha}"
        );
        // The binary kubectl runs is this one under the plugin name.
        assert_eq!(p["bin"].as_str(), Some("kubectl-gpu"));
        let files = p["files"].as_array().unwrap();
        assert!(
            files
                .iter()
                .any(|f| f["from"] == "kubectl-gpu" && f["to"] == "."),
            "{files:?}"
        );
        for f in files {
            assert!(
                !f["from"].as_str().unwrap().is_empty() && !f["to"].as_str().unwrap().is_empty()
            );
        }
    }
    seen.sort();
    assert_eq!(seen, ["linux/amd64", "linux/arm64"]);
}
