//! The `gpuops` binary end to end on the simulated driver: what a user types and sees.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test support code

mod common;

use common::{gpuops, run};
use gpuops_testbed::ChildGuard;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn inventory_json_has_eight_gpus_on_a_simulated_dgx() {
    let o = run(&["inventory", "--simulate", "dgx-h100", "-o", "json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    let gpus = v["gpus"].as_array().unwrap();
    assert_eq!(gpus.len(), 8);
    assert_eq!(gpus[0]["name"], "NVIDIA H100 80GB HBM3");
    assert_eq!(gpus[0]["model"], "H100-SXM5-80GB");
    assert!(gpus[7]["uuid"].as_str().unwrap().starts_with("GPU-"));
    assert_eq!(v["driver_version"], "580.105.08");
    assert_eq!(v["topology"].as_array().unwrap().len(), 28);
}

#[test]
fn inventory_yaml_and_table_for_other_fleets() {
    let o = run(&["inventory", "--simulate", "l4x4", "-o", "yaml"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(
        stdout(&o).matches("name: NVIDIA L4").count(),
        4,
        "{}",
        stdout(&o)
    );
    let o = run(&["inventory", "--simulate", "hgx-h200"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = stdout(&o);
    assert!(
        text.contains("NVIDIA H200") && text.contains("TOPOLOGY") && text.contains("NV18"),
        "{text}"
    );
}

#[test]
fn mig_devices_made_in_the_simulator_show_in_the_inventory() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().to_str().unwrap();
    let fleet = dir.path().join("fleet.yaml");
    std::fs::write(
        &fleet,
        "hostname: t\ngpus:\n  - model: A100-SXM4-40GB\n    count: 1\n    mig-enabled: true\n  - model: L4\n",
    )
    .unwrap();
    let o = run(&[
        "sim",
        "init",
        "--fleet",
        fleet.to_str().unwrap(),
        "--state",
        state,
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("1x A100-SXM4-40GB + 1x L4"),
        "{}",
        stdout(&o)
    );
    let o = run(&["inventory", "--sim-state", state, "-o", "json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v["gpus"][0]["mig"]["current_enabled"], true);
    assert_eq!(v["gpus"][1]["mig"]["capable"], false);
    assert_eq!(v["gpus"][0]["mig_devices"].as_array().unwrap().len(), 0);
}

#[test]
fn agent_once_prints_inventory_and_planned_endpoints() {
    let o = run(&[
        "agent",
        "--simulate",
        "dgx-h100",
        "--once",
        "--node-name",
        "n1",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = stdout(&o);
    assert!(
        text.contains("gpuops agent") && text.contains("on node n1"),
        "{text}"
    );
    assert!(text.contains("simulated driver"), "{text}");
    assert!(text.contains("NVIDIA H100 80GB HBM3"), "{text}");
    // The tests' environment moves the metrics to a free loopback port.
    assert!(
        text.contains(
            "metrics        http://127.0.0.1:0/metrics (DCGM-compatible; not served with --once)"
        ),
        "{text}"
    );
    assert!(
        text.contains("nvidia-gpu.sock for nvidia.com/gpu"),
        "{text}"
    );
}

/// How long a test waits for a line of the agent's.
const LINE_WAIT: Duration = Duration::from_secs(20);

/// An agent (or a shell line) whose stdout and stderr the test waits on line by line; stopped
/// when dropped.
struct Agent(ChildGuard);

impl Agent {
    /// Runs a shell command line (to merge stderr into stdout with `2>&1`).
    fn start_shell(line: &str) -> Agent {
        let mut cmd = Command::new("sh");
        cmd.args(["-c", line]);
        Agent::spawn(cmd)
    }

    fn start(args: &[&str]) -> Agent {
        let mut cmd = gpuops();
        cmd.args(args);
        Agent::spawn(cmd)
    }

    fn spawn(command: Command) -> Agent {
        Agent(ChildGuard::spawn_temp("agent", command).expect("start agent"))
    }

    /// The next line with `needle` after the last one this returned.
    fn wait_for(&mut self, needle: &str) -> String {
        self.0
            .next_line(needle, LINE_WAIT)
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// Like [`Agent::wait_for`], but any line printed so far counts too.
    fn saw_or_wait(&mut self, needle: &str) -> String {
        self.0
            .wait_for_line(needle, LINE_WAIT)
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// SIGTERM; the agent says it is stopping and exits.
    fn terminate(mut self) -> std::process::ExitStatus {
        self.0.signal("TERM");
        self.wait_for("stopping");
        self.0
            .wait_exit(LINE_WAIT)
            .unwrap_or_else(|| panic!("no exit after SIGTERM:\n{}", self.0.tail()))
    }

    /// SIGTERM, then its exit status, which must come within `within`.
    fn exit_within(&mut self, within: Duration, while_: &str) -> std::process::ExitStatus {
        self.0.signal("TERM");
        self.0.wait_exit(within).unwrap_or_else(|| {
            panic!(
                "the agent did not exit within {within:?} of SIGTERM while {while_}:\n{}",
                self.0.tail()
            )
        })
    }
}

#[test]
fn agent_reports_injected_xids_lost_gpus_and_recovery_then_stops_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().to_str().unwrap().to_string();
    let mut agent = Agent::start(&[
        "agent",
        "--simulate",
        "dgx-h100",
        "--sim-state",
        &state,
        "--interval",
        "300ms",
    ]);
    agent.wait_for("watching 8 GPUs");
    let sim = |args: &[&str]| {
        let mut full = vec!["sim"];
        full.extend_from_slice(args);
        full.extend_from_slice(&["--state", &state]);
        let o = run(&full);
        assert!(o.status.success(), "{}", stderr(&o));
    };
    sim(&["xid", "--gpu", "3", "--xid", "48"]);
    let line = agent.wait_for("XID 48 on GPU 3");
    assert!(
        line.contains("double-bit ECC") && line.contains("GPU-"),
        "{line}"
    );
    sim(&["xid", "--gpu", "1", "--xid", "13"]);
    assert!(
        agent
            .wait_for("XID 13 on GPU 1")
            .contains("GPU stays healthy")
    );
    sim(&["lost", "--gpu", "5"]);
    agent.wait_for("health healthy -> lost");
    agent.wait_for("watching 7 GPUs for XID errors (0,1,2,3,4,6,7)");
    sim(&["reset", "--gpu", "5"]);
    agent.wait_for("health lost -> healthy");
    agent.wait_for("watching 8 GPUs");
    // Events keep flowing after the recovery (the watcher was rebuilt).
    sim(&["xid", "--gpu", "5", "--xid", "94"]);
    agent.wait_for("XID 94 on GPU 5");
    assert!(agent.terminate().success());
    // The state directory the user named is kept for inspection.
    assert!(dir.path().join("state.json").is_file());
}

/// A GPU falling off the bus is marked at once, not at the next periodic read: the driver's
/// "GPU is lost" on the event wait names no GPU, so the agent reads the GPUs right then. With a
/// 60 s interval, waiting for the next read would take up to a minute.
#[test]
fn a_lost_gpu_is_marked_as_fast_as_an_xid_not_at_the_next_read() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().to_str().unwrap().to_string();
    let mut agent = Agent::start(&[
        "agent",
        "--simulate",
        "dgx-h100",
        "--sim-state",
        &state,
        "--interval",
        "60s",
    ]);
    agent.wait_for("watching 8 GPUs");
    let sim = |args: &[&str]| {
        let mut full = vec!["sim"];
        full.extend_from_slice(args);
        full.extend_from_slice(&["--state", &state]);
        let o = run(&full);
        assert!(o.status.success(), "{}", stderr(&o));
    };
    // Bounds far under the interval, and generous for a loaded 2-core machine.
    let within = Duration::from_secs(10);
    let started = Instant::now();
    sim(&["xid", "--gpu", "3", "--xid", "48"]);
    agent
        .0
        .next_line("XID 48 on GPU 3", within)
        .unwrap_or_else(|e| panic!("{e}"));
    let xid_took = started.elapsed();
    let started = Instant::now();
    sim(&["lost", "--gpu", "5"]);
    agent
        .0
        .next_line("health healthy -> lost", within)
        .unwrap_or_else(|e| panic!("{e}"));
    let lost_took = started.elapsed();
    println!("XID marked after {xid_took:?}, lost GPU after {lost_took:?} (interval 60 s)");
    agent
        .0
        .next_line("watching 7 GPUs for XID errors (0,1,2,3,4,6,7)", within)
        .unwrap_or_else(|e| panic!("{e}"));
    // Only GPU 5 is lost: the other seven stay watched and healthy.
    sim(&["xid", "--gpu", "6", "--xid", "48"]);
    agent
        .0
        .next_line("XID 48 on GPU 6", within)
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(agent.terminate().success());
}

#[test]
fn bad_input_gives_clear_errors_and_a_failing_exit_code() {
    let dir = tempfile::tempdir().unwrap();
    let bad_fleet = dir.path().join("fleet.yaml");
    std::fs::write(&bad_fleet, "gpus:\n  - model: H900\n    count: 2\n").unwrap();
    let bad_fleet = bad_fleet.to_str().unwrap().to_string();
    let corrupt = dir.path().join("corrupt");
    std::fs::create_dir(&corrupt).unwrap();
    std::fs::write(corrupt.join("state.json"), "{").unwrap();
    let corrupt = corrupt.to_str().unwrap().to_string();
    let cases: Vec<(Vec<&str>, Vec<&str>)> = vec![
        (
            vec!["inventory", "--simulate", "dgx-h900"],
            vec!["unknown fleet", "dgx-h100", "l4x4"],
        ),
        (
            vec!["inventory", "--simulate", &bad_fleet],
            vec![&bad_fleet, "line 2", "H900", "known models"],
        ),
        (
            vec!["inventory", "--sim-state", &corrupt],
            vec![&corrupt, "corrupt"],
        ),
        (
            vec!["inventory", "--nvml-lib", "/nonexistent/libnvidia-ml.so.1"],
            vec!["/nonexistent/libnvidia-ml.so.1", "--simulate"],
        ),
        (
            vec![
                "sim", "xid", "--state", &corrupt, "--gpu", "0", "--xid", "48",
            ],
            vec!["corrupt"],
        ),
        (
            vec!["catalog", "H900"],
            vec!["unknown GPU model", "H100-SXM5-80GB"],
        ),
        (
            vec!["agent", "--simulate", "l4x4", "--interval", "ten"],
            vec!["not a duration"],
        ),
    ];
    for (args, needles) in cases {
        let o = run(&args);
        assert!(!o.status.success(), "{args:?} should fail");
        let err = stderr(&o);
        for n in needles {
            assert!(err.contains(n), "{args:?}: expected {n:?} in:\n{err}");
        }
        assert!(!err.contains("panicked"), "{args:?} panicked:\n{err}");
    }
}

#[test]
fn sim_commands_validate_their_targets() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().to_str().unwrap();
    assert!(
        run(&["sim", "init", "--fleet", "l4x4", "--state", state])
            .status
            .success()
    );
    let o = run(&["sim", "xid", "--state", state, "--gpu", "9", "--xid", "48"]);
    assert!(
        stderr(&o).contains("no GPU with index 9") && stderr(&o).contains("0 to 3"),
        "{}",
        stderr(&o)
    );
    let o = run(&[
        "sim", "load", "--state", state, "--gpu", "0", "--util", "150",
    ]);
    assert!(stderr(&o).contains("0-100"), "{}", stderr(&o));
    let o = run(&["sim", "load", "--state", state, "--gpu", "all"]);
    assert!(stderr(&o).contains("nothing to change"), "{}", stderr(&o));
    let o = run(&[
        "sim", "load", "--state", state, "--gpu", "all", "--util", "75", "--power", "60",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let o = run(&["inventory", "--sim-state", state, "-o", "json"]);
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    for g in v["gpus"].as_array().unwrap() {
        assert_eq!(g["telemetry"]["gpu_utilization_pct"], 75);
        assert_eq!(g["telemetry"]["power_mw"], 60_000);
    }
    let o = run(&["sim", "show", "--state", state]);
    assert!(stdout(&o).contains("75%"), "{}", stdout(&o));
}

#[test]
fn help_teaches_the_first_commands() {
    let o = run(&["--help"]);
    let text = stdout(&o);
    assert!(text.contains("gpuops agent --simulate dgx-h100"), "{text}");
    for sub in ["agent", "inventory", "sim", "catalog"] {
        let o = run(&[sub, "--help"]);
        assert!(o.status.success(), "{sub} --help");
        assert!(
            stdout(&o).contains("Examples"),
            "{sub} --help has examples:\n{}",
            stdout(&o)
        );
    }
}

#[test]
fn catalog_lists_models_and_mig_profiles() {
    let o = run(&["catalog"]);
    let text = stdout(&o);
    for key in ["A100-SXM4-40GB", "H100-SXM5-80GB", "H200", "B200", "L4"] {
        assert!(text.contains(key), "{key} in:\n{text}");
    }
    let o = run(&["catalog", "nvidia h100 80gb hbm3"]);
    let text = stdout(&o);
    assert!(
        text.contains("1g.10gb") && text.contains("7g.80gb") && text.contains("0,1,2,3,4,5,6"),
        "{text}"
    );
}

#[test]
fn a_changed_device_plugin_config_is_reloaded_and_a_bad_one_keeps_the_last_good() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("plugin.yaml");
    let write = |replicas: u32| {
        let text = format!(
            "version: v1\nsharing:\n  timeSlicing:\n    renameByDefault: true\n    resources:\n    - name: nvidia.com/gpu\n      replicas: {replicas}\n"
        );
        write_newer(&config, &text);
    };
    write(2);
    let command = format!(
        "exec {} agent --simulate l4x4 --interval 300ms --metrics-address 127.0.0.1:0 --device-plugin-dir {} --config-file {} 2>&1",
        env!("CARGO_BIN_EXE_gpuops"),
        dir.path().join("dp").display(),
        config.display()
    );
    let mut agent = Agent::start_shell(&command);
    agent.wait_for("nvidia.com/gpu.shared (8 devices)");
    agent.wait_for("re-reading the GPUs");
    write(4);
    agent.wait_for("reloaded");
    agent.wait_for("nvidia.com/gpu.shared 16/16");
    write(1);
    let line = agent.wait_for("keeping the last good device plugin config");
    assert!(line.contains("replicas must be >= 2"), "{line}");
    assert!(agent.terminate().success());
}

/// Writes `text` to `path` until the file's modification time differs from the one it had: the
/// agent notices a changed config by that time, which some file systems keep in whole seconds.
fn write_newer(path: &std::path::Path, text: &str) {
    let mtime = || std::fs::metadata(path).and_then(|m| m.modified()).ok();
    let before = mtime();
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        std::fs::write(path, text).unwrap();
        if mtime() != before {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the modification time of {} never changed",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn cdi_generate_names_every_gpu_and_mig_device() {
    let o = run(&[
        "cdi",
        "generate",
        "--simulate",
        "dgx-h100",
        "--format",
        "json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v["cdiVersion"], "0.6.0");
    assert_eq!(v["kind"], "k8s.device-plugin.nvidia.com/gpu");
    let names = |v: &serde_json::Value| -> Vec<String> {
        v["devices"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d["name"].as_str().unwrap().to_string())
            .collect()
    };
    let n = names(&v);
    assert_eq!(n.len(), 17, "{n:?}");
    assert_eq!(n.last().map(String::as_str), Some("all"));
    assert_eq!(n.iter().filter(|n| n.starts_with("GPU-")).count(), 8);
    assert!((0..8).all(|i| n.contains(&i.to_string())), "{n:?}");
    assert_eq!(v["containerEdits"]["env"][0], "NVIDIA_VISIBLE_DEVICES=void");

    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().to_str().unwrap();
    let o = run(&["sim", "init", "--fleet", "dgx-h100", "--state", state]);
    assert!(o.status.success(), "{}", stderr(&o));
    let o = run(&["sim", "dev-nodes", "--state", state]);
    assert!(o.status.success(), "{}", stderr(&o));
    let o = run(&[
        "mig",
        "apply",
        "-f",
        concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/seed-mig-parted-config.yaml"
        ),
        "-c",
        "mixed-inference",
        "--sim-state",
        state,
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let inv = run(&["inventory", "--sim-state", state, "-o", "json"]);
    let inv: serde_json::Value = serde_json::from_str(&stdout(&inv)).unwrap();
    let out = dir.path().join("cdi").join("spec.json");
    let o = run(&[
        "cdi",
        "generate",
        "--sim-state",
        state,
        "--output",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    let n = names(&v);
    // 8 GPUs with 5 MIG devices each, every one by UUID and by index, and `all`.
    assert_eq!(n.len(), 2 * (8 + 8 * 5) + 1, "{n:?}");
    let mig = inv["gpus"][3]["mig_devices"][4]["uuid"].as_str().unwrap();
    assert!(
        mig.starts_with("MIG-") && n.contains(&mig.to_string()),
        "{n:?}"
    );
    assert!(n.contains(&"3:4".to_string()) && n.contains(&"7:0".to_string()));
    let dev = v["devices"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["name"] == "3:4")
        .unwrap();
    let nodes = dev["containerEdits"]["deviceNodes"].as_array().unwrap();
    assert_eq!(nodes.len(), 3);
    assert_eq!(nodes[0]["path"], "/dev/nvidia3");
    assert!(
        nodes[1]["path"]
            .as_str()
            .unwrap()
            .starts_with("/dev/nvidia-caps/nvidia-cap")
    );
    // The simulator's device nodes and placeholder driver files, at their host paths.
    assert_eq!(nodes[0]["hostPath"], format!("{state}/dev/nvidia3"));
    assert!(
        std::path::Path::new(nodes[1]["hostPath"].as_str().unwrap()).exists(),
        "{nodes:?}"
    );
    let mounts = v["containerEdits"]["mounts"].as_array().unwrap();
    let driver = inv["driver_version"].as_str().unwrap();
    let lib = format!("/usr/lib/x86_64-linux-gnu/libcuda.so.{driver}");
    assert!(
        mounts.iter().any(|m| m["containerPath"] == lib
            && m["hostPath"] == format!("{state}/driver{lib}")
            && m["options"][0] == "ro"),
        "{mounts:?}"
    );
    assert!(
        mounts
            .iter()
            .any(|m| m["containerPath"] == "/usr/lib/x86_64-linux-gnu/libcuda.so.1"),
        "{mounts:?}"
    );
    assert!(
        mounts
            .iter()
            .any(|m| m["containerPath"] == "/usr/bin/nvidia-smi"),
        "{mounts:?}"
    );
    let top: Vec<&str> = v["containerEdits"]["deviceNodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["path"].as_str().unwrap())
        .collect();
    assert_eq!(
        top,
        [
            "/dev/nvidiactl",
            "/dev/nvidia-uvm",
            "/dev/nvidia-uvm-tools",
            "/dev/nvidia-modeset"
        ]
    );

    // Bad input: a bad kind (a missing driver root: the probe's unit tests).
    let o = run(&[
        "cdi",
        "generate",
        "--sim-state",
        state,
        "--kind",
        "nvidia.com",
    ]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("CDI kind \"nvidia.com\" is not vendor/class"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn nvidia_flags_win_over_env_vars_which_win_over_the_config_file() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("plugin.yaml");
    std::fs::write(
        &config,
        "version: v1\nsharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 3\n",
    )
    .unwrap();
    let run_with = |env: Option<&str>, flag: Option<&str>| {
        let mut c = gpuops();
        c.args([
            "agent",
            "--simulate",
            "l4x4",
            "--once",
            "--config-file",
            config.to_str().unwrap(),
        ]);
        c.env_remove("DEVICE_SPLIT_COUNT");
        if let Some(v) = env {
            c.env("DEVICE_SPLIT_COUNT", v);
        }
        if let Some(v) = flag {
            c.args(["--device-split-count", v]);
        }
        c.output().unwrap()
    };
    let devices = |o: &Output| {
        let out = stdout(o);
        assert!(o.status.success(), "{out}{}", stderr(o));
        out.lines()
            .find(|l| l.contains("for nvidia.com/gpu ("))
            .map(str::to_string)
            .unwrap_or_default()
    };
    assert!(
        devices(&run_with(None, None)).contains("(12 devices)"),
        "file: 4 GPUs x 3"
    );
    assert!(
        devices(&run_with(Some("2"), None)).contains("(8 devices)"),
        "env over file"
    );
    assert!(
        devices(&run_with(Some("2"), Some("4"))).contains("(16 devices)"),
        "flag over env"
    );
    let o = run_with(None, Some("many"));
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("--device-split-count"),
        "{}",
        stderr(&o)
    );
}

/// `GET path` on `address`, as (status line and headers, body).
fn http_get(address: &str, path: &str) -> (String, String) {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(address).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {address}\r\n\r\n").unwrap();
    let mut text = String::new();
    stream.read_to_string(&mut text).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    (head.to_string(), body.to_string())
}

#[test]
fn a_hung_api_server_delays_neither_xid_health_nor_metrics_nor_shutdown() {
    // An API server that accepts connections and never answers a byte.
    let hung = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let api = hung.local_addr().unwrap();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for stream in hung.incoming() {
            held.push(stream);
        }
    });
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: hung\n  cluster:\n    server: http://{api}\ncontexts:\n- name: hung\n  context:\n    cluster: hung\n    user: u\nusers:\n- name: u\n  user: {{}}\ncurrent-context: hung\n"
        ),
    )
    .unwrap();
    let state = dir.path().join("sim");
    let plugins = dir.path().join("plugins");
    let mut agent = Agent::start(&[
        "agent",
        "--simulate",
        "dgx-h100",
        "--sim-state",
        state.to_str().unwrap(),
        "--interval",
        "300ms",
        "--kubernetes",
        "--taint-unhealthy",
        "--node-name",
        "gpu-node-1",
        "--kubeconfig",
        kubeconfig.to_str().unwrap(),
        "--device-plugin-dir",
        plugins.to_str().unwrap(),
    ]);
    let address = agent
        .wait_for("metrics        http://")
        .split("http://")
        .nth(1)
        .and_then(|s| s.split('/').next())
        .unwrap()
        .to_string();
    agent.wait_for("watching 8 GPUs");
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let mut stream = runtime.block_on(async {
        use gpuops_kubelet_api::deviceplugin::v1beta1::{
            Empty, device_plugin_client::DevicePluginClient,
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        let channel = loop {
            match gpuops_kubelet_api::unix::connect(&plugins.join("nvidia-gpu.sock")).await {
                Ok(c) => break c,
                Err(e) => assert!(Instant::now() < deadline, "no plugin socket: {e}"),
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        DevicePluginClient::new(channel)
            .list_and_watch(Empty {})
            .await
            .unwrap()
            .into_inner()
    });
    let o = run(&[
        "sim",
        "xid",
        "--gpu",
        "3",
        "--xid",
        "48",
        "--state",
        state.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    agent.wait_for("XID 48 on GPU 3");
    runtime.block_on(async {
        let wait = tokio::time::timeout(Duration::from_secs(10), async {
            while let Some(message) = stream.message().await.unwrap() {
                let unhealthy = message
                    .devices
                    .iter()
                    .filter(|d| d.health == "Unhealthy")
                    .count();
                if unhealthy == 1 {
                    return;
                }
            }
            panic!("ListAndWatch ended");
        });
        wait.await
            .expect("GPU 3 never turned Unhealthy on ListAndWatch while the API server hangs");
    });
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (_, body) = http_get(&address, "/metrics");
        let unhealthy_gpu3 = body.lines().any(|l| {
            l.starts_with("gpuops_device_healthy{") && l.contains("gpu=\"3\"") && l.ends_with(" 0")
        });
        if unhealthy_gpu3 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "metrics never showed GPU 3 unhealthy:\n{body}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let (head, _) = http_get(&address, "/healthz");
    assert!(head.contains(" 200"), "{head}");
    let status = agent.exit_within(Duration::from_secs(2), "the API server hangs");
    assert!(status.success(), "{status}");
}

/// The status line of `GET path` and how long it took, or `None` without an answer within 5 s.
fn probe(address: &str, path: &str) -> Option<(String, Duration)> {
    use std::io::{Read, Write};
    let started = Instant::now();
    let mut stream = std::net::TcpStream::connect(address).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {address}\r\n\r\n").ok()?;
    let mut text = String::new();
    stream.read_to_string(&mut text).ok()?;
    let status = text.lines().next().unwrap_or_default().to_string();
    Some((status, started.elapsed()))
}

/// Polls `path` until its status line contains `want`; how long that took.
fn wait_for_status(address: &str, path: &str, want: &str, within: Duration) -> Duration {
    let started = Instant::now();
    let mut last = None;
    while started.elapsed() < within {
        last = probe(address, path);
        if last.as_ref().is_some_and(|(s, _)| s.contains(want)) {
            return started.elapsed();
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("{path} did not answer {want} within {within:?}; last: {last:?}");
}

#[test]
fn a_hung_driver_fails_healthz_while_metrics_readyz_and_sigterm_still_answer() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().to_str().unwrap().to_string();
    // Liveness deadline: 3 x interval + snapshot timeout = 0.9 s + 4 s after the read began.
    let mut agent = Agent::start(&[
        "agent",
        "--simulate",
        "l4x4",
        "--sim-state",
        &state,
        "--interval",
        "300ms",
        "--snapshot-timeout",
        "4s",
        "--no-device-plugin",
    ]);
    let address = agent
        .wait_for("metrics        http://")
        .split("http://")
        .nth(1)
        .and_then(|s| s.split('/').next())
        .unwrap()
        .to_string();
    agent.wait_for("watching 4 GPUs");
    wait_for_status(&address, "/healthz", " 200", Duration::from_secs(10));

    let o = run(&["sim", "hang-driver", "--state", &state]);
    assert!(o.status.success(), "{}", stderr(&o));
    let hung_at = Instant::now();
    wait_for_status(&address, "/healthz", " 503", Duration::from_secs(20));
    let since_hang = hung_at.elapsed();
    // The loop's beat ages from when the hung read began (at most one interval after the hang):
    // stale 4.9 s later, seen at the agent's next 1 s health check, so 4.9-6.2 s; slack for a
    // loaded machine. Not earlier: the hang, not something else, fails it. Not later either: a
    // beat refreshed when the read is reported late (at 4 s) would fail it only after 8.9 s.
    assert!(
        since_hang >= Duration::from_millis(4700) && since_hang < Duration::from_secs(8),
        "/healthz failed {since_hang:?} after the hang; the deadline is 4.9 s after the read began"
    );
    agent.saw_or_wait("the GPU snapshot loop is stuck: /healthz fails");
    // What does not call the driver answers at once.
    for path in ["/metrics", "/readyz"] {
        let (status, took) = probe(&address, path)
            .unwrap_or_else(|| panic!("{path} did not answer while the driver hangs"));
        assert!(
            !status.is_empty() && took < Duration::from_secs(1),
            "{path}: {status} in {took:?}"
        );
    }
    let (status, _) = probe(&address, "/metrics").unwrap();
    assert!(status.contains(" 200"), "{status}");

    // The blocked read returns once the driver answers: liveness comes back.
    let o = run(&["sim", "hang-driver", "--state", &state, "--clear"]);
    assert!(o.status.success(), "{}", stderr(&o));
    wait_for_status(&address, "/healthz", " 200", Duration::from_secs(10));

    // SIGTERM while a driver call hangs: out within 2 s.
    let o = run(&["sim", "hang-driver", "--state", &state]);
    assert!(o.status.success(), "{}", stderr(&o));
    agent.wait_for("the NVIDIA driver has not answered a GPU read");
    let status = agent.exit_within(Duration::from_secs(2), "the driver hangs");
    assert!(status.success(), "{status}");
}

#[test]
fn log_format_json_gives_one_object_per_event_with_its_fields() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().to_str().unwrap().to_string();
    let mut agent = Agent::start(&[
        "agent",
        "--simulate",
        "l4x4",
        "--sim-state",
        &state,
        "--interval",
        "300ms",
        "--log-format",
        "json",
    ]);
    agent.wait_for("watching 4 GPUs");
    let o = run(&["sim", "xid", "--gpu", "2", "--xid", "79", "--state", &state]);
    assert!(o.status.success(), "{}", stderr(&o));
    let line = agent.wait_for("XID 79 on GPU 2");
    let event: serde_json::Value = serde_json::from_str(&line).unwrap();
    assert_eq!(event["level"], "WARN", "{line}");
    assert_eq!(event["fields"]["gpu"], 2, "{line}");
    assert_eq!(event["fields"]["xid"], 79, "{line}");
    assert!(
        event["fields"]["message"]
            .as_str()
            .unwrap()
            .contains("fallen off the bus"),
        "{line}"
    );
    assert!(agent.terminate().success());
}

/// The simulated driver cargo built next to the binary.
fn sim_library() -> std::path::PathBuf {
    let bin = std::path::Path::new(env!("CARGO_BIN_EXE_gpuops"));
    let dir = bin.parent().unwrap();
    [dir.join("libnvml_sim.so"), dir.join("deps/libnvml_sim.so")]
        .into_iter()
        .filter(|p| p.is_file())
        .max_by_key(|p| std::fs::metadata(p).unwrap().modified().unwrap())
        .expect("libnvml_sim.so next to the binary")
}

#[test]
fn without_nvml_fail_on_init_error_false_keeps_the_agent_up_until_the_driver_appears() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("sim");
    let o = run(&[
        "sim",
        "init",
        "--fleet",
        "l4x4",
        "--state",
        state.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let library = dir.path().join("driver/usr/lib64/libnvidia-ml.so.1");
    let plugins = dir.path().join("plugins");
    let args = [
        "agent",
        "--sim-state",
        state.to_str().unwrap(),
        "--nvml-lib",
        library.to_str().unwrap(),
        "--interval",
        "300ms",
        "--device-plugin-dir",
        plugins.to_str().unwrap(),
    ];
    // NVIDIA's default (FAIL_ON_INIT_ERROR=true): a clear failure with the hints.
    let o = gpuops().args(args).output().unwrap();
    assert!(!o.status.success());
    let text = stderr(&o);
    assert!(
        text.contains(library.to_str().unwrap()) && text.contains("FAIL_ON_INIT_ERROR=false"),
        "{text}"
    );

    let mut cmd = gpuops();
    cmd.args(args).env("FAIL_ON_INIT_ERROR", "false");
    let mut agent = Agent::spawn(cmd);
    let address = agent
        .wait_for("metrics        http://")
        .split("http://")
        .nth(1)
        .and_then(|s| s.split('/').next())
        .unwrap()
        .to_string();
    let line = agent.saw_or_wait("cannot load NVML");
    assert!(
        line.contains("not a GPU node") && line.contains(library.to_str().unwrap()),
        "{line}"
    );
    let (head, _) = http_get(&address, "/healthz");
    assert!(head.contains(" 200"), "{head}");
    let (head, body) = http_get(&address, "/metrics");
    assert!(head.contains(" 200"), "{head}");
    assert!(body.contains("gpuops_collections_total"), "{body}");
    assert!(!body.contains("DCGM_FI_DEV_GPU_TEMP{"), "{body}");
    let sockets = |d: &std::path::Path| {
        std::fs::read_dir(d)
            .map(|e| e.filter_map(Result::ok).count())
            .unwrap_or(0)
    };
    assert_eq!(sockets(&plugins), 0, "advertised devices without NVML");

    // The driver appears (a driver container finished installing): picked up by the retries.
    std::fs::create_dir_all(library.parent().unwrap()).unwrap();
    std::fs::copy(sim_library(), &library).unwrap();
    agent.wait_for("NVML loaded from");
    agent.wait_for("watching 4 GPUs");
    let deadline = Instant::now() + Duration::from_secs(20);
    while !plugins.join("nvidia-gpu.sock").exists() {
        assert!(
            Instant::now() < deadline,
            "no device plugin socket after NVML loaded"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(agent.terminate().success());
}

#[cfg(not(feature = "test-hooks"))]
#[test]
fn the_shipped_binary_has_no_test_only_knobs() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("mig.yaml");
    std::fs::write(
        &config,
        "version: v1\nmig-configs:\n  all-disabled:\n  - devices: all\n    mig-enabled: false\n",
    )
    .unwrap();
    let config = config.to_str().unwrap();
    let base = [
        "mig",
        "apply",
        "-f",
        config,
        "-c",
        "all-disabled",
        "--simulate",
        "dgx-h100",
    ];
    let mut crash = base.to_vec();
    crash.extend(["--crash-after", "1"]);
    let o = run(&crash);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("--crash-after"), "{}", stderr(&o));
    // The step delay's environment variable means nothing to it (with the knob, this value is a
    // parse error).
    let mut dry = base.to_vec();
    dry.push("--dry-run");
    let o = gpuops()
        .args(&dry)
        .env("GPUOPS_MIG_STEP_DELAY", "not-a-duration")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
}

/// `gpuops catalog | head -1`: the reader is gone before the first line is written. Every
/// command that prints ends quietly, killed by SIGPIPE as coreutils are (or with status 0), never
/// with a panic.
#[test]
fn output_into_a_closed_pipe_ends_quietly() {
    use std::os::unix::process::ExitStatusExt;
    for args in [
        &["catalog"][..],
        &["inventory", "--simulate", "dgx-h100"],
        &["inventory", "--simulate", "dgx-h100", "-o", "json"],
        &["mig", "export", "--simulate", "dgx-h100"],
        &["sim", "fleets"],
        &["agent", "--simulate", "l4x4", "--once"],
        &["completion", "bash"],
    ] {
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        let o = gpuops()
            .args(args)
            .stdout(writer)
            .stderr(Stdio::piped())
            .output()
            .unwrap();
        let err = stderr(&o);
        assert!(
            o.status.success() || o.status.signal() == Some(libc_sigpipe()),
            "gpuops {}: {:?}\n{err}",
            args.join(" "),
            o.status
        );
        assert!(
            !err.contains("panicked"),
            "gpuops {}: {err}",
            args.join(" ")
        );
    }
}

/// SIGPIPE's number on Linux.
fn libc_sigpipe() -> i32 {
    13
}

#[test]
fn cdi_hook_update_ldcache_writes_the_folders_and_runs_ldconfig_on_the_containers_root() {
    use std::io::Write;
    let dir = tempfile::tempdir().unwrap();
    let bundle = dir.path().join("bundle");
    std::fs::create_dir_all(bundle.join("rootfs/etc")).unwrap();
    std::fs::write(bundle.join("config.json"), r#"{"root":{"path":"rootfs"}}"#).unwrap();
    // Stands in for ldconfig: records how it was run.
    let fake = dir.path().join("ldconfig");
    let record = dir.path().join("args");
    std::fs::write(
        &fake,
        format!("#!/bin/sh\necho \"$@\" > {}\n", record.display()),
    )
    .unwrap();
    std::fs::set_permissions(&fake, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let hook = |state: &str, folder: &str| {
        let mut child = gpuops()
            .args([
                "cdi",
                "hook",
                "update-ldcache",
                "--folder",
                folder,
                "--ldconfig",
            ])
            .arg(&fake)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(state.as_bytes())
            .unwrap();
        child.wait_with_output().unwrap()
    };
    let state = format!(
        r#"{{"ociVersion":"1.0.2","id":"c","bundle":"{}"}}"#,
        bundle.display()
    );
    let o = hook(&state, "/usr/lib64");
    assert!(o.status.success(), "{}", stderr(&o));
    let conf =
        std::fs::read_to_string(bundle.join("rootfs/etc/ld.so.conf.d/00-gpuops-cdi.conf")).unwrap();
    assert!(conf.ends_with("\n/usr/lib64\n"), "{conf}");
    let args = std::fs::read_to_string(&record).unwrap();
    assert_eq!(
        args.trim(),
        format!("-r {}", bundle.join("rootfs").display())
    );
    // Bad input is refused, naming what is wrong.
    let o = hook("garbage", "/usr/lib64");
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("OCI state on stdin is not valid"),
        "{}",
        stderr(&o)
    );
    // A link in the image that would lead the hook out of the container's root.
    std::fs::remove_dir_all(bundle.join("rootfs/etc")).unwrap();
    std::os::unix::fs::symlink(dir.path().join("host-etc"), bundle.join("rootfs/etc")).unwrap();
    let o = hook(&state, "/usr/lib64");
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("rootfs/etc is a symlink"),
        "{}",
        stderr(&o)
    );
    assert!(!dir.path().join("host-etc").exists());
    let o = hook(&state, "relative/dir");
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("\"relative/dir\" is not an absolute directory"),
        "{}",
        stderr(&o)
    );
}
