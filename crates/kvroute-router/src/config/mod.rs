//! Configuration: a TOML file, overridden by command-line flags, validated before anything
//! starts.
//!
//! Every mistake is reported with the key that holds it and what to write instead, because
//! the person reading the message is an operator at a deploy, not the author of this code.
//! Unknown keys are errors: a misspelt key silently ignored is a production incident later.
//!
//! Layout: `file` is the file's shape; each section is validated by a builder in its own
//! file, next to the type it builds and the defaults it applies (`server`, `proxy`, `health`,
//! `workers`, `models`, `policy`, `index`, `limits`, `tenants`, `discovery`, `recording`,
//! `endpoints`, `sessions`; `values` holds the range
//! checks they share). `Config::build` only sequences them. A default lives once: as a named constant in the
//! section's file, or as the `Default` impl of the type the section builds.

mod data_parallel;
mod discovery;
mod endpoints;
mod file;
mod health;
mod index;
mod kv_events;
mod limits;
mod models;
mod overrides;
mod policy;
mod priority;
mod proxy;
mod recording;
mod replica_bus;
mod role;
mod server;
mod sessions;
mod tenants;
mod tier_cost;
mod tls;
mod tokenizer_warnings;
mod traces;
mod values;
mod worker_mistakes;
mod workers;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Args;
use sha2::Digest;
use thiserror::Error;

use file::FileConfig;

use crate::fleet::{BreakerConfig, HealthConfig, WorkerSpec};
use crate::policy::{KvAwareConfig, PolicyKind, PolicySettings};
use crate::proxy::ProxyConfig;

pub use crate::telemetry::{LogFormat, TracingConfig};
pub use data_parallel::{DataParallelError, data_parallel_size};
pub use discovery::{
    DEFAULT_ANNOTATION_PREFIX, DEFAULT_DNS_INTERVAL, DEFAULT_DRAIN_TIMEOUT, DiscoveryConfig,
    DnsDiscovery, InferencePoolRef, KubernetesDiscovery, PortRef, is_namespace,
};
pub use endpoints::{
    DEFAULT_FORWARD_PATHS, DEFAULT_RESPONSES_CAPACITY, DEFAULT_RESPONSES_TTL, EndpointsConfig,
    NEVER_BY_WILDCARD, PathPattern,
};
pub use index::IndexSettings;
pub use limits::Limits;
pub use models::{
    DEFAULT_BLOCK_SIZE, DEFAULT_FORWARD_CACHE_SALT, DEFAULT_TOKEN_CACHE_MB, ModelConfig,
    TokenizerSource,
};
pub use overrides::Override;
pub use policy::{DEFAULT_POLICY, DEFAULT_SEED};
pub use role::{RoleError, bootstrap_port, check_role, worker_role};
pub use server::{
    Connections, DEFAULT_BODY_READ_TIMEOUT, DEFAULT_HEADER_READ_TIMEOUT, DEFAULT_LISTEN,
    DEFAULT_MAX_BODY_BYTES, DEFAULT_SHUTDOWN_GRACE, Deprecation, MOVED_TO_SERVER,
};
pub use sessions::{DEFAULT_SESSION_HEADER, SessionField, SessionsConfig};
pub use tenants::{ANY_MODEL, AdminAccess, TenantConfig, TenantShaping};
pub use workers::{
    MAX_WORKER_ID_BYTES, WORKER_FLAG_SYNTAX, WorkerFlagError, WorkerSpecError, check_worker,
    names_own_address, parse_worker_flag,
};

/// A configuration problem, phrased for the operator.
#[derive(Debug, Error)]
pub enum ConfigError {
    /// The file could not be read.
    // The OS error is the source, not part of the message: `{:#}` prints the chain, and
    // printing it here too showed it twice.
    #[error("cannot read config file {path}")]
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

/// `kvroute serve` flags; each overrides the config file's key of the same meaning. Each is
/// also read from its `KVROUTE_*` variable (see the `kvroute` package's `cli`).
#[derive(Args, Debug, Clone, Default)]
pub struct ServeArgs {
    /// TOML config file (see config/kvroute.example.toml). Without one, the router starts with
    /// the workers of `--worker` flags (or none, to be added through the admin API).
    #[arg(long, env = "KVROUTE_CONFIG")]
    pub config: Option<PathBuf>,
    /// Address to listen on (default 127.0.0.1:8080; vLLM takes 8000).
    #[arg(long, env = "KVROUTE_LISTEN")]
    pub listen: Option<String>,
    /// Routing policy.
    #[arg(long, value_enum)]
    pub policy: Option<PolicyKind>,
    /// A worker: URL[=MODEL,…][@EVENTS[@REPLAY]], e.g.
    /// http://h:8000=llama@tcp://h:5557@tcp://h:5558. Models are discovered when omitted;
    /// EVENTS is its KV-event PUB endpoint and REPLAY its replay ROUTER endpoint (tcp:// or
    /// ipc://; with REPLAY the router learns what an idle engine holds when it connects, and
    /// replays lost batches). Repeat for more workers; in `KVROUTE_WORKER`, separate them with
    /// spaces.
    #[arg(long = "worker", value_delimiter = ' ')]
    pub workers: Vec<String>,
    /// Log format.
    #[arg(long, value_enum)]
    pub log_format: Option<LogFormat>,
    /// Record every routed request to this Mooncake trace file (`[recording] trace`), for
    /// `kvroute simulate --trace FILE`. See docs/recording-traffic.md.
    #[arg(long, value_name = "FILE")]
    pub record_trace: Option<PathBuf>,
    /// Without an admin key, accept the admin API's changes (add, drain, remove workers) from
    /// loopback clients (`[admin] open_on_loopback`). Without a key and without this, they are
    /// refused: anyone reaching the listener could add a worker and read others' prompts.
    #[arg(long)]
    pub admin_open_on_loopback: bool,
    /// A model's tokenizer: MODEL=TOKENIZER, TOKENIZER a directory holding the engine's
    /// tokenizer.json (or the file itself), or a Hugging Face id (ORG/NAME, not an existing
    /// path) fetched once at start into the Hugging Face cache (HF_HOME, HF_ENDPOINT,
    /// HF_TOKEN, HF_HUB_OFFLINE). Without one, a model is tokenized by the builtin tokenizer,
    /// whose blocks match nothing a real engine computes. Replaces the model's `[[models]]
    /// tokenizer`, or lists the model. Repeat for more models; in `KVROUTE_TOKENIZER`,
    /// separate them with spaces.
    #[arg(
        long = "tokenizer",
        value_name = "MODEL=TOKENIZER",
        value_delimiter = ' '
    )]
    pub tokenizers: Vec<String>,
    /// KV block size of the engines (vLLM `--block-size`, SGLang `--page-size`) for models
    /// without their own `[[models]] block_size`; replaces `[tokens] default_block_size`
    /// (default 16).
    #[arg(long)]
    pub block_size: Option<u32>,
    /// Share this router replica's bookings with the other replicas over this NATS server
    /// (`[replica_bus] url`, e.g. nats://nats:4222): every replica then weighs every
    /// replica's requests. Off by default.
    #[arg(long, value_name = "URL")]
    pub replica_bus_url: Option<String>,
    /// This replica's id on the replica bus (`[replica_bus] replica_id`; default: host name
    /// and process id).
    #[arg(long, value_name = "ID")]
    pub replica_id: Option<String>,
}

/// The validated configuration of `kvroute serve`.
#[derive(Clone, Debug)]
pub struct Config {
    /// Where to listen.
    pub listen: SocketAddr,
    /// Where `/metrics` is served instead of on `listen`, when set (`[server] metrics_listen`).
    pub metrics_listen: Option<SocketAddr>,
    /// How often the config file is checked for a change, which reloads it as SIGHUP does
    /// (`[server] config_reload_interval_s`); `None`: only on SIGHUP.
    pub config_reload_interval: Option<Duration>,
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
    /// Bounds of the KV-event replays (`[kv_events]`).
    pub replay_limits: crate::kv_events::ReplayLimits,
    /// Engines' subscriptions one KV-event intake thread reads (`[kv_events]`).
    pub engines_per_intake: usize,
    /// Per-worker circuit breakers.
    pub breaker: BreakerConfig,
    /// Longest a client may take to send its request body.
    pub body_read_timeout: Duration,
    /// Longest a client may take to send its request headers.
    pub header_read_timeout: Duration,
    /// Client connections: idle timeout, HTTP/2 keep-alive, how many at once.
    pub connections: Connections,
    /// HTTPS at the front door (`[server.tls]`), if configured.
    pub tls: Option<crate::tls::ServerTls>,
    /// Admission limits.
    pub limits: Limits,
    /// The admission queue's priority bands (`[priority]`).
    pub priorities: crate::shaping::Priorities,
    /// Placement isolation (`[priority] isolate`, `isolate_window_s`; reloadable).
    pub isolation: crate::shaping::Isolation,
    /// API keys and their tenants; empty means no authentication.
    pub tenants: Vec<TenantConfig>,
    /// Who may use the admin API: its key, or (without one) loopback clients when opened.
    pub admin: AdminAccess,
    /// What the file says explicitly it has none of (`tenants = []`, `workers = []`): a
    /// reload may remove every tenant or every static worker only when it says so.
    pub emptied: Emptied,
    /// Deprecated keys the file used (still honoured); see [`Config::warn_deprecations`].
    pub deprecations: Vec<Deprecation>,
    /// File values a flag or its variable replaced; see [`Config::log_overrides`].
    pub overrides: Vec<Override>,
    /// Workers found at run time (`[discovery]`).
    pub discovery: DiscoveryConfig,
    /// The recorded trace of routed requests (`[recording]`), when one is named.
    pub recording: Option<crate::recording::RecordSettings>,
    /// Endpoints beyond completions and chat (`[endpoints]`).
    pub endpoints: EndpointsConfig,
    /// Affinity hints: where clients name sessions, how long homes are kept (`[sessions]`).
    pub sessions: SessionsConfig,
    /// Router replicas sharing their bookings over NATS (`[replica_bus]`), when a URL is given.
    pub replica_bus: Option<crate::replica_bus::ReplicaBusSettings>,
    /// OpenTelemetry traces (`[tracing]`).
    pub tracing: TracingConfig,
}

impl Config {
    /// The settings the policies are built with.
    pub fn policy_settings(&self) -> PolicySettings {
        let mut kv_aware = self.kv_aware;
        // Prefix pieces bound what a queued prefill blocks, as an engine's own cap does.
        kv_aware.long_prefill_token_threshold = crate::policy::kv_aware::threshold_with_pieces(
            kv_aware.long_prefill_token_threshold,
            self.proxy.prefill_piece_tokens as u64,
        );
        PolicySettings {
            seed: self.seed,
            kv_aware,
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
            .unwrap_or_else(|| ModelConfig::unlisted(name, self.default_block_size))
    }

    /// Logs one warning per deprecated key the file used. Loading does not log by itself:
    /// logging is set up from the loaded config (`log_format`), so the caller calls this once
    /// it is.
    pub fn warn_deprecations(&self) {
        for d in &self.deprecations {
            tracing::warn!(old = d.old, new = d.new, "{d}");
        }
    }

    /// Logs at INFO each file value a flag or its `KVROUTE_*` variable replaced, naming the
    /// variable: an environment beating the file is otherwise invisible.
    pub fn log_overrides(&self) {
        for o in &self.overrides {
            o.log();
        }
    }

    /// Loads the file named by `args.config` (if any), applies the flags, validates.
    pub fn load(args: &ServeArgs) -> Result<Config, ConfigError> {
        Config::load_hashed(args).map(|l| l.config)
    }

    /// As [`Config::load`], with the SHA-256 of the file's bytes as read (of nothing without
    /// a file): what the config metrics show, so an operator can tell which file a replica
    /// runs (`sha256sum kvroute.toml`).
    pub fn load_hashed(args: &ServeArgs) -> Result<Loaded, ConfigError> {
        let text = match &args.config {
            Some(path) => std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
                path: path.to_owned(),
                source,
            })?,
            None => String::new(),
        };
        let file = match &args.config {
            Some(path) => parse_file(&text, path)?,
            None => FileConfig::default(),
        };
        let sha256 = sha2::Sha256::digest(text.as_bytes())
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        Ok(Loaded {
            config: Config::build(file, args)?,
            sha256,
        })
    }

    /// Parses a config from TOML text (no flags); `origin` names it in errors.
    pub fn from_toml(text: &str, origin: &Path) -> Result<Config, ConfigError> {
        let file = parse_file(text, origin)?;
        Config::build(file, &ServeArgs::default())
    }

    fn build(file: FileConfig, args: &ServeArgs) -> Result<Config, ConfigError> {
        let mut deprecations = server::deprecations(&file);
        deprecations.extend(proxy::deprecations(&file.proxy));
        let mut overrides = overrides::overrides(&file, args);
        let front = server::FrontDoor::from_file(&file, args.listen.as_deref())?;
        let policy = policy::policy(args.policy, file.policy)?;
        let proxy = proxy::proxy(&file.proxy)?;
        let breaker = proxy::breaker(&file.proxy)?;
        let health = health::health(file.health)?;
        let emptied = Emptied {
            tenants: file.tenants.as_ref().is_some_and(Vec::is_empty),
            workers: file.workers.as_ref().is_some_and(Vec::is_empty),
        };
        let workers = workers::workers(file.workers.unwrap_or_default(), &args.workers)?;
        let model_flags = models::ModelFlags::of(args);
        let models =
            models::Models::from_file(&file.tokens, file.models, &model_flags, &mut overrides)?;
        let kv_aware = policy::kv_aware(&file.kv_aware)?;
        let index = IndexSettings::from_file(&file.index)?;
        let replay_limits = kv_events::replay_limits(&file.kv_events)?;
        let engines_per_intake = kv_events::engines_per_intake(&file.kv_events)?;
        let discovery = discovery::discovery(file.discovery)?;
        let recording = recording::recording(&file.recording, args.record_trace.as_deref())?;
        let endpoints = endpoints::endpoints(&file.endpoints)?;
        let sessions = sessions::sessions(&file.sessions)?;
        let bus_flags = replica_bus::ReplicaBusFlags::of(args);
        let replica_bus = replica_bus::replica_bus(&file.replica_bus, &bus_flags)?;
        let limits = Limits::from_file(&file.limits, front.max_body_bytes)?;
        let priorities = priority::within_limits(&file.priority, &limits)?;
        let isolation = priority::isolation(&file.priority)?;
        let tenants = tenants::tenants(file.tenants.unwrap_or_default(), &priorities)?;
        let admin = tenants::admin_access(file.admin, args.admin_open_on_loopback, &tenants)?;
        check_workers(&workers, &front)?;
        Ok(Config {
            listen: front.listen,
            metrics_listen: front.metrics_listen,
            config_reload_interval: front.config_reload_interval,
            policy,
            seed: file.seed.unwrap_or(DEFAULT_SEED),
            log_format: args.log_format.or(file.log_format).unwrap_or_default(),
            max_body_bytes: front.max_body_bytes,
            shutdown_grace: front.shutdown_grace,
            proxy,
            health,
            workers,
            models: models.models,
            default_block_size: models.default_block_size,
            token_cache_bytes: models.token_cache_bytes,
            kv_aware,
            index,
            replay_limits,
            engines_per_intake,
            breaker,
            body_read_timeout: front.body_read_timeout,
            header_read_timeout: front.header_read_timeout,
            connections: front.connections,
            tls: tls::server_tls(file.server.tls.as_ref())?,
            limits,
            priorities,
            isolation,
            tenants,
            admin,
            emptied,
            deprecations,
            overrides,
            discovery,
            recording,
            endpoints,
            sessions,
            replica_bus,
            tracing: traces::tracing(file.tracing)?,
        })
    }
}

/// Checks the static workers as a whole: ids and URLs unique, none at the router's own
/// addresses ([`workers::unique_ids`]), and each model's disaggregation pools complete.
fn check_workers(workers: &[WorkerSpec], front: &server::FrontDoor) -> Result<(), ConfigError> {
    let own: Vec<SocketAddr> = std::iter::once(front.listen)
        .chain(front.metrics_listen)
        .collect();
    workers::unique_ids(workers, &own)?;
    role::check_pools(workers).map_err(|e| invalid(format!("workers.{}", e.field), e.message))
}

/// What a config file says explicitly that it has none of, rather than by leaving the tables
/// out (which a truncated or mistaken file does too).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Emptied {
    /// `tenants = []`: no tenants, so no authentication, on purpose.
    pub tenants: bool,
    /// `workers = []`: no static workers on purpose.
    pub workers: bool,
}

/// A validated configuration and the digest of the file it came from.
#[derive(Clone, Debug)]
pub struct Loaded {
    /// The configuration.
    pub config: Config,
    /// SHA-256 of the file's bytes, in hex.
    pub sha256: String,
}

fn parse_file(text: &str, path: &Path) -> Result<FileConfig, ConfigError> {
    toml::from_str(text).map_err(|e| ConfigError::Parse {
        path: path.to_owned(),
        message: e.to_string(),
    })
}

#[cfg(test)]
mod first_deployment_tests;
#[cfg(test)]
mod tests;
