//! dcgm-exporter's environment variables, for DaemonSets that switch their image to gpuops.
//!
//! dcgm-exporter takes every flag from an env var too (`DCGM_EXPORTER_LISTEN=:9400`,
//! `DCGM_EXPORTER_INTERVAL=30000` in milliseconds, ...). The ones with a gpuops equivalent are
//! read here; gpuops' own flags and `GPUOPS_*` variables win over them. Variables gpuops knows but
//! cannot honour are reported so the user is told, not silently ignored.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

/// The metrics crate's errors.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EnvError {
    /// A dcgm-exporter variable with a value gpuops cannot use.
    #[error("{var}={value:?}: {problem}")]
    BadValue {
        var: &'static str,
        value: String,
        problem: String,
    },
}

/// What dcgm-exporter's variables ask for; `None` where the variable is unset.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DcgmExporterEnv {
    /// `DCGM_EXPORTER_LISTEN` (`-a`): `:9400`, `0.0.0.0:9400`, `[::]:9400`.
    pub listen: Option<SocketAddr>,
    /// `DCGM_EXPORTER_INTERVAL` (`-c`), in milliseconds.
    pub interval: Option<Duration>,
    /// `DCGM_EXPORTER_KUBERNETES` (`-k`): pod labels from the kubelet's PodResources API.
    pub kubernetes: Option<bool>,
    /// `DCGM_POD_RESOURCES_KUBELET_SOCKET`.
    pub pod_resources_socket: Option<PathBuf>,
    /// Variables that are set but have no gpuops equivalent, each with why.
    pub ignored: Vec<String>,
}

/// Set but not honoured, and what gpuops does instead.
const NOT_HONOURED: &[(&str, &str)] = &[
    (
        "DCGM_EXPORTER_COLLECTORS",
        "gpuops serves its fixed DCGM field set (docs/metrics.md); the counters file is not read",
    ),
    (
        "DCGM_EXPORTER_NO_HOSTNAME",
        "gpuops always writes the node label (--hostname-label picks its spelling)",
    ),
    (
        "DCGM_EXPORTER_DEVICES_STR",
        "gpuops exports every GPU and MIG instance",
    ),
    (
        "DCGM_REMOTE_HOSTENGINE_INFO",
        "gpuops reads NVML directly; there is no DCGM host engine",
    ),
];

impl DcgmExporterEnv {
    /// Reads the variables from `vars` (e.g. `std::env::vars()`). An empty value counts as unset.
    pub fn from_vars(
        vars: impl IntoIterator<Item = (String, String)>,
    ) -> Result<DcgmExporterEnv, EnvError> {
        let mut out = DcgmExporterEnv::default();
        let mut vars: Vec<(String, String)> = vars
            .into_iter()
            .filter(|(_, v)| !v.trim().is_empty())
            .collect();
        vars.sort();
        for (name, value) in &vars {
            let value = value.trim();
            let err = |var: &'static str, problem: String| EnvError::BadValue {
                var,
                value: value.to_string(),
                problem,
            };
            match name.as_str() {
                "DCGM_EXPORTER_LISTEN" => {
                    out.listen = Some(parse_listen(value)?);
                }
                "DCGM_EXPORTER_INTERVAL" => {
                    let ms: u64 = value.parse().map_err(|_| {
                        err(
                            "DCGM_EXPORTER_INTERVAL",
                            "not a whole number of milliseconds (dcgm-exporter's unit), e.g. 30000"
                                .into(),
                        )
                    })?;
                    if ms == 0 {
                        return Err(err(
                            "DCGM_EXPORTER_INTERVAL",
                            "must be more than zero".into(),
                        ));
                    }
                    out.interval = Some(Duration::from_millis(ms));
                }
                "DCGM_EXPORTER_KUBERNETES" => {
                    out.kubernetes = Some(parse_go_bool("DCGM_EXPORTER_KUBERNETES", value)?);
                }
                "DCGM_POD_RESOURCES_KUBELET_SOCKET" => {
                    out.pod_resources_socket = Some(PathBuf::from(value));
                }
                other => {
                    if let Some((_, why)) = NOT_HONOURED.iter().find(|(n, _)| *n == other) {
                        out.ignored.push(format!("{other} is ignored: {why}"));
                    }
                }
            }
        }
        Ok(out)
    }
}

/// Go's `net.Listen` address forms dcgm-exporter accepts: `:9400` (all interfaces), `host:port`,
/// `[v6]:port`; the error names `DCGM_EXPORTER_LISTEN` and `text`.
pub fn parse_listen(text: &str) -> Result<SocketAddr, EnvError> {
    let bad = |problem: String| EnvError::BadValue {
        var: "DCGM_EXPORTER_LISTEN",
        value: text.to_string(),
        problem,
    };
    if let Some(port) = text.strip_prefix(':') {
        let port: u16 = port
            .parse()
            .map_err(|_| bad(format!("port {port:?} is not a number from 0 to 65535")))?;
        return Ok(SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), port));
    }
    let literal = match text.strip_prefix("localhost:") {
        Some(port) => format!("127.0.0.1:{port}"),
        None => text.to_string(),
    };
    literal.parse().map_err(|_| {
        bad("not an address like :9400, 0.0.0.0:9400 or [::]:9400 (host names other than localhost are not resolved)"
            .to_string())
    })
}

/// Go's `strconv.ParseBool`, which dcgm-exporter's flag library uses for env vars.
fn parse_go_bool(var: &'static str, text: &str) -> Result<bool, EnvError> {
    match text {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Ok(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Ok(false),
        _ => Err(EnvError::BadValue {
            var,
            value: text.to_string(),
            problem: "not a boolean (true or false)".into(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Result<DcgmExporterEnv, EnvError> {
        DcgmExporterEnv::from_vars(
            pairs
                .iter()
                .map(|(k, v)| ((*k).to_string(), (*v).to_string())),
        )
    }

    #[test]
    fn the_daemonset_variables_map_to_gpuops_settings() {
        let e = env(&[
            ("DCGM_EXPORTER_LISTEN", ":9500"),
            ("DCGM_EXPORTER_INTERVAL", "15000"),
            ("DCGM_EXPORTER_KUBERNETES", "true"),
            ("DCGM_POD_RESOURCES_KUBELET_SOCKET", "/run/k/pod.sock"),
            (
                "DCGM_EXPORTER_COLLECTORS",
                "/etc/dcgm-exporter/dcp-metrics-included.csv",
            ),
            ("PATH", "/usr/bin"),
        ])
        .unwrap();
        assert_eq!(e.listen, Some("0.0.0.0:9500".parse().unwrap()));
        assert_eq!(e.interval, Some(Duration::from_secs(15)));
        assert_eq!(e.kubernetes, Some(true));
        assert_eq!(
            e.pod_resources_socket,
            Some(PathBuf::from("/run/k/pod.sock"))
        );
        assert_eq!(e.ignored.len(), 1);
        assert!(e.ignored[0].starts_with("DCGM_EXPORTER_COLLECTORS is ignored"));
        assert_eq!(env(&[]).unwrap(), DcgmExporterEnv::default());
        assert_eq!(
            env(&[("DCGM_EXPORTER_KUBERNETES", "0")])
                .unwrap()
                .kubernetes,
            Some(false)
        );
        assert_eq!(
            env(&[("DCGM_EXPORTER_INTERVAL", " ")]).unwrap().interval,
            None
        );
    }

    #[test]
    fn listen_addresses_in_gos_forms() {
        assert_eq!(parse_listen(":9400"), Ok("0.0.0.0:9400".parse().unwrap()));
        assert_eq!(
            parse_listen("127.0.0.1:9400"),
            Ok("127.0.0.1:9400".parse().unwrap())
        );
        assert_eq!(parse_listen("[::]:9400"), Ok("[::]:9400".parse().unwrap()));
        assert_eq!(
            parse_listen("localhost:1"),
            Ok("127.0.0.1:1".parse().unwrap())
        );
        assert!(
            parse_listen(":99999")
                .unwrap_err()
                .to_string()
                .contains("99999")
        );
        assert!(parse_listen("gpu-node:9400").is_err());
    }

    #[test]
    fn bad_values_name_the_variable_and_the_value() {
        for (var, value, problem) in [
            ("DCGM_EXPORTER_INTERVAL", "30s", "milliseconds"),
            ("DCGM_EXPORTER_INTERVAL", "0", "more than zero"),
            ("DCGM_EXPORTER_KUBERNETES", "yes", "boolean"),
            ("DCGM_EXPORTER_LISTEN", "9400", "address like :9400"),
        ] {
            let e = env(&[(var, value)]).unwrap_err();
            let text = e.to_string();
            assert!(
                text.starts_with(&format!("{var}={value:?}: ")) && text.contains(problem),
                "{text}"
            );
        }
    }
}
