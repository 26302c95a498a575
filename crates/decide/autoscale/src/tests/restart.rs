//! A restart or failover decides as the replica it replaces would have: each test runs the same
//! passes on one replica, on one killed after a pass and replaced by another that reads what the
//! first published (the status ConfigMap's JSON), and on one replaced by a replica with no
//! memory, which must decide differently (so the test can fail).

use super::*;
use crate::memory::{self, MAX_SEEN, Remembered};
use crate::mig_demand::{
    MigConfig, MigGpu, MigInstance, MigMemory, MigNode, MigNodeState, MigPod, decide_mig,
};
use crate::status::{self, Status};
use std::collections::HashMap;

/// One controller replica: the memory the runtime keeps between passes and what it published.
#[derive(Default)]
struct Replica {
    state: State,
    seen: HashMap<String, Millis>,
    mig: MigMemory,
    published: Option<Status>,
}

impl Replica {
    /// One pass as the controller runs it: batch-window times, the decision, the status.
    fn pass(&mut self, snap: &Snapshot, now: Millis, c: &Config) -> Decision {
        let mut snap = snap.clone();
        memory::first_seen(&mut snap.pending, &mut self.seen, now);
        let d = decide(&snap, &mut self.state, now, c);
        let mut st = status::build(&snap, &[], &d, now, "one", self.published.as_ref());
        st.memory = Some(Remembered::of(&self.state, &self.seen, Some(&self.mig)));
        self.published = Some(st);
        d
    }

    /// The replica that takes the Lease when this one dies: it has only what this one wrote
    /// into the status ConfigMap, as text.
    fn failover(&self) -> Replica {
        let text = serde_json::to_string_pretty(self.published.as_ref().unwrap()).unwrap();
        let st: Status = serde_json::from_str(&text).unwrap();
        let r = st
            .memory
            .clone()
            .unwrap()
            .restore(crate::status::explained(&st.pending));
        Replica {
            state: r.state,
            seen: r.seen,
            mig: r.mig,
            published: Some(st),
        }
    }
}

/// Runs `passes` (snapshot, time) on one replica; the same with the replica killed after
/// pass `kill` and replaced by its failover; and replaced by a replica with no memory.
/// Returns the last decision of each.
fn three_runs(
    passes: &[(Snapshot, Millis)],
    kill: usize,
    c: &Config,
) -> (Decision, Decision, Decision) {
    let run = |replace: &dyn Fn(&Replica) -> Replica| {
        let mut r = Replica::default();
        let mut last = Decision::default();
        for (i, (snap, now)) in passes.iter().enumerate() {
            last = r.pass(snap, *now, c);
            if i == kill {
                r = replace(&r);
            }
        }
        last
    };
    (
        run(&|r| Replica {
            state: r.state.clone(),
            seen: r.seen.clone(),
            mig: r.mig.clone(),
            published: r.published.clone(),
        }),
        run(&Replica::failover),
        run(&|_| Replica::default()),
    )
}

/// Pods created in the second starting at 100 s (the API server's timestamp), seen 100 ms into
/// it.
fn burst() -> Snapshot {
    let mut snap = Snapshot {
        pools: vec![gpu_pool("h100", 10, 8, 30.0, 0)],
        ..Snapshot::default()
    };
    for i in 0..3 {
        let mut p = gpu_pod(&format!("a/p{i}"), 4);
        p.created = 100 * S;
        snap.pending.push(p);
    }
    snap
}

#[test]
fn a_batch_window_in_progress_closes_when_it_would_have_without_the_restart() {
    let c = Config {
        batch_idle: Duration::from_secs(1),
        batch_max: Duration::from_secs(10),
        ..Config::default()
    };
    let snap = burst();
    // Seen at 100.1 s, killed; the window closes 1 s after the newest sighting, at 101.1 s.
    let passes = [(snap.clone(), 100 * S + 100), (snap, 101 * S + 150)];
    let (kept, failed_over, forgot) = three_runs(&passes, 0, &c);
    assert_eq!(launched(&kept), 2, "12 GPUs on 8-GPU nodes: {kept:?}");
    assert_eq!(failed_over, kept);
    // Without the sightings the pods count from the end of their timestamp's second: the
    // window stays open until 101.999 s.
    assert!(forgot.scale_ups.is_empty(), "{forgot:?}");
    assert_eq!(forgot.batch_closes_in, Some(Duration::from_millis(849)));
}

#[test]
fn killed_right_after_the_scale_up_the_next_leader_buys_nothing_more_nor_explains_again() {
    let c = cfg();
    let mut snap = burst();
    let mut r = Replica::default();
    let d = r.pass(&snap, 100 * S + 100, &c);
    assert_eq!(launched(&d), 2);
    apply(&mut snap, &d);
    // The pods now wait for the nodes in flight: a new explanation each, then the kill.
    let waiting = r.pass(&snap, 100 * S + 200, &c);
    assert_eq!(waiting.events.len(), 3, "{:?}", waiting.events);
    let mut next = r.failover();
    let after = next.pass(&snap, 100 * S + 600, &c);
    assert!(after.scale_ups.is_empty(), "{after:?}");
    assert!(
        after.events.is_empty(),
        "explained again: {:?}",
        after.events
    );
    assert_eq!(after, r.pass(&snap, 100 * S + 600, &c));
    let forgot = Replica::default().pass(&snap, 100 * S + 600, &c);
    assert!(forgot.scale_ups.is_empty(), "{forgot:?}");
    assert_eq!(forgot.events.len(), 3, "{:?}", forgot.events);
}

#[test]
fn a_pool_backed_off_stays_backed_off_after_its_machine_is_gone() {
    let flaky_machine = Machine {
        name: "capi/flaky-1".into(),
        pool: "capi/flaky".into(),
        node: Some("f1".into()),
        stage: Stage::Devices,
        stage_since: 0,
        failed: false,
    };
    let mut before = Snapshot {
        pools: vec![
            gpu_pool("flaky", 5, 8, 1.0, 1),
            gpu_pool("solid", 5, 8, 2.0, 0),
        ],
        machines: vec![flaky_machine],
        ..Snapshot::default()
    };
    let now = 11 * 60 * S;
    // The timed-out machine removed, its replica taken back; a pod arrives.
    let mut after = before.clone();
    after.machines.clear();
    after.pools[0].replicas = 0;
    after.pending = vec![gpu_pod("a/p", 8)];
    before.pending = after.pending.clone();
    let passes = [(before, now), (after, now + 60 * S)];
    let (kept, failed_over, forgot) = three_runs(&passes, 0, &cfg());
    assert_eq!(kept.scale_ups[0].pool, "capi/solid", "{kept:?}");
    assert_eq!(failed_over.scale_ups, kept.scale_ups);
    assert_eq!(
        forgot.scale_ups[0].pool, "capi/flaky",
        "without the back-off the failing pool is bought from again"
    );
}

#[test]
fn a_machine_still_timed_out_after_the_restart_backs_its_pool_off_once() {
    let snap = Snapshot {
        pools: vec![gpu_pool("flaky", 5, 8, 1.0, 1)],
        machines: vec![Machine {
            name: "capi/flaky-1".into(),
            pool: "capi/flaky".into(),
            node: None,
            stage: Stage::Provisioning,
            stage_since: 0,
            failed: true,
        }],
        ..Snapshot::default()
    };
    let mut r = Replica::default();
    r.pass(&snap, 60 * S, &cfg());
    let mut next = r.failover();
    next.pass(&snap, 61 * S, &cfg());
    r.pass(&snap, 61 * S, &cfg());
    assert_eq!(next.state.backoff, r.state.backoff);
    assert_eq!(next.state.backoff["capi/flaky"].failures, 1);
    let mut forgot = Replica {
        state: State {
            backoff: r.state.backoff.clone(),
            ..State::default()
        },
        ..Replica::default()
    };
    forgot.pass(&snap, 61 * S, &cfg());
    assert_eq!(forgot.state.backoff["capi/flaky"].failures, 2);
}

#[test]
fn an_idle_node_goes_when_it_would_have_without_the_restart() {
    let snap = idle_cluster();
    let passes = [
        (snap.clone(), 0),
        (snap.clone(), 5 * 60 * S),
        (snap, 10 * 60 * S),
    ];
    let (kept, failed_over, forgot) = three_runs(&passes, 1, &cfg());
    assert_eq!(kept.removals.len(), 1, "{kept:?}");
    assert_eq!(failed_over.removals, kept.removals);
    assert!(forgot.removals.is_empty(), "the idle time starts over");
}

fn mig_node(state: MigNodeState) -> MigNode {
    MigNode {
        name: "n1".into(),
        pool: Some("default/mig".into()),
        model: "H100-SXM5-80GB".into(),
        price_per_hour: 1.0,
        config: "all-1g.10gb".into(),
        state,
        changed_at: None,
        unschedulable: false,
        in_flight: false,
        gpus: vec![MigGpu {
            mig_enabled: true,
            busy: false,
            instances: (0..7)
                .map(|start| MigInstance {
                    profile: "1g.10gb".into(),
                    start,
                    busy: false,
                })
                .collect(),
        }],
        cpu_free_milli: u64::MAX,
        memory_free_mib: u64::MAX,
    }
}

#[test]
fn a_mig_node_that_recovered_from_a_failure_stays_backed_off_after_the_restart() {
    let cfg = MigConfig::default();
    let pods = vec![MigPod {
        key: "ns/a".into(),
        created: 0,
        profile: "7g.80gb".into(),
        count: 1,
        cpu_milli: 0,
        memory_mib: 0,
    }];
    let mut r = Replica::default();
    decide_mig(
        &[mig_node(MigNodeState::Failed)],
        &pods,
        &[],
        &mut r.mig,
        20 * S,
        &cfg,
    );
    r.pass(&Snapshot::default(), 20 * S, &Config::default());
    let recovered = [mig_node(MigNodeState::Success)];
    let now = 20 * 60 * S;
    let mut next = r.failover();
    let d = decide_mig(&recovered, &pods, &[], &mut next.mig, now, &cfg);
    let kept = decide_mig(&recovered, &pods, &[], &mut r.mig, now, &cfg);
    assert!(kept.changes.is_empty(), "inside the back-off: {kept:?}");
    assert_eq!(d, kept);
    let forgot = decide_mig(&recovered, &pods, &[], &mut MigMemory::default(), now, &cfg);
    assert_eq!(forgot.changes.len(), 1, "{forgot:?}");
}

#[test]
fn the_memory_kept_is_bounded_to_the_newest_sightings_and_the_oldest() {
    let seen: HashMap<String, Millis> = (0..MAX_SEEN as u64 + 500)
        .map(|i| (format!("a/p{i}"), 1_000 + i))
        .collect();
    let m = Remembered::of(&State::default(), &seen, None);
    assert_eq!(m.first_seen.len(), MAX_SEEN);
    assert_eq!(m.first_seen.get("a/p0"), Some(&1_000), "the oldest");
    assert!(!m.first_seen.contains_key("a/p1"));
    assert!(!m.first_seen.contains_key("a/p500"));
    assert!(m.first_seen.contains_key("a/p501"));
    let last = format!("a/p{}", MAX_SEEN + 499);
    assert!(m.first_seen.contains_key(&last));
    let few: HashMap<String, Millis> = seen.into_iter().take(10).collect();
    assert_eq!(
        Remembered::of(&State::default(), &few, None)
            .first_seen
            .len(),
        10
    );
}

#[test]
fn a_status_written_before_the_memory_existed_still_reads() {
    let st: Status = serde_json::from_str(
        r#"{"time":"2026-12-01T10:00:00Z","leader":"one","pools":[],"errors":[],
            "in_flight":[],"pending":[],"decisions":["x"]}"#,
    )
    .unwrap();
    assert_eq!(st.memory, None);
    let empty = serde_json::to_value(Remembered::default()).unwrap();
    assert_eq!(
        empty,
        serde_json::json!({}),
        "nothing written when nothing is kept"
    );
}
