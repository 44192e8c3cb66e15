//! Real vLLM engines of different contexts (`--max-model-len` 256 and 4096) behind one router:
//! vLLM's own limits, checked at their edges, are what `routing::context_fit` assumes — a
//! prompt of `max_model_len − 1` tokens is served and one of `max_model_len` refused, and a
//! `max_tokens` past the room left is clamped, not refused — and the router sends a prompt only
//! the larger context holds there, never to the engine that would refuse it.
//!
//! Ignored by default; see `real_vllm.rs` for how they run.

use serde_json::{Value, json};

use crate::support;
use crate::support::real_router::{MODEL, RealRouter, router_config};
use crate::support::vllm::{VllmEngine, VllmOptions, VllmSetup};

const SHORT: usize = 256;

/// A completion of `n` token ids (the same id: the tokenizer is not involved), up to
/// `max_tokens` output tokens when given.
fn ids(n: usize, max_tokens: Option<u64>) -> Value {
    let mut body = json!({"model": MODEL, "prompt": vec![42u32; n], "temperature": 0});
    if let Some(m) = max_tokens {
        body["max_tokens"] = json!(m);
    }
    body
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
#[ignore = "needs real vLLM: scripts/real-engines/vllm-setup.sh; run by .ci/run"]
async fn a_prompt_goes_to_the_real_engine_whose_context_holds_it() {
    let setup = VllmSetup::locate();
    let short = VllmOptions {
        max_model_len: SHORT,
        enforce_eager: true,
        ..VllmOptions::default()
    };
    let long = VllmOptions {
        enforce_eager: true,
        ..VllmOptions::default()
    };
    let engines = VllmEngine::start_each(&setup, &[short, long]).await;
    let (v0, v1) = (engines[0].url(), engines[1].url());

    // vLLM's edges, asked directly.
    let (fits, answer) = direct(&v0, &ids(SHORT - 1, None)).await;
    assert_eq!(fits, 200, "{answer}");
    let (over, answer) = direct(&v0, &ids(SHORT, None)).await;
    assert_eq!(over, 400, "{answer}");
    let (held, answer) = direct(&v1, &ids(SHORT, None)).await;
    assert_eq!(held, 200, "{answer}");
    let (clamped, answer) = direct(&v0, &ids(200, Some(100))).await;
    assert_eq!(clamped, 200, "vLLM clamps a long max_tokens: {answer}");
    let completion = answer["usage"]["completion_tokens"].as_u64().unwrap_or(0);
    assert!(completion <= (SHORT - 200) as u64, "{answer}");

    let router = RealRouter::start(&router_config(&setup, &engines, "kv_aware", &[])).await;
    router.wait_ready().await;
    // The router reads each engine's context from its /v1/models on a passing health check.
    let end = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let over_body = ids(SHORT, None);
    let explained = loop {
        let explained = router.explain(&over_body, None).await;
        if !support::context_excluded(&explained).is_empty() || std::time::Instant::now() > end {
            break explained;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    };
    assert_eq!(support::context_excluded(&explained), ["v0"], "{explained}");
    // The edge, as the router applies it: one token less fits both; a long max_tokens does
    // not fit v0 whole.
    let explained = router.explain(&ids(SHORT - 1, None), None).await;
    assert!(
        support::context_excluded(&explained).is_empty(),
        "{explained}"
    );
    let explained = router.explain(&ids(200, Some(100)), None).await;
    assert_eq!(support::context_excluded(&explained), ["v0"], "{explained}");

    // Every prompt v0 would refuse is served by v1.
    for n in [SHORT, 300, 1000] {
        let (worker, answer) = router.send(&ids(n, Some(4)), None).await;
        assert_eq!(worker, "v1", "{n} tokens: {answer}");
    }
    router.shutdown().await;
    drop(engines);
}
