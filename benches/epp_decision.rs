//! Decision latency of `kvroute epp` against what `kvroute serve` adds, for the same request
//! and the same fleet (issue 31's goal: the picker adds no more than the proxy).
//!
//! Three paths, alternating round by round in one run (drift on a shared machine hits each
//! alike), each request a chat completion of a few hundred words (a different prompt per
//! request, the same sequence on every path):
//! - **direct**: the request posted to a fake engine (it answers at once);
//! - **serve**: the same request through a `kvroute serve` process over four such engines
//!   (`kv_aware`): what serve adds is its median (p99) less direct's;
//! - **epp**: a `kvroute epp` process over the same four engines, asked as Envoy asks it (the
//!   test suite's Envoy stand-in: one ext_proc stream per request on a shared HTTP/2
//!   connection, request headers, the body in `FULL_DUPLEX_STREAMED` chunks, the last one
//!   ending it). Timed from sending the body's last chunk to receiving the pick (the headers
//!   answer), and — since Envoy forwards the body only as the picker streams it back — to
//!   receiving the body's last chunk. The response phase is then reported (headers with the
//!   served endpoint, the engine's answer) so the picker releases the request's load as it
//!   would behind a gateway; that part is not timed.
//!
//! - **floor**: the same ext_proc exchange with a server that decides nothing (`null_picker`:
//!   the picker's messages, a fixed endpoint, the body unread): the stand-in, HTTP/2 and gRPC
//!   alone, once in a thread of the bench's process and once in a process of its own (as
//!   `kvroute epp` runs). The picker less the second is what its own work adds.
//! - **forwarder**: a bare hyper forwarder that reads the body before forwarding it and
//!   decides nothing (`bare_forwarder`, a process of its own): the floor under what `serve`
//!   adds, as the null picker is the floor under the pick. The two floors' difference is what
//!   the ext_proc exchange costs beyond an HTTP/1 forward on this machine, before either face
//!   does any work: a picker that does `serve`'s work can add no less than `serve` when that
//!   difference exceeds what `serve` does that the picker does not.
//!
//! `KVROUTE_BENCH_BASELINE` may name another `kvroute` binary (say, one built from main): its
//! `kvroute epp` over the same engines is a fourth path of the same run, so a change to the
//! picker is measured against what it changes.
//!
//! Run: `flock /tmp/kvroute-bench.lock cargo bench --bench epp_decision` (N defaults to 2,000
//! per path; set `KVROUTE_BENCH_N`; `KVROUTE_BENCH_WORDS` sets the prompt's words, 300 by
//! default).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test and bench code: a failed step should stop the run"
)]

use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use bytes::Bytes;
use envoy_types::pb::envoy::service::ext_proc::v3::HttpBody;
use envoy_types::pb::envoy::service::ext_proc::v3::processing_request::Request;
use envoy_types::pb::envoy::service::ext_proc::v3::processing_response::Response;
use hdrhistogram::Histogram;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

#[path = "common/bare_forwarder.rs"]
mod bare_forwarder;
#[path = "common/fake_backend.rs"]
mod fake_backend;
// The Envoy stand-in of the `epp` tests; the bench uses its stream steps, not its whole
// requests.
#[allow(dead_code)]
#[path = "../tests/it/support/gateway.rs"]
mod gateway;
#[path = "common/null_picker.rs"]
mod null_picker;
#[path = "common/prose.rs"]
mod prose;

use fake_backend::{ANSWER, Process, free_addr, serve_backend, spawn_quiet};
use gateway::{Call, Gateway, endpoints_of, message};

/// Rounds; each sends `n / ROUNDS` requests per path after warm-up ones.
const ROUNDS: usize = 10;
const WARM_UP: usize = 50;
/// Engines behind both routers.
const ENGINES: usize = 4;
/// Words in a prompt (about 2 KB of JSON) unless `KVROUTE_BENCH_WORDS` says otherwise.
const WORDS: usize = 300;

/// Words in each prompt of this run.
fn words() -> usize {
    static WORDS_NOW: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *WORDS_NOW.get_or_init(|| {
        std::env::var("KVROUTE_BENCH_WORDS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(WORDS)
    })
}
/// The body chunk the stand-in sends (Envoy passes on what the client's frames carried).
const CHUNK: usize = 1024;
const PATH: &str = "/v1/chat/completions";

type BenchClient = Client<HttpConnector, Full<Bytes>>;

fn body(seed: u64) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "model": "m",
        "messages": [{"role": "user", "content": prose::words(words(), seed)}],
        "max_tokens": 1,
    }))
    .expect("json")
}

async fn post(client: &BenchClient, url: &str, body: Vec<u8>) -> bool {
    let req = http::Request::post(url)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body)))
        .expect("request");
    match client.request(req).await {
        Ok(resp) => {
            let ok = resp.status().is_success();
            let bytes = resp.into_body().collect().await.map(|b| b.to_bytes());
            ok && bytes.is_ok_and(|b| !b.is_empty())
        }
        Err(_) => false,
    }
}

/// One request over HTTP; its latency in nanoseconds.
async fn http_request(client: &BenchClient, url: &str, seed: u64) -> u64 {
    let body = body(seed);
    let t = Instant::now();
    assert!(post(client, url, body).await, "{url} failed");
    t.elapsed().as_nanos() as u64
}

/// One request through the picker: the nanoseconds from the body's last chunk to the pick,
/// and to the body's last chunk back; `None` when the picker answered by itself (a refusal).
async fn epp_request(gateway: &Gateway, seed: u64) -> Option<(u64, u64)> {
    let body = body(seed);
    let call = Call::post(PATH, &body);
    let mut stream = gateway.open(&call).await;
    let chunks: Vec<&[u8]> = body.chunks(CHUNK).collect();
    let mut sent = Instant::now();
    for (i, c) in chunks.iter().enumerate() {
        let last = i + 1 == chunks.len();
        let part = HttpBody {
            body: c.to_vec(),
            end_of_stream: last,
            ..HttpBody::default()
        };
        if last {
            sent = Instant::now();
        }
        stream.send(message(Request::RequestBody(part), None)).await;
    }
    let first = stream.next().await;
    let picked = sent.elapsed().as_nanos() as u64;
    if !matches!(first.response, Some(Response::RequestHeaders(_))) {
        return None;
    }
    stream.body_back().await;
    let body_back = sent.elapsed().as_nanos() as u64;
    let served = endpoints_of(&first).swap_remove(0);
    stream.report_head(200, &served).await;
    stream.report_body(ANSWER.as_bytes()).await;
    Some((picked, body_back))
}

/// The routers' shared config: `kv_aware` over `engines`.
fn config(dir: &Path, engines: &[SocketAddr], listen: SocketAddr) -> std::path::PathBuf {
    let mut text = format!("listen = \"{listen}\"\npolicy = \"kv_aware\"\n");
    for (i, e) in engines.iter().enumerate() {
        text.push_str(&format!(
            "[[workers]]\nid = \"e{i}\"\nurl = \"http://{e}\"\nmodels = [\"m\"]\n"
        ));
    }
    let file = dir.join(format!("kvroute-{}.toml", listen.port()));
    std::fs::write(&file, text).expect("config");
    file
}

fn start_serve(dir: &Path, engines: &[SocketAddr]) -> (Process, String) {
    let addr = free_addr();
    let file = config(dir, engines, addr);
    let process = spawn_quiet(
        Command::new(env!("CARGO_BIN_EXE_kvroute"))
            .args(["serve", "--config"])
            .arg(&file)
            .env("RUST_LOG", "warn"),
        "kvroute serve",
    );
    (process, format!("http://{addr}{PATH}"))
}

fn start_epp(binary: &Path, dir: &Path, engines: &[SocketAddr]) -> (Process, SocketAddr) {
    let grpc = free_addr();
    let file = config(dir, engines, free_addr());
    let process = spawn_quiet(
        Command::new(binary)
            .args(["epp", "--config"])
            .arg(&file)
            .args(["--grpc-listen", &grpc.to_string()])
            .args(["--health-listen", &free_addr().to_string()])
            .args(["--metrics-listen", &free_addr().to_string()])
            .env("RUST_LOG", "warn"),
        "kvroute epp",
    );
    (process, grpc)
}

/// The picker, connected once it picks (its workers known).
async fn ready_epp(grpc: SocketAddr) -> Gateway {
    for _ in 0..600 {
        let connected = tokio::time::timeout(
            Duration::from_secs(1),
            tonic::transport::Channel::from_shared(format!("http://{grpc}"))
                .expect("uri")
                .connect(),
        )
        .await;
        if matches!(connected, Ok(Ok(_))) {
            let gateway = Gateway::connect(grpc).await;
            if epp_request(&gateway, 0).await.is_some() {
                return gateway;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("kvroute epp never picked");
}

async fn ready_http(client: &BenchClient, url: &str) {
    for _ in 0..600 {
        if post(client, url, body(0)).await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{url} never answered");
}

/// The histograms of one run.
struct Figures {
    direct: Histogram<u64>,
    serve: Histogram<u64>,
    pick: Histogram<u64>,
    body_back: Histogram<u64>,
    /// The null picker's in the bench's process (the exchange's floor).
    floor_pick: Histogram<u64>,
    floor_body_back: Histogram<u64>,
    /// The null picker's in a process of its own.
    floor_process_pick: Histogram<u64>,
    floor_process_body_back: Histogram<u64>,
    /// Through the bare forwarder (body read first): the floor under `serve`.
    forwarder: Histogram<u64>,
    /// The baseline binary's picker (`KVROUTE_BENCH_BASELINE`), when one is given.
    baseline_pick: Option<Histogram<u64>>,
    baseline_body_back: Option<Histogram<u64>>,
}

/// Sends one round's requests through `gateway`, recording those after the warm-up.
async fn epp_round(
    gateway: &Gateway,
    first: u64,
    per_round: usize,
    pick: &mut Histogram<u64>,
    body_back: &mut Histogram<u64>,
) {
    for i in 0..per_round + WARM_UP {
        let (p, back) = epp_request(gateway, first + i as u64)
            .await
            .expect("the picker picks");
        if i >= WARM_UP {
            pick.record(p).expect("record");
            body_back.record(back).expect("record");
        }
    }
}

/// The pickers one run asks: kvroute's, the floors, and the baseline binary's if given.
struct Pickers<'a> {
    epp: &'a Gateway,
    floor: &'a Gateway,
    floor_process: &'a Gateway,
    baseline: Option<&'a Gateway>,
}

/// The HTTP paths one run asks: an engine directly, `serve`, the bare forwarder.
struct Urls<'a> {
    direct: &'a str,
    serve: &'a str,
    forwarder: &'a str,
}

/// Sends one round's requests to `url`, recording those after the warm-up.
async fn http_round(
    client: &BenchClient,
    url: &str,
    first: u64,
    per_round: usize,
    h: &mut Histogram<u64>,
) {
    for i in 0..per_round + WARM_UP {
        let ns = http_request(client, url, first + i as u64).await;
        if i >= WARM_UP {
            h.record(ns).expect("record");
        }
    }
}

async fn run(client: &BenchClient, urls: Urls<'_>, p: Pickers<'_>, n: usize) -> Figures {
    let Pickers {
        epp: gateway,
        floor,
        floor_process,
        baseline,
    } = p;
    let new = || Histogram::<u64>::new(3).expect("histogram");
    let mut f = Figures {
        direct: new(),
        serve: new(),
        pick: new(),
        body_back: new(),
        floor_pick: new(),
        floor_body_back: new(),
        floor_process_pick: new(),
        floor_process_body_back: new(),
        forwarder: new(),
        baseline_pick: baseline.map(|_| new()),
        baseline_body_back: baseline.map(|_| new()),
    };
    let per_round = n / ROUNDS;
    let mut seed = 1;
    for _ in 0..ROUNDS {
        let first = seed;
        http_round(client, urls.direct, first, per_round, &mut f.direct).await;
        http_round(client, urls.serve, first, per_round, &mut f.serve).await;
        http_round(client, urls.forwarder, first, per_round, &mut f.forwarder).await;
        epp_round(gateway, first, per_round, &mut f.pick, &mut f.body_back).await;
        epp_round(
            floor,
            first,
            per_round,
            &mut f.floor_pick,
            &mut f.floor_body_back,
        )
        .await;
        epp_round(
            floor_process,
            first,
            per_round,
            &mut f.floor_process_pick,
            &mut f.floor_process_body_back,
        )
        .await;
        if let (Some(b), Some(pick), Some(back)) = (
            baseline,
            f.baseline_pick.as_mut(),
            f.baseline_body_back.as_mut(),
        ) {
            epp_round(b, first, per_round, pick, back).await;
        }
        seed += (per_round + WARM_UP) as u64;
    }
    f
}

fn report(f: &Figures) {
    let us = |h: &Histogram<u64>, q: f64| h.value_at_quantile(q) as f64 / 1000.0;
    println!("requests per path: {}", f.direct.len());
    let mut paths = vec![
        ("direct to an engine", &f.direct),
        ("through kvroute serve", &f.serve),
        ("epp: body end -> pick", &f.pick),
        ("epp: body end -> body back", &f.body_back),
        ("floor: -> pick", &f.floor_pick),
        ("floor: -> body back", &f.floor_body_back),
        ("floor, own process: -> pick", &f.floor_process_pick),
        ("floor, own process: -> back", &f.floor_process_body_back),
        ("through the bare forwarder", &f.forwarder),
    ];
    if let (Some(p), Some(b)) = (&f.baseline_pick, &f.baseline_body_back) {
        paths.push(("baseline epp: -> pick", p));
        paths.push(("baseline epp: -> body back", b));
    }
    for (name, h) in paths {
        println!(
            "{name:<28}: median {:>8.1} µs  p99 {:>8.1} µs",
            us(h, 0.5),
            us(h, 0.99)
        );
    }
    let added = (
        us(&f.serve, 0.5) - us(&f.direct, 0.5),
        us(&f.serve, 0.99) - us(&f.direct, 0.99),
    );
    println!(
        "serve adds                  : median {:>8.1} µs  p99 {:>8.1} µs",
        added.0, added.1
    );
    println!(
        "epp's own work (pick less the floor's): median {:>8.1} µs  p99 {:>8.1} µs",
        us(&f.pick, 0.5) - us(&f.floor_pick, 0.5),
        us(&f.pick, 0.99) - us(&f.floor_pick, 0.99)
    );
    report_floors(f, added.0);
    let mut ratios = vec![
        ("pick", &f.pick),
        ("body back", &f.body_back),
        ("(floor) pick", &f.floor_pick),
    ];
    if let (Some(p), Some(b)) = (&f.baseline_pick, &f.baseline_body_back) {
        ratios.push(("(baseline) pick", p));
        ratios.push(("(baseline) body back", b));
    }
    for (name, h) in ratios {
        println!(
            "epp {name} / serve's added: {:.2}× (median), {:.2}× (p99)",
            us(h, 0.5) / added.0,
            us(h, 0.99) / added.1
        );
    }
}

/// The two faces against their floors, at the median: the forwarder's added latency is
/// `serve`'s floor, the null picker in its own process the pick's.
fn report_floors(f: &Figures, serve_added: f64) {
    let median = |h: &Histogram<u64>| h.value_at_quantile(0.5) as f64 / 1000.0;
    let forward_floor = median(&f.forwarder) - median(&f.direct);
    let exchange_floor = median(&f.floor_process_pick);
    println!("bare forwarder adds (median)          : {forward_floor:>8.1} µs");
    println!(
        "serve beyond its floor (median)       : {:>8.1} µs",
        serve_added - forward_floor
    );
    println!(
        "epp beyond its floor, own process     : {:>8.1} µs",
        median(&f.pick) - exchange_floor
    );
    println!(
        "exchange floor less forward floor     : {:>8.1} µs ({:.2}× serve's added)",
        exchange_floor - forward_floor,
        (exchange_floor - forward_floor) / serve_added
    );
}

fn main() {
    if bare_forwarder::serve_if_child() || null_picker::serve_if_child() {
        return;
    }
    let n: usize = std::env::var("KVROUTE_BENCH_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2000);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let dir = std::env::temp_dir().join(format!("kvroute-epp-decision-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    rt.block_on(async {
        let mut engines = Vec::new();
        for _ in 0..ENGINES {
            engines.push(serve_backend().await);
        }
        let (serve_process, serve) = start_serve(&dir, &engines);
        let own = Path::new(env!("CARGO_BIN_EXE_kvroute"));
        let (epp_process, grpc) = start_epp(own, &dir, &engines);
        let baseline = std::env::var_os("KVROUTE_BENCH_BASELINE")
            .map(|b| start_epp(Path::new(&b), &dir, &engines));
        let client: BenchClient = Client::builder(TokioExecutor::new()).build_http();
        let direct = format!("http://{}{PATH}", engines[0]);
        ready_http(&client, &serve).await;
        let gateway = ready_epp(grpc).await;
        let floor = ready_epp(null_picker::start(engines[0])).await;
        let (null_process, null_addr) = null_picker::start_process(engines[0]);
        let floor_own = ready_epp(null_addr).await;
        let (forwarder_process, forwarder_addr) = bare_forwarder::start(engines[0], true);
        let forwarder = format!("http://{forwarder_addr}{PATH}");
        ready_http(&client, &forwarder).await;
        let baseline_gateway = match &baseline {
            Some((_, addr)) => Some(ready_epp(*addr).await),
            None => None,
        };
        let pickers = Pickers {
            epp: &gateway,
            floor: &floor,
            floor_process: &floor_own,
            baseline: baseline_gateway.as_ref(),
        };
        let urls = Urls {
            direct: &direct,
            serve: &serve,
            forwarder: &forwarder,
        };
        let figures = run(&client, urls, pickers, n).await;
        report(&figures);
        drop((serve_process, epp_process, baseline));
        drop((null_process, forwarder_process));
    });
    let _ = std::fs::remove_dir_all(&dir);
}
