//! `cargo bench -p gpuops-mig --bench plan`: times `plan_fleet` on ~1,000-GPU demand mixes.
//!
//! Target: 1,000 GPUs and a 10-profile demand mix planned in under 100 ms (release).

use gpuops_mig::workload::{Demand, FleetOffer, parse_demand, parse_fleet, plan_fleet};
use std::hint::black_box;
use std::time::Instant;

/// Ten MIG device kinds on an H100 80GB, about 1,100 GPUs' worth.
const MIX: &str = "1200x 1g.10gb, 100x 1g.10gb+me, 800x 1g.20gb, 700x 2g.20gb, 200x 1c.2g.20gb, \
                   500x 3g.40gb, 100x 1c.3g.40gb, 100x 2c.3g.40gb, 100x 4g.40gb, 50x 7g.80gb";

/// Memory-sized demand that maps differently on each model.
const MEMORY_MIX: &str = "1500x 9GB, 900x 15GiB, 600x 19GB, 300x 30GiB, 200x 40GB, 60x 70GiB";

fn bench(label: &str, demand: &Demand, fleet: &[FleetOffer], iterations: u32) {
    let plan = match plan_fleet(demand, fleet) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("{label}: planning failed: {e}");
            std::process::exit(1);
        }
    };
    let start = Instant::now();
    for _ in 0..iterations {
        let p = plan_fleet(black_box(demand), black_box(fleet));
        black_box(&p);
    }
    let per = start.elapsed().as_secs_f64() * 1000.0 / f64::from(iterations);
    let unmet: u32 = plan.unmet.iter().map(|u| u.1).sum();
    println!(
        "{label}: {per:.2} ms per plan (mean of {iterations}); {} GPUs, lower bound {}, {} layouts, {} units unmet{}",
        plan.gpus.len(),
        plan.lower_bound,
        plan.configs().len(),
        unmet,
        if plan.proven_optimal() {
            ", proven optimal"
        } else {
            ""
        }
    );
}

fn main() {
    let parse = || -> Result<_, String> {
        Ok((
            parse_demand(MIX).map_err(|e| e.to_string())?,
            parse_demand(MEMORY_MIX).map_err(|e| e.to_string())?,
            parse_fleet("H100-SXM5-80GB").map_err(|e| e.to_string())?,
            parse_fleet("600x H100-SXM5-80GB, A100-SXM4-80GB").map_err(|e| e.to_string())?,
            parse_fleet("500x H100-SXM5-80GB, H200").map_err(|e| e.to_string())?,
        ))
    };
    let (mix, memory_mix, h100, two, h100_h200) = match parse() {
        Ok(v) => v,
        Err(e) => {
            eprintln!("bad benchmark input: {e}");
            std::process::exit(1);
        }
    };
    let iterations = std::env::args()
        .skip(1)
        .find_map(|a| a.parse::<u32>().ok())
        .unwrap_or(50);
    bench("(a) 10-profile mix, H100 fleet", &mix, &h100, iterations);
    bench(
        "(b) 10-profile mix, 600x H100 + A100-80GB",
        &mix,
        &two,
        iterations,
    );
    bench(
        "(c) memory mix, 500x H100 + H200",
        &memory_mix,
        &h100_h200,
        iterations,
    );
}
