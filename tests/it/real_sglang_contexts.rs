//! Real SGLang engines of different contexts (`--context-length` 256 and 4096) behind one
//! router: SGLang's own limits at their edges, as `routing::context_fit`'s notes state them —
//! its scheduler keeps 6 tokens back (a prompt of `context_length − 7` tokens is served, one of
//! `context_length − 6` refused), and unlike vLLM a `max_tokens` past the room left is refused,
//! not clamped — and the router sends a prompt only the larger context holds there.
//!
//! Ignored by default; see `real_sglang.rs` for how they run.

use serde_json::{Value, json};

use crate::support;
use crate::support::real_router::{MODEL, RealRouter, router_config};
use crate::support::sglang::{SglangEngine, SglangOptions, SglangSetup};

const SHORT: usize = 256;

/// A completion of `n` token ids (the same id: the tokenizer is not involved) and up to
/// `max_tokens` output tokens.
fn ids(n: usize, max_tokens: u64) -> Value {
    json!({"model": MODEL, "prompt": vec![42u32; n], "temperature": 0, "max_tokens": max_tokens})
}

/// The status and answer of `body` sent straight to an engine.
async fn direct(url: &str, body: &Value) -> (u16, Value) {
    let resp = reqwest::Client::new()
        .post(format!("{url}/v1/completions"))
        .json(body)
        .send()
        .await
        .expect("the engine answers");
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs real SGLang: scripts/real-engines/sglang-setup.sh; run by .ci/run"]
async fn a_prompt_goes_to_the_real_sglang_engine_whose_context_holds_it() {
    let setup = SglangSetup::locate();
    let short = SglangOptions {
        context_length: SHORT,
        ..SglangOptions::default()
    };
    let engines = SglangEngine::start_each(&setup, &[short, SglangOptions::default()]).await;
    let (s0, s1) = (engines[0].url(), engines[1].url());

    // SGLang's edges, asked directly.
    let (fits, answer) = direct(&s0, &ids(SHORT - 7, 1)).await;
    assert_eq!(fits, 200, "{answer}");
    let (over, answer) = direct(&s0, &ids(SHORT - 6, 1)).await;
    assert_eq!(over, 400, "{answer}");
    let (held, answer) = direct(&s1, &ids(SHORT, 1)).await;
    assert_eq!(held, 200, "{answer}");
    let (refused, answer) = direct(&s0, &ids(200, 100)).await;
    assert_eq!(refused, 400, "SGLang refuses a long max_tokens: {answer}");

    let router = RealRouter::start(&router_config(&setup, &engines, "kv_aware", &[])).await;
    router.wait_ready().await;
    // The router reads each engine's context from its /v1/models on a passing health check.
    let end = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let over_body = ids(SHORT - 6, 1);
    let explained = loop {
        let explained = router.explain(&over_body, None).await;
        if !support::context_excluded(&explained).is_empty() || std::time::Instant::now() > end {
            break explained;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    };
    assert_eq!(support::context_excluded(&explained), ["s0"], "{explained}");
    let explained = router.explain(&ids(SHORT - 7, 1), None).await;
    assert!(
        support::context_excluded(&explained).is_empty(),
        "{explained}"
    );
    let explained = router.explain(&ids(200, 100), None).await;
    assert_eq!(support::context_excluded(&explained), ["s0"], "{explained}");

    // Every prompt s0 would refuse is served by s1.
    for n in [SHORT - 6, 300, 1000] {
        let (worker, answer) = router.send(&ids(n, 4), None).await;
        assert_eq!(worker, "s1", "{n} tokens: {answer}");
    }
    router.shutdown().await;
    drop(engines);
}
