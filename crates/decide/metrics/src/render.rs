//! Renders one node's metrics: the DCGM families per GPU and MIG instance, then gpuops' own.

use crate::dcgm::{FIELDS, XID_ERRORS, XID_ERRORS_HELP};
use crate::pods::{PodMap, PodRef};
use crate::text::{Kind, Value, header, push_label, sample};
use crate::xids::XidCounters;
use gpuops_inventory::{Gpu, Health, Inventory, MigDevice};

/// How the node label is spelled: dcgm-exporter wrote `Hostname` until 4.6, `hostname` since
/// (what the GPU Operator ships now, so the default).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum HostnameLabel {
    Upper,
    #[default]
    Lower,
}

impl HostnameLabel {
    pub fn name(self) -> &'static str {
        match self {
            HostnameLabel::Upper => "Hostname",
            HostnameLabel::Lower => "hostname",
        }
    }
}

/// The agent's own figures, exported next to the GPUs'.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct AgentStats {
    /// How long the last collection took.
    pub collection_seconds: f64,
    pub collections: u64,
    pub nvml_errors: u64,
    pub pod_resources_errors: u64,
    /// Unix time of the last collection.
    pub last_collection_unix: f64,
    pub resident_memory_bytes: Option<u64>,
    pub cpu_seconds: Option<f64>,
}

/// Everything one render needs.
pub struct NodeView<'a> {
    pub inventory: &'a Inventory,
    pub hostname: &'a str,
    pub hostname_label: HostnameLabel,
    pub pods: &'a PodMap,
    pub xids: &'a XidCounters,
    /// The XID keeping a GPU (`None`) or MIG device (`Some((gi, ci))`) unhealthy, if any.
    pub unhealthy: &'a dyn Fn(u32, Option<(u32, u32)>) -> Option<u64>,
    /// GPUs this node has had since the agent started (a lost one still counts).
    pub capacity: u32,
    pub agent: AgentStats,
}

/// One series source: a whole GPU or one MIG instance, with its label text prepared once.
struct Entity<'a> {
    gpu: &'a Gpu,
    mig: Option<&'a MigDevice>,
    /// `gpu=…,UUID=…,…,DCGM_FI_DRIVER_VERSION=…`.
    labels: String,
    /// One `container=…,namespace=…,pod=…` per holder; one empty string when none.
    holders: Vec<String>,
}

fn entities<'a>(view: &NodeView<'a>) -> Vec<Entity<'a>> {
    let inv = view.inventory;
    let mut out = Vec::new();
    for gpu in inv.gpus.iter().filter(|g| !g.uuid.is_empty()) {
        let mut base = String::new();
        push_label(&mut base, "gpu", &gpu.index.to_string());
        push_label(&mut base, "UUID", &gpu.uuid);
        push_label(&mut base, "pci_bus_id", &gpu.pci_bus_id);
        let device = gpu
            .minor_number
            .map_or_else(|| format!("nvidia{}", gpu.index), |m| format!("nvidia{m}"));
        push_label(&mut base, "device", &device);
        push_label(&mut base, "modelName", &gpu.name);
        let finish = |mut labels: String| {
            push_label(&mut labels, view.hostname_label.name(), view.hostname);
            push_label(&mut labels, "DCGM_FI_DRIVER_VERSION", &inv.driver_version);
            labels
        };
        out.push(Entity {
            gpu,
            mig: None,
            labels: finish(base.clone()),
            holders: holders(view.pods.holders(&gpu.uuid)),
        });
        for m in &gpu.mig_devices {
            let mut labels = base.clone();
            push_label(&mut labels, "GPU_I_PROFILE", &m.profile);
            push_label(&mut labels, "GPU_I_ID", &m.gi_id.to_string());
            out.push(Entity {
                gpu,
                mig: Some(m),
                labels: finish(labels),
                holders: holders(view.pods.holders(&m.uuid)),
            });
        }
    }
    out
}

fn holders(pods: &[PodRef]) -> Vec<String> {
    if pods.is_empty() {
        return vec![String::new()];
    }
    pods.iter()
        .map(|p| {
            let mut s = String::new();
            push_label(&mut s, "container", &p.container);
            push_label(&mut s, "namespace", &p.namespace);
            push_label(&mut s, "pod", &p.pod);
            s
        })
        .collect()
}

/// Writes a family only when it has at least one sample.
fn family(
    out: &mut String,
    name: &str,
    kind: Kind,
    help: &str,
    samples: impl IntoIterator<Item = (Vec<String>, Value)>,
) {
    let mut header_written = false;
    for (labels, value) in samples {
        if !header_written {
            header(out, name, kind, help);
            header_written = true;
        }
        let parts: Vec<&str> = labels.iter().map(String::as_str).collect();
        sample(out, name, &parts, value);
    }
}

/// The whole exposition, except `gpuops_scrapes_total` (see [`render_scrapes`]).
pub fn render(view: &NodeView<'_>) -> String {
    let entities = entities(view);
    let mut out = String::with_capacity(64 * 1024);
    // Lost GPUs answer nothing: their last telemetry is not re-served as current.
    let answering = |e: &&Entity| e.gpu.health == Health::Healthy;
    for field in FIELDS {
        let samples = entities.iter().filter(answering).flat_map(|e| {
            let value = match e.mig {
                None => (field.gpu)(e.gpu),
                Some(m) => field.mig.and_then(|f| f(m)),
            };
            per_holder(e, value, &[])
        });
        family(&mut out, field.name, field.kind, field.help, samples);
        if field.name == "DCGM_FI_DEV_DEC_UTIL" {
            let samples = entities.iter().filter(|e| e.mig.is_none()).flat_map(|e| {
                let last = view.xids.last(e.gpu.index);
                let code = xid_labels(last);
                per_holder(e, Some(Value::Int(last)), &code)
            });
            family(&mut out, XID_ERRORS, Kind::Gauge, XID_ERRORS_HELP, samples);
        }
    }
    own_families(view, &entities, &mut out);
    out
}

/// `err_code`/`err_msg` of an XID series; none for "no XID yet".
fn xid_labels(xid: u64) -> Vec<String> {
    if xid == 0 {
        return Vec::new();
    }
    let mut s = String::new();
    push_label(&mut s, "err_code", &xid.to_string());
    push_label(
        &mut s,
        "err_msg",
        gpuops_catalog::xid::describe(xid).meaning,
    );
    vec![s]
}

/// The samples of one entity: one per holding container (or one without pod labels).
fn per_holder(e: &Entity<'_>, value: Option<Value>, extra: &[String]) -> Vec<(Vec<String>, Value)> {
    let Some(value) = value else {
        return Vec::new();
    };
    e.holders
        .iter()
        .map(|h| {
            let mut labels = vec![e.labels.clone(), h.clone()];
            labels.extend(extra.iter().cloned());
            (labels, value)
        })
        .collect()
}

fn own_families(view: &NodeView<'_>, entities: &[Entity<'_>], out: &mut String) {
    let xid_counts = entities.iter().flat_map(|e| {
        let gi = e.mig.map(|m| m.gi_id);
        view.xids
            .counts(e.gpu.index, gi)
            .flat_map(|(xid, n)| per_holder(e, Some(Value::Int(n)), &xid_labels(xid)))
            .collect::<Vec<_>>()
    });
    family(
        out,
        "gpuops_xid_errors_total",
        Kind::Counter,
        "XID errors seen since the agent started, per device and XID code (err_code, err_msg).",
        xid_counts,
    );
    let healthy = entities.iter().flat_map(|e| {
        let mig = e.mig.map(|m| (m.gi_id, m.ci_id));
        let ok = e.gpu.health == Health::Healthy && (view.unhealthy)(e.gpu.index, mig).is_none();
        per_holder(e, Some(Value::Int(u64::from(ok))), &[])
    });
    family(
        out,
        "gpuops_device_healthy",
        Kind::Gauge,
        "1 when the GPU or MIG device is healthy as the device plugin sees it (no recent fatal XID, not lost).",
        healthy,
    );
    let allocated = entities.iter().flat_map(|e| {
        let held = !e.holders[0].is_empty();
        per_holder(e, Some(Value::Int(u64::from(held))), &[])
    });
    family(
        out,
        "gpuops_device_allocated",
        Kind::Gauge,
        "1 when a pod holds the GPU or MIG device (pod labels name it), from the kubelet's PodResources API.",
        allocated,
    );
    let mut node = String::new();
    push_label(&mut node, view.hostname_label.name(), view.hostname);
    let node = vec![node];
    let healthy_gpus = view
        .inventory
        .gpus
        .iter()
        .filter(|g| g.health == Health::Healthy && (view.unhealthy)(g.index, None).is_none())
        .count();
    let scalar = |out: &mut String, name: &str, kind: Kind, help: &str, v: Option<Value>| {
        family(out, name, kind, help, v.map(|v| (node.clone(), v)));
    };
    scalar(
        out,
        "gpuops_node_gpus",
        Kind::Gauge,
        "GPUs this node has had since the agent started, lost ones included.",
        Some(Value::Int(u64::from(view.capacity))),
    );
    scalar(
        out,
        "gpuops_node_gpus_healthy",
        Kind::Gauge,
        "GPUs answering the driver with no recent fatal XID.",
        Some(Value::Int(healthy_gpus as u64)),
    );
    let a = view.agent;
    scalar(
        out,
        "gpuops_collection_duration_seconds",
        Kind::Gauge,
        "How long the last collection (NVML snapshot and PodResources) took.",
        Some(Value::Float(a.collection_seconds)),
    );
    scalar(
        out,
        "gpuops_collections_total",
        Kind::Counter,
        "Collections since the agent started.",
        Some(Value::Int(a.collections)),
    );
    let errors = [
        ("nvml", a.nvml_errors),
        ("podresources", a.pod_resources_errors),
    ]
    .into_iter()
    .map(|(source, n)| {
        let mut s = String::new();
        push_label(&mut s, "source", source);
        (vec![node[0].clone(), s], Value::Int(n))
    });
    family(
        out,
        "gpuops_collection_errors_total",
        Kind::Counter,
        "Collections that failed to read a source (the last good data stays served).",
        errors,
    );
    scalar(
        out,
        "gpuops_last_collection_timestamp_seconds",
        Kind::Gauge,
        "Unix time of the last collection.",
        Some(Value::Float(a.last_collection_unix)),
    );
    scalar(
        out,
        "process_resident_memory_bytes",
        Kind::Gauge,
        "Resident memory size in bytes.",
        a.resident_memory_bytes.map(Value::Int),
    );
    scalar(
        out,
        "process_cpu_seconds_total",
        Kind::Counter,
        "Total user and system CPU time spent in seconds.",
        a.cpu_seconds.map(Value::Float),
    );
}

/// The scrape counter, appended at serve time so the rest can be rendered ahead.
pub fn render_scrapes(hostname_label: HostnameLabel, hostname: &str, scrapes: u64) -> String {
    let mut out = String::new();
    let mut node = String::new();
    push_label(&mut node, hostname_label.name(), hostname);
    header(
        &mut out,
        "gpuops_scrapes_total",
        Kind::Counter,
        "Scrapes of this endpoint since the agent started.",
    );
    sample(
        &mut out,
        "gpuops_scrapes_total",
        &[&node],
        Value::Int(scrapes),
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pods::Assignment;
    use gpuops_inventory::{Memory, MigState, RemappedRows, Telemetry};

    fn h100(index: u32) -> Gpu {
        Gpu {
            index,
            uuid: format!("GPU-{index}"),
            name: "NVIDIA H100 80GB HBM3".into(),
            pci_bus_id: format!("00000000:{:02X}:00.0", 0x18 + index),
            minor_number: Some(index),
            memory: Memory {
                total_mib: 81559,
                used_mib: 1000,
                free_mib: 80000,
                reserved_mib: 559,
            },
            telemetry: Telemetry {
                gpu_utilization_pct: Some(37),
                memory_utilization_pct: Some(5),
                temperature_c: Some(31),
                power_mw: Some(71_234),
                energy_mj: Some(123_456_789),
                sm_clock_mhz: Some(1980),
                remapped_rows: Some(RemappedRows {
                    correctable: 0,
                    uncorrectable: 2,
                    pending: false,
                    failure: false,
                }),
                ..Telemetry::default()
            },
            ..Gpu::default()
        }
    }

    fn node() -> Inventory {
        let mut mig = h100(1);
        mig.mig = MigState {
            capable: true,
            current_enabled: true,
            pending_enabled: true,
        };
        mig.telemetry.gpu_utilization_pct = None;
        mig.mig_devices = vec![MigDevice {
            uuid: "MIG-a".into(),
            gi_id: 9,
            ci_id: 0,
            profile: "1g.10gb".into(),
            fb: Some(Memory {
                total_mib: 9984,
                used_mib: 12,
                free_mib: 9972,
                reserved_mib: 0,
            }),
            ..MigDevice::default()
        }];
        let mut lost = h100(2);
        lost.health = Health::Lost;
        Inventory {
            driver_version: "580.105.08".into(),
            gpus: vec![h100(0), mig, lost],
            ..Inventory::default()
        }
    }

    fn lines(text: &str, metric: &str) -> Vec<String> {
        text.lines()
            .filter(|l| {
                l.starts_with(&format!("{metric}{{")) || l.starts_with(&format!("{metric} "))
            })
            .map(String::from)
            .collect()
    }

    fn render_node(pods: &PodMap, xids: &XidCounters, label: HostnameLabel) -> String {
        let inv = node();
        let unhealthy =
            |gpu: u32, mig: Option<(u32, u32)>| (gpu == 0 && mig.is_none()).then_some(48);
        render(&NodeView {
            inventory: &inv,
            hostname: "node-1",
            hostname_label: label,
            pods,
            xids,
            unhealthy: &unhealthy,
            capacity: 3,
            agent: AgentStats {
                collection_seconds: 0.0125,
                collections: 7,
                ..AgentStats::default()
            },
        })
    }

    #[test]
    fn gpu_series_carry_dcgm_labels_in_dcgm_order() {
        let text = render_node(
            &PodMap::default(),
            &XidCounters::default(),
            HostnameLabel::Upper,
        );
        assert_eq!(
            lines(&text, "DCGM_FI_DEV_GPU_TEMP")[0],
            r#"DCGM_FI_DEV_GPU_TEMP{gpu="0",UUID="GPU-0",pci_bus_id="00000000:18:00.0",device="nvidia0",modelName="NVIDIA H100 80GB HBM3",Hostname="node-1",DCGM_FI_DRIVER_VERSION="580.105.08"} 31"#
        );
        assert!(text.contains("# HELP DCGM_FI_DEV_GPU_TEMP GPU temperature (in C).\n# TYPE DCGM_FI_DEV_GPU_TEMP gauge\n"));
        assert!(text.contains("# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION counter\n"));
        assert!(lines(&text, "DCGM_FI_DEV_POWER_USAGE")[0].ends_with("} 71.234"));
    }

    #[test]
    fn unsupported_values_and_lost_gpus_are_skipped_not_zeroed() {
        let text = render_node(
            &PodMap::default(),
            &XidCounters::default(),
            HostnameLabel::Upper,
        );
        let util = lines(&text, "DCGM_FI_DEV_GPU_UTIL");
        assert_eq!(
            util.len(),
            1,
            "GPU 1 is in MIG mode, GPU 2 is lost: {util:?}"
        );
        assert!(
            !text.contains("DCGM_FI_DEV_ENC_UTIL"),
            "no GPU reports it: no family at all"
        );
        assert!(!text.contains("UUID=\"GPU-2\",pci_bus_id=\"00000000:1A:00.0\",device=\"nvidia2\",modelName=\"NVIDIA H100 80GB HBM3\",Hostname=\"node-1\",DCGM_FI_DRIVER_VERSION=\"580.105.08\"} 31"));
        assert_eq!(
            lines(&text, "gpuops_node_gpus")[0],
            r#"gpuops_node_gpus{Hostname="node-1"} 3"#
        );
        assert_eq!(
            lines(&text, "gpuops_node_gpus_healthy")[0],
            r#"gpuops_node_gpus_healthy{Hostname="node-1"} 1"#,
            "GPU 0 has a fatal XID, GPU 2 is lost"
        );
    }

    #[test]
    fn mig_instances_get_their_own_fb_series_and_pod_labels() {
        let inv = node();
        let pods = PodMap::build(
            [Assignment {
                namespace: "serving".into(),
                pod: "llm-0".into(),
                container: "server".into(),
                resource: "nvidia.com/mig-1g.10gb".into(),
                device_ids: vec!["MIG-a".into()],
            }],
            &inv,
        );
        let text = render_node(&pods, &XidCounters::default(), HostnameLabel::Lower);
        let used = lines(&text, "DCGM_FI_DEV_FB_USED");
        assert!(
            used.contains(&r#"DCGM_FI_DEV_FB_USED{gpu="1",UUID="GPU-1",pci_bus_id="00000000:19:00.0",device="nvidia1",modelName="NVIDIA H100 80GB HBM3",GPU_I_PROFILE="1g.10gb",GPU_I_ID="9",hostname="node-1",DCGM_FI_DRIVER_VERSION="580.105.08",container="server",namespace="serving",pod="llm-0"} 12"#.to_string()),
            "{used:#?}"
        );
        assert_eq!(used.len(), 3, "GPU 0, GPU 1 and its instance: {used:#?}");
        let allocated = lines(&text, "gpuops_device_allocated");
        assert_eq!(allocated.iter().filter(|l| l.ends_with(" 1")).count(), 1);
        assert!(
            allocated
                .iter()
                .any(|l| l.contains("pod=\"llm-0\"") && l.ends_with(" 1"))
        );
    }

    #[test]
    fn shared_gpus_give_one_series_per_holding_container() {
        let inv = node();
        let pods = PodMap::build(
            ["a", "b"].map(|p| Assignment {
                namespace: "ns".into(),
                pod: p.into(),
                container: "c".into(),
                resource: "nvidia.com/gpu.shared".into(),
                device_ids: vec![format!("GPU-0::{}", p.len())],
            }),
            &inv,
        );
        let text = render_node(&pods, &XidCounters::default(), HostnameLabel::Upper);
        let temp = lines(&text, "DCGM_FI_DEV_GPU_TEMP");
        assert_eq!(temp.len(), 3, "{temp:#?}");
        assert!(temp[0].contains("pod=\"a\"") && temp[1].contains("pod=\"b\""));
    }

    #[test]
    fn xids_show_as_a_counter_per_code_and_the_sticky_gauge() {
        let mut xids = XidCounters::default();
        xids.record(0, None, 79);
        xids.record(0, None, 13);
        xids.record(0, None, 13);
        xids.record(1, Some(9), 31);
        let text = render_node(&PodMap::default(), &xids, HostnameLabel::Upper);
        let counter = lines(&text, "gpuops_xid_errors_total");
        assert_eq!(counter.len(), 3, "{counter:#?}");
        assert!(
            counter[0].contains("UUID=\"GPU-0\"")
                && counter[0].contains("err_code=\"13\"")
                && counter[0].ends_with(" 2")
        );
        assert!(
            counter[1].contains("err_code=\"79\",err_msg=\"GPU has fallen off the bus\"} 1"),
            "{}",
            counter[1]
        );
        assert!(counter[2].contains("GPU_I_ID=\"9\"") && counter[2].contains("err_code=\"31\""));
        let gauge = lines(&text, "DCGM_FI_DEV_XID_ERRORS");
        assert!(
            gauge[0].contains("err_code=\"13\"") && gauge[0].ends_with(" 13"),
            "last XID: {}",
            gauge[0]
        );
        assert!(
            gauge[1].ends_with("err_code=\"31\",err_msg=\"GPU memory page fault\"} 31"),
            "{}",
            gauge[1]
        );
        assert!(
            gauge[2].ends_with("} 0"),
            "no XID yet: 0 without err labels: {}",
            gauge[2]
        );
        let healthy = lines(&text, "gpuops_device_healthy");
        assert!(healthy[0].contains("UUID=\"GPU-0\"") && healthy[0].ends_with(" 0"));
        assert!(healthy[1].ends_with(" 1"));
    }

    #[test]
    fn gpm_activity_becomes_dcgm_profiling_fields_per_gpu_and_mig_instance() {
        let mut inv = node();
        let busy = gpuops_inventory::Activity {
            gr_engine_active: Some(0.75),
            sm_active: Some(0.5),
            sm_occupancy: Some(0.25),
            tensor_active: Some(0.125),
            dram_active: Some(0.3),
            pcie_tx_bytes_per_second: Some(1024.0),
            pcie_rx_bytes_per_second: Some(2048.0),
            nvlink_tx_bytes_per_second: None,
            nvlink_rx_bytes_per_second: None,
        };
        inv.gpus[0].activity = Some(busy);
        inv.gpus[1].mig_devices[0].activity = Some(gpuops_inventory::Activity {
            gr_engine_active: Some(0.5),
            ..busy
        });
        let unhealthy = |_: u32, _: Option<(u32, u32)>| None;
        let text = render(&NodeView {
            inventory: &inv,
            hostname: "node-1",
            hostname_label: HostnameLabel::Lower,
            pods: &PodMap::default(),
            xids: &XidCounters::default(),
            unhealthy: &unhealthy,
            capacity: 3,
            agent: AgentStats::default(),
        });
        assert!(text.contains("# HELP DCGM_FI_PROF_GR_ENGINE_ACTIVE Ratio of time the graphics engine is active.\n# TYPE DCGM_FI_PROF_GR_ENGINE_ACTIVE gauge\n"));
        let gr = lines(&text, "DCGM_FI_PROF_GR_ENGINE_ACTIVE");
        assert_eq!(
            gr.len(),
            2,
            "GPU 0 and the MIG instance; GPU 1 itself has none: {gr:#?}"
        );
        assert!(gr[0].contains("gpu=\"0\"") && gr[0].ends_with(" 0.75"));
        assert!(gr[1].contains("GPU_I_ID=\"9\"") && gr[1].ends_with(" 0.5"));
        assert!(lines(&text, "DCGM_FI_PROF_PCIE_RX_BYTES")[0].ends_with(" 2048"));
        assert!(
            !text.contains("DCGM_FI_PROF_NVLINK_TX_BYTES"),
            "no GPU reports NVLink: no family"
        );
    }

    #[test]
    fn every_family_has_help_and_type_once_and_samples_grouped() {
        let mut xids = XidCounters::default();
        xids.record(0, None, 48);
        let text = render_node(&PodMap::default(), &xids, HostnameLabel::Upper)
            + &render_scrapes(HostnameLabel::Upper, "node-1", 4);
        let mut seen = std::collections::BTreeSet::new();
        let mut current = String::new();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let name = rest.split(' ').next().unwrap().to_string();
                assert!(seen.insert(name.clone()), "{name} declared twice");
                current = name;
            } else if !line.starts_with('#') {
                let name = line.split(['{', ' ']).next().unwrap();
                assert_eq!(name, current, "sample outside its family: {line}");
            }
        }
        assert!(seen.contains("gpuops_scrapes_total") && seen.contains("gpuops_collections_total"));
    }
}
