//! The shape of the TOML file. `deny_unknown_fields` everywhere: a typo is an error.

use serde::Deserialize;

use super::LogFormat;

/// The file's shape. `deny_unknown_fields` everywhere: typos are errors.
#[derive(Deserialize, Debug, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct FileConfig {
    /// Deprecated: `server.listen`.
    pub(super) listen: Option<String>,
    /// A string, not a `PolicyKind`: see `policy::policy` for why.
    pub(super) policy: Option<String>,
    pub(super) seed: Option<u64>,
    pub(super) log_format: Option<LogFormat>,
    /// Deprecated: `server.max_body_bytes`.
    pub(super) max_body_bytes: Option<u64>,
    /// Deprecated: `server.shutdown_grace_s`.
    pub(super) shutdown_grace_s: Option<f64>,
    #[serde(default)]
    pub(super) server: FileServer,
    #[serde(default)]
    pub(super) proxy: FileProxy,
    #[serde(default)]
    pub(super) health: FileHealth,
    /// `None` when the file has no `[[workers]]`; `Some(empty)` for an explicit `workers = []`.
    pub(super) workers: Option<Vec<FileWorker>>,
    #[serde(default)]
    pub(super) models: Vec<FileModel>,
    #[serde(default)]
    pub(super) tokens: FileTokens,
    #[serde(default)]
    pub(super) kv_aware: FileKvAware,
    #[serde(default)]
    pub(super) index: FileIndex,
    #[serde(default)]
    pub(super) kv_events: super::kv_events::FileKvEvents,
    #[serde(default)]
    pub(super) limits: FileLimits,
    #[serde(default)]
    pub(super) priority: super::priority::FilePriority,
    /// `None` when the file has no `[[tenants]]`; `Some(empty)` for an explicit `tenants = []`.
    pub(super) tenants: Option<Vec<FileTenant>>,
    pub(super) admin: Option<FileAdmin>,
    #[serde(default)]
    pub(super) discovery: super::discovery::FileDiscovery,
    #[serde(default)]
    pub(super) recording: super::recording::FileRecording,
    #[serde(default)]
    pub(super) endpoints: super::endpoints::FileEndpoints,
    #[serde(default)]
    pub(super) sessions: super::sessions::FileSessions,
    #[serde(default)]
    pub(super) replica_bus: super::replica_bus::FileReplicaBus,
    #[serde(default)]
    pub(super) tracing: super::traces::FileTracing,
}

#[derive(Deserialize, Debug, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct FileServer {
    pub(super) listen: Option<String>,
    pub(super) max_body_bytes: Option<u64>,
    pub(super) shutdown_grace_s: Option<f64>,
    pub(super) header_read_timeout_s: Option<f64>,
    pub(super) body_read_timeout_s: Option<f64>,
    pub(super) idle_timeout_s: Option<f64>,
    pub(super) max_connections: Option<u64>,
    pub(super) http2_keepalive_interval_s: Option<f64>,
    pub(super) http2_keepalive_timeout_s: Option<f64>,
    pub(super) metrics_listen: Option<String>,
    pub(super) config_reload_interval_s: Option<f64>,
    pub(super) tls: Option<FileServerTls>,
}

#[derive(Deserialize, Debug, Default, Clone)]
#[serde(deny_unknown_fields)]
pub(super) struct FileServerTls {
    pub(super) cert_file: Option<std::path::PathBuf>,
    pub(super) key_file: Option<std::path::PathBuf>,
    pub(super) client_ca_file: Option<std::path::PathBuf>,
    pub(super) reload_interval_s: Option<f64>,
}

#[derive(Deserialize, Debug, Default, Clone)]
#[serde(deny_unknown_fields)]
pub(super) struct FileUpstreamTls {
    pub(super) ca_file: Option<std::path::PathBuf>,
    pub(super) cert_file: Option<std::path::PathBuf>,
    pub(super) key_file: Option<std::path::PathBuf>,
}

#[derive(Deserialize, Debug, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct FileProxy {
    pub(super) connect_timeout_s: Option<f64>,
    pub(super) first_byte_timeout_s: Option<f64>,
    pub(super) retries: Option<u32>,
    pub(super) pool_max_idle_per_host: Option<usize>,
    pub(super) idle_timeout_s: Option<f64>,
    pub(super) total_timeout_s: Option<f64>,
    /// Deprecated: `server.body_read_timeout_s`.
    pub(super) body_read_timeout_s: Option<f64>,
    /// Deprecated: `server.header_read_timeout_s`.
    pub(super) header_read_timeout_s: Option<f64>,
    pub(super) retry_budget_ratio: Option<f64>,
    pub(super) retry_budget_min_per_s: Option<f64>,
    /// Deprecated: `breaker_min_requests`.
    pub(super) breaker_failures: Option<u32>,
    pub(super) breaker_min_requests: Option<u32>,
    pub(super) breaker_failure_rate: Option<f64>,
    pub(super) breaker_window_s: Option<f64>,
    pub(super) breaker_open_s: Option<f64>,
    pub(super) tls: Option<FileUpstreamTls>,
    pub(super) prefill_piece_tokens: Option<u64>,
}

#[derive(Deserialize, Debug, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct FileHealth {
    pub(super) path: Option<String>,
    pub(super) interval_s: Option<f64>,
    pub(super) timeout_s: Option<f64>,
    pub(super) unhealthy_threshold: Option<u32>,
    pub(super) healthy_threshold: Option<u32>,
    pub(super) load_interval_ms: Option<u64>,
}

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
pub(super) struct FileWorker {
    pub(super) id: Option<String>,
    pub(super) url: String,
    #[serde(default)]
    pub(super) models: Vec<String>,
    pub(super) kv_events: Option<String>,
    pub(super) kv_replay: Option<String>,
    pub(super) kv_blocks: Option<usize>,
    pub(super) data_parallel_size: Option<i64>,
    pub(super) role: Option<String>,
    pub(super) bootstrap_port: Option<i64>,
}

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
pub(super) struct FileModel {
    pub(super) name: String,
    pub(super) tokenizer: Option<String>,
    pub(super) block_size: Option<u32>,
    pub(super) forward_cache_salt: Option<bool>,
    pub(super) base_model: Option<String>,
    pub(super) engine: Option<String>,
    pub(super) max_model_len: Option<u64>,
    pub(super) disaggregation: Option<String>,
    pub(super) ttft_target_ms: Option<f64>,
    pub(super) itl_target_ms: Option<f64>,
}

impl FileModel {
    /// A model given by `--tokenizer MODEL=TOKENIZER` alone: its tokenizer, defaults otherwise.
    pub(super) fn named(name: String, tokenizer: String) -> FileModel {
        FileModel {
            name,
            tokenizer: Some(tokenizer),
            block_size: None,
            forward_cache_salt: None,
            base_model: None,
            engine: None,
            max_model_len: None,
            disaggregation: None,
            ttft_target_ms: None,
            itl_target_ms: None,
        }
    }
}

#[derive(Deserialize, Debug, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct FileTokens {
    pub(super) default_block_size: Option<u32>,
    pub(super) cache_mb: Option<u64>,
}

#[derive(Deserialize, Debug, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct FileKvAware {
    pub(super) prefill_rate_tokens_per_s: Option<f64>,
    pub(super) step_cost_s: Option<f64>,
    pub(super) overhead_s: Option<f64>,
    pub(super) calibrate: Option<bool>,
    pub(super) forgetting: Option<f64>,
    pub(super) temperature: Option<f64>,
    pub(super) decode_weight: Option<f64>,
    pub(super) eviction_weight: Option<f64>,
    pub(super) copy_weight: Option<f64>,
    pub(super) saturation_weight: Option<f64>,
    pub(super) long_prefill_token_threshold: Option<u64>,
    /// `[kv_aware.tiers]`.
    #[serde(default)]
    pub(super) tiers: super::tier_cost::FileTierCost,
}

#[derive(Deserialize, Debug, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct FileIndex {
    pub(super) max_entries: Option<usize>,
    pub(super) approx_ttl_s: Option<f64>,
    pub(super) approx_capacity_blocks: Option<usize>,
}

#[derive(Deserialize, Debug, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct FileLimits {
    pub(super) max_concurrency: Option<usize>,
    pub(super) max_queue: Option<usize>,
    pub(super) queue_timeout_s: Option<f64>,
    pub(super) max_body_bytes_in_flight: Option<u64>,
}

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
pub(super) struct FileTenant {
    pub(super) name: String,
    pub(super) api_key_sha256: String,
    pub(super) models: Option<Vec<String>>,
    pub(super) max_concurrency: Option<usize>,
    pub(super) priority: Option<String>,
    pub(super) max_priority: Option<String>,
    pub(super) sheddable: Option<bool>,
    pub(super) weight: Option<u32>,
    pub(super) tokens_per_minute: Option<u64>,
    pub(super) requests_per_minute: Option<u64>,
    pub(super) ttft_target_ms: Option<f64>,
    pub(super) itl_target_ms: Option<f64>,
}

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
pub(super) struct FileAdmin {
    pub(super) api_key_sha256: Option<String>,
    pub(super) open_on_loopback: Option<bool>,
}
