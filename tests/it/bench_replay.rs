//! The replay client against an in-test SSE backend on 127.0.0.1 with known delays:
//! latency bookkeeping (lower bounds only), usage and worker capture, error accounting,
//! the concurrency cap, and `kvroute bench` end to end (result files, compare).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{Response, StatusCode};
use axum::routing::post;
use clap::Parser;
use kvroute::bench::BenchCli;
use kvroute::bench::plan::{PlannedRequest, RequestShape, plan};
use kvroute::bench::replay::{ReplayConfig, completions_url, replay};
use kvroute::report::{Outcome, RunResult};
use kvroute::workload::synthesis::PromptSynth;
use kvroute::workload::trace::{Trace, TraceRequest};

/// How the backend answers.
#[derive(Clone)]
struct Behaviour {
    status: StatusCode,
    first_delay: Duration,
    chunks: usize,
    gap: Duration,
    cached_tokens: u32,
    worker: &'static str,
}

struct Backend {
    addr: SocketAddr,
    received: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Backend {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn completions(
    State((b, received)): State<(Behaviour, Arc<AtomicUsize>)>,
    body: Bytes,
) -> Response<Body> {
    received.fetch_add(1, Ordering::SeqCst);
    let v: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
    let prompt_len = v["prompt"].as_array().map_or(0, |a| a.len());
    if b.status != StatusCode::OK {
        return Response::builder()
            .status(b.status)
            .header("content-type", "application/json")
            .header("x-kvroute-worker", b.worker)
            .body(Body::from(
                r#"{"error":{"message":"backend exploded","type":"server_error"}}"#,
            ))
            .unwrap();
    }
    let worker = b.worker;
    let stream = futures_util::stream::unfold(0usize, move |i| {
        let b = b.clone();
        async move {
            if i > b.chunks + 1 {
                return None;
            }
            let text = if i == 0 {
                tokio::time::sleep(b.first_delay).await;
                "data: {\"choices\":[{\"index\":0,\"text\":\"t0\"}]}\n\n".to_string()
            } else if i < b.chunks {
                tokio::time::sleep(b.gap).await;
                format!("data: {{\"choices\":[{{\"index\":0,\"text\":\"t{i}\"}}]}}\n\n")
            } else if i == b.chunks {
                format!(
                    "data: {{\"choices\":[],\"usage\":{{\"prompt_tokens\":{prompt_len},\"completion_tokens\":{},\"prompt_tokens_details\":{{\"cached_tokens\":{}}}}}}}\n\n",
                    b.chunks, b.cached_tokens
                )
            } else {
                "data: [DONE]\n\n".to_string()
            };
            Some((Ok::<_, Infallible>(Bytes::from(text)), i + 1))
        }
    });
    Response::builder()
        .header("content-type", "text/event-stream")
        .header("x-kvroute-worker", worker)
        .body(Body::from_stream(stream))
        .unwrap()
}

async fn start_backend(b: Behaviour) -> Backend {
    let received = Arc::new(AtomicUsize::new(0));
    let app = Router::new()
        .route("/v1/completions", post(completions))
        .with_state((b, received.clone()));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Backend {
        addr,
        received,
        task,
    }
}

fn slow() -> Behaviour {
    Behaviour {
        status: StatusCode::OK,
        first_delay: Duration::from_millis(200),
        chunks: 6,
        gap: Duration::from_millis(50),
        cached_tokens: 64,
        worker: "w7",
    }
}

fn trace(n: usize, every_s: f64) -> Trace {
    Trace::new(
        (0..n)
            .map(|i| TraceRequest {
                arrival_s: i as f64 * every_s,
                input_tokens: 100,
                output_tokens: 6,
                hash_ids: vec![0, 1],
                block_tokens: 64,
                session: None,
            })
            .collect(),
    )
}

fn planned(t: &Trace) -> Vec<PlannedRequest> {
    let shape = RequestShape {
        model: "m".into(),
        force_output_length: true,
        text_prompt: false,
        no_usage: false,
    };
    plan(t, &PromptSynth::default(), &shape)
}

fn config(addr: SocketAddr) -> ReplayConfig {
    ReplayConfig {
        url: completions_url(&format!("http://{addr}")).unwrap(),
        concurrency_limit: 64,
        request_timeout: Duration::from_secs(20),
        progress: false,
    }
}

#[tokio::test]
async fn latencies_follow_known_delays() {
    let b = start_backend(slow()).await;
    let run = replay(planned(&trace(3, 0.1)), config(b.addr))
        .await
        .unwrap();
    assert_eq!(run.records.len(), 3);
    assert_eq!(b.received.load(Ordering::SeqCst), 3);
    for (i, r) in run.records.iter().enumerate() {
        assert_eq!(r.index, i);
        assert_eq!(r.outcome, Outcome::Ok, "{:?}", r.error);
        let ttft = r.ttft_s.unwrap();
        assert!(ttft >= 0.2, "ttft {ttft}");
        // First token after 200 ms, then 5 more every 50 ms.
        assert!(r.e2e_s >= 0.45, "e2e {}", r.e2e_s);
        assert!(r.e2e_s >= ttft);
        let itl = r.itl_mean_s.unwrap();
        assert!(itl >= 0.045, "itl {itl}");
        assert!(r.itl_p99_s.unwrap() >= itl);
        assert_eq!(r.completion_tokens, 6);
        assert_eq!(r.cached_tokens, Some(64));
        assert_eq!(r.prompt_tokens, 100);
        assert_eq!(r.worker.as_deref(), Some("w7"));
        // Sent no earlier than scheduled.
        assert!(r.start_s + 1e-3 >= r.scheduled_s);
    }
    assert!(run.records[2].start_s >= 0.2 - 1e-3);
    assert!(run.wall_s >= 0.65);
    assert_eq!(run.waited_for_slot, 0);
}

#[tokio::test]
async fn server_errors_are_counted_by_status() {
    let b = start_backend(Behaviour {
        status: StatusCode::INTERNAL_SERVER_ERROR,
        ..slow()
    })
    .await;
    let run = replay(planned(&trace(4, 0.0)), config(b.addr))
        .await
        .unwrap();
    assert_eq!(run.records.len(), 4);
    for r in &run.records {
        assert_eq!(r.outcome, Outcome::Http { status: 500 });
        assert!(r.error.as_deref().unwrap().contains("backend exploded"));
        assert_eq!(r.ttft_s, None);
    }
    let s = kvroute::report::Summary::from_records(&run.records, Default::default(), run.wall_s);
    assert_eq!((s.ok, s.errors), (0, 4));
    assert_eq!(s.errors_by_kind.get("http_500"), Some(&4));
    assert_eq!(s.slo_attainment, 0.0);
}

#[tokio::test]
async fn refused_connections_are_connect_errors() {
    // Bind then drop: nothing listens on the port any more.
    let addr = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let run = replay(planned(&trace(2, 0.0)), config(addr)).await.unwrap();
    assert!(run.records.iter().all(|r| r.outcome == Outcome::Connect));
}

#[tokio::test]
async fn timeouts_are_recorded() {
    let b = start_backend(Behaviour {
        first_delay: Duration::from_secs(30),
        ..slow()
    })
    .await;
    let mut c = config(b.addr);
    c.request_timeout = Duration::from_millis(300);
    let run = replay(planned(&trace(1, 0.0)), c).await.unwrap();
    assert_eq!(run.records[0].outcome, Outcome::Timeout);
    assert!(run.records[0].e2e_s >= 0.3);
}

#[tokio::test]
async fn concurrency_cap_delays_and_counts() {
    let b = start_backend(slow()).await;
    let mut c = config(b.addr);
    c.concurrency_limit = 1;
    // Three requests due at once, one slot: two wait for ~0.45 s each.
    let run = replay(planned(&trace(3, 0.0)), c).await.unwrap();
    assert_eq!(run.waited_for_slot, 2);
    assert_eq!(run.late_sends, 2);
    assert!(run.max_send_delay_s >= 0.9, "{}", run.max_send_delay_s);
    assert!(run.records.iter().all(|r| r.outcome.is_ok()));
    let starts: Vec<f64> = run.records.iter().map(|r| r.start_s).collect();
    assert!(
        starts[2] >= starts[1] + 0.45 && starts[1] >= starts[0] + 0.45,
        "{starts:?}"
    );
}

#[derive(Parser)]
struct TestCli {
    #[command(flatten)]
    bench: BenchCli,
}

#[tokio::test]
async fn bench_command_writes_results_and_compares() {
    let b = start_backend(Behaviour {
        first_delay: Duration::from_millis(20),
        gap: Duration::from_millis(5),
        ..slow()
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let out_a = dir.path().join("a.json");
    let target = format!("http://{}", b.addr);
    let args = [
        "kvroute-bench",
        "--target",
        &target,
        "--model",
        "m",
        "--synthetic",
        "shared-prefix",
        "--requests",
        "20",
        "--rate",
        "200",
        "--input-tokens",
        "50",
        "--output-tokens",
        "6",
        "--prefix-tokens",
        "128",
        "--slo-ttft",
        "10",
        "--slo-e2e",
        "10",
        "--no-progress",
        "--out",
    ];
    let mut a: Vec<&str> = args.to_vec();
    let out_a_s = out_a.display().to_string();
    a.push(&out_a_s);
    kvroute::bench::run(TestCli::parse_from(&a).bench)
        .await
        .unwrap();
    assert_eq!(b.received.load(Ordering::SeqCst), 20);
    let result = RunResult::read_json(&out_a).unwrap();
    assert_eq!(result.name, "a");
    assert_eq!(result.summary.requests, 20);
    assert_eq!(result.summary.ok, 20);
    assert_eq!(result.summary.slo_attainment, 1.0);
    assert_eq!(result.summary.per_worker.get("w7"), Some(&20));
    assert!(result.summary.goodput_rps > 0.0);
    for f in ["a.md", "a-ttft-cdf.svg", "a-load.svg"] {
        let p = dir.path().join(f);
        let text = std::fs::read_to_string(&p).unwrap();
        assert!(!text.is_empty(), "{f}");
    }

    // A second run with another name, then compare both.
    let out_b = dir.path().join("b.json");
    let out_b_s = out_b.display().to_string();
    let mut bargs = args.to_vec();
    bargs.push(&out_b_s);
    bargs.extend(["--name", "second", "--seed", "3"]);
    kvroute::bench::run(TestCli::parse_from(&bargs).bench)
        .await
        .unwrap();
    let svg = dir.path().join("cmp.svg");
    let svg_s = svg.display().to_string();
    let cli = TestCli::parse_from([
        "kvroute-bench",
        "compare",
        &out_a_s,
        &out_b_s,
        "--plot",
        &svg_s,
    ]);
    kvroute::bench::run(cli.bench).await.unwrap();
    let chart = std::fs::read_to_string(&svg).unwrap();
    // plotters writes each label on its own line inside <text>.
    assert!(chart.contains("\na\n</text>"));
    assert!(chart.contains("\nsecond\n</text>"));
}

#[tokio::test]
async fn bench_command_rejects_missing_workload_and_target() {
    let no_target = TestCli::parse_from(["x", "--synthetic", "unique"]);
    let e = kvroute::bench::run(no_target.bench).await.unwrap_err();
    assert!(e.to_string().contains("--target"), "{e}");
    let no_workload = TestCli::parse_from(["x", "--target", "http://127.0.0.1:1"]);
    let e = kvroute::bench::run(no_workload.bench).await.unwrap_err();
    assert!(e.to_string().contains("--trace"), "{e}");
    assert!(TestCli::try_parse_from(["x", "--window", "5:1"]).is_err());
    assert!(TestCli::try_parse_from(["x", "--trace", "a", "--synthetic", "unique"]).is_err());
}
