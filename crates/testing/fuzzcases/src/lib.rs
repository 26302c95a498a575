//! One function per fuzz target: feeds bytes to a real parser or handler and checks its invariants.
//!
//! The cargo-fuzz targets in `fuzz/` call these, and so does the stable replay test
//! (`tests/replay.rs`) over the kept corpus and every crash file, so a crash found once stays a
//! regression test in the normal `cargo test`. A function returns normally for any input the
//! code handles correctly (an error is fine when it names its origin); it panics, which is what
//! libFuzzer records as a crash, when the code under test panics or breaks an invariant.
// Panicking on a broken invariant is how a fuzz harness reports it, and the fixtures are constant.
#![allow(clippy::panic, clippy::unwrap_used, clippy::expect_used)]

mod fixtures;

/// A target's function: returns for input handled correctly, panics on a bug.
pub type Target = fn(&[u8]);

/// Every target: its name (the `fuzz/fuzz_targets/<name>.rs` binary and the `fuzz/corpus/<name>/`
/// directory) and its function.
pub const TARGETS: &[(&str, Target)] = &[
    ("mig_config", mig_config),
    ("mig_configmap", mig_configmap),
    ("mig_hooks", mig_hooks),
    ("mig_checkpoint", mig_checkpoint),
    ("plugin_config", plugin_config),
    ("fleet", fleet),
    ("kubelet", kubelet),
    ("extender", extender),
    ("trace_nodes", trace_nodes),
    ("trace_pods", trace_pods),
    ("prometheus_text", prometheus_text),
    ("go_duration", go_duration),
    ("autoscale_annotations", autoscale_annotations),
];

const ORIGIN: &str = "fuzz-input";

fn text(data: &[u8]) -> Option<&str> {
    std::str::from_utf8(data).ok()
}

/// An error message must say which input it is about, or a user cannot act on it.
fn names_origin(message: &str) {
    assert!(
        message.contains(ORIGIN),
        "error does not name its origin {ORIGIN:?}: {message}"
    );
}

/// mig-parted configs (`gpuops mig apply -f`, the agent's ConfigMap): any accepted config renders
/// to YAML that parses back to the same config (rendering is a fixed point); errors name the file.
pub fn mig_config(data: &[u8]) {
    let Some(text) = text(data) else { return };
    match gpuops_mig::config::parse(text, ORIGIN) {
        Ok(cfg) => {
            let yaml = cfg.to_yaml();
            let again = gpuops_mig::config::parse(&yaml, "rendered")
                .unwrap_or_else(|e| panic!("rendered config does not parse: {e}\n{yaml}"));
            assert_eq!(again.to_yaml(), yaml, "render -> parse -> render differs");
            assert_eq!(again.names(), cfg.names());
            let _ = cfg.to_json();
        }
        Err(e) => {
            if e.position().is_some() {
                names_origin(&e.to_string());
            }
        }
    }
}

/// The same config inside a ConfigMap (`data."config.yaml"`, a literal block) reads as the plain
/// file does.
pub fn mig_configmap(data: &[u8]) {
    let Some(text) = text(data) else { return };
    let plain = gpuops_mig::config::parse(text, ORIGIN);
    let map = configmap_around(text);
    let wrapped = gpuops_mig::config::parse(&map, ORIGIN);
    if let Err(e) = &wrapped
        && e.position().is_some()
    {
        names_origin(&e.to_string());
    }
    // A plain text that is itself a manifest (several documents, a ConfigMap) means something
    // else once nested, and YAML's block scalars cannot carry every string a plain file can.
    let simple = !text.contains("---")
        && !text.contains("...")
        && !text.contains("ConfigMap")
        && text
            .chars()
            .all(|c| c == '\n' || c == ' ' || (!c.is_control() && c != '\u{feff}'));
    if let (Ok(plain), true) = (&plain, simple) {
        let wrapped =
            wrapped.unwrap_or_else(|e| panic!("accepted plain but not in a ConfigMap: {e}\n{map}"));
        assert_eq!(wrapped.to_yaml(), plain.to_yaml(), "ConfigMap form differs");
    }
}

fn configmap_around(text: &str) -> String {
    let mut out = String::from(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: fuzz\ndata:\n  config.yaml: |2+\n",
    );
    for line in text.split('\n') {
        out.push_str("    ");
        out.push_str(line);
        out.push('\n');
    }
    out
}

/// mig-parted hooks files: accepted hooks all have a command; errors name the file.
pub fn mig_hooks(data: &[u8]) {
    use gpuops_mig::hooks::{HookPoint, Hooks};
    let Some(text) = text(data) else { return };
    match Hooks::parse(text, ORIGIN) {
        Ok(h) => {
            for p in [
                HookPoint::ApplyStart,
                HookPoint::PreApplyMode,
                HookPoint::PreApplyConfig,
                HookPoint::ApplyExit,
            ] {
                assert!(h.at(p).iter().all(|hook| !hook.command.trim().is_empty()));
            }
        }
        Err(e) => names_origin(&e.to_string()),
    }
}

/// The MIG apply checkpoint (read back after a crash): what is accepted survives a write and a
/// read unchanged; errors name the file.
pub fn mig_checkpoint(data: &[u8]) {
    use gpuops_mig::checkpoint::Checkpoint;
    let Some(text) = text(data) else { return };
    match Checkpoint::parse(text, ORIGIN) {
        Ok(c) => {
            let json = serde_json::to_string(&c).expect("a checkpoint serialises");
            let again = Checkpoint::parse(&json, "rewritten")
                .unwrap_or_else(|e| panic!("written checkpoint does not parse: {e}\n{json}"));
            assert_eq!(again, c, "write -> read differs");
        }
        Err(e) => names_origin(&e.to_string()),
    }
}

/// Device-plugin configs: an accepted config goes through the resource model (the agent's next
/// step) without panicking; errors name the file.
pub fn plugin_config(data: &[u8]) {
    let Some(text) = text(data) else { return };
    match gpuops_resources::config::Config::parse(text, ORIGIN) {
        Ok(cfg) => {
            let none = gpuops_resources::Overrides::default();
            if let Ok(cfg) = gpuops_resources::Config::effective(Some(cfg), &none, &none) {
                let _ = gpuops_resources::resources(fixtures::inventory(), &cfg);
            }
        }
        Err(e) => names_origin(&e.to_string()),
    }
}

/// Simulator fleet files: an accepted fleet has GPUs; errors name the file.
pub fn fleet(data: &[u8]) {
    let Some(text) = text(data) else { return };
    match gpuops_sim::fleet::Fleet::parse(text, ORIGIN) {
        Ok(f) => assert!(
            !f.expanded().is_empty(),
            "a fleet without GPUs was accepted"
        ),
        Err(e) => names_origin(&e.to_string()),
    }
}

/// What the kubelet sends the device plugin. The first byte picks the plugin's config (whole GPUs,
/// or time-sliced replicas) and the message; the rest is the protobuf, decoded as tonic does and
/// handed to the same pure functions the gRPC service calls.
pub fn kubelet(data: &[u8]) {
    use gpuops_kubelet_api::deviceplugin::v1beta1::{
        AllocateRequest, PreStartContainerRequest, PreferredAllocationRequest,
    };
    use prost::Message;
    let Some((&selector, wire)) = data.split_first() else {
        return;
    };
    let node = &fixtures::nodes()[usize::from(selector & 1)];
    match (selector >> 1) % 3 {
        0 => {
            let Ok(req) = AllocateRequest::decode(wire) else {
                return;
            };
            for c in &req.container_requests {
                let Ok(a) = gpuops_resources::allocate(
                    &node.resource,
                    &c.devices_ids,
                    &node.config,
                    &node.host,
                ) else {
                    continue;
                };
                assert!(
                    a.envs.contains_key("NVIDIA_VISIBLE_DEVICES") || !a.cdi_devices.is_empty(),
                    "an allocation that names no device: {a:?}"
                );
            }
        }
        1 => {
            let Ok(req) = PreferredAllocationRequest::decode(wire) else {
                return;
            };
            for c in &req.container_requests {
                let Ok(size) = usize::try_from(c.allocation_size) else {
                    continue;
                };
                let Ok(chosen) = gpuops_resources::preferred_allocation(
                    &node.resource,
                    &c.available_device_i_ds,
                    &c.must_include_device_i_ds,
                    size,
                    &node.config,
                    fixtures::inventory(),
                ) else {
                    continue;
                };
                assert_eq!(chosen.len(), size, "asked for {size}, got {chosen:?}");
                let mut unique = chosen.clone();
                unique.sort();
                unique.dedup();
                assert_eq!(unique.len(), chosen.len(), "a device twice: {chosen:?}");
                for id in &chosen {
                    assert!(
                        c.available_device_i_ds.contains(id),
                        "{id} was not available"
                    );
                }
                for id in &c.must_include_device_i_ds {
                    assert!(
                        chosen.contains(id),
                        "must-include {id} left out: {chosen:?}"
                    );
                }
            }
        }
        _ => {
            // The plugin does nothing on PreStartContainer; decoding must still be safe.
            let _ = PreStartContainerRequest::decode(wire);
        }
    }
}

/// The scheduler extender's HTTP bodies. The first byte picks the verb and whether the watch has
/// synced; the rest is the body. Every answer is JSON; a 400 says where the JSON went wrong.
pub fn extender(data: &[u8]) {
    let Some((&selector, body)) = data.split_first() else {
        return;
    };
    let verb = if selector & 1 == 0 {
        "filter"
    } else {
        "prioritize"
    };
    let synced = selector & 2 == 0;
    let (nodes, pods) = fixtures::cluster();
    let nodes: Vec<_> = nodes.iter().collect();
    let pods: Vec<_> = pods.iter().collect();
    let (status, text) =
        gpuops_extender::server::handle(verb, body, synced, &nodes, &pods, fixtures::engine());
    let answer: serde_json::Value = serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("{verb} answered {status} with non-JSON {text:?}: {e}"));
    match status.as_u16() {
        200 => {
            if verb == "prioritize" {
                assert!(answer.is_array(), "prioritize answered {text}");
            }
        }
        400 => {
            let message = answer["Error"].as_str().unwrap_or_default();
            assert!(
                message.contains("line"),
                "a 400 that does not say where: {text}"
            );
        }
        500 => assert!(answer["Error"].is_string(), "a 500 without Error: {text}"),
        other => panic!("{verb} answered status {other}: {text}"),
    }
}

/// Trace node CSVs: errors name the file.
pub fn trace_nodes(data: &[u8]) {
    let Some(text) = text(data) else { return };
    match gpuops_packing::trace::parse_nodes(ORIGIN, text) {
        Ok(nodes) => assert!(!nodes.is_empty()),
        Err(e) => names_origin(&e.to_string()),
    }
}

/// Trace pod CSVs: accepted pods obey the documented limits; errors name the file.
pub fn trace_pods(data: &[u8]) {
    let Some(text) = text(data) else { return };
    match gpuops_packing::trace::parse_pods(ORIGIN, text) {
        Ok(pods) => {
            assert!(!pods.is_empty());
            for p in &pods {
                let _ = p.total_gpu_milli();
                let _ = p.gpu_spec_key();
            }
        }
        Err(e) => names_origin(&e.to_string()),
    }
}

/// The Prometheus text exposition `gpuops doctor` reads from agents: samples with plain names and
/// label keys render back to text that parses to the same samples; errors give the line.
pub fn prometheus_text(data: &[u8]) {
    let Some(text) = text(data) else { return };
    match gpuops_doctor::metrics::parse_exposition(text) {
        Ok(samples) => {
            let plain = |s: &str| {
                !s.is_empty()
                    && s.chars()
                        .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
            };
            let simple: Vec<_> = samples
                .iter()
                .filter(|s| plain(&s.name) && s.labels.keys().all(|k| plain(k)))
                .collect();
            let rendered: String = simple.iter().map(|s| render_sample(s)).collect();
            let again = gpuops_doctor::metrics::parse_exposition(&rendered)
                .unwrap_or_else(|e| panic!("rendered samples do not parse: {e}\n{rendered}"));
            assert_eq!(again.len(), simple.len(), "{rendered}");
            for (a, b) in again.iter().zip(&simple) {
                assert_eq!(a.name, b.name);
                assert_eq!(a.labels, b.labels, "{rendered}");
                assert!(
                    a.value == b.value || (a.value.is_nan() && b.value.is_nan()),
                    "value {} became {}",
                    b.value,
                    a.value
                );
            }
        }
        Err(e) => assert!(e.to_string().contains("line "), "no line in {e}"),
    }
}

fn render_sample(s: &gpuops_doctor::Sample) -> String {
    let mut out = s.name.clone();
    out.push('{');
    for (k, v) in &s.labels {
        out.push_str(k);
        out.push_str("=\"");
        for c in v.chars() {
            match c {
                '\\' => out.push_str("\\\\"),
                '"' => out.push_str("\\\""),
                '\n' => out.push_str("\\n"),
                c => out.push(c),
            }
        }
        out.push_str("\",");
    }
    out.push_str("} ");
    let v = s.value;
    if v.is_nan() {
        out.push_str("NaN");
    } else if v == f64::INFINITY {
        out.push_str("+Inf");
    } else if v == f64::NEG_INFINITY {
        out.push_str("-Inf");
    } else {
        out.push_str(&format!("{v:?}"));
    }
    out.push('\n');
    out
}

/// Go durations (flags, config fields): what parses formats back to the same duration.
pub fn go_duration(data: &[u8]) {
    let Some(text) = text(data) else { return };
    match gpuops_duration::parse(text) {
        Ok(d) => {
            let formatted = gpuops_duration::format(d);
            let again = gpuops_duration::parse(&formatted)
                .unwrap_or_else(|e| panic!("{d:?} formats to {formatted:?}, which fails: {e}"));
            assert_eq!(again, d, "{text:?} -> {formatted:?}");
        }
        Err(e) => assert!(!e.to_string().is_empty()),
    }
}

/// The autoscaler's MachineDeployment annotations (Cluster Autoscaler's clusterapi ones and
/// `gpuops.io/*`). Input that is JSON is the MachineDeployment itself; other text is
/// `annotation=value` lines on a MachineDeployment named after the input. An accepted pool is
/// consistent (min <= max, a usable price, GPUs that can be modelled); an error names the
/// MachineDeployment, and the annotation when one is at fault; `parse_pools` agrees.
pub fn autoscale_annotations(data: &[u8]) {
    use gpuops_autoscale::AutoscaleError;
    use gpuops_autoscale::pool::{is_pool, parse_pool, parse_pools, pool_name};
    use serde_json::{Map, Value, json};
    let Some(text) = text(data) else { return };
    let md = match serde_json::from_str::<Value>(text) {
        Ok(v) => v,
        Err(_) => {
            let annotations: Map<String, Value> = text
                .lines()
                .filter_map(|l| l.split_once('='))
                .map(|(k, v)| (k.to_string(), Value::String(v.to_string())))
                .collect();
            json!({
                "metadata": {"namespace": "fuzz", "name": ORIGIN, "annotations": annotations},
                "spec": {"replicas": 1},
            })
        }
    };
    let name = pool_name(&md);
    let parsed = parse_pool(&md);
    assert_eq!(
        parse_pool(&md),
        parsed,
        "parsing the same object twice differs"
    );
    match &parsed {
        Ok(p) => {
            assert_eq!(p.name, name);
            assert!(p.min <= p.max, "min {} above max {}", p.min, p.max);
            assert!(
                p.price_per_hour.is_finite() && p.price_per_hour >= 0.0,
                "price {}",
                p.price_per_hour
            );
            let t = &p.template;
            assert!(t.gpu_replicas >= 1, "{} replicas per GPU", t.gpu_replicas);
            assert!(t.gpus <= 64, "{} GPUs per node", t.gpus);
            assert_eq!(
                t.gpus == 0,
                t.gpu_resource.is_empty(),
                "GPUs {} offered as {:?}",
                t.gpus,
                t.gpu_resource
            );
            assert!(t.scalars.contains_key("pods"), "no pods capacity");
        }
        Err(e) => {
            assert_eq!(
                e.pool(),
                Some(name.as_str()),
                "error about another pool: {e}"
            );
            let message = e.to_string();
            assert!(
                message.contains(&format!("MachineDeployment {name}")),
                "error does not name the MachineDeployment {name:?}: {message}"
            );
            if let AutoscaleError::Annotation { annotation, .. } = e {
                assert!(
                    !annotation.is_empty() && message.contains(annotation.as_str()),
                    "error does not name its annotation: {message}"
                );
            }
        }
    }
    let (pools, errors) = parse_pools(std::slice::from_ref(&md));
    if is_pool(&md) {
        match parsed {
            Ok(p) => assert!(pools == [p] && errors.is_empty(), "parse_pools differs"),
            Err(e) => assert!(pools.is_empty() && errors == [e], "parse_pools differs"),
        }
    } else {
        assert!(
            pools.is_empty() && errors.is_empty(),
            "a MachineDeployment without size annotations was read as a pool"
        );
    }
}

#[cfg(test)]
mod tests {
    /// The seeds must reach both sides of the parser, or the fuzzer starts blind to one.
    #[test]
    fn the_autoscale_seeds_reach_accepted_pools_and_each_kind_of_error() {
        use gpuops_autoscale::AutoscaleError;
        let dir = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../../fuzz/corpus/autoscale_annotations"
        );
        let (mut ok, mut annotation, mut pool) = (0, 0, 0);
        for e in std::fs::read_dir(dir).unwrap() {
            let data = std::fs::read(e.unwrap().path()).unwrap();
            let Ok(md) = serde_json::from_slice::<serde_json::Value>(&data) else {
                continue;
            };
            match gpuops_autoscale::pool::parse_pool(&md) {
                Ok(_) => ok += 1,
                Err(AutoscaleError::Annotation { .. }) => annotation += 1,
                Err(AutoscaleError::Pool { .. }) => pool += 1,
                Err(e) => panic!("a pool's annotations gave a MIG error: {e}"),
            }
        }
        assert!(
            ok >= 3 && annotation >= 2 && pool >= 1,
            "{ok} ok, {annotation} annotation errors, {pool} pool errors"
        );
    }
}
