//! Feeding one worker's KV events into the index.
//!
//! A [`WorkerFeed`] owns the worker's ZeroMQ subscription (read by a shared intake thread, see
//! `kv_events::subscriber`) and a task that applies what it receives: batches in sequence
//! order, and a full clear of the worker's entries whenever the subscriber says the stream
//! cannot be trusted (publisher restart, unrecoverable gap, a batch that cannot be decoded).
//! Stale entries are worse than none: they route requests to a worker for a prefix it no longer
//! holds. While the subscriber's warm-up replay runs, the worker is marked warming (its entries
//! are a lower bound of its cache; routing uses them as they are).
//!
//! Dropping the feed stops both and clears the worker's entries, so a removed worker leaves
//! nothing behind.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use super::Holdings;
use crate::fleet::WorkerId;
use crate::kv_events::{
    EventBatch, KvEvent, Subscriber, SubscriberConfig, SubscriberError, SubscriberEvent,
    SubscriberHandle, SubscriberStats, WorkerEvent,
};
use crate::tokens::HashSeed;
use crate::tokens::model::hash_seed;

/// Events queued between the intake thread and the applying task; beyond it the subscription's
/// socket is not read (ZeroMQ then buffers, since the receive high-water mark is unbounded).
const QUEUE: usize = 4096;

/// How long events wait for their worker's model to become known (its first health check
/// discovers it) before batches are skipped instead, so a worker whose model list never
/// arrives cannot make events pile up.
const MODEL_WAIT: Duration = Duration::from_secs(10);

/// The worker's base model, whose name seeds its blocks' hashes; `None` while unknown.
pub type ModelOf = Box<dyn Fn() -> Option<FeedModel> + Send + Sync>;

/// What a feed must know of its worker's model: the name that seeds the worker's block
/// hashes, and the block size kvroute hashes that model's requests in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FeedModel {
    /// The model's name.
    pub name: String,
    /// `[[models]] block_size` (or the default): tokens per block of its requests' hashes.
    pub block_size: u32,
}

/// Told `true` when the worker's warm-up replay starts and `false` once its batches are
/// applied (or it failed, or the feed stopped).
pub type WarmingHook = Box<dyn Fn(bool) + Send + Sync>;

/// At most one warning per this interval for a worker whose blocks have another size than its
/// model's (every batch it publishes has them).
const BLOCK_SIZE_LOG_EVERY: Duration = Duration::from_secs(60);

/// At most one warning per this interval for undecodable batches (a flood of bad payloads
/// must not flood the log; `kvroute_kv_events_total{kind="undecodable"}` counts them all).
const UNDECODABLE_LOG_EVERY: Duration = Duration::from_secs(10);

/// How a worker's events are seeded: its base model, with the salt and LoRA name each event
/// carries, exactly as a request for that model, adapter and salt is hashed. The simulator
/// seeds its engines' events with the same function.
pub fn seeds_for(model: &str) -> impl Fn(Option<&str>, Option<&str>) -> HashSeed + '_ {
    move |salt, lora| hash_seed(model, lora, salt)
}

/// A running event feed for one worker.
pub struct WorkerFeed {
    worker: WorkerId,
    holdings: Arc<Holdings>,
    subscriber: Option<SubscriberHandle>,
    task: tokio::task::JoinHandle<()>,
}

impl WorkerFeed {
    /// Subscribes to the worker's events and applies them to `holdings`; block chains are
    /// seeded for the model `model` names when a batch arrives (with the salt and LoRA name
    /// each event carries); `warming` hears when the warm-up replay starts and ends. Must be
    /// called on a Tokio runtime.
    pub fn start(
        holdings: Arc<Holdings>,
        worker: WorkerId,
        model: ModelOf,
        warming: WarmingHook,
        config: SubscriberConfig,
    ) -> Result<WorkerFeed, SubscriberError> {
        let (tx, mut rx) = mpsc::channel(QUEUE);
        let rank = config.dp_rank;
        let subscriber = Subscriber::spawn(config, tx)?;
        let stats = Arc::clone(subscriber.stats());
        let index = Arc::clone(&holdings);
        let task = tokio::spawn(async move {
            let mut applier = Applier {
                // Whatever ends the task (a stop, a closed channel), the worker is not warming.
                warming: WarmingGuard(warming),
                index,
                worker,
                rank,
                stats,
                model,
                model_wait: ModelWait::default(),
                undecodable: Throttle::new(UNDECODABLE_LOG_EVERY),
                other_size: Throttle::new(BLOCK_SIZE_LOG_EVERY),
                other_rank: Throttle::new(BLOCK_SIZE_LOG_EVERY),
            };
            applier.run(&mut rx).await;
        });
        Ok(WorkerFeed {
            worker,
            holdings,
            subscriber: Some(subscriber),
            task,
        })
    }

    /// Stops the subscriber and waits until the applying task has ended, then removes the
    /// worker's entries: nothing of this feed reaches the index afterwards, so the worker's
    /// number can be given to another worker.
    pub async fn stop(mut self) {
        // Waits until the intake thread has let go of the subscription: no more events are queued.
        self.subscriber.take();
        self.task.abort();
        // An abort takes effect at the task's next await; a batch being applied finishes.
        let _ = (&mut self.task).await;
        self.holdings.exact.remove_worker(self.worker);
    }

    /// The subscriber's counters.
    pub fn stats(&self) -> Option<&Arc<SubscriberStats>> {
        self.subscriber.as_ref().map(SubscriberHandle::stats)
    }
}

/// The applying task of a [`WorkerFeed`]: what it writes to, and the waits and log throttles
/// that persist from one batch to the next.
struct Applier {
    /// Dropped first when the task ends: the worker is not warming any more.
    warming: WarmingGuard,
    index: Arc<Holdings>,
    worker: WorkerId,
    /// The data-parallel rank the subscription is for, if any.
    rank: Option<u32>,
    stats: Arc<SubscriberStats>,
    model: ModelOf,
    model_wait: ModelWait,
    undecodable: Throttle,
    other_size: Throttle,
    other_rank: Throttle,
}

impl Applier {
    /// Applies what the subscriber queues until the channel closes.
    async fn run(&mut self, rx: &mut mpsc::Receiver<WorkerEvent>) {
        // Everything queued is taken per wake-up: an intake thread hands over a busy
        // engine's batches several at a time.
        let mut queued = Vec::with_capacity(256);
        while rx.recv_many(&mut queued, 256).await > 0 {
            for msg in queued.drain(..) {
                self.apply(&msg.worker, msg.event).await;
            }
        }
    }

    /// Indexes a batch of the subscribed rank, seeded for the worker's model (waiting for it
    /// to be known, see [`ModelWait`]), without blocks of another size than the model's.
    async fn batch(&mut self, label: &str, batch: EventBatch) {
        if self.is_foreign(label, &batch) {
            return;
        }
        let Some(model) = self.model_wait.model(&self.model).await else {
            if self.model_wait.first_skip() {
                tracing::warn!(worker = %label, "KV events arrive but the worker's model is not known yet; skipping them until it is");
            }
            self.index.exact.count_skipped(batch.events.len() as u64);
            return;
        };
        let (batch, refused) = same_block_size(batch, model.block_size);
        if let Some(refused) = refused {
            self.index.exact.count_skipped(refused.events);
            self.stats
                .block_size_mismatch
                .fetch_add(refused.events, Ordering::Relaxed);
            if let Some(suppressed) = self.other_size.allow(Instant::now()) {
                tracing::error!(
                    worker = %label,
                    model = %model.name,
                    engine_block_size = refused.block_size,
                    model_block_size = model.block_size,
                    suppressed,
                    "the worker's engine stores KV blocks of another size than its model's block_size: its blocks can never match a request, so they are not indexed and the worker is routed as if its cache were cold; run the engine with the model's block (page) size, or serve it under another model name with its own block_size"
                );
            }
        }
        self.index
            .exact
            .apply(self.worker, &batch, &seeds_for(&model.name));
    }

    /// Whether `batch` names another data-parallel rank than the subscription's: then it is
    /// counted as skipped, and the misconfiguration logged (throttled).
    fn is_foreign(&mut self, label: &str, batch: &EventBatch) -> bool {
        let Some(named) = foreign_rank(batch, self.rank) else {
            return false;
        };
        self.index.exact.count_skipped(batch.events.len() as u64);
        self.stats.dp_rank_mismatch.fetch_add(1, Ordering::Relaxed);
        if let Some(suppressed) = self.other_rank.allow(Instant::now()) {
            tracing::error!(
                worker = %label,
                expected = self.rank.unwrap_or_default(),
                named,
                suppressed,
                "a KV-event batch names another data-parallel rank than the one this endpoint was subscribed for: its blocks are not indexed; check the worker's data_parallel_size and kv_events port (rank N publishes on the port plus N)"
            );
        }
        true
    }

    /// Applies one message of the worker labelled `label`: a batch is indexed; a stream that
    /// cannot be trusted any more clears the worker's entries; the warm-up replay's start and
    /// end mark it warming.
    async fn apply(&mut self, label: &str, event: SubscriberEvent) {
        let worker = self.worker;
        match event {
            SubscriberEvent::Batch { batch, .. } => self.batch(label, batch).await,
            SubscriberEvent::Reset { last_seq, seq } => {
                tracing::info!(worker = %label, last_seq, seq, "KV-event publisher restarted; worker starts cold");
                self.index.exact.clear_worker(worker);
            }
            SubscriberEvent::Disconnected => {
                tracing::info!(worker = %label, "KV-event publisher disconnected; worker starts cold");
                self.index.exact.clear_worker(worker);
            }
            SubscriberEvent::Dropped { from, to, reason } => {
                tracing::warn!(worker = %label, from, to, ?reason, "KV events lost; dropping the worker's index entries");
                self.index.exact.clear_worker(worker);
            }
            SubscriberEvent::Undecodable { seq, error } => {
                // The batch is lost: what it removed may still be listed.
                self.index.exact.clear_worker(worker);
                if let Some(suppressed) = self.undecodable.allow(Instant::now()) {
                    tracing::warn!(worker = %label, seq, %error, suppressed, "undecodable KV-event batch: the worker's entries are dropped (later ones in this interval are counted, not logged)");
                }
            }
            SubscriberEvent::Warming => (self.warming.0)(true),
            SubscriberEvent::Warmed { result } => {
                tracing::debug!(worker = %label, ?result, "KV-event warm-up replay ended");
                (self.warming.0)(false);
            }
        }
    }
}

/// The rank `batch` names when it is not `expected` (a stream subscribed for one rank of a
/// data-parallel worker). A batch naming no rank (vLLM 0.9.0 sends none) is taken.
fn foreign_rank(batch: &EventBatch, expected: Option<u32>) -> Option<i64> {
    let expected = i64::from(expected?);
    batch.dp_rank.filter(|named| *named != expected)
}

/// Stored blocks of another size than the model's, left out of a batch.
#[derive(Debug, PartialEq, Eq)]
struct Refused {
    /// `BlockStored` events left out.
    events: u64,
    /// The (first) size they had.
    block_size: u32,
}

/// `batch` without the `BlockStored` events whose block size is not `block_size`, and what
/// was left out. Such blocks are hashed from chunks of another length than requests are, so
/// they could never match one: indexing them would only spend memory. Removals and clears
/// are kept (a removal of a block never stored is counted and ignored).
fn same_block_size(mut batch: EventBatch, block_size: u32) -> (EventBatch, Option<Refused>) {
    let mut refused: Option<Refused> = None;
    batch.events.retain(|e| match e {
        // A placeholder (block size 0) moves a known block to another tier: it has no size.
        KvEvent::Stored(s) if s.block_size != block_size && !s.is_placeholder() => {
            let r = refused.get_or_insert(Refused {
                events: 0,
                block_size: s.block_size,
            });
            r.events += 1;
            false
        }
        _ => true,
    });
    (batch, refused)
}

/// Waits for a worker's model to become known, up to [`MODEL_WAIT`] from the first batch that
/// found it unknown; later batches of the same unknown spell are skipped without waiting.
#[derive(Default)]
struct ModelWait {
    /// When the first batch found the model unknown.
    since: Option<Instant>,
    warned: bool,
}

impl ModelWait {
    async fn model(&mut self, model: &ModelOf) -> Option<FeedModel> {
        loop {
            if let Some(m) = model() {
                self.since = None;
                self.warned = false;
                return Some(m);
            }
            let since = *self.since.get_or_insert_with(Instant::now);
            if since.elapsed() >= MODEL_WAIT {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Whether this is the first batch skipped since the model was last known.
    fn first_skip(&mut self) -> bool {
        !std::mem::replace(&mut self.warned, true)
    }
}

/// Clears the warming mark when the applying task ends, however it ends.
struct WarmingGuard(WarmingHook);

impl Drop for WarmingGuard {
    fn drop(&mut self) {
        (self.0)(false);
    }
}

/// Lets one log line through per interval and counts the ones it held back.
#[derive(Debug)]
pub(crate) struct Throttle {
    every: Duration,
    last: Option<Instant>,
    suppressed: u64,
}

impl Throttle {
    pub(crate) fn new(every: Duration) -> Throttle {
        Throttle {
            every,
            last: None,
            suppressed: 0,
        }
    }

    /// `Some(lines held back since the last one)` if a line may be written at `now`.
    pub(crate) fn allow(&mut self, now: Instant) -> Option<u64> {
        match self.last {
            Some(last) if now.duration_since(last) < self.every => {
                self.suppressed += 1;
                None
            }
            _ => {
                self.last = Some(now);
                Some(std::mem::take(&mut self.suppressed))
            }
        }
    }
}

impl Drop for WorkerFeed {
    fn drop(&mut self) {
        // Remove the subscription first so nothing is applied after the clear.
        self.subscriber.take();
        self.task.abort();
        self.holdings.exact.remove_worker(self.worker);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stored(block_size: u32) -> KvEvent {
        KvEvent::Stored(crate::kv_events::BlockStored {
            block_hashes: vec![crate::kv_events::EngineHash(1)],
            token_ids: vec![7; block_size as usize],
            block_size,
            ..Default::default()
        })
    }

    #[test]
    fn a_rank_stream_leaves_out_batches_of_other_ranks() {
        let of = |rank: Option<i64>| EventBatch {
            ts: 0.0,
            events: vec![stored(16)],
            dp_rank: rank,
        };
        // A worker without data parallelism takes every batch (an externally balanced
        // server's rank N names N).
        assert_eq!(foreign_rank(&of(Some(3)), None), None);
        assert_eq!(foreign_rank(&of(Some(1)), Some(1)), None);
        assert_eq!(foreign_rank(&of(Some(0)), Some(1)), Some(0));
        // vLLM 0.9.0 names no rank: taken.
        assert_eq!(foreign_rank(&of(None), Some(1)), None);
    }

    #[test]
    fn blocks_of_another_size_are_left_out_and_counted() {
        let batch = EventBatch {
            ts: 0.0,
            events: vec![stored(16), stored(32), KvEvent::AllCleared, stored(32)],
            dp_rank: None,
        };
        let (kept, refused) = same_block_size(batch, 16);
        assert_eq!(kept.events, vec![stored(16), KvEvent::AllCleared]);
        assert_eq!(
            refused,
            Some(Refused {
                events: 2,
                block_size: 32
            })
        );
        let (kept, refused) = same_block_size(kept, 16);
        assert_eq!(kept.events.len(), 2);
        assert_eq!(refused, None);
    }

    #[test]
    fn twenty_thousand_bad_batches_write_one_line_per_interval() {
        let mut t = Throttle::new(Duration::from_secs(10));
        let start = Instant::now();
        let lines = (0..20_000u64)
            .filter_map(|i| t.allow(start + Duration::from_millis(i)))
            .collect::<Vec<_>>();
        // 20 s of payloads, one a millisecond: a line at 0 s, 10 s; the second says how many
        // it held back.
        assert_eq!(lines, vec![0, 9_999]);
    }
}
