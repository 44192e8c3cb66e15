//! Helpers shared by the integration tests, by concept:
//! - [`backend`]: test backends (small OpenAI-style servers that record what they receive and
//!   misbehave on request) and a router started in front of them;
//! - [`engine`]: simulated engines in this process, publishing KV events over ZeroMQ;
//! - [`kube_api`]: a fake Kubernetes API server (list, watch, bookmarks, 410 Gone, outages)
//!   for the discovery tests;
//! - [`process`]: `kvroute engine` / `kvroute serve` child processes and memory readings;
//! - [`qwen3`]: the Qwen3 tokenizer fixture, loaded once per test binary;
//! - [`vllm`], [`vllm_router`]: real vLLM engines as child processes, kvroute in front of them,
//!   and the exactness check (the `real_vllm*` tests);
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
pub mod tls;
pub mod vllm;
pub mod vllm_router;

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
