//! The MPS supervisor (`gpuops-mps`) driving the simulator's stand-in control binary.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test support code

use gpuops_mps::{Config, Daemon, DaemonSpec, Daemons, Dirs, MpsError, State, send};
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio::sync::watch;

const STAND_IN: &str = env!("CARGO_BIN_EXE_gpuops-mps-control-sim");
/// Generous: the machine that runs the tests may be busy; every wait ends as soon as its
/// condition holds.
const WITHIN: Duration = Duration::from_secs(30);

fn config(root: &Path) -> Config {
    let mut c = Config::new(STAND_IN, root);
    c.health_every = Duration::from_millis(50);
    c.restart = gpuops_backoff::Policy::new(Duration::from_millis(10), Duration::from_millis(200));
    c
}

fn spec(name: &str, uuids: &[&str], percentage: u32, limit: &str) -> DaemonSpec {
    DaemonSpec {
        name: name.into(),
        uuids: uuids.iter().map(|u| u.to_string()).collect(),
        active_thread_percentage: Some(percentage),
        pinned_limits: [(uuids[0].to_string(), limit.to_string())].into(),
    }
}

async fn ask(root: &Path, d: &Daemon, command: &str) -> Result<String, MpsError> {
    send(&config(root).binary, d.dirs(), &[], command, WITHIN).await
}

fn pid(dirs: &Dirs) -> u32 {
    std::fs::read_to_string(dirs.pid_file())
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

/// Whether `pid` still runs. A zombie counts as gone: the stand-in's `-d` leaves the daemon to
/// whoever reaps orphans, which in a container may be nobody.
fn running(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        let state = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next());
        !matches!(state, Some("Z" | "X") | None)
    })
}

/// Waits until `pid` no longer runs: the daemon removes its socket just before it exits.
async fn gone(pid: u32) -> bool {
    let deadline = tokio::time::Instant::now() + WITHIN;
    while tokio::time::Instant::now() < deadline {
        if !running(pid) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    false
}

async fn wait_for(d: &Daemon, what: impl Fn(&gpuops_mps::Status) -> bool) {
    let mut status = d.status();
    tokio::time::timeout(WITHIN, status.wait_for(|s| what(s)))
        .await
        .unwrap_or_else(|_| panic!("timed out; last status {:?}", *d.status().borrow()))
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settings_are_applied_and_read_back_and_release_quits() {
    let root = tempfile::tempdir().unwrap();
    let (_stop_tx, stop) = watch::channel(false);
    let d = Daemon::start(
        config(root.path()),
        spec("claim-a", &["GPU-a", "MIG-b"], 25, "1024M"),
        stop,
    )
    .await
    .unwrap();
    assert_eq!(
        ask(root.path(), &d, "get_default_active_thread_percentage")
            .await
            .unwrap(),
        "25.0"
    );
    assert_eq!(
        ask(root.path(), &d, "get_default_device_pinned_mem_limit GPU-a")
            .await
            .unwrap(),
        "1024M"
    );
    let log = std::fs::read_to_string(d.dirs().log.join("control.log")).unwrap();
    assert!(log.contains("CUDA_VISIBLE_DEVICES=GPU-a,MIG-b"), "{log}");
    // A refusal comes back as an error with the daemon's words.
    let err = ask(root.path(), &d, "set_default_active_thread_percentage 300")
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("not 0-100"), "{err}");

    let daemon_pid = pid(d.dirs());
    let dirs = d.dirs().clone();
    let status = d.status();
    d.release().await;
    assert_eq!(status.borrow().state, State::Stopped);
    assert!(gone(daemon_pid).await, "the daemon quit");
    assert!(!dirs.base.exists(), "its directory is removed");
    assert!(dirs.shm.exists(), "the shared shm stays for the others");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_daemon_is_started_again_with_its_settings() {
    let root = tempfile::tempdir().unwrap();
    let (_stop_tx, stop) = watch::channel(false);
    let d = Daemon::start(
        config(root.path()),
        spec("GPU-a", &["GPU-a"], 40, "2G"),
        stop,
    )
    .await
    .unwrap();
    let first = pid(d.dirs());
    assert!(
        std::process::Command::new("kill")
            .args(["-9", &first.to_string()])
            .status()
            .unwrap()
            .success()
    );
    wait_for(&d, |s| s.starts >= 2 && s.state == State::Running).await;
    let second = pid(d.dirs());
    assert_ne!(first, second);
    assert_eq!(
        ask(root.path(), &d, "get_default_active_thread_percentage")
            .await
            .unwrap(),
        "40.0"
    );
    assert_eq!(
        ask(root.path(), &d, "get_default_device_pinned_mem_limit GPU-a")
            .await
            .unwrap(),
        "2G"
    );
    d.release().await;
    assert!(gone(second).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_quits_every_daemon_and_two_gpus_do_not_share_a_pipe() {
    let root = tempfile::tempdir().unwrap();
    let (stop_tx, stop) = watch::channel(false);
    let a = Daemon::start(
        config(root.path()),
        spec("GPU-a", &["GPU-a"], 30, "100M"),
        stop.clone(),
    )
    .await
    .unwrap();
    let b = Daemon::start(
        config(root.path()),
        spec("GPU-b", &["GPU-b"], 70, "200M"),
        stop,
    )
    .await
    .unwrap();
    assert_ne!(a.dirs().pipe, b.dirs().pipe);
    assert_ne!(pid(a.dirs()), pid(b.dirs()));
    assert_eq!(
        ask(root.path(), &a, "get_default_active_thread_percentage")
            .await
            .unwrap(),
        "30.0"
    );
    assert_eq!(
        ask(root.path(), &b, "get_default_active_thread_percentage")
            .await
            .unwrap(),
        "70.0"
    );
    assert_eq!(
        ask(root.path(), &b, "get_default_device_pinned_mem_limit GPU-a")
            .await
            .unwrap(),
        "0",
        "b never got a's limit"
    );
    let pids = [pid(a.dirs()), pid(b.dirs())];
    stop_tx.send(true).unwrap();
    wait_for(&a, |s| s.state == State::Stopped).await;
    wait_for(&b, |s| s.state == State::Stopped).await;
    for p in pids {
        assert!(gone(p).await, "{p} quit");
    }
    assert!(
        ask(root.path(), &a, "get_default_active_thread_percentage")
            .await
            .is_err()
    );
}

#[tokio::test]
async fn a_missing_binary_is_named() {
    let root = tempfile::tempdir().unwrap();
    let missing = PathBuf::from("/nonexistent/bin/nvidia-cuda-mps-control");
    let mut c = config(root.path());
    c.binary = missing.clone();
    let (_stop_tx, stop) = watch::channel(false);
    let err = Daemon::start(c, spec("GPU-a", &["GPU-a"], 50, "1M"), stop)
        .await
        .unwrap_err();
    assert!(
        matches!(&err, MpsError::BinaryMissing { path } if *path == missing),
        "{err:?}"
    );
    assert!(
        err.to_string()
            .contains("/nonexistent/bin/nvidia-cuda-mps-control"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_daemon_on_one_pipe_is_refused_by_the_stand_in() {
    let root = tempfile::tempdir().unwrap();
    let (_stop_tx, stop) = watch::channel(false);
    let d = Daemon::start(
        config(root.path()),
        spec("GPU-a", &["GPU-a"], 50, "1M"),
        stop,
    )
    .await
    .unwrap();
    let out = std::process::Command::new(STAND_IN)
        .arg("-f")
        .env("CUDA_MPS_PIPE_DIRECTORY", &d.dirs().pipe)
        .env("CUDA_MPS_LOG_DIRECTORY", &d.dirs().log)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("already serves"));
    d.release().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemon_already_running_is_adopted_and_given_its_settings() {
    let root = tempfile::tempdir().unwrap();
    let dirs = Dirs::new(root.path(), "claim-x").unwrap();
    std::fs::create_dir_all(&dirs.pipe).unwrap();
    // As left by an agent that restarted: a daemon answers on the pipe already.
    let started = std::process::Command::new(STAND_IN)
        .arg("-d")
        .env("CUDA_MPS_PIPE_DIRECTORY", &dirs.pipe)
        .env("CUDA_MPS_LOG_DIRECTORY", &dirs.log)
        .status()
        .unwrap();
    assert!(started.success());
    let before = pid(&dirs);
    let (_stop_tx, stop) = watch::channel(false);
    let d = Daemon::start(
        config(root.path()),
        spec("claim-x", &["GPU-a"], 60, "1M"),
        stop,
    )
    .await
    .unwrap();
    assert_eq!(pid(d.dirs()), before, "not a second daemon");
    assert_eq!(
        ask(root.path(), &d, "get_default_active_thread_percentage")
            .await
            .unwrap(),
        "60.0"
    );
    d.release().await;
    assert!(gone(before).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_during_shutdown_leaves_no_daemon() {
    let root = tempfile::tempdir().unwrap();
    let (_stop_tx, stop) = watch::channel(true);
    let err = Daemon::start(
        config(root.path()),
        spec("GPU-a", &["GPU-a"], 50, "1M"),
        stop,
    )
    .await
    .unwrap_err();
    assert!(matches!(err, MpsError::Stopped { .. }), "{err:?}");
    let dirs = Dirs::new(root.path(), "GPU-a").unwrap();
    assert!(
        !dirs.base.exists(),
        "nothing left in {}",
        dirs.base.display()
    );
}

async fn ask_dirs(root: &Path, dirs: &Dirs, command: &str) -> Result<String, MpsError> {
    send(&config(root).binary, dirs, &[], command, WITHIN).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_node_registry_is_idempotent_and_releases_what_a_previous_agent_left() {
    let root = tempfile::tempdir().unwrap();
    let (_stop_tx, stop) = watch::channel(false);
    let daemons = Daemons::new(config(root.path()), stop);
    let dirs = Dirs::new(root.path(), "claim-1").unwrap();

    let first = daemons
        .ensure(spec("claim-1", &["GPU-a"], 20, "1M"))
        .await
        .unwrap();
    let pid_first = pid(&dirs);
    // A prepare asked twice: the same daemon, the same edits.
    assert_eq!(
        daemons
            .ensure(spec("claim-1", &["GPU-a"], 20, "1M"))
            .await
            .unwrap(),
        first
    );
    assert_eq!(pid(&dirs), pid_first);
    assert_eq!(first.mounts[0].host_path, dirs.pipe);
    // New settings under the same name: a new daemon with them.
    daemons
        .ensure(spec("claim-1", &["GPU-a"], 80, "1M"))
        .await
        .unwrap();
    assert!(gone(pid_first).await);
    assert_eq!(
        ask_dirs(root.path(), &dirs, "get_default_active_thread_percentage")
            .await
            .unwrap(),
        "80.0"
    );
    assert_eq!(daemons.names().await, ["claim-1"]);
    let pid_second = pid(&dirs);
    daemons.release("claim-1").await.unwrap();
    assert!(gone(pid_second).await);
    assert!(!dirs.base.exists());
    assert!(daemons.names().await.is_empty());
    // Unprepare twice, or of a claim never prepared: no error.
    daemons.release("claim-1").await.unwrap();
    daemons.release("never").await.unwrap();

    // A daemon left running by an agent that was killed: this agent never started it, and
    // its release still quits it.
    let left = Dirs::new(root.path(), "claim-2").unwrap();
    std::fs::create_dir_all(&left.pipe).unwrap();
    let started = std::process::Command::new(STAND_IN)
        .arg("-d")
        .env("CUDA_MPS_PIPE_DIRECTORY", &left.pipe)
        .env("CUDA_MPS_LOG_DIRECTORY", &left.log)
        .status()
        .unwrap();
    assert!(started.success());
    let orphan = pid(&left);
    daemons.release("claim-2").await.unwrap();
    assert!(gone(orphan).await);
    assert!(!left.base.exists());
    assert!(matches!(
        daemons.release("../etc").await,
        Err(MpsError::BadName { .. })
    ));
}
