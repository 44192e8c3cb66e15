//! Added latency of the router: the same small request sent N times sequentially, directly to a
//! backend and through each router in front of it (one run, same machine, same client, rounds
//! alternating so drift on a shared machine hits every path alike), median and p99.
//!
//! Paths: kvroute in this process (`least_request`), `kvroute serve` processes with a load-only
//! policy and with its default (`kv_aware`: the request is tokenized, hashed and looked up), one
//! serving the model disaggregated (a prefill and a decode worker on two listeners of the same
//! backend: two upstream requests, vLLM's hand-off), and — when
//! `KVROUTE_BENCH_SGLANG_ROUTER` names a Python with the `sglang-router` package
//! (`scripts/peer-routers-setup.sh` installs one) — the SGLang router (`cache_aware`) as a peer.
//! The two processes are compared like for like: a separate process each, one worker behind.
//! `KVROUTE_BENCH_BASELINE` may name another `kvroute` binary (say, one built from main), run as
//! three more processes (`kv_aware`, `least_request` and P/D), so a change is measured against what it
//! changes in one run.
//!
//! A bare hyper forwarder (this bench re-run as a child process that forwards without deciding
//! anything) gives the floor every router process pays on this machine, so each router's own
//! cost is what it adds beyond that floor.
//!
//! Run: `cargo bench --bench proxy_overhead` (N defaults to 2,000 per path; set
//! `KVROUTE_BENCH_N`).
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
use hdrhistogram::Histogram;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use kvroute::config::Config;
use tokio::net::TcpListener;

#[path = "common/bare_forwarder.rs"]
mod bare_forwarder;
#[path = "common/fake_backend.rs"]
mod fake_backend;

use fake_backend::{Process, free_addr, serve_backend, spawn_quiet};

const BODY: &str = r#"{"model":"m","prompt":"Say hello","max_tokens":1}"#;
const KV_AWARE: &str = "kvroute serve (kv_aware)";
const FLOOR: &str = "bare hyper forwarder";
/// The forwarder reading the whole body before it forwards (see [`bare_forwarder`]).
const FLOOR_READ: &str = "bare forwarder, body read first";
const BASELINE: &str = "baseline serve (kv_aware)";
const BASELINE_LOAD: &str = "baseline serve (least_request)";
/// A disaggregated model: a prefill worker, then a decode worker (two upstream requests).
const PD: &str = "kvroute serve (kv_aware, P/D)";
const BASELINE_PD: &str = "baseline serve (kv_aware, P/D)";
const SGLANG: &str = "sglang-router (cache_aware)";

/// Rounds per path; each round sends `n / ROUNDS` requests after 100 warm-up ones.
const ROUNDS: usize = 10;

type BenchClient = Client<HttpConnector, Full<Bytes>>;

async fn measure(client: &BenchClient, url: &str, n: usize) -> Histogram<u64> {
    let mut h = Histogram::<u64>::new(3).expect("histogram");
    for i in 0..n + 100 {
        let req = http::Request::post(url)
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from_static(BODY.as_bytes())))
            .expect("request");
        let t = Instant::now();
        let resp = client.request(req).await.expect("response");
        let status = resp.status();
        let body = resp.into_body().collect().await.expect("body").to_bytes();
        let us = t.elapsed().as_nanos() as u64;
        assert!(
            status.is_success() && !body.is_empty(),
            "{url}: {status} {body:?}"
        );
        // The first 100 warm up connections and caches.
        if i >= 100 {
            h.record(us).expect("record");
        }
    }
    h
}

/// Waits until `url` answers a completion, so no path is measured while still starting.
async fn wait_serving(client: &BenchClient, url: &str) {
    for _ in 0..600 {
        let req = http::Request::post(url)
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from_static(BODY.as_bytes())))
            .expect("request");
        if let Ok(r) = client.request(req).await
            && r.status().is_success()
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{url} never answered");
}

fn kvroute_process(
    binary: &Path,
    backend: SocketAddr,
    dir: &Path,
    policy: &str,
) -> (Process, String) {
    let workers =
        format!("[[workers]]\nid = \"b\"\nurl = \"http://{backend}\"\nmodels = [\"m\"]\n");
    kvroute_over(binary, &workers, dir, policy)
}

/// `kvroute serve` with a prefill worker on `prefill` and a decode worker on `decode` (vLLM's
/// hand-off: the prefill's answer, then the decode's).
fn kvroute_pd_process(
    binary: &Path,
    (prefill, decode): (SocketAddr, SocketAddr),
    dir: &Path,
) -> (Process, String) {
    let worker = |id: &str, addr: SocketAddr, role: &str| {
        format!(
            "[[workers]]\nid = \"{id}\"\nurl = \"http://{addr}\"\nmodels = [\"m\"]\nrole = \"{role}\"\n"
        )
    };
    let workers = worker("p", prefill, "prefill") + &worker("d", decode, "decode");
    kvroute_over(binary, &workers, dir, "kv_aware")
}

/// `kvroute serve` (`binary`) over `workers` (their TOML) with `policy`.
fn kvroute_over(binary: &Path, workers: &str, dir: &Path, policy: &str) -> (Process, String) {
    let addr = free_addr();
    let file = dir.join(format!("kvroute-{policy}-{}.toml", addr.port()));
    let text = format!("listen = \"{addr}\"\npolicy = \"{policy}\"\n{workers}");
    std::fs::write(&file, text).expect("config");
    let child = spawn_quiet(
        Command::new(binary)
            .arg("serve")
            .arg("--config")
            .arg(&file)
            .env("RUST_LOG", "warn"),
        "kvroute serve",
    );
    (child, format!("http://{addr}/v1/completions"))
}

fn sglang_router(python: &str, backend: SocketAddr) -> (Process, String) {
    let addr = free_addr();
    let child = spawn_quiet(
        Command::new(python)
            .args(["-m", "sglang_router.launch_router", "--host", "127.0.0.1"])
            .args(["--port", &addr.port().to_string()])
            .args(["--worker-urls", &format!("http://{backend}")])
            .args(["--policy", "cache_aware", "--log-level", "warn"]),
        "sglang router",
    );
    (child, format!("http://{addr}/v1/completions"))
}

fn main() {
    if bare_forwarder::serve_if_child() {
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
    let dir = std::env::temp_dir().join(format!("kvroute-proxy-overhead-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    rt.block_on(async {
        let backend_addr = serve_backend().await;
        // A second fake engine: the decode worker of the P/D path.
        let second_addr = serve_backend().await;

        let text = format!(
            "policy = \"least_request\"\n[[workers]]\nid = \"b\"\nurl = \"http://{backend_addr}\"\nmodels = [\"m\"]\n"
        );
        let config = Config::from_toml(&text, Path::new("bench")).expect("config");
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let router = kvroute::server::start(&config, listener).expect("router");

        let client: BenchClient = Client::builder(TokioExecutor::new()).build_http();
        let mut paths: Vec<(&str, String)> = vec![
            ("direct", format!("http://{backend_addr}/v1/completions")),
            (
                "kvroute in-process (least_request)",
                format!("http://{}/v1/completions", router.addr),
            ),
        ];
        let mut processes = Vec::new();
        let (p, addr) = bare_forwarder::start(backend_addr, false);
        let url = format!("http://{addr}/v1/completions");
        processes.push(p);
        paths.push((FLOOR, url));
        let (p, addr) = bare_forwarder::start(backend_addr, true);
        let url = format!("http://{addr}/v1/completions");
        processes.push(p);
        paths.push((FLOOR_READ, url));
        let this = Path::new(env!("CARGO_BIN_EXE_kvroute"));
        let (p, url) = kvroute_process(this, backend_addr, &dir, "least_request");
        processes.push(p);
        paths.push(("kvroute serve (least_request)", url));
        let (p, url) = kvroute_process(this, backend_addr, &dir, "kv_aware");
        processes.push(p);
        paths.push((KV_AWARE, url));
        let (p, url) = kvroute_pd_process(this, (backend_addr, second_addr), &dir);
        processes.push(p);
        paths.push((PD, url));
        if let Ok(baseline) = std::env::var("KVROUTE_BENCH_BASELINE") {
            let baseline = Path::new(&baseline);
            let (p, url) = kvroute_process(baseline, backend_addr, &dir, "kv_aware");
            processes.push(p);
            paths.push((BASELINE, url));
            let (p, url) = kvroute_process(baseline, backend_addr, &dir, "least_request");
            processes.push(p);
            paths.push((BASELINE_LOAD, url));
            let (p, url) = kvroute_pd_process(baseline, (backend_addr, second_addr), &dir);
            processes.push(p);
            paths.push((BASELINE_PD, url));
        }
        if let Ok(python) = std::env::var("KVROUTE_BENCH_SGLANG_ROUTER") {
            let (p, url) = sglang_router(&python, backend_addr);
            processes.push(p);
            paths.push((SGLANG, url));
        }
        for (_, url) in &paths {
            wait_serving(&client, url).await;
        }

        let mut hists: Vec<Histogram<u64>> = paths
            .iter()
            .map(|_| Histogram::<u64>::new(3).expect("histogram"))
            .collect();
        for _ in 0..ROUNDS {
            for (i, (_, url)) in paths.iter().enumerate() {
                hists[i]
                    .add(measure(&client, url, n / ROUNDS).await)
                    .expect("add");
            }
        }
        let us = |h: &Histogram<u64>, q: f64| h.value_at_quantile(q) as f64 / 1000.0;
        println!("requests per path: {}", hists[0].len());
        for ((name, _), h) in paths.iter().zip(&hists) {
            println!(
                "{name:<36}: median {:>8.1} µs  p99 {:>8.1} µs",
                us(h, 0.5),
                us(h, 0.99)
            );
        }
        let direct = &hists[0];
        let added: Vec<(f64, f64)> = hists
            .iter()
            .map(|h| (us(h, 0.5) - us(direct, 0.5), us(h, 0.99) - us(direct, 0.99)))
            .collect();
        for ((name, _), (m, p)) in paths.iter().zip(&added).skip(1) {
            println!("added by {name:<27}: median {m:>8.1} µs  p99 {p:>8.1} µs");
        }
        let added_by = |name: &str| {
            paths
                .iter()
                .position(|(n, _)| *n == name)
                .map(|i| added[i])
        };
        if let Some((sg_m, sg_p)) = added_by(SGLANG) {
            for name in [FLOOR, KV_AWARE, BASELINE] {
                if let Some((m, p)) = added_by(name) {
                    println!(
                        "{name} adds {:.2}× what sglang-router adds (median), {:.2}× (p99)",
                        m / sg_m,
                        p / sg_p
                    );
                }
            }
        }
        if let Some((f_m, f_p)) = added_by(FLOOR) {
            for name in [FLOOR_READ, KV_AWARE, BASELINE, PD, BASELINE_PD, SGLANG] {
                if let Some((m, p)) = added_by(name) {
                    println!(
                        "{name} adds {:.1} µs (median), {:.1} µs (p99) beyond the bare forwarder: {:.2}× / {:.2}× what it adds",
                        m - f_m,
                        p - f_p,
                        m / f_m,
                        p / f_p,
                    );
                }
            }
        }
        drop(processes);
        router.shutdown().await;
    });
    let _ = std::fs::remove_dir_all(&dir);
}
