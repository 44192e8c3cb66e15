//! Seeded synthetic workloads, each shaped to exercise one property of a router.
//!
//! - `SharedPrefix`: a pool of system prompts picked with zipf popularity, each followed by a
//!   unique question. Cache-aware routing should win here, by keeping each prompt on few
//!   replicas.
//! - `MultiTurn`: conversations whose next turn extends the previous prompt with the previous
//!   answer and a new question, so turn k's block ids are a prefix of turn k+1's. Session
//!   affinity falls out of the cache, not out of a sticky table.
//! - `Unique`: no sharing at all. Cache awareness cannot help; it must not hurt either.
//! - `HotPrefix`: one prefix at a rate no single replica can serve alone. Sending all of it to
//!   the replica holding the cache overloads it; a good policy spreads it anyway.
//!
//! Arrivals are Poisson (exponential gaps); lengths vary uniformly in ±50 % around the mean
//! so requests do not march in lockstep. The same seed gives the same trace, on every
//! platform (`StdRng` is seeded explicitly; no global randomness).

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use thiserror::Error;

use super::trace::{Trace, TraceRequest};

/// Which synthetic workload to generate, with its own knobs.
#[derive(Clone, Debug, PartialEq)]
pub enum SyntheticKind {
    /// System prompts with zipf popularity plus a unique question each.
    SharedPrefix {
        /// Number of distinct system prompts.
        prefixes: usize,
        /// Length of each system prompt, rounded up to whole blocks.
        prefix_tokens: u32,
        /// Zipf exponent: prompt of rank k is picked with weight 1/k^s.
        zipf_s: f64,
    },
    /// Multi-turn conversations; each turn extends the previous turn's prompt.
    MultiTurn {
        /// Turns per conversation.
        turns: u32,
        /// Mean pause between a turn's arrival and the next turn's, in seconds (exponential).
        think_s: f64,
    },
    /// Every prompt unique.
    Unique,
    /// A `hot_fraction` of requests share one prefix; the rest are unique.
    HotPrefix {
        /// Length of the hot prefix, rounded up to whole blocks.
        prefix_tokens: u32,
        /// Fraction of requests (0..=1) that carry the hot prefix.
        hot_fraction: f64,
    },
    /// Groups of requests that share a fresh prefix and arrive at one instant (one agent's
    /// fan-out, one document asked several questions): what co-location is about.
    Siblings {
        /// Requests per group.
        group: usize,
        /// Length of each group's prefix, rounded up to whole blocks.
        prefix_tokens: u32,
    },
}

/// A synthetic workload: its kind and the knobs all kinds share.
#[derive(Clone, Debug, PartialEq)]
pub struct SyntheticSpec {
    /// What to generate.
    pub kind: SyntheticKind,
    /// Number of requests.
    pub requests: usize,
    /// Mean arrival rate, requests per second.
    pub rate: f64,
    /// Mean length of each request's own (unshared) prompt part, in tokens.
    pub input_tokens: u32,
    /// Mean number of tokens to generate.
    pub output_tokens: u32,
    /// Tokens per block id.
    pub block_tokens: u32,
    /// Seed of the generator.
    pub seed: u64,
}

impl std::fmt::Display for SyntheticSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.kind {
            SyntheticKind::SharedPrefix {
                prefixes,
                prefix_tokens,
                zipf_s,
            } => write!(
                f,
                "shared-prefix: {prefixes} prompts of {prefix_tokens} tokens (zipf s = {zipf_s})"
            )?,
            SyntheticKind::MultiTurn { turns, think_s } => {
                write!(f, "multi-turn: {turns} turns, {think_s} s think time")?
            }
            SyntheticKind::Unique => write!(f, "unique prompts")?,
            SyntheticKind::HotPrefix {
                prefix_tokens,
                hot_fraction,
            } => write!(
                f,
                "hot-prefix: {:.0} % share one {prefix_tokens}-token prefix",
                hot_fraction * 100.0
            )?,
            SyntheticKind::Siblings {
                group,
                prefix_tokens,
            } => write!(
                f,
                "siblings: groups of {group} sharing a {prefix_tokens}-token prefix, each at one instant"
            )?,
        }
        write!(
            f,
            ", {} requests at {} req/s, ~{} own input and {} output tokens, seed {}",
            self.requests, self.rate, self.input_tokens, self.output_tokens, self.seed
        )
    }
}

/// Why a synthetic workload cannot be generated.
#[derive(Debug, Error)]
#[error("invalid synthetic workload: {0}")]
pub struct SyntheticError(String);

/// Zipf sampling over ranks `0..n` by inverse CDF (binary search): exact and fast enough for
/// pools of a few thousand prompts.
#[derive(Clone, Debug)]
pub struct Zipf {
    cdf: Vec<f64>,
}

impl Zipf {
    /// Ranks `0..n` where rank k has weight `1/(k+1)^s`. `n` must be at least 1.
    pub fn new(n: usize, s: f64) -> Zipf {
        let mut cdf = Vec::with_capacity(n.max(1));
        let mut total = 0.0;
        for k in 0..n.max(1) {
            total += 1.0 / ((k + 1) as f64).powf(s);
            cdf.push(total);
        }
        for c in &mut cdf {
            *c /= total;
        }
        Zipf { cdf }
    }

    /// A rank drawn from the distribution.
    pub fn sample(&self, rng: &mut impl Rng) -> usize {
        let u: f64 = rng.random();
        let i = self.cdf.partition_point(|&c| c < u);
        i.min(self.cdf.len() - 1)
    }
}

/// Hands out fresh block ids; ids are never reused within one trace.
struct BlockIds(u64);

impl BlockIds {
    fn take(&mut self, n: usize) -> Vec<u64> {
        let ids = (self.0..self.0 + n as u64).collect();
        self.0 += n as u64;
        ids
    }
}

impl SyntheticSpec {
    /// Generates the trace.
    pub fn generate(&self) -> Result<Trace, SyntheticError> {
        self.validate()?;
        let mut rng = StdRng::seed_from_u64(self.seed);
        let mut ids = BlockIds(0);
        let requests = match &self.kind {
            SyntheticKind::SharedPrefix {
                prefixes,
                prefix_tokens,
                zipf_s,
            } => self.shared_prefix(&mut rng, &mut ids, *prefixes, *prefix_tokens, *zipf_s),
            SyntheticKind::MultiTurn { turns, think_s } => {
                self.multi_turn(&mut rng, &mut ids, *turns, *think_s)
            }
            SyntheticKind::Unique => self.shared_prefix(&mut rng, &mut ids, 1, 0, 0.0),
            SyntheticKind::HotPrefix {
                prefix_tokens,
                hot_fraction,
            } => self.hot_prefix(&mut rng, &mut ids, *prefix_tokens, *hot_fraction),
            SyntheticKind::Siblings {
                group,
                prefix_tokens,
            } => self.siblings(&mut rng, &mut ids, *group, *prefix_tokens),
        };
        Ok(Trace::new(requests))
    }

    fn validate(&self) -> Result<(), SyntheticError> {
        let fail = |m: &str| Err(SyntheticError(m.to_string()));
        if !(self.rate.is_finite() && self.rate > 0.0) {
            return fail("rate must be a positive number of requests per second");
        }
        if self.block_tokens == 0 {
            return fail("block size must be at least 1 token");
        }
        if self.input_tokens == 0 || self.output_tokens == 0 {
            return fail("input and output lengths must be at least 1 token");
        }
        match &self.kind {
            SyntheticKind::SharedPrefix {
                prefixes, zipf_s, ..
            } if *prefixes == 0 || !zipf_s.is_finite() || *zipf_s < 0.0 => {
                fail("shared-prefix needs at least one prefix and a zipf exponent >= 0")
            }
            SyntheticKind::MultiTurn { turns, think_s }
                if *turns == 0 || !think_s.is_finite() || *think_s < 0.0 =>
            {
                fail("multi-turn needs at least one turn and a think time >= 0")
            }
            SyntheticKind::HotPrefix { hot_fraction, .. }
                if !(0.0..=1.0).contains(hot_fraction) =>
            {
                fail("hot-prefix fraction must be within 0..=1")
            }
            SyntheticKind::Siblings { group, .. } if *group == 0 => {
                fail("siblings needs at least one request per group")
            }
            _ => Ok(()),
        }
    }

    /// Exponential gap of a Poisson process at `rate`.
    fn gap(rng: &mut impl Rng, rate: f64) -> f64 {
        // 1 - u is in (0, 1], so the logarithm is finite.
        let u: f64 = rng.random();
        -(1.0 - u).ln() / rate
    }

    /// A length uniformly within ±50 % of `mean`, at least 1.
    fn jitter(rng: &mut impl Rng, mean: u32) -> u32 {
        let lo = (mean / 2).max(1);
        let hi = mean.saturating_add(mean / 2).max(lo);
        rng.random_range(lo..=hi)
    }

    fn blocks(&self, tokens: u32) -> usize {
        tokens.div_ceil(self.block_tokens) as usize
    }

    /// A request: `prefix` ids (whole blocks) followed by a fresh unique part.
    fn with_prefix(
        &self,
        rng: &mut impl Rng,
        ids: &mut BlockIds,
        arrival_s: f64,
        prefix: &[u64],
    ) -> TraceRequest {
        let own = Self::jitter(rng, self.input_tokens);
        let mut hash_ids = prefix.to_vec();
        hash_ids.extend(ids.take(self.blocks(own)));
        TraceRequest {
            arrival_s,
            input_tokens: prefix.len() as u32 * self.block_tokens + own,
            output_tokens: Self::jitter(rng, self.output_tokens),
            hash_ids,
            block_tokens: self.block_tokens,
            session: None,
        }
    }

    fn shared_prefix(
        &self,
        rng: &mut StdRng,
        ids: &mut BlockIds,
        prefixes: usize,
        prefix_tokens: u32,
        zipf_s: f64,
    ) -> Vec<TraceRequest> {
        let pool: Vec<Vec<u64>> = (0..prefixes)
            .map(|_| ids.take(self.blocks(prefix_tokens)))
            .collect();
        let zipf = Zipf::new(prefixes, zipf_s);
        let mut t = 0.0;
        (0..self.requests)
            .map(|_| {
                t += Self::gap(rng, self.rate);
                let prefix = &pool[zipf.sample(rng)];
                self.with_prefix(rng, ids, t, prefix)
            })
            .collect()
    }

    fn hot_prefix(
        &self,
        rng: &mut StdRng,
        ids: &mut BlockIds,
        prefix_tokens: u32,
        hot_fraction: f64,
    ) -> Vec<TraceRequest> {
        let hot = ids.take(self.blocks(prefix_tokens));
        let mut t = 0.0;
        (0..self.requests)
            .map(|_| {
                t += Self::gap(rng, self.rate);
                let prefix: &[u64] = if rng.random::<f64>() < hot_fraction {
                    &hot
                } else {
                    &[]
                };
                self.with_prefix(rng, ids, t, prefix)
            })
            .collect()
    }

    /// Groups arrive as a Poisson process at `rate / group`, so the overall request rate is
    /// `rate`; each group's requests share a prefix no other group has and arrive together.
    fn siblings(
        &self,
        rng: &mut StdRng,
        ids: &mut BlockIds,
        group: usize,
        prefix_tokens: u32,
    ) -> Vec<TraceRequest> {
        let group_rate = self.rate / group as f64;
        let mut t = 0.0;
        let mut out = Vec::with_capacity(self.requests);
        while out.len() < self.requests {
            t += Self::gap(rng, group_rate);
            let prefix = ids.take(self.blocks(prefix_tokens));
            let n = group.min(self.requests - out.len());
            for _ in 0..n {
                out.push(self.with_prefix(rng, ids, t, &prefix));
            }
        }
        out
    }

    /// Conversations start as a Poisson process at `rate / turns`, so the overall request
    /// rate is about `rate`; turn k+1 arrives an exponential think time after turn k and its
    /// prompt is turn k's prompt, turn k's answer and a new question.
    fn multi_turn(
        &self,
        rng: &mut StdRng,
        ids: &mut BlockIds,
        turns: u32,
        think_s: f64,
    ) -> Vec<TraceRequest> {
        let conversations = self.requests.div_ceil(turns as usize);
        let start_rate = self.rate / f64::from(turns);
        let mut out = Vec::with_capacity(conversations * turns as usize);
        let mut start = 0.0;
        for _ in 0..conversations {
            start += Self::gap(rng, start_rate);
            let mut t = start;
            let mut prev = self.with_prefix(rng, ids, t, &[]);
            for _ in 1..turns {
                let grown = prev
                    .input_tokens
                    .saturating_add(prev.output_tokens)
                    .saturating_add(Self::jitter(rng, self.input_tokens));
                let mut hash_ids = prev.hash_ids.clone();
                // The previous last block, if partial, is continued under its own id: its
                // content is a prefix of the full block's, so the token prefix holds too.
                let more = self.blocks(grown).saturating_sub(hash_ids.len());
                hash_ids.extend(ids.take(more));
                t += if think_s > 0.0 {
                    Self::gap(rng, 1.0 / think_s)
                } else {
                    0.0
                };
                let next = TraceRequest {
                    arrival_s: t,
                    input_tokens: grown,
                    output_tokens: Self::jitter(rng, self.output_tokens),
                    hash_ids,
                    block_tokens: self.block_tokens,
                    session: None,
                };
                out.push(std::mem::replace(&mut prev, next));
            }
            out.push(prev);
        }
        // Keep the earliest `requests` arrivals so the count is exact.
        out.sort_by(|a, b| a.arrival_s.total_cmp(&b.arrival_s));
        out.truncate(self.requests);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zipf_rank_zero_is_most_popular() {
        let z = Zipf::new(10, 1.2);
        let mut rng = StdRng::seed_from_u64(7);
        let mut counts = [0usize; 10];
        for _ in 0..10_000 {
            counts[z.sample(&mut rng)] += 1;
        }
        assert!(counts[0] > counts[1] && counts[1] > counts[9], "{counts:?}");
    }

    #[test]
    fn siblings_share_their_group_prefix_and_arrival_only() {
        let spec = SyntheticSpec {
            kind: SyntheticKind::Siblings {
                group: 4,
                prefix_tokens: 256,
            },
            requests: 10,
            rate: 8.0,
            input_tokens: 64,
            output_tokens: 8,
            block_tokens: 64,
            seed: 3,
        };
        let trace = spec.generate().unwrap();
        let r = &trace.requests;
        assert_eq!(r.len(), 10);
        for g in r.chunks(4) {
            assert!(g.iter().all(|x| x.arrival_s == g[0].arrival_s));
            assert!(g.iter().all(|x| x.hash_ids[..4] == g[0].hash_ids[..4]));
            // Each request's own part is its own.
            assert_ne!(g[0].hash_ids[4..], g[1].hash_ids[4..]);
        }
        assert!(r[4].arrival_s > r[0].arrival_s);
        assert_ne!(r[0].hash_ids[0], r[4].hash_ids[0]);
        let zero = SyntheticSpec {
            kind: SyntheticKind::Siblings {
                group: 0,
                prefix_tokens: 256,
            },
            ..spec
        };
        assert!(zero.generate().is_err());
    }

    #[test]
    fn zero_exponent_is_uniform_enough() {
        let z = Zipf::new(4, 0.0);
        let mut rng = StdRng::seed_from_u64(1);
        let mut counts = [0usize; 4];
        for _ in 0..8_000 {
            counts[z.sample(&mut rng)] += 1;
        }
        assert!(counts.iter().all(|&c| c > 1_500), "{counts:?}");
    }
}
