//! The replay figures of docs/autoscaling-replay.md in an optimised build without the whole
//! `gpuops` binary: `cargo run --release -p gpuops-replay --example figures -- PODS POOLS
//! [SVG]` prints the same table and CSV as `gpuops simulate autoscale` (the same library call).
#![allow(clippy::print_stdout, clippy::print_stderr)]

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.len() < 2 {
        eprintln!("usage: figures PODS.csv POOLS.yaml [OUT.svg]");
        std::process::exit(2);
    }
    let read = |p: &str| {
        std::fs::read_to_string(p).unwrap_or_else(|e| {
            eprintln!("{p}: {e}");
            std::process::exit(1)
        })
    };
    let pools = gpuops_replay::parse_pools(&args[1], &read(&args[1])).unwrap_or_else(|e| {
        eprintln!("{e}");
        std::process::exit(1)
    });
    let trace = gpuops_replay::parse_timed_pods(&args[0], &read(&args[0])).unwrap_or_else(|e| {
        eprintln!("{e}");
        std::process::exit(1)
    });
    let started = std::time::Instant::now();
    let r = gpuops_replay::replay(
        &pools,
        &trace,
        &gpuops_replay::ReplayOptions::default(),
        &mut |p| {
            if p.done {
                eprintln!(
                    "{} done after {:.1}s",
                    p.policy.name(),
                    started.elapsed().as_secs_f64()
                );
            }
        },
    );
    if let Some(svg) = args.get(2)
        && let Err(e) = std::fs::write(svg, gpuops_replay::report::svg(&r))
    {
        eprintln!("{svg}: {e}");
        std::process::exit(1);
    }
    print!("{}", gpuops_replay::report::table(&r));
    print!("\n{}", gpuops_replay::report::csv(&r));
}
