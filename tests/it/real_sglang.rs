//! kvroute in front of real SGLang engines (0.5.23's CPU engine, the tiny random-weight Qwen3
//! with the project's Qwen3 tokenizer): what the router predicts an engine will reuse must be
//! what the engine then reports (`--enable-cache-report`), request by request. SGLang differs
//! from vLLM where kvroute must cope: signed 64-bit block hashes (negative ones occur), many
//! blocks per `BlockRemoved`, an `AllBlocksCleared` at sequence 0, page size 16.
//!
//! Ignored by default (they need `scripts/real-engines/sglang-setup.sh`, ~7 GB); `.ci/run` runs
//! them with `cargo test --test it real_sglang -- --ignored --test-threads=1`. Each test starts
//! two engines (~20 s, ~4.5 GB each; more on a busy machine) and stops them, also when it
//! fails; to keep the stage short, one pair of engines serves every scenario that fits a
//! default-sized cache (request kinds, routing, restarts), and a second pair the small cache
//! that evicts. Run with `--nocapture` to see the tables. The scenarios are shared with the vLLM suite
//! (`support/request_kinds.rs`, `support/real_scenarios.rs`); what SGLang does not support
//! (LoRA on its CPU engine, `prompt_logprobs`) is explained in `docs/real-sglang.md`.

use std::time::{Duration, Instant};

use serde_json::json;

use crate::support::metrics_text;
use crate::support::real_engine::{EngineProc, metric_sum};
use crate::support::real_router::{Exactness, RealRouter, router_config};
use crate::support::real_scenarios::{
    engine_restart, evicting_cache, kv_aware_beats_round_robin, router_restart, tenant_salts,
    the_official_openai_python_sdk_streams, wrong_block_size_mismatches,
};
use crate::support::request_kinds::{client_salt_requests, common_request_kinds};
use crate::support::sglang::{SglangEngine, SglangOptions, SglangSetup};

/// On two engines: every request kind kvroute tokenizes differently, clients' and tenants'
/// salts and the official SDK streaming (exactness, clients); shared-prefix groups under
/// `round_robin` then `kv_aware`, measured by SGLang's own `sglang:cached_tokens_total` /
/// `sglang:prompt_tokens_total` (routing); a router restarted next to a warm engine, then that
/// engine restarted on its ports (lifecycle). Every request of every part is checked for
/// exactness.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs real SGLang: scripts/real-engines/sglang-setup.sh; run by .ci/run"]
async fn predicted_reuse_equals_sglang_cached_tokens_for_every_request_kind_route_and_restart() {
    let setup = SglangSetup::locate();
    let mut engines = SglangEngine::start_all(&setup, 2, &SglangOptions::default()).await;
    let rss: Vec<f64> = engines.iter().map(|e| e.rss_mib()).collect();
    println!(
        "engine RSS (MiB, all processes of each engine): {:?}, total {:.0}",
        rss.iter().map(|r| r.round()).collect::<Vec<_>>(),
        rss.iter().sum::<f64>()
    );
    let router = RealRouter::start(&router_config(&setup, &engines, "kv_aware", &[])).await;
    the_router_reads_each_engines_capacity_from_its_metrics(&router, &engines).await;
    let mut table = Exactness::default();
    // SGLang renders no tools for "none", only the named one for a named function, and all of
    // them (through its request model) otherwise: each is checked.
    let named = json!({"type": "function", "function": {"name": "get_time"}});
    let choices = [json!("none"), json!("auto"), named];
    common_request_kinds(&router, &mut table, &choices, true).await;
    client_salt_requests(&router, &mut table).await;
    the_official_openai_python_sdk_streams(&setup.python, &router).await;
    router.assert_no_cached_token_mismatch().await;
    router.shutdown().await;
    tenant_salts(&setup, &engines, &mut table).await;
    wrong_block_size_mismatches(&setup, &engines).await;
    table.print("request kinds, 2 SGLang engines");

    // Fresh documents: what the engines already hold does not help either policy.
    let mut routing = Exactness::default();
    kv_aware_beats_round_robin(&setup, &engines, &mut routing).await;
    routing.print("routing, 2 SGLang engines");

    let mut restarts = Exactness::default();
    router_restart(&setup, &engines[0], &mut restarts).await;
    engine_restart(&setup, &mut engines[0], &mut restarts).await;
    restarts.print("router and engine restarts, 1 SGLang engine");

    table.assert_all_exact();
    routing.assert_all_exact();
    restarts.assert_all_exact();
}

/// The router's `kvroute_worker_kv_blocks` for each engine equals SGLang's own
/// `sglang:max_total_num_tokens / sglang:page_size` (read by the health checker).
async fn the_router_reads_each_engines_capacity_from_its_metrics(
    router: &RealRouter,
    engines: &[EngineProc],
) {
    for e in engines {
        let text = e.metrics().await;
        let want = (metric_sum(&text, "sglang:max_total_num_tokens")
            / metric_sum(&text, "sglang:page_size"))
        .floor();
        assert!(want >= 1.0, "SGLang reports no capacity:\n{text}");
        let series = format!("kvroute_worker_kv_blocks{{worker=\"{}\"}} ", e.name);
        let end = Instant::now() + Duration::from_secs(30);
        let seen = loop {
            let page = metrics_text(router.handle.addr).await;
            let seen = page
                .lines()
                .find_map(|l| l.strip_prefix(series.as_str()))
                .and_then(|v| v.trim().parse::<f64>().ok());
            if seen == Some(want) || Instant::now() > end {
                break seen;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        assert_eq!(
            seen,
            Some(want),
            "the router's capacity for {} is not SGLang's tokens over page size",
            e.name
        );
        println!(
            "capacity of {}: {want} blocks (SGLang's metrics and the router agree)",
            e.name
        );
    }
}

/// A cache of 1,024 tokens (64 pages of 16) per engine under ten prompts of ~20–40 pages:
/// SGLang's radix cache evicts, publishes `BlockRemoved` (several blocks per event), and the
/// prediction follows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs real SGLang: scripts/real-engines/sglang-setup.sh; run by .ci/run"]
async fn predicted_reuse_stays_exact_while_a_small_sglang_cache_evicts() {
    let setup = SglangSetup::locate();
    let options = SglangOptions {
        max_total_tokens: 1024,
        context_length: 1024,
    };
    let engines = SglangEngine::start_all(&setup, 2, &options).await;
    let mut table = Exactness::default();
    evicting_cache(&setup, &engines, &mut table).await;
    table.print("1,024-token caches, 2 SGLang engines");
    table.assert_all_exact();
}
