//! `kvroute serve`'s front door on one thread per core, each running its own single-threaded
//! Tokio runtime with its own accept loop on the shared listening socket and its own pool of
//! connections to the workers.
//!
//! Why: on one multi-threaded runtime a request's steps (client socket, handler, pooled
//! upstream connection, response) hop between worker threads — a parked worker is woken
//! (futex) to steal a task the current one was about to run, and the I/O driver is woken from
//! another thread (eventfd). On the proxy-overhead bench that was two futex calls and half an
//! eventfd write per request, and the cross-thread hand-offs were most of the latency kvroute
//! added beyond its own work. Here a connection is accepted, read, routed, forwarded (over a
//! connection pooled on the same thread) and answered on one thread, and the threads still use
//! every core: each accepts connections as they come. The control plane (health checks, KV
//! events, discovery, reload, a separate metrics listener) stays on the main runtime; all
//! threads share the router's state, so routing sees one fleet and one index.
//!
//! Shutdown is the single loop's: every thread stops accepting when `stop` is cancelled and
//! drains its connections; the connection cap and the wait for the last connection are shared
//! ([`OpenConnections`]), so the cap is the process's and the grace is one grace.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

use super::listen::{self, FrontDoor, OpenConnections};
use crate::metrics::Metrics;
use crate::proxy::Upstream;

/// How long a front thread's runtime waits, once its connections are done, for blocking work
/// it started (a large body's parse, a long prompt's tokenization) before it is dropped.
const BLOCKING_WAIT: Duration = Duration::from_secs(1);

/// The number of front-door threads for this machine: one per core the process may use.
pub(super) fn per_core() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Serves `app` on `listener` from `threads` front-door threads (see the module doc) until
/// `stop` is cancelled and every thread has drained. Falls back to serving on the calling
/// runtime if no thread can be started.
pub(super) async fn serve(
    listener: TcpListener,
    app: Router,
    stop: CancellationToken,
    front: FrontDoor,
    metrics: Metrics,
    upstream: Upstream,
    threads: usize,
) {
    let open = Arc::new(OpenConnections::new(metrics.clone()));
    let socket = match listener.into_std() {
        Ok(s) => s,
        Err(e) => {
            tracing::error!(error = %e, "cannot hand the listening socket to the front threads");
            return;
        }
    };
    let mut finished = Vec::with_capacity(threads);
    for i in 0..threads.max(1) {
        let spawned = socket.try_clone().and_then(|own| {
            let (app, stop, front, metrics) =
                (app.clone(), stop.clone(), front.clone(), metrics.clone());
            let (open, upstream) = (Arc::clone(&open), upstream.clone());
            let (done, finished_rx) = oneshot::channel::<()>();
            std::thread::Builder::new()
                .name(format!("kvroute-front-{i}"))
                .spawn(move || {
                    let runtime = match tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                    {
                        Ok(r) => r,
                        Err(e) => {
                            tracing::error!(error = %e, "cannot start a front thread's runtime");
                            return;
                        }
                    };
                    runtime.block_on(async move {
                        upstream.pool_on_this_thread();
                        match TcpListener::from_std(own) {
                            Ok(l) => listen::serve_until(l, app, stop, front, metrics, open).await,
                            Err(e) => tracing::error!(error = %e, "a front thread cannot listen"),
                        }
                    });
                    runtime.shutdown_timeout(BLOCKING_WAIT);
                    let _ = done.send(());
                })
                .map(|_| finished_rx)
        });
        match spawned {
            Ok(rx) => finished.push(rx),
            Err(e) => tracing::warn!(error = %e, thread = i, "cannot start a front thread"),
        }
    }
    if finished.is_empty() {
        match TcpListener::from_std(socket) {
            Ok(l) => listen::serve_until(l, app, stop, front, metrics, open).await,
            Err(e) => tracing::error!(error = %e, "cannot listen"),
        }
        return;
    }
    // The threads hold their own handles to the socket; it closes when the last one stops.
    drop(socket);
    for rx in finished {
        // An error means the thread ended without serving (logged there).
        let _ = rx.await;
    }
}
