//! Prefix hits are counted under load-only policies too: a router with `least_request` in front
//! of engines hashes each prompt off the request's path and counts
//! `kvroute_prefix_hit_blocks_total` for the worker it chose, from KV events or, for a worker
//! without them, from its own predictions.

use std::time::Duration;

use kvroute::policy::PolicyKind;
use serde_json::json;

use crate::support::{self, Backend, SimEngine};

const MODEL: &str = "sim";

/// The sum of a counter's series in the router's metrics.
fn total(metrics: &str, name: &str) -> u64 {
    metrics
        .lines()
        .filter(|l| l.starts_with(name))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

async fn wait_metric(addr: std::net::SocketAddr, name: &str, at_least: u64) -> u64 {
    for _ in 0..400 {
        let v = total(&support::metrics_text(addr).await, name);
        if v >= at_least {
            return v;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    total(&support::metrics_text(addr).await, name)
}

/// 64 words = 4 blocks of 16 tokens (3 reusable: the last token is always computed).
fn prompt() -> String {
    words(64)
}

/// `n` words, one token each.
fn words(n: usize) -> String {
    (0..n)
        .map(|i| format!("w{i}"))
        .collect::<Vec<_>>()
        .join(" ")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn least_request_counts_hits_from_kv_events() {
    counts_hits_from_kv_events(&prompt(), 4).await;
}

/// A body over the inline limit (2 KiB) is analysed by a task of its own, off the path; a
/// small one on it: both count the same way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn least_request_counts_hits_of_a_long_prompt_analysed_off_the_path() {
    let long = words(640);
    assert!(
        long.len() > 2 << 10,
        "the body must exceed the inline limit"
    );
    counts_hits_from_kv_events(&long, 40).await;
}

/// Sends `prompt` (`blocks` blocks of 16 tokens) twice through a `least_request` router in
/// front of one engine with KV events: the first is queried and misses, the second hits every
/// reusable block. The engine's replay endpoint is configured as a deployment's would be: the
/// first request may be served before the subscription has joined (ZeroMQ's slow joiner), and
/// without replay its stored blocks would be lost. The test failed once under the whole
/// suite's load; that this was the cause is a reading, its output was not kept.
async fn counts_hits_from_kv_events(prompt: &str, blocks: u64) {
    let engine = SimEngine::start(MODEL, 0, 50.0).await;
    let extra = format!(
        "[[models]]\nname = \"{MODEL}\"\nblock_size = 16\n[[workers]]\nid = \"e0\"\nurl = \"http://{}\"\nmodels = [\"{MODEL}\"]\nkv_events = \"{}\"\nkv_replay = \"{}\"\n",
        engine.addr, engine.events, engine.replay
    );
    let config = support::router_config(PolicyKind::LeastRequest, &[], &extra);
    let router = support::start_router(&config).await;
    let http = support::client();
    let body = json!({"model": MODEL, "prompt": prompt, "max_tokens": 2});
    let url = format!("http://{}/v1/completions", router.addr);
    assert_eq!(
        http.post(&url).json(&body).send().await.unwrap().status(),
        200
    );
    assert_eq!(
        wait_metric(router.addr, "kvroute_prefix_queried_blocks_total", blocks).await,
        blocks
    );
    // The engine's events reach the index, then the same prompt again.
    assert!(wait_metric(router.addr, "kvroute_index_entries", blocks).await >= blocks);
    assert_eq!(
        total(
            &support::metrics_text(router.addr).await,
            "kvroute_prefix_hit_blocks_total"
        ),
        0
    );
    assert_eq!(
        http.post(&url).json(&body).send().await.unwrap().status(),
        200
    );
    assert_eq!(
        wait_metric(router.addr, "kvroute_prefix_hit_blocks_total", blocks - 1).await,
        blocks - 1,
        "the repeated prompt's reusable blocks were on the chosen worker"
    );
    assert_eq!(
        total(
            &support::metrics_text(router.addr).await,
            "kvroute_prefix_queried_blocks_total"
        ),
        2 * blocks
    );
    router.shutdown().await;
    let _ = engine.handle.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn round_robin_counts_predicted_hits_without_events() {
    let backend = Backend::start("b0", &[MODEL]).await;
    let workers = [(backend.url(), vec![MODEL])];
    let extra = format!("[[models]]\nname = \"{MODEL}\"\nblock_size = 16\n");
    let config = support::router_config(PolicyKind::RoundRobin, &workers, &extra);
    let router = support::start_router(&config).await;
    let http = support::client();
    let body = json!({"model": MODEL, "prompt": prompt(), "max_tokens": 2});
    let url = format!("http://{}/v1/completions", router.addr);
    assert_eq!(
        http.post(&url).json(&body).send().await.unwrap().status(),
        200
    );
    assert_eq!(
        wait_metric(router.addr, "kvroute_prefix_queried_blocks_total", 4).await,
        4
    );
    assert_eq!(
        http.post(&url).json(&body).send().await.unwrap().status(),
        200
    );
    assert_eq!(
        wait_metric(router.addr, "kvroute_prefix_hit_blocks_total", 3).await,
        3,
        "the first request's blocks were predicted on the worker it went to"
    );
    router.shutdown().await;
}
