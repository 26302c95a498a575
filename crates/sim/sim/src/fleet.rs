//! Fleet files: which GPUs a simulated node has, and the built-in fleets (`dgx-h100`, ...).

use crate::SimError;
use gpuops_catalog::GpuModel;
use serde::Deserialize;
use serde_saphyr::Spanned;
use std::path::Path;

/// The fleet file format, as `gpuops sim fleets` shows it.
pub const FORMAT_HELP: &str = "\
Fleet file format (YAML; unknown keys are errors):
  hostname: node-1            # seeds the GPU UUIDs (default gpuops-sim)
  driver-version: 580.105.08  # default 580.105.08
  cuda-version: \"13.0\"        # default 13.0
  fabric: auto                # auto | nvswitch | pairs | none
  numa-nodes: 2               # default: one per four GPUs
  gpus:
    - model: H100-SXM5-80GB   # a key from `gpuops catalog`
      count: 8                # default 1
      mig-enabled: false      # start in MIG mode (MIG-capable models only)
      pci-class: 0x030200     # default: 3D controller (compute); 0x030000: VGA (graphics mode)
      report-as:              # optional: report another name and PCI device id, to
        name: NVIDIA H999     #   simulate a model gpuops does not know (behaves as `model`)
        pci-device-id: 0x2999";

/// Built-in fleets, by name, as fleet-file text (parsed by the same code as user files).
pub const BUILTIN_FLEETS: &[(&str, &str)] = &[
    (
        "dgx-h100",
        "hostname: dgx-h100-sim\nfabric: nvswitch\nnuma-nodes: 2\ngpus:\n  - model: H100-SXM5-80GB\n    count: 8\n",
    ),
    (
        "dgx-a100",
        "hostname: dgx-a100-sim\nfabric: nvswitch\nnuma-nodes: 2\ngpus:\n  - model: A100-SXM4-80GB\n    count: 8\n",
    ),
    (
        "hgx-h200",
        "hostname: hgx-h200-sim\nfabric: nvswitch\nnuma-nodes: 2\ngpus:\n  - model: H200\n    count: 8\n",
    ),
    (
        "dgx-b200",
        "hostname: dgx-b200-sim\ndriver-version: \"580.105.08\"\nfabric: nvswitch\nnuma-nodes: 2\ngpus:\n  - model: B200\n    count: 8\n",
    ),
    (
        "h100-nvl-x2",
        "hostname: h100-nvl-sim\nfabric: pairs\nnuma-nodes: 1\ngpus:\n  - model: H100-NVL\n    count: 2\n",
    ),
    (
        "l4x4",
        "hostname: l4-sim\nfabric: none\nnuma-nodes: 1\ngpus:\n  - model: L4\n    count: 4\n",
    ),
];

/// How NVLink connects the GPUs of a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum Fabric {
    /// Pick from the models: SXM parts behind NVSwitches, NVL parts bridged in pairs, PCIe parts none.
    #[default]
    Auto,
    /// Every GPU's links go to NVSwitches (DGX/HGX): all pairs are NVLink peers.
    Nvswitch,
    /// Neighbouring GPUs (0-1, 2-3, ...) are bridged to each other.
    Pairs,
    /// PCIe only.
    None,
}

/// A group of identical GPUs in a fleet file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct FleetGpus {
    pub model: Spanned<String>,
    #[serde(default = "one")]
    pub count: u32,
    /// Start with MIG mode enabled (MIG-capable models only).
    #[serde(default)]
    pub mig_enabled: bool,
    /// Report another identity than the catalog's: simulates a GPU model gpuops does not know,
    /// behaving like `model`.
    #[serde(default)]
    pub report_as: Option<ReportAs>,
    /// PCI class code the GPU shows (`/sys/bus/pci/devices/<bus id>/class`, `baseClass`/`subClass`
    /// of `nvmlDeviceGetPciInfoExt`): `0x030200` (3D controller, compute mode, the default of every
    /// catalog model) or `0x030000` (VGA controller, a GPU switched to display mode).
    #[serde(default)]
    pub pci_class: Option<u32>,
}

/// A name and PCI device id the simulated GPU reports instead of its model's.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct ReportAs {
    pub name: String,
    /// The upper 16 bits of NVML's `pciDeviceId`, e.g. 0x2399.
    pub pci_device_id: u16,
}

fn one() -> u32 {
    1
}

/// A simulated node: its driver and GPUs.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct Fleet {
    /// Seeds the UUIDs, so two simulated nodes get different ones.
    #[serde(default = "default_hostname")]
    pub hostname: String,
    #[serde(default = "default_driver")]
    pub driver_version: String,
    #[serde(default = "default_cuda")]
    pub cuda_version: String,
    #[serde(default)]
    pub fabric: Fabric,
    /// CPU sockets the GPUs are spread over (0 = one per four GPUs, at least one).
    #[serde(default)]
    pub numa_nodes: u32,
    pub gpus: Vec<FleetGpus>,
}

fn default_hostname() -> String {
    "gpuops-sim".into()
}
fn default_driver() -> String {
    "580.105.08".into()
}
fn default_cuda() -> String {
    "13.0".into()
}

/// The most GPUs one simulated node may have; real nodes top out at 16.
pub const MAX_GPUS: u32 = 64;

impl Fleet {
    /// Resolves `name_or_path`: a built-in fleet name, else a fleet file.
    pub fn resolve(name_or_path: &str) -> Result<Fleet, SimError> {
        if let Some((name, text)) = BUILTIN_FLEETS.iter().find(|(n, _)| *n == name_or_path) {
            return Fleet::parse(text, &format!("<built-in {name}>"));
        }
        let path = Path::new(name_or_path);
        if !path.exists() {
            return Err(SimError::UnknownFleet {
                name: name_or_path.to_string(),
            });
        }
        let file =
            std::fs::File::open(path).map_err(|e| SimError::io("reading fleet file", path, e))?;
        let origin = path.display().to_string();
        let text =
            gpuops_yamlpos::read_text(file, gpuops_yamlpos::MAX_CONFIG_BYTES, "a fleet file")
                .map_err(|e| SimError::FleetSyntax {
                    path: origin.clone(),
                    message: e.to_string(),
                })?;
        Fleet::parse(&text, &origin)
    }

    /// Parses and validates fleet-file text; `origin` names the file in errors.
    pub fn parse(text: &str, origin: &str) -> Result<Fleet, SimError> {
        let fleet: Fleet = serde_saphyr::from_str(text).map_err(|e| {
            let tree: Option<gpuops_yamlpos::SNode> = serde_saphyr::from_str(text).ok();
            let p = gpuops_yamlpos::explain(&e, tree.as_ref(), text);
            let (at, mut message) = match (p.line, p.column) {
                (Some(l), Some(c)) => (format!("line {l} column {c}: "), p.message),
                _ => (String::new(), p.message),
            };
            // A GPU count too large for its type is over the fleet's limit like any other.
            if let (Some(l), Some(c)) = (p.line, p.column)
                && let Some(v) = gpuops_yamlpos::scalar_at(text, l, c)
                && v.parse::<u128>().is_ok()
                && tree
                    .as_ref()
                    .and_then(|t| gpuops_yamlpos::find_at(t, l, c))
                    .is_some_and(|f| f.path.ends_with("].count"))
            {
                message = format!(
                    "count {v} is more than the {MAX_GPUS} GPUs a simulated node may have; accepted: 1 to {MAX_GPUS}"
                );
            }
            SimError::FleetSyntax {
                path: origin.to_string(),
                message: format!("{at}{message}"),
            }
        })?;
        fleet.validate(origin)?;
        Ok(fleet)
    }

    fn validate(&self, origin: &str) -> Result<(), SimError> {
        let invalid = |message: String| SimError::FleetInvalid {
            path: origin.to_string(),
            message,
        };
        if self.gpus.is_empty() {
            return Err(invalid(
                "`gpus` is empty: list at least one {model, count}".into(),
            ));
        }
        let mut total = 0u32;
        for group in &self.gpus {
            let at = format!(
                "line {} column {}",
                group.model.referenced.line(),
                group.model.referenced.column()
            );
            let model = gpuops_catalog::lookup(&group.model.value)
                .map_err(|e| invalid(format!("{at}: {e}")))?;
            if group.count == 0 {
                return Err(invalid(format!(
                    "{at}: count for {} must be at least 1",
                    model.key
                )));
            }
            if group.mig_enabled && !model.mig_capable() {
                return Err(invalid(format!(
                    "{at}: mig-enabled is set but {} does not support MIG",
                    model.key
                )));
            }
            if let Some(r) = &group.report_as
                && (r.name.trim().is_empty() || r.name.len() > 95)
            {
                return Err(invalid(format!(
                    "{at}: report-as name must be 1 to 95 characters"
                )));
            }
            if let Some(class) = group.pci_class
                && class >> 16 != 0x03
            {
                return Err(invalid(format!(
                    "{at}: pci-class {class:#08x} is not a display controller class (0x03xxxx, e.g. 0x030200 for compute, 0x030000 for graphics)"
                )));
            }
            total = total.saturating_add(group.count);
        }
        if total > MAX_GPUS {
            return Err(invalid(format!(
                "{total} GPUs is more than the {MAX_GPUS} a simulated node may have"
            )));
        }
        parse_driver_version(&self.driver_version).map_err(|e| invalid(e.to_string()))?;
        parse_cuda_version(&self.cuda_version).map_err(|e| invalid(e.to_string()))?;
        Ok(())
    }

    /// The fleet expanded to one GPU per entry, in index order.
    pub fn expanded(&self) -> Vec<(&'static GpuModel, &FleetGpus)> {
        self.gpus
            .iter()
            .flat_map(|g| {
                let model = gpuops_catalog::lookup(&g.model.value).ok();
                std::iter::repeat_n(model.map(|m| (m, g)), g.count as usize)
            })
            .flatten()
            .collect()
    }
}

/// Checks a driver version like `580.105.08` and returns its major number.
pub fn parse_driver_version(v: &str) -> Result<u32, SimError> {
    let parts: Vec<&str> = v.split('.').collect();
    let numeric = parts
        .iter()
        .all(|p| !p.is_empty() && p.chars().all(|c| c.is_ascii_digit()));
    if !(2..=3).contains(&parts.len()) || !numeric {
        return Err(SimError::DriverVersion(v.to_string()));
    }
    parts[0]
        .parse()
        .map_err(|_| SimError::DriverMajorTooLarge(v.to_string()))
}

/// Parses a CUDA version like `13.0` into NVML's integer form (13000).
pub fn parse_cuda_version(v: &str) -> Result<i32, SimError> {
    let bad = || SimError::CudaVersion(v.to_string());
    let (major, minor) = v.split_once('.').ok_or_else(bad)?;
    let major: i32 = major.parse().map_err(|_| bad())?;
    let minor: i32 = minor.parse().map_err(|_| bad())?;
    if !(1..=99).contains(&major) || !(0..=9).contains(&minor) {
        return Err(bad());
    }
    Ok(major * 1000 + minor * 10)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_builtin_fleet_parses() {
        for (name, _) in BUILTIN_FLEETS {
            let fleet = Fleet::resolve(name).unwrap();
            assert!(!fleet.expanded().is_empty(), "{name}");
        }
        assert_eq!(Fleet::resolve("dgx-h100").unwrap().expanded().len(), 8);
    }

    #[test]
    fn unknown_fleet_names_the_builtins() {
        let err = Fleet::resolve("dgx-h900").unwrap_err().to_string();
        assert!(
            err.contains("dgx-h900") && err.contains("dgx-h100") && err.contains("l4x4"),
            "{err}"
        );
    }

    #[test]
    fn fleet_files_over_the_size_limit_or_not_utf8_say_so() {
        let dir = tempfile::tempdir().unwrap();
        let write = |name: &str, bytes: &[u8]| {
            let path = dir.path().join(name);
            std::fs::write(&path, bytes).unwrap();
            path.display().to_string()
        };
        let utf16: Vec<u8> = [0xFEFF_u16]
            .into_iter()
            .chain("gpus:\n  - model: L4\n".encode_utf16())
            .flat_map(u16::to_le_bytes)
            .collect();
        let path = write("u16.yaml", &utf16);
        let e = Fleet::resolve(&path).unwrap_err().to_string();
        assert!(
            e.starts_with(&format!(
                "fleet file {path}: the file is UTF-16 (little-endian) text"
            )),
            "{e}"
        );
        let big = format!("gpus:\n  - model: L4\n{}", "#\n".repeat(3_000_000));
        let path = write("big.yaml", big.as_bytes());
        let e = Fleet::resolve(&path).unwrap_err().to_string();
        assert_eq!(
            e,
            format!(
                "fleet file {path}: the file is larger than 4 MiB (4194304 bytes), the size limit for a fleet file"
            )
        );
        let path = write("ok.yaml", b"gpus:\n  - model: L4\n");
        assert_eq!(Fleet::resolve(&path).unwrap().expanded().len(), 1);
    }

    #[test]
    fn bad_fleet_files_say_where_and_what() {
        let cases = [
            (
                "gpus:\n  - model: H100-SXM5-80GB\n    cnt: 2\n",
                "line 3",
                "unknown field `cnt`",
            ),
            (
                "gpus:\n  - model: H100-SXM5-80GB\n    count: -1\n",
                "line 3",
                // Issue 29: was "invalid u32", without the key or the value.
                "`gpus[0].count`: -1 is too small: at least 0",
            ),
            ("gpus: [\n", "line 1", "unclosed"),
            ("gpus:\n  - model: H900\n", "line 2", "known models"),
            (
                "gpus:\n  - model: L4\n    mig-enabled: true\n",
                "line 2",
                "does not support MIG",
            ),
            (
                "gpus:\n  - model: L4\n    count: 0\n",
                "line 2",
                "at least 1",
            ),
            ("gpus: []\n", "f.yaml", "empty"),
            (
                "driver-version: banana\ngpus:\n  - model: L4\n",
                "f.yaml",
                "driver-version",
            ),
            (
                "cuda-version: \"13\"\ngpus:\n  - model: L4\n",
                "f.yaml",
                "cuda-version",
            ),
            (
                "gpus:\n  - model: L4\n    count: 65\n",
                "f.yaml",
                "more than the 64",
            ),
            (
                "gpus:\n  - model: L4\n    count: 4294967296\n",
                "line 3 column 12",
                "count 4294967296 is more than the 64 GPUs a simulated node may have; accepted: 1 to 64",
            ),
            (
                "gpus:\n  - model: L4\n    count: many\n",
                "line 3 column 12",
                "`gpus[0].count`: \"many\" is not valid: expected a whole number",
            ),
            (
                "colour: blue\ngpus:\n  - model: L4\n",
                "line 1",
                "unknown field `colour`",
            ),
            (
                "gpus:\n  - model: L4\n    pci-class: 0x020000\n",
                "line 2",
                "not a display controller class",
            ),
        ];
        for (text, place, problem) in cases {
            let err = Fleet::parse(text, "f.yaml").unwrap_err().to_string();
            assert!(err.contains("f.yaml"), "{err}");
            assert!(err.contains(place), "expected {place:?} in {err}");
            assert!(err.contains(problem), "expected {problem:?} in {err}");
        }
    }

    #[test]
    fn versions_parse() {
        assert_eq!(parse_cuda_version("12.8").unwrap(), 12080);
        assert_eq!(parse_driver_version("535.104.05").unwrap(), 535);
        assert!(parse_driver_version("535").is_err());
        assert!(parse_cuda_version("x.1").is_err());
    }
}
