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
//! fleet's measured time from first token to end, `policy::residence`): a request that is running
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
//! (`Residence::remaining`, which also counts the answers still running while the router is
//! young), and one that has just begun is an average answer.

use crate::fleet::decode_ages::DecodeAges;

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
    /// Whether the prompt must wait for running requests to end: it does not fit beside
    /// them. With nothing running it never waits (a prompt larger than the whole cache is the
    /// engine's to refuse, and waiting would not help).
    pub fn is_short(&self) -> bool {
        let over = self.active_tokens + self.needed_tokens - self.capacity_tokens;
        over > 0.0 && self.in_flight > 0 && self.active_tokens > 0.0
    }

    /// The expected seconds the prompt waits for room, `residual(age)` being what is left,
    /// on average, of a request decoding for `age` seconds (`None`: of one whose age is not
    /// known; `Residence::remaining`).
    ///
    /// The prompt starts once the `k` requests that free the excess have ended. Each running
    /// request ends at rate `1 / residual` of its age, as if memoryless from now on; the first
    /// of them to end does so after `1 / Σ rates`, and the likeliest to end first are the
    /// quickest, so the expected `k`-th end is taken as `Σ_{j<k} 1 / (Σ rates of all but the
    /// j quickest)`. With every residual alike this is `R × (1/n + 1/(n−1) + … )`.
    pub fn wait_s(&self, residual: impl Fn(Option<f64>) -> f64) -> f64 {
        if !self.is_short() {
            return 0.0;
        }
        let over = self.active_tokens + self.needed_tokens - self.capacity_tokens;
        let n = self.in_flight;
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
}
