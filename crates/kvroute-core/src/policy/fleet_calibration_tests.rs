//! Unit tests of `fleet_calibration` (a file of their own to keep the module readable).

use super::*;

/// `worker`'s rates in a decision whose view is `partial`.
fn rates_in_view(fleet: &FleetCalibration<u32>, worker: u32, partial: bool) -> Rates {
    fleet.rates_in_view_of(std::iter::once(worker), partial)[0]
}

fn prior() -> Rates {
    Rates {
        seconds_per_token: 5e-5,
        step_cost_s: 5e-4,
        overhead_s: 0.02,
    }
}

/// A deterministic uniform draw in [-0.5, 0.5).
fn noise(x: &mut u64) -> f64 {
    *x = x
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (*x >> 33) as f64 / f64::from(1u32 << 31) - 0.5
}

fn spread(values: impl Iterator<Item = f64>) -> f64 {
    let v: Vec<f64> = values.collect();
    let max = v.iter().copied().fold(f64::MIN, f64::max);
    let min = v.iter().copied().fold(f64::MAX, f64::min);
    max / min
}

/// Identical workers, short prompts, nothing decoding (the idle fleet of the herding
/// report), ±30 % noise and an occasional 20× stall: their load price and their idle
/// predictions stay within 10 % of each other. Per-worker fits put them 3–8× apart.
#[test]
fn noise_does_not_separate_identical_workers() {
    let truth = Rates {
        seconds_per_token: 1.5e-5,
        step_cost_s: 0.0,
        overhead_s: 0.0165,
    };
    let mut fleet = FleetCalibration::new(prior(), 0.995);
    let mut per_worker: Vec<Calibrator> = (0..4).map(|_| Calibrator::new(prior(), 0.995)).collect();
    let mut x = 12345;
    for i in 0..400u64 {
        let tokens = 24.0 + (i % 7) as f64 * 8.0;
        let mut ttft = truth.predict(tokens, 0.0) * (1.0 + 0.6 * noise(&mut x));
        if i % 37 == 0 {
            ttft *= 20.0;
        }
        let w = (i % 4) as usize;
        fleet.observe(w, tokens, 0.0, ttft, false, false);
        per_worker[w].observe(tokens, 0.0, ttft);
    }
    let price = spread((0..4).map(|w| fleet.rates(w).seconds_per_token));
    assert!(price < 1.1, "pooled fit: load price spread {price}");
    let idle = spread((0..4).map(|w| fleet.rates(w).predict(40.0, 0.0)));
    assert!(idle < 1.1, "pooled fit: idle prediction spread {idle}");
    // What per-worker fits made of the same samples (the behaviour this replaces).
    let old = spread(per_worker.iter().map(|c| c.rates().seconds_per_token));
    assert!(old > 1.15, "per-worker fits: {old}");
}

#[test]
fn a_slower_worker_is_recognised_within_bounds() {
    let mut fleet = FleetCalibration::new(prior(), 0.995);
    for i in 0..3_000u64 {
        let tokens = 200.0 + ((i * 7919) % 4000) as f64;
        let w = (i % 3) as u32;
        // Worker 2 is 3× slower; worker 1 looks 100× faster (implausible).
        let slow = match w {
            2 => 3.0,
            1 => 0.01,
            _ => 1.0,
        };
        fleet.observe(w, tokens, 0.0, (tokens * 5e-5 + 0.02) * slow, false, false);
    }
    let f: Vec<f64> = (0..3).map(|w| fleet.factor(w)).collect();
    assert!(f[2] / f[0] > 1.1, "{f:?}");
    assert!(f[1] >= 1.0 / MAX_FACTOR && f[1] < f[0], "{f:?}");
    // A worker without evidence is scored as the fleet's mean, and so is a forgotten one.
    let unknown = fleet.factor(9);
    assert!(unknown > f[1] && unknown < f[2], "{unknown} vs {f:?}");
    fleet.forget(2);
    assert_eq!(fleet.factor(2), fleet.factor(9));
}

/// Observations of `workers` workers whose TTFTs are `slow(w)` times the truth, with
/// ±30 % noise and the model's misfit for each worker's work, `misfit` per cent apart.
fn observe_fleet(
    fleet: &mut FleetCalibration<u32>,
    (workers, n): (u32, u64),
    misfit: f64,
    slow: impl Fn(u32) -> f64,
) {
    let mut x = 777;
    for i in 0..n {
        let tokens = 200.0 + ((i * 7919) % 4000) as f64;
        let w = (i % u64::from(workers)) as u32;
        let misfit = 1.0 + misfit * f64::from(w % 3);
        let ttft = (tokens * 5e-5 + 0.02) * slow(w) * misfit * (1.0 + 0.6 * noise(&mut x));
        fleet.observe(w, tokens, 0.0, ttft, false, true);
    }
}

/// Half the fleet at half speed (another GPU type): each half is priced at its own speed,
/// not shrunk toward the other (the strong shrinkage alone priced the slow half 1.12×).
#[test]
fn a_mixed_fleet_is_priced_at_its_speeds() {
    let mut fleet = FleetCalibration::new(prior(), 0.995);
    observe_fleet(&mut fleet, (4, 2_000), 0.02, |w| {
        if w % 2 == 1 { 2.0 } else { 1.0 }
    });
    assert!(fleet.mixed());
    let ratio = fleet.factor(1) / fleet.factor(0);
    assert!(ratio > 1.7 && ratio <= MAX_FACTOR * MAX_FACTOR, "{ratio}");
    // Forgotten, the slow workers leave identical ones behind: one pool again.
    fleet.forget(1);
    fleet.forget(3);
    assert!(!fleet.mixed());
    assert!((fleet.factor(0) / fleet.factor(2) - 1.0).abs() < 0.05);
}

/// Workers 1.35× apart are not judged mixed from the start, but a fleet judged mixed at 2×
/// stays mixed when its slow half comes within 1.35× (between [`POOLED_SPREAD`] and
/// [`MIXED_SPREAD`]): the judgement does not flap as a slow worker's evidence changes.
#[test]
fn the_judgement_has_hysteresis() {
    let slow_half = |k: f64| move |w: u32| if w % 2 == 1 { k } else { 1.0 };
    let mut fresh = FleetCalibration::new(prior(), 0.995);
    observe_fleet(&mut fresh, (4, 4_000), 0.0, slow_half(1.35));
    assert!(!fresh.mixed());
    let mut was_mixed = FleetCalibration::new(prior(), 0.995);
    observe_fleet(&mut was_mixed, (4, 2_000), 0.0, slow_half(2.0));
    assert!(was_mixed.mixed());
    observe_fleet(&mut was_mixed, (4, 4_000), 0.0, slow_half(1.35));
    assert!(was_mixed.mixed());
    let ratio = was_mixed.factor(1) / was_mixed.factor(0);
    assert!(ratio > 1.2 && ratio < 1.5, "{ratio}");
}

/// Identical workers, one of which runs twice its prediction whenever requests were queued
/// ahead there (the model misjudging its queue, as a burst of siblings makes it): not a
/// mixed fleet, since only requests that ran alone judge the engines' speed.
#[test]
fn a_misjudged_queue_is_no_evidence_of_speed() {
    // `told`: whether the fleet is told which requests had a queue ahead of them.
    let judged = |told: bool| {
        let mut fleet = FleetCalibration::new(prior(), 0.995);
        let mut x = 99;
        for i in 0..4_000u64 {
            let tokens = 200.0 + ((i * 7919) % 4000) as f64;
            let w = (i % 4) as u32;
            let queued = i % 3 != 0;
            let misjudged = if w == 1 && queued { 2.0 } else { 1.0 };
            let ttft = (tokens * 5e-5 + 0.02) * misjudged * (1.0 + 0.6 * noise(&mut x));
            fleet.observe(w, tokens, 0.0, ttft, false, !(told && queued));
        }
        fleet.mixed()
    };
    assert!(!judged(true));
    // Judged on every sample alike, the same evidence would make a mixed fleet.
    assert!(judged(false));
}

/// Identical workers with noise and up to 10 % of misfit are not a mixed fleet (the
/// misfit stands out of the noise, but not by [`MIXED_SPREAD`]): their factors stay
/// within 2 % of each other.
#[test]
fn identical_workers_with_misfit_stay_one_pool() {
    let mut fleet = FleetCalibration::new(prior(), 0.995);
    observe_fleet(&mut fleet, (4, 4_000), 0.05, |_| 1.0);
    assert!(!fleet.mixed());
    let f = spread((0..4).map(|w| fleet.factor(w)));
    assert!(f < 1.02, "{f}");
}

#[test]
fn an_unobserved_worker_drifts_back_to_the_pool() {
    let mut fleet = FleetCalibration::new(prior(), 0.99);
    // Worker 0 looks slow for a while, then only workers 1 and 2 are observed.
    for i in 0..300u64 {
        let tokens = 100.0 + (i % 50) as f64 * 40.0;
        let w = (i % 3) as u32;
        let slow = if w == 0 { 3.0 } else { 1.0 };
        fleet.observe(w, tokens, 0.0, (tokens * 5e-5 + 0.02) * slow, false, false);
    }
    let before = fleet.factor(0);
    assert!(before > 1.03, "{before}");
    for i in 0..2_000u64 {
        let tokens = 100.0 + (i % 50) as f64 * 40.0;
        fleet.observe(
            1 + (i % 2) as u32,
            tokens,
            0.0,
            tokens * 5e-5 + 0.02,
            false,
            false,
        );
    }
    let after = fleet.factor(0);
    assert!(after - 1.0 < (before - 1.0) / 4.0, "{before} → {after}");
}

/// Worker 0 shares its engine with other router replicas' requests the view prices too
/// low: its TTFTs run 3× what its visible load predicts. On a partial view its own fit
/// prices that; on a complete view it is priced like its peers (those samples were no
/// evidence of speed), and a forgotten worker is scored like a newcomer.
#[test]
fn own_fits_decide_only_on_a_partial_view() {
    let mut fleet = FleetCalibration::new(prior(), 0.995);
    for i in 0..400u64 {
        let tokens = 200.0 + ((i * 7919) % 4000) as f64;
        let visible = tokens * 5e-5 + 0.02;
        fleet.observe(0, tokens, 0.0, 3.0 * visible, true, false);
        fleet.observe(1, tokens, 0.0, visible, false, false);
    }
    let predict = |w: u32, partial: bool| rates_in_view(&fleet, w, partial).predict(2000.0, 0.0);
    let truth = 2000.0 * 5e-5 + 0.02;
    assert!(
        (predict(0, true) / (3.0 * truth) - 1.0).abs() < 0.05,
        "{}",
        predict(0, true)
    );
    assert!(
        (predict(1, true) / truth - 1.0).abs() < 0.05,
        "{}",
        predict(1, true)
    );
    assert!((predict(0, false) / predict(1, false) - 1.0).abs() < 0.01);
    fleet.forget(0);
    assert_eq!(
        rates_in_view(&fleet, 0, true),
        rates_in_view(&fleet, 0, false)
    );
}

#[test]
fn the_pooled_fit_learns_the_rates() {
    let truth = Rates {
        seconds_per_token: 2.5e-5,
        step_cost_s: 4e-3,
        overhead_s: 0.02,
    };
    let mut fleet = FleetCalibration::new(prior(), 0.995);
    for i in 0..400u64 {
        let tokens = ((i * 7919) % 9000) as f64 + 100.0;
        let decoding = ((i * 31) % 64) as f64;
        fleet.observe(
            (i % 4) as u32,
            tokens,
            decoding,
            truth.predict(tokens, decoding),
            false,
            false,
        );
    }
    let r = fleet.rates(2);
    assert!(
        (r.seconds_per_token - truth.seconds_per_token).abs() < 1e-6,
        "{r:?}"
    );
    assert!((fleet.factor(0) - 1.0).abs() < 0.01);
}
