//! The simulated engine over real HTTP on 127.0.0.1: OpenAI responses (streaming and not),
//! prefix-cache reuse visible in `usage` and in the engine's reported TTFT, errors, metrics,
//! and aborts on client disconnect. Every wait is bounded.

use std::time::Duration;

use kvroute::engine::http::TTFT_HEADER;
use kvroute::engine::{EngineConfig, EngineHandle, ServeConfig, StepTiming, start};
use kvroute::tokens::Tokenizer;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::time::timeout;

const MODEL: &str = "sim-model";
const WAIT: Duration = Duration::from_secs(20);

async fn engine(speedup: f64) -> EngineHandle {
    engine_with(EngineConfig {
        timing: StepTiming {
            speedup,
            ..StepTiming::default()
        },
        ..EngineConfig::default()
    })
    .await
}

async fn engine_with(core: EngineConfig) -> EngineHandle {
    let mut config = ServeConfig::new(MODEL);
    config.core = core;
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    start(config, listener).await.unwrap()
}

fn url(h: &EngineHandle, path: &str) -> String {
    format!("http://{}{}", h.local_addr(), path)
}

async fn post(h: &EngineHandle, path: &str, body: Value) -> reqwest::Response {
    let fut = reqwest::Client::new().post(url(h, path)).json(&body).send();
    timeout(WAIT, fut).await.unwrap().unwrap()
}

/// The `data:` payloads of an SSE body, in order.
fn sse_data(body: &str) -> Vec<String> {
    body.lines()
        .filter_map(|l| l.strip_prefix("data: ").or_else(|| l.strip_prefix("data:")))
        .map(|d| d.trim().to_owned())
        .collect()
}

async fn metrics(h: &EngineHandle) -> String {
    let fut = reqwest::get(url(h, "/metrics"));
    timeout(WAIT, fut)
        .await
        .unwrap()
        .unwrap()
        .text()
        .await
        .unwrap()
}

fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .find(|l| l.starts_with(name) && !l.starts_with('#'))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("metric {name} missing in\n{text}"))
}

#[tokio::test]
async fn repeated_long_prompt_reports_cached_tokens_and_lower_ttft() {
    let h = engine(20.0).await;
    let prompt: Vec<u32> = (0..2000).map(|t| t * 7 % 50_000).collect();
    let body = json!({"model": MODEL, "prompt": prompt, "max_tokens": 4});
    let mut ttfts = Vec::new();
    let mut usages = Vec::new();
    for _ in 0..2 {
        let r = post(&h, "/v1/completions", body.clone()).await;
        assert_eq!(r.status(), 200);
        let ttft: f64 = r.headers()[TTFT_HEADER].to_str().unwrap().parse().unwrap();
        let v: Value = r.json().await.unwrap();
        ttfts.push(ttft);
        usages.push(v["usage"].clone());
        assert_eq!(v["object"], "text_completion");
        assert_eq!(v["choices"][0]["finish_reason"], "length");
    }
    assert_eq!(usages[0]["prompt_tokens"], 2000);
    assert_eq!(usages[0]["completion_tokens"], 4);
    assert_eq!(usages[0]["prompt_tokens_details"]["cached_tokens"], 0);
    // 124 full blocks of 16: a 2000-token prompt reuses (2000 - 1) / 16 blocks.
    assert_eq!(usages[1]["prompt_tokens_details"]["cached_tokens"], 1984);
    assert!(
        ttfts[1] < ttfts[0],
        "cached TTFT {} not below cold {}",
        ttfts[1],
        ttfts[0]
    );
    let m = metrics(&h).await;
    assert_eq!(metric(&m, "vllm:prefix_cache_queries_total"), 4000.0);
    assert_eq!(metric(&m, "vllm:prefix_cache_hits_total"), 1984.0);
    assert_eq!(metric(&m, "vllm:time_to_first_token_seconds_count"), 2.0);
    h.shutdown().await.unwrap();
}

#[tokio::test]
async fn text_prompts_are_tokenized_like_the_router() {
    let h = engine(50.0).await;
    let text = "The quick brown fox jumps over the lazy dog. ".repeat(20);
    let expected = Tokenizer::builtin().encode(&text).unwrap().len();
    let r = post(&h, "/tokenize", json!({"model": MODEL, "prompt": text})).await;
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["count"], expected);
    assert_eq!(v["tokens"].as_array().unwrap().len(), expected);
    let r = post(
        &h,
        "/v1/completions",
        json!({"model": MODEL, "prompt": text, "max_tokens": 2}),
    )
    .await;
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["usage"]["prompt_tokens"], expected);
    // Chat: the engine's prompt count equals what /tokenize says for the same messages.
    let messages = json!([{"role": "user", "content": "hello there, engine"}]);
    let r = post(&h, "/tokenize", json!({"messages": messages})).await;
    let count = r.json::<Value>().await.unwrap()["count"].clone();
    let r = post(
        &h,
        "/v1/chat/completions",
        json!({"model": MODEL, "messages": messages, "max_tokens": 3}),
    )
    .await;
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["usage"]["prompt_tokens"], count);
    assert_eq!(v["usage"]["completion_tokens"], 3);
    assert_eq!(v["choices"][0]["message"]["role"], "assistant");
    h.shutdown().await.unwrap();
}

#[tokio::test]
async fn streaming_sends_one_chunk_per_token_then_done() {
    let h = engine(50.0).await;
    let r = post(
        &h,
        "/v1/completions",
        json!({"model": MODEL, "prompt": [1, 2, 3, 4, 5], "max_tokens": 7, "stream": true}),
    )
    .await;
    assert_eq!(r.status(), 200);
    assert!(
        r.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/event-stream")
    );
    let body = timeout(WAIT, r.text()).await.unwrap().unwrap();
    let data = sse_data(&body);
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"));
    let chunks: Vec<Value> = data[..data.len() - 1]
        .iter()
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    assert_eq!(chunks.len(), 7);
    for (i, c) in chunks.iter().enumerate() {
        assert_eq!(c["object"], "text_completion");
        assert!(!c["choices"][0]["text"].as_str().unwrap().is_empty());
        let finish = &c["choices"][0]["finish_reason"];
        if i == 6 {
            assert_eq!(finish, "length");
        } else {
            assert!(finish.is_null());
        }
        assert!(c.get("usage").is_none());
    }
    h.shutdown().await.unwrap();
}

#[tokio::test]
async fn include_usage_adds_a_final_usage_chunk() {
    let h = engine(50.0).await;
    let r = post(
        &h,
        "/v1/chat/completions",
        json!({"model": MODEL, "messages": [{"role": "user", "content": "hi"}],
               "max_tokens": 5, "stream": true, "stream_options": {"include_usage": true}}),
    )
    .await;
    let body = timeout(WAIT, r.text()).await.unwrap().unwrap();
    let data = sse_data(&body);
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"));
    let chunks: Vec<Value> = data[..data.len() - 1]
        .iter()
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    // role chunk, 5 token chunks, usage chunk
    assert_eq!(chunks.len(), 7, "{body}");
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let tokens = chunks[1..6]
        .iter()
        .filter(|c| c["choices"][0]["delta"]["content"].is_string())
        .count();
    assert_eq!(tokens, 5);
    let usage = &chunks[6];
    assert_eq!(usage["choices"], json!([]));
    assert_eq!(usage["usage"]["completion_tokens"], 5);
    assert!(usage["usage"]["prompt_tokens"].as_u64().unwrap() > 0);
    assert!(usage["usage"]["prompt_tokens_details"]["cached_tokens"].is_u64());
    h.shutdown().await.unwrap();
}

#[tokio::test]
async fn errors_are_openai_shaped() {
    let h = engine(50.0).await;
    let client = reqwest::Client::new();
    let r = client
        .post(url(&h, "/v1/completions"))
        .header("content-type", "application/json")
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["type"], "invalid_request_error");
    let cases = [
        (json!({"model": "other", "prompt": "x"}), 404, Some("model")),
        (json!({"model": MODEL}), 400, Some("prompt")),
        (
            json!({"model": MODEL, "prompt": "x", "max_tokens": 0}),
            400,
            Some("max_tokens"),
        ),
        (
            json!({"model": MODEL, "prompt": [1], "max_tokens": 10_000_000}),
            400,
            Some("max_tokens"),
        ),
        (
            json!({"model": MODEL, "prompt": "", "max_tokens": 1}),
            400,
            Some("prompt"),
        ),
        (
            json!({"model": MODEL, "prompt": "x", "n": 2}),
            400,
            Some("n"),
        ),
    ];
    for (body, status, param) in cases {
        let r = post(&h, "/v1/completions", body.clone()).await;
        assert_eq!(r.status(), status, "{body}");
        let v: Value = r.json().await.unwrap();
        assert!(
            v["error"]["message"]
                .as_str()
                .is_some_and(|m| !m.is_empty()),
            "{body}"
        );
        assert_eq!(v["error"]["param"].as_str(), param, "{body}");
    }
    let r = timeout(WAIT, reqwest::get(url(&h, "/v2/nothing")))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(r.status(), 404);
    assert!(r.json::<Value>().await.unwrap()["error"].is_object());
    h.shutdown().await.unwrap();
}

#[tokio::test]
async fn models_health_and_metrics() {
    let h = engine(50.0).await;
    let r = timeout(WAIT, reqwest::get(url(&h, "/health")))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(r.status(), 200);
    let v: Value = reqwest::get(url(&h, "/v1/models"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(v["data"][0]["id"], MODEL);
    assert_eq!(v["data"][0]["max_model_len"], 16_384 * 16);
    let m = metrics(&h).await;
    for name in [
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:prefix_cache_queries_total",
        "vllm:prefix_cache_hits_total",
        "vllm:num_preemptions_total",
        "vllm:time_to_first_token_seconds",
        "vllm:e2e_request_latency_seconds",
    ] {
        assert!(
            m.lines()
                .any(|l| l.starts_with(name) && l.contains("model_name=\"sim-model\"")),
            "{name} missing"
        );
    }
    h.shutdown().await.unwrap();
}

#[tokio::test]
async fn client_disconnect_aborts_the_request() {
    // Real speed: 100,000 decode steps would take minutes, so only an abort ends it.
    let h = engine(1.0).await;
    let mut r = post(
        &h,
        "/v1/completions",
        json!({"model": MODEL, "prompt": (0..64).collect::<Vec<u32>>(), "max_tokens": 100_000, "stream": true}),
    )
    .await;
    let first = timeout(WAIT, r.chunk()).await.unwrap().unwrap();
    assert!(first.is_some());
    let m = metrics(&h).await;
    assert_eq!(metric(&m, "vllm:num_requests_running"), 1.0);
    assert!(metric(&m, "vllm:kv_cache_usage_perc") > 0.0);
    drop(r);
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let m = metrics(&h).await;
        if metric(&m, "vllm:num_requests_running") == 0.0 {
            assert_eq!(metric(&m, "vllm:kv_cache_usage_perc"), 0.0);
            assert!(
                m.lines()
                    .any(|l| l.starts_with("vllm:request_success_total")
                        && l.contains("finished_reason=\"abort\"")
                        && l.ends_with(" 1")),
                "{m}"
            );
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "request not aborted"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    h.shutdown().await.unwrap();
}

#[tokio::test]
async fn concurrent_requests_survive_preemption() {
    // 8 blocks of 16 tokens; four requests of 20 + 40 tokens need 16 blocks together.
    let h = engine_with(EngineConfig {
        num_blocks: 8,
        timing: StepTiming {
            speedup: 100.0,
            ..StepTiming::default()
        },
        ..EngineConfig::default()
    })
    .await;
    let requests = (0..4u32).map(|i| {
        let prompt: Vec<u32> = (0..20).map(|t| t + 100 * i).collect();
        post(
            &h,
            "/v1/completions",
            json!({"model": MODEL, "prompt": prompt, "max_tokens": 40}),
        )
    });
    for r in futures_util::future::join_all(requests).await {
        assert_eq!(r.status(), 200);
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["usage"]["completion_tokens"], 40);
        assert_eq!(v["usage"]["prompt_tokens"], 20);
    }
    let m = metrics(&h).await;
    assert!(metric(&m, "vllm:num_preemptions_total") > 0.0);
    assert_eq!(metric(&m, "vllm:num_requests_running"), 0.0);
    assert_eq!(metric(&m, "vllm:kv_cache_usage_perc"), 0.0);
    h.shutdown().await.unwrap();
}
