//! The decision core's use of affinity hints: a session's home is evidence (a tie-break, and
//! on a worker without KV events the prefix its last request left there), never a pin.

use std::sync::Arc;
use std::time::Duration;

use super::super::testing::TestTarget as T;
use super::*;
use crate::index::{ApproxConfig, ApproxIndex, IndexConfig, KvIndex, SessionKey};
use crate::policy::{PolicyKind, seeded};
use crate::tokens::HashSeed;

fn fleet(n: u32, events: bool) -> Vec<T> {
    T::fleet(n, events)
}

/// A decider whose predictions of routed prompts expire after one second.
fn decider() -> Decider {
    let holdings = Arc::new(Holdings::new(
        KvIndex::new(IndexConfig {
            max_entries: 1 << 16,
        }),
        ApproxIndex::new(ApproxConfig {
            ttl: Duration::from_secs(1),
            capacity_per_worker: 1 << 16,
        }),
    ));
    Decider::new(seeded(PolicyKind::KvAware, 3), holdings)
}

fn ids(session: u32, len: usize) -> Vec<u32> {
    (0..len as u32).map(|i| session * 100_000 + i).collect()
}

fn seed() -> HashSeed {
    HashSeed::new("m", None, None)
}

/// Routes `prompt` of `session` at `now` (seconds) and returns the chosen worker, keeping the
/// request in flight when `hold` is given.
fn route(
    d: &Decider,
    targets: &[T],
    prompt: &[u32],
    session: Option<SessionKey>,
    now: u64,
    hold: &mut Vec<super::super::Admitted>,
) -> WorkerId {
    let at = Duration::from_secs(now);
    let mut analysis = d.analyse(prompt, seed(), 16, at);
    analysis.session = session;
    let choice = d
        .choose(&analysis, targets, &mut Vec::new())
        .expect("a worker");
    let admitted = d.admit(&analysis, &choice, at);
    let worker = admitted.worker();
    hold.push(admitted);
    worker
}

#[test]
fn without_events_a_session_returns_home_after_predictions_expire() {
    let targets = fleet(4, false);
    let d = decider();
    let mut held = Vec::new();
    let mut homes = Vec::new();
    // Eight sessions, one request each, all in flight: they spread over the fleet.
    for s in 0..8 {
        let key = SessionKey::new(None, "m", format!("s{s}").as_bytes());
        homes.push(route(&d, &targets, &ids(s, 640), Some(key), 0, &mut held));
    }
    held.clear();
    // Ten seconds later the predictions are gone; each session's next turn extends its prompt
    // and goes home, on the hint's evidence alone.
    for s in 0..8 {
        let key = SessionKey::new(None, "m", format!("s{s}").as_bytes());
        let mut next = ids(s, 640);
        next.extend(ids(s + 50, 64));
        let w = route(&d, &targets, &next, Some(key), 10, &mut Vec::new());
        assert_eq!(w, homes[s as usize], "session {s} left its home");
    }
    // The same turns without the hint, once the predictions of those turns expired too, are
    // routed on load alone: they do not all go home.
    let unhinted = (0..8u32)
        .filter(|&s| {
            let mut next = ids(s, 640);
            next.extend(ids(s + 60, 64));
            route(&d, &targets, &next, None, 20, &mut Vec::new()) == homes[s as usize]
        })
        .count();
    assert!(
        unhinted < 8,
        "every unhinted turn went home: the test would not see a hint"
    );
}

#[test]
fn a_busy_home_is_left_for_an_idle_worker() {
    let targets = fleet(2, true);
    let d = decider();
    let key = SessionKey::new(None, "m", b"s");
    let home = route(&d, &targets, &ids(1, 64), Some(key), 0, &mut Vec::new());
    // The home gets a long queue; the session's next request goes elsewhere.
    let busy = &targets[home.0 as usize];
    let _queue: Vec<_> = (0..8).map(|_| busy.load.admit(8_000, 8_000)).collect();
    let w = route(&d, &targets, &ids(2, 64), Some(key), 1, &mut Vec::new());
    assert_ne!(w, home);
}

#[test]
fn an_event_publishing_home_gets_ties_but_no_invented_prefix() {
    let targets = fleet(3, true);
    let d = decider();
    let key = SessionKey::new(None, "m", b"s");
    let home = route(&d, &targets, &ids(1, 640), Some(key), 0, &mut Vec::new());
    let mut analysis = d.analyse(&ids(1, 700), seed(), 16, Duration::from_secs(5));
    analysis.session = Some(key);
    let (_, candidates) = d.candidates(&analysis, &targets, &[]);
    for c in &candidates {
        assert_eq!(c.session_home, c.worker == home);
        // The engine reported nothing: the exact index's count stands.
        assert_eq!(c.overlap_blocks, 0);
    }
    let choice = d.choose(&analysis, &targets, &mut Vec::new()).unwrap();
    assert_eq!(choice.target.worker(), home);
}

/// Routes 16 requests sharing a 4,096-token prefix (plus 32 tokens of their own) at one
/// instant, keeping them in flight; returns the workers they landed on and the prefill tokens
/// booked for them.
fn siblings(targets: &[T]) -> (usize, u64) {
    siblings_by(&decider(), targets)
}

/// [`siblings`], routed by `d`.
fn siblings_by(d: &Decider, targets: &[T]) -> (usize, u64) {
    let queued = |targets: &[T]| -> u64 {
        targets
            .iter()
            .map(|t| t.load.snapshot().queued_prefill_tokens)
            .sum()
    };
    let before = queued(targets);
    let mut held = Vec::new();
    let mut on = std::collections::BTreeSet::new();
    for k in 0..16u32 {
        let mut prompt = ids(7, 4_096);
        prompt.extend(ids(1_000 + k, 32));
        on.insert(route(d, targets, &prompt, None, 0, &mut held));
    }
    (on.len(), queued(targets) - before)
}

#[test]
fn siblings_spread_with_room_and_co_locate_on_a_saturated_fleet() {
    // Room everywhere: they spread (one started beside the first would compute the prefix
    // again at the same time) and book the whole prompt, until every worker has two prompts
    // queued: the eight after that start behind a written prefix and book 32 tokens each.
    let (on, booked) = siblings(&fleet(4, true));
    assert_eq!(on, 4);
    assert_eq!(booked, 8 * 4_128 + 8 * 32);
    // Every worker has far more than twice the prompt queued: they start after the first's
    // prefix is written, so they join it and book their own 32 tokens only.
    let targets = fleet(4, true);
    let _queued: Vec<_> = targets
        .iter()
        .map(|t| t.load.admit(100_000, 100_000))
        .collect();
    let (on, booked) = siblings(&targets);
    assert!(on <= 2, "on {on} workers");
    assert!(booked < 3 * 4_128, "{booked} tokens booked");
}

#[test]
fn siblings_co_locate_when_no_worker_has_kv_room() {
    // Four workers of 1,000 blocks (16,000 tokens), each running an answer to a 14,000-token
    // prompt of its own: no queue, but no room for a 4,128-token sibling until one ends.
    let targets = with_kv_blocks(fleet(4, true), 1_000);
    let d = decider();
    let _running: Vec<_> = (0..4usize)
        .map(|w| decoding(&d, &targets[w], &ids(100 + w as u32, 14_000)))
        .collect();
    // Wherever they go they wait for room, so the fleet is saturated: they join the first,
    // whose prefix is written before they start, and book their own 32 tokens.
    let (on, booked) = siblings_by(&d, &targets);
    assert!(on <= 2, "on {on} workers");
    assert!(booked < 3 * 4_128, "{booked} tokens booked");
}

/// `targets`, each with a KV cache of `blocks` blocks.
fn with_kv_blocks(targets: Vec<T>, blocks: usize) -> Vec<T> {
    targets
        .into_iter()
        .map(|t| T {
            kv_blocks: Some(blocks),
            ..t
        })
        .collect()
}

/// `prompt` admitted on `target` at 1 s, decoding since its first token at 2 s.
fn decoding(d: &Decider, target: &T, prompt: &[u32]) -> super::super::Admitted {
    let at = Duration::from_secs(1);
    let analysis = d.analyse(prompt, seed(), 16, at);
    let choice = d
        .choose(&analysis, std::slice::from_ref(target), &mut Vec::new())
        .expect("a worker");
    let mut admitted = d.admit(&analysis, &choice, at).admitted_at(at);
    admitted.first_token_after(Duration::from_secs(1));
    admitted
}

/// A prompt of a 512-token prefix every `tag` shares, then 64 tokens of its own.
fn shared_prefix_prompt(tag: u32) -> Vec<u32> {
    (0..512u32)
        .chain((0..64).map(|i| 1_000_000 + tag * 100 + i))
        .collect()
}

#[test]
fn admissions_count_toward_the_rate_of_the_prefix_they_share() {
    let d = decider();
    let targets = fleet(2, false);
    let mut hold = Vec::new();
    for tag in 0..5 {
        route(&d, &targets, &shared_prefix_prompt(tag), None, 0, &mut hold);
    }
    let at = Duration::from_millis(500);
    let hot = d.analyse(&shared_prefix_prompt(99), seed(), 16, at);
    // Five arrivals, each worth 1/10 s⁻¹ and half a second old.
    let expected = 0.5 * (-0.05f64).exp();
    assert!(
        (hot.request.warm_prefix_rate - expected).abs() < 1e-9,
        "{:?}",
        hot.request
    );
    // A prompt nobody holds any of has no warm prefix to price.
    let cold = d.analyse(&ids(7, 576), seed(), 16, at);
    assert_eq!(cold.request.warm_prefix_rate, 0.0);
}

#[test]
fn once_one_worker_fills_every_worker_s_decode_ages_are_read() {
    // Two workers of 100 blocks (1,600 tokens); one request decoding on each.
    let targets = with_kv_blocks(fleet(2, true), 100);
    let d = decider();
    let _held = [
        decoding(&d, &targets[0], &ids(0, 400)),
        decoding(&d, &targets[1], &ids(1, 32)),
    ];
    let candidates = |prompt: usize| {
        let analysis = d.analyse(&ids(9, prompt), seed(), 16, Duration::from_secs(12));
        d.candidates(&analysis, &targets, &[]).1
    };
    let ages = |prompt: usize| {
        candidates(prompt)
            .iter()
            .map(|c| c.cache.decode_ages.len())
            .collect::<Vec<_>>()
    };
    // A short prompt leaves both under half full: no ages read one by one, but their sum
    // is (each has decoded since 2 s).
    assert_eq!(ages(64), vec![0, 0]);
    for c in candidates(64) {
        assert!(
            (c.cache.decoded_s - 10.0).abs() < 1e-9,
            "{}",
            c.cache.decoded_s
        );
    }
    // 400 + 500 tokens are over half of worker 0: its ages are read, and worker 1's too,
    // though the prompt would fit there (the running answers are the residences' evidence).
    assert_eq!(ages(500), vec![1, 1]);
}
