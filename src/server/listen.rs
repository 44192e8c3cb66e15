//! The accept loop: HTTP/1 and HTTP/2 connections with client-side timeouts and graceful
//! shutdown.
//!
//! `axum::serve` sets no timer on hyper, which leaves hyper's header read timeout off: a client
//! that trickles its request headers byte by byte would hold a connection and a task forever.
//! Serving connections with hyper-util's builder directly lets us set that deadline, and
//! hyper-util's `GracefulShutdown` drains open connections when the router stops.

use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// Serves `app` on `listener` until `stop` is cancelled, then lets open connections finish for
/// at most `grace`.
pub async fn serve_until(
    listener: TcpListener,
    app: Router,
    stop: CancellationToken,
    grace: Duration,
    header_read_timeout: Duration,
) {
    let mut builder = Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(header_read_timeout);
    builder.http2().timer(TokioTimer::new());
    let graceful = GracefulShutdown::new();
    loop {
        let (stream, peer) = tokio::select! {
            _ = stop.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    // Out of file descriptors and the like: back off instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        if let Err(e) = stream.set_nodelay(true) {
            tracing::debug!(%peer, error = %e, "cannot set TCP_NODELAY");
        }
        let service = TowerToHyperService::new(app.clone());
        let conn = builder.serve_connection_with_upgrades(TokioIo::new(stream), service);
        let conn = graceful.watch(conn.into_owned());
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(%peer, error = %e, "connection ended with an error");
            }
        });
    }
    // Stop accepting before draining.
    drop(listener);
    tokio::select! {
        _ = graceful.shutdown() => {}
        _ = tokio::time::sleep(grace) => {
            tracing::warn!(?grace, "shutdown grace period over; closing remaining connections");
        }
    }
}
