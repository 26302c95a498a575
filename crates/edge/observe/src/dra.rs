//! The DRA objects the doctor's claim rules and top read: the ResourceClaims of the namespaces
//! whose pods use claims, every ResourceSlice and DeviceClass (`resource.k8s.io/v1`). Each list
//! is bounded; a cluster without the API (before 1.34, or DRA off) or a token that may not list
//! them leaves a note instead of failing the doctor.

use crate::cluster::list_all;
use crate::error::ObserveError;
use gpuops_doctor::Dra;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceSlice};
use kube::api::ListParams;
use kube::{Api, Client};
use std::collections::BTreeSet;

/// At most this many objects of each kind: a slice per node and pool, a claim per pod, so far
/// beyond any cluster the doctor reads whole; the note says when a list was cut.
pub const MAX_OBJECTS: usize = 20_000;
/// At most this many namespaces' claims are listed one by one; beyond that, all at once.
const MAX_NAMESPACES: usize = 32;

/// The namespaces whose pods name ResourceClaims.
pub fn claim_namespaces(pods: &[Pod]) -> BTreeSet<String> {
    pods.iter()
        .filter(|p| {
            p.spec
                .as_ref()
                .and_then(|s| s.resource_claims.as_ref())
                .is_some_and(|c| !c.is_empty())
        })
        .map(|p| {
            p.metadata
                .namespace
                .clone()
                .unwrap_or_else(|| "default".into())
        })
        .collect()
}

/// Why a list failed, in the words the doctor prints.
fn why(e: &ObserveError) -> String {
    match e {
        ObserveError::Kube {
            source: kube::Error::Api(s),
            ..
        } if s.code == 404 => {
            "resource.k8s.io/v1 is not served (Kubernetes before 1.34, or DRA turned off)".into()
        }
        ObserveError::Kube {
            source: kube::Error::Api(s),
            ..
        } if s.code == 403 => format!("forbidden: {}", s.message),
        other => crate::error::chain(other),
    }
}

fn take<T>(r: Result<Vec<T>, ObserveError>, what: &str, notes: &mut Vec<String>) -> Option<Vec<T>> {
    match r {
        Ok(v) => Some(v),
        Err(e) => {
            notes.push(format!("{what}: {}", why(&e)));
            None
        }
    }
}

fn bounded<T>(mut v: Vec<T>, what: &str, notes: &mut Vec<String>) -> Vec<T> {
    if v.len() > MAX_OBJECTS {
        notes.push(format!("{what}: only the first {MAX_OBJECTS} read"));
        v.truncate(MAX_OBJECTS);
    }
    v
}

/// Every ResourceClaim, for `top`'s claim-allocated GPUs: empty when the cluster has no
/// `resource.k8s.io/v1` (nothing can be allocated through it then); any other failure in words.
pub async fn claims(client: &Client) -> Result<Vec<ResourceClaim>, String> {
    match list_all(
        Api::<ResourceClaim>::all(client.clone()),
        "resourceclaims",
        ListParams::default(),
    )
    .await
    {
        Ok(mut v) => {
            v.truncate(MAX_OBJECTS);
            Ok(v)
        }
        Err(ObserveError::Kube {
            source: kube::Error::Api(s),
            ..
        }) if s.code == 404 => Ok(Vec::new()),
        Err(e) => Err(why(&e)),
    }
}

/// Reads the DRA objects for `pods`. Never fails: what could not be read is in `unread`, and only
/// when a pod uses claims (a cluster without DRA gets no note).
pub async fn read(client: &Client, pods: &[Pod]) -> Dra {
    let namespaces = claim_namespaces(pods);
    let mut notes = Vec::new();
    let claims = async {
        if namespaces.is_empty() {
            return Ok(Vec::new());
        }
        if namespaces.len() > MAX_NAMESPACES {
            return list_all(
                Api::<ResourceClaim>::all(client.clone()),
                "resourceclaims",
                ListParams::default(),
            )
            .await;
        }
        let mut out = Vec::new();
        for ns in &namespaces {
            out.extend(
                list_all(
                    Api::<ResourceClaim>::namespaced(client.clone(), ns),
                    "resourceclaims",
                    ListParams::default(),
                )
                .await?,
            );
        }
        Ok(out)
    };
    let (claims, slices, classes) = tokio::join!(
        claims,
        list_all(
            Api::<ResourceSlice>::all(client.clone()),
            "resourceslices",
            ListParams::default()
        ),
        list_all(
            Api::<DeviceClass>::all(client.clone()),
            "deviceclasses",
            ListParams::default()
        ),
    );
    let claims = take(claims, "resourceclaims", &mut notes);
    let slices = take(slices, "resourceslices", &mut notes);
    let classes = take(classes, "deviceclasses", &mut notes);
    let unread = (!notes.is_empty() && !namespaces.is_empty()).then(|| notes.join("; "));
    let mut cut = Vec::new();
    Dra {
        claims: bounded(claims.unwrap_or_default(), "resourceclaims", &mut cut),
        slices: bounded(slices.unwrap_or_default(), "resourceslices", &mut cut),
        classes: bounded(classes.unwrap_or_default(), "deviceclasses", &mut cut),
        unread: match (unread, cut.is_empty()) {
            (u, true) => u,
            (Some(u), false) => Some(format!("{u}; {}", cut.join("; "))),
            (None, false) => Some(cut.join("; ")),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{PodResourceClaim, PodSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    #[test]
    fn only_namespaces_of_pods_with_claims_are_read() {
        let pod = |ns: &str, claims: bool| Pod {
            metadata: ObjectMeta {
                namespace: Some(ns.into()),
                ..ObjectMeta::default()
            },
            spec: Some(PodSpec {
                resource_claims: claims.then(|| {
                    vec![PodResourceClaim {
                        name: "gpu".into(),
                        ..PodResourceClaim::default()
                    }]
                }),
                ..PodSpec::default()
            }),
            ..Pod::default()
        };
        let got = claim_namespaces(&[
            pod("a", true),
            pod("b", false),
            pod("a", true),
            pod("c", true),
        ]);
        assert_eq!(got.into_iter().collect::<Vec<_>>(), vec!["a", "c"]);
        assert!(claim_namespaces(&[pod("b", false)]).is_empty());
    }

    #[test]
    fn a_missing_api_or_rbac_is_a_note_in_words() {
        let api = |code: u16, message: &str| ObserveError::Kube {
            what: "listing resourceslices".into(),
            source: kube::Error::Api(
                kube::core::Status::failure(message, "NotFound")
                    .with_code(code)
                    .boxed(),
            ),
        };
        assert!(
            why(&api(
                404,
                "the server could not find the requested resource"
            ))
            .contains("before 1.34")
        );
        let forbidden = why(&api(403, "resourceslices.resource.k8s.io is forbidden"));
        assert!(
            forbidden.starts_with("forbidden: resourceslices"),
            "{forbidden}"
        );
        let mut notes = Vec::new();
        assert_eq!(
            bounded(vec![0u8; MAX_OBJECTS + 3], "x", &mut notes).len(),
            MAX_OBJECTS
        );
        assert_eq!(notes.len(), 1);
    }
}
