//! Where a protected request's TTFT goes at saturation when the router is not in the way:
//! the same streamed prompt sent straight to one simulated engine (no router), alone and while
//! the engine already runs other requests. Ignored, printed, never asserted; run alone under
//! the bench lock:
//!   flock /tmp/kvroute-bench.lock cargo test --test it shaping_floor -- --ignored --nocapture
//!
//! Two kinds of background: `closed` clients sending 32-token completions back to back (what
//! the flood of `shaping_bench` puts on each engine: new prefills keep joining the batch), and
//! `decode` streams of 4,000 tokens started first (only decodes in the batch).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde_json::json;

use crate::support::SimEngine;

const MODEL: &str = "sim";

fn prompt(tag: &str) -> String {
    (0..64).map(|i| format!(" {tag}w{i}")).collect()
}

/// One streamed completion; the time to its first body chunk.
async fn ttft(http: &reqwest::Client, url: &str, tag: &str, max_tokens: u32) -> Option<Duration> {
    let body =
        json!({"model": MODEL, "prompt": prompt(tag), "max_tokens": max_tokens, "stream": true});
    let sent = Instant::now();
    let mut resp = http.post(url).json(&body).send().await.ok()?;
    if !resp.status().is_success() {
        return None;
    }
    resp.chunk().await.ok()??;
    let at = sent.elapsed();
    while resp.chunk().await.ok()?.is_some() {}
    Some(at)
}

fn p90_ms(mut v: Vec<Duration>) -> f64 {
    v.sort();
    v.get((v.len() * 9).div_ceil(10).saturating_sub(1))
        .map_or(f64::NAN, |d| d.as_secs_f64() * 1000.0)
}

/// Probes one at a time, 3 per second for 15 s.
async fn probe(url: &str, tag: &str) -> f64 {
    let http = reqwest::Client::new();
    let mut out = Vec::new();
    for i in 0..45 {
        let next = Instant::now() + Duration::from_millis(333);
        if let Some(d) = ttft(&http, url, &format!("{tag}p{i}"), 32).await {
            out.push(d);
        }
        tokio::time::sleep_until(next.into()).await;
    }
    p90_ms(out)
}

/// `n` background clients until `stop`: each sends `max_tokens`-token completions back to
/// back.
fn background(
    url: &str,
    n: usize,
    max_tokens: u32,
    tag: &str,
    stop: &Arc<AtomicBool>,
) -> Vec<tokio::task::JoinHandle<()>> {
    (0..n)
        .map(|c| {
            let (url, stop, tag) = (url.to_owned(), Arc::clone(stop), format!("{tag}c{c}"));
            tokio::spawn(async move {
                let http = reqwest::Client::new();
                let mut i = 0;
                while !stop.load(Ordering::Relaxed) {
                    let _ = ttft(&http, &url, &format!("{tag}x{i}"), max_tokens).await;
                    i += 1;
                }
            })
        })
        .collect()
}

async fn under(url: &str, n: usize, max_tokens: u32, tag: &str) -> f64 {
    let stop = Arc::new(AtomicBool::new(false));
    let tasks = background(url, n, max_tokens, tag, &stop);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let p = probe(url, tag).await;
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.abort();
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    p
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement for docs/benchmarks.md: run under flock /tmp/kvroute-bench.lock"]
async fn shaping_floor() {
    let engine = SimEngine::start(MODEL, 0, 1.0).await;
    let url = format!("http://{}/v1/completions", engine.addr);
    println!("round | background | probe TTFT p90 ms | ratio to alone");
    for round in 0..2 {
        let alone = probe(&url, &format!("r{round}alone")).await;
        println!("{round} | none | {alone:.1} | 1.00");
        for n in [1, 2, 4] {
            let p = under(&url, n, 32, &format!("r{round}closed{n}")).await;
            println!(
                "{round} | {n} closed-loop clients, 32 tokens | {p:.1} | {:.2}",
                p / alone
            );
        }
        for n in [1, 4] {
            let p = under(&url, n, 4000, &format!("r{round}decode{n}")).await;
            println!(
                "{round} | {n} decode streams, 4000 tokens | {p:.1} | {:.2}",
                p / alone
            );
        }
    }
    let _ = engine.handle.shutdown().await;
}
