//! What router replicas reading a real vLLM's `/metrics` cost the engine: R replicas each
//! scraping every 100 ms (the live `[health] load_interval_ms` default), R = 1, 4, 8, against
//! one idle `vllm serve` (the CPU build of the real-vLLM stage). Printed per R: scrape latency
//! (p50, p99, max) and the CPU the engine's API server process (which answers `/metrics`) and
//! its whole process group used, as a share of one core, next to the same engine unscraped.
//!
//! A measurement, not a CI stage (its name does not match the `real_vllm` filter of
//! `.ci/run`): run it alone, under the machines' benchmark lock,
//! `flock /tmp/kvroute-bench.lock cargo test --test it engine_scrape_cost -- --ignored --nocapture --test-threads=1`.
//! It fails if a scrape fails or misses vLLM's load gauges.

use std::time::{Duration, Instant};

use crate::support::vllm::{VllmEngine, VllmOptions, VllmSetup};

/// How long each R is measured.
const WINDOW: Duration = Duration::from_secs(20);

/// Scrapes `url` every 100 ms from `replicas` clients (each its own keep-alive connection, as
/// each replica's poller has) for `WINDOW`; returns every scrape's latency in ms.
async fn scrape(url: &str, replicas: usize) -> Vec<f64> {
    let tasks: Vec<_> = (0..replicas)
        .map(|i| {
            let url = url.to_owned();
            tokio::spawn(async move {
                let client = reqwest::Client::new();
                // Replicas start their intervals at different instants.
                tokio::time::sleep(Duration::from_millis(100 * i as u64 / replicas as u64)).await;
                let mut tick = tokio::time::interval(Duration::from_millis(100));
                let end = Instant::now() + WINDOW;
                let mut ms = Vec::new();
                while Instant::now() < end {
                    tick.tick().await;
                    let t = Instant::now();
                    let r = client.get(&url).send().await.expect("scrape answers");
                    assert!(r.status().is_success(), "scrape: {}", r.status());
                    let text = r.text().await.expect("scrape body");
                    ms.push(t.elapsed().as_secs_f64() * 1e3);
                    assert!(
                        text.contains("vllm:num_requests_running")
                            && text.contains("vllm:num_requests_waiting"),
                        "vLLM's load gauges missing from /metrics"
                    );
                }
                ms
            })
        })
        .collect();
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.expect("scraper"));
    }
    all.sort_by(f64::total_cmp);
    all
}

fn pct(sorted: &[f64], q: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs real vLLM (scripts/real-engines/vllm-setup.sh) and a quiet machine: a measurement"]
async fn engine_scrape_cost_of_1_4_8_replicas_polling_vllm_metrics() {
    let setup = VllmSetup::locate();
    let options = VllmOptions {
        enforce_eager: true,
        ..VllmOptions::default()
    };
    let mut engines = VllmEngine::start_all(&setup, 1, &options).await;
    let e = &engines[0];
    let url = format!("{}/metrics", e.url());
    let bytes = e.metrics().await.len();
    // Let the start's work settle.
    tokio::time::sleep(Duration::from_secs(5)).await;
    println!("vLLM /metrics: {bytes} bytes");
    println!(
        "| replicas | scrapes/s | scrape p50 | p99 | max | API server CPU | engine (all processes) CPU |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|");
    for replicas in [0usize, 1, 4, 8] {
        let (leader0, group0) = e.cpu_seconds();
        let t = Instant::now();
        let ms = if replicas == 0 {
            tokio::time::sleep(WINDOW).await;
            Vec::new()
        } else {
            scrape(&url, replicas).await
        };
        let secs = t.elapsed().as_secs_f64();
        let (leader1, group1) = e.cpu_seconds();
        let (p50, p99, max) = if ms.is_empty() {
            (f64::NAN, f64::NAN, f64::NAN)
        } else {
            (pct(&ms, 0.5), pct(&ms, 0.99), ms[ms.len() - 1])
        };
        println!(
            "| {replicas} | {:.0} | {p50:.1} ms | {p99:.1} ms | {max:.1} ms | {:.1} % | {:.1} % |",
            ms.len() as f64 / secs,
            (leader1 - leader0) / secs * 100.0,
            (group1 - group0) / secs * 100.0,
        );
        if replicas > 0 {
            // 10 a second per replica, less what the start stagger and a slow scrape skip.
            assert!(ms.len() as f64 >= replicas as f64 * 10.0 * WINDOW.as_secs_f64() * 0.8);
        }
    }
    engines[0].stop();
}
