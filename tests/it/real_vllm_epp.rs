//! `kvroute epp` in front of real vLLM engines, driven by the Envoy stand-in
//! (`support::gateway`): beside it a `kvroute serve` over the same engines with the same
//! configuration, both fed by the engines' own KV events. A repeated prompt's pick through the
//! gateway is the worker `serve`'s `/debug/route` names for it at that moment — the engine that
//! holds it — and vLLM reports exactly the reuse `serve` predicted on the picked engine, for
//! every request.
//!
//! Ignored by default; see `real_vllm.rs` for how they run.

use std::sync::Arc;

use kvroute::epp::Listeners;
use tokio::net::TcpListener;

use crate::support::eventually;
use crate::support::gateway::{Call, Gateway};
use crate::support::real_router::{RealRouter, completion, router_config};
use crate::support::request_kinds::document;
use crate::support::vllm::{VllmEngine, VllmOptions, VllmSetup};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs real vLLM: scripts/real-engines/vllm-setup.sh; run by .ci/run"]
async fn real_vllm_epp_picks_as_serve_and_repeats_hit_the_engine_holding_them() {
    let setup = VllmSetup::locate();
    let engines = VllmEngine::start_all(&setup, 2, &VllmOptions::default()).await;
    let config = router_config(&setup, &engines, "kv_aware", &[]);
    let serve = RealRouter::start(&config).await;
    serve.wait_ready().await;
    let bind = || async { TcpListener::bind("127.0.0.1:0").await.unwrap() };
    let listeners = Listeners {
        grpc: bind().await,
        health: bind().await,
        metrics: bind().await,
    };
    let epp = kvroute::epp::start(&config, listeners).unwrap();
    let fleet = Arc::clone(&epp.state.fleet);
    let now = std::time::Instant::now;
    assert!(
        eventually(|| fleet
            .workers()
            .iter()
            .filter(|w| w.is_routable(now()))
            .count()
            == 2)
        .await,
        "the picker sees both engines"
    );
    let gateway = Gateway::connect(epp.grpc_addr).await;
    let worker_of = |endpoint: &str| {
        engines
            .iter()
            .find(|e| e.url().ends_with(endpoint))
            .map(|e| e.name.clone())
            .expect("an engine's endpoint")
    };
    for topic in ["harbor", "orchard", "canyon", "lantern"] {
        let body = completion(document(topic, 300), 4);
        let bytes = serde_json::to_vec(&body).unwrap();
        for turn in ["first", "repeat"] {
            let explained = serve.explain(&body, None).await;
            let answer = gateway.request(Call::post("/v1/completions", &bytes)).await;
            assert_eq!(
                answer.status,
                200,
                "{}",
                String::from_utf8_lossy(&answer.body)
            );
            let picked = worker_of(&answer.destination.unwrap());
            // A new prompt ties both engines; ties go by requests admitted so far, which only
            // the picker has (serve is only asked): the pick is compared on the repeat, which
            // the prefix decides.
            if turn == "repeat" {
                assert_eq!(
                    picked, explained["worker"],
                    "{topic}: epp picks as serve would"
                );
            }
            let usage: serde_json::Value = serde_json::from_slice(&answer.body).unwrap();
            let cached = usage["usage"]["prompt_tokens_details"]["cached_tokens"]
                .as_u64()
                .unwrap_or(0);
            let predicted = explained["candidates"]
                .as_array()
                .unwrap()
                .iter()
                .find(|c| c["worker"] == picked.as_str())
                .and_then(|c| c["cached_tokens"].as_u64())
                .unwrap_or(0);
            assert_eq!(
                cached, predicted,
                "{topic} {turn}: vLLM's reuse is the predicted one"
            );
            if turn == "repeat" {
                assert!(cached > 0, "{topic}: the repeat hits the engine holding it");
            }
            let prompt = usage["usage"]["prompt_tokens"].as_u64().unwrap_or(0);
            let blocks = prompt.saturating_sub(1) / u64::from(kvroute_block(&setup));
            serve.settle(&body, None, &picked, blocks).await;
            // The picker reads the same events; wait until it has as many batches as serve.
            let want = serve.event_batches(&picked).await;
            let metrics = epp.metrics_addr;
            let mut have = 0.0;
            for _ in 0..500 {
                have = batches(metrics, &picked).await;
                if have >= want {
                    break;
                }
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
            assert!(
                have >= want,
                "the picker's index caught up ({have} < {want})"
            );
        }
    }
    epp.shutdown().await;
    serve.shutdown().await;
}

fn kvroute_block(setup: &VllmSetup) -> u32 {
    use crate::support::real_router::RouterModel;
    setup.block_size()
}

/// Event batches the picker has received from `worker` (its `/metrics`).
async fn batches(addr: std::net::SocketAddr, worker: &str) -> f64 {
    let text = crate::support::backend::metrics_text(addr).await;
    let series = format!("kvroute_kv_events_total{{kind=\"batches\",worker=\"{worker}\"}}");
    text.lines()
        .find_map(|l| l.strip_prefix(series.as_str())?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0)
}
