//! `cache_aware` learning from what it routed (`SimConfig::cache_aware_index`), as the SGLang
//! router's own radix tree does, beside policies that hear the engines' KV events.

use std::collections::HashMap;
use std::time::Duration;

use kvroute::engine::EngineConfig;
use kvroute::policy::PolicyKind;
use kvroute::sim::{IndexMode, PolicyRun, SimConfig, Simulation, dynamo_mocker_engine};
use kvroute::workload::Trace;
use kvroute::workload::synthetic::{SyntheticKind, SyntheticSpec};

/// Conversations of eight turns, each turn extending the last.
fn conversations() -> Trace {
    SyntheticSpec {
        kind: SyntheticKind::MultiTurn {
            turns: 8,
            think_s: 4.0,
        },
        requests: 480,
        rate: 8.0,
        input_tokens: 1024,
        output_tokens: 32,
        block_tokens: 64,
        seed: 3,
    }
    .generate()
    .unwrap()
}

/// Four workers whose caches hold a few conversations each, so the engines evict.
fn small_caches() -> SimConfig {
    SimConfig {
        workers: 4,
        engine: EngineConfig {
            num_blocks: 192,
            ..dynamo_mocker_engine()
        },
        ..SimConfig::default()
    }
}

fn run(trace: &Trace, config: &SimConfig, policy: PolicyKind) -> PolicyRun {
    Simulation::new(trace, config, policy).unwrap().run()
}

fn workers(run: &PolicyRun) -> Vec<Option<u32>> {
    run.records.iter().map(|r| r.worker).collect()
}

/// Turns that went to another worker than their conversation's previous turn (a
/// conversation is named by its first block: every turn starts with it).
fn moves(trace: &Trace, run: &PolicyRun) -> usize {
    let mut last: HashMap<u64, Option<u32>> = HashMap::new();
    let mut moved = 0;
    for (request, record) in trace.requests.iter().zip(&run.records) {
        let conversation = request.hash_ids[0];
        if let Some(before) = last.insert(conversation, record.worker)
            && before != record.worker
        {
            moved += 1;
        }
    }
    moved
}

#[test]
fn cache_aware_can_learn_from_what_it_routed_while_the_others_hear_events() {
    let trace = conversations();
    let events = small_caches();
    let day = Duration::from_secs(86_400);
    let own = SimConfig {
        cache_aware_index: Some(IndexMode::Approx),
        approx_ttl: day,
        ..small_caches()
    };
    let all_approx = SimConfig {
        index: IndexMode::Approx,
        approx_ttl: day,
        ..small_caches()
    };
    // cache_aware routes exactly as on a fleet without events…
    let ca_own = run(&trace, &own, PolicyKind::CacheAware);
    assert_eq!(
        workers(&ca_own),
        workers(&run(&trace, &all_approx, PolicyKind::CacheAware))
    );
    // …while kv_aware in the same configuration still hears the engines' events.
    assert_eq!(
        workers(&run(&trace, &own, PolicyKind::KvAware)),
        workers(&run(&trace, &events, PolicyKind::KvAware))
    );
    // Hearing the engines evict, cache_aware moves conversations whose home dropped their
    // prefix; remembering what it routed, it sends them home.
    let ca_events = run(&trace, &events, PolicyKind::CacheAware);
    let (heard, remembered) = (moves(&trace, &ca_events), moves(&trace, &ca_own));
    assert!(
        remembered < heard,
        "moves with events {heard}, remembering its routes {remembered}"
    );
    // A memory shorter than the think time forgets every conversation between its turns.
    let forgetful = SimConfig {
        approx_ttl: Duration::from_millis(100),
        ..own.clone()
    };
    let forgot = moves(&trace, &run(&trace, &forgetful, PolicyKind::CacheAware));
    assert!(
        forgot > remembered,
        "moves forgetting {forgot}, remembering {remembered}"
    );
}

#[test]
fn an_approximate_index_that_forgets_at_once_is_refused() {
    let config = SimConfig {
        approx_ttl: Duration::ZERO,
        ..SimConfig::default()
    };
    let trace = conversations();
    assert!(Simulation::new(&trace, &config, PolicyKind::CacheAware).is_err());
}
