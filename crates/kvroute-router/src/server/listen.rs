//! The accept loop: HTTP/1 and HTTP/2 connections with client-side timeouts, a cap on open
//! connections, and graceful shutdown.
//!
//! `axum::serve` sets no timer on hyper, which leaves hyper's header read timeout off: a client
//! that trickles its request headers byte by byte would hold a connection and a task forever.
//! Serving connections with hyper-util's builder directly lets us set that deadline; each
//! connection's other deadlines (first request, idle) and its part in shutdown are kept by
//! [`super::connection`]. Shutdown: stop accepting, let each connection finish what is in
//! progress for at most the grace period, then cut the streams still running (each ends with an
//! SSE error event, see [`crate::proxy::ObservedBody::cut_on`]) and drop what is left.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use hyper_util::service::TowerToHyperService;
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;
use tokio_util::sync::CancellationToken;

use super::canned::CannedErrors;
use super::connection::{self, Activity, CUT_FLUSH, Deadlines, Tracked};
use super::open_connections::OpenConnections;
use crate::config::Connections;
use crate::metrics::Metrics;
use crate::tls::listener::TlsFront;

/// Open-file limit assumed where the process's own cannot be read.
const ASSUMED_FILE_LIMIT: usize = 1024;
/// Fewest connections a derived cap allows.
const MIN_DERIVED_CAP: usize = 32;

/// How the front door treats connections.
#[derive(Clone, Debug)]
pub(super) struct FrontDoor {
    /// How long open connections may finish their requests after `stop`.
    pub(super) grace: Duration,
    /// Longest a client may take to send request headers; also the first request's deadline.
    pub(super) header_read_timeout: Duration,
    /// Idle timeout, HTTP/2 keep-alive and the connection cap.
    pub(super) connections: Connections,
    /// Cancelled when the grace is over: streams still running end with an error event.
    pub(super) cutoff: CancellationToken,
    /// TLS, when this listener serves HTTPS.
    pub(super) tls: Option<Arc<TlsFront>>,
}

/// Serves `app` on `listener` until `stop` is cancelled, then drains (see the module doc).
pub(super) async fn serve_until(
    listener: TcpListener,
    app: Router,
    stop: CancellationToken,
    front: FrontDoor,
    metrics: Arc<Metrics>,
) {
    let builder = http_builder(&front);
    let cap = front
        .connections
        .max_connections
        .unwrap_or_else(derived_cap);
    let deadlines = Deadlines {
        first_request: front.header_read_timeout,
        idle: front.connections.idle_timeout,
    };
    let open = Arc::new(OpenConnections::new(Arc::clone(&metrics)));
    while let Some((stream, peer)) = accept(&listener, &stop).await {
        let activity = Activity::new(peer.ip(), deadlines.idle);
        let Some(slot) = open.take(cap, &activity) else {
            metrics.connections.refused.inc();
            tracing::debug!(%peer, cap, "connection refused: server.max_connections are open");
            drop(stream);
            continue;
        };
        if let Err(e) = stream.set_nodelay(true) {
            tracing::debug!(%peer, error = %e, "cannot set TCP_NODELAY");
        }
        let service = Tracked::new(
            TowerToHyperService::new(app.clone()),
            Arc::clone(&activity),
            peer,
        );
        let (stop, cutoff, metrics) = (stop.clone(), front.cutoff.clone(), Arc::clone(&metrics));
        let builder = builder.clone();
        let tls = front.tls.as_ref().map(|t| t.acceptor());
        tokio::spawn(async move {
            match tls {
                None => {
                    let io = CannedErrors::new(TokioIo::new(stream), Arc::clone(&activity));
                    let conn = builder.serve_connection_with_upgrades(io, service);
                    connection::drive(conn, activity, deadlines, stop, cutoff, metrics).await;
                }
                Some(acceptor) => {
                    let shake = Handshake {
                        activity: &activity,
                        deadline: deadlines.first_request,
                        metrics: &metrics,
                        peer,
                    };
                    let Some(stream) = shake.complete(acceptor, stream).await else {
                        return;
                    };
                    let io = CannedErrors::new(TokioIo::new(stream), Arc::clone(&activity));
                    let conn = builder.serve_connection_with_upgrades(io, service);
                    connection::drive(conn, activity, deadlines, stop, cutoff, metrics).await;
                }
            }
            drop(slot);
        });
    }
    // Stop accepting before draining.
    drop(listener);
    drain(&open, &front).await;
}

/// Hyper's connection builder with the front door's deadlines: HTTP/1's header read timeout
/// (which needs a timer, and is what `axum::serve` leaves off), HTTP/2's keep-alive and
/// stream limit.
fn http_builder(front: &FrontDoor) -> Builder<TokioExecutor> {
    let mut builder = Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(front.header_read_timeout);
    builder
        .http2()
        .timer(TokioTimer::new())
        .keep_alive_interval(front.connections.http2_keepalive_interval)
        .keep_alive_timeout(front.connections.http2_keepalive_timeout)
        .max_concurrent_streams(front.connections.http2_max_concurrent_streams);
    builder
}

/// The next connection, or `None` once `stop` is cancelled. A failed accept (out of file
/// descriptors and the like) is logged and retried after a pause instead of spinning.
async fn accept(
    listener: &TcpListener,
    stop: &CancellationToken,
) -> Option<(TcpStream, SocketAddr)> {
    loop {
        tokio::select! {
            _ = stop.cancelled() => return None,
            accepted = listener.accept() => match accepted {
                Ok(a) => return Some(a),
                Err(e) => {
                    // Out of file descriptors and the like: back off instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
        }
    }
}

/// A TLS connection's handshake, and what its failure is charged to.
struct Handshake<'a> {
    /// The connection's activity: an evicted connection stops its handshake.
    activity: &'a Activity,
    /// The first request's deadline, which the handshake is held to.
    deadline: Duration,
    metrics: &'a Metrics,
    peer: SocketAddr,
}

impl Handshake<'_> {
    /// The TLS stream once the handshake completes; `None` (counted and logged) when it fails,
    /// times out or the connection is evicted. The handshake is held to the first request's
    /// deadline: a client that opens a connection and never finishes its hello is closed like
    /// one that never sends a request.
    async fn complete(
        self,
        acceptor: TlsAcceptor,
        stream: TcpStream,
    ) -> Option<TlsStream<TcpStream>> {
        let peer = self.peer;
        let shake = tokio::time::timeout(self.deadline, acceptor.accept(stream));
        let shake = tokio::select! {
            s = shake => s,
            _ = self.activity.evicted() => return None,
        };
        match shake {
            Ok(Ok(s)) => Some(s),
            Ok(Err(e)) => {
                self.metrics.connections.tls_handshake_failures.inc();
                tracing::debug!(%peer, error = %e, "TLS handshake failed");
                None
            }
            Err(_) => {
                self.metrics.connections.tls_handshake_failures.inc();
                tracing::debug!(%peer, "TLS handshake timed out");
                None
            }
        }
    }
}

/// Waits for the open connections to close, for at most the grace period; then cuts the
/// streams still running and gives them a moment to flush their error event.
async fn drain(open: &OpenConnections, front: &FrontDoor) {
    tokio::select! {
        _ = open.all_closed() => {}
        _ = tokio::time::sleep(front.grace) => {
            tracing::warn!(
                grace = ?front.grace,
                open = open.count(),
                "shutdown grace period over; cutting the streams still running"
            );
            front.cutoff.cancel();
            let flushed = CUT_FLUSH + Duration::from_secs(1);
            let _ = tokio::time::timeout(flushed, open.all_closed()).await;
        }
    }
}

/// The connection cap when none is configured: half the process's open-file limit, since each
/// proxied request holds a client connection and a connection to a worker, and the rest of
/// the process (KV-event sockets, health checks, logs) needs files too.
fn derived_cap() -> usize {
    (file_limit().unwrap_or(ASSUMED_FILE_LIMIT) / 2).max(MIN_DERIVED_CAP)
}

/// The soft open-file limit (`Max open files` in `/proc/self/limits`), where it can be read.
fn file_limit() -> Option<usize> {
    let text = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = text.lines().find(|l| l.starts_with("Max open files"))?;
    let soft = line
        .trim_start_matches("Max open files")
        .split_whitespace()
        .next()?;
    match soft {
        "unlimited" => Some(usize::MAX / 2),
        n => n.parse().ok(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_derived_cap_is_half_the_file_limit() {
        let limit = file_limit();
        if cfg!(target_os = "linux") {
            assert!(limit.is_some(), "/proc/self/limits is readable on Linux");
        }
        let cap = derived_cap();
        assert_eq!(
            cap,
            (limit.unwrap_or(ASSUMED_FILE_LIMIT) / 2).max(MIN_DERIVED_CAP)
        );
    }
}
