//! A real-time `kvroute engine` with a host-memory KV tier (`--cpu-tier-ratio`) behind a
//! `kvroute serve` that indexes its KV events: a prompt the GPU cache evicts is offloaded to
//! the tier, published as a `CPU` store the router's index shows on `/debug/route`, counted in
//! the engine's `vllm:kv_offload_*` metrics, and loaded back (counted as cached tokens, as
//! vLLM counts its connector's) when the prompt comes again. Both encodings of vLLM's tier
//! events are published: placeholder stores and self-describing ones.

use std::time::Duration;

use serde_json::{Value, json};

use crate::support::{self, EngineAddrs, EngineProcess, RouterProcess};

const MODEL: &str = "sim";
const BLOCK: u64 = 16;
/// The engine's default KV bytes per token (`--kv-bytes-per-token`).
const KV_BYTES_PER_TOKEN: u64 = 147_456;

/// A prompt of `len` token ids from `first` on (exact sizes, whatever the tokenizer).
fn prompt(first: u32, len: u32) -> Value {
    json!((first..first + len).collect::<Vec<u32>>())
}

/// The sum of the samples of `name` (any labels) on a Prometheus page.
fn counter(page: &str, name: &str) -> f64 {
    page.lines()
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|r| r.starts_with(['{', ' ']))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// A completion of one token through the router: (prompt tokens, cached tokens).
async fn complete(router: &RouterProcess, ids: &Value) -> (u64, u64) {
    let resp = support::client()
        .post(format!("http://{}/v1/completions", router.addr))
        .json(&json!({"model": MODEL, "prompt": ids, "max_tokens": 1}))
        .send()
        .await
        .unwrap();
    let status = resp.status();
    let body: Value = resp.json().await.unwrap();
    assert_eq!(status, 200, "{body}");
    let usage = &body["usage"];
    let cached = usage["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap_or(0);
    (usage["prompt_tokens"].as_u64().unwrap(), cached)
}

/// Worker `e0`'s tier split of `ids` on `/debug/route`: (GPU blocks, CPU blocks).
async fn tiers(router: &RouterProcess, ids: &Value) -> (u64, u64) {
    let url = format!("http://{}/debug/route", router.addr);
    let v = support::post_json(&url, &json!({"model": MODEL, "prompt": ids})).await;
    let c = v["candidates"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["worker"] == "e0"))
        .unwrap_or_else(|| panic!("no candidate e0: {v}"));
    let t = &c["tiers"];
    (
        t["gpu_blocks"].as_u64().unwrap(),
        t["cpu_blocks"].as_u64().unwrap(),
    )
}

/// Polls `/debug/route` until `e0` shows `want` for `ids` (the events take a moment); the last
/// split seen.
async fn wait_tiers(router: &RouterProcess, ids: &Value, want: (u64, u64)) -> (u64, u64) {
    let mut seen = tiers(router, ids).await;
    for _ in 0..250 {
        if seen == want {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        seen = tiers(router, ids).await;
    }
    seen
}

async fn engine_offloads_and_loads_back(events: &str) {
    let addrs = EngineAddrs::fresh();
    // 32 GPU blocks of 16 tokens: each 400-token prompt B takes 26, so two of them evict all
    // of prompt A's 12 blocks; the tier holds 4 × 32.
    let flags = [
        "--block-size",
        "16",
        "--num-blocks",
        "32",
        "--cpu-tier-ratio",
        "4",
        "--cpu-tier-events",
        events,
    ];
    let _engine = EngineProcess::start_with(&addrs, MODEL, 20.0, &flags).await;
    let config = format!(
        "policy = \"kv_aware\"\nshutdown_grace_s = 1.0\n[health]\ninterval_s = 0.2\n\
         [[models]]\nname = \"{MODEL}\"\nblock_size = {BLOCK}\n\
         [[workers]]\nid = \"e0\"\nurl = \"http://{}\"\nmodels = [\"{MODEL}\"]\n\
         kv_events = \"{}\"\nkv_replay = \"{}\"\n",
        addrs.http, addrs.events, addrs.replay
    );
    let (router, _file) = RouterProcess::start(&config).await;
    let engine_metrics = || support::metrics_text(addrs.http);

    let a = prompt(1000, 200);
    let (a_tokens, first_cached) = complete(&router, &a).await;
    assert_eq!(first_cached, 0, "a cold engine");
    let full = a_tokens / BLOCK;
    assert_eq!((a_tokens, full), (200, 12));
    assert_eq!(wait_tiers(&router, &a, (full, 0)).await, (full, 0));
    let page = engine_metrics().await;
    assert_eq!(counter(&page, "vllm:kv_offload_store_bytes_total"), 0.0);

    for first in [5000, 9000] {
        complete(&router, &prompt(first, 400)).await;
    }
    // (a) The GPU evicted A; the tier holds it, and the router's index knows where.
    assert_eq!(wait_tiers(&router, &a, (0, full)).await, (0, full));
    // (b) Every evicted block was written to the tier.
    let page = engine_metrics().await;
    let stored = counter(&page, "vllm:kv_offload_store_bytes_total");
    assert!(
        stored >= (full * BLOCK * KV_BYTES_PER_TOKEN) as f64,
        "stored {stored} bytes:\n{page}"
    );
    assert_eq!(counter(&page, "vllm:kv_offload_load_bytes_total"), 0.0);

    // (c) A again: its blocks are loaded (all but the last prompt token's, which is computed)
    // and reported cached, as vLLM reports its connector's tokens.
    let loaded = (a_tokens - 1) / BLOCK * BLOCK;
    let (_, cached) = complete(&router, &a).await;
    assert_eq!(cached, loaded, "A's {a_tokens} tokens, {full} full blocks");
    let page = engine_metrics().await;
    assert_eq!(
        counter(&page, "vllm:kv_offload_load_bytes_total"),
        (loaded * KV_BYTES_PER_TOKEN) as f64,
        "{page}"
    );
    // Loaded back, A is on the GPU again.
    assert_eq!(wait_tiers(&router, &a, (full, 0)).await.0, full);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_with_a_cpu_tier_offloads_publishes_and_loads_back() {
    tokio::time::timeout(
        Duration::from_secs(60),
        engine_offloads_and_loads_back("placeholder"),
    )
    .await
    .expect("finished in time");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn self_describing_tier_events_reach_the_router_from_a_real_time_engine() {
    tokio::time::timeout(
        Duration::from_secs(60),
        engine_offloads_and_loads_back("self-describing"),
    )
    .await
    .expect("finished in time");
}
