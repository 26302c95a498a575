//! GPU resource names (`nvidia.com/gpu`, `nvidia.com/mig-*`, `*.shared`), quantities and pod requests.

use k8s_openapi::api::core::v1::{Container, Pod};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use std::collections::BTreeMap;

/// Whole GPUs (and MIG devices under the `single` strategy, and time-sliced replicas not renamed).
pub const GPU: &str = "nvidia.com/gpu";
/// Time-sliced or MPS replicas of whole GPUs with `renameByDefault`.
pub const GPU_SHARED: &str = "nvidia.com/gpu.shared";
const MIG_PREFIX: &str = "nvidia.com/mig-";

/// GPU resources per name, as counts.
pub type GpuMap = BTreeMap<String, i64>;

/// Whether a resource name is one of NVIDIA's (every extended resource under `nvidia.com/`).
pub fn is_gpu_resource(name: &str) -> bool {
    name.starts_with("nvidia.com/")
}

/// Whether the resource is shared replicas by its name (`….shared`).
pub fn is_shared_name(name: &str) -> bool {
    is_gpu_resource(name) && name.ends_with(".shared")
}

/// The MIG profile of `nvidia.com/mig-<profile>[.shared]`, with the `.`-written attributes given
/// back their `+` (`nvidia.com/mig-1g.10gb.me` -> `1g.10gb+me`).
pub fn mig_profile(name: &str) -> Option<String> {
    let rest = name.strip_prefix(MIG_PREFIX)?;
    let rest = rest.strip_suffix(".shared").unwrap_or(rest);
    let end = rest.find("gb").map(|i| i + 2)?;
    let (base, attrs) = rest.split_at(end);
    Some(match attrs.strip_prefix('.') {
        Some(a) if !a.is_empty() => format!("{base}+{a}"),
        _ => base.to_string(),
    })
}

/// The resource name for a MIG profile (`1g.10gb+me` -> `nvidia.com/mig-1g.10gb.me`).
pub fn mig_resource(profile: &str) -> String {
    format!("{MIG_PREFIX}{}", profile.replace('+', "."))
}

/// A quantity as a whole count, rounded down; `None` when it is not a number.
pub fn count(q: &Quantity) -> Option<i64> {
    let s = q.0.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '-' || c == '+'))
        .unwrap_or(s.len());
    let (num, suffix) = s.split_at(split);
    let n: f64 = num.parse().ok()?;
    let mult = match suffix {
        "" => 1.0,
        "m" => 0.001,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "Ki" => 1024.0,
        "Mi" => 1024.0 * 1024.0,
        "Gi" => 1024.0 * 1024.0 * 1024.0,
        _ => return None,
    };
    // Counts of devices are small integers; the cast saturates on nonsense.
    Some((n * mult).floor() as i64)
}

/// A quantity as a number (`500m` -> 0.5, `8Gi` -> 8589934592, `1e3` -> 1000); `None` when it is
/// not one.
pub fn value(q: &Quantity) -> Option<f64> {
    let s = q.0.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '-' || c == '+'))
        .unwrap_or(s.len());
    let (num, suffix) = s.split_at(split);
    let n: f64 = num.parse().ok()?;
    let mult = match suffix {
        "" => 1.0,
        "n" => 1e-9,
        "u" => 1e-6,
        "m" => 1e-3,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        "E" => 1e18,
        "Ki" => 1024.0,
        "Mi" => 1024f64.powi(2),
        "Gi" => 1024f64.powi(3),
        "Ti" => 1024f64.powi(4),
        "Pi" => 1024f64.powi(5),
        "Ei" => 1024f64.powi(6),
        e if e.starts_with(['e', 'E']) => 10f64.powi(e[1..].parse().ok()?),
        _ => return None,
    };
    Some(n * mult)
}

/// CPU (cores) and memory (bytes) a pod asks for, as the scheduler counts them: the containers'
/// sum (requests, else limits) or the largest init container, plus the pod overhead.
pub fn pod_cpu_memory(pod: &Pod) -> (f64, f64) {
    let Some(spec) = pod.spec.as_ref() else {
        return (0.0, 0.0);
    };
    let of = |c: &Container, key: &str| -> f64 {
        let r = c.resources.as_ref();
        r.and_then(|r| r.requests.as_ref())
            .and_then(|m| m.get(key))
            .or_else(|| r.and_then(|r| r.limits.as_ref()).and_then(|m| m.get(key)))
            .and_then(value)
            .unwrap_or(0.0)
    };
    let mut cpu: f64 = spec.containers.iter().map(|c| of(c, "cpu")).sum();
    let mut mem: f64 = spec.containers.iter().map(|c| of(c, "memory")).sum();
    for c in spec.init_containers.iter().flatten() {
        cpu = cpu.max(of(c, "cpu"));
        mem = mem.max(of(c, "memory"));
    }
    if let Some(o) = spec.overhead.as_ref() {
        cpu += o.get("cpu").and_then(value).unwrap_or(0.0);
        mem += o.get("memory").and_then(value).unwrap_or(0.0);
    }
    (cpu, mem)
}

/// Bytes as `512Mi`, `8Gi`, `1.5Ti`.
pub fn bytes(b: f64) -> String {
    let gib = b / 1024f64.powi(3);
    if gib >= 1024.0 {
        format!("{}Ti", trim(gib / 1024.0))
    } else if gib >= 1.0 {
        format!("{}Gi", trim(gib))
    } else {
        format!("{}Mi", trim(b / 1024f64.powi(2)))
    }
}

/// CPU cores as `8`, `1.5`, `250m`.
pub fn cores(c: f64) -> String {
    if c < 1.0 && c > 0.0 {
        format!("{:.0}m", c * 1000.0)
    } else {
        trim(c)
    }
}

fn trim(v: f64) -> String {
    let s = format!("{v:.1}");
    s.strip_suffix(".0").map_or(s.clone(), str::to_string)
}

/// The GPU resources of a quantity map.
pub fn gpu_map(list: Option<&BTreeMap<String, Quantity>>) -> GpuMap {
    list.into_iter()
        .flatten()
        .filter(|(k, _)| is_gpu_resource(k))
        .filter_map(|(k, q)| count(q).map(|n| (k.clone(), n)))
        .filter(|(_, n)| *n > 0)
        .collect()
}

/// What one container asks for: its requests, falling back to its limits (the API server copies
/// limits into requests for extended resources).
pub fn container_gpus(c: &Container) -> GpuMap {
    let r = c.resources.as_ref();
    let mut out = gpu_map(r.and_then(|r| r.limits.as_ref()));
    out.extend(gpu_map(r.and_then(|r| r.requests.as_ref())));
    out
}

/// The pod's effective GPU request, as the scheduler computes it: the larger of the containers'
/// sum and the largest init container.
pub fn pod_gpus(pod: &Pod) -> GpuMap {
    let Some(spec) = pod.spec.as_ref() else {
        return GpuMap::new();
    };
    let mut sum = GpuMap::new();
    for c in &spec.containers {
        for (k, n) in container_gpus(c) {
            *sum.entry(k).or_default() += n;
        }
    }
    for c in spec.init_containers.iter().flatten() {
        for (k, n) in container_gpus(c) {
            let e = sum.entry(k).or_default();
            *e = (*e).max(n);
        }
    }
    sum
}

/// `nvidia.com/gpu: 2, nvidia.com/mig-1g.10gb: 1` style.
pub fn describe(map: &GpuMap) -> String {
    map.iter()
        .map(|(k, n)| format!("{k}: {n}"))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mig_profiles_from_resource_names() {
        for (name, want) in [
            ("nvidia.com/mig-1g.10gb", Some("1g.10gb")),
            ("nvidia.com/mig-1g.10gb.me", Some("1g.10gb+me")),
            ("nvidia.com/mig-3g.40gb.shared", Some("3g.40gb")),
            ("nvidia.com/gpu", None),
            ("nvidia.com/gpu.shared", None),
        ] {
            assert_eq!(mig_profile(name).as_deref(), want, "{name}");
        }
        assert_eq!(mig_resource("1g.10gb+me"), "nvidia.com/mig-1g.10gb.me");
    }

    #[test]
    fn quantities() {
        for (q, want) in [
            ("8", Some(8)),
            ("0", Some(0)),
            ("1k", Some(1000)),
            ("500m", Some(0)),
            ("x", None),
        ] {
            assert_eq!(count(&Quantity(q.into())), want, "{q}");
        }
        for (q, want) in [
            ("500m", Some(0.5)),
            ("8Gi", Some(8.0 * 1024f64.powi(3))),
            ("1e3", Some(1000.0)),
            ("64", Some(64.0)),
            ("1.5k", Some(1500.0)),
            ("2x", None),
        ] {
            assert_eq!(value(&Quantity(q.into())), want, "{q}");
        }
        assert_eq!(bytes(16.0 * 1024f64.powi(3)), "16Gi");
        assert_eq!(bytes(512.0 * 1024f64.powi(2)), "512Mi");
        assert_eq!(cores(0.25), "250m");
        assert_eq!(cores(8.0), "8");
    }
}
