//! What the router's observer spends on each chunk of a streamed answer reading it as it passes:
//! `proxy::usage` (the engine's reported usage, looked for in every response) and
//! `proxy::stream_events` (the stream's events, an answer's length when no usage is reported),
//! over a vLLM-shaped completion stream of 1,000 tokens, one event per chunk.
//!
//! `cargo bench --bench stream_scan`
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test and bench code: a failed step should stop the run"
)]

use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use kvroute::proxy::stream_events::StreamEvents;
use kvroute::proxy::usage::UsageScan;

/// A vLLM completion stream's chunks: 1,000 token events, then `[DONE]`.
fn chunks() -> Vec<Vec<u8>> {
    let mut out: Vec<Vec<u8>> = (0..1000)
        .map(|i| {
            format!(
                "data: {{\"id\":\"cmpl-0123456789abcdef\",\"object\":\"text_completion\",\
                 \"created\":1796647957,\"model\":\"Qwen/Qwen3-0.6B\",\"choices\":[{{\"index\":0,\
                 \"text\":\" word{i}\",\"logprobs\":null,\"finish_reason\":null,\
                 \"stop_reason\":null}}]}}\n\n"
            )
            .into_bytes()
        })
        .collect();
    out.push(b"data: [DONE]\n\n".to_vec());
    out
}

fn bench(c: &mut Criterion) {
    let stream = chunks();
    let mut g = c.benchmark_group("stream_scan");
    g.throughput(Throughput::Elements(stream.len() as u64));
    g.bench_function("usage", |b| {
        b.iter(|| {
            let mut s = UsageScan::new();
            stream.iter().for_each(|c| s.feed(black_box(c)));
            black_box(s.usage())
        })
    });
    g.bench_function("events", |b| {
        b.iter(|| {
            let mut s = StreamEvents::new();
            stream.iter().for_each(|c| s.feed(black_box(c)));
            assert_eq!(s.count(), 1000);
            black_box(s.count())
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
