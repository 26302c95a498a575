use super::*;

const S: Millis = 1000;
const H100: &str = "H100-SXM5-80GB";
const A100: &str = "A100-SXM4-80GB";

fn inst(profile: &str, start: u32, busy: bool) -> MigInstance {
    MigInstance {
        profile: profile.into(),
        start,
        busy,
    }
}

/// A GPU with seven 1g.10gb, the first `busy` of them in use.
fn seven_1g(busy: usize) -> MigGpu {
    MigGpu {
        mig_enabled: true,
        busy: false,
        instances: (0..7)
            .map(|s| inst("1g.10gb", s, (s as usize) < busy))
            .collect(),
    }
}

fn node(name: &str, model: &str, price: f64, gpus: Vec<MigGpu>) -> MigNode {
    MigNode {
        name: name.into(),
        pool: Some("default/mig".into()),
        model: model.into(),
        price_per_hour: price,
        config: "all-1g.10gb".into(),
        state: MigNodeState::Success,
        changed_at: None,
        unschedulable: false,
        in_flight: false,
        gpus,
        cpu_free_milli: u64::MAX,
        memory_free_mib: u64::MAX,
    }
}

fn pod(key: &str, created: Millis, profile: &str) -> MigPod {
    MigPod {
        key: key.into(),
        created,
        profile: profile.into(),
        count: 1,
        cpu_milli: 0,
        memory_mib: 0,
    }
}

fn busy_kept(n: &MigNode, c: &MigChange) {
    for (gi, plan) in &c.plans {
        for b in n.gpus[*gi as usize].instances.iter().filter(|i| i.busy) {
            assert!(
                plan.target
                    .instances
                    .iter()
                    .any(|t| t.profile == b.profile && t.start == b.start),
                "busy {}@{} of {} GPU {gi} lost in {}",
                b.profile,
                b.start,
                n.name,
                plan.target
            );
        }
        assert!(plan.destroy.is_empty(), "{plan:?}");
    }
}

#[test]
fn free_gpu_is_repartitioned_and_busy_instances_stay() {
    let n = node("n1", H100, 10.0, vec![seven_1g(3)]);
    let pods = vec![pod("ns/a", 0, "3g.40gb")];
    let mut mem = MigMemory::default();
    let d = decide_mig(
        std::slice::from_ref(&n),
        &pods,
        &[],
        &mut mem,
        20 * S,
        &MigConfig::default(),
    );
    assert_eq!(d.changes.len(), 1, "{d:?}");
    let c = &d.changes[0];
    assert_eq!(c.pods, vec!["ns/a".to_string()]);
    busy_kept(&n, c);
    let target = &c.plans[0].1.target;
    assert!(target.counts().get("3g.40gb") == Some(&1), "{target}");
    assert!(
        target.counts().get("1g.10gb").copied().unwrap_or(0) >= 3,
        "{target}"
    );
    assert!(
        c.config.yaml.contains("\"3g.40gb\": 1"),
        "{}",
        c.config.yaml
    );
    assert!(c.config.yaml.starts_with("version: v1"));
    assert!(c.config_name.starts_with("gpuops-"));
    assert!(d.scale_ups.is_empty());
    // The generated config is one mig-parted can read back.
    let parsed = gpuops_mig::config::parse(&c.config.yaml, "generated").unwrap();
    assert_eq!(parsed.names(), vec![c.config_name.as_str()]);
}

#[test]
fn pods_a_free_instance_serves_change_nothing() {
    let n = node("n1", H100, 10.0, vec![seven_1g(3)]);
    let pods = vec![pod("ns/a", 0, "1g.10gb")];
    let d = decide_mig(
        &[n],
        &pods,
        &[],
        &mut MigMemory::default(),
        60 * S,
        &MigConfig::default(),
    );
    assert!(d.changes.is_empty());
    assert_eq!(d.served_by_free, vec!["ns/a".to_string()]);
}

#[test]
fn demand_inside_the_batch_window_waits() {
    let n = node("n1", H100, 10.0, vec![seven_1g(0)]);
    // Created 5 s ago: not persisted for the 10 s idle window.
    let pods = vec![pod("ns/a", 100 * S, "3g.40gb")];
    let mut mem = MigMemory::default();
    let d = decide_mig(
        std::slice::from_ref(&n),
        &pods,
        &[],
        &mut mem,
        105 * S,
        &MigConfig::default(),
    );
    assert!(d.changes.is_empty(), "{d:?}");
    assert_eq!(d.waiting, vec!["ns/a".to_string()]);
    // A pod that came and went inside the window (absent at the next call) never changed
    // anything; the one that persisted does.
    let d = decide_mig(&[n], &pods, &[], &mut mem, 111 * S, &MigConfig::default());
    assert_eq!(d.changes.len(), 1);
}

#[test]
fn a_steady_stream_is_served_at_the_maximum_window() {
    let n = node("n1", H100, 10.0, vec![seven_1g(0)]);
    // One new pod every 5 s: the idle window never closes, the 60 s maximum does.
    let pods: Vec<MigPod> = (0..13)
        .map(|k| pod(&format!("ns/p{k}"), k * 5 * S, "2g.20gb"))
        .collect();
    let d = decide_mig(
        std::slice::from_ref(&n),
        &pods[..12],
        &[],
        &mut MigMemory::default(),
        58 * S,
        &MigConfig::default(),
    );
    assert!(d.changes.is_empty());
    let d = decide_mig(
        &[n],
        &pods,
        &[],
        &mut MigMemory::default(),
        60 * S,
        &MigConfig::default(),
    );
    assert_eq!(d.changes.len(), 1);
    // Only pods that persisted 10 s count: p0..p10 (created <= 50 s); 3 fit one GPU.
    assert_eq!(d.changes[0].pods, vec!["ns/p0", "ns/p1", "ns/p2"]);
}

#[test]
fn failed_node_is_not_chosen_until_it_recovered_and_backed_off() {
    let mut n = node("n1", H100, 1.0, vec![seven_1g(0)]);
    let other = node("n2", H100, 5.0, vec![seven_1g(0)]);
    n.state = MigNodeState::Failed;
    let cfg = MigConfig::default();
    let mut mem = MigMemory::default();
    let pods = vec![pod("ns/a", 0, "7g.80gb")];
    let d = decide_mig(
        &[n.clone(), other.clone()],
        &pods,
        &[],
        &mut mem,
        20 * S,
        &cfg,
    );
    assert_eq!(d.changes.len(), 1);
    assert_eq!(d.changes[0].node, "n2", "the cheaper node failed: {d:?}");
    // Recovered, but inside the back-off: still not chosen.
    n.state = MigNodeState::Success;
    let d = decide_mig(
        std::slice::from_ref(&n),
        &pods,
        &[],
        &mut mem,
        20 * 60 * S,
        &cfg,
    );
    assert!(d.changes.is_empty(), "{d:?}");
    assert_eq!(d.unserved.len(), 1);
    // After the back-off it is chosen again.
    let d = decide_mig(&[n], &pods, &[], &mut mem, 40 * 60 * S, &cfg);
    assert_eq!(d.changes[0].node, "n1");
}

#[test]
fn a_node_is_not_changed_twice_inside_the_minimum_interval() {
    let n = node("n1", H100, 1.0, vec![seven_1g(0), seven_1g(0)]);
    let cfg = MigConfig::default();
    let mut mem = MigMemory::default();
    let d = decide_mig(
        std::slice::from_ref(&n),
        &[pod("ns/a", 0, "7g.80gb")],
        &[],
        &mut mem,
        20 * S,
        &cfg,
    );
    assert_eq!(d.changes.len(), 1);
    let d = decide_mig(
        std::slice::from_ref(&n),
        &[pod("ns/b", 100 * S, "7g.80gb")],
        &[],
        &mut mem,
        200 * S,
        &cfg,
    );
    assert!(d.changes.is_empty(), "{d:?}");
    // The label's own change time counts too (a restarted controller has no memory).
    let mut labelled = n.clone();
    labelled.changed_at = Some(150 * S);
    let d = decide_mig(
        &[labelled],
        &[pod("ns/b", 100 * S, "7g.80gb")],
        &[],
        &mut MigMemory::default(),
        200 * S,
        &cfg,
    );
    assert!(d.changes.is_empty(), "{d:?}");
    let d = decide_mig(
        &[n],
        &[pod("ns/b", 100 * S, "7g.80gb")],
        &[],
        &mut mem,
        20 * S + 10 * 60 * S,
        &cfg,
    );
    assert_eq!(d.changes.len(), 1);
}

#[test]
fn ampere_stays_in_its_mig_mode_hopper_may_enable_it() {
    let off = MigGpu {
        mig_enabled: false,
        busy: false,
        instances: vec![],
    };
    let a = node("a100", A100, 1.0, vec![off.clone()]);

    let h = node("h100", H100, 2.0, vec![off.clone()]);
    let pods = vec![pod("ns/a", 0, "3g.40gb")];
    let d = decide_mig(
        &[a.clone(), h],
        &pods,
        &[],
        &mut MigMemory::default(),
        20 * S,
        &MigConfig::default(),
    );
    assert_eq!(d.changes.len(), 1);
    assert_eq!(d.changes[0].node, "h100", "{d:?}");
    // An Ampere GPU already in MIG mode is re-partitioned.
    let a_mig = node("a100", A100, 1.0, vec![seven_1g(1)]);
    let d = decide_mig(
        &[a_mig],
        &pods,
        &[],
        &mut MigMemory::default(),
        20 * S,
        &MigConfig::default(),
    );
    assert_eq!(d.changes[0].node, "a100");
}

#[test]
fn a_busy_whole_gpu_is_never_touched() {
    let busy = MigGpu {
        mig_enabled: false,
        busy: true,
        instances: vec![],
    };
    let n = node("n1", H100, 1.0, vec![busy]);
    let d = decide_mig(
        &[n],
        &[pod("ns/a", 0, "1g.10gb")],
        &[],
        &mut MigMemory::default(),
        20 * S,
        &MigConfig::default(),
    );
    assert!(d.changes.is_empty());
    assert_eq!(d.unserved.len(), 1);
    assert!(d.unserved[0].1.contains("1x 1g.10gb"), "{:?}", d.unserved);
}

#[test]
fn cheaper_nodes_first() {
    let dear = node("a-dear", H100, 9.0, vec![seven_1g(0)]);
    let cheap = node("b-cheap", H100, 3.0, vec![seven_1g(0)]);
    let d = decide_mig(
        &[dear, cheap],
        &[pod("ns/a", 0, "4g.40gb")],
        &[],
        &mut MigMemory::default(),
        20 * S,
        &MigConfig::default(),
    );
    assert_eq!(d.changes.len(), 1);
    assert_eq!(d.changes[0].node, "b-cheap");
}

#[test]
fn without_free_capacity_a_node_is_bought_with_the_right_layout() {
    let full = node("n1", H100, 1.0, vec![seven_1g(7)]);
    let pools = vec![
        MigPool {
            name: "default/h100-dear".into(),
            model: H100.into(),
            gpus: 2,
            price_per_hour: 30.0,
            room: 5,
            default_config: None,
            cpu_milli: u64::MAX,
            memory_mib: u64::MAX,
        },
        MigPool {
            name: "default/h100".into(),
            model: H100.into(),
            gpus: 2,
            price_per_hour: 20.0,
            room: 5,
            default_config: Some((
                "all-1g.10gb".into(),
                vec![BTreeMap::from([("1g.10gb".to_string(), 7)]); 2],
            )),
            cpu_milli: u64::MAX,
            memory_mib: u64::MAX,
        },
    ];
    let pods = vec![
        pod("ns/a", 0, "3g.40gb"),
        pod("ns/b", 0, "3g.40gb"),
        pod("ns/c", 0, "3g.40gb"),
    ];
    let d = decide_mig(
        &[full],
        &pods,
        &pools,
        &mut MigMemory::default(),
        20 * S,
        &MigConfig::default(),
    );
    assert!(d.changes.is_empty(), "{d:?}");
    assert_eq!(d.scale_ups.len(), 1, "{d:?}");
    let su = &d.scale_ups[0];
    assert_eq!(su.pool, "default/h100");
    assert_eq!(su.nodes, 1, "three 3g fit one node of two GPUs: {su:?}");
    assert_ne!(
        su.config_name, "all-1g.10gb",
        "the default cannot serve 3g.40gb"
    );
    let threes: u32 = su.layout.iter().filter_map(|g| g.get("3g.40gb")).sum();
    assert!(threes >= 3, "{su:?}");
    // Demand the default serves: the new node comes up with the default config.
    let d = decide_mig(
        &[node("n1", H100, 1.0, vec![seven_1g(7)])],
        &[pod("ns/a", 0, "1g.10gb")],
        &pools,
        &mut MigMemory::default(),
        20 * S,
        &MigConfig::default(),
    );
    assert_eq!(d.scale_ups[0].config_name, "all-1g.10gb");
}

/// xorshift64*, for reproducible random clusters.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

const PROFILES: [&str; 6] = [
    "1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb",
];

/// A random valid layout on one H100, some instances busy.
fn random_gpu(rng: &mut Rng) -> MigGpu {
    let model = model_of(H100).unwrap();
    if rng.below(8) == 0 {
        return MigGpu {
            mig_enabled: false,
            busy: rng.below(2) == 0,
            instances: vec![],
        };
    }
    let mut wanted = BTreeMap::new();
    for _ in 0..rng.below(6) {
        let p = PROFILES[rng.below(PROFILES.len() as u64) as usize];
        let mut w = wanted.clone();
        *w.entry(p.to_string()).or_insert(0) += 1;
        if planner::check(model, &w).is_ok() {
            wanted = w;
        }
    }
    let layout = planner::check(model, &wanted).unwrap_or_default();
    MigGpu {
        mig_enabled: true,
        busy: false,
        instances: layout
            .instances
            .iter()
            .map(|i| inst(&i.profile, i.start, rng.below(2) == 0))
            .collect(),
    }
}

/// Applies a change the way the agent would: the plan's target per changed GPU, busy flags
/// carried over to the kept instances.
fn apply(n: &mut MigNode, c: &MigChange, now: Millis) {
    for (gi, plan) in &c.plans {
        let g = &mut n.gpus[*gi as usize];
        let busy: Vec<(String, u32)> = g
            .instances
            .iter()
            .filter(|i| i.busy)
            .map(|i| (i.profile.clone(), i.start))
            .collect();
        g.mig_enabled = true;
        g.instances = plan
            .target
            .instances
            .iter()
            .map(|t| {
                inst(
                    &t.profile,
                    t.start,
                    busy.contains(&(t.profile.clone(), t.start)),
                )
            })
            .collect();
    }
    n.config = c.config_name.clone();
    n.changed_at = Some(now);
}

#[test]
fn property_random_clusters_never_lose_a_busy_instance_nor_change_a_node_twice_in_the_window() {
    let cfg = MigConfig::default();
    let window = ms(cfg.min_interval);
    for seed in 1..=40u64 {
        let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
        let mut nodes: Vec<MigNode> = (0..(2 + rng.below(6)))
            .map(|i| {
                let gpus = (0..(1 + rng.below(4)))
                    .map(|_| random_gpu(&mut rng))
                    .collect();
                node(&format!("n{i}"), H100, (1 + rng.below(5)) as f64, gpus)
            })
            .collect();
        let mut mem = MigMemory::default();
        let mut now: Millis = 0;
        let mut changed: BTreeMap<String, Millis> = BTreeMap::new();
        let mut k = 0;
        for _round in 0..25 {
            now += rng.below(8 * 60) * S;
            let pods: Vec<MigPod> = (0..rng.below(6))
                .map(|_| {
                    k += 1;
                    pod(
                        &format!("ns/p{k}"),
                        now.saturating_sub(rng.below(120) * S),
                        PROFILES[rng.below(PROFILES.len() as u64) as usize],
                    )
                })
                .collect();
            // Some nodes fail and recover at random; busy flags flip on free instances.
            for n in &mut nodes {
                n.state = match rng.below(10) {
                    0 => MigNodeState::Failed,
                    1 => MigNodeState::Pending,
                    _ => MigNodeState::Success,
                };
                for g in &mut n.gpus {
                    for i in &mut g.instances {
                        if rng.below(5) == 0 {
                            i.busy = !i.busy;
                        }
                    }
                }
            }
            let before = nodes.clone();
            let d = decide_mig(&nodes, &pods, &[], &mut mem, now, &cfg);
            for c in &d.changes {
                let n = before.iter().find(|n| n.name == c.node).unwrap();
                assert_eq!(n.state, MigNodeState::Success, "seed {seed}: {c:?}");
                busy_kept(n, c);
                // A MIG-off GPU with work, and any GPU of a node not changed, is untouched.
                for (gi, _) in &c.plans {
                    assert!(
                        !n.gpus[*gi as usize].busy,
                        "seed {seed}: busy whole GPU changed"
                    );
                }
                assert!(!c.pods.is_empty());
                if let Some(prev) = changed.get(&c.node) {
                    assert!(
                        now - prev >= window,
                        "seed {seed}: node {} changed at {prev} and again at {now}",
                        c.node
                    );
                }
                changed.insert(c.node.clone(), now);
                let target = nodes.iter_mut().find(|n| n.name == c.node).unwrap();
                apply(target, c, now);
            }
        }
    }
}

#[test]
fn a_free_slice_on_a_node_without_cpu_room_does_not_count() {
    let mut full = node("full", H100, 1.0, vec![seven_1g(1)]);
    full.cpu_free_milli = 1000;
    let roomy = node("roomy", H100, 2.0, vec![seven_1g(7), seven_1g(0)]);
    let mut p = pod("ns/a", 0, "1g.10gb");
    p.cpu_milli = 4000;
    let d = decide_mig(
        &[full.clone(), roomy],
        std::slice::from_ref(&p),
        &[],
        &mut MigMemory::default(),
        20 * S,
        &MigConfig::default(),
    );
    // The roomy node offers a free 1g: served there.
    assert_eq!(d.served_by_free, vec!["ns/a".to_string()]);
    let d = decide_mig(
        &[full],
        &[p],
        &[],
        &mut MigMemory::default(),
        20 * S,
        &MigConfig::default(),
    );
    assert!(d.served_by_free.is_empty() && d.changes.is_empty(), "{d:?}");
    assert_eq!(d.unserved.len(), 1);
}
