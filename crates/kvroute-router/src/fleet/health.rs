//! Active health checks and model discovery.
//!
//! Every interval each worker's health endpoint is asked, with a timeout; a worker that does
//! not answer 2xx gets no new requests until it does. Workers configured without a model list
//! are asked for `GET /v1/models` on the same beat, so a redeployed replica serving a new model
//! is picked up without restarting the router. Workers without a configured KV capacity are
//! asked for `GET /metrics` until it tells their KV cache size (see [`super::capacity`]),
//! again after each restart, since a restarted engine may have been given a different share of
//! GPU memory. The same reading tells the engine's KV block size, checked against the
//! models' configured one ([`super::engine_block_size`]).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio_util::sync::CancellationToken;

use super::capacity::parse_kv_blocks;
use super::engine_block_size::reported_block_size;
use super::{Fleet, ServedModel, Worker};
use crate::tls::upstream::WorkerConnector;
use crate::tls::{TlsError, UpstreamTls};

/// Called when a worker's KV cache capacity (in blocks) becomes known or changes.
pub type CapacityHook = Arc<dyn Fn(&Worker, usize) + Send + Sync>;

/// Called when the KV block size a worker's engine reports becomes known or changes
/// ([`super::engine_block_size`]).
pub type BlockSizeHook = Arc<dyn Fn(&Worker, u32) + Send + Sync>;

/// Who hears of the engine facts read from a worker's metrics.
#[derive(Clone, Default)]
pub struct EngineHooks {
    /// Its KV cache capacity.
    pub capacity: Option<CapacityHook>,
    /// Its KV block size.
    pub block_size: Option<BlockSizeHook>,
}

/// The default interval between two readings of a worker's load (`[health] load_interval_ms`;
/// read by `fleet::load_poller`).
pub const DEFAULT_LOAD_INTERVAL: Duration = Duration::from_millis(100);

/// How health is checked.
#[derive(Clone, Debug)]
pub struct HealthConfig {
    /// Time between two checks of the same worker.
    pub interval: Duration,
    /// How long one check may take.
    pub timeout: Duration,
    /// Path of the health endpoint on the worker.
    pub path: String,
    /// Consecutive failed checks that mark a healthy worker down.
    pub unhealthy_threshold: u32,
    /// Consecutive passed checks that bring a down worker back.
    pub healthy_threshold: u32,
    /// Time between two readings of each worker's own load from its `/metrics`
    /// ([`super::load_poller`]); zero turns the readings off (one router sees all its load).
    pub load_interval: Duration,
}

impl Default for HealthConfig {
    fn default() -> Self {
        HealthConfig {
            interval: Duration::from_secs(5),
            timeout: Duration::from_secs(2),
            path: "/health".into(),
            unhealthy_threshold: 2,
            healthy_threshold: 1,
            load_interval: DEFAULT_LOAD_INTERVAL,
        }
    }
}

pub(super) type ProbeClient = Client<WorkerConnector, Empty<Bytes>>;

/// Runs health checks until `stop` is cancelled. The first round runs immediately;
/// `hooks` hear of every KV capacity and block size read from a worker's metrics. `https://`
/// workers are reached as `tls` says (the proxy's settings); fails when its files cannot be
/// used.
pub fn spawn(
    fleet: Arc<Fleet>,
    config: HealthConfig,
    tls: &UpstreamTls,
    hooks: EngineHooks,
    stop: CancellationToken,
) -> Result<tokio::task::JoinHandle<()>, TlsError> {
    let connector = crate::tls::upstream::connector(tls, config.timeout)?;
    let client: ProbeClient = Client::builder(TokioExecutor::new()).build(connector);
    Ok(tokio::spawn(async move {
        let mut tick = tokio::time::interval(config.interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tick.tick() => {}
            }
            let workers = fleet.workers();
            let checks = workers.iter().map(|w| async {
                if check_worker(&client, w, &config).await {
                    learn_engine(&client, w, &config, &hooks).await;
                }
            });
            futures_util::future::join_all(checks).await;
        }
    }))
}

/// Checks one worker now and updates its state; returns whether it is healthy.
pub async fn check_worker(
    client: &ProbeClient,
    worker: &Arc<Worker>,
    config: &HealthConfig,
) -> bool {
    let failure = match probe(client, worker, &config.path, config.timeout).await {
        Ok((status, _)) if status.is_success() => None,
        Ok((status, _)) => Some(format!("GET {} answered {status}", config.path)),
        Err(e) => Some(format!("GET {}: {e}", config.path)),
    };
    let ok = failure.is_none();
    if let Some(reason) = &failure {
        tracing::debug!(worker = worker.id(), %reason, "health check failed");
    }
    worker.set_health_error(failure.clone());
    // A worker whose models are configured is read once per life, for each model's context
    // (`max_model_len`, which routing narrows on); one discovering its models, every time.
    let configured = !worker.spec.models.is_empty();
    if ok
        && !(configured && worker.has_discovered_models())
        && let Some((status, body)) = get(client, worker, "/v1/models", config.timeout).await
        && status.is_success()
    {
        match parse_models(&body) {
            Some(models) => worker.set_discovered_models(models),
            None => tracing::warn!(worker = worker.id(), "unparseable /v1/models answer"),
        }
    }
    let was = worker.is_healthy();
    let now = worker.observe_check(ok, config.healthy_threshold, config.unhealthy_threshold);
    if was && !now {
        // It comes back as a new process, perhaps with another cache or block size: read
        // them again.
        worker.set_discovered_kv_blocks(0);
        worker.engine_block_size.forget();
        if configured {
            worker.set_discovered_models(Vec::new());
        }
    }
    if was != now {
        if now {
            tracing::info!(worker = worker.id(), "worker is healthy");
        } else {
            tracing::warn!(
                worker = worker.id(),
                reason = failure.as_deref().unwrap_or("unknown"),
                "worker failed its health checks; marked down"
            );
        }
    }
    now
}

/// Reads the engine facts of a healthy worker's metrics while one is not known: its KV
/// capacity (unless configured) and its KV block size.
async fn learn_engine(
    client: &ProbeClient,
    worker: &Arc<Worker>,
    config: &HealthConfig,
    hooks: &EngineHooks,
) {
    let want_capacity = worker.kv_blocks().is_none();
    if !want_capacity && worker.engine_block_size.reported().is_some() {
        return;
    }
    let Some((status, body)) = get(client, worker, "/metrics", config.timeout).await else {
        return;
    };
    if !status.is_success() {
        return;
    }
    let Ok(text) = std::str::from_utf8(&body) else {
        return;
    };
    if let Some(size) = reported_block_size(text)
        && worker.engine_block_size.set(size)
        && let Some(hook) = &hooks.block_size
    {
        hook(worker, size);
    }
    if !want_capacity {
        return;
    }
    let Some(blocks) = parse_kv_blocks(text) else {
        tracing::debug!(
            worker = worker.id(),
            "no KV cache capacity in /metrics; the index grows as the cache warms"
        );
        return;
    };
    if worker.set_discovered_kv_blocks(blocks) {
        tracing::info!(
            worker = worker.id(),
            blocks,
            "KV cache capacity read from the engine's metrics"
        );
        if let Some(hook) = &hooks.capacity {
            hook(worker, blocks);
        }
    }
}

pub(super) async fn get(
    client: &ProbeClient,
    worker: &Worker,
    path: &str,
    timeout: Duration,
) -> Option<(http::StatusCode, Bytes)> {
    probe(client, worker, path, timeout).await.ok()
}

/// Why a probe got no answer: what a failed health check reports.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    /// No connection or no complete answer (refused, reset, TLS, DNS, ...).
    #[error("{0}")]
    Connect(String),
    /// No answer within the timeout.
    #[error("no answer within {0:?} (`[health] timeout_s`)")]
    Timeout(Duration),
    /// The request could not be built from the worker's URL.
    #[error("cannot build the request: {0}")]
    Request(String),
}

/// GETs `path` on `worker` with a 4 MiB limit on the body, or says why not.
pub(super) async fn probe(
    client: &ProbeClient,
    worker: &Worker,
    path: &str,
    timeout: Duration,
) -> Result<(http::StatusCode, Bytes), ProbeError> {
    let req = http::Request::get(worker.spec.url.join(path))
        .body(Empty::new())
        .map_err(|e| ProbeError::Request(e.to_string()))?;
    let fut = async {
        let resp = client.request(req).await.map_err(connect_error)?;
        let status = resp.status();
        let body = http_body_util::Limited::new(resp.into_body(), 4 << 20)
            .collect()
            .await
            .map_err(|e| ProbeError::Connect(format!("reading the body: {e}")))?
            .to_bytes();
        Ok((status, body))
    };
    tokio::time::timeout(timeout, fut)
        .await
        .unwrap_or(Err(ProbeError::Timeout(timeout)))
}

/// The client's error with its causes (hyper-util's own message is just "client error
/// (Connect)"; the cause says "Connection refused").
fn connect_error(e: hyper_util::client::legacy::Error) -> ProbeError {
    let mut text = e.to_string();
    let mut source = std::error::Error::source(&e);
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    ProbeError::Connect(text)
}

/// The models of an OpenAI `GET /v1/models` answer. vLLM lists each LoRA adapter as a model
/// of its own whose `parent` is the base model it runs on, and each model's `max_model_len`.
pub fn parse_models(body: &[u8]) -> Option<Vec<ServedModel>> {
    let v: serde_json::Value = serde_json::from_slice(body).ok()?;
    let data = v.get("data")?.as_array()?;
    Some(
        data.iter()
            .filter_map(|m| {
                let id = m.get("id")?.as_str()?.to_owned();
                let parent = m
                    .get("parent")
                    .and_then(|p| p.as_str())
                    .filter(|p| !p.is_empty() && *p != id)
                    .map(str::to_owned);
                let max_model_len = m.get("max_model_len").and_then(|n| n.as_u64());
                Some(ServedModel {
                    id,
                    parent,
                    max_model_len,
                })
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(models: &[ServedModel]) -> Vec<&str> {
        models.iter().map(|m| m.id.as_str()).collect()
    }

    #[test]
    fn parses_openai_model_lists() {
        let body = br#"{"object":"list","data":[{"id":"a","object":"model"},{"id":"b"},{"x":1}]}"#;
        let models = parse_models(body).unwrap();
        assert_eq!(ids(&models), ["a", "b"]);
        assert!(models.iter().all(|m| m.parent.is_none()));
        assert!(parse_models(b"{}").is_none());
        assert!(parse_models(b"garbage").is_none());
    }

    #[test]
    fn vllm_lora_adapters_name_their_base_model() {
        // vLLM's list: the base model (`parent: null`), then each adapter with its base.
        let body = br#"{"object":"list","data":[
            {"id":"qwen3","object":"model","root":"/models/qwen3","parent":null,"max_model_len":4096},
            {"id":"sql-lora","object":"model","root":"/adapters/sql","parent":"qwen3"}]}"#;
        let models = parse_models(body).unwrap();
        assert_eq!(ids(&models), ["qwen3", "sql-lora"]);
        assert_eq!(models[0].parent, None);
        assert_eq!(models[1].parent.as_deref(), Some("qwen3"));
        assert_eq!(models[0].max_model_len, Some(4096));
        assert_eq!(models[1].max_model_len, None);
    }
}
