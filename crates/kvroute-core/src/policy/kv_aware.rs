//! `kv_aware`: predicted time to first token, from prefix overlap and queued work.
//!
//! For each eligible worker the policy predicts
//! `ttft ≈ (queued + prompt − cached) / prefill_rate + decoding × step_cost + overhead`
//! (ARCHITECTURE.md, "The cost model"). `cached` comes from the KV index (leading blocks the
//! worker holds), `queued` and `decoding` from router-side accounting. The rates start from
//! configuration and are re-fitted online from observed TTFTs, so the trade-off between a warm
//! cache and a short queue is made in the fleet's own seconds rather than with a hand-tuned
//! weight. They are fitted once for the whole fleet; each worker only has a speed factor on top,
//! shrunk, bounded and decaying ([`super::fleet_calibration`]): per-worker fits turned timing
//! noise into lasting preferences, and bursts and new prefixes herded onto the one worker that
//! happened to look fastest (issue 15). A worker without evidence of its own (new, restarted,
//! never chosen) is scored with the fleet's rates, not the configured prior. Where the view
//! holds other router replicas' requests (`LoadSnapshot::unseen_in_flight`, from the engines'
//! load readings), every worker is scored with its own fit instead: per-worker fits learn the
//! load the view cannot see, which a pooled fit averages away.
//!
//! The policy minimises the *total* latency the decision adds, not only the request's own
//! TTFT: with continuous batching, the request's prefill runs in the same steps as the
//! sequences already decoding on that worker and stalls each of them by about as long as it
//! takes (`uncached / prefill_rate + overhead`). So
//! `cost = ttft + decode_weight × decoding × (uncached / prefill_rate + overhead)`.
//! Measured in `kvroute simulate` (docs/benchmarks.md), TTFT alone piled decodes onto warm
//! workers and lost on completion latency whenever hits were equal; the stall term balances
//! decode load without giving up prefix hits that actually save time. The default weight,
//! 0.25, is the one that scored best on SLO attainment across the scenario suite (0 loses
//! completion latency, 1 gives up too much TTFT on unique prompts).
//!
//! A worker's KV cache holds sessions that come back (agents return with the same context
//! seconds to minutes later), and writing a prompt's uncached blocks on a full worker evicts
//! the blocks touched longest ago. When those belong to a session that returns, the eviction
//! costs a recomputation later, which no term above sees: under cache pressure, myopic
//! placement spread working sets unevenly and evicted live sessions on the crowded workers.
//! So the cost also counts `eviction_weight × returning × block_size / prefill_rate`, where
//! `returning` ([`super::WorkingSet::returning_evictions`], from `index::Residency`) is the
//! expected number of evicted blocks that will be asked for again, each weighed by the
//! measured chance that a block idle that long comes back. It is 0 on a worker with room, on
//! traffic that never comes back, and for victims idle past every measured return; a session
//! moves only where its new home can hold it without evicting someone who returns. On the
//! agentic trace × 8 (docs/benchmarks.md, "Routing under pressure") TTFT p90 fell from 1,073 to
//! 924 ms; the conversation trace and the scenario suite are unchanged within noise.
//!
//! A saturated fleet ([`super::saturation`]: every worker has at least twice the prompt queued
//! for prefill, or none has room for it in its KV cache) changes two things. The prefix a
//! request in flight on a worker is computing counts as cached there (the request starts after
//! it is written), and the work a placement adds is counted a second time,
//! `saturation_weight × (prompt − held) / prefill_rate`: every later request waits for it too. Siblings that arrive together then co-locate where the
//! first computes their prefix; below saturation they spread over idle workers, which
//! computes the prefix on each but finishes sooner.
//!
//! Costs within [`TIE_TOLERANCE`] of the best (at most [`TIE_CAP_S`]) are ties (exact ties only on
//! a partial view, where per-worker fits decide and their differences are signal): the model
//! cannot tell them apart (on an idle fleet every prediction is the overhead, and a millisecond
//! of noise used to decide every request). Ties go to the worker with fewer requests in flight,
//! then to the home of the session the client named (an affinity hint: `prompt_cache_key`,
//! `user` or a session header; see `index::sessions`; measured on the agentic trace without KV
//! events, the home before the in-flight count lost on mean and p99 TTFT, after it won on
//! every statistic),
//! then to the one that was admitted fewer requests so far, then to a seeded random one, so
//! unique prompts spread like `least_request` and new prefixes that no worker holds rotate over
//! the workers rather than all following the first tie's winner. With a temperature above 0 the
//! choice is sampled, softly preferring lower costs.

use std::sync::Mutex;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::calibration::Rates;
use super::copy_value;
use super::fleet_calibration::FleetCalibration;
use super::kv_room::Room;
use super::residence::Residence;
use super::saturation;
use super::tier_cost::{TierCostConfig, TierPricing};
use super::{Candidate, Observation, Policy, RouteDecision, RouteRequest};
use crate::fleet::WorkerId;
use crate::fleet::decode_ages::DecodeAges;

/// Settings of the cost model.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct KvAwareConfig {
    /// Initial prefill throughput of one worker, tokens per second.
    pub prefill_rate_tokens_per_s: f64,
    /// Initial seconds added to TTFT per sequence decoding on the worker.
    pub step_cost_s: f64,
    /// Initial fixed seconds per request (scheduling, first step).
    pub overhead_s: f64,
    /// Re-fit the rates from observed TTFTs.
    pub calibrate: bool,
    /// Weight of older observations in the fit (0.9–1.0; 0.995 ≈ the last few hundred).
    pub forgetting: f64,
    /// 0: always the minimum. Above 0: sample with weights `exp(−Δcost / (temperature × best))`.
    pub temperature: f64,
    /// Weight of the stall a prefill imposes on sequences decoding on the worker (0: own TTFT
    /// only; 1: every second of anyone's latency counts the same).
    pub decode_weight: f64,
    /// Weight of the recomputation a placement causes later: the live blocks of other sessions
    /// that writing this prompt evicts, times the measured chance they come back, priced at
    /// the prefill rate (0: the decision ignores what it evicts).
    pub eviction_weight: f64,
    /// Weight of what a copy of a busy prefix saves the later requests for it
    /// ([`super::copy_value`]; 0: a prefix is copied only for the request in hand).
    pub copy_weight: f64,
    /// Weight of the work a placement adds to a saturated fleet ([`super::saturation`]),
    /// counted again for the requests queued behind it (0: own latency only, at any load).
    pub saturation_weight: f64,
    /// The engines' `--long-prefill-token-threshold` (0: unset, a prompt takes the whole step
    /// budget): with it, a request shares the steps of the long prefills ahead of it rather
    /// than waiting for them ([`super::chunking`]).
    pub long_prefill_token_threshold: u64,
    /// What blocks in host memory and on disk are worth ([`super::tier_cost`]).
    pub tiers: TierCostConfig,
}

/// The threshold the cost model prices queued prefills with (`long_prefill_token_threshold`)
/// when the router sends long prompts in pieces of `piece_tokens` (0: whole;
/// `routing::prefill_pieces`): a request then waits behind one piece of each, or the engines'
/// own cap `engine_threshold` if that is smaller (0: none).
pub fn threshold_with_pieces(engine_threshold: u64, piece_tokens: u64) -> u64 {
    match (engine_threshold, piece_tokens) {
        (0, p) => p,
        (t, 0) => t,
        (t, p) => t.min(p),
    }
}

/// Costs within this fraction of the best are ties: the model's precision, not a preference.
/// Measured on the Mooncake conversation trace × 16 (TTFT mean / p90): 2 % → 185.5 / 426.7 ms,
/// 10 % → 187.1 / 436.3 ms, exact ties only → 189.2 / 429.9 ms (with per-worker factors then
/// shrunk by 50: the window must be wider than the factors' spread on identical workers).
pub const TIE_TOLERANCE: f64 = 0.02;

/// The most seconds [`TIE_TOLERANCE`] may amount to: under load, where costs are large,
/// differences of a few milliseconds are real and the cost decides.
pub const TIE_CAP_S: f64 = 0.002;

impl Default for KvAwareConfig {
    fn default() -> Self {
        KvAwareConfig {
            prefill_rate_tokens_per_s: 20_000.0,
            step_cost_s: 0.000_5,
            overhead_s: 0.02,
            calibrate: true,
            forgetting: 0.995,
            temperature: 0.0,
            decode_weight: 0.25,
            eviction_weight: 1.0,
            copy_weight: 1.0,
            saturation_weight: 1.0,
            long_prefill_token_threshold: 0,
            tiers: TierCostConfig::default(),
        }
    }
}

impl KvAwareConfig {
    fn prior(&self) -> Rates {
        Rates {
            seconds_per_token: 1.0 / self.prefill_rate_tokens_per_s.max(1.0),
            step_cost_s: self.step_cost_s.max(0.0),
            overhead_s: self.overhead_s.max(0.0),
        }
    }
}

/// The cost-model policy.
#[derive(Debug)]
pub struct KvAware {
    /// The settings, replaced by a config reload ([`Policy::reconfigure`]); read once per
    /// decision.
    config: Mutex<KvAwareConfig>,
    calibration: Mutex<FleetCalibration<WorkerId>>,
    tiers: TierPricing,
    /// How long running requests keep their KV blocks ([`super::kv_room`]).
    residence: Mutex<Residence>,
    rng: Mutex<StdRng>,
}

impl KvAware {
    /// A policy with `config`; `seed` drives tie-breaks and sampling.
    pub fn new(config: KvAwareConfig, seed: u64) -> KvAware {
        KvAware {
            config: Mutex::new(config),
            calibration: Mutex::new(FleetCalibration::new(config.prior(), config.forgetting)),
            tiers: TierPricing::new(config.forgetting),
            residence: Mutex::new(Residence::default()),
            rng: Mutex::new(StdRng::seed_from_u64(seed)),
        }
    }

    /// The settings now.
    pub fn config(&self) -> KvAwareConfig {
        *super::lock(&self.config)
    }

    /// The rates currently used for `worker`.
    pub fn rates(&self, worker: WorkerId) -> Rates {
        super::lock(&self.calibration).rates(worker)
    }

    /// The learned mean time from a request's first token to its end, seconds.
    #[cfg(test)]
    pub(crate) fn residence_mean_s(&self) -> f64 {
        super::lock(&self.residence).mean_s()
    }

    /// The fitted load factors of the host-memory and disk tiers.
    pub fn tier_factors(&self) -> [f64; 2] {
        self.tiers.factors()
    }

    /// What `c` holds and runs, when its KV capacity is known: the prompts booked there and
    /// what their answers have written so far, at `written_per_s` tokens per second of decode.
    fn room(request: &RouteRequest, c: &Candidate, written_per_s: f64) -> Option<Room> {
        let capacity = c.cache.capacity_blocks?;
        let shared = c.cache.running_prefix_blocks * u64::from(request.block_size);
        let written = c.cache.decoded_s * written_per_s;
        Some(Room {
            capacity_tokens: capacity as f64 * f64::from(request.block_size),
            active_tokens: c.cache.running_tokens as f64 + written,
            in_flight: c.load.in_flight,
            needed_tokens: request.prompt_tokens.saturating_sub(shared) as f64,
            ages: c.cache.decode_ages,
            written_per_s,
        })
    }

    /// How long `request` waits for room in each candidate's KV cache (`None` where the
    /// capacity is not known). The answers running there hold what they have written besides
    /// their prompts; what is left of them is read from the residences, with every
    /// candidate's running ones counted as lasting at least their ages
    /// ([`Residence::remaining`]). The curve is drawn only when some candidate is short of room.
    fn room_waits(&self, request: &RouteRequest, candidates: &[Candidate]) -> Vec<Option<f64>> {
        let residence = super::lock(&self.residence);
        let written_per_s = residence.decode_tokens_per_s().unwrap_or(0.0);
        let rooms: Vec<Option<Room>> = candidates
            .iter()
            .map(|c| Self::room(request, c, written_per_s))
            .collect();
        if !rooms.iter().flatten().any(Room::is_short) {
            return rooms.iter().map(|r| r.map(|_| 0.0)).collect();
        }
        let mut running = DecodeAges::default();
        candidates
            .iter()
            .for_each(|c| running.merge(&c.cache.decode_ages));
        let remaining = residence.remaining(&running);
        drop(residence);
        rooms
            .iter()
            .map(|r| r.as_ref().map(|room| room.wait_s(|age| remaining.at(age))))
            .collect()
    }

    /// Predicted TTFT of `request` on `c`, and the cost of sending it there; `quote` is what
    /// its GPU and offloaded blocks are worth (tokens not computed, seconds of loading),
    /// `room_wait_s` how long it waits for room in the worker's KV cache.
    fn predict(
        config: &KvAwareConfig,
        request: &RouteRequest,
        c: &Candidate,
        rates: &Rates,
        quote: &super::TierQuote,
        room_wait_s: f64,
        saturated: bool,
    ) -> (f64, f64) {
        // Saturated, the prefix a request in flight there computes is written before this
        // one starts: it is not computed twice.
        let held = if saturated {
            quote
                .cached_tokens
                .max(saturation::in_flight_prefix_tokens(request, c))
        } else {
            quote.cached_tokens
        };
        let uncached_tokens = request.prompt_tokens.saturating_sub(held);
        let uncached = uncached_tokens as f64;
        let ahead = super::chunking::tokens_ahead(
            c.load.queued_prefill_tokens,
            c.load.in_flight.saturating_sub(c.load.decoding),
            uncached_tokens,
            config.long_prefill_token_threshold,
        );
        let tokens = ahead as f64 + uncached;
        let decoding = c.load.decoding as f64;
        // A load from host memory or disk delays this request only (it runs beside others).
        let ttft = rates.predict(tokens, decoding) + quote.load_s() + room_wait_s;
        let stall = uncached * rates.seconds_per_token + rates.overhead_s;
        let recompute =
            c.cache.returning_evictions * f64::from(request.block_size) * rates.seconds_per_token;
        // Saturated, every second of work added here is a second the requests behind it wait.
        let added_work = if saturated {
            config.saturation_weight * uncached * rates.seconds_per_token
        } else {
            0.0
        };
        let cost = ttft
            + config.decode_weight * decoding * stall
            + config.eviction_weight * recompute
            + added_work;
        (ttft, cost)
    }
}

impl Policy for KvAware {
    fn name(&self) -> &'static str {
        super::PolicyKind::KvAware.name()
    }

    fn uses_prefix(&self) -> bool {
        true
    }

    fn choose(&self, request: &RouteRequest, candidates: &[Candidate]) -> Option<RouteDecision> {
        if candidates.is_empty() {
            return None;
        }
        let config = self.config();
        // Other router replicas' requests in the view: score every worker with its own fit,
        // which has learned what the view misses ([`super::fleet_calibration`]).
        let partial = candidates.iter().any(|c| c.load.unseen_in_flight > 0);
        let factors = self.tiers.factors();
        let quotes: Vec<_> = candidates
            .iter()
            .map(|c| self.tiers.quote(&config.tiers, request, c, factors))
            .collect();
        let rates: Vec<Rates> = super::lock(&self.calibration)
            .rates_in_view_of(candidates.iter().map(|c| c.worker), partial);
        let room_wait = self.room_waits(request, candidates);
        let saturated = saturation::saturated(request.prompt_tokens, candidates, &room_wait);
        let (predicted, mut cost): (Vec<f64>, Vec<f64>) = candidates
            .iter()
            .zip(&quotes)
            .zip(&rates)
            .zip(&room_wait)
            .map(|(((c, quote), rates), wait)| {
                let wait = wait.unwrap_or(0.0);
                Self::predict(&config, request, c, rates, quote, wait, saturated)
            })
            .unzip();
        if !saturated {
            let off = copy_discounts(&config, request, candidates, &quotes, &predicted, &rates);
            cost.iter_mut().zip(off).for_each(|(k, d)| *k -= d);
        }
        let best = cost.iter().copied().fold(f64::INFINITY, f64::min);
        let chosen = if config.temperature > 0.0 {
            let scale = config.temperature * best.max(1e-3);
            let weights: Vec<f64> = cost.iter().map(|p| (-(p - best) / scale).exp()).collect();
            let total: f64 = weights.iter().sum();
            let mut x = super::lock(&self.rng).random_range(0.0..total);
            let mut pick = 0;
            for (i, w) in weights.iter().enumerate() {
                if x < *w {
                    pick = i;
                    break;
                }
                x -= w;
            }
            pick
        } else {
            // On a partial view the per-worker fits decide, and a difference of a millisecond
            // between them is what they learned about unseen load, not noise: exact ties only.
            let slack = if partial {
                1e-6
            } else {
                (best * TIE_TOLERANCE).clamp(1e-6, TIE_CAP_S)
            };
            let tied: Vec<usize> = (0..candidates.len())
                .filter(|&i| cost[i] - best <= slack)
                .collect();
            let tied = fewest_by(tied, |i| candidates[i].load.in_flight);
            let tied = fewest_by(tied, |i| u64::from(!candidates[i].session_home));
            let tied = fewest_by(tied, |i| candidates[i].load.admitted);
            if tied.len() == 1 {
                tied[0]
            } else {
                tied[super::lock(&self.rng).random_range(0..tied.len())]
            }
        };
        Some(RouteDecision {
            chosen,
            predicted_ttft_s: predicted.into_iter().map(Some).collect(),
            cost: cost.into_iter().map(Some).collect(),
            tiers: quotes.into_iter().map(Some).collect(),
            prefill_tokens_per_s: rates
                .iter()
                .map(|r| (r.seconds_per_token > 0.0).then(|| 1.0 / r.seconds_per_token))
                .collect(),
            room_wait_s: room_wait,
        })
    }

    fn forget(&self, worker: WorkerId) {
        super::lock(&self.calibration).forget(worker);
    }

    /// A reload's new cost model applies from the next decision: the weights, the temperature
    /// and the prior (which scores the fleet until the pooled fit has enough observations).
    /// Rates already fitted are kept (they are measurements of the workers, not settings). The
    /// seed is not changed.
    fn reconfigure(&self, settings: &super::PolicySettings) {
        let config = settings.kv_aware;
        *super::lock(&self.config) = config;
        super::lock(&self.calibration).set_prior(config.prior());
    }

    fn observe_decode(&self, _worker: WorkerId, decode_s: f64, output_tokens: Option<u64>) {
        let forgetting = self.config().forgetting;
        super::lock(&self.residence).observe(decode_s, output_tokens, forgetting);
    }

    fn observe(&self, o: &Observation) {
        let config = self.config();
        if !config.calibrate {
            return;
        }
        let ahead = super::chunking::tokens_ahead(
            o.queued_tokens,
            o.prefilling,
            o.uncached_tokens,
            config.long_prefill_token_threshold,
        );
        let tokens = (ahead + o.uncached_tokens) as f64;
        let mut calibration = super::lock(&self.calibration);
        // The time spent loading offloaded blocks is the tier fit's to learn, not the prefill's.
        let prefill = calibration
            .rates(o.worker)
            .predict(tokens, o.decoding as f64);
        // The wait for room it was predicted is the room model's to price
        // ([`super::kv_room`]), not slow prefill: learned into the rates, it made every
        // prediction slower after waits.
        let ttft_s = (self.tiers.observe(&config.tiers, o, prefill) - o.room_wait_s).max(0.0);
        calibration.observe(
            o.worker,
            tokens,
            o.decoding as f64,
            ttft_s,
            o.unseen_in_flight > 0,
            ahead == 0,
        );
    }
}

/// What each candidate's copy of the warm prefix saves the requests for it after this one
/// ([`copy_value`]). Nothing unless requests in flight hold that prefix now: one session's
/// turns come one after another, so its own context's rate is nobody arriving meanwhile.
fn copy_discounts(
    config: &KvAwareConfig,
    request: &RouteRequest,
    candidates: &[Candidate],
    quotes: &[super::TierQuote],
    predicted: &[f64],
    rates: &[Rates],
) -> Vec<f64> {
    let sharing: u32 = candidates.iter().map(|c| c.cache.sharing_requests).sum();
    if sharing == 0 || config.copy_weight <= 0.0 {
        return vec![0.0; candidates.len()];
    }
    let sides: Vec<copy_value::Side> = quotes
        .iter()
        .zip(predicted)
        .zip(rates)
        .map(|((quote, ttft), rates)| {
            let own = request.prompt_tokens.saturating_sub(quote.cached_tokens);
            copy_value::Side {
                cached_tokens: quote.cached_tokens,
                wait_s: ttft - own as f64 * rates.seconds_per_token,
                seconds_per_token: rates.seconds_per_token,
            }
        })
        .collect();
    copy_value::discounts(request.warm_prefix_rate, &sides, config.copy_weight)
}

/// The members of `tied` with the smallest `key`.
fn fewest_by(tied: Vec<usize>, key: impl Fn(usize) -> u64) -> Vec<usize> {
    let fewest = tied.iter().map(|&i| key(i)).min().unwrap_or(0);
    tied.into_iter().filter(|&i| key(i) == fewest).collect()
}

#[cfg(test)]
#[path = "kv_aware_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "kv_aware_room_tests.rs"]
mod room_tests;
