//! Parsers of the engine flags' numeric values, shared by the flag groups (`args`,
//! `tier_args`): a bad value is a command-line error naming it, in every subcommand alike.

/// A flag value that must be a positive finite number.
pub(super) fn positive(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 => Ok(v),
        _ => Err(format!("`{s}` is not a positive number")),
    }
}

/// A flag value that must be a finite number of at least 0.
pub(super) fn non_negative(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 0.0 => Ok(v),
        _ => Err(format!("`{s}` is not a number of at least 0")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_out_of_range_are_refused_by_name() {
        assert_eq!(positive("2.5"), Ok(2.5));
        assert!(positive("0").unwrap_err().contains("`0`"));
        assert!(positive("inf").is_err());
        assert_eq!(non_negative("0"), Ok(0.0));
        assert!(non_negative("-1").is_err());
        assert!(non_negative("x").is_err());
    }
}
