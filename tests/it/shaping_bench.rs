//! The measurements behind docs/benchmarks.md, "Traffic shaping" (issue 33): ignored, printed,
//! never asserted (timings belong in the document, not in tests). Run alone, under the bench
//! lock:
//!   flock /tmp/kvroute-bench.lock cargo test --test it shaping_bench -- --ignored --nocapture
//!
//! Two simulated engines (real time) behind a router with 8 slots (the capacity it is told the
//! fleet serves well). Client-side TTFT: send to the first body chunk of a stream.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kvroute::server::RouterHandle;
use serde_json::{Value, json};
use tokio::net::TcpListener;

use crate::support::SimEngine;

const MODEL: &str = "sim";
const SLOTS: usize = 8;

async fn engines() -> Vec<SimEngine> {
    let mut engines = Vec::new();
    for i in 0..2 {
        engines.push(SimEngine::start(MODEL, i, 1.0).await);
    }
    engines
}

/// A router over `engines` with 2 slots of headroom for `high`, `reserve` slots of fair
/// reserve, and placement isolation when `isolate`.
async fn start(engines: &[SimEngine], reserve: usize, isolate: bool) -> RouterHandle {
    let mut text = format!(
        "shutdown_grace_s = 1.0\n[limits]\nmax_concurrency = {SLOTS}\nmax_queue = 4096\n\
         queue_timeout_s = 300\n[priority]\nheadroom = 2\nfair_reserve = {reserve}\n\
         isolate = {isolate}\n"
    );
    for (name, extra) in [
        ("a", ""),
        ("b", ""),
        ("h", "max_priority = \"high\""),
        ("lim", "tokens_per_minute = 20000"),
    ] {
        text += &format!(
            "[[tenants]]\nname = \"{name}\"\napi_key_sha256 = \"{}\"\n{extra}\n",
            crate::support::sha256_hex(&format!("key-{name}"))
        );
    }
    let config = SimEngine::config_over(&text, engines, MODEL);
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    kvroute::server::start(&config, listener).expect("router")
}

/// The sum and count of `name{labels}` (a histogram) on the router's metrics page.
async fn histogram(router: &RouterHandle, name: &str, labels: &str) -> (f64, f64) {
    let page = crate::support::metrics_text(router.addr).await;
    let read = |suffix: &str| -> f64 {
        page.lines()
            .filter(|l| l.starts_with(&format!("{name}_{suffix}")) && l.contains(labels))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    };
    (read("sum"), read("count"))
}

/// Mean ms of a histogram between two readings.
fn mean_ms(before: (f64, f64), after: (f64, f64)) -> f64 {
    (after.0 - before.0) / (after.1 - before.1).max(1.0) * 1000.0
}

fn prompt(tag: &str) -> String {
    (0..64).map(|i| format!(" {tag}w{i}")).collect()
}

/// One streamed completion as `tenant`; its TTFT (to the first body chunk) when it succeeded.
async fn ttft(
    http: &reqwest::Client,
    url: &str,
    tenant: &str,
    priority: Option<&str>,
    tag: &str,
) -> Option<Duration> {
    let body = json!({"model": MODEL, "prompt": prompt(tag), "max_tokens": 32, "stream": true});
    let mut req = http
        .post(url)
        .bearer_auth(format!("key-{tenant}"))
        .json(&body);
    if let Some(p) = priority {
        req = req.header("x-kvroute-priority", p);
    }
    let sent = Instant::now();
    let mut resp = req.send().await.ok()?;
    if !resp.status().is_success() {
        return None;
    }
    let first = resp.chunk().await.ok()??;
    let at = sent.elapsed();
    drop(first);
    while resp.chunk().await.ok()?.is_some() {}
    Some(at)
}

fn p90(mut v: Vec<Duration>) -> f64 {
    v.sort();
    v.get((v.len() * 9).div_ceil(10).saturating_sub(1))
        .map_or(f64::NAN, |d| d.as_secs_f64() * 1000.0)
}

/// `tenant` sends at `rate` per second for `secs`; TTFTs of its successes.
async fn open_loop(
    url: &str,
    tenant: &'static str,
    priority: Option<&'static str>,
    rate: f64,
    secs: f64,
    tag: &str,
) -> Vec<Duration> {
    let http = reqwest::Client::new();
    let n = (rate * secs) as usize;
    let start = Instant::now();
    let mut tasks = Vec::new();
    for i in 0..n {
        let at = start + Duration::from_secs_f64(i as f64 / rate);
        tokio::time::sleep_until(at.into()).await;
        let (http, url, tag) = (http.clone(), url.to_owned(), format!("{tag}{i}"));
        tasks.push(tokio::spawn(async move {
            ttft(&http, &url, tenant, priority, &tag).await
        }));
    }
    let mut out = Vec::new();
    for t in tasks {
        if let Ok(Some(d)) = t.await {
            out.push(d);
        }
    }
    out
}

/// When each of the flood's requests was sent, and its TTFT.
type Served = Arc<Mutex<Vec<(Instant, Duration)>>>;

/// `loops` clients of tenant `a` sending back to back until `stop`; each success goes to
/// `served`.
fn flood(
    url: &str,
    loops: usize,
    stop: Arc<Mutex<bool>>,
    served: &Served,
) -> Vec<tokio::task::JoinHandle<()>> {
    (0..loops)
        .map(|c| {
            let (url, stop, served) = (url.to_owned(), Arc::clone(&stop), Arc::clone(served));
            tokio::spawn(async move {
                let http = reqwest::Client::new();
                let mut i = 0;
                while !*stop.lock().unwrap() {
                    let sent = Instant::now();
                    if let Some(t) = ttft(&http, &url, "a", None, &format!("flood{c}x{i}")).await {
                        served.lock().unwrap().push((sent, t));
                    }
                    i += 1;
                }
            })
        })
        .collect()
}

/// The flood's completions per second and TTFT p90 (ms) among its requests sent in
/// `[from, to)`.
fn flood_figures(served: &Served, from: Instant, to: Instant) -> (f64, f64) {
    let within: Vec<Duration> = served
        .lock()
        .unwrap()
        .iter()
        .filter(|(at, _)| *at >= from && *at < to)
        .map(|(_, t)| *t)
        .collect();
    let rate = within.len() as f64 / (to - from).as_secs_f64();
    (rate, p90(within))
}

/// One round on `router`: `b` and `high` alone, then under `a`'s flood; p90s, the means of
/// `high`'s router queue and of the routing decision while the flood runs, and the flood's own
/// completions per second and TTFT p90 while `b` and `high` run beside it.
async fn round(router: &RouterHandle, tag: &str) -> [f64; 8] {
    let url = format!("http://{}/v1/completions", router.addr);
    let (rate, secs) = (3.0, 20.0);
    let b_alone = p90(open_loop(&url, "b", None, rate, secs, &format!("ba{tag}")).await);
    let h_alone = p90(open_loop(&url, "h", Some("high"), rate, secs, &format!("ha{tag}")).await);
    // `a` keeps 40 requests in flight: 10 x its share (half of 8 slots).
    let stop = Arc::new(Mutex::new(false));
    let served = Served::default();
    let loops = flood(&url, 40, Arc::clone(&stop), &served);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let beside = Instant::now();
    let b_loaded = p90(open_loop(&url, "b", None, rate, secs, &format!("bl{tag}")).await);
    let queue = "band=\"high\"";
    let q0 = histogram(router, "kvroute_queue_seconds", queue).await;
    let d0 = histogram(router, "kvroute_routing_decision_seconds", "").await;
    let h_loaded = p90(open_loop(&url, "h", Some("high"), rate, secs, &format!("hl{tag}")).await);
    let q1 = histogram(router, "kvroute_queue_seconds", queue).await;
    let d1 = histogram(router, "kvroute_routing_decision_seconds", "").await;
    let (a_rate, a_p90) = flood_figures(&served, beside, Instant::now());
    *stop.lock().unwrap() = true;
    for l in loops {
        let _ = l.await;
    }
    [
        b_alone,
        b_loaded,
        h_alone,
        h_loaded,
        mean_ms(q0, q1),
        mean_ms(d0, d1),
        a_rate,
        a_p90,
    ]
}

/// The rounds' table: per round, reserve and isolation, [`round`]'s figures and the ratios.
fn print_rounds(rows: &[(usize, usize, bool, [f64; 8])]) {
    println!(
        "round | fair_reserve | isolate | b alone p90 ms | b with a at 10x share p90 ms | ratio | high alone p90 ms | high under flood p90 ms | ratio | high's mean router queue ms | mean decision ms | a completions/s | a TTFT p90 ms"
    );
    for (r, reserve, isolate, [ba, bl, ha, hl, q, d, ar, ap]) in rows {
        println!(
            "{r} | {reserve} | {isolate} | {ba:.0} | {bl:.0} | {:.2} | {ha:.0} | {hl:.0} | {:.2} | {q:.2} | {d:.2} | {ar:.1} | {ap:.0}",
            bl / ba,
            hl / ha
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement for docs/benchmarks.md: run under flock /tmp/kvroute-bench.lock"]
async fn shaping_bench() {
    let engines = engines().await;
    // Alternating: no fair reserve, a reserve of 2, a reserve of 2 with placement isolation;
    // twice (the machine is noisy).
    let mut rows = Vec::new();
    for r in 0..2 {
        for (reserve, isolate) in [(0, false), (2, false), (2, true)] {
            let router = start(&engines, reserve, isolate).await;
            let tag = format!("{r}r{reserve}i{isolate}");
            rows.push((r, reserve, isolate, round(&router, &tag).await));
            router.shutdown().await;
        }
    }
    print_rounds(&rows);
    let router = start(&engines, 0, false).await;
    let url = format!("http://{}/v1/completions", router.addr);
    // A 60 s token limit (20,000 tokens/min): 8 clients back to back for 65 s; the tokens of
    // every success (usage.total_tokens) by send time, the most in any 60 s window.
    let http = reqwest::Client::new();
    let start = Instant::now();
    let spent: Arc<Mutex<Vec<(f64, u64)>>> = Arc::default();
    let refused: Arc<Mutex<u64>> = Arc::default();
    let clients: Vec<_> = (0..8)
        .map(|c| {
            let (http, url, spent, refused) = (http.clone(), url.clone(), Arc::clone(&spent), Arc::clone(&refused));
            tokio::spawn(async move {
                let mut i = 0;
                while start.elapsed() < Duration::from_secs(65) {
                    let at = start.elapsed().as_secs_f64();
                    let body = json!({"model": MODEL, "prompt": prompt(&format!("lim{c}x{i}")), "max_tokens": 32});
                    i += 1;
                    let Ok(resp) = http.post(&url).bearer_auth("key-lim").json(&body).send().await else { continue };
                    if resp.status() == 429 {
                        *refused.lock().unwrap() += 1;
                        let wait: u64 = resp.headers().get("retry-after").and_then(|v| v.to_str().ok()?.parse().ok()).unwrap_or(1);
                        tokio::time::sleep(Duration::from_secs(wait.min(5))).await;
                        continue;
                    }
                    let v: Value = resp.json().await.unwrap_or_default();
                    if let Some(n) = v["usage"]["total_tokens"].as_u64() {
                        spent.lock().unwrap().push((at, n));
                    }
                }
            })
        })
        .collect();
    for c in clients {
        let _ = c.await;
    }
    let spent = spent.lock().unwrap().clone();
    let mut worst = 0;
    let mut t = 0.0;
    while t + 60.0 <= 65.0 {
        let w: u64 = spent
            .iter()
            .filter(|(at, _)| *at >= t && *at < t + 60.0)
            .map(|(_, n)| n)
            .sum();
        worst = worst.max(w);
        t += 0.1;
    }
    println!(
        "token limit 20000/min: most tokens in any 60 s window {worst} ({:+.2} % of the limit), {} successes, {} refused (429)",
        (worst as f64 / 20000.0 - 1.0) * 100.0,
        spent.len(),
        refused.lock().unwrap()
    );
    router.shutdown().await;
    for e in engines {
        let _ = e.handle.shutdown().await;
    }
}
