//! Room in a worker's KV cache for a request's prompt, and the wait when there is none.
//!
//! An engine computes a prompt only once it can give all of the prompt's blocks a place in
//! its KV cache beside the sequences it is already running; until then the request waits
//! (vLLM's scheduler leaves it in the waiting queue, and a running sequence that cannot grow is
//! preempted and later recomputed). The prefix and queue terms of the cost model do not see
//! this: a warm worker running one 800k-token agent session has a short queue in tokens and
//! the whole prefix of the next turn, yet cannot start it until that session's answer ends.
//! In the simulator's tiered agentic fleet (docs/benchmarks.md, "Tiered caches") such requests
//! were predicted at 0.3–1 s and waited 3–24 s, preempting others on the way.
//!
//! The wait is priced from what the router books per worker: the prompt tokens of its
//! unfinished requests (`active`) and how many there are (`in_flight`). When `active` plus the
//! new prompt exceeds the worker's capacity, the request waits until enough of those requests
//! end to free the excess. With each request holding `active / in_flight` tokens, that is the
//! `k`-th of `n` to end; with remaining lifetimes taken as memoryless with mean `R`, the
//! expected wait is `R × (1/n + 1/(n−1) + … + 1/(n−k+1))`. It is 0 whenever the prompt fits,
//! which is every request of a fleet with room, so it moves nothing until a worker's running set
//! is full.
//!
//! `R` is what is left of a request found running, not a request's whole residence `D` (the
//! fleet's measured time from first token to end, [`Residence`]): a request that is running
//! when another arrives is more likely a long one (the inspection paradox), and what remains of
//! it is `E[D²] / 2E[D]` on average. Answer lengths are heavy-tailed — on the tiered agentic
//! fleet (seed 0) half end within 3.5 s, one in a hundred runs over 63 s, the longest 354 s —
//! so that is more than twice the mean (16.6 s against 7.2 s there): priced with the mean, turns
//! of 333k–505k tokens waited 19–27 s for room where 3–4 s was predicted, and more were sent
//! behind them (docs/benchmarks.md, "What is left of a running request").
//!
//! Where the router knows how long each request there has been decoding
//! (`fleet::decode_ages`), each is priced by its own age instead: what is left of an answer
//! that has run for a minute is what the recent answers longer than a minute ran past it
//! ([`Residence::residual_at`]), and one that has just begun is an average answer.

use crate::fleet::decode_ages::DecodeAges;

/// Until the first request ends, the residence assumed: a few hundred output tokens at
/// tens of milliseconds per step.
pub const PRIOR_RESIDENCE_S: f64 = 5.0;

/// Residences kept to tell what is left of a request of a given age.
pub const RECENT_RESIDENCES: usize = 512;

/// Residences needed, and longer than an age, before the recent ones are averaged past it.
const MIN_TAIL: usize = 8;

/// The fleet's times from a request's first token to its end (their mean and mean square,
/// and the most recent ones), learned from requests that completed: how long a running
/// request keeps its KV blocks once it has them.
#[derive(Clone, Debug)]
pub struct Residence {
    mean_s: f64,
    /// The mean of the squared residences, s².
    mean_sq: f64,
    observed: u64,
    /// The last [`RECENT_RESIDENCES`], oldest first.
    recent: std::collections::VecDeque<f32>,
}

impl Default for Residence {
    /// The prior as memoryless: what is left of a running request is the whole mean.
    fn default() -> Self {
        Residence {
            mean_s: PRIOR_RESIDENCE_S,
            mean_sq: 2.0 * PRIOR_RESIDENCE_S * PRIOR_RESIDENCE_S,
            observed: 0,
            recent: std::collections::VecDeque::with_capacity(RECENT_RESIDENCES),
        }
    }
}

impl Residence {
    /// The current estimate of a request's whole residence, seconds.
    pub fn mean_s(&self) -> f64 {
        self.mean_s
    }

    /// What is left, on average, of a request found running: `E[D²] / 2E[D]`, seconds.
    pub fn residual_s(&self) -> f64 {
        if self.mean_s <= 0.0 {
            return 0.0;
        }
        self.mean_sq / (2.0 * self.mean_s)
    }

    /// A request decoded for `decode_s` seconds after its first token. `forgetting` weighs
    /// older requests as the rate fit does; the first `1 / (1 − forgetting)` observations are
    /// averaged plainly so the prior does not linger.
    pub fn observe(&mut self, decode_s: f64, forgetting: f64) {
        if !decode_s.is_finite() || decode_s < 0.0 {
            return;
        }
        self.observed += 1;
        let plain = 1.0 / self.observed as f64;
        let keep = forgetting.clamp(0.0, 1.0);
        let new = plain.max(1.0 - keep);
        self.mean_s += new * (decode_s - self.mean_s);
        self.mean_sq += new * (decode_s * decode_s - self.mean_sq);
        if self.recent.len() == RECENT_RESIDENCES {
            self.recent.pop_front();
        }
        self.recent.push_back(decode_s as f32);
    }

    /// What is left, on average, of a request that has decoded for `age_s` seconds:
    /// `E[D − a | D > a]` over the recent residences. `None` (an age not known) is a request
    /// found running at random, [`Residence::residual_s`]; so is every age until
    /// [`RECENT_RESIDENCES`] / 8 have ended. An age beyond all but a few of them is assumed to
    /// go on at least as long again (a heavy tail's remaining time grows with its age).
    pub fn residual_at(&self, age_s: Option<f64>) -> f64 {
        let Some(age) = age_s else {
            return self.residual_s();
        };
        if self.recent.len() < RECENT_RESIDENCES / 8 {
            return self.residual_s();
        }
        let (sum, n) = self
            .recent
            .iter()
            .map(|&d| f64::from(d))
            .filter(|&d| d > age)
            .fold((0.0, 0usize), |(s, n), d| (s + d - age, n + 1));
        if n < MIN_TAIL {
            return age.max(self.residual_s());
        }
        sum / n as f64
    }
}

/// What a worker holds and runs, in tokens, as the router booked it, and what a new prompt
/// needs there.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Room {
    /// The worker's KV cache size in tokens.
    pub capacity_tokens: f64,
    /// Tokens the requests routed there and not yet finished hold (shared prefixes once).
    pub active_tokens: f64,
    /// How many such requests.
    pub in_flight: u64,
    /// Tokens of the new prompt the running requests do not already hold.
    pub needed_tokens: f64,
    /// How long those of them that are decoding have been, where known (the others, and all
    /// of them without ages, are taken as found running at random).
    pub ages: DecodeAges,
}

impl Room {
    /// The expected seconds the prompt waits for room, `residual(age)` being what is left,
    /// on average, of a request decoding for `age` seconds (`None`: of one whose age is not
    /// known; [`Residence::residual_at`]).
    ///
    /// The prompt starts once the `k` requests that free the excess have ended. Each running
    /// request ends at rate `1 / residual` of its age, as if memoryless from now on; the first
    /// of them to end does so after `1 / Σ rates`, and the likeliest to end first are the
    /// quickest, so the expected `k`-th end is taken as `Σ_{j<k} 1 / (Σ rates of all but the
    /// j quickest)`. With every residual alike this is `R × (1/n + 1/(n−1) + … )`.
    pub fn wait_s(&self, residual: impl Fn(Option<f64>) -> f64) -> f64 {
        let over = self.active_tokens + self.needed_tokens - self.capacity_tokens;
        let n = self.in_flight;
        // Nothing running: a prompt larger than the whole cache is the engine's to refuse,
        // and waiting would not help.
        if over <= 0.0 || n == 0 || self.active_tokens <= 0.0 {
            return 0.0;
        }
        let each = self.active_tokens / n as f64;
        let k = ((over / each).ceil() as u64).clamp(1, n) as usize;
        let mut rates: Vec<f64> = Vec::with_capacity(n as usize);
        for (age, count) in self.ages.buckets() {
            let r = 1.0 / residual(Some(age)).max(1e-3);
            rates.extend(std::iter::repeat_n(r, count as usize));
        }
        rates.truncate(n as usize);
        let unaged = 1.0 / residual(None).max(1e-3);
        rates.resize(n as usize, unaged);
        // Quickest first: the first to end are most likely the quickest.
        rates.sort_by(|a, b| b.total_cmp(a));
        let mut left: f64 = rates.iter().sum();
        let mut wait = 0.0;
        for r in rates.iter().take(k) {
            wait += 1.0 / left;
            left -= r;
        }
        wait
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn room(active: f64, n: u64, needed: f64) -> Room {
        Room {
            capacity_tokens: 1000.0,
            active_tokens: active,
            in_flight: n,
            needed_tokens: needed,
            ages: DecodeAges::default(),
        }
    }

    /// `wait_s` with every request's remaining time `r`.
    fn wait(room: Room, r: f64) -> f64 {
        room.wait_s(|_| r)
    }

    #[test]
    fn a_prompt_that_fits_waits_for_nothing() {
        assert_eq!(wait(room(600.0, 3, 400.0), 10.0), 0.0);
        assert_eq!(wait(room(0.0, 0, 5000.0), 10.0), 0.0);
    }

    #[test]
    fn one_running_request_in_the_way_is_waited_for_whole() {
        // One 900-token session running: any prompt over 100 tokens waits for it to end.
        assert!((wait(room(900.0, 1, 200.0), 8.0) - 8.0).abs() < 1e-9);
    }

    #[test]
    fn the_wait_is_the_kth_of_n_to_end() {
        // Four requests of 200 tokens; 300 over needs two of them gone: D/4 + D/3.
        let w = wait(room(800.0, 4, 500.0), 12.0);
        assert!((w - (3.0 + 4.0)).abs() < 1e-9, "{w}");
        // A small excess needs only the first of them to end.
        assert!((wait(room(800.0, 4, 250.0), 12.0) - 3.0).abs() < 1e-9);
        // More than everything running frees: all of them, and no more.
        let all = 12.0 * (1.0 / 4.0 + 1.0 / 3.0 + 1.0 / 2.0 + 1.0);
        assert!((wait(room(800.0, 4, 5000.0), 12.0) - all).abs() < 1e-9);
    }

    #[test]
    fn what_is_left_of_a_running_request_grows_with_the_tail() {
        let r = Residence::default();
        assert!(
            (r.residual_s() - PRIOR_RESIDENCE_S).abs() < 1e-9,
            "the prior is memoryless"
        );
        // Answers all alike: one found running is half done.
        let mut r = Residence::default();
        for _ in 0..100 {
            r.observe(4.0, 1.0);
        }
        assert!((r.residual_s() - 2.0).abs() < 1e-9);
        // Nine in ten end after 1 s, one in ten after 91 s: the mean is 10 s, and what is left
        // of one found running E[D²] / 2E[D] = (0.9 × 1 + 0.1 × 8,281) / 20 = 41.45 s.
        let mut r = Residence::default();
        for i in 0..1000 {
            r.observe(if i % 10 == 9 { 91.0 } else { 1.0 }, 1.0);
        }
        assert!((r.mean_s() - 10.0).abs() < 1e-9);
        assert!((r.residual_s() - 41.45).abs() < 1e-9, "{}", r.residual_s());
    }

    #[test]
    fn what_is_left_of_an_answer_grows_with_its_age() {
        // Too few ended yet: every age is priced as one found at random.
        let mut r = Residence::default();
        r.observe(3.0, 1.0);
        assert_eq!(r.residual_at(Some(100.0)), r.residual_s());
        // Nine in ten end after 1 s, one in ten after 91 s.
        let mut r = Residence::default();
        for i in 0..1000 {
            r.observe(if i % 10 == 9 { 91.0 } else { 1.0 }, 1.0);
        }
        assert_eq!(r.residual_at(None), r.residual_s());
        // Just begun: an average answer (the last 512: 460 of 1 s and 52 of 91 s), less
        // than what is left of one found at random (41.45 s).
        let young = r.residual_at(Some(0.5));
        assert!((young - (5192.0 / 512.0 - 0.5)).abs() < 1e-6, "{young}");
        // Past 1 s it can only be a long one: 91 − 30.
        assert!((r.residual_at(Some(30.0)) - 61.0).abs() < 1e-6);
        // Older than any seen: at least as long again.
        assert_eq!(r.residual_at(Some(200.0)), 200.0);
    }

    #[test]
    fn old_answers_hold_their_room_longer_than_new_ones() {
        let aged = |age: f64| {
            let mut ages = DecodeAges::default();
            for _ in 0..4 {
                ages.add(age);
            }
            Room {
                ages,
                ..room(800.0, 4, 300.0)
            }
        };
        // What is left: 5 s of a new answer, 60 s of an old one, 20 s of one of unknown age.
        let residual = |age: Option<f64>| match age {
            Some(a) if a > 10.0 => 60.0,
            Some(_) => 5.0,
            None => 20.0,
        };
        // One of four must end: a quarter of what is left of each.
        assert!((aged(1.0).wait_s(residual) - 5.0 / 4.0).abs() < 1e-9);
        assert!((aged(100.0).wait_s(residual) - 60.0 / 4.0).abs() < 1e-9);
        assert!((room(800.0, 4, 300.0).wait_s(residual) - 20.0 / 4.0).abs() < 1e-9);
        // Two new and two old, two to end: the new ones first, 1/(2/5 + 2/60) + 1/(1/5 + 2/60).
        let mut ages = DecodeAges::default();
        for a in [1.0, 1.0, 100.0, 100.0] {
            ages.add(a);
        }
        let mixed = Room {
            ages,
            ..room(800.0, 4, 500.0)
        };
        let expected = 1.0 / (2.0 / 5.0 + 2.0 / 60.0) + 1.0 / (1.0 / 5.0 + 2.0 / 60.0);
        assert!((mixed.wait_s(residual) - expected).abs() < 1e-9);
    }

    #[test]
    fn residence_averages_plainly_then_forgets() {
        let mut r = Residence::default();
        assert_eq!(r.mean_s(), PRIOR_RESIDENCE_S);
        r.observe(2.0, 0.99);
        assert_eq!(r.mean_s(), 2.0, "the first observation replaces the prior");
        r.observe(4.0, 0.99);
        assert!((r.mean_s() - 3.0).abs() < 1e-12);
        for _ in 0..2000 {
            r.observe(10.0, 0.99);
        }
        assert!((r.mean_s() - 10.0).abs() < 1e-6);
        r.observe(f64::NAN, 0.99);
        r.observe(-1.0, 0.99);
        assert!((r.mean_s() - 10.0).abs() < 1e-6, "nonsense is ignored");
    }
}
