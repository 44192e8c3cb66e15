//! `[replica_bus]`: router replicas that share their bookings over NATS (see `replica_bus`).
//! Off unless a URL is given (`url`, or `kvroute serve --replica-bus-url`).
//!
//! ```toml
//! [replica_bus]
//! url = "nats://nats:4222"        # the NATS server(s), comma-separated for a cluster
//! subject = "kvroute.replicas"    # one per fleet sharing a NATS
//! replica_id = "router-0"         # default: host name and process id
//! heartbeat_ms = 1000
//! expiry_ms = 3000                # a replica silent this long has its bookings released
//! ```

use std::time::Duration;

use serde::Deserialize;

use super::{ConfigError, ServeArgs, invalid};
use crate::replica_bus::settings::default_replica_id;
use crate::replica_bus::{DEFAULT_EXPIRY, DEFAULT_HEARTBEAT, DEFAULT_SUBJECT, ReplicaBusSettings};

/// The `[replica_bus]` table.
#[derive(Deserialize, Debug, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct FileReplicaBus {
    pub(super) url: Option<String>,
    pub(super) subject: Option<String>,
    pub(super) replica_id: Option<String>,
    pub(super) heartbeat_ms: Option<u64>,
    pub(super) expiry_ms: Option<u64>,
}

/// The flags that replace the table's keys.
pub(super) struct ReplicaBusFlags<'a> {
    /// `--replica-bus-url`.
    pub(super) url: Option<&'a str>,
    /// `--replica-id`.
    pub(super) replica_id: Option<&'a str>,
}

impl ReplicaBusFlags<'_> {
    /// The flags `kvroute serve` was given.
    pub(super) fn of(args: &ServeArgs) -> ReplicaBusFlags<'_> {
        ReplicaBusFlags {
            url: args.replica_bus_url.as_deref(),
            replica_id: args.replica_id.as_deref(),
        }
    }
}

/// The bus settings, `None` when no URL is given.
pub(super) fn replica_bus(
    file: &FileReplicaBus,
    flags: &ReplicaBusFlags<'_>,
) -> Result<Option<ReplicaBusSettings>, ConfigError> {
    let Some(url) = flags
        .url
        .map(str::to_owned)
        .or_else(|| file.url.clone())
        .filter(|u| !u.trim().is_empty())
    else {
        return Ok(None);
    };
    if !url
        .split(',')
        .all(|u| u.starts_with("nats://") || u.starts_with("tls://") || !u.contains("://"))
    {
        return Err(invalid(
            "replica_bus.url",
            format!("`{url}` is not a NATS address; give e.g. \"nats://nats:4222\""),
        ));
    }
    let subject = file
        .subject
        .clone()
        .unwrap_or_else(|| DEFAULT_SUBJECT.to_owned());
    if subject.is_empty() || subject.contains([' ', '*', '>']) {
        return Err(invalid(
            "replica_bus.subject",
            "must be a plain NATS subject without spaces or wildcards, e.g. \"kvroute.replicas\"",
        ));
    }
    let replica_id = flags
        .replica_id
        .map(str::to_owned)
        .or_else(|| file.replica_id.clone())
        .filter(|i| !i.is_empty())
        .unwrap_or_else(default_replica_id);
    let heartbeat = file
        .heartbeat_ms
        .map_or(DEFAULT_HEARTBEAT, Duration::from_millis);
    let expiry = file.expiry_ms.map_or(DEFAULT_EXPIRY, Duration::from_millis);
    if heartbeat.is_zero() || expiry < heartbeat * 2 {
        return Err(invalid(
            "replica_bus.expiry_ms",
            format!(
                "heartbeat_ms must be above 0 and expiry_ms at least two heartbeats (default {} / {} ms), or a live replica's bookings would expire",
                DEFAULT_HEARTBEAT.as_millis(),
                DEFAULT_EXPIRY.as_millis()
            ),
        ));
    }
    Ok(Some(ReplicaBusSettings {
        url,
        subject,
        replica_id,
        heartbeat,
        expiry,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    const NO_FLAGS: ReplicaBusFlags<'static> = ReplicaBusFlags {
        url: None,
        replica_id: None,
    };

    #[test]
    fn off_without_a_url_and_flags_win_over_the_file() {
        assert_eq!(
            replica_bus(&FileReplicaBus::default(), &NO_FLAGS).unwrap(),
            None
        );
        let file = FileReplicaBus {
            url: Some("nats://a:4222".into()),
            replica_id: Some("file-id".into()),
            ..FileReplicaBus::default()
        };
        let s = replica_bus(&file, &NO_FLAGS).unwrap().unwrap();
        assert_eq!(
            (s.url.as_str(), s.replica_id.as_str(), s.subject.as_str()),
            ("nats://a:4222", "file-id", DEFAULT_SUBJECT)
        );
        assert_eq!((s.heartbeat, s.expiry), (DEFAULT_HEARTBEAT, DEFAULT_EXPIRY));
        let flags = ReplicaBusFlags {
            url: Some("nats://b:4222"),
            replica_id: Some("flag-id"),
        };
        let s = replica_bus(&file, &flags).unwrap().unwrap();
        assert_eq!(
            (s.url.as_str(), s.replica_id.as_str()),
            ("nats://b:4222", "flag-id")
        );
        let s = replica_bus(
            &FileReplicaBus {
                url: Some("nats://a:4222".into()),
                ..FileReplicaBus::default()
            },
            &NO_FLAGS,
        )
        .unwrap()
        .unwrap();
        assert!(s.replica_id.ends_with(&format!("-{}", std::process::id())));
    }

    #[test]
    fn bad_values_name_their_key() {
        let bad = |f: FileReplicaBus| match replica_bus(&f, &NO_FLAGS) {
            Err(ConfigError::Invalid { key, .. }) => key,
            other => panic!("{other:?}"),
        };
        let url = || Some("nats://a:4222".to_owned());
        assert_eq!(
            bad(FileReplicaBus {
                url: Some("http://a:4222".into()),
                ..FileReplicaBus::default()
            }),
            "replica_bus.url"
        );
        assert_eq!(
            bad(FileReplicaBus {
                url: url(),
                subject: Some("kvroute.>".into()),
                ..FileReplicaBus::default()
            }),
            "replica_bus.subject"
        );
        assert_eq!(
            bad(FileReplicaBus {
                url: url(),
                heartbeat_ms: Some(1000),
                expiry_ms: Some(1500),
                ..FileReplicaBus::default()
            }),
            "replica_bus.expiry_ms"
        );
    }
}
