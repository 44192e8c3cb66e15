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
    (0..64)
        .map(|i| format!("w{i}"))
        .collect::<Vec<_>>()
        .join(" ")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn least_request_counts_hits_from_kv_events() {
    let engine = SimEngine::start(MODEL, 0, 50.0).await;
    let extra = format!(
        "[[models]]\nname = \"{MODEL}\"\nblock_size = 16\n[[workers]]\nid = \"e0\"\nurl = \"http://{}\"\nmodels = [\"{MODEL}\"]\nkv_events = \"{}\"\n",
        engine.addr, engine.events
    );
    let config = support::router_config(PolicyKind::LeastRequest, &[], &extra);
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
    // The engine's events reach the index, then the same prompt again.
    assert!(wait_metric(router.addr, "kvroute_index_entries", 4).await >= 4);
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
        wait_metric(router.addr, "kvroute_prefix_hit_blocks_total", 3).await,
        3,
        "the repeated prompt's reusable blocks were on the chosen worker"
    );
    assert_eq!(
        total(
            &support::metrics_text(router.addr).await,
            "kvroute_prefix_queried_blocks_total"
        ),
        8
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
