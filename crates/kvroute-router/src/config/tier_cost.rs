//! `[kv_aware.tiers]`: what the cost model charges for blocks offloaded to host memory or
//! disk. Defaults are `TierCostConfig::default()`, next to the model (`policy::tier_cost`).

use serde::Deserialize;

use super::values::{non_negative, positive};
use super::{ConfigError, invalid};
use crate::policy::{TierCostConfig, TierCredit, tier_cost::TierLink};

/// The file's `[kv_aware.tiers]` table.
#[derive(Deserialize, Debug, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct FileTierCost {
    pub(super) credit: Option<String>,
    pub(super) kv_bytes_per_token: Option<u64>,
    pub(super) cpu_bandwidth_bytes_per_s: Option<f64>,
    pub(super) cpu_latency_s: Option<f64>,
    pub(super) disk_bandwidth_bytes_per_s: Option<f64>,
    pub(super) disk_latency_s: Option<f64>,
}

/// The tier pricing from `[kv_aware.tiers]`.
pub(super) fn tier_cost(file: &FileTierCost) -> Result<TierCostConfig, ConfigError> {
    let d = TierCostConfig::default();
    let credit = match &file.credit {
        None => d.credit,
        Some(name) => TierCredit::from_name(name).ok_or_else(|| {
            invalid(
                "kv_aware.tiers.credit",
                format!("unknown credit `{name}`; use seconds, dynamo-weights or ignored"),
            )
        })?,
    };
    let kv_bytes_per_token = file.kv_bytes_per_token.unwrap_or(d.kv_bytes_per_token);
    if kv_bytes_per_token == 0 {
        return Err(invalid(
            "kv_aware.tiers.kv_bytes_per_token",
            "must be at least 1 (2 × layers × KV heads × head size × bytes per element)",
        ));
    }
    let link = |tier: &str, bw: Option<f64>, lat: Option<f64>, d: TierLink| {
        Ok::<_, ConfigError>(TierLink {
            bandwidth_bytes_per_s: positive(
                &format!("kv_aware.tiers.{tier}_bandwidth_bytes_per_s"),
                bw,
                d.bandwidth_bytes_per_s,
            )?,
            latency_s: non_negative(
                &format!("kv_aware.tiers.{tier}_latency_s"),
                lat,
                d.latency_s,
            )?,
        })
    };
    Ok(TierCostConfig {
        credit,
        kv_bytes_per_token,
        cpu: link(
            "cpu",
            file.cpu_bandwidth_bytes_per_s,
            file.cpu_latency_s,
            d.cpu,
        )?,
        disk: link(
            "disk",
            file.disk_bandwidth_bytes_per_s,
            file.disk_latency_s,
            d.disk,
        )?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_bad_values() {
        assert_eq!(
            tier_cost(&FileTierCost::default()).unwrap(),
            TierCostConfig::default()
        );
        let file = FileTierCost {
            credit: Some("dynamo-weights".into()),
            cpu_bandwidth_bytes_per_s: Some(25e9),
            ..FileTierCost::default()
        };
        let c = tier_cost(&file).unwrap();
        assert_eq!(c.credit, TierCredit::DynamoWeights);
        assert_eq!(c.cpu.bandwidth_bytes_per_s, 25e9);
        for bad in [
            FileTierCost {
                credit: Some("weights".into()),
                ..FileTierCost::default()
            },
            FileTierCost {
                kv_bytes_per_token: Some(0),
                ..FileTierCost::default()
            },
            FileTierCost {
                disk_bandwidth_bytes_per_s: Some(0.0),
                ..FileTierCost::default()
            },
        ] {
            assert!(tier_cost(&bad).is_err(), "{bad:?}");
        }
    }
}
