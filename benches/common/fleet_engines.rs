//! Many simulated engines publishing KV events on real ZeroMQ PUB sockets, for the
//! event-to-index lag bench (`benches/event_lag.rs`).
//!
//! Every engine has its own PUB socket on its own TCP port, its own sequence numbers and its
//! own cache; what is shared is the thread that drives it: a few publisher threads each drive
//! a slice of the engines (1,024 engine threads would take the 2 cores from the router under
//! test), each thread with its own ZeroMQ context, as separate engine processes would have.
//! A thread publishes its engines' batches round-robin at evenly spaced instants, so the
//! fleet's batches are spread over time as unsynchronised engines' are.
//!
//! An engine's cache: requests of `request_blocks` blocks, prefilled over successive batches
//! (each batch stores the next `store` blocks of the current request, chained to the last
//! one); once the engine holds more than `capacity` blocks it evicts the oldest request's
//! blocks from its tail (as vLLM frees a finished request's blocks, leaf first), at most
//! `store` blocks per batch, so stores and removals balance in the steady state. Token ids are
//! unique to (engine, block), so no two engines share a block: the lag measured is the feed's,
//! not the index's dedup of shared prefixes.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use kvroute::kv_events::{BlockRemoved, BlockStored, EngineHash, EventBatch, KvEvent, Layout};
use kvroute::tokens::{BlockHash, HashSeed, chain_hash};

/// A request whose first batch was just published: the lookups thread times how long until
/// the index shows `worker` holding `hashes[0]`.
pub struct Tracer {
    /// When its first batch was sent, in ns of the wall clock ([`unix_ns`]): the publishers run
    /// in another process, and both read the same clock.
    pub published: u128,
    pub worker: u32,
    /// The engine's request number (its tokens follow from it and the worker).
    pub counter: u64,
    /// kvroute hashes of the request's whole prompt (what a lookup for it would ask).
    pub hashes: Arc<Vec<BlockHash>>,
}

/// How the engines publish.
#[derive(Clone, Copy, Debug)]
pub struct Shape {
    /// Blocks stored per batch (and at most that many removed).
    pub store: usize,
    /// Blocks per request.
    pub request_blocks: usize,
    /// Blocks an engine holds before it evicts.
    pub capacity: usize,
    /// Tokens per block.
    pub block_size: usize,
}

struct Request {
    engine_ids: Vec<EngineHash>,
    /// Blocks of it still held, from the front; evicted from the back.
    held: usize,
}

/// One engine: its socket, sequence, cache and current request.
pub struct Engine {
    socket: zmq::Socket,
    pub endpoint: String,
    worker: u32,
    seq: u64,
    next_id: u64,
    requests: VecDeque<Request>,
    held: usize,
    /// The request being prefilled: its hashes and how many blocks are stored so far.
    current: Option<(Arc<Vec<BlockHash>>, Vec<u32>, usize)>,
    counter: u64,
}

/// Now, in ns since the Unix epoch: a clock both bench processes read.
pub fn unix_ns() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0)
}

/// The kvroute hashes and token ids of engine `worker`'s request number `counter`.
pub fn request(
    worker: u32,
    counter: u64,
    shape: Shape,
    seed: HashSeed,
) -> (Vec<BlockHash>, Vec<u32>) {
    let n = shape.request_blocks * shape.block_size;
    let tokens: Vec<u32> = (0..n).map(|i| token(worker, counter, i)).collect();
    let mut parent = None;
    let hashes: Vec<BlockHash> = tokens
        .chunks_exact(shape.block_size)
        .map(|b| {
            let h = chain_hash(seed, parent, b);
            parent = Some(h);
            h
        })
        .collect();
    (hashes, tokens)
}

fn token(worker: u32, counter: u64, i: usize) -> u32 {
    let mut x = (u64::from(worker) << 40) ^ (counter << 12) ^ i as u64;
    x = x.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    (x >> 40) as u32 % 150_000
}

impl Engine {
    /// Binds a PUB socket on a free port of 127.0.0.1 in `ctx`.
    pub fn bind(ctx: &zmq::Context, worker: u32) -> Engine {
        let socket = ctx.socket(zmq::PUB).unwrap();
        socket.set_linger(0).unwrap();
        socket.set_sndhwm(100_000).unwrap();
        socket.bind("tcp://127.0.0.1:*").unwrap();
        let endpoint = socket.get_last_endpoint().unwrap().unwrap();
        Engine {
            socket,
            endpoint,
            worker,
            seq: 0,
            next_id: 0,
            requests: VecDeque::new(),
            held: 0,
            current: None,
            counter: 0,
        }
    }

    /// Builds the engine's next batch; `Some(tracer)` when it starts a request.
    fn next_batch(&mut self, shape: Shape, seed: HashSeed) -> (EventBatch, Option<Tracer>) {
        let mut tracer = None;
        if self.current.is_none() {
            self.counter += 1;
            let (hashes, tokens) = request(self.worker, self.counter, shape, seed);
            let hashes = Arc::new(hashes);
            tracer = Some(Tracer {
                published: unix_ns(),
                worker: self.worker,
                counter: self.counter,
                hashes: Arc::clone(&hashes),
            });
            self.current = Some((hashes, tokens, 0));
            self.requests.push_back(Request {
                engine_ids: Vec::with_capacity(shape.request_blocks),
                held: 0,
            });
        }
        let mut events = Vec::with_capacity(2);
        let removed = self.evict(shape.store, shape.capacity);
        if !removed.is_empty() {
            events.push(KvEvent::Removed(BlockRemoved {
                block_hashes: removed,
                ..BlockRemoved::default()
            }));
        }
        let (hashes, tokens, done) = self.current.as_mut().unwrap();
        let take = shape.store.min(hashes.len() - *done);
        let request = self.requests.back_mut().unwrap();
        let parent = request.engine_ids.last().copied();
        let ids: Vec<EngineHash> = (0..take)
            .map(|_| {
                self.next_id += 1;
                EngineHash(u64::from(self.worker) << 40 | self.next_id)
            })
            .collect();
        request.engine_ids.extend(&ids);
        request.held += take;
        self.held += take;
        let bs = shape.block_size;
        events.push(KvEvent::Stored(BlockStored {
            block_hashes: ids,
            parent_block_hash: parent,
            token_ids: tokens[*done * bs..(*done + take) * bs].to_vec(),
            block_size: bs as u32,
            ..BlockStored::default()
        }));
        *done += take;
        if *done == hashes.len() {
            self.current = None;
        }
        let batch = EventBatch {
            ts: 0.0,
            events,
            dp_rank: None,
        };
        (batch, tracer)
    }

    /// Up to `n` blocks evicted while over capacity: the oldest finished request's, tail first.
    fn evict(&mut self, n: usize, capacity: usize) -> Vec<EngineHash> {
        let mut out = Vec::new();
        while out.len() < n && self.held > capacity {
            // Never the request being prefilled (the last one).
            if self.requests.len() < 2 {
                break;
            }
            let oldest = self.requests.front_mut().unwrap();
            oldest.held -= 1;
            out.push(oldest.engine_ids[oldest.held]);
            self.held -= 1;
            if oldest.held == 0 {
                self.requests.pop_front();
            }
        }
        out
    }

    /// Encodes and sends one batch; returns its tracer, if it starts a request.
    pub fn publish(&mut self, shape: Shape, seed: HashSeed) -> (Option<Tracer>, usize) {
        let (batch, mut tracer) = self.next_batch(shape, seed);
        let blocks = batch
            .events
            .iter()
            .map(|e| match e {
                KvEvent::Stored(s) => s.block_hashes.len(),
                KvEvent::Removed(r) => r.block_hashes.len(),
                _ => 0,
            })
            .sum();
        let payload = kvroute::kv_events::encode_batch(&batch, Layout::default());
        let seq = self.seq.to_be_bytes();
        self.seq += 1;
        if let Some(t) = tracer.as_mut() {
            t.published = unix_ns();
        }
        self.socket
            .send_multipart([&b"kv-events"[..], &seq[..], &payload[..]], 0)
            .unwrap();
        (tracer, blocks)
    }
}

/// What a publisher thread did.
#[derive(Default)]
pub struct Published {
    pub batches: u64,
    pub blocks: u64,
    /// Sends that were due more than 10 ms before they went out (the thread fell behind).
    pub late: u64,
}

/// Publishes each engine's batches `per_engine_hz` times a second, round-robin at evenly
/// spaced instants, until `stop` is reached; tracers go to `tracers` when `trace` is set.
pub fn drive(
    mut engines: Vec<Engine>,
    shape: Shape,
    seed: HashSeed,
    per_engine_hz: f64,
    until: Instant,
    tracers: Option<mpsc::Sender<Tracer>>,
) -> (Vec<Engine>, Published) {
    let mut out = Published::default();
    if engines.is_empty() {
        return (engines, out);
    }
    let gap = Duration::from_secs_f64(1.0 / per_engine_hz / engines.len() as f64);
    let start = Instant::now();
    let mut i: u64 = 0;
    loop {
        let due = start + gap.mul_f64(i as f64);
        if due >= until {
            break;
        }
        let now = Instant::now();
        if due > now {
            std::thread::sleep(due - now);
        } else if now - due > Duration::from_millis(10) {
            out.late += 1;
        }
        let k = (i % engines.len() as u64) as usize;
        let (tracer, blocks) = engines[k].publish(shape, seed);
        out.batches += 1;
        out.blocks += blocks as u64;
        if let (Some(t), Some(tx)) = (tracer, tracers.as_ref()) {
            let _ = tx.send(t);
        }
        i += 1;
    }
    (engines, out)
}
