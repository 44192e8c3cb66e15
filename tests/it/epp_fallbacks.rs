//! The fallback endpoints `kvroute epp` names after its pick (`ip:port,ip:port…`): the
//! decision's runners-up in the order it priced them, never the pick itself nor a worker that
//! is ineligible, draining or has an open circuit; and the load follows the endpoint the
//! gateway reports as having served.

use std::sync::Arc;
use std::time::Instant;

use envoy_types::pb::envoy::service::ext_proc::v3::ProcessingResponse;
use envoy_types::pb::envoy::service::ext_proc::v3::processing_response::Response;
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

/// The value the pick sets for request header `name`.
fn set_header(pick: &ProcessingResponse, name: &str) -> Option<String> {
    let Some(Response::RequestHeaders(h)) = &pick.response else {
        panic!("not a pick: {pick:?}");
    };
    let mutation = h.response.as_ref()?.header_mutation.as_ref()?;
    mutation
        .set_headers
        .iter()
        .filter_map(|o| o.header.as_ref())
        .find(|h| h.key == name)
        .map(|h| String::from_utf8_lossy(&h.raw_value).into_owned())
}

/// A pick and its stream, the request's body sent back.
async fn pick_whole(gateway: &Gateway, call: Call<'_>) -> (ProcessingResponse, Stream) {
    let mut stream = gateway.open(&call).await;
    gateway.send_body(&stream, call.body).await;
    let first = stream.next().await;
    stream.body_back().await;
    (first, stream)
}

/// Two data-parallel pods of two ranks behind one port each, and a plain pod: a pick pinned to
/// rank R names the other pod as its fallback (the gateway sends it the same
/// `x-data-parallel-rank: R`), never the plain pod (a rank it has not) nor the pick's own pod;
/// when that fallback serves, the load moves to its rank R.
#[tokio::test]
async fn a_rank_pinned_pick_falls_back_on_the_same_rank_of_another_pod() {
    let pool = [
        Backend::start("dp0", &["m"]).await,
        Backend::start("dp1", &["m"]).await,
        Backend::start("plain", &["m"]).await,
    ];
    let workers: Vec<(String, Vec<&str>)> = pool.iter().map(|b| (b.url(), vec!["m"])).collect();
    let mut config = router_config(PolicyKind::LeastRequest, &workers, "");
    config.workers[0].data_parallel_size = 2;
    config.workers[1].data_parallel_size = 2;
    let epp = start_naming(&config, 3).await;
    let gateway = Gateway::connect(epp.grpc_addr).await;
    let index = |e: &str| pool.iter().position(|b| endpoint(b) == e).unwrap();
    let mut pinned = 0;
    for turn in 0..6 {
        let body = completion(&prompt(&format!("ranked {turn}")));
        let (first, mut stream) = pick_whole(&gateway, Call::post("/v1/completions", &body)).await;
        let endpoints = endpoints_of(&first);
        let rank = set_header(&first, "x-data-parallel-rank");
        match index(&endpoints[0]) {
            2 => {
                assert_eq!(rank, None, "the plain pod needs no rank");
                assert_eq!(
                    endpoints.len(),
                    1,
                    "no plain pod to fall back on: {endpoints:?}"
                );
                drop(stream);
            }
            picked => {
                let rank: u32 = rank.expect("a pinned pick").parse().unwrap();
                pinned += 1;
                assert_eq!(
                    endpoints,
                    vec![endpoint(&pool[picked]), endpoint(&pool[1 - picked])],
                    "turn {turn}: the other pod's rank {rank} alone"
                );
                let other = worker(&epp, 1 - picked);
                stream.report_head(200, &endpoints[1]).await;
                assert_eq!(worker(&epp, picked).in_flight(), 0, "the pick's load moved");
                let on_rank = other.rank(rank).load.snapshot().in_flight;
                assert_eq!(on_rank, 1, "to the same rank");
                assert_eq!(other.in_flight(), 1);
                stream.report_body(br#"{"choices":[]}"#).await;
            }
        }
        let fleet = Arc::clone(&epp.state.fleet);
        assert!(eventually(|| fleet.workers().iter().all(|w| w.in_flight() == 0)).await);
    }
    assert!(pinned > 0, "some pick went to a data-parallel pod");
    epp.shutdown().await;
}

/// A disaggregated pool of one prefill and three decode pods: the decode's fallbacks are the
/// other decode pods in the decode pick's own order (the busier one last), never the prefill
/// pod, and each reads the same `x-prefiller-host-port`; when one serves, the decode's load
/// moves there.
#[tokio::test]
async fn a_decode_falls_back_on_the_other_decode_pods_in_the_decode_picks_order() {
    let pool = [
        Backend::start("p", &["m"]).await,
        Backend::start("d1", &["m"]).await,
        Backend::start("d2", &["m"]).await,
        Backend::start("d3", &["m"]).await,
    ];
    let mut text = String::from("policy = \"kv_aware\"\nshutdown_grace_s = 1.0\n");
    for (i, (b, role)) in pool
        .iter()
        .zip(["prefill", "decode", "decode", "decode"])
        .enumerate()
    {
        text.push_str(&format!(
            "[[workers]]\nid = \"w{i}\"\nurl = \"{}\"\nmodels = [\"m\"]\nrole = \"{role}\"\n",
            b.url()
        ));
    }
    let config = kvroute::config::Config::from_toml(&text, std::path::Path::new("test")).unwrap();
    let epp = start_naming(&config, 3).await;
    let gateway = Gateway::connect(epp.grpc_addr).await;
    // One request held on d3 (the subset allows the prefill pod and d3 alone).
    let body = completion(&prompt("held"));
    let mut call = Call::post("/v1/completions", &body);
    call.subset = Some(vec![endpoint(&pool[0]), endpoint(&pool[3])]);
    let (held, _held_stream) = pick_whole(&gateway, call).await;
    assert_eq!(
        endpoints_of(&held),
        vec![endpoint(&pool[3])],
        "no other decode in the subset"
    );

    let body = completion(&prompt("fresh"));
    let (first, mut stream) = pick_whole(&gateway, Call::post("/v1/completions", &body)).await;
    let endpoints = endpoints_of(&first);
    assert_eq!(
        set_header(&first, "x-prefiller-host-port"),
        Some(endpoint(&pool[0]))
    );
    assert_eq!(
        endpoints,
        vec![endpoint(&pool[1]), endpoint(&pool[2]), endpoint(&pool[3])],
        "the idle decodes first (the pick, then its runner-up), the busy one last, no prefill pod"
    );
    stream.report_head(200, &endpoints[1]).await;
    assert_eq!(
        worker(&epp, 1).in_flight(),
        0,
        "the pick's decode load moved"
    );
    assert_eq!(worker(&epp, 2).in_flight(), 1, "to the decode that served");
    stream.report_body(br#"{"choices":[]}"#).await;
    drop(_held_stream);
    let fleet = Arc::clone(&epp.state.fleet);
    assert!(eventually(|| fleet.workers().iter().all(|w| w.in_flight() == 0)).await);
    epp.shutdown().await;
}
