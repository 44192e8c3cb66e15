//! Prefill/decode disaggregation end to end: simulated engines started as prefill and decode
//! engines (real sockets; KV events over ZeroMQ; vLLM-style transfers pulled over HTTP, SGLang-
//! style bootstrap rooms on their own listener), a router choosing a prefill worker KV-aware
//! and a decode worker by load, the hand-off in both protocols, and the failure cases: a
//! prefill that fails, a decode that fails before its first token, and one that fails after.

use std::path::Path;
use std::time::Duration;

use kvroute::config::Config;
use kvroute::fleet::Role;
use kvroute::server::RouterHandle;
use serde_json::{Value, json};

use crate::support::*;

pub(crate) const MODEL: &str = "sim";

/// One `[[workers]]` entry.
pub(crate) struct W {
    pub(crate) id: &'static str,
    pub(crate) url: String,
    pub(crate) role: &'static str,
    pub(crate) events: Option<(String, String)>,
    pub(crate) bootstrap: Option<u16>,
}

fn engine(id: &'static str, e: &SimEngine, role: &'static str) -> W {
    W {
        id,
        url: e.url(),
        role,
        events: Some((e.events.clone(), e.replay.clone())),
        bootstrap: None,
    }
}

pub(crate) fn backend(id: &'static str, b: &Backend, role: &'static str) -> W {
    W {
        id,
        url: b.url(),
        role,
        events: None,
        bootstrap: None,
    }
}

pub(crate) fn config_text(protocol: &str, workers: &[W], extra: &str) -> String {
    let mut text = format!(
        "policy = \"kv_aware\"\nshutdown_grace_s = 1.0\n{extra}\n[health]\ninterval_s = 0.2\n\
         [kv_aware]\ncalibrate = false\n[[models]]\nname = \"{MODEL}\"\nblock_size = 16\n\
         disaggregation = \"{protocol}\"\n"
    );
    for w in workers {
        text.push_str(&format!(
            "[[workers]]\nid = \"{}\"\nurl = \"{}\"\nmodels = [\"{MODEL}\"]\nrole = \"{}\"\n",
            w.id, w.url, w.role
        ));
        if let Some((events, replay)) = &w.events {
            text.push_str(&format!(
                "kv_events = \"{events}\"\nkv_replay = \"{replay}\"\n"
            ));
        }
        if let Some(port) = w.bootstrap {
            text.push_str(&format!("bootstrap_port = {port}\n"));
        }
    }
    text
}

pub(crate) async fn router(protocol: &str, workers: &[W], extra: &str) -> RouterHandle {
    let text = config_text(protocol, workers, extra);
    let config = Config::from_toml(&text, Path::new("test")).unwrap();
    start_router(&config).await
}

fn header(resp: &reqwest::Response, name: &str) -> String {
    resp.headers()
        .get(name)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned()
}

/// A prompt of about `words` words, distinct per `seed`.
fn prompt(seed: &str, words: usize) -> String {
    (0..words)
        .map(|i| format!("{seed}{}", i % 7))
        .collect::<Vec<_>>()
        .join(" ")
}

async fn send(
    r: &RouterHandle,
    body: Value,
    chat: bool,
) -> (reqwest::StatusCode, String, String, String) {
    let path = if chat {
        "chat/completions"
    } else {
        "completions"
    };
    let resp = client()
        .post(format!("http://{}/v1/{path}", r.addr))
        .json(&body)
        .send()
        .await
        .unwrap();
    let (decode, prefill) = (
        header(&resp, "x-kvroute-worker"),
        header(&resp, "x-kvroute-prefill-worker"),
    );
    (resp.status(), decode, prefill, resp.text().await.unwrap())
}

/// Content events of an SSE body (chat deltas or completion texts), and whether it had an
/// error event.
fn sse_content(body: &str) -> (Vec<String>, bool) {
    let mut content = Vec::new();
    let mut error = false;
    for line in body.lines() {
        let Some(data) = line.strip_prefix("data: ") else {
            continue;
        };
        let Ok(v) = serde_json::from_str::<Value>(data) else {
            continue;
        };
        error |= v.get("error").is_some();
        let c = &v["choices"][0];
        if let Some(t) = c["text"].as_str().or(c["delta"]["content"].as_str())
            && !t.is_empty()
        {
            content.push(t.to_owned());
        }
    }
    (content, error)
}

async fn metric(r: &RouterHandle, needle: &str) -> f64 {
    let text = metrics_text(r.addr).await;
    text.lines()
        .filter(|l| l.starts_with(needle))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vllm_style_hands_the_kv_over_streamed_and_not() {
    let p0 = SimEngine::start_role(MODEL, Role::Prefill, false).await;
    let d0 = SimEngine::start_role(MODEL, Role::Decode, false).await;
    let r = router(
        "vllm",
        &[engine("p0", &p0, "prefill"), engine("d0", &d0, "decode")],
        "",
    )
    .await;
    // A client's own transfer parameters never reach an engine (a decode engine given them
    // without a prefill would refuse, or with real vLLM die).
    let body = json!({"model": MODEL, "prompt": prompt("a", 60), "max_tokens": 5,
        "kv_transfer_params": {"do_remote_prefill": true}});
    let (status, decode, prefill, text) = send(&r, body, false).await;
    assert_eq!(status, 200, "{text}");
    assert_eq!((decode.as_str(), prefill.as_str()), ("d0", "p0"));
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["usage"]["completion_tokens"], 5, "{v}");
    assert!(
        v.get("kv_transfer_params").is_none_or(Value::is_null),
        "{v}"
    );
    let body = json!({"model": MODEL, "stream": true, "max_tokens": 4,
        "messages": [{"role": "user", "content": prompt("b", 40)}]});
    let (status, decode, prefill, text) = send(&r, body, true).await;
    assert_eq!(status, 200, "{text}");
    assert_eq!((decode.as_str(), prefill.as_str()), ("d0", "p0"));
    let (content, error) = sse_content(&text);
    assert_eq!(content.len(), 4, "{text}");
    assert!(!error && text.contains("[DONE]"), "{text}");
    assert_eq!(
        metric(
            &r,
            "kvroute_disaggregated_handoffs_total{outcome=\"relayed\",protocol=\"vllm\"}"
        )
        .await,
        2.0
    );
    assert!(
        metric(
            &r,
            "kvroute_disaggregated_picks_total{side=\"decode\",worker=\"d0\"}"
        )
        .await
            >= 2.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sglang_style_pairs_both_workers_by_a_bootstrap_room() {
    let p0 = SimEngine::start_role(MODEL, Role::Prefill, true).await;
    let d0 = SimEngine::start_role(MODEL, Role::Decode, false).await;
    let mut pw = engine("p0", &p0, "prefill");
    pw.bootstrap = Some(p0.bootstrap_port());
    let r = router("sglang", &[pw, engine("d0", &d0, "decode")], "").await;
    for stream in [false, true] {
        let body = json!({"model": MODEL, "prompt": prompt("s", 50), "max_tokens": 6,
            "stream": stream});
        let (status, decode, prefill, text) = send(&r, body, false).await;
        assert_eq!(status, 200, "{text}");
        assert_eq!((decode.as_str(), prefill.as_str()), ("d0", "p0"));
        if stream {
            let (content, error) = sse_content(&text);
            assert_eq!(content.len(), 6, "{text}");
            assert!(!error, "{text}");
        } else {
            let v: Value = serde_json::from_str(&text).unwrap();
            assert_eq!(v["usage"]["completion_tokens"], 6, "{v}");
        }
    }
    assert_eq!(
        metric(
            &r,
            "kvroute_disaggregated_handoffs_total{outcome=\"paired\",protocol=\"sglang\"}"
        )
        .await,
        2.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_prefill_goes_where_the_prefix_is_cached_and_debug_route_shows_both_picks() {
    let p0 = SimEngine::start_role(MODEL, Role::Prefill, false).await;
    let p1 = SimEngine::start_role(MODEL, Role::Prefill, false).await;
    let d0 = SimEngine::start_role(MODEL, Role::Decode, false).await;
    let r = router(
        "vllm",
        &[
            engine("p0", &p0, "prefill"),
            engine("p1", &p1, "prefill"),
            engine("d0", &d0, "decode"),
        ],
        "",
    )
    .await;
    for seed in ["x", "y", "z"] {
        let text = prompt(seed, 200);
        let body = json!({"model": MODEL, "prompt": text, "max_tokens": 2});
        let (status, _, first, out) = send(&r, body.clone(), false).await;
        assert_eq!(status, 200, "{out}");
        // Wait until the prefill engine's KV events reached the index.
        let url = format!("http://{}/debug/route", r.addr);
        let mut seen = false;
        for _ in 0..100 {
            let d = post_json(&url, &body).await;
            let held =
                d["candidates"].as_array().unwrap().iter().any(|c| {
                    c["worker"] == first.as_str() && c["overlap_blocks"].as_u64() > Some(0)
                });
            if held {
                assert_eq!(d["worker"], first.as_str(), "{d}");
                assert_eq!(d["decode"]["worker"], "d0", "{d}");
                assert_eq!(d["disaggregation"], "vllm", "{d}");
                let roles: Vec<_> = d["candidates"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|c| c["role"].clone())
                    .collect();
                assert_eq!(roles, [json!("prefill"), json!("prefill")], "{d}");
                seen = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(seen, "the index never learned {first}'s blocks");
        for _ in 0..2 {
            let (status, decode, again, out) = send(&r, body.clone(), false).await;
            assert_eq!(status, 200, "{out}");
            assert_eq!((again.as_str(), decode.as_str()), (first.as_str(), "d0"));
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decodes_spread_over_the_decode_pool_by_load() {
    let p0 = SimEngine::start_role(MODEL, Role::Prefill, false).await;
    let d0 = SimEngine::start_role(MODEL, Role::Decode, false).await;
    let d1 = SimEngine::start_role(MODEL, Role::Decode, false).await;
    let r = router(
        "vllm",
        &[
            engine("p0", &p0, "prefill"),
            engine("d0", &d0, "decode"),
            engine("d1", &d1, "decode"),
        ],
        "",
    )
    .await;
    // Only the answers' heads are awaited (the router answers once the decode's first token
    // is in) and the streams are held open: every decode is still running when the last is
    // picked, however slowly a loaded machine lets the four prefills end. (Reading whole
    // answers of a few hundred tokens let a fast decode end before a late pick, which then
    // saw one decode worker idle and sent two there.)
    let sends = (0..4).map(|i| {
        let body = json!({"model": MODEL, "prompt": prompt(&format!("q{i}"), 30),
            "max_tokens": 20_000, "stream": true});
        client()
            .post(format!("http://{}/v1/completions", r.addr))
            .json(&body)
            .send()
    });
    let answers = futures_util::future::join_all(sends).await;
    let mut per = std::collections::BTreeMap::new();
    for answer in &answers {
        let answer = answer.as_ref().expect("an answer");
        assert_eq!(answer.status(), 200);
        assert_eq!(header(answer, "x-kvroute-prefill-worker"), "p0");
        *per.entry(header(answer, "x-kvroute-worker")).or_insert(0) += 1;
    }
    assert_eq!(per.get("d0"), Some(&2), "{per:?}");
    assert_eq!(per.get("d1"), Some(&2), "{per:?}");
    // Dropping the answers disconnects the client, which aborts the decodes.
    drop(answers);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_prefill_is_sent_to_another_prefill_worker() {
    // Healthy to the health checker, but every completion answers 503.
    let failing = Backend::start("failing", &[MODEL]).await;
    failing.set(|b| b.fail_status = Some(503));
    let p0 = SimEngine::start_role(MODEL, Role::Prefill, false).await;
    let d0 = SimEngine::start_role(MODEL, Role::Decode, false).await;
    let r = router(
        "vllm",
        &[
            backend("failing", &failing, "prefill"),
            engine("p0", &p0, "prefill"),
            engine("d0", &d0, "decode"),
        ],
        "",
    )
    .await;
    for i in 0..3 {
        let body = json!({"model": MODEL, "prompt": prompt(&format!("f{i}"), 20), "max_tokens": 2});
        let (status, decode, prefill, text) = send(&r, body, false).await;
        assert_eq!(status, 200, "{text}");
        assert_eq!((decode.as_str(), prefill.as_str()), ("d0", "p0"));
    }
    assert!(
        failing.count() >= 1,
        "the failing prefill worker was never tried"
    );
    assert!(
        metric(&r, "kvroute_disaggregated_retries_total{phase=\"prefill\"").await >= 1.0,
        "{}",
        metrics_text(r.addr).await
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decode_that_fails_before_its_first_token_is_retried_and_the_client_sees_one_answer() {
    let p0 = SimEngine::start_role(MODEL, Role::Prefill, false).await;
    let d1 = SimEngine::start_role(MODEL, Role::Decode, false).await;
    let bad = Backend::start("bad", &[MODEL]).await;
    let r = router(
        "vllm",
        &[
            engine("p0", &p0, "prefill"),
            backend("bad", &bad, "decode"),
            engine("d1", &d1, "decode"),
        ],
        "",
    )
    .await;
    // A plain request whose decode answers 500 (vLLM's failed KV load): prefill and decode again.
    bad.set(|b| b.fail_status = Some(500));
    let body = json!({"model": MODEL, "prompt": prompt("r", 30), "max_tokens": 3});
    let (status, decode, prefill, text) = send(&r, body, false).await;
    assert_eq!(status, 200, "{text}");
    assert_eq!((decode.as_str(), prefill.as_str()), ("d1", "p0"));
    let got = bad.received();
    assert_eq!(got.len(), 1);
    let sent: Value = serde_json::from_slice(&got[0].body).unwrap();
    assert_eq!(
        sent["kv_transfer_params"]["do_remote_prefill"], true,
        "{sent}"
    );
    assert_eq!(
        sent["max_tokens"], 3,
        "the decode gets the original request: {sent}"
    );
    // A stream whose first event is an error (vLLM's streamed failure): the client never sees it.
    bad.set(|b| {
        b.fail_status = None;
        b.error_event_first = true;
    });
    let body = json!({"model": MODEL, "stream": true, "max_tokens": 3,
        "messages": [{"role": "user", "content": prompt("t", 30)}]});
    let (status, decode, _, text) = send(&r, body, true).await;
    assert_eq!(status, 200, "{text}");
    let (content, error) = sse_content(&text);
    assert!(
        !error,
        "the failed decode's error reached the client: {text}"
    );
    assert_eq!(content.len(), 3, "{text}");
    assert_eq!(decode, "d1");
    assert!(
        metric(&r, "kvroute_disaggregated_retries_total{phase=\"pair\"").await >= 2.0,
        "{}",
        metrics_text(r.addr).await
    );
}

/// A vLLM-style pair of one simulated prefill engine `p0` and one decode backend `bad` behaving
/// as `behave` says, behind a router.
async fn prefill_and_bad_decode(
    behave: impl FnOnce(&mut Behavior),
) -> (SimEngine, Backend, RouterHandle) {
    let p0 = SimEngine::start_role(MODEL, Role::Prefill, false).await;
    let bad = Backend::start("bad", &[MODEL]).await;
    bad.set(behave);
    let r = router(
        "vllm",
        &[engine("p0", &p0, "prefill"), backend("bad", &bad, "decode")],
        "",
    )
    .await;
    (p0, bad, r)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decode_that_fails_after_its_first_token_ends_the_stream_with_an_error_event() {
    let (_p0, bad, r) = prefill_and_bad_decode(|b| b.break_mid_stream = true).await;
    let body = json!({"model": MODEL, "prompt": prompt("m", 20), "max_tokens": 3, "stream": true});
    let (status, decode, _, text) = send(&r, body, false).await;
    assert_eq!(status, 200, "{text}");
    assert_eq!(decode, "bad");
    let (content, error) = sse_content(&text);
    assert_eq!(
        content,
        ["tok0 "],
        "the first token once, nothing replayed: {text}"
    );
    assert!(error && text.contains("upstream_stream_error"), "{text}");
    assert_eq!(bad.received().len(), 1, "no retry after the first token");
}

/// The only decode worker fails before its first token: the retry finds no decode worker left,
/// and the client is told the hand-off failed (502 `decode_failed`), not that no worker was
/// ever available (503).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pair_whose_only_decode_fails_is_a_502_naming_the_decode() {
    let (_p0, _bad, r) = prefill_and_bad_decode(|b| b.error_event_first = true).await;
    let body = json!({"model": MODEL, "prompt": prompt("f", 20), "max_tokens": 3, "stream": true});
    let (status, _, _, text) = send(&r, body, false).await;
    assert_eq!(status, 502, "{text}");
    assert!(text.contains("decode_failed"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenants_requests_are_handed_off_with_its_salt() {
    use sha2::{Digest, Sha256};
    let key_hash: String = Sha256::digest(b"key-acme")
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let p0 = SimEngine::start_role(MODEL, Role::Prefill, false).await;
    let d0 = Backend::start("d0", &[MODEL]).await;
    let tenants = format!("[[tenants]]\nname = \"acme\"\napi_key_sha256 = \"{key_hash}\"\n");
    let r = router(
        "vllm",
        &[engine("p0", &p0, "prefill"), backend("d0", &d0, "decode")],
        &tenants,
    )
    .await;
    let resp = client()
        .post(format!("http://{}/v1/completions", r.addr))
        .bearer_auth("key-acme")
        .json(&json!({"model": MODEL, "prompt": prompt("t", 20), "max_tokens": 2}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(header(&resp, "x-kvroute-prefill-worker"), "p0");
    let got = d0.received();
    let sent: Value = serde_json::from_slice(&got[0].body).unwrap();
    assert!(
        sent["cache_salt"].as_str().is_some_and(|s| !s.is_empty()),
        "{sent}"
    );
    assert_eq!(
        sent["kv_transfer_params"]["do_remote_prefill"], true,
        "{sent}"
    );
    assert!(got[0].headers.get("authorization").is_none());
    let anonymous = client()
        .post(format!("http://{}/v1/completions", r.addr))
        .json(&json!({"model": MODEL, "prompt": "x"}))
        .send()
        .await
        .unwrap();
    assert_eq!(anonymous.status(), 401);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decode_engine_refuses_a_transfer_its_prefill_never_issued() {
    let p0 = SimEngine::start_role(MODEL, Role::Prefill, false).await;
    let d0 = SimEngine::start_role(MODEL, Role::Decode, false).await;
    let c = client();
    let text = prompt("w", 30);
    let prefill: Value = c
        .post(format!("{}/v1/completions", p0.url()))
        .json(
            &json!({"model": MODEL, "prompt": text, "max_tokens": 1, "stream": false,
            "kv_transfer_params": {"do_remote_decode": true}}),
        )
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let params = prefill["kv_transfer_params"].clone();
    assert_eq!(params["do_remote_prefill"], true, "{prefill}");
    assert_eq!(params["remote_port"], p0.addr.port(), "{prefill}");
    let decode = |params: Value, stream: bool| {
        c.post(format!("{}/v1/completions", d0.url()))
            .json(
                &json!({"model": MODEL, "prompt": text, "max_tokens": 2, "stream": stream,
                "kv_transfer_params": params}),
            )
            .send()
    };
    // Another engine's id: refused by the prefill engine, failed like vLLM's failed load.
    let mut wrong = params.clone();
    wrong["remote_engine_id"] = json!("someone-else");
    let resp = decode(wrong.clone(), false).await.unwrap();
    assert_eq!(resp.status(), 500);
    let streamed = decode(wrong, true).await.unwrap();
    assert_eq!(streamed.status(), 200);
    let (content, error) = sse_content(&streamed.text().await.unwrap());
    assert!(error && content.is_empty());
    // The right parameters once; a second pull of the same blocks finds nothing.
    let resp = decode(params.clone(), false).await.unwrap();
    assert_eq!(resp.status(), 200);
    let again = decode(params, false).await.unwrap();
    assert_eq!(again.status(), 500);
    // A plain request is not a decode engine's to serve.
    let plain = c
        .post(format!("{}/v1/completions", d0.url()))
        .json(&json!({"model": MODEL, "prompt": "x"}))
        .send()
        .await
        .unwrap();
    assert_eq!(assert_openai_error(plain, 400).await["code"], "wrong_role");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_sglang_pair_whose_prefill_fails_is_sent_again_with_another_prefill() {
    let p0 = SimEngine::start_role(MODEL, Role::Prefill, true).await;
    let d0 = SimEngine::start_role(MODEL, Role::Decode, false).await;
    // Healthy to the health checker, but every completion answers 503.
    let failing = Backend::start("failing", &[MODEL]).await;
    failing.set(|b| b.fail_status = Some(503));
    let mut gone = backend("failing", &failing, "prefill");
    gone.bootstrap = Some(free_port());
    let mut pw = engine("p0", &p0, "prefill");
    pw.bootstrap = Some(p0.bootstrap_port());
    let r = router("sglang", &[gone, pw, engine("d0", &d0, "decode")], "").await;
    for i in 0..3 {
        let body = json!({"model": MODEL, "prompt": prompt(&format!("g{i}"), 20), "max_tokens": 2});
        let (status, decode, prefill, text) = send(&r, body, false).await;
        assert_eq!(status, 200, "{text}");
        assert_eq!((decode.as_str(), prefill.as_str()), ("d0", "p0"));
    }
    assert!(
        failing.count() >= 1,
        "the failing prefill worker was never tried"
    );
    assert!(
        metric(&r, "kvroute_disaggregated_retries_total{phase=\"prefill\"").await >= 1.0,
        "{}",
        metrics_text(r.addr).await
    );
}
