//! The router's KV-event feed against engines that already hold blocks, over real ZeroMQ and
//! HTTP on 127.0.0.1: the warm-up replay on connect (issue 13 F2) and its "warming" state,
//! batches arriving during a replay, an undecodable batch (issue 14.9), and a replay peer that
//! never ends or would hold too much (issue 14.10). The engine side is either the project's simulated engine or a
//! scripted XPUB/ROUTER pair (below) whose replay answers the test controls.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::Duration;

use kvroute::config::Config;
use kvroute::fleet::{BaseUrl, WorkerSpec};
use kvroute::kv_events::{
    BlockRemoved, BlockStored, EngineHash, EventBatch, KvEvent, Layout, ReplayBound, ReplayError,
    ReplayLimits, Subscriber, SubscriberConfig, SubscriberEvent, encode_batch,
};
use kvroute::server::RouterHandle;
use kvroute::tokens::ModelTokens;
use serde_json::{Value, json};
use tokio::time::Instant;

use crate::support::{self, Backend, SimEngine};

const BLOCK: usize = 16;
/// Generous bound of every wait; the tests assert states, not durations.
const DEADLINE: Duration = Duration::from_secs(20);

/// A prompt of 8 full blocks of the builtin tokenizer, and its token ids.
fn prompt() -> (String, Vec<u32>) {
    let text: String = (0..BLOCK * 8).map(|i| format!(" word{i}")).collect();
    let ids = ModelTokens::builtin(BLOCK).encode(&text).unwrap();
    assert!(ids.len() >= BLOCK * 8, "{} tokens", ids.len());
    (text, ids)
}

/// `BlockStored` of blocks `first..first + n` of `ids`, engine hashes `hash..`, chained to
/// `parent`.
fn stored(ids: &[u32], first: usize, n: usize, hash: u64, parent: Option<u64>) -> KvEvent {
    KvEvent::Stored(BlockStored {
        block_hashes: (0..n as u64).map(|k| EngineHash(hash + k)).collect(),
        parent_block_hash: parent.map(EngineHash),
        token_ids: ids[first * BLOCK..(first + n) * BLOCK].to_vec(),
        block_size: BLOCK as u32,
        ..Default::default()
    })
}

fn removed(hash: u64) -> KvEvent {
    KvEvent::Removed(BlockRemoved {
        block_hashes: vec![EngineHash(hash)],
        ..Default::default()
    })
}

fn payload(events: Vec<KvEvent>) -> Vec<u8> {
    let batch = EventBatch {
        ts: 0.0,
        events,
        dp_rank: Some(0),
    };
    encode_batch(&batch, Layout::Vllm0_33)
}

/// How the scripted peer answers a replay request.
#[derive(Clone)]
enum Answer {
    /// These batches, then the end marker once the test calls [`Peer::release`].
    Hold(Vec<(u64, Vec<u8>)>),
    /// These batches over and over, never the end marker.
    Endless(Vec<(u64, Vec<u8>)>),
}

enum Command {
    Publish(u64, Vec<u8>),
    Release,
}

/// A scripted engine side on its own thread: an XPUB (which tells when the router has
/// subscribed) and, optionally, a replay ROUTER answering as [`Answer`] says.
struct Peer {
    events: String,
    replay: Option<String>,
    subscribed: Arc<AtomicBool>,
    requests: Arc<AtomicUsize>,
    tx: mpsc::Sender<Command>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Peer {
    fn start(answer: Option<Answer>) -> Peer {
        let ctx = zmq::Context::new();
        let xpub = ctx.socket(zmq::XPUB).unwrap();
        xpub.set_linger(0).unwrap();
        xpub.bind("tcp://127.0.0.1:*").unwrap();
        let events = xpub.get_last_endpoint().unwrap().unwrap();
        let router = answer.as_ref().map(|_| {
            let r = ctx.socket(zmq::ROUTER).unwrap();
            r.set_linger(0).unwrap();
            r.set_sndhwm(0).unwrap();
            r.bind("tcp://127.0.0.1:*").unwrap();
            r
        });
        let replay = router
            .as_ref()
            .map(|r| r.get_last_endpoint().unwrap().unwrap());
        let (subscribed, requests, stop) = (
            Arc::new(AtomicBool::new(false)),
            Arc::new(AtomicUsize::new(0)),
            Arc::new(AtomicBool::new(false)),
        );
        let (tx, rx) = mpsc::channel();
        let (sub2, req2, stop2) = (subscribed.clone(), requests.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            let _ctx = ctx;
            let mut client: Option<Vec<u8>> = None;
            let mut released = false;
            let mut turn = 0usize;
            while !stop2.load(Ordering::Relaxed) {
                while let Ok(frames) = xpub.recv_multipart(zmq::DONTWAIT) {
                    if frames.first().and_then(|f| f.first()) == Some(&1) {
                        sub2.store(true, Ordering::Relaxed);
                    }
                }
                if let Some(router) = &router {
                    while let Ok(frames) = router.recv_multipart(zmq::DONTWAIT) {
                        req2.fetch_add(1, Ordering::Relaxed);
                        let id = frames[0].clone();
                        if let Some(Answer::Hold(batches)) = &answer {
                            for (seq, p) in batches {
                                let seq = seq.to_be_bytes();
                                router
                                    .send_multipart([&id[..], b"", b"kv", &seq, p], 0)
                                    .unwrap();
                            }
                        }
                        client = Some(id);
                    }
                    if let (Some(id), Some(Answer::Endless(batches))) = (&client, &answer) {
                        for _ in 0..20 {
                            let (seq, p) = &batches[turn % batches.len()];
                            turn += 1;
                            let seq = seq.to_be_bytes();
                            let _ = router.send_multipart([&id[..], b"", b"kv", &seq, p], 0);
                        }
                    }
                    if released && let (Some(id), Some(Answer::Hold(_))) = (client.take(), &answer)
                    {
                        let end = (-1i64).to_be_bytes();
                        router
                            .send_multipart([&id[..], b"", b"kv", &end, b""], 0)
                            .unwrap();
                    }
                }
                match rx.recv_timeout(Duration::from_millis(5)) {
                    Ok(Command::Publish(seq, p)) => {
                        xpub.send_multipart([&b"kv"[..], &seq.to_be_bytes(), &p], 0)
                            .unwrap();
                    }
                    Ok(Command::Release) => released = true,
                    Err(_) => {}
                }
            }
        });
        Peer {
            events,
            replay,
            subscribed,
            requests,
            tx,
            stop,
            thread: Some(thread),
        }
    }

    fn publish(&self, seq: u64, payload: Vec<u8>) {
        self.tx.send(Command::Publish(seq, payload)).unwrap();
    }

    /// Sends the end marker of the held replay.
    fn release(&self) {
        self.tx.send(Command::Release).unwrap();
    }

    /// Waits until the router has subscribed.
    async fn wait_subscribed(&self) {
        let ok = support::wait_for(DEADLINE, || self.subscribed.load(Ordering::Relaxed)).await;
        assert!(ok, "the router never subscribed");
    }

    /// Waits until the router has subscribed (and, with a replay socket, asked for a replay).
    async fn wait_connected(&self) {
        let ok = support::wait_for(DEADLINE, || {
            self.subscribed.load(Ordering::Relaxed)
                && (self.replay.is_none() || self.requests.load(Ordering::Relaxed) > 0)
        })
        .await;
        assert!(
            ok,
            "the router never subscribed or never asked for a replay"
        );
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A router over one worker `w0` (a recording backend serving model `m`) whose KV events come
/// from `events` (and `replay`), plus extra TOML.
async fn router(events: &str, replay: Option<&str>, extra: &str) -> (RouterHandle, Backend) {
    let backend = Backend::start("w0", &["m"]).await;
    let text = format!(
        "policy = \"kv_aware\"\nshutdown_grace_s = 1.0\n{extra}\n[[models]]\nname = \"m\"\nblock_size = {BLOCK}\n"
    );
    let mut config = Config::from_toml(&text, Path::new("test")).unwrap();
    config.workers = vec![WorkerSpec {
        id: "w0".into(),
        url: BaseUrl::parse(&backend.url()).unwrap(),
        models: vec!["m".into()],
        kv_events: Some(events.into()),
        kv_replay: replay.map(str::to_owned),
        kv_blocks: None,
        data_parallel_size: 1,
        role: kvroute::fleet::Role::Both,
        bootstrap_port: None,
    }];
    (support::start_router(&config).await, backend)
}

/// `(overlap_blocks, kv_warming)` of worker `w0` for `text`, from `/debug/route`.
async fn explain(router: &RouterHandle, model: &str, text: &str) -> (u64, Value) {
    let url = format!("http://{}/debug/route", router.addr);
    let v = support::post_json(&url, &json!({"model": model, "prompt": text})).await;
    let c = v["candidates"][0].clone();
    (
        c["overlap_blocks"].as_u64().unwrap_or(0),
        c["kv_warming"].clone(),
    )
}

/// Polls `/debug/route` until `cond(overlap, warming)` holds; the last answer.
async fn until(
    router: &RouterHandle,
    model: &str,
    text: &str,
    cond: impl Fn(u64, &Value) -> bool,
) -> (u64, Value) {
    let end = Instant::now() + DEADLINE;
    loop {
        let (overlap, warming) = explain(router, model, text).await;
        if cond(overlap, &warming) || Instant::now() > end {
            return (overlap, warming);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The value of the series `series` (name and labels exactly) in the router's metrics.
async fn metric(router: &RouterHandle, series: &str) -> Option<f64> {
    let text = support::metrics_text(router.addr).await;
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_router_started_next_to_a_warm_idle_engine_sees_its_cache() {
    let engine = SimEngine::start("sim", 0, 50.0).await;
    let text: String = (0..300).map(|i| format!(" idle{i}")).collect();
    // The engine caches the prompt and publishes its blocks before any router listens; it
    // publishes nothing afterwards.
    let resp = support::client()
        .post(format!("http://{}/v1/completions", engine.addr))
        .json(&json!({"model": "sim", "prompt": text, "max_tokens": 1}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);

    let backend_text = "policy = \"kv_aware\"\nshutdown_grace_s = 1.0\n[[models]]\nname = \"sim\"\nblock_size = 16\n";
    let mut config = Config::from_toml(backend_text, Path::new("test")).unwrap();
    config.workers = vec![WorkerSpec {
        id: "w0".into(),
        url: BaseUrl::parse(&format!("http://{}", engine.addr)).unwrap(),
        models: vec!["sim".into()],
        kv_events: Some(engine.events.clone()),
        kv_replay: Some(engine.replay.clone()),
        kv_blocks: None,
        data_parallel_size: 1,
        role: kvroute::fleet::Role::Both,
        bootstrap_port: None,
    }];
    let router = support::start_router(&config).await;
    let (overlap, warming) = until(&router, "sim", &text, |o, w| o >= 16 && *w == false).await;
    assert!(
        overlap >= 16,
        "the idle engine's cache stays invisible: {overlap} blocks"
    );
    assert_eq!(warming, json!(false));
    assert_eq!(
        metric(&router, "kvroute_worker_warming{worker=\"w0\"}").await,
        Some(0.0)
    );
    assert!(
        metric(
            &router,
            "kvroute_kv_events_total{kind=\"replays_ok\",worker=\"w0\"}"
        )
        .await
        .is_some_and(|n| n >= 1.0)
    );
    router.shutdown().await;
    let _ = engine.handle.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_arriving_during_the_warm_up_replay_are_neither_lost_nor_applied_twice() {
    let (text, ids) = prompt();
    // 0: blocks 0-3; 1: block 3 evicted; 2: block 3 stored again; 3 (live only): block 4.
    let b0 = payload(vec![stored(&ids, 0, 4, 1, None)]);
    let b1 = payload(vec![removed(4)]);
    let b2 = payload(vec![stored(&ids, 3, 1, 14, Some(3))]);
    let b3 = payload(vec![stored(&ids, 4, 1, 15, Some(14))]);
    let peer = Peer::start(Some(Answer::Hold(vec![
        (0, b0),
        (1, b1.clone()),
        (2, b2.clone()),
    ])));
    let (router, _backend) = router(&peer.events, peer.replay.as_deref(), "").await;
    peer.wait_connected().await;

    // The replay has answered but not ended: the worker is warming.
    let (_, warming) = until(&router, "m", &text, |_, w| *w == true).await;
    assert_eq!(warming, json!(true), "the worker is not shown warming");
    assert_eq!(
        metric(&router, "kvroute_worker_warming{worker=\"w0\"}").await,
        Some(1.0)
    );
    // Live batches meanwhile: two the replay also returned, and a new one.
    peer.publish(1, b1);
    peer.publish(2, b2);
    peer.publish(3, b3);
    peer.release();

    let (overlap, warming) = until(&router, "m", &text, |o, w| o == 5 && *w == false).await;
    assert_eq!(
        overlap, 5,
        "a batch was lost or applied twice (blocks 0-4 expected)"
    );
    assert_eq!(warming, json!(false));
    let dups = metric(
        &router,
        "kvroute_kv_events_total{kind=\"duplicates\",worker=\"w0\"}",
    )
    .await;
    assert!(dups.is_some_and(|n| n >= 2.0), "duplicates: {dups:?}");
    router.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_undecodable_batch_drops_the_workers_entries_and_is_counted() {
    let (text, ids) = prompt();
    let peer = Peer::start(None);
    let (router, _backend) = router(&peer.events, None, "").await;
    peer.wait_connected().await;
    peer.publish(0, payload(vec![stored(&ids, 0, 4, 1, None)]));
    let (overlap, warming) = until(&router, "m", &text, |o, _| o == 4).await;
    assert_eq!(overlap, 4);
    assert_ne!(warming, json!(true), "no replay endpoint: never warming");

    // A BlockRemoved of block 3, cut short: it cannot be decoded, so what it removed is unknown.
    let mut cut = payload(vec![removed(4)]);
    cut.truncate(cut.len() - 2);
    peer.publish(1, cut.clone());
    let (overlap, _) = until(&router, "m", &text, |o, _| o == 0).await;
    assert_eq!(overlap, 0, "stale entries stay after an undecodable batch");
    // A flood of them is counted, every one.
    for seq in 2..502 {
        peer.publish(seq, cut.clone());
    }
    let series = "kvroute_kv_events_total{kind=\"undecodable\",worker=\"w0\"}";
    let end = Instant::now() + DEADLINE;
    while metric(&router, series).await != Some(501.0) && Instant::now() < end {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(metric(&router, series).await, Some(501.0));
    router.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endless_replay_peer_is_abandoned_and_live_events_still_apply() {
    let (text, ids) = prompt();
    let junk: Vec<(u64, Vec<u8>)> = (0..1000)
        .map(|seq| (seq, payload(vec![stored(&ids, 0, 1, 900, None)])))
        .collect();
    let peer = Peer::start(Some(Answer::Endless(junk)));
    let extra = "[kv_events]\nreplay_max_s = 2.0\nreplay_max_batches = 50000\n";
    let (router, _backend) = router(&peer.events, peer.replay.as_deref(), extra).await;
    peer.wait_subscribed().await;
    // Live batches while the replay runs (joining at 5, a replay from 0 would be asked for
    // now if it were not running already).
    peer.publish(5, payload(vec![stored(&ids, 0, 4, 1, None)]));
    peer.publish(6, payload(vec![stored(&ids, 4, 1, 5, Some(4))]));

    let (overlap, warming) = until(&router, "m", &text, |o, w| o == 5 && *w == false).await;
    assert_eq!(overlap, 5, "live events stopped applying behind the replay");
    assert_eq!(warming, json!(false));
    let abandoned = metric(
        &router,
        "kvroute_kv_events_total{kind=\"replays_abandoned\",worker=\"w0\"}",
    )
    .await;
    assert!(abandoned.is_some_and(|n| n >= 1.0), "{abandoned:?}");
    // And later live batches apply at once (the failed replay is not retried for a while).
    peer.publish(7, payload(vec![stored(&ids, 5, 1, 6, Some(5))]));
    let (overlap, _) = until(&router, "m", &text, |o, _| o == 6).await;
    assert_eq!(overlap, 6);
    router.shutdown().await;
}

/// The warm-up replay's end, as the subscriber reports it to its consumer.
async fn warmed(config: SubscriberConfig) -> Result<usize, ReplayError> {
    let (tx, mut rx) = tokio::sync::mpsc::channel(1024);
    let _sub = Subscriber::spawn(config, tx).unwrap();
    let end = Instant::now() + DEADLINE;
    loop {
        let msg = tokio::time::timeout_at(end, rx.recv())
            .await
            .expect("the replay never ended")
            .expect("the subscriber stopped");
        if let SubscriberEvent::Warmed { result } = msg.event {
            return result;
        }
    }
}

#[tokio::test]
async fn an_endless_replay_is_cut_at_its_byte_and_reply_bounds() {
    // Distinct batches of 1 KiB: the bytes held grow until the bound.
    let big: Vec<(u64, Vec<u8>)> = (0..1000).map(|seq| (seq, vec![0x90; 1024])).collect();
    let peer = Peer::start(Some(Answer::Endless(big)));
    let mut config =
        SubscriberConfig::new("w0", peer.events.clone()).with_replay(peer.replay.clone().unwrap());
    config.replay_limits = ReplayLimits {
        max_bytes: 10_000,
        ..ReplayLimits::default()
    };
    assert_eq!(
        warmed(config).await,
        Err(ReplayError::Abandoned(ReplayBound::Bytes(10_000)))
    );

    // The same batch over and over: duplicates hold nothing, but count as replies.
    let same = vec![(0, payload(vec![removed(1)]))];
    let peer = Peer::start(Some(Answer::Endless(same)));
    let mut config =
        SubscriberConfig::new("w0", peer.events.clone()).with_replay(peer.replay.clone().unwrap());
    config.replay_limits = ReplayLimits {
        max_batches: 100,
        ..ReplayLimits::default()
    };
    assert_eq!(
        warmed(config).await,
        Err(ReplayError::Abandoned(ReplayBound::Replies(100)))
    );
}
