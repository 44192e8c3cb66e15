//! Helpers shared by the integration tests, by concept:
//! - [`backend`]: test backends (small OpenAI-style servers that record what they receive and
//!   misbehave on request) and a router started in front of them;
//! - [`engine`]: simulated engines in this process, publishing KV events over ZeroMQ;
//! - [`kube_api`]: a fake Kubernetes API server (list, watch, bookmarks, 410 Gone, outages)
//!   for the discovery tests;
//! - [`process`]: `kvroute engine` / `kvroute serve` child processes and memory readings;
//! - [`qwen3`]: the Qwen3 tokenizer fixture, loaded once per test binary;
//! - [`real_engine`]: what real engines share as child processes (cache, ports, process
//!   group, readiness, stop by id); [`vllm`] and [`sglang`] launch vLLM and SGLang with it;
//! - [`real_router`], [`request_kinds`]: kvroute in front of real engines, the exactness
//!   check and the request kinds it is made on; [`real_scenarios`]: eviction, tenants, the SDK,
//!   routing and restarts on either engine (the `real_vllm*` and `real_sglang*` tests);
//! - here: the fixtures directory, free ports, and polling until a condition holds.
//!
//! Everything is re-exported here, so a test writes `use crate::support::*;` or names the
//! helpers it needs.

use std::net::TcpListener;
use std::path::PathBuf;
use std::time::{Duration, Instant};

pub mod backend;
pub mod engine;
pub mod kube_api;
pub mod process;
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

/// A port that was free a moment ago (for processes and sockets that must be told their port).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
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
