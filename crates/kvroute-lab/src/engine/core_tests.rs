use super::*;
use kvroute_router::kv_events::KvEvent;

fn config(num_blocks: u32, budget: usize) -> EngineConfig {
    EngineConfig {
        block_size: 4,
        num_blocks,
        max_num_seqs: 8,
        max_num_batched_tokens: budget,
        ..EngineConfig::default()
    }
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-12
}

/// Steps until idle, returning every outcome.
fn drain(e: &mut EngineCore, mut now: f64) -> Vec<StepOutcome> {
    let mut out = Vec::new();
    while e.has_work() {
        let o = e.step(now);
        assert!(o.num_scheduled > 0, "engine stalled");
        now = o.end;
        out.push(o);
    }
    out
}

#[test]
fn hand_computed_timeline() {
    let mut e = EngineCore::new(config(64, 10)).unwrap();
    let t = e.config().timing;
    e.add_request(RequestId(1), (0..25).collect(), 2, 1.0)
        .unwrap();
    let steps = drain(&mut e, 1.0);
    assert_eq!(steps.len(), 4);
    let prefill: Vec<usize> = steps.iter().map(|s| s.work.prefill_tokens).collect();
    assert_eq!(prefill, vec![10, 10, 5, 0]);
    assert!(close(steps[0].duration, t.prefill_ms(10) / 1000.0));
    assert!(close(steps[2].duration, t.prefill_ms(5) / 1000.0));
    // The decode step holds 7 blocks (26 tokens) of 64.
    assert!(close(steps[3].duration, t.decode_ms(7.0 / 64.0) / 1000.0));
    assert!(steps[..2].iter().all(|s| s.tokens.is_empty()));
    assert_eq!(steps[2].tokens.len(), 1);
    let fin = &steps[3].finished[0];
    assert_eq!(
        (fin.prompt_tokens, fin.output_tokens, fin.cached_tokens),
        (25, 2, 0)
    );
    assert_eq!(fin.queue_time(), Some(0.0));
    assert!(close(fin.ttft().unwrap(), steps[2].end - 1.0));
    assert!(close(fin.e2e(), steps[3].end - 1.0));
    assert_eq!(fin.reason, FinishReason::Length);
    assert_eq!(e.kv_usage(), 0.0);
    let c = e.counters();
    assert_eq!(
        (c.steps, c.prefill_tokens, c.generated_tokens, c.finished),
        (4, 25, 2, 1)
    );
}

#[test]
fn repeated_prompt_hits_cache_and_is_faster() {
    let mut e = EngineCore::new(config(256, 8192)).unwrap();
    let prompt: Vec<u32> = (0..400).collect();
    e.add_request(RequestId(1), prompt.clone(), 1, 0.0).unwrap();
    let first = drain(&mut e, 0.0).pop().unwrap().finished.pop().unwrap();
    e.add_request(RequestId(2), prompt, 1, 10.0).unwrap();
    let second = drain(&mut e, 10.0).pop().unwrap().finished.pop().unwrap();
    assert_eq!(first.cached_tokens, 0);
    assert_eq!(second.cached_tokens, 396);
    assert!(second.ttft().unwrap() < first.ttft().unwrap());
    let c = e.counters();
    assert_eq!((c.queried_tokens, c.hit_tokens), (800, 396));
    assert_eq!((c.queried_blocks, c.hit_blocks), (200, 99));
}

#[test]
fn events_describe_the_cache() {
    let mut e = EngineCore::new(config(8, 100)).unwrap();
    e.add_request(RequestId(1), (0..6).collect(), 3, 0.0)
        .unwrap();
    let steps = drain(&mut e, 0.0);
    let events: Vec<KvEvent> = steps.into_iter().flat_map(|s| s.kv_events).collect();
    // Prompt block [0..4] at admission; [4,5,o0,o1] once the second output is scheduled.
    assert_eq!(events.len(), 2);
    let KvEvent::Stored(b0) = &events[0] else {
        panic!("{events:?}")
    };
    let KvEvent::Stored(b1) = &events[1] else {
        panic!("{events:?}")
    };
    assert_eq!(b0.token_ids, vec![0, 1, 2, 3]);
    assert_eq!(b1.parent_block_hash, Some(b0.block_hashes[0]));
    assert_eq!(&b1.token_ids[..2], &[4, 5]);
    let mut held: Vec<_> = e.with_cache(|c| c.cached_hashes().collect());
    held.sort();
    let mut told = vec![b0.block_hashes[0], b1.block_hashes[0]];
    told.sort();
    assert_eq!(held, told);
    assert!(e.reset_prefix_cache());
    assert_eq!(e.take_kv_events(), vec![KvEvent::AllCleared]);
}

#[test]
fn deterministic_given_a_seed() {
    let run = |seed| {
        let mut e = EngineCore::new(EngineConfig {
            seed,
            ..config(64, 16)
        })
        .unwrap();
        for id in 0..4u64 {
            e.add_request(RequestId(id), (0..(10 + id as u32 * 7)).collect(), 5, 0.0)
                .unwrap();
        }
        drain(&mut e, 0.0)
    };
    assert_eq!(run(3), run(3));
    let tokens = |o: Vec<StepOutcome>| -> Vec<u32> {
        o.into_iter()
            .flat_map(|s| s.tokens)
            .map(|t| t.token)
            .collect()
    };
    assert_ne!(tokens(run(3)), tokens(run(4)));
}

#[test]
fn preemption_is_counted_and_work_completes() {
    // 6 blocks of 4 tokens; three requests that together outgrow the cache.
    let mut e = EngineCore::new(config(6, 100)).unwrap();
    for id in 0..3u64 {
        e.add_request(
            RequestId(id),
            (0..7).map(|t| t + 100 * id as u32).collect(),
            6,
            0.0,
        )
        .unwrap();
    }
    let steps = drain(&mut e, 0.0);
    let finished: Vec<_> = steps.iter().flat_map(|s| &s.finished).collect();
    assert_eq!(finished.len(), 3);
    assert!(finished.iter().all(|f| f.output_tokens == 6));
    let c = e.counters();
    assert!(c.preemptions > 0);
    assert_eq!(
        c.preemptions,
        finished
            .iter()
            .map(|f| u64::from(f.preemptions))
            .sum::<u64>()
    );
}

#[test]
fn abort_frees_blocks() {
    let mut e = EngineCore::new(config(16, 100)).unwrap();
    e.add_request(RequestId(1), (0..20).collect(), 30, 0.0)
        .unwrap();
    e.step(0.0);
    assert!(e.kv_usage() > 0.0);
    let st = e.abort(RequestId(1), 1.0).unwrap();
    assert_eq!(st.reason, FinishReason::Aborted);
    assert_eq!(e.kv_usage(), 0.0);
    assert!(!e.has_work());
    assert!(e.abort(RequestId(1), 1.0).is_none());
    assert_eq!(e.counters().aborted, 1);
}

#[test]
fn rejects_bad_requests_and_configs() {
    let mut e = EngineCore::new(config(4, 100)).unwrap();
    assert_eq!(
        e.add_request(RequestId(1), vec![], 1, 0.0),
        Err(AddError::EmptyPrompt)
    );
    assert_eq!(
        e.add_request(RequestId(1), vec![1], 0, 0.0),
        Err(AddError::NoOutput)
    );
    assert!(matches!(
        e.add_request(RequestId(1), vec![1; 10], 7, 0.0),
        Err(AddError::TooLong { limit: 16, .. })
    ));
    e.add_request(RequestId(1), vec![1], 1, 0.0).unwrap();
    assert_eq!(
        e.add_request(RequestId(1), vec![1], 1, 0.0),
        Err(AddError::Duplicate(RequestId(1)))
    );
    assert_eq!(
        EngineCore::new(EngineConfig {
            block_size: 0,
            ..EngineConfig::default()
        })
        .unwrap_err(),
        ConfigError::Zero("block_size")
    );
    let mut bad = EngineConfig::default();
    bad.timing.speedup = 0.0;
    assert_eq!(EngineCore::new(bad).unwrap_err(), ConfigError::Speedup);
}

#[test]
fn engines_sharing_a_cache_hit_each_others_blocks() {
    use crate::engine::cache_slot::PooledCache;
    use std::sync::{Arc, Mutex};
    let shared: PooledCache = Arc::new(Mutex::new(KvCache::new(64, 4)));
    let mut a = EngineCore::pooled(config(64, 64), shared.clone()).unwrap();
    let mut b = EngineCore::pooled(config(64, 64), shared).unwrap();
    let mut own = EngineCore::new(config(64, 64)).unwrap();
    a.add_request(RequestId(1), (0..25).collect(), 1, 0.0)
        .unwrap();
    drain(&mut a, 0.0);
    // Six full blocks of the prompt are in the shared cache: the other engine hits them
    // (all but the last block's token must run), an engine of its own does not.
    b.add_request(RequestId(2), (0..25).collect(), 1, 1.0)
        .unwrap();
    own.add_request(RequestId(2), (0..25).collect(), 1, 1.0)
        .unwrap();
    let hit = |e: &mut EngineCore| {
        let steps = drain(e, 1.0);
        steps.last().unwrap().finished[0].cached_tokens
    };
    assert_eq!(hit(&mut b), 24);
    assert_eq!(hit(&mut own), 0);
}
