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
//! is full. Where the router knows the decoding requests' prompts (`fleet::decode_ages` keeps
//! them beside their ages), each frees what it holds instead of an even share: a 560k-token
//! turn beside answers of 10k and 285k waits for the 285k one, not for the first to end.
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
    /// How long those of them that are decoding have been, and the prompts they hold, where
    /// known (the others, and all of them without ages, are taken as found running at random
    /// and as holding an even share of what the aged ones do not).
    pub ages: DecodeAges,
    /// Tokens a decoding request writes per second: an aged request holds its prompt and
    /// what it has written.
    pub written_per_s: f64,
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
    /// The prompt starts once the requests that have ended free the excess. Each running
    /// request ends at rate `1 / residual` of its age, as if memoryless from now on; the first
    /// of them to end does so after `1 / Σ rates`, and the likeliest to end first are the
    /// quickest, so the requests are taken to end quickest first, the `j`-th after
    /// `Σ_{i<j} 1 / (Σ rates of all but the i quickest)`, until what they held covers the
    /// excess. With every residual and every request's tokens alike this is the `k`-th of `n`
    /// to end, `R × (1/n + 1/(n−1) + … )`.
    ///
    /// What each frees is its own: agent sessions of 10k and 400k tokens share workers, and
    /// when the excess is a long prompt's, the short answers ending first do not make room
    /// for it. Taking every request as holding `active / n` priced those waits as the first
    /// few ends where the one holding the room had to end.
    pub fn wait_s(&self, residual: impl Fn(Option<f64>) -> f64) -> f64 {
        if !self.is_short() {
            return 0.0;
        }
        let over = self.active_tokens + self.needed_tokens - self.capacity_tokens;
        let mut leavers = self.leavers(residual);
        // Quickest first: the first to end are most likely the quickest.
        leavers.sort_by(|a, b| b.0.total_cmp(&a.0));
        let mut left: f64 = leavers.iter().map(|l| l.0).sum();
        let (mut wait, mut freed) = (0.0, 0.0);
        for (rate, tokens) in leavers {
            if freed >= over {
                break;
            }
            wait += 1.0 / left;
            left -= rate;
            freed += tokens;
        }
        wait
    }

    /// Each running request's rate of ending and the tokens its end frees. A request
    /// without an age (queued, prefilling, or its first token not timed) is taken, as before
    /// sizes were known, to free an even share `active / n`; the aged share the rest in
    /// proportion to what each holds, its bucket's average prompt and what it has written
    /// (prefixes they share are held once, so their own sizes add up to more than that rest).
    ///
    /// Why the unaged keep an even share: given only what the aged leave of `active`
    /// (nothing, where shared prefixes make the aged prompts add up to more), the request
    /// queued behind them, the quickest to end by the random residual, freed nothing; on the
    /// capped four-engine fleet the waits came out at 4.6–8.7 s where the engines took 1–3 s,
    /// turns left their warm homes, and that fleet's mean TTFT nearly doubled. Scaled with
    /// the aged instead (losing their part of what shared prefixes take), the unaged still
    /// cost that fleet 8–11 % without tiers (docs/benchmarks.md, "What each running request
    /// frees").
    fn leavers(&self, residual: impl Fn(Option<f64>) -> f64) -> Vec<(f64, f64)> {
        let n = self.in_flight as usize;
        let even = self.active_tokens / n as f64;
        let mut leavers: Vec<(f64, f64)> = Vec::with_capacity(n);
        for (age, count, tokens) in self.ages.buckets_holding() {
            let rate = 1.0 / residual(Some(age)).max(1e-3);
            let each = match tokens {
                0 => even,
                t => t as f64 / f64::from(count) + self.written_per_s * age,
            };
            leavers.extend(std::iter::repeat_n((rate, each), count as usize));
        }
        leavers.truncate(n);
        let aged = leavers.len();
        // The unaged keep an even share; the aged share the rest by what they hold.
        let theirs = (self.active_tokens - (n - aged) as f64 * even).max(0.0);
        let held: f64 = leavers.iter().map(|l| l.1).sum();
        if held > 0.0 {
            let scale = theirs / held;
            leavers.iter_mut().for_each(|l| l.1 *= scale);
        }
        leavers.resize(n, (1.0 / residual(None).max(1e-3), even));
        leavers
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
            written_per_s: 0.0,
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
    fn a_long_prompt_waits_for_the_request_holding_the_room() {
        // Nine young answers of 10 tokens and one old one of 910 fill a cache of 1,000.
        // What is left: 1 s of a young answer, 30 s of the old one.
        let mut ages = DecodeAges::default();
        for _ in 0..9 {
            ages.add(0.5, 10);
        }
        ages.add(100.0, 910);
        let aged = |needed: f64| Room {
            ages,
            ..room(1000.0, 10, needed)
        };
        let residual = |age: Option<f64>| match age {
            Some(a) if a > 10.0 => 30.0,
            _ => 1.0,
        };
        // 50 tokens: five young ones make room, ending after 1/(9 + 1/30) + … + 1/(5 + 1/30).
        let rate = |young: f64| young + 1.0 / 30.0;
        let five: f64 = (5..=9).map(|y| 1.0 / rate(f64::from(y))).sum();
        assert!((aged(50.0).wait_s(residual) - five).abs() < 1e-9);
        // 200 tokens: the young ones hold 90 between them; the old one must end too. As if
        // each held 100, two young ones would have made room: 1/rate(9) + 1/rate(8).
        let all: f64 = (1..=9).map(|y| 1.0 / rate(f64::from(y))).sum::<f64>() + 30.0;
        assert!((aged(200.0).wait_s(residual) - all).abs() < 1e-9);
        // Without ages nothing tells them apart: an even share each.
        let even = room(1000.0, 10, 200.0).wait_s(residual);
        assert!((even - (1.0 / 10.0 + 1.0 / 9.0)).abs() < 1e-9, "{even}");
    }

    #[test]
    fn shares_add_up_to_what_is_held() {
        // Three requests hold 900 tokens: one unaged, with an even share of 300, and two
        // aged ones told 200 and 1,000 (more than the 600 left: a prefix they share is held
        // once), who share the 600 as 1 to 5.
        let mut ages = DecodeAges::default();
        ages.add(0.5, 200);
        ages.add(6.0, 1000);
        let r = Room {
            ages,
            ..room(900.0, 3, 400.0)
        };
        let tokens: Vec<f64> = r.leavers(|_| 2.0).iter().map(|l| l.1).collect();
        assert_eq!(tokens, vec![100.0, 500.0, 300.0]);
        // Written tokens count with the prompt: 100 a second for an answer 6 s old.
        let mut ages = DecodeAges::default();
        ages.add(6.0, 400);
        ages.add(0.5, 400);
        let r = Room {
            ages,
            written_per_s: 100.0,
            ..room(1450.0, 2, 100.0)
        };
        let tokens: Vec<f64> = r.leavers(|_| 2.0).iter().map(|l| l.1).collect();
        assert_eq!(tokens, vec![450.0, 1000.0]);
    }

    #[test]
    fn old_answers_hold_their_room_longer_than_new_ones() {
        let aged = |age: f64| {
            let mut ages = DecodeAges::default();
            for _ in 0..4 {
                ages.add(age, 200);
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
            ages.add(a, 200);
        }
        let mixed = Room {
            ages,
            ..room(800.0, 4, 500.0)
        };
        let expected = 1.0 / (2.0 / 5.0 + 2.0 / 60.0) + 1.0 / (1.0 / 5.0 + 2.0 / 60.0);
        assert!((mixed.wait_s(residual) - expected).abs() < 1e-9);
    }
}
