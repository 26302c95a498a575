//! `gpuops controller` scale-down on the test bed: what keeps an idle GPU node (a
//! PodDisruptionBudget, a do-not-disrupt pod, the pool's minimum) and that the node goes once
//! that is lifted. Real apiserver, scheduler, controller-manager (its disruption controller
//! computes the PDB status), Cluster API core controllers and the test infrastructure provider.
//!
//! Needs GPUOPS_K8S_BIN and `eval $(tests/k8s/build.sh capi)` (GPUOPS_CAPI_BIN); scripts/test sets
//! both and runs these with `--ignored`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use gpuops_testbed::{Cluster, ClusterApi, NodeShape, PoolSpec};

mod common;
use common::{Controller, bed};
use std::time::{Duration, Instant};

/// How long a kept node is watched: it outlasts the controller's idle period
/// (`common::SCALE_DOWN_IDLE`) by several resyncs (2 s).
const KEPT_WINDOW: Duration = Duration::from_secs(14);

/// A pool already at `replicas` nodes (the test provider brings them up; no scale-up needed).
fn pool(name: &str, min: u32, replicas: u32) -> PoolSpec {
    let mut shape = NodeShape::gpu("NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu", 8);
    shape.boot_delay = Duration::from_secs(1);
    shape.devices_delay = Duration::from_secs(2);
    let mut p = PoolSpec::new(name, shape);
    p.min = min;
    p.replicas = replicas;
    p.annotations
        .insert("gpuops.io/price-per-hour".into(), "98.32".into());
    p.annotations.insert(
        "gpuops.io/gpu-product".into(),
        "NVIDIA-H100-80GB-HBM3".into(),
    );
    p
}

/// A pod bound to `node` (KWOK runs it at once). `gpus` 0: a plain CPU pod.
fn pod(name: &str, node: &str, gpus: u32, labels: &str, annotations: &str) -> String {
    let limits = if gpus > 0 {
        format!(", \"limits\": {{\"nvidia.com/gpu\": \"{gpus}\"}}")
    } else {
        String::new()
    };
    format!(
        r#"{{"apiVersion": "v1", "kind": "Pod",
  "metadata": {{"name": "{name}", "namespace": "default", "labels": {{{labels}}}, "annotations": {{{annotations}}}}},
  "spec": {{"nodeName": "{node}", "terminationGracePeriodSeconds": 0,
    "containers": [{{"name": "c", "image": "example.invalid/app:1",
      "resources": {{"requests": {{"cpu": "100m"}}{limits}}}}}]}}}}"#
    )
}

fn wait_running(cluster: &Cluster, names: &[&str]) {
    gpuops_testbed::wait_until("the test pods Running", Duration::from_secs(60), || {
        names.iter().all(|n| {
            cluster
                .kubectl(&["get", "pod", n, "-o", "jsonpath={.status.phase}"])
                .is_ok_and(|p| p.trim() == "Running")
        })
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", dump(cluster)));
}

fn dump(cluster: &Cluster) -> String {
    let objects = cluster
        .kubectl(&[
            "get",
            "machines.cluster.x-k8s.io,nodes,pods,pdb",
            "-A",
            "-o",
            "wide",
        ])
        .unwrap_or_default();
    format!("{objects}\n{}", events(cluster))
}

/// Every event's reason and text (the controller's are events.k8s.io with a note).
fn events(cluster: &Cluster) -> String {
    cluster
        .kubectl(&[
            "get",
            "events",
            "-A",
            "-o",
            "custom-columns=R:.reason,M:.note,MSG:.message",
        ])
        .unwrap_or_default()
}

/// Waits for the controller's ScaleDownBlocked event about `node` saying `why`.
fn wait_blocked(cluster: &Cluster, node: &str, why: &str) {
    let about = format!("node {node} is unneeded");
    gpuops_testbed::wait_until(
        &format!("a ScaleDownBlocked event for {node} ({why})"),
        Duration::from_secs(60),
        || {
            events(cluster)
                .lines()
                .any(|l| l.starts_with("ScaleDownBlocked") && l.contains(&about) && l.contains(why))
        },
    )
    .unwrap_or_else(|e| panic!("{e}\n{}", dump(cluster)));
}

/// The Node of each of the pool's Machines (all of them have one).
fn nodes_of(capi: &ClusterApi, pool: &str) -> Vec<String> {
    capi.machines(pool)
        .unwrap()
        .into_iter()
        .filter_map(|m| m.node)
        .collect()
}

fn cordoned(cluster: &Cluster, node: &str) -> bool {
    cluster
        .kubectl(&["get", "node", node, "-o", "jsonpath={.spec.unschedulable}"])
        .is_ok_and(|s| s.trim() == "true")
}

/// Over the whole window, the pool keeps a Machine for each of `nodes`, none of them cordoned,
/// and every pod in `pods` stays (not evicted).
fn stays_for(cluster: &Cluster, capi: &ClusterApi, pool: &str, nodes: &[&str], pods: &[&str]) {
    let end = Instant::now() + KEPT_WINDOW;
    while Instant::now() < end {
        let have = nodes_of(capi, pool);
        for n in nodes {
            assert!(
                have.iter().any(|h| h == n),
                "node {n} was removed: {have:?}\n{}",
                dump(cluster)
            );
            assert!(
                !cordoned(cluster, n),
                "node {n} cordoned\n{}",
                dump(cluster)
            );
        }
        for p in pods {
            let gone = cluster
                .kubectl(&[
                    "get",
                    "pod",
                    p,
                    "-o",
                    "jsonpath={.metadata.deletionTimestamp}",
                ])
                .map_or(true, |t| !t.trim().is_empty());
            assert!(!gone, "pod {p} evicted\n{}", dump(cluster));
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

fn wait_removed(cluster: &Cluster, capi: &ClusterApi, pool: &str, node: &str) {
    gpuops_testbed::wait_until(
        &format!("node {node}'s Machine removed"),
        Duration::from_secs(60),
        || !nodes_of(capi, pool).iter().any(|n| n == node),
    )
    .unwrap_or_else(|e| panic!("{e}\n{}", dump(cluster)));
}

#[test]
#[ignore = "needs the control plane and Cluster API (GPUOPS_K8S_BIN, GPUOPS_CAPI_BIN): run scripts/test"]
fn a_pdb_keeps_an_idle_node_until_it_is_deleted() {
    let (cluster, capi) = bed();
    capi.add_pool(&pool("h100", 0, 2)).unwrap();
    let usable = capi
        .wait_usable_nodes("h100", 2, Duration::from_secs(60))
        .unwrap();
    let (busy, idle) = (usable[0].as_str(), usable[1].as_str());
    // The busy node runs a GPU pod (needed); the idle one only a CPU pod that a PDB allows no
    // disruption of. A bare pod: the disruption controller counts it for minAvailable.
    cluster
        .apply(&pod("trainer", busy, 8, "", ""))
        .and_then(|_| cluster.apply(&pod("guarded", idle, 0, r#""app": "guarded""#, "")))
        .and_then(|_| {
            cluster.apply(
                r#"{"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
                "metadata": {"name": "keep-guarded", "namespace": "default"},
                "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "guarded"}}}}"#,
            )
        })
        .unwrap();
    wait_running(&cluster, &["trainer", "guarded"]);
    gpuops_testbed::wait_until(
        "the PDB's status computed (0 disruptions allowed, 1 healthy)",
        Duration::from_secs(30),
        || {
            cluster
                .kubectl(&[
                    "get",
                    "pdb",
                    "keep-guarded",
                    "-o",
                    "jsonpath={.status.currentHealthy}/{.status.disruptionsAllowed}",
                ])
                .is_ok_and(|s| s.trim() == "1/0")
        },
    )
    .unwrap_or_else(|e| panic!("{e}\n{}", dump(&cluster)));
    // Started only now, so neither node looked idle before its pods were there.
    let _controller = Controller::start(&cluster, "solo", false);

    wait_blocked(
        &cluster,
        idle,
        "would violate PodDisruptionBudget default/keep-guarded (0 disruption(s) allowed, 1 needed)",
    );
    // The event is about the Node itself (cluster-scoped: no namespace in its reference, filed
    // in `default` with the Node's uid), so `kubectl describe node` shows it.
    let regarding = cluster
        .kubectl(&[
            "get",
            "events.events.k8s.io",
            "-n",
            "default",
            "--field-selector",
            "reason=ScaleDownBlocked",
            "-o",
            "jsonpath={range .items[*]}{.regarding.kind}/{.regarding.namespace}/{.regarding.name}/{.regarding.uid}{\"\\n\"}{end}",
        ])
        .unwrap();
    let uid = cluster
        .kubectl(&["get", "node", idle, "-o", "jsonpath={.metadata.uid}"])
        .unwrap();
    assert!(
        regarding
            .lines()
            .any(|l| l == format!("Node//{idle}/{}", uid.trim())),
        "{regarding}"
    );
    let described = cluster.kubectl(&["describe", "node", idle]).unwrap();
    assert!(described.contains("ScaleDownBlocked"), "{described}");
    // The status lists the kept node with what keeps it.
    let status = common::status_json(&cluster).unwrap();
    let status: serde_json::Value = serde_json::from_str(&status).unwrap();
    let blocked = status["blocked"].as_array().unwrap();
    assert!(
        blocked.iter().any(|b| b["node"] == idle
            && b["reason"]
                .as_str()
                .unwrap()
                .contains("PodDisruptionBudget default/keep-guarded")),
        "{status}"
    );
    stays_for(
        &cluster,
        &capi,
        "h100",
        &[busy, idle],
        &["trainer", "guarded"],
    );

    cluster.kubectl(&["delete", "pdb", "keep-guarded"]).unwrap();
    wait_removed(&cluster, &capi, "h100", idle);
    // The needed node and its GPU pod were left alone, and the pool settled at one node.
    assert_eq!(nodes_of(&capi, "h100"), vec![busy.to_string()]);
    assert_eq!(
        capi.machine_deployment("h100").unwrap()["spec"]["replicas"],
        1
    );
    wait_running(&cluster, &["trainer"]);
    let ev = events(&cluster);
    assert!(
        ev.lines()
            .any(|l| l.starts_with("ScaleDown ") && l.contains(&format!("removing node {idle}"))),
        "{ev}"
    );
}

#[test]
#[ignore = "needs the control plane and Cluster API (GPUOPS_K8S_BIN, GPUOPS_CAPI_BIN): run scripts/test"]
fn do_not_disrupt_pods_are_never_evicted_and_keep_their_node() {
    let (cluster, capi) = bed();
    capi.add_pool(&pool("h100", 0, 2)).unwrap();
    let usable = capi
        .wait_usable_nodes("h100", 2, Duration::from_secs(60))
        .unwrap();
    let (a, b) = (usable[0].as_str(), usable[1].as_str());
    // Neither node has a GPU pod: both are idle, each kept by one of the two annotations.
    cluster
        .apply(&pod(
            "karpenter-pinned",
            a,
            0,
            "",
            r#""karpenter.sh/do-not-disrupt": "true""#,
        ))
        .and_then(|_| {
            cluster.apply(&pod(
                "gpuops-pinned",
                b,
                0,
                "",
                r#""gpuops.io/do-not-disrupt": "true""#,
            ))
        })
        .unwrap();
    wait_running(&cluster, &["karpenter-pinned", "gpuops-pinned"]);
    let _controller = Controller::start(&cluster, "solo", false);

    wait_blocked(
        &cluster,
        a,
        "pod default/karpenter-pinned is annotated do-not-disrupt",
    );
    wait_blocked(
        &cluster,
        b,
        "pod default/gpuops-pinned is annotated do-not-disrupt",
    );
    stays_for(
        &cluster,
        &capi,
        "h100",
        &[a, b],
        &["karpenter-pinned", "gpuops-pinned"],
    );

    // The annotation is what kept it: without it the same node goes.
    cluster
        .kubectl(&[
            "annotate",
            "pod",
            "gpuops-pinned",
            "gpuops.io/do-not-disrupt-",
        ])
        .unwrap();
    wait_removed(&cluster, &capi, "h100", b);
    assert_eq!(nodes_of(&capi, "h100"), vec![a.to_string()]);
    wait_running(&cluster, &["karpenter-pinned"]);
}

#[test]
#[ignore = "needs the control plane and Cluster API (GPUOPS_K8S_BIN, GPUOPS_CAPI_BIN): run scripts/test"]
fn an_idle_node_is_kept_at_the_pools_minimum() {
    let (cluster, capi) = bed();
    capi.add_pool(&pool("h100", 1, 2)).unwrap();
    let usable = capi
        .wait_usable_nodes("h100", 2, Duration::from_secs(60))
        .unwrap();
    // Both nodes idle, no pods at all: one goes, the other is the minimum and stays.
    let _controller = Controller::start(&cluster, "solo", false);
    gpuops_testbed::wait_until(
        "the pool down to its minimum of 1",
        Duration::from_secs(60),
        || capi.machines("h100").is_ok_and(|m| m.len() == 1),
    )
    .unwrap_or_else(|e| panic!("{e}\n{}", dump(&cluster)));
    let left = nodes_of(&capi, "h100");
    assert_eq!(left.len(), 1, "{left:?}");
    assert!(usable.contains(&left[0]), "{left:?} not one of {usable:?}");
    wait_blocked(
        &cluster,
        &left[0],
        "but pool default/h100 is at its minimum size 1",
    );
    stays_for(&cluster, &capi, "h100", &[&left[0]], &[]);
    assert_eq!(
        capi.machine_deployment("h100").unwrap()["spec"]["replicas"],
        1
    );
}

/// A loopback exporter serving DCGM_FI_DEV_GPU_UTIL per node (`Hostname`, as dcgm-exporter
/// spells it), for as long as the test process runs.
fn serve_gpu_util(nodes: &[(&str, u32)]) -> String {
    use std::io::{Read, Write};
    let mut body = String::from("# TYPE DCGM_FI_DEV_GPU_UTIL gauge\n");
    for (node, util) in nodes {
        for gpu in 0..8 {
            body.push_str(&format!(
                "DCGM_FI_DEV_GPU_UTIL{{gpu=\"{gpu}\",UUID=\"GPU-{node}-{gpu}\",Hostname=\"{node}\"}} {util}\n"
            ));
        }
    }
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = listener.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        for mut s in listener.incoming().flatten() {
            let mut buf = [0u8; 4096];
            let _ = s.read(&mut buf);
            let _ = write!(
                s,
                "HTTP/1.1 200 OK\r\ncontent-type: text/plain; version=0.0.4\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    address
}

fn openssl(dir: &std::path::Path, args: &[&str]) {
    let out = std::process::Command::new("openssl")
        .current_dir(dir)
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A real Prometheus (Debian's package) serving HTTPS with a certificate from its own CA,
/// scraping `target` every second; killed on drop.
struct Prometheus {
    // Before `dir`: the process stops before its files go.
    process: gpuops_testbed::ChildGuard,
    url: String,
    ca: std::path::PathBuf,
    dir: tempfile::TempDir,
}

impl Prometheus {
    fn start(target: &str) -> Prometheus {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        openssl(
            d,
            &[
                "req",
                "-x509",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-keyout",
                "ca.key",
                "-out",
                "ca.crt",
                "-days",
                "1",
                "-subj",
                "/CN=gpuops-test-ca",
            ],
        );
        openssl(
            d,
            &[
                "req",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-keyout",
                "tls.key",
                "-out",
                "tls.csr",
                "-subj",
                "/CN=127.0.0.1",
            ],
        );
        std::fs::write(
            d.join("ext"),
            "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\n",
        )
        .unwrap();
        openssl(
            d,
            &[
                "x509",
                "-req",
                "-in",
                "tls.csr",
                "-CA",
                "ca.crt",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-out",
                "tls.crt",
                "-days",
                "1",
                "-extfile",
                "ext",
            ],
        );
        std::fs::write(
            d.join("web.yml"),
            format!(
                "tls_server_config:\n  cert_file: {}\n  key_file: {}\n",
                d.join("tls.crt").display(),
                d.join("tls.key").display()
            ),
        )
        .unwrap();
        std::fs::write(
            d.join("prometheus.yml"),
            format!(
                "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n- job_name: dcgm\n  static_configs:\n  - targets: ['{target}']\n"
            ),
        )
        .unwrap();
        let port = gpuops_testbed::free_port().unwrap();
        let mut cmd = std::process::Command::new("prometheus");
        cmd.arg(format!(
            "--config.file={}",
            d.join("prometheus.yml").display()
        ))
        .arg(format!("--web.config.file={}", d.join("web.yml").display()))
        .arg(format!("--storage.tsdb.path={}", d.join("tsdb").display()))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"));
        let process =
            gpuops_testbed::ChildGuard::spawn("prometheus", cmd, &d.join("prometheus.log"))
                .expect("prometheus not found: scripts/test installs Debian's prometheus package");
        Prometheus {
            process,
            url: format!("https://127.0.0.1:{port}"),
            ca: d.join("ca.crt"),
            dir,
        }
    }

    /// `curl`ed through its CA: the series Prometheus holds for `query`.
    fn query(&self, query: &str) -> String {
        let out = std::process::Command::new("curl")
            .args(["-sS", "--cacert"])
            .arg(&self.ca)
            .arg("--data-urlencode")
            .arg(format!("query={query}"))
            .arg(format!("{}/api/v1/query", self.url))
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn log(&self) -> String {
        self.process.output()
    }
}

#[test]
#[ignore = "needs the control plane, Cluster API and prometheus (GPUOPS_K8S_BIN, GPUOPS_CAPI_BIN): run scripts/test"]
fn a_real_prometheus_over_https_tells_an_idle_gpu_node_from_a_busy_one() {
    let (cluster, capi) = bed();
    capi.add_pool(&pool("h100", 0, 2)).unwrap();
    let usable = capi
        .wait_usable_nodes("h100", 2, Duration::from_secs(60))
        .unwrap();
    let (busy, idle) = (usable[0].as_str(), usable[1].as_str());
    // Both nodes hold a GPU pod: by the pod rule both are needed. Only the measured use
    // tells them apart.
    cluster
        .apply(&pod("busy-job", busy, 8, "", ""))
        .and_then(|_| cluster.apply(&pod("idle-job", idle, 8, "", "")))
        .unwrap();
    wait_running(&cluster, &["busy-job", "idle-job"]);
    let exporter = serve_gpu_util(&[(busy, 85), (idle, 0)]);
    let prometheus = Prometheus::start(&exporter);
    gpuops_testbed::wait_until(
        "Prometheus to hold both nodes' DCGM_FI_DEV_GPU_UTIL",
        Duration::from_secs(60),
        || {
            let r = prometheus.query("count by (Hostname) (DCGM_FI_DEV_GPU_UTIL)");
            r.contains(busy) && r.contains(idle)
        },
    )
    .unwrap_or_else(|e| panic!("{e}\n{}", prometheus.log()));

    // A token Prometheus does not check: it must travel without breaking the query, and it
    // is read from its file.
    let token = prometheus.dir.path().join("token");
    std::fs::write(&token, "e2e-s3cret\n").unwrap();
    let (url, ca) = (prometheus.url.clone(), prometheus.ca.clone());
    let controller = Controller::start_with(cluster.kubeconfig(), "solo", false, move |c| {
        c.decision.idle_util_pct = 10.0;
        c.prometheus = Some(gpuops_controller::prom::Source {
            url,
            bearer_token_file: Some(token),
            ca_file: Some(ca),
            poll: Duration::from_secs(1),
        });
    });
    // The query went through TLS with the CA from the flag (no answer: the age stays -1).
    gpuops_testbed::wait_until(
        "the controller's first answer from Prometheus",
        Duration::from_secs(30),
        || {
            controller
                .metric("gpuops_autoscaler_gpu_util_age_seconds")
                .is_some_and(|a| a >= 0.0)
        },
    )
    .unwrap_or_else(|e| panic!("{e}\n{}", prometheus.log()));

    wait_removed(&cluster, &capi, "h100", idle);
    let ev = events(&cluster);
    assert!(
        ev.lines().any(|l| l.starts_with("ScaleDown ")
            && l.contains(&format!("removing node {idle}"))
            && l.contains("idle (utilization 0%)")),
        "{ev}"
    );
    // The busy node, with the same kind of pod, is kept well past the idle period.
    stays_for(&cluster, &capi, "h100", &[busy], &["busy-job"]);
    assert_eq!(nodes_of(&capi, "h100"), vec![busy.to_string()]);
}
