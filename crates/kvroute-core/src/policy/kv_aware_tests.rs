//! Unit tests of `kv_aware` (a file of their own to keep the policy readable).

use super::super::testing::idle;
use super::*;

pub(super) fn req(tokens: u64) -> RouteRequest {
    RouteRequest {
        prompt_tokens: tokens,
        blocks: (tokens / 16) as u32,
        block_size: 16,
        kv_bytes_per_token: 0,
        warm_prefix_rate: 0.0,
    }
}

/// A first token on `worker` after `ttft_s` for `tokens` uncached tokens with nothing queued
/// or decoding there, with `unseen` other replicas' requests in its view.
fn alone(worker: u32, tokens: u64, ttft_s: f64, unseen: u64) -> Observation {
    Observation {
        worker: WorkerId(worker),
        uncached_tokens: tokens,
        queued_tokens: 0,
        decoding: 0,
        prefilling: 0,
        unseen_in_flight: unseen,
        ttft_s,
        loaded_tokens: [0, 0],
        kv_bytes_per_token: 0,
        room_wait_s: 0.0,
    }
}

pub(super) fn policy() -> KvAware {
    KvAware::new(
        KvAwareConfig {
            calibrate: false,
            ..Default::default()
        },
        1,
    )
}

#[test]
fn prefers_the_warm_worker_when_queues_are_equal() {
    let mut c = idle(3);
    c[2].overlap_blocks = 400;
    let d = policy().choose(&req(8000), &c).unwrap();
    assert_eq!(d.chosen, 2);
    let p = d.predicted_ttft_s;
    assert!(p[2].unwrap() < p[0].unwrap());
}

#[test]
fn bypasses_a_warm_worker_whose_queue_costs_more_than_the_prefix_saves() {
    let mut c = idle(2);
    c[0].overlap_blocks = 100; // saves 1,600 tokens
    c[0].load.queued_prefill_tokens = 20_000; // but 20,000 are queued ahead
    assert_eq!(policy().choose(&req(2000), &c).unwrap().chosen, 1);
    // With a short queue the same prefix wins.
    c[0].load.queued_prefill_tokens = 500;
    assert_eq!(policy().choose(&req(2000), &c).unwrap().chosen, 0);
}

#[test]
fn on_engines_that_cap_long_prefills_a_session_stays_beside_one() {
    // Worker 0 holds 96k of the prompt's 100k tokens, and one request there still has 500k
    // tokens to prefill; worker 1 is cold and idle.
    let mut c = idle(2);
    c[0].overlap_blocks = 6_000;
    c[0].load.in_flight = 1;
    c[0].load.queued_prefill_tokens = 500_000;
    // Uncapped, the engine runs that prefill first: recomputing elsewhere is faster.
    let d = policy().choose(&req(100_000), &c).unwrap();
    assert_eq!(d.chosen, 1);
    // Capped at 4,096 tokens a step, the 4k left share one step with a chunk of it.
    let capped = KvAware::new(
        KvAwareConfig {
            calibrate: false,
            long_prefill_token_threshold: 4_096,
            ..Default::default()
        },
        1,
    );
    let d = capped.choose(&req(100_000), &c).unwrap();
    assert_eq!(d.chosen, 0);
    let warm = d.predicted_ttft_s[0].unwrap();
    assert!(warm < 1.0, "{warm}");
}

#[test]
fn a_capped_queue_is_learned_as_the_chunks_it_ran_beside() {
    // Calibration regresses TTFT on the same tokens the prediction counts: an observed first
    // token 0.5 s after a 4k prompt routed behind a 500k prefill on a capped engine is a
    // fast worker's 8k tokens, not a fast worker's 504k.
    let config = KvAwareConfig {
        long_prefill_token_threshold: 4_096,
        ..Default::default()
    };
    let p = KvAware::new(config, 1);
    let before = p.rates(WorkerId(0)).seconds_per_token;
    for _ in 0..200 {
        p.observe(&Observation {
            worker: WorkerId(0),
            uncached_tokens: 4_000,
            queued_tokens: 500_000,
            decoding: 0,
            prefilling: 1,
            unseen_in_flight: 0,
            ttft_s: 0.5,
            loaded_tokens: [0, 0],
            kv_bytes_per_token: 0,
            room_wait_s: 0.0,
        });
    }
    let after = p.rates(WorkerId(0)).seconds_per_token;
    // Learned on about 8k tokens, 0.5 s is some 60 µs a token, near the prior's 50; learned
    // on the whole 504k queue it would read as 1 µs a token, fifty times too fast.
    assert!(after > before * 0.5, "{before} -> {after}");
    assert!(after < 1.0 / 10_000.0, "{after}");
}

#[test]
fn reconfigured_weights_apply_to_the_next_decision() {
    let mut c = idle(2);
    c[0].overlap_blocks = 100; // saves 1,600 tokens
    c[0].load.queued_prefill_tokens = 1_000;
    let p = policy();
    assert_eq!(p.choose(&req(2000), &c).unwrap().chosen, 0);
    let before = p.choose(&req(2000), &c).unwrap().predicted_ttft_s[1].unwrap();
    // A prior ten times slower changes every prediction at once.
    p.reconfigure(&crate::policy::PolicySettings {
        kv_aware: KvAwareConfig {
            prefill_rate_tokens_per_s: 2_000.0,
            calibrate: false,
            ..Default::default()
        },
        ..Default::default()
    });
    let after = p.choose(&req(2000), &c).unwrap().predicted_ttft_s[1].unwrap();
    assert!(after > 5.0 * before, "{before} → {after}");
    assert_eq!(p.config().prefill_rate_tokens_per_s, 2_000.0);
}

#[test]
fn unique_prompts_spread_by_in_flight_then_randomly() {
    let p = policy();
    let mut c = idle(3);
    c[0].load.in_flight = 2;
    c[0].load.decoding = 0;
    let mut hits = [0; 3];
    for _ in 0..300 {
        hits[p.choose(&req(1000), &c).unwrap().chosen] += 1;
    }
    assert_eq!(hits[0], 0, "{hits:?}");
    assert!(hits[1] > 100 && hits[2] > 100, "{hits:?}");
}

#[test]
fn deterministic_for_a_seed() {
    let run = |seed| {
        let p = KvAware::new(KvAwareConfig::default(), seed);
        (0..50)
            .map(|_| p.choose(&req(100), &idle(4)).unwrap().chosen)
            .collect::<Vec<_>>()
    };
    assert_eq!(run(5), run(5));
    assert_ne!(run(5), run(6));
}

#[test]
fn calibration_changes_the_trade_off() {
    let p = KvAware::new(KvAwareConfig::default(), 1);
    // Worker 0 turns out 3× slower than worker 1 (the two observed alternately).
    for i in 0..400u64 {
        let (slot, rate) = if i % 2 == 0 {
            (0, 2_000.0)
        } else {
            (1, 6_000.0)
        };
        let tokens = 500 + (i / 2) * 20;
        p.observe(&Observation {
            worker: WorkerId(slot),
            uncached_tokens: tokens,
            queued_tokens: 0,
            decoding: i % 4,
            prefilling: 0,
            unseen_in_flight: 0,
            ttft_s: tokens as f64 / rate + 0.02,
            loaded_tokens: [0, 0],
            kv_bytes_per_token: 0,
            room_wait_s: 0.0,
        });
    }
    // Shrunk hard toward the pool (identical replicas are the rule), but recognised.
    let (slow, fast) = (p.rates(WorkerId(0)), p.rates(WorkerId(1)));
    assert!(
        slow.seconds_per_token > 1.05 * fast.seconds_per_token,
        "{slow:?} {fast:?}"
    );
    // A slightly warm but slow worker 0 loses to a cold fast worker 1; without the
    // calibration the warm one wins.
    let mut c = idle(2);
    c[0].overlap_blocks = 20;
    assert_eq!(p.choose(&req(8000), &c).unwrap().chosen, 1);
    assert_eq!(policy().choose(&req(8000), &c).unwrap().chosen, 0);
}

#[test]
fn a_forgotten_worker_is_scored_as_a_newcomer() {
    let p = KvAware::new(KvAwareConfig::default(), 1);
    for i in 0..400u64 {
        let slot = (i % 2) as u32;
        let slow = if slot == 0 { 1.8 } else { 1.0 };
        p.observe(&Observation {
            worker: WorkerId(slot),
            uncached_tokens: 500 + i * 10,
            queued_tokens: 0,
            decoding: 0,
            prefilling: 0,
            unseen_in_flight: 0,
            ttft_s: slow * ((500 + i * 10) as f64 / 20_000.0 + 0.02),
            loaded_tokens: [0, 0],
            kv_bytes_per_token: 0,
            room_wait_s: 0.0,
        });
    }
    let slow = p.rates(WorkerId(0));
    assert!(slow.seconds_per_token > p.rates(WorkerId(1)).seconds_per_token);
    p.forget(WorkerId(0));
    assert_ne!(p.rates(WorkerId(0)), slow);
    assert_eq!(p.rates(WorkerId(0)), p.rates(WorkerId(7)));
}

#[test]
fn an_uncalibrated_worker_is_scored_like_its_calibrated_peers() {
    let p = KvAware::new(KvAwareConfig::default(), 1);
    // Workers 0 and 1 turn out 3× faster than the prior; worker 2 is new.
    for slot in [0, 1] {
        let worker = WorkerId(slot);
        for i in 0..100u64 {
            let tokens = 500 + i * 37;
            p.observe(&Observation {
                worker,
                uncached_tokens: tokens,
                queued_tokens: 0,
                decoding: 0,
                prefilling: 0,
                unseen_in_flight: 0,
                ttft_s: tokens as f64 / 60_000.0 + 0.02,
                loaded_tokens: [0, 0],
                kv_bytes_per_token: 0,
                room_wait_s: 0.0,
            });
        }
    }
    let r = p.rates(WorkerId(2));
    assert!((r.seconds_per_token - 1.0 / 60_000.0).abs() < 2e-6, "{r:?}");
    // Idle and cold, the newcomer ties with its peers and wins on fewer in-flight.
    let mut c = idle(3);
    c[0].load.in_flight = 1;
    c[1].load.in_flight = 1;
    assert_eq!(p.choose(&req(4000), &c).unwrap().chosen, 2);
}

#[test]
fn decode_stall_balances_equal_hits() {
    let p = policy();
    let mut c = idle(2);
    c[0].overlap_blocks = 490;
    c[1].overlap_blocks = 490;
    // Worker 0 would give this request the lower TTFT (0.030 s vs 0.033 s), but its
    // prefill would stall the 4 sequences decoding there by ~0.028 s each.
    c[0].load.decoding = 4;
    c[1].load.queued_prefill_tokens = 100;
    let d = p.choose(&req(8000), &c).unwrap();
    assert_eq!(d.chosen, 1, "{d:?}");
    let ttft = |i: usize| d.predicted_ttft_s[i].unwrap();
    assert!(ttft(0) < ttft(1));
    // Own TTFT alone prefers worker 0.
    let ttft_only = KvAware::new(
        KvAwareConfig {
            decode_weight: 0.0,
            calibrate: false,
            ..Default::default()
        },
        1,
    );
    assert_eq!(ttft_only.choose(&req(8000), &c).unwrap().chosen, 0);
}

#[test]
fn temperature_samples_but_prefers_the_best() {
    let p = KvAware::new(
        KvAwareConfig {
            temperature: 0.5,
            calibrate: false,
            ..Default::default()
        },
        3,
    );
    let mut c = idle(2);
    c[0].overlap_blocks = 150;
    let mut hits = [0; 2];
    for _ in 0..400 {
        hits[p.choose(&req(8000), &c).unwrap().chosen] += 1;
    }
    assert!(hits[0] > hits[1] && hits[1] > 0, "{hits:?}");
}

/// A deterministic uniform draw in [-0.5, 0.5) (a 64-bit LCG).
fn draw(state: &mut u64) -> f64 {
    *state = state
        .wrapping_mul(6_364_136_223_846_793_005)
        .wrapping_add(1_442_695_040_888_963_407);
    (*state >> 11) as f64 / (1u64 << 53) as f64 - 0.5
}

/// Issue 15, goal 1: four identical idle workers get sequential short prompts, routed by the
/// policy, whose TTFTs carry ±25 % noise: they must rotate (the noise decided every idle
/// decision before, and the worker whose samples happened to be lucky got them all); then a
/// burst of
/// 400 unique prompts is routed with the router's own load accounting (each decision admits
/// on a [`crate::fleet::Load`]; no first token arrives during the burst, as with non-streaming
/// clients or a burst faster than a prefill step; nothing ends).
/// The split must stay within ±15 % of even: noise is no preference, and the load booked by
/// earlier decisions must count for the later ones.
#[test]
fn a_burst_after_noisy_calibration_splits_evenly() {
    use crate::fleet::{Load, LoadGuard};
    use std::sync::Arc;

    const WORKERS: usize = 4;
    const BURST: usize = 400;
    let p = KvAware::new(KvAwareConfig::default(), 7);
    let loads: Vec<Arc<Load>> = (0..WORKERS).map(|_| Arc::new(Load::default())).collect();
    let snapshot = |loads: &[Arc<Load>]| {
        let mut c = idle(WORKERS);
        for (c, load) in c.iter_mut().zip(loads) {
            c.load = load.snapshot();
        }
        c
    };
    // Sequential requests on the idle fleet, each routed by the policy and observed.
    let mut rng = 2026u64;
    let mut calibration = [0usize; WORKERS];
    for i in 0..240u64 {
        let tokens = 24 + (i % 7) * 8;
        let w = p.choose(&req(tokens), &snapshot(&loads)).unwrap().chosen;
        calibration[w] += 1;
        drop(loads[w].admit(tokens, tokens));
        let noise = 0.5 * draw(&mut rng);
        p.observe(&Observation {
            worker: WorkerId(w as u32),
            uncached_tokens: tokens,
            queued_tokens: 0,
            decoding: 0,
            prefilling: 0,
            unseen_in_flight: 0,
            ttft_s: (0.0165 + 1.5e-5 * tokens as f64) * (1.0 + noise),
            loaded_tokens: [0, 0],
            kv_bytes_per_token: 0,
            room_wait_s: 0.0,
        });
    }
    let even = 240.0 / WORKERS as f64;
    for (w, &n) in calibration.iter().enumerate() {
        assert!(
            (n as f64 - even).abs() <= 0.15 * even,
            "sequential: worker {w} got {n}: {calibration:?}"
        );
    }
    let mut routed: Vec<LoadGuard> = Vec::new();
    let mut counts = [0usize; WORKERS];
    for _ in 0..BURST {
        let chosen = p.choose(&req(48), &snapshot(&loads)).unwrap().chosen;
        counts[chosen] += 1;
        routed.push(loads[chosen].admit(48, 48));
    }
    let even = (BURST / WORKERS) as f64;
    for (w, &n) in counts.iter().enumerate() {
        assert!(
            (n as f64 - even).abs() <= 0.15 * even,
            "worker {w} got {n}: {counts:?}"
        );
    }
}

/// Worker 0's TTFTs ran 3× what its visible load predicted while other router replicas' requests
/// were in the view (load it could not see); worker 1's matched. A decision on a partial view
/// scores both with their own fits and avoids worker 0 despite its cached prefix; on a complete
/// view those samples are no evidence of speed, and the prefix wins.
#[test]
fn a_partial_view_scores_every_worker_with_its_own_fit() {
    let p = KvAware::new(KvAwareConfig::default(), 3);
    for i in 0..64u64 {
        for (slot, slow) in [(0u32, 3.0), (1, 1.0)] {
            let tokens = 500 + i * 10;
            p.observe(&alone(
                slot,
                tokens,
                slow * (tokens as f64 / 20_000.0 + 0.02),
                2,
            ));
        }
    }
    let mut c = idle(2);
    c[0].overlap_blocks = 20; // 320 of 1,000 tokens cached
    assert_eq!(p.choose(&req(1000), &c).unwrap().chosen, 0);
    c[1].load.unseen_in_flight = 1;
    c[1].load.in_flight = 1;
    c[1].load.decoding = 1;
    assert_eq!(p.choose(&req(1000), &c).unwrap().chosen, 1);
}

/// A new session goes where writing it evicts nothing that returns, even past a worker with a
/// small shared prefix; with eviction pricing off it follows the prefix.
#[test]
fn places_a_session_where_it_evicts_no_returning_blocks() {
    let mut c = idle(2);
    c[0].overlap_blocks = 20; // a shared system prompt
    c[0].cache.returning_evictions = 400.0; // but a full cache of sessions that come back
    assert_eq!(policy().choose(&req(8000), &c).unwrap().chosen, 1);
    let blind = KvAware::new(
        KvAwareConfig {
            calibrate: false,
            eviction_weight: 0.0,
            ..Default::default()
        },
        1,
    );
    assert_eq!(blind.choose(&req(8000), &c).unwrap().chosen, 0);
    // The cost says why; the predicted TTFT is the request's own.
    let d = policy().choose(&req(8000), &c).unwrap();
    let evicting = d.cost[0].unwrap() - d.predicted_ttft_s[0].unwrap();
    assert!(
        (evicting - 400.0 * 16.0 / 20_000.0).abs() < 1e-9,
        "{evicting}"
    );
}

/// A returning session stays home when its home has room, although the other worker is idle.
#[test]
fn a_session_stays_where_it_fits() {
    let mut c = idle(2);
    c[0].overlap_blocks = 450;
    c[0].load.queued_prefill_tokens = 2_000;
    c[1].cache.returning_evictions = 500.0; // moving would evict a returning session
    assert_eq!(policy().choose(&req(8000), &c).unwrap().chosen, 0);
}

#[test]
fn a_session_home_wins_ties_but_is_never_a_pin() {
    let p = policy();
    // Idle fleet, nothing cached: every cost ties, and the session's home takes the request,
    // ahead of workers with fewer requests admitted so far.
    let mut c = idle(4);
    c[2].session_home = true;
    c[2].load.admitted = 50;
    for _ in 0..20 {
        assert_eq!(p.choose(&req(160), &c).unwrap().chosen, 2);
    }
    // Among ties, the worker with fewer requests in flight still comes first.
    c[2].load.in_flight = 1;
    assert_ne!(p.choose(&req(160), &c).unwrap().chosen, 2);
    c[2].load.in_flight = 0;
    // The home with a queue that costs more than the tie window loses to an idle worker.
    c[2].load.queued_prefill_tokens = 4_000;
    assert_ne!(p.choose(&req(160), &c).unwrap().chosen, 2);
    // A warm worker elsewhere beats a home that holds nothing of the prompt.
    let mut c = idle(2);
    c[0].session_home = true;
    c[1].overlap_blocks = 200;
    assert_eq!(p.choose(&req(4000), &c).unwrap().chosen, 1);
}

/// Four workers; the first is computing a sibling's 4,096-token prefix (its booking queued),
/// every worker has `base` prefill tokens of other work queued.
fn siblings_fleet(base: u64) -> Vec<Candidate> {
    let mut c = idle(4);
    for w in &mut c {
        w.load.queued_prefill_tokens = base;
    }
    c[0].load.queued_prefill_tokens += 4_224;
    c[0].cache.running_prefix_blocks = 256; // 4,096 tokens at block size 16
    c
}

#[test]
fn a_sibling_spreads_below_saturation_and_joins_the_first_at_saturation() {
    let p = policy();
    // A fleet with room: the first sibling's queue is worth avoiding, its prefix is not
    // written yet (a sibling started beside it would compute it again).
    assert_ne!(p.choose(&req(4_224), &siblings_fleet(0)).unwrap().chosen, 0);
    // Every worker has at least twice the prompt queued: the sibling starts after the prefix
    // is written wherever it goes, and computing it again elsewhere is work every later
    // request waits for.
    let saturated = siblings_fleet(50_000);
    let d = p.choose(&req(4_224), &saturated).unwrap();
    assert_eq!(d.chosen, 0, "{:?}", d.cost);
    // Its predicted TTFT there counts only the part the first one is not computing.
    let p0 = d.predicted_ttft_s[0].unwrap();
    let p1 = d.predicted_ttft_s[1].unwrap();
    assert!((p0 - p1).abs() < 0.01, "{p0} against {p1}");
}

#[test]
fn saturation_weight_zero_weighs_only_the_requests_own_latency() {
    let p = KvAware::new(
        KvAwareConfig {
            calibrate: false,
            saturation_weight: 0.0,
            ..Default::default()
        },
        1,
    );
    // Equal predicted TTFTs everywhere: the tie goes to a worker with fewer in flight, not
    // to the one computing the prefix.
    let mut c = siblings_fleet(50_000);
    c[0].load.in_flight = 1;
    assert_ne!(p.choose(&req(4_224), &c).unwrap().chosen, 0);
}

#[test]
fn a_hot_prefix_is_copied_before_its_holders_queue_costs_one_request_more() {
    // Worker 0 holds the prompt's 8,000-token prefix behind a 0.3 s queue; worker 1 is idle.
    // For this request alone waiting is cheaper (0.3 s against 0.4 s of copy).
    let mut c = idle(2);
    c[0].overlap_blocks = 500;
    c[0].load.queued_prefill_tokens = 6_000;
    c[0].cache.sharing_requests = 3;
    let mut r = req(8_256);
    assert_eq!(policy().choose(&r, &c).unwrap().chosen, 0);
    // Twenty requests a second ask for that prefix: six arrive while the queue drains.
    r.warm_prefix_rate = 20.0;
    let d = policy().choose(&r, &c).unwrap();
    assert_eq!(d.chosen, 1);
    // The same rate from one session's turns in a row (none of them in flight now) is no
    // one arriving meanwhile: no copy.
    c[0].cache.sharing_requests = 0;
    assert_eq!(policy().choose(&r, &c).unwrap().chosen, 0);
    c[0].cache.sharing_requests = 3;
    // The copy's price moved, not the prediction.
    assert!(d.predicted_ttft_s[1].unwrap() > d.predicted_ttft_s[0].unwrap());
    // One a second is not enough to pay for the copy, and weight 0 ignores the rate.
    r.warm_prefix_rate = 1.0;
    assert_eq!(policy().choose(&r, &c).unwrap().chosen, 0);
    r.warm_prefix_rate = 20.0;
    let off = KvAware::new(
        KvAwareConfig {
            calibrate: false,
            copy_weight: 0.0,
            ..Default::default()
        },
        1,
    );
    assert_eq!(off.choose(&r, &c).unwrap().chosen, 0);
}

/// The stall a prefill imposes on a worker's decoding sequences lasts as long as that worker
/// takes to prefill: on a fleet judged mixed it is priced at each worker's speed. (Pricing it
/// at the fleet's rates on uniform fleets was tried and not kept: docs/benchmarks.md, "Full
/// batches"; this keeps any such change off mixed fleets.)
#[test]
fn a_mixed_fleet_prices_the_stall_at_each_workers_speed() {
    // Worker 0 twice as slow, judged mixed: its prefill stalls its decodes twice as long.
    let p = KvAware::new(KvAwareConfig::default(), 1);
    for i in 0..600u64 {
        let slot = (i % 2) as u32;
        let slow = if slot == 0 { 2.0 } else { 1.0 };
        let tokens = 500 + i * 10;
        p.observe(&alone(
            slot,
            tokens,
            slow * (tokens as f64 / 20_000.0 + 0.02),
            0,
        ));
    }
    assert!(super::super::lock(&p.calibration).mixed());
    let mut c = idle(2);
    for w in &mut c {
        w.load.in_flight = 100;
        w.load.decoding = 100;
    }
    let d = p.choose(&req(2048), &c).unwrap();
    let stall = |i: usize| d.cost[i].unwrap() - d.predicted_ttft_s[i].unwrap();
    assert!(stall(0) > 1.5 * stall(1), "{d:?}");
    assert_eq!(d.chosen, 1);
}

#[test]
fn pieces_cap_the_priced_wait_behind_a_queued_prefill() {
    use super::threshold_with_pieces;
    assert_eq!(threshold_with_pieces(0, 0), 0, "whole prompts, no cap");
    assert_eq!(threshold_with_pieces(0, 16_384), 16_384);
    assert_eq!(threshold_with_pieces(4_096, 0), 4_096);
    assert_eq!(
        threshold_with_pieces(4_096, 16_384),
        4_096,
        "the engine's smaller cap"
    );
    assert_eq!(threshold_with_pieces(32_768, 16_384), 16_384);
}
