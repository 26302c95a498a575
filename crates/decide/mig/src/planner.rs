//! Placement planning: which MIG devices to keep, destroy and create on one GPU so that it ends up
//! with exactly the wanted devices, each at an explicit placement.
//!
//! The search is exact. A GPU has at most 8 memory slices, so a layout has at most 8 instances.
//! [`plan`] enumerates the subsets of the current instances that could survive (largest subsets
//! first, then the ones holding the lowest-placed instances); only subsets as large as the first
//! one around which the rest can be placed compete, so it keeps as many current instances as any
//! layout with the wanted counts could. [`check`] is [`plan`] from an empty GPU.
//!
//! Among the layouts that keep that many, it picks one that can grow into the most count vectors
//! (how many of each GPU-instance profile) on the model, so that a later request for "the same
//! and more" is as likely as possible to keep every instance. On an 8-slice part a 1g at slot 6
//! strands slot 7 (no 1g starts there), anything in the lower half blocks 4g and 7g (they only
//! start at 0), anything in the upper half blocks a 3g there (the only place for one beside a 4g);
//! which costs least depends on the rest of the layout, so no fixed order of starts gets it right
//! every time. The numbers come from a table of every valid layout of the model's geometry, built
//! once on first use (about 2,300 layouts on an 8-slice part: ~0.5 ms optimised, ~8 ms in a debug
//! build).
//!
//! The search backtracks over the wanted instances largest first, trying each profile's starts
//! from the highest down, and skips partial layouts that already grow into no more than the best
//! complete one found (adding an instance never lets a layout grow into more); ties go to the first
//! layout in that order, the right-packed one. Over every feasible count vector A and superset B
//! of it, planning B from the planner's layout for A destroys something for 36 of the 1,080 pairs
//! A ⊊ B on each 8-slice part and none on an A30 (`tests/planner.rs`), the fewest any choice of
//! layouts can; right-packing alone lost 120, the best fixed per-profile order of starts 51. Same
//! input, same output.
//!
//! Only the counts decide the compute-slice total, the per-profile maxima and the engines the
//! instances share (NVIDIA's rule: the sum of each engine type over the instances is at most the
//! GPU's, so a GPU with one NVJPG and one OFA takes one `+me` instance), so those are checked
//! once up front; the searches only have to avoid overlapping memory slices.

use crate::layout::{Instance, Layout};
use gpuops_catalog::{
    EngineCounts, GiProfile, GpuModel, MigGeometry, ProfileName, ProfileNameErrorKind, ci_sizes,
};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

/// What to do to one GPU to go from `current` to a layout with exactly `wanted` MIG devices.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Plan {
    /// The complete wanted layout with explicit placements (canonical device names).
    pub target: Layout,
    /// Instances in both current and target (same profile including the CI part, same start),
    /// named canonically as in `target`.
    pub keep: Vec<Instance>,
    /// Instances of current that are not in target, exactly as `current` spelled them.
    pub destroy: Vec<Instance>,
    /// Instances of target that are not in current. After all destroys, creating them one by one
    /// with explicit placements in this order is valid (every prefix is part of the valid target).
    pub create: Vec<Instance>,
}

impl Plan {
    /// Whether the GPU already has the target layout.
    pub fn is_noop(&self) -> bool {
        self.destroy.is_empty() && self.create.is_empty()
    }
}

/// Why no layout with the wanted MIG devices exists on a model: a result the planner returns and
/// `-o json` serialises (with its numbers), not an error type of its own; as an error it travels
/// in [`crate::MigError::Infeasible`]. `Display` is the explanation users see.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Infeasible {
    /// The model has no MIG at all.
    NotMigCapable { model: String },
    /// A wanted name is not a MIG device name at all.
    BadName { name: String, reason: String },
    /// A `Cc.` prefix names a compute-instance size the GPU instance cannot hold.
    ComputeInstance {
        name: String,
        gpu_slices: u32,
        compute_slices: u32,
        valid: Vec<u32>,
    },
    /// The model offers no such GPU-instance profile.
    UnknownProfile {
        name: String,
        model: String,
        profiles: Vec<String>,
    },
    /// More instances of one GPU-instance profile than the model allows (CI variants count together).
    TooMany {
        profile: String,
        wanted: u64,
        max: u32,
        model: String,
    },
    /// The instances need more memory slices than the GPU has.
    MemorySlices {
        wanted: String,
        needed: u64,
        available: u32,
        model: String,
    },
    /// The instances need more compute slices than the GPU has.
    ComputeSlices {
        wanted: String,
        needed: u64,
        available: u32,
        model: String,
    },
    /// The instances need more engines of one type than the GPU has: media-extension (`+me`)
    /// profiles each take an NVJPG and the OFA, so a GPU with one of each holds only one.
    Engines {
        wanted: String,
        engine: String,
        needed: u64,
        available: u32,
        model: String,
    },
    /// The slice totals fit but no arrangement of placements does; `detail` says where the
    /// closest arrangement the search found got stuck.
    Placement {
        wanted: String,
        model: String,
        detail: Box<PlacementDetail>,
    },
}

impl std::fmt::Display for Infeasible {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Infeasible::NotMigCapable { model } => write!(f, "{model} does not support MIG"),
            Infeasible::BadName { name, reason } => {
                write!(f, "{name} is not a MIG device name ({reason})")
            }
            Infeasible::ComputeInstance {
                name,
                gpu_slices,
                compute_slices,
                valid,
            } => write!(
                f,
                "{name}: a {gpu_slices}g GPU instance cannot hold a {compute_slices}-slice compute instance (valid: {})",
                join(valid)
            ),
            Infeasible::UnknownProfile {
                name,
                model,
                profiles,
            } => write!(
                f,
                "{name} is not a MIG profile of {model} (profiles: {})",
                profiles.join(", ")
            ),
            Infeasible::TooMany {
                profile,
                wanted,
                max,
                model,
            } => write!(
                f,
                "{wanted}x {profile} exceeds the maximum of {max} {profile} on {model}"
            ),
            Infeasible::MemorySlices {
                wanted,
                needed,
                available,
                model,
            } => write!(
                f,
                "{wanted} needs {needed} of {available} memory slices on {model}"
            ),
            Infeasible::ComputeSlices {
                wanted,
                needed,
                available,
                model,
            } => write!(
                f,
                "{wanted} needs {needed} of {available} compute slices on {model}"
            ),
            Infeasible::Engines {
                wanted,
                engine,
                needed,
                available,
                model,
            } => write!(
                f,
                "{wanted} needs {needed} of {available} {engine} engines on {model} (instances share the GPU's engines; each +me instance takes an NVJPG and an OFA)"
            ),
            Infeasible::Placement {
                wanted,
                model,
                detail,
            } => write!(
                f,
                "{wanted} has no valid placement on {model}: {}",
                detail.reason
            ),
        }
    }
}

/// Where the closest arrangement of an [`Infeasible::Placement`] got stuck: with `placed` in place,
/// `profile` (valid starts `starts`) has the free starts `free`, room for `room` instances, but
/// `needed` are wanted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PlacementDetail {
    pub profile: String,
    pub starts: Vec<u32>,
    pub placed: Vec<Instance>,
    pub free: Vec<u32>,
    pub room: u32,
    pub needed: u32,
    /// The explanation, e.g. `2g.20gb can start only at slots 0, 2, 4; with 3g.40gb at 0-3 only
    /// slot 4 is left, but 2 are needed`.
    pub reason: String,
}

/// Plans the change of one GPU of `model` from `current` to a layout with exactly `wanted` MIG
/// devices (`{"1g.10gb": 2, "1c.3g.40gb": 1}`; zero counts are ignored, names are matched
/// case-insensitively and written canonically in the plan).
///
/// The target keeps as many current instances as any feasible layout can and, among the layouts
/// that do, is one that can grow into the most count vectors (see the module documentation);
/// current instances that are not valid on the model (unknown profile, invalid start, overlapping
/// a kept one) are destroyed.
pub fn plan(
    model: &GpuModel,
    wanted: &BTreeMap<String, u32>,
    current: &Layout,
) -> Result<Plan, Infeasible> {
    let demand = Demand::new(model, wanted)?;
    let cands = demand.candidates(model, current);
    // The best (kept subset, created instances) so far and how far it grows (`bound`): only
    // subsets as large as the first one that works compete, and a later one has to grow into
    // strictly more.
    let mut bound = None;
    let mut best: Option<(Vec<usize>, Vec<Instance>)> = None;
    for subset in demand.keepable_subsets(&cands) {
        if best
            .as_ref()
            .is_some_and(|(kept, _)| subset.len() < kept.len())
        {
            break;
        }
        let mut occupied = 0u64;
        let mut layout = demand.empty_layout();
        let mut remaining = demand.counts.clone();
        for &c in &subset {
            occupied |= cands[c].mask;
            layout = demand.grow(layout, cands[c].id);
            remaining[cands[c].item] -= 1;
        }
        let mut search = Search::new(&demand, &remaining, occupied, layout);
        if let Some(created) = search.run_best(&mut bound) {
            best = Some((subset, created));
        }
    }
    match best {
        Some((subset, created)) => Ok(assemble(&demand, current, &cands, &subset, created)),
        // Not even the empty subset (a fresh layout) works.
        None => Err(demand.placement_error(model)),
    }
}

/// Whether `wanted` fits on an empty GPU of `model`; the layout [`plan`] would create from empty.
pub fn check(model: &GpuModel, wanted: &BTreeMap<String, u32>) -> Result<Layout, Infeasible> {
    plan(model, wanted, &Layout::default()).map(|p| p.target)
}

/// `1, 2, 4`.
fn join(values: &[u32]) -> String {
    values
        .iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// `slot 4` / `slots 0, 2, 4`.
fn slots(values: &[u32]) -> String {
    match values {
        [one] => format!("slot {one}"),
        _ => format!("slots {}", join(values)),
    }
}

/// The concrete reason of an [`Infeasible::Placement`], e.g. `2g.20gb can start only at slots 0,
/// 2, 4; with 3g.40gb at 0-3 only slot 4 is left, but 2 are needed`. `placed` holds the other
/// instances with their memory-slice counts.
fn placement_reason(
    profile: &str,
    starts: &[u32],
    placed: &[(Instance, u32)],
    free: &[u32],
    room: u32,
    needed: u32,
) -> String {
    let starts_text = if starts.is_empty() {
        format!("{profile} has no usable placement")
    } else {
        format!("{profile} can start only at {}", slots(starts))
    };
    let need = if needed == 1 {
        "1 is needed".to_string()
    } else {
        format!("{needed} are needed")
    };
    if placed.is_empty() {
        return format!("{starts_text}, room for {room}, but {need}");
    }
    let others = placed
        .iter()
        .map(|(i, size)| match size {
            0 | 1 => format!("{} at {}", i.profile, i.start),
            n => format!("{} at {}-{}", i.profile, i.start, i.start + n - 1),
        })
        .collect::<Vec<_>>();
    let others = match others.split_last() {
        Some((last, rest)) if !rest.is_empty() => format!("{} and {last}", rest.join(", ")),
        _ => others.join(""),
    };
    let left = match free {
        [] => "no slot is left".to_string(),
        [one] => format!("only slot {one} is left"),
        many if room as usize == many.len() => format!("only slots {} are left", join(many)),
        many => format!("only slots {} are left (room for {room})", join(many)),
    };
    format!("{starts_text}; with {others} {left}, but {need}")
}

/// One wanted MIG device name and what it occupies.
#[derive(Debug)]
struct Item {
    /// Canonical MIG device name (`1c.3g.40gb`, `1g.10gb+me`).
    name: String,
    gi: &'static GiProfile,
    /// Usable placements, highest start first (the order ties between equally good layouts are
    /// broken in).
    placements: Vec<Placement>,
}

/// One usable placement of a GPU-instance profile.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Placement {
    start: u32,
    /// The memory slices it occupies.
    mask: u64,
    /// Its number in [`Growth`] ([`NO_LAYOUT`] when the model has no growth table).
    id: u32,
}

/// The validated wanted devices of one GPU, in search order (largest first).
#[derive(Debug)]
struct Demand {
    items: Vec<Item>,
    counts: Vec<u32>,
    /// `2x 3g.40gb + 2x 1g.10gb`, in search order, for messages.
    described: String,
    /// How far each layout of the model can grow, when known.
    growth: Option<Arc<Growth>>,
}

/// A current instance that could be kept: valid on the model and wanted.
#[derive(Debug)]
struct Candidate {
    /// Index into `current.instances`.
    index: usize,
    /// Index into `Demand::items`.
    item: usize,
    start: u32,
    mask: u64,
    /// Its placement number in [`Growth`].
    id: u32,
}

/// The bit mask of `size` memory slices from `start`, if they lie within the GPU's `total`.
fn slice_mask(start: u32, size: u32, total: u32) -> Option<u64> {
    let end = start.checked_add(size)?;
    if size == 0 || end > total || total > 64 {
        return None;
    }
    let run = if size == 64 {
        u64::MAX
    } else {
        (1u64 << size) - 1
    };
    Some(run << start)
}

/// How far each layout of one MIG geometry can grow: for every valid layout (a set of GPU-instance
/// profile placements), the number of count vectors of GPU-instance profiles that some valid
/// layout containing it has, its own included. Placements are numbered per profile, lowest start
/// first, in catalog order; a layout is the bit set of its placements.
///
/// A layout that can grow into more count vectors is kept by more later requests for "the same
/// and more", so [`plan`] picks, among the layouts that keep the most current instances, one that
/// grows into the most. The number only falls as instances are added, which bounds the search.
#[derive(Debug)]
struct Growth {
    /// Per profile, in catalog order: (start, placement number), lowest start first.
    numbers: Vec<Vec<(u32, u32)>>,
    /// The number of placements.
    placements: usize,
    /// The number of the empty layout.
    empty: u32,
    /// `next[layout * placements + id]`: the number of `layout` plus placement `id`, or
    /// [`NO_LAYOUT`] where that is not a valid layout.
    next: Vec<u32>,
    /// The number of count vectors each layout can grow into.
    reach: Vec<u32>,
}

/// No layout (in [`Growth`]), or no placement number.
const NO_LAYOUT: u32 = u32::MAX;

impl Growth {
    /// The table of `geometry`, built on first use and shared from then on. `None` when the
    /// geometry has more than 64 placements (no catalog part comes close) or too many count
    /// vectors to number; the planner then takes the first layout in search order.
    fn of(geometry: &MigGeometry) -> Option<Arc<Growth>> {
        type Cache = Vec<((&'static [GiProfile], u32, u32), Option<Arc<Growth>>)>;
        static CACHE: OnceLock<Mutex<Cache>> = OnceLock::new();
        // The profile table is static, so its address identifies it for good.
        let key = (
            geometry.gi_profiles,
            geometry.memory_slices,
            geometry.compute_slices,
        );
        let mut cache = CACHE
            .get_or_init(Mutex::default)
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let hit = cache.iter().find(|((profiles, memory, compute), _)| {
            std::ptr::eq(*profiles, key.0) && (*memory, *compute) == (key.1, key.2)
        });
        if let Some((_, growth)) = hit {
            return growth.clone();
        }
        let growth = Growth::build(geometry).map(Arc::new);
        cache.push((key, growth.clone()));
        growth
    }

    fn build(geometry: &MigGeometry) -> Option<Growth> {
        let profiles = geometry.gi_profiles;
        // Every placement: (profile, memory-slice mask), numbered in this order.
        let mut placements: Vec<(usize, u64)> = Vec::new();
        let mut numbers = Vec::with_capacity(profiles.len());
        for (profile, gi) in profiles.iter().enumerate() {
            let mut starts: Vec<(u32, u64)> = gi
                .placement_starts
                .iter()
                .filter_map(|&s| {
                    slice_mask(s, gi.memory_slices, geometry.memory_slices).map(|m| (s, m))
                })
                .collect();
            starts.sort_unstable();
            starts.dedup_by_key(|(s, _)| *s);
            let mut own = Vec::with_capacity(starts.len());
            for (start, mask) in starts {
                own.push((start, u32::try_from(placements.len()).ok()?));
                placements.push((profile, mask));
            }
            numbers.push(own);
        }
        if placements.len() > 64 {
            return None;
        }
        // A count vector as one number: profile i counts in units of the product of the
        // (maximum + 1) of the profiles before it.
        let mut unit = Vec::with_capacity(profiles.len());
        let mut next = 1u64;
        for gi in profiles {
            unit.push(next);
            next = next.checked_mul(u64::from(gi.max_count) + 1)?;
        }
        let mut all = Layouts {
            geometry,
            placements: &placements,
            unit: &unit,
            per_profile: vec![0; profiles.len()],
            engines: EngineCounts::default(),
            budget: geometry.engine_budget(),
            found: Vec::new(),
        };
        all.walk(0, 0, 0, 0, 0);
        let mut layouts = all.found;
        layouts.sort_unstable_by_key(|l| l.0);
        // Count vectors numbered densely, then one bit set of reachable count vectors per layout,
        // largest layouts first: what a layout reaches is its own counts plus whatever the
        // layouts one placement larger reach.
        let mut codes: Vec<u64> = layouts.iter().map(|l| l.2).collect();
        codes.sort_unstable();
        codes.dedup();
        let words = codes.len().div_ceil(64);
        let mut order: Vec<usize> = (0..layouts.len()).collect();
        order.sort_by_key(|&i| std::cmp::Reverse(layouts[i].0.count_ones()));
        let mut rows = vec![0u64; layouts.len() * words];
        let mut next = vec![NO_LAYOUT; layouts.len() * placements.len()];
        let mut row = vec![0u64; words];
        let mut reach = vec![0u32; layouts.len()];
        for i in order {
            let (set, occupied, code) = layouts[i];
            row.fill(0);
            let own = codes.binary_search(&code).unwrap_or_default();
            row[own / 64] |= 1 << (own % 64);
            for (p, &(_, mask)) in placements.iter().enumerate() {
                if mask & occupied != 0 {
                    continue;
                }
                let bigger = set | (1 << p);
                if let Ok(j) = layouts.binary_search_by_key(&bigger, |l| l.0) {
                    next[i * placements.len() + p] = u32::try_from(j).ok()?;
                    for (w, r) in row.iter_mut().zip(&rows[j * words..(j + 1) * words]) {
                        *w |= r;
                    }
                }
            }
            rows[i * words..(i + 1) * words].copy_from_slice(&row);
            reach[i] = row.iter().map(|w| w.count_ones()).sum();
        }
        Some(Growth {
            numbers,
            placements: placements.len(),
            // Sorted by bit set, the empty layout comes first.
            empty: 0,
            next,
            reach,
        })
    }

    /// How many count vectors `layout` can grow into; 0 for [`NO_LAYOUT`].
    fn reach(&self, layout: u32) -> u32 {
        self.reach.get(layout as usize).copied().unwrap_or(0)
    }

    /// The number of `layout` plus placement `id`; [`NO_LAYOUT`] if either is unknown.
    fn grow(&self, layout: u32, id: u32) -> u32 {
        if layout == NO_LAYOUT || id == NO_LAYOUT {
            return NO_LAYOUT;
        }
        self.next
            .get(layout as usize * self.placements + id as usize)
            .copied()
            .unwrap_or(NO_LAYOUT)
    }

    /// The placement number of `profile` (catalog index) at `start`.
    fn number(&self, profile: usize, start: u32) -> u32 {
        self.numbers
            .get(profile)
            .and_then(|own| own.iter().find(|(s, _)| *s == start))
            .map_or(NO_LAYOUT, |&(_, n)| n)
    }
}

/// The enumeration of every valid layout of a geometry for [`Growth`]: no overlapping memory
/// slices, each profile at most its maximum, compute slices and engines within the GPU's.
struct Layouts<'a> {
    geometry: &'a MigGeometry,
    placements: &'a [(usize, u64)],
    unit: &'a [u64],
    per_profile: Vec<u32>,
    /// The engines the placements chosen so far take, and the GPU's.
    engines: EngineCounts,
    budget: EngineCounts,
    /// (bit set, occupied memory slices, count vector number) of every valid layout.
    found: Vec<(u64, u64, u64)>,
}

impl Layouts<'_> {
    fn walk(&mut self, at: usize, set: u64, occupied: u64, compute: u32, code: u64) {
        let Some(&(profile, mask)) = self.placements.get(at) else {
            self.found.push((set, occupied, code));
            return;
        };
        let gi = &self.geometry.gi_profiles[profile];
        let with = self.engines.plus(gi.engines(), 1);
        if occupied & mask == 0
            && self.per_profile[profile] < gi.max_count
            && compute + gi.compute_slices <= self.geometry.compute_slices
            && with.exceeds(&self.budget).is_none()
        {
            let before = std::mem::replace(&mut self.engines, with);
            self.per_profile[profile] += 1;
            self.walk(
                at + 1,
                set | (1 << at),
                occupied | mask,
                compute + gi.compute_slices,
                code + self.unit[profile],
            );
            self.per_profile[profile] -= 1;
            self.engines = before;
        }
        self.walk(at + 1, set, occupied, compute, code);
    }
}

/// A MIG device name resolved against a model: canonical name and GI profile.
fn resolve(model: &GpuModel, name: &str) -> Result<(String, &'static GiProfile), Infeasible> {
    let parsed: ProfileName =
        name.parse()
            .map_err(|e: gpuops_catalog::ProfileNameError| match e.kind {
                ProfileNameErrorKind::InvalidComputeSize { compute, gpu, .. }
                | ProfileNameErrorKind::ComputeExceedsGpu { compute, gpu } => {
                    Infeasible::ComputeInstance {
                        name: name.trim().to_string(),
                        gpu_slices: gpu,
                        compute_slices: compute,
                        valid: ci_sizes(gpu),
                    }
                }
                kind => Infeasible::BadName {
                    name: name.to_string(),
                    reason: kind.to_string(),
                },
            })?;
    let gi_name = parsed.gi_name();
    let Some(gi) = model.gi_profile(&gi_name) else {
        return Err(Infeasible::UnknownProfile {
            name: gi_name,
            model: model.key.to_string(),
            profiles: model
                .mig
                .as_ref()
                .map(|m| m.gi_profiles.iter().map(|p| p.name.to_string()).collect())
                .unwrap_or_default(),
        });
    };
    let canonical = match parsed.compute_slices {
        Some(c) if c != gi.compute_slices => {
            let valid = ci_sizes(gi.compute_slices);
            if !valid.contains(&c) {
                return Err(Infeasible::ComputeInstance {
                    name: parsed.to_string(),
                    gpu_slices: gi.compute_slices,
                    compute_slices: c,
                    valid,
                });
            }
            format!("{c}c.{}", gi.name)
        }
        _ => gi.name.to_string(),
    };
    Ok((canonical, gi))
}

impl Demand {
    /// The [`Growth`] number of the empty layout.
    fn empty_layout(&self) -> u32 {
        self.growth.as_ref().map_or(NO_LAYOUT, |g| g.empty)
    }

    /// The [`Growth`] number of `layout` plus placement `id`.
    fn grow(&self, layout: u32, id: u32) -> u32 {
        self.growth
            .as_ref()
            .map_or(NO_LAYOUT, |g| g.grow(layout, id))
    }

    /// How many count vectors `layout` can grow into; 0 without a growth table.
    fn growth(&self, layout: u32) -> u32 {
        self.growth.as_ref().map_or(0, |g| g.reach(layout))
    }

    /// Validates `wanted` on `model`: names, maxima, memory and compute totals.
    fn new(model: &GpuModel, wanted: &BTreeMap<String, u32>) -> Result<Demand, Infeasible> {
        let key = model.key.to_string();
        let Some(geometry) = model.mig.as_ref() else {
            return Err(Infeasible::NotMigCapable { model: key });
        };
        let mut by_name: BTreeMap<String, (&'static GiProfile, u64)> = BTreeMap::new();
        for (name, &n) in wanted {
            if n == 0 {
                continue;
            }
            let (canonical, gi) = resolve(model, name)?;
            by_name.entry(canonical).or_insert((gi, 0)).1 += u64::from(n);
        }
        // Per-GI-profile maxima, CI variants together, in catalog order.
        for p in geometry.gi_profiles {
            let total: u64 = by_name
                .values()
                .filter(|(gi, _)| gi.name == p.name)
                .map(|(_, n)| n)
                .sum();
            if total > u64::from(p.max_count) {
                return Err(Infeasible::TooMany {
                    profile: p.name.to_string(),
                    wanted: total,
                    max: p.max_count,
                    model: key,
                });
            }
        }
        // Every count is now at most a profile maximum, so the list below is small.
        let mut entries: Vec<(String, &'static GiProfile, u32)> = by_name
            .into_iter()
            .map(|(name, (gi, n))| (name, gi, u32::try_from(n).unwrap_or(u32::MAX)))
            .collect();
        entries.sort_by(|a, b| {
            b.1.memory_slices
                .cmp(&a.1.memory_slices)
                .then(a.1.placement_starts.len().cmp(&b.1.placement_starts.len()))
                .then(b.1.compute_slices.cmp(&a.1.compute_slices))
                .then(a.0.cmp(&b.0))
        });
        let described = if entries.is_empty() {
            "no MIG devices".to_string()
        } else {
            entries
                .iter()
                .map(|(name, _, n)| format!("{n}x {name}"))
                .collect::<Vec<_>>()
                .join(" + ")
        };
        let memory: u64 = entries
            .iter()
            .map(|(_, gi, n)| u64::from(gi.memory_slices) * u64::from(*n))
            .sum();
        if memory > u64::from(geometry.memory_slices) {
            return Err(Infeasible::MemorySlices {
                wanted: described,
                needed: memory,
                available: geometry.memory_slices,
                model: key,
            });
        }
        let compute: u64 = entries
            .iter()
            .map(|(_, gi, n)| u64::from(gi.compute_slices) * u64::from(*n))
            .sum();
        if compute > u64::from(geometry.compute_slices) {
            return Err(Infeasible::ComputeSlices {
                wanted: described,
                needed: compute,
                available: geometry.compute_slices,
                model: key,
            });
        }
        // Engines are shared like slices: the driver refuses an instance whose engines are taken.
        let engines = entries
            .iter()
            .fold(EngineCounts::default(), |sum, (_, gi, n)| {
                sum.plus(gi.engines(), *n)
            });
        if let Some((engine, needed, available)) = engines.exceeds(&geometry.engine_budget()) {
            return Err(Infeasible::Engines {
                wanted: described,
                engine: engine.to_string(),
                needed: u64::from(needed),
                available,
                model: key,
            });
        }
        let growth = Growth::of(geometry);
        let mut items = Vec::with_capacity(entries.len());
        let mut counts = Vec::with_capacity(entries.len());
        for (name, gi, n) in entries {
            let profile = geometry
                .gi_profiles
                .iter()
                .position(|p| std::ptr::eq(p, gi));
            let mut placements: Vec<Placement> = gi
                .placement_starts
                .iter()
                .filter_map(|&start| {
                    let mask = slice_mask(start, gi.memory_slices, geometry.memory_slices)?;
                    let id = match (&growth, profile) {
                        (Some(g), Some(p)) => g.number(p, start),
                        _ => NO_LAYOUT,
                    };
                    Some(Placement { start, mask, id })
                })
                .collect();
            // Highest start first. This only breaks ties now: which layout is chosen is decided by
            // how far it can grow (see `Growth`), and among equally good ones the right-packed
            // one comes first (big profiles can only start low: 4g and 7g at slot 0).
            placements.sort_unstable_by_key(|p| std::cmp::Reverse(p.start));
            placements.dedup_by_key(|p| p.start);
            items.push(Item {
                name,
                gi,
                placements,
            });
            counts.push(n);
        }
        Ok(Demand {
            items,
            counts,
            described,
            growth,
        })
    }

    /// The current instances that could be kept: valid on the model, at a valid start, and of a
    /// wanted name. Sorted by start, then name, then position in `current`.
    fn candidates(&self, model: &GpuModel, current: &Layout) -> Vec<Candidate> {
        let mut out = Vec::new();
        for (index, inst) in current.instances.iter().enumerate() {
            let Ok((canonical, _)) = resolve(model, &inst.profile) else {
                continue;
            };
            let Some(item) = self.items.iter().position(|i| i.name == canonical) else {
                continue;
            };
            let Some(&Placement { start, mask, id }) = self.items[item]
                .placements
                .iter()
                .find(|p| p.start == inst.start)
            else {
                continue;
            };
            out.push(Candidate {
                index,
                item,
                start,
                mask,
                id,
            });
        }
        out.sort_by(|a, b| {
            a.start
                .cmp(&b.start)
                .then_with(|| self.items[a.item].name.cmp(&self.items[b.item].name))
                .then(a.index.cmp(&b.index))
        });
        out
    }

    /// Every subset of `cands` that can coexist (no overlap, within the wanted counts), largest
    /// first, then lexicographically by candidate position (lowest starts kept first). Always
    /// ends with the empty subset.
    fn keepable_subsets(&self, cands: &[Candidate]) -> Vec<Vec<usize>> {
        fn walk(
            cands: &[Candidate],
            at: usize,
            occupied: u64,
            left: &mut [u32],
            chosen: &mut Vec<usize>,
            out: &mut Vec<Vec<usize>>,
        ) {
            if at == cands.len() {
                out.push(chosen.clone());
                return;
            }
            let c = &cands[at];
            if occupied & c.mask == 0 && left[c.item] > 0 {
                left[c.item] -= 1;
                chosen.push(at);
                walk(cands, at + 1, occupied | c.mask, left, chosen, out);
                chosen.pop();
                left[c.item] += 1;
            }
            walk(cands, at + 1, occupied, left, chosen, out);
        }
        let mut out = Vec::new();
        let mut left = self.counts.clone();
        walk(cands, 0, 0, &mut left, &mut Vec::new(), &mut out);
        // The walk yields subsets in lexicographic order already; a stable sort by size keeps it.
        out.sort_by_key(|s| std::cmp::Reverse(s.len()));
        out
    }

    /// The explanation of why nothing fits from empty, from the deepest partial placement.
    fn placement_error(&self, model: &GpuModel) -> Infeasible {
        let mut search = Search::new(self, &self.counts, 0, NO_LAYOUT);
        search.track_best = true;
        search.run();
        let best = search.best;
        // The first item not fully placed in the deepest partial placement.
        let mut placed_per_item = vec![0u32; self.items.len()];
        for &(item, _) in &best {
            placed_per_item[item] += 1;
        }
        let stuck = (0..self.items.len())
            .find(|&i| placed_per_item[i] < self.counts[i])
            .unwrap_or(0);
        let mut others = 0u64;
        let mut placed = Vec::new();
        for &(item, start) in &best {
            if item == stuck {
                continue;
            }
            let it = &self.items[item];
            if let Some(p) = it.placements.iter().find(|p| p.start == start) {
                others |= p.mask;
            }
            placed.push((Instance::new(it.name.clone(), start), it.gi.memory_slices));
        }
        placed.sort_by(|a, b| {
            a.0.start
                .cmp(&b.0.start)
                .then_with(|| a.0.profile.cmp(&b.0.profile))
        });
        let (profile, starts, placements, needed) = match self.items.get(stuck) {
            Some(it) => (
                it.name.clone(),
                it.gi.placement_starts.to_vec(),
                it.placements.as_slice(),
                self.counts[stuck],
            ),
            None => (String::new(), Vec::new(), &[][..], 0),
        };
        let mut free: Vec<u32> = placements
            .iter()
            .filter(|p| p.mask & others == 0)
            .map(|p| p.start)
            .collect();
        free.sort_unstable();
        // Equal-size aligned intervals: greedy from either end fits the most.
        let mut room = 0;
        let mut taken = others;
        for p in placements {
            if p.mask & taken == 0 {
                taken |= p.mask;
                room += 1;
            }
        }
        let reason = placement_reason(&profile, &starts, &placed, &free, room, needed);
        Infeasible::Placement {
            wanted: self.described.clone(),
            model: model.key.to_string(),
            detail: Box::new(PlacementDetail {
                profile,
                starts,
                placed: placed.into_iter().map(|(i, _)| i).collect(),
                free,
                room,
                needed,
                reason,
            }),
        }
    }
}

/// Backtracking placement of the remaining counts around already occupied slices.
struct Search<'d> {
    demand: &'d Demand,
    /// One entry per instance to place: item index, in search order.
    slots: Vec<usize>,
    /// Placement index chosen for each slot.
    chosen: Vec<usize>,
    occupied: u64,
    /// The [`Growth`] number of the layout so far (kept and placed instances).
    layout: u32,
    track_best: bool,
    /// The deepest partial placement seen (item, start), when `track_best`.
    best: Vec<(usize, u32)>,
}

impl<'d> Search<'d> {
    fn new(demand: &'d Demand, remaining: &[u32], occupied: u64, layout: u32) -> Search<'d> {
        let slots: Vec<usize> = remaining
            .iter()
            .enumerate()
            .flat_map(|(i, &n)| std::iter::repeat_n(i, n as usize))
            .collect();
        Search {
            demand,
            chosen: Vec::with_capacity(slots.len()),
            slots,
            occupied,
            layout,
            track_best: false,
            best: Vec::new(),
        }
    }

    /// Places every slot; on success `chosen` holds the first placement found.
    fn run(&mut self) -> bool {
        self.place(0)
    }

    /// The complete placement that can grow into the most count vectors, if one grows into more
    /// than `bound`; raises `bound` to it. Ties go to the first in search order.
    fn run_best(&mut self, bound: &mut Option<u32>) -> Option<Vec<Instance>> {
        let mut found = None;
        self.explore(0, bound, &mut found);
        found.map(|chosen| {
            self.chosen = chosen;
            self.placed_instances()
        })
    }

    fn place(&mut self, depth: usize) -> bool {
        if self.track_best && depth > self.best.len() {
            self.best = self.placed();
        }
        let Some(&item) = self.slots.get(depth) else {
            return true;
        };
        let demand = self.demand;
        for (p, pl) in demand.items[item]
            .placements
            .iter()
            .enumerate()
            .skip(self.first(depth))
        {
            if self.occupied & pl.mask != 0 {
                continue;
            }
            self.occupied |= pl.mask;
            self.chosen.push(p);
            if self.place(depth + 1) {
                return true;
            }
            self.chosen.pop();
            self.occupied &= !pl.mask;
        }
        false
    }

    /// Branch and bound over every placement: a layout can grow into no more than any part of it
    /// can, so a partial layout that grows into no more than `bound` is not worth completing.
    fn explore(&mut self, depth: usize, bound: &mut Option<u32>, found: &mut Option<Vec<usize>>) {
        let score = self.demand.growth(self.layout);
        if bound.is_some_and(|b| score <= b) {
            return;
        }
        let Some(&item) = self.slots.get(depth) else {
            *bound = Some(score);
            *found = Some(self.chosen.clone());
            return;
        };
        let demand = self.demand;
        for (p, pl) in demand.items[item]
            .placements
            .iter()
            .enumerate()
            .skip(self.first(depth))
        {
            if self.occupied & pl.mask != 0 {
                continue;
            }
            let layout = self.layout;
            self.occupied |= pl.mask;
            self.layout = demand.grow(layout, pl.id);
            self.chosen.push(p);
            self.explore(depth + 1, bound, found);
            self.chosen.pop();
            self.layout = layout;
            self.occupied &= !pl.mask;
        }
    }

    /// The first placement index slot `depth` may take. Instances of one name are
    /// interchangeable: each takes a later placement in the list than the previous one (a lower
    /// start).
    fn first(&self, depth: usize) -> usize {
        match depth.checked_sub(1) {
            Some(prev) if self.slots[prev] == self.slots[depth] => self.chosen[prev] + 1,
            _ => 0,
        }
    }

    /// (item, start) of every placed slot.
    fn placed(&self) -> Vec<(usize, u32)> {
        self.chosen
            .iter()
            .zip(&self.slots)
            .map(|(&p, &item)| (item, self.demand.items[item].placements[p].start))
            .collect()
    }

    fn placed_instances(&self) -> Vec<Instance> {
        self.placed()
            .into_iter()
            .map(|(item, start)| Instance::new(self.demand.items[item].name.clone(), start))
            .collect()
    }
}

/// The plan that keeps `subset` of `cands` and creates `created`.
fn assemble(
    demand: &Demand,
    current: &Layout,
    cands: &[Candidate],
    subset: &[usize],
    created: Vec<Instance>,
) -> Plan {
    let kept_index: Vec<usize> = subset.iter().map(|&c| cands[c].index).collect();
    let keep: Vec<Instance> = {
        let mut k: Vec<Instance> = subset
            .iter()
            .map(|&c| {
                let cand = &cands[c];
                Instance::new(demand.items[cand.item].name.clone(), cand.start)
            })
            .collect();
        k.sort_by(|a, b| {
            a.start
                .cmp(&b.start)
                .then_with(|| a.profile.cmp(&b.profile))
        });
        k
    };
    let destroy: Vec<Instance> = current
        .instances
        .iter()
        .enumerate()
        .filter(|(i, _)| !kept_index.contains(i))
        .map(|(_, inst)| inst.clone())
        .collect();
    let create = Layout::new(created).instances;
    let target = Layout::new(keep.iter().chain(&create).cloned().collect());
    Plan {
        target,
        keep,
        destroy,
        create,
    }
}
