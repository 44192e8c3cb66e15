//! The state every request handler shares ([`AppState`]: the fleet, its index, the decision
//! core, the proxy, metrics, admission), built once from the configuration, and the request
//! body's limits ([`BodyLimits`]).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use crate::config::{Config, EndpointsConfig, ModelConfig};
use crate::fleet::{Fleet, gauges::FleetGauges};
use crate::index::{ApproxConfig, ApproxIndex, Holdings, IndexConfig, IndexGauges, KvIndex};
use crate::lifecycle::{Lifecycle, LifecycleGauges};
use crate::metrics::Metrics;
use crate::policy::{self, Policy};
use crate::proxy::Upstream;
use crate::recording::Recorder;
use crate::routing::Decider;
use crate::tls::listener::TlsFront;
use crate::tokens::ModelRegistry;

use super::{admission, affinity, auth};

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
    pub(super) body_limits: arc_swap::ArcSwap<BodyLimits>,
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
    pub(super) models: Vec<ModelConfig>,
    /// Origin of the index's clock (approximate entries expire on it).
    pub(super) started: Instant,
    /// The router's own addresses (configured and bound): a worker there would be a loop.
    pub(super) own_addrs: std::sync::RwLock<Vec<SocketAddr>>,
    /// The front door's TLS, once started with it (for its reload counts in `/metrics`).
    pub(super) tls: std::sync::OnceLock<Arc<TlsFront>>,
    /// The endpoints beyond completions and chat (`[endpoints]`).
    pub(super) endpoints: EndpointsConfig,
    /// Which worker stores which Responses API response.
    pub(super) affinity: Arc<affinity::ResponseAffinity>,
    /// Where clients name their sessions (`[sessions]`, reloadable).
    pub(super) sessions: arc_swap::ArcSwap<crate::config::SessionsConfig>,
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

    pub(super) fn set_tls(&self, front: Arc<TlsFront>) {
        let _ = self.tls.set(front);
    }

    /// The front door's TLS, when it serves HTTPS.
    pub fn tls(&self) -> Option<&Arc<TlsFront>> {
        self.tls.get()
    }

    pub(super) fn add_own_addr(&self, addr: SocketAddr) {
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
    pub(super) fn of(config: &Config) -> BodyLimits {
        BodyLimits {
            max_bytes: config.max_body_bytes,
            read_timeout: config.body_read_timeout,
        }
    }
}
