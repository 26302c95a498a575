//! XID events counted per device and code, and the last XID per GPU (DCGM's sticky gauge).

use std::collections::BTreeMap;

/// XIDs seen since the agent started.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct XidCounters {
    /// (GPU index, GPU-instance id when attributed to a MIG instance, XID) -> count.
    counts: BTreeMap<(u32, Option<u32>, u64), u64>,
    /// GPU index -> the last XID (what `DCGM_FI_DEV_XID_ERRORS` shows).
    last: BTreeMap<u32, u64>,
}

impl XidCounters {
    pub fn record(&mut self, gpu: u32, gi: Option<u32>, xid: u64) {
        *self.counts.entry((gpu, gi, xid)).or_default() += 1;
        self.last.insert(gpu, xid);
    }

    /// The last XID on this GPU, 0 when none (as DCGM reports it).
    pub fn last(&self, gpu: u32) -> u64 {
        self.last.get(&gpu).copied().unwrap_or(0)
    }

    /// (XID, count) for the GPU itself (`gi: None`) or one of its GPU instances.
    pub fn counts(&self, gpu: u32, gi: Option<u32>) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.counts
            .range((gpu, gi, 0)..=(gpu, gi, u64::MAX))
            .map(|(&(_, _, xid), &n)| (xid, n))
    }

    pub fn total(&self) -> u64 {
        self.counts.values().sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repeats_count_and_the_gauge_keeps_the_last() {
        let mut x = XidCounters::default();
        x.record(0, None, 79);
        x.record(0, None, 13);
        x.record(0, None, 13);
        x.record(0, Some(7), 31);
        x.record(2, None, 48);
        assert_eq!(x.counts(0, None).collect::<Vec<_>>(), [(13, 2), (79, 1)]);
        assert_eq!(x.counts(0, Some(7)).collect::<Vec<_>>(), [(31, 1)]);
        assert_eq!(x.counts(1, None).count(), 0);
        assert_eq!((x.last(0), x.last(1), x.last(2)), (31, 0, 48));
        assert_eq!(x.total(), 5);
    }
}
