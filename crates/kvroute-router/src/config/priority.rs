//! `[priority]`: the admission queue's bands (names, highest first), the default band, the
//! bands whose requests are sheddable, and the headers a request names its band and
//! sheddability in; and placement isolation (`isolate`, `isolate_window_s`). Defaults are in
//! [`crate::shaping::priority`] and [`crate::shaping::isolation`].

use serde::Deserialize;

use super::{ConfigError, Limits, invalid};
use std::time::Duration;

use crate::shaping::priority::{DEFAULT_BAND, DEFAULT_HEADER, DEFAULT_SHEDDABLE_HEADER};
use crate::shaping::{Isolation, Priorities};

/// The `[priority]` table.
#[derive(Deserialize, Debug, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct FilePriority {
    pub(super) bands: Option<Vec<String>>,
    pub(super) default: Option<String>,
    pub(super) sheddable: Option<Vec<String>>,
    pub(super) header: Option<String>,
    pub(super) sheddable_header: Option<String>,
    pub(super) headroom: Option<usize>,
    pub(super) fair_reserve: Option<usize>,
    pub(super) isolate: Option<bool>,
    pub(super) isolate_window_s: Option<f64>,
}

/// Most bands: each is scanned in turn for the next request to admit.
const MAX_BANDS: usize = 16;

/// The priorities of `[priority]`, checked against `limits`: the bands held back
/// (`headroom`, `fair_reserve`) must leave room under `limits.max_concurrency`.
pub(super) fn within_limits(
    file: &FilePriority,
    limits: &Limits,
) -> Result<Priorities, ConfigError> {
    let priorities = priorities(file)?;
    if priorities.headroom >= limits.max_concurrency {
        return Err(invalid(
            "priority.headroom",
            "must be below limits.max_concurrency, or only the highest band could run",
        ));
    }
    if priorities.headroom + priorities.fair_reserve >= limits.max_concurrency {
        return Err(invalid(
            "priority.fair_reserve",
            "headroom + fair_reserve must be below limits.max_concurrency, or no tenant \
             would have a share outside them",
        ));
    }
    Ok(priorities)
}

/// The priorities of `[priority]`.
pub(super) fn priorities(file: &FilePriority) -> Result<Priorities, ConfigError> {
    let d = Priorities::default();
    let bands = file.bands.clone().unwrap_or(d.bands);
    if bands.is_empty() || bands.len() > MAX_BANDS {
        return Err(invalid(
            "priority.bands",
            format!("name 1 to {MAX_BANDS} bands, highest priority first"),
        ));
    }
    for (i, b) in bands.iter().enumerate() {
        if b.is_empty()
            || !b
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        {
            return Err(invalid(
                "priority.bands",
                format!("`{b}` is not a band name (letters, digits, `-`, `_`)"),
            ));
        }
        if bands[..i].contains(b) {
            return Err(invalid("priority.bands", format!("`{b}` is listed twice")));
        }
    }
    let band_of = |key: &str, name: &str| {
        bands.iter().position(|b| b == name).ok_or_else(|| {
            invalid(
                key,
                format!(
                    "`{name}` is not one of priority.bands ({})",
                    bands.join(", ")
                ),
            )
        })
    };
    let default_band = match &file.default {
        Some(name) => band_of("priority.default", name)?,
        None if file.bands.is_none() => d.default_band,
        // The default band must be one of the file's own bands: `normal` if listed, else
        // the lowest (a request that says nothing is not put above those that do).
        None => bands
            .iter()
            .position(|b| b == DEFAULT_BAND)
            .unwrap_or(bands.len() - 1),
    };
    let mut sheddable = vec![false; bands.len()];
    for name in file.sheddable.iter().flatten() {
        sheddable[band_of("priority.sheddable", name)?] = true;
    }
    Ok(Priorities {
        header: header("priority.header", file.header.as_deref(), DEFAULT_HEADER)?,
        sheddable_header: header(
            "priority.sheddable_header",
            file.sheddable_header.as_deref(),
            DEFAULT_SHEDDABLE_HEADER,
        )?,
        bands,
        default_band,
        sheddable,
        headroom: file.headroom.unwrap_or(0),
        fair_reserve: file.fair_reserve.unwrap_or(0),
    })
}

/// Placement isolation's settings of `[priority]` (`isolate`, `isolate_window_s`): kept apart
/// from [`Priorities`] because they reload, where the bands need a restart.
pub(super) fn isolation(file: &FilePriority) -> Result<Isolation, ConfigError> {
    let d = Isolation::default();
    let window = match file.isolate_window_s {
        None => d.window,
        Some(s) if (0.0..=MAX_WINDOW_S).contains(&s) => Duration::from_secs_f64(s),
        Some(_) => {
            return Err(invalid(
                "priority.isolate_window_s",
                format!("must be a number of seconds from 0 to {MAX_WINDOW_S}"),
            ));
        }
    };
    Ok(Isolation {
        enabled: file.isolate.unwrap_or(d.enabled),
        window,
    })
}

/// The longest window a tenant counts as active after its last request: an hour (longer is a
/// mistake: a tenant that left would confine the others for that long).
const MAX_WINDOW_S: f64 = 3600.0;

/// A header name, lower case.
fn header(key: &str, v: Option<&str>, default: &str) -> Result<String, ConfigError> {
    let v = v.unwrap_or(default).to_ascii_lowercase();
    http::HeaderName::from_bytes(v.as_bytes())
        .map_err(|_| invalid(key, format!("`{v}` is not a header name")))?;
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bands_default_and_sheddable_are_checked() {
        let p = priorities(&FilePriority::default()).unwrap();
        assert_eq!(p, Priorities::default());
        let file = FilePriority {
            bands: Some(vec!["critical".into(), "batch".into()]),
            sheddable: Some(vec!["batch".into()]),
            header: Some("X-Priority".into()),
            ..FilePriority::default()
        };
        let p = priorities(&file).unwrap();
        assert_eq!(
            (p.default_band, p.sheddable.clone()),
            (1, vec![false, true])
        );
        assert_eq!(p.header, "x-priority");
        for bad in [
            FilePriority {
                bands: Some(vec![]),
                ..FilePriority::default()
            },
            FilePriority {
                bands: Some(vec!["a".into(), "a".into()]),
                ..FilePriority::default()
            },
            FilePriority {
                default: Some("urgent".into()),
                ..FilePriority::default()
            },
            FilePriority {
                sheddable: Some(vec!["bulk".into()]),
                ..FilePriority::default()
            },
            FilePriority {
                header: Some("bad header".into()),
                ..FilePriority::default()
            },
        ] {
            assert!(priorities(&bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn isolation_is_off_by_default_and_its_window_is_checked() {
        assert_eq!(
            isolation(&FilePriority::default()).unwrap(),
            Isolation::default()
        );
        let file = FilePriority {
            isolate: Some(true),
            isolate_window_s: Some(2.5),
            ..FilePriority::default()
        };
        assert_eq!(
            isolation(&file).unwrap(),
            Isolation {
                enabled: true,
                window: Duration::from_millis(2500),
            }
        );
        for bad in [-1.0, f64::NAN, 1e9] {
            let file = FilePriority {
                isolate_window_s: Some(bad),
                ..FilePriority::default()
            };
            assert!(isolation(&file).is_err(), "{bad}");
        }
    }
}
