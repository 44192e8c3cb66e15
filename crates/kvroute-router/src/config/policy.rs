//! `policy`, `seed` and `[kv_aware]`: which policy routes, and the settings of the ones that
//! have any. Cost-model defaults are `KvAwareConfig::default()`, next to the model.

use super::file::FileKvAware;
use super::values::{non_negative, positive};
use super::{ConfigError, invalid};
use crate::policy::{KvAwareConfig, PolicyKind};

/// Policy used when neither the file nor `--policy` names one.
pub const DEFAULT_POLICY: PolicyKind = PolicyKind::DEFAULT;
/// Seed of the policies' random choices when none is configured.
pub const DEFAULT_SEED: u64 = 0;

/// The policy: `--policy`, else the file's `policy`, else [`DEFAULT_POLICY`].
///
/// The file's value is read as a string and parsed here (not by serde) so that an unknown
/// name is reported like every other invalid value: with its key and the accepted names.
pub(super) fn policy(
    flag: Option<PolicyKind>,
    file: Option<String>,
) -> Result<PolicyKind, ConfigError> {
    match (flag, file) {
        (Some(kind), _) => Ok(kind),
        (None, Some(name)) => name.parse().map_err(|_| {
            invalid(
                "policy",
                format!(
                    "unknown policy `{name}`; use one of {}",
                    PolicyKind::known_names()
                ),
            )
        }),
        (None, None) => Ok(DEFAULT_POLICY),
    }
}

/// `kv_aware`'s cost model from `[kv_aware]`.
pub(super) fn kv_aware(file: &FileKvAware) -> Result<KvAwareConfig, ConfigError> {
    let d = KvAwareConfig::default();
    let kv_aware = KvAwareConfig {
        prefill_rate_tokens_per_s: positive(
            "kv_aware.prefill_rate_tokens_per_s",
            file.prefill_rate_tokens_per_s,
            d.prefill_rate_tokens_per_s,
        )?,
        step_cost_s: non_negative("kv_aware.step_cost_s", file.step_cost_s, d.step_cost_s)?,
        overhead_s: non_negative("kv_aware.overhead_s", file.overhead_s, d.overhead_s)?,
        calibrate: file.calibrate.unwrap_or(d.calibrate),
        forgetting: file.forgetting.unwrap_or(d.forgetting),
        temperature: non_negative("kv_aware.temperature", file.temperature, d.temperature)?,
        decode_weight: non_negative(
            "kv_aware.decode_weight",
            file.decode_weight,
            d.decode_weight,
        )?,
        eviction_weight: non_negative(
            "kv_aware.eviction_weight",
            file.eviction_weight,
            d.eviction_weight,
        )?,
        copy_weight: non_negative("kv_aware.copy_weight", file.copy_weight, d.copy_weight)?,
        saturation_weight: non_negative(
            "kv_aware.saturation_weight",
            file.saturation_weight,
            d.saturation_weight,
        )?,
        long_prefill_token_threshold: file
            .long_prefill_token_threshold
            .unwrap_or(d.long_prefill_token_threshold),
        tiers: super::tier_cost::tier_cost(&file.tiers)?,
    };
    if !(0.9..=1.0).contains(&kv_aware.forgetting) {
        return Err(invalid(
            "kv_aware.forgetting",
            "must be between 0.9 and 1.0 (0.995 weighs the last few hundred requests)",
        ));
    }
    Ok(kv_aware)
}
