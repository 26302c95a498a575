//! The Cluster Autoscaler-like baseline, from CA's documented behaviour (facts in
//! `reference/autoscaling.md`): a scan every 10 s; pending pods are first simulated onto nodes
//! already launched (counted as upcoming through the 15-minute provisioning window), then
//! onto template nodes of each group (the binpacking estimate), and the least-waste expander
//! picks one group per scan; a group's template comes from one of its ready nodes or, from
//! zero, from its capacity annotations, which carry one GPU resource name (`gpu-type`), so a MIG
//! group scaled from zero offers only its most numerous profile. Scale-down: a node below 0.5
//! request utilization (GPU requests / GPUs on GPU nodes, else the larger of CPU and memory)
//! for 10 minutes, and not within 10 minutes of a scale-up, is removed if its pods fit on other
//! nodes (they are evicted and rescheduled); empty nodes go in bulk, at most one non-empty node
//! per scan; never below a group's minimum.

use crate::sim::{Action, Ask, Ms, PSt, Pod, World};
use std::collections::{BTreeMap, BTreeSet};

const SCAN: Ms = 10_000;
const UNNEEDED: Ms = 10 * 60_000;
const DELAY_AFTER_ADD: Ms = 10 * 60_000;
const PROVISION_WINDOW: Ms = 15 * 60_000;
const THRESHOLD: f64 = 0.5;

/// What the baseline remembers between scans.
#[derive(Debug, Default)]
pub(crate) struct CaState {
    unneeded_since: BTreeMap<usize, Ms>,
    last_scale_up: Option<Ms>,
    scheduled: BTreeSet<Ms>,
}

/// Capacity CA simulates pods onto.
#[derive(Debug, Clone)]
struct Bin {
    pool: usize,
    cpu: u64,
    mem: u64,
    gpus: Vec<u16>,
    mig: BTreeMap<String, u32>,
}

impl Bin {
    /// A template node of pool `i`: from a ready node's layout when the group has one, else
    /// from the annotations (one GPU resource name).
    fn template(w: &World<'_>, i: usize) -> Bin {
        let p = w.pool(i);
        let has_ready = w.nodes.iter().any(|n| n.pool == i && n.is_ready(w.now));
        let mut mig = w.pool_mig_totals[i].clone();
        if !has_ready && mig.len() > 1 {
            let keep = mig
                .iter()
                .max_by(|a, b| a.1.cmp(b.1).then(b.0.cmp(a.0)))
                .map(|(k, v)| (k.clone(), *v));
            mig = keep.into_iter().collect();
        }
        Bin {
            pool: i,
            cpu: p.cpu_milli,
            mem: p.memory_mib,
            gpus: if p.mig.is_some() {
                Vec::new()
            } else {
                vec![1000; p.gpus as usize]
            },
            mig,
        }
    }

    /// A ready node's free capacity.
    fn free(w: &World<'_>, ni: usize) -> Bin {
        let n = &w.nodes[ni];
        let mut mig = BTreeMap::new();
        for i in n.mig.iter().flatten().filter(|i| i.pod.is_none()) {
            *mig.entry(i.profile.clone()).or_insert(0) += 1;
        }
        Bin {
            pool: n.pool,
            cpu: n.cpu_free,
            mem: n.mem_free,
            gpus: n.gpu_free.clone(),
            mig,
        }
    }

    fn fits(&self, w: &World<'_>, pod: &Pod) -> bool {
        if pod.cpu > self.cpu || pod.mem > self.mem || !w.model_ok(pod, self.pool) {
            return false;
        }
        match &pod.ask {
            Ask::Whole(n) => self.gpus.iter().filter(|g| **g == 1000).count() >= *n as usize,
            Ask::Shared(m) => self.gpus.iter().any(|g| u32::from(*g) >= *m),
            Ask::Mig(p) => self.mig.get(p).copied().unwrap_or(0) > 0,
        }
    }

    fn place(&mut self, pod: &Pod) {
        self.cpu -= pod.cpu;
        self.mem -= pod.mem;
        match &pod.ask {
            Ask::Whole(n) => {
                for g in self
                    .gpus
                    .iter_mut()
                    .filter(|g| **g == 1000)
                    .take(*n as usize)
                {
                    *g = 0;
                }
            }
            Ask::Shared(m) => {
                // Best fit: the GPU with the least room that still fits.
                if let Some(g) = self
                    .gpus
                    .iter_mut()
                    .filter(|g| u32::from(**g) >= *m)
                    .min_by_key(|g| **g)
                {
                    *g -= *m as u16;
                }
            }
            Ask::Mig(p) => {
                if let Some(c) = self.mig.get_mut(p) {
                    *c -= 1;
                }
            }
        }
    }
}

fn utilization(w: &World<'_>, ni: usize) -> f64 {
    let n = &w.nodes[ni];
    let p = w.pool(n.pool);
    if p.mig.is_none() && p.gpus > 0 {
        let used: u64 = n.gpu_free.iter().map(|f| 1000 - u64::from(*f)).sum();
        used as f64 / (f64::from(p.gpus) * 1000.0)
    } else {
        let cpu = (p.cpu_milli - n.cpu_free) as f64 / p.cpu_milli.max(1) as f64;
        let mem = (p.memory_mib - n.mem_free) as f64 / p.memory_mib.max(1) as f64;
        cpu.max(mem)
    }
}

/// One scan (only at 10 s boundaries; other calls do nothing).
pub(crate) fn step(st: &mut CaState, w: &mut World<'_>) -> Vec<Action> {
    let now = w.now;
    st.scheduled.retain(|t| *t > now);
    if !now.is_multiple_of(SCAN) {
        return Vec::new();
    }
    let mut actions = Vec::new();
    let buy = scale_up(w);
    let scaled = buy.is_some();
    if let Some(buy) = buy {
        actions.push(buy);
        st.last_scale_up = Some(now);
    }
    scale_down(st, w, scaled, &mut actions);
    actions
}

/// Scale-up: the pending pods that nodes still provisioning will not take, and the one pool
/// whose new nodes would take them with the least waste.
fn scale_up(w: &World<'_>) -> Option<Action> {
    let now = w.now;
    let mut pending = w.pending.clone();
    pending.sort_by_key(|&p| (w.pods[p].since, p));
    if !pending.is_empty() {
        let mut upcoming: Vec<Bin> = (0..w.nodes.len())
            .filter(|&i| {
                let n = &w.nodes[i];
                n.live() && !n.is_ready(now) && now - n.created <= PROVISION_WINDOW
            })
            .map(|i| Bin::template(w, w.nodes[i].pool))
            .collect();
        let mut rest = Vec::new();
        for pi in pending {
            let pod = &w.pods[pi];
            match upcoming.iter_mut().find(|b| b.fits(w, pod)) {
                Some(b) => b.place(pod),
                None => rest.push(pi),
            }
        }
        let mut best: Option<(f64, String, usize, u32)> = None;
        for i in 0..w.pools.pools.len() {
            let p = w.pool(i);
            let live = w.nodes.iter().filter(|n| n.live() && n.pool == i).count() as u32;
            let room = p.max.saturating_sub(live);
            if room == 0 {
                continue;
            }
            let t = Bin::template(w, i);
            let mut helped: Vec<usize> = rest
                .iter()
                .copied()
                .filter(|&pi| t.fits(w, &w.pods[pi]))
                .collect();
            if helped.is_empty() {
                continue;
            }
            let score = |pi: usize| {
                let pod = &w.pods[pi];
                pod.cpu as f64 / t.cpu.max(1) as f64 + pod.mem as f64 / t.mem.max(1) as f64
            };
            helped.sort_by(|&a, &b| score(b).total_cmp(&score(a)).then(a.cmp(&b)));
            let mut bins: Vec<Bin> = Vec::new();
            let (mut cpu, mut mem) = (0u64, 0u64);
            for pi in helped {
                let pod = &w.pods[pi];
                let count = bins.len() as u32;
                let placed = match bins.iter_mut().find(|b| b.fits(w, pod)) {
                    Some(b) => {
                        b.place(pod);
                        true
                    }
                    None if count < room => {
                        let mut b = t.clone();
                        b.place(pod);
                        bins.push(b);
                        true
                    }
                    None => false,
                };
                if placed {
                    cpu += pod.cpu;
                    mem += pod.mem;
                }
            }
            let n = bins.len() as u32;
            let (tc, tm) = (t.cpu as f64 * f64::from(n), t.mem as f64 * f64::from(n));
            let waste = (tc - cpu as f64) / tc.max(1.0) + (tm - mem as f64) / tm.max(1.0);
            let better = match &best {
                None => true,
                Some((bw, bn, _, _)) => waste < *bw || (waste == *bw && p.name < *bn),
            };
            if better {
                best = Some((waste, p.name.clone(), i, n));
            }
        }
        if let Some((_, _, pool, n)) = best {
            return Some(Action::Buy {
                pool,
                n,
                layout: None,
            });
        }
    }
    None
}

/// Scale-down: unneeded tracking every scan, removals (into `actions`) only when this scan did
/// not scale up and outside the delay after a scale-up.
fn scale_down(st: &mut CaState, w: &World<'_>, scaled: bool, actions: &mut Vec<Action>) {
    let now = w.now;
    let ready: Vec<usize> = (0..w.nodes.len())
        .filter(|&i| w.nodes[i].is_ready(now))
        .collect();
    st.unneeded_since.retain(|i, _| ready.contains(i));
    for &i in &ready {
        if utilization(w, i) < THRESHOLD {
            st.unneeded_since.entry(i).or_insert(now);
        } else {
            st.unneeded_since.remove(&i);
        }
    }
    let cooling = st.last_scale_up.is_some_and(|t| now < t + DELAY_AFTER_ADD);
    if scaled || cooling {
        return;
    }
    let mut cands: Vec<(Ms, usize)> = st
        .unneeded_since
        .iter()
        .filter(|(_, s)| now >= **s + UNNEEDED)
        .map(|(i, s)| (*s, *i))
        .collect();
    cands.sort_unstable();
    let mut size: Vec<u32> = (0..w.pools.pools.len())
        .map(|p| w.nodes.iter().filter(|n| n.live() && n.pool == p).count() as u32)
        .collect();
    let mut removed: Vec<usize> = Vec::new();
    let mut non_empty_done = false;
    for (_, ni) in cands {
        let pool = w.nodes[ni].pool;
        if size[pool] <= w.pool(pool).min {
            continue;
        }
        if !w.nodes[ni].pods.is_empty() {
            if non_empty_done {
                continue;
            }
            // Its pods must fit elsewhere (nodes not being removed).
            let mut others: Vec<Bin> = ready
                .iter()
                .filter(|&&o| o != ni && !removed.contains(&o))
                .map(|&o| Bin::free(w, o))
                .collect();
            let all_fit = w.nodes[ni].pods.iter().all(|&pi| {
                let pod = &w.pods[pi];
                match others.iter_mut().find(|b| b.fits(w, pod)) {
                    Some(b) => {
                        b.place(pod);
                        true
                    }
                    None => false,
                }
            });
            if !all_fit {
                continue;
            }
            non_empty_done = true;
        }
        size[pool] -= 1;
        removed.push(ni);
        st.unneeded_since.remove(&ni);
        actions.push(Action::Remove(ni));
    }
}

/// Wake-ups so that the scans that matter happen: the next scan after any change, every scan
/// while pods are pending, and when a node's unneeded period or the delay after a scale-up ends.
pub(crate) fn schedule(st: &mut CaState, w: &mut World<'_>) {
    let now = w.now;
    let boundary = |t: Ms| t.div_ceil(SCAN) * SCAN;
    let mut at = vec![if now.is_multiple_of(SCAN) {
        now + SCAN
    } else {
        boundary(now)
    }];
    let pending_any = w.pending.iter().any(|&p| w.pods[p].st == PSt::Pending);
    if !pending_any && now.is_multiple_of(SCAN) {
        at.clear();
    }
    for s in st.unneeded_since.values() {
        at.push(boundary(s + UNNEEDED));
    }
    if let Some(t) = st.last_scale_up {
        at.push(boundary(t + DELAY_AFTER_ADD));
    }
    for t in at {
        if t > now && st.scheduled.insert(t) {
            w.wake_at(t);
        }
    }
}
