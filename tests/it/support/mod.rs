//! Helpers shared by the integration tests, by concept:
//! - [`backend`]: test backends (small OpenAI-style servers that record what they receive and
//!   misbehave on request) and a router started in front of them;
//! - [`engine`]: simulated engines in this process, publishing KV events over ZeroMQ;
//! - [`hub`]: a stand-in for the Hugging Face hub's file API (the tokenizer fetch);
//! - [`kube_api`]: a fake Kubernetes API server (list, watch, bookmarks, 410 Gone, outages)
//!   for the discovery tests;
//! - [`process`]: `kvroute engine` / `kvroute serve` child processes and memory readings;
//! - [`qwen3`]: the Qwen3 tokenizer fixture, loaded once per test binary;
//! - [`real_engine`]: what real engines share as child processes (cache, ports, process
//!   group, readiness, stop by id); [`vllm`] and [`sglang`] launch vLLM and SGLang with it;
//! - [`real_router`], [`request_kinds`]: kvroute in front of real engines, the exactness
//!   check and the request kinds it is made on; [`real_scenarios`]: eviction, tenants, the SDK,
//!   routing and restarts on either engine (the `real_vllm*` and `real_sglang*` tests);
//! - here: the fixtures directory, free ports (and quiet ones, outside the ephemeral range), and polling until a condition holds.
//!
//! Everything is re-exported here, so a test writes `use crate::support::*;` or names the
//! helpers it needs.

use std::net::TcpListener;
use std::path::PathBuf;
use std::time::{Duration, Instant};

pub mod backend;
pub mod engine;
#[cfg(feature = "epp")]
pub mod gateway;
pub mod hub;
pub mod kube_api;
pub mod process;
pub mod quickstart;
pub mod qwen3;
pub mod real_engine;
pub mod real_router;
pub mod real_scenarios;
pub mod request_kinds;
pub mod sglang;
pub mod tls;
pub mod vllm;

pub use backend::*;
pub use engine::*;
pub use process::*;
pub use qwen3::*;

/// The project's test fixtures directory (`tests/fixtures`).
pub fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

/// The lowercase hex SHA-256 of `s`: how the config names an API key (`api_key_sha256`).
pub fn sha256_hex(s: &str) -> String {
    use sha2::{Digest, Sha256};
    Sha256::digest(s.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A port that was free a moment ago (for processes and sockets that must be told their port).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A free port below the kernel's ephemeral range, for a child process that binds it only
/// seconds later or binds it again after a restart (a real engine, a restarted router).
///
/// A port from [`free_port`] is handed back to the kernel's ephemeral pool, and any outgoing
/// connection or `bind(0)` in the meantime may take it: CI saw vLLM's KV-event socket fail
/// with "Address already in use" 38 s after the port was picked, while vLLM's own processes
/// were connecting to each other. The kernel never assigns a port outside
/// `ip_local_port_range` by itself, so only an explicit bind can take one of these; a
/// process-wide counter (started from the process id, for parallel test processes) keeps two
/// calls from returning the same port.
pub fn quiet_port() -> u16 {
    use std::sync::OnceLock;
    use std::sync::atomic::{AtomicU32, Ordering};
    const LOWEST: u32 = 15_000;
    static NEXT: OnceLock<(AtomicU32, u32)> = OnceLock::new();
    let (next, end) = NEXT.get_or_init(|| {
        let end = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
            .ok()
            .and_then(|s| s.split_whitespace().next()?.parse::<u32>().ok())
            .unwrap_or(32_768);
        let span = end.saturating_sub(LOWEST).max(1);
        (
            AtomicU32::new(std::process::id().wrapping_mul(7_919) % span),
            end,
        )
    });
    let span = end.saturating_sub(LOWEST);
    if span < 1_000 {
        return free_port();
    }
    for _ in 0..span {
        let port = LOWEST + next.fetch_add(1, Ordering::Relaxed) % span;
        let Ok(port) = u16::try_from(port) else {
            continue;
        };
        // Free on every address: engines bind `*` as well as loopback.
        if TcpListener::bind(("0.0.0.0", port)).is_ok()
            && TcpListener::bind(("127.0.0.1", port)).is_ok()
        {
            return port;
        }
    }
    free_port()
}

/// The first of `n` consecutive ports that were free a moment ago, below the ephemeral range
/// (a data-parallel engine publishes rank N's events on its port plus N). All `n` are taken
/// from [`quiet_port`]'s counter, so no later call in this process returns one of them.
pub fn quiet_ports(n: u16) -> u16 {
    loop {
        let first = quiet_port();
        if (1..n).all(|i| first.checked_add(i) == Some(quiet_port())) {
            return first;
        }
    }
}

/// Polls `cond` every 10 ms until it holds or `limit` passes; whether it held.
pub async fn wait_for(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + limit;
    while Instant::now() < end {
        if cond() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    cond()
}

/// Polls `cond` for up to 5 s (see [`wait_for`]).
pub async fn eventually(cond: impl FnMut() -> bool) -> bool {
    wait_for(Duration::from_secs(5), cond).await
}
