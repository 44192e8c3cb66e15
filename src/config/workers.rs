//! `[[workers]]` and `--worker`: the static fleet. Both spellings go through one
//! [`worker_spec`], so a worker given on the command line is checked exactly like one in the
//! file.

use thiserror::Error;

use super::file::FileWorker;
use super::{ConfigError, invalid};
use crate::fleet::{BaseUrl, WorkerSpec};

/// The `--worker` syntax, for help texts and errors.
pub const WORKER_FLAG_SYNTAX: &str = "URL[=MODEL,…][@EVENTS_ENDPOINT[@REPLAY_ENDPOINT]]";

/// Why a `--worker` flag was refused.
#[derive(Debug, Error, PartialEq)]
pub enum WorkerFlagError {
    /// More than the events and replay endpoints follow the URL.
    #[error(
        "{0} ZeroMQ endpoints after the URL; give at most two, events then replay: {WORKER_FLAG_SYNTAX}"
    )]
    TooManyEndpoints(usize),
    /// The URL, a model name or an endpoint is invalid (the same checks as `[[workers]]`).
    #[error("{0}")]
    Invalid(String),
}

/// The workers of `[[workers]]`, then those of `--worker` flags; ids must be unique.
pub(super) fn workers(
    file: Vec<FileWorker>,
    flags: &[String],
) -> Result<Vec<WorkerSpec>, ConfigError> {
    let mut workers = Vec::new();
    for (i, w) in file.into_iter().enumerate() {
        let key = format!("workers[{i}]");
        if w.kv_blocks == Some(0) {
            return Err(invalid(
                format!("{key}.kv_blocks"),
                "must be at least 1; omit it to read the engine's metrics",
            ));
        }
        let mut spec = worker_spec(&key, w.id, &w.url, w.models, w.kv_events, w.kv_replay)?;
        spec.kv_blocks = w.kv_blocks;
        workers.push(spec);
    }
    for (i, flag) in flags.iter().enumerate() {
        let spec = parse_worker_flag(flag)
            .map_err(|e| invalid(format!("--worker #{}", i + 1), e.to_string()))?;
        workers.push(spec);
    }
    Ok(workers)
}

/// Fails when two workers share an id: metrics, logs and the admin API address workers by id.
pub(super) fn unique_ids(workers: &[WorkerSpec]) -> Result<(), ConfigError> {
    let mut seen = std::collections::HashSet::new();
    for w in workers {
        if !seen.insert(w.id.clone()) {
            return Err(invalid(
                "workers",
                format!("two workers have the id `{}`; give each an `id`", w.id),
            ));
        }
    }
    Ok(())
}

fn worker_spec(
    key: &str,
    id: Option<String>,
    url: &str,
    models: Vec<String>,
    kv_events: Option<String>,
    kv_replay: Option<String>,
) -> Result<WorkerSpec, ConfigError> {
    let base = BaseUrl::parse(url).map_err(|e| invalid(format!("{key}.url"), e.to_string()))?;
    let id = id.unwrap_or_else(|| base.host_port());
    if id.is_empty() || id.chars().any(|c| c.is_control() || c.is_whitespace()) {
        return Err(invalid(
            format!("{key}.id"),
            "must be non-empty, without spaces or control characters",
        ));
    }
    if models.iter().any(|m| m.is_empty()) {
        return Err(invalid(
            format!("{key}.models"),
            "model names must not be empty",
        ));
    }
    for (k, ep) in [("kv_events", &kv_events), ("kv_replay", &kv_replay)] {
        if let Some(ep) = ep
            && !ep
                .split_once("://")
                .is_some_and(|(scheme, at)| matches!(scheme, "tcp" | "ipc") && !at.is_empty())
        {
            return Err(invalid(
                format!("{key}.{k}"),
                format!("`{ep}` is not a ZeroMQ endpoint; write e.g. \"tcp://127.0.0.1:5557\""),
            ));
        }
    }
    Ok(WorkerSpec {
        id,
        url: base,
        models,
        kv_events,
        kv_replay,
        kv_blocks: None,
    })
}

/// Parses `URL[=MODEL,…][@EVENTS[@REPLAY]]`: the KV-event PUB endpoint, then the replay ROUTER
/// endpoint, each `tcp://…` or `ipc://…` (e.g.
/// `http://10.0.0.5:8000=llama@tcp://10.0.0.5:5557@tcp://10.0.0.5:5558`). An endpoint starts at
/// an `@` followed by `tcp://` or `ipc://`, so `@` elsewhere (in a model name) is not one.
pub fn parse_worker_flag(flag: &str) -> Result<WorkerSpec, WorkerFlagError> {
    let mut starts: Vec<usize> = ["@tcp://", "@ipc://"]
        .iter()
        .flat_map(|marker| flag.match_indices(marker).map(|(at, _)| at))
        .collect();
    starts.sort_unstable();
    let rest = &flag[..starts.first().copied().unwrap_or(flag.len())];
    let mut endpoints = starts
        .iter()
        .enumerate()
        .map(|(k, &at)| flag[at + 1..starts.get(k + 1).copied().unwrap_or(flag.len())].to_owned());
    let (events, replay) = (endpoints.next(), endpoints.next());
    if starts.len() > 2 {
        return Err(WorkerFlagError::TooManyEndpoints(starts.len()));
    }
    let (url, models) = match rest.split_once('=') {
        Some((u, m)) => (
            u,
            m.split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .collect(),
        ),
        None => (rest, Vec::new()),
    };
    worker_spec("worker", None, url, models, events, replay).map_err(|e| {
        WorkerFlagError::Invalid(match e {
            ConfigError::Invalid { message, .. } => message,
            other => other.to_string(),
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_then_replay_endpoints() {
        let w = parse_worker_flag("http://h:1=a,b@tcp://h:5557@tcp://h:5558").unwrap();
        assert_eq!(w.models, ["a", "b"]);
        assert_eq!(w.kv_events.as_deref(), Some("tcp://h:5557"));
        assert_eq!(w.kv_replay.as_deref(), Some("tcp://h:5558"));
        let w = parse_worker_flag("http://h:1@ipc:///run/ev@tcp://h:5558").unwrap();
        assert_eq!(w.kv_events.as_deref(), Some("ipc:///run/ev"));
        assert_eq!(w.kv_replay.as_deref(), Some("tcp://h:5558"));
        let w = parse_worker_flag("http://h:1=m@tcp://h:5557").unwrap();
        assert_eq!(
            (w.kv_events.as_deref(), w.kv_replay),
            (Some("tcp://h:5557"), None)
        );
        // An `@` not followed by an endpoint scheme belongs to the model name.
        let w = parse_worker_flag("http://h:1=org@v2@tcp://h:5557").unwrap();
        assert_eq!(w.models, ["org@v2"]);
        assert_eq!(w.kv_replay, None);
    }

    #[test]
    fn bad_flags_are_typed_errors() {
        assert_eq!(
            parse_worker_flag("http://h:1@tcp://h:1@tcp://h:2@tcp://h:3"),
            Err(WorkerFlagError::TooManyEndpoints(3))
        );
        match parse_worker_flag("http://h:1=m@tcp://h:1@ipc://") {
            Ok(w) => panic!("accepted {w:?}"),
            Err(e) => assert!(matches!(e, WorkerFlagError::Invalid(_)), "{e:?}"),
        }
        let e = parse_worker_flag("ftp://x@tcp://h:1@tcp://h:2").unwrap_err();
        assert!(e.to_string().contains("http"), "{e}");
    }
}
