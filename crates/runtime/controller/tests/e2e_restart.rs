//! A leader killed mid-burst: two replicas of `gpuops controller` under one Lease on the test bed
//! (the real apiserver and scheduler, Cluster API and its test provider), the leader stopped at
//! one stage of the mixed burst, the other taking over with only what the cluster's objects
//! and the status ConfigMap say. The figures must be those of the run without the kill,
//! `a_mixed_burst_of_whole_mig_and_shared_pods_buys_the_fewest_nodes_that_fit` in
//! e2e_controller.rs: 2 nodes per kind, every pod running. (The third stage, a leader gone
//! while a node bought for an owed MIG layout boots, is
//! `with_no_mig_capacity_a_node_is_bought_with_a_generated_layout_and_labelled_at_boot` in
//! e2e_mig.rs.)
//!
//! Needs GPUOPS_K8S_BIN and `eval $(tests/k8s/build.sh capi)` (GPUOPS_CAPI_BIN); scripts/test sets
//! both and runs these with `--ignored`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use gpuops_testbed::scenario::{self, Outcome, Scenario};
use gpuops_testbed::{ClusterApi, PoolSpec};
use std::time::{Duration, Instant};

mod common;
use common::Controller;

/// When the leader is killed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    /// Pods wait for the scale-up batch window, nothing bought yet.
    InsideTheBatchWindow,
    /// A pool's replicas were raised (the others may be raised in the same pass or not yet).
    AfterTheScaleUp,
}

/// Both replicas' batch window: wide enough for the kill to land inside it on a loaded machine.
const BATCH_IDLE: Duration = Duration::from_secs(3);

fn replica(cluster: &gpuops_testbed::Cluster, identity: &str) -> Controller {
    Controller::start_with(cluster.kubeconfig(), identity, true, |c| {
        c.decision.batch_idle = BATCH_IDLE;
        c.decision.batch_max = Duration::from_secs(10);
    })
}

/// `kubectl` on the bed from another thread.
fn kubectl(kubeconfig: &std::path::Path, args: &[&str]) -> String {
    let out = std::process::Command::new(format!(
        "{}/kubectl",
        std::env::var("GPUOPS_K8S_BIN").unwrap()
    ))
    .arg("--kubeconfig")
    .arg(kubeconfig)
    .args(args)
    .output()
    .unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Replicas of every pool's MachineDeployment, summed.
fn replicas_bought(kubeconfig: &std::path::Path) -> u64 {
    kubectl(
        kubeconfig,
        &[
            "get",
            "machinedeployments.cluster.x-k8s.io",
            "-A",
            "-o",
            "jsonpath={.items[*].spec.replicas}",
        ],
    )
    .split_whitespace()
    .filter_map(|r| r.parse::<u64>().ok())
    .sum()
}

/// The status the leader published, parsed (`Null` before the first).
fn status(kubeconfig: &std::path::Path) -> serde_json::Value {
    let text = kubectl(
        kubeconfig,
        &[
            "get",
            "configmap",
            "gpuops-autoscaler-status",
            "-o",
            "jsonpath={.data.status\\.json}",
        ],
    );
    serde_json::from_str(&text).unwrap_or(serde_json::Value::Null)
}

/// Whether the stage has come: the leader's status shows pods waiting for the window with
/// nothing bought, or a pool's replicas raised.
fn reached(kubeconfig: &std::path::Path, stage: Stage) -> bool {
    match stage {
        Stage::InsideTheBatchWindow => {
            replicas_bought(kubeconfig) == 0
                && status(kubeconfig)["pending"]
                    .as_array()
                    .is_some_and(|p| p.iter().any(|p| p["plan"] == "waiting"))
        }
        Stage::AfterTheScaleUp => replicas_bought(kubeconfig) > 0,
    }
}

/// What the kill saw: whom it stopped and how many replicas were bought right after.
#[derive(Debug)]
struct Kill {
    leader: String,
    bought_after: u64,
    history_before: Vec<String>,
}

/// The mixed burst on a bed with its pools and two replicas, the leader killed at `stage`.
fn mixed_burst_with_the_leader_killed(
    stage: Stage,
) -> (Outcome, Kill, gpuops_testbed::Cluster, ClusterApi, Scenario) {
    let s = Scenario::mixed();
    let (cluster, capi) = common::bed_with(Some(s.bin_packing_profile()));
    for offer in &s.offers {
        let mut p = PoolSpec::from_offer(offer, Duration::from_secs(2), Duration::from_secs(6));
        p.max = 5;
        capi.add_pool(&p).unwrap();
    }
    let mut replicas = vec![
        Some(replica(&cluster, "one")),
        Some(replica(&cluster, "two")),
    ];
    let kubeconfig = cluster.kubeconfig();
    let killer = std::thread::spawn(move || {
        let deadline = Instant::now() + Duration::from_secs(120);
        while Instant::now() < deadline && !reached(&kubeconfig, stage) {
            std::thread::sleep(Duration::from_millis(50));
        }
        let leader = kubectl(
            &kubeconfig,
            &[
                "get",
                "lease",
                "gpuops-controller",
                "-o",
                "jsonpath={.spec.holderIdentity}",
            ],
        );
        let history_before: Vec<String> = status(&kubeconfig)["decisions"]
            .as_array()
            .map(|d| {
                d.iter()
                    .filter_map(|x| x.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default();
        eprintln!("{stage:?}: killing the leader {leader:?}");
        replicas[usize::from(leader == "two")].take();
        let bought_after = replicas_bought(&kubeconfig);
        (
            Kill {
                leader,
                bought_after,
                history_before,
            },
            replicas,
        )
    });
    let outcome = scenario::run(
        &cluster,
        &capi,
        &s,
        "default",
        Duration::from_secs(240),
        // Long enough for a second (wrong) scale-up after the devices appeared to show.
        Duration::from_secs(12),
    )
    .unwrap();
    let (kill, _survivor) = killer.join().unwrap();
    eprintln!("{}\n{}\n{kill:?}", Outcome::header(), outcome.row());
    assert!(
        outcome.all_running,
        "{outcome:?}\n{}",
        cluster
            .kubectl(&[
                "get",
                "machines.cluster.x-k8s.io,nodes,pods",
                "-A",
                "-o",
                "wide"
            ])
            .unwrap_or_default()
    );
    let st: serde_json::Value =
        serde_json::from_str(&common::status_json(&cluster).unwrap()).unwrap();
    assert_ne!(
        st["leader"],
        kill.leader.as_str(),
        "the survivor writes: {st}"
    );
    // The decision history went on: what the killed leader decided is still listed.
    let history: Vec<&str> = st["decisions"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|d| d.as_str())
        .collect();
    for d in &kill.history_before {
        assert!(history.contains(&d.as_str()), "{d:?} lost: {st}");
    }
    (outcome, kill, cluster, capi, s)
}

/// The figures of the run without the kill (e2e_controller.rs' mixed burst): the fewest nodes
/// per kind, 2 each.
fn assert_as_without_the_kill(outcome: &Outcome, capi: &ClusterApi, s: &Scenario) {
    assert_eq!(s.min_instances(), 6);
    assert_eq!(outcome.launched, 6, "{outcome:?}");
    for pool in ["gpu-h100-mig-1g", "gpu-l4-shared", "gpu-h100-8x"] {
        assert_eq!(capi.machines(pool).unwrap().len(), 2, "{pool}: {outcome:?}");
    }
}

#[test]
#[ignore = "needs the control plane and Cluster API (GPUOPS_K8S_BIN, GPUOPS_CAPI_BIN): run scripts/test"]
fn a_leader_killed_inside_the_batch_window_buys_what_an_unkilled_one_does() {
    let (outcome, kill, _cluster, capi, s) =
        mixed_burst_with_the_leader_killed(Stage::InsideTheBatchWindow);
    assert_eq!(
        kill.bought_after, 0,
        "the window closed before the kill: the test no longer covers it ({kill:?})"
    );
    assert_as_without_the_kill(&outcome, &capi, &s);
}

#[test]
#[ignore = "needs the control plane and Cluster API (GPUOPS_K8S_BIN, GPUOPS_CAPI_BIN): run scripts/test"]
fn a_leader_killed_right_after_its_scale_up_is_not_bought_for_twice() {
    let (outcome, kill, _cluster, capi, s) =
        mixed_burst_with_the_leader_killed(Stage::AfterTheScaleUp);
    assert!(kill.bought_after > 0, "{kill:?}");
    assert_as_without_the_kill(&outcome, &capi, &s);
}
