//! The engine side: publish event batches on a ZMQ PUB socket with sequence numbers, and
//! answer replay requests from a bounded buffer on a ROUTER socket, as vLLM and SGLang do.
//!
//! Why a dedicated thread fed by a channel (and not a `Mutex<Socket>`): the ROUTER must answer
//! replay requests even while nobody publishes, so some thread has to own and poll it; ZeroMQ
//! sockets must not be used from several threads at once, so that thread owns the PUB socket
//! too. Callers only encode (in parallel, on their own threads) and, under a short lock,
//! take the next sequence number and enqueue, so numbers and send order always agree.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use thiserror::Error;

use super::encode::{Layout, encode_batch};
use super::subscription::zmq_context;
use super::wire::EventBatch;

/// How a publisher binds and speaks.
#[derive(Clone, Debug)]
pub struct PublisherConfig {
    /// PUB endpoint to bind, e.g. `tcp://127.0.0.1:5557` (`tcp://127.0.0.1:*` picks a port).
    pub endpoint: String,
    /// ROUTER endpoint to bind for replay, if any.
    pub replay_endpoint: Option<String>,
    /// Topic frame of every message (vLLM's and the fixtures' `kv-events`).
    pub topic: String,
    /// Wire layout of the payloads.
    pub layout: Layout,
    /// Replay replies as `[topic, seq, payload]` (vLLM ≥ 0.26) instead of `[seq, payload]`.
    pub reply_with_topic: bool,
    /// How many recent batches the replay buffer keeps (vLLM's `buffer_steps`).
    pub buffer_len: usize,
}

impl PublisherConfig {
    /// Defaults: topic `kv-events`, vLLM 0.33 layout and reply frames, no replay, 10,000 kept.
    pub fn new(endpoint: impl Into<String>) -> Self {
        let layout = Layout::default();
        PublisherConfig {
            endpoint: endpoint.into(),
            replay_endpoint: None,
            topic: "kv-events".into(),
            layout,
            reply_with_topic: layout.replay_reply_has_topic(),
            buffer_len: 10_000,
        }
    }

    /// Sets the replay endpoint.
    pub fn with_replay(mut self, endpoint: impl Into<String>) -> Self {
        self.replay_endpoint = Some(endpoint.into());
        self
    }

    /// Sets the layout and the reply frames of that release.
    pub fn with_layout(mut self, layout: Layout) -> Self {
        self.layout = layout;
        self.reply_with_topic = layout.replay_reply_has_topic();
        self
    }
}

/// Failure to start a publisher.
#[derive(Debug, Error)]
pub enum PublisherError {
    /// Socket creation or bind failed (port in use, malformed endpoint).
    #[error("cannot bind {endpoint}: {source}")]
    Bind {
        /// The endpoint.
        endpoint: String,
        /// The ZeroMQ error.
        source: zmq::Error,
    },
    /// The OS refused to start a thread.
    #[error("cannot start publisher thread: {0}")]
    Thread(#[from] std::io::Error),
}

/// A payload with its number, on its way to the socket thread.
struct Outgoing {
    seq: u64,
    payload: Arc<Vec<u8>>,
    /// False to keep it for replay only (a simulated lost message).
    live: bool,
}

/// A running publisher; dropping it closes the sockets (linger 0) and stops its thread.
pub struct Publisher {
    /// Next sequence number and the queue to the socket thread, taken together.
    queue: Mutex<Option<(u64, mpsc::Sender<Outgoing>)>>,
    layout: Layout,
    endpoint: String,
    replay_endpoint: Option<String>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Publisher {
    /// Binds the sockets and starts the socket thread.
    pub fn bind(config: PublisherConfig) -> Result<Publisher, PublisherError> {
        let bind = |kind, endpoint: &str| -> Result<(zmq::Socket, String), PublisherError> {
            let err = |source| PublisherError::Bind {
                endpoint: endpoint.to_owned(),
                source,
            };
            let socket = zmq_context().socket(kind).map_err(err)?;
            socket.set_linger(0).map_err(err)?;
            socket.set_sndhwm(100_000).map_err(err)?;
            socket.bind(endpoint).map_err(err)?;
            let bound = match socket.get_last_endpoint() {
                Ok(Ok(bound)) => bound,
                _ => endpoint.to_owned(),
            };
            Ok((socket, bound))
        };
        let (pub_socket, endpoint) = bind(zmq::PUB, &config.endpoint)?;
        let router = match &config.replay_endpoint {
            Some(e) => Some(bind(zmq::ROUTER, e)?),
            None => None,
        };
        let replay_endpoint = router.as_ref().map(|(_, e)| e.clone());
        let (tx, rx) = mpsc::channel();
        let stop = Arc::new(AtomicBool::new(false));
        let mut sockets = Sockets {
            publisher: pub_socket,
            router: router.map(|(s, _)| s),
            topic: config.topic.into_bytes(),
            reply_with_topic: config.reply_with_topic,
            buffer: VecDeque::new(),
            buffer_len: config.buffer_len,
        };
        let thread_stop = stop.clone();
        let thread = std::thread::Builder::new()
            .name("kv-pub".into())
            .spawn(move || sockets.run(rx, &thread_stop))?;
        Ok(Publisher {
            queue: Mutex::new(Some((0, tx))),
            layout: config.layout,
            endpoint,
            replay_endpoint,
            stop,
            thread: Some(thread),
        })
    }

    /// The bound PUB endpoint (with the real port if `*` was asked).
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The bound replay endpoint, if any.
    pub fn replay_endpoint(&self) -> Option<&str> {
        self.replay_endpoint.as_deref()
    }

    /// Encodes and publishes a batch; returns its sequence number. Callable from any thread.
    pub fn publish(&self, batch: &EventBatch) -> u64 {
        self.enqueue(encode_batch(batch, self.layout), true)
    }

    /// Publishes an already encoded payload as is (e.g. a malformed one, in tests).
    #[cfg(any(test, feature = "testing"))]
    pub fn publish_raw(&self, payload: Vec<u8>) -> u64 {
        self.enqueue(payload, true)
    }

    /// Numbers and buffers a batch for replay without sending it live: a message lost on the
    /// way, for fault-injection tests of the subscriber's gap handling.
    #[cfg(any(test, feature = "testing"))]
    pub fn publish_lost(&self, batch: &EventBatch) -> u64 {
        self.enqueue(encode_batch(batch, self.layout), false)
    }

    fn enqueue(&self, payload: Vec<u8>, live: bool) -> u64 {
        let payload = Arc::new(payload);
        // A poisoned lock only means another publishing thread panicked; the counter is fine.
        let mut guard = self.queue.lock().unwrap_or_else(|p| p.into_inner());
        let Some((next, tx)) = guard.as_mut() else {
            return 0;
        };
        let seq = *next;
        *next += 1;
        if tx.send(Outgoing { seq, payload, live }).is_err() {
            tracing::warn!(seq, "kv-events publisher thread is gone; batch not sent");
        }
        seq
    }
}

impl Drop for Publisher {
    fn drop(&mut self) {
        // Closing the queue lets the thread send what is queued, then exit.
        if let Ok(mut guard) = self.queue.lock() {
            guard.take();
        }
        if let Some(thread) = self.thread.take() {
            // Bound the wait even if the queue is long: the flag ends the loop.
            let deadline = std::time::Instant::now() + Duration::from_secs(1);
            while !thread.is_finished() && std::time::Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(1));
            }
            self.stop.store(true, Ordering::Relaxed);
            let _ = thread.join();
        }
    }
}

/// The sockets and replay buffer, owned by the socket thread.
struct Sockets {
    publisher: zmq::Socket,
    router: Option<zmq::Socket>,
    topic: Vec<u8>,
    reply_with_topic: bool,
    buffer: VecDeque<(u64, Arc<Vec<u8>>)>,
    buffer_len: usize,
}

impl Sockets {
    fn run(&mut self, rx: mpsc::Receiver<Outgoing>, stop: &AtomicBool) {
        while !stop.load(Ordering::Relaxed) {
            self.serve_replays();
            match rx.recv_timeout(Duration::from_millis(2)) {
                Ok(out) => self.send(out),
                Err(RecvTimeoutError::Timeout) => continue,
                Err(RecvTimeoutError::Disconnected) => return,
            }
        }
    }

    fn send(&mut self, out: Outgoing) {
        let seq = out.seq.to_be_bytes();
        if out.live {
            let frames = [&self.topic[..], &seq[..], &out.payload[..]];
            if let Err(e) = self.publisher.send_multipart(frames, 0) {
                tracing::warn!(seq = out.seq, error = %e, "kv-events publish failed");
            }
        }
        if self.buffer_len > 0 {
            if self.buffer.len() == self.buffer_len {
                self.buffer.pop_front();
            }
            self.buffer.push_back((out.seq, out.payload));
        }
    }

    /// Answers every pending replay request: `[identity, "", start_seq]`.
    fn serve_replays(&self) {
        let Some(router) = &self.router else { return };
        while let Ok(frames) = router.recv_multipart(zmq::DONTWAIT) {
            let [identity, _, start]: [Vec<u8>; 3] = match frames.try_into() {
                Ok(f) => f,
                Err(_) => continue,
            };
            let Ok(start) = <[u8; 8]>::try_from(start) else {
                continue;
            };
            let start = u64::from_be_bytes(start);
            let reply = |seq: &[u8], payload: &[u8]| {
                let result = if self.reply_with_topic {
                    router
                        .send_multipart([&identity[..], &b""[..], &self.topic[..], seq, payload], 0)
                } else {
                    router.send_multipart([&identity[..], &b""[..], seq, payload], 0)
                };
                if let Err(e) = result {
                    tracing::warn!(error = %e, "kv-events replay reply failed");
                }
            };
            for (seq, payload) in self.buffer.iter().filter(|(s, _)| *s >= start) {
                reply(&seq.to_be_bytes(), payload);
            }
            reply(&(-1i64).to_be_bytes(), b"");
        }
    }
}
