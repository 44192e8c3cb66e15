use super::*;
use crate::fleet::WorkerSpec;
use crate::index::{ApproxConfig, ApproxIndex, IndexConfig, KvIndex};

fn fleet() -> Arc<Fleet> {
    let spec = WorkerSpec::for_test;
    Arc::new(Fleet::new(vec![spec("a", 1), spec("b", 2)]))
}

/// A replica: its fleet (same workers as the others), its link and the receiver of its
/// outbox (what the connection task would drain).
struct Replica {
    fleet: Arc<Fleet>,
    holdings: Arc<Holdings>,
    link: Link,
    notes: tokio::sync::mpsc::Receiver<BookingNote>,
    metrics: ReplicaBusMetrics,
}

fn replica(id: &str) -> Replica {
    let fleet = fleet();
    let metrics = crate::metrics::Metrics::new().replica_bus;
    let (outbox, notes) = Outbox::new(metrics.clone());
    let holdings = Arc::new(Holdings::new(
        KvIndex::new(IndexConfig::default()),
        ApproxIndex::new(ApproxConfig::default()),
    ));
    let link = Link::new(
        id.into(),
        Duration::from_secs(3),
        Arc::clone(&fleet),
        Arc::clone(&holdings),
        Arc::new(outbox),
        metrics.clone(),
    );
    Replica {
        fleet,
        holdings,
        link,
        notes,
        metrics,
    }
}

impl Replica {
    fn in_flight(&self, worker: usize, rank: u32) -> u64 {
        self.fleet.workers()[worker]
            .rank(rank)
            .load
            .snapshot()
            .in_flight
    }

    /// Its queued announcements as messages.
    fn drain(&mut self) -> Vec<Envelope> {
        let mut out = Vec::new();
        while let Ok(n) = self.notes.try_recv() {
            out.extend(self.link.announce(&n));
        }
        out
    }
}

fn deliver(to: &mut Replica, msgs: &[Envelope], now: Duration) -> Vec<Envelope> {
    msgs.iter()
        .flat_map(|m| to.link.receive(&m.encode(), now))
        .collect()
}

const T0: Duration = Duration::ZERO;

#[test]
fn a_booking_on_one_replica_is_known_load_on_the_other_until_it_ends() {
    let (mut a, mut b) = (replica("ra"), replica("rb"));
    a.link.connected();
    b.link.connected();
    // Replica a routes one request to worker b's rank 1 and one to worker a.
    let mut g1 = a.fleet.workers()[1].rank(1).load.admit(500, 300);
    let g2 = a.fleet.workers()[0].rank(0).load.admit(100, 100);
    let sent = a.drain();
    assert_eq!(sent.len(), 2);
    deliver(&mut b, &sent, T0);
    assert_eq!(
        (b.in_flight(1, 1), b.in_flight(0, 0), b.in_flight(1, 0)),
        (1, 1, 0)
    );
    assert_eq!(
        b.fleet.workers()[1]
            .rank(1)
            .load
            .snapshot()
            .queued_prefill_tokens,
        300
    );
    assert_eq!(b.metrics.bookings.get(), 2);
    // Its own echo changes nothing on a.
    deliver(&mut a, &sent, T0);
    assert_eq!(a.in_flight(1, 1), 1);
    g1.first_token();
    drop(g1);
    drop(g2);
    let sent = a.drain();
    deliver(&mut b, &sent, T0);
    assert_eq!((b.in_flight(1, 1), b.in_flight(0, 0)), (0, 0));
    assert_eq!(b.link.booked(), 0);
}

#[test]
fn replicas_heard_on_the_bus_share_the_reading_of_engine_load() {
    let (mut a, mut b, mut c) = (replica("ra"), replica("rb"), replica("rc"));
    let base = Duration::from_millis(100);
    assert_eq!(a.fleet.poll_share.interval(base), base, "alone");
    a.link.connected();
    let (from_b, from_c) = (b.link.connected(), c.link.connected());
    deliver(&mut a, &from_b, T0);
    deliver(&mut a, &from_c, T0);
    assert_eq!(a.fleet.poll_share.replicas(), 3);
    assert_eq!(a.fleet.poll_share.interval(base), base * 3);
    // b keeps beating, c goes silent and expires: two share the reading.
    let beat = b.link.tick(Duration::from_secs(2));
    deliver(&mut a, &Vec::from_iter(beat), Duration::from_secs(2));
    a.link.tick(Duration::from_secs(4));
    assert_eq!(a.fleet.poll_share.replicas(), 2);
    // Without the bus readings are all a replica has: the full rate again.
    a.link.disconnected();
    assert_eq!(a.fleet.poll_share.interval(base), base);
}

#[test]
fn losing_the_bus_releases_the_others_and_reconnecting_resyncs_from_snapshots() {
    let (mut a, mut b) = (replica("ra"), replica("rb"));
    a.link.connected();
    b.link.connected();
    let _held = a.fleet.workers()[0].rank(0).load.admit(100, 100);
    let sent = a.drain();
    deliver(&mut b, &sent, T0);
    assert_eq!(b.in_flight(0, 0), 1);
    b.link.disconnected();
    assert_eq!(b.in_flight(0, 0), 0, "without the bus only own requests");
    assert_eq!(b.metrics.connected.get(), 0);
    // While a is cut off too, its bookings are not sent.
    a.link.disconnected();
    let _later = a.fleet.workers()[1].rank(0).load.admit(10, 10);
    assert!(a.drain().is_empty());
    // Both come back: b's hello makes a answer with its snapshot.
    let hello_b = b.link.connected();
    let hello_a = a.link.connected();
    let answers = deliver(&mut a, &hello_b, T0);
    deliver(&mut b, &hello_a, T0);
    deliver(&mut b, &answers, T0);
    assert_eq!((b.in_flight(0, 0), b.in_flight(1, 0)), (1, 1));
    assert_eq!(b.link.booked(), 2, "each once, though sent twice");
}

#[test]
fn a_gap_asks_the_sender_for_a_snapshot_and_a_silent_replica_expires() {
    let (mut a, mut b) = (replica("ra"), replica("rb"));
    a.link.connected();
    b.link.connected();
    let g1 = a.fleet.workers()[0].rank(0).load.admit(100, 100);
    let _g2 = a.fleet.workers()[0].rank(0).load.admit(100, 100);
    let mut sent = a.drain();
    deliver(&mut b, &sent[..1], T0);
    drop(g1);
    sent = a.drain();
    // The second booking is lost; the end of the first arrives.
    let answer = deliver(&mut b, &sent, T0);
    assert_eq!(b.metrics.lost.with_label_values(&["gap"]).get(), 1);
    assert!(
        matches!(&answer[..], [Envelope { body: Body::Hello { of: Some(of) }, .. }] if of == "ra")
    );
    assert_eq!(b.in_flight(0, 0), 0);
    let snapshot = deliver(&mut a, &answer, T0);
    deliver(&mut b, &snapshot, T0);
    assert_eq!(b.in_flight(0, 0), 1, "the lost booking, from the snapshot");
    // a falls silent: its booking is released after the expiry.
    assert!(b.link.tick(Duration::from_secs(3)).is_some());
    assert_eq!(b.in_flight(0, 0), 1);
    b.link.tick(Duration::from_secs(4));
    assert_eq!(b.in_flight(0, 0), 0);
    assert_eq!(b.metrics.expired.get(), 1);
}

#[test]
fn a_bookings_block_hashes_reach_the_other_replicas_working_set_and_running_blocks() {
    let (mut a, mut b) = (replica("ra"), replica("rb"));
    a.link.connected();
    b.link.connected();
    // A 40-block prompt (16-token blocks) routed by replica a to worker b's rank 1.
    let hashes: Vec<BlockHash> = (1..=40).map(BlockHash).collect();
    let _g = a.fleet.workers()[1]
        .rank(1)
        .load
        .admit_holding(640, 640, &hashes, 16);
    let sent = a.drain();
    let at = Duration::from_secs(2);
    deliver(&mut b, &sent, at);
    let target = b.fleet.workers()[1].rank(1).key;
    let other = b.fleet.workers()[0].rank(0).key;
    let residency = &b.holdings.residency;
    assert_eq!(
        (
            residency.live_blocks(target, at),
            residency.live_blocks(other, at)
        ),
        (40, 0),
        "b's working set of the target holds every block a booked there"
    );
    // Its two marks (blocks 16 and 32) are running there; the last 8 blocks count as tokens.
    assert_eq!(
        b.fleet.workers()[1].rank(1).load.running(&hashes, 16),
        (640, 32)
    );
    // And it is an arrival for its prefixes in b's rates, as if b had admitted it.
    let rate = b.holdings.prefix_rates.rate(&hashes, 32, at);
    assert!((rate - 0.1).abs() < 1e-9, "{rate}");
}
