//! `cargo bench -p gpuops-packing --bench simulate`: simulator speed on the openb default trace.
//!
//! Targets: one run (default trace, 130% load, one policy) under 2 s; all seven policies x 10
//! seeds under 2 minutes. Traces: `$GPUOPS_TRACES_DIR` (the directory holding `openb/`), else
//! `/work/shared/traces`.

use gpuops_packing::{
    Cluster, PodReq, PolicyKind, SimConfig, read_nodes_file, read_pods_file, report, simulate,
    simulate::run_one, workload,
};
use std::path::PathBuf;
use std::time::Instant;

fn main() {
    let base = std::env::var("GPUOPS_TRACES_DIR")
        .map_or_else(|_| PathBuf::from("/work/shared/traces"), PathBuf::from);
    let dir = base.join("openb");
    let (nodes, pods) = match (
        read_nodes_file(&dir.join("openb_node_list_gpu_node.csv")),
        read_pods_file(&dir.join("openb_pod_list_default.csv")),
    ) {
        (Ok(n), Ok(p)) => (n, p),
        (Err(e), _) | (_, Err(e)) => {
            eprintln!("cannot load traces (set GPUOPS_TRACES_DIR): {e}");
            std::process::exit(1);
        }
    };
    let Ok(cluster) = Cluster::new(&nodes) else {
        eprintln!("bad node list");
        std::process::exit(1);
    };
    let requests: Vec<PodReq> = pods.iter().map(|p| cluster.resolve(p)).collect();
    let order = workload(&pods, cluster.gpu_capacity_milli(), 1.3, 42);
    for kind in PolicyKind::ALL {
        let start = Instant::now();
        let policy = kind.build(&cluster, &pods);
        let r = run_one(
            &cluster,
            &requests,
            &order,
            policy,
            kind,
            42,
            1.3,
            &mut |_, _| {},
        );
        let secs = start.elapsed().as_secs_f64();
        match r {
            Ok(r) => println!(
                "one run, default trace, 130% load, seed 42, {kind:<13}: {secs:6.3} s ({} pods, {:.2}% unallocated){}",
                r.pods_arrived,
                r.unallocated_pct,
                if secs < 2.0 {
                    ""
                } else {
                    "  [over the 2 s target]"
                }
            ),
            Err(e) => eprintln!("{kind}: {e}"),
        }
    }
    let cfg = SimConfig::default();
    let start = Instant::now();
    match simulate(&nodes, &pods, &cfg, &mut |_| {}) {
        Ok(sim) => {
            let secs = start.elapsed().as_secs_f64();
            println!(
                "all {} policies x {} seeds ({} threads): {secs:.1} s{}",
                cfg.policies.len(),
                cfg.seeds.len(),
                std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get),
                if secs < 120.0 {
                    ""
                } else {
                    "  [over the 2 min target]"
                }
            );
            print!("{}", report::table(&sim));
        }
        Err(e) => eprintln!("simulation failed: {e}"),
    }
}
