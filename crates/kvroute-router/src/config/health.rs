//! `[health]`: how workers are probed. Defaults are `HealthConfig::default()`, next to the
//! prober that uses them.

use super::file::FileHealth;
use super::values::seconds;
use super::{ConfigError, invalid};
use crate::fleet::HealthConfig;

/// The health-check settings of `[health]`.
pub(super) fn health(file: FileHealth) -> Result<HealthConfig, ConfigError> {
    let d = HealthConfig::default();
    let health = HealthConfig {
        interval: seconds("health.interval_s", file.interval_s, d.interval, 0.01)?,
        timeout: seconds("health.timeout_s", file.timeout_s, d.timeout, 0.001)?,
        path: file.path.unwrap_or(d.path),
        unhealthy_threshold: file.unhealthy_threshold.unwrap_or(d.unhealthy_threshold),
        healthy_threshold: file.healthy_threshold.unwrap_or(d.healthy_threshold),
        load_interval: file
            .load_interval_ms
            .map_or(d.load_interval, std::time::Duration::from_millis),
    };
    if health.unhealthy_threshold == 0 || health.healthy_threshold == 0 {
        return Err(invalid(
            "health.unhealthy_threshold",
            "thresholds must be at least 1",
        ));
    }
    if !health.path.starts_with('/') {
        return Err(invalid(
            "health.path",
            "must start with `/`, e.g. \"/health\"",
        ));
    }
    Ok(health)
}
