//! One run: consecutive blocks of one chain with their holders, and a block's location in the
//! runs ([`Loc`]), packed into the 32 bits an engine-id map entry has room for. The runs
//! themselves, and why the index stores chains this way, are in `runs`.

use std::mem::size_of;

use super::worker::Bits;

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
pub(super) type Slot = [u32; 3];

pub(super) fn slot_hash(s: &Slot) -> u64 {
    u64::from(s[0]) | u64::from(s[1]) << 32
}

/// A run of consecutive blocks of one chain.
#[derive(Debug, Default)]
pub(super) struct Run {
    pub(super) slots: Vec<Slot>,
    /// Holders from pages other than `page`: `(page, holders per offset)`, only for pages some
    /// worker of which has held a block of the run. A run is usually held from one page (in
    /// fleets of up to 32 workers always), so those pay nothing for it, and in a fleet of
    /// 1,024 workers a block held by one worker costs 4 bytes of holders, not 128.
    pub(super) more: Vec<(u32, Vec<Bits>)>,
    /// The page whose holders live in the slots: that of the first worker to hold a block.
    pub(super) page: u32,
    /// The block this run branches from, if it was known when the run started.
    pub(super) parent: Option<Loc>,
    /// Runs branching from this one: while any exists, no block of this run may be cut.
    pub(super) children: u32,
    /// Blocks held by at least one worker.
    pub(super) live: u32,
}

impl Run {
    pub(super) fn len(&self) -> usize {
        self.slots.len()
    }

    /// Heap bytes of this run's arrays.
    pub(super) fn bytes(&self) -> usize {
        self.slots.capacity() * size_of::<Slot>()
            + self.more.capacity() * size_of::<(u32, Vec<Bits>)>()
            + self
                .more
                .iter()
                .map(|(_, v)| v.capacity() * size_of::<Bits>())
                .sum::<usize>()
    }

    #[inline]
    pub(super) fn hash(&self, offset: usize) -> u64 {
        slot_hash(&self.slots[offset])
    }

    /// The holders of `page` per offset, if the run has any from that page (`None` for the
    /// home page, whose holders are in the slots).
    #[inline]
    pub(super) fn other_page(&self, page: u32) -> Option<&[Bits]> {
        self.more
            .iter()
            .find(|(p, _)| *p == page)
            .map(|(_, v)| v.as_slice())
    }

    #[inline]
    pub(super) fn bits(&self, page: usize, offset: usize) -> Bits {
        if page as u32 == self.page {
            self.slots[offset][2]
        } else {
            self.other_page(page as u32).map_or(0, |v| v[offset])
        }
    }

    /// The holders of `offset` in `page`, which [`Run::add_page`] must have made room for.
    #[allow(
        clippy::expect_used,
        reason = "the caller made room for the page (the method's contract)"
    )]
    pub(super) fn bits_mut(&mut self, page: usize, offset: usize) -> &mut Bits {
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
    pub(super) fn has_page(&self, page: usize) -> bool {
        page as u32 == self.page || self.more.iter().any(|(p, _)| *p == page as u32)
    }

    /// A holder array for `page`.
    pub(super) fn add_page(&mut self, page: usize) {
        let len = self.slots.len();
        self.more.push((page as u32, vec![0; len]));
    }

    /// Whether storing one more block reallocates an array.
    pub(super) fn is_full(&self) -> bool {
        self.slots.len() == self.slots.capacity()
            || self.more.iter().any(|(_, v)| v.len() == v.capacity())
    }

    pub(super) fn held(&self, offset: usize) -> bool {
        self.slots[offset][2] != 0 || self.more.iter().any(|(_, v)| v[offset] != 0)
    }

    pub(super) fn push(&mut self, hash: u64, room: usize) {
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
    pub(super) fn cut_dead_tail(&mut self) {
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
