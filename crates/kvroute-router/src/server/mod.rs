//! The HTTP face of the router: OpenAI endpoints, operations endpoints, errors in OpenAI's
//! shape, and the lifecycle (start, graceful shutdown).

mod access_log;
mod admin;
pub mod admission;
mod affinity;
mod api;
pub mod auth;
mod background;
mod body;
mod body_budget;
mod cache_salt;
mod call;
mod canned;
mod connection;
mod context;
mod debug;
mod decide;
mod endpoints;
mod forward;
mod front;
mod gate;
#[cfg(feature = "epp")]
pub mod gateway;
mod hops;
mod listen;
mod observer;
mod open_connections;
mod ops;
mod peer;
mod rate_limit;
mod read;
mod refusal;
pub mod reload;
mod reload_guard;
pub(crate) mod repoll;
mod request_id;
mod reserve;
mod responses;
mod route;
mod session_hint;
mod slo;
mod stall;
mod state;
mod tokenize;
mod trail;

pub use background::start_background;

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::routing::{get, post};
use http::StatusCode;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

pub use forward::WORKER_HEADER;
pub use state::{AppState, BodyLimits};

use crate::config::Config;
use crate::openai::{ApiError, ECHO_MAX, shorten};
use crate::tls::listener::TlsFront;

/// The axum application; `/metrics` is on it unless `metrics_apart` (served by
/// [`metrics_app`] on its own listener).
pub fn app(state: Arc<AppState>, metrics_apart: bool) -> Router {
    let router = Router::new()
        .route("/v1/completions", post(forward::completions))
        .route("/v1/chat/completions", post(forward::chat_completions))
        .route("/v1/models", get(ops::models))
        .route("/health", get(ops::health))
        .route("/ready", get(ops::ready));
    let router = endpoints::routes(router);
    let router = if metrics_apart {
        router
    } else {
        router.route("/metrics", get(ops::metrics))
    };
    router
        .route("/debug/route", post(debug::route))
        .route("/admin/workers", get(admin::list).post(admin::add))
        .route("/admin/workers/{id}/drain", post(admin::drain))
        .route("/admin/workers/{id}/undrain", post(admin::undrain))
        .route("/admin/workers/{id}", axum::routing::delete(admin::remove))
        .fallback(endpoints::other)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(axum::middleware::from_fn_with_state(
            Arc::clone(&state),
            front::front,
        ))
        .with_state(state)
}

/// The metrics listener's application (`[server] metrics_listen`): `/metrics` alone.
pub fn metrics_app(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/metrics", get(ops::metrics))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(state)
}

async fn not_found(uri: http::Uri) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "invalid_request_error",
        Some("not_found"),
        format!("no route for `{}`", shorten(uri.path(), ECHO_MAX)),
    )
}

async fn method_not_allowed(method: http::Method, uri: http::Uri) -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "invalid_request_error",
        Some("method_not_allowed"),
        format!(
            "method {} is not allowed on `{}`",
            shorten(method.as_str(), ECHO_MAX),
            shorten(uri.path(), ECHO_MAX)
        ),
    )
}

/// A running router.
pub struct RouterHandle {
    /// The address it listens on.
    pub addr: SocketAddr,
    /// The address `/metrics` is served on when apart (`[server] metrics_listen`).
    pub metrics_addr: Option<SocketAddr>,
    /// Its shared state (fleet, metrics).
    pub state: Arc<AppState>,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl RouterHandle {
    /// Starts graceful shutdown and waits for it to complete.
    pub async fn shutdown(self) {
        self.stop.cancel();
        let _ = self.task.await;
    }

    /// A token that, when cancelled, begins graceful shutdown.
    pub fn stop_token(&self) -> CancellationToken {
        self.stop.clone()
    }

    /// Waits until the router has stopped.
    pub async fn wait(self) {
        let _ = self.task.await;
    }
}

/// Starts a router for `config` on `listener`, with health checks; returns at once.
pub fn start(config: &Config, listener: TcpListener) -> anyhow::Result<RouterHandle> {
    let state = Arc::new(AppState::from_config(config)?);
    start_with_state(state, config, listener)
}

/// Starts a router with prepared `state` (tests, `demo`) on `listener`.
pub fn start_with_state(
    state: Arc<AppState>,
    config: &Config,
    listener: TcpListener,
) -> anyhow::Result<RouterHandle> {
    let addr = listener.local_addr()?;
    state.add_own_addr(addr);
    log_admin_state(&state.keys);
    let stop = CancellationToken::new();
    let background = start_background(&state, config, &stop)?;
    let tls = match &config.tls {
        Some(settings) => Some(tls_front(&state, settings, &stop)?),
        None => None,
    };
    let front = listen::FrontDoor {
        grace: config.shutdown_grace,
        header_read_timeout: config.header_read_timeout,
        connections: config.connections,
        cutoff: state.cutoff.clone(),
        tls: None,
    };
    let metrics = Arc::clone(&state.metrics);
    let (metrics_addr, metrics_task) = match config.metrics_listen {
        Some(at) => {
            let listener = bind_now(at)
                .map_err(|e| anyhow::anyhow!("cannot listen for metrics on {at}: {e}"))?;
            let bound = listener.local_addr()?;
            state.add_own_addr(bound);
            let serve = listen::serve_until(
                listener,
                metrics_app(Arc::clone(&state)),
                stop.clone(),
                front.clone(),
                Arc::clone(&metrics),
            );
            (Some(bound), Some(tokio::spawn(serve)))
        }
        None => (None, None),
    };
    let app = app(Arc::clone(&state), metrics_addr.is_some());
    // The API's listener speaks TLS when configured; a separate metrics listener stays plain
    // (scrapers on the pod network), as Prometheus exporters usually are.
    let front = listen::FrontDoor { tls, ..front };
    let stop_serving = stop.clone();
    let task = tokio::spawn(async move {
        listen::serve_until(listener, app, stop_serving, front, metrics).await;
        if let Some(t) = metrics_task {
            let _ = t.await;
        }
        for t in background {
            t.abort();
        }
    });
    Ok(RouterHandle {
        addr,
        metrics_addr,
        state,
        stop,
        task,
    })
}

/// The TLS of a listener, loaded now and re-read when its files change until `stop`.
fn tls_front(
    state: &AppState,
    settings: &crate::tls::ServerTls,
    stop: &CancellationToken,
) -> anyhow::Result<Arc<TlsFront>> {
    let front = TlsFront::load(settings.clone()).map_err(|e| anyhow::anyhow!("server.tls: {e}"))?;
    front.spawn_reloader(stop.clone());
    state.set_tls(Arc::clone(&front));
    Ok(front)
}

/// Serves `app` on `listener` with the front door's timeouts, connection cap and graceful
/// shutdown (and TLS, when `tls`), until `stop`: another face's listener (`epp`'s gRPC, its
/// health and metrics) treated as `serve` treats its own.
pub fn serve_router(
    state: &Arc<AppState>,
    config: &Config,
    listener: TcpListener,
    app: Router,
    tls: Option<&crate::tls::ServerTls>,
    stop: &CancellationToken,
) -> anyhow::Result<tokio::task::JoinHandle<()>> {
    if let Ok(addr) = listener.local_addr() {
        state.add_own_addr(addr);
    }
    let tls = match tls {
        Some(settings) => Some(tls_front(state, settings, stop)?),
        None => None,
    };
    let front = listen::FrontDoor {
        grace: config.shutdown_grace,
        header_read_timeout: config.header_read_timeout,
        connections: config.connections,
        cutoff: state.cutoff.clone(),
        tls,
    };
    let serve = listen::serve_until(
        listener,
        app,
        stop.clone(),
        front,
        Arc::clone(&state.metrics),
    );
    Ok(tokio::spawn(serve))
}

/// Says at start who may change the fleet through the admin API: a WARN when it is open
/// without a key (to loopback clients), else INFO.
fn log_admin_state(keys: &auth::Keys) {
    let state = keys.admin_state();
    if keys.admin_open_without_key() {
        tracing::warn!("{state}");
    } else {
        tracing::info!("{state}");
    }
}

/// Fetches the tokenizers named by Hugging Face ids into the cache (or finds them there),
/// before [`AppState::from_config`] loads every tokenizer: a start-time error names the model,
/// the id, the endpoint and the hub's answer.
pub async fn fetch_tokenizers(config: &Config) -> anyhow::Result<()> {
    let hub = crate::tokens::hub::Hub::from_env();
    crate::tokens::hub::fetch_all(&hub, config.models.iter().map(|m| m.token_source())).await?;
    Ok(())
}

/// Binds `addr` at once (from a synchronous caller on a Tokio runtime).
fn bind_now(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let listener = std::net::TcpListener::bind(addr)?;
    listener.set_nonblocking(true)?;
    TcpListener::from_std(listener)
}

/// `kvroute serve`: runs until SIGTERM or ctrl-c, then drains; SIGHUP reloads the
/// configuration (see [`reload`]). `args` are the flags and variables it was loaded with.
pub async fn run(
    loaded: crate::config::Loaded,
    args: crate::config::ServeArgs,
) -> anyhow::Result<()> {
    // Before anything else: SIGHUP's default action ends the process.
    let hangups = reload::hangups();
    let config = &loaded.config;
    fetch_tokenizers(config).await?;
    let listener = TcpListener::bind(config.listen)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen on {}: {e}", config.listen))?;
    let state = Arc::new(AppState::from_config(config)?);
    // The file's digest before the first request or scrape can arrive.
    state.metrics.config.loaded(&loaded.sha256);
    let handle = start_with_state(state, config, listener)?;
    tracing::info!(
        addr = %handle.addr,
        policy = %config.policy,
        workers = config.workers.len(),
        config_sha256 = %loaded.sha256,
        "kvroute is serving"
    );
    if let Some(at) = handle.metrics_addr {
        tracing::info!(addr = %at, "metrics are served on their own address");
    }
    let stop = handle.stop_token();
    let reloader = reload::Reloader::start(Arc::clone(&handle.state), &loaded, args, &stop);
    if let Some(every) = config.config_reload_interval {
        tokio::spawn(reload::on_change(
            every,
            Arc::clone(&reloader),
            stop.clone(),
        ));
    }
    tokio::spawn(reload::on_hangup(hangups, reloader, stop.clone()));
    tokio::spawn(async move {
        shutdown_signal().await;
        tracing::info!("shutdown requested; draining in-flight requests");
        stop.cancel();
    });
    handle.wait().await;
    tracing::info!("stopped");
    Ok(())
}

/// Resolves on ctrl-c or SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {}
        _ = term => {}
    }
}
