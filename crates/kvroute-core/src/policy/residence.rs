//! How long a request keeps its KV blocks once it has its first token, and what is left of
//! one that has decoded for a given time.
//!
//! The wait for KV room (`policy::kv_room`) is the wait for running requests to end. The
//! fleet's residences `D` (first token to end) are heavy-tailed — on the tiered agentic fleet
//! (seed 0) half end within 3.5 s, one in a hundred runs over 63 s, the longest 354 s — so
//! what is left of a request depends on how long it has already run: `E[D − a | D > a]`.
//!
//! That is read from the survival curve of the residences, and the residences that have
//! *ended* are a biased sample of it while the router is young: in its first minutes only
//! the short answers have ended, and the long ones are still running. On four engines fed
//! capped agent sessions for three minutes, the waits priced from the ended ones came out
//! 4–6 s short (docs/benchmarks.md, "Answers still running"). So the curve is Kaplan–Meier's:
//! each request still decoding counts as one that has lasted at least its age (a censored
//! observation), beside the ones that ended. That is exact while every request that ended
//! since the policy began is still among the [`RECENT_RESIDENCES`] kept (each running request
//! then began after the sample did). Past that, the sample is the ones that ended in a recent
//! window, which is not biased toward short ones once the router has run longer than its
//! answers (it holds long and short answers in the proportion they end), and censoring the
//! running ones there would count again the long ones the window already holds: they are not
//! counted.

use crate::fleet::decode_ages::DecodeAges;

/// Until the first request ends, the residence assumed: a few hundred output tokens at
/// tens of milliseconds per step.
pub const PRIOR_RESIDENCE_S: f64 = 5.0;

/// Residences kept to tell what is left of a request of a given age.
pub const RECENT_RESIDENCES: usize = 512;

/// Residences (ended or running) needed beyond an age before the curve is read past it.
const MIN_TAIL: f64 = 8.0;

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
    /// The same, shortest first.
    sorted: Vec<f32>,
    /// Output tokens after the first, and seconds of decode, of the answers whose length is
    /// known (averaged with forgetting): their ratio is the tokens a decoding request writes
    /// per second.
    decoded: Option<(f64, f64)>,
    decoded_observed: u64,
}

impl Default for Residence {
    /// The prior as memoryless: what is left of a running request is the whole mean.
    fn default() -> Self {
        Residence {
            mean_s: PRIOR_RESIDENCE_S,
            mean_sq: 2.0 * PRIOR_RESIDENCE_S * PRIOR_RESIDENCE_S,
            observed: 0,
            recent: std::collections::VecDeque::with_capacity(RECENT_RESIDENCES),
            sorted: Vec::with_capacity(RECENT_RESIDENCES),
            decoded: None,
            decoded_observed: 0,
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

    /// Tokens a decoding request writes per second, once an answer's length has been told.
    pub fn decode_tokens_per_s(&self) -> Option<f64> {
        let (tokens, secs) = self.decoded?;
        (secs > 0.0).then(|| tokens / secs)
    }

    /// A request decoded for `decode_s` seconds after its first token, writing
    /// `output_tokens` in all where the engine said. `forgetting` weighs older requests as
    /// the rate fit does; the first `1 / (1 − forgetting)` observations are averaged plainly
    /// so the prior does not linger.
    pub fn observe(&mut self, decode_s: f64, output_tokens: Option<u64>, forgetting: f64) {
        if !decode_s.is_finite() || decode_s < 0.0 {
            return;
        }
        self.observed += 1;
        let keep = forgetting.clamp(0.0, 1.0);
        let new = (1.0 / self.observed as f64).max(1.0 - keep);
        self.mean_s += new * (decode_s - self.mean_s);
        self.mean_sq += new * (decode_s * decode_s - self.mean_sq);
        if let Some(out) = output_tokens.filter(|_| decode_s > 0.0) {
            // The first token came with the prefill.
            let tokens = out.saturating_sub(1) as f64;
            self.decoded_observed += 1;
            let new = (1.0 / self.decoded_observed as f64).max(1.0 - keep);
            let (t, s) = self.decoded.get_or_insert((tokens, decode_s));
            *t += new * (tokens - *t);
            *s += new * (decode_s - *s);
        }
        if self.recent.len() == RECENT_RESIDENCES
            && let Some(old) = self.recent.pop_front()
        {
            let at = self.sorted.partition_point(|&d| d < old);
            self.sorted.remove(at);
        }
        let d = decode_s as f32;
        self.recent.push_back(d);
        let at = self.sorted.partition_point(|&x| x < d);
        self.sorted.insert(at, d);
    }

    /// What is left of requests by their age, with `running` the ages of the requests
    /// decoding now (censored residences, counted only while every ended one is kept).
    pub fn remaining(&self, running: &DecodeAges) -> Remaining {
        let random_s = self.residual_s();
        if self.recent.len() < RECENT_RESIDENCES / 8 {
            return Remaining {
                random_s,
                curve: None,
            };
        }
        let young = self.observed <= RECENT_RESIDENCES as u64;
        let censored: Vec<(f64, u32)> = if young {
            running.buckets().collect()
        } else {
            Vec::new()
        };
        Remaining {
            random_s,
            curve: Some(Survival::product_limit(&self.sorted, &censored)),
        }
    }

    /// What is left, on average, of a request that has decoded for `age_s` seconds, from the
    /// ended residences alone ([`Residence::remaining`] with nothing running).
    #[cfg(test)]
    pub fn residual_at(&self, age_s: Option<f64>) -> f64 {
        self.remaining(&DecodeAges::default()).at(age_s)
    }
}

/// What is left of a running request by its age: `E[D − a | D > a]`.
#[derive(Clone, Debug)]
pub struct Remaining {
    /// What is left of a request found running at random.
    random_s: f64,
    /// The residences' survival curve, once enough have ended.
    curve: Option<Survival>,
}

impl Remaining {
    /// What is left, on average, of a request that has decoded for `age_s` seconds. `None`
    /// (an age not known) is a request found running at random, [`Residence::residual_s`];
    /// so is every age until [`RECENT_RESIDENCES`] / 8 have ended. An age beyond all but a
    /// few residences is assumed to go on at least as long again (a heavy tail's remaining
    /// time grows with its age).
    pub fn at(&self, age_s: Option<f64>) -> f64 {
        let (Some(age), Some(curve)) = (age_s, &self.curve) else {
            return self.random_s;
        };
        curve
            .mean_beyond(age)
            .unwrap_or_else(|| age.max(self.random_s))
    }
}

/// A survival curve by the product-limit (Kaplan–Meier) estimate: a step function of time,
/// with what lies under it beyond each step.
#[derive(Clone, Debug)]
struct Survival {
    /// Distinct observation times, ascending.
    times: Vec<f64>,
    /// The survival from each time to the next (1 before the first).
    after: Vec<f64>,
    /// The area under the curve from each time on.
    area_from: Vec<f64>,
    /// Observations (ended or censored) later than each time.
    later: Vec<f64>,
    /// All observations.
    total: f64,
}

impl Survival {
    /// The curve of `ended` (ascending) with `censored` `(time, count)` observations that
    /// had lasted at least their time. Beyond the last observation, what survives is taken
    /// to last as long again.
    fn product_limit(ended: &[f32], censored: &[(f64, u32)]) -> Survival {
        // (time, ended, censored) at each distinct time.
        let mut points: Vec<(f64, f64, f64)> = Vec::with_capacity(ended.len() + censored.len());
        for &d in ended {
            match points.last_mut() {
                Some(p) if p.0 == f64::from(d) => p.1 += 1.0,
                _ => points.push((f64::from(d), 1.0, 0.0)),
            }
        }
        for &(t, n) in censored {
            points.push((t, 0.0, f64::from(n)));
        }
        points.sort_by(|a, b| a.0.total_cmp(&b.0));
        points.dedup_by(|b, a| {
            let same = a.0 == b.0;
            if same {
                a.1 += b.1;
                a.2 += b.2;
            }
            same
        });
        let total: f64 = points.iter().map(|p| p.1 + p.2).sum();
        let mut at_risk = total;
        let mut s = 1.0;
        let (mut times, mut after, mut later) = (Vec::new(), Vec::new(), Vec::new());
        for (t, ended, cens) in points {
            // Censored at `t` were still at risk of ending at `t`.
            if at_risk > 0.0 {
                s *= 1.0 - ended / at_risk;
            }
            at_risk -= ended + cens;
            times.push(t);
            after.push(s);
            later.push(at_risk);
        }
        let mut area_from = vec![0.0; times.len()];
        let mut area = times.last().zip(after.last()).map_or(0.0, |(t, s)| t * s);
        for i in (0..times.len()).rev() {
            if let Some(next) = times.get(i + 1) {
                area += after[i] * (next - times[i]);
            }
            area_from[i] = area;
        }
        Survival {
            times,
            after,
            area_from,
            later,
            total,
        }
    }

    /// `E[D − a | D > a]`, or `None` where fewer than [`MIN_TAIL`] observations lie beyond
    /// `a` (or none of the curve does).
    fn mean_beyond(&self, a: f64) -> Option<f64> {
        // Steps at or before `a`.
        let k = self.times.partition_point(|&t| t <= a);
        let (s, later) = match k {
            0 => (1.0, self.total),
            _ => (self.after[k - 1], self.later[k - 1]),
        };
        if later < MIN_TAIL || s <= 0.0 {
            return None;
        }
        // From `a` to the next step at the survival of `a`, then the area from that step on.
        let next = *self.times.get(k)?;
        let area = s * (next - a) + self.area_from[k];
        Some(area / s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
            r.observe(4.0, None, 1.0);
        }
        assert!((r.residual_s() - 2.0).abs() < 1e-9);
        // Nine in ten end after 1 s, one in ten after 91 s: the mean is 10 s, and what is left
        // of one found running E[D²] / 2E[D] = (0.9 × 1 + 0.1 × 8,281) / 20 = 41.45 s.
        let mut r = Residence::default();
        for i in 0..1000 {
            r.observe(if i % 10 == 9 { 91.0 } else { 1.0 }, None, 1.0);
        }
        assert!((r.mean_s() - 10.0).abs() < 1e-9);
        assert!((r.residual_s() - 41.45).abs() < 1e-9, "{}", r.residual_s());
    }

    #[test]
    fn what_is_left_of_an_answer_grows_with_its_age() {
        // Too few ended yet: every age is priced as one found at random.
        let mut r = Residence::default();
        r.observe(3.0, None, 1.0);
        assert_eq!(r.residual_at(Some(100.0)), r.residual_s());
        // Nine in ten end after 1 s, one in ten after 91 s.
        let mut r = Residence::default();
        for i in 0..1000 {
            r.observe(if i % 10 == 9 { 91.0 } else { 1.0 }, None, 1.0);
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
    fn answers_still_running_lengthen_what_is_left_while_the_router_is_young() {
        // The first 100 to end were all short (2 s); 20 others have run 24 s and go on.
        let mut r = Residence::default();
        for _ in 0..100 {
            r.observe(2.0, None, 1.0);
        }
        let mut running = DecodeAges::default();
        for _ in 0..20 {
            running.add(20.0, 1_000); // the 16–32 s bucket, counted at 24 s
        }
        // From the ended alone a new answer has 2 s left, and one 10 s old is past them all.
        let ended = r.remaining(&DecodeAges::default());
        assert!((ended.at(Some(0.5)) - 1.5).abs() < 1e-9);
        assert_eq!(ended.at(Some(10.0)), r.residual_s().max(10.0));
        // With the running ones: 100 of 120 end at 2 s, 20 last at least 24 s and as long
        // again past it. E[D] = 2 + (20/120) × (22 + 24) from 0; from 0.5, 1.5 + the same.
        let censored = r.remaining(&running);
        let expected = 1.5 + (20.0 / 120.0) * (22.0 + 24.0);
        assert!(
            (censored.at(Some(0.5)) - expected).abs() < 1e-9,
            "{}",
            censored.at(Some(0.5))
        );
        // One 10 s old is one of the long ones: 14 s to its censoring, then as long again.
        assert!((censored.at(Some(10.0)) - (14.0 + 24.0)).abs() < 1e-9);
        // An answer of unknown age is still one found at random.
        assert_eq!(censored.at(None), r.residual_s());
    }

    #[test]
    fn once_the_kept_residences_have_turned_over_the_running_ones_are_not_counted() {
        let mut r = Residence::default();
        for _ in 0..(RECENT_RESIDENCES + 1) {
            r.observe(2.0, None, 1.0);
        }
        let mut running = DecodeAges::default();
        for _ in 0..20 {
            running.add(20.0, 1_000);
        }
        assert_eq!(
            r.remaining(&running).at(Some(0.5)),
            r.remaining(&DecodeAges::default()).at(Some(0.5))
        );
    }

    #[test]
    fn product_limit_with_ties_and_censoring() {
        // Ended at 1, 1, 3; censored at 2 (one) and 4 (one). At risk 5 at 1: S = 3/5; 2 is
        // censored; at risk 2 at 3: S = 3/10; then one censored at 4, lasting 4 more.
        let s = Survival::product_limit(&[1.0, 1.0, 3.0], &[(2.0, 1), (4.0, 1)]);
        assert_eq!(s.times, vec![1.0, 2.0, 3.0, 4.0]);
        let after: Vec<f64> = s.after.iter().map(|x| (x * 1e9).round() / 1e9).collect();
        assert_eq!(after, vec![0.6, 0.6, 0.3, 0.3]);
        assert_eq!(s.later, vec![3.0, 2.0, 1.0, 0.0]);
        // Area: 1 + 0.6 × 2 + 0.3 × 1 + 0.3 × 4 = 3.7.
        assert!((s.area_from[0] + 1.0 - 3.7).abs() < 1e-9);
    }

    #[test]
    fn answers_write_tokens_at_the_rate_their_lengths_tell() {
        let mut r = Residence::default();
        assert_eq!(r.decode_tokens_per_s(), None, "no length told yet");
        r.observe(5.0, None, 0.99);
        r.observe(0.0, Some(1), 0.99);
        assert_eq!(r.decode_tokens_per_s(), None, "neither says how fast");
        // 101 tokens in 4 s and 301 in 8 s: 400 tokens after the first in 12 s.
        r.observe(4.0, Some(101), 0.99);
        r.observe(8.0, Some(301), 0.99);
        let rate = r.decode_tokens_per_s().unwrap_or_default();
        assert!((rate - 400.0 / 12.0).abs() < 1e-9, "{rate}");
    }

    #[test]
    fn residence_averages_plainly_then_forgets() {
        let mut r = Residence::default();
        assert_eq!(r.mean_s(), PRIOR_RESIDENCE_S);
        r.observe(2.0, None, 0.99);
        assert_eq!(r.mean_s(), 2.0, "the first observation replaces the prior");
        r.observe(4.0, None, 0.99);
        assert!((r.mean_s() - 3.0).abs() < 1e-12);
        for _ in 0..2000 {
            r.observe(10.0, None, 0.99);
        }
        assert!((r.mean_s() - 10.0).abs() < 1e-6);
        r.observe(f64::NAN, Some(9), 0.99);
        r.observe(-1.0, Some(9), 0.99);
        assert!((r.mean_s() - 10.0).abs() < 1e-6, "nonsense is ignored");
        assert_eq!(r.sorted.len(), RECENT_RESIDENCES);
        assert!(r.sorted.windows(2).all(|w| w[0] <= w[1]));
    }
}
