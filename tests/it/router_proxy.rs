//! The router's request path end to end on 127.0.0.1: forwarding, streaming, policies,
//! eligibility, errors, cancellation, retries and metrics.

use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::support::*;
use futures_util::StreamExt;

#[tokio::test]
async fn body_is_forwarded_byte_for_byte_and_worker_is_named() {
    let b = Backend::start("a", &["m"]).await;
    let r = start_router_over(PolicyKind::RoundRobin, &[&b], "").await;
    // Odd spacing, key order, unicode escapes and unknown fields must all survive.
    let body = "{ \"prompt\":\"h\\u00e9llo\",  \"model\" : \"m\", \"x_unknown\": {\"deep\":[1,2.50]}, \"max_tokens\":3 }";
    let resp = client()
        .post(format!("http://{}/v1/completions", r.addr))
        .header("content-type", "application/json")
        .header("x-request-id", "abc")
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["x-kvroute-worker"], "w0");
    let got = b.received();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].body, body.as_bytes());
    assert_eq!(got[0].path, "/v1/completions");
    assert_eq!(got[0].headers["x-request-id"], "abc");
    assert_eq!(got[0].headers["host"], b.addr.to_string());
    r.shutdown().await;
}

#[tokio::test]
async fn sse_arrives_chunk_by_chunk() {
    let b = Backend::start("a", &["m"]).await;
    b.set(|x| {
        x.chunks = 3;
        x.hold_last_chunk = true;
    });
    let r = start_router_over(PolicyKind::RoundRobin, &[&b], "").await;
    let resp = client()
        .post(format!("http://{}/v1/chat/completions", r.addr))
        .json(&serde_json::json!({"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["x-kvroute-worker"], "w0");
    let mut stream = resp.bytes_stream();
    let mut seen = String::new();
    // The backend holds its last chunk until released: everything before it must arrive first.
    while !seen.contains("tok1") {
        let chunk = tokio::time::timeout(Duration::from_secs(5), stream.next())
            .await
            .expect("earlier chunks arrive while the backend holds the last one")
            .unwrap()
            .unwrap();
        seen.push_str(std::str::from_utf8(&chunk).unwrap());
    }
    assert!(!seen.contains("tok2"));
    b.release();
    while let Some(c) = stream.next().await {
        seen.push_str(std::str::from_utf8(&c.unwrap()).unwrap());
    }
    assert!(
        seen.contains("tok2") && seen.ends_with("data: [DONE]\n\n"),
        "{seen}"
    );
    r.shutdown().await;
}

async fn distribution(policy: PolicyKind, n: usize, requests: usize) -> Vec<usize> {
    let backends: Vec<Backend> = futures_util::future::join_all(
        (0..n).map(|i| async move { Backend::start(&format!("b{i}"), &["m"]).await }),
    )
    .await;
    let workers: Vec<_> = backends.iter().map(|b| (b.url(), vec!["m"])).collect();
    let r = start_router(&router_config(policy, &workers, "seed = 42")).await;
    let c = client();
    for _ in 0..requests {
        let resp = complete(&c, r.addr, &serde_json::json!({"model":"m","prompt":"x"})).await;
        assert_eq!(resp.status(), 200);
        resp.bytes().await.unwrap();
    }
    r.shutdown().await;
    backends.iter().map(Backend::count).collect()
}

#[tokio::test]
async fn round_robin_spreads_evenly() {
    assert_eq!(
        distribution(PolicyKind::RoundRobin, 3, 30).await,
        [10, 10, 10]
    );
}

#[tokio::test]
async fn random_and_power_of_two_reach_every_worker() {
    for policy in [PolicyKind::Random, PolicyKind::PowerOfTwo] {
        let d = distribution(policy, 3, 60).await;
        assert_eq!(d.iter().sum::<usize>(), 60);
        assert!(d.iter().all(|&n| n >= 5), "{policy}: {d:?}");
    }
}

#[tokio::test]
async fn least_request_avoids_the_busy_worker() {
    let busy = Backend::start("busy", &["m"]).await;
    let idle = Backend::start("idle", &["m"]).await;
    busy.set(|x| x.hold_last_chunk = true);
    idle.set(|x| x.hold_last_chunk = true);
    let r = start_router_over(PolicyKind::LeastRequest, &[&busy, &idle], "").await;
    let c = client();
    let url = format!("http://{}/v1/completions", r.addr);
    // Two held streams occupy both workers once; then a third goes to one of them.
    let s1 = c
        .post(&url)
        .json(&serde_json::json!({"model":"m","prompt":"x","stream":true}))
        .send()
        .await
        .unwrap();
    let first = s1.headers()["x-kvroute-worker"]
        .to_str()
        .unwrap()
        .to_string();
    idle.set(|x| x.hold_last_chunk = false);
    busy.set(|x| x.hold_last_chunk = false);
    // With one stream open on `first`, every short request goes to the other worker.
    for _ in 0..6 {
        let resp = c
            .post(&url)
            .json(&serde_json::json!({"model":"m","prompt":"x"}))
            .send()
            .await
            .unwrap();
        assert_ne!(resp.headers()["x-kvroute-worker"].to_str().unwrap(), first);
        resp.bytes().await.unwrap();
    }
    busy.release();
    idle.release();
    s1.bytes().await.unwrap();
    r.shutdown().await;
}

#[tokio::test]
async fn requests_go_only_to_workers_serving_the_model() {
    let a = Backend::start("a", &["m1"]).await;
    let b = Backend::start("b", &["m1", "m2"]).await;
    // The third worker's models are discovered from its /v1/models.
    let c3 = Backend::start("c", &["m3"]).await;
    let mut cfg = router_config(
        PolicyKind::RoundRobin,
        &[(a.url(), vec!["m1"]), (b.url(), vec!["m1", "m2"])],
        "",
    );
    cfg.workers
        .push(kvroute::config::parse_worker_flag(&c3.url()).unwrap());
    let r = start_router(&cfg).await;
    let c = client();
    let url = format!("http://{}/v1/completions", r.addr);
    for _ in 0..4 {
        let resp = c
            .post(&url)
            .json(&serde_json::json!({"model":"m2","prompt":"x"}))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.headers()["x-kvroute-worker"], "w1");
    }
    assert!(
        eventually(|| r.state.fleet.knows_model("m3")).await,
        "m3 discovered"
    );
    let resp = c
        .post(&url)
        .json(&serde_json::json!({"model":"m3","prompt":"x"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["x-kvroute-worker"], c3.addr.to_string());
    let models: serde_json::Value = c
        .get(format!("http://{}/v1/models", r.addr))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let ids: Vec<&str> = models["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["m1", "m2", "m3"]);
    assert_eq!(a.count(), 0);
    let e = assert_openai_error(
        c.post(&url)
            .json(&serde_json::json!({"model":"gpt-9","prompt":"x"}))
            .send()
            .await
            .unwrap(),
        404,
    )
    .await;
    assert_eq!(e["code"], "model_not_found");
    r.shutdown().await;
}

#[tokio::test]
async fn bad_requests_get_openai_errors() {
    let b = Backend::start("a", &["m"]).await;
    let r = start_router_over(PolicyKind::RoundRobin, &[&b], "max_body_bytes = 4096").await;
    let c = client();
    let base = format!("http://{}", r.addr);
    let post = |path: &str, body: String| {
        c.post(format!("{base}{path}"))
            .header("content-type", "application/json")
            .body(body)
            .send()
    };
    let cases: Vec<(&str, String, u16, Option<&str>)> = vec![
        ("/v1/completions", "{not json".into(), 400, None),
        ("/v1/completions", "\u{0}\u{0}".into(), 400, None),
        (
            "/v1/completions",
            r#"{"prompt":"x"}"#.into(),
            400,
            Some("model"),
        ),
        (
            "/v1/completions",
            r#"{"model":"m"}"#.into(),
            400,
            Some("prompt"),
        ),
        (
            "/v1/completions",
            r#"{"model":"m","prompt":{"a":1}}"#.into(),
            400,
            Some("prompt"),
        ),
        (
            "/v1/chat/completions",
            r#"{"model":"m"}"#.into(),
            400,
            Some("messages"),
        ),
        (
            "/v1/chat/completions",
            r#"{"model":"m","messages":[{"content":"x"}]}"#.into(),
            400,
            Some("messages"),
        ),
        (
            "/v1/completions",
            format!(r#"{{"model":"m","prompt":"{}"}}"#, "x".repeat(5000)),
            413,
            None,
        ),
    ];
    for (path, body, status, param) in cases {
        let e = assert_openai_error(post(path, body.clone()).await.unwrap(), status).await;
        if let Some(p) = param {
            assert_eq!(e["param"], p, "{body}");
        }
    }
    assert_openai_error(
        c.get(format!("{base}/v1/completions"))
            .send()
            .await
            .unwrap(),
        405,
    )
    .await;
    assert_openai_error(
        c.get(format!("{base}/v2/nothing")).send().await.unwrap(),
        404,
    )
    .await;
    assert_eq!(b.count(), 0, "no bad request reaches a worker");
    r.shutdown().await;
}

#[tokio::test]
async fn no_eligible_or_reachable_worker() {
    let b = Backend::start("a", &["m"]).await;
    b.set(|x| x.health_status = 503);
    let r = start_router_over(PolicyKind::RoundRobin, &[&b], "[health]\ninterval_s = 0.05").await;
    let c = client();
    let url = format!("http://{}/v1/completions", r.addr);
    let w0 = r.state.fleet.get("w0").unwrap();
    assert!(
        eventually(|| !w0.is_healthy()).await,
        "failing health check marks it down"
    );
    let e = assert_openai_error(
        c.post(&url)
            .json(&serde_json::json!({"model":"m","prompt":"x"}))
            .send()
            .await
            .unwrap(),
        503,
    )
    .await;
    assert_eq!(e["code"], "no_worker_available");
    assert_eq!(
        c.get(format!("http://{}/ready", r.addr))
            .send()
            .await
            .unwrap()
            .status(),
        503
    );
    r.shutdown().await;

    // A worker that refuses connections: 502 after the retry finds nobody else.
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dead_url = format!("http://{}", dead.local_addr().unwrap());
    drop(dead);
    let r = start_router(&router_config(
        PolicyKind::RoundRobin,
        &[(dead_url, vec!["m"])],
        "[health]\ninterval_s = 3600",
    ))
    .await;
    let resp = complete(&c, r.addr, &serde_json::json!({"model":"m","prompt":"x"})).await;
    // Either the first health check or the failed connect marks it unhealthy: 502 or 503.
    let status = resp.status().as_u16();
    assert!(status == 502 || status == 503, "{status}");
    assert_openai_error(resp, status).await;
    r.shutdown().await;
}

#[tokio::test]
async fn client_disconnect_cancels_upstream_and_releases_load() {
    let b = Backend::start("a", &["m"]).await;
    b.set(|x| x.hold_last_chunk = true);
    let r = start_router_over(PolicyKind::RoundRobin, &[&b], "").await;
    let resp = client()
        .post(format!("http://{}/v1/completions", r.addr))
        .json(&serde_json::json!({"model":"m","prompt":"x","stream":true}))
        .send()
        .await
        .unwrap();
    let mut stream = resp.bytes_stream();
    let first = stream.next().await.unwrap().unwrap();
    assert!(std::str::from_utf8(&first).unwrap().contains("tok0"));
    let w = r.state.fleet.get("w0").unwrap();
    assert_eq!(w.rank(0).load.snapshot().in_flight, 1);
    drop(stream);
    assert!(
        eventually(|| b.state.streams_cancelled.load(Ordering::SeqCst) == 1).await,
        "upstream stream cancelled"
    );
    assert!(
        eventually(|| w.rank(0).load.snapshot().in_flight == 0).await,
        "in-flight released"
    );
    assert_eq!(w.rank(0).load.snapshot().queued_prefill_tokens, 0);
    assert_eq!(b.state.streams_completed.load(Ordering::SeqCst), 0);
    let metrics = metrics_text(r.addr).await;
    assert!(
        metrics.contains(r#"kvroute_requests_total{endpoint="completions",model="m",status="cancelled",worker="w0"} 1"#),
        "{metrics}"
    );
    r.shutdown().await;
}

#[tokio::test]
async fn a_5xx_before_the_first_byte_is_retried_on_another_worker() {
    let bad = Backend::start("bad", &["m"]).await;
    let good = Backend::start("good", &["m"]).await;
    // 502, 503, 504 are the worker's failures (a 500 is the request's own answer: see
    // failure_classes).
    bad.set(|x| x.fail_status = Some(502));
    let r = start_router_over(PolicyKind::RoundRobin, &[&bad, &good], "").await;
    let c = client();
    for _ in 0..4 {
        let resp = complete(&c, r.addr, &serde_json::json!({"model":"m","prompt":"x"})).await;
        assert_eq!(resp.status(), 200);
        assert_eq!(resp.headers()["x-kvroute-worker"], "w1");
        resp.bytes().await.unwrap();
    }
    // Every request `bad` saw was retried once on `good`, and `good` served them all.
    let failed = bad.count();
    assert!(failed >= 1);
    assert_eq!(good.count(), 4);
    let metrics = metrics_text(r.addr).await;
    assert!(
        metrics.contains(&format!(
            r#"kvroute_retries_total{{reason="status_5xx"}} {failed}"#
        )),
        "{metrics}"
    );
    assert!(metrics.contains(&format!(
        r#"kvroute_upstream_errors_total{{kind="status_5xx",worker="w0"}} {failed}"#
    )));
    r.shutdown().await;
}

#[tokio::test]
async fn connect_failure_is_retried_on_another_worker() {
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dead_url = format!("http://{}", dead.local_addr().unwrap());
    drop(dead);
    let good = Backend::start("good", &["m"]).await;
    let r = start_router(&router_config(
        PolicyKind::RoundRobin,
        &[(dead_url, vec!["m"]), (good.url(), vec!["m"])],
        "[health]\ninterval_s = 3600",
    ))
    .await;
    // Let the first health round settle, then force the dead worker back in rotation.
    tokio::time::sleep(Duration::from_millis(200)).await;
    r.state.fleet.get("w0").unwrap().set_healthy(true);
    let c = client();
    for _ in 0..2 {
        let resp = complete(&c, r.addr, &serde_json::json!({"model":"m","prompt":"x"})).await;
        assert_eq!(resp.status(), 200);
        assert_eq!(resp.headers()["x-kvroute-worker"], "w1");
    }
    assert_eq!(good.count(), 2);
    r.shutdown().await;
}

#[tokio::test]
async fn a_stream_that_started_is_never_replayed() {
    let flaky = Backend::start("flaky", &["m"]).await;
    let other = Backend::start("other", &["m"]).await;
    flaky.set(|x| x.break_mid_stream = true);
    let r = start_router_over(PolicyKind::RoundRobin, &[&flaky, &other], "").await;
    let resp = client()
        .post(format!("http://{}/v1/completions", r.addr))
        .json(&serde_json::json!({"model":"m","prompt":"x","stream":true}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.headers()["x-kvroute-worker"], "w0");
    let mut text = String::new();
    let mut stream = resp.bytes_stream();
    while let Some(Ok(c)) = stream.next().await {
        text.push_str(std::str::from_utf8(&c).unwrap());
    }
    assert!(text.contains("tok0"), "{text}");
    assert!(
        text.contains("upstream_stream_error"),
        "the client is told the stream broke: {text}"
    );
    assert!(!text.contains("[DONE]"));
    assert_eq!(flaky.count(), 1);
    assert_eq!(other.count(), 0, "no replay after bytes were sent");
    let w = r.state.fleet.get("w0").unwrap();
    assert!(eventually(|| w.rank(0).load.snapshot().in_flight == 0).await);
    r.shutdown().await;
}

#[tokio::test]
async fn metrics_move_with_traffic() {
    let b = Backend::start("a", &["m"]).await;
    let r = start_router_over(PolicyKind::LeastRequest, &[&b], "").await;
    let c = client();
    for stream in [false, true, true] {
        let resp = c.post(format!("http://{}/v1/chat/completions", r.addr))
            .json(&serde_json::json!({"model":"m","messages":[{"role":"user","content":"x"}],"stream":stream}))
            .send().await.unwrap();
        resp.bytes().await.unwrap();
    }
    let text = metrics_text(r.addr).await;
    assert!(
        text.contains(r#"kvroute_requests_total{endpoint="chat_completions",model="m",status="200",worker="w0"} 3"#),
        "{text}"
    );
    assert!(
        text.contains(r#"kvroute_time_to_first_token_seconds_count{model="m",worker="w0"} 3"#),
        "{text}"
    );
    assert!(text.contains(
        r#"kvroute_request_duration_seconds_count{endpoint="chat_completions",model="m"} 3"#
    ));
    assert!(text.contains(
        r#"kvroute_routing_decision_seconds_count{policy="least_request",stage="total"} 3"#
    ));
    assert!(text.contains(r#"kvroute_worker_in_flight{worker="w0"} 0"#));
    assert!(text.contains(r#"kvroute_worker_healthy{worker="w0"} 1"#));
    assert_eq!(
        c.get(format!("http://{}/health", r.addr))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    assert_eq!(
        c.get(format!("http://{}/ready", r.addr))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    r.shutdown().await;
}

/// The cost model's TTFT prediction is checked against every observed first token, per worker;
/// a load-only policy predicts nothing and records nothing.
#[tokio::test]
async fn the_ttft_prediction_error_is_measured_per_worker() {
    for (policy, expected) in [(PolicyKind::KvAware, 3), (PolicyKind::RoundRobin, 0)] {
        let b = Backend::start("a", &["m"]).await;
        let r = start_router_over(policy, &[&b], "").await;
        let c = client();
        for _ in 0..3 {
            let resp = complete(
                &c,
                r.addr,
                &serde_json::json!({"model":"m","prompt":"x y z"}),
            )
            .await;
            assert_eq!(resp.status(), 200);
            resp.bytes().await.unwrap();
        }
        let text = metrics_text(r.addr).await;
        let counted: u64 = text
            .lines()
            .filter(|l| {
                l.starts_with("kvroute_ttft_prediction_error_seconds_count{")
                    && l.contains(r#"model="m""#)
                    && l.contains(r#"worker="w0""#)
            })
            .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
            .sum();
        assert_eq!(counted, expected, "{policy:?}:\n{text}");
        r.shutdown().await;
    }
}
