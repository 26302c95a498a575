//! Pending pods' claims as demand: each pod is served, in order, by a node in flight that still
//! has the devices (so one need buys one node), by re-partitioning a registered node's MIG GPUs
//! (dynamic MIG before buying, as MIG labels are served today), or by the cheapest pool whose new
//! node satisfies every claim of the pod; that new node then serves later pods too.

use crate::ClaimError;
use crate::cel::Functions;
use crate::claim::{Allocation, ClaimSpec, Classes, NodeDevices};
use gpuops_dra::DeviceModel;
use std::collections::{BTreeMap, HashMap};

/// A pool that can grow: the devices its new node publishes and how many more it may buy.
#[derive(Debug, Clone)]
pub struct PoolShape {
    pub name: String,
    pub price_per_hour: f64,
    pub devices: DeviceModel,
    /// Nodes it may still add (max size less replicas and machines in flight).
    pub room: u32,
}

/// A node that exists or is coming, with the devices its claims already hold marked used.
#[derive(Debug, Clone)]
pub struct Existing {
    pub node: String,
    pub devices: NodeDevices,
    pub kind: ExistingKind,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExistingKind {
    /// A machine bought and not yet serving: what it will publish, less claims counted on it.
    InFlight,
    /// A registered node's GPUs as dynamic MIG would offer them (every placement), less the
    /// instances in use: a fit here means re-partitioning it instead of buying.
    Repartitionable,
}

/// One pending pod with claims that cannot be allocated.
#[derive(Debug, Clone)]
pub struct PodClaims {
    pub pod: String,
    pub claims: Vec<ClaimSpec>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// A node in flight will have the devices.
    InFlight {
        node: String,
        devices: Vec<Allocation>,
    },
    /// Re-partitioning this node gives the devices.
    Repartition {
        node: String,
        devices: Vec<Allocation>,
    },
    /// Buy a node of this pool.
    Buy {
        pool: String,
        devices: Vec<Allocation>,
    },
    /// No pool's node satisfies every claim (or none has room): reported, nothing bought.
    NoPool { tried: Vec<String> },
    /// The claims could not be judged: reported, nothing bought.
    Error(ClaimError),
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct Plan {
    /// Per pod, in the order given.
    pub outcomes: Vec<(String, Outcome)>,
    /// Nodes to buy per pool.
    pub buys: BTreeMap<String, u32>,
}

pub fn plan(
    pods: &[PodClaims],
    classes: &Classes,
    mut existing: Vec<Existing>,
    pools: &[PoolShape],
) -> Plan {
    let fns = Functions::new();
    let mut order: Vec<usize> = (0..pools.len()).collect();
    order.sort_by(|&a, &b| {
        pools[a]
            .price_per_hour
            .total_cmp(&pools[b].price_per_hour)
            .then_with(|| pools[a].name.cmp(&pools[b].name))
    });
    let mut room: Vec<u32> = pools.iter().map(|p| p.room).collect();
    let mut fresh: Vec<Option<NodeDevices>> = vec![None; pools.len()];
    let mut scan = Scan::new(&existing, pools);
    let mut out = Plan::default();
    for pod in pods {
        let outcome = serve(
            pod,
            classes,
            &fns,
            &mut existing,
            pools,
            &order,
            &mut room,
            &mut fresh,
            &mut scan,
        );
        if let Outcome::Buy { pool, .. } = &outcome {
            *out.buys.entry(pool.clone()).or_default() += 1;
        }
        out.outcomes.push((pod.pod.clone(), outcome));
    }
    out
}

/// What makes serving thousands of pods linear in the nodes rather than quadratic.
struct Scan {
    /// Per shape of demand (the pod's claims' requests, the claims' names aside) with one
    /// alternative per request: per kind of node, the first index in `existing` not known to
    /// refuse it. Devices are only ever taken, so a node that refused a shape refuses it again,
    /// and (one alternative each) it evaluates a prefix of the selectors it evaluated then,
    /// so it cannot newly fail with an error either; pods of one shape, after a node filled up,
    /// scanned every full node before it again. With `firstAvailable` a fuller node may try an
    /// alternative it never evaluated: those shapes scan from the start as before.
    from: HashMap<String, [usize; 2]>,
    /// Per pool: the nodes bought so far (`<pool>/new-<n>`), counted once rather than by
    /// scanning every node at each purchase.
    bought: Vec<usize>,
    /// CEL programs by expression, compiled once for all pods.
    programs: HashMap<String, std::sync::Arc<cel::Program>>,
}

impl Scan {
    fn new(existing: &[Existing], pools: &[PoolShape]) -> Self {
        let bought = pools
            .iter()
            .map(|p| {
                let prefix = format!("{}/new-", p.name);
                existing
                    .iter()
                    .filter(|e| e.node.starts_with(&prefix))
                    .count()
            })
            .collect();
        Self {
            from: HashMap::new(),
            bought,
            programs: HashMap::new(),
        }
    }

    /// The key of a pod's demand, `None` when it may not skip nodes.
    fn shape(pod: &PodClaims) -> Option<String> {
        let single = pod
            .claims
            .iter()
            .all(|c| c.requests.iter().all(|r| r.alternatives.len() == 1));
        single.then(|| {
            let requests: Vec<_> = pod.claims.iter().map(|c| &c.requests).collect();
            format!("{requests:?}")
        })
    }
}

fn kind_index(kind: ExistingKind) -> usize {
    match kind {
        ExistingKind::InFlight => 0,
        ExistingKind::Repartitionable => 1,
    }
}

#[allow(clippy::too_many_arguments)]
fn serve(
    pod: &PodClaims,
    classes: &Classes,
    fns: &Functions,
    existing: &mut Vec<Existing>,
    pools: &[PoolShape],
    order: &[usize],
    room: &mut [u32],
    fresh: &mut [Option<NodeDevices>],
    scan: &mut Scan,
) -> Outcome {
    let claims = match pod
        .claims
        .iter()
        .map(|c| c.compile_shared(classes, &mut scan.programs))
        .collect::<Result<Vec<_>, _>>()
    {
        Ok(c) => c,
        Err(e) => return Outcome::Error(e),
    };
    let shape = Scan::shape(pod);
    let mut from = shape
        .as_ref()
        .and_then(|k| scan.from.get(k))
        .copied()
        .unwrap_or([0, 0]);
    // In flight first, then re-partitioning: both cost no new node.
    let mut found = None;
    'kinds: for kind in [ExistingKind::InFlight, ExistingKind::Repartitionable] {
        let k = kind_index(kind);
        for (i, e) in existing.iter_mut().enumerate().skip(from[k]) {
            if e.kind != kind {
                continue;
            }
            match e.devices.allocate(fns, &claims) {
                Ok(Some(devices)) => {
                    from[k] = i;
                    let node = e.node.clone();
                    found = Some(match kind {
                        ExistingKind::InFlight => Outcome::InFlight { node, devices },
                        ExistingKind::Repartitionable => Outcome::Repartition { node, devices },
                    });
                    break 'kinds;
                }
                Ok(None) => from[k] = i + 1,
                Err(e) => {
                    found = Some(Outcome::Error(e));
                    break 'kinds;
                }
            }
        }
    }
    if let Some(k) = shape {
        scan.from.insert(k, from);
    }
    if let Some(o) = found {
        return o;
    }
    let mut tried = Vec::new();
    for &p in order {
        let pool = &pools[p];
        tried.push(pool.name.clone());
        if room[p] == 0 {
            continue;
        }
        let mut node = fresh[p]
            .get_or_insert_with(|| NodeDevices::new(pool.devices.clone()))
            .clone();
        match node.allocate(fns, &claims) {
            Ok(Some(devices)) => {
                room[p] -= 1;
                let n = scan.bought[p];
                scan.bought[p] += 1;
                existing.push(Existing {
                    node: format!("{}/new-{n}", pool.name),
                    devices: node,
                    kind: ExistingKind::InFlight,
                });
                return Outcome::Buy {
                    pool: pool.name.clone(),
                    devices,
                };
            }
            Ok(None) => {}
            Err(e) => return Outcome::Error(e),
        }
    }
    Outcome::NoPool { tried }
}
