//! Bracketing searches for capacity at an SLO: the highest arrival-rate multiplier that still
//! passes, and the fewest workers that pass.
//!
//! Each probe is a whole simulation, so the searches spend probes sparingly (doubling to a
//! bracket, then bisection); and SLO attainment is only roughly monotone in load (a slightly
//! faster replay can line a burst up differently and pass where a slower one failed), so
//! nothing is inferred from monotonicity that was not measured: the answer is always a value
//! whose probe passed, and a failure that ends the rate search is re-checked once above it
//! before it is believed. Pure: the caller's `probe` runs the simulation.

use serde::Serialize;

/// One measurement: the SLO attainment at `at`, and whether it reached the target.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Probe<X> {
    /// The probed value (a rate multiplier or a worker count).
    pub at: X,
    /// Fraction of requests that met the SLO there.
    pub attainment: f64,
    /// Whether `attainment` reached the target.
    pub passed: bool,
}

/// What a search found.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Found<X> {
    /// The best value measured passing (the highest multiplier, the fewest workers), if any.
    pub best: Option<X>,
    /// The value measured failing next to `best` (just above the multiplier, just below the
    /// workers), if the search found one inside its bounds.
    pub limit: Option<X>,
    /// Every probe, in the order run.
    pub probes: Vec<Probe<X>>,
}

impl<X: Copy> Found<X> {
    /// The probe at `best`.
    pub fn best_probe(&self) -> Option<Probe<X>>
    where
        X: PartialEq,
    {
        let best = self.best?;
        self.probes.iter().rev().find(|p| p.at == best).copied()
    }
}

/// How the rate search runs.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RateSearch {
    /// Attainment a probe must reach to pass.
    pub target: f64,
    /// Bisection stops once the bracket's ends are within this relative distance (0.02 = 2 %).
    pub precision: f64,
    /// The smallest multiplier probed (the search halves from 1 toward it when 1 fails).
    pub min: f64,
    /// The largest multiplier probed (a policy passing here is reported at this bound).
    pub max: f64,
    /// Before a failure ends the search, the multiplier this factor above it is probed: if it
    /// passes, the failure was a blip and the search climbs on from there.
    pub confirm: f64,
}

/// The default re-check step: 10 % above a failure, well past the 2 % default precision, so
/// it tests a different load rather than the same boundary again.
pub const CONFIRM_STEP: f64 = 1.1;

/// Records every probe and judges it against the target.
struct Log<X, F> {
    target: f64,
    probe: F,
    probes: Vec<Probe<X>>,
}

impl<F> Log<f64, F> {
    /// The lowest multiplier above `x` measured failing.
    fn lowest_failure_above(&self, x: f64) -> Option<f64> {
        self.probes
            .iter()
            .filter(|p| !p.passed && p.at > x)
            .map(|p| p.at)
            .min_by(f64::total_cmp)
    }
}

impl<X: Copy, E, F: FnMut(X) -> Result<f64, E>> Log<X, F> {
    fn passes(&mut self, at: X) -> Result<bool, E> {
        let attainment = (self.probe)(at)?;
        let passed = attainment >= self.target;
        self.probes.push(Probe {
            at,
            attainment,
            passed,
        });
        Ok(passed)
    }
}

/// The highest multiplier in `[spec.min, spec.max]` whose probe passes: probes 1 (clamped to
/// the bounds), doubles while it passes or halves while it fails to bracket the boundary,
/// bisects the bracket geometrically to `spec.precision`, then re-checks `spec.confirm` above
/// the failing end; a pass there means the failure was a blip, and the search climbs on from
/// it (up to the lowest failure measured above, or doubling when none is). Terminates: each round either ends or raises the passing end by at least `spec.confirm`,
/// and it never exceeds `spec.max`.
pub fn max_multiplier<E>(
    spec: &RateSearch,
    probe: impl FnMut(f64) -> Result<f64, E>,
) -> Result<Found<f64>, E> {
    let mut log = Log {
        target: spec.target,
        probe,
        probes: Vec::new(),
    };
    let (min, max) = (spec.min.min(spec.max), spec.max);
    let start = 1.0_f64.clamp(min, max);
    let (mut lo, mut hi) = if log.passes(start)? {
        (start, None)
    } else {
        match halve_to_pass(&mut log, start, min)? {
            (Some(lo), hi) => (lo, Some(hi)),
            (None, hi) => return Ok(found(None, Some(hi), log)),
        }
    };
    loop {
        let fail = match hi {
            Some(fail) => fail,
            None => match double_to_fail(&mut log, &mut lo, max)? {
                Some(fail) => fail,
                None => return Ok(found(Some(lo), None, log)),
            },
        };
        let (pass, fail) = bisect(&mut log, lo, fail, spec.precision)?;
        let check = (fail * spec.confirm).min(max);
        if spec.confirm <= 1.0 || check <= fail || !log.passes(check)? {
            return Ok(found(Some(pass), Some(fail), log));
        }
        // Climb on from the pass, bracketed by a failure already measured above it if any.
        (lo, hi) = (check, log.lowest_failure_above(check));
    }
}

fn found<X, F>(best: Option<X>, limit: Option<X>, log: Log<X, F>) -> Found<X> {
    Found {
        best,
        limit,
        probes: log.probes,
    }
}

/// Halves from the failing `start` toward `min` until a probe passes: (the pass, the lowest
/// failure above it), or (None, the lowest failure) when nothing down to `min` passes.
fn halve_to_pass<E, F: FnMut(f64) -> Result<f64, E>>(
    log: &mut Log<f64, F>,
    start: f64,
    min: f64,
) -> Result<(Option<f64>, f64), E> {
    let mut hi = start;
    while hi > min {
        let x = (hi / 2.0).max(min);
        if log.passes(x)? {
            return Ok((Some(x), hi));
        }
        hi = x;
    }
    Ok((None, hi))
}

/// Doubles from the passing `lo` (raised as probes pass) until a probe fails, returning it,
/// or None when `max` passes.
fn double_to_fail<E, F: FnMut(f64) -> Result<f64, E>>(
    log: &mut Log<f64, F>,
    lo: &mut f64,
    max: f64,
) -> Result<Option<f64>, E> {
    while *lo < max {
        let x = (*lo * 2.0).min(max);
        if !log.passes(x)? {
            return Ok(Some(x));
        }
        *lo = x;
    }
    Ok(None)
}

/// Bisects (geometrically: the precision is relative) between the passing `lo` and the failing
/// `hi` until `hi / lo <= 1 + precision`; returns the final bracket.
fn bisect<E, F: FnMut(f64) -> Result<f64, E>>(
    log: &mut Log<f64, F>,
    mut lo: f64,
    mut hi: f64,
    precision: f64,
) -> Result<(f64, f64), E> {
    // A non-positive precision would never stop; 1e-6 is far below any simulation's noise.
    let precision = precision.max(1e-6);
    while hi / lo > 1.0 + precision {
        let mid = (lo * hi).sqrt();
        if log.passes(mid)? {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    Ok((lo, hi))
}

/// The fewest workers in `1..=max` whose probe passes: probes 1, 2, 4, … until one passes,
/// then bisects between the last failure and that pass down to adjacent counts. The answer is
/// a count measured passing with the next smaller one measured failing (or 1).
pub fn min_workers<E>(
    target: f64,
    max: u32,
    probe: impl FnMut(u32) -> Result<f64, E>,
) -> Result<Found<u32>, E> {
    let mut log = Log {
        target,
        probe,
        probes: Vec::new(),
    };
    let max = max.max(1);
    let (mut fail, mut pass) = (0u32, None);
    let mut n = 1u32;
    loop {
        if log.passes(n)? {
            pass = Some(n);
            break;
        }
        fail = n;
        if n >= max {
            break;
        }
        n = n.saturating_mul(2).min(max);
    }
    let Some(mut pass) = pass else {
        return Ok(found(None, Some(fail), log));
    };
    while pass - fail > 1 {
        let mid = fail + (pass - fail) / 2;
        if log.passes(mid)? {
            pass = mid;
        } else {
            fail = mid;
        }
    }
    Ok(found(Some(pass), (fail > 0).then_some(fail), log))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::convert::Infallible;

    fn spec(precision: f64) -> RateSearch {
        RateSearch {
            target: 0.9,
            precision,
            min: 1.0 / 1024.0,
            max: 1024.0,
            confirm: CONFIRM_STEP,
        }
    }

    /// Runs the rate search on a synthetic attainment curve.
    fn rate(spec: &RateSearch, curve: impl Fn(f64) -> f64) -> Found<f64> {
        let ok: Result<_, Infallible> = max_multiplier(spec, |x| Ok(curve(x)));
        ok.unwrap_or_else(|e| match e {})
    }

    /// A step at `edge`: 0.95 at or below it, 0.5 above.
    fn step(edge: f64) -> impl Fn(f64) -> f64 {
        move |x| if x <= edge { 0.95 } else { 0.5 }
    }

    /// The answer is a measured pass, the bracket's other end a measured failure within the
    /// precision, and nothing is probed outside the bounds.
    fn check_bracket(f: &Found<f64>, s: &RateSearch) -> (f64, f64) {
        let best = f.best.expect("a pass");
        assert!(f.best_probe().is_some_and(|p| p.passed), "{f:?}");
        let limit = f.limit.expect("a failure");
        assert!(f.probes.iter().any(|p| p.at == limit && !p.passed), "{f:?}");
        assert!(
            limit > best && limit / best <= 1.0 + s.precision + 1e-12,
            "{f:?}"
        );
        assert!(f.probes.iter().all(|p| p.at >= s.min && p.at <= s.max));
        (best, limit)
    }

    #[test]
    fn finds_the_boundary_of_a_step_and_of_a_smooth_curve() {
        let s = spec(0.02);
        let (best, limit) = check_bracket(&rate(&s, step(3.7)), &s);
        assert!(
            best <= 3.7 && limit > 3.7 && best >= 3.7 / 1.02,
            "{best} {limit}"
        );
        // 1 / (1 + (x/5)^4) crosses 0.9 at 5 / sqrt(3).
        let edge = 5.0 / 3.0_f64.sqrt();
        let f = rate(&s, |x| 1.0 / (1.0 + (x / 5.0).powi(4)));
        let (best, limit) = check_bracket(&f, &s);
        assert!(best <= edge && limit > edge, "{best} {limit}");
    }

    #[test]
    fn halves_when_the_recorded_rate_already_fails() {
        let s = spec(0.02);
        let f = rate(&s, step(0.3));
        let (best, _) = check_bracket(&f, &s);
        assert!((0.3 / 1.02..=0.3).contains(&best), "{best}");
        assert_eq!(f.probes[0].at, 1.0);
        assert!(!f.probes[0].passed);
    }

    /// A failure inside the passing range (noise) is re-checked above and climbed past; the
    /// answer is still a multiplier measured passing.
    #[test]
    fn climbs_past_a_non_monotone_blip() {
        let s = spec(0.02);
        let blip = |x: f64| {
            if (3.9..=4.1).contains(&x) {
                0.85
            } else {
                step(6.0)(x)
            }
        };
        let f = rate(&s, blip);
        let (best, _) = check_bracket(&f, &s);
        assert!((6.0 / 1.02..=6.0).contains(&best), "{best}: {f:?}");
        // The blip was measured failing and then passed over.
        assert!(f.probes.iter().any(|p| p.at == 4.0 && !p.passed));
        // Without the re-check the search would stop under the blip.
        let naive = rate(&RateSearch { confirm: 1.0, ..s }, blip);
        assert!(naive.best.is_some_and(|b| b < 4.0), "{naive:?}");
    }

    #[test]
    fn tighter_precision_costs_probes_and_narrows_the_bracket() {
        let mut last = 0;
        for p in [0.2, 0.05, 0.02, 0.005] {
            let s = spec(p);
            let f = rate(&s, step(13.0));
            check_bracket(&f, &s);
            assert!(f.probes.len() > last, "{p}: {}", f.probes.len());
            last = f.probes.len();
        }
    }

    #[test]
    fn stops_at_the_bounds() {
        let s = spec(0.02);
        let all = rate(&s, |_| 1.0);
        assert_eq!((all.best, all.limit), (Some(1024.0), None));
        assert_eq!(all.probes.len(), 11, "1, 2, 4, …, 1024");
        let none = rate(&s, |_| 0.0);
        assert_eq!((none.best, none.limit), (None, Some(1.0 / 1024.0)));
        assert_eq!(none.probes.len(), 11, "1, 1/2, …, 1/1024");
        // Exactly the target passes.
        assert_eq!(rate(&s, |_| 0.9).best, Some(1024.0));
    }

    /// Whatever the curve (here pass/fail drawn from a hash of the multiplier, the worst
    /// noise), the search ends after a bounded number of probes with a measured pass.
    #[test]
    fn terminates_on_noise() {
        for seed in 0..50u64 {
            let noise = |x: f64| {
                let h = (x.to_bits() ^ seed).wrapping_mul(0x9E37_79B9_7F4A_7C15);
                if (h >> 61) < 5 { 0.95 } else { 0.2 }
            };
            let f = rate(&spec(0.02), noise);
            assert!(f.probes.len() < 400, "seed {seed}: {}", f.probes.len());
            if f.best.is_some() {
                assert!(f.best_probe().is_some_and(|p| p.passed));
            }
        }
    }

    #[test]
    fn an_error_stops_the_search() {
        let mut calls = 0;
        let r = max_multiplier(&spec(0.02), |x| {
            calls += 1;
            if x > 2.0 { Err("boom") } else { Ok(1.0) }
        });
        assert_eq!(r, Err("boom"));
        assert_eq!(calls, 3);
    }

    fn workers(needed: u32, max: u32) -> Found<u32> {
        let ok: Result<_, Infallible> =
            min_workers(0.9, max, |n| Ok(if n >= needed { 0.95 } else { 0.1 }));
        ok.unwrap_or_else(|e| match e {})
    }

    #[test]
    fn finds_the_fewest_workers() {
        let f = workers(11, 256);
        assert_eq!((f.best, f.limit), (Some(11), Some(10)));
        let at: Vec<u32> = f.probes.iter().map(|p| p.at).collect();
        assert_eq!(at, [1, 2, 4, 8, 16, 12, 10, 11]);
        for needed in 1..=70 {
            let f = workers(needed, 256);
            assert_eq!(f.best, Some(needed));
            assert_eq!(f.limit, (needed > 1).then(|| needed - 1));
        }
        assert_eq!(workers(1, 256).probes.len(), 1);
        let none = workers(300, 256);
        assert_eq!((none.best, none.limit), (None, Some(256)));
        assert_eq!(none.probes.last().map(|p| p.at), Some(256));
    }
}
