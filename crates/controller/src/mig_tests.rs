use super::*;
use gpuops_autoscale::PendingPod;

fn node(name: &str, labels: &[(&str, &str)], annotations: &[(&str, &str)]) -> Arc<Node> {
    let m = |kv: &[(&str, &str)]| -> BTreeMap<String, String> {
        kv.iter()
            .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
            .collect()
    };
    let mut n = Node::default();
    n.metadata.name = Some(name.into());
    n.metadata.labels = Some(m(labels));
    n.metadata.annotations = Some(m(annotations));
    Arc::new(n)
}

const LAYOUT: &str = r#"{"applied":"all-1g.10gb","model":"A100-SXM4-80GB","gpus":[
  {"mig_enabled":true,"busy":false,"instances":[{"profile":"1g.10gb","start":0,"busy":true},{"profile":"1g.10gb","start":1,"busy":false}]},
  {"mig_enabled":true,"busy":false,"instances":[]}]}"#;

fn mig_pod(key: &str, resource: &str, n: u64) -> PendingPod {
    PendingPod {
        key: key.into(),
        created: 1000,
        cpu_milli: 100,
        memory_mib: 64,
        gpu_resource: String::new(),
        gpu_count: 0,
        gpu_milli: None,
        scalars: BTreeMap::from([(resource.to_string(), n)]),
        tolerations: Vec::new(),
        constraints: Default::default(),
    }
}

#[test]
fn the_view_reads_the_agents_layout_and_states_and_only_single_profile_mig_pods() {
    let nodes = vec![
        node(
            "applied",
            &[(CONFIG_LABEL, "all-1g.10gb"), (STATE_LABEL, "success")],
            &[(LAYOUT_ANNOTATION, LAYOUT)],
        ),
        // The label names a config the agent has not applied: under way.
        node(
            "asked",
            &[(CONFIG_LABEL, "gpuops-1234"), (STATE_LABEL, "success")],
            &[(LAYOUT_ANNOTATION, LAYOUT)],
        ),
        node(
            "failed",
            &[(CONFIG_LABEL, "gpuops-1234"), (STATE_LABEL, "failed")],
            &[(LAYOUT_ANNOTATION, LAYOUT)],
        ),
        node("no-mig", &[], &[]),
        node("broken", &[], &[(LAYOUT_ANNOTATION, "{not json")]),
    ];
    let mut snap = Snapshot {
        pending: vec![
            mig_pod("default/a", "nvidia.com/mig-3g.40gb", 2),
            mig_pod("default/whole", "nvidia.com/gpu", 1),
        ],
        ..Snapshot::default()
    };
    snap.pending[1].gpu_count = 1;
    let (mig_nodes, pods, pools, problems) = view(&nodes, &snap, &Boot::default());
    let names: Vec<&str> = mig_nodes.iter().map(|n| n.name.as_str()).collect();
    assert_eq!(names, ["applied", "asked", "failed"]);
    assert_eq!(mig_nodes[0].state, MigNodeState::Success);
    assert_eq!(mig_nodes[1].state, MigNodeState::Pending);
    assert_eq!(mig_nodes[2].state, MigNodeState::Failed);
    assert_eq!(mig_nodes[0].model, "A100-SXM4-80GB");
    assert!(mig_nodes[0].gpus[0].instances[0].busy);
    assert!(!mig_nodes[0].gpus[0].instances[1].busy);
    // Not in the snapshot's ready nodes: counted as launched, not re-partitioned.
    assert!(mig_nodes[0].in_flight);
    assert_eq!(pods.len(), 1);
    assert_eq!((pods[0].profile.as_str(), pods[0].count), ("3g.40gb", 2));
    assert!(pools.is_empty());
    assert_eq!(problems.len(), 1);
    assert!(
        problems[0].contains("node broken") && problems[0].contains(LAYOUT_ANNOTATION),
        "{problems:?}"
    );
    assert!(is_mig_pod(&snap.pending[0]));
    assert!(!is_mig_pod(&snap.pending[1]));
}

const EXISTING: &str = "version: v1
mig-configs:
  all-1g.10gb:
  - devices: all
    mig-enabled: true
    mig-devices:
      1g.10gb: 7
  gpuops-old:
  - devices: all
    mig-enabled: true
    mig-devices:
      7g.80gb: 1
  gpuops-inuse:
  - devices: all
    mig-enabled: true
    mig-devices:
      2g.20gb: 3
";

#[test]
fn configs_are_merged_in_replacing_by_name_and_unreferenced_generated_ones_pruned() {
    let add = NamedConfigYaml {
        name: "gpuops-new".into(),
        yaml: "version: v1\nmig-configs:\n  gpuops-new:\n  - devices: all\n    mig-enabled: true\n    mig-devices:\n      3g.40gb: 2\n".into(),
    };
    let referenced = BTreeSet::from(["gpuops-inuse".to_string()]);
    let text = merge_configs(EXISTING, "cm", &[&add], &referenced).unwrap();
    let all = gpuops_mig::config::parse(&text, "merged").unwrap();
    let names: Vec<&str> = all.configs.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["all-1g.10gb", "gpuops-inuse", "gpuops-new"]);
    assert_eq!(
        all.get("gpuops-new").unwrap().entries[0].mig_devices["3g.40gb"],
        2
    );
    // Idempotent: merging the same again changes nothing.
    assert_eq!(
        merge_configs(&text, "cm", &[&add], &referenced).unwrap(),
        text
    );
    // An empty ConfigMap key starts a file.
    let fresh = merge_configs("", "cm", &[&add], &BTreeSet::new()).unwrap();
    assert!(fresh.contains("gpuops-new"), "{fresh}");
}

#[test]
fn a_config_map_that_does_not_parse_is_an_error_naming_it() {
    let e = merge_configs(
        "version: v1\nmig-configs: [",
        "ConfigMap gpuops/gpuops-mig-config key config.yaml",
        &[],
        &BTreeSet::new(),
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("ConfigMap gpuops/gpuops-mig-config key config.yaml"),
        "{e}"
    );
}

#[test]
fn changes_under_way_and_failed_ones_are_listed_for_the_status() {
    let nodes = vec![
        node(
            "done",
            &[(CONFIG_LABEL, "all-1g.10gb"), (STATE_LABEL, "success")],
            &[(LAYOUT_ANNOTATION, LAYOUT)],
        ),
        node(
            "asked",
            &[(CONFIG_LABEL, "gpuops-1"), (STATE_LABEL, "success")],
            &[(LAYOUT_ANNOTATION, LAYOUT)],
        ),
        node(
            "applying",
            &[(CONFIG_LABEL, "gpuops-1"), (STATE_LABEL, "pending")],
            &[(LAYOUT_ANNOTATION, LAYOUT)],
        ),
        node(
            "failed",
            &[(CONFIG_LABEL, "gpuops-1"), (STATE_LABEL, "failed")],
            &[
                (LAYOUT_ANNOTATION, LAYOUT),
                (REASON_ANNOTATION, "injected failure"),
            ],
        ),
    ];
    let s = under_way(&nodes);
    let rows: Vec<(&str, &str, &str)> = s
        .iter()
        .map(|c| (c.node.as_str(), c.state.as_str(), c.message.as_str()))
        .collect();
    assert_eq!(
        rows,
        [
            ("asked", "requested", ""),
            ("applying", "pending", ""),
            ("failed", "failed", "injected failure")
        ]
    );
    assert!(
        s.iter()
            .all(|c| c.from == "all-1g.10gb" && c.to == "gpuops-1")
    );
}

fn mig_pool(replicas: u32) -> gpuops_autoscale::Pool {
    gpuops_autoscale::Pool {
        name: "default/a100".into(),
        min: 0,
        max: 4,
        replicas,
        price_per_hour: 10.0,
        template: gpuops_autoscale::NodeTemplate {
            cpu_milli: 64_000,
            memory_mib: 512 * 1024,
            gpus: 0,
            gpu_resource: String::new(),
            gpu_replicas: 1,
            gpu_product: "NVIDIA-A100-SXM4-80GB".into(),
            scalars: BTreeMap::from([("nvidia.com/mig-3g.40gb".to_string(), 2)]),
            labels: BTreeMap::from([
                (CONFIG_LABEL.to_string(), "all-3g.40gb".to_string()),
                ("nvidia.com/gpu.count".to_string(), "1".to_string()),
            ]),
            taints: Vec::new(),
        },
        timeouts: gpuops_autoscale::StageTimeouts::default(),
    }
}

#[test]
fn a_mig_pool_buys_once_and_its_launched_node_counts_until_it_publishes_a_layout() {
    let mut snap = Snapshot {
        pending: vec![
            mig_pod("default/a", "nvidia.com/mig-3g.40gb", 1),
            mig_pod("default/b", "nvidia.com/mig-3g.40gb", 1),
        ],
        pools: vec![mig_pool(0)],
        ..Snapshot::default()
    };
    let cfg = MigConfig {
        batch_idle: std::time::Duration::ZERO,
        ..MigConfig::default()
    };
    let (nodes, pods, pools, _) = view(&[], &snap, &Boot::default());
    assert_eq!(pools.len(), 1);
    assert_eq!(
        pools[0].default_config,
        Some((
            "all-3g.40gb".to_string(),
            vec![BTreeMap::from([("3g.40gb".to_string(), 2)])]
        ))
    );
    let mut mem = MigMemory::default();
    let d = decide_mig(&nodes, &pods, &pools, &mut mem, 10_000, &cfg);
    assert_eq!(d.scale_ups.len(), 1, "{d:?}");
    assert_eq!(
        (d.scale_ups[0].nodes, d.scale_ups[0].config_name.as_str()),
        (1, "all-3g.40gb")
    );
    // Replicas raised, the node not ready: its layout holds both pods, nothing bought again.
    snap.pools = vec![mig_pool(1)];
    let (nodes, pods, pools, _) = view(&[], &snap, &Boot::default());
    assert_eq!(nodes.len(), 1);
    assert!(nodes[0].in_flight);
    let d = decide_mig(&nodes, &pods, &pools, &mut mem, 11_000, &cfg);
    assert!(d.scale_ups.is_empty(), "{d:?}");
    assert_eq!(d.served_by_free.len(), 2, "{d:?}");
}
