//! The fallback endpoints `kvroute epp` names after its pick (`ip:port,ip:port…`): the
//! decision's runners-up in the order it priced them, never the pick itself nor a worker that
//! is ineligible, draining or has an open circuit; and the load follows the endpoint the
//! gateway reports as having served.

use std::sync::Arc;
use std::time::Instant;

use kvroute::epp::{EppHandle, Listeners};
use kvroute::fleet::Worker;

use crate::epp::{endpoint, listener};
use crate::support::backend::{Backend, PolicyKind, router_config};
use crate::support::eventually;
use crate::support::gateway::{Call, Gateway, Stream, endpoints_of};

async fn start_naming(config: &kvroute::config::Config, fallbacks: usize) -> EppHandle {
    let listeners = Listeners {
        grpc: listener().await,
        health: listener().await,
        metrics: listener().await,
    };
    kvroute::epp::start_naming(config, listeners, fallbacks).unwrap()
}

/// A completion of `prompt` (no chat template: the prompt's first block is its own, so no
/// two prompts here share a cached prefix).
fn completion(prompt: &str) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({"model": "m", "prompt": prompt, "max_tokens": 4}))
        .unwrap()
}

/// A request held on the endpoint `only` (the subset hint): picked, its body back, its
/// response not begun, so its load stays on that worker.
async fn hold(gateway: &Gateway, only: &str, prompt: &str) -> Stream {
    let body = completion(prompt);
    let mut call = Call::post("/v1/completions", &body);
    call.subset = Some(vec![only.to_owned()]);
    let mut stream = gateway.open(&call).await;
    gateway.send_body(&stream, &body).await;
    let pick = stream.next().await;
    assert_eq!(endpoints_of(&pick)[0], only);
    stream.body_back().await;
    stream
}

/// A fresh request's pick and fallbacks, with its stream (its load held until it ends).
async fn pick(gateway: &Gateway, prompt: &str) -> (Vec<String>, Stream) {
    let body = completion(prompt);
    let call = Call::post("/v1/completions", &body);
    let mut stream = gateway.open(&call).await;
    gateway.send_body(&stream, &body).await;
    let endpoints = endpoints_of(&stream.next().await);
    stream.body_back().await;
    (endpoints, stream)
}

fn worker(epp: &EppHandle, i: usize) -> Arc<Worker> {
    epp.state.fleet.get(&format!("w{i}")).unwrap()
}

fn prompt(tag: &str) -> String {
    format!(
        "{tag}: {}",
        "a prompt of its own, long enough to weigh ".repeat(30)
    )
}

/// Over four engines of the model loaded 0, 1, 2 and 3 requests deep (and a fifth serving
/// another model), `kv_aware` picks the idle one and names the next two by its cost — the
/// least loaded first; once the first of them drains and the second's circuit opens, only
/// the one left is named, and never the ineligible fifth.
#[tokio::test]
async fn fallbacks_follow_the_decisions_cost_and_skip_the_pick_and_workers_that_are_out() {
    let mut pool = Vec::new();
    for i in 0..4 {
        pool.push(Backend::start(&format!("b{i}"), &["m"]).await);
    }
    pool.push(Backend::start("other", &["other"]).await);
    let workers: Vec<(String, Vec<&str>)> = pool
        .iter()
        .enumerate()
        .map(|(i, b)| (b.url(), vec![if i < 4 { "m" } else { "other" }]))
        .collect();
    let config = router_config(PolicyKind::KvAware, &workers, "");
    let epp = start_naming(&config, 2).await;
    let gateway = Gateway::connect(epp.grpc_addr).await;
    let mut held = Vec::new();
    for (i, b) in pool.iter().enumerate().take(4) {
        for j in 0..i {
            held.push(hold(&gateway, &endpoint(b), &prompt(&format!("held {i}.{j}"))).await);
        }
    }
    let (endpoints, stream) = pick(&gateway, &prompt("fresh")).await;
    let expected: Vec<String> = pool[..3].iter().map(endpoint).collect();
    assert_eq!(
        endpoints, expected,
        "the idle engine, then the next cheapest two in the decision's order"
    );
    drop(stream);
    assert!(eventually(|| worker(&epp, 0).in_flight() == 0).await);

    worker(&epp, 1).set_draining(true);
    let second = worker(&epp, 2);
    let now = Instant::now();
    for _ in 0..100 {
        if !second.is_routable(now) {
            break;
        }
        second.record_failure(now);
    }
    assert!(!second.is_routable(now), "w2's circuit is open");
    let (endpoints, _stream) = pick(&gateway, &prompt("after")).await;
    assert_eq!(
        endpoints,
        vec![endpoint(&pool[0]), endpoint(&pool[3])],
        "a draining worker and an open circuit are never fallbacks"
    );
    drop(held);
    epp.shutdown().await;
}

/// With `--fallbacks 0` the pick is named alone.
#[tokio::test]
async fn no_fallbacks_names_the_pick_alone() {
    let pool = [
        Backend::start("b0", &["m"]).await,
        Backend::start("b1", &["m"]).await,
    ];
    let workers: Vec<(String, Vec<&str>)> = pool.iter().map(|b| (b.url(), vec!["m"])).collect();
    let config = router_config(PolicyKind::LeastRequest, &workers, "");
    let epp = start_naming(&config, 0).await;
    let gateway = Gateway::connect(epp.grpc_addr).await;
    let (endpoints, _stream) = pick(&gateway, "alone").await;
    assert_eq!(endpoints.len(), 1, "{endpoints:?}");
    epp.shutdown().await;
}

/// The gateway reports that the first fallback served (the pick failed to connect, say): the
/// request's load moves there from the pick, and is released when the response ends.
#[tokio::test]
async fn a_fallback_that_served_carries_the_load() {
    let pool = [
        Backend::start("b0", &["m"]).await,
        Backend::start("b1", &["m"]).await,
        Backend::start("b2", &["m"]).await,
    ];
    let workers: Vec<(String, Vec<&str>)> = pool.iter().map(|b| (b.url(), vec!["m"])).collect();
    let config = router_config(PolicyKind::LeastRequest, &workers, "");
    let epp = start_naming(&config, 2).await;
    let gateway = Gateway::connect(epp.grpc_addr).await;
    let (endpoints, mut stream) = pick(&gateway, "fall back").await;
    assert_eq!(endpoints.len(), 3, "{endpoints:?}");
    let index = |e: &str| pool.iter().position(|b| endpoint(b) == e).unwrap();
    let (picked, fallback) = (index(&endpoints[0]), index(&endpoints[1]));
    assert_eq!(
        worker(&epp, picked).in_flight(),
        1,
        "the pick holds the load"
    );
    stream.report_head(200, &endpoints[1]).await;
    assert_eq!(worker(&epp, picked).in_flight(), 0, "the pick's load moved");
    assert_eq!(
        worker(&epp, fallback).in_flight(),
        1,
        "the fallback that served carries it"
    );
    let answer = br#"{"choices":[{"index":0,"text":"hi"}]}"#;
    assert_eq!(stream.report_body(answer).await, answer);
    let fleet = Arc::clone(&epp.state.fleet);
    assert!(
        eventually(|| fleet.workers().iter().all(|w| w.in_flight() == 0)).await,
        "released at the end"
    );
    epp.shutdown().await;
}
