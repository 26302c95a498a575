//! Parsing of the openb trace CSV files (node list and pod list), by header name.
//!
//! Node files: `sn,cpu_milli,memory_mib,gpu,model`. Pod files:
//! `name,cpu_milli,memory_mib,num_gpu,gpu_milli[,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time]`.
//! Columns may come in any order; unknown or duplicate columns are rejected. Fields are read with
//! a real CSV parser (the `csv` crate: quoted fields, `""` escapes, CRLF), and every row must
//! have exactly the header's fields, so an unterminated quote (which would swallow the rows after
//! it) is an error rather than lost rows. Every error names the file, the 1-based line, the
//! column and the offending value.

use crate::error::{PackingError, Result};
use serde::Serialize;
use std::path::Path;

/// One GPU node of the trace.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NodeSpec {
    /// Node name (`sn`).
    pub name: String,
    /// Allocatable CPU in milli-cores.
    pub cpu_milli: u64,
    /// Allocatable memory in MiB.
    pub memory_mib: u64,
    /// Number of GPUs.
    pub gpus: u32,
    /// GPU model name; empty for CPU-only nodes.
    pub model: String,
}

/// One pod of the trace.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PodSpec {
    /// Pod name.
    pub name: String,
    /// CPU request in milli-cores.
    pub cpu_milli: u64,
    /// Memory request in MiB.
    pub memory_mib: u64,
    /// Number of GPUs (0 for CPU-only pods).
    pub num_gpu: u32,
    /// GPU milli per GPU: 1..=1000; < 1000 only when `num_gpu == 1` (a shared GPU).
    pub gpu_milli: u32,
    /// Allowed GPU models; empty means any model.
    pub gpu_spec: Vec<String>,
}

impl PodSpec {
    /// Total GPU milli requested (`num_gpu * gpu_milli`).
    #[must_use]
    pub fn total_gpu_milli(&self) -> u64 {
        u64::from(self.num_gpu) * u64::from(self.gpu_milli)
    }

    /// True for a fractional (shared-GPU) pod.
    #[must_use]
    pub fn is_fractional(&self) -> bool {
        self.num_gpu == 1 && self.gpu_milli < 1000
    }

    /// The `gpu_spec` as it appears in the trace (`|`-joined), used as part of a pod's shape.
    #[must_use]
    pub fn gpu_spec_key(&self) -> String {
        self.gpu_spec.join("|")
    }
}

/// The most rows a trace may have. Every row becomes a pod or node the simulator keeps (and a
/// replay keeps events per pod), so rows size memory; the largest public GPU cluster traces have
/// about 8,000 pods (Alibaba's openb), so a million is far beyond any real trace while its model
/// stays under a few GiB.
pub const MAX_TRACE_ROWS: usize = 1_000_000;

const NODE_REQUIRED: &[&str] = &["sn", "cpu_milli", "memory_mib", "gpu", "model"];
const POD_REQUIRED: &[&str] = &["name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli"];
const POD_OPTIONAL: &[&str] = &[
    "gpu_spec",
    "qos",
    "pod_phase",
    "creation_time",
    "deletion_time",
    "scheduled_time",
];

/// Column positions resolved from a header line.
struct Header<'a> {
    file: &'a str,
    names: Vec<String>,
}

impl<'a> Header<'a> {
    fn parse(
        file: &'a str,
        names: Vec<String>,
        required: &[&str],
        optional: &[&str],
    ) -> Result<Self> {
        for (i, n) in names.iter().enumerate() {
            if !required.contains(&n.as_str()) && !optional.contains(&n.as_str()) {
                return Err(perr(
                    file,
                    1,
                    format!(
                        "unknown column {n:?} in header (expected {})",
                        required
                            .iter()
                            .chain(optional.iter())
                            .copied()
                            .collect::<Vec<_>>()
                            .join(",")
                    ),
                ));
            }
            if names[..i].contains(n) {
                return Err(perr(file, 1, format!("duplicate column {n:?} in header")));
            }
        }
        for r in required {
            if !names.iter().any(|n| n == r) {
                return Err(perr(file, 1, format!("missing column {r:?} in header")));
            }
        }
        Ok(Self { file, names })
    }

    fn index(&self, name: &str) -> Option<usize> {
        self.names.iter().position(|n| n == name)
    }
}

fn perr(file: &str, line: usize, message: String) -> PackingError {
    PackingError::Parse {
        file: file.to_string(),
        line,
        message,
    }
}

/// A data row split into fields, with typed accessors that produce located errors.
struct Row<'a, 'h> {
    header: &'h Header<'a>,
    line: usize,
    fields: csv::StringRecord,
}

impl Row<'_, '_> {
    fn str(&self, name: &str) -> &str {
        self.header
            .index(name)
            .and_then(|i| self.fields.get(i))
            .unwrap_or("")
    }

    fn int(&self, name: &str) -> Result<u64> {
        let v = self.str(name);
        v.parse::<u64>().map_err(|_| {
            let problem = if !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()) {
                format!("is more than {}, the largest value", u64::MAX)
            } else {
                "is not an integer".to_string()
            };
            perr(
                self.header.file,
                self.line,
                format!("column {name}: {v:?} {problem}"),
            )
        })
    }

    fn err(&self, message: String) -> PackingError {
        perr(self.header.file, self.line, message)
    }
}

/// The 1-based line a csv error (or the record it was reading) starts on.
fn csv_line(e: &csv::Error) -> usize {
    let position = match e.kind() {
        csv::ErrorKind::Utf8 { pos, .. } => pos.as_ref(),
        csv::ErrorKind::UnequalLengths { pos, .. } => pos.as_ref(),
        csv::ErrorKind::Deserialize { pos, .. } => pos.as_ref(),
        _ => e.position(),
    };
    position.map_or(1, |p| usize::try_from(p.line()).unwrap_or(usize::MAX))
}

fn csv_err(file: &str, e: &csv::Error) -> PackingError {
    let message = match e.kind() {
        csv::ErrorKind::Utf8 { err, .. } => {
            format!("field {} is not valid UTF-8", err.field() + 1)
        }
        _ => e.to_string(),
    };
    perr(file, csv_line(e), message)
}

/// Reads `text` as CSV: the header (line 1) and every data row, each with the line it starts on.
/// Blank lines are skipped.
fn read_csv<'a>(
    file: &'a str,
    text: &str,
    required: &[&str],
    optional: &[&str],
) -> Result<(Header<'a>, Vec<(usize, csv::StringRecord)>)> {
    let mut reader = csv::ReaderBuilder::new()
        .has_headers(false)
        .flexible(true)
        .trim(csv::Trim::All)
        .from_reader(text.as_bytes());
    let mut header: Option<Header<'a>> = None;
    let mut rows = Vec::new();
    for record in reader.records() {
        let record = record.map_err(|e| csv_err(file, &e))?;
        let line = record
            .position()
            .map_or(1, |p| usize::try_from(p.line()).unwrap_or(usize::MAX));
        // Whitespace-only lines read as one empty field.
        if record.len() == 1 && record.get(0).is_some_and(str::is_empty) {
            continue;
        }
        if let Some(i) = record
            .iter()
            .position(|f| f.contains('\n') || f.contains('\r'))
        {
            let name = header
                .as_ref()
                .and_then(|h| h.names.get(i))
                .map_or_else(|| format!("field {}", i + 1), |n| format!("column {n}"));
            return Err(perr(
                file,
                line,
                format!(
                    "{name}: a quoted value runs past the end of the line (an unterminated quote?)"
                ),
            ));
        }
        match &header {
            None => {
                if line != 1 {
                    return Err(perr(file, 1, "empty file: no header line".to_string()));
                }
                let names = record.iter().map(str::to_string).collect();
                // Validated before any row, as users fix files top down.
                header = Some(Header::parse(file, names, required, optional)?);
            }
            Some(Header { names: h, .. }) => {
                if record.len() != h.len() {
                    return Err(perr(
                        file,
                        line,
                        format!(
                            "row has {} fields, header has {} ({})",
                            record.len(),
                            h.len(),
                            h.join(",")
                        ),
                    ));
                }
                if rows.len() == MAX_TRACE_ROWS {
                    return Err(perr(
                        file,
                        line,
                        format!(
                            "more than {MAX_TRACE_ROWS} rows, the most a trace may have; split the trace"
                        ),
                    ));
                }
                rows.push((line, record));
            }
        }
    }
    let Some(header) = header else {
        return Err(perr(file, 1, "empty file: no header line".to_string()));
    };
    Ok((header, rows))
}

/// Parses a node list. `file` is used only in error messages.
///
/// # Errors
/// [`PackingError::Parse`] naming file, line, column and value for any malformed row or header.
pub fn parse_nodes(file: &str, text: &str) -> Result<Vec<NodeSpec>> {
    let (header, records) = read_csv(file, text, NODE_REQUIRED, &[])?;
    let mut out = Vec::new();
    for (line, fields) in records {
        let row = Row {
            header: &header,
            line,
            fields,
        };
        let gpus = row.int("gpu")?;
        let gpus = u32::try_from(gpus)
            .ok()
            .filter(|g| *g <= 64)
            .ok_or_else(|| row.err(format!("column gpu: {gpus} GPUs on one node (at most 64)")))?;
        out.push(NodeSpec {
            name: row.str("sn").to_string(),
            cpu_milli: row.int("cpu_milli")?,
            memory_mib: row.int("memory_mib")?,
            gpus,
            model: row.str("model").to_string(),
        });
    }
    if out.is_empty() {
        return Err(perr(file, 2, "no node rows after the header".to_string()));
    }
    Ok(out)
}

/// Parses a pod list. `file` is used only in error messages.
///
/// # Errors
/// [`PackingError::Parse`] naming file, line, column and value for any malformed row or header,
/// including `gpu_milli > 1000`, a fractional request on more than one GPU, and GPU milli without
/// GPUs (or GPUs without milli).
pub fn parse_pods(file: &str, text: &str) -> Result<Vec<PodSpec>> {
    let (header, records) = read_csv(file, text, POD_REQUIRED, POD_OPTIONAL)?;
    let mut out = Vec::new();
    for (line, fields) in records {
        let row = Row {
            header: &header,
            line,
            fields,
        };
        let num_gpu = row.int("num_gpu")?;
        let gpu_milli = row.int("gpu_milli")?;
        if gpu_milli > 1000 {
            return Err(row.err(format!(
                "column gpu_milli: {gpu_milli} is more than 1000 (one whole GPU)"
            )));
        }
        if num_gpu > 64 {
            return Err(row.err(format!("column num_gpu: {num_gpu} is more than 64")));
        }
        if num_gpu > 1 && gpu_milli < 1000 {
            return Err(row.err(format!(
                "column gpu_milli: {gpu_milli} is fractional but num_gpu is {num_gpu} (fractional pods use exactly one GPU)"
            )));
        }
        if num_gpu == 0 && gpu_milli != 0 {
            return Err(row.err(format!(
                "column gpu_milli: {gpu_milli} with num_gpu 0 (a CPU-only pod has gpu_milli 0)"
            )));
        }
        if num_gpu > 0 && gpu_milli == 0 {
            return Err(row.err(format!(
                "column gpu_milli: 0 with num_gpu {num_gpu} (a GPU pod requests 1..=1000 milli per GPU)"
            )));
        }
        let gpu_spec = row
            .str("gpu_spec")
            .split('|')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_string)
            .collect();
        out.push(PodSpec {
            name: row.str("name").to_string(),
            cpu_milli: row.int("cpu_milli")?,
            memory_mib: row.int("memory_mib")?,
            num_gpu: u32::try_from(num_gpu).unwrap_or(u32::MAX),
            gpu_milli: u32::try_from(gpu_milli).unwrap_or(u32::MAX),
            gpu_spec,
        });
    }
    if out.is_empty() {
        return Err(perr(file, 2, "no pod rows after the header".to_string()));
    }
    Ok(out)
}

fn read(path: &Path) -> Result<(String, String)> {
    let io = |message: String| PackingError::Io {
        path: path.to_path_buf(),
        message,
    };
    let file = std::fs::File::open(path).map_err(|e| io(e.to_string()))?;
    let text = gpuops_yamlpos::read_text(file, gpuops_yamlpos::MAX_TRACE_BYTES, "a trace")
        .map_err(|e| io(e.to_string()))?;
    let name = path.file_name().map_or_else(
        || path.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    );
    Ok((name, text))
}

/// Reads and parses a node list file (the only file-reading helper of the crate).
///
/// # Errors
/// [`PackingError::Io`] if the file cannot be read, else as [`parse_nodes`].
pub fn read_nodes_file(path: &Path) -> Result<Vec<NodeSpec>> {
    let (name, text) = read(path)?;
    parse_nodes(&name, &text)
}

/// Reads and parses a pod list file.
///
/// # Errors
/// [`PackingError::Io`] if the file cannot be read, else as [`parse_pods`].
pub fn read_pods_file(path: &Path) -> Result<Vec<PodSpec>> {
    let (name, text) = read(path)?;
    parse_pods(&name, &text)
}

#[cfg(test)]
mod tests {
    use super::*;

    const POD_HEADER: &str = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time";

    fn pods(body: &str) -> Result<Vec<PodSpec>> {
        parse_pods("openb_pod_list_x.csv", &format!("{POD_HEADER}\n{body}"))
    }

    fn msg(r: Result<Vec<PodSpec>>) -> String {
        r.unwrap_err().to_string()
    }

    #[test]
    fn parses_nodes_and_pods() {
        let n = parse_nodes(
            "n.csv",
            "sn,cpu_milli,memory_mib,gpu,model\nn0,64000,262144,2,P100\nn1,32000,1000,0,\n",
        )
        .unwrap();
        assert_eq!(n.len(), 2);
        assert_eq!(n[0].gpus, 2);
        assert_eq!(n[0].model, "P100");
        assert_eq!(n[1].model, "");
        let p = pods("p0,12000,16384,1,460,V100M16|V100M32,LS,Running,0,1,0\np1,6000,1,0,0,,BE,Running,0,1,0").unwrap();
        assert_eq!(p[0].gpu_spec, vec!["V100M16", "V100M32"]);
        assert!(p[0].is_fractional());
        assert_eq!(p[1].total_gpu_milli(), 0);
    }

    #[test]
    fn columns_by_name_in_any_order_and_short_multigpu_format() {
        let p = parse_pods(
            "m.csv",
            "gpu_milli,num_gpu,name,memory_mib,cpu_milli\n1000,8,big,100,32000\n",
        )
        .unwrap();
        assert_eq!(p[0].num_gpu, 8);
        assert_eq!(p[0].cpu_milli, 32000);
        assert!(p[0].gpu_spec.is_empty());
    }

    #[test]
    fn non_number_names_file_line_column_value() {
        let m = msg(pods(
            "p0,1,1,1,500,,LS,Running,0,1,0\np1,1,1,1,abc,,LS,Running,0,1,0",
        ));
        assert_eq!(
            m,
            "openb_pod_list_x.csv:3: column gpu_milli: \"abc\" is not an integer"
        );
    }

    #[test]
    fn missing_column_in_row() {
        let m = msg(pods("p0,1,1"));
        assert!(
            m.starts_with("openb_pod_list_x.csv:2: row has 3 fields, header has 11"),
            "{m}"
        );
        // A row one field short used to pass when the missing field was an optional one.
        let m = msg(pods("p0,1,1,1,500,,LS,Running,0,1"));
        assert!(m.contains(":2: row has 10 fields, header has 11"), "{m}");
    }

    #[test]
    fn quoted_fields_are_read_as_csv() {
        let p = pods(
            "\"p,0\",1,1,1,500,\"V100M16|V100M32\",LS,Running,0,1,0\r\n\"say \"\"hi\"\"\",1,1,0,0,,BE,Running,0,1,0",
        )
        .unwrap();
        assert_eq!(p[0].name, "p,0");
        assert_eq!(p[0].gpu_spec, vec!["V100M16", "V100M32"]);
        assert_eq!(p[1].name, "say \"hi\"");
    }

    #[test]
    fn an_unterminated_quote_is_an_error_at_its_line_not_lost_rows() {
        // The old reader split on commas and dropped what followed; every row must be accounted
        // for or the file refused.
        let m = msg(pods(
            "p0,1,1,1,500,,LS,Running,0,1,0\n\"p1,1,1,1,500,,LS,Running,0,1,0\np2,1,1,1,500,,LS,Running,0,1,0\n",
        ));
        assert!(
            m.starts_with(
                "openb_pod_list_x.csv:3: column name: a quoted value runs past the end of the line"
            ),
            "{m}"
        );
        let m = msg(pods("p0,1,1,1,500,\"V100M16,LS,Running,0,1,0"));
        assert!(
            m.starts_with("openb_pod_list_x.csv:2: row has 6 fields"),
            "{m}"
        );
    }

    #[test]
    fn blank_lines_are_skipped_and_lines_stay_true() {
        let m = msg(pods(
            "p0,1,1,1,500,,LS,Running,0,1,0\n\n   \np1,1,1,1,x,,LS,Running,0,1,0",
        ));
        assert_eq!(
            m,
            "openb_pod_list_x.csv:5: column gpu_milli: \"x\" is not an integer"
        );
    }

    #[test]
    fn too_many_fields() {
        let m = msg(pods("p0,1,1,1,500,,LS,Running,0,1,0,extra"));
        assert!(m.contains(":2: row has 12 fields"), "{m}");
    }

    #[test]
    fn gpu_milli_over_1000() {
        let m = msg(pods("p0,1,1,1,1500,,LS,Running,0,1,0"));
        assert!(
            m.contains(":2: column gpu_milli: 1500 is more than 1000"),
            "{m}"
        );
    }

    #[test]
    fn fractional_multi_gpu() {
        let m = msg(pods("p0,1,1,2,500,,LS,Running,0,1,0"));
        assert!(
            m.contains(":2: column gpu_milli: 500 is fractional but num_gpu is 2"),
            "{m}"
        );
    }

    #[test]
    fn milli_without_gpu_and_gpu_without_milli() {
        assert!(msg(pods("p0,1,1,0,500,,LS,Running,0,1,0")).contains("with num_gpu 0"));
        assert!(msg(pods("p0,1,1,1,0,,LS,Running,0,1,0")).contains("0 with num_gpu 1"));
    }

    #[test]
    fn empty_file_and_header_only() {
        let m = parse_pods("e.csv", "").unwrap_err().to_string();
        assert_eq!(m, "e.csv:1: empty file: no header line");
        let m = parse_nodes("e.csv", "sn,cpu_milli,memory_mib,gpu,model\n")
            .unwrap_err()
            .to_string();
        assert!(m.contains("no node rows"), "{m}");
    }

    #[test]
    fn unknown_missing_and_duplicate_header() {
        let m = parse_pods(
            "h.csv",
            "name,cpu_milli,memory_mib,num_gpu,gpu_milli,colour\n",
        )
        .unwrap_err()
        .to_string();
        assert!(m.starts_with("h.csv:1: unknown column \"colour\""), "{m}");
        let m = parse_nodes("h.csv", "sn,cpu_milli,gpu,model\nn,1,1,T4\n")
            .unwrap_err()
            .to_string();
        assert_eq!(m, "h.csv:1: missing column \"memory_mib\" in header");
        let m = parse_nodes("h.csv", "sn,sn,cpu_milli,memory_mib,gpu,model\n")
            .unwrap_err()
            .to_string();
        assert!(m.contains("duplicate column \"sn\""), "{m}");
    }

    #[test]
    fn node_bad_values() {
        let m = parse_nodes("n.csv", "sn,cpu_milli,memory_mib,gpu,model\nn0,-5,1,1,T4\n")
            .unwrap_err()
            .to_string();
        assert_eq!(m, "n.csv:2: column cpu_milli: \"-5\" is not an integer");
        let m = parse_nodes(
            "n.csv",
            "sn,cpu_milli,memory_mib,gpu,model\nn0,5,1,100,T4\n",
        )
        .unwrap_err()
        .to_string();
        assert!(m.contains("column gpu: 100 GPUs"), "{m}");
    }

    #[test]
    fn read_helper_reports_missing_file() {
        let e = read_pods_file(Path::new("/nonexistent/x.csv")).unwrap_err();
        assert!(matches!(e, PackingError::Io { .. }));
    }

    #[test]
    fn traces_are_bounded_in_rows_and_bytes_and_name_too_large_values() {
        let m = msg(pods(
            "p,1,1,1,1000,,,,,,\np2,99999999999999999999,1,1,1000,,,,,,\n",
        ));
        assert_eq!(
            m,
            "openb_pod_list_x.csv:3: column cpu_milli: \"99999999999999999999\" is more than 18446744073709551615, the largest value"
        );
        let rows = "n,1,1,0,\n".repeat(MAX_TRACE_ROWS + 1);
        let m = parse_nodes(
            "n.csv",
            &format!("sn,cpu_milli,memory_mib,gpu,model\n{rows}"),
        )
        .unwrap_err()
        .to_string();
        assert_eq!(
            m,
            format!(
                "n.csv:{}: more than 1000000 rows, the most a trace may have; split the trace",
                MAX_TRACE_ROWS + 2
            )
        );
        let dir = std::env::temp_dir().join(format!("gpuops-trace-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("u16.csv");
        let utf16: Vec<u8> = "sn,cpu_milli,memory_mib,gpu,model\n"
            .encode_utf16()
            .flat_map(u16::to_le_bytes)
            .collect();
        std::fs::write(&path, utf16).unwrap();
        let m = read_nodes_file(&path).unwrap_err().to_string();
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(
            m.contains("u16.csv: the file is UTF-16 (little-endian) text, not UTF-8"),
            "{m}"
        );
    }
}
