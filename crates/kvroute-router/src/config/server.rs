//! `[server]`: the front door — where the router listens, what it accepts from clients and
//! how long it waits for them, and how it drains on shutdown.
//!
//! These keys used to sit at the top level (`listen`, `max_body_bytes`, `shutdown_grace_s`)
//! and under `[proxy]` (`header_read_timeout_s`, `body_read_timeout_s`), although `[proxy]`
//! is otherwise about the upstream side. The old places are still read, so existing files
//! keep working, but each use is reported as a [`Deprecation`]; a key given at both places is
//! an error, because silently preferring one would hide which value is live.

use std::fmt;
use std::net::SocketAddr;
use std::time::Duration;

use super::file::{FileConfig, FileServer};
use super::values::seconds;
use super::{ConfigError, invalid};

/// Default listen address: 8080, so a router next to a vLLM server (8000) starts as it is.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:8080";
/// Default request body limit: 32 MiB.
pub const DEFAULT_MAX_BODY_BYTES: u64 = 32 << 20;
/// Default time in-flight requests may run on after SIGTERM.
pub const DEFAULT_SHUTDOWN_GRACE: Duration = Duration::from_secs(30);
/// Default time a client may take to send its request headers (nginx's keepalive_timeout).
pub const DEFAULT_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(75);
/// Default time a client may take to send its request body.
pub const DEFAULT_BODY_READ_TIMEOUT: Duration = Duration::from_secs(30);
/// Smallest body limit accepted: below it even a short chat request is refused.
const MIN_MAX_BODY_BYTES: u64 = 1024;
/// Default time a connection may stay open with no request in progress (nginx's
/// keepalive_timeout); applies to HTTP/2 connections with no open stream as to HTTP/1.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(75);
/// Default interval of HTTP/2 keep-alive pings: a peer that vanished without a FIN is noticed.
pub const DEFAULT_HTTP2_KEEPALIVE_INTERVAL: Duration = Duration::from_secs(30);
/// Default time an HTTP/2 peer has to answer a keep-alive ping before its connection is closed.
pub const DEFAULT_HTTP2_KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(20);

/// Default most streams a client may have open on one HTTP/2 connection (hyper's): an OpenAI
/// client rarely multiplexes more, and each stream holds a request's resources.
pub const DEFAULT_HTTP2_MAX_CONCURRENT_STREAMS: u32 = 200;

/// How long client connections may live without work, and how many may be open at once.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Connections {
    /// A connection with no request in progress for this long is closed (for HTTP/2: no open
    /// stream). A connection's first request must arrive within `header_read_timeout` instead.
    pub idle_timeout: Duration,
    /// Most client connections open at once; more are closed on accept. `None`: half the
    /// process's open-file limit, read at start (each proxied request also holds an upstream
    /// connection, so half leaves room for those).
    pub max_connections: Option<usize>,
    /// Interval of HTTP/2 keep-alive pings.
    pub http2_keepalive_interval: Duration,
    /// Time a ping may go unanswered before the connection is closed.
    pub http2_keepalive_timeout: Duration,
    /// Most streams open at once on one HTTP/2 connection (not a file setting: the endpoint
    /// picker raises it for its gateway, `epp::STREAMS_PER_GATEWAY_CONNECTION`).
    pub http2_max_concurrent_streams: u32,
}

impl Default for Connections {
    fn default() -> Self {
        Connections {
            idle_timeout: DEFAULT_IDLE_TIMEOUT,
            max_connections: None,
            http2_keepalive_interval: DEFAULT_HTTP2_KEEPALIVE_INTERVAL,
            http2_keepalive_timeout: DEFAULT_HTTP2_KEEPALIVE_TIMEOUT,
            http2_max_concurrent_streams: DEFAULT_HTTP2_MAX_CONCURRENT_STREAMS,
        }
    }
}

impl Connections {
    fn from_file(s: &FileServer) -> Result<Connections, ConfigError> {
        let max_connections = match s.max_connections {
            None => None,
            Some(0) => return Err(invalid("server.max_connections", "must be at least 1")),
            Some(n) => Some(usize::try_from(n).unwrap_or(usize::MAX)),
        };
        Ok(Connections {
            idle_timeout: seconds(
                "server.idle_timeout_s",
                s.idle_timeout_s,
                DEFAULT_IDLE_TIMEOUT,
                0.001,
            )?,
            max_connections,
            http2_keepalive_interval: seconds(
                "server.http2_keepalive_interval_s",
                s.http2_keepalive_interval_s,
                DEFAULT_HTTP2_KEEPALIVE_INTERVAL,
                0.001,
            )?,
            http2_keepalive_timeout: seconds(
                "server.http2_keepalive_timeout_s",
                s.http2_keepalive_timeout_s,
                DEFAULT_HTTP2_KEEPALIVE_TIMEOUT,
                0.001,
            )?,
            http2_max_concurrent_streams: DEFAULT_HTTP2_MAX_CONCURRENT_STREAMS,
        })
    }
}

/// A key that moved: it is still read at `old`, with a warning that names `new`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Deprecation {
    /// Where the key used to be.
    pub old: &'static str,
    /// Where it is now.
    pub new: &'static str,
}

impl fmt::Display for Deprecation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "`{}` is deprecated; use `{}`", self.old, self.new)
    }
}

const LISTEN: Deprecation = Deprecation {
    old: "listen",
    new: "server.listen",
};
const MAX_BODY_BYTES: Deprecation = Deprecation {
    old: "max_body_bytes",
    new: "server.max_body_bytes",
};
const SHUTDOWN_GRACE: Deprecation = Deprecation {
    old: "shutdown_grace_s",
    new: "server.shutdown_grace_s",
};
const HEADER_READ_TIMEOUT: Deprecation = Deprecation {
    old: "proxy.header_read_timeout_s",
    new: "server.header_read_timeout_s",
};
const BODY_READ_TIMEOUT: Deprecation = Deprecation {
    old: "proxy.body_read_timeout_s",
    new: "server.body_read_timeout_s",
};

/// Every key that moved to `[server]`.
pub const MOVED_TO_SERVER: [Deprecation; 5] = [
    LISTEN,
    MAX_BODY_BYTES,
    SHUTDOWN_GRACE,
    HEADER_READ_TIMEOUT,
    BODY_READ_TIMEOUT,
];

/// The deprecated keys `file` uses, in [`MOVED_TO_SERVER`] order.
pub(super) fn deprecations(file: &FileConfig) -> Vec<Deprecation> {
    [
        (LISTEN, file.listen.is_some()),
        (MAX_BODY_BYTES, file.max_body_bytes.is_some()),
        (SHUTDOWN_GRACE, file.shutdown_grace_s.is_some()),
        (
            HEADER_READ_TIMEOUT,
            file.proxy.header_read_timeout_s.is_some(),
        ),
        (BODY_READ_TIMEOUT, file.proxy.body_read_timeout_s.is_some()),
    ]
    .into_iter()
    .filter_map(|(d, used)| used.then_some(d))
    .collect()
}

/// The front-door settings, validated.
pub(super) struct FrontDoor {
    pub(super) listen: SocketAddr,
    pub(super) max_body_bytes: usize,
    pub(super) shutdown_grace: Duration,
    pub(super) header_read_timeout: Duration,
    pub(super) body_read_timeout: Duration,
    pub(super) connections: Connections,
    pub(super) metrics_listen: Option<SocketAddr>,
    pub(super) config_reload_interval: Option<Duration>,
}

impl FrontDoor {
    /// The settings of `[server]` (or their old places); `listen_flag` is `--listen`.
    pub(super) fn from_file(
        file: &FileConfig,
        listen_flag: Option<&str>,
    ) -> Result<FrontDoor, ConfigError> {
        let s = &file.server;
        let (key, listen) = pick(LISTEN, s.listen.as_deref(), file.listen.as_deref())?;
        // The flag's errors are reported under `listen`, as they always were.
        let (key, listen) = match listen_flag {
            Some(flag) => (LISTEN.old, flag),
            None => (key, listen.unwrap_or(DEFAULT_LISTEN)),
        };
        let listen: SocketAddr = listen.parse().map_err(|_| {
            invalid(
                key,
                format!("`{listen}` is not an address; write e.g. \"127.0.0.1:8000\""),
            )
        })?;
        let (key, max_body_bytes) = pick(MAX_BODY_BYTES, s.max_body_bytes, file.max_body_bytes)?;
        let max_body_bytes = max_body_bytes.unwrap_or(DEFAULT_MAX_BODY_BYTES);
        if max_body_bytes < MIN_MAX_BODY_BYTES {
            return Err(invalid(key, "must be at least 1024"));
        }
        let (key, grace) = pick(SHUTDOWN_GRACE, s.shutdown_grace_s, file.shutdown_grace_s)?;
        let shutdown_grace = seconds(key, grace, DEFAULT_SHUTDOWN_GRACE, 0.0)?;
        let (key, header) = pick(
            HEADER_READ_TIMEOUT,
            s.header_read_timeout_s,
            file.proxy.header_read_timeout_s,
        )?;
        let header_read_timeout = seconds(key, header, DEFAULT_HEADER_READ_TIMEOUT, 0.001)?;
        let (key, body) = pick(
            BODY_READ_TIMEOUT,
            s.body_read_timeout_s,
            file.proxy.body_read_timeout_s,
        )?;
        let body_read_timeout = seconds(key, body, DEFAULT_BODY_READ_TIMEOUT, 0.001)?;
        let metrics_listen = metrics_listen(s.metrics_listen.as_deref(), listen)?;
        Ok(FrontDoor {
            listen,
            max_body_bytes: usize::try_from(max_body_bytes).unwrap_or(usize::MAX),
            shutdown_grace,
            header_read_timeout,
            body_read_timeout,
            connections: Connections::from_file(s)?,
            metrics_listen,
            // 0 (or absent): reloads on SIGHUP only.
            config_reload_interval: match s.config_reload_interval_s {
                None | Some(0.0) => None,
                Some(x) => Some(seconds(
                    "server.config_reload_interval_s",
                    Some(x),
                    Duration::ZERO,
                    0.01,
                )?),
            },
        })
    }
}

/// `server.metrics_listen`: a second address that serves `/metrics` alone, so that metrics
/// (worker ids, models, load) are not readable by everyone who can reach the API port. When
/// set, the main listener no longer serves `/metrics`.
fn metrics_listen(
    value: Option<&str>,
    listen: SocketAddr,
) -> Result<Option<SocketAddr>, ConfigError> {
    const KEY: &str = "server.metrics_listen";
    let Some(value) = value else {
        return Ok(None);
    };
    let addr: SocketAddr = value.parse().map_err(|_| {
        invalid(
            KEY,
            format!("`{value}` is not an address; write e.g. \"127.0.0.1:9100\""),
        )
    })?;
    if addr.port() != 0 && addr.port() == listen.port() {
        return Err(invalid(
            KEY,
            format!("{addr} uses the port of `server.listen`; give metrics a port of their own"),
        ));
    }
    Ok(Some(addr))
}

/// The value of a moved key — from its new place, else its old one — with the key it was read
/// from, so that a bad value is reported under the name the operator wrote.
fn pick<T>(
    moved: Deprecation,
    new: Option<T>,
    old: Option<T>,
) -> Result<(&'static str, Option<T>), ConfigError> {
    match (new, old) {
        (Some(_), Some(_)) => Err(invalid(
            moved.new,
            format!(
                "also given as `{}`, its deprecated old name; keep only `{}`",
                moved.old, moved.new
            ),
        )),
        (None, Some(v)) => Ok((moved.old, Some(v))),
        (v, None) => Ok((moved.new, v)),
    }
}
