//! The answer of a lookup: per worker, how many leading blocks of a request it holds.

use crate::fleet::WorkerId;

/// Per worker, the number of leading blocks of a request it holds (only workers holding at
/// least one), sorted by worker.
///
/// "Leading" is the only count that saves prefill: an engine reuses a cached prefix, so a
/// worker holding blocks 0–9 and 20–29 of a request saves 10 blocks, not 20.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Overlaps {
    counts: Vec<(WorkerId, u32)>,
    /// Per worker with blocks in host memory or on disk, how many further blocks past its
    /// count it holds there (host memory, disk), sorted by worker; empty without offloading.
    lower: Vec<(WorkerId, [u32; 2])>,
}

impl Overlaps {
    /// No worker holds anything.
    pub fn new() -> Self {
        Self::default()
    }

    /// Leading blocks held by `worker` (0 if none).
    pub fn get(&self, worker: WorkerId) -> u32 {
        self.counts
            .binary_search_by_key(&worker, |(w, _)| *w)
            .map_or(0, |i| self.counts[i].1)
    }

    /// The blocks past [`Overlaps::get`]'s that `worker` holds in host memory and on disk, in
    /// that order: what its engine would load rather than recompute.
    pub fn lower(&self, worker: WorkerId) -> [u32; 2] {
        self.lower
            .binary_search_by_key(&worker, |(w, _)| *w)
            .map_or([0, 0], |i| self.lower[i].1)
    }

    /// Workers with lower-tier continuations, by worker.
    pub fn lower_iter(&self) -> impl Iterator<Item = (WorkerId, [u32; 2])> + '_ {
        self.lower.iter().copied()
    }

    /// Sets the lower-tier continuations (sorted by worker), replacing any.
    pub(crate) fn set_lower(&mut self, lower: Vec<(WorkerId, [u32; 2])>) {
        self.lower = lower;
    }

    /// Raises `worker`'s count to at least `blocks`.
    pub fn raise(&mut self, worker: WorkerId, blocks: u32) {
        if blocks == 0 {
            return;
        }
        match self.counts.binary_search_by_key(&worker, |(w, _)| *w) {
            Ok(i) => self.counts[i].1 = self.counts[i].1.max(blocks),
            Err(i) => self.counts.insert(i, (worker, blocks)),
        }
    }

    /// Workers with a non-zero count and their counts, by worker.
    pub fn iter(&self) -> impl Iterator<Item = (WorkerId, u32)> + '_ {
        self.counts.iter().copied()
    }

    /// Number of workers holding at least the first block.
    pub fn len(&self) -> usize {
        self.counts.len()
    }

    /// Whether no worker holds even the first block.
    pub fn is_empty(&self) -> bool {
        self.counts.is_empty()
    }

    /// The largest count (0 when empty).
    pub fn max(&self) -> u32 {
        self.counts.iter().map(|(_, n)| *n).max().unwrap_or(0)
    }

    /// Appends a count in any worker order; [`Overlaps::sort`] must follow.
    pub(crate) fn push(&mut self, worker: WorkerId, blocks: u32) {
        if blocks > 0 {
            self.counts.push((worker, blocks));
        }
    }

    /// Restores worker order after counts were pushed page by page out of order.
    pub(crate) fn sort(&mut self) {
        self.counts.sort_unstable_by_key(|(w, _)| *w);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raise_keeps_the_maximum_and_worker_order() {
        let mut o = Overlaps::new();
        o.raise(WorkerId(5), 3);
        o.raise(WorkerId(1), 7);
        o.raise(WorkerId(5), 2);
        o.raise(WorkerId(9), 0);
        assert_eq!(
            o.iter().collect::<Vec<_>>(),
            vec![(WorkerId(1), 7), (WorkerId(5), 3)]
        );
        assert_eq!(o.get(WorkerId(9)), 0);
        assert_eq!(o.max(), 7);
    }
}
