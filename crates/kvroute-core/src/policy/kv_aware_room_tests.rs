//! Unit tests of `kv_aware`'s wait for KV room (`kv_room`, `residence`): what the running
//! requests hold, and how long they keep it.

use super::super::testing::idle;
use super::tests::{policy, req};
use super::*;
use crate::policy::residence::PRIOR_RESIDENCE_S;

#[test]
fn a_warm_worker_whose_running_requests_fill_its_cache_is_priced_by_the_wait() {
    // Worker 0 holds the whole 80k-token prompt, but one running 1M-token session fills
    // its 1,048,576-token cache: the prompt cannot start there until that session ends.
    let mut c = idle(2);
    for w in &mut c {
        w.cache.capacity_blocks = Some(65_536); // × 16 tokens
    }
    c[0].overlap_blocks = 5_000;
    c[0].load.in_flight = 1;
    c[0].load.decoding = 1;
    c[0].cache.running_tokens = 1_000_000;
    let p = policy();
    let d = p.choose(&req(80_000), &c).unwrap();
    assert_eq!(d.chosen, 1, "{:?}", d.predicted_ttft_s);
    let waits = d.predicted_ttft_s[0].unwrap();
    assert!(
        waits >= PRIOR_RESIDENCE_S,
        "the prior residence is waited: {waits}"
    );
    // The explanation names the wait, and the idle worker's none.
    assert_eq!(d.room_wait_s, vec![Some(PRIOR_RESIDENCE_S), Some(0.0)]);
    // The running session shares the prompt's prefix: no new room is needed, so it stays.
    c[0].cache.running_prefix_blocks = 5_000;
    assert_eq!(p.choose(&req(80_000), &c).unwrap().chosen, 0);
    // Short answers learned: the wait shrinks to what decoding lasts, and the warm worker
    // wins again once that is below recomputing 80k tokens.
    c[0].cache.running_prefix_blocks = 0;
    for _ in 0..50 {
        p.observe_decode(WorkerId(0), 0.5, None);
    }
    assert_eq!(p.choose(&req(80_000), &c).unwrap().chosen, 0);
    // Answers whose mean is as short but whose tail is long (nine in ten end at once, one in
    // ten runs ten times the mean): the session found running is most likely a long one, and
    // the 80k tokens are recomputed elsewhere.
    let p = policy();
    let recompute = p.choose(&req(80_000), &c).unwrap().predicted_ttft_s[1].unwrap();
    let long = 4.0 * recompute;
    for i in 0..200 {
        p.observe_decode(WorkerId(0), if i % 10 == 9 { long } else { 0.0 }, None);
    }
    assert!(p.residence_mean_s() < recompute / 2.0);
    let d = p.choose(&req(80_000), &c).unwrap();
    assert_eq!(d.chosen, 1, "{:?}", d.predicted_ttft_s);
}

#[test]
fn what_the_running_answers_have_written_takes_room_too() {
    // Worker 0's booked prompts leave exactly room for the new one; its four answers have
    // decoded for 100 s in all.
    let mut c = idle(2);
    for w in &mut c {
        w.cache.capacity_blocks = Some(1_000); // 16,000 tokens
    }
    c[0].load.in_flight = 4;
    c[0].load.decoding = 4;
    c[0].cache.running_tokens = 12_000;
    c[0].cache.decoded_s = 100.0;
    let p = policy();
    // No answer's length told yet: only the prompts count, and the prompt fits.
    assert_eq!(p.choose(&req(4_000), &c).unwrap().room_wait_s[0], Some(0.0));
    // Answers write 20 tokens a second: 2,000 tokens are held beside the prompts, and the
    // prompt waits for one of the four to end.
    for _ in 0..10 {
        p.observe_decode(WorkerId(1), 10.0, Some(201));
    }
    let wait = p.choose(&req(4_000), &c).unwrap().room_wait_s[0];
    assert!(wait.is_some_and(|w| w > 0.0), "{wait:?}");
}

#[test]
fn answers_still_running_anywhere_lengthen_the_wait_while_the_router_is_young() {
    // Worker 0 is full: the prompt waits for its one young answer to end.
    let mut c = idle(2);
    for w in &mut c {
        w.cache.capacity_blocks = Some(1_000);
    }
    c[0].load.in_flight = 1;
    c[0].load.decoding = 1;
    c[0].cache.running_tokens = 15_000;
    c[0].cache.decode_ages.add(0.5, 15_000);
    let p = policy();
    // The 100 answers that ended were all 2 s long.
    for _ in 0..100 {
        p.observe_decode(WorkerId(1), 2.0, None);
    }
    let short = p.choose(&req(4_000), &c).unwrap().room_wait_s[0].unwrap_or(0.0);
    assert!((short - 1.5).abs() < 1e-9, "{short}");
    // Twenty answers have run 16-32 s on worker 1 and go on: answers are not all short.
    for _ in 0..20 {
        c[1].cache.decode_ages.add(20.0, 15_000);
    }
    let long = p.choose(&req(4_000), &c).unwrap().room_wait_s[0].unwrap_or(0.0);
    assert!(long > 5.0 * short, "{long} against {short}");
}

#[test]
fn a_predicted_wait_for_room_is_not_learned_as_slow_prefill() {
    // Two routers see the same first tokens: 8k tokens computed in 0.4 s. One also had a
    // predicted wait for room of 3 s, and its TTFTs are 3 s longer. The prefill rates both
    // learn are the same: the wait is the room model's, not a slow worker's.
    let learn = |wait: f64| {
        let p = KvAware::new(KvAwareConfig::default(), 1);
        for _ in 0..200 {
            p.observe(&Observation {
                worker: WorkerId(0),
                uncached_tokens: 8_000,
                queued_tokens: 0,
                decoding: 0,
                prefilling: 0,
                unseen_in_flight: 0,
                ttft_s: 0.4 + wait,
                loaded_tokens: [0, 0],
                kv_bytes_per_token: 0,
                room_wait_s: wait,
            });
        }
        p.rates(WorkerId(0)).seconds_per_token
    };
    let (waited, none) = (learn(3.0), learn(0.0));
    assert!((waited - none).abs() <= none * 1e-6, "{waited} vs {none}");
}

#[test]
fn a_fleet_with_no_room_anywhere_counts_what_a_placement_recomputes_again() {
    // Worker 0 holds half of the 80k-token prompt behind 60k queued tokens; worker 1 holds
    // none of it and queues nothing. Both run one answer beside the prompts they hold.
    let mut c = idle(2);
    for w in &mut c {
        w.cache.capacity_blocks = Some(65_536); // × 16 tokens
        w.load.in_flight = 1;
        w.load.decoding = 1;
        w.cache.decode_ages.add(1.0, 100_000);
    }
    c[0].overlap_blocks = 2_500;
    c[0].load.queued_prefill_tokens = 60_000;
    let p = policy();
    // Room on both: the idle worker starts the prompt first, and takes it.
    for w in &mut c {
        w.cache.running_tokens = 100_000;
    }
    let d = p.choose(&req(80_000), &c).unwrap();
    assert_eq!(d.room_wait_s, vec![Some(0.0), Some(0.0)]);
    assert_eq!(d.chosen, 1, "{:?}", d.cost);
    // Both caches full: wherever it goes the prompt waits for an answer to end, and every
    // token recomputed then evicts what the next turns would find. The recomputation counts
    // again, and the warm worker wins.
    for w in &mut c {
        w.cache.running_tokens = 1_000_000;
    }
    let d = p.choose(&req(80_000), &c).unwrap();
    assert!(d.room_wait_s.iter().all(|w| w.is_some_and(|w| w > 0.0)));
    assert_eq!(d.room_wait_s[0], d.room_wait_s[1]);
    assert_eq!(d.chosen, 0, "{:?}", d.cost);
}
