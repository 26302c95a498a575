//! A node's ResourceSlices for one DRA driver, kept level-triggered: every call makes the slices
//! on the API server equal to the desired set (server-side apply of each, extras deleted), and
//! bumps the pool's generation when, and only when, what the pool offers changed.
//!
//! What counts as "changed" is a hash of what gpuops sent (the spec without the generation), kept
//! in an annotation on each slice: the API server defaults fields in the stored spec, so comparing
//! the stored spec with the desired one would see a change on every pass and the generation would
//! climb forever.
//!
//! A slice with neither devices nor shared counters is never written: a node whose GPUs cannot
//! be read (NVML missing) has no slice at all, never an empty one that the scheduler believes.

use crate::error::{KubeError, bounded};
use k8s_openapi::api::resource::v1::{ResourceSlice, ResourceSliceSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::Api;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams};
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

/// The annotation holding the hash of what gpuops last applied to a slice.
pub const SLICE_HASH_ANNOTATION: &str = "gpuops.io/slice-hash";

/// The field manager of the slice writes.
pub const SLICE_FIELD_MANAGER: &str = "gpuops-dra";

/// A slice of this node and driver as the API server has it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObservedSlice {
    pub name: String,
    pub generation: i64,
    /// [`SLICE_HASH_ANNOTATION`], absent on a slice someone else wrote.
    pub hash: Option<String>,
}

/// What one pass writes.
#[derive(Debug, Clone, PartialEq)]
pub struct SlicePlan {
    /// The pool generation every applied slice carries.
    pub generation: i64,
    /// Slices to apply, by name, each with its hash.
    pub apply: Vec<(String, String, ResourceSliceSpec)>,
    /// Slices to delete: of this node and driver, but no longer wanted.
    pub delete: Vec<String>,
}

impl SlicePlan {
    /// Nothing to write: the API server already has the desired slices.
    pub fn is_empty(&self) -> bool {
        self.apply.is_empty() && self.delete.is_empty()
    }
}

/// The outcome of [`SlicePublisher::publish`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Published {
    /// The pool generation now on the API server (0: no slice).
    pub generation: i64,
    pub applied: usize,
    pub deleted: usize,
}

/// Slice `index` of `node`'s pool of `driver`: stable names, so a pass applies the same objects.
pub fn slice_name(node: &str, driver: &str, index: usize) -> String {
    let name = format!("{node}-{driver}-{index}");
    if name.len() <= 253 {
        return name;
    }
    // A node name near the 253-character limit: keep a prefix and make it unique again.
    let tail = format!("-{:016x}-{index}", fnv1a(name.as_bytes()));
    let mut cut = 253 - tail.len();
    while !name.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}{tail}", name[..cut].trim_end_matches(['-', '.']))
}

/// Whether a slice offers anything: devices or shared counters.
fn offers_something(spec: &ResourceSliceSpec) -> bool {
    spec.devices.as_ref().is_some_and(|d| !d.is_empty())
        || spec.shared_counters.as_ref().is_some_and(|c| !c.is_empty())
}

/// FNV-1a, 64 bits: stable across Rust versions and builds (std's hasher is not promised to be),
/// so an upgraded agent sees the same hash for the same slice and does not bump the generation.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The hash of a slice's content, its generation left out.
fn content_hash(spec: &ResourceSliceSpec) -> String {
    let mut spec = spec.clone();
    spec.pool.generation = 0;
    // serde_json's map is ordered by key, so equal specs give equal text.
    let text = serde_json::to_vec(&spec).unwrap_or_default();
    format!("{:016x}", fnv1a(&text))
}

/// What to write so that `node`'s slices of `driver` become `desired` (pure). Slices that offer
/// nothing are dropped; the pool name, node name, driver and slice count are set here, so the
/// caller's values for them do not matter. The generation stays when nothing changed, else it is
/// one more than the highest observed.
pub fn plan_slices(
    node: &str,
    driver: &str,
    desired: &[ResourceSliceSpec],
    observed: &[ObservedSlice],
) -> SlicePlan {
    let wanted: Vec<ResourceSliceSpec> = desired
        .iter()
        .filter(|s| offers_something(s))
        .cloned()
        .collect();
    let count = i64::try_from(wanted.len()).unwrap_or(i64::MAX);
    let wanted: Vec<(String, String, ResourceSliceSpec)> = wanted
        .into_iter()
        .enumerate()
        .map(|(i, mut spec)| {
            spec.driver = driver.to_string();
            spec.node_name = Some(node.to_string());
            spec.node_selector = None;
            spec.all_nodes = None;
            spec.per_device_node_selection = None;
            spec.pool.name = node.to_string();
            spec.pool.resource_slice_count = count;
            let hash = content_hash(&spec);
            (slice_name(node, driver, i), hash, spec)
        })
        .collect();
    let highest = observed.iter().map(|o| o.generation).max().unwrap_or(0);
    let by_name: BTreeMap<&str, &ObservedSlice> =
        observed.iter().map(|o| (o.name.as_str(), o)).collect();
    let wanted_names: BTreeSet<&str> = wanted.iter().map(|(n, _, _)| n.as_str()).collect();
    let delete: Vec<String> = observed
        .iter()
        .filter(|o| !wanted_names.contains(o.name.as_str()))
        .map(|o| o.name.clone())
        .collect();
    let same = observed.len() == wanted.len()
        && wanted.iter().all(|(name, hash, _)| {
            by_name
                .get(name.as_str())
                .is_some_and(|o| o.hash.as_deref() == Some(hash) && o.generation == highest)
        });
    if same {
        return SlicePlan {
            generation: highest,
            apply: Vec::new(),
            delete: Vec::new(),
        };
    }
    let generation = if wanted.is_empty() { 0 } else { highest + 1 };
    let apply = wanted
        .into_iter()
        .map(|(name, hash, mut spec)| {
            spec.pool.generation = generation;
            (name, hash, spec)
        })
        .collect();
    SlicePlan {
        generation,
        apply,
        delete,
    }
}

/// Writes one node's ResourceSlices of one driver, each request bounded by the timeout.
#[derive(Clone)]
pub struct SlicePublisher {
    slices: Api<ResourceSlice>,
    node: String,
    driver: String,
    timeout: Duration,
}

impl SlicePublisher {
    pub fn new(client: kube::Client, node: &str, driver: &str, timeout: Duration) -> Self {
        SlicePublisher {
            slices: Api::all(client),
            node: node.to_string(),
            driver: driver.to_string(),
            timeout,
        }
    }

    /// This node's slices of this driver on the API server now.
    pub async fn observed(&self) -> Result<Vec<ObservedSlice>, KubeError> {
        let params = ListParams::default().fields(&format!(
            "spec.nodeName={},spec.driver={}",
            self.node, self.driver
        ));
        let list = bounded(
            self.timeout,
            || format!("listing the ResourceSlices of node {}", self.node),
            self.slices.list(&params),
        )
        .await?;
        Ok(list
            .items
            .into_iter()
            .map(|s| ObservedSlice {
                name: s.metadata.name.unwrap_or_default(),
                generation: s.spec.pool.generation,
                hash: s
                    .metadata
                    .annotations
                    .and_then(|a| a.get(SLICE_HASH_ANNOTATION).cloned()),
            })
            .collect())
    }

    /// Makes this node's slices equal to `desired` (see [`plan_slices`]); `owner` (the Node) lets
    /// the garbage collector remove them with the node. An empty `desired` removes every slice.
    pub async fn publish(
        &self,
        desired: &[ResourceSliceSpec],
        owner: Option<OwnerReference>,
    ) -> Result<Published, KubeError> {
        let observed = self.observed().await?;
        let plan = plan_slices(&self.node, &self.driver, desired, &observed);
        let params = PatchParams::apply(SLICE_FIELD_MANAGER).force();
        for (name, hash, spec) in &plan.apply {
            let slice = ResourceSlice {
                metadata: ObjectMeta {
                    name: Some(name.clone()),
                    annotations: Some(BTreeMap::from([(
                        SLICE_HASH_ANNOTATION.to_string(),
                        hash.clone(),
                    )])),
                    owner_references: owner.clone().map(|o| vec![o]),
                    ..ObjectMeta::default()
                },
                spec: spec.clone(),
            };
            bounded(
                self.timeout,
                || format!("applying ResourceSlice {name} of node {}", self.node),
                self.slices.patch(name, &params, &Patch::Apply(&slice)),
            )
            .await?;
        }
        // After the new generation is in place: until then the old slices still serve.
        for name in &plan.delete {
            match bounded(
                self.timeout,
                || format!("deleting ResourceSlice {name} of node {}", self.node),
                self.slices.delete(name, &DeleteParams::default()),
            )
            .await
            {
                Ok(_) => {}
                // Gone already: what this pass wanted.
                Err(KubeError::Api {
                    source: kube::Error::Api(status),
                    ..
                }) if status.code == 404 => {}
                Err(e) => return Err(e),
            }
        }
        if !plan.is_empty() {
            tracing::info!(
                node = %self.node,
                driver = %self.driver,
                generation = plan.generation,
                applied = plan.apply.len(),
                deleted = plan.delete.len(),
                "ResourceSlices published"
            );
        }
        Ok(Published {
            generation: plan.generation,
            applied: plan.apply.len(),
            deleted: plan.delete.len(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::resource::v1::{CounterSet, Device, ResourcePool};

    fn spec(devices: &[&str]) -> ResourceSliceSpec {
        ResourceSliceSpec {
            driver: "ignored".into(),
            pool: ResourcePool {
                name: "ignored".into(),
                generation: 99,
                resource_slice_count: 7,
            },
            devices: Some(
                devices
                    .iter()
                    .map(|d| Device {
                        name: (*d).to_string(),
                        ..Device::default()
                    })
                    .collect(),
            ),
            ..ResourceSliceSpec::default()
        }
    }

    fn as_observed(plan: &SlicePlan) -> Vec<ObservedSlice> {
        plan.apply
            .iter()
            .map(|(name, hash, spec)| ObservedSlice {
                name: name.clone(),
                generation: spec.pool.generation,
                hash: Some(hash.clone()),
            })
            .collect()
    }

    #[test]
    fn the_first_pass_writes_generation_one_with_the_pool_set_here() {
        let plan = plan_slices(
            "n1",
            "gpu.nvidia.com",
            &[spec(&["gpu-0"]), spec(&["gpu-1"])],
            &[],
        );
        assert_eq!(plan.generation, 1);
        assert!(plan.delete.is_empty());
        let names: Vec<&str> = plan.apply.iter().map(|(n, _, _)| n.as_str()).collect();
        assert_eq!(names, ["n1-gpu.nvidia.com-0", "n1-gpu.nvidia.com-1"]);
        for (_, _, s) in &plan.apply {
            assert_eq!(s.driver, "gpu.nvidia.com");
            assert_eq!(s.node_name.as_deref(), Some("n1"));
            assert_eq!(s.pool.name, "n1");
            assert_eq!(s.pool.generation, 1);
            assert_eq!(s.pool.resource_slice_count, 2);
        }
    }

    #[test]
    fn an_unchanged_set_writes_nothing_and_keeps_the_generation() {
        let desired = [spec(&["gpu-0"]), spec(&["gpu-1"])];
        let first = plan_slices("n1", "gpu.nvidia.com", &desired, &[]);
        // The caller's generation does not matter: only the content does.
        let mut again = desired.clone();
        again[0].pool.generation = 5;
        let second = plan_slices("n1", "gpu.nvidia.com", &again, &as_observed(&first));
        assert!(second.is_empty(), "{second:?}");
        assert_eq!(second.generation, 1);
    }

    #[test]
    fn a_change_bumps_the_generation_on_every_slice_and_deletes_extras() {
        let first = plan_slices(
            "n1",
            "gpu.nvidia.com",
            &[spec(&["gpu-0"]), spec(&["gpu-1"])],
            &[],
        );
        let mut observed = as_observed(&first);
        // Someone's leftover slice of this node and driver, without gpuops's hash.
        observed.push(ObservedSlice {
            name: "n1-stale".into(),
            generation: 4,
            hash: None,
        });
        // gpu-1 went into MIG mode: its slice now offers a MIG device instead.
        let plan = plan_slices(
            "n1",
            "gpu.nvidia.com",
            &[spec(&["gpu-0"]), spec(&["gpu-1-mig-1g10gb-19-0"])],
            &observed,
        );
        assert_eq!(plan.generation, 5, "one more than the highest seen");
        assert_eq!(
            plan.apply.len(),
            2,
            "every slice carries the new generation"
        );
        assert!(plan.apply.iter().all(|(_, _, s)| s.pool.generation == 5));
        assert_eq!(plan.delete, ["n1-stale"]);
    }

    #[test]
    fn fewer_slices_delete_the_extra_and_recount_the_pool() {
        let first = plan_slices(
            "n1",
            "gpu.nvidia.com",
            &[spec(&["gpu-0"]), spec(&["gpu-1"])],
            &[],
        );
        let plan = plan_slices(
            "n1",
            "gpu.nvidia.com",
            &[spec(&["gpu-0"])],
            &as_observed(&first),
        );
        assert_eq!(plan.generation, 2);
        assert_eq!(plan.apply.len(), 1);
        assert_eq!(plan.apply[0].2.pool.resource_slice_count, 1);
        assert_eq!(plan.delete, ["n1-gpu.nvidia.com-1"]);
    }

    #[test]
    fn nothing_to_offer_means_no_slice_never_an_empty_one() {
        let first = plan_slices("n1", "gpu.nvidia.com", &[spec(&["gpu-0"])], &[]);
        // NVML missing: no devices. Every slice goes; none is written.
        let plan = plan_slices("n1", "gpu.nvidia.com", &[], &as_observed(&first));
        assert!(plan.apply.is_empty());
        assert_eq!(plan.delete, ["n1-gpu.nvidia.com-0"]);
        assert_eq!(plan.generation, 0);
        // A slice with no devices and no counters is dropped, not published.
        let plan = plan_slices("n1", "gpu.nvidia.com", &[spec(&[])], &[]);
        assert!(plan.is_empty(), "{plan:?}");
        // Shared counters alone are something to offer (dynamic MIG's own slice).
        let counters = ResourceSliceSpec {
            shared_counters: Some(vec![CounterSet {
                name: "gpu-0-counter-set".into(),
                ..CounterSet::default()
            }]),
            ..ResourceSliceSpec::default()
        };
        let plan = plan_slices("n1", "gpu.nvidia.com", &[counters, spec(&["gpu-0"])], &[]);
        assert_eq!(plan.apply.len(), 2);
    }

    #[test]
    fn names_stay_valid_for_the_longest_node_names() {
        let node = "n".repeat(250);
        let a = slice_name(&node, "gpu.nvidia.com", 0);
        let b = slice_name(&node, "gpu.nvidia.com", 1);
        assert!(a.len() <= 253 && b.len() <= 253, "{} {}", a.len(), b.len());
        assert_ne!(a, b);
        assert_eq!(slice_name("n1", "gpu.nvidia.com", 3), "n1-gpu.nvidia.com-3");
    }

    #[test]
    fn the_hash_is_stable_across_builds() {
        // FNV-1a's published test vectors: an agent upgrade must not see a change where there is
        // none.
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
    }
}
