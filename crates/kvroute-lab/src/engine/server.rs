//! Starting and stopping one engine in-process: the engine task plus its HTTP server.
//!
//! `kvroute engine` calls this through [`super::run`]; tests and `kvroute demo` call
//! [`start`] directly with a listener they bound (port 0 is fine) and stop it with
//! [`EngineHandle::shutdown`].

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use axum::serve::ListenerExt;
use thiserror::Error;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::bootstrap::Rooms;
use super::core::{ConfigError, EngineConfig, EngineCore};
use super::disaggregated::DEFAULT_BOOTSTRAP_WAIT;
use super::driver::{self, EngineClient};
use super::events::{KvEventSink, NoEvents};
use super::handoff_routes;
use super::http::{AppState, router};
use super::kv_transfer::Transfers;
use super::metrics::EngineMetrics;
use kvroute_router::fleet::{MAX_DATA_PARALLEL_SIZE, Role};
use kvroute_router::tokens::ModelTokens;

/// Everything one engine instance needs.
pub struct ServeConfig {
    /// Served model name (`model` in requests, `model_name` in metrics).
    pub model: String,
    /// The model core.
    pub core: EngineConfig,
    /// Tokenizer and chat template of the model.
    pub tokens: Arc<ModelTokens>,
    /// Output length when a request gives no `max_tokens`.
    pub default_max_tokens: usize,
    /// Where KV events go (rank 0's, with data parallelism).
    pub events: Box<dyn KvEventSink>,
    /// Engine cores behind the one port (vLLM `--data-parallel-size`): each its own scheduler
    /// and KV cache, chosen per request by `X-data-parallel-rank` or else by the fewest open
    /// requests.
    pub data_parallel_size: u32,
    /// Where the KV events of ranks 1, 2, … go (vLLM publishes rank N's on the configured
    /// port plus N); a rank without one publishes nothing.
    pub rank_events: Vec<Box<dyn KvEventSink>>,
    /// Which side of disaggregated requests it runs.
    pub role: Role,
    /// The port of its bootstrap server (SGLang-style prefill), on the HTTP listener's
    /// address; 0 picks one; `None`: no bootstrap server.
    pub bootstrap_port: Option<u16>,
    /// How long a room waits for its other side.
    pub bootstrap_wait: Duration,
}

impl ServeConfig {
    /// An engine serving `model` with default settings, the builtin tokenizer and no events.
    pub fn new(model: impl Into<String>) -> Self {
        ServeConfig {
            model: model.into(),
            core: EngineConfig::default(),
            tokens: Arc::new(ModelTokens::builtin(EngineConfig::default().block_size)),
            default_max_tokens: 16,
            events: Box::new(NoEvents),
            data_parallel_size: 1,
            rank_events: Vec::new(),
            role: Role::Both,
            bootstrap_port: None,
            bootstrap_wait: DEFAULT_BOOTSTRAP_WAIT,
        }
    }
}

/// Why an engine could not start.
#[derive(Debug, Error)]
pub enum StartError {
    /// The model configuration is invalid.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// Metrics could not be registered.
    #[error("metrics: {0}")]
    Metrics(#[from] prometheus::Error),
    /// The listener has no local address.
    #[error("listener: {0}")]
    Io(#[from] std::io::Error),
    /// `default_max_tokens` is zero.
    #[error("default_max_tokens must be at least 1")]
    DefaultMaxTokens,
    /// `data_parallel_size` is zero or beyond the bound.
    #[error("--data-parallel-size must be from 1 to {MAX_DATA_PARALLEL_SIZE}")]
    DataParallelSize,
}

/// A running engine.
pub struct EngineHandle {
    addr: SocketAddr,
    bootstrap: Option<SocketAddr>,
    shutdown: CancellationToken,
    server: JoinHandle<std::io::Result<()>>,
    engines: Vec<JoinHandle<()>>,
    client: EngineClient,
    metrics: Arc<EngineMetrics>,
}

impl EngineHandle {
    /// The HTTP address it serves on.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Where its bootstrap server listens, if it runs one.
    pub fn bootstrap_addr(&self) -> Option<SocketAddr> {
        self.bootstrap
    }

    /// A client of its (first rank's) engine task (submit requests without HTTP).
    pub fn client(&self) -> &EngineClient {
        &self.client
    }

    /// Its metrics.
    pub fn metrics(&self) -> &Arc<EngineMetrics> {
        &self.metrics
    }

    /// A token that stops the engine when cancelled (e.g. on Ctrl-C).
    pub fn shutdown_token(&self) -> CancellationToken {
        self.shutdown.clone()
    }

    /// Stops accepting, ends in-flight streams, and waits for both tasks.
    pub async fn shutdown(self) -> anyhow::Result<()> {
        self.shutdown.cancel();
        self.wait().await
    }

    /// Waits until the engine stops (after its shutdown token is cancelled).
    pub async fn wait(self) -> anyhow::Result<()> {
        for engine in self.engines {
            engine.await?;
        }
        self.server.await??;
        Ok(())
    }
}

/// Starts an engine serving HTTP on `listener`.
pub async fn start(config: ServeConfig, listener: TcpListener) -> Result<EngineHandle, StartError> {
    if config.default_max_tokens == 0 {
        return Err(StartError::DefaultMaxTokens);
    }
    let ranks = config.data_parallel_size;
    if !(1..=MAX_DATA_PARALLEL_SIZE).contains(&ranks) {
        return Err(StartError::DataParallelSize);
    }
    let max_model_len = config.core.max_model_len();
    let registry = prometheus::Registry::new();
    let addr = listener.local_addr()?;
    let shutdown = CancellationToken::new();
    let mut sinks = std::iter::once(config.events).chain(config.rank_events);
    let (mut clients, mut engines, mut all_metrics) = (Vec::new(), Vec::new(), Vec::new());
    for rank in 0..ranks {
        let metrics = Arc::new(EngineMetrics::for_rank(
            &registry,
            &config.model,
            &config.core,
            rank,
        )?);
        let core = EngineCore::new(config.core.clone())?;
        let sink = sinks.next().unwrap_or_else(|| Box::new(NoEvents));
        let (client, engine) =
            driver::spawn_rank(core, sink, metrics.clone(), rank, shutdown.clone());
        clients.push(client);
        engines.push(engine);
        all_metrics.push(metrics);
    }
    let (client, metrics) = (clients[0].clone(), Arc::clone(&all_metrics[0]));
    let state = Arc::new(AppState {
        clients,
        next_rank: std::sync::atomic::AtomicU32::new(0),
        model: config.model,
        tokens: config.tokens,
        default_max_tokens: config.default_max_tokens,
        max_model_len,
        metrics: metrics.clone(),
        responses: AtomicU64::new(1),
        stored: std::sync::Mutex::new(std::collections::HashMap::new()),
        role: config.role,
        transfers: Transfers::new(
            reachable_host(addr),
            addr.port(),
            Duration::from_secs_f64(config.core.kv_hold_timeout_s),
        ),
        rooms: Rooms::new(config.bootstrap_wait),
    });
    let bootstrap = match config.bootstrap_port {
        None => None,
        Some(port) => {
            Some(serve_bootstrap(SocketAddr::new(addr.ip(), port), &state, &shutdown).await?)
        }
    };
    let server = serve_http(listener, router(state), &shutdown);
    tracing::info!(%addr, "engine listening");
    Ok(EngineHandle {
        addr,
        bootstrap,
        shutdown,
        server,
        engines,
        client,
        metrics,
    })
}

/// Serves the SGLang bootstrap endpoint of a prefill engine on `at` until `shutdown`; the
/// address it listens on.
async fn serve_bootstrap(
    at: SocketAddr,
    state: &Arc<AppState>,
    shutdown: &CancellationToken,
) -> Result<SocketAddr, StartError> {
    let listener = TcpListener::bind(at).await?;
    let at = listener.local_addr()?;
    let app = handoff_routes::bootstrap_router(Arc::clone(state));
    let stop = shutdown.clone();
    tokio::spawn(async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(stop.cancelled_owned())
            .await
    });
    tracing::info!(%at, "bootstrap server listening");
    Ok(at)
}

/// Serves the engine's HTTP `app` on `listener` until `shutdown`, with `TCP_NODELAY` on
/// every connection.
fn serve_http(
    listener: TcpListener,
    app: axum::Router,
    shutdown: &CancellationToken,
) -> JoinHandle<std::io::Result<()>> {
    let stop = shutdown.clone();
    // One SSE chunk per token is a stream of tiny writes: without TCP_NODELAY, Nagle's
    // algorithm and delayed ACKs hold each one for tens of milliseconds.
    let listener = listener.tap_io(|tcp| {
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(error = %e, "cannot set TCP_NODELAY");
        }
    });
    tokio::spawn(async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(stop.cancelled_owned())
            .await
    })
}

/// The host decode engines reach this one at: its listen address, or loopback when it listens
/// on every address (a simulated fleet runs on one machine).
fn reachable_host(addr: SocketAddr) -> String {
    if addr.ip().is_unspecified() {
        "127.0.0.1".into()
    } else {
        addr.ip().to_string()
    }
}
