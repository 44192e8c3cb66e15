//! How long the requests decoding on a worker have been at it.
//!
//! The wait for KV room (`policy::kv_room`) is the wait for running requests to end, and
//! answer lengths are heavy-tailed: a request that has decoded for a minute is likely to go on
//! for a long time, one that has just started is as likely as any to be short. Pricing every
//! running request with one remaining time (the fleet's `E[D²] / 2E[D]`) made a worker full of
//! old answers look as quick to free room as one full of new ones: on four engines fed capped
//! agent sessions, turns were predicted 0.6–0.9 s of room wait where an 80-second-old answer
//! and its peers kept them 4–5 s (docs/benchmarks.md, "How long the running answers have
//! run"). The router knows when each of its requests reached its first token; this keeps
//! those times per worker and hands the decision their ages, grouped in doubling buckets (a
//! fixed-size copyable summary: the candidates of a decision are copied, and the residual of
//! an age changes slowly with it).

use std::collections::BTreeMap;
use std::time::Duration;

/// Upper bounds of the age buckets, seconds: 1, 2, 4, … 2¹¹; the last bucket holds the rest.
pub const AGE_BUCKETS: usize = 13;

/// The ages of a worker's decoding requests, counted in doubling buckets, with the prompt
/// tokens the requests of each bucket hold.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DecodeAges {
    counts: [u32; AGE_BUCKETS],
    /// Prompt tokens of each bucket's requests, added up (0 where not told).
    tokens: [u64; AGE_BUCKETS],
}

impl DecodeAges {
    /// The bucket of an age.
    fn bucket(age_s: f64) -> usize {
        if age_s < 1.0 {
            return 0;
        }
        ((age_s.log2().floor() as usize) + 1).min(AGE_BUCKETS - 1)
    }

    /// A representative age of bucket `i`, seconds: the middle of its span (0.5 s for the
    /// first, 1.5·2ⁱ⁻¹ for the others).
    pub fn bucket_age_s(i: usize) -> f64 {
        if i == 0 {
            0.5
        } else {
            1.5 * f64::powi(2.0, i as i32 - 1)
        }
    }

    /// Counts one request of `age_s` holding a prompt of `prompt_tokens`.
    pub fn add(&mut self, age_s: f64, prompt_tokens: u64) {
        self.add_many(age_s, 1, prompt_tokens);
    }

    /// Counts `n` requests of `age_s` holding `prompt_tokens` between them.
    fn add_many(&mut self, age_s: f64, n: u32, prompt_tokens: u64) {
        let b = Self::bucket(age_s.max(0.0));
        self.counts[b] = self.counts[b].saturating_add(n);
        self.tokens[b] = self.tokens[b].saturating_add(prompt_tokens);
    }

    /// Adds `other`'s counts (another worker's requests).
    pub fn merge(&mut self, other: &DecodeAges) {
        for (a, b) in self.counts.iter_mut().zip(other.counts) {
            *a = a.saturating_add(b);
        }
        for (a, b) in self.tokens.iter_mut().zip(other.tokens) {
            *a = a.saturating_add(b);
        }
    }

    /// `(representative age, count, prompt tokens)` of every non-empty bucket, youngest
    /// first.
    pub fn buckets_holding(&self) -> impl Iterator<Item = (f64, u32, u64)> + '_ {
        self.counts
            .iter()
            .zip(self.tokens)
            .enumerate()
            .filter(|(_, (n, _))| **n > 0)
            .map(|(i, (n, t))| (Self::bucket_age_s(i), *n, t))
    }

    /// `(representative age, count)` of every non-empty bucket, youngest first.
    pub fn buckets(&self) -> impl Iterator<Item = (f64, u32)> + '_ {
        self.counts
            .iter()
            .enumerate()
            .filter(|(_, n)| **n > 0)
            .map(|(i, n)| (Self::bucket_age_s(i), *n))
    }

    /// Requests counted.
    pub fn len(&self) -> u64 {
        self.counts.iter().map(|n| u64::from(*n)).sum()
    }

    /// Whether none are counted.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// When each decoding request whose start is known began decoding, on the decider's clock
/// (a multiset: several may start at one instant), and their count and sum, so the ages'
/// sum is read without a walk.
#[derive(Debug, Default)]
pub struct DecodeStarts {
    /// Per start, how many began then and their prompt tokens added up.
    starts: BTreeMap<Duration, (u32, u64)>,
    count: u128,
    /// The starts added up, nanoseconds (exact, unlike a float sum of many).
    sum_ns: u128,
}

impl DecodeStarts {
    /// A request holding a prompt of `prompt_tokens` started decoding at `at`.
    pub fn add(&mut self, at: Duration, prompt_tokens: u64) {
        let (n, tokens) = self.starts.entry(at).or_insert((0, 0));
        *n += 1;
        *tokens = tokens.saturating_add(prompt_tokens);
        self.count += 1;
        self.sum_ns += at.as_nanos();
    }

    /// The request `add`ed at `at` with `prompt_tokens` ended.
    pub fn remove(&mut self, at: Duration, prompt_tokens: u64) {
        if let Some((n, tokens)) = self.starts.get_mut(&at) {
            *n -= 1;
            *tokens = tokens.saturating_sub(prompt_tokens);
            if *n == 0 {
                self.starts.remove(&at);
            }
            self.count -= 1;
            self.sum_ns -= at.as_nanos();
        }
    }

    /// Their ages at `now` added up, seconds: with the tokens a decoding request writes per
    /// second, what the answers hold in the KV cache beside their prompts. (Starts after `now`,
    /// from a clock read late, may take from the others' ages; the sum is never negative.)
    pub fn decoded_s(&self, now: Duration) -> f64 {
        let total = (self.count * now.as_nanos()).saturating_sub(self.sum_ns);
        total as f64 / 1e9
    }

    /// Their ages at `now` (a start after `now`, from a clock read late, counts as 0).
    pub fn ages(&self, now: Duration) -> DecodeAges {
        let mut ages = DecodeAges::default();
        for (&start, &(n, tokens)) in &self.starts {
            ages.add_many(now.saturating_sub(start).as_secs_f64(), n, tokens);
        }
        ages
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_fall_in_doubling_buckets_with_their_prompts() {
        let mut s = DecodeStarts::default();
        for (at, tokens) in [(100.0, 10), (100.0, 20), (95.0, 40), (20.0, 80)] {
            s.add(Duration::from_secs_f64(at), tokens);
        }
        let ages = s.ages(Duration::from_secs_f64(100.5));
        // 0.5 s (twice), 5.5 s, 80.5 s.
        assert_eq!(
            ages.buckets_holding().collect::<Vec<_>>(),
            vec![(0.5, 2, 30), (6.0, 1, 40), (96.0, 1, 80)]
        );
        assert_eq!(ages.len(), 4);
        assert!(
            (s.decoded_s(Duration::from_secs_f64(100.5)) - (0.5 + 0.5 + 5.5 + 80.5)).abs() < 1e-9
        );
        s.remove(Duration::from_secs_f64(100.0), 10);
        s.remove(Duration::from_secs_f64(20.0), 80);
        s.remove(Duration::from_secs_f64(7.0), 5); // never added: nothing happens
        let ages = s.ages(Duration::from_secs_f64(100.5));
        assert_eq!(
            ages.buckets_holding().collect::<Vec<_>>(),
            vec![(0.5, 1, 20), (6.0, 1, 40)]
        );
        assert_eq!(ages.buckets().collect::<Vec<_>>(), vec![(0.5, 1), (6.0, 1)]);
        assert!((s.decoded_s(Duration::from_secs_f64(100.5)) - 6.0).abs() < 1e-9);
        // A start read after `now` takes from the others' ages, never below nothing.
        s.add(Duration::from_secs(1000), 1);
        assert_eq!(s.decoded_s(Duration::from_secs(101)), 0.0);
    }

    #[test]
    fn the_oldest_bucket_holds_everything_older() {
        let mut ages = DecodeAges::default();
        ages.add(1e9, 1);
        ages.add(-3.0, 1);
        assert_eq!(
            ages.buckets().collect::<Vec<_>>(),
            vec![(0.5, 1), (DecodeAges::bucket_age_s(AGE_BUCKETS - 1), 1)]
        );
    }

    #[test]
    fn merged_ages_add_their_counts() {
        let mut a = DecodeAges::default();
        a.add(3.0, 5);
        let mut b = DecodeAges::default();
        b.add(3.5, 7);
        b.add(40.0, 9);
        a.merge(&b);
        assert_eq!(
            a.buckets_holding().collect::<Vec<_>>(),
            vec![(3.0, 2, 12), (48.0, 1, 9)]
        );
    }
}
