//! The engine model's flags: KV cache shape, scheduler limits, step time, the KV link and the
//! host-memory tier. One group, flattened into `kvroute engine` (and `demo`) and into
//! `kvroute simulate`.
//!
//! A simulation is only evidence about the real-time engine if both are configured by the same
//! flags with the same meaning; `--engine-speedup` always makes the simulated GPU faster
//! (never the trace: that is `--trace-speedup`). Defaults are the real-time engine's (vLLM's
//! 16-token blocks); `kvroute simulate` raises the block size to Dynamo's mocker default (see
//! `sim::args`). `--speedup`, the old spelling, stays accepted as a hidden alias.

use clap::Args;

use super::core::EngineConfig;
use super::flag_values::{non_negative, positive};
use super::tier_args::CpuTierArgs;
use super::timing::StepTiming;
use super::transfer::{TransferError, TransferModel};

/// The engine model core's flags; together with a seed they make an [`EngineConfig`].
#[derive(Args, Clone, Debug, PartialEq)]
pub struct EngineCoreArgs {
    /// Tokens per KV block (also kvroute's hashing block size in `simulate`).
    #[arg(long, default_value_t = 16)]
    pub block_size: usize,
    /// KV blocks per engine (cache capacity = blocks × block size tokens).
    #[arg(long, default_value_t = 16_384)]
    pub num_blocks: u32,
    /// Most running sequences.
    #[arg(long, default_value_t = 256)]
    pub max_num_seqs: usize,
    /// Token budget of one step.
    #[arg(long, default_value_t = 8192)]
    pub max_num_batched_tokens: usize,
    /// Most prompt tokens one request computes in a step, as vLLM's flag of that name (0: only
    /// the step's budget limits it, vLLM's default).
    #[arg(long, default_value_t = 0, value_name = "TOKENS")]
    pub long_prefill_token_threshold: usize,
    /// Longest prompt + output accepted (default: the whole KV cache).
    #[arg(long)]
    pub max_model_len: Option<usize>,
    /// Divides every engine step time (a faster simulated GPU).
    #[arg(long, default_value_t = 1.0, value_name = "X", alias = "speedup")]
    pub engine_speedup: f64,
    /// Step-time model coefficients.
    #[command(flatten)]
    pub timing: TimingArgs,
    /// How long a decode engine takes to pull a prompt's KV from its prefill engine.
    #[command(flatten)]
    pub transfer: TransferArgs,
    /// A host-memory KV tier behind the GPU cache.
    #[command(flatten)]
    pub cpu_tier: CpuTierArgs,
}

/// The KV transfer model's flags (see [`TransferModel`]): a prompt of t tokens takes
/// latency + t × bytes per token ÷ bandwidth to reach its decode engine.
#[derive(Args, Debug, Clone, PartialEq)]
pub struct TransferArgs {
    /// Bytes of one token's KV cache (2 × layers × KV heads × head size × dtype bytes;
    /// default Qwen3-8B in bf16).
    #[arg(long, default_value_t = 147_456, value_parser = clap::value_parser!(u64).range(1..))]
    pub kv_bytes_per_token: u64,
    /// Effective bandwidth between a prefill and a decode engine, GB/s (10⁹ bytes a second).
    #[arg(long, default_value_t = 25.0, value_name = "GB_PER_S", value_parser = positive)]
    pub kv_transfer_bandwidth: f64,
    /// Fixed cost of one transfer, ms.
    #[arg(long, default_value_t = 1.0, value_name = "MS", value_parser = non_negative)]
    pub kv_transfer_latency_ms: f64,
}

impl Default for TransferArgs {
    fn default() -> Self {
        let t = TransferModel::default();
        TransferArgs {
            kv_bytes_per_token: t.bytes_per_token(),
            kv_transfer_bandwidth: t.bandwidth_bytes_per_s() / 1e9,
            kv_transfer_latency_ms: t.latency_s() * 1e3,
        }
    }
}

impl TransferArgs {
    /// The transfer model these flags describe.
    pub fn model(&self) -> Result<TransferModel, TransferError> {
        TransferModel::try_new(
            self.kv_bytes_per_token,
            self.kv_transfer_bandwidth * 1e9,
            self.kv_transfer_latency_ms / 1e3,
        )
    }
}

impl Default for EngineCoreArgs {
    fn default() -> Self {
        // Mirror the clap defaults so in-process users (demo, tests) start from the same place.
        let c = EngineConfig::default();
        EngineCoreArgs {
            block_size: c.block_size,
            num_blocks: c.num_blocks,
            max_num_seqs: c.max_num_seqs,
            max_num_batched_tokens: c.max_num_batched_tokens,
            long_prefill_token_threshold: c.long_prefill_token_threshold,
            max_model_len: c.max_model_len,
            engine_speedup: c.timing.speedup,
            timing: TimingArgs::default(),
            transfer: TransferArgs::default(),
            cpu_tier: CpuTierArgs::default(),
        }
    }
}

impl EngineCoreArgs {
    /// The model-core configuration these flags describe, with `seed` for generated tokens and
    /// engine block hashes.
    pub fn engine_config(&self, seed: u64) -> EngineConfig {
        // The flags' parsers admit only values the model takes; a struct built in code with
        // others gets the default link.
        let transfer = self.transfer.model().unwrap_or_default();
        EngineConfig {
            block_size: self.block_size,
            num_blocks: self.num_blocks,
            max_num_seqs: self.max_num_seqs,
            max_num_batched_tokens: self.max_num_batched_tokens,
            long_prefill_token_threshold: self.long_prefill_token_threshold,
            max_model_len: self.max_model_len,
            timing: self.timing.step_timing(self.engine_speedup),
            seed,
            transfer,
            // One size of KV per model: the tier moves what the transfer model pulls.
            cpu_tier: self
                .cpu_tier
                .config(self.num_blocks, transfer.bytes_per_token()),
            ..EngineConfig::default()
        }
    }
}

/// The step-time model's coefficients as flags (the defaults are NVIDIA Dynamo's mocker fit for
/// vLLM).
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

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        core: EngineCoreArgs,
    }

    #[test]
    fn defaults_agree_with_clap_and_config() {
        let parsed = Cli::parse_from(["x"]).core;
        assert_eq!(parsed, EngineCoreArgs::default());
        assert_eq!(parsed.engine_config(0), EngineConfig::default());
    }

    #[test]
    fn old_speedup_spelling_is_the_engine_speedup() {
        let old = Cli::parse_from(["x", "--speedup", "4"]).core;
        let new = Cli::parse_from(["x", "--engine-speedup", "4"]).core;
        assert_eq!(old, new);
        assert_eq!(old.engine_config(0).timing.speedup, 4.0);
    }
}
