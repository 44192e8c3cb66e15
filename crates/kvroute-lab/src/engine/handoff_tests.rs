//! The prefill/decode hand-off in the engine core: a prefill for a remote decode holds its
//! blocks until pulled or expired; a decode of a remote prefill waits for its KV transfer and
//! then only decodes.

use super::*;
use kvroute_router::kv_events::KvEvent;

/// Blocks of 4 tokens, a 1 ms-per-token link with no latency, a 10 s hold.
fn config(num_blocks: u32, budget: usize) -> EngineConfig {
    EngineConfig {
        block_size: 4,
        num_blocks,
        max_num_seqs: 8,
        max_num_batched_tokens: budget,
        transfer: TransferModel::try_new(1000, 1e6, 0.0).unwrap(),
        kv_hold_timeout_s: 10.0,
        ..EngineConfig::default()
    }
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-12
}

fn request(id: u64, prompt: Vec<u32>, output: usize, at: f64, handoff: Handoff) -> NewRequest {
    NewRequest::local(RequestId(id), prompt, output, at).with_handoff(handoff)
}

/// Steps until idle, sleeping to the next wake-up when a step schedules nothing.
fn drain(e: &mut EngineCore, mut now: f64) -> Vec<StepOutcome> {
    let mut out = Vec::new();
    while e.has_work() {
        let o = e.step(now);
        if o.num_scheduled == 0 {
            now = e
                .next_wakeup()
                .expect("nothing scheduled and nothing to wait for");
        } else {
            now = o.end;
        }
        out.push(o);
    }
    out
}

fn finished(steps: &[StepOutcome]) -> Vec<RequestStats> {
    steps.iter().flat_map(|s| s.finished.clone()).collect()
}

#[test]
fn a_prefill_for_a_remote_decode_emits_one_token_and_holds_its_blocks() {
    let mut e = EngineCore::new(config(64, 100)).unwrap();
    let prompt: Vec<u32> = (0..25).collect();
    e.add(request(1, prompt.clone(), 50, 0.0, Handoff::ToDecode))
        .unwrap();
    let steps = drain(&mut e, 0.0);
    let tokens: Vec<_> = steps.iter().flat_map(|s| s.tokens.clone()).collect();
    assert_eq!(tokens.len(), 1, "max_tokens is 1 for a remote decode");
    let done = finished(&steps);
    assert_eq!(done.len(), 1);
    assert_eq!(done[0].handoff, Handoff::ToDecode);
    assert_eq!(done[0].output_tokens, 1);
    // Finished, yet its 7 prompt blocks are still referenced: usage counts them.
    assert!(!e.has_work());
    assert_eq!(e.num_held(), 1);
    assert!(close(e.kv_usage(), 7.0 / 64.0));
    assert_eq!(
        e.add(request(1, prompt.clone(), 1, 1.0, Handoff::Local)),
        Err(AddError::Duplicate(RequestId(1))),
        "a held id is still taken"
    );
    // Another prompt with the same prefix hits the held blocks.
    e.add(request(2, prompt.clone(), 1, 1.0, Handoff::Local))
        .unwrap();
    let again = finished(&drain(&mut e, 1.0));
    assert_eq!(again[0].cached_tokens, 24);
    // Released: back in the free queue, still cached.
    assert!(e.release_held(RequestId(1)));
    assert!(!e.release_held(RequestId(1)));
    assert_eq!(e.kv_usage(), 0.0);
    assert_eq!(e.with_cache(|c| c.num_cached()), 6);
    assert_eq!(e.counters().held_released, 1);
    assert_eq!(e.next_wakeup(), None);
}

#[test]
fn held_blocks_expire_when_never_pulled() {
    let mut e = EngineCore::new(config(64, 100)).unwrap();
    e.add(request(1, (0..9).collect(), 1, 0.0, Handoff::ToDecode))
        .unwrap();
    let end = drain(&mut e, 0.0).last().unwrap().end;
    assert_eq!(e.next_wakeup(), Some(end + 10.0));
    assert!(e.step(end + 9.0).expired.is_empty());
    assert_eq!(e.num_held(), 1);
    let o = e.step(end + 10.0);
    assert_eq!(o.expired, vec![RequestId(1)]);
    assert_eq!(o.num_scheduled, 0);
    assert_eq!((e.num_held(), e.kv_usage()), (0, 0.0));
    assert_eq!(e.counters().held_expired, 1);
    assert!(!e.release_held(RequestId(1)));
}

#[test]
fn a_decode_of_a_remote_prefill_waits_for_its_kv_then_only_decodes() {
    let mut e = EngineCore::new(config(64, 100)).unwrap();
    e.add(request(1, (0..25).collect(), 3, 0.5, Handoff::FromPrefill))
        .unwrap();
    // Admitted at 1.0: blocks for the whole prompt, no compute, 25 tokens on the wire.
    let o = e.step(1.0);
    assert_eq!(o.num_scheduled, 0);
    assert_eq!(o.pulls.len(), 1);
    let pull = o.pulls[0];
    assert_eq!(
        (pull.id, pull.tokens, pull.bytes),
        (RequestId(1), 25, 25_000)
    );
    assert!(close(pull.ready_at, 1.025));
    assert!(
        o.kv_events.is_empty(),
        "nothing is cached before the data lands"
    );
    assert!(close(e.kv_usage(), 7.0 / 64.0));
    assert!(e.has_work());
    assert_eq!(
        (e.num_pulling(), e.num_waiting(), e.num_running()),
        (1, 1, 0)
    );
    assert_eq!(e.next_wakeup(), Some(pull.ready_at));
    // Too early: nothing changes.
    assert_eq!(e.step(1.02).num_scheduled, 0);
    // Landed: its last prompt token runs as a decode, producing the first output token.
    let o = e.step(pull.ready_at);
    assert_eq!(o.landed, vec![RequestId(1)]);
    assert_eq!((o.work.prefill_tokens, o.work.decode_seqs), (0, 1));
    assert_eq!(o.tokens.len(), 1);
    assert_eq!(o.tokens[0].index, 0);
    let stored: usize = o
        .kv_events
        .iter()
        .map(|ev| match ev {
            KvEvent::Stored(b) => b.block_hashes.len(),
            _ => 0,
        })
        .sum();
    assert_eq!(
        stored, 6,
        "the pulled full blocks are cached once they land"
    );
    let mut steps = vec![o];
    steps.extend(drain(&mut e, steps[0].end));
    let done = finished(&steps);
    assert_eq!(done.len(), 1);
    let s = &done[0];
    assert_eq!(
        (s.handoff, s.output_tokens, s.transferred_tokens),
        (Handoff::FromPrefill, 3, 25)
    );
    assert_eq!(s.kv_ready, Some(pull.ready_at));
    assert_eq!(s.first_scheduled, Some(1.0));
    assert!(close(s.ttft().unwrap(), steps[0].end - 0.5));
    let c = e.counters();
    assert_eq!((c.prefill_tokens, c.generated_tokens), (0, 3));
    assert_eq!((c.pulls, c.transferred_tokens), (1, 25));
    assert_eq!(e.kv_usage(), 0.0);
}

#[test]
fn a_decode_pulls_only_what_its_own_prefix_cache_lacks() {
    let mut e = EngineCore::new(config(64, 100)).unwrap();
    let prompt: Vec<u32> = (0..25).collect();
    e.add(request(1, prompt[..17].to_vec(), 1, 0.0, Handoff::Local))
        .unwrap();
    let t = drain(&mut e, 0.0).last().unwrap().end;
    e.add(request(2, prompt, 2, t, Handoff::FromPrefill))
        .unwrap();
    let o = e.step(t);
    // 4 blocks (16 tokens) are cached locally; the other 9 tokens are pulled.
    assert_eq!(o.pulls[0].tokens, 9);
    let done = finished(&drain(&mut e, t));
    assert_eq!(done[0].cached_tokens, 16);
    assert_eq!(done[0].transferred_tokens, 9);
    assert_eq!(e.counters().prefill_tokens, 17);
}

#[test]
fn a_pull_takes_no_budget_and_no_running_slot_until_it_lands() {
    let mut e = EngineCore::new(EngineConfig {
        max_num_seqs: 1,
        ..config(64, 8)
    })
    .unwrap();
    e.add(request(
        1,
        (100..140).collect(),
        2,
        0.0,
        Handoff::FromPrefill,
    ))
    .unwrap();
    e.add(request(2, (0..6).collect(), 2, 0.0, Handoff::Local))
        .unwrap();
    let o = e.step(0.0);
    // The 40-token pull started with a budget of 8 and the local prompt ran beside it.
    assert_eq!(o.pulls.len(), 1);
    assert_eq!((o.num_scheduled, o.work.prefill_tokens), (1, 6));
    let steps = drain(&mut e, o.end);
    let done = finished(&steps);
    assert_eq!(done.len(), 2);
    // It landed only once request 2 left the single running slot.
    let landed_at = steps
        .iter()
        .find(|s| s.landed.contains(&RequestId(1)))
        .unwrap()
        .start;
    let two_done = done.iter().find(|s| s.id == RequestId(2)).unwrap().finished;
    assert!(landed_at >= two_done);
}

#[test]
fn aborting_a_pulling_request_frees_its_blocks() {
    let mut e = EngineCore::new(config(64, 100)).unwrap();
    e.add(request(1, (0..25).collect(), 3, 0.0, Handoff::FromPrefill))
        .unwrap();
    e.step(0.0);
    assert!(e.kv_usage() > 0.0);
    let s = e.abort(RequestId(1), 0.01).unwrap();
    assert_eq!(s.reason, FinishReason::Aborted);
    assert_eq!((e.kv_usage(), e.num_pulling()), (0.0, 0));
    assert!(!e.has_work());
    assert_eq!(e.next_wakeup(), None);
}

#[test]
fn a_hold_timeout_must_be_positive() {
    for bad in [0.0, -1.0, f64::NAN, f64::INFINITY] {
        let c = EngineConfig {
            kv_hold_timeout_s: bad,
            ..EngineConfig::default()
        };
        assert_eq!(EngineCore::new(c).unwrap_err(), ConfigError::HoldTimeout);
    }
}
