//! `kvroute epp` flags: the router's own (config file, policy, workers, tokenizers, block
//! size, log format) and the picker's ports and TLS, as GIE's pickers take them.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use crate::config::{
    Config, ConfigError, InferencePoolRef, Loaded, LogFormat, ServeArgs, is_namespace,
};
use crate::policy::PolicyKind;
use crate::tls::ServerTls;

/// `kvroute epp` flags; each is also read from its `KVROUTE_EPP_*` variable.
#[derive(Args, Debug, Clone)]
pub struct EppArgs {
    /// TOML config file, as for `serve` (workers, `[discovery]`, models, tenants, limits,
    /// `[server.tls]` for the gRPC port).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Routing policy.
    #[arg(long, value_enum)]
    pub policy: Option<PolicyKind>,
    /// A worker, as `serve --worker` takes it (URL[=MODEL,…][@EVENTS[@REPLAY]]); its
    /// `host:port` is the endpoint the gateway is sent to. Repeat for more.
    #[arg(long = "worker", value_delimiter = ' ')]
    pub workers: Vec<String>,
    /// A model's tokenizer: MODEL=TOKENIZER (a directory or a Hugging Face id), as for `serve`.
    #[arg(
        long = "tokenizer",
        value_name = "MODEL=TOKENIZER",
        value_delimiter = ' '
    )]
    pub tokenizers: Vec<String>,
    /// KV block size of the engines, as for `serve`.
    #[arg(long)]
    pub block_size: Option<u32>,
    /// Log format.
    #[arg(long, value_enum)]
    pub log_format: Option<LogFormat>,
    /// The `InferencePool` whose pods are the workers (its selector and `targetPorts`, one
    /// per data-parallel rank); KV-event ports and annotations as `[discovery.kubernetes]`
    /// says (or its defaults).
    #[arg(long)]
    pub pool_name: Option<String>,
    /// The pool's namespace (default: the picker's own, or `[discovery.kubernetes] namespace`).
    #[arg(long, requires = "pool_name")]
    pub pool_namespace: Option<String>,
    /// The ext_proc gRPC listener (GIE's convention: port 9002).
    #[arg(long, default_value = "0.0.0.0:9002")]
    pub grpc_listen: SocketAddr,
    /// The `grpc.health.v1` listener (port 9003).
    #[arg(long, default_value = "0.0.0.0:9003")]
    pub health_listen: SocketAddr,
    /// The Prometheus listener (port 9090).
    #[arg(long, default_value = "0.0.0.0:9090")]
    pub metrics_listen: SocketAddr,
    /// Endpoints named after the pick for the gateway to fall back on when it retries
    /// (`ip:port,ip:port…`), the decision's runners-up by their cost (default: `[proxy]
    /// retries`, i.e. as far as `serve` would retry; 0 names the pick alone).
    #[arg(long, value_parser = clap::value_parser!(u32).range(0..=16))]
    pub fallbacks: Option<u32>,
    /// PEM certificate chain of the gRPC port (with `--tls-key`; replaces `[server.tls]`).
    #[arg(long, requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of the gRPC port.
    #[arg(long, requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
}

impl EppArgs {
    /// The configuration: the file and the router's flags as `serve` reads them, the gRPC
    /// port's TLS from the flags when given.
    pub fn load(&self) -> Result<Loaded, ConfigError> {
        let serve = ServeArgs {
            config: self.config.clone(),
            listen: None,
            policy: self.policy,
            workers: self.workers.clone(),
            log_format: self.log_format,
            record_trace: None,
            admin_open_on_loopback: false,
            tokenizers: self.tokenizers.clone(),
            block_size: self.block_size,
            // The picker reads `[replica_bus]` from its config file.
            replica_bus_url: None,
            replica_id: None,
        };
        let mut loaded = Config::load_hashed(&serve)?;
        if let Some(name) = &self.pool_name {
            loaded.config.discovery.inference_pool = Some(self.pool(name)?);
        }
        if let (Some(cert), Some(key)) = (&self.tls_cert, &self.tls_key) {
            loaded.config.tls = Some(ServerTls {
                cert_file: cert.clone(),
                key_file: key.clone(),
                client_ca_file: None,
                reload_interval: Duration::from_secs(10),
            });
        }
        Ok(loaded)
    }

    fn pool(&self, name: &str) -> Result<InferencePoolRef, ConfigError> {
        let bad = |key: &str, what: &str| ConfigError::Invalid {
            key: key.into(),
            message: format!("`{what}` is not a Kubernetes object name"),
        };
        if !name.split('.').all(is_namespace) || name.len() > 253 {
            return Err(bad("--pool-name", name));
        }
        if let Some(ns) = self
            .pool_namespace
            .as_deref()
            .filter(|ns| !is_namespace(ns))
        {
            return Err(bad("--pool-namespace", ns));
        }
        if !cfg!(feature = "kubernetes") {
            return Err(ConfigError::Invalid {
                key: "--pool-name".into(),
                message: "this kvroute was built without Kubernetes discovery (cargo feature \
                          `kubernetes`)"
                    .into(),
            });
        }
        Ok(InferencePoolRef {
            name: name.to_owned(),
            namespace: self.pool_namespace.clone(),
        })
    }
}
