//! Reading an input file's bytes as text, with a size limit and an encoding check that says what
//! the file is when it is not UTF-8 (UTF-16 and UTF-32 files are common on Windows hosts).
//! Every config, fleet, pools and trace reader goes through [`read_text`], so each input gets
//! the same limit and the same messages.

use crate::YamlposError;
use std::io::Read;

/// The most bytes a config-like YAML input (device plugin config, mig-parted config or the
/// ConfigMap manifest holding one, fleet file, pools file) may have. A ConfigMap holds at most
/// 1 MiB, NVIDIA's largest shipped mig-parted manifest is under 100 KiB; 4 MiB leaves room for
/// multi-document manifests and stays far below what the YAML tree of such a file costs in
/// memory (about 100 bytes of tree per byte of YAML in the worst case).
pub const MAX_CONFIG_BYTES: u64 = 4 << 20;

/// The most bytes a trace (a pod or node list CSV) may have: the largest public GPU cluster
/// traces (Alibaba's openb, 8,152 pods) are under 2 MiB; 256 MiB is over a million rows.
pub const MAX_TRACE_BYTES: u64 = 256 << 20;

/// `4 MiB (4194304 bytes)`: a byte limit as people read it, with the exact number.
pub fn human_bytes(n: u64) -> String {
    if n >= 1 << 20 && n.is_multiple_of(1 << 20) {
        format!("{} MiB ({n} bytes)", n >> 20)
    } else if n >= 1 << 10 && n.is_multiple_of(1 << 10) {
        format!("{} KiB ({n} bytes)", n >> 10)
    } else {
        format!("{n} bytes")
    }
}

/// Reads at most `max` bytes (one more to notice a larger input, never the whole of a huge
/// file) and decodes them with [`decode`]. `what` names the kind of input in the size message
/// ("a device plugin config").
pub fn read_text<R: Read>(reader: R, max: u64, what: &str) -> Result<String, YamlposError> {
    let mut bytes = Vec::new();
    reader
        .take(max.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(|e| YamlposError::Read {
            message: e.to_string(),
        })?;
    decode(bytes, max, what)
}

/// Checks the size and the encoding of an input's bytes and gives its text. A UTF-8 byte order
/// mark is dropped (editors on Windows write one; YAML and CSV readers do not expect it).
pub fn decode(bytes: Vec<u8>, max: u64, what: &str) -> Result<String, YamlposError> {
    if u64::try_from(bytes.len()).map_or(true, |n| n > max) {
        return Err(YamlposError::TooLarge {
            what: what.to_string(),
            limit: human_bytes(max),
        });
    }
    if let Some(encoding) = wide_encoding(&bytes) {
        return Err(YamlposError::WideEncoding {
            encoding: encoding.name,
            bom: encoding.bom,
            iconv: encoding.iconv,
        });
    }
    match String::from_utf8(bytes) {
        Ok(mut text) => {
            if text.starts_with('\u{feff}') {
                text.drain(..'\u{feff}'.len_utf8());
            }
            Ok(text)
        }
        Err(e) => {
            let bytes = e.as_bytes();
            let at = e.utf8_error().valid_up_to();
            let before = &bytes[..at];
            let line = before.iter().filter(|&&b| b == b'\n').count() + 1;
            let line_start = before
                .iter()
                .rposition(|&b| b == b'\n')
                .map_or(0, |p| p + 1);
            // `before` is valid UTF-8, so this counts characters, as editors show columns.
            let column = String::from_utf8_lossy(&before[line_start..])
                .chars()
                .count()
                + 1;
            Err(YamlposError::NotUtf8 {
                byte: bytes.get(at).copied().unwrap_or(0),
                line: line as u64,
                column: column as u64,
            })
        }
    }
}

struct Wide {
    name: &'static str,
    iconv: &'static str,
    bom: bool,
}

/// UTF-32 and UTF-16, by byte order mark or, without one, by the NUL bytes that ASCII text in
/// those encodings has in every other (or three of four) byte. UTF-32's marks are checked first:
/// UTF-32LE's begins with UTF-16LE's.
fn wide_encoding(b: &[u8]) -> Option<Wide> {
    let wide = |name, iconv, bom| Some(Wide { name, iconv, bom });
    if b.starts_with(&[0xFF, 0xFE, 0, 0]) {
        return wide("UTF-32 (little-endian)", "UTF-32LE", true);
    }
    if b.starts_with(&[0, 0, 0xFE, 0xFF]) {
        return wide("UTF-32 (big-endian)", "UTF-32BE", true);
    }
    if b.starts_with(&[0xFF, 0xFE]) {
        return wide("UTF-16 (little-endian)", "UTF-16LE", true);
    }
    if b.starts_with(&[0xFE, 0xFF]) {
        return wide("UTF-16 (big-endian)", "UTF-16BE", true);
    }
    // Without a mark: look at the first few hundred bytes of text.
    let head = &b[..b.len().min(512)];
    if head.len() < 4 || !head.contains(&0) {
        return None;
    }
    let zero_at = |phase: usize, step: usize| {
        let picked: Vec<u8> = head.iter().skip(phase).step_by(step).copied().collect();
        !picked.is_empty() && picked.iter().filter(|&&x| x == 0).count() * 10 >= picked.len() * 9
    };
    if zero_at(1, 4) && zero_at(2, 4) && zero_at(3, 4) {
        return wide("UTF-32 (little-endian)", "UTF-32LE", false);
    }
    if zero_at(0, 4) && zero_at(1, 4) && zero_at(2, 4) {
        return wide("UTF-32 (big-endian)", "UTF-32BE", false);
    }
    if zero_at(1, 2) {
        return wide("UTF-16 (little-endian)", "UTF-16LE", false);
    }
    if zero_at(0, 2) {
        return wide("UTF-16 (big-endian)", "UTF-16BE", false);
    }
    None
}
