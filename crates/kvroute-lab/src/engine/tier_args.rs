//! The host-memory KV tier's flags (`engine::cpu_tier`, vLLM's OffloadingConnector with its
//! `CPUOffloadingSpec`): a group of the engine model's flags, so `kvroute engine`, `demo` and
//! `simulate` all take it, with the same names and meaning.
//!
//! The values are checked by the flags' parsers, so a bad one is a command-line error in every
//! subcommand alike rather than a check each caller must remember; a configuration built in
//! code with others is refused by [`EngineConfig::validate`](super::core::EngineConfig).

use clap::Args;

use super::cpu_tier::{CpuTierConfig, TierEvents};
use super::flag_values::{non_negative, positive};

/// A host-memory KV tier behind the engine's GPU cache.
#[derive(Args, Clone, Debug, PartialEq)]
pub struct CpuTierArgs {
    /// Give the engine a host-memory KV tier of R × its GPU blocks (vLLM's
    /// OffloadingConnector): GPU evictions are offloaded there (LRU) and loaded back instead
    /// of recomputed. 0: no tier.
    #[arg(long, default_value_t = 0.0, value_name = "R", value_parser = non_negative)]
    pub cpu_tier_ratio: f64,
    /// Host→GPU load bandwidth of the tier, GB/s (PCIe 5 ×16: ≈ 50 effective).
    #[arg(long, default_value_t = 50.0, value_name = "GB/S", value_parser = positive)]
    pub cpu_tier_read_gbps: f64,
    /// GPU→host offload bandwidth of the tier, GB/s.
    #[arg(long, default_value_t = 50.0, value_name = "GB/S", value_parser = positive)]
    pub cpu_tier_write_gbps: f64,
    /// Fixed milliseconds of every load from the tier.
    #[arg(long, default_value_t = 0.5, value_name = "MS", value_parser = non_negative)]
    pub cpu_tier_latency_ms: f64,
    /// How the tier's KV events are encoded: `placeholder` (vLLM < 0.24, or without
    /// self_describing_kv_events) or `self-describing`.
    #[arg(long, default_value = "placeholder", value_name = "ENCODING",
          value_parser = parse_events)]
    pub cpu_tier_events: TierEventsArg,
}

/// [`TierEvents`] as a flag value.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TierEventsArg(pub TierEvents);

fn parse_events(s: &str) -> Result<TierEventsArg, String> {
    TierEvents::from_name(s)
        .map(TierEventsArg)
        .ok_or_else(|| format!("`{s}`: use placeholder or self-describing"))
}

impl Default for CpuTierArgs {
    /// The clap defaults (no tier), for in-process users (demo, tests).
    fn default() -> Self {
        CpuTierArgs {
            cpu_tier_ratio: 0.0,
            cpu_tier_read_gbps: 50.0,
            cpu_tier_write_gbps: 50.0,
            cpu_tier_latency_ms: 0.5,
            cpu_tier_events: TierEventsArg(TierEvents::default()),
        }
    }
}

impl CpuTierArgs {
    /// The tier of an engine of `num_blocks` GPU blocks whose KV is `bytes_per_token` bytes a
    /// token (the transfer model's: one size of KV per model), or `None` when the ratio gives
    /// it no block.
    pub fn config(&self, num_blocks: u32, bytes_per_token: u64) -> Option<CpuTierConfig> {
        // `as` saturates: a ratio the parser refuses (NaN, negative) built in code gives no
        // tier rather than a wrapped size.
        let blocks = (f64::from(num_blocks) * self.cpu_tier_ratio).round() as u32;
        (blocks > 0).then(|| CpuTierConfig {
            blocks,
            read_bytes_per_s: self.cpu_tier_read_gbps * 1e9,
            write_bytes_per_s: self.cpu_tier_write_gbps * 1e9,
            latency_s: self.cpu_tier_latency_ms / 1000.0,
            bytes_per_token,
            events: self.cpu_tier_events.0,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        tier: CpuTierArgs,
    }

    fn parse(flags: &[&str]) -> Result<CpuTierArgs, clap::Error> {
        Cli::try_parse_from(std::iter::once("x").chain(flags.iter().copied())).map(|c| c.tier)
    }

    #[test]
    fn defaults_agree_with_clap_and_give_no_tier() {
        let parsed = parse(&[]).unwrap();
        assert_eq!(parsed, CpuTierArgs::default());
        assert_eq!(parsed.config(1000, 10), None);
    }

    #[test]
    fn a_ratio_sizes_the_tier_from_the_gpu_blocks() {
        let a = parse(&[
            "--cpu-tier-ratio",
            "2.5",
            "--cpu-tier-read-gbps",
            "25",
            "--cpu-tier-latency-ms",
            "2",
            "--cpu-tier-events",
            "self-describing",
        ])
        .unwrap();
        let t = a.config(100, 7).unwrap();
        assert_eq!((t.blocks, t.bytes_per_token), (250, 7));
        assert_eq!((t.read_bytes_per_s, t.write_bytes_per_s), (25e9, 50e9));
        assert_eq!((t.latency_s, t.events), (0.002, TierEvents::SelfDescribing));
    }

    #[test]
    fn bad_values_are_refused_by_the_parser() {
        for flags in [
            &["--cpu-tier-read-gbps", "0"][..],
            &["--cpu-tier-write-gbps=-1"],
            &["--cpu-tier-read-gbps", "inf"],
            &["--cpu-tier-ratio=-1"],
            &["--cpu-tier-ratio", "NaN"],
            &["--cpu-tier-latency-ms=-0.5"],
            &["--cpu-tier-events", "gpu"],
        ] {
            let e = parse(flags).err().map(|e| e.kind());
            assert_eq!(
                e,
                Some(clap::error::ErrorKind::ValueValidation),
                "{flags:?}"
            );
        }
        assert!(parse(&["--cpu-tier-latency-ms", "0", "--cpu-tier-ratio", "0"]).is_ok());
    }
}
