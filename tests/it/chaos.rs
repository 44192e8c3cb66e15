//! Chaos and load: real engines (child `kvroute engine` processes or in-process simulated
//! engines publishing KV events over ZeroMQ) behind a real router on 127.0.0.1, every test
//! bounded in time.
//!
//! What must hold through each failure: every client gets a complete response or a clear
//! error (an SSE error event or an error status), nothing hangs, no request is lost or run
//! twice, the router's memory stays bounded, and the index never keeps entries of an engine
//! that died, restarted or lost events. Each scenario prints one line:
//! `scenario: sent N, completed N, failed N {by kind}, peak RSS X MiB (whose)`.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::support::{
    self, EngineAddrs, EngineProcess, RouterProcess, SimEngine, report, rss_mib, start_router,
    wait_for,
};
use futures_util::StreamExt;
use kvroute::config::Config;
use kvroute::fleet::WorkerId;
use kvroute::kv_events::{
    BlockRemoved, BlockStored, EngineHash, EventBatch, KvEvent, Publisher, PublisherConfig,
};
use kvroute::openai::{Endpoint, RequestView};
use kvroute::policy::PolicyKind;
use kvroute::server::RouterHandle;
use kvroute::tokens::model::hash_seed;
use kvroute::tokens::{BlockHash, ModelTokens, block_hashes};
use serde_json::{Value, json};

const MODEL: &str = "sim";

/// A prompt of `words` distinct words (≈ one builtin token each).
fn prompt(tag: &str, words: usize) -> String {
    (0..words).map(|i| format!(" {tag}{i}")).collect()
}

/// The router's block hashes of a completion prompt (builtin tokenizer, block size 16).
fn prompt_hashes(text: &str) -> Vec<BlockHash> {
    let view = RequestView::parse(
        Endpoint::Completions,
        &json!({"model": MODEL, "prompt": text}),
    )
    .unwrap();
    let ids = ModelTokens::builtin(16).prompt_ids(&view).unwrap();
    block_hashes(hash_seed(MODEL, None, None), &ids, 16)
}

/// Leading blocks of `hashes` the router's event-fed index holds for `worker`.
fn held(router: &RouterHandle, worker: WorkerId, hashes: &[BlockHash]) -> u32 {
    router.state.holdings.exact.lookup(hashes).get(worker)
}

fn router_config(policy: PolicyKind, workers: &str, extra: &str) -> Config {
    let text = format!(
        "policy = \"{policy}\"\nshutdown_grace_s = 1.0\n{extra}\n[health]\ninterval_s = 0.2\ntimeout_s = 0.5\n[[models]]\nname = \"{MODEL}\"\nblock_size = 16\n{workers}"
    );
    Config::from_toml(&text, Path::new("chaos")).unwrap()
}

fn worker_toml(id: &str, url: &str, events: Option<&str>, replay: Option<&str>) -> String {
    let mut s = format!("[[workers]]\nid = \"{id}\"\nurl = \"{url}\"\nmodels = [\"{MODEL}\"]\n");
    if let Some(e) = events {
        s.push_str(&format!("kv_events = \"{e}\"\n"));
    }
    if let Some(r) = replay {
        s.push_str(&format!("kv_replay = \"{r}\"\n"));
    }
    s
}

fn http() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .pool_max_idle_per_host(2048)
        .build()
        .unwrap()
}

/// How one client request ended.
#[derive(Clone, Debug, PartialEq)]
enum Outcome {
    /// 200 and, for a stream, `[DONE]` without an error event.
    Complete {
        worker: String,
        completion_tokens: u64,
    },
    /// 200, then an SSE error event.
    ErrorEvent { worker: String },
    /// An error status with an OpenAI error body.
    Status(u16),
    /// The connection failed or the body broke off without an error event.
    Transport(String),
    /// A stream that ended without `[DONE]` and without an error: silently truncated.
    Truncated { worker: String },
    /// No end within the time limit.
    Hung,
}

impl Outcome {
    fn kind(&self) -> String {
        match self {
            Outcome::Complete { .. } => "complete".into(),
            Outcome::ErrorEvent { .. } => "sse_error_event".into(),
            Outcome::Status(s) => format!("status_{s}"),
            Outcome::Transport(_) => "transport".into(),
            Outcome::Truncated { .. } => "truncated".into(),
            Outcome::Hung => "hung".into(),
        }
    }

    fn worker(&self) -> Option<&str> {
        match self {
            Outcome::Complete { worker, .. }
            | Outcome::ErrorEvent { worker }
            | Outcome::Truncated { worker } => Some(worker),
            _ => None,
        }
    }
}

/// Tally of outcomes: (completed, failures by kind).
fn tally(outcomes: &[Outcome]) -> (usize, BTreeMap<String, usize>) {
    let mut failed = BTreeMap::new();
    let mut completed = 0;
    for o in outcomes {
        match o {
            Outcome::Complete { .. } => completed += 1,
            other => *failed.entry(other.kind()).or_insert(0) += 1,
        }
    }
    (completed, failed)
}

fn classify_stream(worker: String, text: &str) -> Outcome {
    let mut completion_tokens = 0;
    let mut error = false;
    let mut done = false;
    for line in text.lines() {
        let Some(data) = line.strip_prefix("data:") else {
            continue;
        };
        let data = data.trim();
        if data == "[DONE]" {
            done = true;
            continue;
        }
        if let Ok(v) = serde_json::from_str::<Value>(data) {
            if v.get("error").is_some() {
                error = true;
            }
            if let Some(p) = v["usage"]["completion_tokens"].as_u64() {
                completion_tokens = p;
            }
        }
    }
    if error {
        Outcome::ErrorEvent { worker }
    } else if done {
        Outcome::Complete {
            worker,
            completion_tokens,
        }
    } else {
        Outcome::Truncated { worker }
    }
}

/// Sends a streaming completion; signals `started` on the first body chunk; reads to the end.
async fn stream_request(
    http: reqwest::Client,
    url: String,
    body: Value,
    started: Option<tokio::sync::mpsc::Sender<()>>,
    limit: Duration,
) -> Outcome {
    let run = async move {
        let resp = match http.post(&url).json(&body).send().await {
            Ok(r) => r,
            Err(e) => return Outcome::Transport(e.to_string()),
        };
        let status = resp.status().as_u16();
        let worker = resp
            .headers()
            .get("x-kvroute-worker")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("-")
            .to_string();
        if status != 200 {
            let v: Value = resp.json().await.unwrap_or(Value::Null);
            assert!(
                v["error"]["message"].is_string(),
                "status {status} without an OpenAI error: {v}"
            );
            return Outcome::Status(status);
        }
        let mut body = resp.bytes_stream();
        let mut text = String::new();
        let mut started = started;
        while let Some(chunk) = body.next().await {
            match chunk {
                Ok(c) => {
                    text.push_str(&String::from_utf8_lossy(&c));
                    if let Some(tx) = started.take() {
                        let _ = tx.send(()).await;
                    }
                }
                Err(e) => {
                    // A transport error after an error event still counts as the event.
                    return match classify_stream(worker, &text) {
                        o @ Outcome::ErrorEvent { .. } => o,
                        _ => Outcome::Transport(e.to_string()),
                    };
                }
            }
        }
        classify_stream(worker, &text)
    };
    tokio::time::timeout(limit, run)
        .await
        .unwrap_or(Outcome::Hung)
}

/// Sends a non-streaming completion.
async fn plain_request(http: &reqwest::Client, url: &str, body: Value) -> Outcome {
    let resp = match http.post(url).json(&body).send().await {
        Ok(r) => r,
        Err(e) => return Outcome::Transport(e.to_string()),
    };
    let status = resp.status().as_u16();
    let worker = resp
        .headers()
        .get("x-kvroute-worker")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("-")
        .to_string();
    let v: Value = resp.json().await.unwrap_or(Value::Null);
    if status == 200 {
        Outcome::Complete {
            worker,
            completion_tokens: v["usage"]["completion_tokens"].as_u64().unwrap_or(0),
        }
    } else {
        assert!(v["error"]["message"].is_string(), "{status}: {v}");
        Outcome::Status(status)
    }
}

/// (a) An engine process is SIGKILLed while streams run on it: its clients get an error
/// event, the other engine's clients finish, new requests go to the survivor, and the dead
/// engine's index entries vanish. (b) It restarts on the same port and KV endpoints: it is
/// taken back, serves again, and starts cold.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_engine_mid_stream_then_restarted_on_the_same_port() {
    let limit = Duration::from_secs(45);
    tokio::time::timeout(limit, kill_and_restart())
        .await
        .expect("scenario finished in time");
}

async fn kill_and_restart() {
    let addrs = [EngineAddrs::fresh(), EngineAddrs::fresh()];
    let mut engines = Vec::new();
    for a in &addrs {
        engines.push(EngineProcess::start(a, MODEL, 1.0).await);
    }
    let workers: String = addrs
        .iter()
        .enumerate()
        .map(|(i, a)| {
            worker_toml(
                &format!("e{i}"),
                &format!("http://{}", a.http),
                Some(&a.events),
                Some(&a.replay),
            )
        })
        .collect();
    let router = start_router(&router_config(PolicyKind::RoundRobin, &workers, "")).await;
    let http = http();
    let url = format!("http://{}/v1/completions", router.addr);
    let key = |id: &str| router.state.fleet.get(id).unwrap().rank(0).key;
    let (s0, s1) = (key("e0"), key("e1"));

    // Warm both engines directly with a known prompt each and wait for the index to see it.
    let warm: Vec<String> = (0..2).map(|i| prompt(&format!("warm{i}x"), 320)).collect();
    for (i, a) in addrs.iter().enumerate() {
        let o = plain_request(
            &http,
            &format!("http://{}/v1/completions", a.http),
            json!({"model": MODEL, "prompt": warm[i], "max_tokens": 1}),
        )
        .await;
        assert!(matches!(o, Outcome::Complete { .. }), "{o:?}");
    }
    let h0 = prompt_hashes(&warm[0]);
    let h1 = prompt_hashes(&warm[1]);
    assert!(
        wait_for(Duration::from_secs(5), || held(&router, s0, &h0) >= 19
            && held(&router, s1, &h1) >= 19)
        .await,
        "the index never saw the engines' blocks: e0 {} e1 {}",
        held(&router, s0, &h0),
        held(&router, s1, &h1)
    );

    // Twenty long streams, ten per engine (round robin).
    let n_streams = 20;
    let (tx, mut rx) = tokio::sync::mpsc::channel(n_streams);
    let mut tasks = Vec::new();
    for i in 0..n_streams {
        let body = json!({"model": MODEL, "prompt": prompt(&format!("s{i}x"), 40), "max_tokens": 400, "stream": true});
        tasks.push(tokio::spawn(stream_request(
            http.clone(),
            url.clone(),
            body,
            Some(tx.clone()),
            Duration::from_secs(20),
        )));
    }
    drop(tx);
    for _ in 0..n_streams {
        tokio::time::timeout(Duration::from_secs(10), rx.recv())
            .await
            .expect("every stream started");
    }
    let (killed_peak, _) = rss_mib(Some(engines[0].pid()));
    engines[0].kill();
    let killed_at = Instant::now();

    // While e0 is dead, new requests are served by e1 (retry on connect failure).
    let mut during = Vec::new();
    for i in 0..10 {
        during.push(
            plain_request(
                &http,
                &url,
                json!({"model": MODEL, "prompt": prompt(&format!("d{i}x"), 20), "max_tokens": 2}),
            )
            .await,
        );
    }
    let mut outcomes = Vec::new();
    for t in tasks {
        outcomes.push(t.await.unwrap());
    }
    let (completed, failed) = tally(&outcomes);
    let (peak, _) = rss_mib(None);
    report(
        "chaos(a) kill engine mid-stream",
        n_streams,
        completed,
        &failed,
        peak,
        &format!("test process with router; killed engine peaked at {killed_peak:.1} MiB"),
    );
    let (dc, dfailed) = tally(&during);
    report(
        "chaos(a) requests while an engine is dead",
        during.len(),
        dc,
        &dfailed,
        peak,
        "test process with router",
    );
    for o in &outcomes {
        match (o.worker(), o) {
            (Some("e1"), Outcome::Complete { .. }) => {}
            (Some("e0"), Outcome::ErrorEvent { .. }) => {}
            (w, o) => panic!("stream on {w:?} ended as {o:?}"),
        }
    }
    assert_eq!(completed, n_streams / 2, "{outcomes:?}");
    for o in &during {
        assert!(
            matches!(o, Outcome::Complete { worker, .. } if worker == "e1"),
            "request while e0 is dead: {o:?}"
        );
    }

    // Every stream's load was released, the broken ones included.
    let e0_load = router
        .state
        .fleet
        .get("e0")
        .unwrap()
        .rank(0)
        .load
        .snapshot();
    assert!(
        wait_for(Duration::from_secs(2), || router
            .state
            .fleet
            .get("e0")
            .unwrap()
            .rank(0)
            .load
            .snapshot()
            .in_flight
            == 0)
        .await,
        "load of the killed engine's streams not released: {e0_load:?}"
    );
    // The dead engine's entries are gone; the survivor's remain.
    assert!(
        wait_for(Duration::from_secs(5), || held(&router, s0, &h0) == 0).await,
        "{} stale blocks of the killed engine remain {:?} after the kill",
        held(&router, s0, &h0),
        killed_at.elapsed()
    );
    assert!(held(&router, s1, &h1) >= 19);
    let e0 = router.state.fleet.get("e0").unwrap();
    assert!(
        wait_for(Duration::from_secs(3), || !e0.is_healthy()).await,
        "a dead engine stays healthy"
    );

    // (b) Restart on the same port and endpoints.
    engines[0] = EngineProcess::start(&addrs[0], MODEL, 1.0).await;
    assert!(
        wait_for(Duration::from_secs(5), || e0.is_healthy()).await,
        "the restarted engine was not taken back"
    );
    assert_eq!(
        held(&router, s0, &h0),
        0,
        "the restarted engine must start cold"
    );
    // It serves through the router again.
    let mut after = Vec::new();
    for i in 0..10 {
        after.push(
            plain_request(
                &http,
                &url,
                json!({"model": MODEL, "prompt": prompt(&format!("r{i}x"), 20), "max_tokens": 2}),
            )
            .await,
        );
    }
    let (ac, afailed) = tally(&after);
    report(
        "chaos(b) restart on the same port",
        after.len(),
        ac,
        &afailed,
        rss_mib(None).0,
        &format!(
            "test process with router; restarted engine {:.1} MiB",
            rss_mib(Some(engines[0].pid())).0
        ),
    );
    assert_eq!(ac, after.len(), "{after:?}");
    assert!(
        after.iter().any(|o| o.worker() == Some("e0")),
        "the restarted engine got no request: {after:?}"
    );
    // Its new events reach the index (the subscription survived the restart), and the engine
    // really is cold: the warm prompt is computed again.
    let o = plain_request(
        &http,
        &format!("http://{}/v1/completions", addrs[0].http),
        json!({"model": MODEL, "prompt": warm[0], "max_tokens": 1}),
    )
    .await;
    assert!(matches!(o, Outcome::Complete { .. }), "{o:?}");
    assert!(
        wait_for(Duration::from_secs(5), || held(&router, s0, &h0) >= 19).await,
        "events of the restarted engine never reached the index"
    );
    router.shutdown().await;
}

/// An engine-shaped event source: a publisher we drive by hand, plus the batches to send.
fn stored(first_id: u64, parent: Option<u64>, tokens: Vec<u32>) -> KvEvent {
    let blocks = tokens.len() / 16;
    KvEvent::Stored(BlockStored {
        block_hashes: (0..blocks as u64)
            .map(|i| EngineHash(first_id + i))
            .collect(),
        parent_block_hash: parent.map(EngineHash),
        token_ids: tokens,
        block_size: 16,
        ..BlockStored::default()
    })
}

fn removed(ids: &[u64]) -> KvEvent {
    KvEvent::Removed(BlockRemoved {
        block_hashes: ids.iter().copied().map(EngineHash).collect(),
        ..BlockRemoved::default()
    })
}

fn batch(events: Vec<KvEvent>) -> EventBatch {
    EventBatch {
        ts: 0.0,
        events,
        dp_rank: Some(0),
    }
}

/// Token ids of a chain: `blocks` blocks starting at `base`.
fn chain(base: u32, blocks: usize) -> Vec<u32> {
    (0..(blocks * 16) as u32).map(|i| base + i).collect()
}

fn chain_hashes(tokens: &[u32]) -> Vec<BlockHash> {
    block_hashes(hash_seed(MODEL, None, None), tokens, 16)
}

/// Publishes `probe` until the index shows it for `worker` (the subscriber is connected).
async fn connect(router: &RouterHandle, worker: WorkerId, publisher: &Publisher, probe_base: u32) {
    let tokens = chain(probe_base, 1);
    let h = chain_hashes(&tokens);
    for _ in 0..100 {
        publisher.publish(&batch(vec![stored(
            u64::from(probe_base),
            None,
            tokens.clone(),
        )]));
        if wait_for(Duration::from_millis(50), || held(router, worker, &h) == 1).await {
            return;
        }
    }
    panic!("the router never subscribed to {}", publisher.endpoint());
}

fn bind_publisher(endpoint: &str, replay: Option<&str>) -> Publisher {
    let mut config = PublisherConfig::new(endpoint);
    if let Some(r) = replay {
        config = config.with_replay(r);
    }
    for _ in 0..100 {
        if let Ok(p) = Publisher::bind(config.clone()) {
            return p;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("cannot bind {endpoint}");
}

/// (c) A batch goes missing (it holds the removal of blocks the router indexed, and a new
/// chain): with replay the router fetches it and ends exact; without replay it drops the
/// worker's entries. Either way, no stale entry survives. Then the event stream is cut (the
/// publisher dies) and a new one binds the same endpoint: the worker starts cold. A second
/// worker's garbage payloads are counted, drop that worker's entries (lost batches) and never
/// touch the first's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn event_stream_gaps_and_cuts_leave_no_stale_entries() {
    let limit = Duration::from_secs(30);
    tokio::time::timeout(limit, async {
        gap_scenario(true).await;
        gap_scenario(false).await;
    })
    .await
    .expect("scenario finished in time");
}

async fn gap_scenario(replay: bool) {
    let backend = support::Backend::start("b", &[MODEL]).await;
    let port = support::free_port();
    let endpoint = format!("tcp://127.0.0.1:{port}");
    let replay_ep = replay.then(|| format!("tcp://127.0.0.1:{}", support::free_port()));
    let other_ep = format!("tcp://127.0.0.1:{}", support::free_port());
    let publisher = bind_publisher(&endpoint, replay_ep.as_deref());
    let other = bind_publisher(&other_ep, None);
    // A replica each: the router refuses a URL listed twice.
    let backend_1 = support::Backend::start("b1", &[MODEL]).await;
    let workers = worker_toml("w0", &backend.url(), Some(&endpoint), replay_ep.as_deref())
        + &worker_toml("w1", &backend_1.url(), Some(&other_ep), None);
    let router = start_router(&router_config(PolicyKind::KvAware, &workers, "")).await;
    let s0 = router.state.fleet.get("w0").unwrap().rank(0).key;
    let s1 = router.state.fleet.get("w1").unwrap().rank(0).key;
    connect(&router, s0, &publisher, 1_000_000).await;
    connect(&router, s1, &other, 2_000_000).await;
    let probe = chain_hashes(&chain(1_000_000, 1));
    let other_probe = chain_hashes(&chain(2_000_000, 1));

    // A: two blocks, indexed.
    let a = chain(10_000, 2);
    let ha = chain_hashes(&a);
    publisher.publish(&batch(vec![stored(1, None, a)]));
    assert!(wait_for(Duration::from_secs(3), || held(&router, s0, &ha) == 2).await);

    // Lost: A removed, C stored. Then B arrives live and reveals the gap.
    let c = chain(20_000, 1);
    let hc = chain_hashes(&c);
    publisher.publish_lost(&batch(vec![removed(&[1, 2]), stored(3, None, c)]));
    let b = chain(30_000, 1);
    let hb = chain_hashes(&b);
    publisher.publish(&batch(vec![stored(4, None, b)]));
    assert!(
        wait_for(Duration::from_secs(5), || held(&router, s0, &hb) == 1).await,
        "the batch after the gap was not applied"
    );
    // Garbage from the other worker meanwhile.
    other.publish_raw(vec![0xc1, 0xff, 0x00]);
    other.publish_raw(b"not msgpack at all".to_vec());
    let d = chain(40_000, 1);
    other.publish(&batch(vec![stored(5, None, d.clone())]));
    let hd = chain_hashes(&d);
    assert!(wait_for(Duration::from_secs(3), || held(&router, s1, &hd) == 1).await);

    let stale_a = held(&router, s0, &ha);
    let c_now = held(&router, s0, &hc);
    let probe_now = held(&router, s0, &probe);
    let metrics = reqwest::get(format!("http://{}/metrics", router.addr))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let stream_line = |kind: &str, w: &str| {
        metrics
            .lines()
            .find(|l| {
                l.starts_with("kvroute_kv_events_total")
                    && l.contains(&format!("kind=\"{kind}\""))
                    && l.contains(&format!("worker=\"{w}\""))
            })
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    println!(
        "chaos(c) gap with replay={replay}: A(removed in the lost batch) held {stale_a}, C(stored in it) {c_now}, pre-gap probe {probe_now}; gaps {} replays_ok {} dropped {}; w1 undecodable {}",
        stream_line("gaps", "w0"),
        stream_line("replays_ok", "w0"),
        stream_line("dropped", "w0"),
        stream_line("undecodable", "w1"),
    );
    assert_eq!(
        stale_a, 0,
        "blocks removed in the lost batch are still indexed"
    );
    assert_eq!(stream_line("gaps", "w0"), 1.0);
    if replay {
        assert_eq!(c_now, 1, "the replayed batch's blocks are missing");
        assert_eq!(probe_now, 1, "replay must not drop what was exact");
        // At least the gap's replay; a subscriber that joined after the first publishes also
        // catches up by replay (a second successful one) on a loaded machine.
        assert!(stream_line("replays_ok", "w0") >= 1.0);
    } else {
        assert_eq!(c_now, 0);
        assert_eq!(
            probe_now, 0,
            "without replay the worker's entries must be dropped"
        );
        assert_eq!(stream_line("dropped", "w0"), 1.0);
    }
    assert_eq!(stream_line("undecodable", "w1"), 2.0);
    // An undecodable batch is a lost batch (issue 14.9): what it removed is unknown, so the
    // worker's earlier entries go; what follows it applies.
    assert_eq!(
        held(&router, s1, &other_probe),
        0,
        "entries from before an undecodable batch remain"
    );
    assert_eq!(held(&router, s0, &hb), 1, "garbage on w1 touched w0");

    // Cut: the publisher dies; a new one binds the same endpoint and counts from 0.
    drop(publisher);
    assert!(
        wait_for(Duration::from_secs(5), || held(&router, s0, &hb) == 0).await,
        "entries of a disconnected publisher remain"
    );
    let fresh = bind_publisher(&endpoint, replay_ep.as_deref());
    connect(&router, s0, &fresh, 3_000_000).await;
    assert_eq!(
        held(&router, s0, &hb),
        0,
        "a restarted publisher starts cold"
    );
    assert_eq!(held(&router, s0, &ha), 0);
    assert_eq!(held(&router, s1, &hd), 1, "the other worker is untouched");
    let (peak, _) = rss_mib(None);
    println!(
        "chaos(c) cut and rebind with replay={replay}: entries cleared, new stream applied; peak RSS {peak:.1} MiB (test process)"
    );
    router.shutdown().await;
}

/// (d) An engine stops sending mid-stream: with `proxy.idle_timeout_s` the client gets an
/// SSE error event instead of hanging, the upstream request is cancelled, and the other
/// engine's streams are unaffected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_engine_ends_streams_with_an_error_event() {
    let healthy = support::Backend::start("ok", &[MODEL]).await;
    let stalled = support::Backend::start("stalled", &[MODEL]).await;
    stalled.set(|b| {
        b.chunks = 4;
        b.hold_last_chunk = true;
    });
    let workers = worker_toml("ok", &healthy.url(), None, None)
        + &worker_toml("stalled", &stalled.url(), None, None);
    let config = router_config(
        PolicyKind::RoundRobin,
        &workers,
        "[proxy]\nidle_timeout_s = 1.0\n",
    );
    let router = start_router(&config).await;
    let http = http();
    let url = format!("http://{}/v1/completions", router.addr);
    let n = 10;
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            tokio::spawn(stream_request(
                http.clone(),
                url.clone(),
                json!({"model": MODEL, "prompt": format!("p{i}"), "stream": true}),
                None,
                Duration::from_secs(10),
            ))
        })
        .collect();
    let mut outcomes = Vec::new();
    for t in tasks {
        outcomes.push(t.await.unwrap());
    }
    let (completed, failed) = tally(&outcomes);
    report(
        "chaos(d) stalled engine",
        n,
        completed,
        &failed,
        rss_mib(None).0,
        "test process with router",
    );
    for o in &outcomes {
        match (o.worker(), o) {
            (Some("ok"), Outcome::Complete { .. }) => {}
            (Some("stalled"), Outcome::ErrorEvent { .. }) => {}
            (w, o) => panic!("stream on {w:?} ended as {o:?}"),
        }
    }
    assert!(
        support::eventually(|| stalled
            .state
            .streams_cancelled
            .load(std::sync::atomic::Ordering::SeqCst)
            == n / 2)
        .await,
        "the stalled upstream requests were not cancelled"
    );
    stalled.release();
    router.shutdown().await;
}

/// Sum of every sample of `metric` in a Prometheus text page.
fn metric_sum(page: &str, metric: &str) -> f64 {
    page.lines()
        .filter(|l| {
            l.starts_with(metric)
                && matches!(l.as_bytes().get(metric.len()), Some(b'{') | Some(b' '))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// (e) 1,000 concurrent streaming requests through a `kvroute serve` process to four
/// simulated engines: each completes or gets a clear error; what the engines served equals
/// what clients received (none lost, none run twice); the router's memory stays bounded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flood_of_concurrent_streams() {
    let limit = Duration::from_secs(60);
    tokio::time::timeout(limit, flood())
        .await
        .expect("flood finished in time");
}

/// One wave of `n` concurrent streams; returns the outcomes and a summary of time and
/// client-side concurrency.
async fn flood_wave(
    http: &reqwest::Client,
    url: &str,
    n: usize,
    wave: usize,
) -> (Vec<Outcome>, String) {
    let shared = prompt(&format!("shared{wave}w"), 64);
    let started = Instant::now();
    // Client-side concurrency: requests sent and not yet finished, and its peak.
    let in_flight = Arc::new(AtomicUsize::new(0));
    let peak_in_flight = Arc::new(AtomicUsize::new(0));
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            let (in_flight, peak_in_flight) = (Arc::clone(&in_flight), Arc::clone(&peak_in_flight));
            // Half share a 4-block prefix (routing has something to find), all are unique.
            let p = if i % 2 == 0 {
                format!("{shared} {}", prompt(&format!("q{wave}w{i}x"), 24))
            } else {
                prompt(&format!("u{wave}w{i}x"), 88)
            };
            let request = stream_request(
                http.clone(),
                url.to_string(),
                json!({"model": MODEL, "prompt": p, "max_tokens": 4, "stream": true,
                       "stream_options": {"include_usage": true}}),
                None,
                Duration::from_secs(25),
            );
            tokio::spawn(async move {
                let now = in_flight.fetch_add(1, Ordering::SeqCst) + 1;
                peak_in_flight.fetch_max(now, Ordering::SeqCst);
                let o = request.await;
                in_flight.fetch_sub(1, Ordering::SeqCst);
                o
            })
        })
        .collect();
    let mut outcomes = Vec::with_capacity(n);
    for t in tasks {
        outcomes.push(t.await.unwrap());
    }
    let summary = format!(
        "{:.1?}, peak client concurrency {}",
        started.elapsed(),
        peak_in_flight.load(Ordering::SeqCst)
    );
    (outcomes, summary)
}

async fn flood() {
    let n = 1000;
    let mut engines = Vec::new();
    for i in 0..4 {
        engines.push(SimEngine::start(MODEL, i, 50.0).await);
    }
    let workers: String = engines
        .iter()
        .enumerate()
        .map(|(i, e)| {
            worker_toml(
                &format!("e{i}"),
                &format!("http://{}", e.addr),
                Some(&e.events),
                Some(&e.replay),
            )
        })
        .collect();
    let config = format!(
        "policy = \"kv_aware\"\nshutdown_grace_s = 1.0\n[health]\ninterval_s = 0.5\n[[models]]\nname = \"{MODEL}\"\nblock_size = 16\n{workers}"
    );
    let (router, _config_file) = RouterProcess::start(&config).await;
    let (idle_peak, idle_rss) = rss_mib(Some(router.pid()));
    let http = http();
    let url = format!("http://{}/v1/completions", router.addr);
    // Two waves: the second must not need more memory than the first (nothing kept per
    // finished request).
    let mut outcomes = Vec::with_capacity(2 * n);
    let mut peaks = Vec::new();
    for wave in 0..2 {
        let (wave_outcomes, summary) = flood_wave(&http, &url, n, wave).await;
        let (peak, rss) = rss_mib(Some(router.pid()));
        let (completed, failed) = tally(&wave_outcomes);
        report(
            &format!("chaos(e) flood wave {} of 1,000 streams", wave + 1),
            n,
            completed,
            &failed,
            peak,
            &format!(
                "kvroute serve process; idle {idle_rss:.1} MiB (peak {idle_peak:.1}), after the wave {rss:.1} MiB; {summary}"
            ),
        );
        peaks.push(peak);
        outcomes.extend(wave_outcomes);
    }
    let (completed, _) = tally(&outcomes);
    let peak = peaks[1];
    // Every request ended cleanly: complete, or a clear refusal (429 once limits exist).
    for o in &outcomes {
        assert!(
            matches!(o, Outcome::Complete { .. } | Outcome::Status(429 | 503)),
            "{o:?}"
        );
    }
    // What the engines served is exactly what the clients received.
    let mut served = 0.0;
    let mut generated = 0.0;
    for e in &engines {
        let page = reqwest::get(format!("http://{}/metrics", e.addr))
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        served += metric_sum(&page, "vllm:request_success_total");
        generated += metric_sum(&page, "vllm:generation_tokens_total");
    }
    let client_tokens: u64 = outcomes
        .iter()
        .map(|o| match o {
            Outcome::Complete {
                completion_tokens, ..
            } => *completion_tokens,
            _ => 0,
        })
        .sum();
    println!(
        "chaos(e) engines served {served} requests ({generated} generated tokens); clients completed {completed} ({client_tokens} tokens received)"
    );
    assert_eq!(served as usize, completed, "requests lost or run twice");
    assert_eq!(
        generated as u64, client_tokens,
        "requests lost or run twice"
    );
    assert_eq!(client_tokens, 4 * completed as u64, "a stream lost tokens");
    assert!(completed > 0);
    // Load accounting released every request.
    let page = reqwest::get(format!("http://{}/metrics", router.addr))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(
        metric_sum(&page, "kvroute_worker_in_flight"),
        0.0,
        "requests still counted in flight after every client finished"
    );
    // Bounded memory: the router holds nothing per finished request.
    assert!(
        peak < 512.0,
        "router peak RSS {peak:.1} MiB for {n} concurrent streams"
    );
    assert!(
        peaks[1] <= peaks[0] * 1.5 + 16.0,
        "router memory grows from wave to wave: peaks {peaks:?} MiB"
    );
    drop(router);
    for e in engines {
        let _ = e.handle.shutdown().await;
    }
}
