//! The replay client's own cost, against an in-process SSE server that answers at once.
//!
//! A measurement, not an assertion (timing depends on the machine): run it with
//!
//! ```text
//! cargo test --release --test it bench_overhead -- --ignored --nocapture
//! ```
//!
//! and read the printed achieved rate, late sends and client CPU per request. The only
//! assertions are that every request was answered and CPU was measured.

use std::convert::Infallible;
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::http::Response;
use axum::routing::post;
use kvroute::bench::plan::{RequestShape, plan};
use kvroute::bench::replay::{ReplayConfig, completions_url, replay};
use kvroute::workload::synthesis::PromptSynth;
use kvroute::workload::synthetic::{SyntheticKind, SyntheticSpec};

/// Output tokens per request, each its own SSE event, 1 ms apart.
const TOKENS: usize = 16;

async fn instant_stream(_body: Bytes) -> Response<Body> {
    let stream = futures_util::stream::unfold(0usize, |i| async move {
        let text = match i {
            i if i < TOKENS => {
                if i > 0 {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
                format!(
                    "data: {{\"id\":\"c\",\"object\":\"text_completion\",\"choices\":[{{\"index\":0,\"text\":\" tok{i}\",\"logprobs\":null,\"finish_reason\":null}}]}}\n\n"
                )
            }
            i if i == TOKENS => format!(
                "data: {{\"choices\":[],\"usage\":{{\"prompt_tokens\":256,\"completion_tokens\":{TOKENS},\"prompt_tokens_details\":{{\"cached_tokens\":0}}}}}}\n\ndata: [DONE]\n\n"
            ),
            _ => return None,
        };
        Some((Ok::<_, Infallible>(Bytes::from(text)), i + 1))
    });
    Response::builder()
        .header("content-type", "text/event-stream")
        .header("x-kvroute-worker", "w0")
        .body(Body::from_stream(stream))
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
#[ignore = "measurement; run with --release --ignored --nocapture"]
async fn client_overhead() {
    let app = Router::new().route("/v1/completions", post(instant_stream));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });

    // Overridable to probe headroom: BENCH_OVERHEAD_RATE=1000 BENCH_OVERHEAD_REQUESTS=5000.
    let env = |k: &str, d: f64| {
        std::env::var(k)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(d)
    };
    let rate = env("BENCH_OVERHEAD_RATE", 300.0);
    let requests = env("BENCH_OVERHEAD_REQUESTS", 1_500.0) as usize;
    let trace = SyntheticSpec {
        kind: SyntheticKind::Unique,
        requests,
        rate,
        input_tokens: 256,
        output_tokens: TOKENS as u32,
        block_tokens: 64,
        seed: 1,
    }
    .generate()
    .unwrap();
    let shape = RequestShape {
        model: "m".into(),
        force_output_length: true,
        text_prompt: false,
        no_usage: false,
    };
    let planned = plan(&trace, &PromptSynth::default(), &shape);
    let config = ReplayConfig {
        url: completions_url(&format!("http://{addr}")).unwrap(),
        concurrency_limit: 1024,
        request_timeout: Duration::from_secs(30),
        progress: false,
    };
    let run = replay(planned, config).await.unwrap();
    server.abort();

    let ok = run.records.iter().filter(|r| r.outcome.is_ok()).count();
    let last_start = run.records.iter().map(|r| r.start_s).fold(0.0, f64::max);
    let cpu = run.client_cpu_s.unwrap_or(f64::NAN);
    let events = (requests * (TOKENS + 2)) as f64;
    println!(
        "client overhead: {requests} streaming requests ({TOKENS} token events each) offered at {rate} req/s\n  \
         achieved send rate {:.1} req/s, {ok} ok, late sends (>10 ms) {}, max send delay {:.1} ms\n  \
         client thread CPU {:.3} s over {:.2} s wall = {:.1} % of one core\n  \
         {:.1} µs CPU per request, {:.2} µs per SSE event",
        requests as f64 / last_start.max(1e-9),
        run.late_sends,
        run.max_send_delay_s * 1e3,
        cpu,
        run.wall_s,
        cpu / run.wall_s * 100.0,
        cpu * 1e6 / requests as f64,
        cpu * 1e6 / events,
    );
    assert_eq!(ok, requests);
    assert!(run.client_cpu_s.is_some() || !cfg!(target_os = "linux"));
}
