//! The soak of issue 18: the real agent binary on a simulated 8x H100 node partitioned with MIG,
//! serving the kubelet's real device manager (a harness node) on the test bed's apiserver and
//! scheduler, with 50 pods churning, XIDs injected, /metrics scraped every second, and the agent's
//! RSS, peak RSS, open file descriptors and scrape latency written to a CSV every minute. At the end
//! it prints the least-squares slope of RSS and fds and a verdict, and writes summary.txt.
//!
//! Run through scripts/soak (it builds and copies what is needed). Knobs (environment):
//! SOAK_SECS (7200), SOAK_AGENT (the gpuops binary; libnvml_sim.so next to it), SOAK_OUT (results
//! directory), SOAK_CHURN_MS (3000: one pod replaced every this long), SOAK_XID_MS (2000: one
//! non-fatal XID every this long), SOAK_FATAL_EVERY (300: every this many XIDs, a fatal one on a
//! MIG device), SOAK_WARMUP_SECS (600: samples before this are left out of the verdict's slope).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // a measurement driver

use gpuops_testbed::{Cluster, ClusterOptions, HarnessNode, free_port, wait_until};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const PODS: usize = 50;
/// Slots below this ask for a 3g.40gb instance, the rest for a 1g.10gb one.
const BIG_PODS: usize = 2;
const NODE: &str = "soak-node";

/// 6 GPUs of seven 1g.10gb and 2 of four 1g.10gb + one 3g.40gb: 50 small and 2 big instances,
/// room for all 50 pods with two to spare.
const MIG_CONFIG: &str = "version: v1\nmig-configs:\n  soak:\n    - devices: [0, 1, 2, 3, 4, 5]\n      mig-enabled: true\n      mig-devices:\n        \"1g.10gb\": 7\n    - devices: [6, 7]\n      mig-enabled: true\n      mig-devices:\n        \"3g.40gb\": 1\n        \"1g.10gb\": 4\n";

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn run(agent: &Path, args: &[&str]) {
    let o = Command::new(agent).args(args).output().unwrap();
    assert!(
        o.status.success(),
        "gpuops {args:?}: {}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
}

fn pod_yaml(name: &str, slot: usize) -> String {
    let resource = if slot < BIG_PODS {
        "nvidia.com/mig-3g.40gb"
    } else {
        "nvidia.com/mig-1g.10gb"
    };
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  namespace: default\n  labels:\n    soak: \"true\"\nspec:\n  terminationGracePeriodSeconds: 0\n  containers:\n  - name: c\n    image: example.invalid/app:1\n    resources:\n      limits:\n        {resource}: \"1\"\n"
    )
}

/// One GET of /metrics; the time to the whole body, or why it failed.
fn scrape(address: &str) -> Result<Duration, String> {
    let start = Instant::now();
    let mut s = TcpStream::connect(address).map_err(|e| format!("connect: {e}"))?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok();
    write!(
        s,
        "GET /metrics HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n"
    )
    .map_err(|e| format!("write: {e}"))?;
    let mut body = Vec::new();
    s.read_to_end(&mut body).map_err(|e| format!("read: {e}"))?;
    let took = start.elapsed();
    let text = String::from_utf8_lossy(&body);
    if !text.starts_with("HTTP/1.1 200") {
        return Err(format!(
            "status: {}",
            text.lines().next().unwrap_or("(empty)")
        ));
    }
    if !text.contains("DCGM_FI_DEV_XID_ERRORS") {
        return Err("no DCGM_FI_DEV_XID_ERRORS in the body".into());
    }
    Ok(took)
}

fn proc_status(pid: u32, key: &str) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
}

fn fd_count(pid: u32) -> Option<u64> {
    Some(std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.count() as u64)
}

/// Least-squares slope of y over x.
fn slope(points: &[(f64, f64)]) -> f64 {
    let n = points.len() as f64;
    if points.len() < 2 {
        return 0.0;
    }
    let mx = points.iter().map(|p| p.0).sum::<f64>() / n;
    let my = points.iter().map(|p| p.1).sum::<f64>() / n;
    let sxy: f64 = points.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
    let sxx: f64 = points.iter().map(|p| (p.0 - mx).powi(2)).sum();
    if sxx == 0.0 { 0.0 } else { sxy / sxx }
}

fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 * q).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i]
}

fn pod_phases(cluster: &Cluster) -> (u64, u64, u64) {
    let out = cluster
        .kubectl(&[
            "get",
            "pods",
            "-l",
            "soak=true",
            "-o",
            "jsonpath={range .items[*]}{.status.phase}{\"\\n\"}{end}",
        ])
        .unwrap_or_default();
    let count = |p: &str| out.lines().filter(|l| l.trim() == p).count() as u64;
    (count("Running"), count("Pending"), count("Failed"))
}

// Long on purpose: the soak is one script: a long run's phases in order, each printing its figures.
fn main() {
    let total = Duration::from_secs(env_u64("SOAK_SECS", 7200));
    let churn_every = Duration::from_millis(env_u64("SOAK_CHURN_MS", 3000));
    let xid_every = Duration::from_millis(env_u64("SOAK_XID_MS", 2000));
    let fatal_every = env_u64("SOAK_FATAL_EVERY", 300).max(1);
    let warmup = env_u64("SOAK_WARMUP_SECS", 600) as f64;
    let agent_bin =
        PathBuf::from(std::env::var("SOAK_AGENT").expect("SOAK_AGENT: the gpuops binary"));
    let out_dir = PathBuf::from(std::env::var("SOAK_OUT").unwrap_or_else(|_| "/tmp/soak".into()));
    std::fs::create_dir_all(&out_dir).unwrap();
    let csv_path = out_dir.join("soak.csv");
    let summary_path = out_dir.join("summary.txt");
    let _ = std::fs::remove_file(&summary_path);

    let cluster = Cluster::start(ClusterOptions::default()).unwrap();
    let node = HarnessNode::start(&cluster, NODE).unwrap();
    let state = out_dir.join("sim");
    let state_s = state.to_str().unwrap().to_string();
    run(
        &agent_bin,
        &["sim", "init", "--fleet", "dgx-h100", "--state", &state_s],
    );
    let config = out_dir.join("mig-config.yaml");
    std::fs::write(&config, MIG_CONFIG).unwrap();
    run(
        &agent_bin,
        &[
            "mig",
            "apply",
            "-f",
            config.to_str().unwrap(),
            "-c",
            "soak",
            "--sim-state",
            &state_s,
        ],
    );

    // The simulator keeps the last 1,024 events (gpuops-sim MAX_EVENTS) in its state file, which every NVML call of the
    // agent reads: filled up first, so the state the agent parses is as large as it gets and any
    // growth measured is the agent's own.
    gpuops_sim::Store::new(&state)
        .update(|s| (0..1032u32).try_for_each(|i| s.inject_xid(i % 8, 13, None, None)))
        .unwrap()
        .unwrap();

    let port = free_port().unwrap();
    let address = format!("127.0.0.1:{port}");
    let log = std::fs::File::create(out_dir.join("agent.log")).unwrap();
    let mut agent = Command::new(&agent_bin)
        .args([
            "agent",
            "--sim-state",
            &state_s,
            "--interval",
            "1s",
            "--node-name",
            NODE,
        ])
        .args([
            "--metrics-address",
            &address,
            "--health-quiet-period",
            "60s",
        ])
        .arg("--device-plugin-dir")
        .arg(node.plugin_dir())
        .arg("--pod-resources-socket")
        .arg(node.pod_resources_socket())
        .env("MIG_STRATEGY", "mixed")
        .stdout(Stdio::from(log.try_clone().unwrap()))
        .stderr(Stdio::from(log))
        .spawn()
        .unwrap();
    let pid = agent.id();
    // Recorded like the test bed's own processes, so scripts/soak stops it if this driver dies.
    let record = std::env::var_os(gpuops_testbed::RUN_DIR_ENV).map(|dir| {
        let file = PathBuf::from(dir).join(format!("pid-{pid}"));
        let start = gpuops_testbed::start_time(pid).unwrap_or(0);
        std::fs::write(&file, format!("{start} gpuops agent (soak)\n")).unwrap();
        file
    });
    let allocatable = |resource: &str| {
        let path = format!(
            "jsonpath={{.status.allocatable.{}}}",
            resource.replace('.', "\\.")
        );
        cluster
            .kubectl(&["get", "node", NODE, "-o", &path])
            .map(|s| s.trim().to_string())
            .unwrap_or_default()
    };
    wait_until(
        "50 small and 2 big MIG instances allocatable",
        Duration::from_secs(120),
        || {
            allocatable("nvidia.com/mig-1g.10gb") == "50"
                && allocatable("nvidia.com/mig-3g.40gb") == "2"
        },
    )
    .unwrap();

    let mut generation = vec![0u64; PODS];
    for (slot, g) in generation.iter().enumerate() {
        cluster
            .apply(&pod_yaml(&format!("soak-{slot}-{g}"), slot))
            .unwrap();
    }
    wait_until("50 pods Running", Duration::from_secs(180), || {
        pod_phases(&cluster).0 == PODS as u64
    })
    .unwrap();
    println!(
        "soak: agent pid {pid} on {address}, 50 pods Running; {}s to go",
        total.as_secs()
    );

    let stop = Arc::new(AtomicBool::new(false));
    let latencies = Arc::new(Mutex::new(Vec::<f64>::new()));
    let scrape_errors = Arc::new(AtomicU64::new(0));
    let xids = Arc::new(AtomicU64::new(0));
    let scraper = {
        let (stop, latencies, errors, address) = (
            stop.clone(),
            latencies.clone(),
            scrape_errors.clone(),
            address.clone(),
        );
        std::thread::spawn(move || {
            let mut next = Instant::now();
            while !stop.load(Ordering::Relaxed) {
                match scrape(&address) {
                    Ok(d) => latencies.lock().unwrap().push(d.as_secs_f64() * 1000.0),
                    Err(e) => {
                        errors.fetch_add(1, Ordering::Relaxed);
                        eprintln!("soak: scrape failed: {e}");
                    }
                }
                next += Duration::from_secs(1);
                std::thread::sleep(next.saturating_duration_since(Instant::now()));
            }
        })
    };
    let injector = {
        let (stop, xids, agent_bin, state_s) = (
            stop.clone(),
            xids.clone(),
            agent_bin.clone(),
            state_s.clone(),
        );
        std::thread::spawn(move || {
            let mut n: u64 = 0;
            while !stop.load(Ordering::Relaxed) {
                n += 1;
                let gpu = (n % 8).to_string();
                // Mostly XIDs NVIDIA's plugin skips (13, 31, 43); now and then a fatal double-bit ECC
                // on one MIG instance, which its quiet period then heals.
                let args: Vec<String> = if n.is_multiple_of(fatal_every) {
                    [
                        "sim", "xid", "--state", &state_s, "--gpu", "7", "--xid", "48", "--gi", "2",
                    ]
                    .map(String::from)
                    .to_vec()
                } else {
                    let xid = ["13", "31", "43"][(n % 3) as usize];
                    [
                        "sim", "xid", "--state", &state_s, "--gpu", &gpu, "--xid", xid,
                    ]
                    .map(String::from)
                    .to_vec()
                };
                match Command::new(&agent_bin).args(&args).output() {
                    Ok(o) if o.status.success() => {
                        xids.fetch_add(1, Ordering::Relaxed);
                    }
                    Ok(o) => eprintln!("soak: {args:?}: {}", String::from_utf8_lossy(&o.stderr)),
                    Err(e) => eprintln!("soak: {args:?}: {e}"),
                }
                std::thread::sleep(xid_every);
            }
        })
    };

    let mut csv = std::fs::File::create(&csv_path).unwrap();
    writeln!(
        csv,
        "elapsed_s,rss_kib,hwm_kib,fds,threads,scrapes,scrape_p50_ms,scrape_p99_ms,scrape_max_ms,scrape_errors,xids,pods_replaced,pods_running,pods_pending,pods_failed"
    )
    .unwrap();
    let start = Instant::now();
    let mut next_sample = start + Duration::from_secs(60);
    let mut next_churn = start;
    let mut replaced: u64 = 0;
    let mut samples: Vec<(f64, f64, f64)> = Vec::new();
    let mut all_latencies: Vec<f64> = Vec::new();
    let mut failed_pods_max: u64 = 0;
    let mut died = None;
    let wanted = (total.as_secs() / 60).max(1) as usize;
    while samples.len() < wanted {
        if let Ok(Some(status)) = agent.try_wait() {
            died = Some(format!("the agent exited: {status}"));
            break;
        }
        let now = Instant::now();
        if now >= next_churn {
            let slot = (replaced % PODS as u64) as usize;
            let old = format!("soak-{slot}-{}", generation[slot]);
            generation[slot] += 1;
            let new = format!("soak-{slot}-{}", generation[slot]);
            if let Err(e) = cluster.kubectl(&["delete", "pod", &old, "--wait=false"]) {
                eprintln!("soak: deleting {old}: {e}");
            }
            if let Err(e) = cluster.apply(&pod_yaml(&new, slot)) {
                eprintln!("soak: creating {new}: {e}");
            }
            replaced += 1;
            next_churn += churn_every;
        }
        if now >= next_sample {
            let elapsed = start.elapsed().as_secs_f64();
            let mut lat = std::mem::take(&mut *latencies.lock().unwrap());
            lat.sort_by(f64::total_cmp);
            let rss = proc_status(pid, "VmRSS:").unwrap_or(0);
            let hwm = proc_status(pid, "VmHWM:").unwrap_or(0);
            let threads = proc_status(pid, "Threads:").unwrap_or(0);
            let fds = fd_count(pid).unwrap_or(0);
            let (running, pending, failed) = pod_phases(&cluster);
            failed_pods_max = failed_pods_max.max(failed);
            let line = format!(
                "{elapsed:.0},{rss},{hwm},{fds},{threads},{},{:.3},{:.3},{:.3},{},{},{replaced},{running},{pending},{failed}",
                lat.len(),
                percentile(&lat, 0.5),
                percentile(&lat, 0.99),
                lat.last().copied().unwrap_or(f64::NAN),
                scrape_errors.load(Ordering::Relaxed),
                xids.load(Ordering::Relaxed),
            );
            writeln!(csv, "{line}").unwrap();
            csv.flush().unwrap();
            println!("soak: {line}");
            samples.push((elapsed, rss as f64, fds as f64));
            all_latencies.extend(lat);
            next_sample += Duration::from_secs(60);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    stop.store(true, Ordering::Relaxed);
    scraper.join().unwrap();
    injector.join().unwrap();
    let _ = Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status();
    let _ = wait_until("the agent stopped", Duration::from_secs(10), || {
        matches!(agent.try_wait(), Ok(Some(_)))
    });
    let _ = agent.kill();
    let _ = agent.wait();
    if let Some(file) = record {
        let _ = std::fs::remove_file(file);
    }

    all_latencies.sort_by(f64::total_cmp);
    let steady: Vec<&(f64, f64, f64)> = samples.iter().filter(|s| s.0 >= warmup).collect();
    let hours = |s: &(f64, f64, f64)| s.0 / 3600.0;
    let rss_all = slope(&samples.iter().map(|s| (hours(s), s.1)).collect::<Vec<_>>());
    let fds_all = slope(&samples.iter().map(|s| (hours(s), s.2)).collect::<Vec<_>>());
    let rss_steady = slope(&steady.iter().map(|s| (hours(s), s.1)).collect::<Vec<_>>());
    let fds_steady = slope(&steady.iter().map(|s| (hours(s), s.2)).collect::<Vec<_>>());
    let mean_rss = steady.iter().map(|s| s.1).sum::<f64>() / steady.len().max(1) as f64;
    // Flat: after the warm-up, RSS would grow by less than 1% of itself (or 1 MiB) per hour and
    // the fd count by less than one per hour, with no scrape failing and no pod rejected.
    let rss_limit = (mean_rss * 0.01).max(1024.0);
    let mut problems = Vec::new();
    if let Some(d) = &died {
        problems.push(d.clone());
    }
    if steady.len() < 3 {
        problems.push(format!("only {} samples after the warm-up", steady.len()));
    }
    if rss_steady > rss_limit {
        problems.push(format!(
            "RSS grows {rss_steady:.0} KiB/h (limit {rss_limit:.0})"
        ));
    }
    if fds_steady >= 1.0 {
        problems.push(format!("fds grow {fds_steady:.2}/h"));
    }
    let errors = scrape_errors.load(Ordering::Relaxed);
    if errors > 0 {
        problems.push(format!("{errors} scrapes failed"));
    }
    if failed_pods_max > 0 {
        problems.push(format!("{failed_pods_max} pods rejected (Failed)"));
    }
    let verdict = if problems.is_empty() {
        "PASS: no growth trend".to_string()
    } else {
        format!("FAIL: {}", problems.join("; "))
    };
    let first = samples.first().map(|s| s.1).unwrap_or(0.0);
    let last = samples.last().map(|s| s.1).unwrap_or(0.0);
    let summary = format!(
        "soak of {:.0} s ({} samples, {} after the {warmup:.0} s warm-up), agent {}\n\
         pods replaced {replaced}, XIDs injected {}, scrapes {} (failed {errors}), p50 {:.3} ms, p99 {:.3} ms, max {:.3} ms\n\
         RSS first {first:.0} KiB, last {last:.0} KiB, mean after warm-up {mean_rss:.0} KiB\n\
         RSS slope {rss_steady:.1} KiB/hour after warm-up ({rss_all:.1} KiB/hour over the whole run)\n\
         fds slope {fds_steady:.3} per hour after warm-up ({fds_all:.3} per hour over the whole run), last {}\n\
         verdict: {verdict}\n\
         csv: {}\n",
        start.elapsed().as_secs_f64(),
        samples.len(),
        steady.len(),
        agent_bin.display(),
        xids.load(Ordering::Relaxed),
        all_latencies.len(),
        percentile(&all_latencies, 0.5),
        percentile(&all_latencies, 0.99),
        all_latencies.last().copied().unwrap_or(f64::NAN),
        samples.last().map(|s| s.2).unwrap_or(0.0),
        csv_path.display(),
    );
    std::fs::write(&summary_path, &summary).unwrap();
    print!("{summary}");
    drop(node);
    drop(cluster);
    if !problems.is_empty() {
        std::process::exit(1);
    }
}
