//! Worker identity inside the index.
//!
//! The index never sees worker URLs or names: `fleet` assigns each worker a [`WorkerId`] (the
//! fleet's `WorkerId`), a small integer, when it joins and reuses freed ones. Dense ids let the
//! index keep "which workers hold this block" as a 32-bit set per page of 32 workers instead of
//! a list, which is what keeps a block's slot at 12 bytes and a lookup branch-light. 32 rather
//! than 64 per page because most blocks are held by one worker: the wider set would cost 4
//! more bytes on every block to save a second walk only in fleets of 33+ workers.

use crate::fleet::WorkerId;

/// A set of workers of one page, one bit each.
pub(crate) type Bits = u32;

/// Workers per page (bits of [`Bits`]).
pub(crate) const PAGE_WORKERS: u32 = Bits::BITS;

impl WorkerId {
    /// Which page of [`PAGE_WORKERS`] workers holds this worker's bit.
    pub(crate) fn page(self) -> usize {
        (self.0 / PAGE_WORKERS) as usize
    }

    /// This worker's bit inside its page.
    pub(crate) fn bit(self) -> Bits {
        1 << (self.0 % PAGE_WORKERS)
    }

    /// The worker that owns bit `bit` of page `page`.
    pub(crate) fn from_page_bit(page: usize, bit: u32) -> Self {
        WorkerId(page as u32 * PAGE_WORKERS + bit)
    }
}

/// Iterates the workers whose bits are set in `bits` of page `page`, lowest first.
pub(crate) fn workers_in(page: usize, mut bits: Bits) -> impl Iterator<Item = WorkerId> {
    std::iter::from_fn(move || {
        if bits == 0 {
            return None;
        }
        let b = bits.trailing_zeros();
        bits &= bits - 1;
        Some(WorkerId::from_page_bit(page, b))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn page_and_bit_round_trip() {
        for id in [0u32, 1, 63, 64, 65, 127, 128, 1000] {
            let w = WorkerId(id);
            let got: Vec<_> = workers_in(w.page(), w.bit()).collect();
            assert_eq!(got, vec![w]);
        }
    }

    #[test]
    fn workers_in_lists_all_set_bits_in_order() {
        let got: Vec<_> = workers_in(1, 0b1011).map(|w| w.0).collect();
        assert_eq!(got, vec![32, 33, 35]);
    }
}
