//! MIG profile names (`3g.40gb`, `1c.3g.40gb`, `1g.10gb+me`): parsing, canonical rendering, and the
//! rule that turns an instance's memory into the `NNgb` part of its name.
//!
//! Grammar (case-insensitive): `[<C>c.]<G>g.<N>gb[+attr,...|-attr,...]`. Without `c`, C = G.
//! An attribute is letters and digits, optionally dotted (`me`, `me.all`, `gfx`).

use std::fmt;
use std::str::FromStr;

/// A parsed MIG profile name.
///
/// `attrs` keeps the suffix: attributes after `+` are stored bare (`"me"`, `"me.all"`, `"gfx"`),
/// attributes after `-` keep their sign (`"-me"`), so `+me,gfx` is `["me", "gfx"]` and `-me` is
/// `["-me"]`. A compute-instance size equal to the GPU-instance size is not written in a name
/// (NVIDIA calls a full-size CI of a `3g` GI just `3g.40gb`), so parsing `3c.3g.40gb` gives
/// `compute_slices: None`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ProfileName {
    /// `C` of a `Cc.` prefix: the compute-instance size, when smaller than the GPU instance.
    pub compute_slices: Option<u32>,
    /// `G`: compute slices of the GPU instance.
    pub gpu_slices: u32,
    /// `N` of `Ngb`, computed by [`memory_gb_for_name`].
    pub memory_gb: u32,
    /// Suffix attributes; see the type's documentation for the sign convention.
    pub attrs: Vec<String>,
}

impl ProfileName {
    /// The GPU-instance part of the name: the same name without the `Cc.` prefix (`1c.3g.40gb+me`
    /// gives `3g.40gb+me`), i.e. what mig-parted configs and `nvidia.com/mig-*` resources use.
    pub fn gi_name(&self) -> String {
        ProfileName {
            compute_slices: None,
            ..self.clone()
        }
        .to_string()
    }

    /// The compute-instance size in slices: `C` when given, otherwise `G`.
    pub fn compute_slices_or_gpu(&self) -> u32 {
        self.compute_slices.unwrap_or(self.gpu_slices)
    }

    /// Whether the suffix carries this attribute (`"me"`, `"me.all"`, `"-me"`), ignoring case.
    pub fn has_attr(&self, attr: &str) -> bool {
        self.attrs.iter().any(|a| a.eq_ignore_ascii_case(attr))
    }
}

impl fmt::Display for ProfileName {
    /// Canonical lowercase form: `1c.3g.40gb`, `3g.40gb`, `1g.10gb+me`, `1g.24gb-me`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(c) = self.compute_slices {
            write!(f, "{c}c.")?;
        }
        write!(f, "{}g.{}gb", self.gpu_slices, self.memory_gb)?;
        // The grammar has one sign per suffix; a hand-built mix renders as `+a,b-c`, which is
        // at least stable and readable.
        let plus: Vec<&str> = self
            .attrs
            .iter()
            .filter(|a| !a.starts_with('-'))
            .map(String::as_str)
            .collect();
        let minus: Vec<&str> = self
            .attrs
            .iter()
            .filter_map(|a| a.strip_prefix('-'))
            .collect();
        if !plus.is_empty() {
            write!(f, "+{}", plus.join(",").to_ascii_lowercase())?;
        }
        if !minus.is_empty() {
            write!(f, "-{}", minus.join(",").to_ascii_lowercase())?;
        }
        Ok(())
    }
}

/// Why a profile name did not parse, with the input echoed (`"3g.40": missing 'gb' suffix`).
/// Plain data (the parse's `Err`, which callers match on `kind`); as the crate's error it travels
/// in [`crate::CatalogError::ProfileName`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProfileNameError {
    /// The text that was given, unchanged.
    pub input: String,
    /// What is wrong with it.
    pub kind: ProfileNameErrorKind,
}

/// The specific problem in a profile name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProfileNameErrorKind {
    Empty,
    MissingMemory,
    MissingGbSuffix,
    TooManyParts,
    BadNumber {
        what: &'static str,
        text: String,
        suffix: &'static str,
    },
    Zero {
        what: &'static str,
    },
    EmptyAttribute {
        sign: char,
    },
    BadAttribute {
        attr: String,
    },
    ComputeExceedsGpu {
        compute: u32,
        gpu: u32,
    },
    InvalidComputeSize {
        compute: u32,
        gpu: u32,
        valid: Vec<u32>,
    },
}

impl fmt::Display for ProfileNameError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}: {}", self.input, self.kind)
    }
}

impl fmt::Display for ProfileNameErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ProfileNameErrorKind::Empty => write!(f, "empty profile name"),
            ProfileNameErrorKind::MissingMemory => write!(
                f,
                "missing memory size: expected [<C>c.]<G>g.<N>gb, e.g. 3g.40gb"
            ),
            ProfileNameErrorKind::MissingGbSuffix => write!(f, "missing 'gb' suffix"),
            ProfileNameErrorKind::TooManyParts => write!(
                f,
                "too many '.'-separated parts: expected [<C>c.]<G>g.<N>gb"
            ),
            ProfileNameErrorKind::BadNumber { what, text, suffix } => write!(
                f,
                "invalid {what} {text:?}: expected a number followed by '{suffix}'"
            ),
            ProfileNameErrorKind::Zero { what } => write!(f, "{what} must be at least 1"),
            ProfileNameErrorKind::EmptyAttribute { sign } => {
                write!(f, "empty attribute after '{sign}'")
            }
            ProfileNameErrorKind::BadAttribute { attr } => write!(
                f,
                "invalid attribute {attr:?}: expected letters and digits, optionally dotted (me, me.all, gfx)"
            ),
            ProfileNameErrorKind::ComputeExceedsGpu { compute, gpu } => {
                write!(f, "compute slices ({compute}c) exceed GPU slices ({gpu}g)")
            }
            ProfileNameErrorKind::InvalidComputeSize {
                compute,
                gpu,
                valid,
            } => write!(
                f,
                "a {compute}c compute instance does not fit a {gpu}g GPU instance (valid sizes: {valid:?})"
            ),
        }
    }
}

/// What each number in a name is called in error messages.
const WHAT_C: &str = "compute slice count";
const WHAT_G: &str = "GPU slice count";
const WHAT_MEM: &str = "memory size";

impl FromStr for ProfileName {
    type Err = ProfileNameError;

    /// Parses `[<C>c.]<G>g.<N>gb[+attr,...|-attr,...]`, ignoring case and surrounding whitespace.
    fn from_str(input: &str) -> Result<Self, Self::Err> {
        parse(input).map_err(|kind| ProfileNameError {
            input: input.to_string(),
            kind,
        })
    }
}

/// The parser proper; the caller attaches the input to the error.
fn parse(input: &str) -> Result<ProfileName, ProfileNameErrorKind> {
    let text = input.trim().to_ascii_lowercase();
    if text.is_empty() {
        return Err(ProfileNameErrorKind::Empty);
    }
    // Numbers and dots never contain a sign, so the first '+' or '-' starts the suffix.
    let (core, attrs) = match text.find(['+', '-']) {
        Some(at) => {
            let sign = text[at..].chars().next().unwrap_or('+');
            (&text[..at], parse_attrs(sign, &text[at + 1..])?)
        }
        None => (text.as_str(), Vec::new()),
    };
    let parts: Vec<&str> = core.split('.').collect();
    let (c_part, g_part, mem_part) = match parts.as_slice() {
        [_] => return Err(ProfileNameErrorKind::MissingMemory),
        [g, m] => (None, *g, *m),
        [c, g, m] => (Some(*c), *g, *m),
        _ => return Err(ProfileNameErrorKind::TooManyParts),
    };
    let gpu_slices = count(g_part, "g", WHAT_G)?;
    let compute_slices = c_part.map(|c| count(c, "c", WHAT_C)).transpose()?;
    let Some(mem_digits) = mem_part.strip_suffix("gb") else {
        return Err(ProfileNameErrorKind::MissingGbSuffix);
    };
    let memory_gb = number(mem_digits, mem_part, "gb", WHAT_MEM)?;
    if let Some(compute) = compute_slices {
        if compute > gpu_slices {
            return Err(ProfileNameErrorKind::ComputeExceedsGpu {
                compute,
                gpu: gpu_slices,
            });
        }
        let valid = crate::ci_sizes(gpu_slices);
        if !valid.contains(&compute) {
            return Err(ProfileNameErrorKind::InvalidComputeSize {
                compute,
                gpu: gpu_slices,
                valid,
            });
        }
    }
    Ok(ProfileName {
        // A full-size CI is written without its `Cc.` prefix.
        compute_slices: compute_slices.filter(|&c| c != gpu_slices),
        gpu_slices,
        memory_gb,
        attrs,
    })
}

/// Parses `<digits><suffix>` (e.g. `3g`) into a count of at least 1.
fn count(
    part: &str,
    suffix: &'static str,
    what: &'static str,
) -> Result<u32, ProfileNameErrorKind> {
    let digits = part
        .strip_suffix(suffix)
        .ok_or_else(|| ProfileNameErrorKind::BadNumber {
            what,
            text: part.to_string(),
            suffix,
        })?;
    number(digits, part, suffix, what)
}

/// Parses ASCII digits into a number of at least 1; `part` is what the error quotes.
fn number(
    digits: &str,
    part: &str,
    suffix: &'static str,
    what: &'static str,
) -> Result<u32, ProfileNameErrorKind> {
    let bad = || ProfileNameErrorKind::BadNumber {
        what,
        text: part.to_string(),
        suffix,
    };
    // `u32::from_str` would also take a leading '+', which is not part of the grammar.
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    match digits.parse::<u32>() {
        Ok(0) => Err(ProfileNameErrorKind::Zero { what }),
        Ok(n) => Ok(n),
        Err(_) => Err(bad()),
    }
}

/// Parses the comma list after the sign; `-` attributes keep their sign in the result.
fn parse_attrs(sign: char, list: &str) -> Result<Vec<String>, ProfileNameErrorKind> {
    list.split(',')
        .map(|attr| {
            if attr.is_empty() {
                return Err(ProfileNameErrorKind::EmptyAttribute { sign });
            }
            let well_formed = attr
                .split('.')
                .all(|seg| !seg.is_empty() && seg.bytes().all(|b| b.is_ascii_alphanumeric()));
            if !well_formed {
                return Err(ProfileNameErrorKind::BadAttribute {
                    attr: attr.to_string(),
                });
            }
            Ok(if sign == '-' {
                format!("-{attr}")
            } else {
                attr.to_string()
            })
        })
        .collect()
}

impl serde::Serialize for ProfileName {
    /// Serializes as the canonical string, the form configs and labels use.
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for ProfileName {
    /// Deserializes from a profile-name string, reporting parse errors with the input.
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = <std::borrow::Cow<'de, str>>::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

/// The `NN` of `NNgb` for an instance of `instance_mib` on a GPU of `total_mib`, as NVIDIA names it
/// (go-nvlib's rule): the instance's share of memory rounded UP to a whole number of
/// `1/memory_slices_total`, times the GPU's memory in whole GiB rounded up, rounded to nearest
/// (halves away from zero).
///
/// Rounding the share up is what makes an A100 80GB's 79 GiB full instance `7g.80gb` rather than
/// `7g.79gb` (gpu-operator #351). Degenerate inputs (`total_mib == 0` or no slices) give 0.
pub fn memory_gb_for_name(instance_mib: u64, total_mib: u64, memory_slices_total: u32) -> u32 {
    if total_mib == 0 || memory_slices_total == 0 {
        return 0;
    }
    // Integer arithmetic throughout so exact slice boundaries are not lost to floating point.
    let n = u128::from(memory_slices_total);
    let slices = (u128::from(instance_mib) * n).div_ceil(u128::from(total_mib));
    let total_gib = u128::from(total_mib).div_ceil(1024);
    // round(slices * total_gib / n), halves away from zero.
    let gb = (2 * slices * total_gib + n) / (2 * n);
    u32::try_from(gb).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_ok(s: &str) -> ProfileName {
        s.parse()
            .unwrap_or_else(|e| panic!("{s:?} should parse: {e}"))
    }

    fn parse_err(s: &str) -> ProfileNameError {
        match s.parse::<ProfileName>() {
            Ok(p) => panic!("{s:?} should not parse, got {p:?}"),
            Err(e) => e,
        }
    }

    #[test]
    fn canonical_names_round_trip() {
        for name in [
            "1g.5gb",
            "3g.40gb",
            "7g.141gb",
            "1c.3g.40gb",
            "2c.3g.40gb",
            "1c.7g.80gb",
            "4c.7g.80gb",
            "1g.10gb+me",
            "1g.24gb+me.all",
            "1g.24gb-me",
            "2g.48gb+gfx",
            "1g.24gb+me,gfx",
            "1c.4g.96gb-me",
        ] {
            assert_eq!(parse_ok(name).to_string(), name, "round trip of {name}");
        }
    }

    #[test]
    fn parse_fills_fields() {
        let p = parse_ok("1c.3g.40gb+me");
        assert_eq!(
            p,
            ProfileName {
                compute_slices: Some(1),
                gpu_slices: 3,
                memory_gb: 40,
                attrs: vec!["me".into()],
            }
        );
        assert_eq!(p.gi_name(), "3g.40gb+me");
        assert_eq!(p.compute_slices_or_gpu(), 1);
        assert!(p.has_attr("ME"));

        let q = parse_ok("3g.40gb");
        assert_eq!(q.compute_slices, None);
        assert_eq!(q.compute_slices_or_gpu(), 3);
        assert_eq!(q.gi_name(), "3g.40gb");

        assert_eq!(parse_ok("1g.24gb-me").attrs, vec!["-me".to_string()]);
        assert_eq!(
            parse_ok("1g.24gb+me,gfx").attrs,
            vec!["me".to_string(), "gfx".to_string()]
        );
        assert_eq!(
            parse_ok("1g.24gb-me,gfx").attrs,
            vec!["-me".to_string(), "-gfx".to_string()]
        );
    }

    #[test]
    fn input_is_case_insensitive_output_lowercase() {
        assert_eq!(parse_ok("1C.3G.40GB+ME").to_string(), "1c.3g.40gb+me");
        assert_eq!(parse_ok("  7G.80Gb ").to_string(), "7g.80gb");
    }

    #[test]
    fn full_size_compute_instance_drops_its_prefix() {
        assert_eq!(parse_ok("3c.3g.40gb").to_string(), "3g.40gb");
        assert_eq!(parse_ok("7c.7g.80gb").compute_slices, None);
    }

    #[test]
    fn compute_sizes_follow_the_ci_rule() {
        // 2C <= G+1 or C == G.
        assert_eq!(parse_ok("2c.3g.40gb").compute_slices, Some(2));
        assert_eq!(parse_ok("2c.4g.40gb").compute_slices, Some(2));
        assert_eq!(parse_ok("3c.7g.80gb").compute_slices, Some(3));
        assert_eq!(
            parse_err("3c.4g.40gb").kind,
            ProfileNameErrorKind::InvalidComputeSize {
                compute: 3,
                gpu: 4,
                valid: vec![1, 2, 4]
            }
        );
        assert_eq!(
            parse_err("8c.3g.40gb").kind,
            ProfileNameErrorKind::ComputeExceedsGpu { compute: 8, gpu: 3 }
        );
    }

    #[test]
    fn bad_inputs_are_rejected_with_the_reason() {
        use ProfileNameErrorKind as K;
        let cases: &[(&str, K)] = &[
            ("", K::Empty),
            ("   ", K::Empty),
            ("3g", K::MissingMemory),
            ("3g.40", K::MissingGbSuffix),
            ("3g.40g", K::MissingGbSuffix),
            (
                "xg.10gb",
                K::BadNumber {
                    what: WHAT_G,
                    text: "xg".into(),
                    suffix: "g",
                },
            ),
            (
                "3.40gb",
                K::BadNumber {
                    what: WHAT_G,
                    text: "3".into(),
                    suffix: "g",
                },
            ),
            (
                "g.40gb",
                K::BadNumber {
                    what: WHAT_G,
                    text: "g".into(),
                    suffix: "g",
                },
            ),
            (
                "3g.gb",
                K::BadNumber {
                    what: WHAT_MEM,
                    text: "gb".into(),
                    suffix: "gb",
                },
            ),
            (
                "3g.99999999999gb",
                K::BadNumber {
                    what: WHAT_MEM,
                    text: "99999999999gb".into(),
                    suffix: "gb",
                },
            ),
            ("0g.10gb", K::Zero { what: WHAT_G }),
            ("3g.0gb", K::Zero { what: WHAT_MEM }),
            ("0c.3g.40gb", K::Zero { what: WHAT_C }),
            (
                "1x.3g.40gb",
                K::BadNumber {
                    what: WHAT_C,
                    text: "1x".into(),
                    suffix: "c",
                },
            ),
            ("1c.3g.40gb.x", K::TooManyParts),
            ("1c.3g.40gb+", K::EmptyAttribute { sign: '+' }),
            ("1g.24gb-", K::EmptyAttribute { sign: '-' }),
            ("1g.10gb+me,", K::EmptyAttribute { sign: '+' }),
            (
                "1g.10gb+me-gfx",
                K::BadAttribute {
                    attr: "me-gfx".into(),
                },
            ),
            ("1g.10gb+me.", K::BadAttribute { attr: "me.".into() }),
            ("1g.10gb+m e", K::BadAttribute { attr: "m e".into() }),
            ("8c.3g.40gb", K::ComputeExceedsGpu { compute: 8, gpu: 3 }),
        ];
        for (input, kind) in cases {
            let err = parse_err(input);
            assert_eq!(&err.kind, kind, "kind for {input:?}");
            assert_eq!(err.input, *input);
        }
    }

    #[test]
    fn error_messages_echo_the_input() {
        assert_eq!(
            parse_err("3g.40").to_string(),
            "\"3g.40\": missing 'gb' suffix"
        );
        assert_eq!(parse_err("").to_string(), "\"\": empty profile name");
        assert_eq!(
            parse_err("xg.10gb").to_string(),
            "\"xg.10gb\": invalid GPU slice count \"xg\": expected a number followed by 'g'"
        );
        assert_eq!(
            parse_err("8c.3g.40gb").to_string(),
            "\"8c.3g.40gb\": compute slices (8c) exceed GPU slices (3g)"
        );
    }

    #[test]
    fn deserializes_from_a_profile_name_string() {
        // No serde format crate is a dependency; serde's own value deserializers are enough to
        // show that strings parse and that parse errors surface.
        let p = parse_ok("1G.10GB+ME");
        let value = serde::de::value::StrDeserializer::<serde::de::value::Error>::new("1g.10gb+me");
        let back = <ProfileName as serde::Deserialize>::deserialize(value).expect("deserializes");
        assert_eq!(back, p);
        let bad = serde::de::value::StrDeserializer::<serde::de::value::Error>::new("3g.40");
        let err = <ProfileName as serde::Deserialize>::deserialize(bad).expect_err("rejects");
        assert!(err.to_string().contains("missing 'gb' suffix"), "{err}");
    }

    #[test]
    fn memory_rule_rounds_the_share_up() {
        // A100 80GB full instance: 79.00 GiB of 80 GiB must still be named 80gb (gpu-operator #351).
        assert_eq!(memory_gb_for_name(80896, 81920, 8), 80);
        // A100 40GB 1g: 4.75 GiB -> 1/8 of 40.
        assert_eq!(memory_gb_for_name(4864, 40960, 8), 5);
        // H100 80GB: total 81559 MiB rounds up to 80 GiB.
        assert_eq!(memory_gb_for_name(9984, 81559, 8), 10);
        // H200: 141 GiB, halves: 2/8 of 141 = 35.25 -> 35, 4/8 = 70.5 -> 71 (away from zero).
        assert_eq!(memory_gb_for_name(33024, 143771, 8), 35);
        assert_eq!(memory_gb_for_name(71168, 143771, 8), 71);
        assert_eq!(memory_gb_for_name(143104, 143771, 8), 141);
        // H100 NVL: 1/8 of 94 = 11.75 -> 12.
        assert_eq!(memory_gb_for_name(10880, 95830, 8), 12);
        // A30 uses quarters.
        assert_eq!(memory_gb_for_name(5952, 24576, 4), 6);
        assert_eq!(memory_gb_for_name(24000, 24576, 4), 24);
        // Exactly on a slice boundary stays on it.
        assert_eq!(memory_gb_for_name(10240, 81920, 8), 10);
        // Degenerate inputs.
        assert_eq!(memory_gb_for_name(1, 0, 8), 0);
        assert_eq!(memory_gb_for_name(1, 1024, 0), 0);
    }
}
