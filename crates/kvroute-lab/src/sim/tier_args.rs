//! `kvroute simulate`'s tiered-fleet flags: a host-memory KV tier behind every engine's GPU
//! cache (`engine::cpu_tier`), and how `kv_aware` credits what it holds (`policy::tier_cost`).

use anyhow::bail;
use clap::Args;

use crate::engine::core::EngineConfig;
use crate::engine::cpu_tier::{CpuTierConfig, TierEvents};
use kvroute_router::policy::{KvAwareConfig, TierCredit};

/// A host-memory tier per engine and how the router prices it.
#[derive(Args, Clone, Debug, PartialEq)]
pub struct TierArgs {
    /// Give every engine a host-memory KV tier of R × its GPU blocks (vLLM's
    /// OffloadingConnector): GPU evictions are offloaded there (LRU) and loaded back instead
    /// of recomputed. 0: no tier.
    #[arg(long, default_value_t = 0.0, value_name = "R")]
    pub cpu_tier_ratio: f64,
    /// Host→GPU load bandwidth of the tier, GB/s (PCIe 5 ×16: ≈ 50 effective).
    #[arg(long, default_value_t = 50.0, value_name = "GB/S")]
    pub cpu_tier_read_gbps: f64,
    /// GPU→host offload bandwidth of the tier, GB/s.
    #[arg(long, default_value_t = 50.0, value_name = "GB/S")]
    pub cpu_tier_write_gbps: f64,
    /// Fixed milliseconds of every load from the tier.
    #[arg(long, default_value_t = 0.5, value_name = "MS")]
    pub cpu_tier_latency_ms: f64,
    /// How the tier's KV events are encoded: `placeholder` (vLLM < 0.24, or without
    /// self_describing_kv_events) or `self-describing`.
    #[arg(long, default_value = "placeholder", value_name = "ENCODING",
          value_parser = parse_events)]
    pub cpu_tier_events: TierEventsArg,
    /// How kv_aware credits blocks held in host memory or on disk: `seconds` (their load
    /// time, fitted online), `dynamo-weights` (NVIDIA Dynamo's 0.75 / 0.25 of a GPU hit) or
    /// `ignored` (GPU blocks only).
    #[arg(long, default_value = "seconds", value_name = "CREDIT", value_parser = parse_credit)]
    pub tier_credit: TierCreditArg,
}

/// [`TierEvents`] as a flag value.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TierEventsArg(pub TierEvents);

/// [`TierCredit`] as a flag value.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TierCreditArg(pub TierCredit);

fn parse_events(s: &str) -> Result<TierEventsArg, String> {
    TierEvents::from_name(s)
        .map(TierEventsArg)
        .ok_or_else(|| format!("`{s}`: use placeholder or self-describing"))
}

fn parse_credit(s: &str) -> Result<TierCreditArg, String> {
    TierCredit::from_name(s)
        .map(TierCreditArg)
        .ok_or_else(|| format!("`{s}`: use seconds, dynamo-weights or ignored"))
}

impl TierArgs {
    /// Checks the values the flags' types admit but the model does not.
    pub fn validate(&self) -> anyhow::Result<()> {
        for (name, v) in [
            ("--cpu-tier-read-gbps", self.cpu_tier_read_gbps),
            ("--cpu-tier-write-gbps", self.cpu_tier_write_gbps),
        ] {
            if !(v.is_finite() && v > 0.0) {
                bail!("{name} must be a positive number of GB/s");
            }
        }
        if !(self.cpu_tier_ratio.is_finite() && self.cpu_tier_ratio >= 0.0) {
            bail!("--cpu-tier-ratio must be 0 or more");
        }
        if !(self.cpu_tier_latency_ms.is_finite() && self.cpu_tier_latency_ms >= 0.0) {
            bail!("--cpu-tier-latency-ms must be 0 or more");
        }
        Ok(())
    }

    /// Adds the tier to `engine` (its KV bytes per token are the transfer model's).
    pub fn apply_engine(&self, engine: &mut EngineConfig) {
        let blocks = (f64::from(engine.num_blocks) * self.cpu_tier_ratio).round() as u32;
        engine.cpu_tier = (blocks > 0).then(|| CpuTierConfig {
            blocks,
            read_bytes_per_s: self.cpu_tier_read_gbps * 1e9,
            write_bytes_per_s: self.cpu_tier_write_gbps * 1e9,
            latency_s: self.cpu_tier_latency_ms / 1000.0,
            bytes_per_token: engine.transfer.bytes_per_token(),
            events: self.cpu_tier_events.0,
        });
    }

    /// Configures kv_aware's tier pricing as a live router in front of these engines would
    /// be: the same link and KV size as its prior, the flag's credit.
    pub fn apply_policy(&self, kv_aware: &mut KvAwareConfig, engine: &EngineConfig) {
        kv_aware.tiers.credit = self.tier_credit.0;
        kv_aware.tiers.kv_bytes_per_token = engine.transfer.bytes_per_token();
        kv_aware.tiers.cpu.bandwidth_bytes_per_s = self.cpu_tier_read_gbps * 1e9;
        kv_aware.tiers.cpu.latency_s = self.cpu_tier_latency_ms / 1000.0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::args::tests::parse;

    #[test]
    fn a_tier_ratio_gives_every_engine_a_tier_and_the_router_its_link() {
        let a = parse(&[
            "--num-blocks",
            "1000",
            "--cpu-tier-ratio",
            "4",
            "--cpu-tier-read-gbps",
            "25",
            "--cpu-tier-events",
            "self-describing",
            "--tier-credit",
            "dynamo-weights",
        ]);
        let c = a.sim_config().unwrap();
        let tier = c.engine.cpu_tier.unwrap();
        assert_eq!((tier.blocks, tier.read_bytes_per_s), (4000, 25e9));
        assert_eq!(tier.events, TierEvents::SelfDescribing);
        let tiers = c.policy.kv_aware.tiers;
        assert_eq!(tiers.credit, TierCredit::DynamoWeights);
        assert_eq!(tiers.cpu.bandwidth_bytes_per_s, 25e9);
        assert_eq!(tiers.kv_bytes_per_token, tier.bytes_per_token);
        // No ratio, no tier; a bad link is refused.
        assert!(parse(&[]).sim_config().unwrap().engine.cpu_tier.is_none());
        assert!(parse(&["--cpu-tier-read-gbps", "0"]).sim_config().is_err());
    }
}
