use super::*;
use crate::engine::block_hash::EngineHasher;

const BS: usize = 4;

fn req(id: u64, prompt_len: usize, max_output: usize) -> Request {
    let prompt = (0..prompt_len as u32)
        .map(|t| t + 1000 * id as u32)
        .collect();
    Request::new(
        RequestId(id),
        prompt,
        max_output,
        0.0,
        None,
        &EngineHasher::new(0),
        BS,
    )
}

fn sched(max_num_seqs: usize, budget: usize) -> Scheduler {
    Scheduler::new(SchedulerLimits {
        max_num_seqs,
        max_num_batched_tokens: budget,
        long_prefill_token_threshold: 0,
    })
}

/// What the engine core does after a step: advance computed tokens, emit a token when the
/// sequence is caught up.
fn apply(s: &mut Scheduler, batch: &Batch) {
    let h = EngineHasher::new(0);
    for e in &batch.scheduled {
        let r = s.get_mut(e.id).unwrap();
        r.num_computed += e.num_new_tokens;
        if r.num_computed == r.num_tokens() {
            r.push_output(7, &h, BS);
        }
    }
}

fn plan(batch: &Batch) -> Vec<(u64, usize, bool)> {
    batch
        .scheduled
        .iter()
        .map(|s| (s.id.0, s.num_new_tokens, s.decode))
        .collect()
}

#[test]
fn a_long_prompt_takes_at_most_the_threshold_and_shares_its_steps() {
    let mut cache = KvCache::new(64, BS);
    let mut s = Scheduler::new(SchedulerLimits {
        max_num_seqs: 8,
        max_num_batched_tokens: 10,
        long_prefill_token_threshold: 4,
    });
    s.add(req(1, 20, 2));
    s.add(req(2, 3, 2));
    // Without the threshold the long prompt would take the whole budget of 10; capped at 4,
    // the short one is admitted in the same step.
    let b = s.schedule(&mut cache, 0.0);
    assert_eq!(plan(&b), vec![(1, 4, false), (2, 3, false)]);
    apply(&mut s, &b);
    let b = s.schedule(&mut cache, 1.0);
    assert_eq!(plan(&b), vec![(2, 1, true), (1, 4, false)]);
}

#[test]
fn token_budget_and_chunked_prefill() {
    let mut cache = KvCache::new(64, BS);
    let mut s = sched(8, 10);
    s.add(req(1, 6, 4));
    s.add(req(2, 9, 4));
    let b = s.schedule(&mut cache, 0.0);
    assert_eq!(plan(&b), vec![(1, 6, false), (2, 4, false)]);
    apply(&mut s, &b);
    // Decode of 1 first, then the rest of 2's prompt.
    let b = s.schedule(&mut cache, 1.0);
    assert_eq!(plan(&b), vec![(1, 1, true), (2, 5, false)]);
    apply(&mut s, &b);
    let b = s.schedule(&mut cache, 2.0);
    assert_eq!(plan(&b), vec![(1, 1, true), (2, 1, true)]);
}

#[test]
fn long_prompt_is_chunked_across_steps_and_decodes_go_first() {
    let mut cache = KvCache::new(64, BS);
    let mut s = sched(8, 8);
    s.add(req(1, 3, 10));
    s.add(req(2, 20, 1));
    let b = s.schedule(&mut cache, 0.0);
    assert_eq!(plan(&b), vec![(1, 3, false), (2, 5, false)]);
    apply(&mut s, &b);
    for _ in 0..2 {
        let b = s.schedule(&mut cache, 0.0);
        assert_eq!(plan(&b), vec![(1, 1, true), (2, 7, false)]);
        apply(&mut s, &b);
    }
    // 5 + 7 + 7 = 19: the last prompt token is still a prefill chunk.
    let b = s.schedule(&mut cache, 0.0);
    assert_eq!(plan(&b), vec![(1, 1, true), (2, 1, false)]);
    apply(&mut s, &b);
    let b = s.schedule(&mut cache, 0.0);
    assert_eq!(plan(&b), vec![(1, 1, true), (2, 1, true)]);
}

#[test]
fn max_num_seqs_limits_admission() {
    let mut cache = KvCache::new(64, BS);
    let mut s = sched(2, 100);
    for id in 1..=3 {
        s.add(req(id, 4, 2));
    }
    let b = s.schedule(&mut cache, 0.0);
    assert_eq!(b.admitted, vec![RequestId(1), RequestId(2)]);
    assert_eq!(s.num_waiting(), 1);
    assert_eq!(s.num_running(), 2);
}

#[test]
fn admission_adopts_cached_prefix_and_records_queue_time() {
    let mut cache = KvCache::new(64, BS);
    let mut s = sched(8, 100);
    s.add(req(1, 12, 1));
    let b = s.schedule(&mut cache, 0.5);
    assert_eq!((b.queried_tokens, b.hit_tokens), (12, 0));
    s.remove(RequestId(1), &mut cache);
    let mut again = req(1, 12, 1);
    again.id = RequestId(9);
    s.add(again);
    let b = s.schedule(&mut cache, 2.0);
    // 12 tokens: at most (12-1)/4 = 2 blocks may be reused, 4 tokens recomputed.
    assert_eq!(plan(&b), vec![(9, 4, false)]);
    assert_eq!((b.queried_tokens, b.hit_tokens), (12, 8));
    assert_eq!((b.queried_blocks, b.hit_blocks), (3, 2));
    let r = s.get(RequestId(9)).unwrap();
    assert_eq!((r.cached_tokens, r.first_scheduled), (8, Some(2.0)));
}

#[test]
fn preempts_newest_by_recompute_when_blocks_run_out() {
    // 4 blocks of 4 tokens; two requests of 7 prompt tokens take 2 blocks each.
    let mut cache = KvCache::new(4, BS);
    let mut s = sched(8, 100);
    s.add(req(1, 7, 10));
    s.add(req(2, 7, 10));
    let b = s.schedule(&mut cache, 0.0);
    assert_eq!(plan(&b), vec![(1, 7, false), (2, 7, false)]);
    apply(&mut s, &b); // both now 8 tokens, 7 computed
    let b = s.schedule(&mut cache, 0.0);
    assert_eq!(plan(&b), vec![(1, 1, true), (2, 1, true)]);
    apply(&mut s, &b); // both 9 tokens, 8 computed: the next decode needs a third block
    cache.take_events();
    let b = s.schedule(&mut cache, 0.0);
    assert_eq!(b.preempted, vec![RequestId(2)]);
    assert_eq!(plan(&b), vec![(1, 1, true)]);
    assert!(
        b.admitted.is_empty(),
        "no admission in a step that preempted"
    );
    let r2 = s.get(RequestId(2)).unwrap();
    assert_eq!(
        (r2.num_computed, r2.num_tokens(), r2.preemptions),
        (0, 9, 1)
    );
    assert_eq!(s.waiting().collect::<Vec<_>>(), vec![RequestId(2)]);
    // 2's blocks were freed tail first; 1 took 2's second (cached) block and evicted it.
    let ev = cache.take_events();
    let req2_hashes = s.get(RequestId(2)).unwrap().hashes.clone();
    assert_eq!(
        ev,
        vec![kvroute_router::kv_events::KvEvent::Removed(
            kvroute_router::kv_events::BlockRemoved {
                block_hashes: vec![req2_hashes[1]],
                medium: Some("GPU".into()),
                group_idx: None,
            }
        )]
    );
    apply(&mut s, &b);
    // Next step: 2 would reuse its first block (free, cached) but needs 2 more: 1 free block.
    let b = s.schedule(&mut cache, 0.0);
    assert_eq!(plan(&b), vec![(1, 1, true)]);
    assert_eq!(s.num_waiting(), 1);
}

#[test]
fn preempting_itself_stops_the_running_pass() {
    let mut cache = KvCache::new(2, BS);
    let mut s = sched(8, 100);
    s.add(req(1, 8, 4));
    let b = s.schedule(&mut cache, 0.0);
    assert_eq!(plan(&b), vec![(1, 8, false)]);
    apply(&mut s, &b);
    // 9 tokens need 3 blocks out of 2: the only running request preempts itself.
    let b = s.schedule(&mut cache, 0.0);
    assert!(b.scheduled.is_empty());
    assert_eq!(b.preempted, vec![RequestId(1)]);
    assert_eq!(cache.num_free(), 2);
}

#[test]
fn removing_frees_blocks_from_any_queue() {
    let mut cache = KvCache::new(8, BS);
    let mut s = sched(1, 100);
    s.add(req(1, 8, 4));
    s.add(req(2, 8, 4));
    s.schedule(&mut cache, 0.0);
    assert_eq!(cache.num_free(), 6);
    assert!(s.remove(RequestId(2), &mut cache).is_some());
    assert!(s.remove(RequestId(1), &mut cache).is_some());
    assert!(s.remove(RequestId(1), &mut cache).is_none());
    assert_eq!(
        (cache.num_free(), s.num_running(), s.num_waiting()),
        (8, 0, 0)
    );
}

#[test]
fn a_prefix_evicted_to_the_host_tier_is_loaded_back_not_recomputed() {
    use crate::engine::cpu_tier::{CpuTierConfig, TierEvents};
    let tier = CpuTierConfig {
        blocks: 8,
        read_bytes_per_s: 1000.0,
        write_bytes_per_s: 1e12,
        latency_s: 0.5,
        bytes_per_token: 10,
        events: TierEvents::Placeholder,
    };
    // Room for one 3-block request at a time.
    let mut cache = KvCache::with_tier(3, BS, Some(tier));
    let mut s = sched(4, 64);
    // Request 1 runs and finishes: its 2 full prompt blocks are cached on the GPU.
    s.add(req(1, 9, 1));
    let b = s.schedule(&mut cache, 0.0);
    apply(&mut s, &b);
    s.remove(RequestId(1), &mut cache);
    // Request 2 (other tokens) evicts them: they are offloaded to the tier first.
    s.add(req(2, 9, 1));
    let b = s.schedule(&mut cache, 1.0);
    apply(&mut s, &b);
    s.remove(RequestId(2), &mut cache);
    assert_eq!(cache.tier().unwrap().len(), 2);
    // Request 1 again: no GPU hit, 2 blocks loaded (0.5 s + 80 bytes at 1000 B/s), then the
    // last token prefilled.
    let same_prompt: Vec<u32> = (1000..1009).collect();
    s.add(Request::new(
        RequestId(3),
        same_prompt,
        1,
        2.0,
        None,
        &EngineHasher::new(0),
        BS,
    ));
    let b = s.schedule(&mut cache, 2.0);
    assert!(b.scheduled.is_empty() && b.landed.is_empty());
    assert_eq!(s.num_pulling(), 1);
    assert_eq!(s.next_ready_at(), Some(2.0 + 0.5 + 0.08));
    let b = s.schedule(&mut cache, 2.58);
    assert_eq!(b.scheduled.len(), 1);
    assert_eq!(b.scheduled[0].num_new_tokens, 1);
    let r = s.get(RequestId(3)).unwrap();
    assert_eq!((r.cached_tokens, r.loaded_tokens), (8, 8));
    assert_eq!(cache.tier().unwrap().counters().loaded_tokens, 8);
    // The loaded blocks are cached on the GPU again.
    assert_eq!(cache.num_cached(), 2);
}

#[test]
fn a_tier_prefix_without_room_waits_for_its_blocks_rather_than_recomputing() {
    use crate::engine::cpu_tier::{CpuTierConfig, TierEvents};
    let tier = CpuTierConfig {
        blocks: 8,
        read_bytes_per_s: 1e12,
        write_bytes_per_s: 1e12,
        latency_s: 0.5,
        bytes_per_token: 10,
        events: TierEvents::Placeholder,
    };
    let mut cache = KvCache::with_tier(5, BS, Some(tier));
    // Steps of one block's tokens: a prompt without room to load could still start a chunk.
    let mut s = sched(4, BS);
    let run = |s: &mut Scheduler, cache: &mut KvCache, id, len, out| {
        s.add(req(id, len, out));
        // Until its prompt is computed.
        for _ in 0..len {
            if s.get(RequestId(id)).is_some_and(|r| r.num_computed >= len) {
                break;
            }
            let b = s.schedule(cache, 1.0);
            apply(s, &b);
        }
        assert!(s.get(RequestId(id)).is_some_and(|r| r.num_computed >= len));
    };
    // Request 1's two full prompt blocks stay cached after it ends; request 2 (13 tokens,
    // decoding within its 4 blocks) and request 4 (2 tokens, then ended) push them to the
    // tier, and request 4's block is left free.
    run(&mut s, &mut cache, 1, 9, 1);
    s.remove(RequestId(1), &mut cache);
    run(&mut s, &mut cache, 2, 13, 5);
    run(&mut s, &mut cache, 4, 2, 1);
    s.remove(RequestId(4), &mut cache);
    assert_eq!((cache.tier().unwrap().len(), cache.num_free()), (2, 1));
    // Request 1's prompt again: its prefix is in the tier and one block is free, two are
    // needed for the load. It waits; it is not recomputed a chunk at a time.
    let same_prompt: Vec<u32> = (1000..1009).collect();
    let h = EngineHasher::new(0);
    s.add(Request::new(
        RequestId(3),
        same_prompt,
        1,
        2.0,
        None,
        &h,
        BS,
    ));
    let b = s.schedule(&mut cache, 2.0);
    assert!(b.admitted.is_empty() && s.num_pulling() == 0);
    // Once request 2 ends the two blocks are loaded.
    s.remove(RequestId(2), &mut cache);
    s.schedule(&mut cache, 3.0);
    assert_eq!(s.num_pulling(), 1);
    assert_eq!(s.get(RequestId(3)).unwrap().cached_tokens, 8);
}
