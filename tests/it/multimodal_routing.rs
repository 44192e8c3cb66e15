//! Chats with images are routed on their text up to the first image, and on the image itself
//! after it (`tokens::media`): two requests with the same words and different pictures share
//! only the blocks before the picture, as an engine's prefix cache shares them; the same
//! picture again is credited whole. Checked on the router's own predictions (no KV events),
//! where text-only hashing credited every same-worded request with the first one's prompt.

use std::path::Path;

use kvroute::config::Config;
use serde_json::{Value, json};
use tokio::net::TcpListener;

use crate::support::{self, SimEngine};

const MODEL: &str = "sim";

fn words(n: usize, salt: &str) -> String {
    (0..n).map(|i| format!("{salt}{i} ")).collect()
}

/// A chat whose picture, at `url`, sits between a system prompt and a long question.
fn chat(url: &str) -> Value {
    json!({
        "model": MODEL,
        "max_tokens": 2,
        "messages": [
            {"role": "system", "content": words(120, "sys")},
            {"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": url}},
                {"type": "text", "text": words(200, "q")},
            ]},
        ],
    })
}

/// Each candidate's predicted prefix, in blocks, from `/debug/route`.
fn overlaps(explained: &Value) -> Vec<(String, u64)> {
    explained["candidates"]
        .as_array()
        .map(|cs| {
            cs.iter()
                .map(|c| {
                    let worker = c["worker"].as_str().unwrap_or_default().to_owned();
                    (worker, c["overlap_blocks"].as_u64().unwrap_or(0))
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The blocks `/debug/route`'s explanation credits `worker` with.
fn credited(explained: &Value, worker: &str) -> u64 {
    overlaps(explained)
        .into_iter()
        .find(|(w, _)| w == worker)
        .map_or(0, |(_, o)| o)
}

/// Sends `body` to `/v1/{path}`: the worker that served it, and the blocks the same body is
/// then credited with there — the whole prompt.
async fn served_and_credited(
    router: &kvroute::server::RouterHandle,
    path: &str,
    body: &Value,
) -> (String, u64) {
    let resp = support::client()
        .post(format!("http://{}/v1/{path}", router.addr))
        .json(body)
        .send()
        .await
        .expect("router answers");
    assert_eq!(resp.status(), 200);
    let home = resp
        .headers()
        .get("x-kvroute-worker")
        .and_then(|v| v.to_str().ok())
        .expect("served by a worker")
        .to_owned();
    let debug = format!("http://{}/debug/route", router.addr);
    let same = support::post_json(&debug, body).await;
    let whole = credited(&same, &home);
    let blocks = same["prompt_tokens"].as_u64().unwrap_or(0) / 16;
    assert!(whole + 1 >= blocks && whole > 0, "{same}");
    (home, whole)
}

/// A `kv_aware` router over `engines` without their KV events: the router's own record of
/// what it routed is the index.
fn start_router(engines: &[SimEngine]) -> kvroute::server::RouterHandle {
    let text = format!(
        "policy = \"kv_aware\"\nshutdown_grace_s = 1.0\n[[models]]\nname = \"{MODEL}\"\nblock_size = 16\n"
    );
    let mut config = Config::from_toml(&text, Path::new("test")).expect("config");
    config.workers = engines
        .iter()
        .enumerate()
        .map(|(i, e)| e.worker_without_events(&format!("e{i}"), MODEL))
        .collect();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.set_nonblocking(true).expect("nonblocking");
    let listener = TcpListener::from_std(listener).expect("a tokio listener");
    kvroute::server::start(&config, listener).expect("router")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_different_picture_shares_only_the_blocks_before_it() {
    let engines = [
        SimEngine::start(MODEL, 0, 4.0).await,
        SimEngine::start(MODEL, 1, 4.0).await,
    ];
    let router = start_router(&engines);
    let debug = format!("http://{}/debug/route", router.addr);

    let first = chat("https://example.com/a.png");
    let (home, whole) = served_and_credited(&router, "chat/completions", &first).await;
    let at_home = |explained: &Value| credited(explained, &home);

    // Another picture after the same words: only the system prompt's blocks, before it.
    let other = support::post_json(&debug, &chat("https://example.com/b.png")).await;
    let shared = at_home(&other);
    assert!(
        shared > 0,
        "the system prompt before the picture is shared: {other}"
    );
    assert!(
        shared < whole / 2,
        "{shared} of {whole} blocks credited: {other}"
    );

    // Text alone (no picture) parts from the first chat where its picture was.
    let plain = json!({
        "model": MODEL,
        "max_tokens": 2,
        "messages": [
            {"role": "system", "content": words(120, "sys")},
            {"role": "user", "content": words(200, "q")},
        ],
    });
    let plain = support::post_json(&debug, &plain).await;
    assert!(at_home(&plain) < whole / 2, "{plain}");
    router.shutdown().await;
}

/// A Responses request whose picture sits in its second user turn, after a long first one.
fn responses(url: &str) -> Value {
    json!({
        "model": MODEL,
        "max_output_tokens": 2,
        "instructions": words(60, "sys"),
        "input": [
            {"role": "user", "content": words(120, "turn")},
            {"role": "user", "content": [
                {"type": "input_text", "text": words(200, "q")},
                {"type": "input_image", "image_url": url},
            ]},
        ],
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_responses_input_with_another_picture_shares_only_the_turns_before_it() {
    let engines = [
        SimEngine::start(MODEL, 0, 4.0).await,
        SimEngine::start(MODEL, 1, 4.0).await,
    ];
    let router = start_router(&engines);
    let debug = format!("http://{}/debug/route", router.addr);
    let first = responses("https://example.com/a.png");
    let (home, whole) = served_and_credited(&router, "responses", &first).await;
    // Another picture: the instructions and the first turn are shared, not the turn that
    // holds the picture (its text flattened as vLLM renders it, the picture beside it).
    let other = support::post_json(&debug, &responses("https://example.com/b.png")).await;
    let shared = credited(&other, &home);
    assert!(
        shared > 0,
        "the turns before the picture are shared: {other}"
    );
    assert!(
        shared < whole * 2 / 3,
        "{shared} of {whole} blocks credited: {other}"
    );
    router.shutdown().await;
}
