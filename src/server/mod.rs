//! The HTTP face of the router: OpenAI endpoints, operations endpoints, errors in OpenAI's
//! shape, and the lifecycle (start, graceful shutdown).

mod admin;
pub mod admission;
pub mod auth;
mod body;
mod debug;
mod forward;
mod listen;
mod ops;
mod route;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::routing::{get, post};
use http::StatusCode;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::config::{Config, ModelConfig};
use crate::fleet::health::{self, CapacityHook};
use crate::fleet::{DownHook, Fleet, Worker};
use crate::index::{
    ApproxConfig, ApproxIndex, Holdings, IndexConfig, KvIndex, WorkerFeed, WorkerIdx,
};
use crate::kv_events::SubscriberConfig;
use crate::metrics::Metrics;
use crate::openai::ApiError;
use crate::policy::{self, Policy};
use crate::proxy::Upstream;
use crate::tokens::ModelRegistry;

/// Everything a request handler needs, shared by all requests.
pub struct AppState {
    /// The workers.
    pub fleet: Arc<Fleet>,
    /// The routing policy.
    pub policy: Arc<dyn Policy>,
    /// The upstream client.
    pub upstream: Upstream,
    /// The metrics.
    pub metrics: Metrics,
    /// Largest accepted request body.
    pub max_body_bytes: usize,
    /// Longest a client may take to send its body.
    pub body_read_timeout: Duration,
    /// Tokenizers, chat templates and block sizes per model.
    pub tokens: ModelRegistry,
    /// Who holds which block: event-fed and predicted.
    pub holdings: Arc<Holdings>,
    /// API keys and tenants.
    pub keys: auth::Keys,
    /// Concurrency limits.
    pub admission: admission::Admission,
    /// Per-model settings (block size, salt forwarding).
    models: Vec<ModelConfig>,
    /// KV-event feeds, by worker slot.
    feeds: Mutex<HashMap<u32, WorkerFeed>>,
    /// Origin of the index's clock (approximate entries expire on it).
    started: Instant,
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
        let holdings = Arc::new(holdings);
        let forget = Arc::clone(&holdings);
        let on_down: DownHook = Arc::new(move |w: &Worker| {
            forget.exact.clear_worker(WorkerIdx(w.slot));
            forget.approx.clear_worker(WorkerIdx(w.slot));
        });
        Ok(AppState {
            fleet: Arc::new(Fleet::with(
                config.workers.clone(),
                config.breaker,
                Some(on_down),
            )),
            policy: policy::build(config.policy, &config.policy_settings()),
            upstream: Upstream::new(config.proxy.clone()),
            metrics: Metrics::new(),
            max_body_bytes: config.max_body_bytes,
            body_read_timeout: config.body_read_timeout,
            tokens: ModelRegistry::load(config)?,
            holdings,
            keys: auth::Keys::new(&config.tenants, config.admin_key_sha256),
            admission: admission::Admission::new(config.limits, &config.tenants),
            models: config.models.clone(),
            feeds: Mutex::new(HashMap::new()),
            started: Instant::now(),
        })
    }

    /// Whether a tenant's cache salt is sent to `model`'s engines (default: yes).
    pub fn forwards_salt(&self, model: &str) -> bool {
        self.models
            .iter()
            .find(|m| m.name == model)
            .is_none_or(|m| m.forward_cache_salt)
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

    /// Subscribes to the KV events of every worker that publishes them and has none yet.
    /// Must be called on a Tokio runtime.
    pub fn start_feeds(&self) {
        for w in self.fleet.workers().iter() {
            self.start_feed(w);
            if let Some(blocks) = w.kv_blocks() {
                reserve_capacity(&self.holdings, &self.fleet, w, blocks);
            }
        }
    }

    /// Stops the worker's KV-event feed (its index entries are dropped with it).
    fn stop_feed(&self, slot: u32) {
        let feed = self.feeds.lock().ok().and_then(|mut f| f.remove(&slot));
        drop(feed);
        self.holdings.exact.clear_worker(WorkerIdx(slot));
        self.holdings.approx.clear_worker(WorkerIdx(slot));
    }

    fn start_feed(&self, w: &Arc<Worker>) {
        let Some(endpoint) = &w.spec.kv_events else {
            return;
        };
        let Ok(mut feeds) = self.feeds.lock() else {
            return;
        };
        if feeds.contains_key(&w.slot) {
            return;
        }
        let mut sub = SubscriberConfig::new(w.id(), endpoint.clone());
        if let Some(replay) = &w.spec.kv_replay {
            sub = sub.with_replay(replay.clone());
        }
        // Engine events do not name the model: a worker's blocks are hashed for its first base
        // model (adapters' blocks carry their `lora_name`), which is every worker's case in a
        // single-model fleet. It is read when events arrive, since a worker configured without
        // models learns them at its first health check.
        let worker = Arc::clone(w);
        let adapters: Vec<String> = self
            .models
            .iter()
            .filter(|m| m.base_model.is_some())
            .map(|m| m.name.clone())
            .collect();
        let model = move || {
            worker
                .models()
                .into_iter()
                .find(|m| !adapters.contains(m) && worker.adapter_base(m).is_none())
        };
        let holdings = Arc::clone(&self.holdings);
        match WorkerFeed::start(holdings, WorkerIdx(w.slot), Box::new(model), sub) {
            Ok(feed) => {
                feeds.insert(w.slot, feed);
            }
            Err(e) => tracing::error!(worker = w.id(), error = %e, "cannot subscribe to KV events"),
        }
    }

    /// What the health checker calls with a worker's KV capacity read from its metrics.
    fn capacity_hook(&self) -> CapacityHook {
        let (holdings, fleet) = (Arc::clone(&self.holdings), Arc::clone(&self.fleet));
        Arc::new(move |w: &Worker, blocks| reserve_capacity(&holdings, &fleet, w, blocks))
    }

    /// Whether the worker in `slot` has a KV-event feed.
    pub fn has_feed(&self, slot: u32) -> bool {
        self.feeds
            .lock()
            .map(|f| f.contains_key(&slot))
            .unwrap_or(false)
    }

    /// Counters of every feed, by worker slot, for metrics.
    fn feed_stats(&self) -> Vec<(u32, Arc<crate::kv_events::SubscriberStats>)> {
        self.feeds
            .lock()
            .map(|f| {
                f.iter()
                    .filter_map(|(slot, feed)| feed.stats().map(|s| (*slot, Arc::clone(s))))
                    .collect()
            })
            .unwrap_or_default()
    }
}

/// The axum application.
pub fn app(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/v1/completions", post(forward::completions))
        .route("/v1/chat/completions", post(forward::chat_completions))
        .route("/v1/models", get(ops::models))
        .route("/health", get(ops::health))
        .route("/ready", get(ops::ready))
        .route("/metrics", get(ops::metrics))
        .route("/debug/route", post(debug::route))
        .route("/admin/workers", get(admin::list).post(admin::add))
        .route("/admin/workers/{id}/drain", post(admin::drain))
        .route("/admin/workers/{id}", axum::routing::delete(admin::remove))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(state)
}

async fn not_found(uri: http::Uri) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "invalid_request_error",
        Some("not_found"),
        format!("no route for `{}`", uri.path()),
    )
}

async fn method_not_allowed(method: http::Method, uri: http::Uri) -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "invalid_request_error",
        Some("method_not_allowed"),
        format!("method {method} is not allowed on `{}`", uri.path()),
    )
}

/// A running router.
pub struct RouterHandle {
    /// The address it listens on.
    pub addr: SocketAddr,
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

/// Tells the index a worker's KV cache size: its approximate predictions are capped at it and,
/// for a worker that publishes events, the exact index's part is sized for it (see
/// [`KvIndex::reserve`]) on a blocking thread: that room (megabytes for a large cache) is
/// allocated and written under the index's write lock, which must not hold up an async worker
/// thread. Must be called on a Tokio runtime.
fn reserve_capacity(holdings: &Arc<Holdings>, fleet: &Arc<Fleet>, w: &Worker, blocks: usize) {
    holdings.approx.set_cache_blocks(WorkerIdx(w.slot), blocks);
    if w.spec.kv_events.is_none() {
        return;
    }
    let (holdings, fleet) = (Arc::clone(holdings), Arc::clone(fleet));
    let (slot, id) = (w.slot, w.id().to_string());
    tokio::task::spawn_blocking(move || {
        let granted = holdings.exact.reserve(WorkerIdx(slot), blocks);
        // A worker removed meanwhile (the fleet forgets it before its feed releases its
        // entries) must not keep the room: slots are never reused.
        if !fleet.workers().iter().any(|w| w.slot == slot) {
            holdings.exact.remove_worker(WorkerIdx(slot));
            return;
        }
        if granted < blocks {
            tracing::warn!(
                worker = id,
                blocks,
                granted,
                "the index's max_entries bounds the room reserved for this worker's KV cache"
            );
        }
    });
}

/// Starts a router with prepared `state` (tests, `demo`) on `listener`.
pub fn start_with_state(
    state: Arc<AppState>,
    config: &Config,
    listener: TcpListener,
) -> anyhow::Result<RouterHandle> {
    let addr = listener.local_addr()?;
    state.start_feeds();
    let stop = CancellationToken::new();
    let health_task = health::spawn(
        Arc::clone(&state.fleet),
        config.health.clone(),
        Some(state.capacity_hook()),
        stop.clone(),
    );
    let app = app(Arc::clone(&state));
    let grace = config.shutdown_grace;
    let header_timeout = config.header_read_timeout;
    let stop_serving = stop.clone();
    let task = tokio::spawn(async move {
        listen::serve_until(listener, app, stop_serving, grace, header_timeout).await;
        health_task.abort();
    });
    Ok(RouterHandle {
        addr,
        state,
        stop,
        task,
    })
}

/// `kvroute serve`: runs until SIGTERM or ctrl-c, then drains.
pub async fn run(config: Config) -> anyhow::Result<()> {
    let listener = TcpListener::bind(config.listen)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen on {}: {e}", config.listen))?;
    let handle = start(&config, listener)?;
    tracing::info!(
        addr = %handle.addr,
        policy = %config.policy,
        workers = config.workers.len(),
        "kvroute is serving"
    );
    let stop = handle.stop_token();
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
