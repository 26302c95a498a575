//! GFD's `.product` value (sanitised, suffixed, kept within 63 characters) and `.family` value.

use gpuops_catalog::Family;

/// Longest Kubernetes label value.
pub const MAX_LABEL_VALUE_LEN: usize = 63;

/// GFD's sanitising of one product-name part: drops every character but `A-Z a-z 0-9 - _ .` and
/// space, then joins the remaining words with `-` (`NVIDIA TITAN X (Pascal)` ->
/// `NVIDIA-TITAN-X-Pascal`).
pub fn sanitise(part: &str) -> String {
    let kept: String = part
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ' '))
        .collect();
    kept.split_whitespace().collect::<Vec<_>>().join("-")
}

fn trim_to_alnum_end(s: &str) -> &str {
    s.trim_end_matches(|c: char| !c.is_ascii_alphanumeric())
}

/// The `.product` label value from name parts (`[model]`, or `[model, "MIG", profile]`), with
/// `-SHARED` appended when `shared` (shared and not renamed).
///
/// Each part is [`sanitise`]d and empty parts are dropped; parts are joined with `-`. When the
/// result is longer than 63 characters the model (first part) is cut so that the rest (`-MIG-…`,
/// `-SHARED`) survives, and separators left at the cut are trimmed. Returns an empty string when
/// every part is empty.
pub fn product_label(parts: &[&str], shared: bool) -> String {
    let mut clean: Vec<String> = parts
        .iter()
        .map(|p| sanitise(p))
        .filter(|p| !p.is_empty())
        .collect();
    if clean.is_empty() {
        return String::new();
    }
    if shared {
        clean.push("SHARED".to_string());
    }
    let model = clean.remove(0);
    let suffix: String = clean.iter().map(|p| format!("-{p}")).collect();
    if model.len() + suffix.len() <= MAX_LABEL_VALUE_LEN {
        return format!("{model}{suffix}");
    }
    // Sanitised text is ASCII, so byte positions are character positions.
    let budget = MAX_LABEL_VALUE_LEN.saturating_sub(suffix.len());
    let cut = trim_to_alnum_end(&model[..budget.min(model.len())]);
    if cut.is_empty() {
        // The suffix alone does not fit: keep what fits of the whole value.
        let whole = format!("{model}{suffix}");
        return trim_to_alnum_end(&whole[..MAX_LABEL_VALUE_LEN]).to_string();
    }
    format!("{cut}{suffix}")
}

/// GFD's `.family` value for a CUDA compute capability: the catalog's families (volta, turing,
/// ampere, ada-lovelace, hopper, blackwell), GFD's names for older majors, else `undefined`.
pub fn family_label(major: u32, minor: u32) -> &'static str {
    if let Some(f) = Family::from_compute_capability(major, minor) {
        return f.as_str();
    }
    match major {
        1 => "tesla",
        2 => "fermi",
        3 => "kepler",
        5 => "maxwell",
        6 => "pascal",
        // Minors the catalog's table does not list fall where GFD puts them.
        7 => "turing",
        8 => "ada-lovelace",
        _ => "undefined",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sanitising_parts() {
        let cases = [
            ("NVIDIA A100-SXM4-80GB", "NVIDIA-A100-SXM4-80GB"),
            ("NVIDIA H100 80GB HBM3", "NVIDIA-H100-80GB-HBM3"),
            ("NVIDIA A100 80GB PCIe", "NVIDIA-A100-80GB-PCIe"),
            ("NVIDIA TITAN X (Pascal)", "NVIDIA-TITAN-X-Pascal"),
            ("  Tesla   V100-SXM2-16GB ", "Tesla-V100-SXM2-16GB"),
            ("a/b [c] / d", "ab-c-d"),
            ("keep-these_chars.ok", "keep-these_chars.ok"),
            ("GeForce RTX™ 4090", "GeForce-RTX-4090"),
            ("1g.10gb", "1g.10gb"),
            ("", ""),
        ];
        for (input, want) in cases {
            assert_eq!(sanitise(input), want, "{input:?}");
        }
    }

    #[test]
    fn product_values() {
        let long = "NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition"; // 55 sanitised
        let cases: [(&[&str], bool, &str); 9] = [
            (&["NVIDIA A100-SXM4-80GB"], false, "NVIDIA-A100-SXM4-80GB"),
            (
                &["NVIDIA H100 80GB HBM3"],
                true,
                "NVIDIA-H100-80GB-HBM3-SHARED",
            ),
            (
                &["NVIDIA A100-SXM4-80GB", "MIG", "1g.10gb"],
                false,
                "NVIDIA-A100-SXM4-80GB-MIG-1g.10gb",
            ),
            (
                &["NVIDIA A100-SXM4-80GB", "MIG", "1g.10gb"],
                true,
                "NVIDIA-A100-SXM4-80GB-MIG-1g.10gb-SHARED",
            ),
            (
                &["NVIDIA A100-SXM4-80GB", "MIG", "INVALID"],
                false,
                "NVIDIA-A100-SXM4-80GB-MIG-INVALID",
            ),
            // Too long: the model is cut, the MIG profile and SHARED stay.
            (
                &[long, "MIG", "1g.24gb"],
                false,
                "NVIDIA-RTX-PRO-6000-Blackwell-Max-Q-Workstation-Edi-MIG-1g.24gb",
            ),
            // The cut lands after a '-', which is trimmed.
            (
                &[long, "MIG", "1g.24gb.me"],
                false,
                "NVIDIA-RTX-PRO-6000-Blackwell-Max-Q-Workstation-MIG-1g.24gb.me",
            ),
            (
                &[long, "MIG", "1g.24gb"],
                true,
                "NVIDIA-RTX-PRO-6000-Blackwell-Max-Q-Workstat-MIG-1g.24gb-SHARED",
            ),
            (&["", ""], true, ""),
        ];
        for (parts, shared, want) in cases {
            let got = product_label(parts, shared);
            assert_eq!(got, want, "{parts:?} shared={shared}");
            assert!(got.len() <= MAX_LABEL_VALUE_LEN);
        }
        let dotted = format!("{}.{}", "A".repeat(51), "B".repeat(10));
        assert_eq!(
            product_label(&[&dotted, "MIG", "1g.5gb"], false),
            format!("{}-MIG-1g.5gb", "A".repeat(51))
        );
        assert_eq!(product_label(&[&"A".repeat(80)], false), "A".repeat(63));
        // A suffix that cannot fit on its own still gives a valid value.
        let huge = "P".repeat(70);
        let got = product_label(&["X", "MIG", &huge], false);
        assert_eq!(got, format!("X-MIG-{}", "P".repeat(57)));
    }

    #[test]
    fn family_by_compute_capability() {
        let cases = [
            ((7, 0), "volta"),
            ((7, 2), "volta"),
            ((7, 5), "turing"),
            ((8, 0), "ampere"),
            ((8, 6), "ampere"),
            ((8, 7), "ampere"),
            ((8, 9), "ada-lovelace"),
            ((9, 0), "hopper"),
            ((10, 0), "blackwell"),
            ((12, 0), "blackwell"),
            ((6, 1), "pascal"),
            ((5, 2), "maxwell"),
            ((3, 7), "kepler"),
            ((2, 0), "fermi"),
            ((1, 3), "tesla"),
            ((4, 0), "undefined"),
            ((11, 0), "undefined"),
        ];
        for ((major, minor), want) in cases {
            assert_eq!(family_label(major, minor), want, "{major}.{minor}");
        }
    }
}
