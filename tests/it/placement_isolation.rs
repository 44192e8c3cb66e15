//! Placement isolation on real sockets (issue 33): two simulated engines behind a router with
//! 8 slots. Counted, never timed: while tenant `a` floods and `b` is active, every request of
//! `b` lands on the worker `a` does not occupy and every request of `a` on the one it does
//! (`kvroute_isolation_confined_total` counts both); with `b` absent, `a` uses both workers.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kvroute::server::RouterHandle;
use serde_json::json;
use tokio::net::TcpListener;

use crate::support::{self, SimEngine};

const MODEL: &str = "sim";

/// A router over `engines` with 8 slots, 2 of them a fair reserve, isolation on (a tenant
/// stays active for a minute after its last request), tenants `a` and `b`.
async fn router(engines: &[SimEngine]) -> RouterHandle {
    let mut text = "shutdown_grace_s = 1.0\n[limits]\nmax_concurrency = 8\nmax_queue = 512\n\
                    queue_timeout_s = 120\n[priority]\nfair_reserve = 2\nisolate = true\n\
                    isolate_window_s = 60\n"
        .to_owned();
    for name in ["a", "b"] {
        text += &format!(
            "[[tenants]]\nname = \"{name}\"\napi_key_sha256 = \"{}\"\n",
            crate::support::sha256_hex(&format!("key-{name}"))
        );
    }
    text += &format!(
        "[admin]\napi_key_sha256 = \"{}\"\n",
        crate::support::sha256_hex("key-admin")
    );
    let config = SimEngine::config_over(&text, engines, MODEL);
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    kvroute::server::start(&config, listener).expect("router")
}

/// One completion as `tenant`: the worker that served it (`x-kvroute-worker`).
async fn served_by(
    http: &reqwest::Client,
    router: &RouterHandle,
    tenant: &str,
    tag: &str,
) -> String {
    let body = json!({"model": MODEL, "prompt": format!("{tag} a prompt of a few words"), "max_tokens": 16});
    let resp = http
        .post(format!("http://{}/v1/completions", router.addr))
        .bearer_auth(format!("key-{tenant}"))
        .json(&body)
        .send()
        .await
        .expect("the router answers");
    assert!(resp.status().is_success(), "{tag}: {}", resp.status());
    let worker = resp
        .headers()
        .get("x-kvroute-worker")
        .and_then(|v| v.to_str().ok())
        .expect("the serving worker is named")
        .to_owned();
    let _ = resp.bytes().await;
    worker
}

/// `clients` of tenant `a` sending back to back until `stop`; each served request's worker,
/// in order of completion.
fn flood(
    router: &RouterHandle,
    clients: usize,
    stop: &Arc<AtomicBool>,
    served: &Arc<Mutex<Vec<String>>>,
) -> Vec<tokio::task::JoinHandle<()>> {
    (0..clients)
        .map(|c| {
            let (stop, served, addr) = (Arc::clone(stop), Arc::clone(served), router.addr);
            tokio::spawn(async move {
                let http = reqwest::Client::new();
                let mut i = 0;
                while !stop.load(Ordering::Relaxed) {
                    let tag = format!("flood{c}x{i}");
                    let body = json!({"model": MODEL, "prompt": format!("{tag} a prompt of a few words"), "max_tokens": 16});
                    let resp = http
                        .post(format!("http://{addr}/v1/completions"))
                        .bearer_auth("key-a")
                        .json(&body)
                        .send()
                        .await
                        .expect("the router answers");
                    assert!(resp.status().is_success(), "{tag}: {}", resp.status());
                    let worker = resp.headers()["x-kvroute-worker"]
                        .to_str()
                        .expect("a worker name")
                        .to_owned();
                    let _ = resp.bytes().await;
                    served.lock().unwrap().push(worker);
                    i += 1;
                }
            })
        })
        .collect()
}

/// `/debug/route`'s answer for a request of `tenant` now.
async fn explained(
    http: &reqwest::Client,
    router: &RouterHandle,
    tenant: &str,
) -> serde_json::Value {
    let body = json!({"model": MODEL, "prompt": "an explained prompt", "max_tokens": 16});
    http.post(format!("http://{}/debug/route", router.addr))
        .bearer_auth("key-admin")
        .header("x-kvroute-tenant", tenant)
        .json(&body)
        .send()
        .await
        .expect("the router answers")
        .json()
        .await
        .expect("an explanation")
}

/// `kvroute_isolation_confined_total{rule}` on the router's metrics page.
async fn confined(router: &RouterHandle, rule: &str) -> u64 {
    let page = support::metrics_text(router.addr).await;
    page.lines()
        .find(|l| {
            l.starts_with(&format!(
                "kvroute_isolation_confined_total{{rule=\"{rule}\"}}"
            ))
        })
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_keeps_to_one_worker_and_the_other_tenant_gets_the_other() {
    let engines = vec![
        SimEngine::start(MODEL, 0, 1.0).await,
        SimEngine::start(MODEL, 1, 1.0).await,
    ];
    let router = router(&engines).await;
    let http = reqwest::Client::new();
    // `b` is active (for the window) before the flood begins.
    served_by(&http, &router, "b", "first").await;
    let (stop, served) = (Arc::new(AtomicBool::new(false)), Arc::default());
    let clients = flood(&router, 16, &stop, &served);
    // Past the flood's first requests (placed before it held more than its share).
    while served.lock().unwrap().len() < 24 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let from = served.lock().unwrap().len();
    let mut b_workers = Vec::new();
    for i in 0..6 {
        b_workers.push(served_by(&http, &router, "b", &format!("calm{i}")).await);
    }
    let to = served.lock().unwrap().len();
    // `/debug/route` shows each tenant's stance and the one candidate left to it.
    let (b_seen, a_seen) = (
        explained(&http, &router, "b").await,
        explained(&http, &router, "a").await,
    );
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        c.await.expect("a flood client");
    }
    let a_workers: BTreeSet<String> = served.lock().unwrap()[from..to].iter().cloned().collect();
    let b_set: BTreeSet<String> = b_workers.iter().cloned().collect();
    assert_eq!(
        a_workers.len(),
        1,
        "the flood kept to one worker: {a_workers:?}"
    );
    assert_eq!(b_set.len(), 1, "b kept to one worker: {b_workers:?}");
    assert!(
        a_workers.is_disjoint(&b_set),
        "a on {a_workers:?}, b on {b_set:?}"
    );
    assert!(to > from, "the flood ran while b's requests did");
    let b_isolation = &b_seen["isolation"];
    assert_eq!(b_isolation["stance"], "within_share", "{b_seen}");
    assert_eq!(b_isolation["over_share_tenants"], json!(["a"]));
    assert_eq!(b_isolation["confined"], "within_share");
    assert_eq!(b_seen["candidates"].as_array().map(Vec::len), Some(1));
    assert!(
        b_set.contains(b_seen["worker"].as_str().unwrap_or("?")),
        "{b_seen}"
    );
    assert_eq!(a_seen["isolation"]["stance"], "over_share", "{a_seen}");
    assert_eq!(a_seen["isolation"]["confined"], "over_share");
    assert!(
        a_workers.contains(a_seen["worker"].as_str().unwrap_or("?")),
        "{a_seen}"
    );
    assert!(confined(&router, "over_share").await >= (to - from) as u64);
    assert!(confined(&router, "within_share").await >= 6);
    router.shutdown().await;
    for e in engines {
        let _ = e.handle.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_alone_uses_every_worker() {
    let engines = vec![
        SimEngine::start(MODEL, 0, 1.0).await,
        SimEngine::start(MODEL, 1, 1.0).await,
    ];
    let router = router(&engines).await;
    let (stop, served) = (Arc::new(AtomicBool::new(false)), Arc::default());
    let clients = flood(&router, 16, &stop, &served);
    while served.lock().unwrap().len() < 48 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        c.await.expect("a flood client");
    }
    let workers: BTreeSet<String> = served.lock().unwrap().iter().cloned().collect();
    assert_eq!(
        workers.len(),
        2,
        "alone, the flood is not confined: {workers:?}"
    );
    assert_eq!(confined(&router, "over_share").await, 0);
    assert_eq!(confined(&router, "within_share").await, 0);
    router.shutdown().await;
    for e in engines {
        let _ = e.handle.shutdown().await;
    }
}
