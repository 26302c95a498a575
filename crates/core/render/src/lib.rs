//! Output shared by the CLI's commands: borderless kubectl-style tables and `-o json|yaml`.
//!
//! The library crates render their own data with these (each in its `render` module); the binary
//! only prints what they return.
#![forbid(unsafe_code)]

use comfy_table::{Table, presets};
use serde::Serialize;

pub use comfy_table;

/// A value that could not be serialised for `-o json|yaml`.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("rendering JSON: {0}")]
    Json(#[from] serde_json::Error),
    #[error("rendering YAML: {0}")]
    Yaml(#[from] serde_saphyr::SerializeError),
}

/// Output format of commands that print data, as kubectl spells them (`-o wide`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum Format {
    Table,
    /// The table with the columns that do not fit a narrow terminal.
    Wide,
    Json,
    Yaml,
}

impl Format {
    /// Whether a table should carry its extra columns.
    pub fn wide(self) -> bool {
        self == Format::Wide
    }
}

/// Serialises for `-o json|yaml`; `None` for tables (plain or wide), which each command renders
/// itself.
pub fn structured<T: Serialize + ?Sized>(
    value: &T,
    format: Format,
) -> Result<Option<String>, Error> {
    Ok(match format {
        Format::Json => Some(json(value)?),
        Format::Yaml => Some(serde_saphyr::to_string(&value)?),
        Format::Table | Format::Wide => None,
    })
}

/// Pretty JSON with a final newline.
pub fn json<T: Serialize + ?Sized>(value: &T) -> Result<String, Error> {
    Ok(serde_json::to_string_pretty(value)? + "\n")
}

/// A table whose `wide` columns appear only with `-o wide`, like kubectl's: rows are given with
/// every column and the narrow view drops the wide ones.
pub struct Columns {
    header: Vec<(&'static str, bool)>,
    rows: Vec<Vec<String>>,
    wide: bool,
}

impl Columns {
    /// `header` pairs each column name with whether it is a wide-only column.
    pub fn new(header: &[(&'static str, bool)], wide: bool) -> Columns {
        Columns {
            header: header.to_vec(),
            rows: Vec::new(),
            wide,
        }
    }

    /// A row with a cell for every column, wide ones included.
    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    fn keep(&self, i: usize) -> bool {
        self.wide || self.header.get(i).is_some_and(|(_, wide)| !wide)
    }

    /// The rendered table.
    pub fn render(&self) -> String {
        let names: Vec<&str> = self
            .header
            .iter()
            .enumerate()
            .filter(|(i, _)| self.keep(*i))
            .map(|(_, (n, _))| *n)
            .collect();
        let mut t = table(&names);
        for r in &self.rows {
            t.add_row(
                r.iter()
                    .enumerate()
                    .filter(|(i, _)| self.keep(*i))
                    .map(|(_, c)| c.clone())
                    .collect::<Vec<_>>(),
            );
        }
        t.to_string()
    }
}

/// A borderless, kubectl-style table.
pub fn table<S: ToString>(header: &[S]) -> Table {
    let mut t = Table::new();
    t.load_preset(presets::NOTHING)
        .set_header(header.iter().map(ToString::to_string).collect::<Vec<_>>());
    t
}

/// `-` for a missing value, else the value with its unit.
pub fn opt<T: std::fmt::Display>(v: Option<T>, unit: &str) -> String {
    v.map_or_else(|| "-".into(), |v| format!("{v}{unit}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Serialize)]
    struct Row {
        a: u32,
    }

    #[test]
    fn wide_columns_only_with_wide() {
        let mut narrow = Columns::new(&[("A", false), ("B", true)], false);
        narrow.row(vec!["1".into(), "2".into()]);
        let text = narrow.render();
        assert!(
            text.contains('A') && !text.contains('B') && !text.contains('2'),
            "{text}"
        );
        let mut wide = Columns::new(&[("A", false), ("B", true)], true);
        wide.row(vec!["1".into(), "2".into()]);
        assert!(wide.render().contains("B"));
    }

    #[test]
    fn structured_is_none_for_tables() {
        assert!(structured(&Row { a: 1 }, Format::Table).unwrap().is_none());
        assert!(structured(&Row { a: 1 }, Format::Wide).unwrap().is_none());
        assert_eq!(
            structured(&Row { a: 1 }, Format::Json).unwrap().unwrap(),
            "{\n  \"a\": 1\n}\n"
        );
        assert_eq!(
            structured(&Row { a: 1 }, Format::Yaml).unwrap().unwrap(),
            "a: 1\n"
        );
    }
}
