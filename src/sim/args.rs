//! `kvroute simulate` flags, and how they become a workload and a [`SimConfig`].
//!
//! Engine defaults are NVIDIA Dynamo's mocker defaults (64-token blocks, 16,384 blocks, 8,192
//! batched tokens, 256 sequences, its vLLM step-time fit), so a Mooncake run here can be read
//! next to one of Dynamo's. Workload flags mirror `kvroute bench`'s, except that the trace
//! speed-up is `--speedup-trace` (`--speedup` is the engine's, as in `kvroute engine`).

use std::path::PathBuf;

use anyhow::bail;
use clap::Args;

use crate::engine::{EngineConfig, TimingArgs};
use crate::policy::{KvAwareConfig, POLICY_NAMES, PolicySettings};
use crate::report::Slo;
use crate::workload::SyntheticChoice;
use crate::workload::synthesis::PromptSynth;
use crate::workload::synthetic::{SyntheticKind, SyntheticSpec};
use crate::workload::trace::{MOONCAKE_BLOCK_TOKENS, Trace, Transforms};

use super::config::{FleetChange, IndexMode, SimConfig};

/// How the index is fed, on the command line.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum IndexChoice {
    /// The engines' KV events feed the exact index.
    Events,
    /// The router records routed blocks (no events).
    Approx,
}

/// Flags of `kvroute simulate`.
#[derive(Args, Clone, Debug, PartialEq)]
pub struct SimulateArgs {
    /// Run a named scenario of the suite (`all` for every one; see `benches/scenarios/`), or a
    /// scenario file (`*.toml`). Only --out, --policies and --jobs may be given with it.
    #[arg(long, value_name = "NAME")]
    pub scenario: Option<String>,
    /// A Mooncake JSONL trace (timestamp ms, input_length, output_length, hash_ids).
    #[arg(long, value_name = "FILE", conflicts_with = "synthetic")]
    pub trace: Option<PathBuf>,
    /// Tokens per block id of the trace file (Mooncake: 512).
    #[arg(long, default_value_t = MOONCAKE_BLOCK_TOKENS, value_name = "N")]
    pub trace_block_size: u32,
    /// A synthetic workload instead of a trace.
    #[arg(long, value_enum, value_name = "KIND")]
    pub synthetic: Option<SyntheticChoice>,
    /// Synthetic: number of requests.
    #[arg(long, default_value_t = 1000)]
    pub requests: usize,
    /// Synthetic: mean arrival rate, requests per second (Poisson).
    #[arg(long, default_value_t = 10.0)]
    pub rate: f64,
    /// Synthetic: mean unique prompt tokens per request (±50 %).
    #[arg(long, default_value_t = 512)]
    pub input_tokens: u32,
    /// Synthetic: mean output tokens per request (±50 %).
    #[arg(long, default_value_t = 128)]
    pub output_tokens: u32,
    /// Synthetic: tokens per block id (sharing granularity).
    #[arg(long, default_value_t = 64)]
    pub block_tokens: u32,
    /// Synthetic shared-prefix: number of system prompts.
    #[arg(long, default_value_t = 16)]
    pub prefixes: usize,
    /// Synthetic shared-prefix / hot-prefix: shared prefix length in tokens.
    #[arg(long, default_value_t = 2048)]
    pub prefix_tokens: u32,
    /// Synthetic shared-prefix: zipf exponent of prompt popularity.
    #[arg(long, default_value_t = 1.1)]
    pub zipf: f64,
    /// Synthetic multi-turn: turns per conversation.
    #[arg(long, default_value_t = 4)]
    pub turns: u32,
    /// Synthetic multi-turn: mean seconds between turns.
    #[arg(long, default_value_t = 5.0)]
    pub think_time: f64,
    /// Synthetic hot-prefix: fraction of requests carrying the hot prefix.
    #[arg(long, default_value_t = 0.9)]
    pub hot_fraction: f64,
    /// Only arrivals in START:END seconds of the trace (re-based to 0).
    #[arg(long, value_name = "START:END", value_parser = parse_window)]
    pub window: Option<(f64, f64)>,
    /// Only the first N requests (after the window).
    #[arg(long, value_name = "N")]
    pub max_requests: Option<usize>,
    /// Divide the trace's inter-arrival times by X (2 = twice the rate).
    #[arg(long, value_name = "X")]
    pub speedup_trace: Option<f64>,
    /// Cap prompts at N tokens, keeping their exact prefix.
    #[arg(long, value_name = "N")]
    pub max_input_tokens: Option<u32>,
    /// Workers at the start.
    #[arg(long, default_value_t = 4)]
    pub workers: u32,
    /// Comma-separated policies (default: all seven); the oracle is always added.
    #[arg(long, value_delimiter = ',', value_name = "P1,P2,…")]
    pub policies: Option<Vec<String>>,
    /// How the router's index learns what engines cache.
    #[arg(long, value_enum, default_value = "events")]
    pub index: IndexChoice,
    /// Events mode: seconds between a step's end and its KV events reaching the index.
    #[arg(long, default_value_t = 0.0, value_name = "SECONDS")]
    pub event_delay: f64,
    /// A cold worker joins at T seconds (repeatable).
    #[arg(long, value_name = "T")]
    pub join_at: Vec<f64>,
    /// Worker W restarts (cache and events reset, in-flight requests fail) at T seconds,
    /// given as W@T (repeatable).
    #[arg(long, value_name = "W@T", value_parser = parse_restart)]
    pub restart_at: Vec<(u32, f64)>,
    /// Engine: tokens per KV block (also kvroute's hashing block size).
    #[arg(long, default_value_t = 64)]
    pub block_size: usize,
    /// Engine: KV blocks per worker.
    #[arg(long, default_value_t = 16_384)]
    pub num_blocks: u32,
    /// Engine: token budget of one step.
    #[arg(long, default_value_t = 8192)]
    pub max_num_batched_tokens: usize,
    /// Engine: most running sequences.
    #[arg(long, default_value_t = 256)]
    pub max_num_seqs: usize,
    /// Engine: longest prompt + output accepted (default: the whole KV cache).
    #[arg(long)]
    pub max_model_len: Option<usize>,
    /// Engine: divides every step time (a faster GPU).
    #[arg(long, default_value_t = 1.0)]
    pub speedup: f64,
    /// Engine step-time coefficients (as `kvroute engine`).
    #[command(flatten)]
    pub timing: TimingArgs,
    /// kv_aware: initial prefill rate of a worker, tokens per second (the live router's
    /// `kv_aware` config; calibration refines it per worker from observed TTFTs).
    #[arg(long, value_name = "TOKENS_PER_S")]
    pub kv_aware_prefill_rate: Option<f64>,
    /// kv_aware: do not re-fit the cost model's rates from observed TTFTs.
    #[arg(long)]
    pub kv_aware_no_calibrate: bool,
    /// kv_aware: weight of the stall a prefill imposes on decoding sequences (the live
    /// router's `kv_aware.decode_weight`; 0 optimises each request's own TTFT only).
    #[arg(long, value_name = "WEIGHT")]
    pub kv_aware_decode_weight: Option<f64>,
    /// TTFT target in seconds, for SLO attainment.
    #[arg(long, value_name = "SECONDS")]
    pub slo_ttft: Option<f64>,
    /// End-to-end latency target in seconds.
    #[arg(long, value_name = "SECONDS")]
    pub slo_e2e: Option<f64>,
    /// Seed of the synthetic workload, prompt content, engines and random policies.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Token ids used for synthesized prompts, START:END (end exclusive).
    #[arg(long, value_name = "START:END", default_value = "1000:30000", value_parser = parse_vocab)]
    pub vocab: (u32, u32),
    /// Write results.json, summary.md and SVG charts into DIR.
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Policies simulated in parallel threads (results do not depend on it).
    #[arg(long, default_value_t = 1)]
    pub jobs: usize,
}

fn parse_pair<T: std::str::FromStr>(s: &str, sep: char) -> Result<(T, T), String> {
    let (a, b) = s
        .split_once(sep)
        .ok_or_else(|| format!("`{s}` is not A{sep}B"))?;
    let parse = |x: &str| {
        x.trim()
            .parse::<T>()
            .map_err(|_| format!("`{x}` in `{s}` is not a number"))
    };
    Ok((parse(a)?, parse(b)?))
}

fn parse_window(s: &str) -> Result<(f64, f64), String> {
    let (a, b) = parse_pair::<f64>(s, ':')?;
    if a >= 0.0 && b > a {
        Ok((a, b))
    } else {
        Err(format!("window `{s}` needs 0 <= START < END"))
    }
}

fn parse_vocab(s: &str) -> Result<(u32, u32), String> {
    let (a, b) = parse_pair::<u32>(s, ':')?;
    if b > a {
        Ok((a, b))
    } else {
        Err(format!("vocab range `{s}` needs START < END"))
    }
}

fn parse_restart(s: &str) -> Result<(u32, f64), String> {
    let (w, t) = s
        .split_once('@')
        .ok_or_else(|| format!("`{s}` is not W@T (worker@seconds)"))?;
    let w = w
        .trim()
        .parse::<u32>()
        .map_err(|_| format!("worker `{w}` in `{s}` is not a number"))?;
    let t = t
        .trim()
        .parse::<f64>()
        .map_err(|_| format!("time `{t}` in `{s}` is not a number"))?;
    Ok((w, t))
}

impl SimulateArgs {
    /// The policies to run, validated, in the given order (default: all).
    pub fn policy_names(&self) -> anyhow::Result<Vec<String>> {
        let names: Vec<String> = match &self.policies {
            Some(p) => p
                .iter()
                .map(|s| s.trim().to_string())
                .filter(|s| !s.is_empty() && s != "oracle")
                .collect(),
            None => POLICY_NAMES.iter().map(|s| s.to_string()).collect(),
        };
        for n in &names {
            if !POLICY_NAMES.contains(&n.as_str()) {
                bail!(
                    "unknown policy `{n}`; known policies: {}",
                    POLICY_NAMES.join(", ")
                );
            }
        }
        Ok(names)
    }

    /// The workload after every transform (window, first N, speed-up, input cap), with a
    /// one-line description.
    pub fn workload(&self) -> anyhow::Result<(Trace, String)> {
        let (trace, mut label) = match (&self.trace, self.synthetic) {
            (Some(path), None) => {
                let mut trace = Trace::from_mooncake_file(path)?;
                if self.trace_block_size != MOONCAKE_BLOCK_TOKENS {
                    trace = trace.with_block_tokens(self.trace_block_size)?;
                }
                let name = path.file_name().unwrap_or_default().to_string_lossy();
                (trace, format!("trace {name}"))
            }
            (None, Some(kind)) => {
                let spec = self.synthetic_spec(kind);
                (spec.generate()?, format!("synthetic {kind:?}"))
            }
            (Some(_), Some(_)) => bail!("give either --trace or --synthetic, not both"),
            (None, None) => {
                bail!("give a workload: --trace FILE, --synthetic KIND or --scenario NAME")
            }
        };
        let trace = Transforms {
            window: self.window,
            max_requests: self.max_requests,
            speed_up: self.speedup_trace,
            max_input_tokens: self.max_input_tokens,
        }
        .apply(trace, &mut label)?;
        Ok((trace, label))
    }

    /// The synthetic spec of these flags for `kind`.
    pub fn synthetic_spec(&self, kind: SyntheticChoice) -> SyntheticSpec {
        let kind = match kind {
            SyntheticChoice::SharedPrefix => SyntheticKind::SharedPrefix {
                prefixes: self.prefixes,
                prefix_tokens: self.prefix_tokens,
                zipf_s: self.zipf,
            },
            SyntheticChoice::MultiTurn => SyntheticKind::MultiTurn {
                turns: self.turns,
                think_s: self.think_time,
            },
            SyntheticChoice::Unique => SyntheticKind::Unique,
            SyntheticChoice::HotPrefix => SyntheticKind::HotPrefix {
                prefix_tokens: self.prefix_tokens,
                hot_fraction: self.hot_fraction,
            },
        };
        SyntheticSpec {
            kind,
            requests: self.requests,
            rate: self.rate,
            input_tokens: self.input_tokens,
            output_tokens: self.output_tokens,
            block_tokens: self.block_tokens,
            seed: self.seed,
        }
    }

    /// The engine configuration of these flags.
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

    /// The policies' settings: the live router's defaults, seeded, with the kv_aware overrides.
    pub fn policy_settings(&self) -> PolicySettings {
        let mut kv_aware = KvAwareConfig::default();
        if let Some(rate) = self.kv_aware_prefill_rate {
            kv_aware.prefill_rate_tokens_per_s = rate;
        }
        kv_aware.calibrate = !self.kv_aware_no_calibrate;
        if let Some(w) = self.kv_aware_decode_weight {
            kv_aware.decode_weight = w;
        }
        PolicySettings {
            seed: self.seed,
            kv_aware,
            ..PolicySettings::default()
        }
    }

    /// The simulation configuration of these flags (validated).
    pub fn sim_config(&self) -> anyhow::Result<SimConfig> {
        let mut changes: Vec<FleetChange> = self
            .join_at
            .iter()
            .map(|&at| FleetChange::Join { at })
            .collect();
        changes.extend(
            self.restart_at
                .iter()
                .map(|&(worker, at)| FleetChange::Restart { worker, at }),
        );
        let config = SimConfig {
            workers: self.workers,
            engine: self.engine_config(),
            index: match self.index {
                IndexChoice::Events => IndexMode::Events {
                    delay_s: self.event_delay,
                },
                IndexChoice::Approx => IndexMode::Approx,
            },
            changes,
            policy: self.policy_settings(),
            model: "kvroute/sim".to_string(),
            synth: PromptSynth::new(self.vocab.0, self.vocab.1, self.seed),
            slo: Slo {
                ttft_s: self.slo_ttft,
                e2e_s: self.slo_e2e,
            },
        };
        config.validate()?;
        Ok(config)
    }
}
