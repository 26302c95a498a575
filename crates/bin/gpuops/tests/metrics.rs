//! The metrics exporter on nvml-sim: the exposition dcgm-exporter users expect, what changes in
//! the simulated driver do to it, a real Prometheus scraping it, and its failure modes.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

mod common;

use gpuops_testbed::ChildGuard;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// `gpuops exporter` (or `agent`) writing its output to a log file; stopped on drop.
struct Served {
    process: ChildGuard,
    address: String,
}

impl Served {
    fn start(dir: &Path, args: &[&str]) -> Served {
        Served::start_with(dir, args, |_| {})
    }

    /// The same with the command adjusted first (its environment, say).
    fn start_with(dir: &Path, args: &[&str], adjust: impl FnOnce(&mut Command)) -> Served {
        let log = dir.join(format!("exporter-{}.log", args.join("-").len()));
        let mut command = common::gpuops();
        adjust(&mut command);
        command.args(args);
        let mut served = Served {
            process: ChildGuard::spawn("gpuops", command, &log).unwrap(),
            address: String::new(),
        };
        served.address = served
            .wait_for_line("metrics        http://")
            .split("http://")
            .nth(1)
            .and_then(|s| s.split('/').next())
            .unwrap()
            .to_string();
        served
    }

    fn log(&self) -> String {
        self.process.output()
    }

    fn wait_for_line(&mut self, needle: &str) -> String {
        self.process
            .wait_for_line(needle, Duration::from_secs(30))
            .unwrap_or_else(|e| panic!("{e}"))
    }

    fn get(&self, path: &str) -> (String, String) {
        http_get(&self.address, path)
    }

    fn metrics(&self) -> String {
        let (head, body) = self.get("/metrics");
        assert!(
            head.starts_with("HTTP/1.0 200") || head.starts_with("HTTP/1.1 200"),
            "{head}"
        );
        body
    }

    /// Scrapes until `check` holds (the next collections bring changes).
    fn metrics_until(&self, what: &str, check: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let body = self.metrics();
            if check(&body) {
                return body;
            }
            assert!(
                Instant::now() < deadline,
                "{what} never showed up; last scrape:\n{body}\nlog:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

fn http_get(address: &str, path: &str) -> (String, String) {
    let mut stream = std::net::TcpStream::connect(address).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {address}\r\n\r\n").unwrap();
    let mut raw = String::new();
    stream.read_to_string(&mut raw).unwrap();
    let (head, body) = raw.split_once("\r\n\r\n").unwrap();
    (head.to_string(), body.to_string())
}

/// The sample lines of one metric.
fn series<'a>(body: &'a str, metric: &str) -> Vec<&'a str> {
    body.lines()
        .filter(|l| l.starts_with(&format!("{metric}{{")) || l.starts_with(&format!("{metric} ")))
        .collect()
}

fn value(line: &str) -> f64 {
    line.rsplit(' ').next().unwrap().parse().unwrap()
}

fn sim(state: &Path, args: &[&str]) {
    let mut all = vec![args[0], "--state", state.to_str().unwrap()];
    all.extend(&args[1..]);
    let mut full = vec!["sim"];
    full.extend(all);
    let o = common::run(&full);
    assert!(o.status.success(), "{}", common::text(&o));
}

fn exporter(state: &Path, fleet: &str, extra: &[&str]) -> Served {
    let mut args = vec![
        "exporter",
        "--simulate",
        fleet,
        "--sim-state",
        state.to_str().unwrap(),
        "--interval",
        "300ms",
        "--node-name",
        "gpu-node-7",
    ];
    args.extend(extra);
    Served::start(state.parent().unwrap(), &args)
}

/// What `promtool check metrics` says about an exposition, minus the lint findings every
/// dcgm-exporter-compatible exposition has by design (DCGM's camelCase labels, counter names
/// without `_total`).
fn promtool_findings(body: &str) -> Vec<String> {
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool not found: scripts/test installs Debian's prometheus package (apt-get install prometheus)");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(body.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() || out.status.code() == Some(3),
        "promtool could not parse the exposition:\n{text}"
    );
    text.lines()
        .filter(|l| {
            let dcgm = l.starts_with("DCGM_FI_");
            let inherited = l
                .ends_with("label names should be written in 'snake_case' not 'camelCase'")
                || (dcgm && l.ends_with("counter metrics should have \"_total\" suffix"))
                || (dcgm && l.ends_with("metric name should not include type 'counter'"));
            !inherited && !l.trim().is_empty()
        })
        .map(String::from)
        .collect()
}

#[test]
fn the_exporter_serves_dcgm_metrics_with_dcgm_labels_that_promtool_accepts() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("sim");
    let served = exporter(&state, "dgx-h100", &[]);
    let body = served.metrics();
    let temps = series(&body, "DCGM_FI_DEV_GPU_TEMP");
    assert_eq!(temps.len(), 8, "{body}");
    let labels = temps[0]
        .split('{')
        .nth(1)
        .unwrap()
        .split('}')
        .next()
        .unwrap();
    let names: Vec<&str> = labels
        .split(',')
        .map(|kv| kv.split('=').next().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "gpu",
            "UUID",
            "pci_bus_id",
            "device",
            "modelName",
            "hostname",
            "DCGM_FI_DRIVER_VERSION"
        ],
        "dcgm-exporter's label order: {}",
        temps[0]
    );
    assert!(
        temps[0].contains("modelName=\"NVIDIA H100 80GB HBM3\"")
            && temps[0].contains("hostname=\"gpu-node-7\"")
    );
    for metric in [
        "DCGM_FI_DEV_SM_CLOCK",
        "DCGM_FI_DEV_MEM_CLOCK",
        "DCGM_FI_DEV_MEMORY_TEMP",
        "DCGM_FI_DEV_POWER_USAGE",
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
        "DCGM_FI_DEV_GPU_UTIL",
        "DCGM_FI_DEV_MEM_COPY_UTIL",
        "DCGM_FI_DEV_FB_FREE",
        "DCGM_FI_DEV_FB_USED",
        "DCGM_FI_DEV_FB_RESERVED",
        "DCGM_FI_DEV_XID_ERRORS",
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
        "DCGM_FI_DEV_ROW_REMAP_FAILURE",
        "gpuops_device_healthy",
        "gpuops_device_allocated",
    ] {
        assert_eq!(series(&body, metric).len(), 8, "{metric}:\n{body}");
    }
    assert!(body.contains("# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION counter\n"));
    assert!(body.contains("# HELP DCGM_FI_DEV_FB_USED Framebuffer memory used (in MiB).\n"));
    let total: f64 = ["FREE", "USED", "RESERVED"]
        .iter()
        .map(|k| value(series(&body, &format!("DCGM_FI_DEV_FB_{k}"))[0]))
        .sum();
    assert_eq!(
        total, 81559.0,
        "free + used + reserved = total MiB of an H100"
    );
    assert_eq!(value(series(&body, "gpuops_node_gpus")[0]), 8.0);
    let findings = promtool_findings(&body);
    assert!(
        findings.is_empty(),
        "promtool check metrics:\n{}",
        findings.join("\n")
    );

    let (head, _) = served.get("/metrics");
    assert!(
        head.to_lowercase()
            .contains("content-type: text/plain; version=0.0.4"),
        "{head}"
    );
    let scrapes = value(series(&served.metrics(), "gpuops_scrapes_total")[0]);
    assert!(scrapes >= 3.0, "every scrape counts: {scrapes}");
    let (head, _) = served.get("/nope");
    assert!(head.contains(" 404"), "{head}");
    let (head, body) = served.get("/healthz");
    assert!(head.contains(" 200") && body == "ok\n", "{head}");
}

#[test]
fn promtool_findings_catch_a_broken_exposition() {
    // The check above can fail: a bad sample or an own metric breaking conventions is reported.
    let bad = "# TYPE gpuops_things counter\ngpuops_things{a=\"1\"} 3\n";
    assert!(!promtool_findings(bad).is_empty());
    let parse = std::panic::catch_unwind(|| promtool_findings("x{a=\"1\"} notanumber\n"));
    assert!(parse.is_err(), "an unparsable exposition fails the check");
}

#[test]
fn load_xids_and_a_lost_gpu_show_up_in_the_next_collection() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("sim");
    let served = exporter(&state, "dgx-h100", &[]);
    let gpu3 = |body: &str, metric: &str| -> Vec<String> {
        series(body, metric)
            .into_iter()
            .filter(|l| l.contains("gpu=\"3\""))
            .map(String::from)
            .collect()
    };
    sim(
        &state,
        &[
            "load",
            "--gpu",
            "3",
            "--util",
            "87",
            "--memory-used",
            "40000",
        ],
    );
    let body = served.metrics_until("GPU 3 at 87%", |b| {
        gpu3(b, "DCGM_FI_DEV_GPU_UTIL")
            .first()
            .is_some_and(|l| value(l) == 87.0)
    });
    assert!(value(&gpu3(&body, "DCGM_FI_DEV_FB_USED")[0]) >= 40000.0);

    sim(&state, &["xid", "--gpu", "3", "--xid", "79"]);
    sim(&state, &["xid", "--gpu", "3", "--xid", "13"]);
    sim(&state, &["xid", "--gpu", "3", "--xid", "13"]);
    let body = served.metrics_until("XID counters", |b| {
        gpu3(b, "gpuops_xid_errors_total")
            .iter()
            .any(|l| l.contains("err_code=\"13\"") && value(l) == 2.0)
    });
    let counters = gpu3(&body, "gpuops_xid_errors_total");
    assert!(
        counters.iter().any(|l| l
            .contains("err_code=\"79\",err_msg=\"GPU has fallen off the bus\"")
            && value(l) == 1.0),
        "{counters:#?}"
    );
    let gauge = &gpu3(&body, "DCGM_FI_DEV_XID_ERRORS")[0];
    assert_eq!(
        value(gauge),
        13.0,
        "the sticky gauge shows the last XID: {gauge}"
    );
    assert_eq!(
        value(&gpu3(&body, "gpuops_device_healthy")[0]),
        0.0,
        "XID 79 is fatal"
    );
    assert_eq!(value(series(&body, "gpuops_node_gpus_healthy")[0]), 7.0);

    sim(&state, &["lost", "--gpu", "5"]);
    let body = served.metrics_until("GPU 5 lost", |b| {
        series(b, "DCGM_FI_DEV_GPU_TEMP").len() == 7
    });
    assert_eq!(
        value(series(&body, "gpuops_node_gpus")[0]),
        8.0,
        "capacity remembers the lost GPU"
    );
    assert_eq!(value(series(&body, "gpuops_node_gpus_healthy")[0]), 6.0);
    let healthy5: Vec<&str> = series(&body, "gpuops_device_healthy")
        .into_iter()
        .filter(|l| l.contains("gpu=\"5\""))
        .collect();
    assert!(
        healthy5.len() == 1 && value(healthy5[0]) == 0.0,
        "{healthy5:?}"
    );
}

#[test]
fn mig_instances_get_their_own_series_with_profile_and_instance_id() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("sim");
    sim(&state, &["init", "--fleet", "dgx-h100"]);
    let config = dir.path().join("mig.yaml");
    std::fs::write(
        &config,
        "version: v1\nmig-configs:\n  half:\n  - devices: [0, 1]\n    mig-enabled: true\n    mig-devices:\n      1g.10gb: 7\n  - devices: [2, 3, 4, 5, 6, 7]\n    mig-enabled: false\n",
    )
    .unwrap();
    let o = common::run(&[
        "mig",
        "apply",
        "-f",
        config.to_str().unwrap(),
        "-c",
        "half",
        "--sim-state",
        state.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", common::text(&o));
    let mut args = vec![
        "exporter",
        "--sim-state",
        state.to_str().unwrap(),
        "--interval",
        "300ms",
    ];
    args.extend(["--hostname-label", "Hostname"]);
    let served = Served::start(dir.path(), &args);
    let body = served.metrics();
    let instances: Vec<&str> = series(&body, "DCGM_FI_DEV_FB_FREE")
        .into_iter()
        .filter(|l| l.contains("GPU_I_PROFILE=\"1g.10gb\""))
        .collect();
    assert_eq!(instances.len(), 14, "{body}");
    assert!(
        instances[0]
            .contains(",modelName=\"NVIDIA H100 80GB HBM3\",GPU_I_PROFILE=\"1g.10gb\",GPU_I_ID=\""),
        "MIG labels sit between modelName and the host label: {}",
        instances[0]
    );
    assert!(
        instances[0].contains(",Hostname=\""),
        "--hostname-label Hostname (before dcgm-exporter 4.6): {}",
        instances[0]
    );
    assert!(!body.contains("hostname="));
    let util_gpus = series(&body, "DCGM_FI_DEV_GPU_UTIL");
    assert!(
        util_gpus.iter().all(|l| !l.contains("GPU_I_ID")),
        "no utilization per MIG instance"
    );
    assert_eq!(series(&body, "gpuops_device_healthy").len(), 8 + 14);
    let findings = promtool_findings(&body);
    assert!(findings.is_empty(), "{}", findings.join("\n"));
}

#[test]
fn a_taken_port_fails_the_start_with_a_clear_message() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = taken.local_addr().unwrap().to_string();
    let dir = tempfile::tempdir().unwrap();
    let o = common::run(&[
        "exporter",
        "--simulate",
        "l4x4",
        "--sim-state",
        dir.path().join("s").to_str().unwrap(),
        "--address",
        &address,
    ]);
    assert!(!o.status.success());
    let text = common::text(&o);
    assert!(
        text.contains(&format!("cannot listen for metrics on {address}")),
        "{text}"
    );
    let o = common::run(&["exporter", "--simulate", "l4x4", "--hostname-label", "HOST"]);
    assert!(
        !o.status.success() && common::text(&o).contains("use Hostname or hostname"),
        "{}",
        common::text(&o)
    );
}

#[test]
fn a_missing_kubelet_socket_is_reported_once_and_metrics_keep_flowing() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("sim");
    let socket = dir.path().join("no-kubelet/kubelet.sock");
    let mut served = exporter(
        &state,
        "l4x4",
        &["--pod-resources-socket", socket.to_str().unwrap()],
    );
    served.wait_for_line("pod attribution: kubelet PodResources at");
    let body = served.metrics_until("several collections", |b| {
        series(b, "gpuops_collections_total")
            .first()
            .is_some_and(|l| value(l) >= 4.0)
    });
    assert_eq!(series(&body, "DCGM_FI_DEV_GPU_TEMP").len(), 4);
    let errors: Vec<&str> = series(&body, "gpuops_collection_errors_total")
        .into_iter()
        .filter(|l| l.contains("source=\"podresources\""))
        .collect();
    assert!(value(errors[0]) >= 3.0, "{errors:?}");
    let log = served.log();
    assert_eq!(
        log.matches("pod attribution: kubelet PodResources").count(),
        1,
        "logged once:\n{log}"
    );
    assert!(log.contains(socket.to_str().unwrap()), "{log}");
}

/// A real Prometheus on a free loopback port with `config`; stopped on drop.
struct Prometheus {
    _process: ChildGuard,
    address: String,
    log: PathBuf,
}

impl Prometheus {
    fn start(dir: &Path, config: &str) -> Prometheus {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let file = dir.join("prometheus.yml");
        std::fs::write(&file, config).unwrap();
        let log = dir.join("prometheus.log");
        let mut cmd = Command::new("prometheus");
        cmd.arg(format!("--config.file={}", file.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("tsdb").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"));
        let process = ChildGuard::spawn("prometheus", cmd, &log)
            .unwrap_or_else(|e| panic!("{e}: scripts/test installs Debian's prometheus package"));
        Prometheus {
            _process: process,
            address: format!("127.0.0.1:{port}"),
            log,
        }
    }

    /// The result vector of an instant query (empty while Prometheus is not up yet).
    fn results(&self, q: &str) -> Vec<serde_json::Value> {
        let encoded: String = q
            .bytes()
            .map(|b| match b {
                b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'_' => (b as char).to_string(),
                _ => format!("%{b:02X}"),
            })
            .collect();
        if std::net::TcpStream::connect(&self.address).is_err() {
            return Vec::new();
        }
        let (_, body) = http_get(&self.address, &format!("/api/v1/query?query={encoded}"));
        serde_json::from_str::<serde_json::Value>(&body).unwrap_or(serde_json::Value::Null)["data"]
            ["result"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    }

    /// Queries until `check` holds on the result, with a deadline.
    fn until(
        &self,
        what: &str,
        q: &str,
        check: impl Fn(&[serde_json::Value]) -> bool,
    ) -> Vec<serde_json::Value> {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let r = self.results(q);
            if check(&r) {
                return r;
            }
            assert!(
                Instant::now() < deadline,
                "{what}: {q} gave {r:#?}; Prometheus log:\n{}",
                std::fs::read_to_string(&self.log).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(500));
        }
    }
}

#[test]
fn a_real_prometheus_scrapes_the_exporter_and_sees_the_series_and_labels() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("sim");
    let served = exporter(&state, "hgx-h200", &[]);
    let prometheus = Prometheus::start(
        dir.path(),
        &format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n- job_name: gpuops\n  static_configs:\n  - targets: ['{}']\n",
            served.address
        ),
    );
    let results = |q: &str| prometheus.results(q);
    prometheus.until("8 GPU temperatures", "DCGM_FI_DEV_GPU_TEMP", |r| {
        r.len() == 8
    });
    let up = results("up{job=\"gpuops\"}");
    assert_eq!(up[0]["value"][1], "1", "{up:?}");
    let temp = &results("DCGM_FI_DEV_GPU_TEMP{gpu=\"0\"}")[0]["metric"];
    assert_eq!(temp["modelName"], "NVIDIA H200");
    // dcgm-exporter 4.6+'s spelling by default.
    assert_eq!(temp["hostname"], "gpu-node-7");
    assert!(temp.get("Hostname").is_none(), "{temp}");
    assert!(temp["UUID"].as_str().unwrap().starts_with("GPU-"));
    assert_eq!(temp["device"], "nvidia0");
    assert!(
        temp["DCGM_FI_DRIVER_VERSION"]
            .as_str()
            .is_some_and(|v| !v.is_empty())
    );
    // The alert rule's expression over the counter sees an injected XID.
    sim(&state, &["xid", "--gpu", "2", "--xid", "48"]);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let r = results("gpuops_xid_errors_total{err_code=\"48\"}");
        if r.len() == 1 {
            assert_eq!(r[0]["metric"]["gpu"], "2");
            assert_eq!(r[0]["metric"]["err_msg"], "double-bit ECC error");
            break;
        }
        assert!(Instant::now() < deadline, "XID 48 never reached Prometheus");
        std::thread::sleep(Duration::from_millis(500));
    }
    let fb = results("sum(DCGM_FI_DEV_FB_USED + DCGM_FI_DEV_FB_FREE + DCGM_FI_DEV_FB_RESERVED)");
    let total: f64 = fb[0]["value"][1].as_str().unwrap().parse().unwrap();
    assert_eq!(total, 8.0 * 143771.0, "8x H200 total MiB");
}

#[test]
fn gpm_profiling_fields_follow_the_simulated_load_and_gpus_without_gpm_have_none() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("sim");
    let served = exporter(&state, "dgx-h100", &[]);
    let of = |body: &str, metric: &str, gpu: &str| -> Option<f64> {
        series(body, metric)
            .into_iter()
            .find(|l| l.contains(&format!("gpu=\"{gpu}\"")))
            .map(value)
    };
    // The second collection has an interval to report: every H100 idle.
    let body = served.metrics_until("GPM series", |b| {
        series(b, "DCGM_FI_PROF_GR_ENGINE_ACTIVE").len() == 8
    });
    assert!(
        body.contains("# TYPE DCGM_FI_PROF_PIPE_TENSOR_ACTIVE gauge\n"),
        "{body}"
    );
    for metric in [
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
        "DCGM_FI_PROF_SM_ACTIVE",
        "DCGM_FI_PROF_SM_OCCUPANCY",
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
        "DCGM_FI_PROF_DRAM_ACTIVE",
        "DCGM_FI_PROF_PCIE_TX_BYTES",
        "DCGM_FI_PROF_PCIE_RX_BYTES",
        "DCGM_FI_PROF_NVLINK_TX_BYTES",
        "DCGM_FI_PROF_NVLINK_RX_BYTES",
    ] {
        assert_eq!(of(&body, metric, "3"), Some(0.0), "{metric} idle");
    }
    assert_eq!(promtool_findings(&body), Vec::<String>::new());

    sim(
        &state,
        &["load", "--gpu", "3", "--util", "90", "--mem-util", "40"],
    );
    let body = served.metrics_until("GPU 3 busy", |b| {
        of(b, "DCGM_FI_PROF_GR_ENGINE_ACTIVE", "3").is_some_and(|v| (v - 0.9).abs() < 1e-6)
    });
    assert!((of(&body, "DCGM_FI_PROF_DRAM_ACTIVE", "3").unwrap() - 0.4).abs() < 1e-6);
    assert!(of(&body, "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "3").unwrap() > 0.0);
    assert!(of(&body, "DCGM_FI_PROF_PCIE_RX_BYTES", "3").unwrap() > 1e9);
    assert_eq!(of(&body, "DCGM_FI_PROF_GR_ENGINE_ACTIVE", "2"), Some(0.0));
    drop(served);

    // Ampere has no GPM: no profiling series at all, never zeros.
    let state = dir.path().join("a100");
    let served = exporter(&state, "dgx-a100", &[]);
    let body = served.metrics_until("a few collections", |b| {
        series(b, "gpuops_collections_total")
            .first()
            .is_some_and(|l| value(l) >= 3.0)
    });
    assert!(!body.contains("DCGM_FI_PROF_"), "{body}");
}

#[test]
fn dcgm_exporters_env_vars_configure_the_exporter_and_bad_ones_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("sim");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let args = [
        "exporter",
        "--simulate",
        "l4x4",
        "--sim-state",
        state.to_str().unwrap(),
        "--node-name",
        "gpu-node-7",
    ];
    // As dcgm-exporter's DaemonSet sets them: Go's ":port" form and milliseconds.
    let mut served = Served::start_with(dir.path(), &args, |c| {
        c.env_remove("GPUOPS_METRICS_ADDRESS")
            .env("DCGM_EXPORTER_LISTEN", format!(":{port}"))
            .env("DCGM_EXPORTER_INTERVAL", "250")
            .env("DCGM_EXPORTER_KUBERNETES", "false")
            .env(
                "DCGM_POD_RESOURCES_KUBELET_SOCKET",
                "/nonexistent/kubelet.sock",
            )
            .env(
                "DCGM_EXPORTER_COLLECTORS",
                "/etc/dcgm-exporter/dcp-metrics-included.csv",
            );
    });
    let line = served.wait_for_line("metrics        http://");
    assert!(
        line.contains(&format!("0.0.0.0:{port}/metrics")) && line.contains("every 250ms"),
        "{line}"
    );
    served.wait_for_line("DCGM_EXPORTER_COLLECTORS is ignored");
    served.address = format!("127.0.0.1:{port}");
    let body = served.metrics_until("collections every 250 ms", |b| {
        series(b, "gpuops_collections_total")
            .first()
            .is_some_and(|l| value(l) >= 3.0)
    });
    assert!(body.contains("hostname=\"gpu-node-7\""));
    assert!(
        !served.log().contains("pod attribution"),
        "DCGM_EXPORTER_KUBERNETES=false: no pod mapping: {}",
        served.log()
    );
    drop(served);
    // A value dcgm-exporter would take differently is refused, naming the variable.
    let o = common::gpuops()
        .args(args)
        .env("DCGM_EXPORTER_INTERVAL", "30s")
        .output()
        .unwrap();
    assert!(!o.status.success());
    let text = common::text(&o);
    assert!(
        text.contains("DCGM_EXPORTER_INTERVAL=\"30s\"") && text.contains("milliseconds"),
        "{text}"
    );
}

/// The kubelet's PodResources API, answering `List()` with whatever the test put in `pods`.
struct FakeKubelet {
    pods: std::sync::Arc<std::sync::Mutex<Vec<gpuops_kubelet_api::podresources::v1::PodResources>>>,
}

#[tonic::async_trait]
impl gpuops_kubelet_api::podresources::v1::pod_resources_lister_server::PodResourcesLister
    for FakeKubelet
{
    async fn list(
        &self,
        _: tonic::Request<gpuops_kubelet_api::podresources::v1::ListPodResourcesRequest>,
    ) -> Result<
        tonic::Response<gpuops_kubelet_api::podresources::v1::ListPodResourcesResponse>,
        tonic::Status,
    > {
        let pods = self.pods.lock().unwrap().clone();
        Ok(tonic::Response::new(
            gpuops_kubelet_api::podresources::v1::ListPodResourcesResponse {
                pod_resources: pods,
            },
        ))
    }

    async fn get_allocatable_resources(
        &self,
        _: tonic::Request<gpuops_kubelet_api::podresources::v1::AllocatableResourcesRequest>,
    ) -> Result<
        tonic::Response<gpuops_kubelet_api::podresources::v1::AllocatableResourcesResponse>,
        tonic::Status,
    > {
        Ok(tonic::Response::new(Default::default()))
    }

    async fn get(
        &self,
        _: tonic::Request<gpuops_kubelet_api::podresources::v1::GetPodResourcesRequest>,
    ) -> Result<
        tonic::Response<gpuops_kubelet_api::podresources::v1::GetPodResourcesResponse>,
        tonic::Status,
    > {
        Err(tonic::Status::unimplemented("not used"))
    }
}

/// A Prometheus Operator scrape job for the chart's ServiceMonitor in `mode`
/// (`metrics.serviceMonitor.podLabels`), as a static config: the target gets the `__meta_*`
/// labels Kubernetes service discovery would give the agent pod's endpoint, then the relabelling
/// the operator generates for every ServiceMonitor endpoint, then the endpoint's own.
fn operator_job(mode: &str, target: &str) -> String {
    // The chart is the one source of the ServiceMonitor; render it with the real Helm the test
    // bed builds (hence an e2e-tier test).
    let bin = std::env::var_os(gpuops_testbed::BIN_ENV)
        .map(std::path::PathBuf::from)
        .expect("GPUOPS_K8S_BIN: run eval \"$(tests/k8s/build.sh)\" first (it builds Helm)");
    let chart =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../deploy/helm/gpuops");
    let home = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(bin.join("helm"))
        .args(["template", "gpuops"])
        .arg(&chart)
        .args([
            "--namespace",
            "gpuops",
            "--set",
            "metrics.serviceMonitor.enabled=true",
        ])
        .args(["--set", &format!("metrics.serviceMonitor.podLabels={mode}")])
        .env("HELM_CACHE_HOME", home.path().join("cache"))
        .env("HELM_CONFIG_HOME", home.path().join("config"))
        .env("HELM_DATA_HOME", home.path().join("data"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", common::text(&out));
    let text = String::from_utf8(out.stdout).unwrap();
    let endpoint = text
        .split("\n---")
        .map(|doc| serde_saphyr::from_str::<serde_json::Value>(doc).unwrap_or_default())
        .find(|o| o["kind"] == "ServiceMonitor")
        .expect("a ServiceMonitor")["spec"]["endpoints"][0]
        .clone();
    let honor = endpoint["honorLabels"].as_bool().unwrap_or(false);
    let own: Vec<String> = endpoint["relabelings"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(|r| {
            let fields: Vec<String> = r
                .as_object()
                .unwrap()
                .iter()
                .map(|(k, v)| {
                    let key = match k.as_str() {
                        "sourceLabels" => "source_labels",
                        "targetLabel" => "target_label",
                        other => other,
                    };
                    format!("{key}: {v}")
                })
                .collect();
            format!("  - {{{}}}\n", fields.join(", "))
        })
        .collect();
    let service = format!("gpuops-{mode}");
    format!(
        "- job_name: serviceMonitor/gpuops/{service}/0\n  honor_labels: {honor}\n  static_configs:\n  - targets: ['{target}']\n    labels:\n      __meta_kubernetes_namespace: gpuops\n      __meta_kubernetes_service_name: {service}\n      __meta_kubernetes_pod_name: gpuops-agent-x7k2p\n      __meta_kubernetes_pod_container_name: agent\n      __meta_kubernetes_endpoint_port_name: metrics\n  relabel_configs:\n  - {{source_labels: [job], target_label: __tmp_prometheus_job_name}}\n  - {{source_labels: [__meta_kubernetes_endpoint_port_name], regex: metrics, action: keep}}\n  - {{source_labels: [__meta_kubernetes_namespace], target_label: namespace}}\n  - {{source_labels: [__meta_kubernetes_service_name], target_label: service}}\n  - {{source_labels: [__meta_kubernetes_pod_name], target_label: pod}}\n  - {{source_labels: [__meta_kubernetes_pod_container_name], target_label: container}}\n  - {{source_labels: [__meta_kubernetes_service_name], target_label: job}}\n  - {{target_label: endpoint, replacement: metrics}}\n{}",
        own.concat()
    )
}

#[test]
#[ignore = "e2e tier: needs the test bed's Helm (GPUOPS_K8S_BIN), run by scripts/test"]
// Long on purpose: one scenario, its steps in order on one shared setup (a control plane, a node or a fleet costs seconds to start), so the cases read as the story they test.
fn behind_the_prometheus_operator_free_gpus_never_look_allocated_or_idle() {
    use gpuops_kubelet_api::podresources::v1::{
        ContainerDevices, ContainerResources, PodResources,
        pod_resources_lister_server::PodResourcesListerServer,
    };
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("sim");
    let pods = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let socket = dir.path().join("pod-resources.sock");
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let listener = runtime
        .block_on(async { tokio::net::UnixListener::bind(&socket) })
        .unwrap();
    runtime.spawn(
        tonic::transport::Server::builder()
            .add_service(PodResourcesListerServer::new(FakeKubelet {
                pods: pods.clone(),
            }))
            .serve_with_incoming(gpuops_kubelet_api::unix::incoming(listener)),
    );
    let served = exporter(
        &state,
        "l4x4",
        &["--pod-resources-socket", socket.to_str().unwrap()],
    );
    let inv: serde_json::Value = serde_json::from_slice(
        &common::run(&[
            "inventory",
            "--sim-state",
            state.to_str().unwrap(),
            "-o",
            "json",
        ])
        .stdout,
    )
    .unwrap();
    let gpu0 = inv["gpus"][0]["uuid"].as_str().unwrap().to_string();
    // ml/trainer-0 holds GPU 0 and leaves it idle; GPUs 1-3 are free (and idle).
    pods.lock().unwrap().push(PodResources {
        name: "trainer-0".into(),
        namespace: "ml".into(),
        containers: vec![ContainerResources {
            name: "train".into(),
            devices: vec![ContainerDevices {
                resource_name: "nvidia.com/gpu".into(),
                device_ids: vec![gpu0],
                topology: None,
            }],
            ..ContainerResources::default()
        }],
    });
    served.metrics_until("GPU 0 allocated", |b| {
        series(b, "gpuops_device_allocated")
            .iter()
            .any(|l| l.contains("pod=\"trainer-0\"") && l.ends_with(" 1"))
    });

    let rules =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../deploy/prometheus/gpuops-rules.yaml");
    let prometheus = Prometheus::start(
        dir.path(),
        &format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files: ['{}']\nscrape_configs:\n{}{}",
            rules.display(),
            operator_job("gpu", &served.address),
            operator_job("target", &served.address),
        ),
    );
    let by_gpu = |r: &[serde_json::Value]| -> Vec<(String, serde_json::Value)> {
        let mut v: Vec<(String, serde_json::Value)> = r
            .iter()
            .map(|s| {
                (
                    s["metric"]["gpu"].as_str().unwrap_or("").to_string(),
                    s["metric"].clone(),
                )
            })
            .collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    };

    // The chart's default: the GPU user's pod labels, and none at all on a free GPU.
    let gpu = prometheus.until(
        "4 GPUs scraped (podLabels: gpu)",
        "gpuops_device_allocated{job=\"gpuops-gpu\"}",
        |r| r.len() == 4,
    );
    for (index, m) in by_gpu(&gpu) {
        if index == "0" {
            assert_eq!(
                (m["namespace"].as_str(), m["pod"].as_str()),
                (Some("ml"), Some("trainer-0")),
                "{m}"
            );
            assert_eq!(m["container"], "train");
        } else {
            assert!(
                m.get("pod").is_none()
                    && m.get("namespace").is_none()
                    && m.get("container").is_none(),
                "free GPU {index} inherited the agent pod's target labels: {m}"
            );
        }
        assert_eq!(m["service"], "gpuops-gpu");
    }
    let up = prometheus.results("up{job=\"gpuops-gpu\"}");
    assert_eq!(up[0]["value"][1], "1", "{up:?}");

    // dcgm-exporter's default: target labels win, the user's come as exported_*.
    let target = prometheus.until(
        "4 GPUs scraped (podLabels: target)",
        "gpuops_device_allocated{job=\"gpuops-target\"}",
        |r| r.len() == 4,
    );
    for (index, m) in by_gpu(&target) {
        assert_eq!(m["pod"], "gpuops-agent-x7k2p", "{m}");
        assert_eq!(m["namespace"], "gpuops", "{m}");
        if index == "0" {
            assert_eq!(m["exported_pod"], "trainer-0", "{m}");
            assert_eq!(m["exported_namespace"], "ml", "{m}");
        } else {
            assert!(m.get("exported_pod").is_none(), "{m}");
        }
    }

    // The shipped idle alert, evaluated by this Prometheus: pending for the held GPU 0 under
    // either scrape, never for the free ones (which carry a pod label under `target`).
    let pending = prometheus.until(
        "GpuAllocatedIdle pending for GPU 0 in both jobs",
        "ALERTS{alertname=\"GpuAllocatedIdle\"}",
        |r| r.len() >= 2,
    );
    let mut seen: Vec<(String, String)> = pending
        .iter()
        .map(|a| {
            (
                a["metric"]["job"].as_str().unwrap_or("").to_string(),
                a["metric"]["gpu"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect();
    seen.sort();
    assert_eq!(
        seen,
        [
            ("gpuops-gpu".to_string(), "0".to_string()),
            ("gpuops-target".to_string(), "0".to_string())
        ],
        "{pending:#?}"
    );
    assert!(
        pending
            .iter()
            .all(|a| a["metric"]["alertstate"] == "pending")
    );
    drop(runtime);
}
