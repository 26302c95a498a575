//! The device plugin config file as the agent reads it: unknown keys are accepted (as NVIDIA's
//! plugin accepts them) but warned about once per file with file:line:col and a did-you-mean, and
//! counted in `gpuops_config_unknown_keys{file}`; an empty file is an error naming the file.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use gpuops_testbed::ChildGuard;
use std::io::{Read, Write};
use std::path::Path;
use std::time::Duration;

const TYPOS: &str = "version: v1\nflags:\n  migStratagy: mixed\nbogusTop: 1\nsharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 2\n";

/// An agent writing stdout and stderr to one log file; stopped on drop.
struct Agent(ChildGuard);

impl Agent {
    fn start(dir: &Path, config: &Path) -> Agent {
        let mut cmd = common::gpuops();
        cmd.args([
            "agent",
            "--simulate",
            "l4x4",
            "--interval",
            "300ms",
            "--device-plugin-dir",
            dir.join("dp").to_str().unwrap(),
            "--config-file",
            config.to_str().unwrap(),
        ]);
        Agent(ChildGuard::spawn("agent", cmd, &dir.join("agent.log")).unwrap())
    }

    fn log(&self) -> String {
        self.0.output()
    }

    fn wait_for(&mut self, needle: &str) -> String {
        self.0
            .wait_for_line(needle, Duration::from_secs(30))
            .unwrap_or_else(|e| panic!("{e}"))
    }

    fn metrics(&mut self) -> String {
        let line = self.wait_for("metrics        http://");
        let address = line
            .split("http://")
            .nth(1)
            .and_then(|s| s.split('/').next())
            .unwrap()
            .to_string();
        let mut stream = std::net::TcpStream::connect(&address).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        write!(stream, "GET /metrics HTTP/1.0\r\nHost: {address}\r\n\r\n").unwrap();
        let mut raw = String::new();
        stream.read_to_string(&mut raw).unwrap();
        raw.split_once("\r\n\r\n").unwrap().1.to_string()
    }
}

#[test]
fn unknown_keys_are_accepted_warned_once_with_their_position_and_counted() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("plugin.yaml");
    std::fs::write(&config, TYPOS).unwrap();
    let file = config.display().to_string();
    let mut agent = Agent::start(dir.path(), &config);
    // Still accepted: the sharing section applies.
    agent.wait_for("for nvidia.com/gpu (8 devices)");
    agent.wait_for("re-reading the GPUs");
    let log = agent.log();
    let typo = format!(
        "{file}:3:3: unknown key flags.migStratagy (did you mean flags.migStrategy?); ignored, as NVIDIA's device plugin ignores it"
    );
    let top = format!("{file}:4:1: unknown key bogusTop; ignored");
    assert_eq!(log.matches(&typo).count(), 1, "{log}");
    assert_eq!(log.matches(&top).count(), 1, "{log}");
    let body = agent.metrics();
    let want = format!("gpuops_config_unknown_keys{{file=\"{file}\"}} 2");
    assert!(body.lines().any(|l| l == want), "{want} not in:\n{body}");
    assert!(
        body.contains("# TYPE gpuops_config_unknown_keys gauge"),
        "{body}"
    );
}

#[test]
fn an_empty_config_file_is_an_error_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("empty.yaml");
    std::fs::write(&config, "# nothing here\n").unwrap();
    let o = common::run(&[
        "agent",
        "--simulate",
        "l4x4",
        "--once",
        "--config-file",
        config.to_str().unwrap(),
    ]);
    assert!(!o.status.success());
    let out = common::text(&o);
    assert!(
        out.contains(&format!(
            "{}: the file is empty: expected a device plugin config",
            config.display()
        )),
        "{out}"
    );
}
