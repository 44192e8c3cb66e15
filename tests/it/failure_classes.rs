//! Which upstream failures count against a worker. A request whose own content makes the engine
//! answer 500 is that request's answer: relayed, not retried, not charged, so one tenant cannot
//! open every circuit of a model. Transport failures and 502/503/504 are the worker's: retried
//! and charged. And the last routable worker of a model never has its circuit opened.

use serde_json::json;
use sha2::{Digest, Sha256};

use crate::support::*;

fn sha(key: &str) -> String {
    Sha256::digest(key.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn tenants() -> String {
    format!(
        "[[tenants]]\nname = \"mallory\"\napi_key_sha256 = \"{}\"\n[[tenants]]\nname = \"alice\"\napi_key_sha256 = \"{}\"\n",
        sha("key-mallory"),
        sha("key-alice")
    )
}

async fn send(c: &reqwest::Client, addr: std::net::SocketAddr, key: &str, prompt: &str) -> u16 {
    let resp = c
        .post(format!("http://{addr}/v1/completions"))
        .bearer_auth(key)
        .json(&json!({"model": "m", "prompt": prompt}))
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    resp.bytes().await.unwrap();
    status
}

fn circuit(metrics: &str, worker: &str) -> Option<u32> {
    let key = format!("kvroute_worker_circuit_state{{worker=\"{worker}\"}} ");
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(&key))
        .and_then(|v| v.trim().parse().ok())
}

#[tokio::test]
async fn a_prompt_the_engine_answers_500_charges_no_worker() {
    let a = Backend::start("a", &["m"]).await;
    let b = Backend::start("b", &["m"]).await;
    for x in [&a, &b] {
        x.set(|x| x.fail_on = Some(("poison".into(), 500)));
    }
    let r = start_router_over(PolicyKind::RoundRobin, &[&a, &b], &tenants()).await;
    let c = client();
    for _ in 0..10 {
        let resp = c
            .post(format!("http://{}/v1/completions", r.addr))
            .bearer_auth("key-mallory")
            .json(&json!({"model": "m", "prompt": "poison"}))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 500);
        let v: serde_json::Value = resp.json().await.unwrap();
        assert!(
            v["error"]["message"].as_str().unwrap().ends_with("failed"),
            "the engine's own error body is relayed: {v}"
        );
    }
    assert_eq!(a.count() + b.count(), 10, "no 500 was retried");
    let metrics = metrics_text(r.addr).await;
    assert_eq!(circuit(&metrics, "w0"), Some(0), "{metrics}");
    assert_eq!(circuit(&metrics, "w1"), Some(0), "{metrics}");
    assert!(
        !metrics.contains("kvroute_upstream_errors_total{"),
        "{metrics}"
    );
    assert!(!metrics.contains("kvroute_retries_total{"), "{metrics}");
    // Everyone else is served by both workers as before.
    for _ in 0..10 {
        assert_eq!(send(&c, r.addr, "key-alice", "hello").await, 200);
    }
    assert_eq!((a.count(), b.count()), (10, 10));
    r.shutdown().await;
}

#[tokio::test]
async fn a_502_503_or_504_is_retried_and_opens_the_circuit() {
    for status in [502, 503, 504] {
        let bad = Backend::start("bad", &["m"]).await;
        let good = Backend::start("good", &["m"]).await;
        bad.set(|x| x.fail_status = Some(status));
        let r = start_router_over(
            PolicyKind::RoundRobin,
            &[&bad, &good],
            "[proxy]\nbreaker_min_requests = 2\nretry_budget_min_per_s = 100\n",
        )
        .await;
        let c = client();
        for _ in 0..8 {
            let resp = complete(&c, r.addr, &json!({"model": "m", "prompt": "x"})).await;
            assert_eq!(resp.status(), 200, "{status} retried on the good worker");
            resp.bytes().await.unwrap();
        }
        assert_eq!(
            bad.count(),
            2,
            "{status}: open after two failures, then skipped"
        );
        assert_eq!(good.count(), 8);
        let metrics = metrics_text(r.addr).await;
        assert_eq!(circuit(&metrics, "w0"), Some(1), "{status}: {metrics}");
        assert!(
            metrics.contains(r#"kvroute_retries_total{reason="status_5xx"} 2"#),
            "{metrics}"
        );
        r.shutdown().await;
    }
}

#[tokio::test]
async fn a_refused_connection_is_retried_and_opens_the_circuit() {
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dead_url = format!("http://{}", dead.local_addr().unwrap());
    drop(dead);
    let good = Backend::start("good", &["m"]).await;
    let r = start_router(&router_config(
        PolicyKind::RoundRobin,
        &[(dead_url, vec!["m"]), (good.url(), vec!["m"])],
        "[proxy]\nbreaker_min_requests = 1\n",
    ))
    .await;
    let c = client();
    for _ in 0..4 {
        let resp = complete(&c, r.addr, &json!({"model": "m", "prompt": "x"})).await;
        assert_eq!(resp.status(), 200);
        resp.bytes().await.unwrap();
    }
    assert_eq!(good.count(), 4);
    let metrics = metrics_text(r.addr).await;
    assert_eq!(circuit(&metrics, "w0"), Some(1), "{metrics}");
    assert!(
        metrics.contains(r#"kvroute_retries_total{reason="connect"} 1"#),
        "{metrics}"
    );
    r.shutdown().await;
}

#[tokio::test]
async fn the_last_routable_worker_of_a_model_keeps_serving() {
    let only = Backend::start("only", &["m"]).await;
    let drained = Backend::start("drained", &["m"]).await;
    only.set(|x| x.fail_status = Some(503));
    let r = start_router_over(
        PolicyKind::RoundRobin,
        &[&only, &drained],
        "[proxy]\nbreaker_min_requests = 2\n",
    )
    .await;
    r.state.fleet.get("w1").unwrap().set_draining(true);
    let c = client();
    for _ in 0..10 {
        let resp = complete(&c, r.addr, &json!({"model": "m", "prompt": "x"})).await;
        assert_eq!(resp.status(), 503);
        let v: serde_json::Value = resp.json().await.unwrap();
        assert_eq!(
            v["error"]["message"], "only failed",
            "the worker's own answer: {v}"
        );
    }
    assert_eq!(only.count(), 10, "every request reached the last worker");
    let metrics = metrics_text(r.addr).await;
    assert_eq!(circuit(&metrics, "w0"), Some(0), "{metrics}");
    // It recovers: served at once, with no open period to wait out.
    only.set(|x| x.fail_status = None);
    let resp = complete(&c, r.addr, &json!({"model": "m", "prompt": "x"})).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(drained.count(), 0);
    r.shutdown().await;
}
