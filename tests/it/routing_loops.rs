//! Routing loops: a request that comes back to a router it already went through is refused
//! with 508 Loop Detected instead of recursing until a limit is hit.

use std::sync::Arc;

use serde_json::json;
use tokio::net::TcpListener;

use crate::support::*;

fn requests_with(metrics: &str, status: &str) -> u64 {
    metrics
        .lines()
        .filter(|l| {
            l.starts_with("kvroute_requests_total{") && l.contains(&format!("status=\"{status}\""))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

#[tokio::test]
async fn two_routers_that_route_to_each_other_answer_508_once() {
    let la = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let lb = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let (a_addr, b_addr) = (la.local_addr().unwrap(), lb.local_addr().unwrap());
    // Small limits: without loop detection the request recurses until they are hit.
    let extra = "[limits]\nmax_concurrency = 16\nmax_queue = 0\n";
    let config_a = router_config(
        PolicyKind::RoundRobin,
        &[(format!("http://{b_addr}"), vec!["m"])],
        extra,
    );
    let config_b = router_config(
        PolicyKind::RoundRobin,
        &[(format!("http://{a_addr}"), vec!["m"])],
        extra,
    );
    let a = kvroute::server::start(&config_a, la).unwrap();
    let b = kvroute::server::start(&config_b, lb).unwrap();
    let c = client();
    for _ in 0..3 {
        let resp = complete(&c, a.addr, &json!({"model": "m", "prompt": "x"})).await;
        let e = assert_openai_error(resp, 508).await;
        assert_eq!(e["code"], "loop_detected", "{e}");
    }
    // Each request went A → B → A once: A refused it, B and A relayed the refusal.
    let (ma, mb) = (metrics_text(a.addr).await, metrics_text(b.addr).await);
    assert_eq!(requests_with(&ma, "508"), 6, "{ma}");
    assert_eq!(requests_with(&mb, "508"), 3, "{mb}");
    let (sa, sb) = (Arc::clone(&a.state), Arc::clone(&b.state));
    assert!(
        eventually(
            || sa.fleet.workers()[0].rank(0).load.snapshot().in_flight == 0
                && sb.fleet.workers()[0].rank(0).load.snapshot().in_flight == 0
        )
        .await
    );
    a.shutdown().await;
    b.shutdown().await;
}

#[tokio::test]
async fn other_routers_ids_are_passed_on_with_this_ones() {
    let backend = Backend::start("a", &["m"]).await;
    let r = start_router_over(PolicyKind::RoundRobin, &[&backend], "").await;
    let resp = client()
        .post(format!("http://{}/v1/completions", r.addr))
        .header("x-kvroute-via", "0123456789abcdef")
        .json(&json!({"model": "m", "prompt": "x"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200, "a chain of distinct routers is no loop");
    let got = backend.received();
    let via: Vec<&str> = got[0]
        .headers
        .get_all("x-kvroute-via")
        .iter()
        .map(|v| v.to_str().unwrap())
        .collect();
    assert_eq!(via, ["0123456789abcdef", r.state.upstream.hop().as_str()]);
    // The same request sent back to this router is refused.
    let resp = client()
        .post(format!("http://{}/v1/completions", r.addr))
        .header("x-kvroute-via", via.join(", "))
        .json(&json!({"model": "m", "prompt": "x"}))
        .send()
        .await
        .unwrap();
    assert_openai_error(resp, 508).await;
    assert_eq!(backend.count(), 1);
    r.shutdown().await;
}
