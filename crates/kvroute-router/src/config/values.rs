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
            format!(
                "{} is out of range; give seconds ≥ {min}, e.g. {default}",
                number(s)
            ),
        ));
    }
    Ok(Duration::from_secs_f64(s))
}

/// `v` (or `default`), which must be finite and above zero.
pub(super) fn positive(key: &str, v: Option<f64>, default: f64) -> Result<f64, ConfigError> {
    let x = v.unwrap_or(default);
    if !(x.is_finite() && x > 0.0) {
        return Err(invalid(
            key,
            format!("{} must be a positive number", number(x)),
        ));
    }
    Ok(x)
}

/// `v` (or `default`), which must be finite and not negative.
pub(super) fn non_negative(key: &str, v: Option<f64>, default: f64) -> Result<f64, ConfigError> {
    let x = v.unwrap_or(default);
    if !(x.is_finite() && x >= 0.0) {
        return Err(invalid(key, format!("{} must be zero or more", number(x))));
    }
    Ok(x)
}

/// `x` as a person reads it in an error: plain for everyday magnitudes, scientific beyond
/// (`1e300` was printed with 301 digits).
pub(super) fn number(x: f64) -> String {
    let a = x.abs();
    if x == 0.0 || !x.is_finite() || (1e-4..1e15).contains(&a) {
        format!("{x}")
    } else {
        format!("{x:e}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn huge_and_tiny_numbers_are_printed_short() {
        assert_eq!(number(1e300), "1e300");
        assert_eq!(number(-2.5e-9), "-2.5e-9");
        assert_eq!(number(0.5), "0.5");
        assert_eq!(number(30.0), "30");
        assert_eq!(number(f64::NAN), "NaN");
        let e = positive("k", Some(-1e300), 1.0).unwrap_err().to_string();
        assert!(e.contains("-1e300 must be a positive number"), "{e}");
        assert!(e.len() < 100, "{e}");
    }
}
