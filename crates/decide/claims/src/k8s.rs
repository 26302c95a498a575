//! From the API objects the controller watches to this crate's plain types.

use crate::ClaimError;
use crate::claim::{AlternativeSpec, ClaimSpec, Classes, Count, RequestSpec};
use gpuops_dra::DRIVER_NAME;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1 as res;
use std::collections::BTreeMap;

/// Claims and templates by (namespace, name).
pub type ByName<T> = BTreeMap<(String, String), T>;

/// The DeviceClasses' CEL selectors by class name.
pub fn classes(dcs: &[res::DeviceClass]) -> Classes {
    dcs.iter()
        .filter_map(|dc| {
            let name = dc.metadata.name.clone()?;
            let sel = dc
                .spec
                .selectors
                .iter()
                .flatten()
                .filter_map(|s| s.cel.as_ref().map(|c| c.expression.clone()))
                .collect();
            Some((name, sel))
        })
        .collect()
}

fn count(claim: &str, mode: Option<&str>, n: Option<i64>) -> Result<Count, ClaimError> {
    match mode.unwrap_or("ExactCount") {
        "ExactCount" => {
            let n = n.unwrap_or(1);
            u32::try_from(n)
                .ok()
                .filter(|&n| n >= 1)
                .map(Count::Exact)
                .ok_or_else(|| ClaimError::Invalid {
                    claim: claim.to_string(),
                    reason: format!("count {n} is not a positive number of devices"),
                })
        }
        "All" => Ok(Count::All),
        other => Err(ClaimError::Unsupported {
            claim: claim.to_string(),
            what: format!("allocationMode {other:?}"),
        }),
    }
}

fn selectors(s: Option<&Vec<res::DeviceSelector>>) -> Vec<String> {
    s.into_iter()
        .flatten()
        .filter_map(|s| s.cel.as_ref().map(|c| c.expression.clone()))
        .collect()
}

/// A claim's spec as demand. What the allocator here does not model is refused by name (an
/// admin-access request, a capacity request, constraints such as matchAttribute) rather than
/// bought for on a guess.
pub fn claim_spec(name: &str, spec: &res::ResourceClaimSpec) -> Result<ClaimSpec, ClaimError> {
    let unsupported = |what: &str| ClaimError::Unsupported {
        claim: name.to_string(),
        what: what.to_string(),
    };
    let devices = spec.devices.as_ref();
    if devices.is_some_and(|d| d.constraints.as_ref().is_some_and(|c| !c.is_empty())) {
        return Err(unsupported(
            "a constraint (matchAttribute, distinctAttribute)",
        ));
    }
    let mut requests = Vec::new();
    for r in devices
        .and_then(|d| d.requests.as_ref())
        .into_iter()
        .flatten()
    {
        let alternatives = match (&r.exactly, &r.first_available) {
            (Some(e), None) => {
                if e.admin_access == Some(true) {
                    return Err(unsupported("an adminAccess request"));
                }
                if e.capacity.is_some() {
                    return Err(unsupported("a capacity request (consumable capacity)"));
                }
                vec![AlternativeSpec {
                    name: r.name.clone(),
                    class: e.device_class_name.clone(),
                    selectors: selectors(e.selectors.as_ref()),
                    count: count(name, e.allocation_mode.as_deref(), e.count)?,
                }]
            }
            (None, Some(subs)) if !subs.is_empty() => subs
                .iter()
                .map(|s| {
                    if s.capacity.is_some() {
                        return Err(unsupported("a capacity request (consumable capacity)"));
                    }
                    Ok(AlternativeSpec {
                        name: format!("{}/{}", r.name, s.name),
                        class: s.device_class_name.clone(),
                        selectors: selectors(s.selectors.as_ref()),
                        count: count(name, s.allocation_mode.as_deref(), s.count)?,
                    })
                })
                .collect::<Result<Vec<_>, _>>()?,
            _ => {
                return Err(ClaimError::Invalid {
                    claim: name.to_string(),
                    reason: format!(
                        "request {} has neither exactly nor firstAvailable, or both",
                        r.name
                    ),
                });
            }
        };
        requests.push(RequestSpec {
            name: r.name.clone(),
            alternatives,
        });
    }
    Ok(ClaimSpec {
        name: name.to_string(),
        requests,
    })
}

fn allocated(c: &res::ResourceClaim) -> bool {
    c.status.as_ref().is_some_and(|s| s.allocation.is_some())
}

/// The claims of a pending pod that are not allocated, as demand. A claim from a template
/// whose ResourceClaim the controller-manager has not made yet is judged on the template's
/// spec; a named claim that does not exist yet is left out (the scheduler waits for it too).
pub fn pending_claims(
    pod: &Pod,
    claims: &ByName<res::ResourceClaim>,
    templates: &ByName<res::ResourceClaimTemplate>,
) -> Result<Vec<ClaimSpec>, ClaimError> {
    let ns = pod.metadata.namespace.clone().unwrap_or_default();
    let statuses: BTreeMap<&str, Option<&str>> = pod
        .status
        .iter()
        .flat_map(|s| s.resource_claim_statuses.iter().flatten())
        .map(|s| (s.name.as_str(), s.resource_claim_name.as_deref()))
        .collect();
    let mut out = Vec::new();
    for pc in pod
        .spec
        .iter()
        .flat_map(|s| s.resource_claims.iter().flatten())
    {
        let claim_name = match (&pc.resource_claim_name, &pc.resource_claim_template_name) {
            (Some(n), _) => Some(n.as_str()),
            // No claim is needed when the status says so (`resourceClaimName` unset).
            (None, Some(_)) => match statuses.get(pc.name.as_str()) {
                Some(Some(n)) => Some(*n),
                Some(None) => continue,
                None => None,
            },
            (None, None) => continue,
        };
        match claim_name.and_then(|n| claims.get(&(ns.clone(), n.to_string()))) {
            Some(c) if allocated(c) => {}
            Some(c) => out.push(claim_spec(
                &format!("{ns}/{}", claim_name.unwrap_or_default()),
                &c.spec,
            )?),
            None => {
                let Some(t) = pc
                    .resource_claim_template_name
                    .as_ref()
                    .and_then(|t| templates.get(&(ns.clone(), t.clone())))
                else {
                    continue;
                };
                let name = format!(
                    "{ns}/{}",
                    pc.resource_claim_template_name
                        .as_deref()
                        .unwrap_or_default()
                );
                out.push(claim_spec(&name, &t.spec.spec)?);
            }
        }
    }
    Ok(out)
}

/// Devices of this driver allocated to claims, by pool (one pool per node, named after it):
/// what nodes in flight already owe, so one need buys one node.
pub fn allocated_devices(claims: &ByName<res::ResourceClaim>) -> BTreeMap<String, Vec<String>> {
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for c in claims.values() {
        let results = c
            .status
            .as_ref()
            .and_then(|s| s.allocation.as_ref())
            .and_then(|a| a.devices.as_ref())
            .and_then(|d| d.results.as_ref());
        for r in results.into_iter().flatten() {
            if r.driver == DRIVER_NAME {
                out.entry(r.pool.clone())
                    .or_default()
                    .push(r.device.clone());
            }
        }
    }
    out
}
