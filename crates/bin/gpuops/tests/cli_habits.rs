//! What users coming from kubectl expect of the CLI: `-o wide`, shell completions and man pages
//! generated from the CLI itself, and `--version` with the commit it was built from.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::{run, text};

fn stdout(args: &[&str]) -> String {
    let o = run(args);
    assert!(o.status.success(), "{args:?}: {}", text(&o));
    String::from_utf8(o.stdout).unwrap()
}

#[test]
fn version_names_the_commit() {
    let v = stdout(&["--version"]);
    let want = format!("gpuops {} (commit ", env!("CARGO_PKG_VERSION"));
    assert!(v.starts_with(&want) && v.trim_end().ends_with(')'), "{v}");
    let commit = v
        .trim_end()
        .trim_end_matches(')')
        .rsplit(' ')
        .next()
        .unwrap();
    // A hex commit (with -dirty for a changed tree), or `unknown` when built without git.
    let hex = commit.trim_end_matches("-dirty");
    assert!(
        commit == "unknown" || (hex.len() == 12 && hex.bytes().all(|b| b.is_ascii_hexdigit())),
        "{commit}"
    );
}

#[test]
fn completions_cover_every_subcommand_for_each_shell() {
    let bash = stdout(&["completion", "bash"]);
    assert!(bash.contains("complete -F _gpuops"), "{bash}");
    for sub in ["agent", "mig", "doctor", "simulate", "completion", "man"] {
        assert!(bash.contains(sub), "bash lacks {sub}");
    }
    assert!(
        bash.contains("--selected-config"),
        "flags are completed too"
    );
    assert!(stdout(&["completion", "zsh"]).starts_with("#compdef gpuops"));
    let fish = stdout(&["completion", "fish"]);
    assert!(fish.contains("complete -c gpuops"), "{fish}");
    let plugin = stdout(&["completion", "bash", "--name", "kubectl-gpu"]);
    assert!(plugin.contains("kubectl-gpu"), "{plugin}");
    let o = run(&["completion", "powerpoint"]);
    assert!(!o.status.success());
    assert!(text(&o).contains("possible values"), "{}", text(&o));
}

#[test]
fn man_pages_are_generated_for_every_command() {
    let page = stdout(&["man"]);
    assert!(page.contains(".TH gpuops 1"), "{page}");
    assert!(page.contains("mig"), "{page}");
    let dir = tempfile::tempdir().unwrap();
    let out = stdout(&["man", "--dir", dir.path().to_str().unwrap()]);
    for page in [
        "gpuops.1",
        "gpuops-agent.1",
        "gpuops-mig.1",
        "gpuops-mig-apply.1",
    ] {
        let text = std::fs::read_to_string(dir.path().join(page))
            .unwrap_or_else(|e| panic!("{page}: {e}; {out}"));
        assert!(text.contains(".TH"), "{page}");
    }
    assert!(out.contains("man pages in"), "{out}");
}

#[test]
fn wide_tables_add_columns() {
    let narrow = stdout(&["catalog"]);
    let wide = stdout(&["catalog", "-o", "wide"]);
    for column in ["PCI IDS", "MIG SLICES", "POWER", "NVLINKS"] {
        assert!(
            !narrow.contains(column) && wide.contains(column),
            "{column}"
        );
    }
    assert!(wide.contains("0x2330,0x2324"), "{wide}");
    let profiles = stdout(&["catalog", "H100-SXM5-80GB", "-o", "wide"]);
    assert!(
        profiles.contains(" DEC ") && profiles.contains(" OFA"),
        "{profiles}"
    );
    let narrow = stdout(&["inventory", "--simulate", "l4x4"]);
    let wide = stdout(&["inventory", "--simulate", "l4x4", "-o", "wide"]);
    assert!(
        !narrow.contains("PCI ID") && wide.contains("PCI ID"),
        "{wide}"
    );
    assert!(wide.contains("0x27B810DE"), "{wide}");
}
