//! `[[workers]]` and `--worker`: the static fleet. Both spellings go through one
//! [`worker_spec`], so a worker given on the command line is checked exactly like one in the
//! file; the admin API checks the workers it adds with the same [`check_worker`].

use std::net::{IpAddr, SocketAddr};

use thiserror::Error;

use super::data_parallel::{check_ranks, data_parallel_size};
use super::file::FileWorker;
use super::role::{bootstrap_port, check_role, worker_role};
use super::{ConfigError, invalid};
use crate::fleet::{BaseUrl, WorkerSpec};

pub use super::worker_mistakes::WORKER_FLAG_SYNTAX;

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

/// Longest worker id accepted: ids are metric labels, log fields and URL path segments.
pub const MAX_WORKER_ID_BYTES: usize = 128;

/// What is wrong with a worker's description, and in which of its fields.
#[derive(Debug, Error, PartialEq)]
#[error("{message}")]
pub struct WorkerSpecError {
    /// The field at fault (`id`, `url`, `models`, `kv_events`, `kv_replay`, `kv_blocks`,
    /// `data_parallel_size`, `role`, `bootstrap_port`).
    pub field: &'static str,
    /// What is wrong and what to write instead.
    pub message: String,
}

fn spec_error(field: &'static str, message: impl Into<String>) -> WorkerSpecError {
    WorkerSpecError {
        field,
        message: message.into(),
    }
}

/// Checks a worker's description: the one check for `[[workers]]`, `--worker` and the admin
/// API. An id is a metric label, a log field and the path segment the admin API removes it by,
/// so it must be non-empty, short, and free of spaces and control characters; a model name is a
/// metric label too. A `/` is refused as well: a data-parallel rank's target is labelled
/// `id/dpN` (so a worker `dpw/dp1` would share every series of rank 1 of a worker `dpw`), and
/// the admin API takes the id as one path segment.
pub fn check_worker(spec: &WorkerSpec) -> Result<(), WorkerSpecError> {
    let id = &spec.id;
    if id.is_empty() || id.chars().any(|c| c.is_control() || c.is_whitespace()) {
        return Err(spec_error(
            "id",
            "must be non-empty, without spaces or control characters",
        ));
    }
    if id.contains('/') {
        return Err(spec_error(
            "id",
            format!(
                "`{}` contains `/`, which worker ids may not: a data-parallel rank is named \
                 `<id>/dp<rank>` and the admin API takes the id as one path segment; use `-` \
                 or `_` instead",
                crate::openai::shorten(id, crate::openai::ECHO_MAX)
            ),
        ));
    }
    if id.len() > MAX_WORKER_ID_BYTES {
        return Err(spec_error(
            "id",
            format!("must be at most {MAX_WORKER_ID_BYTES} bytes"),
        ));
    }
    if spec
        .models
        .iter()
        .any(|m| m.is_empty() || m.chars().any(char::is_control))
    {
        return Err(spec_error(
            "models",
            "model names must be non-empty, without control characters",
        ));
    }
    for (field, ep) in [
        ("kv_events", &spec.kv_events),
        ("kv_replay", &spec.kv_replay),
    ] {
        if let Some(ep) = ep
            && !ep
                .split_once("://")
                .is_some_and(|(scheme, at)| matches!(scheme, "tcp" | "ipc") && !at.is_empty())
        {
            return Err(spec_error(
                field,
                format!("`{ep}` is not a ZeroMQ endpoint; write e.g. \"tcp://127.0.0.1:5557\""),
            ));
        }
    }
    if let Some((field, message)) = super::worker_mistakes::find(
        &spec.models,
        spec.kv_events.as_deref(),
        spec.kv_replay.as_deref(),
    ) {
        return Err(spec_error(field, message));
    }
    if spec.kv_blocks == Some(0) {
        return Err(spec_error(
            "kv_blocks",
            "must be at least 1; omit it to read the engine's metrics",
        ));
    }
    check_data_parallel(spec)?;
    check_role(spec.role, spec.bootstrap_port).map_err(|e| spec_error(e.field, e.message))
}

/// A data-parallel worker's ranks must be reachable (see [`check_ranks`]).
fn check_data_parallel(spec: &WorkerSpec) -> Result<(), WorkerSpecError> {
    check_ranks(
        spec.data_parallel_size,
        spec.kv_events.as_deref(),
        spec.kv_replay.as_deref(),
    )
    .map_err(|e| spec_error(e.field, e.message))
}

/// Whether `url` names one of the router's own listen addresses: the same port on a loopback
/// or unspecified host (`localhost`, `127.x`, `::1`, `0.0.0.0`, `::`) or on the very address
/// listened on. Such a worker would send every request back to the router, which forwards it
/// again (a routing loop). The host is compared as the address it resolves to, numeric
/// spellings included (`127.1`, `2130706433`, `0x7f000001`: the resolver reads IPv4 as
/// `inet_aton` does, see [`numeric_ipv4`]). Other names of this host (its LAN address while
/// listening on `0.0.0.0`, a DNS alias) are caught at run time by the hop header instead.
pub fn names_own_address(url: &BaseUrl, own: &[SocketAddr]) -> bool {
    let authority = url.authority();
    let port = authority
        .port_u16()
        .unwrap_or(if url.is_tls() { 443 } else { 80 });
    let host = authority
        .host()
        .trim_start_matches('[')
        .trim_end_matches(']');
    let ip: Option<IpAddr> = host
        .parse()
        .ok()
        .or_else(|| numeric_ipv4(host).map(IpAddr::V4));
    let local = host.eq_ignore_ascii_case("localhost")
        || ip.is_some_and(|ip| ip.is_loopback() || ip.is_unspecified());
    own.iter()
        .any(|a| a.port() == port && (local || ip == Some(a.ip())))
}

/// The IPv4 address a numeric host stands for as the system resolver reads it (glibc's
/// `getaddrinfo`, hence the workers' connections, take `inet_aton`'s forms): one to four parts
/// separated by dots, each decimal, octal (leading `0`) or hex (`0x`), the last filling the
/// remaining bytes — `127.1`, `2130706433`, `0x7f000001`, `0177.0.0.1`. `None` for anything else.
pub fn numeric_ipv4(host: &str) -> Option<std::net::Ipv4Addr> {
    let parts: Vec<&str> = host.split('.').collect();
    if parts.is_empty() || parts.len() > 4 {
        return None;
    }
    let mut values = Vec::with_capacity(parts.len());
    for part in &parts {
        let (digits, radix) =
            if let Some(hex) = part.strip_prefix("0x").or_else(|| part.strip_prefix("0X")) {
                (hex, 16)
            } else if part.len() > 1 && part.starts_with('0') {
                (&part[1..], 8)
            } else {
                (*part, 10)
            };
        if (digits.is_empty() && radix != 16) || !digits.chars().all(|c| c.is_digit(radix)) {
            return None;
        }
        let value = if digits.is_empty() {
            0
        } else {
            u32::from_str_radix(digits, radix).ok()?
        };
        values.push(value);
    }
    let (last, leading) = values.split_last()?;
    if leading.iter().any(|&v| v > 0xff) {
        return None;
    }
    let shift = 8 * (4 - leading.len() as u32);
    if shift < 32 && *last >= (1 << shift) {
        return None;
    }
    let head = leading
        .iter()
        .enumerate()
        .fold(0u32, |acc, (i, &v)| acc | (v << (24 - 8 * i as u32)));
    Some(std::net::Ipv4Addr::from(head | last))
}

/// The workers of `[[workers]]`, then those of `--worker` flags; ids must be unique.
pub(super) fn workers(
    file: Vec<FileWorker>,
    flags: &[String],
) -> Result<Vec<WorkerSpec>, ConfigError> {
    let mut workers = Vec::new();
    for (i, w) in file.into_iter().enumerate() {
        let key = format!("workers[{i}]");
        let mut spec = worker_spec(&key, w.id, &w.url, w.models, w.kv_events, w.kv_replay)?;
        spec.kv_blocks = w.kv_blocks;
        spec.data_parallel_size = data_parallel_size(w.data_parallel_size)
            .map_err(|e| invalid(format!("{key}.{}", e.field), e.message))?;
        spec.role = worker_role(w.role.as_deref())
            .map_err(|e| invalid(format!("{key}.{}", e.field), e.message))?;
        spec.bootstrap_port = bootstrap_port(w.bootstrap_port)
            .map_err(|e| invalid(format!("{key}.{}", e.field), e.message))?;
        check_worker(&spec).map_err(|e| invalid(format!("{key}.{}", e.field), e.message))?;
        workers.push(spec);
    }
    for (i, flag) in flags.iter().enumerate() {
        let spec = parse_worker_flag(flag)
            .map_err(|e| invalid(format!("--worker #{}", i + 1), e.to_string()))?;
        workers.push(spec);
    }
    Ok(workers)
}

/// Fails when two workers share an id (metrics, logs and the admin API address workers by id)
/// or a URL (one replica listed twice gets twice its share and skews every load figure), or
/// when a worker is the router itself (see [`names_own_address`]).
pub(super) fn unique_ids(workers: &[WorkerSpec], own: &[SocketAddr]) -> Result<(), ConfigError> {
    let mut seen = std::collections::HashSet::new();
    for w in workers {
        if !seen.insert(w.id.clone()) {
            return Err(invalid(
                "workers",
                format!("two workers have the id `{}`; give each an `id`", w.id),
            ));
        }
    }
    for (i, w) in workers.iter().enumerate() {
        if let Some(other) = workers[..i].iter().find(|o| o.url.same_endpoint(&w.url)) {
            return Err(invalid(
                "workers",
                format!(
                    "workers `{}` and `{}` have the same url {}; list each replica once",
                    other.id, w.id, w.url
                ),
            ));
        }
        if names_own_address(&w.url, own) {
            return Err(invalid(
                "workers",
                format!(
                    "worker `{}` has the url {}, which is this router's own listen address: \
                     every request would loop back to it",
                    w.id, w.url
                ),
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
    let spec = WorkerSpec {
        id,
        url: base,
        models,
        kv_events,
        kv_replay,
        kv_blocks: None,
        data_parallel_size: 1,
        role: crate::fleet::Role::Both,
        bootstrap_port: None,
    };
    check_worker(&spec).map_err(|e| invalid(format!("{key}.{}", e.field), e.message))?;
    Ok(spec)
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

    #[test]
    fn data_parallel_workers_need_a_bounded_size_and_offsettable_endpoints() {
        assert_eq!(data_parallel_size(None), Ok(1));
        assert_eq!(data_parallel_size(Some(4)), Ok(4));
        for bad in [0, -1, 257, i64::MAX] {
            let e = data_parallel_size(Some(bad)).unwrap_err();
            assert_eq!(e.field, "data_parallel_size", "{bad}");
        }
        let mut spec = parse_worker_flag("http://h:1@tcp://h:5557@tcp://h:5567").unwrap();
        spec.data_parallel_size = 4;
        assert_eq!(check_worker(&spec), Ok(()));
        // Rank 1's events would be rank 0's replay port.
        spec.kv_replay = Some("tcp://h:5558".into());
        assert_eq!(check_worker(&spec).unwrap_err().field, "kv_replay");
        spec.kv_events = Some("tcp://h:5557".into());
        spec.kv_replay = Some("tcp://other:5558".into());
        assert_eq!(check_worker(&spec), Ok(()));
        spec.kv_events = Some("ipc:///run/ev".into());
        assert_eq!(check_worker(&spec).unwrap_err().field, "kv_events");
        spec.kv_events = Some("tcp://h:5557".into());
        spec.kv_replay = Some("tcp://h:65534".into());
        let e = check_worker(&spec).unwrap_err();
        assert_eq!(e.field, "kv_replay");
        assert!(e.message.contains("65532"), "{e}");
        spec.kv_replay = None;
        spec.data_parallel_size = 0;
        assert_eq!(check_worker(&spec).unwrap_err().field, "data_parallel_size");
    }

    /// Issue 35 item 8: `dpw/dp1` was accepted and shared rank 1 of `dpw`'s series.
    #[test]
    fn a_slash_in_an_id_is_refused() {
        let mut spec = parse_worker_flag("http://h:1").unwrap();
        spec.id = "dpw/dp1".into();
        let e = check_worker(&spec).unwrap_err();
        assert_eq!(e.field, "id");
        assert!(e.message.contains('/'), "{e}");
        spec.id = "dpw-dp1".into();
        assert_eq!(check_worker(&spec), Ok(()));
    }

    /// Issue 35 item 9: numeric spellings of loopback were not recognised as the router itself.
    #[test]
    fn numeric_spellings_of_the_own_address_are_recognised() {
        let own: Vec<SocketAddr> = vec!["0.0.0.0:8000".parse().unwrap()];
        for host in [
            "127.0.0.1",
            "127.1",
            "2130706433",
            "0x7f000001",
            "0177.0.0.1",
            "127.0.1",
            "localhost",
            "[::1]",
        ] {
            let url = BaseUrl::parse(&format!("http://{host}:8000")).unwrap();
            assert!(names_own_address(&url, &own), "{host}");
        }
        for host in [
            "127.0.0.1:8001",
            "10.0.0.1:8000",
            "2130706433x:8000",
            "1.2.3.4.5:8000",
        ] {
            let url = BaseUrl::parse(&format!("http://{host}")).unwrap();
            assert!(!names_own_address(&url, &own), "{host}");
        }
        assert_eq!(numeric_ipv4("1.2.3"), Some([1, 2, 0, 3].into()));
        assert_eq!(numeric_ipv4("256.1"), None);
        assert_eq!(numeric_ipv4("1.0x1000000"), None);
        assert_eq!(numeric_ipv4("host"), None);
    }
}
