//! Checks shared by every section: numbers and durations in range, each error naming its key.

use std::time::Duration;

use super::{ConfigError, invalid};

/// `v` (or `default`) as a duration of seconds, at least `min` and at most a year.
pub(super) fn seconds(
    key: &str,
    v: Option<f64>,
    default: Duration,
    min: f64,
) -> Result<Duration, ConfigError> {
    let default = default.as_secs_f64();
    let s = v.unwrap_or(default);
    if !s.is_finite() || s < min || s > 86_400.0 * 365.0 {
        return Err(invalid(
            key,
            format!("{s} is out of range; give seconds ≥ {min}, e.g. {default}"),
        ));
    }
    Ok(Duration::from_secs_f64(s))
}

/// `v` (or `default`), which must be finite and above zero.
pub(super) fn positive(key: &str, v: Option<f64>, default: f64) -> Result<f64, ConfigError> {
    let x = v.unwrap_or(default);
    if !(x.is_finite() && x > 0.0) {
        return Err(invalid(key, format!("{x} must be a positive number")));
    }
    Ok(x)
}

/// `v` (or `default`), which must be finite and not negative.
pub(super) fn non_negative(key: &str, v: Option<f64>, default: f64) -> Result<f64, ConfigError> {
    let x = v.unwrap_or(default);
    if !(x.is_finite() && x >= 0.0) {
        return Err(invalid(key, format!("{x} must be zero or more")));
    }
    Ok(x)
}
