//! Restarts next to real vLLM engines: an engine restarted on its ports comes back empty and
//! the router forgets its blocks at once; a router restarted next to warm engines knows their
//! caches before any new event (it asks the engines' replay sockets when it connects).
//!
//! Ignored by default; see `real_vllm.rs` for how they run.

use std::time::{Duration, Instant};

use serde_json::Value;

use crate::real_vllm::document;
use crate::support::vllm::{VLLM_BLOCK, VllmEngine, VllmOptions, VllmSetup};
use crate::support::vllm_router::{Exactness, VllmRouter, completion, router_config};

/// Blocks of `body` the router's index holds on `worker` (not capped by the last-token rule).
async fn held(router: &VllmRouter, body: &Value, worker: &str) -> u64 {
    let v = router.explain(body, None).await;
    v["candidates"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["worker"] == worker))
        .map_or(0, |c| c["overlap_blocks"].as_u64().unwrap_or(0))
}

/// Polls until `held` is `want(held)`, for up to `limit`; the last value seen.
async fn held_until(
    router: &VllmRouter,
    body: &Value,
    worker: &str,
    limit: Duration,
    want: impl Fn(u64) -> bool,
) -> u64 {
    let end = Instant::now() + limit;
    loop {
        let h = held(router, body, worker).await;
        if want(h) || Instant::now() > end {
            return h;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs real vLLM: scripts/real-engines/vllm-setup.sh; run by .ci/run"]
async fn a_vllm_engine_restarted_on_its_ports_is_forgotten_then_exact_again() {
    let setup = VllmSetup::locate();
    let mut engines = VllmEngine::start_all(&setup, 1, &VllmOptions::default()).await;
    let router = VllmRouter::start(&router_config(&setup, &engines, "kv_aware", &[])).await;
    let worker = engines[0].name.clone();
    let mut table = Exactness::default();
    let prompts: Vec<Value> = (0..3)
        .map(|i| completion(document(&format!("restart {i}"), 250), 4))
        .collect();
    for p in prompts.iter().chain(&prompts) {
        table.record("before the restart", &router.checked(p, None).await);
    }
    assert!(
        held(&router, &prompts[0], &worker).await > 0,
        "the index never held the prompt"
    );

    // Down: the router must drop the engine's blocks (stale entries are worse than none).
    engines[0].stop();
    let left = held_until(
        &router,
        &prompts[0],
        &worker,
        Duration::from_secs(60),
        |h| h == 0,
    )
    .await;
    assert_eq!(
        left, 0,
        "the router still predicts a stopped engine's cache"
    );
    engines[0].restart().await;
    router.wait_ready().await;
    // Back on the same ports with an empty cache: nothing is predicted, and the engine agrees.
    for p in prompts.iter().chain(&prompts) {
        table.record("after the restart", &router.checked(p, None).await);
    }
    router.shutdown().await;
    table.print("engine restart, 1 engine");
    table.assert_all_exact();
}

/// F2: a router that starts next to an engine with cached prefixes must see them before the
/// engine publishes anything new (replay from the engine's replay socket on connect).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs real vLLM: scripts/real-engines/vllm-setup.sh; run by .ci/run"]
async fn a_router_restarted_next_to_a_warm_vllm_engine_is_exact_before_any_new_event() {
    let setup = VllmSetup::locate();
    let engines = VllmEngine::start_all(&setup, 1, &VllmOptions::default()).await;
    let config = router_config(&setup, &engines, "kv_aware", &[]);
    let worker = engines[0].name.clone();
    let prompts: Vec<Value> = (0..3)
        .map(|i| completion(document(&format!("warm {i}"), 250), 4))
        .collect();
    let first = VllmRouter::start(&config).await;
    let mut tokens = 0;
    for p in &prompts {
        tokens = first.checked(p, None).await.engine_prompt_tokens;
    }
    first.shutdown().await;

    let router = VllmRouter::start(&config).await;
    // No request is sent until the new router has learned the engine's cache.
    let last = &prompts[prompts.len() - 1];
    let full = (tokens - 1) / u64::from(VLLM_BLOCK);
    let blocks = held_until(&router, last, &worker, Duration::from_secs(30), |h| {
        h >= full
    })
    .await;
    assert!(
        blocks >= full,
        "a router restarted next to a warm engine holds {blocks} of the {full} cached blocks of a \
         prompt without a new event (F2: it must replay from the engine's replay socket when it \
         connects)"
    );
    let mut table = Exactness::default();
    for p in &prompts {
        let o = router.checked(p, None).await;
        assert!(
            o.cached > 0,
            "the engine did not serve the warm prompt from cache: {o:?}"
        );
        table.record("router restarted, warm engine", &o);
    }
    router.shutdown().await;
    table.print("router restart, 1 engine");
    table.assert_all_exact();
}
