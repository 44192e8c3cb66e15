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
mod tokenize;
mod trail;

pub use background::start_background;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::routing::{get, post};
use http::StatusCode;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

pub use forward::WORKER_HEADER;

use crate::config::{Config, EndpointsConfig, ModelConfig};
use crate::fleet::{Fleet, gauges::FleetGauges};
use crate::index::{ApproxConfig, ApproxIndex, Holdings, IndexConfig, IndexGauges, KvIndex};
use crate::lifecycle::{Lifecycle, LifecycleGauges};
use crate::metrics::Metrics;
use crate::openai::{ApiError, ECHO_MAX, shorten};
use crate::policy::{self, Policy};
use crate::proxy::Upstream;
use crate::recording::Recorder;
use crate::routing::Decider;
use crate::tls::listener::TlsFront;
use crate::tokens::ModelRegistry;

/// Everything a request handler needs, shared by all requests.
pub struct AppState {
    /// The workers.
    pub fleet: Arc<Fleet>,
    /// The routing policy.
    pub policy: Arc<dyn Policy>,
    /// The decision core: the policy over the index.
    pub decider: Decider,
    /// The upstream client.
    pub upstream: Upstream,
    /// The metrics: shared, not cloned, by what lives as long as a request (a `Metrics` clone
    /// is one reference count per metric family, dozens of atomic operations each way).
    pub metrics: Arc<Metrics>,
    /// Largest accepted request body and longest a client may take to send it (reloadable).
    body_limits: arc_swap::ArcSwap<BodyLimits>,
    /// Tokenizers, chat templates and block sizes per model.
    pub tokens: ModelRegistry,
    /// Who holds which block: event-fed and predicted.
    pub holdings: Arc<Holdings>,
    /// API keys and tenants.
    pub keys: auth::Keys,
    /// Concurrency limits.
    pub admission: admission::Admission,
    /// Every worker's join, drain, down and leave.
    pub lifecycle: Arc<Lifecycle>,
    /// Cancelled when the shutdown grace is over: responses still streaming end with an error
    /// event rather than a bare close.
    pub cutoff: CancellationToken,
    /// The recorded trace of routed requests (`[recording]`), when one is named.
    pub recorder: Option<Arc<Recorder>>,
    /// Per-model settings (block size, salt forwarding).
    models: Vec<ModelConfig>,
    /// Origin of the index's clock (approximate entries expire on it).
    started: Instant,
    /// The router's own addresses (configured and bound): a worker there would be a loop.
    own_addrs: std::sync::RwLock<Vec<SocketAddr>>,
    /// The front door's TLS, once started with it (for its reload counts in `/metrics`).
    tls: std::sync::OnceLock<Arc<TlsFront>>,
    /// The endpoints beyond completions and chat (`[endpoints]`).
    endpoints: EndpointsConfig,
    /// Which worker stores which Responses API response.
    affinity: Arc<affinity::ResponseAffinity>,
    /// Where clients name their sessions (`[sessions]`, reloadable).
    sessions: arc_swap::ArcSwap<crate::config::SessionsConfig>,
}

impl AppState {
    /// State for `config`: fleet, policy, tokenizers (loaded now), an empty index, metrics.
    pub fn from_config(config: &Config) -> anyhow::Result<AppState> {
        let holdings = Holdings::new(
            KvIndex::new(IndexConfig {
                max_entries: config.index.max_entries,
            }),
            ApproxIndex::new(ApproxConfig {
                ttl: config.index.approx_ttl,
                capacity_per_worker: config.index.approx_capacity_blocks,
            }),
        );
        holdings
            .sessions
            .configure(config.sessions.ttl, config.sessions.max_sessions);
        let holdings = Arc::new(holdings);
        let policy = policy::build(config.policy, &config.policy_settings());
        let metrics = Metrics::new();
        let lifecycle = Arc::new(
            Lifecycle::new(
                config.workers.clone(),
                config.breaker,
                Arc::clone(&holdings),
                Arc::clone(&policy),
                metrics.clone(),
                &config.models,
            )
            .with_replay_limits(config.replay_limits)
            .with_engines_per_intake(config.engines_per_intake)
            .with_default_block_size(config.default_block_size),
        );
        metrics.register(Box::new(FleetGauges::new(Arc::clone(lifecycle.fleet()))));
        metrics.register(Box::new(IndexGauges::new(Arc::clone(&holdings))));
        metrics.register(Box::new(LifecycleGauges::new(Arc::downgrade(&lifecycle))));
        Ok(AppState {
            decider: Decider::new(Arc::clone(&policy), Arc::clone(&holdings)),
            fleet: Arc::clone(lifecycle.fleet()),
            lifecycle,
            policy,
            upstream: Upstream::new(config.proxy.clone())
                .map_err(|e| anyhow::anyhow!("proxy.tls: {e}"))?,
            metrics: Arc::new(metrics.clone()),
            body_limits: arc_swap::ArcSwap::from_pointee(BodyLimits::of(config)),
            tokens: ModelRegistry::load(
                config.models.iter().map(|m| m.token_source()),
                config.token_cache_bytes,
                config.default_block_size as usize,
            )?,
            holdings,
            keys: auth::Keys::new(&config.tenants, config.admin),
            admission: {
                let admission = admission::Admission::new(
                    config.limits,
                    &config.tenants,
                    &config.priorities,
                    &metrics,
                );
                admission.set_isolation(config.isolation);
                admission
            },
            recorder: recorder(config, &metrics)?,
            models: config.models.clone(),
            started: Instant::now(),
            cutoff: CancellationToken::new(),
            own_addrs: std::sync::RwLock::new(
                std::iter::once(config.listen)
                    .chain(config.metrics_listen)
                    .collect(),
            ),
            tls: std::sync::OnceLock::new(),
            endpoints: config.endpoints.clone(),
            affinity: Arc::new(affinity::ResponseAffinity::new(
                config.endpoints.responses_capacity,
                config.endpoints.responses_ttl,
            )),
            sessions: arc_swap::ArcSwap::from_pointee(config.sessions.clone()),
        })
    }

    /// Where clients name their sessions now (a config reload may change it).
    pub(crate) fn sessions(&self) -> Arc<crate::config::SessionsConfig> {
        self.sessions.load_full()
    }

    /// Applies a reloaded `[sessions]`: where names are read, and the homes' limits.
    pub(crate) fn set_sessions(&self, config: &crate::config::SessionsConfig) {
        self.holdings
            .sessions
            .configure(config.ttl, config.max_sessions);
        self.sessions.store(Arc::new(config.clone()));
    }

    /// The request body limits now (a config reload may change them).
    pub fn body_limits(&self) -> BodyLimits {
        **self.body_limits.load()
    }

    /// The addresses this router listens on (configured, and bound once started).
    pub fn own_addrs(&self) -> Vec<SocketAddr> {
        match self.own_addrs.read() {
            Ok(a) => a.clone(),
            Err(p) => p.into_inner().clone(),
        }
    }

    fn set_tls(&self, front: Arc<TlsFront>) {
        let _ = self.tls.set(front);
    }

    /// The front door's TLS, when it serves HTTPS.
    pub fn tls(&self) -> Option<&Arc<TlsFront>> {
        self.tls.get()
    }

    fn add_own_addr(&self, addr: SocketAddr) {
        let mut a = match self.own_addrs.write() {
            Ok(a) => a,
            Err(p) => p.into_inner(),
        };
        if !a.contains(&addr) {
            a.push(addr);
        }
    }

    /// Whether a tenant's cache salt is sent to `model`'s engines (default: yes).
    pub fn forwards_salt(&self, model: &str) -> bool {
        self.models
            .iter()
            .find(|m| m.name == model)
            .is_none_or(|m| m.forward_cache_salt)
    }

    /// How `model`'s disaggregated requests hand the KV cache over: its `[[models]]` entry's
    /// (an adapter's: its base model's), else vLLM's.
    pub fn handoff(&self, model: &str) -> crate::proxy::handoff::Protocol {
        let own = self.model_config(model);
        own.filter(|m| m.base_model.is_none())
            .or_else(|| {
                let base = self.adapter_base(model)?;
                self.models.iter().find(|m| m.name == base)
            })
            .or(own)
            .map(ModelConfig::handoff)
            .unwrap_or_default()
    }

    /// The `[[models]]` entry of `model`, if it has one.
    pub fn model_config(&self, model: &str) -> Option<&ModelConfig> {
        self.models.iter().find(|m| m.name == model)
    }

    /// The base model `model` runs on when it is a LoRA adapter: configured (`[[models]]
    /// base_model`) or reported by a worker (the `parent` of vLLM's `/v1/models` entries).
    pub fn adapter_base(&self, model: &str) -> Option<String> {
        self.models
            .iter()
            .find(|m| m.name == model)
            .and_then(|m| m.base_model.clone())
            .or_else(|| self.fleet.adapter_base(model))
    }

    /// The index's clock: time since the router started.
    pub fn now(&self) -> Duration {
        self.started.elapsed()
    }
}

/// The trace recorder of `[recording]`, started now (its file is created now, so a path that
/// cannot be written fails the start).
fn recorder(config: &Config, metrics: &Metrics) -> anyhow::Result<Option<Arc<Recorder>>> {
    let Some(settings) = &config.recording else {
        return Ok(None);
    };
    let recorder =
        Recorder::start(settings, metrics).map_err(|e| anyhow::anyhow!("[recording]: {e}"))?;
    tracing::info!(path = %settings.path.display(), "recording routed requests as a Mooncake trace");
    Ok(Some(Arc::new(recorder)))
}

/// How large a request body may be and how long its client may take to send it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BodyLimits {
    /// Largest accepted request body (413 beyond).
    pub max_bytes: usize,
    /// Longest a client may take to send its body (408 beyond).
    pub read_timeout: Duration,
}

impl BodyLimits {
    fn of(config: &Config) -> BodyLimits {
        BodyLimits {
            max_bytes: config.max_body_bytes,
            read_timeout: config.body_read_timeout,
        }
    }
}

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
