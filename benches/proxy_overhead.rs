//! Added latency of the router: the same small request sent N times sequentially, directly to a
//! backend and through kvroute (one run, same machine, same client), median and p99.
//!
//! Run: `cargo bench --bench proxy_overhead` (N defaults to 2,000; set `KVROUTE_BENCH_N`).

use std::path::Path;
use std::time::Instant;

use axum::Router;
use axum::routing::post;
use bytes::Bytes;
use hdrhistogram::Histogram;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use kvroute::config::Config;
use tokio::net::TcpListener;

const BODY: &str = r#"{"model":"m","prompt":"Say hello","max_tokens":1}"#;
const ANSWER: &str = r#"{"id":"c","object":"text_completion","choices":[{"index":0,"text":"hi","finish_reason":"length"}],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}"#;

async fn measure(url: &str, n: usize) -> Histogram<u64> {
    let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
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

fn main() {
    let n: usize = std::env::var("KVROUTE_BENCH_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2000);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let backend = Router::new()
            .route(
                "/v1/completions",
                post(|| async { ([("content-type", "application/json")], ANSWER) }),
            )
            .route("/health", axum::routing::get(|| async { "ok" }));
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let backend_addr = listener.local_addr().expect("addr");
        tokio::spawn(async move { axum::serve(listener, backend).await });

        let text = format!(
            "policy = \"least_request\"\n[[workers]]\nid = \"b\"\nurl = \"http://{backend_addr}\"\nmodels = [\"m\"]\n"
        );
        let config = Config::from_toml(&text, Path::new("bench")).expect("config");
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let router = kvroute::server::start(&config, listener).expect("router");

        let direct_url = format!("http://{backend_addr}/v1/completions");
        let routed_url = format!("http://{}/v1/completions", router.addr);
        // Interleave two rounds each so drift on a shared machine hits both sides alike.
        let mut direct = Histogram::<u64>::new(3).expect("histogram");
        let mut routed = Histogram::<u64>::new(3).expect("histogram");
        for _ in 0..2 {
            direct.add(measure(&direct_url, n / 2).await).expect("add");
            routed.add(measure(&routed_url, n / 2).await).expect("add");
        }
        let us = |h: &Histogram<u64>, q: f64| h.value_at_quantile(q) as f64 / 1000.0;
        println!("requests per path: {}", direct.len());
        println!(
            "direct : median {:>8.1} µs  p99 {:>8.1} µs",
            us(&direct, 0.5),
            us(&direct, 0.99)
        );
        println!(
            "routed : median {:>8.1} µs  p99 {:>8.1} µs",
            us(&routed, 0.5),
            us(&routed, 0.99)
        );
        println!(
            "added  : median {:>8.1} µs  p99 {:>8.1} µs",
            us(&routed, 0.5) - us(&direct, 0.5),
            us(&routed, 0.99) - us(&direct, 0.99)
        );
        router.shutdown().await;
    });
}
