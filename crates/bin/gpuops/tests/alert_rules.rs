#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! The Prometheus rules, their promtool unit tests and the Grafana dashboard under deploy/.
//!
//! - `promtool check rules` and `promtool test rules tests/promtool/*.yaml` pass;
//! - the PrometheusRule carries exactly the groups of the plain rules file;
//! - every alert has a severity, a summary and a description, and a promtool test where it fires;
//! - every metric name the rules and the dashboard use is one the exporter exports (the contract
//!   below), so a typo fails here instead of silently never alerting;
//! - the dashboard is valid JSON, has its template variables, and every query parses.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

/// Every series the gpuops exporter serves (dcgm-exporter default names plus gpuops extras).
const CONTRACT: &[&str] = &[
    "DCGM_FI_DEV_SM_CLOCK",
    "DCGM_FI_DEV_MEM_CLOCK",
    "DCGM_FI_DEV_MEMORY_TEMP",
    "DCGM_FI_DEV_GPU_TEMP",
    "DCGM_FI_DEV_POWER_USAGE",
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
    "DCGM_FI_DEV_GPU_UTIL",
    "DCGM_FI_DEV_MEM_COPY_UTIL",
    "DCGM_FI_DEV_ENC_UTIL",
    "DCGM_FI_DEV_DEC_UTIL",
    "DCGM_FI_DEV_XID_ERRORS",
    "DCGM_FI_DEV_FB_FREE",
    "DCGM_FI_DEV_FB_USED",
    "DCGM_FI_DEV_FB_RESERVED",
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
    "DCGM_FI_DEV_ROW_REMAP_FAILURE",
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
    "DCGM_FI_PROF_SM_ACTIVE",
    "DCGM_FI_PROF_SM_OCCUPANCY",
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
    "DCGM_FI_PROF_DRAM_ACTIVE",
    "DCGM_FI_PROF_PCIE_TX_BYTES",
    "DCGM_FI_PROF_PCIE_RX_BYTES",
    "DCGM_FI_PROF_NVLINK_TX_BYTES",
    "DCGM_FI_PROF_NVLINK_RX_BYTES",
    "gpuops_xid_errors_total",
    "gpuops_device_healthy",
    "gpuops_device_allocated",
    "gpuops_node_gpus",
    "gpuops_node_gpus_healthy",
    "gpuops_collection_duration_seconds",
    "gpuops_collections_total",
    "gpuops_collection_errors_total",
    "gpuops_scrapes_total",
    "gpuops_last_collection_timestamp_seconds",
    "process_resident_memory_bytes",
    "process_cpu_seconds_total",
];

/// Series Prometheus itself makes for every scrape target.
const SYNTHETIC: &[&str] = &["up"];

/// Label names that look like metric names.
const LABELS_WITH_METRIC_PREFIX: &[&str] = &["DCGM_FI_DRIVER_VERSION"];

const RULES: &str = "deploy/prometheus/gpuops-rules.yaml";
const PROMETHEUS_RULE: &str = "deploy/prometheus/gpuops-prometheusrule.yaml";
const DASHBOARD: &str = "deploy/grafana/gpuops-dashboard.json";
const PROMTOOL_TESTS: &str = "tests/promtool";

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../..")
        .canonicalize()
        .expect("workspace root")
}

fn read(rel: &str) -> String {
    let path = workspace_root().join(rel);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

fn yaml(rel: &str) -> Value {
    serde_saphyr::from_str::<Value>(&read(rel)).unwrap_or_else(|e| panic!("parsing {rel}: {e}"))
}

/// Runs promtool with `args` in the workspace root and fails the test, with promtool's output,
/// unless it succeeds.
fn promtool(args: &[&str]) -> String {
    let output = match Command::new("promtool")
        .args(args)
        .current_dir(workspace_root())
        .output()
    {
        Ok(output) => output,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => panic!(
            "promtool is not on PATH. scripts/test installs it (Debian package `prometheus`: \
             apt-get update && apt-get install -y prometheus); install it, or run scripts/test."
        ),
        Err(e) => panic!("running promtool {args:?}: {e}"),
    };
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        output.status.success(),
        "promtool {} failed ({}):\n{text}",
        args.join(" "),
        output.status
    );
    text
}

fn promtool_test_files() -> Vec<String> {
    let dir = workspace_root().join(PROMTOOL_TESTS);
    let mut files: Vec<String> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("listing {}: {e}", dir.display()))
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name.ends_with(".yaml") || name.ends_with(".yml"))
        .map(|name| format!("{PROMTOOL_TESTS}/{name}"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no promtool tests in {}", dir.display());
    files
}

fn groups(rules: &Value) -> &Vec<Value> {
    rules["groups"].as_array().expect("`groups` is a list")
}

fn all_rules(rules: &Value) -> impl Iterator<Item = &Value> {
    groups(rules)
        .iter()
        .flat_map(|g| g["rules"].as_array().expect("`rules` is a list"))
}

#[test]
fn promtool_checks_the_rules_file() {
    let out = promtool(&["check", "rules", RULES]);
    assert!(out.contains("SUCCESS"), "{out}");
}

#[test]
fn promtool_unit_tests_pass() {
    for file in promtool_test_files() {
        let out = promtool(&["test", "rules", &file]);
        assert!(out.contains("SUCCESS"), "{file}:\n{out}");
    }
}

#[test]
fn prometheusrule_has_the_same_groups_as_the_rules_file() {
    let plain = yaml(RULES);
    let operator = yaml(PROMETHEUS_RULE);
    assert_eq!(operator["apiVersion"], "monitoring.coreos.com/v1");
    assert_eq!(operator["kind"], "PrometheusRule");
    assert!(operator["metadata"]["name"].is_string());
    assert!(!groups(&plain).is_empty());
    assert_eq!(
        operator["spec"]["groups"], plain["groups"],
        "{PROMETHEUS_RULE} spec.groups differ from {RULES} groups: regenerate it (docs/metrics.md)"
    );
}

#[test]
fn every_alert_is_documented_and_tested_firing() {
    let rules = yaml(RULES);
    // Alert names with at least one promtool case where they fire.
    let mut fired = BTreeSet::new();
    for file in promtool_test_files() {
        let tests = yaml(&file);
        for test in tests["tests"].as_array().expect("`tests` is a list") {
            for case in test["alert_rule_test"].as_array().into_iter().flatten() {
                if case["exp_alerts"].as_array().is_some_and(|a| !a.is_empty()) {
                    fired.insert(case["alertname"].as_str().unwrap().to_owned());
                }
            }
        }
    }
    let mut names = BTreeSet::new();
    for rule in all_rules(&rules).filter(|r| r.get("alert").is_some()) {
        let name = rule["alert"].as_str().unwrap();
        assert!(names.insert(name), "alert {name} is defined twice");
        let severity = rule["labels"]["severity"].as_str();
        assert!(
            matches!(severity, Some("critical" | "warning" | "info")),
            "alert {name}: severity label is {severity:?}"
        );
        for annotation in ["summary", "description"] {
            let text = rule["annotations"][annotation].as_str().unwrap_or_default();
            assert!(text.len() > 20, "alert {name}: {annotation} is missing");
        }
        assert!(
            fired.contains(name),
            "alert {name} never fires in {PROMTOOL_TESTS}/*.yaml"
        );
    }
    assert!(names.len() >= 10, "only {} alerts: {names:?}", names.len());
}

/// The metric names a PromQL expression selects: identifiers outside label matchers, strings,
/// ranges, grouping lists and Grafana variables that are neither keywords nor function calls.
fn promql_metric_names(expr: &str) -> Vec<String> {
    const KEYWORDS: &[&str] = &[
        "and",
        "or",
        "unless",
        "offset",
        "bool",
        "by",
        "without",
        "on",
        "ignoring",
        "group_left",
        "group_right",
        "sum",
        "min",
        "max",
        "avg",
        "count",
        "stddev",
        "stdvar",
        "topk",
        "bottomk",
        "quantile",
        "count_values",
        "group",
        "inf",
        "nan",
        "start",
        "end",
    ];
    const GROUPING: &[&str] = &[
        "by",
        "without",
        "on",
        "ignoring",
        "group_left",
        "group_right",
    ];
    let chars: Vec<char> = expr.chars().collect();
    let skip_string = |mut i: usize| -> usize {
        let quote = chars[i];
        i += 1;
        while i < chars.len() && chars[i] != quote {
            i += if chars[i] == '\\' { 2 } else { 1 };
        }
        i + 1
    };
    // Skips from an opening bracket to just past its closing one.
    let skip_to = |mut i: usize, close: char| -> usize {
        i += 1;
        while i < chars.len() && chars[i] != close {
            i = if matches!(chars[i], '"' | '\'' | '`') {
                skip_string(i)
            } else {
                i + 1
            };
        }
        i + 1
    };
    let is_ident = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == ':';
    let mut names = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if matches!(c, '"' | '\'' | '`') {
            i = skip_string(i);
        } else if c == '{' {
            // Label matchers, which may hold Grafana's `${name}` (nested braces).
            let mut depth = 0;
            while i < chars.len() {
                match chars[i] {
                    '"' | '\'' | '`' => {
                        i = skip_string(i);
                        continue;
                    }
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    _ => {}
                }
                i += 1;
                if depth == 0 {
                    break;
                }
            }
        } else if c == '[' {
            i = skip_to(i, ']');
        } else if c == '$' {
            // Grafana variable: $name or ${name}.
            i += 1;
            if i < chars.len() && chars[i] == '{' {
                i = skip_to(i, '}');
            }
            while i < chars.len() && is_ident(chars[i]) {
                i += 1;
            }
        } else if c.is_ascii_digit() || c == '.' {
            // Numbers and durations (10m, 0.95, 1e3, 3600000000).
            while i < chars.len() && (is_ident(chars[i]) || chars[i] == '.') {
                i += 1;
            }
        } else if c.is_ascii_alphabetic() || c == '_' || c == ':' {
            let start = i;
            while i < chars.len() && is_ident(chars[i]) {
                i += 1;
            }
            let word: String = chars[start..i].iter().collect();
            let mut next = i;
            while next < chars.len() && chars[next].is_whitespace() {
                next += 1;
            }
            let before_paren = next < chars.len() && chars[next] == '(';
            if GROUPING.contains(&word.as_str()) {
                if before_paren {
                    i = skip_to(next, ')');
                }
            } else if !before_paren && !KEYWORDS.contains(&word.as_str()) {
                names.push(word);
            }
        } else {
            i += 1;
        }
    }
    names
}

/// Words in `text` that look like metric names of the contract's families (`DCGM_FI_…`,
/// `gpuops_…`, `gpuops:…`, `process_…`), wherever they appear: expressions, annotation
/// templates, descriptions.
fn prefixed_words(text: &str) -> BTreeSet<String> {
    text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
        .filter(|w| {
            ["DCGM_FI_", "gpuops_", "gpuops:", "process_"]
                .iter()
                .any(|p| w.len() > p.len() && w.starts_with(p))
        })
        .map(str::to_owned)
        .collect()
}

/// Every expression of the dashboard: panel targets and template-variable queries (the metric
/// selector inside `label_values(selector, label)`).
fn dashboard_exprs(dashboard: &Value) -> Vec<(String, String)> {
    let mut exprs = Vec::new();
    for panel in dashboard["panels"].as_array().expect("panels") {
        let title = panel["title"].as_str().unwrap_or("?");
        for target in panel["targets"].as_array().into_iter().flatten() {
            let expr = target["expr"].as_str().expect("every target has an expr");
            exprs.push((format!("panel {title:?}"), expr.to_owned()));
        }
    }
    for var in dashboard["templating"]["list"]
        .as_array()
        .expect("templating")
    {
        if var["type"] != "query" {
            continue;
        }
        let query = var["query"]["query"]
            .as_str()
            .or_else(|| var["query"].as_str())
            .expect("query variable has a query");
        // The node label's spelling: a list of label names, no series selector.
        if query == "label_names()" {
            continue;
        }
        let selector = query
            .strip_prefix("label_values(")
            .and_then(|q| q.strip_suffix(')'))
            .and_then(|q| q.rsplit_once(','))
            .map(|(selector, _label)| selector)
            .unwrap_or_else(|| panic!("variable {}: unexpected query {query}", var["name"]));
        exprs.push((format!("variable {}", var["name"]), selector.to_owned()));
    }
    exprs
}

fn dashboard() -> Value {
    serde_json::from_str(&read(DASHBOARD)).unwrap_or_else(|e| panic!("{DASHBOARD}: {e}"))
}

#[test]
fn promql_metric_names_finds_only_metrics() {
    assert_eq!(
        promql_metric_names(
            r#"sum by (Hostname) (max without (GPU_I_ID, pod) (increase(DCGM_FI_DEV_X{a="b",pod!=""}[1h]))) / 3.6e9"#
        ),
        ["DCGM_FI_DEV_X"]
    );
    assert_eq!(
        promql_metric_names(
            "a > 0 unless on (UUID, err_code) b offset 10m or time() - c{Hostname=~\"$Hostname\"} > 90"
        ),
        ["a", "b", "c"]
    );
    assert_eq!(
        promql_metric_names("rate(x[$__rate_interval]) * on (g) group_left (h) y"),
        ["x", "y"]
    );
    assert_eq!(
        promql_metric_names(
            "max by (${node_label}, gpu) (x{${node_label}=~\"$node\", GPU_I_ID=\"\"}) and z == 1"
        ),
        ["x", "z"]
    );
}

#[test]
fn rules_and_dashboard_use_only_contract_metrics() {
    let rules = yaml(RULES);
    let recorded: BTreeSet<String> = all_rules(&rules)
        .filter_map(|r| r["record"].as_str().map(str::to_owned))
        .collect();
    let known = |name: &str| {
        CONTRACT.contains(&name) || SYNTHETIC.contains(&name) || recorded.contains(name)
    };
    let mut unknown: BTreeMap<String, Vec<String>> = BTreeMap::new();

    let mut used_in_rules = BTreeSet::new();
    for rule in all_rules(&rules) {
        let name = rule["alert"].as_str().or(rule["record"].as_str()).unwrap();
        let expr = rule["expr"].as_str().expect("every rule has an expr");
        let names = promql_metric_names(expr);
        assert!(!names.is_empty(), "rule {name}: no metric in {expr}");
        // Behind the Prometheus Operator every series has a pod label (the agent's target
        // labels): allocation is gpuops_device_allocated == 1, never a pod label being set.
        assert!(
            !expr.contains("pod!=\"\""),
            "rule {name} keys on pod!=\"\": {expr}"
        );
        for metric in names {
            if !known(&metric) {
                unknown
                    .entry(metric.clone())
                    .or_default()
                    .push(format!("rule {name}"));
            }
            used_in_rules.insert(metric);
        }
    }

    let dash = dashboard();
    let mut used_in_dashboard = BTreeSet::new();
    for (place, expr) in dashboard_exprs(&dash) {
        let names = promql_metric_names(&expr);
        assert!(!names.is_empty(), "{place}: no metric in {expr}");
        assert!(
            !place.starts_with("panel") || !expr.contains("pod!=\"\""),
            "{place} keys on pod!=\"\" instead of gpuops_device_allocated == 1: {expr}"
        );
        for metric in names {
            if !known(&metric) {
                unknown
                    .entry(metric.clone())
                    .or_default()
                    .push(place.clone());
            }
            used_in_dashboard.insert(metric);
        }
    }

    // Names in annotation templates, comments and descriptions too.
    for file in [RULES, PROMETHEUS_RULE, DASHBOARD] {
        for word in prefixed_words(&read(file)) {
            if !known(&word) && !LABELS_WITH_METRIC_PREFIX.contains(&word.as_str()) {
                unknown.entry(word).or_default().push(file.to_owned());
            }
        }
    }
    assert!(
        unknown.is_empty(),
        "metric names outside the exporter's contract (typo?): {unknown:#?}"
    );

    // The dashboard shows every series the exporter serves.
    let missing: Vec<&&str> = CONTRACT
        .iter()
        .filter(|m| !used_in_dashboard.contains(**m))
        .collect();
    assert!(missing.is_empty(), "{DASHBOARD} never shows {missing:?}");
    for metric in [
        "DCGM_FI_DEV_GPU_TEMP",
        "DCGM_FI_DEV_ROW_REMAP_FAILURE",
        "gpuops_xid_errors_total",
        "gpuops_node_gpus_healthy",
        "gpuops_last_collection_timestamp_seconds",
    ] {
        assert!(used_in_rules.contains(metric), "no rule uses {metric}");
    }
    // The fatal-XID alert must use the counter, never the sticky last-XID gauge.
    assert!(!used_in_rules.contains("DCGM_FI_DEV_XID_ERRORS"));
}

#[test]
fn dashboard_is_valid_and_its_queries_parse() {
    let dash = dashboard();
    let schema = dash["schemaVersion"].as_u64().expect("schemaVersion");
    assert!((36..=41).contains(&schema), "schemaVersion {schema}");
    let vars: BTreeMap<&str, &Value> = dash["templating"]["list"]
        .as_array()
        .expect("templating")
        .iter()
        .map(|v| (v["name"].as_str().unwrap(), v))
        .collect();
    assert_eq!(vars["datasource"]["type"], "datasource");
    assert_eq!(vars["datasource"]["query"], "prometheus");
    for name in ["node_label", "node", "gpu", "namespace", "pod"] {
        assert!(
            vars.contains_key(name),
            "template variable {name} is missing"
        );
    }

    let mut ids = BTreeSet::new();
    let mut rows = Vec::new();
    for panel in dash["panels"].as_array().expect("panels") {
        let id = panel["id"].as_u64().expect("panel id");
        assert!(ids.insert(id), "panel id {id} is used twice");
        if panel["type"] == "row" {
            rows.push(panel["title"].as_str().unwrap().to_owned());
        }
        for target in panel["targets"].as_array().into_iter().flatten() {
            assert_eq!(
                target["datasource"]["uid"], "${datasource}",
                "panel {}: target does not use ${{datasource}}",
                panel["title"]
            );
        }
    }
    assert_eq!(rows, ["Node", "GPU", "MIG", "Pods"]);

    // The node variable lists whichever spelling of the node label the series carry.
    let node_label = vars["node_label"];
    assert_eq!(node_label["query"]["query"], "label_names()");
    let pick = regex_lite(node_label["regex"].as_str().unwrap());
    assert!(pick("hostname") && pick("Hostname") && !pick("hostname_x") && !pick("gpu"));

    // Let promtool parse every query, with either spelling of the node label: Grafana variables
    // become what they expand to.
    let mut rules = String::from("groups:\n  - name: dashboard\n    rules:\n");
    let mut n = 0;
    for spelling in ["hostname", "Hostname"] {
        for (_place, expr) in dashboard_exprs(&dash) {
            assert!(
                !expr.contains("Hostname") && !expr.contains("hostname"),
                "the dashboard spells the node label only through ${{node_label}}: {expr}"
            );
            let expr = expr
                .replace("${node_label}", spelling)
                .replace("$__rate_interval", "5m")
                .replace("$__range", "1h")
                .replace("$node", ".*")
                .replace("$gpu", ".*")
                .replace("$namespace", ".*")
                .replace("$pod", ".*");
            let quoted = serde_json::to_string(&expr).unwrap();
            rules.push_str(&format!(
                "      - record: dashboard:expr{n}\n        expr: {quoted}\n"
            ));
            n += 1;
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("dashboard-queries.yaml");
    std::fs::write(&file, &rules).unwrap();
    promtool(&["check", "rules", file.to_str().unwrap()]);
}

/// The dashboard's `/^(a|b)$/` variable regex as a predicate (the only form it uses).
fn regex_lite(re: &str) -> impl Fn(&str) -> bool {
    let alternatives: Vec<String> = re
        .strip_prefix("/^(")
        .and_then(|r| r.strip_suffix(")$/"))
        .unwrap_or_else(|| panic!("unexpected variable regex {re}"))
        .split('|')
        .map(str::to_owned)
        .collect();
    move |name: &str| alternatives.iter().any(|a| a == name)
}
