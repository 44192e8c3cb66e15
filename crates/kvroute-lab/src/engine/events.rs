//! Where the engine's KV events go.
//!
//! The model core only produces [`KvEvent`]s; how they leave the process (ZeroMQ in vLLM's
//! wire format, a channel in tests, nowhere) is this small trait, so the core and the HTTP
//! face do not depend on the socket code.

use tokio::sync::mpsc;

use kvroute_router::kv_events::{EventBatch, KvEvent, Publisher};

/// A destination for batches of KV events, in the order the engine produced them.
pub trait KvEventSink: Send + 'static {
    /// Publishes one batch. Must not block for long: it runs on the engine loop.
    fn publish(&mut self, batch: EventBatch);
}

/// Drops every event (an engine started without KV events).
#[derive(Debug, Default)]
pub struct NoEvents;

impl KvEventSink for NoEvents {
    fn publish(&mut self, _batch: EventBatch) {}
}

/// Sends batches into a tokio channel (tests, in-process consumers).
#[derive(Debug)]
pub struct ChannelSink(pub mpsc::UnboundedSender<EventBatch>);

impl KvEventSink for ChannelSink {
    fn publish(&mut self, batch: EventBatch) {
        // A closed receiver means nobody listens any more; the engine keeps serving.
        let _ = self.0.send(batch);
    }
}

/// vLLM's wire format on ZeroMQ: PUB with sequence numbers, ROUTER replay.
impl KvEventSink for Publisher {
    fn publish(&mut self, batch: EventBatch) {
        // The publisher numbers, encodes and hands the payload to its socket thread.
        Publisher::publish(self, &batch);
    }
}

/// The batch vLLM's data-parallel rank `rank` (0 without data parallelism) would publish for
/// `events` at wall time `ts` (seconds since the epoch).
pub fn batch(ts: f64, events: Vec<KvEvent>, rank: u32) -> EventBatch {
    EventBatch {
        ts,
        events,
        dp_rank: Some(i64::from(rank)),
    }
}
