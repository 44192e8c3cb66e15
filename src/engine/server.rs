//! Starting and stopping one engine in-process: the engine task plus its HTTP server.
//!
//! `kvroute engine` calls this through [`super::run`]; tests and `kvroute demo` call
//! [`start`] directly with a listener they bound (port 0 is fine) and stop it with
//! [`EngineHandle::shutdown`].

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use axum::serve::ListenerExt;
use thiserror::Error;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::core::{ConfigError, EngineConfig, EngineCore};
use super::driver::{self, EngineClient};
use super::events::{KvEventSink, NoEvents};
use super::http::{AppState, router};
use super::metrics::EngineMetrics;
use crate::tokens::ModelTokens;

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
    /// Where KV events go.
    pub events: Box<dyn KvEventSink>,
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
}

/// A running engine.
pub struct EngineHandle {
    addr: SocketAddr,
    shutdown: CancellationToken,
    server: JoinHandle<std::io::Result<()>>,
    engine: JoinHandle<()>,
    client: EngineClient,
    metrics: Arc<EngineMetrics>,
}

impl EngineHandle {
    /// The HTTP address it serves on.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// A client of its engine task (submit requests without HTTP).
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
        self.engine.await?;
        self.server.await??;
        Ok(())
    }
}

/// Starts an engine serving HTTP on `listener`.
pub async fn start(config: ServeConfig, listener: TcpListener) -> Result<EngineHandle, StartError> {
    if config.default_max_tokens == 0 {
        return Err(StartError::DefaultMaxTokens);
    }
    let max_model_len = config.core.max_model_len();
    let metrics = Arc::new(EngineMetrics::new(&config.model, &config.core)?);
    let core = EngineCore::new(config.core)?;
    let addr = listener.local_addr()?;
    let shutdown = CancellationToken::new();
    let (client, engine) = driver::spawn(core, config.events, metrics.clone(), shutdown.clone());
    let state = Arc::new(AppState {
        client: client.clone(),
        model: config.model,
        tokens: config.tokens,
        default_max_tokens: config.default_max_tokens,
        max_model_len,
        metrics: metrics.clone(),
        responses: AtomicU64::new(1),
        stored: std::sync::Mutex::new(std::collections::HashMap::new()),
    });
    let app = router(state);
    let stop = shutdown.clone();
    // One SSE chunk per token is a stream of tiny writes: without TCP_NODELAY, Nagle's
    // algorithm and delayed ACKs hold each one for tens of milliseconds.
    let listener = listener.tap_io(|tcp| {
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(error = %e, "cannot set TCP_NODELAY");
        }
    });
    let server = tokio::spawn(async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(stop.cancelled_owned())
            .await
    });
    tracing::info!(%addr, "engine listening");
    Ok(EngineHandle {
        addr,
        shutdown,
        server,
        engine,
        client,
        metrics,
    })
}
