//! `gpuops scheduler-extender` behind the real kube-scheduler: KWOK nodes with time-sliced GPUs
//! (GFD labels, `nvidia.com/gpu` capacity = GPUs x replicas), shared-GPU pods created one by one;
//! each must land on a node the packing engine scores best for the state at that moment
//! (computed here with `gpuops_packing` from the same nodes and pods). A look-alike pod (the
//! share annotation but no GPU request) is scheduled normally, without the extender. The
//! extender runs with only the ClusterRole of deploy/scheduler/rbac.yaml.
//!
//! The chart's second scheduler (`extender.enabled`): installed with `helm install`, its rendered
//! KubeSchedulerConfiguration run by the real kube-scheduler and `gpuops scheduler-extender`
//! as processes (no image can be pulled here), each with its own ServiceAccount's token. A pod
//! with `schedulerName: gpuops-scheduler` is bound through the extender, one the extender
//! refuses stays pending with its reason, and the lease held is the one the config names.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

mod common;

use gpuops_packing::{
    Cluster as Engine, GpuChoice, NodeSpec, PodReq, PodSpec, PolicyKind, TypicalPods,
};
use gpuops_testbed::{ChildGuard, Cluster, ClusterOptions, User, free_port, wait_until};
use std::time::Duration;

const REPLICAS: u32 = 4;
const USER: &str = "gpuops-extender";

/// (name, GPUs) of the KWOK nodes; all with 4 replicas per GPU, 32 CPUs, 128 GiB.
const NODES: [(&str, u32); 3] = [("gpu-a", 2), ("gpu-b", 1), ("gpu-c", 4)];

/// A pod: (replicas of nvidia.com/gpu, the gpuops.io/gpu-milli annotation).
type Shape = (u32, Option<u32>);

/// The pods, in arrival order.
const PODS: [Shape; 12] = [
    (1, Some(600)),
    (1, Some(300)),
    (1, None), // 250
    (1, Some(700)),
    (4, None), // a whole GPU
    (1, Some(400)),
    (1, Some(100)),
    (2, None), // 500
    (1, Some(600)),
    (1, Some(350)),
    (1, None),
    (1, Some(900)),
];

fn node_yaml(name: &str, gpus: u32) -> String {
    format!(
        "apiVersion: v1\nkind: Node\nmetadata:\n  name: {name}\n  annotations:\n    kwok.x-k8s.io/node: fake\n  labels:\n    type: kwok\n    nvidia.com/gpu.count: \"{gpus}\"\n    nvidia.com/gpu.replicas: \"{REPLICAS}\"\n    nvidia.com/gpu.product: Tesla-T4-SHARED\n    nvidia.com/gpu.sharing-strategy: time-slicing\nstatus:\n  capacity: {{cpu: \"32\", memory: 128Gi, pods: \"110\", nvidia.com/gpu: \"{r}\"}}\n  allocatable: {{cpu: \"32\", memory: 128Gi, pods: \"110\", nvidia.com/gpu: \"{r}\"}}\n",
        r = gpus * REPLICAS
    )
}

fn pod_yaml(name: &str, (replicas, milli): Shape) -> String {
    let annotation = milli.map_or(String::new(), |m| {
        format!("  annotations:\n    gpuops.io/gpu-milli: \"{m}\"\n")
    });
    let gpu = if replicas > 0 {
        format!(", nvidia.com/gpu: \"{replicas}\"")
    } else {
        String::new()
    };
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  namespace: default\n{annotation}spec:\n  tolerations: [{{operator: Exists}}]\n  containers:\n  - name: c\n    image: busybox\n    resources:\n      requests: {{cpu: \"1\", memory: 1Gi{gpu}}}\n      limits: {{cpu: \"1\", memory: 1Gi{gpu}}}\n"
    )
}

/// The engine's request of a shape on a node with 4 replicas per GPU (the extender's rule).
fn request((replicas, milli): Shape) -> PodReq {
    let (num_gpu, gpu_milli) = match milli {
        Some(m) if m < 1000 => (1, m),
        Some(m) => (m / 1000, 1000),
        None if replicas * 1000 / REPLICAS < 1000 => (1, replicas * 1000 / REPLICAS),
        None => (replicas.div_ceil(REPLICAS), 1000),
    };
    PodReq {
        cpu_milli: 1000,
        memory_mib: 1024,
        num_gpu: num_gpu as u8,
        gpu_milli: gpu_milli as u16,
        models: gpuops_packing::ModelSet::ANY,
    }
}

fn spec(r: &PodReq) -> PodSpec {
    PodSpec {
        name: String::new(),
        cpu_milli: u64::from(r.cpu_milli),
        memory_mib: r.memory_mib,
        num_gpu: u32::from(r.num_gpu),
        gpu_milli: u32::from(r.gpu_milli),
        gpu_spec: Vec::new(),
    }
}

/// The nodes our policy scores best for `incoming`, given the bound pods (oldest first) as the
/// extender models them: nodes by name, bound pods put on GPUs with the engine's GPU choice.
fn best_nodes(bound: &[(Shape, usize)], incoming: Shape) -> (Vec<String>, Vec<(String, f64)>) {
    let mut names: Vec<(&str, u32)> = NODES.to_vec();
    names.sort();
    let specs: Vec<NodeSpec> = names
        .iter()
        .map(|(n, g)| NodeSpec {
            name: n.to_string(),
            cpu_milli: 32_000,
            memory_mib: 128 * 1024,
            gpus: *g,
            model: "Tesla-T4-SHARED".into(),
        })
        .collect();
    let mut cluster = Engine::new(&specs).unwrap();
    let mut shapes: Vec<PodSpec> = bound.iter().map(|(s, _)| spec(&request(*s))).collect();
    shapes.push(spec(&request(incoming)));
    let typical = TypicalPods::from_trace(&cluster, &shapes);
    for (i, (name, _)) in names.iter().enumerate() {
        let mine: Vec<PodReq> = bound
            .iter()
            .filter(|(_, n)| NODES[*n].0 == *name)
            .map(|(s, _)| request(*s))
            .collect();
        for r in mine {
            let gpus = gpuops_packing::extender::preferred_gpus(
                cluster.gpus(i),
                r.num_gpu,
                r.gpu_milli,
                Some(&typical),
            )
            .expect("the bound pods fit in the model");
            let mut choice = GpuChoice::NONE;
            for g in gpus {
                choice.insert(g);
            }
            cluster.place(i, &r, choice).unwrap();
        }
    }
    let policy = PolicyKind::Ours.build_with_typical(&cluster, &typical);
    let req = request(incoming);
    let scores: Vec<(String, f64)> = (0..cluster.len())
        .filter(|&i| cluster.fits(i, &req))
        .filter_map(|i| {
            policy
                .score(&cluster, i, &req)
                .map(|s| (cluster.node(i).name.clone(), s.score))
        })
        .collect();
    let max = scores
        .iter()
        .map(|(_, s)| *s)
        .fold(f64::NEG_INFINITY, f64::max);
    let best = scores
        .iter()
        .filter(|(_, s)| *s == max)
        .map(|(n, _)| n.clone())
        .collect();
    (best, scores)
}

/// Whether the extender models every node with the CPU the bound pods leave free: asked to
/// filter a GPU pod that wants more CPU than any node has, it names each node's free CPU.
fn extender_sees(port: u16, bound: &[(Shape, usize)]) -> bool {
    let greedy = serde_json::json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "cpu-probe", "namespace": "default"},
        "spec": {"containers": [{"name": "c", "resources": {"requests":
            {"nvidia.com/gpu": "1", "cpu": "1000"}}}]}});
    let names: Vec<&str> = NODES.iter().map(|(n, _)| *n).collect();
    let args = serde_json::json!({"Pod": greedy, "NodeNames": names}).to_string();
    let answer = http(port, "POST", "/filter", &args);
    NODES.iter().enumerate().all(|(i, (node, _))| {
        let pods = bound.iter().filter(|(_, n)| *n == i).count() as u64;
        let free = 32_000 - 1000 * pods;
        answer.contains(&format!(
            "\"{node}\":\"gpuops: default/cpu-probe does not fit: insufficient cpu: {free}m free"
        ))
    })
}

fn node_of(cluster: &Cluster, pod: &str) -> Option<String> {
    cluster
        .kubectl(&["get", "pod", pod, "-o", "jsonpath={.spec.nodeName}"])
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
}

#[test]
#[ignore = "needs the control plane (GPUOPS_K8S_BIN): run scripts/test"]
// Long on purpose: one scenario, its steps in order on one shared setup (a control plane, a node or a fleet costs seconds to start), so the cases read as the story they test.
fn kube_scheduler_with_the_extender_places_shared_pods_where_the_engine_scores_best() {
    let port = free_port().unwrap();
    let cluster = Cluster::start(ClusterOptions {
        kwok: true,
        users: vec![User::plain(USER)],
        scheduler_config: Some(format!(
            "extenders:\n- urlPrefix: http://127.0.0.1:{port}\n  filterVerb: filter\n  prioritizeVerb: prioritize\n  weight: 100\n  nodeCacheCapable: true\n  managedResources:\n  - name: nvidia.com/gpu\n    ignoredByScheduler: false\n  - name: nvidia.com/gpu.shared\n    ignoredByScheduler: false\n  httpTimeout: 10s\n"
        )),
        ..ClusterOptions::default()
    })
    .unwrap();

    // Least privilege: the ClusterRole from deploy/scheduler/rbac.yaml, bound to a plain user.
    let rbac = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../../deploy/scheduler/rbac.yaml"),
    )
    .unwrap();
    let role = rbac
        .split("\n---\n")
        .find(|d| d.contains("kind: ClusterRole\n"))
        .unwrap();
    cluster.apply(role).unwrap();
    cluster
        .apply(&format!(
            "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding\nmetadata:\n  name: extender-user\nroleRef:\n  apiGroup: rbac.authorization.k8s.io\n  kind: ClusterRole\n  name: gpuops-scheduler-extender\nsubjects:\n- apiGroup: rbac.authorization.k8s.io\n  kind: User\n  name: {USER}\n"
        ))
        .unwrap();
    wait_until("RBAC for the extender", Duration::from_secs(20), || {
        cluster.kubectl_as(USER, &["get", "pods", "-A"]).is_ok()
    })
    .unwrap();

    let log = cluster.dir().join("extender.log");
    let mut cmd = common::gpuops();
    cmd.args([
        "scheduler-extender",
        "--address",
        &format!("127.0.0.1:{port}"),
    ])
    .arg("--kubeconfig")
    .arg(cluster.kubeconfig_for(USER))
    .env("GPUOPS_LOG", "gpuops=debug");
    let _extender = ChildGuard::spawn("gpuops scheduler-extender", cmd, &log).unwrap();
    let extender_log = || std::fs::read_to_string(&log).unwrap_or_default();
    wait_until("the extender to listen", Duration::from_secs(30), || {
        extender_log().contains("listening on")
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", extender_log()));

    let nodes: String = NODES
        .iter()
        .map(|(n, g)| format!("---\n{}", node_yaml(n, *g)))
        .collect();
    cluster.apply(&nodes).unwrap();
    wait_until("3 Ready nodes", Duration::from_secs(60), || {
        cluster
            .kubectl(&[
                "get",
                "nodes",
                "-o",
                "jsonpath={.items[*].status.conditions[?(@.type==\"Ready\")].status}",
            ])
            .is_ok_and(|s| s.split_whitespace().filter(|v| *v == "True").count() == 3)
    })
    .unwrap();
    // Ready once its informers listed; then its watch sees each node (a node it does not know
    // scores 0, one it models alone scores 10).
    wait_until("the extender's /readyz", Duration::from_secs(30), || {
        http(port, "GET", "/readyz", "").starts_with("HTTP/1.1 200")
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", extender_log()));
    let probe = serde_json::json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "probe", "namespace": "default"},
        "spec": {"containers": [{"name": "c", "resources": {"requests": {"nvidia.com/gpu": "1"}}}]}});
    for (node, _) in NODES {
        let args = serde_json::json!({"Pod": probe, "NodeNames": [node]}).to_string();
        wait_until(
            &format!("the extender to watch {node}"),
            Duration::from_secs(30),
            || {
                http(port, "POST", "/prioritize", &args)
                    .ends_with(&format!("[{{\"Host\":\"{node}\",\"Score\":10}}]"))
            },
        )
        .unwrap_or_else(|e| panic!("{e}\n{}", extender_log()));
    }

    let mut bound: Vec<(Shape, usize)> = Vec::new();
    let mut unique = 0;
    for (k, shape) in PODS.iter().enumerate() {
        let name = format!("shared-{k:02}");
        let (best, scores) = best_nodes(&bound, *shape);
        assert!(
            !best.is_empty(),
            "pod {k} {shape:?} fits nowhere in the model"
        );
        if best.len() == 1 {
            unique += 1;
        }
        cluster.apply(&pod_yaml(&name, *shape)).unwrap();
        wait_until(
            &format!("{name} to be scheduled"),
            Duration::from_secs(60),
            || node_of(&cluster, &name).is_some(),
        )
        .unwrap_or_else(|e| {
            panic!(
                "{e}\nscheduler log:\n{}\nextender log:\n{}",
                std::fs::read_to_string(cluster.dir().join("kube-scheduler.log"))
                    .unwrap_or_default(),
                extender_log()
            )
        });
        let got = node_of(&cluster, &name).unwrap();
        assert!(
            best.contains(&got),
            "{name} {shape:?} went to {got}, the engine scores best {best:?} (scores {scores:?})\nextender log:\n{}",
            extender_log()
        );
        eprintln!("{name} {shape:?} -> {got} (best {best:?}, scores {scores:?})");
        let idx = NODES.iter().position(|(n, _)| *n == got).unwrap();
        bound.push((*shape, idx));
        // The next pod is placed by the extender's view: wait for its pod watch to see this
        // binding (each bound pod takes 1 CPU off its node in the extender's model).
        wait_until(
            &format!("the extender to see {name} on {got}"),
            Duration::from_secs(30),
            || extender_sees(port, &bound),
        )
        .unwrap_or_else(|e| panic!("{e}\nextender log:\n{}", extender_log()));
    }
    assert!(
        unique >= PODS.len() / 2,
        "only {unique} placements had one best node"
    );

    // A look-alike: the share annotation without a GPU request is not the extender's business
    // (not a managed resource): scheduled normally.
    cluster
        .apply(&pod_yaml("look-alike", (0, Some(300))))
        .unwrap();
    wait_until(
        "the look-alike to be scheduled",
        Duration::from_secs(60),
        || node_of(&cluster, "look-alike").is_some(),
    )
    .unwrap();

    // A GPU pod that fits on no GPU in the engine's model stays pending with the extender's
    // reason, although kube-scheduler's own replica count would allow it.
    let (best, _) = best_nodes(&bound, (1, Some(950)));
    assert!(best.is_empty(), "a 950-milli share still fits on {best:?}");
    {
        cluster.apply(&pod_yaml("too-big", (1, Some(950)))).unwrap();
        wait_until(
            "the extender's reason on too-big",
            Duration::from_secs(60),
            || {
                cluster
                    .kubectl(&[
                        "get",
                        "events",
                        "--field-selector",
                        "involvedObject.name=too-big",
                    ])
                    .is_ok_and(|e| e.contains("gpuops"))
            },
        )
        .unwrap_or_else(|e| {
            panic!(
                "{e}\n{}",
                cluster
                    .kubectl(&["get", "events", "-A"])
                    .unwrap_or_default()
            )
        });
        assert_eq!(node_of(&cluster, "too-big"), None);
    }
    assert!(extender_log().contains("policy Ours"));
}

/// One HTTP/1.1 request to the extender on loopback; the whole response, or "" if it failed.
fn http(port: u16, method: &str, path: &str, body: &str) -> String {
    use std::io::{Read, Write};
    let Ok(mut stream) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return String::new();
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: extender\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    if stream.write_all(request.as_bytes()).is_err() {
        return String::new();
    }
    let mut out = String::new();
    let _ = stream.read_to_string(&mut out);
    out
}

/// A kubeconfig with a token of ServiceAccount `gpuops/name` from the TokenRequest API.
fn service_account_kubeconfig(cluster: &Cluster, name: &str) -> std::path::PathBuf {
    let token = cluster
        .kubectl(&["create", "token", name, "-n", "gpuops", "--duration=30m"])
        .unwrap();
    let path = cluster.dir().join(format!("kubeconfig-{name}"));
    std::fs::write(
        &path,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: bed\n  cluster:\n    server: {}\n    insecure-skip-tls-verify: true\nusers:\n- name: sa\n  user:\n    token: {}\ncontexts:\n- name: bed\n  context:\n    cluster: bed\n    user: sa\ncurrent-context: bed\n",
            cluster.server(),
            token.trim()
        ),
    )
    .unwrap();
    path
}

#[test]
#[ignore = "needs the control plane (GPUOPS_K8S_BIN): run scripts/test"]
// Long on purpose: one scenario, its steps in order on one shared setup (a control plane, a node or a fleet costs seconds to start), so the cases read as the story they test.
fn the_charts_scheduler_binds_through_the_extender_and_holds_its_own_lease() {
    // No default scheduler: whatever gets bound, the chart's scheduler bound it.
    let cluster = Cluster::start(ClusterOptions {
        kwok: true,
        scheduler: false,
        ..ClusterOptions::default()
    })
    .unwrap();
    let chart =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../deploy/helm/gpuops");
    cluster
        .helm(&[
            "install",
            "gpuops",
            chart.to_str().unwrap(),
            "--namespace",
            "gpuops",
            "--create-namespace",
            "--set",
            "extender.enabled=true",
        ])
        .unwrap();
    // What Helm installed, as the apiserver stored it.
    let cm = cluster
        .get_json(&["configmap", "gpuops-scheduler", "-n", "gpuops"])
        .unwrap();
    let mut config: serde_json::Value =
        serde_saphyr::from_str(cm["data"]["kube-scheduler-config.yaml"].as_str().unwrap()).unwrap();
    assert_eq!(
        config["profiles"],
        serde_json::json!([{"schedulerName": "gpuops-scheduler"}])
    );
    assert_eq!(
        config["extenders"][0]["urlPrefix"],
        "http://gpuops-scheduler-extender.gpuops.svc:8888"
    );
    let lease_name = config["leaderElection"]["resourceName"]
        .as_str()
        .unwrap()
        .to_string();
    let lease_namespace = config["leaderElection"]["resourceNamespace"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(
        (lease_name.as_str(), lease_namespace.as_str()),
        ("gpuops-scheduler", "gpuops")
    );

    // Out of a pod: no Service DNS, no in-cluster config. Everything else as rendered.
    let port = free_port().unwrap();
    config["extenders"][0]["urlPrefix"] = format!("http://127.0.0.1:{port}").into();
    config["clientConnection"] = serde_json::json!({"kubeconfig":
        service_account_kubeconfig(&cluster, "gpuops-scheduler").to_str().unwrap()});
    let config_file = cluster.dir().join("gpuops-scheduler-config.yaml");
    std::fs::write(&config_file, serde_json::to_string(&config).unwrap()).unwrap();

    let log = cluster.dir().join("chart-extender.log");
    let mut cmd = common::gpuops();
    cmd.args([
        "scheduler-extender",
        "--address",
        &format!("127.0.0.1:{port}"),
    ])
    .arg("--kubeconfig")
    .arg(service_account_kubeconfig(
        &cluster,
        "gpuops-scheduler-extender",
    ));
    let _extender = ChildGuard::spawn("gpuops scheduler-extender", cmd, &log).unwrap();
    let extender_log = || std::fs::read_to_string(&log).unwrap_or_default();
    let scheduler_log_path = cluster.dir().join("gpuops-scheduler.log");
    let mut cmd = std::process::Command::new(cluster.bin().join("kube-scheduler"));
    cmd.arg(format!("--config={}", config_file.display()))
        .arg(format!("--secure-port={}", free_port().unwrap()))
        .arg("--bind-address=127.0.0.1")
        .arg("-v=2");
    let _scheduler = ChildGuard::spawn("gpuops-scheduler", cmd, &scheduler_log_path).unwrap();
    let logs = || {
        format!(
            "kube-scheduler log:\n{}\nextender log:\n{}",
            std::fs::read_to_string(&scheduler_log_path).unwrap_or_default(),
            extender_log()
        )
    };

    cluster.apply(&node_yaml("gpu-a", 1)).unwrap();
    wait_until("the extender's /readyz", Duration::from_secs(60), || {
        http(port, "GET", "/readyz", "").starts_with("HTTP/1.1 200")
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", logs()));
    let probe = serde_json::json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "probe", "namespace": "default"},
        "spec": {"containers": [{"name": "c", "resources": {"requests": {"nvidia.com/gpu": "1"}}}]}});
    let args = serde_json::json!({"Pod": probe, "NodeNames": ["gpu-a"]}).to_string();
    wait_until(
        "the extender to watch gpu-a",
        Duration::from_secs(60),
        || {
            http(port, "POST", "/prioritize", &args)
                .ends_with("[{\"Host\":\"gpu-a\",\"Score\":10}]")
        },
    )
    .unwrap_or_else(|e| panic!("{e}\n{}", logs()));

    let ours = |name: &str, shape: Shape| {
        pod_yaml(name, shape).replacen("spec:\n", "spec:\n  schedulerName: gpuops-scheduler\n", 1)
    };
    cluster.apply(&ours("first", (1, Some(600)))).unwrap();
    wait_until(
        "first to be bound by gpuops-scheduler",
        Duration::from_secs(90),
        || node_of(&cluster, "first").is_some(),
    )
    .unwrap_or_else(|e| panic!("{e}\n{}", logs()));
    assert_eq!(node_of(&cluster, "first").as_deref(), Some("gpu-a"));
    let events = cluster
        .kubectl(&[
            "get",
            "events",
            "-n",
            "default",
            "--field-selector",
            "involvedObject.name=first",
            "-o",
            "json",
        ])
        .unwrap();
    assert!(
        events.contains("gpuops-scheduler"),
        "bound by gpuops-scheduler:\n{events}"
    );

    // 2 of the GPU's 4 replicas are free, so kube-scheduler alone would bind it; the extender
    // knows 600 + 600 milli do not fit on one GPU.
    let share = serde_json::json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "share", "namespace": "default",
            "annotations": {"gpuops.io/gpu-milli": "600"}},
        "spec": {"containers": [{"name": "c", "resources": {"requests": {"nvidia.com/gpu": "1"}}}]}});
    let filter = serde_json::json!({"Pod": share, "NodeNames": ["gpu-a"]}).to_string();
    wait_until(
        "first's binding in the extender's watch",
        Duration::from_secs(30),
        || http(port, "POST", "/filter", &filter).contains("\"FailedNodes\":{\"gpu-a\""),
    )
    .unwrap_or_else(|e| panic!("{e}\n{}", logs()));
    cluster.apply(&ours("second", (1, Some(600)))).unwrap();
    wait_until(
        "the extender's reason on second",
        Duration::from_secs(90),
        || {
            cluster
                .kubectl(&[
                    "get",
                    "events",
                    "-n",
                    "default",
                    "--field-selector",
                    "involvedObject.name=second",
                ])
                .is_ok_and(|e| e.contains("gpuops"))
        },
    )
    .unwrap_or_else(|e| panic!("{e}\n{}", logs()));
    assert_eq!(node_of(&cluster, "second"), None);

    // The lease the config names is held, by this scheduler; the control plane's is untouched.
    let lease = cluster
        .get_json(&["lease", &lease_name, "-n", &lease_namespace])
        .unwrap_or_else(|e| panic!("{e}\n{}", logs()));
    let holder = lease["spec"]["holderIdentity"].as_str().unwrap_or_default();
    assert!(!holder.is_empty(), "{lease}");
    assert!(
        cluster
            .kubectl(&["get", "lease", "kube-scheduler", "-n", "kube-system"])
            .is_err(),
        "the control plane's lease was not taken"
    );
}
