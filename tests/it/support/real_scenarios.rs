//! The scenarios the real-engine suites run on either engine (vLLM or SGLang): a small cache
//! that evicts, tenants' salts, the official SDK streaming, routing concentration measured by
//! the engines' own counters, and restarts of engine and router. Each takes engines already
//! started by the caller (who chooses how many run at once) and records every request in the
//! caller's exactness table.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;

use super::real_engine::EngineProc;
use super::real_router::{
    Exactness, MODEL, RealRouter, RouterModel, Tenant, completion, router_config,
};
use super::request_kinds::document;

/// Ten documents of ~10–20 blocks of 32 tokens, three rounds, over caches smaller than them
/// together: the engine evicts, publishes `BlockRemoved`, and the prediction must follow. Asserts
/// that something was evicted (or the check measured nothing).
pub async fn evicting_cache(
    setup: &impl RouterModel,
    engines: &[EngineProc],
    table: &mut Exactness,
) {
    let block = u64::from(setup.block_size());
    let router = RealRouter::start(&router_config(setup, engines, "kv_aware", &[])).await;
    let docs: Vec<String> = (0..10)
        .map(|i| document(&format!("evict {i}"), 250 + 30 * i))
        .collect();
    // Prompt tokens of each document's first request, and how many later requests for a
    // document found less of it than its own full blocks (evicted in between).
    let mut first_tokens = vec![0u64; docs.len()];
    let mut evicted = 0;
    for round in 0..3 {
        let case = format!("evicting cache, round {round}");
        for (i, doc) in docs.iter().enumerate() {
            let o = router
                .checked(&completion(format!("{doc}\nQ{round}:"), 4), None)
                .await;
            table.record(&case, &o);
            if round == 0 {
                first_tokens[i] = o.engine_prompt_tokens;
            } else if o.cached < (first_tokens[i].saturating_sub(8) / block) * block {
                evicted += 1;
            }
            if i % 3 == 0 {
                // Revisit the first document, so its chain stays warm while others go.
                let o = router
                    .checked(&completion(format!("{}\nQ{round}:", docs[0]), 4), None)
                    .await;
                table.record(&case, &o);
            }
        }
    }
    router.shutdown().await;
    println!("requests that found part of their document evicted: {evicted}");
    assert!(
        evicted > 0,
        "nothing was evicted: the check measured nothing"
    );
}

/// A router told twice the engines' block size (issue 33): it refuses their events (their
/// blocks are of another size), so it predicts nothing cached, and every request the engine
/// then serves from its prefix cache is counted in `kvroute_cached_tokens_mismatch_total` —
/// exactly those, no more.
pub async fn wrong_block_size_mismatches(setup: &impl RouterModel, engines: &[EngineProc]) {
    let mut config = router_config(setup, &engines[..1], "kv_aware", &[]);
    for m in config.models.iter_mut().filter(|m| m.name == MODEL) {
        m.block_size *= 2;
    }
    let router = RealRouter::start(&config).await;
    router.wait_ready().await;
    let body = completion(document("a wrongly sized cache", 300), 4);
    let mut served_from_cache = 0;
    for _ in 0..5 {
        let (_, answer) = router.send(&body, None).await;
        let cached = answer["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap_or(0);
        if cached > 0 {
            served_from_cache += 1;
        }
    }
    let (compared, mismatched) = router.cached_token_mismatches().await;
    let (engine_size, named) = router.engine_block_size().await;
    router.shutdown().await;
    println!("wrong block size: {mismatched} of {compared} compared requests mismatched");
    // The engine's own report of its size (vLLM `cache_config_info`, SGLang `page_size`)
    // named the misconfiguration before any of that.
    let configured = config.model(MODEL).block_size;
    assert_eq!(
        engine_size,
        configured / 2,
        "the engine's reported block size"
    );
    assert_eq!(
        named,
        serde_json::json!([{"model": MODEL, "block_size": configured, "engine_block_size": configured / 2}])
    );
    assert!(served_from_cache >= 4, "the repeats were not cache hits");
    assert_eq!(compared, 5.0);
    assert_eq!(mismatched, f64::from(served_from_cache));
}

/// Tenants: a tenant's salt reaches the engine, and another tenant's identical prompt is cold
/// in the engine itself (its `cached_tokens` is 0, not merely the router's prediction).
pub async fn tenant_salts(setup: &impl RouterModel, engines: &[EngineProc], table: &mut Exactness) {
    let tenants: [Tenant; 2] = [("acme", "key-acme"), ("bob", "key-bob")];
    let router = RealRouter::start(&router_config(setup, engines, "kv_aware", &tenants)).await;
    let shared = completion(document("tenant prompt", 200), 4);
    let first = router.checked(&shared, Some(&tenants[0])).await;
    let again = router.checked(&shared, Some(&tenants[0])).await;
    let other = router.checked(&shared, Some(&tenants[1])).await;
    for o in [&first, &again, &other] {
        table.record("tenant cache_salt", o);
    }
    router.shutdown().await;
    assert!(
        again.cached > 0,
        "the tenant's repeat was not served from cache: {again:?}"
    );
    assert_eq!(
        other.cached, 0,
        "another tenant's identical prompt was served from the first tenant's cache: {other:?}"
    );
}

/// Clients: the official `openai` Python SDK (run by `python`, the engine's virtualenv) streams
/// a chat and a completion through kvroute, with the usage chunk (and its cached tokens on a
/// repeat) at the end.
pub async fn the_official_openai_python_sdk_streams(python: &Path, router: &RealRouter) {
    let base = router.url("");
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/scripts/real-engines/sdk_stream_check.py"
    );
    let python = python.to_path_buf();
    let prompt = document("sdk", 200);
    let out = tokio::task::spawn_blocking(move || {
        Command::new(python)
            .args([script, &base, MODEL, &prompt])
            .output()
            .expect("python runs")
    })
    .await
    .expect("SDK task");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}");
    assert!(
        out.status.success(),
        "SDK checks failed:\n{stdout}\n{stderr}"
    );
    assert!(stdout.contains("sdk checks: all ok"), "{stdout}\n{stderr}");
}

/// Not a multiple of the engine count, so `round_robin` moves each group from engine to engine.
const GROUPS: usize = 5;
const ROUNDS: usize = 4;

/// What one policy's phase did, from the engines' own counters.
pub struct Phase {
    pub hits: f64,
    pub queries: f64,
    /// Workers each group's requests went to.
    pub workers: BTreeMap<usize, BTreeSet<String>>,
}

impl Phase {
    pub fn hit_rate(&self) -> f64 {
        self.hits / self.queries.max(1.0)
    }
}

/// Engines' (hits, queries) summed.
async fn counters(engines: &[EngineProc]) -> (f64, f64) {
    let mut sum = (0.0, 0.0);
    for e in engines {
        let (h, q) = e.prefix_cache().await;
        sum.0 += h;
        sum.1 += q;
    }
    sum
}

/// `GROUPS` documents of its own (cold everywhere), `ROUNDS` questions each, interleaved.
async fn phase(
    setup: &impl RouterModel,
    engines: &[EngineProc],
    policy: &str,
    table: &mut Exactness,
) -> Phase {
    let before = counters(engines).await;
    let router = RealRouter::start(&router_config(setup, engines, policy, &[])).await;
    let docs: Vec<String> = (0..GROUPS)
        .map(|g| document(&format!("{policy} group {g}"), 300))
        .collect();
    let mut workers: BTreeMap<usize, BTreeSet<String>> = BTreeMap::new();
    let mut prompt_tokens = 0.0;
    for round in 0..ROUNDS {
        for (g, doc) in docs.iter().enumerate() {
            let body = completion(format!("{doc}\nQuestion {round}:"), 4);
            // Load-only policies skip the prefix analysis, so only kv_aware has predictions.
            let (worker, tokens) = if policy == "kv_aware" {
                let o = router.checked(&body, None).await;
                table.record("routing (kv_aware)", &o);
                (o.worker, o.engine_prompt_tokens)
            } else {
                let (worker, answer) = router.send(&body, None).await;
                (
                    worker,
                    answer["usage"]["prompt_tokens"].as_u64().unwrap_or(0),
                )
            };
            prompt_tokens += tokens as f64;
            workers.entry(g).or_default().insert(worker);
        }
    }
    router.shutdown().await;
    // The engines count a request's tokens when they schedule it; wait for all of them.
    let end = Instant::now() + Duration::from_secs(30);
    let mut after = counters(engines).await;
    while after.1 - before.1 < prompt_tokens && Instant::now() < end {
        tokio::time::sleep(Duration::from_millis(100)).await;
        after = counters(engines).await;
    }
    Phase {
        hits: after.0 - before.0,
        queries: after.1 - before.1,
        workers,
    }
}

/// Shared-prefix groups under `round_robin`, then under `kv_aware` (fresh documents each):
/// `kv_aware` keeps each group on one engine and the engines' own counters show a higher
/// prefix-cache hit rate than under `round_robin`. Returns both phases (for the report).
pub async fn kv_aware_beats_round_robin(
    setup: &impl RouterModel,
    engines: &[EngineProc],
    table: &mut Exactness,
) -> (Phase, Phase) {
    let rr = phase(setup, engines, "round_robin", table).await;
    let kv = phase(setup, engines, "kv_aware", table).await;
    for (name, p) in [("round_robin", &rr), ("kv_aware", &kv)] {
        let spread: Vec<usize> = p.workers.values().map(BTreeSet::len).collect();
        println!(
            "{name}: engines' prefix-cache hit rate {:.3} ({} hits / {} queries, tokens); \
             workers per group {spread:?}",
            p.hit_rate(),
            p.hits,
            p.queries
        );
    }
    assert!(
        kv.workers.values().all(|w| w.len() == 1),
        "kv_aware spread a shared-prefix group over several engines: {:?}",
        kv.workers
    );
    assert!(
        rr.workers.values().all(|w| w.len() > 1),
        "round_robin kept a group on one engine (the comparison measures nothing): {:?}",
        rr.workers
    );
    assert!(
        kv.hit_rate() > rr.hit_rate(),
        "the engines hit their prefix caches no more under kv_aware ({:.3}) than under \
         round_robin ({:.3})",
        kv.hit_rate(),
        rr.hit_rate()
    );
    (rr, kv)
}

/// Blocks of `body` the router's index holds on `worker` (not capped by the last-token rule);
/// none while no engine can take the request (a stopped one: `/debug/route` answers its 503).
async fn held(router: &RealRouter, body: &Value, worker: &str) -> u64 {
    let (status, v) = router.explain_or_error(body, None).await;
    if status == reqwest::StatusCode::SERVICE_UNAVAILABLE {
        assert_eq!(v["error"]["code"], "no_worker_available", "{v}");
        return 0;
    }
    assert!(status.is_success(), "/debug/route: {status} {v}");
    v["candidates"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["worker"] == worker))
        .map_or(0, |c| c["overlap_blocks"].as_u64().unwrap_or(0))
}

/// Polls until `held` is `want(held)`, for up to `limit`; the last value seen.
async fn held_until(
    router: &RealRouter,
    body: &Value,
    worker: &str,
    limit: Duration,
    want: impl Fn(u64) -> bool,
) -> u64 {
    let end = Instant::now() + limit;
    loop {
        let h = held(router, body, worker).await;
        if want(h) || Instant::now() > end {
            return h;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// An engine stopped and restarted on its ports: the router drops its blocks while it is
/// down (stale entries are worse than none), and is exact again once it is back, cold.
pub async fn engine_restart(
    setup: &impl RouterModel,
    engine: &mut EngineProc,
    table: &mut Exactness,
) {
    let router = RealRouter::start(&router_config(
        setup,
        std::slice::from_ref(engine),
        "kv_aware",
        &[],
    ))
    .await;
    let worker = engine.name.clone();
    let prompts: Vec<Value> = (0..3)
        .map(|i| completion(document(&format!("restart {i}"), 250), 4))
        .collect();
    for p in prompts.iter().chain(&prompts) {
        table.record("before the restart", &router.checked(p, None).await);
    }
    assert!(
        held(&router, &prompts[0], &worker).await > 0,
        "the index never held the prompt"
    );
    engine.stop();
    let left = held_until(
        &router,
        &prompts[0],
        &worker,
        Duration::from_secs(60),
        |h| h == 0,
    )
    .await;
    assert_eq!(
        left, 0,
        "the router still predicts a stopped engine's cache"
    );
    engine.restart().await;
    router.wait_ready().await;
    // Back on the same ports with an empty cache: nothing is predicted, and the engine agrees.
    for p in prompts.iter().chain(&prompts) {
        table.record("after the restart", &router.checked(p, None).await);
    }
    router.shutdown().await;
}

/// A router that starts next to an engine with cached prefixes sees them before the engine
/// publishes anything new (it replays from the engine's replay socket when it connects).
pub async fn router_restart(setup: &impl RouterModel, engine: &EngineProc, table: &mut Exactness) {
    let engines = std::slice::from_ref(engine);
    let config = router_config(setup, engines, "kv_aware", &[]);
    let worker = engine.name.clone();
    let prompts: Vec<Value> = (0..3)
        .map(|i| completion(document(&format!("warm {i}"), 250), 4))
        .collect();
    let first = RealRouter::start(&config).await;
    let mut tokens = 0;
    for p in &prompts {
        tokens = first.checked(p, None).await.engine_prompt_tokens;
    }
    first.shutdown().await;

    let router = RealRouter::start(&config).await;
    // No request is sent until the new router has learned the engine's cache.
    let last = &prompts[prompts.len() - 1];
    let full = (tokens - 1) / u64::from(setup.block_size());
    let blocks = held_until(&router, last, &worker, Duration::from_secs(30), |h| {
        h >= full
    })
    .await;
    assert!(
        blocks >= full,
        "a router restarted next to a warm engine holds {blocks} of the {full} cached blocks of a \
         prompt without a new event (it must replay from the engine's replay socket when it \
         connects)"
    );
    for p in &prompts {
        let o = router.checked(p, None).await;
        assert!(
            o.cached > 0,
            "the engine did not serve the warm prompt from cache: {o:?}"
        );
        table.record("router restarted, warm engine", &o);
    }
    router.shutdown().await;
}

/// The small context of [`contexts_route_where_they_fit`]'s first engine.
pub const SHORT_CONTEXT: usize = 256;

/// A completion of `n` token ids (the same id: the tokenizer is not involved), up to
/// `max_tokens` output tokens when given.
fn token_ids(n: usize, max_tokens: Option<u64>) -> Value {
    let mut body = serde_json::json!({"model": MODEL, "prompt": vec![42u32; n], "temperature": 0});
    if let Some(m) = max_tokens {
        body["max_tokens"] = serde_json::json!(m);
    }
    body
}

/// The status and answer of `body` sent straight to the engine at `url`.
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

/// Two engines, the first of context [`SHORT_CONTEXT`], the second larger, behind `kv_aware`:
/// the engine's own edges asked directly — `last_fit` prompt tokens served on the small one and
/// one more refused; 200 prompt tokens with `max_tokens` 100 answered `long_max_tokens` (vLLM
/// clamps, 200; SGLang refuses, 400) — then the router's narrowing at the same edges, and every
/// prompt the small engine would refuse served by the large one.
pub async fn contexts_route_where_they_fit(
    setup: &impl RouterModel,
    engines: &[EngineProc],
    last_fit: usize,
    long_max_tokens: u16,
) {
    let (small, large) = (&engines[0], &engines[1]);
    let (fits, answer) = direct(&small.url(), &token_ids(last_fit, Some(1))).await;
    assert_eq!(fits, 200, "{answer}");
    let over = token_ids(last_fit + 1, Some(1));
    let (refused, answer) = direct(&small.url(), &over).await;
    assert_eq!(refused, 400, "{answer}");
    let (held, answer) = direct(&large.url(), &over).await;
    assert_eq!(held, 200, "{answer}");
    let (status, answer) = direct(&small.url(), &token_ids(200, Some(100))).await;
    assert_eq!(status, long_max_tokens, "{answer}");
    if status == 200 {
        let completion = answer["usage"]["completion_tokens"].as_u64().unwrap_or(0);
        assert!(completion <= (SHORT_CONTEXT - 200) as u64, "{answer}");
    }

    let router = RealRouter::start(&router_config(setup, engines, "kv_aware", &[])).await;
    router.wait_ready().await;
    // The router reads each engine's context from its /v1/models on a passing health check.
    let end = Instant::now() + Duration::from_secs(20);
    let explained = loop {
        let explained = router.explain(&over, None).await;
        if !super::context_excluded(&explained).is_empty() || Instant::now() > end {
            break explained;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let small_only = [small.name.as_str()];
    assert_eq!(
        super::context_excluded(&explained),
        small_only,
        "{explained}"
    );
    let explained = router.explain(&token_ids(last_fit, Some(1)), None).await;
    assert!(
        super::context_excluded(&explained).is_empty(),
        "{explained}"
    );
    let explained = router.explain(&token_ids(200, Some(100)), None).await;
    assert_eq!(
        super::context_excluded(&explained),
        small_only,
        "{explained}"
    );
    for n in [last_fit + 1, 300, 1000] {
        let (worker, answer) = router.send(&token_ids(n, Some(4)), None).await;
        assert_eq!(worker, large.name, "{n} tokens: {answer}");
    }
    // A batch is hashed on its first prompt; the small engine refuses it for its second.
    let batch = serde_json::json!({
        "model": MODEL,
        "prompt": [vec![42u32; 8], vec![42u32; last_fit + 1]],
        "max_tokens": 4,
        "temperature": 0,
    });
    let (refused, answer) = direct(&small.url(), &batch).await;
    assert_eq!(refused, 400, "{answer}");
    let (worker, answer) = router.send(&batch, None).await;
    assert_eq!(worker, large.name, "a batch: {answer}");
    router.shutdown().await;
}
