//! The layer check, run as `scripts/test` runs it: on the real workspace, and on small workspaces
//! with a violation planted.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::path::Path;
use std::process::Command;

fn crate_at(root: &Path, layer: &str, name: &str, deps: &[(&str, &str, &str)]) {
    let dir = root.join("crates").join(layer).join(name);
    std::fs::create_dir_all(dir.join("src")).unwrap();
    std::fs::write(dir.join("src/lib.rs"), "pub fn f() {}\n").unwrap();
    let mut manifest = format!("[package]\nname = \"{name}\"\nversion = \"0.1.0\"\n");
    for section in ["dependencies", "dev-dependencies"] {
        manifest.push_str(&format!("\n[{section}]\n"));
        for (_, dep, dep_layer) in deps.iter().filter(|(s, ..)| *s == section) {
            manifest.push_str(&format!(
                "{dep} = {{ path = \"../../{dep_layer}/{dep}\" }}\n"
            ));
        }
    }
    std::fs::write(dir.join("Cargo.toml"), manifest).unwrap();
}

fn modcheck(root: &Path) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_gpuops-modcheck"))
        .arg(root)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code().unwrap_or(-1), text)
}

/// A clean little workspace: runtime on edge on decide on core, tests on the simulator.
fn clean(root: &Path) {
    crate_at(root, "core", "facts", &[]);
    crate_at(root, "decide", "plan", &[("dependencies", "facts", "core")]);
    crate_at(root, "edge", "talk", &[("dependencies", "plan", "decide")]);
    crate_at(root, "sim", "fake", &[("dependencies", "facts", "core")]);
    crate_at(
        root,
        "runtime",
        "loop",
        &[
            ("dependencies", "talk", "edge"),
            ("dev-dependencies", "fake", "sim"),
        ],
    );
}

#[test]
fn the_real_workspace_keeps_its_layers() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../..");
    let (code, out) = modcheck(&root);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains(", 0 dependency(ies) across layers the wrong way"),
        "{out}"
    );
}

#[test]
fn a_clean_workspace_passes() {
    let dir = tempfile::tempdir().unwrap();
    clean(dir.path());
    let (code, out) = modcheck(dir.path());
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("5 crate(s), 0 dependency(ies)"), "{out}");
}

#[test]
fn a_planted_upward_dependency_fails_naming_the_manifest_line_and_layers() {
    let dir = tempfile::tempdir().unwrap();
    clean(dir.path());
    crate_at(
        dir.path(),
        "decide",
        "plan",
        &[("dependencies", "talk", "edge")],
    );
    let (code, out) = modcheck(dir.path());
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains(
            "crates/decide/plan/Cargo.toml:6: plan (decide) depends on talk (edge); \
             a decide crate may depend only on core, decide"
        ),
        "{out}"
    );
}

#[test]
fn a_planted_product_dependency_on_the_simulator_fails_but_a_test_one_does_not() {
    let dir = tempfile::tempdir().unwrap();
    clean(dir.path());
    crate_at(
        dir.path(),
        "runtime",
        "loop",
        &[("dependencies", "fake", "sim")],
    );
    let (code, out) = modcheck(dir.path());
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("loop (runtime) depends on fake (sim)"),
        "{out}"
    );
    // The binary may link the simulator (`--simulate`), test support may not be shipped.
    crate_at(
        dir.path(),
        "runtime",
        "loop",
        &[("dev-dependencies", "fake", "sim")],
    );
    crate_at(dir.path(), "bin", "cli", &[("dependencies", "fake", "sim")]);
    assert_eq!(modcheck(dir.path()).0, 0);
    crate_at(dir.path(), "testing", "bed", &[]);
    crate_at(
        dir.path(),
        "bin",
        "cli",
        &[("dependencies", "bed", "testing")],
    );
    let (code, out) = modcheck(dir.path());
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("cli (bin) depends on bed (testing)"), "{out}");
}

#[test]
fn a_folder_that_is_no_layer_or_a_crate_outside_one_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    clean(dir.path());
    std::fs::create_dir_all(dir.path().join("crates/misc")).unwrap();
    let (code, out) = modcheck(dir.path());
    assert_eq!(code, 2, "{out}");
    assert!(
        out.contains("`misc` is not a layer; the folders under crates/ are core, driver"),
        "{out}"
    );
    std::fs::remove_dir(dir.path().join("crates/misc")).unwrap();
    crate_at(dir.path(), ".", "loose", &[]);
    let (code, out) = modcheck(dir.path());
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("a crate directly under crates/"), "{out}");
}
