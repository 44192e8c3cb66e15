//! Issue 33, part 1 on real sockets: a router with two slots in front of one simulated engine,
//! its queue full of one tenant's flood. Counted, never timed: another tenant's requests are
//! served within a turn or two of the flood's, a high-priority request overtakes the whole
//! backlog, sheddable requests give their places to those that are not, and every request
//! gets exactly one answer (the engine served exactly the successes).

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kvroute::config::Config;
use kvroute::fleet::{BaseUrl, WorkerSpec};
use kvroute::server::RouterHandle;
use serde_json::json;
use tokio::net::TcpListener;

use crate::support::{self, SimEngine};

const MODEL: &str = "sim";

struct Shaped {
    router: RouterHandle,
    engine: SimEngine,
    http: reqwest::Client,
}

fn tenant(name: &str, extra: &str) -> String {
    format!(
        "[[tenants]]\nname = \"{name}\"\napi_key_sha256 = \"{}\"\n{extra}\n",
        crate::support::sha256_hex(&format!("key-{name}"))
    )
}

impl Shaped {
    /// A router with 2 slots and a queue of `max_queue` over one engine; tenants `a`, `b`
    /// (plain), `h` (may ask for `high`) and `s` (sheddable).
    async fn start(max_queue: usize) -> Shaped {
        Shaped::start_with(max_queue, "").await
    }

    /// [`Shaped::start`] with more tenants (`extra`, TOML).
    async fn start_with(max_queue: usize, extra: &str) -> Shaped {
        let engine = SimEngine::start(MODEL, 0, 1.0).await;
        let text = format!(
            "shutdown_grace_s = 1.0\n[limits]\nmax_concurrency = 2\nmax_queue = {max_queue}\n\
             queue_timeout_s = 120\n{extra}{}{}{}{}",
            tenant("a", ""),
            tenant("b", ""),
            tenant("h", "max_priority = \"high\""),
            tenant("s", "sheddable = true"),
        );
        let mut config = Config::from_toml(&text, Path::new("test")).expect("config");
        config.workers = vec![WorkerSpec {
            id: "e0".into(),
            url: BaseUrl::parse(&format!("http://{}", engine.addr)).expect("url"),
            models: vec![MODEL.into()],
            kv_events: None,
            kv_replay: None,
            kv_blocks: None,
            data_parallel_size: 1,
            role: kvroute::fleet::Role::Both,
            bootstrap_port: None,
        }];
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let router = kvroute::server::start(&config, listener).expect("router");
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(300))
            .pool_max_idle_per_host(256)
            .build()
            .expect("client");
        Shaped {
            router,
            engine,
            http,
        }
    }

    /// Sends one completion as `tenant` with `headers`; its status and error code.
    fn send(
        &self,
        tenant: &str,
        headers: &[(&str, &str)],
        log: &Arc<Mutex<Vec<String>>>,
        tag: String,
    ) -> tokio::task::JoinHandle<(u16, Option<String>)> {
        self.send_body(tenant, headers, log, tag, 24)
    }

    /// [`Shaped::send`] asking for `max_tokens`.
    fn send_body(
        &self,
        tenant: &str,
        headers: &[(&str, &str)],
        log: &Arc<Mutex<Vec<String>>>,
        tag: String,
        max_tokens: u64,
    ) -> tokio::task::JoinHandle<(u16, Option<String>)> {
        let body = json!({"model": MODEL, "prompt": format!("{tag} hello there"), "max_tokens": max_tokens});
        let mut req = self
            .http
            .post(format!("http://{}/v1/completions", self.router.addr))
            .bearer_auth(format!("key-{tenant}"))
            .json(&body);
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let log = Arc::clone(log);
        tokio::spawn(async move {
            let resp = req.send().await.expect("the router answers");
            let status = resp.status().as_u16();
            let body: serde_json::Value = resp.json().await.expect("a JSON body");
            log.lock().unwrap().push(tag);
            let code = body["error"]["code"].as_str().map(str::to_owned);
            (status, code)
        })
    }

    async fn metrics(&self) -> String {
        get_text(&format!("http://{}/metrics", self.router.addr)).await
    }

    /// Waits until `n` requests of `tenant` wait in the queue.
    async fn until_queued(&self, tenant: &str, n: u64) {
        let needle = format!("tenant=\"{tenant}\"}} ");
        let mut depth = 0;
        for _ in 0..600 {
            let text = self.metrics().await;
            depth = text
                .lines()
                .filter(|l| l.starts_with("kvroute_queue_depth{") && l.contains(&needle))
                .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
                .sum();
            if depth >= n {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("{tenant} never had {n} requests queued (last {depth})");
    }

    async fn engine_successes(&self) -> u64 {
        let text = get_text(&format!("http://{}/metrics", self.engine.addr)).await;
        text.lines()
            .filter(|l| l.starts_with("vllm:request_success_total"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>() as u64
    }

    async fn shutdown(self) {
        self.router.shutdown().await;
        let _ = self.engine.handle.shutdown().await;
    }
}

async fn get_text(url: &str) -> String {
    reqwest::get(url)
        .await
        .expect("metrics answer")
        .text()
        .await
        .expect("metrics text")
}

/// How many of `flood`'s requests completed after `from` (an index into the completion log)
/// and before the last of `tags`.
fn overtaken_by(log: &[String], from: usize, tags: &[&str]) -> usize {
    let last = tags
        .iter()
        .map(|t| log.iter().position(|x| x == t).expect("completed"))
        .max()
        .expect("tags");
    log[from..last]
        .iter()
        .filter(|x| x.starts_with("flood"))
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_tenant_and_a_high_priority_request_pass_a_flood() {
    let s = Shaped::start(256).await;
    let log = Arc::new(Mutex::new(Vec::new()));
    let flood: Vec<_> = (0..40)
        .map(|i| s.send("a", &[], &log, format!("flood{i}")))
        .collect();
    s.until_queued("a", 30).await;
    let from = log.lock().unwrap().len();
    // `b` sends three at once; `h` one at `high`.
    let calm: Vec<_> = (0..3)
        .map(|i| s.send("b", &[], &log, format!("calm{i}")))
        .collect();
    let high = s.send("h", &[("x-kvroute-priority", "high")], &log, "high".into());
    for t in calm.into_iter().chain([high]).chain(flood) {
        assert_eq!(t.await.unwrap(), (200, None));
    }
    let log = log.lock().unwrap().clone();
    // First come, first served would finish at least 30 of the flood first. Fair share: each
    // of `b`'s requests waits for at most one of `a`'s turns, behind the two running.
    let passed = overtaken_by(&log, from, &["calm0", "calm1", "calm2"]);
    assert!(
        passed <= 8,
        "{passed} flood requests finished first: {log:?}"
    );
    let passed = overtaken_by(&log, from, &["high"]);
    assert!(
        passed <= 3,
        "{passed} flood requests finished before `high`: {log:?}"
    );
    assert_eq!(s.engine_successes().await, 44);
    let metrics = s.metrics().await;
    assert!(metrics.contains("kvroute_queue_seconds_count{band=\"high\"} 1"));
    s.shutdown().await;
}

/// With `fair_reserve = 1` of the 2 slots, `a`'s long requests hold one slot and queue
/// behind it; `b`, under its share, takes the reserved slot at once: both of its requests end
/// before any of `a`'s (without the reserve, `a` would hold both slots and `b` would wait for
/// one of them to end). Every request is answered once and served once by the engine.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_under_its_share_starts_at_once_beside_a_flood_holding_its_cap() {
    let s = Shaped::start_with(64, "[priority]\nfair_reserve = 1\n").await;
    let log = Arc::new(Mutex::new(Vec::new()));
    let flood: Vec<_> = (0..3)
        .map(|i| s.send_body("a", &[], &log, format!("flood{i}"), 300))
        .collect();
    // One runs, two wait: `a` alone does not take the reserve.
    s.until_queued("a", 2).await;
    for i in 0..2 {
        let b = s.send("b", &[], &log, format!("b{i}"));
        assert_eq!(b.await.unwrap(), (200, None));
    }
    assert_eq!(
        log.lock().unwrap().clone(),
        ["b0", "b1"],
        "b finished behind the flood"
    );
    for t in flood {
        assert_eq!(t.await.unwrap(), (200, None));
    }
    assert_eq!(log.lock().unwrap().len(), 5);
    assert_eq!(s.engine_successes().await, 5, "served once each");
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sheddable_requests_make_room_and_nothing_is_lost_or_duplicated() {
    let s = Shaped::start(8).await;
    let log = Arc::new(Mutex::new(Vec::new()));
    // Ten sheddable requests: two long ones take both slots (and keep them through the checks
    // below, however slow the machine: a slot freed early would let a later request in),
    // eight fill the queue.
    let mut shed: Vec<_> = (0..2)
        .map(|i| s.send_body("s", &[], &log, format!("shed{i}"), 800))
        .collect();
    for _ in 0..600 {
        if support::in_flight_seen(&s.router) >= 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        support::in_flight_seen(&s.router),
        2,
        "the long two never ran"
    );
    shed.extend((2..10).map(|i| s.send("s", &[], &log, format!("shed{i}"))));
    s.until_queued("s", 8).await;
    // Eight that may not be shed take the eight places; a ninth finds the queue full.
    let kept: Vec<_> = (0..8)
        .map(|i| s.send("a", &[], &log, format!("flood{i}")))
        .collect();
    s.until_queued("a", 8).await;
    let full = s.send("b", &[], &log, "full".into()).await.unwrap();
    assert_eq!(full, (429, Some("queue_full".into())));
    // A sheddable arrival now is refused at once, with 503.
    let late = s.send("s", &[], &log, "late".into()).await.unwrap();
    assert_eq!(late, (503, Some("shed".into())));
    let mut ok = 0;
    let mut dropped = 0;
    for t in shed {
        match t.await.unwrap() {
            (200, None) => ok += 1,
            (503, Some(code)) if code == "shed" => dropped += 1,
            other => panic!("unexpected answer {other:?}"),
        }
    }
    assert_eq!((ok, dropped), (2, 8));
    for t in kept {
        assert_eq!(t.await.unwrap(), (200, None));
    }
    // Exactly the successes reached the engine: nothing shed was also served, nothing twice.
    assert_eq!(s.engine_successes().await, 10);
    let metrics = s.metrics().await;
    assert!(
        metrics.contains("kvroute_rejected_total{reason=\"shed\"} 9"),
        "{metrics}"
    );
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_priority_the_key_may_not_use_is_refused_with_400() {
    let s = Shaped::start(8).await;
    let log = Arc::new(Mutex::new(Vec::new()));
    let above = s.send("a", &[("x-kvroute-priority", "high")], &log, "x".into());
    assert_eq!(above.await.unwrap(), (400, Some("invalid_priority".into())));
    let unknown = s.send("h", &[("x-kvroute-priority", "urgent")], &log, "y".into());
    assert_eq!(
        unknown.await.unwrap(),
        (400, Some("invalid_priority".into()))
    );
    let lower = s.send("a", &[("x-kvroute-priority", "low")], &log, "z".into());
    assert_eq!(lower.await.unwrap(), (200, None));
    s.shutdown().await;
}

/// Issue 33, part 2: a tenant's tokens and requests per minute. A request reserves its prompt
/// plus `max_tokens`; past the limit it is refused with 429, a `Retry-After` and
/// `rate_limit_exceeded`; a request larger than the limit itself is refused too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenants_are_held_to_their_tokens_and_requests_per_minute() {
    let extra = format!(
        "{}{}",
        tenant("tpm", "tokens_per_minute = 200"),
        tenant("rpm", "requests_per_minute = 3")
    );
    let s = Shaped::start_with(8, &extra).await;
    let log = Arc::new(Mutex::new(Vec::new()));
    // Each reserves its 4-token prompt ("tN hello there" in the builtin tokenizer) + 40.
    let mut answers = Vec::new();
    for i in 0..6 {
        answers.push(
            s.send_body("tpm", &[], &log, format!("t{i}"), 40)
                .await
                .unwrap(),
        );
    }
    let ok = answers.iter().filter(|a| a.0 == 200).count();
    assert_eq!(ok, 4, "{answers:?}");
    for a in &answers[4..] {
        assert_eq!(a, &(429, Some("rate_limit_exceeded".into())));
    }
    let big = s
        .send_body("tpm", &[], &log, "big".into(), 500)
        .await
        .unwrap();
    assert_eq!(big, (429, Some("rate_limit_exceeded".into())));
    let resp = s
        .http
        .post(format!("http://{}/v1/completions", s.router.addr))
        .bearer_auth("key-tpm")
        .json(&json!({"model": MODEL, "prompt": "x", "max_tokens": 40}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 429);
    let retry: u64 = resp.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=60).contains(&retry), "Retry-After {retry}");
    for i in 0..3 {
        let a = s.send("rpm", &[], &log, format!("r{i}")).await.unwrap();
        assert_eq!(a, (200, None));
    }
    let over = s.send("rpm", &[], &log, "r3".into()).await.unwrap();
    assert_eq!(over, (429, Some("rate_limit_exceeded".into())));
    // Other tenants are not limited.
    assert_eq!(
        s.send("a", &[], &log, "free".into()).await.unwrap(),
        (200, None)
    );
    let metrics = s.metrics().await;
    assert!(
        metrics.contains("kvroute_rejected_total{reason=\"tokens_per_minute\"} 4"),
        "{metrics}"
    );
    assert!(metrics.contains("kvroute_rejected_total{reason=\"requests_per_minute\"} 1"));
    assert_eq!(s.engine_successes().await, 8);
    s.shutdown().await;
}
