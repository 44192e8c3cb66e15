//! `kvroute simulate`'s router side of tiered fleets: how `kv_aware` credits what the engines'
//! host-memory tiers hold (`policy::tier_cost`). The tier itself is an engine flag group
//! (`engine::tier_args`, `--cpu-tier-*`), which `kvroute engine` and `demo` take too.

use clap::Args;

use crate::engine::core::EngineConfig;
use kvroute_router::policy::{KvAwareConfig, TierCredit};

/// How the simulated router prices blocks held in a lower tier.
#[derive(Args, Clone, Debug, PartialEq)]
pub struct TierArgs {
    /// How kv_aware credits blocks held in host memory or on disk: `seconds` (their load
    /// time, fitted online), `dynamo-weights` (NVIDIA Dynamo's 0.75 / 0.25 of a GPU hit) or
    /// `ignored` (GPU blocks only).
    #[arg(long, default_value = "seconds", value_name = "CREDIT", value_parser = parse_credit)]
    pub tier_credit: TierCreditArg,
}

/// [`TierCredit`] as a flag value.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TierCreditArg(pub TierCredit);

fn parse_credit(s: &str) -> Result<TierCreditArg, String> {
    TierCredit::from_name(s)
        .map(TierCreditArg)
        .ok_or_else(|| format!("`{s}`: use seconds, dynamo-weights or ignored"))
}

impl TierArgs {
    /// Configures kv_aware's tier pricing as a live router in front of `engine`s would be
    /// configured by its operator: the flag's credit, the engines' KV size, and their tier's
    /// link as its prior (the default prior when they have no tier: nothing is then priced).
    pub fn apply_policy(&self, kv_aware: &mut KvAwareConfig, engine: &EngineConfig) {
        kv_aware.tiers.credit = self.tier_credit.0;
        kv_aware.tiers.kv_bytes_per_token = engine.transfer.bytes_per_token();
        if let Some(tier) = &engine.cpu_tier {
            kv_aware.tiers.cpu.bandwidth_bytes_per_s = tier.read_bytes_per_s;
            kv_aware.tiers.cpu.latency_s = tier.latency_s;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::cpu_tier::TierEvents;
    use crate::sim::args::tests::{parse, try_parse};

    #[test]
    fn a_tier_ratio_gives_every_engine_a_tier_and_the_router_its_link() {
        let a = parse(&[
            "--num-blocks",
            "1000",
            "--cpu-tier-ratio",
            "4",
            "--cpu-tier-read-gbps",
            "25",
            "--cpu-tier-latency-ms",
            "2",
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
        assert_eq!(tiers.cpu.latency_s, 0.002);
        assert_eq!(tiers.kv_bytes_per_token, tier.bytes_per_token);
        // No ratio, no tier (and the router's prior stays its default); a bad link is refused
        // on the command line.
        let untiered = parse(&[]).sim_config().unwrap();
        assert!(untiered.engine.cpu_tier.is_none());
        assert_eq!(
            untiered.policy.kv_aware.tiers.cpu,
            KvAwareConfig::default().tiers.cpu
        );
        assert!(try_parse(&["--cpu-tier-read-gbps", "0"]).is_err());
    }
}
