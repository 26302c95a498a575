#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
use super::*;
use crate::mig_demand::{MigConfig, MigMemory, NamedConfigYaml, decide_mig};
use crate::mig_owed::{BootNode, OwedMap, config_layout, merge_configs, owed_json, parse_owed};

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
    let problem = problems[0].to_string();
    assert!(
        problem.contains("node broken") && problem.contains(LAYOUT_ANNOTATION),
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

fn mig_pool(replicas: u32) -> crate::Pool {
    crate::Pool {
        name: "default/a100".into(),
        min: 0,
        max: 4,
        replicas,
        price_per_hour: 10.0,
        template: crate::NodeTemplate {
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
        timeouts: crate::StageTimeouts::default(),
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

/// A pool coming up with 7x `1g.10gb`: a `3g.40gb` pod needs a generated layout.
fn mig_1g_pool(replicas: u32) -> crate::Pool {
    let mut p = mig_pool(replicas);
    p.template.scalars = BTreeMap::from([("nvidia.com/mig-1g.10gb".to_string(), 7)]);
    p.template
        .labels
        .insert(CONFIG_LABEL.to_string(), "all-1g.10gb".to_string());
    p
}

fn owed(config: &str, at: Millis) -> Owed {
    Owed {
        config: config.into(),
        at,
        layout: vec![BTreeMap::from([
            ("3g.40gb".to_string(), 1),
            ("1g.10gb".to_string(), 4),
        ])],
    }
}

#[test]
fn owed_configs_survive_their_annotation_text() {
    let owed = OwedMap::from([
        (
            "default/a100".to_string(),
            vec![owed("gpuops-aaaa", 1000), owed("gpuops-bbbb", 2000)],
        ),
        ("default/h100".to_string(), vec![owed("gpuops-cccc", 3000)]),
    ]);
    assert_eq!(
        parse_owed("ConfigMap x/y", &owed_json(&owed)).unwrap(),
        owed
    );
    assert_eq!(parse_owed("ConfigMap x/y", "").unwrap(), OwedMap::new());
    // Pools owing nothing are left out of the text.
    let mut empty = owed.clone();
    empty.insert("default/a100".into(), Vec::new());
    assert!(!owed_json(&empty).contains("default/a100"));
    // Without a layout (written by hand): still an entry.
    assert_eq!(
        parse_owed(
            "ConfigMap x/y",
            r#"{"default/a100":[{"config":"gpuops-aaaa","at":5}]}"#
        )
        .unwrap()["default/a100"][0]
            .at,
        5
    );
}

#[test]
fn bad_owed_configs_name_the_configmap_the_annotation_and_the_pool() {
    let origin = "ConfigMap gpuops/gpuops-mig-config";
    for (text, why) in [
        ("{not json", "key must be a string"),
        (
            r#"[{"config":"gpuops-a","at":1}]"#,
            "want {\"NAMESPACE/MACHINEDEPLOYMENT\"",
        ),
        (
            r#"{"default/a100":[{"config":"gpuops-a"}]}"#,
            "missing field `at`",
        ),
        (
            r#"{"default/a100":[{"config":"gpuops-a","at":-1}]}"#,
            "invalid value",
        ),
        (
            r#"{"default/a100":[{"config":"gpuops-a","at":1},{"config":"all-1g.10gb","at":2}]}"#,
            "MachineDeployment default/a100 entry 1: config \"all-1g.10gb\" is not a generated config",
        ),
    ] {
        let e = parse_owed(origin, text).unwrap_err().to_string();
        assert!(
            e.contains("ConfigMap gpuops/gpuops-mig-config: annotation gpuops.io/mig.owed-configs")
                && e.contains(why),
            "{text}: {e}"
        );
    }
}

fn fresh(name: &str, registered: Millis) -> BootNode {
    BootNode {
        name: name.into(),
        registered,
    }
}

#[test]
fn one_owed_entry_labels_exactly_one_node_that_registered_after_it() {
    let list = vec![owed("gpuops-aaaa", 10_000)];
    // An older node (registered before the scale-up) is not the one bought for it.
    let a = assign(
        &list,
        &[
            fresh("old", 9_000),
            fresh("new-2", 12_000),
            fresh("new-1", 11_000),
        ],
        0,
        20_000,
        60_000,
    );
    assert_eq!(a.labels.len(), 1);
    assert_eq!(a.labels[0].0, "new-1");
    assert!(a.keep.is_empty() && a.dropped.is_empty(), "{a:?}");
    // Two entries, oldest first, each its own node.
    let list = vec![owed("gpuops-bbbb", 10_500), owed("gpuops-aaaa", 10_000)];
    let a = assign(
        &list,
        &[fresh("new-2", 12_000), fresh("new-1", 11_000)],
        0,
        20_000,
        60_000,
    );
    let got: Vec<(&str, &str)> = a
        .labels
        .iter()
        .map(|(n, o)| (n.as_str(), o.config.as_str()))
        .collect();
    assert_eq!(got, [("new-1", "gpuops-aaaa"), ("new-2", "gpuops-bbbb")]);
}

/// 2026-12-01T12:00:00Z in ms.
const NOON: Millis = 1_796_126_400_000;

#[test]
fn a_node_created_in_the_second_of_its_entry_is_its_node() {
    // Entry at 12:00:00.500 (our clock), node created 12:00:00.800, stamped 12:00:00 by the
    // API server: it is the entry's node. The instant reading (`registered >= at`) left it
    // unlabelled, booting on the default layout, until the entry was trimmed 30 s later.
    let list = vec![owed("gpuops-aaaa", NOON + 500)];
    assert!(fresh("new", NOON).registered < list[0].at);
    let a = assign(&list, &[fresh("new", NOON)], 1, NOON + 2_000, 60_000);
    assert_eq!(a.labels.len(), 1, "{a:?}");
    assert_eq!(a.labels[0].0, "new");
    assert!(a.keep.is_empty() && a.dropped.is_empty(), "{a:?}");
    // A node stamped a whole second before cannot have been bought for it.
    let a = assign(
        &list,
        &[fresh("old", NOON - 1_000)],
        1,
        NOON + 2_000,
        60_000,
    );
    assert!(a.labels.is_empty(), "{a:?}");
    assert_eq!(a.keep, list);
}

#[test]
fn an_owed_entry_waits_for_its_node_then_expires() {
    let list = vec![owed("gpuops-aaaa", 10_000)];
    let a = assign(&list, &[fresh("old", 9_000)], 1, 20_000, 60_000);
    assert!(a.labels.is_empty());
    assert_eq!(a.keep, list);
    // Past the provisioning stages: its node timed out; a node registering later is not it.
    let a = assign(&list, &[fresh("late", 80_000)], 1, 80_001, 60_000);
    assert!(a.labels.is_empty() && a.keep.is_empty(), "{a:?}");
    assert_eq!(a.dropped.len(), 1);
    assert!(a.dropped[0].1.contains("no node registered within 60 s"));
}

#[test]
fn owed_entries_beyond_the_nodes_still_to_come_are_dropped_oldest_first() {
    // Two entries, one node still to register (the second scale-up failed after recording).
    let list = vec![owed("gpuops-aaaa", 10_000), owed("gpuops-bbbb", 11_000)];
    let a = assign(&list, &[], 1, 50_000, 120_000);
    assert_eq!(a.keep.len(), 1);
    assert_eq!(a.keep[0].config, "gpuops-bbbb");
    assert_eq!(a.dropped[0].0.config, "gpuops-aaaa");
    assert!(a.dropped[0].1.contains("did not happen"), "{a:?}");
    // Just written: the replicas counted may predate the scale; kept for now.
    let a = assign(&list, &[], 0, 20_000, 120_000);
    assert_eq!(a.keep, list);
    assert!(a.dropped.is_empty());
}

#[test]
fn a_generated_config_gives_its_layout_per_gpu() {
    let text = "version: v1\nmig-configs:\n  gpuops-abcd:\n  - devices: [0]\n    mig-enabled: true\n    mig-devices: {3g.40gb: 1, 1g.10gb: 4}\n  - devices: [1]\n    mig-enabled: false\n";
    let all = gpuops_mig::config::parse(text, "t").unwrap();
    let l = config_layout(all.get("gpuops-abcd").unwrap(), 2).unwrap();
    assert_eq!(
        l,
        vec![
            BTreeMap::from([("1g.10gb".to_string(), 4), ("3g.40gb".to_string(), 1)]),
            BTreeMap::new()
        ]
    );
}

#[test]
fn fresh_nodes_are_the_pools_registered_ones_nothing_labelled() {
    let created = |name: &str, labels: &[(&str, &str)], ann: &[(&str, &str)]| {
        let mut n = (*node(name, labels, ann)).clone();
        n.metadata.creation_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            "2026-12-01T10:00:00Z".parse().unwrap(),
        ));
        Arc::new(n)
    };
    let nodes = vec![
        created("booting", &[(CONFIG_LABEL, "all-1g.10gb")], &[]),
        created(
            "labelled",
            &[(CONFIG_LABEL, "gpuops-aaaa")],
            &[(CHANGED_ANNOTATION, "2026-12-01T10:00:01Z")],
        ),
        created(
            "touched",
            &[(CONFIG_LABEL, "all-1g.10gb")],
            &[(CHANGED_ANNOTATION, "2026-12-01T10:00:01Z")],
        ),
        created("other-pool", &[(CONFIG_LABEL, "all-1g.10gb")], &[]),
    ];
    let machine = |node: &str, pool: &str| crate::Machine {
        name: format!("default/{node}"),
        pool: pool.into(),
        node: Some(node.into()),
        stage: crate::Stage::Registered,
        stage_since: 0,
        failed: false,
    };
    let snap = Snapshot {
        pools: vec![mig_1g_pool(3)],
        machines: vec![
            machine("booting", "default/a100"),
            machine("labelled", "default/a100"),
            machine("touched", "default/a100"),
            machine("other-pool", "default/h100"),
        ],
        ..Snapshot::default()
    };
    let (fresh, registered) = boot_nodes("default/a100", "all-1g.10gb", &nodes, &snap);
    assert_eq!(registered, 3);
    assert_eq!(fresh.len(), 1);
    assert_eq!(fresh[0].name, "booting");
    assert_eq!(fresh[0].registered, 1_796_119_200_000);
}

#[test]
fn a_launched_node_counts_with_what_its_pool_owes_it_so_one_need_buys_one_node() {
    let mut snap = Snapshot {
        pending: vec![
            mig_pod("default/big", "nvidia.com/mig-3g.40gb", 1),
            mig_pod("default/small", "nvidia.com/mig-1g.10gb", 1),
        ],
        pools: vec![mig_1g_pool(0)],
        ..Snapshot::default()
    };
    let cfg = MigConfig {
        batch_idle: std::time::Duration::ZERO,
        ..MigConfig::default()
    };
    let mut mem = MigMemory::default();
    let (nodes, pods, pools, _) = view(&[], &snap, &Boot::default());
    let d = decide_mig(&nodes, &pods, &pools, &mut mem, 10_000, &cfg);
    assert_eq!(d.scale_ups.len(), 1, "{d:?}");
    let su = &d.scale_ups[0];
    assert!(su.config_name.starts_with("gpuops-"), "{su:?}");
    assert!(su.layout[0].contains_key("3g.40gb"), "{su:?}");
    // Recorded and scaled; the node not registered yet: it counts with the owed layout.
    snap.pools = vec![mig_1g_pool(1)];
    let mut boot = Boot::default();
    boot.owed.insert(
        "default/a100".into(),
        vec![Owed {
            config: su.config_name.clone(),
            at: 10_000,
            layout: su.layout.clone(),
        }],
    );
    let (nodes, pods, pools, _) = view(&[], &snap, &boot);
    assert_eq!(nodes.len(), 1);
    assert_eq!(nodes[0].config, su.config_name);
    let d2 = decide_mig(&nodes, &pods, &pools, &mut mem, 11_000, &cfg);
    assert!(d2.scale_ups.is_empty(), "{d2:?}");
    assert_eq!(d2.served_by_free.len(), 2, "{d2:?}");
    // Without the owed entry it would count with the template's 7x 1g.10gb: bought again.
    let (nodes, pods, pools, _) = view(&[], &snap, &Boot::default());
    let d3 = decide_mig(&nodes, &pods, &pools, &mut mem, 12_000, &cfg);
    assert_eq!(d3.scale_ups.len(), 1, "{d3:?}");
    // Registered and labelled (the entry popped): the label's layout from the ConfigMap.
    let labelled = node("new", &[(CONFIG_LABEL, su.config_name.as_str())], &[]);
    snap.machines = vec![crate::Machine {
        name: "default/new".into(),
        pool: "default/a100".into(),
        node: Some("new".into()),
        stage: crate::Stage::Devices,
        stage_since: 0,
        failed: false,
    }];
    let mut boot = Boot::default();
    boot.layouts
        .insert(su.config_name.clone(), su.layout.clone());
    let (nodes, pods, pools, _) = view(&[labelled], &snap, &boot);
    assert_eq!(nodes.len(), 1);
    assert_eq!(
        (nodes[0].name.as_str(), nodes[0].config.as_str()),
        ("new", su.config_name.as_str())
    );
    let d4 = decide_mig(&nodes, &pods, &pools, &mut mem, 13_000, &cfg);
    assert!(d4.scale_ups.is_empty(), "{d4:?}");
}

#[test]
fn a_ready_node_relabelled_at_boot_counts_free_until_it_advertises_the_new_layout() {
    let layout = vec![BTreeMap::from([
        ("3g.40gb".to_string(), 1),
        ("1g.10gb".to_string(), 2),
    ])];
    let ready = |free: &[(&str, u64)]| crate::Node {
        name: "new".into(),
        pool: Some("default/a100".into()),
        machine: Some("default/new".into()),
        // The snapshot's labels may predate the labelling: the Node object's count.
        labels: BTreeMap::from([(CONFIG_LABEL.to_string(), "all-1g.10gb".to_string())]),
        taints: Vec::new(),
        unschedulable: false,
        cpu_free_milli: 64_000,
        memory_free_mib: 1 << 19,
        gpu_resource: String::new(),
        gpu_replicas: 1,
        gpu_free: Vec::new(),
        gpu_product: "NVIDIA-A100-SXM4-80GB".into(),
        scalars_free: free
            .iter()
            .map(|(k, v)| (format!("nvidia.com/mig-{k}"), *v))
            .collect(),
        pods: Vec::new(),
        gpu_util: None,
        removing: false,
    };
    let k8s = |alloc: &[(&str, &str)]| {
        let mut n = (*node("new", &[(CONFIG_LABEL, "gpuops-aaaa")], &[])).clone();
        n.status = Some(k8s_openapi::api::core::v1::NodeStatus {
            allocatable: Some(
                alloc
                    .iter()
                    .map(|(k, v)| {
                        (
                            format!("nvidia.com/mig-{k}"),
                            k8s_openapi::apimachinery::pkg::api::resource::Quantity(
                                (*v).to_string(),
                            ),
                        )
                    })
                    .collect(),
            ),
            ..Default::default()
        });
        Arc::new(n)
    };
    let mut boot = Boot::default();
    boot.layouts.insert("gpuops-aaaa".into(), layout);
    let busy = |nodes: &[MigNode]| -> Vec<(String, bool)> {
        nodes[0].gpus[0]
            .instances
            .iter()
            .map(|i| (i.profile.clone(), i.busy))
            .collect()
    };
    // Still 7x 1g.10gb from the template's config, all free: the new layout, all free.
    let snap = Snapshot {
        pools: vec![mig_1g_pool(1)],
        nodes: vec![ready(&[("1g.10gb", 7)])],
        ..Snapshot::default()
    };
    let (nodes, _, _, _) = view(&[k8s(&[("1g.10gb", "7")])], &snap, &boot);
    assert_eq!(nodes.len(), 1);
    assert_eq!(nodes[0].config, "gpuops-aaaa");
    assert!(busy(&nodes).iter().all(|(_, b)| !b), "{:?}", busy(&nodes));
    // Landed, and a pod holds the 3g.40gb: that one is busy.
    let snap = Snapshot {
        nodes: vec![ready(&[("1g.10gb", 2), ("3g.40gb", 0)])],
        ..snap
    };
    let (nodes, _, _, _) = view(&[k8s(&[("1g.10gb", "2"), ("3g.40gb", "1")])], &snap, &boot);
    let b = busy(&nodes);
    assert!(b.contains(&("3g.40gb".to_string(), true)), "{b:?}");
    assert_eq!(b.iter().filter(|(_, x)| *x).count(), 1, "{b:?}");
}

#[test]
fn the_minimum_interval_counts_from_the_end_of_the_changed_at_second() {
    let nodes = vec![node(
        "applied",
        &[(CONFIG_LABEL, "all-1g.10gb"), (STATE_LABEL, "success")],
        &[
            (LAYOUT_ANNOTATION, LAYOUT),
            (CHANGED_ANNOTATION, "2026-12-01T10:00:00Z"),
        ],
    )];
    let (mig_nodes, _, _, _) = view(&nodes, &Snapshot::default(), &Boot::default());
    assert_eq!(mig_nodes[0].changed_at, Some(1_796_119_200_999));
}
