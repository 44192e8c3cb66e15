//! Configuration: a TOML file, overridden by command-line flags, validated before anything
//! starts.
//!
//! Every mistake is reported with the key that holds it and what to write instead, because
//! the person reading the message is an operator at a deploy, not the author of this code.
//! Unknown keys are errors: a misspelt key silently ignored is a production incident later.

mod file;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Args;
use serde::Deserialize;

use file::FileConfig;
use thiserror::Error;

use crate::fleet::{BaseUrl, BreakerConfig, HealthConfig, WorkerSpec};
use crate::policy::{KvAwareConfig, PolicyKind, PolicySettings};
use crate::proxy::{ProxyConfig, RetryBudgetConfig};

/// A configuration problem, phrased for the operator.
#[derive(Debug, Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The file is not valid TOML or has unknown / mistyped keys.
    #[error("config file {path}: {message}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// The parser's message, which names the key and line.
        message: String,
    },
    /// A value is out of range or inconsistent.
    #[error("invalid configuration: `{key}`: {message}")]
    Invalid {
        /// The offending key.
        key: String,
        /// What is wrong and how to fix it.
        message: String,
    },
}

fn invalid(key: impl Into<String>, message: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        key: key.into(),
        message: message.into(),
    }
}

/// Log line format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, clap::ValueEnum, Default)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

/// `kvroute serve` flags; each overrides the config file's key of the same meaning.
#[derive(Args, Debug, Clone, Default)]
pub struct ServeArgs {
    /// TOML config file (see config/kvroute.example.toml).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Address to listen on, e.g. 127.0.0.1:8000.
    #[arg(long)]
    pub listen: Option<String>,
    /// Routing policy.
    #[arg(long, value_enum)]
    pub policy: Option<PolicyKind>,
    /// A worker: URL[=MODEL,…][@tcp://HOST:PORT] (models discovered when omitted; the
    /// tcp:// part is its KV-event endpoint). Repeat for more workers.
    #[arg(long = "worker")]
    pub workers: Vec<String>,
    /// Log format.
    #[arg(long, value_enum)]
    pub log_format: Option<LogFormat>,
}

/// The validated configuration of `kvroute serve`.
#[derive(Clone, Debug)]
pub struct Config {
    /// Where to listen.
    pub listen: SocketAddr,
    /// The routing policy.
    pub policy: PolicyKind,
    /// Seed for policies' random choices.
    pub seed: u64,
    /// Log format.
    pub log_format: LogFormat,
    /// Largest request body accepted (413 beyond).
    pub max_body_bytes: usize,
    /// How long in-flight requests may run on after SIGTERM.
    pub shutdown_grace: Duration,
    /// Upstream client settings.
    pub proxy: ProxyConfig,
    /// Health-check settings.
    pub health: HealthConfig,
    /// The workers.
    pub workers: Vec<WorkerSpec>,
    /// Per-model tokenization settings; models not listed use the builtin tokenizer.
    pub models: Vec<ModelConfig>,
    /// KV block size of engines serving models not listed in `models`.
    pub default_block_size: u32,
    /// Memory for cached token ids of repeated prompt segments, per model, in bytes.
    pub token_cache_bytes: u64,
    /// `kv_aware`'s cost model.
    pub kv_aware: KvAwareConfig,
    /// Index bounds.
    pub index: IndexSettings,
    /// Per-worker circuit breakers.
    pub breaker: BreakerConfig,
    /// Longest a client may take to send its request body.
    pub body_read_timeout: Duration,
    /// Longest a client may take to send its request headers.
    pub header_read_timeout: Duration,
    /// Admission limits.
    pub limits: Limits,
    /// API keys and their tenants; empty means no authentication.
    pub tenants: Vec<TenantConfig>,
    /// SHA-256 of the admin API key, if the admin API is enabled.
    pub admin_key_sha256: Option<[u8; 32]>,
}

/// Admission limits: beyond `max_concurrency` requests in flight, up to `max_queue` wait for
/// at most `queue_timeout`; the rest are refused with 429.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Limits {
    /// Requests in flight through the router at once.
    pub max_concurrency: usize,
    /// Requests waiting for a slot at once.
    pub max_queue: usize,
    /// Longest wait for a slot.
    pub queue_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_concurrency: 4096,
            max_queue: 4096,
            queue_timeout: Duration::from_secs(10),
        }
    }
}

/// One tenant: who holds an API key, which models it may use, and its share of capacity.
#[derive(Clone, Debug, PartialEq)]
pub struct TenantConfig {
    /// The tenant's name (logs, metrics, its cache namespace).
    pub name: String,
    /// SHA-256 of its API key (the key itself is never stored).
    pub api_key_sha256: [u8; 32],
    /// Models it may use; `*` allows all.
    pub models: Vec<String>,
    /// Its own concurrency limit, within the router's.
    pub max_concurrency: Option<usize>,
}

impl TenantConfig {
    /// Whether the tenant may use `model`.
    pub fn allows(&self, model: &str) -> bool {
        self.models.iter().any(|m| m == "*" || m == model)
    }
}

/// Decodes a 64-digit hex SHA-256.
fn sha256_hex(key: &str, v: &str) -> Result<[u8; 32], ConfigError> {
    let bad = || {
        invalid(
            key,
            "must be the 64 hex digits of the key's SHA-256 (e.g. `printf %s \"$KEY\" | sha256sum`)",
        )
    };
    let v = v.trim();
    if v.len() != 64 {
        return Err(bad());
    }
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte =
            u8::from_str_radix(v.get(2 * i..2 * i + 2).ok_or_else(bad)?, 16).map_err(|_| bad())?;
    }
    Ok(out)
}

/// Where a model's tokenizer comes from.
#[derive(Clone, Debug, PartialEq)]
pub enum TokenizerSource {
    /// The file-free builtin tokenizer (what `kvroute engine` uses by default).
    Builtin,
    /// A directory with `tokenizer.json` (and `tokenizer_config.json` / `chat_template.jinja`
    /// for chat), or a `tokenizer.json` file.
    Path(PathBuf),
}

/// How one model's prompts become tokens and blocks.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelConfig {
    /// The model name as clients send it.
    pub name: String,
    /// Its tokenizer.
    pub tokenizer: TokenizerSource,
    /// KV block size of its engines (vLLM `--block-size`, SGLang `--page-size`).
    pub block_size: u32,
    /// Send the tenant's cache salt to the engine as vLLM's `cache_salt` request field.
    pub forward_cache_salt: bool,
    /// When this name is a LoRA adapter: the base model it runs on. Its prompts are tokenized
    /// with the base model's tokenizer and hashed as the base model with this adapter, as the
    /// engine's KV events name its blocks (`lora_name`).
    pub base_model: Option<String>,
}

/// Bounds of the KV index.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct IndexSettings {
    /// Most (block, worker) entries kept from KV events.
    pub max_entries: usize,
    /// How long a routed block is assumed cached on a worker without events.
    pub approx_ttl: Duration,
    /// Most predicted blocks kept per worker.
    pub approx_capacity_blocks: usize,
}

impl Default for IndexSettings {
    fn default() -> Self {
        IndexSettings {
            max_entries: 1 << 24,
            approx_ttl: Duration::from_secs(120),
            approx_capacity_blocks: 1 << 16,
        }
    }
}

impl Config {
    /// The settings the policies are built with.
    pub fn policy_settings(&self) -> PolicySettings {
        PolicySettings {
            seed: self.seed,
            kv_aware: self.kv_aware,
            ..Default::default()
        }
    }

    /// The settings of `model`: its own entry, or the builtin tokenizer with the default block
    /// size.
    pub fn model(&self, name: &str) -> ModelConfig {
        self.models
            .iter()
            .find(|m| m.name == name)
            .cloned()
            .unwrap_or_else(|| ModelConfig {
                name: name.to_string(),
                tokenizer: TokenizerSource::Builtin,
                block_size: self.default_block_size,
                forward_cache_salt: true,
                base_model: None,
            })
    }
}

/// Default listen address.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:8000";
/// Default policy.
pub const DEFAULT_POLICY: PolicyKind = PolicyKind::DEFAULT;
/// Default request body limit: 32 MiB.
pub const DEFAULT_MAX_BODY_BYTES: u64 = 32 << 20;

impl Config {
    /// Loads the file named by `args.config` (if any), applies the flags, validates.
    pub fn load(args: &ServeArgs) -> Result<Config, ConfigError> {
        let file = match &args.config {
            Some(path) => read_file(path)?,
            None => FileConfig::default(),
        };
        Config::build(file, args)
    }

    /// Parses a config from TOML text (no flags); `origin` names it in errors.
    pub fn from_toml(text: &str, origin: &Path) -> Result<Config, ConfigError> {
        let file = parse_file(text, origin)?;
        Config::build(file, &ServeArgs::default())
    }

    fn build(file: FileConfig, args: &ServeArgs) -> Result<Config, ConfigError> {
        let listen_text = args
            .listen
            .clone()
            .or(file.listen)
            .unwrap_or_else(|| DEFAULT_LISTEN.into());
        let listen: SocketAddr = listen_text.parse().map_err(|_| {
            invalid(
                "listen",
                format!("`{listen_text}` is not an address; write e.g. \"127.0.0.1:8000\""),
            )
        })?;
        let policy = match (args.policy, file.policy) {
            (Some(kind), _) => kind,
            (None, Some(name)) => name.parse().map_err(|_| {
                invalid(
                    "policy",
                    format!(
                        "unknown policy `{name}`; use one of {}",
                        PolicyKind::known_names()
                    ),
                )
            })?,
            (None, None) => DEFAULT_POLICY,
        };
        let max_body_bytes = file.max_body_bytes.unwrap_or(DEFAULT_MAX_BODY_BYTES);
        if max_body_bytes < 1024 {
            return Err(invalid("max_body_bytes", "must be at least 1024"));
        }
        let shutdown_grace = seconds("shutdown_grace_s", file.shutdown_grace_s, 30.0, 0.0)?;

        let defaults = ProxyConfig::default();
        let proxy = ProxyConfig {
            connect_timeout: seconds(
                "proxy.connect_timeout_s",
                file.proxy.connect_timeout_s,
                defaults.connect_timeout.as_secs_f64(),
                0.001,
            )?,
            first_byte_timeout: seconds(
                "proxy.first_byte_timeout_s",
                file.proxy.first_byte_timeout_s,
                defaults.first_byte_timeout.as_secs_f64(),
                0.001,
            )?,
            retries: file.proxy.retries.unwrap_or(defaults.retries),
            pool_max_idle_per_host: file
                .proxy
                .pool_max_idle_per_host
                .unwrap_or(defaults.pool_max_idle_per_host),
            idle_timeout: seconds(
                "proxy.idle_timeout_s",
                file.proxy.idle_timeout_s,
                defaults.idle_timeout.as_secs_f64(),
                0.001,
            )?,
            total_timeout: seconds(
                "proxy.total_timeout_s",
                file.proxy.total_timeout_s,
                defaults.total_timeout.as_secs_f64(),
                0.001,
            )?,
            retry_budget: RetryBudgetConfig {
                ratio: non_negative(
                    "proxy.retry_budget_ratio",
                    file.proxy.retry_budget_ratio,
                    defaults.retry_budget.ratio,
                )?,
                min_per_s: non_negative(
                    "proxy.retry_budget_min_per_s",
                    file.proxy.retry_budget_min_per_s,
                    defaults.retry_budget.min_per_s,
                )?,
                ..defaults.retry_budget
            },
        };
        let bd = BreakerConfig::default();
        let breaker = BreakerConfig {
            failure_threshold: file.proxy.breaker_failures.unwrap_or(bd.failure_threshold),
            open_for: seconds(
                "proxy.breaker_open_s",
                file.proxy.breaker_open_s,
                bd.open_for.as_secs_f64(),
                0.001,
            )?,
        };
        if breaker.failure_threshold == 0 {
            return Err(invalid("proxy.breaker_failures", "must be at least 1"));
        }
        let header_read_timeout = seconds(
            "proxy.header_read_timeout_s",
            file.proxy.header_read_timeout_s,
            75.0,
            0.001,
        )?;
        let body_read_timeout = seconds(
            "proxy.body_read_timeout_s",
            file.proxy.body_read_timeout_s,
            30.0,
            0.001,
        )?;
        if proxy.retries > 5 {
            return Err(invalid(
                "proxy.retries",
                "at most 5: retries multiply load during an outage",
            ));
        }

        let hd = HealthConfig::default();
        let health = HealthConfig {
            interval: seconds(
                "health.interval_s",
                file.health.interval_s,
                hd.interval.as_secs_f64(),
                0.01,
            )?,
            timeout: seconds(
                "health.timeout_s",
                file.health.timeout_s,
                hd.timeout.as_secs_f64(),
                0.001,
            )?,
            path: file.health.path.unwrap_or(hd.path),
            unhealthy_threshold: file
                .health
                .unhealthy_threshold
                .unwrap_or(hd.unhealthy_threshold),
            healthy_threshold: file
                .health
                .healthy_threshold
                .unwrap_or(hd.healthy_threshold),
        };
        if health.unhealthy_threshold == 0 || health.healthy_threshold == 0 {
            return Err(invalid(
                "health.unhealthy_threshold",
                "thresholds must be at least 1",
            ));
        }
        if !health.path.starts_with('/') {
            return Err(invalid(
                "health.path",
                "must start with `/`, e.g. \"/health\"",
            ));
        }

        let mut workers = Vec::new();
        for (i, w) in file.workers.into_iter().enumerate() {
            let key = format!("workers[{i}]");
            if w.kv_blocks == Some(0) {
                return Err(invalid(
                    format!("{key}.kv_blocks"),
                    "must be at least 1; omit it to read the engine's metrics",
                ));
            }
            let mut spec = worker_spec(&key, w.id, &w.url, w.models, w.kv_events, w.kv_replay)?;
            spec.kv_blocks = w.kv_blocks;
            workers.push(spec);
        }
        for (i, flag) in args.workers.iter().enumerate() {
            workers.push(
                parse_worker_flag(flag).map_err(|m| invalid(format!("--worker #{}", i + 1), m))?,
            );
        }
        let default_block_size = file.tokens.default_block_size.unwrap_or(16);
        block_size_ok("tokens.default_block_size", default_block_size)?;
        let mut models = Vec::new();
        for (i, m) in file.models.into_iter().enumerate() {
            let key = format!("models[{i}]");
            if m.name.is_empty() {
                return Err(invalid(format!("{key}.name"), "must not be empty"));
            }
            if models.iter().any(|x: &ModelConfig| x.name == m.name) {
                return Err(invalid(
                    format!("{key}.name"),
                    format!("model `{}` is listed twice", m.name),
                ));
            }
            let tokenizer = match m.tokenizer.as_deref() {
                None | Some("builtin") => TokenizerSource::Builtin,
                Some(path) => {
                    let p = PathBuf::from(path);
                    if !p.exists() {
                        return Err(invalid(
                            format!("{key}.tokenizer"),
                            format!(
                                "`{path}` does not exist; give a directory with tokenizer.json, a tokenizer.json file, or \"builtin\""
                            ),
                        ));
                    }
                    TokenizerSource::Path(p)
                }
            };
            let block_size = m.block_size.unwrap_or(default_block_size);
            block_size_ok(&format!("{key}.block_size"), block_size)?;
            if m.base_model.is_some() {
                for (k, set) in [
                    ("tokenizer", m.tokenizer.is_some()),
                    ("block_size", m.block_size.is_some()),
                ] {
                    if set {
                        return Err(invalid(
                            format!("{key}.{k}"),
                            "a LoRA adapter uses its base model's; set it on the base model's entry",
                        ));
                    }
                }
            }
            if let Some(base) = &m.base_model
                && (base.is_empty() || *base == m.name)
            {
                return Err(invalid(
                    format!("{key}.base_model"),
                    "must name the model this LoRA adapter runs on, not be empty or the adapter itself",
                ));
            }
            models.push(ModelConfig {
                name: m.name,
                tokenizer,
                block_size,
                forward_cache_salt: m.forward_cache_salt.unwrap_or(true),
                base_model: m.base_model,
            });
        }
        let token_cache_bytes = file.tokens.cache_mb.unwrap_or(32) << 20;

        let kd = KvAwareConfig::default();
        let ka = &file.kv_aware;
        let kv_aware = KvAwareConfig {
            prefill_rate_tokens_per_s: positive(
                "kv_aware.prefill_rate_tokens_per_s",
                ka.prefill_rate_tokens_per_s,
                kd.prefill_rate_tokens_per_s,
            )?,
            step_cost_s: non_negative("kv_aware.step_cost_s", ka.step_cost_s, kd.step_cost_s)?,
            overhead_s: non_negative("kv_aware.overhead_s", ka.overhead_s, kd.overhead_s)?,
            calibrate: ka.calibrate.unwrap_or(kd.calibrate),
            forgetting: ka.forgetting.unwrap_or(kd.forgetting),
            temperature: non_negative("kv_aware.temperature", ka.temperature, kd.temperature)?,
            decode_weight: non_negative(
                "kv_aware.decode_weight",
                ka.decode_weight,
                kd.decode_weight,
            )?,
        };
        if !(0.9..=1.0).contains(&kv_aware.forgetting) {
            return Err(invalid(
                "kv_aware.forgetting",
                "must be between 0.9 and 1.0 (0.995 weighs the last few hundred requests)",
            ));
        }
        let id = IndexSettings::default();
        let index = IndexSettings {
            max_entries: file.index.max_entries.unwrap_or(id.max_entries),
            approx_ttl: seconds(
                "index.approx_ttl_s",
                file.index.approx_ttl_s,
                id.approx_ttl.as_secs_f64(),
                0.001,
            )?,
            approx_capacity_blocks: file
                .index
                .approx_capacity_blocks
                .unwrap_or(id.approx_capacity_blocks),
        };
        if index.max_entries < 1024 {
            return Err(invalid("index.max_entries", "must be at least 1024"));
        }

        let ld = Limits::default();
        let limits = Limits {
            max_concurrency: file.limits.max_concurrency.unwrap_or(ld.max_concurrency),
            max_queue: file.limits.max_queue.unwrap_or(ld.max_queue),
            queue_timeout: seconds(
                "limits.queue_timeout_s",
                file.limits.queue_timeout_s,
                ld.queue_timeout.as_secs_f64(),
                0.0,
            )?,
        };
        if limits.max_concurrency == 0 {
            return Err(invalid("limits.max_concurrency", "must be at least 1"));
        }
        let mut tenants: Vec<TenantConfig> = Vec::new();
        for (i, t) in file.tenants.into_iter().enumerate() {
            let key = format!("tenants[{i}]");
            if t.name.is_empty() || t.name.chars().any(|c| c.is_control()) {
                return Err(invalid(format!("{key}.name"), "must be a non-empty name"));
            }
            if tenants.iter().any(|x| x.name == t.name) {
                return Err(invalid(
                    format!("{key}.name"),
                    format!("tenant `{}` is listed twice", t.name),
                ));
            }
            let digest = sha256_hex(&format!("{key}.api_key_sha256"), &t.api_key_sha256)?;
            if tenants.iter().any(|x| x.api_key_sha256 == digest) {
                return Err(invalid(
                    format!("{key}.api_key_sha256"),
                    "two tenants share one API key; give each its own",
                ));
            }
            if t.max_concurrency == Some(0) {
                return Err(invalid(
                    format!("{key}.max_concurrency"),
                    "must be at least 1",
                ));
            }
            tenants.push(TenantConfig {
                name: t.name,
                api_key_sha256: digest,
                models: t.models.unwrap_or_else(|| vec!["*".into()]),
                max_concurrency: t.max_concurrency,
            });
        }
        let admin_key_sha256 = match file.admin {
            Some(a) => Some(sha256_hex("admin.api_key_sha256", &a.api_key_sha256)?),
            None => None,
        };
        if admin_key_sha256.is_some_and(|a| tenants.iter().any(|t| t.api_key_sha256 == a)) {
            return Err(invalid(
                "admin.api_key_sha256",
                "the admin key must differ from every tenant key",
            ));
        }

        let mut seen = std::collections::HashSet::new();
        for w in &workers {
            if !seen.insert(w.id.clone()) {
                return Err(invalid(
                    "workers",
                    format!("two workers have the id `{}`; give each an `id`", w.id),
                ));
            }
        }
        Ok(Config {
            listen,
            policy,
            seed: file.seed.unwrap_or(0),
            log_format: args.log_format.or(file.log_format).unwrap_or_default(),
            max_body_bytes: usize::try_from(max_body_bytes).unwrap_or(usize::MAX),
            shutdown_grace,
            proxy,
            health,
            workers,
            models,
            default_block_size,
            token_cache_bytes,
            kv_aware,
            index,
            breaker,
            body_read_timeout,
            header_read_timeout,
            limits,
            tenants,
            admin_key_sha256,
        })
    }
}

fn block_size_ok(key: &str, bs: u32) -> Result<(), ConfigError> {
    if bs == 0 || bs > 4096 {
        return Err(invalid(
            key,
            format!("{bs} is not a KV block size; use the engine's (vLLM default 16)"),
        ));
    }
    Ok(())
}

fn positive(key: &str, v: Option<f64>, default: f64) -> Result<f64, ConfigError> {
    let x = v.unwrap_or(default);
    if !(x.is_finite() && x > 0.0) {
        return Err(invalid(key, format!("{x} must be a positive number")));
    }
    Ok(x)
}

fn non_negative(key: &str, v: Option<f64>, default: f64) -> Result<f64, ConfigError> {
    let x = v.unwrap_or(default);
    if !(x.is_finite() && x >= 0.0) {
        return Err(invalid(key, format!("{x} must be zero or more")));
    }
    Ok(x)
}

fn read_file(path: &Path) -> Result<FileConfig, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.to_owned(),
        source,
    })?;
    parse_file(&text, path)
}

fn parse_file(text: &str, path: &Path) -> Result<FileConfig, ConfigError> {
    toml::from_str(text).map_err(|e| ConfigError::Parse {
        path: path.to_owned(),
        message: e.to_string(),
    })
}

fn seconds(key: &str, v: Option<f64>, default: f64, min: f64) -> Result<Duration, ConfigError> {
    let s = v.unwrap_or(default);
    if !s.is_finite() || s < min || s > 86_400.0 * 365.0 {
        return Err(invalid(
            key,
            format!("{s} is out of range; give seconds ≥ {min}, e.g. {default}"),
        ));
    }
    Ok(Duration::from_secs_f64(s))
}

fn worker_spec(
    key: &str,
    id: Option<String>,
    url: &str,
    models: Vec<String>,
    kv_events: Option<String>,
    kv_replay: Option<String>,
) -> Result<WorkerSpec, ConfigError> {
    let base = BaseUrl::parse(url).map_err(|e| invalid(format!("{key}.url"), e.to_string()))?;
    let id = id.unwrap_or_else(|| base.host_port());
    if id.is_empty() || id.chars().any(|c| c.is_control() || c.is_whitespace()) {
        return Err(invalid(
            format!("{key}.id"),
            "must be non-empty, without spaces or control characters",
        ));
    }
    if models.iter().any(|m| m.is_empty()) {
        return Err(invalid(
            format!("{key}.models"),
            "model names must not be empty",
        ));
    }
    for (k, ep) in [("kv_events", &kv_events), ("kv_replay", &kv_replay)] {
        if let Some(ep) = ep
            && !(ep.starts_with("tcp://") || ep.starts_with("ipc://"))
        {
            return Err(invalid(
                format!("{key}.{k}"),
                format!("`{ep}` is not a ZeroMQ endpoint; write e.g. \"tcp://127.0.0.1:5557\""),
            ));
        }
    }
    Ok(WorkerSpec {
        id,
        url: base,
        models,
        kv_events,
        kv_replay,
        kv_blocks: None,
    })
}

/// Parses `URL[=MODEL,…][@tcp://HOST:PORT]`.
pub fn parse_worker_flag(flag: &str) -> Result<WorkerSpec, String> {
    let (rest, events) = match flag.find("@tcp://").or_else(|| flag.find("@ipc://")) {
        Some(at) => (&flag[..at], Some(flag[at + 1..].to_string())),
        None => (flag, None),
    };
    let (url, models) = match rest.split_once('=') {
        Some((u, m)) => (
            u,
            m.split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .collect(),
        ),
        None => (rest, Vec::new()),
    };
    worker_spec("worker", None, url, models, events, None).map_err(|e| match e {
        ConfigError::Invalid { message, .. } => message,
        other => other.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(text: &str) -> Result<Config, ConfigError> {
        Config::from_toml(text, Path::new("test.toml"))
    }

    #[test]
    fn defaults() {
        let c = load("").unwrap();
        assert_eq!(c.listen.to_string(), DEFAULT_LISTEN);
        assert_eq!(c.policy, DEFAULT_POLICY);
        assert_eq!(c.max_body_bytes, 32 << 20);
        assert!(c.workers.is_empty());
    }

    #[test]
    fn worker_flags() {
        let w = parse_worker_flag("http://127.0.0.1:8101").unwrap();
        assert_eq!(w.id, "127.0.0.1:8101");
        assert!(w.models.is_empty());
        let w = parse_worker_flag("http://h:1=a,b@tcp://h:5557").unwrap();
        assert_eq!(w.models, ["a", "b"]);
        assert_eq!(w.kv_events.as_deref(), Some("tcp://h:5557"));
        assert!(parse_worker_flag("ftp://x").unwrap_err().contains("http"));
    }

    #[test]
    fn flags_override_file() {
        let args = ServeArgs {
            listen: Some("127.0.0.1:9999".into()),
            policy: Some(PolicyKind::Random),
            workers: vec!["http://127.0.0.1:2=m".into()],
            ..Default::default()
        };
        let file = parse_file(
            "listen = \"127.0.0.1:1\"\npolicy = \"round_robin\"\n[[workers]]\nurl = \"http://127.0.0.1:1\"\n",
            Path::new("f"),
        )
        .unwrap();
        let c = Config::build(file, &args).unwrap();
        assert_eq!(c.listen.port(), 9999);
        assert_eq!(c.policy, PolicyKind::Random);
        assert_eq!(c.workers.len(), 2);
    }

    #[test]
    fn errors_name_the_key() {
        let cases = [
            ("listen = \"nope\"", "listen"),
            ("policy = \"fastest\"", "policy"),
            ("[proxy]\nretries = 50", "proxy.retries"),
            ("[health]\ninterval_s = -1", "health.interval_s"),
            ("[[workers]]\nurl = \"https://x\"", "workers[0].url"),
            (
                "[[workers]]\nurl = \"http://a:1\"\nkv_events = \"a:1\"",
                "workers[0].kv_events",
            ),
            (
                "[[workers]]\nurl = \"http://a:1\"\n[[workers]]\nurl = \"http://a:1\"",
                "workers",
            ),
        ];
        for (text, key) in cases {
            match load(text) {
                Err(ConfigError::Invalid { key: k, .. }) => assert_eq!(k, key, "{text}"),
                other => panic!("{text}: {other:?}"),
            }
        }
    }

    #[test]
    fn unknown_keys_are_rejected_with_their_name() {
        let e = load("polcy = \"random\"").unwrap_err().to_string();
        assert!(e.contains("polcy"), "{e}");
        let e = load("[proxy]\nretry = 1").unwrap_err().to_string();
        assert!(e.contains("retry"), "{e}");
    }

    #[test]
    fn example_config_loads() {
        let text = include_str!("../../config/kvroute.example.toml");
        let c = load(text).unwrap();
        assert!(!c.workers.is_empty());
        assert_eq!(c.workers[0].kv_blocks, Some(27264));
        assert_eq!(c.workers[1].kv_blocks, None);
    }

    #[test]
    fn lora_adapters_name_their_base_model_and_take_its_tokenizer() {
        let c =
            load("[[models]]\nname = \"base\"\n[[models]]\nname = \"sql\"\nbase_model = \"base\"")
                .unwrap();
        assert_eq!(c.model("sql").base_model.as_deref(), Some("base"));
        assert_eq!(c.model("base").base_model, None);
        for (extra, key) in [
            ("base_model = \"sql\"", "models[0].base_model"),
            ("base_model = \"\"", "models[0].base_model"),
            (
                "base_model = \"b\"\nblock_size = 32",
                "models[0].block_size",
            ),
            (
                "base_model = \"b\"\ntokenizer = \"builtin\"",
                "models[0].tokenizer",
            ),
        ] {
            let e = load(&format!("[[models]]\nname = \"sql\"\n{extra}"))
                .unwrap_err()
                .to_string();
            assert!(e.contains(key), "{extra}: {e}");
        }
    }

    #[test]
    fn a_zero_kv_capacity_is_rejected_with_its_key() {
        let e = load("[[workers]]\nurl = \"http://127.0.0.1:1\"\nkv_blocks = 0")
            .unwrap_err()
            .to_string();
        assert!(e.contains("workers[0].kv_blocks"), "{e}");
    }
}
