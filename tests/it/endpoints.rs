//! The endpoints beyond completions and chat (issue 18, part 1), against the simulated engine
//! and recording backends: embeddings, rerank, score and transcriptions routed to their
//! model's engines on load; `/tokenize` and `/detokenize` answered by the router itself exactly
//! as the engine answers (else forwarded); other paths forwarded by the allow-list; tenants,
//! eligibility, errors and metrics as for chat. The Responses API is in `responses_api.rs`.

use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::support::*;

fn hex_sha(key: &str) -> String {
    Sha256::digest(key.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn worker_of(resp: &reqwest::Response) -> Option<String> {
    resp.headers()
        .get("x-kvroute-worker")
        .map(|v| v.to_str().unwrap().to_owned())
}

/// A `multipart/form-data` body with a `file` and the given text fields.
fn form(boundary: &str, file: &[u8], fields: &[(&str, &str)]) -> Vec<u8> {
    let mut b = Vec::new();
    b.extend_from_slice(
        format!(
            "--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.wav\"\r\n\
             Content-Type: audio/wav\r\n\r\n"
        )
        .as_bytes(),
    );
    b.extend_from_slice(file);
    for (k, v) in fields {
        b.extend_from_slice(
            format!("\r\n--{boundary}\r\nContent-Disposition: form-data; name=\"{k}\"\r\n\r\n{v}")
                .as_bytes(),
        );
    }
    b.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
    b
}

async fn post(addr: std::net::SocketAddr, path: &str, body: Value) -> reqwest::Response {
    client()
        .post(format!("http://{addr}{path}"))
        .json(&body)
        .send()
        .await
        .unwrap()
}

#[tokio::test]
async fn pooling_and_audio_requests_reach_their_models_engines() {
    let chat = SimEngine::start_plain("m", "builtin").await;
    let embed = SimEngine::start_plain("e5", "builtin").await;
    let whisper = SimEngine::start_plain("whisper", "builtin").await;
    let workers = [
        (chat.url(), vec!["m"]),
        (embed.url(), vec!["e5"]),
        (whisper.url(), vec!["whisper"]),
    ];
    let r = start_router(&router_config(PolicyKind::KvAware, &workers, "")).await;

    let resp = post(
        r.addr,
        "/v1/embeddings",
        json!({"model": "e5", "input": ["hello world", "bye"]}),
    )
    .await;
    assert_eq!(resp.status(), 200);
    assert_eq!(worker_of(&resp).as_deref(), Some("w1"));
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["object"], "list");
    assert_eq!(v["model"], "e5");
    assert_eq!(v["data"].as_array().unwrap().len(), 2);
    assert_eq!(v["data"][0]["object"], "embedding");
    assert_eq!(v["data"][0]["embedding"].as_array().unwrap().len(), 16);
    assert_eq!(v["usage"]["prompt_tokens"], 3, "{v}");
    let again: Value = post(
        r.addr,
        "/v1/embeddings",
        json!({"model": "e5", "input": "hello world"}),
    )
    .await
    .json()
    .await
    .unwrap();
    assert_eq!(
        again["data"][0]["embedding"], v["data"][0]["embedding"],
        "deterministic"
    );

    for path in ["/v1/rerank", "/rerank", "/v2/rerank"] {
        let body = json!({"model": "e5", "query": "the red fox", "top_n": 2,
                          "documents": ["a blue whale", "the red fox runs", "the red"]});
        let resp = post(r.addr, path, body).await;
        assert_eq!(resp.status(), 200, "{path}");
        assert_eq!(worker_of(&resp).as_deref(), Some("w1"));
        let v: Value = resp.json().await.unwrap();
        let results = v["results"].as_array().unwrap();
        assert_eq!(results.len(), 2, "{v}");
        assert_eq!(results[0]["index"], 2, "`the red` is all in the query: {v}");
        assert_eq!(results[0]["document"]["text"], "the red");
        assert!(results[0]["relevance_score"].as_f64() >= results[1]["relevance_score"].as_f64());
    }
    for path in ["/v1/score", "/score"] {
        let body = json!({"model": "e5", "text_1": "the red fox", "text_2": ["the red", "blue"]});
        let resp = post(r.addr, path, body).await;
        assert_eq!(resp.status(), 200, "{path}");
        let v: Value = resp.json().await.unwrap();
        assert_eq!(v["data"][0]["score"], 1.0, "{v}");
        assert_eq!(v["data"][1]["score"], 0.0, "{v}");
        assert_eq!(v["data"][1]["object"], "score");
    }

    let boundary = "kvrouteBoundary42";
    let body = form(
        boundary,
        &[0u8, 159, 146, 150, 13, 10, 45, 45].repeat(512),
        &[("model", "whisper")],
    );
    let resp = client()
        .post(format!("http://{}/v1/audio/transcriptions", r.addr))
        .header(
            "content-type",
            format!("multipart/form-data; boundary={boundary}"),
        )
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(worker_of(&resp).as_deref(), Some("w2"));
    let v: Value = resp.json().await.unwrap();
    assert!(v["text"].as_str().is_some_and(|t| !t.is_empty()), "{v}");
    assert_eq!(v["usage"]["type"], "duration");

    // Errors as for chat: an unknown model, a model left out of a several-model fleet, a
    // malformed body, a transcription that is not a form.
    let e = assert_openai_error(
        post(
            r.addr,
            "/v1/embeddings",
            json!({"model": "nope", "input": "x"}),
        )
        .await,
        404,
    )
    .await;
    assert_eq!(e["code"], "model_not_found");
    let e = assert_openai_error(
        post(r.addr, "/v1/score", json!({"text_1": "a", "text_2": "b"})).await,
        400,
    )
    .await;
    assert_eq!(e["param"], "model");
    let resp = client()
        .post(format!("http://{}/v1/rerank", r.addr))
        .body("{\"model\": ")
        .send()
        .await
        .unwrap();
    assert_openai_error(resp, 400).await;
    let resp = client()
        .post(format!("http://{}/v1/audio/transcriptions", r.addr))
        .json(&json!({"model": "whisper"}))
        .send()
        .await
        .unwrap();
    assert_openai_error(resp, 400).await;

    let text = metrics_text(r.addr).await;
    for series in [
        r#"kvroute_requests_total{endpoint="embeddings",model="e5",status="200",worker="w1"} 2"#,
        r#"kvroute_requests_total{endpoint="rerank",model="e5",status="200",worker="w1"} 3"#,
        r#"kvroute_requests_total{endpoint="score",model="e5",status="200",worker="w1"} 2"#,
        r#"kvroute_requests_total{endpoint="transcriptions",model="whisper",status="200",worker="w2"} 1"#,
        r#"kvroute_requests_total{endpoint="embeddings",model="-",status="404",worker="-"} 1"#,
        r#"kvroute_request_duration_seconds_count{endpoint="embeddings",model="e5"} 2"#,
    ] {
        assert!(text.contains(series), "{series} missing:\n{text}");
    }
    // Pooling requests record no time to first token (it would be their whole latency).
    assert!(!text.contains(r#"kvroute_time_to_first_token_seconds_count{model="e5""#));
    r.shutdown().await;
}

/// The only model of a fleet is what a request that names none is for (an engine assumes its
/// own); pooling requests are routed on load among that model's workers.
#[tokio::test]
async fn a_request_without_a_model_goes_to_the_fleets_only_model_on_load() {
    let a = Backend::start("a", &["e5"]).await;
    let b = Backend::start("b", &["e5"]).await;
    let workers = [(a.url(), vec!["e5"]), (b.url(), vec!["e5"])];
    let r = start_router(&router_config(PolicyKind::RoundRobin, &workers, "")).await;
    for _ in 0..4 {
        let resp = post(r.addr, "/v1/embeddings", json!({"input": "x"})).await;
        assert_eq!(resp.status(), 200);
    }
    assert_eq!((a.count(), b.count()), (2, 2));
    assert_eq!(a.received()[0].path, "/v1/embeddings");
    r.shutdown().await;
}

#[tokio::test]
async fn tenants_keys_models_and_salts_apply_to_pooling_and_audio() {
    let b = Backend::start("a", &["e5", "whisper", "m"]).await;
    let extra = format!(
        "[[tenants]]\nname = \"acme\"\napi_key_sha256 = \"{}\"\nmodels = [\"e5\", \"whisper\"]\n",
        hex_sha("key-acme")
    );
    let workers = [(b.url(), vec!["e5", "whisper", "m"])];
    let r = start_router(&router_config(PolicyKind::KvAware, &workers, &extra)).await;
    let url = format!("http://{}/v1/embeddings", r.addr);
    let c = client();
    let e = assert_openai_error(
        c.post(&url)
            .json(&json!({"model": "e5", "input": "x"}))
            .send()
            .await
            .unwrap(),
        401,
    )
    .await;
    assert_eq!(e["code"], "invalid_api_key");
    let forbidden = c
        .post(&url)
        .bearer_auth("key-acme")
        .json(&json!({"model": "m", "input": "x"}))
        .send()
        .await
        .unwrap();
    assert_openai_error(forbidden, 403).await;
    let ok = c
        .post(&url)
        .bearer_auth("key-acme")
        .json(&json!({"model": "e5", "input": "x", "cache_salt": "mine"}))
        .send()
        .await
        .unwrap();
    assert_eq!(ok.status(), 200);
    let got = b.received();
    assert_eq!(got.len(), 1, "refused requests never reach a worker");
    let sent: Value = serde_json::from_slice(&got[0].body).unwrap();
    let salt = sent["cache_salt"].as_str().unwrap();
    assert!(
        salt != "mine" && salt.len() == 32,
        "the tenant's namespaced salt: {sent}"
    );
    assert!(
        got[0].headers.get("authorization").is_none(),
        "the key is not forwarded"
    );

    // A form is forwarded byte for byte (no salt written into it).
    let boundary = "b0undary";
    let body = form(
        boundary,
        b"RIFF....WAVE",
        &[("model", "whisper"), ("language", "en")],
    );
    let resp = c
        .post(format!("http://{}/v1/audio/transcriptions", r.addr))
        .bearer_auth("key-acme")
        .header(
            "content-type",
            format!("multipart/form-data; boundary={boundary}"),
        )
        .body(body.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let got = b.received();
    assert_eq!(got[1].path, "/v1/audio/transcriptions");
    assert_eq!(got[1].body, body);
    r.shutdown().await;
}

/// Retries and the circuit apply as for chat: a worker that answers 503 is retried on another.
#[tokio::test]
async fn a_failing_worker_is_retried_for_pooling_requests() {
    let bad = Backend::start("bad", &["e5"]).await;
    let good = Backend::start("good", &["e5"]).await;
    bad.set(|x| x.fail_status = Some(503));
    let workers = [(bad.url(), vec!["e5"]), (good.url(), vec!["e5"])];
    let r = start_router(&router_config(PolicyKind::RoundRobin, &workers, "")).await;
    for _ in 0..2 {
        let resp = post(
            r.addr,
            "/v1/rerank",
            json!({"model": "e5", "query": "q", "documents": ["d"]}),
        )
        .await;
        assert_eq!(resp.status(), 200);
        assert_eq!(worker_of(&resp).as_deref(), Some("w1"));
    }
    assert!(
        metrics_text(r.addr)
            .await
            .contains("kvroute_retries_total{reason=\"status_5xx\"}")
    );
    r.shutdown().await;
}

#[tokio::test]
async fn the_allow_list_forwards_other_paths_as_they_came() {
    let a = Backend::start("a", &["m"]).await;
    let b = Backend::start("b", &["other"]).await;
    let workers = [(a.url(), vec!["m"]), (b.url(), vec!["other"])];
    // The defaults: the engines' inference paths.
    let r = start_router(&router_config(PolicyKind::KvAware, &workers, "")).await;
    let resp = post(
        r.addr,
        "/v1/messages",
        json!({"model": "other", "max_tokens": 3, "messages": []}),
    )
    .await;
    assert_eq!(resp.status(), 200);
    assert_eq!(
        worker_of(&resp).as_deref(),
        Some("w1"),
        "the model named picks the workers"
    );
    let v: Value = resp.json().await.unwrap();
    assert_eq!(
        (v["backend"].as_str(), v["path"].as_str()),
        (Some("b"), Some("/v1/messages"))
    );
    let resp = client()
        .get(format!("http://{}/pooling?x=1&y=%20", r.addr))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(
        (v["method"].as_str(), v["query"].as_str()),
        (Some("GET"), Some("x=1&y=%20"))
    );
    let got: Vec<_> = a
        .received()
        .into_iter()
        .chain(b.received())
        .filter(|x| x.path == "/pooling")
        .collect();
    assert_eq!(
        (got[0].method.as_str(), got[0].query.as_deref()),
        ("GET", Some("x=1&y=%20"))
    );
    for path in ["/v1/not_forwarded", "/v1/load_lora_adapter", "/nowhere"] {
        let e = assert_openai_error(post(r.addr, path, json!({})).await, 404).await;
        assert_eq!(e["code"], "not_found", "{path}");
    }
    let e = assert_openai_error(
        post(r.addr, "/v1/messages", json!({"model": "nope"})).await,
        404,
    )
    .await;
    assert_eq!(e["code"], "model_not_found");
    let text = metrics_text(r.addr).await;
    assert!(
        text.contains(r#"kvroute_requests_total{endpoint="forwarded",model="other",status="200",worker="w1"} 1"#),
        "{text}"
    );
    r.shutdown().await;

    // A configured wildcard: anything under /v1/ — but the adapter endpoints only when listed.
    let extra = "[endpoints]\nforward_paths = [\"/v1/*\"]\n";
    let r = start_router(&router_config(PolicyKind::KvAware, &workers, extra)).await;
    let resp = client()
        .delete(format!("http://{}/v1/brand/new/endpoint", r.addr))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(
        (v["method"].as_str(), v["path"].as_str()),
        (Some("DELETE"), Some("/v1/brand/new/endpoint"))
    );
    let e = assert_openai_error(
        post(r.addr, "/v1/unload_lora_adapter", json!({})).await,
        404,
    )
    .await;
    assert_eq!(e["code"], "not_found");
    r.shutdown().await;
}

#[tokio::test]
async fn forwarded_paths_need_a_tenant_key() {
    let b = Backend::start("a", &["m"]).await;
    let extra = format!(
        "[[tenants]]\nname = \"acme\"\napi_key_sha256 = \"{}\"\nmodels = [\"m\"]\n",
        hex_sha("key-acme")
    );
    let r = start_router(&router_config(
        PolicyKind::KvAware,
        &[(b.url(), vec!["m"])],
        &extra,
    ))
    .await;
    let url = format!("http://{}/v1/classify", r.addr);
    assert_openai_error(
        client()
            .post(&url)
            .json(&json!({"model": "m"}))
            .send()
            .await
            .unwrap(),
        401,
    )
    .await;
    let ok = client()
        .post(&url)
        .bearer_auth("key-acme")
        .json(&json!({"model": "m", "input": "x"}))
        .send()
        .await
        .unwrap();
    assert_eq!(ok.status(), 200);
    let got = b.received();
    assert_eq!(got.len(), 1);
    assert_eq!(
        got[0].body,
        serde_json::to_vec(&json!({"model": "m", "input": "x"})).unwrap(),
        "forwarded unchanged"
    );
    r.shutdown().await;
}
