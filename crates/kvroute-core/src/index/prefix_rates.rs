//! How many requests per second arrive for each prefix, fleet-wide.
//!
//! The cost model copies a prefix to another worker only when a request would wait longer at
//! the workers holding it than the copy takes to compute (`policy::kv_aware`). That is right
//! for the request in hand, but a copy also serves every later request for the same prefix
//! while its holders stay busy: with a system prompt shared by a hundred requests a second,
//! the first request that waits has already decided where the next ones will queue
//! (`policy::copy_value` prices that). Pricing it needs the prefix's arrival rate, which the
//! index does not hold: it knows who holds a block, not how often it is asked for.
//!
//! So every admitted prompt counts one arrival on each of its *marks* (every
//! [`STRIDE`]-th chained block hash, as `fleet::running_blocks` keeps them: a chained hash names
//! its whole prefix, so a mark's count is the arrivals of prompts sharing that prefix), as an
//! exponentially decaying rate with a [`TAU`] time constant. A system prompt's marks count
//! every request that starts with it; an agent session's own context counts one turn per think
//! time. Entries whose rate has decayed below [`FLOOR_PER_S`] are dropped every
//! [`SWEEP_EVERY`] arrivals, and at most [`MAX_MARKS`] are kept, so memory follows the prefixes
//! in use, not the traffic's history. Time is passed in (the index clock), never read, so the
//! simulator drives it in virtual time.

use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use crate::fleet::running_blocks::STRIDE;
use crate::tokens::BlockHash;
use crate::tokens::id_map::IdMap;

/// Time constant of the decay: an arrival counts `e^(−age / TAU)`, so the rate follows the
/// last ten seconds or so (a hot prefix's burst, not the hour's average).
pub const TAU: Duration = Duration::from_secs(10);

/// Rates below this many requests per second are dropped at the next sweep (an arrival counts
/// `1 / TAU` = 0.1 /s at first, so a prefix asked for once is dropped after about 23 s).
pub const FLOOR_PER_S: f64 = 0.01;

/// Arrivals between two sweeps of decayed entries.
pub const SWEEP_EVERY: u64 = 4096;

/// The most marks kept: past it a sweep keeps the fastest half. Unique prompts' marks, asked
/// for once, are the slowest and go first.
pub const MAX_MARKS: usize = 1 << 18;

/// One mark's decaying rate.
#[derive(Clone, Copy, Debug)]
struct Rate {
    per_s: f64,
    at_s: f64,
}

impl Rate {
    fn at(self, now_s: f64) -> f64 {
        let tau = TAU.as_secs_f64();
        self.per_s * (-(now_s - self.at_s).max(0.0) / tau).exp()
    }
}

#[derive(Default)]
struct Marks {
    rates: IdMap<u64, Rate>,
    arrivals: u64,
}

impl Marks {
    fn sweep(&mut self, now_s: f64) {
        self.rates.retain(|_, r| r.at(now_s) >= FLOOR_PER_S);
        if self.rates.len() > MAX_MARKS {
            let mut by_rate: Vec<f64> = self.rates.values().map(|r| r.at(now_s)).collect();
            let keep = MAX_MARKS / 2;
            by_rate.select_nth_unstable_by(keep, |a, b| b.total_cmp(a));
            let cut = by_rate[keep];
            self.rates.retain(|_, r| r.at(now_s) > cut);
        }
    }
}

/// The fleet's arrival rates by prefix (one router's own arrivals: each router replica counts
/// what it admits).
#[derive(Default)]
pub struct PrefixRates {
    marks: Mutex<Marks>,
}

impl std::fmt::Debug for PrefixRates {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PrefixRates")
            .field("marks", &self.lock().rates.len())
            .finish()
    }
}

impl PrefixRates {
    fn lock(&self) -> MutexGuard<'_, Marks> {
        self.marks.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A prompt with chained block `hashes` was admitted at `now`.
    pub fn arrive(&self, hashes: &[BlockHash], now: Duration) {
        if hashes.len() < STRIDE {
            return;
        }
        let now_s = now.as_secs_f64();
        let step = 1.0 / TAU.as_secs_f64();
        let mut marks = self.lock();
        for h in hashes.iter().skip(STRIDE - 1).step_by(STRIDE) {
            let r = marks.rates.entry(h.0).or_insert(Rate {
                per_s: 0.0,
                at_s: now_s,
            });
            *r = Rate {
                per_s: r.at(now_s) + step,
                at_s: now_s,
            };
        }
        marks.arrivals += 1;
        if marks.arrivals.is_multiple_of(SWEEP_EVERY) || marks.rates.len() > MAX_MARKS {
            marks.sweep(now_s);
        }
    }

    /// Requests per second arriving at `now` for the first `blocks` blocks of `hashes` (to
    /// within [`STRIDE`] blocks below; 0 for a prefix shorter than one mark or never seen).
    pub fn rate(&self, hashes: &[BlockHash], blocks: usize, now: Duration) -> f64 {
        let k = blocks.min(hashes.len()) / STRIDE;
        if k == 0 {
            return 0.0;
        }
        self.lock()
            .rates
            .get(&hashes[k * STRIDE - 1].0)
            .map_or(0.0, |r| r.at(now.as_secs_f64()))
    }

    /// Marks followed (for tests and memory checks).
    pub fn len(&self) -> usize {
        self.lock().rates.len()
    }

    /// Whether no mark is followed.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A chain of `len` hashes whose first `shared` are common to every chain with the same
    /// `shared`, the rest particular to `tag`.
    fn chain(shared: usize, len: usize, tag: u64) -> Vec<BlockHash> {
        (0..len as u64)
            .map(|i| {
                if (i as usize) < shared {
                    BlockHash(1_000 + i)
                } else {
                    BlockHash(tag << 32 | i)
                }
            })
            .collect()
    }

    fn secs(s: f64) -> Duration {
        Duration::from_secs_f64(s)
    }

    #[test]
    fn a_shared_prefix_counts_every_prompt_that_starts_with_it() {
        let rates = PrefixRates::default();
        for i in 0..20 {
            rates.arrive(&chain(32, 64, i), secs(i as f64 * 0.1));
        }
        let probe = chain(32, 64, 99);
        let shared = rates.rate(&probe, 32, secs(2.0));
        // Twenty arrivals in two seconds, each worth 1/TAU, hardly decayed.
        assert!(shared > 1.8 && shared <= 2.0, "{shared}");
        // A prefix deeper than the shared part is the probe's own: never seen.
        assert_eq!(rates.rate(&probe, 64, secs(2.0)), 0.0);
        // One request's own tail was seen once.
        let own = rates.rate(&chain(32, 64, 3), 64, secs(2.0));
        assert!(own > 0.08 && own < 0.1, "{own}");
        // Shorter than a mark: nothing to say.
        assert_eq!(rates.rate(&probe, STRIDE - 1, secs(2.0)), 0.0);
    }

    #[test]
    fn a_rate_decays_and_is_swept_once_negligible() {
        let rates = PrefixRates::default();
        rates.arrive(&chain(16, 16, 0), secs(0.0));
        let fresh = rates.rate(&chain(16, 16, 0), 16, secs(0.0));
        let later = rates.rate(&chain(16, 16, 0), 16, secs(10.0));
        assert!((later / fresh - (-1.0f64).exp()).abs() < 1e-9);
        // Long after, a sweep (every SWEEP_EVERY arrivals) drops it.
        for i in 0..SWEEP_EVERY {
            rates.arrive(&chain(0, 16, i + 1), secs(100.0));
        }
        assert_eq!(rates.rate(&chain(16, 16, 0), 16, secs(100.0)), 0.0);
        assert_eq!(rates.len(), SWEEP_EVERY as usize);
    }
}
