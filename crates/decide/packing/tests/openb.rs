//! Reproduces the FGD paper's default-trace results for every baseline (10 seeds, 130% load) and
//! checks that our policy beats FGD on every seed of the default trace and on the mean of every
//! other openb trace.
//!
//! Traces: `$GPUOPS_TRACES_DIR`, else `/work/shared/traces`, else `<workspace>/../shared/traces`
//! (the directory that holds `openb/`).

#[cfg(test)]
mod openb {
    use gpuops_packing::{
        PolicyKind, SimConfig, Simulation, read_nodes_file, read_pods_file, simulate,
    };
    use std::path::PathBuf;

    fn traces_dir() -> PathBuf {
        let mut candidates = Vec::new();
        if let Ok(d) = std::env::var("GPUOPS_TRACES_DIR") {
            candidates.push(PathBuf::from(d));
        }
        candidates.push(PathBuf::from("/work/shared/traces"));
        candidates
            .push(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../../shared/traces"));
        for c in &candidates {
            if c.join("openb/openb_node_list_gpu_node.csv").is_file() {
                return c.join("openb");
            }
        }
        panic!(
            "openb traces not found (looked in {candidates:?}); set GPUOPS_TRACES_DIR to the directory containing openb/"
        );
    }

    fn run(trace: &str, policies: &[PolicyKind]) -> Simulation {
        let dir = traces_dir();
        let nodes = read_nodes_file(&dir.join("openb_node_list_gpu_node.csv")).unwrap();
        let pods = read_pods_file(&dir.join(format!("openb_pod_list_{trace}.csv"))).unwrap();
        let cfg = SimConfig {
            policies: policies.to_vec(),
            seeds: (42..52).collect(),
            load: 1.3,
            threads: 0,
        };
        simulate(&nodes, &pods, &cfg, &mut |_| {}).unwrap()
    }

    /// Published means (GPU allocation % at 130% arrived, 10 seeds) on the default trace.
    const PUBLISHED: [(PolicyKind, f64); 6] = [
        (PolicyKind::Random, 87.47),
        (PolicyKind::DotProd, 90.85),
        (PolicyKind::GpuClustering, 91.88),
        (PolicyKind::GpuPacking, 92.00),
        (PolicyKind::BestFit, 93.08),
        (PolicyKind::Fgd, 95.39),
    ];

    #[test]
    fn default_trace_baselines_match_paper_and_ours_beats_fgd_per_seed() {
        let sim = run("default", &PolicyKind::ALL);
        let mut report = String::new();
        for (p, published) in PUBLISHED {
            let got = sim.summary(p).unwrap().mean_allocation_pct;
            report.push_str(&format!("{p}: {got:.2} (published {published:.2})\n"));
            assert!(
                (got - published).abs() <= 1.0,
                "{p} allocation {got:.2} not within 1 point of published {published:.2}\n{report}"
            );
        }
        let fgd = sim.summary(PolicyKind::Fgd).unwrap();
        let ours = sim.summary(PolicyKind::Ours).unwrap();
        for ((seed, f), (_, o)) in fgd.per_seed.iter().zip(&ours.per_seed) {
            assert!(
                o < f,
                "seed {seed}: ours {o:.2}% unallocated vs FGD {f:.2}%"
            );
        }
        assert!(ours.mean_unallocated_pct < fgd.mean_unallocated_pct);
        eprintln!(
            "{report}ours {:.2}% unallocated vs FGD {:.2}%",
            ours.mean_unallocated_pct, fgd.mean_unallocated_pct
        );
    }

    #[test]
    fn ours_at_least_as_good_as_fgd_on_every_other_trace() {
        for trace in [
            "gpushare40",
            "gpushare60",
            "multigpu20",
            "gpuspec10",
            "cpu050",
        ] {
            let sim = run(trace, &[PolicyKind::Fgd, PolicyKind::Ours]);
            let f = sim.summary(PolicyKind::Fgd).unwrap().mean_unallocated_pct;
            let o = sim.summary(PolicyKind::Ours).unwrap().mean_unallocated_pct;
            eprintln!("{trace}: FGD {f:.2}% vs ours {o:.2}% unallocated");
            assert!(o <= f, "{trace}: ours {o:.2}% unallocated vs FGD {f:.2}%");
        }
    }
}
