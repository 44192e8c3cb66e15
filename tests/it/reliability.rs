//! Issue 6 on real sockets: authentication and tenants, the admin API, admission limits,
//! circuit breaking, timeouts, the retry budget, and a dead worker's index entries.

use std::io::{Read, Write};
use std::time::{Duration, Instant};

use crate::support::*;
use futures_util::StreamExt;
use serde_json::json;
use sha2::{Digest, Sha256};

fn sha(key: &str) -> String {
    Sha256::digest(key.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn tenants_toml() -> String {
    format!(
        "[[tenants]]\nname = \"acme\"\napi_key_sha256 = \"{}\"\n[[tenants]]\nname = \"bob\"\napi_key_sha256 = \"{}\"\nmodels = [\"small\"]\n[admin]\napi_key_sha256 = \"{}\"\n",
        sha("key-acme"),
        sha("key-bob"),
        sha("key-admin")
    )
}

#[tokio::test]
async fn tenants_authenticate_and_get_their_own_cache_namespace() {
    let b = Backend::start("a", &["m", "small"]).await;
    let r = start_router(&router_config(
        PolicyKind::KvAware,
        &[(b.url(), vec!["m", "small"])],
        &tenants_toml(),
    ))
    .await;
    let c = client();
    let url = format!("http://{}/v1/completions", r.addr);
    let body = json!({"model": "m", "prompt": "hello", "cache_salt": "mine"});
    let e = assert_openai_error(c.post(&url).json(&body).send().await.unwrap(), 401).await;
    assert_eq!(e["code"], "invalid_api_key");
    assert_openai_error(
        c.post(&url)
            .bearer_auth("wrong")
            .json(&body)
            .send()
            .await
            .unwrap(),
        401,
    )
    .await;
    assert_openai_error(
        c.post(&url)
            .bearer_auth("key-admin")
            .json(&body)
            .send()
            .await
            .unwrap(),
        403,
    )
    .await;
    assert_openai_error(
        c.post(&url)
            .bearer_auth("key-bob")
            .json(&body)
            .send()
            .await
            .unwrap(),
        403,
    )
    .await;
    assert_eq!(b.count(), 0, "refused requests never reach a worker");

    for key in ["key-acme", "key-bob"] {
        let resp = c
            .post(&url)
            .bearer_auth(key)
            .json(&json!({"model": "small", "prompt": "hello", "cache_salt": "mine"}))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
    }
    let got = b.received();
    let salts: Vec<String> = got
        .iter()
        .map(|r| {
            let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
            v["cache_salt"].as_str().unwrap().to_string()
        })
        .collect();
    assert_ne!(salts[0], "mine", "a client salt is never passed on raw");
    assert_ne!(salts[0], salts[1], "tenants get different namespaces");
    for r in &got {
        assert!(
            r.headers.get("authorization").is_none(),
            "tenant keys stay at the router"
        );
    }

    // /debug/route is the admin's, and can explain a decision as a tenant would get it.
    let debug = format!("http://{}/debug/route", r.addr);
    assert_openai_error(
        c.post(&debug)
            .bearer_auth("key-acme")
            .json(&body)
            .send()
            .await
            .unwrap(),
        403,
    )
    .await;
    let v: serde_json::Value = c
        .post(&debug)
        .bearer_auth("key-admin")
        .header("x-kvroute-tenant", "acme")
        .json(&body)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(v["tenant"], "acme");
    assert_eq!(v["policy"], "kv_aware");
    r.shutdown().await;
}

#[tokio::test]
async fn admin_api_adds_drains_and_removes_workers() {
    let a = Backend::start("a", &["m"]).await;
    let b = Backend::start("b", &["m"]).await;
    let r = start_router_over(PolicyKind::RoundRobin, &[&a], &tenants_toml()).await;
    let c = client();
    let admin = format!("http://{}/admin/workers", r.addr);
    assert_openai_error(c.get(&admin).send().await.unwrap(), 401).await;
    assert_openai_error(
        c.get(&admin).bearer_auth("key-acme").send().await.unwrap(),
        403,
    )
    .await;

    let added = c
        .post(&admin)
        .bearer_auth("key-admin")
        .json(&json!({"id": "w-new", "url": b.url(), "models": ["m"]}))
        .send()
        .await
        .unwrap();
    assert_eq!(added.status(), 201);
    let dup = c
        .post(&admin)
        .bearer_auth("key-admin")
        .json(&json!({"id": "w-new", "url": b.url()}))
        .send()
        .await
        .unwrap();
    assert_openai_error(dup, 409).await;
    let zero = c
        .post(&admin)
        .bearer_auth("key-admin")
        .json(&json!({"id": "w-zero", "url": b.url(), "kv_blocks": 0}))
        .send()
        .await
        .unwrap();
    assert_openai_error(zero, 400).await;
    let list: serde_json::Value = c
        .get(&admin)
        .bearer_auth("key-admin")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let ids: Vec<&str> = list["workers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["w0", "w-new"]);

    let url = format!("http://{}/v1/completions", r.addr);
    let send = || {
        c.post(&url)
            .bearer_auth("key-acme")
            .json(&json!({"model": "m", "prompt": "x"}))
            .send()
    };
    for _ in 0..4 {
        send().await.unwrap().bytes().await.unwrap();
    }
    assert_eq!((a.count(), b.count()), (2, 2));

    // Drain w0: no new requests; a held stream on it keeps it busy.
    a.set(|x| x.hold_last_chunk = true);
    let held = c
        .post(&url)
        .bearer_auth("key-acme")
        .json(&json!({"model": "m", "prompt": "x", "stream": true}))
        .send()
        .await
        .unwrap();
    let on = held.headers()["x-kvroute-worker"]
        .to_str()
        .unwrap()
        .to_string();
    let busy = if on == "w0" { "w0" } else { "w-new" };
    let drained = c
        .post(format!("{admin}/{busy}/drain"))
        .bearer_auth("key-admin")
        .send()
        .await
        .unwrap();
    assert_eq!(drained.status(), 200);
    let before = (a.count(), b.count());
    for _ in 0..3 {
        let resp = send().await.unwrap();
        assert_ne!(resp.headers()["x-kvroute-worker"], busy);
    }
    assert_eq!(a.count() + b.count(), before.0 + before.1 + 3);
    let refused = c
        .delete(format!("{admin}/{busy}"))
        .bearer_auth("key-admin")
        .send()
        .await
        .unwrap();
    assert_openai_error(refused, 409).await;
    a.release();
    b.release();
    held.bytes().await.unwrap();
    assert!(
        eventually(|| r
            .state
            .fleet
            .get(busy)
            .unwrap()
            .rank(0)
            .load
            .snapshot()
            .in_flight
            == 0)
        .await
    );
    let removed = c
        .delete(format!("{admin}/{busy}"))
        .bearer_auth("key-admin")
        .send()
        .await
        .unwrap();
    assert_eq!(removed.status(), 200);
    assert!(r.state.fleet.get(busy).is_none());
    assert_openai_error(
        c.delete(format!("{admin}/nope"))
            .bearer_auth("key-admin")
            .send()
            .await
            .unwrap(),
        404,
    )
    .await;
    r.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_workers_reserved_index_room_goes_with_the_worker() {
    let b = Backend::start("a", &["m"]).await;
    let publisher = kvroute::kv_events::Publisher::bind(kvroute::kv_events::PublisherConfig::new(
        "tcp://127.0.0.1:*",
    ))
    .unwrap();
    let r = start_router(&router_config(
        PolicyKind::KvAware,
        &[(b.url(), vec!["m"])],
        &tenants_toml(),
    ))
    .await;
    let c = client();
    let admin = format!("http://{}/admin/workers", r.addr);
    let empty = r.state.holdings.exact.heap_bytes();
    let room = 100_000 * 12;
    // A replica of its own: the fleet refuses a URL listed twice.
    let other = Backend::start("kv", &["m"]).await;
    let added = c
        .post(&admin)
        .bearer_auth("key-admin")
        .json(&json!({"id": "w-kv", "url": other.url(), "models": ["m"],
            "kv_events": publisher.endpoint(), "kv_blocks": 100_000}))
        .send()
        .await
        .unwrap();
    assert_eq!(added.status(), 201);
    assert!(
        eventually(|| r.state.holdings.exact.heap_bytes() >= empty + room).await,
        "no room reserved: {} bytes",
        r.state.holdings.exact.heap_bytes()
    );
    let removed = c
        .delete(format!("{admin}/w-kv"))
        .bearer_auth("key-admin")
        .send()
        .await
        .unwrap();
    assert_eq!(removed.status(), 200);
    assert!(
        eventually(|| r.state.holdings.exact.heap_bytes() < empty + room).await,
        "the removed worker's room stayed: {} bytes",
        r.state.holdings.exact.heap_bytes()
    );
    r.shutdown().await;
}

#[tokio::test]
async fn over_capacity_requests_get_429_with_retry_after() {
    let b = Backend::start("a", &["m"]).await;
    b.set(|x| x.hold_last_chunk = true);
    let r = start_router_over(
        PolicyKind::RoundRobin,
        &[&b],
        "[limits]\nmax_concurrency = 1\nmax_queue = 0\n",
    )
    .await;
    let c = client();
    let url = format!("http://{}/v1/completions", r.addr);
    let first = c
        .post(&url)
        .json(&json!({"model": "m", "prompt": "x", "stream": true}))
        .send()
        .await
        .unwrap();
    assert_eq!(first.status(), 200);
    let second = c
        .post(&url)
        .json(&json!({"model": "m", "prompt": "x"}))
        .send()
        .await
        .unwrap();
    assert_eq!(second.headers()["retry-after"], "1");
    let e = assert_openai_error(second, 429).await;
    assert_eq!(e["type"], "rate_limit_error");
    b.release();
    first.bytes().await.unwrap();
    // The slot is free again once the stream ended.
    b.set(|x| x.hold_last_chunk = false);
    let third = c
        .post(&url)
        .json(&json!({"model": "m", "prompt": "x"}))
        .send()
        .await
        .unwrap();
    assert_eq!(third.status(), 200);
    let metrics = metrics_text(r.addr).await;
    assert!(
        metrics.contains(r#"kvroute_rejected_total{reason="queue_full"} 1"#),
        "{metrics}"
    );
    r.shutdown().await;
}

#[tokio::test]
async fn a_failing_worker_trips_its_breaker_and_is_probed_later() {
    let bad = Backend::start("bad", &["m"]).await;
    let good = Backend::start("good", &["m"]).await;
    bad.set(|x| x.fail_status = Some(503));
    let r = start_router_over(
        PolicyKind::RoundRobin,
        &[&bad, &good],
        "[proxy]\nbreaker_min_requests = 2\nbreaker_open_s = 2.0\nretry_budget_min_per_s = 100\n",
    )
    .await;
    let c = client();
    let url = format!("http://{}/v1/completions", r.addr);
    for _ in 0..8 {
        let resp = c
            .post(&url)
            .json(&json!({"model": "m", "prompt": "x"}))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200, "retried on the good worker");
    }
    assert_eq!(bad.count(), 2, "open after two failures, then skipped");
    let metrics = metrics_text(r.addr).await;
    assert!(
        metrics.contains(r#"kvroute_worker_circuit_state{worker="w0"} 1"#),
        "{metrics}"
    );
    // After the open period one probe goes through; it fails again, so the circuit reopens.
    tokio::time::sleep(Duration::from_millis(2100)).await;
    for _ in 0..4 {
        c.post(&url)
            .json(&json!({"model": "m", "prompt": "x"}))
            .send()
            .await
            .unwrap();
    }
    assert_eq!(bad.count(), 3, "exactly one probe");
    // The worker recovers: the next probe closes the circuit.
    bad.set(|x| x.fail_status = None);
    tokio::time::sleep(Duration::from_millis(2100)).await;
    for _ in 0..6 {
        c.post(&url)
            .json(&json!({"model": "m", "prompt": "x"}))
            .send()
            .await
            .unwrap();
    }
    assert!(bad.count() >= 6, "back in rotation: {}", bad.count());
    r.shutdown().await;
}

#[tokio::test]
async fn a_stalled_stream_ends_with_an_error_event() {
    let b = Backend::start("a", &["m"]).await;
    b.set(|x| x.hold_last_chunk = true);
    let r = start_router_over(
        PolicyKind::RoundRobin,
        &[&b],
        "[proxy]\nidle_timeout_s = 0.3\n",
    )
    .await;
    let started = Instant::now();
    let resp = client()
        .post(format!("http://{}/v1/completions", r.addr))
        .json(&json!({"model": "m", "prompt": "x", "stream": true}))
        .send()
        .await
        .unwrap();
    let mut text = String::new();
    let mut stream = resp.bytes_stream();
    while let Some(Ok(chunk)) = stream.next().await {
        text.push_str(std::str::from_utf8(&chunk).unwrap());
    }
    assert!(
        text.contains("tok0") && text.contains("upstream_stream_error"),
        "{text}"
    );
    assert!(text.contains("sent nothing"), "{text}");
    assert!(started.elapsed() < Duration::from_secs(10));
    let w = r.state.fleet.get("w0").unwrap();
    assert!(eventually(|| w.rank(0).load.snapshot().in_flight == 0).await);
    assert!(
        eventually(|| b
            .state
            .streams_cancelled
            .load(std::sync::atomic::Ordering::SeqCst)
            == 1)
        .await
    );
    r.shutdown().await;
}

#[tokio::test]
async fn a_slow_loris_body_gets_408() {
    let b = Backend::start("a", &["m"]).await;
    let r = start_router_over(
        PolicyKind::RoundRobin,
        &[&b],
        "[proxy]\nbody_read_timeout_s = 0.3\n",
    )
    .await;
    let addr = r.addr;
    let answer = tokio::task::spawn_blocking(move || {
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        s.write_all(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n{\"mo").unwrap();
        let mut buf = [0u8; 512];
        let n = s.read(&mut buf).unwrap_or(0);
        String::from_utf8_lossy(&buf[..n]).to_string()
    })
    .await
    .unwrap();
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("request_timeout"));
    assert_eq!(b.count(), 0);
    r.shutdown().await;
}

#[tokio::test]
async fn the_retry_budget_stops_retry_storms() {
    let x = Backend::start("x", &["m"]).await;
    let y = Backend::start("y", &["m"]).await;
    // 503: a failure of the worker, so retried (a 500 is the request's own answer, never
    // retried).
    x.set(|b| b.fail_status = Some(503));
    y.set(|b| b.fail_status = Some(503));
    let r = start_router_over(
        PolicyKind::RoundRobin,
        &[&x, &y],
        "[proxy]\nretry_budget_ratio = 0.2\nretry_budget_min_per_s = 0\nbreaker_min_requests = 100\n",
    )
    .await;
    let c = client();
    for _ in 0..10 {
        let resp = complete(&c, r.addr, &json!({"model": "m", "prompt": "x"})).await;
        assert_eq!(resp.status(), 503, "the worker's own error is passed on");
    }
    // 0.2 retries per request (one per five) and no floor: of ten requests the fifth and the
    // tenth are retried, the other eight are not.
    assert_eq!(x.count() + y.count(), 12);
    let metrics = metrics_text(r.addr).await;
    assert!(
        metrics.contains("kvroute_retries_denied_total 8"),
        "{metrics}"
    );
    r.shutdown().await;
}

#[tokio::test]
async fn a_dead_worker_loses_its_index_entries_and_comes_back_cold() {
    let b = Backend::start("a", &["m"]).await;
    let r = start_router_over(
        PolicyKind::KvAware,
        &[&b],
        "[health]\ninterval_s = 0.05\nunhealthy_threshold = 2\n",
    )
    .await;
    let c = client();
    let prompt: String = (0..200).map(|i| format!(" w{i}")).collect();
    complete(&c, r.addr, &json!({"model": "m", "prompt": prompt})).await;
    let w = r.state.fleet.get("w0").unwrap();
    let predicted = || r.state.holdings.approx.len(w.rank(0).key);
    assert!(
        predicted() >= 12,
        "routed blocks are predicted on a worker without events"
    );
    b.set(|x| x.health_status = 500);
    assert!(eventually(|| !w.is_healthy()).await);
    assert_eq!(predicted(), 0, "a dead worker's entries are dropped");
    b.set(|x| x.health_status = 200);
    assert!(eventually(|| w.is_healthy()).await);
    assert_eq!(predicted(), 0, "it comes back cold");
    r.shutdown().await;
}
