//! KV-aware routing against simulated engines that publish real KV events over ZeroMQ:
//! prefixes concentrate, an overloaded warm worker is bypassed, unique prompts spread, and a
//! restarted engine's blocks vanish from the index.

use std::path::Path;
use std::time::Duration;

use kvroute::config::Config;
use kvroute::engine::EngineArgs;
use kvroute::policy::PolicyKind;
use kvroute::server::RouterHandle;
use serde_json::{Value, json};
use tokio::net::TcpListener;

use crate::support::{self, SimEngine};

const MODEL: &str = "sim";

struct Stack {
    router: RouterHandle,
    engines: Vec<Option<SimEngine>>,
    http: reqwest::Client,
}

impl Stack {
    async fn start(n: usize, speedup: f64, policy: PolicyKind) -> Stack {
        let mut engines = Vec::new();
        for _ in 0..n {
            engines.push(Some(SimEngine::start(MODEL, 0, speedup).await));
        }
        let text = format!(
            "policy = \"{policy}\"\nshutdown_grace_s = 1.0\n[health]\ninterval_s = 0.2\n[[models]]\nname = \"{MODEL}\"\nblock_size = 16\n[kv_aware]\ncalibrate = false\n"
        );
        let mut config = Config::from_toml(&text, Path::new("test")).unwrap();
        config.workers = engines
            .iter()
            .enumerate()
            .map(|(i, e)| {
                let e = e.as_ref().unwrap();
                e.worker(&format!("e{i}"), MODEL)
            })
            .collect();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let router = kvroute::server::start(&config, listener).unwrap();
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(30))
            .build()
            .unwrap();
        Stack {
            router,
            engines,
            http,
        }
    }

    /// The router's Prometheus text.
    async fn metrics(&self) -> String {
        support::metrics_text(self.router.addr).await
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.router.addr)
    }

    /// Sends a completion and returns (worker, cached_tokens).
    async fn complete(&self, prompt: &str, max_tokens: u32) -> (String, u64) {
        let resp = self
            .http
            .post(self.url("/v1/completions"))
            .json(&json!({"model": MODEL, "prompt": prompt, "max_tokens": max_tokens}))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        let worker = resp.headers()["x-kvroute-worker"]
            .to_str()
            .unwrap()
            .to_string();
        let body: Value = resp.json().await.unwrap();
        let cached = body["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap_or(0);
        (worker, cached)
    }

    async fn explain(&self, prompt: &str) -> Value {
        let body = json!({"model": MODEL, "prompt": prompt});
        support::post_json(&self.url("/debug/route"), &body).await
    }

    /// Overlap blocks the index reports for `worker` on `prompt`.
    async fn overlap(&self, prompt: &str, worker: &str) -> u64 {
        let v = self.explain(prompt).await;
        v["candidates"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["worker"] == worker)
            .map(|c| c["overlap_blocks"].as_u64().unwrap())
            .unwrap_or(0)
    }

    /// Waits until the index reports at least `blocks` for `worker` on `prompt`.
    async fn wait_overlap(&self, prompt: &str, worker: &str, at_least: u64) -> u64 {
        for _ in 0..200 {
            let o = self.overlap(prompt, worker).await;
            if o >= at_least {
                return o;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        self.overlap(prompt, worker).await
    }

    async fn shutdown(mut self) {
        self.router.shutdown().await;
        for e in self.engines.iter_mut() {
            if let Some(e) = e.take() {
                let _ = e.handle.shutdown().await;
            }
        }
    }
}

/// The value of the series named exactly `series` (name and labels) in Prometheus text.
fn sample(metrics: &str, series: &str) -> Option<f64> {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
}

/// A prompt of `words` distinct words (≈ one builtin token each) starting with `tag`.
fn prompt(tag: &str, words: usize) -> String {
    (0..words).map(|i| format!(" {tag}{i}")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn same_prefix_requests_concentrate_on_the_warm_worker() {
    let s = Stack::start(4, 50.0, PolicyKind::KvAware).await;
    let system = prompt("sys", 1600);
    let (warm, _) = s.complete(&format!("{system} first question"), 2).await;
    // 1,600 words ≈ 1,600 tokens = 100 full blocks; wait for the events to land.
    assert!(s.wait_overlap(&system, &warm, 90).await >= 90);
    for q in 0..8 {
        let (w, cached) = s
            .complete(&format!("{system} question number {q}"), 2)
            .await;
        assert_eq!(w, warm, "request {q} left the warm worker");
        assert!(
            cached >= 1440,
            "request {q}: the engine reused only {cached} tokens"
        );
    }
    let explained = s.explain(&format!("{system} another")).await;
    assert_eq!(explained["worker"], warm.as_str());
    assert_eq!(explained["policy"], "kv_aware");
    assert!(explained["prompt_tokens"].as_u64().unwrap() >= 1600);
    let warm_row = explained["candidates"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["worker"] == warm.as_str())
        .unwrap()
        .clone();
    let cold_row = explained["candidates"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["worker"] != warm.as_str())
        .unwrap()
        .clone();
    assert!(
        warm_row["predicted_ttft_s"].as_f64().unwrap()
            < cold_row["predicted_ttft_s"].as_f64().unwrap()
    );
    for key in [
        "overlap_blocks",
        "queued_tokens",
        "in_flight",
        "predicted_ttft_s",
        "returning_evictions",
        "sharing_requests",
        "room_wait_s",
    ] {
        assert!(warm_row.get(key).is_some(), "{key} missing: {warm_row}");
    }
    // Nothing runs there: no wait for KV room where the capacity is known, none priced where
    // it is not.
    let no_wait = if warm_row["kv_capacity_blocks"].is_null() {
        serde_json::Value::Null
    } else {
        serde_json::json!(0.0)
    };
    assert_eq!(warm_row["room_wait_s"], no_wait, "{warm_row}");
    // Every candidate is priced at a prefill rate; identical engines at nearly the same one
    // (a mixed fleet's would differ by its speeds).
    let rate_of = |row: &serde_json::Value| row["prefill_tokens_per_s"].as_f64().unwrap();
    assert!(rate_of(&warm_row) > 0.0, "{warm_row}");
    assert!(
        (rate_of(&warm_row) / rate_of(&cold_row) - 1.0).abs() < 0.05,
        "{warm_row} {cold_row}"
    );
    // Nine admissions asked for the system prompt: its arrival rate is counted; a prompt
    // nobody holds has no warm prefix to count.
    let rate = explained["warm_prefix_rate"].as_f64().unwrap();
    assert!(rate > 0.0 && rate <= 0.9, "{explained}");
    let unique = s.explain(&prompt("never-seen", 400)).await;
    assert_eq!(unique["warm_prefix_rate"].as_f64(), Some(0.0), "{unique}");
    // The warm worker's working set holds the system prompt's blocks, touched by nine
    // admissions; a worker that was never chosen has none.
    assert!(
        warm_row["live_blocks"].as_u64().unwrap() >= 100,
        "{warm_row}"
    );
    assert_eq!(cold_row["live_blocks"], 0, "{cold_row}");
    let metrics = s.metrics().await;
    assert!(
        metrics.contains(&format!(
            "kvroute_prefix_hit_blocks_total{{worker=\"{warm}\"}}"
        )),
        "{metrics}"
    );
    assert!(metrics.contains("kvroute_index_entries "));
    // The index's size is reported, and an index holding entries takes memory.
    let bytes = sample(&metrics, "kvroute_index_bytes")
        .unwrap_or_else(|| panic!("kvroute_index_bytes missing: {metrics}"));
    assert!(bytes > 0.0, "{bytes}");
    // A request for prompt logprobs makes the engine compute every prompt position (vLLM reads
    // nothing from its prefix cache for it): no reuse is predicted anywhere.
    let body = json!({"model": MODEL, "prompt": format!("{system} another"), "prompt_logprobs": 1});
    let v = support::post_json(&s.url("/debug/route"), &body).await;
    let cached: Vec<u64> = v["candidates"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["overlap_blocks"].as_u64().unwrap())
        .collect();
    assert!(cached.iter().all(|&b| b == 0), "{v}");
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_engines_kv_capacity_is_read_from_its_metrics_and_reserved_in_the_index() {
    let s = Stack::start(2, 1.0, PolicyKind::KvAware).await;
    let blocks = EngineArgs::default().core.num_blocks;
    let gauge = |metrics: &str, worker: &str| {
        sample(
            metrics,
            &format!("kvroute_worker_kv_blocks{{worker=\"{worker}\"}}"),
        )
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let metrics = loop {
        let m = s.metrics().await;
        // The gauges show what was read; the room is reserved on a blocking thread just after.
        let reserved =
            sample(&m, "kvroute_index_bytes").is_some_and(|b| b >= 2.0 * f64::from(blocks) * 12.0);
        if (gauge(&m, "e0").is_some() && gauge(&m, "e1").is_some() && reserved)
            || std::time::Instant::now() > deadline
        {
            break m;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(gauge(&metrics, "e0"), Some(f64::from(blocks)), "{metrics}");
    assert_eq!(gauge(&metrics, "e1"), Some(f64::from(blocks)), "{metrics}");
    // Both workers' engine-id maps are sized for their caches before any event arrived:
    // 12 bytes per engine id, at most 85 % full.
    let bytes = sample(&metrics, "kvroute_index_bytes")
        .unwrap_or_else(|| panic!("kvroute_index_bytes missing: {metrics}"));
    assert!(bytes >= 2.0 * f64::from(blocks) * 12.0, "{bytes}");
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_without_events_has_its_capacity_read_too() {
    let engine = SimEngine::start(MODEL, 0, 1.0).await;
    let text = format!(
        "policy = \"kv_aware\"\nshutdown_grace_s = 1.0\n[health]\ninterval_s = 0.2\n\
         [[workers]]\nid = \"plain\"\nurl = \"http://{}\"\nmodels = [\"{MODEL}\"]\n",
        engine.addr
    );
    let config = Config::from_toml(&text, Path::new("test")).unwrap();
    let router =
        kvroute::server::start(&config, TcpListener::bind("127.0.0.1:0").await.unwrap()).unwrap();
    let series = "kvroute_worker_kv_blocks{worker=\"plain\"}";
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let mut found = None;
    while found.is_none() && std::time::Instant::now() < deadline {
        found = sample(&support::metrics_text(router.addr).await, series);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        found,
        Some(f64::from(EngineArgs::default().core.num_blocks))
    );
    router.shutdown().await;
    let _ = engine.handle.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_overloaded_warm_worker_is_bypassed() {
    let s = Stack::start(2, 50.0, PolicyKind::KvAware).await;
    let system = prompt("ctx", 800);
    let (warm, _) = s.complete(&format!("{system} q0"), 2).await;
    assert!(s.wait_overlap(&system, &warm, 45).await >= 45);
    let w = s.router.state.fleet.get(&warm).unwrap();
    // A short queue is worth waiting behind for the prefix.
    let small = w.rank(0).load.admit(200, 200);
    let (w1, cached) = s.complete(&format!("{system} q1"), 2).await;
    assert_eq!(w1, warm);
    assert!(cached >= 700);
    drop(small);
    // 50,000 tokens of prefill queued on the warm worker cost far more than 800 saved tokens.
    let backlog = w.rank(0).load.admit(50_000, 50_000);
    let (w2, cached) = s.complete(&format!("{system} q2"), 2).await;
    assert_ne!(w2, warm, "the queue should outweigh the prefix");
    assert_eq!(cached, 0, "the other worker is cold");
    drop(backlog);
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unique_prompts_spread_like_least_request() {
    let s = Stack::start(4, 1.0, PolicyKind::KvAware).await;
    // Sixteen unique prompts at once: each decision sees the queued prefill of the previous.
    let futures: Vec<_> = (0..16)
        .map(|i| {
            let http = s.http.clone();
            let url = s.url("/v1/completions");
            let p = prompt(&format!("u{i}x"), 400);
            async move {
                let resp = http
                    .post(url)
                    .json(&json!({"model": MODEL, "prompt": p, "max_tokens": 32}))
                    .send()
                    .await
                    .unwrap();
                resp.headers()["x-kvroute-worker"]
                    .to_str()
                    .unwrap()
                    .to_string()
            }
        })
        .collect();
    let workers = futures_util::future::join_all(futures).await;
    let mut counts = std::collections::BTreeMap::new();
    for w in workers {
        *counts.entry(w).or_insert(0) += 1;
    }
    assert_eq!(counts.len(), 4, "{counts:?}");
    let (min, max) = (
        counts.values().min().unwrap(),
        counts.values().max().unwrap(),
    );
    assert!(max - min <= 2, "{counts:?}");
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_engines_blocks_vanish() {
    let mut s = Stack::start(2, 50.0, PolicyKind::KvAware).await;
    let system = prompt("old", 640);
    let (warm, _) = s.complete(&format!("{system} a"), 2).await;
    s.complete(&format!("{system} b"), 2).await;
    assert!(s.wait_overlap(&system, &warm, 35).await >= 35);
    let before = s.router.state.holdings.exact.stats().entries;
    assert!(before >= 35);

    // Restart the engine on the same HTTP port and event endpoints: a new process, cold cache.
    let idx: usize = warm.trim_start_matches('e').parse().unwrap();
    let old = s.engines[idx].take().unwrap();
    let (addr, events, replay) = (old.addr, old.events.clone(), old.replay.clone());
    old.handle.shutdown().await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let fresh = SimEngine::start_at(MODEL, addr, &events, &replay, 0, 50.0).await;
    // The new engine's first events (sequence 0 again) tell the router it restarted.
    let direct = format!("http://{addr}/v1/completions");
    for i in 0..50 {
        // A new prompt each time: only uncached blocks produce events.
        let p = prompt(&format!("new{i}x"), 64);
        let r = s
            .http
            .post(&direct)
            .json(&json!({"model": MODEL, "prompt": p, "max_tokens": 1}))
            .send()
            .await;
        if r.is_ok() && s.overlap(&system, &warm).await == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    s.engines[idx] = Some(fresh);
    assert_eq!(
        s.overlap(&system, &warm).await,
        0,
        "stale blocks of the old process remain"
    );
    s.shutdown().await;
}
