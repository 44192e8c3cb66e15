//! LoRA adapters: a request that names an adapter as its model is hashed as the engine's KV
//! events name that adapter's blocks (base model plus `lora_name`), so it finds them, and only
//! them; and a worker configured without models hashes its events for the model it reports.

use std::time::Duration;

use kvroute::config::Config;
use kvroute::kv_events::{
    BlockStored, EngineHash, EventBatch, KvEvent, Publisher, PublisherConfig,
};
use kvroute::server::RouterHandle;
use serde_json::json;

use crate::support;

const BASE: &str = "base-model";
const ADAPTER: &str = "sql-lora";
const BLOCKS: u64 = 4;

/// One BlockStored of `BLOCKS` blocks of the prompt `0..64`, for the adapter or the base.
fn stored(first_id: u64, lora: Option<&str>) -> EventBatch {
    EventBatch {
        ts: 0.0,
        events: vec![KvEvent::Stored(BlockStored {
            block_hashes: (first_id..first_id + BLOCKS).map(EngineHash).collect(),
            token_ids: (0..(BLOCKS * 16) as u32).collect(),
            block_size: 16,
            lora_id: lora.map(|_| 1),
            lora_name: lora.map(str::to_owned),
            ..BlockStored::default()
        })],
        dp_rank: Some(0),
    }
}

/// Overlap of worker `w0` for the prompt `0..=64` sent as `model`, from `/debug/route`.
async fn overlap(router: &RouterHandle, model: &str) -> u64 {
    // One token past the blocks: an engine never serves the last prompt token from cache, so a
    // prompt of exactly `BLOCKS` blocks could reuse only `BLOCKS - 1`.
    let body = json!({"model": model, "prompt": (0..=(BLOCKS * 16) as u32).collect::<Vec<_>>()});
    let v = support::post_json(&format!("http://{}/debug/route", router.addr), &body).await;
    v["candidates"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["worker"] == "w0"))
        .and_then(|c| c["overlap_blocks"].as_u64())
        .unwrap_or_else(|| panic!("no candidate w0: {v}"))
}

/// Publishes `batch` again and again until `model`'s overlap reaches `BLOCKS` (the subscriber
/// connects asynchronously); false if it never does.
async fn publish_until_held(
    router: &RouterHandle,
    publisher: &Publisher,
    batch: &EventBatch,
    model: &str,
) -> bool {
    for _ in 0..100 {
        publisher.publish(batch);
        tokio::time::sleep(Duration::from_millis(50)).await;
        if overlap(router, model).await == BLOCKS {
            return true;
        }
    }
    false
}

async fn start(backend: &support::Backend, models: &str, extra: &str) -> (RouterHandle, Publisher) {
    let publisher = Publisher::bind(PublisherConfig::new("tcp://127.0.0.1:*")).unwrap();
    let text = format!(
        "policy = \"kv_aware\"\nshutdown_grace_s = 1.0\n[health]\ninterval_s = 0.1\n{extra}\n\
         [[workers]]\nid = \"w0\"\nurl = \"{}\"\n{models}\nkv_events = \"{}\"\n",
        backend.url(),
        publisher.endpoint()
    );
    let config = Config::from_toml(&text, std::path::Path::new("test")).unwrap();
    (support::start_router(&config).await, publisher)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_configured_adapter_finds_its_own_blocks_and_not_the_base_models() {
    let backend = support::Backend::start("b", &[BASE, ADAPTER]).await;
    let adapter = format!("[[models]]\nname = \"{ADAPTER}\"\nbase_model = \"{BASE}\"");
    let (router, publisher) = start(
        &backend,
        &format!("models = [\"{BASE}\", \"{ADAPTER}\"]"),
        &adapter,
    )
    .await;
    assert!(
        publish_until_held(&router, &publisher, &stored(100, Some(ADAPTER)), ADAPTER).await,
        "the adapter's blocks never matched a request for the adapter"
    );
    // The same tokens under the base model are another cache.
    assert_eq!(overlap(&router, BASE).await, 0);
    assert!(publish_until_held(&router, &publisher, &stored(200, None), BASE).await);
    assert_eq!(overlap(&router, ADAPTER).await, BLOCKS);
    router.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adapters_and_the_model_are_learned_from_the_workers_model_list() {
    // No models configured anywhere: the worker's /v1/models names the base model and lists the
    // adapter with it as `parent`, as vLLM does.
    let backend = support::Backend::start("b", &[BASE, ADAPTER]).await;
    backend.set(|b| b.adapters = vec![(ADAPTER.into(), BASE.into())]);
    let (router, publisher) = start(&backend, "", "").await;
    assert!(
        publish_until_held(&router, &publisher, &stored(100, Some(ADAPTER)), ADAPTER).await,
        "the adapter's blocks never matched a request for the adapter"
    );
    assert_eq!(overlap(&router, BASE).await, 0);
    assert!(
        publish_until_held(&router, &publisher, &stored(200, None), BASE).await,
        "events of a worker configured without models never matched its model"
    );
    router.shutdown().await;
}
