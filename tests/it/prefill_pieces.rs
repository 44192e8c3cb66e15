//! Long prompts sent in prefix pieces (`proxy.prefill_piece_tokens`): the router sends the
//! prompt's prefixes as one-token completions of its token ids before the request, and the
//! engine then finds all of them cached; a short prompt, or one the worker already holds, goes
//! whole. Checked on what the engine reports and the router counts, not on timings.

use std::path::Path;

use kvroute::config::Config;
use serde_json::{Value, json};
use tokio::net::TcpListener;

use crate::support::{self, SimEngine};

const MODEL: &str = "sim";
const PIECE: u64 = 1_024;

fn words(n: usize, salt: &str) -> String {
    (0..n).map(|i| format!("{salt}{i} ")).collect()
}

async fn router(engine: &SimEngine, extra: &str) -> kvroute::server::RouterHandle {
    let text = format!(
        "policy = \"kv_aware\"\nshutdown_grace_s = 1.0\n[proxy]\nprefill_piece_tokens = {PIECE}\n{extra}\n[[models]]\nname = \"{MODEL}\"\nblock_size = 16\n"
    );
    let mut config = Config::from_toml(&text, Path::new("test")).expect("config");
    config.workers = vec![engine.worker("e0", MODEL)];
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    kvroute::server::start(&config, listener).expect("router")
}

/// The router's counter `name` (with its label set, if any) from its metrics text.
fn counter(text: &str, name: &str) -> u64 {
    text.lines()
        .find(|l| l.starts_with(name))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse::<f64>().ok())
        .map_or(0, |v| v as u64)
}

async fn complete(router: &kvroute::server::RouterHandle, body: &Value) -> Value {
    let resp = support::client()
        .post(format!("http://{}/v1/completions", router.addr))
        .json(body)
        .send()
        .await
        .expect("router answers");
    assert_eq!(resp.status(), 200);
    resp.json().await.expect("a JSON answer")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_prompt_reaches_its_engine_in_pieces_and_finds_them_cached() {
    let engine = SimEngine::start(MODEL, 0, 8.0).await;
    let router = router(&engine, "").await;
    let long = json!({"model": MODEL, "prompt": words(4_000, "w"), "max_tokens": 2});
    let answer = complete(&router, &long).await;
    let usage = &answer["usage"];
    let prompt = usage["prompt_tokens"].as_u64().expect("prompt tokens");
    assert!(
        prompt >= 3 * PIECE,
        "a prompt of three pieces or more: {prompt}"
    );
    // Every piece's blocks were in the engine's cache when the request came: all but its last
    // one to two pieces.
    let cached = usage["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap_or(0);
    assert!(cached + 2 * PIECE > prompt && cached >= PIECE, "{usage}");
    let metrics = support::metrics_text(router.addr).await;
    let answered = counter(
        &metrics,
        "kvroute_prefill_pieces_total{outcome=\"answered\"}",
    );
    assert_eq!(answered, prompt / PIECE - 1, "{metrics}");
    assert_eq!(
        counter(&metrics, "kvroute_prefill_pieced_requests_total"),
        1
    );
    assert_eq!(
        counter(&metrics, "kvroute_prefill_piece_tokens_total"),
        answered * PIECE
    );

    // The same prompt again: its worker holds it, nothing is cut. A short one: nothing either.
    let again = complete(&router, &long).await;
    assert!(again["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64() > Some(cached));
    let short = json!({"model": MODEL, "prompt": words(300, "s"), "max_tokens": 2});
    complete(&router, &short).await;
    let metrics = support::metrics_text(router.addr).await;
    assert_eq!(
        counter(&metrics, "kvroute_prefill_pieced_requests_total"),
        1
    );
    router.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pieces_are_off_by_default_and_a_bad_size_is_a_config_error() {
    let engine = SimEngine::start(MODEL, 0, 8.0).await;
    let text = format!("policy = \"kv_aware\"\n[[models]]\nname = \"{MODEL}\"\nblock_size = 16\n");
    let mut config = Config::from_toml(&text, Path::new("test")).expect("config");
    config.workers = vec![engine.worker("e0", MODEL)];
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let router = kvroute::server::start(&config, listener).expect("router");
    let long = json!({"model": MODEL, "prompt": words(4_000, "w"), "max_tokens": 2});
    let answer = complete(&router, &long).await;
    assert_eq!(answer["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    let metrics = support::metrics_text(router.addr).await;
    assert_eq!(
        counter(&metrics, "kvroute_prefill_pieced_requests_total"),
        0
    );
    router.shutdown().await;

    let bad = "[proxy]\nprefill_piece_tokens = 100\n";
    let e = Config::from_toml(bad, Path::new("test")).expect_err("under a thousand tokens");
    assert!(e.to_string().contains("proxy.prefill_piece_tokens"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chats_pieces_are_its_rendered_prompt() {
    let engine = SimEngine::start(MODEL, 0, 8.0).await;
    let router = router(&engine, "").await;
    let chat = json!({"model": MODEL, "max_tokens": 2, "messages": [
        {"role": "system", "content": words(500, "sys")},
        {"role": "user", "content": words(3_000, "q")},
    ]});
    let resp = support::client()
        .post(format!("http://{}/v1/chat/completions", router.addr))
        .json(&chat)
        .send()
        .await
        .expect("router answers");
    assert_eq!(resp.status(), 200);
    let answer: Value = resp.json().await.expect("a JSON answer");
    let usage = &answer["usage"];
    let prompt = usage["prompt_tokens"].as_u64().expect("prompt tokens");
    let cached = usage["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap_or(0);
    // The pieces' token ids are the chat's rendered prompt: the engine found them cached.
    assert!(
        cached + 2 * PIECE > prompt && cached >= 2 * PIECE,
        "{usage}"
    );
    router.shutdown().await;
}
