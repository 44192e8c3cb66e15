//! Prefix pieces (`proxy.prefill_piece_tokens`) against real vLLM: the router's pieces are
//! completions of the token ids it made of the request, and vLLM must find every one of them
//! in its prefix cache when the request comes — for a chat (rendered by the router's copy of
//! the chat template) and for a text completion. A piece of other ids would leave the request
//! with only the cache's first blocks, and its prompt computed twice.
//!
//! Ignored by default; see `real_vllm.rs` for how they run.

use serde_json::{Value, json};

use crate::support::real_router::{RealRouter, chat, completion, router_config};
use crate::support::vllm::{VLLM_BLOCK, VllmEngine, VllmOptions, VllmSetup};

const PIECE: u64 = 1_024;

/// The request's prompt tokens and those vLLM reported cached.
async fn served(router: &RealRouter, path: &str, body: &Value) -> (u64, u64) {
    let resp = reqwest::Client::new()
        .post(router.url(path))
        .json(body)
        .send()
        .await
        .unwrap();
    let status = resp.status();
    let v: Value = resp.json().await.unwrap();
    assert!(status.is_success(), "{status}: {v}");
    let usage = &v["usage"];
    let prompt = usage["prompt_tokens"].as_u64().unwrap();
    let cached = usage["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap_or(0);
    (prompt, cached)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs real vLLM: scripts/real-engines/vllm-setup.sh; run by .ci/run"]
async fn vllm_finds_the_routers_pieces_in_its_prefix_cache() {
    let setup = VllmSetup::locate();
    let options = VllmOptions {
        enforce_eager: true,
        ..VllmOptions::default()
    };
    let mut engines = VllmEngine::start_all(&setup, 1, &options).await;
    let mut config = router_config(&setup, &engines, "kv_aware", &[]);
    config.proxy.prefill_piece_tokens = PIECE as usize;
    let router = RealRouter::start(&config).await;
    router.wait_ready().await;

    let question: String = (0..500).map(|i| format!("river {i} bends. ")).collect();
    let messages = json!([
        {"role": "system", "content": "You answer in one word."},
        {"role": "user", "content": question},
    ]);
    let text: String = (0..500).map(|i| format!("stone {i} falls. ")).collect();
    for (path, body) in [
        ("/v1/chat/completions", chat(messages, 2)),
        ("/v1/completions", completion(text, 2)),
    ] {
        let (prompt, cached) = served(&router, path, &body).await;
        println!("{path}: {prompt} prompt tokens, {cached} cached after the pieces");
        assert!(
            (3 * PIECE..4_000).contains(&prompt),
            "two pieces or more: {prompt}"
        );
        // Every piece ends on a block: all of them were found, whole blocks up to the last.
        let last_piece = (prompt / PIECE - 1) * PIECE;
        assert_eq!(
            cached,
            last_piece / u64::from(VLLM_BLOCK) * u64::from(VLLM_BLOCK)
        );
    }
    let metrics = crate::support::metrics_text(router.handle.addr).await;
    assert!(
        metrics.contains("kvroute_prefill_pieced_requests_total 2"),
        "{metrics}"
    );
    assert!(
        metrics.contains("kvroute_prefill_pieces_total{outcome=\"failed\"} 0"),
        "{metrics}"
    );
    router.shutdown().await;
    engines[0].stop();
}
