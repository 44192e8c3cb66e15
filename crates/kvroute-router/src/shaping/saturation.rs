//! How close the fleet is to its limits, 0–1, and which limit binds: the router's slots, its
//! queue, the engines' KV caches, and the predicted TTFT against the requests' targets.
//!
//! Each part is already a fraction of its own limit, so the whole is their **maximum**: the
//! fleet is as saturated as its tightest limit (an autoscaler scaling on the sum would add
//! replicas for a queue that is merely in use). The parts are published beside it
//! (`kvroute_saturation_part{part}`) so an operator sees which one binds.
//!
//! Pure: the server measures each part where it is known (the gate, the load readings at a
//! scrape, the decision) and this combines them.

/// One limit the fleet can reach.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Part {
    /// Router slots in use over `limits.max_concurrency`.
    Slots,
    /// Requests waiting over `limits.max_queue`.
    Queue,
    /// The engines' mean KV-cache usage (from their load readings).
    Kv,
    /// Predicted TTFT over the request's target, smoothed over recent requests with a target.
    Ttft,
}

impl Part {
    /// Every part, in label order.
    pub const ALL: [Part; 4] = [Part::Slots, Part::Queue, Part::Kv, Part::Ttft];

    /// Its place in [`Part::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }

    /// Its `part` label.
    pub fn label(self) -> &'static str {
        match self {
            Part::Slots => "slots",
            Part::Queue => "queue",
            Part::Kv => "kv",
            Part::Ttft => "ttft",
        }
    }
}

/// A part's value clamped to 0–1 (NaN counts as 0: a part that cannot be measured does not
/// scale the fleet).
pub fn clamp(v: f64) -> f64 {
    if v.is_nan() { 0.0 } else { v.clamp(0.0, 1.0) }
}

/// The whole: the largest part.
pub fn combine(parts: impl IntoIterator<Item = f64>) -> f64 {
    parts.into_iter().map(clamp).fold(0.0, f64::max)
}

/// Weight of the newest request in the smoothed TTFT part: about the last ten requests with a
/// target count (one late request does not scale a fleet, a run of them does).
pub const TTFT_SMOOTHING: f64 = 0.1;

/// The TTFT part after one more request with a target: `predicted / target` folded into
/// `previous` (exponentially weighted), each clamped to 0–1.
pub fn ttft_part(previous: f64, predicted_s: f64, target_s: f64) -> f64 {
    if target_s.is_nan() || target_s <= 0.0 || !predicted_s.is_finite() {
        return clamp(previous);
    }
    let now = clamp(predicted_s / target_s);
    clamp(previous + TTFT_SMOOTHING * (now - previous))
}

/// How long the TTFT part takes to fade to 1/e of its value when no request with a target
/// comes: a part that only moved when such requests arrived stayed at its last value through a
/// quiet hour, and an autoscaler reading it kept the replicas a burst had asked for.
pub const TTFT_FADE_S: f64 = 60.0;

/// The TTFT part over time: the smoothed ratio, fading while no request with a target comes.
/// Times are given (seconds on any clock that only goes forward), never read.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct TtftPart {
    value: f64,
    at_s: f64,
}

impl TtftPart {
    /// Its value at `now_s`: the last one, faded for the time since.
    pub fn at(&self, now_s: f64) -> f64 {
        let idle_s = (now_s - self.at_s).max(0.0);
        clamp(self.value * (-idle_s / TTFT_FADE_S).exp())
    }

    /// One more request with a target at `now_s`, folded into the faded value.
    pub fn observe(&mut self, now_s: f64, predicted_s: f64, target_s: f64) {
        self.value = ttft_part(self.at(now_s), predicted_s, target_s);
        self.at_s = now_s.max(self.at_s);
    }
}

/// The KV part: the mean usage of the engines that reported one; `None` when none did.
pub fn kv_part(usages: impl IntoIterator<Item = f64>) -> Option<f64> {
    let (sum, n) = usages
        .into_iter()
        .fold((0.0, 0u32), |(s, n), u| (s + clamp(u), n + 1));
    (n > 0).then(|| sum / f64::from(n))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_whole_is_the_tightest_part() {
        assert_eq!(combine([0.25, 0.5, 0.9, 0.0]), 0.9);
        assert_eq!(combine([f64::NAN, 2.0]), 1.0);
        assert_eq!(combine([]), 0.0);
        assert_eq!(Part::ALL.map(Part::label), ["slots", "queue", "kv", "ttft"]);
    }

    #[test]
    fn kv_is_the_mean_of_the_engines_that_report() {
        assert_eq!(kv_part([0.2, 0.6]), Some(0.4));
        assert_eq!(kv_part([]), None);
    }

    #[test]
    fn ttft_follows_a_run_of_late_requests_not_one() {
        let one = ttft_part(0.0, 2.0, 1.0);
        assert!((one - 0.1).abs() < 1e-12, "{one}");
        let mut p = 0.0;
        for _ in 0..50 {
            p = ttft_part(p, 0.9, 1.0);
        }
        assert!((p - 0.9).abs() < 0.01, "{p}");
        assert_eq!(ttft_part(0.3, 1.0, 0.0), 0.3, "no target: unchanged");
    }

    #[test]
    fn the_ttft_part_fades_while_no_request_with_a_target_comes() {
        let mut part = TtftPart::default();
        for i in 0..50 {
            part.observe(f64::from(i) * 0.1, 2.0, 1.0);
        }
        let busy = part.at(5.0);
        assert!(busy > 0.95, "{busy}");
        assert!((part.at(5.0 + TTFT_FADE_S) - busy / std::f64::consts::E).abs() < 1e-9);
        assert!(
            part.at(5.0 + 10.0 * TTFT_FADE_S) < 1e-4,
            "a quiet fleet reads unsaturated"
        );
        // A new request folds into the faded value, not the stale one.
        part.observe(5.0 + 10.0 * TTFT_FADE_S, 0.5, 1.0);
        assert!(part.at(5.0 + 10.0 * TTFT_FADE_S) < 0.06);
        // A clock read before the last request reads its value, not more.
        assert_eq!(part.at(0.0), part.at(5.0 + 10.0 * TTFT_FADE_S));
    }
}
