//! What `gpuops sim show` and `gpuops sim fleets` print.

use crate::{BUILTIN_FLEETS, Fleet, SimError, SimState};
use gpuops_render::table;

/// The simulated node: one row per GPU with its MIG instances, load and processes.
pub fn show(s: &SimState) -> String {
    let mut t = table(&[
        "GPU",
        "MODEL",
        "UUID",
        "STATE",
        "MIG",
        "INSTANCES",
        "UTIL",
        "MEM USED",
        "POWER",
        "PROCS",
    ]);
    for g in &s.gpus {
        let instances: Vec<String> = g
            .gpu_instances
            .iter()
            .map(|gi| {
                format!(
                    "gi{}@{}+{}({} ci)",
                    gi.id,
                    gi.start,
                    gi.size,
                    gi.compute_instances.len()
                )
            })
            .collect();
        t.add_row(vec![
            g.index.to_string(),
            g.model.clone(),
            g.uuid.clone(),
            if g.lost { "LOST" } else { "ok" }.to_string(),
            if g.mig_current { "on" } else { "off" }.to_string(),
            instances.join(" "),
            format!("{}%", g.load.gpu_util_pct),
            format!("{} MiB", g.memory_used_mib()),
            format!("{} W", g.load.power_mw / 1000),
            g.processes.len().to_string(),
        ]);
    }
    format!(
        "node {}  driver {}{}  events queued {}\n{t}\n",
        s.hostname,
        s.driver_version,
        if s.driver_hung {
            " (HUNG: every NVML call blocks)"
        } else {
            ""
        },
        s.events.len()
    )
}

/// The built-in fleets with their GPUs, then the fleet-file format.
pub fn fleets() -> Result<String, SimError> {
    let mut t = table(&["FLEET", "GPUS"]);
    for (name, _) in BUILTIN_FLEETS {
        let s = SimState::from_fleet(&Fleet::resolve(name)?, 0)?;
        t.add_row(vec![name.to_string(), s.summary()]);
    }
    Ok(format!("{t}\n\n{}\n", crate::fleet::FORMAT_HELP))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summaries_group_models() {
        let s = SimState::from_fleet(&Fleet::resolve("dgx-h100").unwrap(), 0).unwrap();
        assert_eq!(s.summary(), "8x H100-SXM5-80GB");
        let text = show(&s);
        assert!(
            text.contains("events queued 0") && text.contains("H100-SXM5-80GB"),
            "{text}"
        );
        assert!(fleets().unwrap().contains("dgx-h100"));
    }
}
