//! The agent's MPS task for the device plugin (`gpuops_agent::mps`) driving the stand-in control
//! binary: the daemon answers on the pipe directory Allocate hands a container, follows the
//! config, and is quit when the config drops MPS and when the agent stops.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test support code

use gpuops_inventory::{Gpu, Inventory, Memory};
use gpuops_resources::config::{Config, Overrides};
use gpuops_resources::health::HealthTracker;
use gpuops_resources::{HostDevices, SharingStrategy};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

const STAND_IN: &str = env!("CARGO_BIN_EXE_gpuops-mps-control-sim");
/// Generous: the machine that runs the tests may be busy; every wait ends as soon as its
/// condition holds.
const WITHIN: Duration = Duration::from_secs(30);

fn inventory() -> Inventory {
    let gpu = |index: u32, mib: u64| Gpu {
        index,
        uuid: format!("GPU-{index}"),
        memory: Memory {
            total_mib: mib,
            ..Memory::default()
        },
        ..Gpu::default()
    };
    Inventory {
        gpus: vec![gpu(0, 81920), gpu(1, 40960)],
        ..Inventory::default()
    }
}

/// What the feed publishes for `sharing` (a YAML `sharing:` block, or empty) under `root`.
fn published(root: &Path, sharing: &str) -> Arc<gpuops_agent::mps::Published> {
    let yaml = format!(
        "version: v1\nflags: {{mpsRoot: {}}}\n{sharing}",
        root.display()
    );
    let config = Config::effective(
        Some(Config::parse(&yaml, "test").unwrap()),
        &Overrides::default(),
        &Overrides::default(),
    )
    .unwrap();
    Arc::new(
        gpuops_agent::publish(
            &inventory(),
            &config,
            &HealthTracker::default(),
            &Arc::new(HostDevices::default()),
        )
        .unwrap(),
    )
}

fn mps(replicas: u32) -> String {
    format!("sharing:\n  mps:\n    resources: [{{name: nvidia.com/gpu, replicas: {replicas}}}]\n")
}

/// Waits until the plugin servers are handed `nvidia.com/gpu` shared as `sharing`.
async fn served(
    out: &watch::Receiver<Arc<gpuops_agent::mps::Published>>,
    sharing: SharingStrategy,
) {
    let mut follow = out.clone();
    let found = tokio::time::timeout(
        WITHIN,
        follow.wait_for(|p| {
            p.resources
                .iter()
                .any(|r| r.name == "nvidia.com/gpu" && r.sharing == sharing)
        }),
    )
    .await
    .map(|r| r.is_ok());
    if found != Ok(true) {
        panic!(
            "nvidia.com/gpu shared as {sharing:?} not served; serving {:?}",
            out.borrow()
                .resources
                .iter()
                .map(|r| (&r.name, r.sharing))
                .collect::<Vec<_>>()
        );
    }
}

/// What Allocate gives a container of one `nvidia.com/gpu` replica: its pipe directory and the
/// host side of its `/dev/shm`.
fn allocated(p: &gpuops_agent::mps::Published) -> (PathBuf, PathBuf) {
    let r = p
        .resources
        .iter()
        .find(|r| r.name == "nvidia.com/gpu")
        .unwrap();
    let a = gpuops_resources::allocate(r, &[r.devices[0].id.clone()], &p.config, &p.host).unwrap();
    let pipe = PathBuf::from(&a.envs["CUDA_MPS_PIPE_DIRECTORY"]);
    let shm = a
        .mounts
        .iter()
        .find(|m| m.container_path == "/dev/shm")
        .map(|m| PathBuf::from(&m.host_path))
        .unwrap();
    (pipe, shm)
}

/// Asks the daemon on `pipe` as a container's client would: only the environment Allocate set.
fn ask(pipe: &Path, command: &str) -> Result<String, String> {
    let mut child = Command::new(STAND_IN)
        .env_clear()
        .env("CUDA_MPS_PIPE_DIRECTORY", pipe)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(format!("{command}\n").as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).trim().to_string())
    }
}

fn pid(pipe: &Path) -> u32 {
    std::fs::read_to_string(pipe.join(gpuops_mps::PID_FILE))
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

/// Whether `pid` still runs; a zombie counts as gone (the stand-in's `-d` leaves the daemon to
/// whoever reaps orphans).
fn running(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        let state = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next());
        !matches!(state, Some("Z" | "X") | None)
    })
}

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_daemon_per_mps_resource_answers_where_allocate_points_and_follows_the_config() {
    let root = tempfile::tempdir().unwrap();
    let (feed, rx) = watch::channel(published(root.path(), &mps(4)));
    let (stop_tx, stop) = watch::channel(false);
    let (out, task) = gpuops_agent::mps::spawn(Some(STAND_IN.into()), rx, stop);

    served(&out, SharingStrategy::Mps).await;
    let (pipe, shm) = allocated(&out.borrow());
    assert_eq!(pipe, root.path().join("nvidia.com/gpu/pipe"));
    assert_eq!(shm, root.path().join("shm"));
    assert!(shm.is_dir(), "the shm Allocate mounts exists");
    // NVIDIA's limits: 100/4 percent of the threads, a quarter of each GPU's memory.
    assert_eq!(
        ask(&pipe, "get_default_active_thread_percentage").unwrap(),
        "25.0"
    );
    assert_eq!(
        ask(&pipe, "get_default_device_pinned_mem_limit GPU-0").unwrap(),
        "20480M"
    );
    assert_eq!(
        ask(&pipe, "get_default_device_pinned_mem_limit GPU-1").unwrap(),
        "10240M"
    );
    let log = std::fs::read_to_string(root.path().join("nvidia.com/gpu/log/control.log")).unwrap();
    assert!(log.contains("CUDA_VISIBLE_DEVICES=GPU-0,GPU-1"), "{log}");
    let first = pid(&pipe);

    // New replicas: the daemon is replaced (MPS takes new defaults only in a new daemon).
    feed.send(published(root.path(), &mps(2))).unwrap();
    let replaced = tokio::time::timeout(WITHIN, async {
        loop {
            if ask(&pipe, "get_default_active_thread_percentage").as_deref() == Ok("50.0") {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(replaced.is_ok(), "the daemon did not take 2 replicas");
    assert!(gone(first).await, "the old daemon quit");
    let second = pid(&pipe);

    // MPS dropped from the config: the GPUs are served whole and the daemon is quit.
    feed.send(published(root.path(), "")).unwrap();
    served(&out, SharingStrategy::None).await;
    assert!(gone(second).await, "the daemon quit when MPS was dropped");
    assert!(
        !root.path().join("nvidia.com").exists(),
        "its directories are removed"
    );
    assert!(ask(&pipe, "get_default_active_thread_percentage").is_err());

    // MPS again, then the agent stops: the daemon is quit before the task ends.
    feed.send(published(root.path(), &mps(4))).unwrap();
    served(&out, SharingStrategy::Mps).await;
    let third = pid(&pipe);
    stop_tx.send(true).unwrap();
    tokio::time::timeout(WITHIN, task).await.unwrap().unwrap();
    assert!(gone(third).await, "the daemon quit at shutdown");
    assert!(!pipe.exists());
}

/// A daemon that will not start (here: not a control binary at all) keeps its resource from
/// the plugin servers; the config dropping MPS serves the GPUs again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemon_that_does_not_start_withholds_its_resource() {
    let root = tempfile::tempdir().unwrap();
    let (feed, rx) = watch::channel(published(root.path(), &mps(4)));
    let (stop_tx, stop) = watch::channel(false);
    let (mut out, task) = gpuops_agent::mps::spawn(Some("/bin/false".into()), rx, stop);
    assert!(out.borrow_and_update().resources.is_empty());
    feed.send(published(root.path(), "")).unwrap();
    served(&out, SharingStrategy::None).await;
    stop_tx.send(true).unwrap();
    tokio::time::timeout(WITHIN, task).await.unwrap().unwrap();
}
