//! Replays the kept fuzz corpus and every crash file through the fuzz targets' own functions, on
//! stable, as part of the normal `cargo test`: a crash found once stays fixed.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::path::{Path, PathBuf};

fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../fuzz")
}

/// The files of `dir` and its subdirectories, sorted (a missing directory has none).
fn files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return out;
    };
    for e in entries {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(files(&p));
        } else {
            out.push(p);
        }
    }
    out.sort();
    out
}

fn replay(kind: &str, each_target_needs_files: bool) -> usize {
    let mut failed = Vec::new();
    let mut total = 0;
    for (name, run) in gpuops_fuzzcases::TARGETS {
        let inputs = files(&fuzz_dir().join(kind).join(name));
        assert!(
            !each_target_needs_files || !inputs.is_empty(),
            "fuzz/{kind}/{name} has no inputs: run python3 fuzz/seeds/make_seeds.py"
        );
        for input in inputs {
            let data = std::fs::read(&input).unwrap();
            total += 1;
            if std::panic::catch_unwind(|| run(&data)).is_err() {
                failed.push(input.display().to_string());
            }
        }
    }
    assert!(failed.is_empty(), "inputs that fail: {failed:#?}");
    total
}

#[test]
fn the_kept_corpus_passes_every_target() {
    let n = replay("corpus", true);
    assert!(n >= gpuops_fuzzcases::TARGETS.len());
}

#[test]
fn every_crash_found_by_fuzzing_stays_fixed() {
    replay("regressions", false);
}

#[test]
fn every_target_has_a_cargo_fuzz_binary() {
    let manifest = std::fs::read_to_string(fuzz_dir().join("Cargo.toml")).unwrap();
    for (name, _) in gpuops_fuzzcases::TARGETS {
        let source = fuzz_dir().join("fuzz_targets").join(format!("{name}.rs"));
        let text = std::fs::read_to_string(&source)
            .unwrap_or_else(|e| panic!("{}: {e}", source.display()));
        assert!(
            text.contains(&format!("gpuops_fuzzcases::{name}(")),
            "{text}"
        );
        assert!(
            manifest.contains(&format!("name = \"{name}\"")),
            "{name} not in fuzz/Cargo.toml"
        );
    }
}
