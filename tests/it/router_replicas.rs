//! Two router replicas in front of the same simulated engines (real HTTP, real KV events over
//! ZeroMQ), a client alternating between them, as behind a Kubernetes Service:
//!
//! - prefix groups concentrate exactly as with one router (both replicas subscribe to every
//!   engine's events, so both indexes hold the same blocks);
//! - concurrent requests stay balanced as with one router, because each replica reads every
//!   engine's own load (`[health] load_interval_ms`) and adds the other replica's requests to
//!   its own. The control shows what the reading buys: with it off, two replicas with the same
//!   configuration (hence the same tie-breaking stream) stack their first requests on the
//!   same engine.
//!
//! Counts only, never timings: between two requests the test waits (a condition, not a
//! duration) until the next replica can know what was sent before.

use std::time::Duration;

use kvroute::server::RouterHandle;
use serde_json::json;
use tokio::net::TcpListener;

use crate::support::{self, SimEngine};

const MODEL: &str = "sim";
const ENGINES: usize = 4;

struct Replicas {
    routers: Vec<RouterHandle>,
    engines: Vec<SimEngine>,
    http: reqwest::Client,
}

impl Replicas {
    /// `routers` replicas with the same configuration over `ENGINES` engines; engine load is
    /// read every `load_interval_ms` (0: never).
    async fn start(routers: usize, load_interval_ms: u64, speedup: f64) -> Replicas {
        let mut engines = Vec::new();
        for i in 0..ENGINES {
            engines.push(SimEngine::start(MODEL, i as u64, speedup).await);
        }
        let text = format!(
            "policy = \"kv_aware\"\nshutdown_grace_s = 0.5\n[health]\ninterval_s = 0.2\nload_interval_ms = {load_interval_ms}\n[[models]]\nname = \"{MODEL}\"\nblock_size = 16\n[kv_aware]\ncalibrate = false\n"
        );
        let config = SimEngine::config_over(&text, &engines, MODEL);
        let mut handles = Vec::new();
        for _ in 0..routers {
            let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
            handles.push(kvroute::server::start(&config, listener).unwrap());
        }
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(60))
            .build()
            .unwrap();
        let r = Replicas {
            routers: handles,
            engines,
            http,
        };
        for router in &r.routers {
            let fleet = &router.state.fleet;
            assert!(
                support::wait_for(Duration::from_secs(20), || fleet
                    .workers()
                    .iter()
                    .all(|w| w.is_healthy() && !w.is_kv_warming()))
                .await
            );
        }
        r
    }

    fn url(&self, router: usize, path: &str) -> String {
        format!("http://{}{path}", self.routers[router].addr)
    }

    /// Sends a completion through `router`; returns the response (its body unread) and the
    /// worker that serves it.
    async fn send(
        &self,
        router: usize,
        prompt: &str,
        max_tokens: u32,
        stream: bool,
    ) -> (reqwest::Response, usize) {
        let resp = self
            .http
            .post(self.url(router, "/v1/completions"))
            .json(&json!({"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "stream": stream}))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        let worker = resp.headers()["x-kvroute-worker"]
            .to_str()
            .unwrap()
            .trim_start_matches('e')
            .parse()
            .unwrap();
        (resp, worker)
    }

    /// Requests in flight on all workers as `router` weighs them (its own plus, from engine
    /// readings, the other replica's).
    fn seen_in_flight(&self, router: usize) -> u64 {
        support::in_flight_seen(&self.routers[router])
    }

    /// Overlap blocks `router`'s index reports for `worker` on `prompt`.
    async fn overlap(&self, router: usize, prompt: &str, worker: usize) -> u64 {
        let body = json!({"model": MODEL, "prompt": prompt});
        let v = support::post_json(&self.url(router, "/debug/route"), &body).await;
        v["candidates"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["worker"] == format!("e{worker}"))
            .map(|c| c["overlap_blocks"].as_u64().unwrap())
            .unwrap_or(0)
    }

    async fn shutdown(mut self) {
        for r in self.routers.drain(..) {
            r.shutdown().await;
        }
        for e in self.engines.drain(..) {
            let _ = e.handle.shutdown().await;
        }
    }
}

/// Words enough for `tokens` tokens of the builtin tokenizer, distinct per `tag`.
fn text(tag: &str, words: usize) -> String {
    (0..words)
        .map(|i| format!("{tag}{i}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Per-engine counts after each of `ENGINES * 2` long requests sent alternately through the
/// replicas, each sent once the sending replica can know of all the earlier ones (when
/// `wait_seen`).
async fn concurrent_counts(routers: usize, load_interval_ms: u64) -> Vec<[usize; ENGINES]> {
    let r = Replicas::start(routers, load_interval_ms, 0.1).await;
    let mut held = Vec::new();
    let mut counts = [0usize; ENGINES];
    let mut after_each = Vec::new();
    for i in 0..ENGINES * 2 {
        let router = i % routers;
        if load_interval_ms > 0 {
            let sent = i as u64;
            assert!(
                support::wait_for(Duration::from_secs(20), || r.seen_in_flight(router) >= sent)
                    .await,
                "replica {router} never saw the {sent} requests sent before"
            );
        }
        let (mut resp, worker) = r
            .send(router, &text(&format!("u{i}x"), 40), 2000, true)
            .await;
        // Past its first token before the next request: every request in flight is then
        // decoding, so the costs differ by load alone, not by how far each prefill got on a
        // busy machine (one router once sent a third request to an engine whose two were
        // decoding while others' were still prefilling).
        assert!(resp.chunk().await.unwrap().is_some(), "a first chunk");
        held.push(resp);
        counts[worker] += 1;
        after_each.push(counts);
    }
    drop(held);
    r.shutdown().await;
    after_each
}

fn spread(c: &[usize; ENGINES]) -> usize {
    c.iter().max().unwrap() - c.iter().min().unwrap()
}

/// Concurrent long requests through two replicas land as evenly as through one: after every
/// request, the busiest and idlest engine differ by at most one (the stated tolerance), and
/// in the end each engine serves exactly two.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_replicas_reading_engine_load_balance_like_one_router() {
    let one = concurrent_counts(1, 20).await;
    let two = concurrent_counts(2, 20).await;
    eprintln!("one router: {one:?}\ntwo replicas: {two:?}");
    for (label, run) in [("one router", &one), ("two replicas", &two)] {
        for (i, c) in run.iter().enumerate() {
            assert!(spread(c) <= 1, "{label}, after request {}: {c:?}", i + 1);
        }
        assert_eq!(run.last(), Some(&[2; ENGINES]), "{label}");
    }
    // Control: without engine readings each replica sees only its own requests; with the same
    // configuration both break the first tie the same way and stack two requests on one
    // engine while others idle.
    let blind = concurrent_counts(2, 0).await;
    eprintln!("two replicas, no engine readings: {blind:?}");
    assert!(
        blind.iter().any(|c| spread(c) >= 2),
        "blind replicas balanced anyway: {blind:?}"
    );
}

/// Prefix groups sent alternately through two replicas concentrate on one engine each, as
/// through one router: both replicas' indexes hold every engine's blocks.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn prefix_groups_concentrate_through_two_replicas_as_through_one() {
    const GROUPS: usize = 4;
    const PER_GROUP: usize = 5;
    for routers in [1, 2] {
        let r = Replicas::start(routers, 20, 10.0).await;
        let mut sent = 0usize;
        let mut per_group: Vec<Vec<usize>> = Vec::new();
        for g in 0..GROUPS {
            let prefix = text(&format!("g{g}p"), 200);
            let mut workers = Vec::new();
            for k in 0..PER_GROUP {
                let prompt = format!("{prefix} {}", text(&format!("g{g}q{k}u"), 8));
                let router = sent % routers;
                sent += 1;
                // Every earlier request has ended: wait until the replica's engine readings
                // say so too (a reading taken while the other replica's request ran still
                // counts it, for at most one interval).
                assert!(
                    support::wait_for(Duration::from_secs(20), || r.seen_in_flight(router) == 0)
                        .await
                );
                let (resp, worker) = r.send(router, &prompt, 4, false).await;
                let _ = resp.bytes().await.unwrap();
                if k == 0 {
                    // Both replicas learn of the group's blocks from the engine's events.
                    for other in 0..routers {
                        let mut seen = 0;
                        for _ in 0..1000 {
                            seen = r.overlap(other, &prompt, worker).await;
                            if seen > 0 {
                                break;
                            }
                            tokio::time::sleep(Duration::from_millis(10)).await;
                        }
                        assert!(seen > 0, "replica {other} never indexed group {g}");
                    }
                }
                workers.push(worker);
            }
            per_group.push(workers);
        }
        eprintln!("{routers} router(s): workers per group {per_group:?}");
        for (g, w) in per_group.iter().enumerate() {
            assert!(
                w.iter().all(|x| *x == w[0]),
                "{routers} router(s): group {g} spread over {w:?}"
            );
        }
        let mut totals = [0usize; ENGINES];
        for w in per_group.iter().flatten() {
            totals[*w] += 1;
        }
        eprintln!("{routers} router(s): requests per engine {totals:?}");
        r.shutdown().await;
    }
}
