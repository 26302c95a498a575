//! GetPreferredAllocation: which of the available device IDs the kubelet should pick.
//!
//! Whole GPUs without replicas: the subset (containing the required IDs) with the best total
//! NVLink/PCIe pair score, found exactly by enumerating combinations (ties: the subset that cuts
//! the fewest good links to the GPUs left over, then the lowest GPU indices). Replicas and MIG
//! devices: NVIDIA's greedy `distributed` / `packed` policies, or (`fragmentation-aware`, ours)
//! the whole request on the one device the packing engine's GPU-level rule picks.

use crate::ResourcesError;
use crate::config::{AllocationPolicy, Config};
use crate::model::{Device, Resource};
use gpuops_inventory::{GpuLink, Inventory, PcieLevel};
use std::collections::{BTreeMap, BTreeSet};

/// Above this many candidate subsets the exact search gives way to a greedy one.
pub const MAX_EXACT_SUBSETS: u64 = 200_000;

/// NVIDIA's pair score for two GPUs: 100 per NVLink plus the PCIe path's score.
pub fn pair_score(link: &GpuLink) -> u64 {
    let pcie = match link.pcie {
        PcieLevel::SameBoard => 60,
        PcieLevel::SingleSwitch => 50,
        PcieLevel::MultipleSwitches => 40,
        PcieLevel::HostBridge => 30,
        PcieLevel::SameNumaNode => 20,
        PcieLevel::CrossCpu => 10,
    };
    100 * u64::from(link.nvlinks) + pcie
}

/// The preferred `size` IDs out of `available`, always including `must_include` (listed first).
pub fn preferred_allocation(
    resource: &Resource,
    available: &[String],
    must_include: &[String],
    size: usize,
    cfg: &Config,
    inv: &Inventory,
) -> Result<Vec<String>, ResourcesError> {
    let lookup = |id: &String| {
        resource
            .device(id)
            .ok_or_else(|| ResourcesError::PreferredUnknownDevice {
                resource: resource.name.clone(),
                id: id.clone(),
            })
    };
    let mut avail: Vec<&Device> = Vec::new();
    for id in available {
        let d = lookup(id)?;
        if !avail.iter().any(|a| a.id == d.id) {
            avail.push(d);
        }
    }
    let mut required: Vec<&Device> = Vec::new();
    for id in must_include {
        let d = lookup(id)?;
        if !avail.iter().any(|a| a.id == d.id) {
            return Err(ResourcesError::RequiredNotAvailable {
                resource: resource.name.clone(),
                id: id.clone(),
            });
        }
        if !required.iter().any(|r| r.id == d.id) {
            required.push(d);
        }
    }
    if required.len() > size {
        return Err(ResourcesError::TooManyRequired {
            resource: resource.name.clone(),
            required: required.len(),
            size,
        });
    }
    if avail.len() < size {
        return Err(ResourcesError::TooFew {
            resource: resource.name.clone(),
            size,
            available: avail.len(),
        });
    }
    let chosen = if resource.replicas <= 1 && !resource.is_mig() {
        by_topology(&avail, &required, size, inv)
    } else {
        greedy(
            resource,
            &avail,
            &required,
            size,
            cfg.shared_devices_allocation_policy(),
        )
    };
    Ok(chosen.into_iter().map(|d| d.id.clone()).collect())
}

fn by_topology<'a>(
    avail: &[&'a Device],
    required: &[&'a Device],
    size: usize,
    inv: &Inventory,
) -> Vec<&'a Device> {
    let score = |a: &Device, b: &Device| {
        inv.link(a.backing.gpu_index, b.backing.gpu_index)
            .map_or(0, pair_score)
    };
    let rest: Vec<&Device> = {
        let mut r: Vec<&Device> = avail
            .iter()
            .filter(|d| !required.iter().any(|q| q.id == d.id))
            .copied()
            .collect();
        r.sort_by_key(|d| d.backing.gpu_index);
        r
    };
    let need = size - required.len();
    // Value of a candidate set: (total pair score, -cut to the leftover GPUs); higher is better.
    let value = |set: &[&Device]| -> (u64, i64) {
        let mut inside = 0u64;
        for (i, a) in set.iter().enumerate() {
            for b in &set[i + 1..] {
                inside += score(a, b);
            }
        }
        let mut cut = 0u64;
        for a in set {
            for b in avail {
                if !set.iter().any(|s| s.id == b.id) {
                    cut += score(a, b);
                }
            }
        }
        (inside, -i64::try_from(cut).unwrap_or(i64::MAX))
    };
    let mut picked: Vec<&Device> = required.to_vec();
    if need == 0 {
        return picked;
    }
    if binomial(rest.len() as u64, need as u64) <= MAX_EXACT_SUBSETS {
        let mut best: Option<((u64, i64), Vec<usize>)> = None;
        let mut combo: Vec<usize> = (0..need).collect();
        loop {
            let mut set = picked.clone();
            set.extend(combo.iter().map(|&i| rest[i]));
            let v = value(&set);
            // Strictly better only: the first (lowest-index) combination wins ties.
            if best.as_ref().is_none_or(|(bv, _)| v > *bv) {
                best = Some((v, combo.clone()));
            }
            if !next_combination(&mut combo, rest.len()) {
                break;
            }
        }
        if let Some((_, combo)) = best {
            picked.extend(combo.iter().map(|&i| rest[i]));
        }
        return picked;
    }
    // Greedy: add the GPU with the best gain to the set so far, then the best potential (its
    // strongest links to the GPUs still left), then the smallest cut.
    let mut left = rest;
    while picked.len() < size && !left.is_empty() {
        let still = size - picked.len() - 1;
        let mut best_i = 0;
        let mut best_v = None;
        for (i, c) in left.iter().enumerate() {
            let gain: u64 = picked.iter().map(|p| score(p, c)).sum();
            let mut others: Vec<u64> = left
                .iter()
                .filter(|o| o.id != c.id)
                .map(|o| score(c, o))
                .collect();
            others.sort_unstable_by(|a, b| b.cmp(a));
            let potential: u64 = others.iter().take(still).sum();
            let mut set = picked.clone();
            set.push(c);
            let v = (gain, potential, value(&set).1);
            if best_v.is_none_or(|b| v > b) {
                best_v = Some(v);
                best_i = i;
            }
        }
        picked.push(left.remove(best_i));
    }
    picked
}

fn binomial(n: u64, k: u64) -> u64 {
    if k > n {
        return 0;
    }
    let k = k.min(n - k);
    let mut r: u64 = 1;
    for i in 0..k {
        r = r.saturating_mul(n - i) / (i + 1);
        if r > MAX_EXACT_SUBSETS {
            return r;
        }
    }
    r
}

/// Advances `c` (strictly increasing indices < n) to the next combination in lexicographic order.
fn next_combination(c: &mut [usize], n: usize) -> bool {
    let k = c.len();
    let mut i = k;
    while i > 0 {
        i -= 1;
        if c[i] < n - k + i {
            c[i] += 1;
            for j in i + 1..k {
                c[j] = c[j - 1] + 1;
            }
            return true;
        }
    }
    false
}

fn greedy<'a>(
    resource: &'a Resource,
    avail: &[&'a Device],
    required: &[&'a Device],
    size: usize,
    policy: AllocationPolicy,
) -> Vec<&'a Device> {
    // Allocated replicas per backing device and per physical GPU = known IDs not available.
    let mut dev_alloc: BTreeMap<&str, i64> = BTreeMap::new();
    let mut gpu_alloc: BTreeMap<u32, i64> = BTreeMap::new();
    for d in &resource.devices {
        if !avail.iter().any(|a| a.id == d.id) {
            *dev_alloc.entry(d.backing_uuid()).or_default() += 1;
            *gpu_alloc.entry(d.backing.gpu_index).or_default() += 1;
        }
    }
    let mut used_gpus: BTreeSet<u32> = BTreeSet::new();
    let mut picked: Vec<&Device> = Vec::new();
    let take = |d: &'a Device,
                picked: &mut Vec<&'a Device>,
                dev_alloc: &mut BTreeMap<&'a str, i64>,
                gpu_alloc: &mut BTreeMap<u32, i64>,
                used: &mut BTreeSet<u32>| {
        picked.push(d);
        *dev_alloc.entry(d.backing_uuid()).or_default() += 1;
        *gpu_alloc.entry(d.backing.gpu_index).or_default() += 1;
        used.insert(d.backing.gpu_index);
    };
    for d in required {
        take(
            d,
            &mut picked,
            &mut dev_alloc,
            &mut gpu_alloc,
            &mut used_gpus,
        );
    }
    // Replicas compete per backing device; MIG devices without replicas per physical GPU.
    let per_device = resource.replicas > 1;
    if policy == AllocationPolicy::FragmentationAware && per_device {
        for d in one_device_share(resource, avail, &picked, size) {
            take(
                d,
                &mut picked,
                &mut dev_alloc,
                &mut gpu_alloc,
                &mut used_gpus,
            );
        }
    }
    // What the fragmentation-aware choice leaves (a share larger than any device's free
    // replicas, or MIG devices without replicas) is packed.
    let sign = match policy {
        AllocationPolicy::Distributed => 1,
        AllocationPolicy::Packed | AllocationPolicy::FragmentationAware => -1,
    };
    while picked.len() < size {
        let best = avail
            .iter()
            .enumerate()
            .filter(|(_, d)| !picked.iter().any(|p| p.id == d.id))
            .min_by_key(|(i, d)| {
                let gpu = gpu_alloc.get(&d.backing.gpu_index).copied().unwrap_or(0);
                let primary = if per_device {
                    dev_alloc.get(d.backing_uuid()).copied().unwrap_or(0)
                } else {
                    gpu
                };
                (
                    sign * primary,
                    used_gpus.contains(&d.backing.gpu_index),
                    sign * gpu,
                    d.backing.gpu_index,
                    d.backing.mig.as_ref().map_or(0, |m| m.index),
                    d.replica.unwrap_or(0),
                    *i,
                )
            })
            .map(|(_, d)| *d);
        match best {
            Some(d) => take(
                d,
                &mut picked,
                &mut dev_alloc,
                &mut gpu_alloc,
                &mut used_gpus,
            ),
            None => break,
        }
    }
    picked
}

/// `fragmentation-aware`: the replicas still needed, all from one backing device, chosen by the
/// packing engine's GPU-level rule ([`gpuops_packing::extender::preferred_gpus`]): each device's
/// free share is its available replicas x 1000/replicas milli, the request is the missing
/// replicas' share, and the engine picks the device whose free share it fits best (without a
/// typical-pod distribution, which the device plugin does not have, that is the best fit; ties
/// to the lowest GPU index). Devices already holding a required replica come first. Empty when no
/// single device has enough available replicas.
fn one_device_share<'a>(
    resource: &'a Resource,
    avail: &[&'a Device],
    picked: &[&'a Device],
    size: usize,
) -> Vec<&'a Device> {
    let need = size.saturating_sub(picked.len());
    let replicas = resource.replicas.max(1) as usize;
    if need == 0 || need > replicas {
        return Vec::new();
    }
    // Backing devices in resource order (GPU index, MIG index) with their free replicas.
    let mut backs: Vec<(&str, Vec<&Device>)> = Vec::new();
    for d in &resource.devices {
        if !avail.iter().any(|a| a.id == d.id) || picked.iter().any(|p| p.id == d.id) {
            continue;
        }
        match backs.iter_mut().find(|(b, _)| *b == d.backing_uuid()) {
            Some((_, list)) => list.push(d),
            None => backs.push((d.backing_uuid(), vec![d])),
        }
    }
    let milli = |n: usize| u16::try_from(n * 1000 / replicas).unwrap_or(1000);
    let pick = |backs: &[(&str, Vec<&'a Device>)]| -> Option<Vec<&'a Device>> {
        if backs.is_empty() || backs.len() > 64 {
            return None;
        }
        let free: Vec<u16> = backs.iter().map(|(_, l)| milli(l.len())).collect();
        let chosen = gpuops_packing::extender::preferred_gpus(&free, 1, milli(need), None)?;
        let (_, list) = backs.get(*chosen.first()?)?;
        (list.len() >= need).then(|| list[..need].to_vec())
    };
    // Prefer the device(s) a required replica already sits on.
    let with_required: Vec<(&str, Vec<&Device>)> = backs
        .iter()
        .filter(|(b, _)| picked.iter().any(|p| p.backing_uuid() == *b))
        .cloned()
        .collect();
    pick(&with_required)
        .or_else(|| pick(&backs))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::resources;
    use crate::testutil::{cfg, gpu, inv, mig_gpu, mig_uuid, uuid};

    fn link(a: u32, b: u32, nvlinks: u32, pcie: PcieLevel) -> GpuLink {
        GpuLink {
            a,
            b,
            nvlinks,
            pcie,
        }
    }

    /// DGX-H100-like: every pair 18 NVLinks through NVSwitches; GPUs 2i and 2i+1 share a PCIe
    /// switch; 0-3 on NUMA node 0 and 4-7 on node 1.
    fn nvswitch_node() -> Inventory {
        let mut i = inv((0..8).map(gpu).collect());
        for a in 0..8 {
            for b in a + 1..8 {
                let pcie = if a / 2 == b / 2 {
                    PcieLevel::SingleSwitch
                } else if a / 4 == b / 4 {
                    PcieLevel::SameNumaNode
                } else {
                    PcieLevel::CrossCpu
                };
                i.topology.push(link(a, b, 18, pcie));
            }
        }
        i
    }

    /// Four PCIe cards with NVLink bridges on 0-2 and 1-3, while 0-1 and 2-3 share PCIe switches.
    fn bridged_pairs_node() -> Inventory {
        let mut i = inv((0..4).map(gpu).collect());
        i.topology = vec![
            link(0, 1, 0, PcieLevel::SingleSwitch),
            link(0, 2, 4, PcieLevel::HostBridge),
            link(0, 3, 0, PcieLevel::HostBridge),
            link(1, 2, 0, PcieLevel::HostBridge),
            link(1, 3, 4, PcieLevel::HostBridge),
            link(2, 3, 0, PcieLevel::SingleSwitch),
        ];
        i
    }

    fn ids(v: &[u32]) -> Vec<String> {
        v.iter().map(|&g| uuid(g)).collect()
    }

    #[test]
    fn pair_scores_follow_nvidia() {
        assert_eq!(pair_score(&link(0, 1, 2, PcieLevel::SameBoard)), 260);
        assert_eq!(pair_score(&link(0, 1, 0, PcieLevel::MultipleSwitches)), 40);
        assert_eq!(pair_score(&link(0, 1, 0, PcieLevel::CrossCpu)), 10);
    }

    #[test]
    fn whole_gpus_by_topology() {
        let c = cfg("");
        // (node, available, required, size, expected)
        type Case = (Inventory, Vec<u32>, Vec<u32>, usize, Vec<u32>);
        let cases: Vec<Case> = vec![
            (nvswitch_node(), (0..8).collect(), vec![], 2, vec![0, 1]),
            (
                nvswitch_node(),
                (0..8).collect(),
                vec![],
                4,
                vec![0, 1, 2, 3],
            ),
            (nvswitch_node(), (0..8).collect(), vec![5], 2, vec![5, 4]),
            (
                nvswitch_node(),
                (0..8).collect(),
                vec![],
                8,
                (0..8).collect(),
            ),
            // GPU 0 is taken: its switch partner 1 is the one to give away next.
            (nvswitch_node(), (1..8).collect(), vec![], 1, vec![1]),
            (
                nvswitch_node(),
                vec![7, 6, 1, 3, 2],
                vec![],
                3,
                vec![1, 2, 3],
            ),
            // NVLink bridges beat a shared PCIe switch.
            (
                bridged_pairs_node(),
                (0..4).collect(),
                vec![],
                2,
                vec![0, 2],
            ),
            (
                bridged_pairs_node(),
                (0..4).collect(),
                vec![1],
                2,
                vec![1, 3],
            ),
            (bridged_pairs_node(), vec![0, 1, 3], vec![], 2, vec![1, 3]),
            // A single GPU comes from the broken pair, keeping 1-3 whole.
            (bridged_pairs_node(), vec![0, 1, 3], vec![], 1, vec![0]),
            (
                bridged_pairs_node(),
                vec![3, 2, 1, 0],
                vec![3, 0],
                4,
                vec![3, 0, 1, 2],
            ),
        ];
        for (n, (node, avail, req, size, want)) in cases.into_iter().enumerate() {
            let r = resources(&node, &c).unwrap().remove(0);
            let got = preferred_allocation(&r, &ids(&avail), &ids(&req), size, &c, &node).unwrap();
            assert_eq!(got, ids(&want), "case {n}");
        }
    }

    #[test]
    fn large_nodes_fall_back_to_greedy_and_still_find_the_cluster() {
        let mut node = inv((0..40).map(gpu).collect());
        for a in 0..40 {
            for b in a + 1..40 {
                let nv = if (30..40).contains(&a) && (30..40).contains(&b) {
                    2
                } else {
                    0
                };
                node.topology.push(link(a, b, nv, PcieLevel::CrossCpu));
            }
        }
        let c = cfg("");
        let r = resources(&node, &c).unwrap().remove(0);
        let all: Vec<u32> = (0..40).collect();
        let mut got = preferred_allocation(&r, &ids(&all), &[], 10, &c, &node).unwrap();
        got.sort();
        assert_eq!(got, ids(&(30..40).collect::<Vec<_>>()));
    }

    #[test]
    fn errors() {
        let node = bridged_pairs_node();
        let c = cfg("");
        let r = resources(&node, &c).unwrap().remove(0);
        let cases = [
            (
                ids(&[0, 1]),
                ids(&[]),
                3,
                "asked for 3 devices but only 2 are available",
            ),
            (ids(&[0, 1]), ids(&[2]), 2, "required device GPU-00000002"),
            (
                ids(&[0, 1]),
                ids(&[0, 1]),
                1,
                "2 required devices exceed the request size 1",
            ),
            (
                vec!["GPU-x".to_string()],
                vec![],
                1,
                "unknown device ID GPU-x",
            ),
        ];
        for (avail, req, size, want) in cases {
            let err = preferred_allocation(&r, &avail, &req, size, &c, &node)
                .unwrap_err()
                .to_string();
            assert!(err.contains(want), "{err}");
        }
    }

    fn rep(g: u32, n: u32) -> String {
        format!("{}::{n}", uuid(g))
    }

    #[test]
    fn replicas_distributed_and_packed() {
        let node = inv(vec![gpu(0), gpu(1), gpu(2)]);
        let base = "sharing:\n  timeSlicing:\n    resources: [{name: gpu, replicas: 4}]\n";
        let all: Vec<String> = (0..3)
            .flat_map(|g| (0..4).map(move |n| rep(g, n)))
            .collect();
        let without = |gone: &[String]| -> Vec<String> {
            all.iter().filter(|i| !gone.contains(i)).cloned().collect()
        };
        // (policy, available, required, size, expected)
        type Case<'a> = (&'a str, Vec<String>, Vec<String>, usize, Vec<String>);
        let cases: Vec<Case> = vec![
            (
                "distributed",
                all.clone(),
                vec![],
                3,
                vec![rep(0, 0), rep(1, 0), rep(2, 0)],
            ),
            (
                "packed",
                all.clone(),
                vec![],
                3,
                vec![rep(0, 0), rep(0, 1), rep(0, 2)],
            ),
            // GPU 0 has one replica in use: distributed avoids it, packed fills it.
            (
                "distributed",
                without(&[rep(0, 0)]),
                vec![],
                2,
                vec![rep(1, 0), rep(2, 0)],
            ),
            (
                "packed",
                without(&[rep(0, 0)]),
                vec![],
                2,
                vec![rep(0, 1), rep(0, 2)],
            ),
            // GPU 1 is busiest: packed goes there first.
            (
                "packed",
                without(&[rep(0, 0), rep(1, 0), rep(1, 1)]),
                vec![],
                3,
                vec![rep(1, 2), rep(1, 3), rep(0, 1)],
            ),
            // Required first; distributed then spreads to other GPUs.
            (
                "distributed",
                all.clone(),
                vec![rep(2, 3)],
                3,
                vec![rep(2, 3), rep(0, 0), rep(1, 0)],
            ),
        ];
        for (n, (policy, avail, req, size, want)) in cases.into_iter().enumerate() {
            let c = cfg(&format!(
                "flags: {{plugin: {{sharedDevicesAllocationPolicy: {policy}}}}}\n{base}"
            ));
            let r = resources(&node, &c).unwrap().remove(0);
            let got = preferred_allocation(&r, &avail, &req, size, &c, &node).unwrap();
            assert_eq!(got, want, "case {n} ({policy})");
        }
    }

    #[test]
    fn replicas_fragmentation_aware() {
        let node = inv(vec![gpu(0), gpu(1), gpu(2)]);
        let c = cfg(
            "flags: {plugin: {sharedDevicesAllocationPolicy: fragmentation-aware}}\n\
             sharing:\n  timeSlicing:\n    resources: [{name: gpu, replicas: 4}]\n",
        );
        let r = resources(&node, &c).unwrap().remove(0);
        let all: Vec<String> = (0..3)
            .flat_map(|g| (0..4).map(move |n| rep(g, n)))
            .collect();
        let without = |gone: &[String]| -> Vec<String> {
            all.iter().filter(|i| !gone.contains(i)).cloned().collect()
        };
        let pick = |avail: &[String], req: &[String], size: usize| {
            preferred_allocation(&r, avail, req, size, &c, &node).unwrap()
        };
        // Idle node: the whole request on GPU 0.
        assert_eq!(pick(&all, &[], 2), vec![rep(0, 0), rep(0, 1)]);
        // GPU 0 has 1 replica free, GPU 1 has 3: a 2-replica request keeps its share on one GPU,
        // the best fit that holds it (GPU 1); packed would split it over GPUs 0 and 1.
        let used = without(&[rep(0, 0), rep(0, 1), rep(0, 2), rep(1, 0)]);
        assert_eq!(pick(&used, &[], 2), vec![rep(1, 1), rep(1, 2)]);
        let packed = cfg("flags: {plugin: {sharedDevicesAllocationPolicy: packed}}\n\
             sharing:\n  timeSlicing:\n    resources: [{name: gpu, replicas: 4}]\n");
        let rp = resources(&node, &packed).unwrap().remove(0);
        assert_eq!(
            preferred_allocation(&rp, &used, &[], 2, &packed, &node).unwrap(),
            vec![rep(0, 3), rep(1, 1)]
        );
        // A single replica goes to the best fit: GPU 0's last free replica completes it.
        assert_eq!(pick(&used, &[], 1), vec![rep(0, 3)]);
        // A required replica pins the device when the rest fits there.
        assert_eq!(
            pick(&all, &[rep(2, 1)], 3),
            vec![rep(2, 1), rep(2, 0), rep(2, 2)]
        );
        // A whole GPU's worth of replicas: an entirely free GPU.
        assert_eq!(
            pick(&used, &[], 4),
            vec![rep(2, 0), rep(2, 1), rep(2, 2), rep(2, 3)]
        );
        // More than one GPU's worth: packed fallback, still every replica distinct.
        let got = pick(&all, &[], 6);
        assert_eq!(got.len(), 6);
        assert_eq!(&got[..4], &[rep(0, 0), rep(0, 1), rep(0, 2), rep(0, 3)]);
    }

    #[test]
    fn mig_devices_spread_or_pack_by_physical_gpu() {
        let node = inv(vec![
            mig_gpu(0, &["1g.10gb", "1g.10gb", "1g.10gb"]),
            mig_gpu(1, &["1g.10gb", "1g.10gb", "1g.10gb"]),
        ]);
        let all: Vec<String> = (0..2)
            .flat_map(|g| (0..3).map(move |j| mig_uuid(g, j)))
            .collect();
        for (policy, avail, size, want) in [
            (
                "distributed",
                all.clone(),
                2,
                vec![mig_uuid(0, 0), mig_uuid(1, 0)],
            ),
            // GPU 1 already has one in use.
            (
                "packed",
                all[..5].to_vec(),
                2,
                vec![mig_uuid(1, 0), mig_uuid(1, 1)],
            ),
            (
                "packed",
                all[1..].to_vec(),
                2,
                vec![mig_uuid(0, 1), mig_uuid(0, 2)],
            ),
            ("distributed", all[1..].to_vec(), 1, vec![mig_uuid(1, 0)]),
        ] {
            let c = cfg(&format!(
                "flags: {{migStrategy: mixed, plugin: {{sharedDevicesAllocationPolicy: {policy}}}}}"
            ));
            let r = resources(&node, &c).unwrap().remove(0);
            let got = preferred_allocation(&r, &avail, &[], size, &c, &node).unwrap();
            assert_eq!(got, want, "{policy} {avail:?}");
        }
    }
}
