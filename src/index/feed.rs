//! Feeding one worker's KV events into the index.
//!
//! A [`WorkerFeed`] owns the worker's ZeroMQ subscriber (a thread, see
//! `kv_events::subscriber`) and a task that applies what it receives: batches in sequence
//! order, and a full clear of the worker's entries whenever the subscriber says the stream
//! cannot be trusted (publisher restart, unrecoverable gap). Stale entries are worse than none:
//! they route requests to a worker for a prefix it no longer holds.
//!
//! Dropping the feed stops both and clears the worker's entries, so a removed worker leaves
//! nothing behind.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use super::holdings::Holdings;
use crate::fleet::WorkerId;
use crate::kv_events::{
    Subscriber, SubscriberConfig, SubscriberError, SubscriberEvent, SubscriberHandle,
    SubscriberStats,
};
use crate::tokens::HashSeed;
use crate::tokens::model::hash_seed;

/// Events queued between the subscriber thread and the applying task; beyond it the thread
/// waits (ZeroMQ then buffers, since the receive high-water mark is unbounded).
const QUEUE: usize = 4096;

/// How long events wait for their worker's model to become known (its first health check
/// discovers it) before batches are skipped instead, so a worker whose model list never
/// arrives cannot make events pile up.
const MODEL_WAIT: Duration = Duration::from_secs(10);

/// The worker's base model, whose name seeds its blocks' hashes; `None` while unknown.
pub type ModelOf = Box<dyn Fn() -> Option<String> + Send + Sync>;

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
    /// each event carries). Must be called on a Tokio runtime.
    pub fn start(
        holdings: Arc<Holdings>,
        worker: WorkerId,
        model: ModelOf,
        config: SubscriberConfig,
    ) -> Result<WorkerFeed, SubscriberError> {
        let (tx, mut rx) = mpsc::channel(QUEUE);
        let subscriber = Subscriber::spawn(config, tx)?;
        let index = Arc::clone(&holdings);
        let task = tokio::spawn(async move {
            let mut model_wait = ModelWait::default();
            while let Some(msg) = rx.recv().await {
                match msg.event {
                    SubscriberEvent::Batch { batch, .. } => {
                        let Some(model) = model_wait.model(&model).await else {
                            if model_wait.first_skip() {
                                tracing::warn!(worker = %msg.worker, "KV events arrive but the worker's model is not known yet; skipping them until it is");
                            }
                            index.exact.count_skipped(batch.events.len() as u64);
                            continue;
                        };
                        index.exact.apply(worker, &batch, &seeds_for(&model));
                    }
                    SubscriberEvent::Reset { last_seq, seq } => {
                        tracing::info!(worker = %msg.worker, last_seq, seq, "KV-event publisher restarted; worker starts cold");
                        index.exact.clear_worker(worker);
                    }
                    SubscriberEvent::Disconnected => {
                        tracing::info!(worker = %msg.worker, "KV-event publisher disconnected; worker starts cold");
                        index.exact.clear_worker(worker);
                    }
                    SubscriberEvent::Dropped { from, to, reason } => {
                        tracing::warn!(worker = %msg.worker, from, to, ?reason, "KV events lost; dropping the worker's index entries");
                        index.exact.clear_worker(worker);
                    }
                    SubscriberEvent::Undecodable { seq, error } => {
                        tracing::warn!(worker = %msg.worker, seq, %error, "undecodable KV-event batch skipped");
                    }
                }
            }
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
        // Joins the subscriber thread: no more events are queued.
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

/// Waits for a worker's model to become known, up to [`MODEL_WAIT`] from the first batch that
/// found it unknown; later batches of the same unknown spell are skipped without waiting.
#[derive(Default)]
struct ModelWait {
    /// When the first batch found the model unknown.
    since: Option<Instant>,
    warned: bool,
}

impl ModelWait {
    async fn model(&mut self, model: &ModelOf) -> Option<String> {
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

impl Drop for WorkerFeed {
    fn drop(&mut self) {
        // Stop the thread first so nothing is applied after the clear.
        self.subscriber.take();
        self.task.abort();
        self.holdings.exact.remove_worker(self.worker);
    }
}
