//! Each worker's working set: the blocks requests asked it for lately, in the order an engine
//! would evict them, and how likely a block idle for a given time is to be asked for again.
//!
//! A worker's KV cache holds sessions, not single requests: an agent's next turn comes back
//! seconds to minutes later with the same context and a little more. The index says which
//! blocks a worker holds; it cannot say which of them are *live*, part of a session that will
//! return, and which are dead weight the engine may drop for free. An engine's cache is
//! least-recently-used, so writing new blocks on a full worker evicts the blocks touched
//! longest ago; what that costs depends on whether they would have been asked for again.
//!
//! So every admission *touches* the prompt's blocks on the chosen worker (those it reuses and
//! those it writes) as one batch, and [`Residency::returning_evictions`] walks a worker's
//! batches from the oldest, as its engine would evict, summing for each victim the chance
//! that a block idle that long comes back. That chance is measured, not assumed: every idle
//! period of a block ends either in a touch on the same worker after a gap, or in expiry at
//! the [`ResidencyConfig::horizon`]; the fleet's [`ReuseCurve`] is, for an idle age `a`, the
//! share of idle periods that reached `a` and still ended in a touch (Kaplan–Meier at block
//! granularity, in bins of doubling ages). Unique traffic resolves to 0 everywhere (nothing is
//! ever priced); agent sessions to nearly 1 for think-time ages, falling past them.
//!
//! Evicting by that price is what a single least-recently-used cache over the whole fleet
//! does: it drops the globally oldest blocks. A fleet of separate caches can only approach it
//! by placing new blocks where the victims are the least likely to return. Time is passed in,
//! never read, so `sim` drives it in virtual time.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock};
use std::time::Duration;

use super::table::Table;
use crate::fleet::WorkerId;
use crate::tokens::BlockHash;

/// Settings of a [`Residency`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ResidencyConfig {
    /// How long a block is followed after its last touch: longer than the think time between
    /// a session's turns. Blocks idle longer count as dead (free to evict).
    pub horizon: Duration,
    /// Most blocks followed per worker (the oldest are forgotten first): a bound on memory
    /// whatever the traffic.
    pub max_blocks_per_worker: usize,
}

impl Default for ResidencyConfig {
    fn default() -> Self {
        ResidencyConfig {
            horizon: Duration::from_secs(900),
            max_blocks_per_worker: 1 << 18,
        }
    }
}

/// Upper edges of the idle-age bins, seconds: 0.5 s, 1 s, 2 s, … 2,048 s.
const BINS: usize = 13;

/// Resolved idle periods kept as evidence before the oldest is halved away: about the last
/// few hundred long prompts.
const EVIDENCE_BLOCKS: f64 = 4_000_000.0;

fn bin(age_s: f64) -> usize {
    if age_s < 0.5 {
        return 0;
    }
    ((age_s / 0.5).log2().floor() as usize + 1).min(BINS - 1)
}

/// For each idle age, the measured chance that a block idle that long on a worker is touched
/// there again.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ReuseCurve {
    /// Idle periods that ended in a touch, by the bin of their length.
    returned: [f64; BINS],
    /// Idle periods that reached the horizon untouched.
    expired: f64,
}

impl ReuseCurve {
    /// The chance that a block idle for `age_s` seconds is asked for again (0 without
    /// evidence).
    pub fn returning(&self, age_s: f64) -> f64 {
        let later: f64 = self.returned[bin(age_s)..].iter().sum();
        let reached = later + self.expired;
        if reached > 0.0 { later / reached } else { 0.0 }
    }

    fn add(&mut self, other: &ReuseCurve) {
        for (a, b) in self.returned.iter_mut().zip(other.returned) {
            *a += b;
        }
        self.expired += other.expired;
        if self.returned.iter().sum::<f64>() + self.expired > EVIDENCE_BLOCKS {
            self.returned.iter_mut().for_each(|x| *x /= 2.0);
            self.expired /= 2.0;
        }
    }

    fn is_empty(&self) -> bool {
        self.expired == 0.0 && self.returned.iter().all(|&x| x == 0.0)
    }
}

/// One admission's blocks on a worker.
#[derive(Clone, Copy, Debug)]
struct Batch {
    at: Duration,
    /// Its blocks not touched again since (they moved to a later batch).
    valid: u64,
}

/// One worker's followed blocks, oldest batch first.
#[derive(Default)]
struct WorkerSet {
    /// Block hash → 1 + the sequence number of the batch that last touched it (0 is the
    /// table's "absent"); a number below `base` is a block no longer followed.
    batch_of: Table<u64>,
    batches: VecDeque<Batch>,
    /// Sequence number of `batches[0]`.
    base: u64,
    /// Sum of the batches' `valid`.
    live: u64,
}

impl WorkerSet {
    fn batch(&self, block: &BlockHash) -> Option<u64> {
        let seq = self.batch_of.get(block.0)?.checked_sub(1)?;
        (seq >= self.base).then_some(seq)
    }

    /// Forgets batches touched before `cutoff` (their blocks' idle periods reached the
    /// horizon) and, beyond `max` blocks, the oldest without evidence.
    fn expire(&mut self, cutoff: Duration, max: u64, curve: &mut ReuseCurve) {
        while let Some(front) = self.batches.front().copied() {
            let old = front.at < cutoff;
            if !old && self.live <= max {
                break;
            }
            if old {
                curve.expired += front.valid as f64;
            }
            self.live -= front.valid;
            self.batches.pop_front();
            self.base += 1;
        }
        // Forgotten blocks stay in the table until it is rebuilt.
        if self.batch_of.len() as u64 > 2 * self.live + 4096 {
            let base = self.base;
            let mut kept = Table::with_capacity(self.live as usize);
            for (k, v) in self.batch_of.iter().filter(|&(_, v)| v > base) {
                kept.insert(k, v);
            }
            self.batch_of = kept;
        }
    }

    fn touch(&mut self, blocks: &[BlockHash], now: Duration, curve: &mut ReuseCurve) {
        let seq = self.base + self.batches.len() as u64;
        self.batches.push_back(Batch { at: now, valid: 0 });
        for b in blocks {
            match self.batch(b) {
                Some(prev) if prev == seq => continue,
                Some(prev) => {
                    let from = &mut self.batches[(prev - self.base) as usize];
                    from.valid -= 1;
                    let gap = now.saturating_sub(from.at).as_secs_f64();
                    curve.returned[bin(gap)] += 1.0;
                }
                None => self.live += 1,
            }
            self.batch_of.insert(b.0, seq + 1);
            if let Some(last) = self.batches.back_mut() {
                last.valid += 1;
            }
        }
    }

    /// Expected returning blocks among the victims of writing `new_blocks` more on a cache of
    /// `capacity` blocks, keeping `own` (the request's reused prefix, which it touches).
    fn returning_evictions(
        &self,
        capacity: u64,
        new_blocks: u64,
        own: &[BlockHash],
        now: Duration,
        curve: &ReuseCurve,
    ) -> f64 {
        let resident = self.live.min(capacity);
        let mut victims = new_blocks.saturating_sub(capacity - resident);
        if victims == 0 {
            return 0.0;
        }
        let mut own_in: HashMap<u64, u64> = HashMap::new();
        for seq in own.iter().filter_map(|b| self.batch(b)) {
            *own_in.entry(seq).or_default() += 1;
        }
        // Followed blocks beyond the capacity are the oldest and already gone.
        let mut gone = self.live - resident;
        let mut returning = 0.0;
        for (i, b) in self.batches.iter().enumerate() {
            let mut n = b.valid - own_in.get(&(self.base + i as u64)).copied().unwrap_or(0);
            let skipped = n.min(gone);
            gone -= skipped;
            n -= skipped;
            let taken = n.min(victims);
            if taken > 0 {
                let age = now.saturating_sub(b.at).as_secs_f64();
                returning += taken as f64 * curve.returning(age);
                victims -= taken;
            }
            if victims == 0 {
                break;
            }
        }
        returning
    }
}

/// The fleet's working sets and its measured reuse curve.
pub struct Residency {
    config: ResidencyConfig,
    workers: RwLock<HashMap<WorkerId, Arc<Mutex<WorkerSet>>>>,
    curve: Mutex<ReuseCurve>,
}

impl Default for Residency {
    fn default() -> Self {
        Residency::new(ResidencyConfig::default())
    }
}

impl std::fmt::Debug for Residency {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Residency")
            .field("config", &self.config())
            .field("curve", &self.curve())
            .finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Residency {
    /// Empty working sets with `config`.
    pub fn new(config: ResidencyConfig) -> Residency {
        Residency {
            config,
            workers: RwLock::new(HashMap::new()),
            curve: Mutex::new(ReuseCurve::default()),
        }
    }

    /// The settings now.
    pub fn config(&self) -> ResidencyConfig {
        self.config
    }

    /// The reuse curve measured so far.
    pub fn curve(&self) -> ReuseCurve {
        *lock(&self.curve)
    }

    fn set(&self, worker: WorkerId) -> Option<Arc<Mutex<WorkerSet>>> {
        let map = self.workers.read().unwrap_or_else(PoisonError::into_inner);
        map.get(&worker).cloned()
    }

    fn set_or_insert(&self, worker: WorkerId) -> Arc<Mutex<WorkerSet>> {
        if let Some(s) = self.set(worker) {
            return s;
        }
        let mut map = self.workers.write().unwrap_or_else(PoisonError::into_inner);
        Arc::clone(map.entry(worker).or_default())
    }

    fn limits(&self, now: Duration) -> (Duration, u64) {
        let c = self.config();
        (
            now.saturating_sub(c.horizon),
            c.max_blocks_per_worker.max(1) as u64,
        )
    }

    fn record(&self, evidence: &ReuseCurve) {
        if !evidence.is_empty() {
            lock(&self.curve).add(evidence);
        }
    }

    /// `blocks` of a request admitted on `worker` at `now`: reused or written there, they are
    /// now the worker's most recently used blocks. A worker whose KV cache holds
    /// `capacity_blocks` is followed for at most twice that (the oldest beyond its capacity are
    /// gone from the engine anyway), so memory follows the fleet's caches, not the traffic.
    pub fn touch(
        &self,
        worker: WorkerId,
        blocks: &[BlockHash],
        now: Duration,
        capacity_blocks: Option<u64>,
    ) {
        if blocks.is_empty() {
            return;
        }
        let (cutoff, configured) = self.limits(now);
        let max = capacity_blocks.map_or(configured, |c| {
            configured.min(c.saturating_mul(2).saturating_add(blocks.len() as u64))
        });
        let set = self.set_or_insert(worker);
        let mut evidence = ReuseCurve::default();
        {
            let mut s = lock(&set);
            s.expire(cutoff, u64::MAX, &mut evidence);
            s.touch(blocks, now, &mut evidence);
            s.expire(cutoff, max, &mut evidence);
        }
        self.record(&evidence);
    }

    /// Runs `f` on `worker`'s set once its expired batches are forgotten at `now` (`None`
    /// when nothing was ever touched there).
    fn expired<R>(
        &self,
        worker: WorkerId,
        now: Duration,
        f: impl FnOnce(&WorkerSet) -> R,
    ) -> Option<R> {
        let set = self.set(worker)?;
        let (cutoff, max) = self.limits(now);
        let mut evidence = ReuseCurve::default();
        let out = {
            let mut s = lock(&set);
            s.expire(cutoff, max, &mut evidence);
            f(&s)
        };
        self.record(&evidence);
        Some(out)
    }

    /// `worker`'s followed blocks at `now` (touched within the horizon).
    pub fn live_blocks(&self, worker: WorkerId, now: Duration) -> u64 {
        self.expired(worker, now, |s| s.live).unwrap_or(0)
    }

    /// How many of the blocks that writing `new_blocks` on `worker` (a cache of `capacity`
    /// blocks) would evict are expected to be asked for again, by `curve`; `own` is the
    /// request's reused prefix there, which it keeps.
    pub fn returning_evictions(
        &self,
        worker: WorkerId,
        capacity: u64,
        new_blocks: u64,
        own: &[BlockHash],
        now: Duration,
        curve: &ReuseCurve,
    ) -> f64 {
        self.expired(worker, now, |s| {
            s.returning_evictions(capacity, new_blocks, own, now, curve)
        })
        .unwrap_or(0.0)
    }

    /// Forgets `worker`'s working set: it restarted with an empty cache, or left.
    pub fn clear_worker(&self, worker: WorkerId) {
        self.workers
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&worker);
    }
}

#[cfg(test)]
#[path = "residency_tests.rs"]
mod tests;
