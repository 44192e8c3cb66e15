//! `kvroute engine`: command-line flags and the process entry point.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use clap::Args;

use super::core::EngineConfig;
use super::events::{KvEventSink, NoEvents};
use super::server::{ServeConfig, start};
use super::timing::StepTiming;
use crate::kv_events::{Layout, Publisher, PublisherConfig};
use crate::tokens::model::DEFAULT_CACHE_UNITS;
use crate::tokens::{ModelTokens, Tokenizer};

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
    /// ZeroMQ ROUTER endpoint the engine binds for replay requests.
    #[arg(long, default_value = "tcp://127.0.0.1:5558")]
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
    /// Tokens per KV block.
    #[arg(long, default_value_t = 16)]
    pub block_size: usize,
    /// KV blocks (cache capacity = blocks × block size tokens).
    #[arg(long, default_value_t = 16_384)]
    pub num_blocks: u32,
    /// Most running sequences.
    #[arg(long, default_value_t = 256)]
    pub max_num_seqs: usize,
    /// Token budget of one step.
    #[arg(long, default_value_t = 8192)]
    pub max_num_batched_tokens: usize,
    /// Longest prompt + output accepted (default: the whole KV cache).
    #[arg(long)]
    pub max_model_len: Option<usize>,
    /// Divides every step time (a faster simulated GPU).
    #[arg(long, default_value_t = 1.0)]
    pub speedup: f64,
    /// Seed of generated tokens and engine block hashes.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// `builtin` or the path of a Hugging Face tokenizer.json.
    #[arg(long, default_value = "builtin")]
    pub tokenizer: String,
    /// Output tokens when a request sets no max_tokens.
    #[arg(long, default_value_t = 16)]
    pub default_max_tokens: usize,
    /// Step-time model coefficients.
    #[command(flatten)]
    pub timing: TimingArgs,
}

impl Default for EngineArgs {
    fn default() -> Self {
        // Mirror the clap defaults so in-process users (demo, tests) start from the same place.
        let t = StepTiming::default();
        let c = EngineConfig::default();
        EngineArgs {
            listen: SocketAddr::from(([127, 0, 0, 1], 8100)),
            model: "kvroute/sim".into(),
            kv_events_endpoint: "tcp://127.0.0.1:5557".into(),
            kv_replay_endpoint: "tcp://127.0.0.1:5558".into(),
            kv_events_layout: "vllm-0.33".into(),
            kv_events_topic: String::new(),
            kv_replay_buffer: 10_000,
            block_size: c.block_size,
            num_blocks: c.num_blocks,
            max_num_seqs: c.max_num_seqs,
            max_num_batched_tokens: c.max_num_batched_tokens,
            max_model_len: None,
            speedup: t.speedup,
            seed: c.seed,
            tokenizer: "builtin".into(),
            default_max_tokens: 16,
            timing: TimingArgs::default(),
        }
    }
}

/// The step-time model's coefficients as flags, shared by `kvroute engine` and
/// `kvroute simulate` (the defaults are NVIDIA Dynamo's mocker fit for vLLM).
#[derive(Args, Debug, Clone, PartialEq)]
pub struct TimingArgs {
    /// Prefill ms = A·t² + B·t + C for t batched prefill tokens: A.
    #[arg(long, default_value_t = 4.209989e-7)]
    pub prefill_a: f64,
    /// Prefill coefficient B.
    #[arg(long, default_value_t = 1.518344e-2)]
    pub prefill_b: f64,
    /// Prefill constant C.
    #[arg(long, default_value_t = 16.50142)]
    pub prefill_c: f64,
    /// Decode ms = D·p² + E·p + F for KV usage p: D.
    #[arg(long, default_value_t = -25.74, allow_hyphen_values = true)]
    pub decode_a: f64,
    /// Decode coefficient E.
    #[arg(long, default_value_t = 54.01)]
    pub decode_b: f64,
    /// Decode constant F.
    #[arg(long, default_value_t = 5.74)]
    pub decode_c: f64,
    /// Floor of a decode step, ms.
    #[arg(long, default_value_t = 1.0)]
    pub min_decode_ms: f64,
}

impl Default for TimingArgs {
    fn default() -> Self {
        let t = StepTiming::default();
        TimingArgs {
            prefill_a: t.prefill_a,
            prefill_b: t.prefill_b,
            prefill_c: t.prefill_c,
            decode_a: t.decode_a,
            decode_b: t.decode_b,
            decode_c: t.decode_c,
            min_decode_ms: t.min_decode_ms,
        }
    }
}

impl TimingArgs {
    /// The step-time model, with every step divided by `speedup`.
    pub fn step_timing(&self, speedup: f64) -> StepTiming {
        StepTiming {
            prefill_a: self.prefill_a,
            prefill_b: self.prefill_b,
            prefill_c: self.prefill_c,
            decode_a: self.decode_a,
            decode_b: self.decode_b,
            decode_c: self.decode_c,
            min_decode_ms: self.min_decode_ms,
            speedup,
        }
    }
}

impl EngineArgs {
    /// The model-core configuration these flags describe.
    pub fn engine_config(&self) -> EngineConfig {
        EngineConfig {
            block_size: self.block_size,
            num_blocks: self.num_blocks,
            max_num_seqs: self.max_num_seqs,
            max_num_batched_tokens: self.max_num_batched_tokens,
            max_model_len: self.max_model_len,
            timing: self.timing.step_timing(self.speedup),
            seed: self.seed,
            ..EngineConfig::default()
        }
    }

    /// Loads the tokenizer named by `--tokenizer`: `builtin`, a Hugging Face model directory
    /// (tokenizer.json with tokenizer_config.json or chat_template.jinja), or a tokenizer.json
    /// file (with its directory's tokenizer_config.json when present).
    pub fn load_tokens(&self) -> anyhow::Result<ModelTokens> {
        let block_size = self.block_size;
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
        if self.kv_events_endpoint == "none" {
            return Ok(Box::new(NoEvents));
        }
        let layout = Layout::from_name(&self.kv_events_layout).with_context(|| {
            let names: Vec<&str> = Layout::ALL.iter().map(|l| l.name()).collect();
            format!(
                "unknown --kv-events-layout {:?}; known: {}",
                self.kv_events_layout,
                names.join(", ")
            )
        })?;
        let mut config = PublisherConfig::new(&self.kv_events_endpoint).with_layout(layout);
        if self.kv_replay_endpoint != "none" {
            config = config.with_replay(&self.kv_replay_endpoint);
        }
        config.topic = self.kv_events_topic.clone();
        config.buffer_len = self.kv_replay_buffer.max(1);
        let publisher = Publisher::bind(config)
            .with_context(|| format!("cannot publish KV events on {}", self.kv_events_endpoint))?;
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
        assert_eq!(a.timing.decode_a, -1.5);
    }
}
