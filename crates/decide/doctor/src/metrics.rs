//! Metric samples from the Prometheus text exposition (an agent's `/metrics`) or a Prometheus
//! HTTP API instant-query answer.

use crate::error::DoctorError;
use crate::snapshot::Sample;
use std::collections::BTreeMap;

/// Parses the text exposition format (0.0.4); comments and blank lines are skipped.
pub fn parse_exposition(text: &str) -> Result<Vec<Sample>, DoctorError> {
    let mut out = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let err = |reason| DoctorError::Exposition {
            line: i + 1,
            reason,
            text: raw.to_string(),
        };
        let name_end = line
            .find(|c: char| c == '{' || c.is_whitespace())
            .ok_or_else(|| err("no value"))?;
        let name = &line[..name_end];
        let mut rest = &line[name_end..];
        let mut labels = BTreeMap::new();
        if rest.starts_with('{') {
            let (parsed, after) = parse_labels(&rest[1..]).ok_or_else(|| err("bad labels"))?;
            labels = parsed;
            rest = after;
        }
        let value = rest
            .split_whitespace()
            .next()
            .ok_or_else(|| err("no value"))
            .and_then(|v| parse_value(v).ok_or_else(|| err("bad value")))?;
        out.push(Sample {
            name: name.to_string(),
            labels,
            value,
        });
    }
    Ok(out)
}

fn parse_value(v: &str) -> Option<f64> {
    match v {
        "+Inf" | "Inf" => Some(f64::INFINITY),
        "-Inf" => Some(f64::NEG_INFINITY),
        "NaN" => Some(f64::NAN),
        _ => v.parse().ok(),
    }
}

/// `k="v",k2="v2"}` -> labels and what follows the `}`.
fn parse_labels(s: &str) -> Option<(BTreeMap<String, String>, &str)> {
    let mut labels = BTreeMap::new();
    let mut chars = s.char_indices().peekable();
    loop {
        while chars
            .peek()
            .is_some_and(|(_, c)| *c == ',' || c.is_whitespace())
        {
            chars.next();
        }
        let (start, c) = chars.next()?;
        if c == '}' {
            return Some((labels, &s[start + 1..]));
        }
        let mut key = String::from(c);
        loop {
            let (_, c) = chars.next()?;
            if c == '=' {
                break;
            }
            key.push(c);
        }
        if chars.next()?.1 != '"' {
            return None;
        }
        let mut value = String::new();
        loop {
            let (_, c) = chars.next()?;
            match c {
                '"' => break,
                '\\' => match chars.next()?.1 {
                    'n' => value.push('\n'),
                    other => value.push(other),
                },
                other => value.push(other),
            }
        }
        labels.insert(key.trim().to_string(), value);
    }
}

/// Parses a Prometheus `/api/v1/query` answer (vector result). Series without `__name__` (the
/// result of a function such as `avg_over_time`) get `default_name`.
pub fn parse_prometheus(json: &str, default_name: &str) -> Result<Vec<Sample>, DoctorError> {
    let v: serde_json::Value =
        serde_json::from_str(json).map_err(|e| DoctorError::Prometheus(e.to_string()))?;
    if v["status"] != "success" {
        return Err(DoctorError::Prometheus(format!(
            "status {}: {}",
            v["status"],
            v["error"].as_str().unwrap_or("no error text")
        )));
    }
    let result = v["data"]["result"]
        .as_array()
        .ok_or_else(|| DoctorError::Prometheus("no data.result array".into()))?;
    let mut out = Vec::with_capacity(result.len());
    for r in result {
        let mut labels: BTreeMap<String, String> = r["metric"]
            .as_object()
            .into_iter()
            .flatten()
            .filter_map(|(k, v)| v.as_str().map(|s| (k.clone(), s.to_string())))
            .collect();
        let name = labels
            .remove("__name__")
            .unwrap_or_else(|| default_name.to_string());
        let Some(value) = r["value"][1].as_str().and_then(parse_value) else {
            continue;
        };
        out.push(Sample {
            name,
            labels,
            value,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exposition_lines() {
        let text = "# HELP x y\n# TYPE DCGM_FI_DEV_GPU_UTIL gauge\n\
            DCGM_FI_DEV_GPU_UTIL{gpu=\"0\",UUID=\"GPU-0\",Hostname=\"n1\",err_msg=\"a \\\"b\\\", c\"} 42\n\
            gpuops_node_gpus{Hostname=\"n1\"} 8 1700000000000\n\
            up 1\n";
        let s = parse_exposition(text).unwrap();
        assert_eq!(s.len(), 3);
        assert_eq!(s[0].value, 42.0);
        assert_eq!(s[0].label("err_msg"), Some("a \"b\", c"));
        assert_eq!(s[1].host(), Some("n1"));
        assert_eq!(s[2].name, "up");
        assert!(parse_exposition("bad{x=1} 2").is_err());
    }

    #[test]
    fn prometheus_vectors() {
        let json = r#"{"status":"success","data":{"resultType":"vector","result":[
            {"metric":{"__name__":"DCGM_FI_DEV_FB_USED","Hostname":"n1","gpu":"0"},"value":[1700000000.1,"1024"]},
            {"metric":{"Hostname":"n1","gpu":"1"},"value":[1700000000.1,"3.5"]}]}}"#;
        let s = parse_prometheus(json, "DCGM_FI_DEV_GPU_UTIL").unwrap();
        assert_eq!(s[0].name, "DCGM_FI_DEV_FB_USED");
        assert_eq!(s[1].name, "DCGM_FI_DEV_GPU_UTIL");
        assert_eq!(s[1].value, 3.5);
        assert!(parse_prometheus(r#"{"status":"error","error":"bad query"}"#, "x").is_err());
    }
}
