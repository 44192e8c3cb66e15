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
use super::table::Table;
use super::worker::{Bits, workers_in};
use crate::fleet::WorkerId;
use crate::tokens::BlockHash;

/// Where a block lives: a run and the block's offset in it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Loc {
    pub(crate) run: u32,
    pub(crate) offset: u32,
}

/// Bits of a packed location ([`Loc::pack`]) that hold the offset: runs are at most
/// [`MAX_RUN`] blocks long (a longer chain continues in a run branching from the last block).
#[cfg(not(test))]
const OFFSET_BITS: u32 = 10;
/// Small in unit tests, so that continuation runs and unpackable locations are exercised.
#[cfg(test)]
const OFFSET_BITS: u32 = 6;
/// Bits of a packed location that hold the run id.
#[cfg(not(test))]
const RUN_BITS: u32 = 32 - OFFSET_BITS;
#[cfg(test)]
const RUN_BITS: u32 = 5;

/// Most blocks in one run.
pub(crate) const MAX_RUN: usize = 1 << OFFSET_BITS;

impl Loc {
    /// The location as a 32-bit word, for the engine-id maps: `None` for a run id of
    /// [`RUN_BITS`] bits or more (more than four million live runs), which the maps keep
    /// aside. The all-ones word is never a packed location.
    pub(crate) fn pack(self) -> Option<u32> {
        (self.run < (1 << RUN_BITS) - 1 && (self.offset as usize) < MAX_RUN)
            .then_some(self.run << OFFSET_BITS | self.offset)
    }

    /// The inverse of [`Loc::pack`].
    pub(crate) fn unpack(word: u32) -> Self {
        Loc {
            run: word >> OFFSET_BITS,
            offset: word & (MAX_RUN as u32 - 1),
        }
    }
}

/// One block of a run: its hash (two halves, so a slot is 12 bytes, not 16) and the holders
/// among the 32 workers of the run's home page.
type Slot = [u32; 3];

fn slot_hash(s: &Slot) -> u64 {
    u64::from(s[0]) | u64::from(s[1]) << 32
}

/// A run of consecutive blocks of one chain.
#[derive(Debug, Default)]
struct Run {
    slots: Vec<Slot>,
    /// Holders from pages other than `page`: `(page, holders per offset)`, only for pages some
    /// worker of which has held a block of the run. A run is usually held from one page (in
    /// fleets of up to 32 workers always), so those pay nothing for it, and in a fleet of
    /// 1,024 workers a block held by one worker costs 4 bytes of holders, not 128.
    more: Vec<(u32, Vec<Bits>)>,
    /// The page whose holders live in the slots: that of the first worker to hold a block.
    page: u32,
    /// The block this run branches from, if it was known when the run started.
    parent: Option<Loc>,
    /// Runs branching from this one: while any exists, no block of this run may be cut.
    children: u32,
    /// Blocks held by at least one worker.
    live: u32,
}

impl Run {
    fn len(&self) -> usize {
        self.slots.len()
    }

    /// Heap bytes of this run's arrays.
    fn bytes(&self) -> usize {
        self.slots.capacity() * size_of::<Slot>()
            + self.more.capacity() * size_of::<(u32, Vec<Bits>)>()
            + self
                .more
                .iter()
                .map(|(_, v)| v.capacity() * size_of::<Bits>())
                .sum::<usize>()
    }

    #[inline]
    fn hash(&self, offset: usize) -> u64 {
        slot_hash(&self.slots[offset])
    }

    /// The holders of `page` per offset, if the run has any from that page (`None` for the
    /// home page, whose holders are in the slots).
    #[inline]
    fn other_page(&self, page: u32) -> Option<&[Bits]> {
        self.more
            .iter()
            .find(|(p, _)| *p == page)
            .map(|(_, v)| v.as_slice())
    }

    #[inline]
    fn bits(&self, page: usize, offset: usize) -> Bits {
        if page as u32 == self.page {
            self.slots[offset][2]
        } else {
            self.other_page(page as u32).map_or(0, |v| v[offset])
        }
    }

    /// The holders of `offset` in `page`, which [`Run::add_page`] must have made room for.
    fn bits_mut(&mut self, page: usize, offset: usize) -> &mut Bits {
        if page as u32 == self.page {
            &mut self.slots[offset][2]
        } else {
            let (_, v) = self
                .more
                .iter_mut()
                .find(|(p, _)| *p == page as u32)
                .expect("page added");
            &mut v[offset]
        }
    }

    /// Whether holders of `page` have a place in this run.
    fn has_page(&self, page: usize) -> bool {
        page as u32 == self.page || self.more.iter().any(|(p, _)| *p == page as u32)
    }

    /// A holder array for `page`.
    fn add_page(&mut self, page: usize) {
        let len = self.slots.len();
        self.more.push((page as u32, vec![0; len]));
    }

    /// Whether storing one more block reallocates an array.
    fn is_full(&self) -> bool {
        self.slots.len() == self.slots.capacity()
            || self.more.iter().any(|(_, v)| v.len() == v.capacity())
    }

    fn held(&self, offset: usize) -> bool {
        self.slots[offset][2] != 0 || self.more.iter().any(|(_, v)| v[offset] != 0)
    }

    fn push(&mut self, hash: u64, room: usize) {
        if self.slots.len() == self.slots.capacity() {
            // Sized by what the event still carries, so a run built by one event is allocated
            // once and exactly.
            self.slots
                .reserve_exact(room.min(MAX_RUN.saturating_sub(self.slots.len())).max(1));
        }
        self.slots.push([hash as u32, (hash >> 32) as u32, 0]);
        for (_, v) in &mut self.more {
            v.push(0);
        }
    }

    /// Cuts blocks nobody holds off the end (only called without branches).
    fn cut_dead_tail(&mut self) {
        while self.len() > 0 && !self.held(self.len() - 1) {
            self.slots.pop();
            for (_, v) in &mut self.more {
                v.pop();
            }
        }
        if self.slots.capacity() > 2 * self.slots.len() + 8 {
            self.slots.shrink_to_fit();
            for (_, v) in &mut self.more {
                v.shrink_to_fit();
            }
        }
    }
}

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
            let n = 1 + run.slots[offset + 1..]
                .iter()
                .zip(&blocks[i + 1..])
                .take_while(|(s, b)| slot_hash(s) == b.0)
                .count();
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
    for (k, b) in blocks.iter().enumerate() {
        let gone = active & !holders(b);
        if gone != 0 {
            for w in workers_in(page as usize, gone) {
                out.push(w, (start + k) as u32);
            }
            active &= !gone;
            if active == 0 {
                return 0;
            }
        }
    }
    active
}

#[cfg(test)]
mod tests {
    use super::*;

    const W0: WorkerId = WorkerId(0);
    const W1: WorkerId = WorkerId(1);

    fn chain(tag: u64, n: usize) -> Vec<BlockHash> {
        (0..n as u64)
            .map(|i| BlockHash((tag << 40 ^ i).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1))
            .collect()
    }

    /// Stores `blocks` on `worker` after `parent`, as one event would.
    fn store(
        runs: &mut Runs,
        worker: WorkerId,
        parent: Option<Loc>,
        blocks: &[BlockHash],
    ) -> Vec<Loc> {
        let mut at = parent;
        let mut locs = Vec::new();
        for (i, b) in blocks.iter().enumerate() {
            let loc = runs.place(at, b.0, blocks.len() - i);
            runs.set(loc, worker);
            locs.push(loc);
            at = Some(loc);
        }
        locs
    }

    fn lookup(runs: &Runs, blocks: &[BlockHash]) -> Vec<(u32, u32)> {
        let mut o = Overlaps::new();
        runs.lookup(blocks, &mut o);
        o.sort();
        o.iter()
            .filter(|(w, _)| w.page() == 0)
            .map(|(w, n)| (w.0, n))
            .collect()
    }

    #[test]
    fn a_chain_stored_by_one_event_is_one_run() {
        let mut runs = Runs::default();
        let c = chain(1, 50);
        let locs = store(&mut runs, W0, None, &c);
        assert_eq!(runs.len(), 1);
        assert!(locs.iter().enumerate().all(|(i, l)| *l
            == Loc {
                run: 0,
                offset: i as u32
            }));
        assert_eq!(lookup(&runs, &c), vec![(0, 50)]);
        // A longer request is credited with the stored prefix only.
        let mut longer = c.clone();
        longer.extend(chain(2, 5));
        assert_eq!(lookup(&runs, &longer), vec![(0, 50)]);
    }

    #[test]
    fn branches_share_the_prefix_and_are_found_from_either_side() {
        let mut runs = Runs::default();
        let root = chain(1, 10);
        let locs = store(&mut runs, W0, None, &root);
        // W1 holds the first six blocks and its own continuation from block 5.
        store(&mut runs, W1, None, &root[..6]);
        let tail = chain(2, 4);
        store(&mut runs, W1, Some(locs[5]), &tail);
        assert_eq!(runs.len(), 2);
        let mut req = root[..6].to_vec();
        req.extend(&tail);
        assert_eq!(lookup(&runs, &req), vec![(0, 6), (1, 10)]);
        assert_eq!(lookup(&runs, &root), vec![(0, 10), (1, 6)]);
        assert_eq!(runs.hash_at(locs[3]), root[3]);
    }

    #[test]
    fn a_lost_middle_block_ends_the_credit_and_dead_runs_are_freed() {
        let mut runs = Runs::default();
        let c = chain(1, 8);
        let locs = store(&mut runs, W0, None, &c);
        assert!(runs.unset(locs[3], W0));
        assert!(!runs.unset(locs[3], W0));
        assert_eq!(lookup(&runs, &c), vec![(0, 3)]);
        // The dead block stays while later blocks are held; cutting them frees everything.
        assert_eq!(runs.blocks(), 8);
        for l in locs.iter().rev() {
            runs.unset(*l, W0);
        }
        assert_eq!((runs.len(), runs.blocks()), (0, 0));
        assert_eq!(lookup(&runs, &c), vec![]);
        // Freed ids are reused and the chain can be stored again.
        store(&mut runs, W1, None, &c);
        assert_eq!(lookup(&runs, &c), vec![(1, 8)]);
        assert_eq!(runs.len(), 1);
    }

    #[test]
    fn a_branch_keeps_its_dead_parent_until_it_goes() {
        let mut runs = Runs::default();
        let root = chain(1, 6);
        let locs = store(&mut runs, W0, None, &root);
        let branch = store(&mut runs, W1, Some(locs[2]), &chain(2, 3));
        for l in &locs {
            runs.unset(*l, W0);
        }
        // Nobody holds the root, but the walk to W1's blocks needs its first three hashes.
        assert_eq!(runs.len(), 2);
        assert_eq!(runs.blocks(), 6 + 3);
        for l in &branch {
            runs.unset(*l, W1);
        }
        assert_eq!((runs.len(), runs.blocks()), (0, 0));
    }

    #[test]
    fn workers_beyond_the_first_page_have_their_own_holders() {
        let mut runs = Runs::default();
        let c = chain(1, 5);
        let locs = store(&mut runs, WorkerId(40), None, &c);
        store(&mut runs, W0, None, &c[..2]);
        let mut o = Overlaps::new();
        runs.lookup(&c, &mut o);
        o.sort();
        assert_eq!(o.get(WorkerId(40)), 5);
        assert_eq!(lookup(&runs, &c), vec![(0, 2)]);
        assert_eq!(runs.holders(&c, 1), vec![1 << 8; 5]);
        for l in locs {
            runs.unset(l, WorkerId(40));
        }
        assert_eq!(runs.blocks(), 2);
    }

    #[test]
    fn random_churn_frees_everything_once_nothing_is_held() {
        let mut runs = Runs::default();
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        let mut rand = move |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n
        };
        // Chains that share prefixes and branch at random depths, on random workers.
        let roots: Vec<Vec<BlockHash>> = (0..8).map(|t| chain(t, 40)).collect();
        let mut held: Vec<(Loc, WorkerId)> = Vec::new();
        for step in 0..2_000u64 {
            if rand(3) > 0 || held.is_empty() {
                let root = &roots[rand(8) as usize];
                let depth = 1 + rand(39) as usize;
                let mut blocks = root[..depth].to_vec();
                blocks.extend(chain(100 + step, rand(5) as usize));
                let w = WorkerId(rand(40) as u32);
                for l in store(&mut runs, w, None, &blocks) {
                    held.push((l, w));
                }
            } else {
                let (l, w) = held.swap_remove(rand(held.len() as u64) as usize);
                runs.unset(l, w);
            }
        }
        let walked: usize = runs.runs.iter().map(Run::bytes).sum();
        assert_eq!(runs.run_bytes, walked, "kept in step with the runs");
        for (l, w) in held {
            runs.unset(l, w);
        }
        assert_eq!((runs.len(), runs.blocks(), runs.run_bytes), (0, 0, 0));
        assert!(runs.starts.is_empty());
    }
}
