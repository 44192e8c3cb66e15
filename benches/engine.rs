//! How fast the simulated engine runs.
//!
//! - `core/*`: the pure model in virtual time, as `sim` drives it. Throughput is simulated
//!   requests per second of wall time (criterion's elements/s).
//! - `http/*`: the real-time face with a huge `--engine-speedup` (model time ≈ 0), so a round
//!   trip measures the overhead of HTTP, JSON, tokenization and the engine task.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test and bench code: a failed step should stop the run"
)]

use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use kvroute::engine::{EngineConfig, EngineCore, RequestId, ServeConfig, StepTiming, start};

/// Runs `n` requests arriving every `gap` seconds through one engine in virtual time;
/// `shared` of every prompt's 1,024 tokens are a common prefix.
fn simulate(n: u64, shared: usize, gap: f64) -> u64 {
    let mut e = EngineCore::new(EngineConfig {
        num_blocks: 8192,
        ..EngineConfig::default()
    })
    .expect("valid config");
    let mut now = 0.0;
    let mut next = 0u64;
    let mut finished = 0u64;
    while finished < n {
        while next < n && (next as f64) * gap <= now {
            let prompt: Vec<u32> = (0..1024u32)
                .map(|i| {
                    if (i as usize) < shared {
                        i
                    } else {
                        (next as u32).wrapping_mul(7919) ^ i
                    }
                })
                .collect();
            e.add_request(RequestId(next), prompt, 64, next as f64 * gap)
                .expect("fits");
            next += 1;
        }
        if e.has_work() {
            let out = e.step(now);
            finished += out.finished.len() as u64;
            now = out.end;
        } else {
            now = next as f64 * gap;
        }
    }
    e.counters().generated_tokens
}

fn core(c: &mut Criterion) {
    let mut g = c.benchmark_group("core");
    g.sample_size(10);
    let n = 1000;
    g.throughput(Throughput::Elements(n));
    // ~20 req/s offered load on one engine: a busy but stable replica.
    g.bench_function("1000req_1024in_64out_unique", |b| {
        b.iter(|| black_box(simulate(n, 0, 0.05)))
    });
    g.bench_function("1000req_1024in_64out_shared768", |b| {
        b.iter(|| black_box(simulate(n, 768, 0.05)))
    });
    g.finish();
}

fn http(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let (handle, url) = rt.block_on(async {
        let mut config = ServeConfig::new("bench");
        config.core.timing = StepTiming {
            speedup: 1e9,
            ..StepTiming::default()
        };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let h = start(config, listener).await.expect("start");
        let url = format!("http://{}/v1/completions", h.local_addr());
        (h, url)
    });
    let client = reqwest::Client::new();
    let body = serde_json::json!({
        "model": "bench",
        "prompt": "The quick brown fox jumps over the lazy dog. ".repeat(40),
        "max_tokens": 16,
    });
    let mut g = c.benchmark_group("http");
    g.throughput(Throughput::Elements(1));
    g.bench_function("completion_400tok_in_16_out", |b| {
        b.iter(|| {
            rt.block_on(async {
                let r = client.post(&url).json(&body).send().await.expect("send");
                black_box(r.bytes().await.expect("body"))
            })
        })
    });
    let stream_body = {
        let mut b = body.clone();
        b["stream"] = serde_json::Value::Bool(true);
        b
    };
    g.bench_function("stream_400tok_in_16_out", |b| {
        b.iter(|| {
            rt.block_on(async {
                let r = client
                    .post(&url)
                    .json(&stream_body)
                    .send()
                    .await
                    .expect("send");
                black_box(r.bytes().await.expect("body"))
            })
        })
    });
    g.finish();
    rt.block_on(handle.shutdown()).expect("shutdown");
}

criterion_group!(benches, core, http);
criterion_main!(benches);
