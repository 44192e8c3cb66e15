//! `[[workers]]` and `--worker`: the static fleet. Both spellings go through one
//! [`worker_spec`], so a worker given on the command line is checked exactly like one in the
//! file.

use super::file::FileWorker;
use super::{ConfigError, invalid};
use crate::fleet::{BaseUrl, WorkerSpec};

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
        workers
            .push(parse_worker_flag(flag).map_err(|m| invalid(format!("--worker #{}", i + 1), m))?);
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
            && !(ep.starts_with("tcp://") || ep.starts_with("ipc://"))
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

/// Parses `URL[=MODEL,…][@tcp://HOST:PORT]`.
pub fn parse_worker_flag(flag: &str) -> Result<WorkerSpec, String> {
    let (rest, events) = match flag.find("@tcp://").or_else(|| flag.find("@ipc://")) {
        Some(at) => (&flag[..at], Some(flag[at + 1..].to_string())),
        None => (flag, None),
    };
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
    worker_spec("worker", None, url, models, events, None).map_err(|e| match e {
        ConfigError::Invalid { message, .. } => message,
        other => other.to_string(),
    })
}
