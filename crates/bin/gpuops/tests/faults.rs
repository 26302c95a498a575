//! The fault matrix of issue 18 on the simulated driver, without a cluster: a MIG apply killed
//! after every one of its steps, an XID storm, a full state directory. Each case prints one
//! `fault-matrix: CASE | CONVERGED IN | LOST` line that scripts/fault-matrix collects.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

mod common;

use common::{gpuops, run, text};
use gpuops_testbed::ChildGuard;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

const SEED: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/seed-mig-parted-config.yaml"
);

fn report(case: &str, converged: &str, lost: &str) {
    println!("fault-matrix: {case} | {converged} | {lost}");
}

fn wait_until(what: &str, timeout: Duration, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !check() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn sim_init(dir: &Path, fleet: &str) -> String {
    let state = dir.join("sim");
    let o = run(&[
        "sim",
        "init",
        "--fleet",
        fleet,
        "--state",
        state.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", text(&o));
    state.to_str().unwrap().to_string()
}

/// Per GPU: sorted "profile@start" of its MIG devices, and whether MIG is on.
fn layouts(state: &str) -> Vec<String> {
    let o = run(&["inventory", "--sim-state", state, "-o", "json"]);
    assert!(o.status.success(), "{}", text(&o));
    let inv: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    inv["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| {
            let mut v: Vec<String> = g["mig_devices"]
                .as_array()
                .unwrap()
                .iter()
                .map(|m| {
                    format!(
                        "{}@{}",
                        m["ci_profile"].as_str().unwrap(),
                        m["placement_start"]
                    )
                })
                .collect();
            v.sort();
            format!("mig={} {}", g["mig"], v.join(","))
        })
        .collect()
}

fn apply(state: &str, checkpoint: &Path, config: &str, extra: &[&str]) -> std::process::Output {
    gpuops()
        .args([
            "mig",
            "apply",
            "-f",
            SEED,
            "-c",
            config,
            "--sim-state",
            state,
        ])
        .arg("--checkpoint")
        .arg(checkpoint)
        .args(extra)
        .output()
        .unwrap()
}

/// `--crash-after K` exits with 137 right before the driver change K+1, without running any
/// destructor: for the files and the driver the same as a SIGKILL at that point. Every K from 0 to
/// the last change; after each, a plain apply must reach exactly the target layout.
#[test]
fn a_mig_apply_killed_after_every_step_converges_on_the_next_apply() {
    let dir = tempfile::tempdir().unwrap();
    let fleet = dir.path().join("fleet.yaml");
    std::fs::write(&fleet, "gpus:\n  - model: H100-SXM5-80GB\n    count: 1\n").unwrap();
    let state = sim_init(dir.path(), fleet.to_str().unwrap());
    let checkpoint = dir.path().join("mig-checkpoint.json");
    let (from, to) = ("all-2g.20gb", "mixed-inference");
    let o = apply(&state, &checkpoint, to, &[]);
    assert!(o.status.success(), "{}", text(&o));
    let target = layouts(&state);
    let o = apply(&state, &checkpoint, from, &[]);
    assert!(o.status.success(), "{}", text(&o));
    let start = layouts(&state);
    assert_ne!(start, target);

    let mut worst = Duration::ZERO;
    let mut steps = 0;
    for k in 0.. {
        let o = apply(&state, &checkpoint, to, &["--crash-after", &k.to_string()]);
        if o.status.success() {
            // Fewer changes than K: the whole apply ran.
            assert_eq!(layouts(&state), target);
            steps = k;
            break;
        }
        assert_eq!(o.status.code(), Some(137), "step {k}: {}", text(&o));
        let saved = std::fs::read_to_string(&checkpoint).unwrap();
        let saved: serde_json::Value = serde_json::from_str(&saved)
            .unwrap_or_else(|e| panic!("step {k}: the checkpoint is not JSON: {e}"));
        assert_eq!(
            saved["applying"], to,
            "step {k}: the checkpoint marks the apply unfinished"
        );
        let t = Instant::now();
        let o = apply(&state, &checkpoint, to, &[]);
        worst = worst.max(t.elapsed());
        assert!(o.status.success(), "step {k}: {}", text(&o));
        assert_eq!(
            layouts(&state),
            target,
            "step {k}: the next apply reaches the target"
        );
        let o = run(&["mig", "assert", "-f", SEED, "-c", to, "--sim-state", &state]);
        assert!(o.status.success(), "step {k}: {}", text(&o));
        let o = apply(&state, &checkpoint, from, &[]);
        assert!(
            o.status.success(),
            "step {k}: back to the start: {}",
            text(&o)
        );
        assert_eq!(layouts(&state), start);
        assert!(k < 200, "the apply never finished");
    }
    assert!(
        steps >= 10,
        "only {steps} driver changes: not the apply meant"
    );
    report(
        &format!(
            "MIG apply killed after each of its {steps} driver changes (1x H100, {from} -> {to})"
        ),
        &format!("next apply {} ms at worst", worst.as_millis()),
        "nothing: exact target layout, checkpoint JSON intact every time",
    );
}

/// The agent as a process with its output in a file, stopped when dropped.
struct Agent(ChildGuard);

impl Agent {
    fn start(dir: &Path, args: &[&str]) -> Agent {
        let mut cmd = gpuops();
        cmd.arg("agent").args(args);
        Agent::spawn(cmd, &dir.join("agent.log"))
    }

    fn spawn(cmd: Command, log: &Path) -> Agent {
        Agent(ChildGuard::spawn("agent", cmd, log).unwrap())
    }

    fn log(&self) -> String {
        self.0.output()
    }

    fn wait_for(&self, needle: &str) -> String {
        let mut found = String::new();
        wait_until(needle, Duration::from_secs(60), || {
            match self.log().lines().find(|l| l.contains(needle)) {
                Some(l) => {
                    found = l.to_string();
                    true
                }
                None => false,
            }
        });
        found
    }

    /// The metrics address from the banner.
    fn address(&self) -> String {
        self.wait_for("metrics        http://")
            .split("http://")
            .nth(1)
            .and_then(|s| s.split('/').next())
            .unwrap()
            .to_string()
    }

    fn status(&self, key: &str) -> u64 {
        let text = std::fs::read_to_string(format!("/proc/{}/status", self.0.id())).unwrap();
        text.lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap()
    }
}

/// One HTTP GET; the status line's code, the body and the time to the last byte.
fn get(address: &str, path: &str) -> (u16, String, Duration) {
    let start = Instant::now();
    let mut s = std::net::TcpStream::connect(address).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut body = String::new();
    s.read_to_string(&mut body).unwrap();
    let took = start.elapsed();
    let code = body
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (code, body, took)
}

/// `gpuops_device_healthy` per GPU index from the exposition.
fn healthy(metrics: &str) -> Vec<(String, f64)> {
    metrics
        .lines()
        .filter(|l| l.starts_with("gpuops_device_healthy{"))
        .map(|l| {
            let gpu = l
                .split("gpu=\"")
                .nth(1)
                .and_then(|s| s.split('"').next())
                .unwrap_or("?")
                .to_string();
            let v = l.rsplit(' ').next().unwrap().parse().unwrap();
            (gpu, v)
        })
        .collect()
}

fn percentile(sorted: &[Duration], q: f64) -> Duration {
    let i = ((sorted.len() as f64 * q).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i]
}

/// 1,000 XIDs per second for 60 s (GPUOPS_STORM_SECS), written into the simulator about every
/// 50 ms, as many as the second so far is due: application XIDs (13, 31, 43) on every GPU and a double-bit ECC (48) on
/// GPU 3. GPU 3 must be unhealthy throughout and the others healthy, RSS flat, /metrics always
/// answered, at least half the XIDs counted by the agent; after the storm GPU 3 recovers after
/// its quiet period. The scrape latency is a
/// figure, not a gate: it is printed, and asserted only when GPUOPS_STORM_P99_MS gives a limit
/// (scripts/fault-matrix does, on a machine it expects to be quiet).
#[test]
#[ignore = "fault matrix, 60 s of storm: scripts/fault-matrix (or scripts/test's e2e tier)"]
// Long on purpose: one scenario, its steps in order on one shared setup (a control plane, a node or a fleet costs seconds to start), so the cases read as the story they test.
fn an_xid_storm_of_1000_per_second_keeps_health_right_memory_flat_and_metrics_fast() {
    let secs: u64 = std::env::var("GPUOPS_STORM_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(60);
    // A latency limit in the test gate fails on a loaded machine for reasons that are not the
    // agent's (a CI run once measured 7 ms p99 against 1.3 ms before the storm), so only a run
    // that asks for one gets it.
    let p99_limit: Option<f64> = std::env::var("GPUOPS_STORM_P99_MS")
        .ok()
        .and_then(|s| s.parse().ok());
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("sim");
    let agent = Agent::start(
        dir.path(),
        &[
            "--simulate",
            "dgx-h100",
            "--sim-state",
            state.to_str().unwrap(),
            "--interval",
            "1s",
            "--health-quiet-period",
            "30s",
            "--no-device-plugin",
        ],
    );
    let address = agent.address();
    agent.wait_for("watching 8 GPUs");
    // The same scrapes for 10 s before the storm: what this machine gives without it.
    let mut baseline = Vec::new();
    let quiet = Instant::now();
    while quiet.elapsed() < Duration::from_secs(10) {
        baseline.push(get(&address, "/metrics").2);
        // Pacing the scrapes (the same rate as in the storm), not waiting for anything.
        std::thread::sleep(Duration::from_millis(20));
    }
    baseline.sort();
    let baseline_p99 = percentile(&baseline, 0.99);
    let store = gpuops_sim::Store::new(&state);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let storm = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut sent = 0u64;
            let begun = Instant::now();
            let mut n = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                // Each write of the simulator's state costs the same whatever it holds: catch up
                // to 1,000 per second of storm in one write, so a slow machine still gets the rate.
                let due = (begun.elapsed().as_millis() as u64)
                    .saturating_sub(sent)
                    .clamp(1, 1000);
                store
                    .update(|s| {
                        (0..due).try_for_each(|_| {
                            n += 1;
                            if n.is_multiple_of(10) {
                                s.inject_xid(3, 48, None, None)
                            } else {
                                s.inject_xid(
                                    (n % 8) as u32,
                                    [13, 31, 43][(n % 3) as usize],
                                    None,
                                    None,
                                )
                            }
                        })
                    })
                    .unwrap()
                    .unwrap();
                sent += due;
                // Pacing the storm: one write every 50 ms carries what is due by then.
                std::thread::sleep(Duration::from_millis(50));
            }
            (sent, begun.elapsed().as_secs_f64())
        })
    };
    // The window starts once the first double-bit ECC is seen.
    wait_until(
        "GPU 3 unhealthy in the storm",
        Duration::from_secs(30),
        || {
            healthy(&get(&address, "/metrics").1)
                .iter()
                .any(|(g, v)| g == "3" && *v == 0.0)
        },
    );
    let started = Instant::now();
    let mut latencies = Vec::new();
    let mut rss = Vec::new();
    let mut wrong = Vec::new();
    let mut next_rss = Instant::now();
    while started.elapsed() < Duration::from_secs(secs) {
        let (code, body, took) = get(&address, "/metrics");
        assert_eq!(code, 200, "{body}");
        latencies.push(took);
        if Instant::now() >= next_rss {
            rss.push((started.elapsed().as_secs_f64(), agent.status("VmRSS:")));
            next_rss += Duration::from_secs(1);
            {
                for (gpu, v) in healthy(&body) {
                    let want = if gpu == "3" { 0.0 } else { 1.0 };
                    if v != want {
                        wrong.push(format!(
                            "{:.1}s ({}): GPU {gpu} healthy={v}",
                            started.elapsed().as_secs_f64(),
                            gpuops_agent::now_ms()
                        ));
                    }
                }
            }
            let (code, _, _) = get(&address, "/healthz");
            assert_eq!(code, 200, "/healthz during the storm\n{}", agent.log());
        }
        // Pacing the scrapes during the storm, not waiting for anything.
        std::thread::sleep(Duration::from_millis(20));
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (sent, storm_secs) = storm.join().unwrap();
    let rate = sent as f64 / storm_secs;
    let ended = Instant::now();
    // What reached the agent: its XID counters once it has taken what the driver still had
    // queued (it stops growing). The simulator's queue holds 1,024 events, as a real driver's is
    // bounded, so a reader slower than the storm misses some.
    let xids_counted = || -> f64 {
        get(&address, "/metrics")
            .1
            .lines()
            .filter(|l| l.starts_with("gpuops_xid_errors_total{"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    };
    let mut counted = xids_counted();
    let drained = Instant::now() + Duration::from_secs(30);
    loop {
        // Drained means unchanged over an interval: the interval is the definition, not a guess.
        std::thread::sleep(Duration::from_millis(250));
        let now = xids_counted();
        if now == counted || Instant::now() > drained {
            break;
        }
        counted = now;
    }
    let share = counted / sent as f64;
    let mut recovered = None;
    wait_until(
        "GPU 3 healthy again after the storm",
        Duration::from_secs(120),
        || {
            let (_, body, _) = get(&address, "/metrics");
            let all = healthy(&body);
            if all.len() == 8 && all.iter().all(|(_, v)| *v == 1.0) {
                recovered = Some(ended.elapsed());
                return true;
            }
            false
        },
    );
    let recovered = recovered.unwrap();
    latencies.sort();
    let p50 = percentile(&latencies, 0.5);
    let p99 = percentile(&latencies, 0.99);
    let max = *latencies.last().unwrap();
    let points: Vec<(f64, f64)> = rss.iter().map(|(t, r)| (*t, *r as f64)).collect();
    let n = points.len() as f64;
    let mx = points.iter().map(|p| p.0).sum::<f64>() / n;
    let my = points.iter().map(|p| p.1).sum::<f64>() / n;
    let slope = points.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum::<f64>()
        / points.iter().map(|p| (p.0 - mx).powi(2)).sum::<f64>();
    let (first, last) = (rss[0].1, rss[rss.len() - 1].1);
    let second_half: Vec<u64> = rss[rss.len() / 2..].iter().map(|r| r.1).collect();
    let half_growth = second_half.last().unwrap().saturating_sub(second_half[0]);
    println!(
        "storm: baseline p99 {:.3} ms; {sent} XIDs in {storm_secs:.0} s ({:.0}/s), {counted} counted by the agent ({:.1}%); {} scrapes p50 {:.3} ms p99 {:.3} ms max {:.3} ms; RSS {first} -> {last} KiB (slope {slope:.1} KiB/s, second half +{half_growth} KiB); healthy again {} ms after the storm",
        baseline_p99.as_secs_f64() * 1e3,
        rate,
        share * 100.0,
        latencies.len(),
        p50.as_secs_f64() * 1e3,
        p99.as_secs_f64() * 1e3,
        max.as_secs_f64() * 1e3,
        recovered.as_millis()
    );
    report(
        &format!(
            "XID storm {:.0}/s for {secs} s (GPU 3 fatal, others application XIDs; {counted} of {sent} ({:.1}%) reached the agent)",
            rate,
            share * 100.0
        ),
        &format!(
            "GPU 3 healthy {} ms after the storm (quiet period 30 s)",
            recovered.as_millis()
        ),
        &format!(
            "nothing; health wrong {} times; /metrics p99 {:.3} ms (max {:.3}; before the storm {:.3}); RSS {first} -> {last} KiB, second half +{half_growth} KiB",
            wrong.len(),
            p99.as_secs_f64() * 1e3,
            max.as_secs_f64() * 1e3,
            baseline_p99.as_secs_f64() * 1e3
        ),
    );
    if !wrong.is_empty() {
        let kept = std::env::temp_dir().join("gpuops-storm-agent.log");
        let _ = std::fs::copy(agent.0.log_path(), &kept);
        panic!(
            "health wrong during the storm: {wrong:?} (agent log: {})",
            kept.display()
        );
    }
    assert!(rate >= 900.0, "only {rate:.0} XIDs/s sent");
    // Lenient on purpose: 90% reached the agent with the 2 cores at a load of 20, and 1.4% when
    // every NVML call re-parsed the simulator's state; half means the agent keeps up.
    assert!(
        share >= 0.5,
        "only {counted} of {sent} XIDs ({:.1}%) reached the agent",
        share * 100.0
    );
    assert!(
        recovered >= Duration::from_secs(25),
        "recovered before the quiet period: {recovered:?}"
    );
    // Flat: the second half of the storm adds less than 1 MiB (allocator noise), not KiB per XID.
    assert!(
        half_growth < 1024,
        "RSS grew {half_growth} KiB in the storm's second half: {rss:?}"
    );
    if let Some(limit) = p99_limit {
        assert!(
            p99.as_secs_f64() * 1e3 < limit,
            "/metrics p99 {:.3} ms during the storm, limit {limit} ms (GPUOPS_STORM_P99_MS)",
            p99.as_secs_f64() * 1e3
        );
    }
}

/// Shifts CLOCK_REALTIME (and gettimeofday) of the process it is preloaded into by the seconds
/// in the file $FAKE_WALL_OFFSET_FILE, read on every call; CLOCK_MONOTONIC is left alone. A few
/// lines instead of libfaketime, compiled by the test.
const WALL_SHIFT_C: &str = r#"
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/time.h>
#include <time.h>
static long offset(void) {
    const char *path = getenv("FAKE_WALL_OFFSET_FILE");
    long v = 0;
    if (!path) return 0;
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    if (fscanf(f, "%ld", &v) != 1) v = 0;
    fclose(f);
    return v;
}
int clock_gettime(clockid_t c, struct timespec *ts) {
    static int (*real)(clockid_t, struct timespec *) = 0;
    if (!real) real = (int (*)(clockid_t, struct timespec *))dlsym(RTLD_NEXT, "clock_gettime");
    int r = real(c, ts);
    if (r == 0 && (c == CLOCK_REALTIME || c == CLOCK_REALTIME_COARSE)) ts->tv_sec += offset();
    return r;
}
int gettimeofday(struct timeval *tv, void *tz) {
    struct timespec ts;
    (void)tz;
    clock_gettime(CLOCK_REALTIME, &ts);
    if (tv) { tv->tv_sec = ts.tv_sec; tv->tv_usec = ts.tv_nsec / 1000; }
    return 0;
}
"#;

fn metric(body: &str, name: &str) -> f64 {
    body.lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with([' ', '{']))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in\n{body}"))
}

/// The wall clock jumps an hour back, then an hour forward, under a running agent (its
/// CLOCK_REALTIME shifted by a preloaded library; the host's clock is untouched). The XID quiet
/// period must last its 5 s both times (before the monotonic clock it lasted an hour and 5 s
/// after the jump back, and ended at once after the jump forward), and /healthz stays 200.
#[test]
fn a_wall_clock_jump_of_an_hour_moves_neither_the_quiet_period_nor_liveness() {
    let dir = tempfile::tempdir().unwrap();
    let shim_c = dir.path().join("wallshift.c");
    let shim = dir.path().join("wallshift.so");
    std::fs::write(&shim_c, WALL_SHIFT_C).unwrap();
    let o = std::process::Command::new("cc")
        .args(["-shared", "-fPIC", "-O1", "-o"])
        .arg(&shim)
        .arg(&shim_c)
        .arg("-ldl")
        .output()
        .expect("cc (a C compiler) is needed to build the clock shim");
    assert!(
        o.status.success(),
        "cc: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let offset_file = dir.path().join("offset");
    std::fs::write(&offset_file, "0").unwrap();
    let state = dir.path().join("sim");
    let mut cmd = gpuops();
    cmd.args([
        "agent",
        "--simulate",
        "dgx-h100",
        "--sim-state",
        state.to_str().unwrap(),
    ])
    .args([
        "--interval",
        "500ms",
        "--health-quiet-period",
        "5s",
        "--no-device-plugin",
    ])
    .env("LD_PRELOAD", &shim)
    .env("FAKE_WALL_OFFSET_FILE", &offset_file);
    let agent = Agent::spawn(cmd, &dir.path().join("agent.log"));
    let address = agent.address();
    agent.wait_for("watching 8 GPUs");
    let gpu3 = |body: &str| {
        healthy(body)
            .into_iter()
            .find(|(g, _)| g == "3")
            .map(|(_, v)| v)
    };
    let sim_xid = || {
        let o = run(&[
            "sim",
            "xid",
            "--state",
            state.to_str().unwrap(),
            "--gpu",
            "3",
            "--xid",
            "48",
        ]);
        assert!(o.status.success(), "{}", text(&o));
    };
    let mut results = Vec::new();
    for (jump, label) in [(-3600i64, "-1 h"), (3600, "+1 h")] {
        std::fs::write(&offset_file, "0").unwrap();
        sim_xid();
        let hit = Instant::now();
        wait_until("GPU 3 unhealthy", Duration::from_secs(10), || {
            gpu3(&get(&address, "/metrics").1) == Some(0.0)
        });
        std::fs::write(&offset_file, jump.to_string()).unwrap();
        // The shift reached the agent: its collection timestamps jumped.
        let wall = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        wait_until(
            "the agent's wall clock to jump",
            Duration::from_secs(10),
            || {
                let seen = metric(
                    &get(&address, "/metrics").1,
                    "gpuops_last_collection_timestamp_seconds",
                );
                (seen - wall - jump as f64).abs() < 30.0
            },
        );
        let mut recovered = None;
        wait_until(
            &format!("GPU 3 healthy after the {label} jump"),
            Duration::from_secs(30),
            || {
                let (code, _, _) = get(&address, "/healthz");
                assert_eq!(
                    code,
                    200,
                    "/healthz after the {label} jump\n{}",
                    agent.log()
                );
                if gpu3(&get(&address, "/metrics").1) == Some(1.0) {
                    recovered = Some(hit.elapsed());
                    return true;
                }
                false
            },
        );
        let recovered = recovered.unwrap();
        assert!(
            recovered >= Duration::from_secs(4),
            "the {label} jump cut the 5 s quiet period to {recovered:?}"
        );
        results.push(format!(
            "{label}: healthy {:.1} s after the XID",
            recovered.as_secs_f64()
        ));
    }
    report(
        "wall clock jumps -1 h / +1 h (CLOCK_REALTIME of the agent shifted)",
        &results.join("; "),
        "nothing: quiet period 5 s both times, /healthz 200 throughout",
    );
}

/// A 64 KiB tmpfs, unmounted when dropped.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(path: PathBuf) -> Tmpfs {
        std::fs::create_dir_all(&path).unwrap();
        let o = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=64k", "tmpfs"])
            .arg(&path)
            .output()
            .unwrap();
        assert!(
            o.status.success(),
            "mounting a 64 KiB tmpfs at {} (needs root): {}",
            path.display(),
            String::from_utf8_lossy(&o.stderr)
        );
        Tmpfs(path)
    }

    /// Fills the file system up to the last byte.
    fn fill(&self) {
        let mut f = std::fs::File::create(self.0.join("filler")).unwrap();
        let block = [0u8; 4096];
        loop {
            match f.write(&block) {
                Ok(0) => break,
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(28) => break,
                Err(e) => panic!("filling the tmpfs: {e}"),
            }
        }
        let _ = f.sync_all();
    }

    fn free(&self) {
        std::fs::remove_file(self.0.join("filler")).unwrap();
    }

    fn entries(&self) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(&self.0)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg(&self.0).status();
    }
}

/// The state directory's disk full: the MIG checkpoint cannot be written. The apply must fail
/// before it changes a GPU, say why naming the file, leave the last checkpoint byte for byte
/// and no temporary file; once there is room the same apply converges.
#[test]
#[ignore = "fault matrix, mounts a 64 KiB tmpfs (root): scripts/fault-matrix"]
fn a_full_state_disk_fails_the_checkpoint_write_cleanly_and_nothing_is_lost() {
    let dir = tempfile::tempdir().unwrap();
    let fs = Tmpfs::mount(dir.path().join("state"));
    let fleet = dir.path().join("fleet.yaml");
    std::fs::write(&fleet, "gpus:\n  - model: H100-SXM5-80GB\n    count: 2\n").unwrap();
    let state = sim_init(dir.path(), fleet.to_str().unwrap());
    let checkpoint = fs.0.join("mig-checkpoint.json");
    let o = apply(&state, &checkpoint, "all-1g.10gb", &[]);
    assert!(o.status.success(), "{}", text(&o));
    let before = std::fs::read(&checkpoint).unwrap();
    let layout = layouts(&state);

    fs.fill();
    let o = apply(&state, &checkpoint, "mixed-inference", &[]);
    let said = text(&o);
    assert!(
        !o.status.success(),
        "the apply succeeded on a full disk: {said}"
    );
    assert!(
        said.contains("mig-checkpoint.json") && said.contains("No space left on device"),
        "the error names the file and ENOSPC: {said}"
    );
    assert_eq!(
        layouts(&state),
        layout,
        "no GPU changed without a checkpoint"
    );
    assert_eq!(
        std::fs::read(&checkpoint).unwrap(),
        before,
        "the last checkpoint is intact"
    );
    assert_eq!(
        fs.entries(),
        ["filler", "mig-checkpoint.json"],
        "no temporary file left"
    );

    fs.free();
    let t = Instant::now();
    let o = apply(&state, &checkpoint, "mixed-inference", &[]);
    assert!(o.status.success(), "{}", text(&o));
    let converged = t.elapsed();
    let o = run(&[
        "mig",
        "assert",
        "-f",
        SEED,
        "-c",
        "mixed-inference",
        "--sim-state",
        &state,
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let first = said
        .lines()
        .find(|l| l.contains("No space"))
        .unwrap_or("")
        .trim()
        .to_string();
    report(
        "state dir full (ENOSPC) during a MIG apply's checkpoint write",
        &format!("apply after freeing space {} ms", converged.as_millis()),
        &format!(
            "nothing: refused before any GPU change, old checkpoint intact, no temp file ({first})"
        ),
    );
}
