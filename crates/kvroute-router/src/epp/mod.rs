//! `kvroute epp`: kvroute as a Gateway API Inference Extension endpoint picker.
//!
//! A gateway (Istio, kgateway, GKE, Envoy Gateway, agentgateway…) that routes to an
//! `InferencePool` asks its picker, over Envoy's `ext_proc` gRPC stream, which pod should serve
//! each request; it then forwards the request itself. This is a second face over the router's
//! one decision path: the request's head and body (buffered to its end, within `serve`'s body
//! limits and admission) go through `server::gateway` — the same reading, eligibility,
//! analysis and `routing::Session` as `serve` — and the pick goes back as the
//! `x-gateway-destination-endpoint` header and `envoy.lb` metadata (`protocol`). The response
//! phase tells which endpoint served; the same observer as `serve`'s records its first token
//! and end (`stream`).
//!
//! Ports, as GIE's pickers use them: gRPC 9002 (TLS with `[server.tls]` or `--tls-cert`),
//! `grpc.health.v1` on 9003 (`liveness`; `readiness` and the ext_proc service once a worker
//! is known: `health`), Prometheus on 9090.

mod args;
mod channel;
mod health;
pub mod metadata;
pub mod protocol;
mod response;
mod stream;

use std::net::SocketAddr;
use std::sync::Arc;

use envoy_types::pb::envoy::service::ext_proc::v3::external_processor_server::ExternalProcessorServer;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::config::{Config, Loaded};
use crate::server::{self, AppState};

pub use args::EppArgs;

/// Where a picker listens.
#[derive(Debug)]
pub struct Listeners {
    /// The ext_proc gRPC port (9002).
    pub grpc: TcpListener,
    /// The gRPC health port (9003).
    pub health: TcpListener,
    /// The Prometheus port (9090).
    pub metrics: TcpListener,
}

/// A running picker.
pub struct EppHandle {
    /// The ext_proc address.
    pub grpc_addr: SocketAddr,
    /// The gRPC health address.
    pub health_addr: SocketAddr,
    /// The metrics address.
    pub metrics_addr: SocketAddr,
    /// Its state (fleet, metrics), `serve`'s own.
    pub state: Arc<AppState>,
    stop: CancellationToken,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    background: Vec<tokio::task::JoinHandle<()>>,
}

impl EppHandle {
    /// Stops serving (open streams get the shutdown grace) and waits for it.
    pub async fn shutdown(self) {
        self.stop.cancel();
        for t in self.tasks {
            let _ = t.await;
        }
        for t in self.background {
            t.abort();
        }
    }

    /// A token that stops the picker when cancelled.
    pub fn stop_token(&self) -> CancellationToken {
        self.stop.clone()
    }
}

/// Starts a picker for `config` on `listeners` (TLS on the gRPC port with `config.tls`),
/// naming as many fallback endpoints as `serve` would make retries ([`default_fallbacks`]).
pub fn start(config: &Config, listeners: Listeners) -> anyhow::Result<EppHandle> {
    start_naming(config, listeners, default_fallbacks(config))
}

/// [`start`], naming up to `fallbacks` endpoints after each pick.
pub fn start_naming(
    config: &Config,
    listeners: Listeners,
    fallbacks: usize,
) -> anyhow::Result<EppHandle> {
    let state = Arc::new(AppState::from_config(config)?);
    start_with_state(state, config, listeners, fallbacks)
}

/// Fallback endpoints named when `--fallbacks` is not given: `[proxy] retries` (1 unless
/// set), so a gateway that retries goes down the list as far as `serve` would retry, each
/// time to the worker the decision priced next.
pub fn default_fallbacks(config: &Config) -> usize {
    config.proxy.retries as usize
}

/// Most ext_proc streams a gateway may have open on one connection to the picker. Each stream
/// lives as long as its LLM request (the response phase included), and a gateway multiplexes
/// them over few connections: at HTTP/2's usual 200, a gateway that opened more streams before
/// it read the picker's SETTINGS had the excess refused (`REFUSED_STREAM`, seen as a failed
/// stream open when 2,000 streams started at once over 8 connections on a loaded machine).
/// The router's admission, not the connection, bounds what runs.
pub const STREAMS_PER_GATEWAY_CONNECTION: u32 = 8192;

/// Starts a picker over prepared `state`, naming up to `fallbacks` endpoints after each pick.
pub fn start_with_state(
    state: Arc<AppState>,
    config: &Config,
    listeners: Listeners,
    fallbacks: usize,
) -> anyhow::Result<EppHandle> {
    let grpc_addr = listeners.grpc.local_addr()?;
    let health_addr = listeners.health.local_addr()?;
    let metrics_addr = listeners.metrics.local_addr()?;
    let stop = CancellationToken::new();
    let background = server::start_background(&state, config, &stop)?;
    let picker = ExternalProcessorServer::new(stream::Picker::new(Arc::clone(&state), fallbacks))
        .max_decoding_message_size(stream::MAX_MESSAGE_BYTES);
    let grpc = tonic::service::Routes::new(picker).into_axum_router();
    let (reporter, health_service) = tonic_health::server::health_reporter();
    let health_app = tonic::service::Routes::new(health_service).into_axum_router();
    let mut gateway_side = config.clone();
    gateway_side.connections.http2_max_concurrent_streams = STREAMS_PER_GATEWAY_CONNECTION;
    let tasks = vec![
        server::serve_router(
            &state,
            &gateway_side,
            listeners.grpc,
            grpc,
            config.tls.as_ref(),
            &stop,
        )?,
        server::serve_router(&state, config, listeners.health, health_app, None, &stop)?,
        server::serve_router(
            &state,
            config,
            listeners.metrics,
            server::metrics_app(Arc::clone(&state)),
            None,
            &stop,
        )?,
        tokio::spawn(health::report(Arc::clone(&state), reporter, stop.clone())),
    ];
    Ok(EppHandle {
        grpc_addr,
        health_addr,
        metrics_addr,
        state,
        stop,
        tasks,
        background,
    })
}

/// `kvroute epp`: runs until SIGTERM or ctrl-c, then drains.
pub async fn run(loaded: Loaded, args: &EppArgs) -> anyhow::Result<()> {
    let config = &loaded.config;
    server::fetch_tokenizers(config).await?;
    let bind = |at: SocketAddr| async move {
        TcpListener::bind(at)
            .await
            .map_err(|e| anyhow::anyhow!("cannot listen on {at}: {e}"))
    };
    let listeners = Listeners {
        grpc: bind(args.grpc_listen).await?,
        health: bind(args.health_listen).await?,
        metrics: bind(args.metrics_listen).await?,
    };
    let state = Arc::new(AppState::from_config(config)?);
    state.metrics.config.loaded(&loaded.sha256);
    let fallbacks = args
        .fallbacks
        .map_or_else(|| default_fallbacks(config), |n| n as usize);
    let handle = start_with_state(state, config, listeners, fallbacks)?;
    tracing::info!(
        grpc = %handle.grpc_addr,
        health = %handle.health_addr,
        metrics = %handle.metrics_addr,
        policy = %config.policy,
        pool = args.pool_name.as_deref().unwrap_or("-"),
        fallbacks,
        "kvroute is picking endpoints"
    );
    let stop = handle.stop_token();
    tokio::spawn(async move {
        server::shutdown_signal().await;
        tracing::info!("shutdown requested; draining open streams");
        stop.cancel();
    });
    let stopped = handle.stop_token();
    stopped.cancelled().await;
    handle.shutdown().await;
    tracing::info!("stopped");
    Ok(())
}
