//! mig-parted v1 config parsing: the seed's ConfigMap, every error with its position, rendering
//! round trips, and NVIDIA's shipped configs.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use gpuops_mig::MigError;
use gpuops_mig::config::{
    DeviceFilter, DeviceSpec, Devices, MigPartedConfig, nvidia_default_configs, parse,
};
use std::collections::BTreeMap;

const SEED: &str = include_str!("fixtures/seed-mig-parted-configmap.yaml");
const FILTERS: &str = include_str!("fixtures/device-filters.yaml");

const BASE: &str = "\
version: v1
mig-configs:
  all-1g.10gb:
    - devices: all
      mig-enabled: true
      mig-devices:
        \"1g.10gb\": 7
";

fn counts(pairs: &[(&str, u32)]) -> BTreeMap<String, u32> {
    pairs.iter().map(|(p, n)| ((*p).to_string(), *n)).collect()
}

fn err(text: &str) -> String {
    match parse(text, "c.yaml") {
        Ok(c) => panic!("expected an error for\n{text}\ngot {c:?}"),
        Err(e) => e.to_string(),
    }
}

fn without_lines(mut c: MigPartedConfig) -> MigPartedConfig {
    for n in &mut c.configs {
        for e in &mut n.entries {
            e.line = 0;
        }
    }
    c
}

#[test]
fn seed_configmap_parses_with_outer_line_numbers() {
    let c = parse(SEED, "mig-config.yaml").unwrap();
    assert_eq!(
        c.names(),
        [
            "all-1g.10gb",
            "all-2g.20gb",
            "mixed-inference",
            "all-disabled"
        ]
    );
    let entry = |name: &str| -> DeviceSpec {
        let n = c.get(name).unwrap();
        assert_eq!(n.entries.len(), 1, "{name}");
        n.entries[0].clone()
    };
    let e = entry("all-1g.10gb");
    assert_eq!(e.devices, Devices::All);
    assert!(e.filters.is_empty());
    assert!(e.mig_enabled);
    assert_eq!(e.mig_devices, counts(&[("1g.10gb", 7)]));
    assert_eq!(
        e.line, 13,
        "`- devices: all` of all-1g.10gb is line 13 of the file"
    );
    assert_eq!(entry("all-2g.20gb").mig_devices, counts(&[("2g.20gb", 3)]));
    assert_eq!(entry("all-2g.20gb").line, 20);
    assert_eq!(
        entry("mixed-inference").mig_devices,
        counts(&[("3g.40gb", 1), ("1g.10gb", 4)])
    );
    assert_eq!(entry("mixed-inference").line, 27);
    let off = entry("all-disabled");
    assert!(!off.mig_enabled);
    assert!(off.mig_devices.is_empty());
    assert_eq!(off.line, 35);
}

#[test]
fn errors_inside_a_configmap_name_outer_positions() {
    // Line 16 of the seed is `            "1g.10gb": 7`; the value is at column 24.
    let bad = SEED.replace("\"1g.10gb\": 7", "\"1g.10gb\": -7");
    assert_eq!(
        err(&bad),
        "c.yaml:16:24: config all-1g.10gb: mig-devices count for \"1g.10gb\" must be a non-negative integer, got -7"
    );
    let bad = SEED.replace(
        "          mig-enabled: false",
        "          mig-enabled: nope",
    );
    assert_eq!(
        err(&bad),
        "c.yaml:36:24: config all-disabled: mig-enabled must be true or false, got \"nope\""
    );
    // `- devices: all` under the now-flow config is line 20, column 9.
    let bad = SEED.replace("      all-2g.20gb:", "      all-2g.20gb: [");
    assert_eq!(
        err(&bad),
        "c.yaml:20:9: invalid YAML: \"-\" is only valid inside a block"
    );
    let bad = SEED.replace("    version: v1", "    version: v1\n    extra: 1");
    assert_eq!(
        err(&bad),
        "c.yaml:10:5: unknown key \"extra\" at the top level; allowed keys: version, mig-configs"
    );
    // Leading blank lines and a strip indicator do not shift the mapping.
    let shifted = SEED.replace("config.yaml: |\n", "config.yaml: |-\n\n");
    let c = parse(&shifted, "c.yaml").unwrap();
    assert_eq!(c.get("all-1g.10gb").unwrap().entries[0].line, 14);
    // CRLF files map the same way.
    let crlf = bad.replace('\n', "\r\n");
    assert_eq!(
        parse(&crlf, "c.yaml").unwrap_err().to_string(),
        "c.yaml:10:5: unknown key \"extra\" at the top level; allowed keys: version, mig-configs"
    );
}

#[test]
fn configmap_shapes() {
    let wrap =
        |data: &str| format!("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: m\n{data}");
    // The only data key is taken even when it is not config.yaml.
    let only = wrap(
        "data:\n  mig.yaml: |\n    version: v1\n    mig-configs:\n      a:\n        - devices: all\n          mig-enabled: false\n",
    );
    let c = parse(&only, "c.yaml").unwrap();
    assert_eq!(c.names(), ["a"]);
    assert_eq!(c.configs[0].entries[0].line, 10);

    let cases: &[(&str, &str)] = &[
        (
            "data:\n  a.yaml: x\n  b.yaml: y\n",
            "c.yaml:5:1: the ConfigMap's data has no \"config.yaml\" key (it has a.yaml, b.yaml)",
        ),
        (
            "data: {}\n",
            "c.yaml:5:1: the ConfigMap's data has no \"config.yaml\" key (it has none)",
        ),
        (
            "",
            "c.yaml:1:1: the ConfigMap has no `data`: expected data.\"config.yaml\" holding the mig-parted config",
        ),
        (
            "data:\n  config.yaml: 7\n",
            "c.yaml:6:16: data.\"config.yaml\" must be a string holding the mig-parted config, got 7",
        ),
        (
            "data:\n  config.yaml: \"\"\n",
            "c.yaml:6:16: data.\"config.yaml\" is empty",
        ),
        (
            // A quoted string cannot be mapped line by line: point at it, name the inner spot.
            "data:\n  config.yaml: \"version: v1\\nmig-configs:\\n  a: []\\n\"\n",
            "c.yaml:6:16: config a: the config is empty: expected a list of device entries (- devices: all ...) (line 3, column 3 of data.\"config.yaml\")",
        ),
    ];
    for (data, want) in cases {
        assert_eq!(err(&wrap(data)), *want, "{data}");
    }
    assert_eq!(
        err("apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: x}\n"),
        "c.yaml:2:7: a Kubernetes \"Deployment\" manifest: expected a mig-parted config (version: v1) or a ConfigMap holding one"
    );
}

#[test]
fn multi_document_files_pick_the_one_config() {
    let text = format!(
        "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: gpu-operator\n---\n{}",
        SEED
    );
    let c = parse(&text, "c.yaml").unwrap();
    assert_eq!(c.configs.len(), 4);
    assert_eq!(c.configs[0].entries[0].line, 18);
    assert_eq!(
        err(&format!("{BASE}---\n{BASE}")),
        "c.yaml:9:1: 2 YAML documents hold a mig-parted config: a mig-parted config (line 1), a mig-parted config (line 9); keep one per file"
    );
    assert_eq!(
        err("a: 1\n---\nb: 2\n"),
        "c.yaml:1:1: none of the file's 2 YAML documents is a mig-parted config or a ConfigMap holding one"
    );
}

/// NVIDIA's mig-manager example (mig-parted v0.15.0 `deployments/container/`): a DaemonSet,
/// RBAC, the `gpu-clients` ConfigMap and the `mig-parted-config` ConfigMap, unchanged.
const MIG_MANAGER_EXAMPLE: &str = include_str!("fixtures/nvidia-mig-manager-v0.15.0-example.yaml");

#[test]
fn nvidias_mig_manager_manifest_gives_the_one_configmap_holding_a_mig_config() {
    let c = parse(MIG_MANAGER_EXAMPLE, "example.yaml").unwrap();
    assert!(c.names().contains(&"all-balanced"), "{:?}", c.names());
    // Lines are the outer file's: the config.yaml block starts under `data:` of the second
    // ConfigMap.
    let line = MIG_MANAGER_EXAMPLE
        .lines()
        .position(|l| l.trim() == "all-disabled:")
        .unwrap() as u64
        + 2;
    assert_eq!(c.get("all-disabled").unwrap().entries[0].line, line);
    // By name, the same; another name lists both ConfigMaps with their lines.
    let by_name = gpuops_mig::config::parse_selecting(
        MIG_MANAGER_EXAMPLE,
        "example.yaml",
        Some("mig-parted-config"),
    )
    .unwrap();
    assert_eq!(by_name, c);
    let e = gpuops_mig::config::parse_selecting(
        MIG_MANAGER_EXAMPLE,
        "example.yaml",
        Some("mig-config"),
    )
    .unwrap_err()
    .to_string();
    assert_eq!(
        e,
        "example.yaml: no ConfigMap named \"mig-config\" in the file (it has \"gpu-clients\" (line 117), \"mig-parted-config\" (line 135))"
    );
    // Naming the ConfigMap that is not a mig-parted config says what is wrong with it.
    let e = gpuops_mig::config::parse_selecting(
        MIG_MANAGER_EXAMPLE,
        "example.yaml",
        Some("gpu-clients"),
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.starts_with("example.yaml:125:5: unknown key \"systemd-services\" at the top level"),
        "{e}"
    );
}

#[test]
fn several_configmaps_holding_mig_configs_are_ambiguous_and_named() {
    let second =
        MIG_MANAGER_EXAMPLE.replace("name: mig-parted-config", "name: mig-parted-config-b");
    let both = format!(
        "{MIG_MANAGER_EXAMPLE}\n---\n{}",
        second.split("---\n").last().unwrap()
    );
    let e = err_at(&both, "two.yaml");
    assert!(
        e.contains("2 YAML documents hold a mig-parted config: ConfigMap \"mig-parted-config\" (line 135), ConfigMap \"mig-parted-config-b\" (line ")
            && e.ends_with("; pick one with --configmap NAME"),
        "{e}"
    );
    let picked =
        gpuops_mig::config::parse_selecting(&both, "two.yaml", Some("mig-parted-config-b"))
            .unwrap();
    assert!(picked.names().contains(&"all-balanced"));
    // A single ConfigMap with another name than asked is refused too.
    let e = gpuops_mig::config::parse_selecting(SEED, "seed.yaml", Some("nope"))
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with("seed.yaml: no ConfigMap named \"nope\""),
        "{e}"
    );
}

fn err_at(text: &str, origin: &str) -> String {
    match parse(text, origin) {
        Ok(c) => panic!("expected an error, parsed {c:?}"),
        Err(e) => e.to_string(),
    }
}

// Long on purpose: a table of broken configs, each with the exact message (file:line:column) it must give.
#[test]
fn every_error_names_file_line_column_and_config() {
    let entry =
        "    - devices: all\n      mig-enabled: true\n      mig-devices:\n        \"1g.10gb\": 7\n";
    let cases: Vec<(String, &str)> = vec![
        // Malformed YAML.
        (
            BASE.replace("\"1g.10gb\": 7", "\"1g.10gb\": [7"),
            "c.yaml:7:20: invalid YAML: unclosed bracket '['",
        ),
        (
            BASE.replace(
                "        \"1g.10gb\": 7\n",
                "        \"1g.10gb\": 7\n       bad: 1\n",
            ),
            "c.yaml:8:8: invalid YAML: while parsing a block mapping, did not find expected key",
        ),
        (
            format!("{BASE}version: v1\n"),
            "c.yaml:8:1: invalid YAML: duplicate mapping key: version",
        ),
        (
            "".into(),
            "c.yaml: the file is empty: expected a mig-parted config (version: v1, mig-configs: ...)",
        ),
        (
            "- a\n".into(),
            "c.yaml:1:1: expected a mig-parted config (a mapping with version: v1 and mig-configs), got a list",
        ),
        // Unknown keys, at each level.
        (
            BASE.replace("version: v1\n", "version: v1\nkind: x\n"),
            "c.yaml:2:1: unknown key \"kind\" at the top level; allowed keys: version, mig-configs",
        ),
        (
            BASE.replace("mig-enabled", "mig_enabled"),
            "c.yaml:5:7: config all-1g.10gb: unknown key \"mig_enabled\" in a device entry (did you mean mig-enabled?); allowed keys: devices, device-filter, mig-enabled, mig-devices",
        ),
        (
            BASE.replace("devices: all", "devices: all\n      gpus: 2"),
            "c.yaml:5:7: config all-1g.10gb: unknown key \"gpus\" in a device entry; allowed keys: devices, device-filter, mig-enabled, mig-devices",
        ),
        // Version.
        (
            BASE.replace("v1", "v2"),
            "c.yaml:1:10: unsupported version \"v2\": expected v1",
        ),
        (
            BASE.replace("v1", "1"),
            "c.yaml:1:10: unsupported version 1: expected v1",
        ),
        (
            BASE.replace("version: v1\n", ""),
            "c.yaml:1:1: missing `version: v1`",
        ),
        // mig-configs and configs.
        (
            "version: v1\n".into(),
            "c.yaml:1:1: missing `mig-configs`: expected a mapping of config names to device entries",
        ),
        (
            "version: v1\nmig-configs: {}\n".into(),
            "c.yaml:2:1: mig-configs is empty: define at least one named config",
        ),
        (
            "version: v1\nmig-configs: []\n".into(),
            "c.yaml:2:14: mig-configs must be a mapping of config names to device entries, got a list",
        ),
        (
            BASE.replace(entry, ""),
            "c.yaml:3:3: config all-1g.10gb: the config is empty: expected a list of device entries (- devices: all ...)",
        ),
        (
            BASE.replace(entry, "    []\n"),
            "c.yaml:3:3: config all-1g.10gb: the config is empty: expected a list of device entries (- devices: all ...)",
        ),
        (
            BASE.replace(entry, "    devices: all\n"),
            "c.yaml:4:5: config all-1g.10gb: a config must be a list of device entries (- devices: all ...), got a mapping",
        ),
        (
            BASE.replace(entry, "    - all\n"),
            "c.yaml:4:7: config all-1g.10gb: a device entry must be a mapping with devices, mig-enabled and mig-devices, got \"all\"",
        ),
        // devices.
        (
            BASE.replace("devices: all", "devices: some"),
            "c.yaml:4:16: config all-1g.10gb: devices must be \"all\" or a list of GPU indices like [0, 1], got \"some\"",
        ),
        (
            BASE.replace("devices: all", "devices: \"ALL\""),
            "c.yaml:4:16: config all-1g.10gb: devices must be \"all\" or a list of GPU indices like [0, 1], got \"ALL\"",
        ),
        (
            BASE.replace("devices: all", "devices: 1"),
            "c.yaml:4:16: config all-1g.10gb: devices must be \"all\" or a list of GPU indices like [0, 1], got 1 (write [1] for one GPU)",
        ),
        (
            BASE.replace("devices: all", "devices: []"),
            "c.yaml:4:16: config all-1g.10gb: devices is an empty list: list GPU indices or write `devices: all`",
        ),
        (
            BASE.replace("devices: all", "devices: [0, -1]"),
            "c.yaml:4:20: config all-1g.10gb: a GPU index in devices must be a non-negative integer, got -1",
        ),
        (
            BASE.replace("devices: all", "devices: [0, \"1\"]"),
            "c.yaml:4:20: config all-1g.10gb: a GPU index in devices must be a non-negative integer, got \"1\"",
        ),
        (
            BASE.replace("    - devices: all\n", "    - mig-enabled: true\n")
                .replace("      mig-enabled: true\n", ""),
            "c.yaml:4:7: config all-1g.10gb: the device entry has no `devices` (write `devices: all` or a list of GPU indices)",
        ),
        // mig-enabled.
        (
            BASE.replace("mig-enabled: true", "mig-enabled: \"yes\""),
            "c.yaml:5:20: config all-1g.10gb: mig-enabled must be true or false, got \"yes\"",
        ),
        (
            BASE.replace("mig-enabled: true", "mig-enabled: 1"),
            "c.yaml:5:20: config all-1g.10gb: mig-enabled must be true or false, got 1",
        ),
        (
            BASE.replace("      mig-enabled: true\n", ""),
            "c.yaml:4:7: config all-1g.10gb: the device entry has no `mig-enabled` (true or false)",
        ),
        // mig-devices against mig-enabled.
        (
            BASE.replace("mig-enabled: true", "mig-enabled: false"),
            "c.yaml:6:7: config all-1g.10gb: mig-devices lists 7x 1g.10gb but mig-enabled is false: set mig-enabled: true or remove mig-devices",
        ),
        (
            BASE.replace("      mig-devices:\n        \"1g.10gb\": 7\n", ""),
            "c.yaml:4:7: config all-1g.10gb: mig-enabled is true but mig-devices is missing (write `mig-devices: {}` to enable MIG mode without MIG devices)",
        ),
        (
            BASE.replace(
                "      mig-devices:\n        \"1g.10gb\": 7\n",
                "      mig-devices: [\"1g.10gb\"]\n",
            ),
            "c.yaml:6:20: config all-1g.10gb: mig-devices must be a mapping of MIG profile to count (\"1g.10gb\": 2), got a list",
        ),
        // Counts.
        (
            BASE.replace(": 7", ": -1"),
            "c.yaml:7:20: config all-1g.10gb: mig-devices count for \"1g.10gb\" must be a non-negative integer, got -1",
        ),
        (
            BASE.replace(": 7", ": \"7\""),
            "c.yaml:7:20: config all-1g.10gb: mig-devices count for \"1g.10gb\" must be a non-negative integer, got \"7\" (write 7 without quotes)",
        ),
        (
            BASE.replace(": 7", ": two"),
            "c.yaml:7:20: config all-1g.10gb: mig-devices count for \"1g.10gb\" must be a non-negative integer, got \"two\"",
        ),
        (
            BASE.replace(": 7", ": 1.5"),
            "c.yaml:7:20: config all-1g.10gb: mig-devices count for \"1g.10gb\" must be a non-negative integer, got 1.5",
        ),
        (
            BASE.replace(": 7", ": 4294967296"),
            // Issue 29: too large for its type used to say "must be a non-negative integer".
            "c.yaml:7:20: config all-1g.10gb: mig-devices count for \"1g.10gb\" must be at most 64, the limit per profile and GPU (no GPU has more than 7 MIG slices), got 4294967296",
        ),
        // Profile names.
        (
            BASE.replace("\"1g.10gb\"", "\"1g10gb\""),
            "c.yaml:7:9: config all-1g.10gb: mig-devices: invalid MIG profile name \"1g10gb\": missing memory size: expected [<C>c.]<G>g.<N>gb, e.g. 3g.40gb",
        ),
        (
            BASE.replace("\"1g.10gb\"", "\"3c.2g.20gb\""),
            "c.yaml:7:9: config all-1g.10gb: mig-devices: invalid MIG profile name \"3c.2g.20gb\": compute slices (3c) exceed GPU slices (2g)",
        ),
        (
            BASE.replace(
                "        \"1g.10gb\": 7\n",
                "        \"1g.10gb\": 7\n        1G.10GB: 1\n",
            ),
            "c.yaml:8:9: config all-1g.10gb: mig-devices lists \"1g.10gb\" twice (as \"1g.10gb\" and \"1G.10GB\")",
        ),
        // device-filter.
        (
            BASE.replace(
                "devices: all",
                "devices: all\n      device-filter: \"0x2330\"",
            ),
            "c.yaml:5:22: config all-1g.10gb: device-filter \"0x2330\" is a bare 16-bit PCI id; write it followed by the vendor id: \"0x233010DE\"",
        ),
        (
            BASE.replace(
                "devices: all",
                "devices: all\n      device-filter: [\"0x233010DE\", \"233010DE\"]",
            ),
            "c.yaml:5:37: config all-1g.10gb: device-filter \"233010DE\" must be 0x followed by 8 hex digits (PCI id, then vendor id 10DE), e.g. \"0x233010DE\"",
        ),
        (
            BASE.replace(
                "devices: all",
                "devices: all\n      device-filter: \"0x233010DEFF\"",
            ),
            "c.yaml:5:22: config all-1g.10gb: device-filter \"0x233010DEFF\" must be 0x followed by exactly 8 hex digits, e.g. \"0x233010DE\"",
        ),
        (
            BASE.replace(
                "devices: all",
                "devices: all\n      device-filter: \"0x233010DE:16C110DE\"",
            ),
            "c.yaml:5:22: config all-1g.10gb: device-filter \"0x233010DE:16C110DE\": the subsystem part \"16C110DE\" must be 0x followed by 8 hex digits (PCI id, then vendor id 10DE), e.g. \"0x233010DE\"",
        ),
        (
            BASE.replace(
                "devices: all",
                "devices: all\n      device-filter: 0x233010DE",
            ),
            "c.yaml:5:22: config all-1g.10gb: device-filter 0x233010DE was read as a number: quote it (\"0x233010DE\")",
        ),
        (
            BASE.replace("devices: all", "devices: all\n      device-filter: {id: 1}"),
            "c.yaml:5:22: config all-1g.10gb: device-filter must be a string like \"0x233010DE\" or a list of them, got a mapping",
        ),
    ];
    for (text, want) in cases {
        assert_eq!(err(&text), want, "for\n{text}");
    }
}

#[test]
fn yaml_1_1_booleans_read_like_mig_parted() {
    // mig-parted reads YAML through go-yaml v2 (YAML 1.1), where unquoted yes/no are booleans.
    let c = parse(
        &BASE.replace("mig-enabled: true", "mig-enabled: yes"),
        "c.yaml",
    )
    .unwrap();
    assert!(c.configs[0].entries[0].mig_enabled);
}

#[test]
fn stdin_is_named() {
    let e = parse("a: [", "-").unwrap_err();
    assert_eq!(
        e.to_string(),
        "<stdin>:1:4: invalid YAML: unclosed bracket '['"
    );
    let pos = e.position().unwrap();
    assert_eq!((pos.line, pos.column), (Some(1), Some(4)));
}

#[test]
fn device_filters_devices_and_counts() {
    let c = parse(FILTERS, "device-filters.yaml").unwrap();
    assert_eq!(c.names(), ["all-disabled", "all-1g.10gb", "custom"]);
    let one = c.get("all-1g.10gb").unwrap();
    assert_eq!(
        one.entries[0].filters,
        [0x20B0_10DE, 0x20B1_10DE, 0x20F1_10DE, 0x20F6_10DE].map(|device| DeviceFilter {
            device,
            subsystem: None
        })
    );
    assert_eq!(one.entries[0].mig_devices, counts(&[("1g.10gb", 4)]));
    assert_eq!(
        one.entries[1].filters,
        [DeviceFilter {
            device: 0x2330_10DE,
            subsystem: None
        }]
    );
    assert_eq!(one.entries[1].line, 18);

    let custom = c.get("custom").unwrap();
    let e = &custom.entries;
    assert_eq!(e[0].devices, Devices::List(vec![0, 1]));
    assert_eq!(
        e[0].filters,
        [DeviceFilter {
            device: 0x2330_10DE,
            subsystem: Some(0x16C1_10DE)
        }]
    );
    assert!(e[0].filters[0].matches(0x2330_10DE, 0x16C1_10DE));
    assert!(!e[0].filters[0].matches(0x2330_10DE, 0x16C2_10DE));
    // Empty filters (a list or a string) mean "no filter", as in mig-parted.
    assert!(e[1].filters.is_empty() && e[2].filters.is_empty());
    assert!(e[1].mig_enabled && e[1].mig_devices.is_empty());
    // Repeated indices collapse; zero counts are dropped; names are canonical.
    assert_eq!(e[2].devices, Devices::List(vec![3]));
    assert_eq!(
        e[2].mig_devices,
        counts(&[("1c.3g.40gb", 1), ("1g.10gb+me", 1)])
    );
}

#[test]
fn unknown_config_names_list_the_known_ones() {
    let c = parse(SEED, "c.yaml").unwrap();
    let e = c.get("all-1g.10g").unwrap_err();
    assert!(matches!(e, MigError::UnknownConfig { .. }));
    assert_eq!(
        e.to_string(),
        "no MIG config named \"all-1g.10g\" (did you mean \"all-1g.10gb\"?); known configs: all-1g.10gb, all-2g.20gb, mixed-inference, all-disabled"
    );
    assert_eq!(
        c.get("training").unwrap_err().to_string(),
        "no MIG config named \"training\"; known configs: all-1g.10gb, all-2g.20gb, mixed-inference, all-disabled"
    );
}

#[test]
fn rendering_round_trips() {
    for (name, text) in [("seed", SEED), ("filters", FILTERS)] {
        let c = parse(text, name).unwrap();
        let yaml = c.to_yaml();
        let back = parse(&yaml, "rendered").unwrap_or_else(|e| panic!("{name}: {e}\n{yaml}"));
        assert_eq!(
            without_lines(back),
            without_lines(c.clone()),
            "{name}:\n{yaml}"
        );
        assert_eq!(
            parse(&yaml, "again").unwrap().to_yaml(),
            yaml,
            "{name}: stable"
        );
    }
    let c = parse(SEED, "seed").unwrap();
    assert_eq!(
        c.to_yaml(),
        "\
version: v1
mig-configs:
  all-1g.10gb:
    - devices: all
      mig-enabled: true
      mig-devices:
        \"1g.10gb\": 7
  all-2g.20gb:
    - devices: all
      mig-enabled: true
      mig-devices:
        \"2g.20gb\": 3
  mixed-inference:
    - devices: all
      mig-enabled: true
      mig-devices:
        \"1g.10gb\": 4
        \"3g.40gb\": 1
  all-disabled:
    - devices: all
      mig-enabled: false
"
    );
    // Names YAML would read as something else are quoted.
    let mut odd = c.clone();
    odd.configs[0].name = "yes".into();
    odd.configs[1].name = "7 small: ones".into();
    let back = parse(&odd.to_yaml(), "odd").unwrap();
    assert_eq!(
        back.names(),
        ["yes", "7 small: ones", "mixed-inference", "all-disabled"]
    );
    let json = c.to_json();
    assert_eq!(json["version"], "v1");
    assert_eq!(
        json["mig-configs"]["mixed-inference"][0]["mig-devices"]["3g.40gb"],
        1
    );
    assert!(
        json["mig-configs"]["all-disabled"][0]
            .get("mig-devices")
            .is_none()
    );
}

#[test]
fn nvidia_defaults_cover_every_mig_model_and_round_trip() {
    let d = nvidia_default_configs();
    let names = d.names();
    for want in [
        "all-disabled",
        "all-enabled",
        "all-1g.10gb",
        "all-1g.10gb.me",
        "all-1g.20gb",
        "all-3g.40gb",
        "all-7g.80gb",
        "all-1g.18gb",
        "all-7g.141gb",
        "all-1g.6gb.me",
        "all-2g.12gb.me",
        "all-balanced",
    ] {
        assert!(names.contains(&want), "{want} missing from {names:?}");
    }
    assert!(names.iter().all(|n| !n.contains('+')), "{names:?}");
    let disabled = &d.get("all-disabled").unwrap().entries;
    assert_eq!(disabled.len(), 1);
    assert!(!disabled[0].mig_enabled && disabled[0].filters.is_empty());
    let enabled = &d.get("all-enabled").unwrap().entries;
    assert!(enabled[0].mig_enabled && enabled[0].mig_devices.is_empty());

    // Every filtered entry names a MIG model that offers each profile at no more than its maximum.
    for config in &d.configs {
        for e in &config.entries {
            for f in &e.filters {
                let model = gpuops_catalog::by_pci_device_id((f.device >> 16) as u16)
                    .unwrap_or_else(|| panic!("{}: {f} is not a catalog model", config.name));
                assert_eq!(f.device & 0xFFFF, 0x10DE);
                for (profile, n) in &e.mig_devices {
                    let p = model.gi_profile(profile).unwrap_or_else(|| {
                        panic!("{}: {} has no {profile}", config.name, model.key)
                    });
                    assert!(
                        *n <= p.max_count,
                        "{}: {n}x {profile} on {}",
                        config.name,
                        model.key
                    );
                }
            }
        }
    }
    // all-<profile> uses the maximum count per model: 1g.10gb is 4 on A100-40GB, 7 on H100.
    let one = d.get("all-1g.10gb").unwrap();
    let for_pci = |entries: &[DeviceSpec], pci: u32| -> BTreeMap<String, u32> {
        entries
            .iter()
            .find(|e| e.filters.iter().any(|f| f.device == pci))
            .unwrap_or_else(|| panic!("no entry for {pci:#X}"))
            .mig_devices
            .clone()
    };
    assert_eq!(
        for_pci(&one.entries, 0x20B0_10DE),
        counts(&[("1g.10gb", 4)])
    );
    assert_eq!(
        for_pci(&one.entries, 0x2330_10DE),
        counts(&[("1g.10gb", 7)])
    );
    assert_eq!(
        for_pci(&d.get("all-1g.10gb.me").unwrap().entries, 0x2330_10DE),
        counts(&[("1g.10gb+me", 1)])
    );

    let balanced = &d.get("all-balanced").unwrap().entries;
    let table: &[(u32, &[(&str, u32)])] = &[
        (
            0x20B0_10DE,
            &[("1g.5gb", 2), ("2g.10gb", 1), ("3g.20gb", 1)],
        ),
        (
            0x20B2_10DE,
            &[("1g.10gb", 2), ("2g.20gb", 1), ("3g.40gb", 1)],
        ),
        (
            0x2330_10DE,
            &[("1g.10gb", 2), ("2g.20gb", 1), ("3g.40gb", 1)],
        ),
        (
            0x2331_10DE,
            &[("1g.10gb", 2), ("2g.20gb", 1), ("3g.40gb", 1)],
        ),
        (
            0x2321_10DE,
            &[("1g.12gb", 2), ("2g.24gb", 1), ("3g.47gb", 1)],
        ),
        (
            0x2335_10DE,
            &[("1g.18gb", 2), ("2g.35gb", 1), ("3g.71gb", 1)],
        ),
        (
            0x2901_10DE,
            &[("1g.23gb", 2), ("2g.45gb", 1), ("3g.90gb", 1)],
        ),
        (0x20B7_10DE, &[("1g.6gb", 2), ("2g.12gb", 1)]),
    ];
    for (pci, want) in table {
        assert_eq!(for_pci(balanced, *pci), counts(want), "{pci:#X}");
    }

    let yaml = d.to_yaml();
    let back = parse(&yaml, "defaults").unwrap_or_else(|e| panic!("{e}\n{yaml}"));
    assert_eq!(without_lines(back), d);
}

/// NVIDIA's published default config (mig-parted v0.15.0's `deployments/systemd/config-default.yaml`,
/// the file the GPU Operator ships), unchanged below a provenance header.
const NVIDIA_DEFAULT: &str = include_str!("fixtures/nvidia-mig-parted-v0.15.0-config-default.yaml");

#[test]
fn nvidias_default_config_names_only_gpus_the_catalog_has_with_their_profiles() {
    let cfg = parse(NVIDIA_DEFAULT, "config-default.yaml").unwrap();
    assert_eq!(cfg.configs.len(), 81, "{:?}", cfg.names());
    let mut ids = std::collections::BTreeSet::new();
    for config in &cfg.configs {
        for e in &config.entries {
            for f in &e.filters {
                assert_eq!(f.device & 0xFFFF, 0x10DE, "{}: {f}", config.name);
                let id = (f.device >> 16) as u16;
                ids.insert(id);
                let model = gpuops_catalog::by_pci_device_id(id)
                    .unwrap_or_else(|| panic!("{}: {f} is not a catalog model", config.name));
                assert!(
                    model.mig_capable(),
                    "{}: {} has no MIG",
                    config.name,
                    model.key
                );
                for (profile, n) in &e.mig_devices {
                    let p = model.gi_profile(profile).unwrap_or_else(|| {
                        panic!("{}: {} has no {profile}", config.name, model.key)
                    });
                    assert!(*n <= p.max_count, "{}: {n}x {profile}", config.name);
                }
            }
            // Unfiltered entries must fit at least one model, as `mig validate` checks.
            if e.filters.is_empty() && e.mig_enabled {
                let fits = gpuops_catalog::models()
                    .iter()
                    .filter(|m| m.mig_capable())
                    .any(|m| gpuops_mig::planner::check(m, &e.mig_devices).is_ok());
                assert!(fits, "{}: {:?} fits no model", config.name, e.mig_devices);
            }
        }
    }
    // Every PCI id the file filters by, 27 of them.
    assert_eq!(ids.len(), 27, "{ids:x?}");
}
