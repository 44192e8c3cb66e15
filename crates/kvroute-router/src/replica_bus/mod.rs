//! The replica bus: router replicas that decide as one, over NATS (`[replica_bus]`).
//!
//! Several kvroute replicas behind one Service each count only the requests they route; engine
//! load readings (`fleet::load_poller`) add the others' only as request counts, up to one
//! reading interval late. With the bus, every replica publishes each booking it makes — the
//! target (worker id and data-parallel rank), prompt and predicted prefill tokens, the
//! prompt's block hashes — then its first token and its end ([`crate::fleet::booking`],
//! announced from `fleet::Load` itself, so the server, the endpoint picker and the simulator
//! all announce without knowing of it). Each replica books the others' on its own load view
//! ([`crate::fleet::replica_ledger`]) as known load, and touches its own working set of the
//! target with their blocks (`index::Residency`, what the policy prices evictions from): the
//! view is complete within a bus round trip, and an engine reading's excess over known load
//! shrinks by it (nothing counts twice). Engine readings stay as the fallback and the truth
//! check.
//!
//! Losing the bus degrades to the behaviour without it: the others' bookings are released,
//! `kvroute_replica_bus_connected` drops to 0, a WARN line says so, and the client reconnects
//! on its own; on (re)connecting a replica says `hello`, and every replica answers with a
//! snapshot of its live bookings, which replaces what the others hold for it. A replica whose
//! heartbeats stop for `expiry_ms` is presumed dead and its bookings are released. Messages
//! are numbered per sender: a gap is counted and answered by asking that sender for a
//! snapshot. The wire format is in [`wire`].
//!
//! - [`settings`]: what `[replica_bus]` configures; [`wire`]: the messages.
//! - [`outbox`]: the request path's side (a bounded queue, and the live list snapshots send).
//! - [`link`]: one replica's state on the bus, free of the connection.
//! - [`spawn`]: the NATS connection (async-nats) driving a [`link::Link`].

pub mod link;
pub mod outbox;
pub mod settings;
pub mod wire;

use std::sync::Arc;
use std::time::Duration;

use async_nats::{Client, ConnectOptions, Event};
use futures_util::StreamExt;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::fleet::Fleet;
use crate::index::Holdings;
use crate::metrics::ReplicaBusMetrics;

pub use settings::{DEFAULT_EXPIRY, DEFAULT_HEARTBEAT, DEFAULT_SUBJECT, ReplicaBusSettings};

use link::Link;
use outbox::Outbox;
use wire::Envelope;

/// Longest wait between two reconnection attempts.
const MAX_RECONNECT_DELAY: Duration = Duration::from_secs(2);

/// Where this replica's side of the bus acts: its fleet, its index and the index's clock.
pub struct Replica {
    /// Every rank of it announces its bookings, and the other replicas' are booked on it.
    pub fleet: Arc<Fleet>,
    /// Whose working sets the other replicas' bookings touch.
    pub holdings: Arc<Holdings>,
    /// The origin of the index's clock (what decisions pass as `now`).
    pub clock: std::time::Instant,
}

/// Starts this replica's side of the bus until `stop`.
pub fn spawn(
    settings: ReplicaBusSettings,
    replica: Replica,
    metrics: ReplicaBusMetrics,
    stop: CancellationToken,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let (outbox, notes) = Outbox::new(metrics.clone());
        let link = Link::new(
            settings.replica_id.clone(),
            settings.expiry,
            replica.fleet,
            replica.holdings,
            Arc::new(outbox),
            metrics.clone(),
        );
        let clock = replica.clock;
        if let Err(e) = run(&settings, link, notes, clock, &metrics, &stop).await {
            tracing::error!(url = %settings.url, error = %e, "replica bus stopped; this replica routes on its own requests and engine load readings");
        }
    })
}

/// Why the bus could not run at all.
#[derive(Debug, thiserror::Error)]
enum BusError {
    #[error("cannot connect: {0}")]
    Connect(#[from] async_nats::ConnectError),
    #[error("cannot subscribe: {0}")]
    Subscribe(#[from] async_nats::SubscribeError),
}

async fn run(
    settings: &ReplicaBusSettings,
    mut link: Link,
    mut notes: mpsc::Receiver<crate::fleet::BookingNote>,
    clock: std::time::Instant,
    metrics: &ReplicaBusMetrics,
    stop: &CancellationToken,
) -> Result<(), BusError> {
    let (events_tx, mut events) = mpsc::unbounded_channel();
    let client = ConnectOptions::new()
        .name(format!("kvroute {}", settings.replica_id))
        .retry_on_initial_connect()
        .max_reconnects(None)
        .reconnect_delay_callback(|attempt| {
            (Duration::from_millis(100) * u32::try_from(attempt).unwrap_or(u32::MAX))
                .min(MAX_RECONNECT_DELAY)
        })
        .event_callback(move |event| {
            let tx = events_tx.clone();
            async move {
                let _ = tx.send(event);
            }
        })
        .connect(settings.url.as_str())
        .await?;
    let mut heard = client.subscribe(settings.subject.clone()).await?;
    tracing::info!(url = %settings.url, subject = %settings.subject, replica = %settings.replica_id, "replica bus started");
    let mut heartbeat = tokio::time::interval(settings.heartbeat);
    heartbeat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let send = |out: Vec<Envelope>| publish(&client, &settings.subject, out, metrics);
    loop {
        tokio::select! {
            () = stop.cancelled() => break,
            Some(note) = notes.recv() => {
                if let Some(m) = link.announce(&note) {
                    send(vec![m]).await;
                }
            }
            Some(msg) = heard.next() => {
                let answer = link.receive(&msg.payload, clock.elapsed());
                send(answer).await;
            }
            Some(event) = events.recv() => match event {
                Event::Connected => {
                    tracing::info!(url = %settings.url, "replica bus connected: other replicas' bookings are shared");
                    let out = link.connected();
                    send(out).await;
                }
                Event::Disconnected => {
                    tracing::warn!(url = %settings.url, "replica bus lost: routing on own requests and engine load readings until it is back");
                    link.disconnected();
                }
                other => tracing::debug!(event = %other, "replica bus event"),
            },
            _ = heartbeat.tick() => {
                if let Some(m) = link.tick(clock.elapsed()) {
                    send(vec![m]).await;
                }
            }
        }
    }
    Ok(())
}

async fn publish(client: &Client, subject: &str, out: Vec<Envelope>, metrics: &ReplicaBusMetrics) {
    for m in out {
        match client.publish(subject.to_owned(), m.encode().into()).await {
            Ok(()) => metrics.messages.with_label_values(&["sent"]).inc(),
            Err(e) => {
                metrics.lost.with_label_values(&["unsent"]).inc();
                tracing::debug!(error = %e, "replica bus message not sent");
            }
        }
    }
}
