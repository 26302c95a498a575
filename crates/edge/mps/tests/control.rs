//! The control client against stand-ins that misbehave: one that hangs, one that refuses.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test support code

use gpuops_mps::{Dirs, MpsError, send};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

fn script(dir: &Path, body: &str) -> PathBuf {
    let path = dir.join("nvidia-cuda-mps-control");
    std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

#[tokio::test]
async fn a_hung_daemon_does_not_hang_the_caller() {
    let tmp = tempfile::tempdir().unwrap();
    let binary = script(tmp.path(), "exec sleep 60");
    let dirs = Dirs::new(tmp.path(), "GPU-a").unwrap();
    let started = Instant::now();
    let err = send(
        &binary,
        &dirs,
        &[],
        "get_default_active_thread_percentage",
        Duration::from_millis(200),
    )
    .await
    .unwrap_err();
    assert!(matches!(err, MpsError::Timeout { .. }), "{err:?}");
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "{:?}",
        started.elapsed()
    );
    let text = err.to_string();
    assert!(
        text.contains("get_default_active_thread_percentage") && text.contains("GPU-a/pipe"),
        "{text}"
    );
}

#[tokio::test]
async fn a_refusal_carries_what_the_client_printed_and_the_env_reaches_it() {
    let tmp = tempfile::tempdir().unwrap();
    // Echoes the pipe directory it was given, then refuses.
    let binary = script(
        tmp.path(),
        "read cmd; echo \"pipe=$CUDA_MPS_PIPE_DIRECTORY devs=$CUDA_VISIBLE_DEVICES\"; echo \"no such thing: $cmd\" >&2; exit 3",
    );
    let dirs = Dirs::new(tmp.path(), "claim-1").unwrap();
    let err = send(
        &binary,
        &dirs,
        &["GPU-a".into()],
        "frobnicate",
        Duration::from_secs(30),
    )
    .await
    .unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, MpsError::Command { .. }), "{err:?}");
    assert!(text.contains("no such thing: frobnicate"), "{text}");
    assert!(
        text.contains(&format!("pipe={} devs=GPU-a", dirs.pipe.display())),
        "{text}"
    );
}

#[tokio::test]
async fn a_binary_that_cannot_run_is_named() {
    let tmp = tempfile::tempdir().unwrap();
    let dirs = Dirs::new(tmp.path(), "GPU-a").unwrap();
    let missing = tmp.path().join("nope");
    let err = send(&missing, &dirs, &[], "quit", Duration::from_secs(5))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, MpsError::Spawn { path, .. } if *path == missing),
        "{err:?}"
    );
}
