//! `kvroute engine`: command-line flags and the process entry point.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use clap::Args;

use std::time::Duration;

use super::args::EngineCoreArgs;
use super::core::EngineConfig;
use super::disaggregated::DEFAULT_BOOTSTRAP_WAIT;
use super::events::{KvEventSink, NoEvents};
use super::server::{ServeConfig, start};
use kvroute_router::fleet::Role;
use kvroute_router::fleet::rank::rank_endpoint;
use kvroute_router::kv_events::{Layout, Publisher, PublisherConfig};
use kvroute_router::tokens::model::DEFAULT_CACHE_UNITS;
use kvroute_router::tokens::{ModelTokens, Tokenizer};

/// Flags of `kvroute engine`; every one has a default.
#[derive(Args, Clone, Debug, PartialEq)]
pub struct EngineArgs {
    /// HTTP address to serve the OpenAI API on.
    #[arg(long, default_value = "127.0.0.1:8100")]
    pub listen: SocketAddr,
    /// Served model name.
    #[arg(long, default_value = "kvroute/sim")]
    pub model: String,
    /// ZeroMQ PUB endpoint the engine binds for KV events; "none" disables events.
    #[arg(long, default_value = "tcp://127.0.0.1:5557")]
    pub kv_events_endpoint: String,
    /// ZeroMQ ROUTER endpoint the engine binds for replay requests; "auto" (the default)
    /// derives it from --kv-events-endpoint (tcp port + 1, so 5557 → 5558, and two engines with
    /// different event ports never collide; with N data-parallel ranks, port + N, past every
    /// rank's events port; ipc://PATH → ipc://PATH.replay); "none" disables replay.
    #[arg(long, default_value = "auto")]
    pub kv_replay_endpoint: String,
    /// Wire layout of KV events, by release: vllm-0.33 (newest), vllm-0.30, vllm-0.24,
    /// vllm-0.22, vllm-0.20, vllm-0.14, vllm-0.10.2, vllm-0.9.1, vllm-0.9.0, sglang-0.4.7,
    /// sglang-0.5.20, sglang-0.5.22.
    #[arg(long, default_value = "vllm-0.33")]
    pub kv_events_layout: String,
    /// Topic frame of KV-event messages (vLLM's default is empty).
    #[arg(long, default_value = "")]
    pub kv_events_topic: String,
    /// Batches kept for replay (vLLM's `buffer_steps`).
    #[arg(long, default_value_t = 10_000)]
    pub kv_replay_buffer: usize,
    /// KV cache shape, scheduler limits and step time.
    #[command(flatten)]
    pub core: EngineCoreArgs,
    /// Seed of generated tokens and engine block hashes.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// `builtin` or the path of a Hugging Face tokenizer.json.
    #[arg(long, default_value = "builtin")]
    pub tokenizer: String,
    /// Output tokens when a request sets no max_tokens.
    #[arg(long, default_value_t = 16)]
    pub default_max_tokens: usize,
    /// Engine cores behind the one port, each with its own scheduler and KV cache (vLLM's
    /// --data-parallel-size): a request goes to the rank its X-data-parallel-rank header names,
    /// else to the one with the fewest open requests; rank N publishes its KV events on the
    /// events port plus N (and replays on the replay port plus N).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=i64::from(kvroute_router::fleet::MAX_DATA_PARALLEL_SIZE)))]
    pub data_parallel_size: u32,
    /// Which side of disaggregated requests it runs: prefill (answers vLLM's
    /// `kv_transfer_params.do_remote_decode` and SGLang's bootstrap rooms), decode (pulls a
    /// prefill's KV, named by `do_remote_prefill` parameters or a bootstrap room, over HTTP
    /// after --kv-transfer-* time) or both (whole requests, and either side of vLLM's).
    #[arg(long, default_value = "both", value_parser = parse_role)]
    pub role: Role,
    /// Port of the SGLang-style bootstrap server a prefill engine runs (decode engines join
    /// its rooms there; SGLang's default is 8998); none without it. 0 picks a free port.
    #[arg(long)]
    pub bootstrap_port: Option<u16>,
    /// How long a prefill's room waits for its decode, and a decode for its prefill, seconds.
    #[arg(long, default_value_t = 30.0, value_parser = positive_seconds)]
    pub bootstrap_wait_s: f64,
}

fn parse_role(s: &str) -> Result<Role, String> {
    s.parse()
        .map_err(|e: kvroute_router::fleet::UnknownRole| e.to_string())
}

fn positive_seconds(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 => Ok(v),
        _ => Err(format!("`{s}` is not a positive number of seconds")),
    }
}

impl Default for EngineArgs {
    fn default() -> Self {
        // Mirror the clap defaults so in-process users (demo, tests) start from the same place.
        let c = EngineConfig::default();
        EngineArgs {
            listen: SocketAddr::from(([127, 0, 0, 1], 8100)),
            model: "kvroute/sim".into(),
            kv_events_endpoint: "tcp://127.0.0.1:5557".into(),
            kv_replay_endpoint: "auto".into(),
            kv_events_layout: "vllm-0.33".into(),
            kv_events_topic: String::new(),
            kv_replay_buffer: 10_000,
            core: EngineCoreArgs::default(),
            seed: c.seed,
            tokenizer: "builtin".into(),
            default_max_tokens: 16,
            data_parallel_size: 1,
            role: Role::Both,
            bootstrap_port: None,
            bootstrap_wait_s: DEFAULT_BOOTSTRAP_WAIT.as_secs_f64(),
        }
    }
}

impl EngineArgs {
    /// The model-core configuration these flags describe.
    pub fn engine_config(&self) -> EngineConfig {
        self.core.engine_config(self.seed)
    }

    /// Loads the tokenizer named by `--tokenizer`: `builtin`, a Hugging Face model directory
    /// (tokenizer.json with tokenizer_config.json or chat_template.jinja), or a tokenizer.json
    /// file (with its directory's tokenizer_config.json when present).
    pub fn load_tokens(&self) -> anyhow::Result<ModelTokens> {
        let block_size = self.core.block_size;
        if self.tokenizer == "builtin" {
            return Ok(ModelTokens::builtin(block_size));
        }
        let path = PathBuf::from(&self.tokenizer);
        let dir = if path.is_dir() {
            Some(path.clone())
        } else if path.ends_with("tokenizer.json") {
            path.parent()
                .filter(|d| d.join("tokenizer_config.json").exists())
                .map(PathBuf::from)
        } else {
            None
        };
        Ok(match dir {
            Some(d) => ModelTokens::from_hf_dir(&d, block_size, DEFAULT_CACHE_UNITS)?,
            None => ModelTokens::new(
                Tokenizer::from_file(&path)?,
                None,
                block_size,
                DEFAULT_CACHE_UNITS,
            ),
        })
    }

    /// The KV-event publisher these flags describe: a ZeroMQ PUB bound at
    /// `--kv-events-endpoint` and a replay ROUTER at `--kv-replay-endpoint` (`none` disables
    /// either).
    pub fn event_sink(&self) -> anyhow::Result<Box<dyn KvEventSink>> {
        self.rank_event_sink(0)
    }

    /// The KV-event publisher of data-parallel rank `rank`: the endpoints' ports plus the rank,
    /// as vLLM offsets them (`ZmqEventPublisher.offset_endpoint_port`).
    pub fn rank_event_sink(&self, rank: u32) -> anyhow::Result<Box<dyn KvEventSink>> {
        if self.kv_events_endpoint == "none" {
            return Ok(Box::new(NoEvents));
        }
        let ranks = self.data_parallel_size.max(1);
        let offset = |endpoint: &str, by: u32| {
            rank_endpoint(endpoint, by).with_context(|| {
                format!(
                    "--data-parallel-size {ranks} needs tcp:// KV-event endpoints with room for \
                     a port per rank, not {endpoint}"
                )
            })
        };
        let layout = Layout::from_name(&self.kv_events_layout).with_context(|| {
            let names: Vec<&str> = Layout::ALL.iter().map(|l| l.name()).collect();
            format!(
                "unknown --kv-events-layout {:?}; known: {}",
                self.kv_events_layout,
                names.join(", ")
            )
        })?;
        let events = offset(&self.kv_events_endpoint, rank)?;
        let mut config = PublisherConfig::new(&events).with_layout(layout);
        let replay = match self.kv_replay_endpoint.as_str() {
            "none" => None,
            "auto" if ranks > 1 => Some(offset(&self.kv_events_endpoint, ranks)?),
            "auto" => Some(
                replay_endpoint_for(&self.kv_events_endpoint)
                    .map_err(|e| anyhow::anyhow!("--kv-replay-endpoint auto: {e}"))?,
            ),
            given => Some(given.to_owned()),
        };
        if let Some(replay) = replay {
            config = config.with_replay(offset(&replay, rank)?);
        }
        config.topic = self.kv_events_topic.clone();
        config.buffer_len = self.kv_replay_buffer.max(1);
        let publisher = Publisher::bind(config)
            .with_context(|| format!("cannot publish KV events on {events}"))?;
        Ok(Box::new(publisher))
    }

    /// The full in-process configuration.
    pub fn serve_config(&self) -> anyhow::Result<ServeConfig> {
        Ok(ServeConfig {
            model: self.model.clone(),
            core: self.engine_config(),
            tokens: Arc::new(self.load_tokens()?),
            default_max_tokens: self.default_max_tokens,
            events: self.event_sink()?,
            data_parallel_size: self.data_parallel_size,
            rank_events: (1..self.data_parallel_size)
                .map(|rank| self.rank_event_sink(rank))
                .collect::<anyhow::Result<_>>()?,
            role: self.role,
            bootstrap_port: self.bootstrap_port,
            bootstrap_wait: Duration::from_secs_f64(self.bootstrap_wait_s),
        })
    }
}

/// Runs `kvroute engine` until Ctrl-C.
pub async fn run(args: EngineArgs) -> anyhow::Result<()> {
    let config = args.serve_config()?;
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    let handle = start(config, listener).await?;
    println!(
        "kvroute engine: model {} on http://{} (kv events {})",
        args.model,
        handle.local_addr(),
        args.kv_events_endpoint
    );
    let token = handle.shutdown_token();
    tokio::spawn(async move {
        let _ = tokio::signal::ctrl_c().await;
        token.cancel();
    });
    handle.wait().await
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        engine: EngineArgs,
    }

    #[test]
    fn defaults_agree_with_clap_and_config() {
        let parsed = Cli::parse_from(["engine"]).engine;
        assert_eq!(parsed, EngineArgs::default());
        assert_eq!(parsed.engine_config(), EngineConfig::default());
        assert!(Layout::from_name(&parsed.kv_events_layout).is_some());
    }

    #[test]
    fn unknown_layout_is_a_clear_error() {
        let a = EngineArgs {
            kv_events_layout: "vllm-9".into(),
            ..EngineArgs::default()
        };
        let e = a.event_sink().err().unwrap().to_string();
        assert!(e.contains("vllm-0.33"), "{e}");
        let none = EngineArgs {
            kv_events_endpoint: "none".into(),
            ..EngineArgs::default()
        };
        assert!(none.event_sink().is_ok());
    }

    #[test]
    fn flags_reach_the_config() {
        let a = Cli::parse_from([
            "engine",
            "--block-size",
            "32",
            "--num-blocks",
            "100",
            "--speedup",
            "4",
            "--decode-a",
            "-1.5",
            "--seed",
            "9",
        ])
        .engine;
        let c = a.engine_config();
        assert_eq!((c.block_size, c.num_blocks, c.seed), (32, 100, 9));
        assert_eq!((c.timing.speedup, c.timing.decode_a), (4.0, -1.5));
        assert_eq!(a.core.timing.decode_a, -1.5);
    }

    /// The real-time engine takes the host-memory tier `simulate` has, by the same flags.
    #[test]
    fn a_tier_ratio_gives_the_engine_a_tier() {
        let a = Cli::try_parse_from([
            "engine",
            "--num-blocks",
            "64",
            "--cpu-tier-ratio",
            "4",
            "--cpu-tier-write-gbps",
            "10",
            "--cpu-tier-events",
            "self-describing",
            "--kv-bytes-per-token",
            "1000",
        ])
        .unwrap()
        .engine;
        let c = a.engine_config();
        let tier = c.cpu_tier.expect("a tier");
        assert_eq!((tier.blocks, tier.bytes_per_token), (256, 1000));
        assert_eq!(
            (tier.read_bytes_per_s, tier.write_bytes_per_s),
            (50e9, 10e9)
        );
        assert_eq!(
            tier.events,
            super::super::cpu_tier::TierEvents::SelfDescribing
        );
        assert!(super::super::core::EngineCore::new(c).is_ok());
        for bad in [
            &["--cpu-tier-read-gbps", "0"][..],
            &["--cpu-tier-ratio=-4"],
            &["--cpu-tier-latency-ms", "x"],
        ] {
            let e = Cli::try_parse_from(["engine"].iter().chain(bad).copied())
                .err()
                .map(|e| e.kind());
            assert_eq!(e, Some(clap::error::ErrorKind::ValueValidation), "{bad:?}");
        }
        // Built in code past the parser, a bad link is a configuration error, not a panic.
        let mut code = a.clone();
        code.core.cpu_tier.cpu_tier_read_gbps = 0.0;
        let e = super::super::core::EngineCore::new(code.engine_config()).err();
        assert_eq!(e, Some(super::super::core::ConfigError::CpuTier));
    }
}

/// The replay endpoint `--kv-replay-endpoint auto` means for `events`: the next TCP port on the
/// same host (`*` stays `*`), or the IPC path with `.replay` appended. Derived rather than
/// fixed so that engines given different event endpoints get different replay endpoints.
pub fn replay_endpoint_for(events: &str) -> Result<String, String> {
    if let Some(path) = events.strip_prefix("ipc://") {
        return Ok(format!("ipc://{path}.replay"));
    }
    let explicit = "; give --kv-replay-endpoint explicitly";
    let Some((host, port)) = events
        .strip_prefix("tcp://")
        .and_then(|hp| hp.rsplit_once(':'))
    else {
        return Err(format!(
            "cannot derive a replay endpoint from `{events}`{explicit}"
        ));
    };
    if port == "*" {
        return Ok(format!("tcp://{host}:*"));
    }
    match port.parse::<u16>().ok().and_then(|p| p.checked_add(1)) {
        Some(next) => Ok(format!("tcp://{host}:{next}")),
        None => Err(format!("`{events}` has no port below 65535{explicit}")),
    }
}

#[cfg(test)]
mod replay_default_tests {
    use super::*;

    #[test]
    fn the_replay_port_follows_the_events_port() {
        let r = |e: &str| replay_endpoint_for(e);
        assert_eq!(r("tcp://127.0.0.1:5557").unwrap(), "tcp://127.0.0.1:5558");
        assert_eq!(r("tcp://127.0.0.1:6001").unwrap(), "tcp://127.0.0.1:6002");
        assert_eq!(r("tcp://*:7000").unwrap(), "tcp://*:7001");
        assert_eq!(r("tcp://[::1]:7000").unwrap(), "tcp://[::1]:7001");
        assert_eq!(r("tcp://127.0.0.1:*").unwrap(), "tcp://127.0.0.1:*");
        assert_eq!(r("ipc:///tmp/ev").unwrap(), "ipc:///tmp/ev.replay");
        assert!(r("tcp://h:65535").is_err());
        assert!(r("tcp://h:x").is_err());
        assert!(r("inproc://x").is_err());
        assert_eq!(EngineArgs::default().kv_replay_endpoint, "auto");
    }

    /// A port `p` with `p + 1` free too (both probed by binding them).
    fn free_pair() -> u16 {
        loop {
            let a = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
            let p = a.local_addr().expect("addr").port();
            if p < u16::MAX && std::net::TcpListener::bind(("127.0.0.1", p + 1)).is_ok() {
                return p;
            }
        }
    }

    #[test]
    fn two_engines_with_different_event_ports_both_start() {
        let engine = |port: u16| EngineArgs {
            kv_events_endpoint: format!("tcp://127.0.0.1:{port}"),
            ..EngineArgs::default()
        };
        let a = free_pair();
        let b = std::iter::repeat_with(free_pair)
            .find(|b| b.abs_diff(a) > 1)
            .expect("a second pair");
        let first = engine(a).event_sink().expect("first engine binds");
        let second = engine(b)
            .event_sink()
            .expect("second engine binds its own replay port");
        drop((first, second));
    }
}
