//! Every indexed block, stored along its chain: runs of consecutive blocks with their holders.
//!
//! A kvroute block hash names a whole prefix (it chains every earlier token), so the blocks the
//! fleet holds form a tree, and a lookup walks one path of it from the root. Storing each block
//! as its own hash-table entry costs one random cache line per block of that walk; this machine
//! sustains about one random line per 9 ns, so a 600-block chain costs about 5.4 µs however the
//! probes are scheduled. Here a chain is stored the way engines report it, as *runs*: arrays of
//! consecutive blocks, each block 12 bytes (its hash and the set of workers holding it). A
//! lookup compares the request's hashes against a run sequentially, touching a new random line
//! only where the path branches into another run. The same layout serves the event path: a
//! stored block usually extends its parent's run or revisits it (another worker storing a
//! popular prefix), both on lines the previous block just used.
//!
//! The structure stays exact without a per-block hash table:
//! - a block's hash determines its place, so a block is stored once: either right after its
//!   parent in the parent's run, or as the first block of a run, found through [`Runs::starts`]
//!   (first block hash → run). A lookup that leaves a run therefore probes `starts` once and
//!   either continues in the branch or knows that nobody holds the rest;
//! - holders are per block, so a worker that lost a middle block gets no credit past it, and a
//!   block nobody holds keeps its hash only while a later block of its run or a branch below
//!   it is still held (the walk needs it). Dead tails are cut, runs with no held block and no
//!   branch are freed, and freeing a branch may free its parent in turn;
//! - a location ([`Loc`]) never moves while a worker holds the block there (runs are never
//!   split or compacted), so the per-worker engine-id maps can point straight at it.

use std::mem::size_of;

use super::overlaps::Overlaps;
pub(crate) use super::run::{Loc, MAX_RUN};
use super::run::{Run, Slot, slot_hash};
use super::table::Table;
use super::worker::{Bits, workers_in};
use crate::fleet::WorkerId;
use crate::tokens::BlockHash;

/// All runs, and the index of their first blocks.
#[derive(Default)]
pub(crate) struct Runs {
    runs: Vec<Run>,
    /// Ids of freed runs, reused first.
    free: Vec<u32>,
    /// First block hash of every live run → run id.
    starts: Table<u32>,
    /// Blocks stored in all runs (held or kept for the walk).
    blocks: usize,
    /// Heap bytes of all runs' arrays, kept up to date so that reading the index's size (a
    /// metrics scrape) does not walk every run under the lock.
    run_bytes: usize,
}

impl Runs {
    /// Heap bytes of the runs and their index.
    pub(crate) fn heap_bytes(&self) -> usize {
        self.run_bytes
            + self.runs.capacity() * size_of::<Run>()
            + self.free.capacity() * size_of::<u32>()
            + self.starts.heap_bytes()
    }

    /// Applies `change` to run `id`, keeping [`Runs::run_bytes`] in step with its arrays.
    fn with_run<T>(&mut self, id: u32, change: impl FnOnce(&mut Run) -> T) -> T {
        let run = &mut self.runs[id as usize];
        let before = run.bytes();
        let out = change(run);
        self.run_bytes = self.run_bytes + run.bytes() - before;
        out
    }

    /// Live runs.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.runs.len() - self.free.len()
    }

    /// Blocks kept in runs (held, or needed to reach a held block).
    #[cfg(test)]
    pub(crate) fn blocks(&self) -> usize {
        self.blocks
    }

    /// The hash of the block at `loc`.
    pub(crate) fn hash_at(&self, loc: Loc) -> BlockHash {
        BlockHash(self.runs[loc.run as usize].hash(loc.offset as usize))
    }

    /// Hints the CPU to fetch the slot at `loc`.
    #[inline]
    pub(crate) fn prefetch(&self, loc: Loc) {
        if let Some(s) = self
            .runs
            .get(loc.run as usize)
            .and_then(|r| r.slots.get(loc.offset as usize))
        {
            super::table::prefetch_line(s);
        }
    }

    /// The location of block `hash` whose parent is at `parent` (`None` for the first block of a
    /// chain, or a parent this index no longer knows), storing the block if it is new. `room`
    /// is how many blocks of the same chain the caller is about to store, this one included.
    ///
    /// A block placed without its parent (the parent was evicted between two write chunks of
    /// one event) starts a run of its own. Should the parent's run later grow the same block,
    /// the two copies split its holders: a lookup may miss a hit there, never report a false one.
    pub(crate) fn place(&mut self, parent: Option<Loc>, hash: u64, room: usize) -> Loc {
        let Some(p) = parent else {
            return self.start_or_new(None, hash, room);
        };
        let run = &self.runs[p.run as usize];
        let next = p.offset as usize + 1;
        if next < run.len() {
            if run.hash(next) == hash {
                return Loc {
                    run: p.run,
                    offset: next as u32,
                };
            }
            // Branching off the middle of a run: if stored at all, the block starts a run.
            return self.start_or_new(Some(p), hash, room);
        }
        // The parent ends its run. Without branches from this run the block cannot exist
        // anywhere (its parent would be here), so it extends the run without a probe.
        if run.children > 0
            && let Some(id) = self.starts.get(hash)
        {
            return Loc { run: id, offset: 0 };
        }
        if run.len() >= MAX_RUN {
            // A full run continues in a run branching from its last block.
            return self.start_or_new(Some(p), hash, room);
        }
        // Byte accounting only when an array grows: most appends fill room reserved earlier.
        if run.is_full() {
            self.with_run(p.run, |r| r.push(hash, room));
        } else {
            self.runs[p.run as usize].push(hash, room);
        }
        self.blocks += 1;
        Loc {
            run: p.run,
            offset: next as u32,
        }
    }

    fn start_or_new(&mut self, parent: Option<Loc>, hash: u64, room: usize) -> Loc {
        if let Some(id) = self.starts.get(hash) {
            return Loc { run: id, offset: 0 };
        }
        let mut run = Run {
            parent,
            ..Run::default()
        };
        run.push(hash, room);
        self.run_bytes += run.bytes();
        let id = match self.free.pop() {
            Some(id) => {
                self.runs[id as usize] = run;
                id
            }
            None => {
                self.runs.push(run);
                (self.runs.len() - 1) as u32
            }
        };
        if let Some(p) = parent {
            self.runs[p.run as usize].children += 1;
        }
        self.starts.insert(hash, id);
        self.blocks += 1;
        Loc { run: id, offset: 0 }
    }

    /// Marks `worker` as holding the block at `loc`; `false` if it already did.
    pub(crate) fn set(&mut self, loc: Loc, worker: WorkerId) -> bool {
        let (offset, page) = (loc.offset as usize, worker.page());
        let run = &mut self.runs[loc.run as usize];
        if !run.has_page(page) {
            if run.live == 0 && run.more.is_empty() {
                // Nobody holds anything here: the slots' holders can be this page's.
                run.page = page as u32;
            } else {
                self.with_run(loc.run, |run| run.add_page(page));
            }
        }
        let run = &mut self.runs[loc.run as usize];
        let was_held = run.held(offset);
        let bits = run.bits_mut(page, offset);
        if *bits & worker.bit() != 0 {
            return false;
        }
        *bits |= worker.bit();
        if !was_held {
            run.live += 1;
        }
        true
    }

    /// Marks `worker` as no longer holding the block at `loc`, freeing what nobody needs any
    /// more; `false` if it did not hold it.
    pub(crate) fn unset(&mut self, loc: Loc, worker: WorkerId) -> bool {
        let Some(run) = self.runs.get_mut(loc.run as usize) else {
            return false;
        };
        let offset = loc.offset as usize;
        if offset >= run.len() || run.bits(worker.page(), offset) & worker.bit() == 0 {
            return false;
        }
        *run.bits_mut(worker.page(), offset) &= !worker.bit();
        if !run.held(offset) {
            run.live -= 1;
            self.collect(loc.run);
        }
        true
    }

    /// Cuts the dead tail of run `id` and frees it (and then its parent, and so on) when
    /// nothing in it is held and nothing branches from it.
    fn collect(&mut self, mut id: u32) {
        loop {
            let run = &mut self.runs[id as usize];
            if run.children > 0 {
                return;
            }
            if run.live > 0 {
                let before = run.len();
                self.with_run(id, Run::cut_dead_tail);
                self.blocks -= before - self.runs[id as usize].len();
                return;
            }
            let first = run.hash(0);
            let parent = run.parent;
            self.blocks -= run.len();
            self.run_bytes -= run.bytes();
            *run = Run::default();
            self.free.push(id);
            self.starts.remove(first);
            let Some(p) = parent else {
                return;
            };
            self.runs[p.run as usize].children -= 1;
            id = p.run;
        }
    }

    /// The run starting with block `hash`.
    #[inline]
    fn start(&self, hash: u64) -> Option<&Run> {
        self.starts.get(hash).map(|id| &self.runs[id as usize])
    }

    /// Walks `blocks` (a request's chained hashes) through the runs, calling `visit(i, bits)`
    /// with the holders in `page` of each block `i` the runs contain, in order, until `visit`
    /// returns `false` or the chain leaves the runs.
    #[inline]
    fn walk(&self, blocks: &[BlockHash], page: usize, mut visit: impl FnMut(usize, Bits) -> bool) {
        let Some(first) = blocks.first() else {
            return;
        };
        let Some(mut run) = self.start(first.0) else {
            return;
        };
        let mut offset = 0;
        if !visit(0, run.bits(page, 0)) {
            return;
        }
        for (i, b) in blocks.iter().enumerate().skip(1) {
            offset += 1;
            if offset >= run.len() || run.hash(offset) != b.0 {
                // Leaving the run: the block, if stored, starts a branch.
                let Some(next) = self.start(b.0) else {
                    return;
                };
                (run, offset) = (next, 0);
            }
            if !visit(i, run.bits(page, offset)) {
                return;
            }
        }
    }

    /// Per worker, the number of leading `blocks` it holds, added to `out` in no particular
    /// order (the caller sorts).
    ///
    /// One walk for every page: the request's hashes are compared with a run once, then the
    /// holders of each page still in play are followed over the blocks that matched, carrying
    /// the set of that page's workers that held every block so far. A page drops out when the
    /// set is empty; the walk ends when no page is left or the chain leaves the runs.
    pub(crate) fn lookup(&self, blocks: &[BlockHash], out: &mut Overlaps) {
        let Some(first) = blocks.first() else {
            return;
        };
        let Some(mut run) = self.start(first.0) else {
            return;
        };
        // Per page holding the first block: the workers that held every block so far.
        let mut active: Vec<(u32, Bits)> = Vec::with_capacity(1 + run.more.len());
        if run.slots[0][2] != 0 {
            active.push((run.page, run.slots[0][2]));
        }
        for (p, v) in &run.more {
            if v[0] != 0 {
                active.push((*p, v[0]));
            }
        }
        // Chain position of the run block at `offset`.
        let (mut i, mut offset) = (0, 0);
        while !active.is_empty() {
            // The run's blocks the chain follows from `offset` (at least the one found).
            let n = 1 + common_prefix(&run.slots[offset + 1..], &blocks[i + 1..]);
            active.retain_mut(|(page, set)| {
                *set = if *page == run.page {
                    follow(
                        &run.slots[offset..offset + n],
                        |s| s[2],
                        *page,
                        *set,
                        i,
                        out,
                    )
                } else {
                    match run.other_page(*page) {
                        Some(v) => follow(&v[offset..offset + n], |b| *b, *page, *set, i, out),
                        None => follow(&[], |b: &Bits| *b, *page, *set, i, out),
                    }
                };
                *set != 0
            });
            i += n;
            if active.is_empty() {
                return;
            }
            // Leaving the run: the next block, if stored, starts a branch.
            let Some(next) = blocks.get(i).and_then(|b| self.start(b.0)) else {
                break;
            };
            (run, offset) = (next, 0);
        }
        // Workers still holding when the chain left the runs hold up to there.
        for (page, set) in active {
            for w in workers_in(page as usize, set) {
                out.push(w, i as u32);
            }
        }
    }

    /// The holders in `page` of each leading block of `blocks` the runs contain.
    pub(crate) fn holders(&self, blocks: &[BlockHash], page: usize) -> Vec<Bits> {
        let mut out = Vec::new();
        self.walk(blocks, page, |_, bits| {
            out.push(bits);
            true
        });
        out
    }
}

/// Follows the holders of `page` over consecutive blocks (`holders` reads each block's set;
/// the first is at chain position `start`): the workers of `active` that lose a block get
/// that position as their count in `out`; returns the workers that held them all (every
/// worker of `active` is lost at `start` when `blocks` is empty: the run has no holder there).
#[inline]
fn follow<T>(
    blocks: &[T],
    holders: impl Fn(&T) -> Bits,
    page: u32,
    mut active: Bits,
    start: usize,
    out: &mut Overlaps,
) -> Bits {
    if blocks.is_empty() {
        for w in workers_in(page as usize, active) {
            out.push(w, start as u32);
        }
        return 0;
    }
    // A worker drops out at a few places along a chain at most, so whole groups of blocks are
    // checked at once (the holders all kept), and only a group where someone drops out is
    // followed block by block.
    for (g, group) in blocks.chunks(GROUP).enumerate() {
        let kept = group.iter().fold(active, |set, b| set & holders(b));
        if kept == active {
            continue;
        }
        for (k, b) in group.iter().enumerate() {
            let gone = active & !holders(b);
            if gone != 0 {
                for w in workers_in(page as usize, gone) {
                    out.push(w, (start + g * GROUP + k) as u32);
                }
                active &= !gone;
                if active == 0 {
                    return 0;
                }
            }
        }
    }
    active
}

/// Blocks compared or followed per step of a lookup's walk: a run's blocks are checked a group
/// at a time without a branch per block, and only a group that ends the match (or loses a
/// holder) is gone through block by block.
const GROUP: usize = 8;

/// How many leading `slots` have the hashes of the leading `blocks`.
#[inline]
fn common_prefix(slots: &[Slot], blocks: &[BlockHash]) -> usize {
    let len = slots.len().min(blocks.len());
    let (slots, blocks) = (&slots[..len], &blocks[..len]);
    let mut n = 0;
    for (s, b) in slots.chunks_exact(GROUP).zip(blocks.chunks_exact(GROUP)) {
        let differ = s
            .iter()
            .zip(b)
            .fold(0, |d, (s, b)| d | (slot_hash(s) ^ b.0));
        if differ != 0 {
            break;
        }
        n += GROUP;
    }
    n + slots[n..]
        .iter()
        .zip(&blocks[n..])
        .take_while(|(s, b)| slot_hash(s) == b.0)
        .count()
}

#[cfg(test)]
#[path = "runs_tests.rs"]
mod tests;
