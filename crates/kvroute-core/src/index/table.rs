//! A compact open-addressing hash table keyed by already-random `u64`s.
//!
//! The index's maps are keyed by hashes (run-start block hashes in `runs`, mixed engine ids in
//! the per-worker engine-id maps), so hashing them again would be wasted work, and a
//! general-purpose map spends memory on control bytes and a 50 %-ish average load after
//! doubling. This table is *bucketized* linear probing:
//!
//! - slots come in 64-byte, cache-line-aligned buckets (five 12-byte slots for `u32` values,
//!   four 16-byte ones for `u64`), so a search or an insertion almost always touches one cache
//!   line even near the maximum load: an insertion takes any free slot of the first bucket
//!   with room, where an ordered (Robin Hood) table would shift the rest of its run — several
//!   lines at 85 % load, which measured as most of the event-application time;
//! - the home bucket of key `k` is `k * buckets >> 64` ("fastrange"), so any capacity works and
//!   the table grows by 1.5× instead of 2×, keeping the load between 57 % and 85 %; the home
//!   being monotone in the key also makes a rebuild stream through the old and the new buckets
//!   in the same order;
//! - a search stops at the first bucket with a free slot (an insertion would have used it);
//!   deletion moves a later entry that probed past the freed bucket back into it (backward
//!   shift, no tombstones), so the table never degrades under the store/remove churn of KV
//!   events;
//! - there is no wrap-around: a short slack region after the last home bucket absorbs the final
//!   run, and is lengthened if that run outgrows it.
//!
//! Keys are used as they come: kvroute block hashes are uniform, and engine ids go through
//! [`mix`] first. Block hashes are computable by clients (xxh3 of their own tokens under a
//! known seed), so a client could craft prompts whose blocks share a home region; the damage
//! is bounded to slower probes in that region (memory stays proportional to entries, since a
//! crowded end lengthens the tail instead of growing the table). Scrambling keys with a
//! per-process secret would close that too, but measured 25 % slower lookups when every block of
//! a lookup was probed in such a table.
//!
//! Key 0 marks an empty slot; a real key 0 lives in a side slot.

use std::mem::size_of;

use super::buckets::Buckets;

/// Maximum load before growing, as a fraction `LOAD_NUM / LOAD_DEN`.
const LOAD_NUM: usize = 17;
const LOAD_DEN: usize = 20;
/// Buckets after the last home bucket that absorb the table's final run.
const SLACK: usize = 16;
/// Smallest home range in buckets; keeps tiny tables from growing at every insert.
const MIN_BUCKETS: usize = 4;

/// One cache line of slots: keys first (compared on every probe), then values.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
pub(crate) struct Bucket<V, const N: usize> {
    keys: [u64; N],
    vals: [V; N],
}

/// What the table needs of a bucket; implemented once, for [`Bucket`], with the slot count
/// chosen per value type in [`Value`].
pub(crate) trait Slots<V>: Copy {
    /// Slots per bucket.
    const N: usize;
    /// A bucket of empty slots.
    fn empty() -> Self;
    /// Key of slot `i` (0 when empty).
    fn key(&self, i: usize) -> u64;
    /// Value of slot `i`.
    fn val(&self, i: usize) -> V;
    /// Writes slot `i`.
    fn set(&mut self, i: usize, key: u64, val: V);
    /// Overwrites the value of slot `i`.
    fn set_val(&mut self, i: usize, val: V);
    /// The slot holding `key` (non-zero), or else whether the bucket has a free slot.
    fn find(&self, key: u64) -> (Option<usize>, bool);
    /// The first free slot.
    fn free(&self) -> Option<usize>;
    /// `Ok` with the slot holding `key` (non-zero), else `Err` with the first free slot.
    fn find_or_free(&self, key: u64) -> Result<usize, Option<usize>>;
}

impl<V: Copy + Default, const N: usize> Slots<V> for Bucket<V, N> {
    const N: usize = N;

    #[inline]
    fn empty() -> Self {
        Bucket {
            keys: [0; N],
            vals: [V::default(); N],
        }
    }

    #[inline]
    fn key(&self, i: usize) -> u64 {
        self.keys[i]
    }

    #[inline]
    fn val(&self, i: usize) -> V {
        self.vals[i]
    }

    #[inline]
    fn set(&mut self, i: usize, key: u64, val: V) {
        self.keys[i] = key;
        self.vals[i] = val;
    }

    #[inline]
    fn set_val(&mut self, i: usize, val: V) {
        self.vals[i] = val;
    }

    #[inline]
    fn find(&self, key: u64) -> (Option<usize>, bool) {
        // Stop at the match: removals, parent look-ups and run-start probes mostly find their
        // key, and the free-slot check matters only for a miss.
        if let Some(i) = self.keys.iter().position(|k| *k == key) {
            return (Some(i), false);
        }
        (None, self.keys.contains(&0))
    }

    #[inline]
    fn free(&self) -> Option<usize> {
        self.keys.iter().position(|k| *k == 0)
    }

    #[inline]
    fn find_or_free(&self, key: u64) -> Result<usize, Option<usize>> {
        // One pass: a removal can free a slot before the key's, so every slot is compared.
        let mut free = None;
        for (i, k) in self.keys.iter().enumerate() {
            if *k == key {
                return Ok(i);
            }
            if *k == 0 && free.is_none() {
                free = Some(i);
            }
        }
        Err(free)
    }
}

/// A map from non-uniformly-distributed-safe `u64` keys to small `Copy` values.
///
/// Callers must pass keys that are already well mixed (hash outputs, or ids passed through
/// [`mix`]); sequential keys would all share one home bucket.
#[derive(Clone)]
pub(crate) struct Table<V: Value> {
    buckets: Buckets<V::Bucket>,
    /// Number of home buckets (`buckets.len() - SLACK`, or more after a lengthened tail).
    capacity: usize,
    len: usize,
    zero: Option<V>,
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
        Self::with_capacity(0)
    }
}

/// A value type the table stores; it names the bucket shape that fills one cache line.
pub(crate) trait Value: Copy + Default {
    /// The 64-byte bucket of this value type.
    type Bucket: Slots<Self>;
}

/// 7 × 8 + 7 bytes fill one line.
impl Value for u8 {
    type Bucket = Bucket<u8, 7>;
}
/// 5 × 8 + 5 × 4 = 60 bytes.
impl Value for u32 {
    type Bucket = Bucket<u32, 5>;
}
/// 4 × 8 + 4 × 8 = 64 bytes.
impl Value for u64 {
    type Bucket = Bucket<u64, 4>;
}

/// An empty array with room for `n` buckets, none of them written yet. Large tables are
/// probed at random, so with 4 KiB pages nearly every probe also misses the TLB; they are
/// aligned for 2 MiB pages and ask for them before the memory is first written (pages
/// already faulted in stay 4 KiB ones), see [`Buckets`].
fn reserve_buckets<B: Copy>(n: usize) -> Buckets<B> {
    Buckets::with_capacity(n)
}

/// `n` empty buckets.
fn empty_buckets<B: Copy>(n: usize, empty: B) -> Buckets<B> {
    let mut buckets = reserve_buckets(n);
    buckets.resize(n, empty);
    buckets
}

/// Appends empty buckets up to `len`. Past the reserved room (only a final run that outgrew the
/// slack region gets there) capacity grows in steps of 1/64 of the table, so a tail lengthened
/// again and again neither doubles the memory, as `Vec`'s own growth would, nor copies it
/// every time.
fn extend_to<B: Slots<V>, V>(buckets: &mut Buckets<B>, len: usize) {
    if len > buckets.capacity() {
        let step = (len - buckets.len()).max(SLACK).max(buckets.len() / 64);
        buckets.reserve_exact(step);
    }
    buckets.resize(len, B::empty());
}

/// The home bucket of `key` among `capacity` home buckets: monotone in the key.
#[inline]
fn home_in(key: u64, capacity: usize) -> usize {
    ((key as u128 * capacity as u128) >> 64) as usize
}

/// Hints the CPU to fetch the cache line at `p`.
#[inline]
pub(crate) fn prefetch_line<T>(p: &T) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
        // SAFETY: SSE is part of the x86_64 baseline, and a prefetch is only a cache hint that
        // never faults; the pointer is valid anyway.
        #[allow(unsafe_code)]
        unsafe {
            _mm_prefetch::<_MM_HINT_T0>((p as *const T).cast::<i8>())
        };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

impl<V: Value> Table<V> {
    /// Home buckets for `n` entries at the maximum load.
    fn capacity_for(n: usize) -> usize {
        (n.saturating_mul(LOAD_DEN) / LOAD_NUM / V::Bucket::N + 1).max(MIN_BUCKETS)
    }

    /// A table that holds `n` entries without growing.
    pub(crate) fn with_capacity(n: usize) -> Self {
        let capacity = Self::capacity_for(n);
        Table {
            buckets: empty_buckets(capacity + SLACK, V::Bucket::empty()),
            capacity,
            len: 0,
            zero: None,
        }
    }

    /// Makes room for `n` entries in all, so inserting up to that many never grows the table
    /// (never shrinks it).
    pub(crate) fn reserve(&mut self, n: usize) {
        let capacity = Self::capacity_for(n);
        if capacity > self.capacity {
            self.rebuild(capacity);
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
        self.buckets.capacity() * size_of::<V::Bucket>()
    }

    /// The bucket where the search for `key` starts.
    #[inline]
    fn home(&self, key: u64) -> usize {
        home_in(key, self.capacity)
    }

    /// Hints the CPU to fetch `key`'s home bucket: it holds nearly every search and insertion.
    #[inline]
    pub(crate) fn prefetch(&self, key: u64) {
        if let Some(b) = self.buckets.get(self.home(key)) {
            prefetch_line(b);
        }
    }

    /// The value stored for `key`.
    #[inline]
    pub(crate) fn get(&self, key: u64) -> Option<V> {
        if key == 0 {
            return self.zero;
        }
        let (b, i) = self.position(self.home(key), key)?;
        Some(self.buckets[b].val(i))
    }

    /// Bucket and slot of the non-zero `key`, searching from bucket `home`.
    #[inline]
    fn position(&self, home: usize, key: u64) -> Option<(usize, usize)> {
        let mut b = home;
        loop {
            let (found, free) = self.buckets.get(b)?.find(key);
            if let Some(i) = found {
                return Some((b, i));
            }
            // An insertion of `key` would have stopped at this bucket's free slot.
            if free {
                return None;
            }
            b += 1;
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
        if self.len + 1 > self.capacity * V::Bucket::N * LOAD_NUM / LOAD_DEN {
            self.grow();
        }
        loop {
            match self.find_or_make_slot(key) {
                Some((b, i, existed)) => {
                    let old = self.buckets[b].val(i);
                    self.buckets[b].set_val(i, f(old));
                    return existed.then_some(old);
                }
                // The last run reached the end: lengthen the tail, not the table. Growing
                // would not help keys that all sort last (chosen ones can), and a longer tail
                // costs only the buckets those keys occupy.
                None => self.lengthen_tail(),
            }
        }
    }

    /// Adds [`SLACK`] empty buckets at the end.
    fn lengthen_tail(&mut self) {
        let len = self.buckets.len() + SLACK;
        extend_to(&mut self.buckets, len);
    }

    /// Stores `val` for `key`, returning the previous value.
    pub(crate) fn insert(&mut self, key: u64, val: V) -> Option<V> {
        self.upsert(key, |_| val)
    }

    /// Bucket and slot of `key` and whether it existed, inserting a default entry in the first
    /// bucket with room if absent; `None` when the run would spill past the slack region (the
    /// caller lengthens the tail and retries).
    fn find_or_make_slot(&mut self, key: u64) -> Option<(usize, usize, bool)> {
        let mut b = self.home(key);
        loop {
            let bucket = self.buckets.get_mut(b)?;
            match bucket.find_or_free(key) {
                Ok(i) => return Some((b, i, true)),
                Err(Some(i)) => {
                    bucket.set(i, key, V::default());
                    self.len += 1;
                    return Some((b, i, false));
                }
                Err(None) => b += 1,
            }
        }
    }

    /// Removes `key`, returning its value.
    pub(crate) fn remove(&mut self, key: u64) -> Option<V> {
        if key == 0 {
            return self.zero.take();
        }
        let (b, i) = self.position(self.home(key), key)?;
        let val = self.buckets[b].val(i);
        self.remove_at(b, i);
        Some(val)
    }

    /// Removes the entry at slot `i` of bucket `b`, refilling the hole with a later entry that
    /// probed past it (and that entry's hole in turn), so searches can still stop at the
    /// first bucket with a free slot.
    fn remove_at(&mut self, mut b: usize, mut i: usize) {
        // Entries past `b` can have their home at or before it only if `b` was full.
        let mut hole_was_full = self.buckets[b].free().is_none();
        let mut j = b + 1;
        while hole_was_full {
            let Some(next) = self.buckets.get(j) else {
                break;
            };
            let movable = (0..V::Bucket::N).find(|&s| {
                let k = next.key(s);
                k != 0 && self.home(k) <= b
            });
            let next_full = next.free().is_none();
            match movable {
                Some(s) => {
                    let (k, v) = (next.key(s), next.val(s));
                    self.buckets[b].set(i, k, v);
                    (b, i) = (j, s);
                    hole_was_full = next_full;
                }
                // Entries further on probed through `j` only if it is full.
                None if !next_full => break,
                None => {}
            }
            j += 1;
        }
        self.buckets[b].set(i, 0, V::default());
        self.len -= 1;
    }

    /// Removes the first entry at or after slot position `hand` (wrapping around), returning
    /// it and the position to continue a sweep from. Used for eviction: sweeping positions
    /// visits entries in roughly key order, which for hash keys is an unbiased,
    /// allocation-free victim order.
    pub(crate) fn remove_next(&mut self, hand: usize) -> Option<(u64, V, usize)> {
        let n = self.buckets.len() * V::Bucket::N;
        let start = hand.min(n);
        let found = (start..n).chain(0..start).find(|&p| {
            let (b, i) = (p / V::Bucket::N, p % V::Bucket::N);
            self.buckets[b].key(i) != 0
        });
        match found {
            Some(p) => {
                let (b, i) = (p / V::Bucket::N, p % V::Bucket::N);
                let (key, val) = (self.buckets[b].key(i), self.buckets[b].val(i));
                self.remove_at(b, i);
                Some((key, val, p))
            }
            None => self.zero.take().map(|v| (0, v, 0)),
        }
    }

    /// All entries (the zero key first).
    pub(crate) fn iter(&self) -> impl Iterator<Item = (u64, V)> + '_ {
        self.zero.map(|v| (0, v)).into_iter().chain(
            self.buckets
                .iter()
                .flat_map(|b| (0..V::Bucket::N).map(move |i| (b.key(i), b.val(i))))
                .filter(|(k, _)| *k != 0),
        )
    }

    /// Rebuilds at the next size.
    fn grow(&mut self) {
        // 1.5× rather than 1.25×: every growth writes a fresh table (page faults and zeroing
        // included), and measured on the index benchmark the engine maps, which grow while
        // events arrive, applied ~15 % more blocks per second for 1.6 more bytes per pair.
        let step = self.capacity / 2;
        let target = (self.capacity + step.max(1)).max(MIN_BUCKETS);
        self.rebuild(target);
    }

    fn rebuild(&mut self, capacity: usize) {
        // Homes are monotone in the key in both tables, so walking the old buckets in order
        // fills the new ones nearly in order too: both stream through the cache. Keys are
        // distinct, so a moved entry takes the first free slot from its home without comparing
        // keys, and slots of the new table fill front to back, so a side array of per-bucket
        // counts says where that slot is. Reading the count instead of the bucket's keys
        // matters: a bucket's keys were just written one by one, and reading them back as one
        // wide load waits for those stores to complete (measured: 9 → 5 ns per moved entry).
        // The new buckets are written once, in order: each is appended empty just before the
        // first entry lands in it (homes are monotone, so the entries arrive nearly in bucket
        // order), instead of zeroing the whole table first and then filling it.
        let empty = V::Bucket::empty();
        let len = capacity + SLACK;
        let mut buckets = reserve_buckets(len);
        let mut used: Vec<u8> = Vec::with_capacity(len);
        for old in self.buckets.iter() {
            for i in 0..V::Bucket::N {
                let key = old.key(i);
                if key == 0 {
                    continue;
                }
                let mut b = home_in(key, capacity);
                loop {
                    if b >= buckets.len() {
                        if b >= buckets.capacity() {
                            // A final run spilled past the slack region: lengthen the tail,
                            // as `upsert` would have.
                            buckets.reserve_exact(b + SLACK - buckets.len());
                        }
                        buckets.resize(b + 1, empty);
                        used.resize(b + 1, 0);
                    }
                    let slot = usize::from(used[b]);
                    if slot < V::Bucket::N {
                        buckets[b].set(slot, key, old.val(i));
                        used[b] += 1;
                        break;
                    }
                    b += 1;
                }
            }
        }
        let len = len.max(buckets.len());
        buckets.resize(len, empty);
        self.buckets = buckets;
        self.capacity = capacity;
    }
}

#[cfg(test)]
#[path = "table_tests.rs"]
mod tests;
