//! Unit tests of the working sets (a file of their own to keep the module readable).

use super::*;

fn blocks(range: std::ops::Range<u64>) -> Vec<BlockHash> {
    range
        .map(|i| BlockHash(crate::index::table::mix(i + 1)))
        .collect()
}

fn s(secs: u64) -> Duration {
    Duration::from_secs(secs)
}

fn residency(horizon: u64, max: usize) -> Residency {
    Residency::new(ResidencyConfig {
        horizon: s(horizon),
        max_blocks_per_worker: max,
    })
}

#[test]
fn live_blocks_count_distinct_touches_within_the_horizon() {
    let r = residency(10, 1_000);
    let w = WorkerId(1);
    r.touch(w, &blocks(0..4), s(0), None);
    r.touch(w, &blocks(0..6), s(5), None);
    assert_eq!(r.live_blocks(w, s(5)), 6);
    assert_eq!(r.live_blocks(WorkerId(2), s(5)), 0);
    // Blocks 0..4 were touched again at 5 s: all six are followed until 15 s.
    assert_eq!(r.live_blocks(w, s(14)), 6);
    assert_eq!(r.live_blocks(w, s(16)), 0);
}

#[test]
fn the_curve_is_the_share_of_idle_periods_that_ended_in_a_touch() {
    let r = residency(100, 1_000);
    let w = WorkerId(0);
    assert_eq!(r.curve().returning(0.0), 0.0);
    // A session of 8 blocks comes back after 3 s, then after 40 s; 8 unique blocks never do.
    r.touch(w, &blocks(0..8), s(0), None);
    r.touch(w, &blocks(0..8), s(3), None);
    r.touch(w, &blocks(100..108), s(4), None);
    r.touch(w, &blocks(0..8), s(43), None);
    assert_eq!(r.curve().returning(0.0), 1.0);
    r.live_blocks(w, s(1_000));
    let c = r.curve();
    // 16 returns, then 8 + 8 periods expired: half of all periods returned.
    assert!((c.returning(0.0) - 0.5).abs() < 1e-9, "{c:?}");
    // Of the periods idle 16 s or more, only the 8 that returned after 40 s did.
    assert!((c.returning(20.0) - 8.0 / 24.0).abs() < 1e-9, "{c:?}");
    assert_eq!(c.returning(500.0), 0.0);
    // Unique traffic only: nothing ever comes back.
    let u = Residency::default();
    for i in 0..50 {
        u.touch(w, &blocks(i * 10..i * 10 + 10), s(i * 1_000), None);
    }
    assert_eq!(u.curve().returning(0.0), 0.0);
}

/// A worker with room evicts nothing; a full one evicts its oldest blocks first, priced by
/// how likely blocks that old come back, and never the request's own prefix.
#[test]
fn returning_evictions_walk_the_oldest_blocks_first() {
    let r = residency(1_000, 10_000);
    let w = WorkerId(0);
    let mut curve = ReuseCurve::default();
    // Blocks idle under 8 s always come back; older ones never do.
    curve.returned[bin(4.0)] = 10.0;
    curve.expired = 10.0;
    assert_eq!(curve.returning(1.0), 0.5);
    let mut always = ReuseCurve::default();
    always.returned[BINS - 1] = 1.0;
    r.touch(w, &blocks(0..40), s(0), None); // old session
    r.touch(w, &blocks(100..140), s(95), None); // recent session
    assert_eq!(r.live_blocks(w, s(100)), 80);
    // Room for 20 more blocks: writing 20 evicts nothing.
    assert_eq!(r.returning_evictions(w, 100, 20, &[], s(100), &always), 0.0);
    // 30 more evict 10 of the old session, 70 evict all 40 old and 10 recent.
    assert_eq!(
        r.returning_evictions(w, 100, 30, &[], s(100), &always),
        10.0
    );
    assert_eq!(
        r.returning_evictions(w, 100, 70, &[], s(100), &always),
        50.0
    );
    // Priced by age: the old session's blocks (100 s idle) do not come back, the recent
    // ones (5 s) do.
    assert_eq!(r.returning_evictions(w, 100, 30, &[], s(100), &curve), 0.0);
    let recent_share = curve.returning(5.0);
    assert_eq!(
        r.returning_evictions(w, 100, 70, &[], s(100), &curve),
        10.0 * recent_share
    );
    // The old session returning keeps its 40 blocks: its 60 new ones evict recent blocks.
    assert_eq!(
        r.returning_evictions(w, 100, 60, &blocks(0..40), s(100), &always),
        40.0
    );
}

#[test]
fn the_set_is_bounded_oldest_first_and_clears() {
    let r = residency(1_000, 100);
    let w = WorkerId(3);
    for i in 0..10 {
        r.touch(w, &blocks(i * 50..i * 50 + 50), s(i), None);
    }
    assert_eq!(r.live_blocks(w, s(10)), 100);
    // The newest blocks stayed: touching them again moves them, it adds none.
    r.touch(w, &blocks(450..500), s(11), None);
    assert_eq!(r.live_blocks(w, s(11)), 100);
    r.clear_worker(w);
    assert_eq!(r.live_blocks(w, s(11)), 0);
}

#[test]
fn forgotten_blocks_leave_the_table() {
    let r = residency(10, 1 << 20);
    let w = WorkerId(0);
    for i in 0..100 {
        r.touch(w, &blocks(i * 1_000..i * 1_000 + 1_000), s(i * 20), None);
    }
    let set = r.set(w).unwrap();
    let s = lock(&set);
    assert_eq!(s.live, 1_000);
    assert!(
        s.batch_of.len() <= 2 * 1_000 + 4096 + 1_000,
        "{}",
        s.batch_of.len()
    );
}

/// A worker with a known KV capacity is followed for at most twice its capacity.
#[test]
fn a_worker_is_followed_for_twice_its_capacity() {
    let r = residency(1_000, 1 << 20);
    let w = WorkerId(0);
    for i in 0..10 {
        r.touch(w, &blocks(i * 100..i * 100 + 100), s(i), Some(200));
    }
    assert_eq!(r.live_blocks(w, s(10)), 500);
    r.touch(WorkerId(1), &blocks(0..1_000), s(0), None);
    assert_eq!(r.live_blocks(WorkerId(1), s(1)), 1_000);
}
