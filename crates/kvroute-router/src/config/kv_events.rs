//! `[kv_events]`: bounds of the KV-event replays (`replay_max_batches`, `replay_max_bytes`,
//! `replay_max_s`; defaults are [`ReplayLimits::default`]), and how many engines' subscriptions
//! one intake thread reads (`engines_per_intake`).

use serde::Deserialize;

use super::values::seconds;
use super::{ConfigError, invalid};
use crate::kv_events::ReplayLimits;

/// The `[kv_events]` table.
#[derive(Deserialize, Debug, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct FileKvEvents {
    pub(super) replay_max_batches: Option<usize>,
    pub(super) replay_max_bytes: Option<usize>,
    pub(super) replay_max_s: Option<f64>,
    pub(super) engines_per_intake: Option<usize>,
}

/// Engines one intake thread polls before another is started: at least 1.
pub(super) fn engines_per_intake(file: &FileKvEvents) -> Result<usize, ConfigError> {
    match file.engines_per_intake {
        Some(0) => Err(invalid(
            "kv_events.engines_per_intake",
            format!(
                "must be at least 1; the default is {}",
                crate::kv_events::DEFAULT_ENGINES_PER_INTAKE
            ),
        )),
        v => Ok(v.unwrap_or(crate::kv_events::DEFAULT_ENGINES_PER_INTAKE)),
    }
}

/// The replay bounds of `[kv_events]`: each at least 1 (batch, byte) and 0.01 s.
pub(super) fn replay_limits(file: &FileKvEvents) -> Result<ReplayLimits, ConfigError> {
    let d = ReplayLimits::default();
    let at_least_one = |key: &str, v: Option<usize>, default: usize| match v {
        Some(0) => Err(invalid(
            format!("kv_events.{key}"),
            format!("must be at least 1; the default is {default}"),
        )),
        v => Ok(v.unwrap_or(default)),
    };
    Ok(ReplayLimits {
        max_batches: at_least_one("replay_max_batches", file.replay_max_batches, d.max_batches)?,
        max_bytes: at_least_one("replay_max_bytes", file.replay_max_bytes, d.max_bytes)?,
        max_duration: seconds(
            "kv_events.replay_max_s",
            file.replay_max_s,
            d.max_duration,
            0.01,
        )?,
    })
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn defaults_and_bounds() {
        let d = replay_limits(&FileKvEvents::default()).unwrap();
        assert_eq!(d, ReplayLimits::default());
        let set = FileKvEvents {
            replay_max_batches: Some(10),
            replay_max_bytes: Some(1000),
            replay_max_s: Some(0.5),
            engines_per_intake: Some(64),
        };
        assert_eq!(engines_per_intake(&set).unwrap(), 64);
        assert_eq!(
            engines_per_intake(&FileKvEvents::default()).unwrap(),
            crate::kv_events::DEFAULT_ENGINES_PER_INTAKE
        );
        let none = FileKvEvents {
            engines_per_intake: Some(0),
            ..Default::default()
        };
        let e = engines_per_intake(&none).unwrap_err().to_string();
        assert!(e.contains("kv_events.engines_per_intake"), "{e}");
        let l = replay_limits(&set).unwrap();
        assert_eq!(
            (l.max_batches, l.max_bytes, l.max_duration),
            (10, 1000, Duration::from_millis(500))
        );
        for bad in [
            FileKvEvents {
                replay_max_batches: Some(0),
                ..Default::default()
            },
            FileKvEvents {
                replay_max_bytes: Some(0),
                ..Default::default()
            },
            FileKvEvents {
                replay_max_s: Some(0.0),
                ..Default::default()
            },
            FileKvEvents {
                replay_max_s: Some(f64::NAN),
                ..Default::default()
            },
        ] {
            let e = replay_limits(&bad).unwrap_err().to_string();
            assert!(e.contains("kv_events.replay_max"), "{e}");
        }
    }
}
