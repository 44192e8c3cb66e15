//! The wait for KV room reads what running answers have written, and learns how fast they
//! write from streams that report no usage: a client that does not ask for
//! `stream_options.include_usage` (most do not) still teaches the rate, by the stream's events
//! (`proxy::stream_events`), so a prompt that fits beside the running prompts but not beside
//! their answers is priced a wait.

use std::time::{Duration, Instant};

use kvroute::engine::EngineCoreArgs;
use serde_json::{Value, json};
use tokio::net::TcpListener;

use crate::support::{self, SimEngine};

const MODEL: &str = "sim";
/// The engine's KV cache: 64 blocks of 16 tokens.
const BLOCKS: usize = 64;
const BLOCK: usize = 16;

fn prompt(first: u32, len: u32) -> Value {
    json!((first..first + len).collect::<Vec<u32>>())
}

/// A stream of up to `max_tokens` without usage; the response, its head read.
async fn stream(router: std::net::SocketAddr, ids: &Value, max_tokens: u32) -> reqwest::Response {
    let resp = support::client()
        .post(format!("http://{router}/v1/completions"))
        .json(&json!({"model": MODEL, "prompt": ids, "max_tokens": max_tokens, "stream": true}))
        .send()
        .await
        .unwrap();
    if resp.status() != 200 {
        panic!(
            "{}: {}",
            resp.status(),
            resp.text().await.unwrap_or_default()
        );
    }
    resp
}

/// `e0`'s predicted wait for room for `ids`, from `/debug/route`.
async fn room_wait(router: std::net::SocketAddr, ids: &Value) -> f64 {
    let url = format!("http://{router}/debug/route");
    let v = support::post_json(&url, &json!({"model": MODEL, "prompt": ids})).await;
    v["candidates"][0]["room_wait_s"]
        .as_f64()
        .unwrap_or_else(|| panic!("no room wait priced: {v}"))
}

#[tokio::test]
async fn answers_streamed_without_usage_hold_room_the_router_counts() {
    let core = EngineCoreArgs {
        block_size: BLOCK,
        num_blocks: BLOCKS as u32,
        engine_speedup: 10.0,
        ..EngineCoreArgs::default()
    };
    let engine = SimEngine::start_with_core(MODEL, core).await;
    let text = format!(
        "policy = \"kv_aware\"\nshutdown_grace_s = 1.0\n[health]\ninterval_s = 0.2\n\
         [[models]]\nname = \"{MODEL}\"\nblock_size = {BLOCK}\n"
    );
    let mut config = SimEngine::config_over(&text, std::slice::from_ref(&engine), MODEL);
    config.workers[0].kv_blocks = Some(BLOCKS);
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let router = kvroute::server::start(&config, listener).unwrap();
    let addr = router.addr;

    // 100 running prompt tokens and a 700-token prompt fit in 1,024 with room to spare.
    let probe = prompt(50_000, 700);
    assert_eq!(room_wait(addr, &probe).await, 0.0, "nothing runs yet");
    // One answer streamed to its end, without usage: the rate it wrote at is learned.
    let taught = stream(addr, &prompt(1_000, 100), 100).await;
    let body = taught.bytes().await.unwrap();
    assert!(body.ends_with(b"data: [DONE]\n\n"), "a whole stream");
    assert!(
        !body.windows(17).any(|w| w == b"completion_tokens"),
        "no usage"
    );

    // A long answer runs; once it has written more than the 224 tokens to spare, the probe
    // waits for it.
    let mut running = stream(addr, &prompt(2_000, 100), 900).await;
    running.chunk().await.unwrap();
    let until = Instant::now() + Duration::from_secs(10);
    let mut wait = 0.0;
    let mut ended = false;
    while wait == 0.0 && !ended && Instant::now() < until {
        // Drain what the engine sent so it keeps writing.
        tokio::select! {
            c = running.chunk() => ended = c.unwrap().is_none(),
            _ = tokio::time::sleep(Duration::from_millis(50)) => {}
        }
        wait = room_wait(addr, &probe).await;
    }
    assert!(
        wait > 0.0,
        "the running answer's written tokens were not counted (ended: {ended})"
    );
    drop(running);
    router.shutdown().await;
    let _ = engine.handle.shutdown().await;
}
