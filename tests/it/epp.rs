//! `kvroute epp` driven by an Envoy stand-in (`support::gateway`): the pick, the body through
//! unchanged, the response phase, the subset hint, immediate answers, stream resets, and many
//! streams at once; and the same decisions as `serve` on one script of arrivals.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use kvroute::config::Config;
use kvroute::epp::{EppHandle, Listeners};
use serde_json::json;
use tokio::net::TcpListener;

use crate::support::backend::{Backend, PolicyKind, router_config, start_router};
use crate::support::eventually;
use crate::support::gateway::{Call, Gateway};

pub(crate) async fn listener() -> TcpListener {
    TcpListener::bind("127.0.0.1:0").await.unwrap()
}

/// A picker for `config` on ephemeral loopback ports.
pub(crate) async fn start_epp(config: &Config) -> EppHandle {
    let listeners = Listeners {
        grpc: listener().await,
        health: listener().await,
        metrics: listener().await,
    };
    kvroute::epp::start(config, listeners).unwrap()
}

pub(crate) fn chat(prompt: &str) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "model": "m",
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": 4,
    }))
    .unwrap()
}

async fn backends(n: usize) -> Vec<Backend> {
    let mut out = Vec::new();
    for i in 0..n {
        out.push(Backend::start(&format!("b{i}"), &["m"]).await);
    }
    out
}

fn workers(backends: &[Backend]) -> Vec<(String, Vec<&'static str>)> {
    backends.iter().map(|b| (b.url(), vec!["m"])).collect()
}

pub(crate) fn endpoint(b: &Backend) -> String {
    b.url().trim_start_matches("http://").to_owned()
}

/// The pick names one of the pool's endpoints in the header and the metadata alike, the
/// engine gets the client's body byte for byte (sent back in chunks), the client gets the
/// engine's answer whole with the worker named, and the load is released at the end.
#[tokio::test]
async fn a_request_goes_where_the_picker_says_with_every_byte() {
    let pool = backends(2).await;
    let config = router_config(PolicyKind::KvAware, &workers(&pool), "");
    let epp = start_epp(&config).await;
    let gateway = Gateway::connect(epp.grpc_addr).await;
    let body = chat(&"the same long prompt ".repeat(40));
    let answer = gateway
        .request(Call::post("/v1/chat/completions", &body))
        .await;
    assert_eq!(
        answer.status,
        200,
        "{}",
        String::from_utf8_lossy(&answer.body)
    );
    let destination = answer.destination.clone().unwrap();
    assert!(
        pool.iter().any(|b| endpoint(b) == destination),
        "{destination}"
    );
    assert_eq!(
        answer.sent_body, body,
        "the body reaches the engine unchanged"
    );
    let served: serde_json::Value = serde_json::from_slice(&answer.body).unwrap();
    assert!(served["choices"].is_array(), "{served}");
    let worker = &answer.headers["x-kvroute-worker"];
    assert!(worker == "w0" || worker == "w1", "{worker}");
    let received: usize = pool.iter().map(Backend::count).sum();
    assert_eq!(received, 1);
    let fleet = Arc::clone(&epp.state.fleet);
    assert!(
        eventually(|| fleet.workers().iter().all(|w| w.in_flight() == 0)).await,
        "the load is released when the body ends"
    );
    epp.shutdown().await;
}

/// The subset hint is obeyed; a subset with no eligible endpoint is a 503 answered by the
/// gateway in OpenAI's shape, and so is an unknown model (404) — the errors `serve` gives.
#[tokio::test]
async fn the_subset_hint_is_obeyed_and_refusals_are_immediate_answers() {
    let pool = backends(3).await;
    let config = router_config(PolicyKind::RoundRobin, &workers(&pool), "");
    let epp = start_epp(&config).await;
    let gateway = Gateway::connect(epp.grpc_addr).await;
    let only = endpoint(&pool[1]);
    for i in 0..6 {
        let body = chat(&format!("prompt {i}"));
        let mut call = Call::post("/v1/chat/completions", &body);
        call.subset = Some(vec![only.clone()]);
        let answer = gateway.request(call).await;
        assert_eq!(answer.destination.as_deref(), Some(only.as_str()));
    }
    assert_eq!(pool[1].count(), 6);
    let body = chat("x");
    let mut call = Call::post("/v1/chat/completions", &body);
    call.subset = Some(vec!["10.9.9.9:8000".into()]);
    let refused = gateway.request(call).await;
    assert_eq!(refused.status, 503);
    assert_eq!(refused.destination, None);
    let e: serde_json::Value = serde_json::from_slice(&refused.body).unwrap();
    assert_eq!(e["error"]["code"], "no_worker_available", "{e}");
    let unknown = serde_json::to_vec(&json!({"model": "nope", "prompt": "x"})).unwrap();
    let refused = gateway
        .request(Call::post("/v1/completions", &unknown))
        .await;
    assert_eq!(refused.status, 404);
    let bad = gateway
        .request(Call::post("/v1/completions", b"{not json"))
        .await;
    assert_eq!(bad.status, 400);
    assert_eq!(
        pool.iter().map(Backend::count).sum::<usize>(),
        6,
        "no refused request went on"
    );
    epp.shutdown().await;
}

/// Admission sheds as `serve` does: past the router's slots and queue, a 429 with
/// `Retry-After`; a body over the limit is a 413 before it is all sent.
#[tokio::test]
async fn shed_requests_get_429_with_retry_after_and_large_bodies_413() {
    let pool = backends(1).await;
    let extra = "max_body_bytes = 4096\n[limits]\nmax_concurrency = 1\nmax_queue = 0\n";
    let config = router_config(PolicyKind::RoundRobin, &workers(&pool), extra);
    let epp = start_epp(&config).await;
    let gateway = Gateway::connect(epp.grpc_addr).await;
    // A stream that sent its head holds the only slot while its body is awaited.
    let body = chat("held");
    let held = gateway
        .open(&Call::post("/v1/chat/completions", &body))
        .await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let shed = gateway
        .request(Call::post("/v1/chat/completions", &body))
        .await;
    assert_eq!(shed.status, 429);
    assert_eq!(
        shed.headers.get("retry-after").map(String::as_str),
        Some("1")
    );
    drop(held);
    let big = chat(&"x".repeat(8192));
    let mut too_large = None;
    for _ in 0..50 {
        let answer = gateway
            .request(Call::post("/v1/chat/completions", &big))
            .await;
        if answer.status != 429 {
            too_large = Some(answer.status);
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        too_large,
        Some(413),
        "the slot comes back when the stream resets"
    );
    assert_eq!(pool[0].count(), 0);
    epp.shutdown().await;
}

/// A stream the gateway resets after the pick (the client left, or no endpoint answered)
/// releases the request's load and slot: the next requests are admitted and routed.
#[tokio::test]
async fn a_reset_stream_releases_its_load() {
    let pool = backends(2).await;
    let config = router_config(PolicyKind::LeastRequest, &workers(&pool), "");
    let epp = start_epp(&config).await;
    let gateway = Gateway::connect(epp.grpc_addr).await;
    let body = chat("reset me");
    let mut stream = gateway
        .open(&Call::post("/v1/chat/completions", &body))
        .await;
    gateway.send_body(&stream, &body).await;
    let _pick = stream.next().await;
    let fleet = Arc::clone(&epp.state.fleet);
    let total = || fleet.workers().iter().map(|w| w.in_flight()).sum::<u64>();
    assert_eq!(total(), 1, "the pick holds its load");
    drop(stream);
    assert!(eventually(|| total() == 0).await, "the reset released it");
    let answer = gateway
        .request(Call::post("/v1/chat/completions", &body))
        .await;
    assert_eq!(answer.status, 200);
    epp.shutdown().await;
}

/// The picker ends its side of a stream only after the gateway ended its own, as GIE's
/// reference picker does: ending first made h2 reset every stream, and the gateway's late end
/// of stream then counted toward h2's limit of locally reset streams, which closes the whole
/// connection. Here the gateway holds its side open after the last answer: the picker's side
/// stays open too, and ends cleanly (status OK, no reset) once the gateway's does.
#[tokio::test]
async fn the_picker_ends_its_side_of_a_stream_after_the_gateway() {
    let pool = backends(1).await;
    let config = router_config(PolicyKind::LeastRequest, &workers(&pool), "");
    let epp = start_epp(&config).await;
    let gateway = Gateway::connect(epp.grpc_addr).await;
    let body = chat("hold the stream");
    let mut stream = gateway
        .open(&Call::post("/v1/chat/completions", &body))
        .await;
    gateway.send_body(&stream, &body).await;
    let _pick = stream.next().await;
    assert_eq!(stream.body_back().await, body);
    stream.report_head(200, &endpoint(&pool[0])).await;
    stream.report_body(b"{}").await;
    // The request is over; the gateway has not ended its side. Nothing more comes: no end,
    // no status, no reset (the window is far longer than the picker takes to end a stream).
    let held = tokio::time::timeout(Duration::from_millis(300), stream.rx.message()).await;
    assert!(held.is_err(), "the picker ended first: {held:?}");
    // The gateway's end of stream, then the picker's, with status OK.
    let (tx, mut rx) = (stream.tx, stream.rx);
    drop(tx);
    match rx.message().await {
        Ok(None) => {}
        other => panic!("expected a clean end after the gateway's, got {other:?}"),
    }
    let fleet = Arc::clone(&epp.state.fleet);
    assert_eq!(
        fleet.workers()[0].in_flight(),
        0,
        "the load was released at the end"
    );
    epp.shutdown().await;
}

/// 2,000 streams at once through the gateway: every one answered 200 by the engine the
/// picker named, and the engines received exactly 2,000 requests.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_thousand_concurrent_streams_lose_nothing() {
    const N: usize = 2000;
    let pool = backends(4).await;
    // What is tested is delivery, not health: on a loaded 2-core machine, 2,000 streams at
    // once can hold a mock engine's `/health` past the default 2 s twice, and a worker marked
    // down leaves the rest a 503 "no worker" (seen twice in full runs under extreme load, the
    // likeliest cause; not reproduced alone). Checks that wait longer keep it in.
    let extra =
        "[limits]\nmax_concurrency = 4096\n[health]\ntimeout_s = 30.0\nunhealthy_threshold = 5\n";
    let config = router_config(PolicyKind::KvAware, &workers(&pool), extra);
    let epp = start_epp(&config).await;
    let mut gateways = Vec::new();
    for _ in 0..8 {
        gateways.push(Gateway::connect(epp.grpc_addr).await);
    }
    let mut tasks = Vec::with_capacity(N);
    for i in 0..N {
        let gateway = gateways[i % gateways.len()].clone();
        tasks.push(tokio::spawn(async move {
            let body = chat(&format!("session {} turn {i}", i % 50));
            let answer = gateway
                .request(Call::post("/v1/chat/completions", &body))
                .await;
            (answer.status, answer.destination, answer.sent_body == body)
        }));
    }
    let mut by_endpoint: HashMap<String, usize> = HashMap::new();
    let mut ok = 0;
    for t in tasks {
        let (status, destination, intact) = t.await.unwrap();
        assert!(
            intact,
            "a body changed on the way: {status} {destination:?}"
        );
        if status == 200 {
            ok += 1;
        }
        *by_endpoint
            .entry(destination.unwrap_or_default())
            .or_default() += 1;
    }
    assert_eq!(ok, N, "{by_endpoint:?}");
    let received: usize = pool.iter().map(Backend::count).sum();
    assert_eq!(received, N, "each request reached exactly one engine once");
    for b in &pool {
        assert_eq!(
            by_endpoint.get(&endpoint(b)).copied().unwrap_or(0),
            b.count()
        );
    }
    epp.shutdown().await;
}

/// `epp` and `serve` make the same decisions on one script of arrivals: the same
/// configuration (kv_aware without timing calibration, approximate index, one seed) over the
/// same engines, the same prompts one after the other (groups sharing long prefixes),
/// alternating between the two faces, each with its own index and loads; every request goes
/// to the worker of the same index.
#[tokio::test]
async fn epp_and_serve_decide_alike_on_one_script() {
    let pool = backends(3).await;
    let extra = "seed = 7\n[kv_aware]\ncalibrate = false\n";
    let config = router_config(PolicyKind::KvAware, &workers(&pool), extra);
    let router = start_router(&config).await;
    let epp = start_epp(&config).await;
    let gateway = Gateway::connect(epp.grpc_addr).await;
    let http = reqwest::Client::new();
    let index_of: HashMap<String, String> = pool
        .iter()
        .enumerate()
        .map(|(i, b)| (endpoint(b), format!("w{i}")))
        .collect();
    let groups = ["alpha ", "bravo ", "charlie ", "delta ", "echo "];
    let (mut via_serve, mut via_epp) = (Vec::new(), Vec::new());
    for step in 0..30 {
        let group = groups[(step * 7) % groups.len()];
        let body = chat(&format!("{}{step}", group.repeat(120)));
        let resp = http
            .post(format!("http://{}/v1/chat/completions", router.addr))
            .header("content-type", "application/json")
            .body(body.clone())
            .send()
            .await
            .unwrap();
        via_serve.push(
            resp.headers()["x-kvroute-worker"]
                .to_str()
                .unwrap()
                .to_owned(),
        );
        resp.bytes().await.unwrap();
        let answer = gateway
            .request(Call::post("/v1/chat/completions", &body))
            .await;
        via_epp.push(index_of[&answer.destination.unwrap()].clone());
    }
    assert_eq!(via_epp, via_serve);
    let distinct: std::collections::HashSet<_> = via_serve.iter().collect();
    assert!(
        distinct.len() > 1,
        "the script spreads over the pool: {via_serve:?}"
    );
    router.shutdown().await;
    epp.shutdown().await;
}

fn hex_sha(key: &str) -> String {
    use sha2::{Digest, Sha256};
    Sha256::digest(key.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A tenant's request carries its namespaced `cache_salt` to the engine, as through `serve`
/// (the same bytes), the tenant key never reaches the engine, and a request without a key is
/// a 401 the gateway answers.
#[tokio::test]
async fn a_tenants_body_gets_its_salt_and_its_key_stays_with_the_picker() {
    let pool = backends(1).await;
    let extra = format!(
        "[[tenants]]\nname = \"acme\"\napi_key_sha256 = \"{}\"\n",
        hex_sha("key-acme")
    );
    let config = router_config(PolicyKind::KvAware, &workers(&pool), &extra);
    let router = start_router(&config).await;
    let epp = start_epp(&config).await;
    let gateway = Gateway::connect(epp.grpc_addr).await;
    let body = chat("salted");
    let resp = reqwest::Client::new()
        .post(format!("http://{}/v1/chat/completions", router.addr))
        .bearer_auth("key-acme")
        .header("content-type", "application/json")
        .body(body.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let via_serve = pool[0].received().last().unwrap().body.clone();
    let mut call = Call::post("/v1/chat/completions", &body);
    call.headers
        .push(("authorization", "Bearer key-acme".into()));
    let answer = gateway.request(call).await;
    assert_eq!(answer.status, 200);
    assert_eq!(
        answer.sent_body,
        via_serve.to_vec(),
        "the same salted bytes as serve sends"
    );
    assert_ne!(answer.sent_body, body);
    assert_eq!(
        answer.sent_headers.get("content-length"),
        Some(&answer.sent_body.len().to_string())
    );
    assert!(!answer.sent_headers.contains_key("authorization"));
    assert!(
        pool[0]
            .received()
            .last()
            .unwrap()
            .headers
            .get("authorization")
            .is_none()
    );
    let refused = gateway
        .request(Call::post("/v1/chat/completions", &body))
        .await;
    assert_eq!(refused.status, 401);
    router.shutdown().await;
    epp.shutdown().await;
}

/// A disaggregated pool: the decode worker is the destination and the prefill worker is in
/// `x-prefiller-host-port` (llm-d's decode sidecar reads it); a client's own value of that
/// header never reaches the engine.
#[tokio::test]
async fn a_disaggregated_request_goes_to_its_decode_with_the_prefill_in_a_header() {
    let pool = backends(2).await;
    let mut text = String::from("policy = \"kv_aware\"\nshutdown_grace_s = 1.0\n");
    for (i, (b, role)) in pool.iter().zip(["prefill", "decode"]).enumerate() {
        text.push_str(&format!(
            "[[workers]]\nid = \"w{i}\"\nurl = \"{}\"\nmodels = [\"m\"]\nrole = \"{role}\"\n",
            b.url()
        ));
    }
    let config = Config::from_toml(&text, std::path::Path::new("test")).unwrap();
    let epp = start_epp(&config).await;
    let gateway = Gateway::connect(epp.grpc_addr).await;
    let body = chat("split me");
    let mut call = Call::post("/v1/chat/completions", &body);
    call.headers
        .push(("x-prefiller-host-port", "10.6.6.6:1".into()));
    let answer = gateway.request(call).await;
    assert_eq!(answer.status, 200);
    assert_eq!(answer.destination, Some(endpoint(&pool[1])));
    assert_eq!(
        answer.sent_headers.get("x-prefiller-host-port"),
        Some(&endpoint(&pool[0]))
    );
    let received = pool[1].received();
    let prefiller = received[0].headers.get("x-prefiller-host-port").unwrap();
    assert_eq!(prefiller.to_str().unwrap(), endpoint(&pool[0]));
    assert_eq!(
        pool[0].count(),
        0,
        "the sidecar, not the picker, sends the prefill"
    );
    epp.shutdown().await;
}
