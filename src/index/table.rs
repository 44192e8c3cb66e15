//! A compact open-addressing hash table keyed by already-random `u64`s.
//!
//! Both of the index's big maps are keyed by hashes (kvroute block hashes, mixed engine ids), so
//! hashing them again would be wasted work, and a general-purpose map spends memory on control
//! bytes and a 50 %-ish average load after doubling. This table is an *ordered* linear-probing
//! table (Amble & Knuth's ordered hash table, i.e. Robin Hood hashing with a monotone home):
//!
//! - the home slot of key `k` is `k * capacity >> 64` ("fastrange"), so any capacity works and
//!   the table grows by 1.5× or 1.25× ([`Growth`]) instead of 2×, keeping the load
//!   between 57 % (or 68 %) and 85 %;
//! - because the home is monotone in the key, the slots are sorted by key: a search stops at the
//!   first larger key or empty slot, so misses (most index probes) cost one or two slots;
//! - deletion shifts the following run back (no tombstones), so the table never degrades under
//!   the store/remove churn of KV events;
//! - there is no wrap-around: a short slack region after the last home slot absorbs the final
//!   run, and is lengthened if that run outgrows it.
//!
//! Keys are used as they come: kvroute block hashes are uniform, and engine ids go through
//! [`mix`] first. Block hashes are computable by clients (xxh3 of their own tokens under a
//! known seed), so a client could craft prompts whose blocks share a home region; the damage
//! is bounded to slower probes in that region (memory stays proportional to entries, since a
//! crowded end lengthens the tail instead of growing the table). Scrambling keys with a
//! per-process secret would close that too, but measured 25 % slower lookups here.
//!
//! Key 0 marks an empty slot; a real key 0 lives in a side slot.

use std::mem::size_of;

/// Maximum load before growing, as a fraction `LOAD_NUM / LOAD_DEN`.
const LOAD_NUM: usize = 17;
const LOAD_DEN: usize = 20;
/// Slots after the last home slot that absorb the table's final run.
const SLACK: usize = 64;
/// Smallest home range; keeps tiny tables from growing at every insert.
const MIN_CAPACITY: usize = 16;

/// Packed to 4-byte alignment so a `u32` value makes a 12-byte slot instead of 16.
#[derive(Clone, Copy)]
#[repr(C, packed(4))]
struct Slot<V> {
    key: u64,
    val: V,
}

/// A map from non-uniformly-distributed-safe `u64` keys to small `Copy` values.
///
/// Callers must pass keys that are already well mixed (hash outputs, or ids passed through
/// [`mix`]); sequential keys would all share one home slot.
#[derive(Clone)]
pub(crate) struct Table<V: Value> {
    slots: Vec<Slot<V>>,
    /// Number of home slots (`slots.len() - SLACK`).
    capacity: usize,
    len: usize,
    zero: Option<V>,
    growth: Growth,
}

/// How a table trades memory for speed when it grows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Growth {
    /// 1.5×: the load stays between 57 % and 85 %; shorter runs, faster probes.
    Fast,
    /// 1.25×: the load stays between 68 % and 85 %; up to a fifth less memory.
    Compact,
}

/// A bijective mix of an arbitrary `u64` id (e.g. an engine's block id, which may be a small
/// sequential number) into a well-spread key. Being a bijection, equal keys mean equal ids.
pub(crate) fn mix(id: u64) -> u64 {
    // Multiplication by an odd constant is invertible mod 2^64; the xor-shift moves the
    // well-mixed high bits into the low ones so both ends of the word are spread.
    let x = id.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    x ^ (x >> 32)
}

impl<V: Value> Default for Table<V> {
    fn default() -> Self {
        Self::with_capacity(0, Growth::Fast)
    }
}

/// Tables at least this large ask the kernel for transparent huge pages.
const HUGE_PAGE_TABLE: usize = 4 << 20;
const HUGE_PAGE: usize = 2 << 20;

/// A value type whose all-zero bytes are its default, so a table of empty slots can come
/// straight from zeroed memory.
///
/// # Safety
/// The all-zero bit pattern must be a valid value equal to `Self::default()`.
pub(crate) unsafe trait Value: Copy + Default {}

// SAFETY: zero is a valid integer and its default.
unsafe impl Value for u8 {}
// SAFETY: as above.
unsafe impl Value for u32 {}
// SAFETY: as above.
unsafe impl Value for u64 {}

/// `n` empty slots.
///
/// Zeroed memory: large allocations come from fresh kernel pages that are already zero, so
/// growing a table does not write it twice. Large tables are probed at random, so with 4 KiB
/// pages nearly every probe also misses the TLB; they ask for 2 MiB pages where the kernel
/// allows them.
fn empty_slots<V: Value>(n: usize) -> Vec<Slot<V>> {
    let layout = match std::alloc::Layout::array::<Slot<V>>(n) {
        Ok(l) if l.size() > 0 => l,
        _ => return Vec::new(),
    };
    // SAFETY: the layout has a non-zero size.
    let ptr = unsafe { std::alloc::alloc_zeroed(layout) }.cast::<Slot<V>>();
    if ptr.is_null() {
        std::alloc::handle_alloc_error(layout);
    }
    if layout.size() >= HUGE_PAGE_TABLE {
        advise_huge_pages(ptr as usize, layout.size());
    }
    // SAFETY: allocated by the global allocator with exactly the layout of a `Vec` of capacity
    // `n`; all `n` slots are initialised, since all-zero is an empty slot (`Value`: key 0 and
    // the default value).
    unsafe { Vec::from_raw_parts(ptr, n, n) }
}

#[cfg(target_os = "linux")]
fn advise_huge_pages(addr: usize, bytes: usize) {
    let start = addr.next_multiple_of(HUGE_PAGE);
    let end = (addr + bytes) / HUGE_PAGE * HUGE_PAGE;
    if end > start {
        // SAFETY: the range lies inside an allocation we own and have not touched yet;
        // MADV_HUGEPAGE only changes how the kernel backs it and cannot fail in a way that
        // affects memory safety (an error just leaves 4 KiB pages).
        unsafe {
            libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE);
        }
    }
}

#[cfg(not(target_os = "linux"))]
fn advise_huge_pages(_addr: usize, _bytes: usize) {}

impl<V: Value> Table<V> {
    /// A table that holds `n` entries without growing.
    pub(crate) fn with_capacity(n: usize, growth: Growth) -> Self {
        let capacity = (n * LOAD_DEN / LOAD_NUM + 1).max(MIN_CAPACITY);
        Table {
            slots: empty_slots(capacity + SLACK),
            capacity,
            len: 0,
            zero: None,
            growth,
        }
    }

    /// Number of entries.
    pub(crate) fn len(&self) -> usize {
        self.len + usize::from(self.zero.is_some())
    }

    /// Whether the table is empty.
    pub(crate) fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes of heap memory the table holds.
    pub(crate) fn heap_bytes(&self) -> usize {
        self.slots.capacity() * size_of::<Slot<V>>()
    }

    /// The slot where the search for `key` starts.
    #[inline]
    pub(crate) fn home(&self, key: u64) -> usize {
        ((key as u128 * self.capacity as u128) >> 64) as usize
    }

    /// Hints the CPU to fetch `lines` cache lines from `key`'s home slot on: one covers most
    /// searches, an insertion runs on to the end of the run and wants more.
    #[inline]
    pub(crate) fn prefetch(&self, key: u64, lines: usize) {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
            let pos = self.home(key);
            for line in 0..lines {
                let at = pos + line * 64 / size_of::<Slot<V>>();
                if let Some(slot) = self.slots.get(at) {
                    // SAFETY: SSE is part of the x86_64 baseline, and a prefetch is only a
                    // cache hint that never faults; the pointer is valid anyway.
                    unsafe { _mm_prefetch::<_MM_HINT_T0>((slot as *const Slot<V>).cast::<i8>()) };
                }
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = (key, lines);
    }

    /// Hints the CPU to fetch the cache line of slot `pos` (a [`Table::home`]).
    #[inline]
    pub(crate) fn prefetch_slot(&self, pos: usize) {
        #[cfg(target_arch = "x86_64")]
        if let Some(slot) = self.slots.get(pos) {
            use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
            // SAFETY: as in `prefetch`.
            unsafe { _mm_prefetch::<_MM_HINT_T0>((slot as *const Slot<V>).cast::<i8>()) };
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = pos;
    }

    /// The value stored for `key`.
    #[inline]
    pub(crate) fn get(&self, key: u64) -> Option<V> {
        self.get_from(self.home(key), key)
    }

    /// The value stored for `key`, whose [`Table::home`] the caller already computed.
    #[inline]
    pub(crate) fn get_from(&self, home: usize, key: u64) -> Option<V> {
        if key == 0 {
            return self.zero;
        }
        let mut pos = home;
        loop {
            let slot = self.slots.get(pos)?;
            if slot.key == key {
                return Some(slot.val);
            }
            // Empty (0 wraps to MAX) or a larger key: sorted order says `key` is absent.
            if { slot.key }.wrapping_sub(1) >= key {
                return None;
            }
            pos += 1;
        }
    }

    /// Replaces the value of `key` with `f(value)`, or removes the entry when `f` returns
    /// `None`; returns the new value (`None` if absent or removed).
    pub(crate) fn modify(&mut self, key: u64, f: impl FnOnce(V) -> Option<V>) -> Option<V> {
        if key == 0 {
            let new = f(self.zero?);
            self.zero = new;
            return new;
        }
        let mut pos = self.home(key);
        loop {
            let slot = *self.slots.get(pos)?;
            if slot.key == key {
                let new = f(slot.val);
                match new {
                    Some(v) => self.slots[pos].val = v,
                    None => self.remove_at(pos),
                }
                return new;
            }
            if { slot.key }.wrapping_sub(1) >= key {
                return None;
            }
            pos += 1;
        }
    }

    /// Sets the value of `key` to `f(old or V::default())`, inserting it if absent; returns
    /// the previous value.
    pub(crate) fn upsert(&mut self, key: u64, f: impl FnOnce(V) -> V) -> Option<V> {
        if key == 0 {
            let old = self.zero;
            self.zero = Some(f(old.unwrap_or_default()));
            return old;
        }
        if self.len + 1 > self.capacity * LOAD_NUM / LOAD_DEN {
            self.grow();
        }
        loop {
            match self.find_or_make_slot(key) {
                Some((pos, existed)) => {
                    let old = self.slots[pos].val;
                    self.slots[pos].val = f(old);
                    return existed.then_some(old);
                }
                // The last run reached the end: lengthen the tail, not the table. Growing
                // would not help keys that all sort last (chosen ones can), and a longer tail
                // costs only the slots those keys occupy.
                None => self.lengthen_tail(),
            }
        }
    }

    /// Adds [`SLACK`] empty slots at the end, reserving capacity in steps of 1/64 of the
    /// table so repeated lengthening neither doubles the memory nor copies it every time.
    fn lengthen_tail(&mut self) {
        let spare = self.slots.capacity() - self.slots.len();
        if spare < SLACK {
            self.slots.reserve_exact(SLACK.max(self.slots.len() / 64));
        }
        let empty = Slot {
            key: 0,
            val: V::default(),
        };
        self.slots.resize(self.slots.len() + SLACK, empty);
    }

    /// Stores `val` for `key`, returning the previous value.
    pub(crate) fn insert(&mut self, key: u64, val: V) -> Option<V> {
        self.upsert(key, |_| val)
    }

    /// Position of `key` and whether it existed, inserting a default entry in sorted position
    /// if absent; `None` when the run would spill past the slack region (the caller grows and
    /// retries).
    fn find_or_make_slot(&mut self, key: u64) -> Option<(usize, bool)> {
        let mut pos = self.home(key);
        loop {
            let k = self.slots.get(pos)?.key;
            if k == key {
                return Some((pos, true));
            }
            if k.wrapping_sub(1) >= key {
                break;
            }
            pos += 1;
        }
        // Shift the rest of the run one slot right to open `pos`.
        let mut end = pos;
        while self.slots.get(end)?.key != 0 {
            end += 1;
        }
        self.slots.copy_within(pos..end, pos + 1);
        self.slots[pos] = Slot {
            key,
            val: V::default(),
        };
        self.len += 1;
        Some((pos, false))
    }

    /// Removes `key`, returning its value.
    pub(crate) fn remove(&mut self, key: u64) -> Option<V> {
        if key == 0 {
            return self.zero.take();
        }
        let mut pos = self.home(key);
        loop {
            let k = self.slots.get(pos)?.key;
            if k == key {
                let val = self.slots[pos].val;
                self.remove_at(pos);
                return Some(val);
            }
            if k.wrapping_sub(1) >= key {
                return None;
            }
            pos += 1;
        }
    }

    /// Removes the entry at `pos`, pulling back the entries after it that sit past their home.
    fn remove_at(&mut self, pos: usize) {
        let mut i = pos;
        loop {
            let next = i + 1;
            let movable = self
                .slots
                .get(next)
                .is_some_and(|s| s.key != 0 && self.home(s.key) < next);
            if !movable {
                self.slots[i].key = 0;
                break;
            }
            self.slots[i] = self.slots[next];
            i = next;
        }
        self.len -= 1;
    }

    /// Removes the first entry at or after slot `hand` (wrapping around), returning it and the
    /// position to continue a sweep from. Used for eviction: sweeping positions visits entries
    /// in key order, which for hash keys is an unbiased, allocation-free victim order.
    pub(crate) fn remove_next(&mut self, hand: usize) -> Option<(u64, V, usize)> {
        let n = self.slots.len();
        let start = hand.min(n);
        let found = (start..n).chain(0..start).find(|&i| self.slots[i].key != 0);
        match found {
            Some(pos) => {
                let Slot { key, val } = self.slots[pos];
                self.remove_at(pos);
                Some((key, val, pos))
            }
            None => self.zero.take().map(|v| (0, v, 0)),
        }
    }

    /// All entries, in key order (the zero key first).
    pub(crate) fn iter(&self) -> impl Iterator<Item = (u64, V)> + '_ {
        self.zero.map(|v| (0, v)).into_iter().chain(
            self.slots
                .iter()
                .filter(|s| s.key != 0)
                .map(|s| (s.key, s.val)),
        )
    }

    /// Rebuilds at the next size (or larger if the slack overflowed).
    fn grow(&mut self) {
        let step = match self.growth {
            Growth::Fast => self.capacity / 2,
            Growth::Compact => self.capacity / 4,
        };
        let target = (self.capacity + step).max(MIN_CAPACITY);
        self.rebuild(target);
    }

    /// Returns memory after mass removals (a worker cleared): rebuilds when under a quarter full.
    pub(crate) fn shrink_if_sparse(&mut self) {
        if self.capacity > 1024 && self.len * 4 < self.capacity {
            let target = (self.len * LOAD_DEN / LOAD_NUM * 3 / 2).max(MIN_CAPACITY);
            self.rebuild(target);
        }
    }

    fn rebuild(&mut self, capacity: usize) {
        let mut slots = empty_slots::<V>(capacity + SLACK);
        let mut next = Table {
            slots: Vec::new(),
            capacity,
            len: self.len,
            zero: self.zero,
            growth: self.growth,
        };
        // Old slots are in key order, and so are homes in the new table: each key goes to its
        // home or just after the previous key, a single linear pass.
        let mut free = 0;
        for s in self.slots.iter().filter(|s| s.key != 0) {
            let pos = next.home(s.key).max(free);
            if pos >= slots.len() {
                // As in `upsert`: lengthen the tail for a last run that does not fit.
                slots.reserve_exact(pos + SLACK - slots.len());
                let empty = Slot {
                    key: 0,
                    val: V::default(),
                };
                slots.resize(pos + SLACK, empty);
            }
            slots[pos] = *s;
            free = pos + 1;
        }
        next.slots = slots;
        *self = next;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn insert_get_remove_agree_with_a_std_map() {
        let mut t: Table<u64> = Table::default();
        let mut m = HashMap::new();
        let mut x = 1u64;
        for i in 0..20_000u64 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let key = if i % 97 == 0 { 0 } else { x % 50_000 };
            let key = mix(key);
            if i % 3 == 0 {
                assert_eq!(t.remove(key), m.remove(&key));
            } else {
                assert_eq!(t.insert(key, i), m.insert(key, i));
            }
            assert_eq!(t.len(), m.len());
        }
        for (k, v) in &m {
            assert_eq!(t.get(*k), Some(*v));
        }
        let mut listed: Vec<_> = t.iter().collect();
        listed.sort_unstable();
        let mut expected: Vec<_> = m.iter().map(|(k, v)| (*k, *v)).collect();
        expected.sort_unstable();
        assert_eq!(listed, expected);
    }

    #[test]
    fn sequential_ids_are_spread_by_mix() {
        let mut t: Table<u32> = Table::default();
        for i in 0..10_000u64 {
            t.insert(mix(i), i as u32);
        }
        for i in 0..10_000u64 {
            assert_eq!(t.get(mix(i)), Some(i as u32));
        }
        assert_eq!(t.get(mix(10_001)), None);
        // Grew by the load bound (≥ 50 % full), not by runs overflowing the slack.
        assert!(t.heap_bytes() < 10_000 * 16 * 2, "{}", t.heap_bytes());
    }

    #[test]
    fn keys_crowding_the_end_lengthen_the_tail_not_the_table() {
        let mut t: Table<u64> = Table::with_capacity(1000, Growth::Fast);
        let before = t.heap_bytes();
        // 500 keys that all sort last (as crafted block hashes could).
        for i in 0..500u64 {
            t.insert(u64::MAX - i, i);
        }
        for i in 0..500u64 {
            assert_eq!(t.get(u64::MAX - i), Some(i));
        }
        assert!(
            t.heap_bytes() < before + 600 * 16,
            "{} vs {before}",
            t.heap_bytes()
        );
        // Growth still rebuilds them in order into a longer tail.
        for i in 1..2000u64 {
            t.insert(mix(i), i);
        }
        for i in 0..500u64 {
            assert_eq!(t.get(u64::MAX - i), Some(i));
        }
        assert_eq!(t.len(), 2499);
    }

    #[test]
    fn remove_next_sweeps_every_entry() {
        let mut t: Table<u8> = Table::default();
        for i in 1..=100u64 {
            t.insert(mix(i), 1);
        }
        let mut hand = 0;
        let mut n = 0;
        while let Some((_, _, h)) = t.remove_next(hand) {
            hand = h;
            n += 1;
        }
        assert_eq!(n, 100);
        assert!(t.is_empty());
    }

    #[test]
    fn shrink_returns_memory_and_keeps_entries() {
        let mut t: Table<u64> = Table::default();
        for i in 0..100_000u64 {
            t.insert(mix(i), i);
        }
        let big = t.heap_bytes();
        for i in 100..100_000u64 {
            t.remove(mix(i));
        }
        t.shrink_if_sparse();
        assert!(t.heap_bytes() < big / 10);
        for i in 0..100u64 {
            assert_eq!(t.get(mix(i)), Some(i));
        }
    }
}
