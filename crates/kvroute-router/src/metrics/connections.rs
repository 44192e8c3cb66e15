//! The front door: client connections and their TLS.

use prometheus::{IntCounter, IntCounterVec, IntGauge, Opts, Registry};

/// Client connections: open, refused at the limit, closed by the router, and the front door's TLS.
#[derive(Clone)]
pub struct ConnectionMetrics {
    /// `kvroute_open_connections`: client connections open now.
    pub open: IntGauge,
    /// `kvroute_connections_refused_total`: client connections closed on accept because
    /// `server.max_connections` were open.
    pub refused: IntCounter,
    /// `kvroute_connections_closed_total{reason}`: client connections the router closed
    /// (`first_request_timeout`, `idle`, `write_stalled`, `evicted`).
    pub closed: IntCounterVec,
    /// `kvroute_tls_handshake_failures_total`: client connections whose TLS handshake failed
    /// or timed out.
    pub tls_handshake_failures: IntCounter,
    /// `kvroute_tls_reloads_total{result}`: changed TLS files of the front door, `applied` or
    /// `refused` (unusable; the previous certificate is still served).
    pub tls_reloads: IntCounterVec,
}

impl ConnectionMetrics {
    pub(super) fn register(registry: &Registry) -> ConnectionMetrics {
        let counter = |name: &str, help: &str, labels: &[&str]| {
            IntCounterVec::new(Opts::new(name, help), labels).expect("static metric definition")
        };
        let open = IntGauge::new("kvroute_open_connections", "Client connections open now.")
            .expect("static metric definition");
        let refused = IntCounter::new(
            "kvroute_connections_refused_total",
            "Client connections closed on accept because server.max_connections were open.",
        )
        .expect("static metric definition");
        let closed = counter(
            "kvroute_connections_closed_total",
            "Client connections the router closed: first_request_timeout (no request within \
             server.header_read_timeout_s), idle (no request in progress for \
             server.idle_timeout_s), write_stalled (a response its client did not take for \
             proxy.idle_timeout_s, or past proxy.total_timeout_s; the router's own answers: \
             server.idle_timeout_s), evicted (idle the longest when a new client came at \
             server.max_connections).",
            &["reason"],
        );
        let tls_handshake_failures = IntCounter::new(
            "kvroute_tls_handshake_failures_total",
            "Client connections whose TLS handshake failed or timed out.",
        )
        .expect("static metric definition");
        let tls_reloads = counter(
            "kvroute_tls_reloads_total",
            "Changed TLS files of the front door: applied, or refused (unusable; the previous \
             certificate is still served).",
            &["result"],
        );
        for c in [
            Box::new(open.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(refused.clone()),
            Box::new(closed.clone()),
            Box::new(tls_handshake_failures.clone()),
            Box::new(tls_reloads.clone()),
        ] {
            registry.register(c).expect("metric names are unique");
        }
        ConnectionMetrics {
            open,
            refused,
            closed,
            tls_handshake_failures,
            tls_reloads,
        }
    }
}
