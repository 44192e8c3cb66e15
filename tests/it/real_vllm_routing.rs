//! Routing against real vLLM engines, measured by the engines themselves: shared-prefix
//! groups concentrate under `kv_aware`, and the engines' `vllm:prefix_cache_hits` /
//! `vllm:prefix_cache_queries` show the gain over `round_robin`.
//!
//! Ignored by default; see `real_vllm.rs` for how they run.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use crate::real_vllm::document;
use crate::support::vllm::{VllmEngine, VllmOptions, VllmSetup};
use crate::support::vllm_router::{Exactness, VllmRouter, completion, router_config};

/// Not a multiple of the engine count, so `round_robin` moves each group from engine to engine.
const GROUPS: usize = 5;
const ROUNDS: usize = 4;

/// What one policy's phase did, from the engines' own counters.
struct Phase {
    hits: f64,
    queries: f64,
    /// Workers each group's requests went to.
    workers: BTreeMap<usize, BTreeSet<String>>,
}

impl Phase {
    fn hit_rate(&self) -> f64 {
        self.hits / self.queries.max(1.0)
    }
}

/// Engines' (hits, queries) summed.
async fn counters(engines: &[VllmEngine]) -> (f64, f64) {
    let mut sum = (0.0, 0.0);
    for e in engines {
        let (h, q) = e.prefix_cache().await;
        sum.0 += h;
        sum.1 += q;
    }
    sum
}

/// `GROUPS` documents of its own (cold everywhere), `ROUNDS` questions each, interleaved.
async fn phase(
    setup: &VllmSetup,
    engines: &[VllmEngine],
    policy: &str,
    table: &mut Exactness,
) -> Phase {
    let before = counters(engines).await;
    let router = VllmRouter::start(&router_config(setup, engines, policy, &[])).await;
    let docs: Vec<String> = (0..GROUPS)
        .map(|g| document(&format!("{policy} group {g}"), 300))
        .collect();
    let mut workers: BTreeMap<usize, BTreeSet<String>> = BTreeMap::new();
    let mut prompt_tokens = 0.0;
    for round in 0..ROUNDS {
        for (g, doc) in docs.iter().enumerate() {
            let body = completion(format!("{doc}\nQuestion {round}:"), 4);
            // Load-only policies skip the prefix analysis, so only kv_aware has predictions.
            let (worker, tokens) = if policy == "kv_aware" {
                let o = router.checked(&body, None).await;
                table.record("routing (kv_aware)", &o);
                (o.worker, o.engine_prompt_tokens)
            } else {
                let (worker, answer) = router.send(&body, None).await;
                (
                    worker,
                    answer["usage"]["prompt_tokens"].as_u64().unwrap_or(0),
                )
            };
            prompt_tokens += tokens as f64;
            workers.entry(g).or_default().insert(worker);
        }
    }
    router.shutdown().await;
    // The engines count a request's queries when they schedule it; wait for all of them.
    let end = Instant::now() + Duration::from_secs(30);
    let mut after = counters(engines).await;
    while after.1 - before.1 < prompt_tokens && Instant::now() < end {
        tokio::time::sleep(Duration::from_millis(100)).await;
        after = counters(engines).await;
    }
    Phase {
        hits: after.0 - before.0,
        queries: after.1 - before.1,
        workers,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs real vLLM: scripts/real-engines/vllm-setup.sh; run by .ci/run"]
async fn kv_aware_concentrates_prefixes_and_real_vllm_hits_more_than_round_robin() {
    let setup = VllmSetup::locate();
    let engines = VllmEngine::start_all(&setup, 3, &VllmOptions::default()).await;
    let rss: Vec<f64> = engines.iter().map(VllmEngine::rss_mib).collect();
    println!(
        "engine RSS (MiB, all processes of each engine): {:?}, total {:.0}",
        rss.iter().map(|r| r.round()).collect::<Vec<_>>(),
        rss.iter().sum::<f64>()
    );
    let mut table = Exactness::default();
    let rr = phase(&setup, &engines, "round_robin", &mut table).await;
    let kv = phase(&setup, &engines, "kv_aware", &mut table).await;
    for (name, p) in [("round_robin", &rr), ("kv_aware", &kv)] {
        let spread: Vec<usize> = p.workers.values().map(BTreeSet::len).collect();
        println!(
            "{name}: engines' prefix-cache hit rate {:.3} ({} hits / {} queries, tokens); \
             workers per group {spread:?}",
            p.hit_rate(),
            p.hits,
            p.queries
        );
    }
    table.print("routing, 3 engines");
    assert!(
        kv.workers.values().all(|w| w.len() == 1),
        "kv_aware spread a shared-prefix group over several engines: {:?}",
        kv.workers
    );
    assert!(
        rr.workers.values().all(|w| w.len() > 1),
        "round_robin kept a group on one engine (the comparison measures nothing): {:?}",
        rr.workers
    );
    assert!(
        kv.hit_rate() > rr.hit_rate(),
        "the engines hit their prefix caches no more under kv_aware ({:.3}) than under \
         round_robin ({:.3})",
        kv.hit_rate(),
        rr.hit_rate()
    );
    table.assert_all_exact();
}
