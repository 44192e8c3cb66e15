//! The replica bus (`replica_bus`): whether this router replica is connected, what it sent and
//! heard, what it lost, and how much of the other replicas' load it holds from them.

use prometheus::{IntCounter, IntCounterVec, IntGauge, Opts, Registry};

/// The replica bus's state and traffic.
#[derive(Clone)]
pub struct ReplicaBusMetrics {
    /// `kvroute_replica_bus_connected`: 1 while connected to the bus (other replicas'
    /// bookings are known load); 0 while it is configured but lost (the view falls back to
    /// own requests plus engine load readings); 0 too without `[replica_bus]`.
    pub connected: IntGauge,
    /// `kvroute_replica_bus_messages_total{direction}`: messages published (`sent`) and heard
    /// from other replicas (`received`).
    pub messages: IntCounterVec,
    /// `kvroute_replica_bus_lost_total{reason}`: announcements this replica could not send
    /// (`outbox_full`: its outbox was full; `unsent`: the bus refused them; `hashes_dropped`:
    /// a booking sent without its block hashes, the queued ones holding their share) and messages of
    /// other replicas it never heard (`gap`: found by their sequence numbers; each asks that
    /// replica for a snapshot).
    pub lost: IntCounterVec,
    /// `kvroute_replica_bus_peers`: other replicas heard from within the expiry.
    pub peers: IntGauge,
    /// `kvroute_replica_bus_bookings`: other replicas' live requests booked on this replica's
    /// load view.
    pub bookings: IntGauge,
    /// `kvroute_replica_bus_expired_total`: replicas whose heartbeats stopped, their bookings
    /// released.
    pub expired: IntCounter,
}

impl ReplicaBusMetrics {
    pub(super) fn register(registry: &Registry) -> ReplicaBusMetrics {
        let m = ReplicaBusMetrics {
            connected: IntGauge::new(
                "kvroute_replica_bus_connected",
                "1 while this router replica is connected to the replica bus; 0 while configured but lost (load view falls back to own requests plus engine readings).",
            )
            .expect("static metric definition"),
            messages: IntCounterVec::new(
                Opts::new(
                    "kvroute_replica_bus_messages_total",
                    "Replica bus messages published (direction=sent) and heard from other replicas (direction=received).",
                ),
                &["direction"],
            )
            .expect("static metric definition"),
            lost: IntCounterVec::new(
                Opts::new(
                    "kvroute_replica_bus_lost_total",
                    "Replica bus messages lost: announcements not sent (reason=outbox_full|unsent; hashes_dropped: a booking sent without its block hashes) and other replicas' messages never heard (reason=gap).",
                ),
                &["reason"],
            )
            .expect("static metric definition"),
            peers: IntGauge::new(
                "kvroute_replica_bus_peers",
                "Other router replicas heard on the replica bus within the expiry.",
            )
            .expect("static metric definition"),
            bookings: IntGauge::new(
                "kvroute_replica_bus_bookings",
                "Other router replicas' live requests booked on this replica's load view.",
            )
            .expect("static metric definition"),
            expired: IntCounter::new(
                "kvroute_replica_bus_expired_total",
                "Router replicas whose replica bus heartbeats stopped; their bookings were released.",
            )
            .expect("static metric definition"),
        };
        let families: [Box<dyn prometheus::core::Collector>; 6] = [
            Box::new(m.connected.clone()),
            Box::new(m.messages.clone()),
            Box::new(m.lost.clone()),
            Box::new(m.peers.clone()),
            Box::new(m.bookings.clone()),
            Box::new(m.expired.clone()),
        ];
        for f in families {
            registry.register(f).expect("metric names are unique");
        }
        m
    }
}
