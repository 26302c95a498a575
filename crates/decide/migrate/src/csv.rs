//! dcgm-exporter's metrics CSV (`dcgm-metrics.csv`: `field, type, help` per line) against the
//! fields gpuops serves.

use crate::MigrateError;

/// One line of the CSV.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CsvField {
    pub name: String,
    pub kind: String,
    pub line: usize,
}

/// The CSV's fields; a line that is not `name, type[, help]` is an error with its line number.
pub(crate) fn parse(text: &str, object: &str, field: &str) -> Result<Vec<CsvField>, MigrateError> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let mut cols = line.splitn(3, ',').map(str::trim);
        let name = cols.next().unwrap_or_default();
        let kind = cols.next().unwrap_or_default();
        let known_kind = matches!(
            kind,
            "gauge" | "counter" | "label" | "histogram" | "summary"
        );
        if name.is_empty() || !known_kind {
            return Err(MigrateError::BadValue {
                object: object.to_string(),
                field: format!("{field} line {}", i + 1),
                problem: format!(
                    "{line:?} is not `DCGM_FI_FIELD, gauge|counter|label, help` as dcgm-exporter reads it"
                ),
            });
        }
        out.push(CsvField {
            name: name.to_string(),
            kind: kind.to_string(),
            line: i + 1,
        });
    }
    Ok(out)
}

/// Whether gpuops's exporter writes a metric family of this name.
pub fn served(name: &str) -> bool {
    name == gpuops_metrics::dcgm::XID_ERRORS
        || gpuops_metrics::dcgm::FIELDS.iter().any(|f| f.name == name)
}
