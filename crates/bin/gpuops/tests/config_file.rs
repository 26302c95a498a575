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

/// Issue 29: every input is read through the same bounds and messages. Each case runs the binary
/// on a bad file and wants a clean error (an exit code, not a signal: the agent used to abort
/// allocating 32 GB for `replicas: 1000000000`) that names the file and the problem once.
// Long on purpose: a table of 20 bad files, one row each, and the one loop that checks them.
#[test]
fn bad_inputs_give_one_clean_error_naming_the_file_key_and_limit() {
    let dir = tempfile::tempdir().unwrap();
    let ts = |entry: &str| {
        format!("version: v1\nsharing:\n  timeSlicing:\n    resources:\n      - name: nvidia.com/gpu\n{entry}")
            .into_bytes()
    };
    let utf16 = |text: &str| -> Vec<u8> {
        [0xFEFF_u16]
            .into_iter()
            .chain(text.encode_utf16())
            .flat_map(u16::to_le_bytes)
            .collect()
    };
    let mig = |count: &str| {
        format!(
            "version: v1\nmig-configs:\n  a:\n    - devices: all\n      mig-enabled: true\n      mig-devices:\n        \"1g.10gb\": {count}\n"
        )
    };
    let big =
        |head: &str| format!("{head}{}", "# padding to 50 MB\n".repeat(2_700_000)).into_bytes();
    let mut garbage: Vec<u8> = (0..4096u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8)
        .collect();
    garbage[0] = 0xFF;
    let pools = |extra: &str| {
        format!(
            "pools:\n  - {{name: a, model: T4, gpus: 1, cpu: 4, memory: 8Gi, price-per-hour: 1{extra}}}\n"
        )
    };
    let agent = |f: &str| {
        vec!["agent", "--simulate", "l4x4", "--once", "--config-file", f]
            .into_iter()
            .map(String::from)
            .collect::<Vec<_>>()
    };
    let mig_validate = |f: &str| vec!["mig".into(), "validate".into(), "-f".into(), f.to_string()];
    let sim_init = |f: &str| {
        let state = dir.path().join("state").display().to_string();
        vec![
            "sim".into(),
            "init".into(),
            "--fleet".into(),
            f.to_string(),
            "--state".into(),
            state,
        ]
    };
    let pods = dir.path().join("pods.csv");
    std::fs::write(
        &pods,
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,creation_time,deletion_time\np,1000,1024,1,1000,,0,60\n",
    )
    .unwrap();
    let pods_arg = pods.display().to_string();
    let autoscale = |f: &str| {
        ["simulate", "autoscale", "--pods", &pods_arg, "--pools", f]
            .into_iter()
            .map(String::from)
            .collect::<Vec<_>>()
    };
    let nodes = dir.path().join("nodes.csv");
    std::fs::write(
        &nodes,
        "sn,cpu_milli,memory_mib,gpu,model\nn0,64000,262144,2,T4\n",
    )
    .unwrap();
    let nodes_arg = nodes.display().to_string();
    let simulate_pods = |f: &str| {
        ["simulate", "--nodes", &nodes_arg, "--pods", f]
            .into_iter()
            .map(String::from)
            .collect::<Vec<_>>()
    };
    type Args<'a> = &'a dyn Fn(&str) -> Vec<String>;
    let cases: Vec<(&str, Vec<u8>, Args, &str)> = vec![
        (
            "huge.yaml",
            ts("        replicas: 1000000000\n"),
            &agent,
            ":6:19: sharing.timeSlicing: nvidia.com/gpu: replicas 1000000000 is more than 1024, the limit per device",
        ),
        (
            "100k.yaml",
            ts("        replicas: 100000\n"),
            &agent,
            "replicas 100000 is more than 1024",
        ),
        (
            "overflow.yaml",
            ts("        replicas: 99999999999999999999999\n"),
            &agent,
            ":6:19: sharing.timeSlicing: nvidia.com/gpu: replicas 99999999999999999999999 is more than 1024",
        ),
        (
            "typo.yaml",
            ts("        replica: 4\n"),
            &agent,
            ":6:9: sharing.timeSlicing: nvidia.com/gpu: unknown key `replica` at line 6 (did you mean `replicas`?)",
        ),
        (
            "type.yaml",
            ts("        replicas: abc\n"),
            &agent,
            ":6:19: sharing.timeSlicing: nvidia.com/gpu: replicas \"abc\" is not a whole number; accepted: 2 to 1024",
        ),
        (
            "utf16.yaml",
            utf16(&String::from_utf8(ts("        replicas: 2\n")).unwrap()),
            &agent,
            ": the file is UTF-16 (little-endian) text (it starts with a byte order mark), not UTF-8",
        ),
        (
            "garbage.yaml",
            garbage.clone(),
            &agent,
            ":1:1: the file is not UTF-8 text: byte 0xFF",
        ),
        (
            "50mb.yaml",
            big("version: v1\n"),
            &agent,
            ": the file is larger than 4 MiB (4194304 bytes), the size limit for a device plugin config",
        ),
        (
            "mig-count.yaml",
            mig("4000000000").into_bytes(),
            &mig_validate,
            ":7:20: config a: mig-devices count for \"1g.10gb\" must be at most 64",
        ),
        (
            "mig-utf16.yaml",
            utf16(&mig("1")),
            &mig_validate,
            ": the file is UTF-16",
        ),
        (
            "mig-50mb.yaml",
            big(&mig("1")),
            &mig_validate,
            ": the file is larger than 4 MiB (4194304 bytes), the size limit for a mig-parted config",
        ),
        (
            "mig-garbage.yaml",
            garbage.clone(),
            &mig_validate,
            ": the file is not UTF-8 text",
        ),
        (
            "fleet.yaml",
            b"gpus:\n  - model: L4\n    count: 4294967296\n".to_vec(),
            &sim_init,
            ": line 3 column 12: count 4294967296 is more than the 64 GPUs a simulated node may have",
        ),
        (
            "fleet-utf16.yaml",
            utf16("gpus:\n  - model: L4\n"),
            &sim_init,
            ": the file is UTF-16",
        ),
        (
            "fleet-garbage.yaml",
            garbage.clone(),
            &sim_init,
            ": the file is not UTF-8 text",
        ),
        (
            "pools.yaml",
            pools(", max: 4000000000").into_bytes(),
            &autoscale,
            ":2: pool \"a\": min/max 4000000000: more than 10000, the most nodes a pool may have",
        ),
        (
            "pools-type.yaml",
            pools(", gpus: many").replace("gpus: 1, ", "").into_bytes(),
            &autoscale,
            "`pools[0].gpus`: \"many\" is not valid: expected a whole number",
        ),
        (
            "pools-utf16.yaml",
            utf16(&pools("")),
            &autoscale,
            ": the file is UTF-16",
        ),
        (
            "pods-utf16.csv",
            utf16("name,cpu_milli\n"),
            &simulate_pods,
            ": the file is UTF-16",
        ),
        (
            "pods-garbage.csv",
            garbage,
            &simulate_pods,
            ": the file is not UTF-8 text",
        ),
    ];
    for (name, bytes, args, want) in cases {
        let path = dir.path().join(name);
        std::fs::write(&path, &bytes).unwrap();
        let file = path.display().to_string();
        let o = common::gpuops().args(args(&file)).output().unwrap();
        let out = common::text(&o);
        assert!(
            o.status.code().is_some_and(|c| c != 0),
            "{name}: want a clean error exit, got {:?}:\n{out}",
            o.status
        );
        let stderr = String::from_utf8_lossy(&o.stderr);
        let line = stderr
            .lines()
            .find(|l| l.starts_with("error:"))
            .unwrap_or_else(|| panic!("{name}: no error line in:\n{out}"));
        assert!(
            line.contains(&file),
            "{name}: the file is not named: {line}"
        );
        assert!(line.contains(want), "{name}: want {want:?} in:\n{line}");
        assert_eq!(
            stderr.matches(want).count(),
            1,
            "{name}: said twice:\n{stderr}"
        );
        assert!(
            !out.contains("invalid i64") && !out.contains("invalid u32"),
            "{out}"
        );
        assert!(!out.contains("budget breached"), "{out}");
    }
}
