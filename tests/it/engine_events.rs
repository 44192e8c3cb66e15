//! The simulated engine's KV events over real ZeroMQ on 127.0.0.1: a raw SUB socket checks
//! the frame layout and sequence numbers, decodes every payload and replays the events into a
//! model of the cache, which must agree with what the engine then reports as cached; a DEALER
//! replays from a sequence number. Every wait is bounded.

use std::collections::{HashSet, VecDeque};
use std::time::Duration;

use kvroute::engine::{EngineConfig, EngineHandle, ServeConfig, StepTiming, start};
use kvroute::kv_events::{
    EngineHash, EventBatch, KvEvent, Layout, Publisher, PublisherConfig, decode_batch, encode_batch,
};
use serde_json::{Value, json};
use tokio::net::TcpListener;

use crate::support::free_port;
use tokio::time::timeout;

const MODEL: &str = "sim-model";
const WAIT: Duration = Duration::from_secs(10);

struct Setup {
    engine: EngineHandle,
    pub_endpoint: String,
    replay_endpoint: String,
    ctx: zmq::Context,
}

/// An engine of 8 blocks × 16 tokens publishing on ephemeral ports, topic "" like vLLM.
async fn setup() -> Setup {
    let mut pc = PublisherConfig::new("tcp://127.0.0.1:*").with_replay("tcp://127.0.0.1:*");
    pc.topic = String::new();
    let publisher = Publisher::bind(pc).unwrap();
    let pub_endpoint = publisher.endpoint().to_owned();
    let replay_endpoint = publisher.replay_endpoint().unwrap().to_owned();
    let mut config = ServeConfig::new(MODEL);
    config.core = EngineConfig {
        num_blocks: 8,
        block_size: 16,
        timing: StepTiming {
            speedup: 100.0,
            ..StepTiming::default()
        },
        ..EngineConfig::default()
    };
    config.events = Box::new(publisher);
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    Setup {
        engine: start(config, listener).await.unwrap(),
        pub_endpoint,
        replay_endpoint,
        ctx: zmq::Context::new(),
    }
}

fn subscriber(s: &Setup) -> zmq::Socket {
    let sub = s.ctx.socket(zmq::SUB).unwrap();
    sub.set_linger(0).unwrap();
    sub.set_rcvhwm(0).unwrap();
    sub.set_rcvtimeo(5000).unwrap();
    sub.set_subscribe(b"").unwrap();
    sub.connect(&s.pub_endpoint).unwrap();
    sub
}

/// One live message: (seq, payload), after checking its three frames.
fn recv(sub: &zmq::Socket) -> (u64, Vec<u8>) {
    let frames = sub.recv_multipart(0).expect("no KV event within 5 s");
    assert_eq!(frames.len(), 3, "topic, seq, payload");
    assert!(frames[0].is_empty(), "topic frame");
    let seq: [u8; 8] = frames[1].as_slice().try_into().expect("8-byte sequence");
    (u64::from_be_bytes(seq), frames[2].clone())
}

/// A DEALER replay from `start`: every (seq, payload) until the -1 terminator.
fn replay(s: &Setup, start: u64) -> Vec<(u64, Vec<u8>)> {
    let dealer = s.ctx.socket(zmq::DEALER).unwrap();
    dealer.set_linger(0).unwrap();
    dealer.set_rcvtimeo(5000).unwrap();
    dealer.connect(&s.replay_endpoint).unwrap();
    dealer
        .send_multipart([&b""[..], &start.to_be_bytes()[..]], 0)
        .unwrap();
    let mut out = Vec::new();
    loop {
        let frames = dealer.recv_multipart(0).expect("replay reply within 5 s");
        // ["", topic, seq, payload] (vLLM >= 0.26) or ["", seq, payload] (older).
        assert!(
            frames.len() == 4 || frames.len() == 3,
            "{} frames",
            frames.len()
        );
        assert!(frames[0].is_empty(), "delimiter frame");
        let n = frames.len();
        let seq = i64::from_be_bytes(frames[n - 2].as_slice().try_into().unwrap());
        if seq == -1 {
            return out;
        }
        out.push((seq as u64, frames[n - 1].clone()));
    }
}

/// Messages in sequence order from the live SUB socket. A subscription that joined late (ZMQ's
/// slow joiner) gets what it missed from replay, as a router's subscriber would.
struct Feed<'a> {
    sub: zmq::Socket,
    setup: &'a Setup,
    pending: VecDeque<(u64, Vec<u8>)>,
    next: u64,
}

impl<'a> Feed<'a> {
    fn new(setup: &'a Setup) -> Self {
        Feed {
            sub: subscriber(setup),
            setup,
            pending: VecDeque::new(),
            next: 0,
        }
    }

    fn next(&mut self) -> (u64, Vec<u8>) {
        tokio::task::block_in_place(|| {
            if let Some(m) = self.pending.pop_front() {
                self.next = m.0 + 1;
                return m;
            }
            let m = recv(&self.sub);
            if m.0 == self.next {
                self.next += 1;
                return m;
            }
            assert!(
                m.0 > self.next,
                "sequence went backwards: {} < {}",
                m.0,
                self.next
            );
            self.pending = replay(self.setup, self.next)
                .into_iter()
                .filter(|(q, _)| *q <= m.0)
                .collect();
            let m = self
                .pending
                .pop_front()
                .expect("replay has the missed batches");
            assert_eq!(m.0, self.next);
            self.next += 1;
            m
        })
    }
}

async fn complete(h: &EngineHandle, prompt: &[u32]) -> Value {
    let body = json!({"model": MODEL, "prompt": prompt, "max_tokens": 1});
    let fut = reqwest::Client::new()
        .post(format!("http://{}/v1/completions", h.local_addr()))
        .json(&body)
        .send();
    let r = timeout(WAIT, fut).await.unwrap().unwrap();
    assert_eq!(r.status(), 200);
    r.json().await.unwrap()
}

fn cached_tokens(v: &Value) -> u64 {
    v["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap()
}

/// The router's view: the set of engine hashes the events say are cached.
#[derive(Default)]
struct CacheModel {
    held: HashSet<EngineHash>,
    /// token ids per block hash, from BlockStored
    stored: Vec<(EngineHash, Vec<u32>)>,
}

impl CacheModel {
    fn apply(&mut self, batch: &EventBatch) {
        for ev in &batch.events {
            match ev {
                KvEvent::Stored(s) => {
                    assert_eq!(s.block_size, 16);
                    assert_eq!(s.token_ids.len(), s.block_hashes.len() * 16);
                    if let Some(p) = s.parent_block_hash {
                        assert!(self.held.contains(&p), "parent {p:?} not cached");
                    }
                    for (h, toks) in s.block_hashes.iter().zip(s.token_ids.chunks(16)) {
                        assert!(self.held.insert(*h), "{h:?} stored twice");
                        self.stored.push((*h, toks.to_vec()));
                    }
                }
                KvEvent::Removed(r) => {
                    for h in &r.block_hashes {
                        assert!(self.held.remove(h), "{h:?} removed but not cached");
                    }
                }
                KvEvent::AllCleared => self.held.clear(),
                KvEvent::Unknown(t) => panic!("unknown event {t}"),
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_track_the_cache_with_sequence_and_replay() {
    let s = setup().await;
    let mut feed = Feed::new(&s);
    // Give the subscription time to reach the publisher; Feed replays anything it missed.
    tokio::time::sleep(Duration::from_millis(200)).await;

    let a: Vec<u32> = (0..40).collect();
    let b: Vec<u32> = (1000..1120).collect();
    let mut model = CacheModel::default();
    let mut live: Vec<(u64, Vec<u8>)> = Vec::new();

    // A: 40 tokens → 2 full blocks stored.
    complete(&s.engine, &a).await;
    live.push(feed.next());
    // B: 120 tokens need all 8 blocks: A's two cached blocks are evicted (tail first), then
    // B's 7 full blocks are stored.
    complete(&s.engine, &b).await;
    live.push(feed.next());

    let batches: Vec<EventBatch> = live.iter().map(|(_, p)| decode_batch(p).unwrap()).collect();
    // Payloads are exactly vLLM 0.33's encoding of their content (the default layout).
    for ((_, payload), batch) in live.iter().zip(&batches) {
        assert_eq!(&encode_batch(batch, Layout::Vllm0_33), payload);
    }
    let KvEvent::Stored(first) = &batches[0].events[0] else {
        panic!("{:?}", batches[0])
    };
    assert_eq!(first.parent_block_hash, None);
    assert_eq!(first.token_ids, a[..32].to_vec());
    assert_eq!(first.block_hashes.len(), 2);
    let kinds: Vec<&str> = batches[1]
        .events
        .iter()
        .map(|e| match e {
            KvEvent::Stored(_) => "stored",
            KvEvent::Removed(_) => "removed",
            _ => "other",
        })
        .collect();
    assert_eq!(kinds, vec!["removed", "removed", "stored"]);
    let KvEvent::Removed(r0) = &batches[1].events[0] else {
        unreachable!()
    };
    assert_eq!(
        r0.block_hashes,
        vec![first.block_hashes[1]],
        "A's tail block goes first"
    );
    for batch in &batches {
        model.apply(batch);
    }
    // Events say: only B's 7 blocks are cached. The engine agrees.
    assert_eq!(model.held.len(), 7);
    let b_blocks: Vec<Vec<u32>> = b[..112].chunks(16).map(<[u32]>::to_vec).collect();
    let stored_b: Vec<Vec<u32>> = model.stored[2..].iter().map(|(_, t)| t.clone()).collect();
    assert_eq!(stored_b, b_blocks);
    // Engine hashes are opaque ids, not kvroute's own hashes.
    let ours =
        kvroute::tokens::block_hashes(kvroute::tokens::HashSeed::new(MODEL, None, None), &b, 16);
    assert!(
        model
            .stored
            .iter()
            .all(|(h, _)| ours.iter().all(|o| o.0 != h.0))
    );

    // A again: evicted, nothing cached; this stores A's blocks and evicts B's LRU blocks.
    let v = complete(&s.engine, &a).await;
    assert_eq!(cached_tokens(&v), 0);
    live.push(feed.next());
    let batch = decode_batch(&live[2].1).unwrap();
    model.apply(&batch);
    // Reset: refused never here (idle engine), AllBlocksCleared follows.
    let r = timeout(
        WAIT,
        reqwest::Client::new()
            .post(format!(
                "http://{}/reset_prefix_cache",
                s.engine.local_addr()
            ))
            .send(),
    )
    .await
    .unwrap()
    .unwrap();
    assert_eq!(r.status(), 200);
    live.push(feed.next());
    let batch = decode_batch(&live[3].1).unwrap();
    assert_eq!(batch.events, vec![KvEvent::AllCleared]);
    model.apply(&batch);
    assert!(model.held.is_empty());
    let v = complete(&s.engine, &a).await;
    assert_eq!(cached_tokens(&v), 0, "cleared cache serves no hit");
    live.push(feed.next());

    // Sequence numbers count every batch from 0 without gaps.
    let seqs: Vec<u64> = live.iter().map(|(q, _)| *q).collect();
    assert_eq!(seqs, (0..live.len() as u64).collect::<Vec<_>>());

    // Replay from 2 returns exactly the batches published from 2 on.
    let replayed = tokio::task::block_in_place(|| replay(&s, 2));
    assert_eq!(replayed, live[2..].to_vec());
    s.engine.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeated_prompt_hits_what_the_events_announced() {
    let s = setup().await;
    let mut feed = Feed::new(&s);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let p: Vec<u32> = (0..50).collect();
    complete(&s.engine, &p).await;
    let (_, payload) = feed.next();
    let batch = decode_batch(&payload).unwrap();
    let announced: usize = batch
        .events
        .iter()
        .map(|e| match e {
            KvEvent::Stored(st) => st.block_hashes.len(),
            _ => 0,
        })
        .sum();
    assert_eq!(announced, 3);
    let v = complete(&s.engine, &p).await;
    // All 3 announced blocks hit ((50 - 1) / 16 = 3).
    assert_eq!(cached_tokens(&v), 48);
    s.engine.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cli_flags_pick_an_older_array_layout() {
    use kvroute::engine::{EngineArgs, EngineCoreArgs};
    let args = EngineArgs {
        kv_events_endpoint: format!("tcp://127.0.0.1:{}", free_port()),
        kv_replay_endpoint: format!("tcp://127.0.0.1:{}", free_port()),
        kv_events_layout: "vllm-0.22".into(),
        model: MODEL.into(),
        core: EngineCoreArgs {
            engine_speedup: 100.0,
            ..EngineCoreArgs::default()
        },
        ..EngineArgs::default()
    };
    let config = args.serve_config().unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let engine = start(config, listener).await.unwrap();
    let s = Setup {
        engine,
        pub_endpoint: args.kv_events_endpoint.clone(),
        replay_endpoint: args.kv_replay_endpoint.clone(),
        ctx: zmq::Context::new(),
    };
    let mut feed = Feed::new(&s);
    tokio::time::sleep(Duration::from_millis(200)).await;
    complete(&s.engine, &(0..40).collect::<Vec<u32>>()).await;
    let (seq, payload) = feed.next();
    assert_eq!(seq, 0);
    let batch = decode_batch(&payload).unwrap();
    assert!(matches!(&batch.events[0], KvEvent::Stored(st) if st.block_hashes.len() == 2));
    // The payload is exactly the vLLM 0.22 encoding of its content (array events).
    assert_eq!(encode_batch(&batch, Layout::Vllm0_22), payload);
    assert_ne!(encode_batch(&batch, Layout::Vllm0_33), payload);
    s.engine.shutdown().await.unwrap();
}
