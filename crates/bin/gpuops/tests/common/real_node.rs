//! What the real-node tests share: the image under test, the node's address, figures.

use gpuops_testbed::Cluster;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../..")
}

/// The image under test: GPUOPS_IMAGE / GPUOPS_IMAGE_REF when set (scripts/test packs the release
/// build), else scripts/image packing this test's own build of gpuops (cached by content).
pub fn image() -> (PathBuf, String) {
    if let (Some(file), Some(r)) = (
        std::env::var_os("GPUOPS_IMAGE"),
        std::env::var("GPUOPS_IMAGE_REF").ok(),
    ) {
        return (PathBuf::from(file), r);
    }
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_gpuops"));
    let dir = bin.parent().unwrap();
    let sim = [dir.join("libnvml_sim.so"), dir.join("deps/libnvml_sim.so")]
        .into_iter()
        .filter(|p| p.is_file())
        .max_by_key(|p| std::fs::metadata(p).and_then(|m| m.modified()).ok())
        .expect("libnvml_sim.so next to the gpuops test binary (cargo builds it with gpuops)");
    let out = Command::new(repo().join("scripts/image"))
        .arg("--binary")
        .arg(&bin)
        .arg("--sim-lib")
        .arg(&sim)
        .stderr(Stdio::inherit())
        .output()
        .expect("running scripts/image");
    assert!(out.status.success(), "scripts/image failed");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let get = |k: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{k}=")))
            .unwrap_or_else(|| panic!("scripts/image printed no {k}: {text}"))
            .to_string()
    };
    (PathBuf::from(get("GPUOPS_IMAGE")), get("GPUOPS_IMAGE_REF"))
}

pub fn figure(name: &str, value: impl std::fmt::Display) {
    println!("FIGURE {name}: {value}");
}

pub fn node_address(cluster: &Cluster, node: &str) -> String {
    let json = cluster.get_json(&["node", node]).unwrap();
    json["status"]["addresses"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|a| a["type"] == "InternalIP")
        .and_then(|a| a["address"].as_str())
        .map(str::to_string)
        .unwrap_or_else(|| panic!("node {node} has no InternalIP: {}", json["status"]))
}
