//! kvroute in front of a disaggregated real vLLM: two prefill engines and one decode engine,
//! joined by vLLM's NixlConnector (NIXL's UCX moving host memory: the CPU platform registers
//! its KV cache with NIXL directly). kvroute drives vLLM's hand-off — the prefill request with
//! `kv_transfer_params` asking for remote decode, `max_tokens` 1, no stream; then the client's
//! request, carrying the `kv_transfer_params` the prefill engine returned, to the decode engine,
//! whose stream goes to the client — and routes the prefill on the prefill engines' KV events.
//!
//! What only real engines can show, each read from the engines themselves:
//! - the decode engine loaded the prompt's KV from the prefill engine instead of computing it
//!   (`vllm:external_prefix_cache_hits`: tokens received through the connector; vLLM leaves
//!   `cached_tokens` at 0 for KV that arrives asynchronously);
//! - the prefill engine's KV events reached kvroute's index (`/debug/route`);
//! - a second request sharing the prefix goes to the prefill engine that holds it, which then
//!   serves that prefix from its own prefix cache (`vllm:prefix_cache_hits`);
//! - a client's own `kv_transfer_params` (which can kill a decode engine) never reach one.
//!
//! Ignored by default; see `real_vllm.rs` for how they run (`scripts/real-engines/vllm-setup.sh`
//! installs NIXL beside vLLM).

use std::time::{Duration, Instant};

use kvroute::fleet::Role;
use serde_json::{Value, json};

use crate::support::real_engine::{EngineProc, metric_sum};
use crate::support::real_router::{MODEL, RealRouter, router_config};
use crate::support::vllm::{VLLM_BLOCK, VllmEngine, VllmOptions, VllmSetup};

/// Engines 0 and 1 prefill, engine 2 decodes.
const PREFILL: usize = 2;

/// What one engine has done so far, from its own counters.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Counters {
    /// Requests finished (`vllm:request_success`).
    requests: f64,
    /// Prompt tokens served from its own prefix cache (`vllm:prefix_cache_hits`).
    local_hits: f64,
    /// Prompt tokens received through the KV connector (`vllm:external_prefix_cache_hits`).
    external_hits: f64,
}

async fn counters(engine: &EngineProc) -> Counters {
    let text = engine.metrics().await;
    Counters {
        requests: metric_sum(&text, "vllm:request_success"),
        local_hits: metric_sum(&text, "vllm:prefix_cache_hits"),
        external_hits: metric_sum(&text, "vllm:external_prefix_cache_hits"),
    }
}

async fn all_counters(engines: &[EngineProc]) -> Vec<Counters> {
    let mut out = Vec::new();
    for e in engines {
        out.push(counters(e).await);
    }
    out
}

/// The engines' counters once one hand-off since `before` is counted: vLLM updates its
/// Prometheus counters from the engine's stats a moment after the answer, so this waits (up to
/// 10 s) until the decode engine and one prefill engine each count one more finished request.
async fn counters_after_one(engines: &[EngineProc], before: &[Counters]) -> Vec<Counters> {
    let end = Instant::now() + Duration::from_secs(10);
    loop {
        let now = all_counters(engines).await;
        let prefills: f64 = (0..PREFILL)
            .map(|i| now[i].requests - before[i].requests)
            .sum();
        let decodes = now[PREFILL].requests - before[PREFILL].requests;
        if (prefills >= 1.0 && decodes >= 1.0) || Instant::now() > end {
            return now;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Makes each prefill engine hand one request off to the decode engine directly, as vLLM's own
/// proxy does, retrying a failed one: a pair's first transfer does NIXL's handshake, which the
/// decode engine gives 5 s (`nixl/base_worker.py`), and on a busy machine it can miss that and
/// fail the request (measured once by hand). The requests under test then go through kvroute.
async fn handshake(engines: &[EngineProc]) {
    let http = reqwest::Client::new();
    let decode = engines[PREFILL].url();
    for p in &engines[..PREFILL] {
        let mut last = String::new();
        let ok = 'tries: {
            for attempt in 0..3 {
                let prompt = format!("handshake {} {attempt}", p.name);
                let prefill: Value = http
                    .post(format!("{}/v1/completions", p.url()))
                    .json(&json!({"model": MODEL, "prompt": prompt, "max_tokens": 1,
                        "kv_transfer_params": {"do_remote_decode": true}}))
                    .send()
                    .await
                    .expect("prefill engine answers")
                    .json()
                    .await
                    .expect("prefill answer");
                let params = prefill["kv_transfer_params"].clone();
                assert!(params.is_object(), "no kv_transfer_params: {prefill}");
                let resp = http
                    .post(format!("{decode}/v1/completions"))
                    .json(&json!({"model": MODEL, "prompt": prompt, "max_tokens": 1,
                        "kv_transfer_params": params}))
                    .send()
                    .await
                    .expect("decode engine answers");
                if resp.status().is_success() {
                    break 'tries true;
                }
                last = resp.text().await.unwrap_or_default();
            }
            false
        };
        assert!(ok, "{} never handed a request off: {last}", p.name);
    }
}

/// A streamed completion of a ~600-token prompt that starts with `prefix`.
fn streamed(prefix: &str, tail: &str) -> Value {
    let prompt: String = (0..140)
        .map(|i| format!("{prefix} {i} "))
        .collect::<String>()
        + tail;
    json!({
        "model": MODEL,
        "prompt": prompt,
        "max_tokens": 8,
        "temperature": 0,
        "stream": true,
        "stream_options": {"include_usage": true},
    })
}

/// What the client received from a streamed request.
struct Streamed {
    /// `x-kvroute-*` response headers, for the log.
    headers: Vec<(String, String)>,
    /// The `data:` payloads, `[DONE]` included.
    events: Vec<String>,
}

impl Streamed {
    /// The generated text, after checking that the stream is a clean one: no error event,
    /// ended by `[DONE]`.
    fn text(&self) -> String {
        for e in &self.events {
            assert!(!e.contains("\"error\""), "error event: {e}");
        }
        assert_eq!(
            self.events.last().map(String::as_str),
            Some("[DONE]"),
            "{:?}",
            self.events
        );
        self.chunks()
            .filter_map(|v| v["choices"][0]["text"].as_str().map(str::to_owned))
            .collect()
    }

    /// Prompt tokens as the decode engine counted them (the usage chunk).
    fn prompt_tokens(&self) -> u64 {
        self.chunks()
            .find_map(|v| v["usage"]["prompt_tokens"].as_u64())
            .expect("a usage chunk")
    }

    fn chunks(&self) -> impl Iterator<Item = Value> + '_ {
        self.events
            .iter()
            .filter(|e| *e != "[DONE]")
            .filter_map(|e| serde_json::from_str(e).ok())
    }
}

async fn stream_through(router: &RealRouter, body: &Value) -> Streamed {
    let resp = reqwest::Client::new()
        .post(router.url("/v1/completions"))
        .timeout(Duration::from_secs(120))
        .json(body)
        .send()
        .await
        .expect("router answers");
    let status = resp.status();
    let headers = resp
        .headers()
        .iter()
        .filter(|(k, _)| k.as_str().starts_with("x-kvroute"))
        .map(|(k, v)| (k.to_string(), v.to_str().unwrap_or("?").to_owned()))
        .collect();
    let text = resp.text().await.expect("stream body");
    assert!(status.is_success(), "{status}: {text}");
    let events = text
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .map(str::to_owned)
        .collect();
    Streamed { headers, events }
}

/// Waits until the router's index holds at least `blocks` of `body`'s blocks on `worker`.
async fn indexed(router: &RealRouter, body: &Value, worker: &str, blocks: u64) -> Value {
    let end = Instant::now() + Duration::from_secs(30);
    loop {
        let v = router.explain(body, None).await;
        let held = v["candidates"]
            .as_array()
            .and_then(|c| c.iter().find(|c| c["worker"] == worker))
            .map_or(0, |c| c["overlap_blocks"].as_u64().unwrap_or(0));
        if held >= blocks {
            return v;
        }
        assert!(
            Instant::now() < end,
            "{worker} holds {held} < {blocks} blocks in the router's index: {v}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The one prefill engine whose finished requests went up by one between `before` and `after`.
fn served_prefill(before: &[Counters], after: &[Counters]) -> usize {
    let served: Vec<usize> = (0..PREFILL)
        .filter(|&i| after[i].requests > before[i].requests)
        .collect();
    assert_eq!(served.len(), 1, "prefill engines that served: {served:?}");
    assert_eq!(after[served[0]].requests, before[served[0]].requests + 1.0);
    served[0]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs real vLLM and NIXL: scripts/real-engines/vllm-setup.sh; run by .ci/run"]
async fn a_disaggregated_vllm_request_moves_its_kv_from_prefill_to_decode() {
    let started = Instant::now();
    let setup = VllmSetup::locate();
    setup.require_nixl();
    let options = VllmOptions {
        kv_blocks: 1024,
        prefill_engines: Some(PREFILL),
        enforce_eager: true,
        ..VllmOptions::default()
    };
    let mut engines = VllmEngine::start_all(&setup, PREFILL + 1, &options).await;
    println!(
        "2 prefill + 1 decode vLLM engines (NixlConnector) ready in {:.0} s, RSS {:.0} MiB",
        started.elapsed().as_secs_f64(),
        engines.iter().map(EngineProc::rss_mib).sum::<f64>()
    );
    let mut config = router_config(&setup, &engines, "kv_aware", &[]);
    for (i, w) in config.workers.iter_mut().enumerate() {
        w.role = if i < PREFILL {
            Role::Prefill
        } else {
            Role::Decode
        };
    }
    handshake(&engines).await;
    let router = RealRouter::start(&config).await;
    router.wait_ready().await;
    let decode = PREFILL;

    // 1. The hand-off: the client's stream comes from the decode engine, which received the
    //    prompt's KV from the prefill engine instead of computing it.
    let first = streamed("river", "and the sea");
    let before = all_counters(&engines).await;
    let answer = stream_through(&router, &first).await;
    let text = answer.text();
    let after = counters_after_one(&engines, &before).await;
    let prefill = served_prefill(&before, &after);
    let prompt_tokens = answer.prompt_tokens();
    let received = after[decode].external_hits - before[decode].external_hits;
    println!(
        "first request: prefill on {}, decode on {}: {prompt_tokens} prompt tokens, {received} \
         received by the decode engine through NIXL; headers {:?}; text {text:?}",
        engines[prefill].name, engines[decode].name, answer.headers
    );
    assert!(!text.is_empty(), "no generated text: {:?}", answer.events);
    assert_eq!(after[decode].requests, before[decode].requests + 1.0);
    let full = (prompt_tokens - 1) / u64::from(VLLM_BLOCK);
    assert!(
        received >= (full * u64::from(VLLM_BLOCK)) as f64,
        "the decode engine received {received} tokens' KV of {prompt_tokens}: it recomputed \
         the prompt"
    );

    // 2. The prefill engine's KV events reached the router's index.
    let mut plain = first.clone();
    plain["stream"] = json!(false);
    plain.as_object_mut().unwrap().remove("stream_options");
    let explained = indexed(&router, &plain, &engines[prefill].name, full).await;
    println!("index after the first request: {explained}");

    // 3. The same prefix again: the prefill engine that holds it takes the prefill and serves
    //    the prefix from its own cache; the decode engine again receives the KV.
    let second = streamed("river", "and the mountains beyond");
    let before = all_counters(&engines).await;
    let answer = stream_through(&router, &second).await;
    answer.text();
    let after = counters_after_one(&engines, &before).await;
    let again = served_prefill(&before, &after);
    let local = after[again].local_hits - before[again].local_hits;
    let received = after[decode].external_hits - before[decode].external_hits;
    println!(
        "second request: prefill on {} ({local} prompt tokens from its own cache), {received} \
         received by the decode engine",
        engines[again].name
    );
    assert_eq!(
        again, prefill,
        "the shared prefix went to another prefill engine"
    );
    assert!(
        local >= (full * u64::from(VLLM_BLOCK)) as f64 - f64::from(VLLM_BLOCK),
        "the prefill engine reused only {local} tokens of the shared prefix"
    );
    assert!(received > 0.0, "the decode engine received nothing");

    // 4. A client's own `kv_transfer_params` never reach an engine: a NixlConnector decode
    //    engine given `{"do_remote_prefill": true}` without the prefill's fields dies (vLLM
    //    0.32 asserts in its engine core; measured by hand). Through kvroute it is an ordinary
    //    hand-off, and the decode engine is still up after it.
    let mut hostile = plain.clone();
    hostile["prompt"] = json!("a client that sends its own kv_transfer_params");
    hostile["kv_transfer_params"] = json!({"do_remote_prefill": true});
    let (worker, answer) = router.send(&hostile, None).await;
    assert_eq!(worker, engines[decode].name, "{answer}");
    let health = reqwest::get(format!("{}/health", engines[decode].url()))
        .await
        .map(|r| r.status());
    assert!(
        health.as_ref().is_ok_and(|s| s.is_success()),
        "the decode engine is down after a client's kv_transfer_params: {health:?}\n{}",
        engines[decode].log_tail()
    );

    // What the decode engine published (it caches the blocks it received; printed, not
    // asserted: kvroute routes decode by load and KV room, not by its events).
    println!(
        "KV event batches from the decode engine: {}",
        router.event_batches(&engines[decode].name).await
    );

    router.shutdown().await;
    for e in &mut engines {
        e.stop();
    }
    println!(
        "real_vllm_pd: {:.0} s including engine start",
        started.elapsed().as_secs_f64()
    );
}
