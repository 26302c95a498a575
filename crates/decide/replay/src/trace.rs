//! Pod traces with time: the openb pod lists' `creation_time` and `deletion_time` (seconds),
//! on top of the packing crate's reading of the resource columns.

use crate::error::ReplayError;
use gpuops_packing::PodSpec;

/// One trace pod with its lifetime.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TimedPod {
    pub spec: PodSpec,
    /// Seconds from the trace's start.
    pub creation: u64,
    /// Seconds from the trace's start; `None` when the trace leaves it empty.
    pub deletion: Option<u64>,
    /// 1-based line in the file.
    pub line: u64,
}

/// Parses a pod list with `creation_time` and `deletion_time` columns.
///
/// # Errors
/// [`ReplayError::Packing`] for the resource columns (the packing crate names file, line and
/// column); [`ReplayError::Trace`] for missing or malformed time columns.
pub fn parse_timed_pods(file: &str, text: &str) -> Result<Vec<TimedPod>, ReplayError> {
    let specs =
        gpuops_packing::parse_pods(file, text).map_err(|e| ReplayError::Packing(e.to_string()))?;
    let terr = |line: u64, message: String| ReplayError::Trace {
        file: file.to_string(),
        line,
        message,
    };
    let mut reader = csv::ReaderBuilder::new()
        .has_headers(true)
        .from_reader(text.as_bytes());
    let header = reader
        .headers()
        .map_err(|e| terr(1, e.to_string()))?
        .clone();
    let col = |name: &str| header.iter().position(|h| h.trim() == name);
    let (Some(c), Some(d)) = (col("creation_time"), col("deletion_time")) else {
        return Err(terr(
            1,
            "the header has no creation_time and deletion_time columns; a replay needs both (openb_pod_list_multigpu20.csv has none)".into(),
        ));
    };
    let mut out = Vec::with_capacity(specs.len());
    for (rec, spec) in reader.records().zip(specs) {
        let rec =
            rec.map_err(|e| terr(e.position().map_or(0, csv::Position::line), e.to_string()))?;
        let line = rec.position().map_or(0, csv::Position::line);
        let num = |i: usize, name: &str| -> Result<Option<u64>, ReplayError> {
            let v = rec.get(i).unwrap_or("").trim();
            if v.is_empty() {
                return Ok(None);
            }
            v.parse::<u64>().map(Some).map_err(|_| {
                terr(
                    line,
                    format!("column {name}: {v:?} is not a whole number of seconds"),
                )
            })
        };
        let creation = num(c, "creation_time")?
            .ok_or_else(|| terr(line, "column creation_time is empty".into()))?;
        let deletion = num(d, "deletion_time")?;
        out.push(TimedPod {
            spec,
            creation,
            deletion,
            line,
        });
    }
    Ok(out)
}
