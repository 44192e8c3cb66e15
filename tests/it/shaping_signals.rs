//! Issue 33, parts 3 and 4 on real sockets with simulated engines: latency targets steer and
//! refuse as documented, and the router's predicted cached tokens match what the engine
//! reports — exactly (no mismatch) when the worker is described right, and mismatching on
//! every request that hits a cache the router cannot see (a worker configured with the wrong
//! block size). Counted, never timed.

use std::path::Path;
use std::time::{Duration, Instant};

use kvroute::config::Config;
use kvroute::server::RouterHandle;
use serde_json::{Value, json};
use tokio::net::TcpListener;

use crate::support::{self, SimEngine};

const MODEL: &str = "sim";

/// A `kv_aware` router over `engine` (as worker `id`), models at block size 16, with `extra`.
fn router(id: &str, engine: &SimEngine, extra: &str) -> RouterHandle {
    router_with_model(id, engine, extra, "")
}

/// [`router`], with `model_keys` added to the model's `[[models]]` entry.
fn router_with_model(id: &str, engine: &SimEngine, extra: &str, model_keys: &str) -> RouterHandle {
    let text = format!(
        "policy = \"kv_aware\"\nshutdown_grace_s = 1.0\n[health]\ninterval_s = 0.2\n{extra}\n\
         [[models]]\nname = \"{MODEL}\"\nblock_size = 16\n{model_keys}\n"
    );
    let mut config = Config::from_toml(&text, Path::new("test")).expect("config");
    config.workers = vec![engine.worker(id, MODEL)];
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.set_nonblocking(true).expect("nonblocking");
    let listener = TcpListener::from_std(listener).expect("listener");
    kvroute::server::start(&config, listener).expect("router")
}

/// Sends a completion; status, error code and body.
async fn complete(
    router: &RouterHandle,
    key: Option<&str>,
    headers: &[(&str, &str)],
    prompt: &str,
) -> (u16, Option<String>, Value) {
    let mut req = reqwest::Client::new()
        .post(format!("http://{}/v1/completions", router.addr))
        .json(&json!({"model": MODEL, "prompt": prompt, "max_tokens": 4}));
    if let Some(k) = key {
        req = req.bearer_auth(k);
    }
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = req.send().await.expect("router answers");
    let status = resp.status().as_u16();
    let body: Value = resp.json().await.expect("JSON");
    let code = body["error"]["code"].as_str().map(str::to_owned);
    (status, code, body)
}

/// The value of the series `name{labels}` (0 when absent).
fn value(page: &str, name: &str, labels: &str) -> f64 {
    let prefix = format!("{name}{{{labels}}} ");
    page.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ttft_targets_steer_refuse_sheddable_requests_and_are_counted() {
    let engine = SimEngine::start(MODEL, 0, 1.0).await;
    let tenants = format!(
        "[[tenants]]\nname = \"a\"\napi_key_sha256 = \"{}\"\n\
         [[tenants]]\nname = \"s\"\napi_key_sha256 = \"{}\"\nsheddable = true\n\
         [[tenants]]\nname = \"slow\"\napi_key_sha256 = \"{}\"\nttft_target_ms = 0.001\nsheddable = true\n",
        crate::support::sha256_hex("key-a"),
        crate::support::sha256_hex("key-s"),
        crate::support::sha256_hex("key-slow"),
    );
    let r = router("e0", &engine, &tenants);
    let impossible = [("x-kvroute-ttft-target-ms", "0.001")];
    let easy = [("x-kvroute-ttft-target-ms", "60000")];
    // Not sheddable: routed best effort.
    let (status, _, _) = complete(&r, Some("key-a"), &impossible, "hello a").await;
    assert_eq!(status, 200);
    // Sheddable: refused at once, by header or by its tenant's own target.
    let (status, code, _) = complete(&r, Some("key-s"), &impossible, "hello s").await;
    assert_eq!((status, code.as_deref()), (503, Some("slo_unmeetable")));
    let (status, code, _) = complete(&r, Some("key-slow"), &[], "hello slow").await;
    assert_eq!((status, code.as_deref()), (503, Some("slo_unmeetable")));
    let (status, _, _) = complete(&r, Some("key-s"), &easy, "hello easy").await;
    assert_eq!(status, 200);
    let bad = [("x-kvroute-ttft-target-ms", "soon")];
    let (status, code, _) = complete(&r, Some("key-a"), &bad, "hello bad").await;
    assert_eq!((status, code.as_deref()), (400, Some("invalid_slo")));
    let page = support::metrics_text(r.addr).await;
    let slo = |outcome: &str| {
        value(
            &page,
            "kvroute_slo_requests_total",
            &format!("outcome=\"{outcome}\",target=\"ttft\""),
        )
    };
    assert_eq!(slo("refused"), 2.0, "{page}");
    assert_eq!(slo("predicted_missed"), 1.0);
    assert_eq!(slo("predicted_met"), 1.0);
    // The impossible target was missed (no first token comes within a microsecond), the easy
    // one met.
    assert_eq!((slo("met"), slo("missed")), (1.0, 1.0));
    r.shutdown().await;
    let _ = engine.handle.shutdown().await;
}

/// A model's target (`[[models]] ttft_target_ms`) is below the request's header and above
/// its tenant's default; requests routed with a target move the saturation's `ttft` part.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_models_target_sits_between_the_header_and_the_tenants() {
    let engine = SimEngine::start(MODEL, 0, 1.0).await;
    let tenants = format!(
        "[[tenants]]\nname = \"s\"\napi_key_sha256 = \"{}\"\nsheddable = true\nttft_target_ms = 60000\n\
         [[tenants]]\nname = \"a\"\napi_key_sha256 = \"{}\"\n",
        crate::support::sha256_hex("key-s"),
        crate::support::sha256_hex("key-a"),
    );
    let r = router_with_model("e0", &engine, &tenants, "ttft_target_ms = 0.001");
    // The model's impossible target wins over the tenant's easy one: refused.
    let (status, code, _) = complete(&r, Some("key-s"), &[], "model target").await;
    assert_eq!((status, code.as_deref()), (503, Some("slo_unmeetable")));
    // The request's own header wins over the model's.
    let easy = [("x-kvroute-ttft-target-ms", "60000")];
    let (status, _, _) = complete(&r, Some("key-s"), &easy, "header target").await;
    assert_eq!(status, 200);
    let page = support::metrics_text(r.addr).await;
    let ttft_part = |page: &str| value(page, "kvroute_saturation_part", "part=\"ttft\"");
    assert!(
        ttft_part(&page) < 0.01,
        "an easy target leaves it near 0: {page}"
    );
    // Not sheddable: routed past the model's target, and predicted to miss it.
    let (status, _, _) = complete(&r, Some("key-a"), &[], "routed late").await;
    assert_eq!(status, 200);
    let page = support::metrics_text(r.addr).await;
    let part = ttft_part(&page);
    assert!(part > 0.0 && part <= 1.0, "{page}");
    let whole: f64 = page
        .lines()
        .find_map(|l| l.strip_prefix("kvroute_saturation "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0);
    assert!(whole >= part, "the whole is the largest part: {page}");
    r.shutdown().await;
    let _ = engine.handle.shutdown().await;
}

/// The saturation's `kv` part is the engines' KV usage as the router reads it: a long stream
/// holding KV blocks on the engine raises it above 0, and the whole is at least it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_saturation_counts_the_engines_kv_usage() {
    let engine = SimEngine::start(MODEL, 0, 1.0).await;
    let r = router("e0", &engine, "load_interval_ms = 50");
    let body = json!({"model": MODEL, "prompt": "a long prompt to hold blocks ".repeat(64), "max_tokens": 3000, "stream": true});
    let url = format!("http://{}/v1/completions", r.addr);
    let mut stream = reqwest::Client::new()
        .post(&url)
        .json(&body)
        .send()
        .await
        .expect("router answers");
    assert_eq!(stream.status(), 200);
    stream.chunk().await.expect("first chunk");
    let read = |page: &str, prefix: &str| -> f64 {
        page.lines()
            .find_map(|l| l.strip_prefix(prefix))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0.0)
    };
    let mut page = String::new();
    for _ in 0..200 {
        page = support::metrics_text(r.addr).await;
        if read(&page, "kvroute_saturation_part{part=\"kv\"} ") > 0.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let kv = read(&page, "kvroute_saturation_part{part=\"kv\"} ");
    assert!(
        kv > 0.0 && kv <= 1.0,
        "the engine's KV usage never showed: {page}"
    );
    assert!(read(&page, "kvroute_saturation ") >= kv, "{page}");
    drop(stream);
    r.shutdown().await;
    let _ = engine.handle.shutdown().await;
}

/// Sends `prompt` once, waits until the router's index sees its blocks on the worker (or
/// `limit` passes, for a worker whose events it refuses), then `repeats` times more.
async fn warm_then_repeat(r: &RouterHandle, prompt: &str, repeats: usize, wait: bool) {
    assert_eq!(complete(r, None, &[], prompt).await.0, 200);
    if wait {
        let body = json!({"model": MODEL, "prompt": prompt});
        let debug = format!("http://{}/debug/route", r.addr);
        let end = Instant::now() + Duration::from_secs(20);
        loop {
            let v = support::post_json(&debug, &body).await;
            if v["candidates"][0]["overlap_blocks"].as_u64().unwrap_or(0) > 0 {
                break;
            }
            assert!(Instant::now() < end, "the index never saw the prompt: {v}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    for _ in 0..repeats {
        let (status, _, body) = complete(r, None, &[], prompt).await;
        assert_eq!(status, 200);
        assert!(
            body["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64() > Some(0),
            "{body}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn predicted_cached_tokens_match_the_engine_unless_the_block_size_is_wrong() {
    let prompt = "a prompt long enough for several blocks of either size, again ".repeat(8);
    let right = SimEngine::start_with_block_size(MODEL, 16).await;
    let r = router("b16", &right, "");
    warm_then_repeat(&r, &prompt, 3, true).await;
    let page = support::metrics_text(r.addr).await;
    let w = "worker=\"b16\"";
    assert_eq!(
        value(&page, "kvroute_cached_tokens_compared_total", w),
        4.0,
        "{page}"
    );
    assert_eq!(value(&page, "kvroute_cached_tokens_mismatch_total", w), 0.0);
    assert!(
        value(
            &page,
            "kvroute_cached_tokens_total",
            &format!("model=\"{MODEL}\",{w}")
        ) > 0.0
    );
    assert!(
        value(
            &page,
            "kvroute_prompt_tokens_total",
            &format!("model=\"{MODEL}\",{w}")
        ) > 0.0
    );
    assert_eq!(
        value(
            &page,
            "kvroute_completion_tokens_total",
            &format!("model=\"{MODEL}\",{w}")
        ),
        16.0
    );
    r.shutdown().await;
    let _ = right.handle.shutdown().await;

    // The engine stores 32-token blocks; the router is told 16: it refuses the events, so it
    // predicts nothing cached, and every repeat the engine serves from its cache mismatches.
    let wrong = SimEngine::start_with_block_size(MODEL, 32).await;
    let r = router("b32", &wrong, "");
    warm_then_repeat(&r, &prompt, 3, false).await;
    let page = support::metrics_text(r.addr).await;
    let w = "worker=\"b32\"";
    assert_eq!(
        value(&page, "kvroute_cached_tokens_compared_total", w),
        4.0,
        "{page}"
    );
    assert_eq!(value(&page, "kvroute_cached_tokens_mismatch_total", w), 3.0);
    r.shutdown().await;
    let _ = wrong.handle.shutdown().await;
}
