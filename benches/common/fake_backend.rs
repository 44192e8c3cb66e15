//! What the latency benches put around a router: a fast fake engine (answers a completion at
//! once, so what is measured is the router's own cost), free ports, and router processes
//! killed when dropped.

use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};

use axum::Router;
use axum::routing::{get, post};
use tokio::net::TcpListener;

/// A completion's answer.
pub const ANSWER: &str = r#"{"id":"c","object":"text_completion","choices":[{"index":0,"text":"hi","finish_reason":"length"}],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}"#;
const MODELS: &str =
    r#"{"object":"list","data":[{"id":"m","object":"model","owned_by":"bench","root":"m"}]}"#;

/// The fake engine's routes: completions and chat answered with [`ANSWER`], `/v1/models`
/// naming model `m`, `/health`.
pub fn backend() -> Router {
    let answer = || async { ([("content-type", "application/json")], ANSWER) };
    Router::new()
        .route("/v1/completions", post(answer))
        .route("/v1/chat/completions", post(answer))
        .route(
            "/v1/models",
            get(|| async { ([("content-type", "application/json")], MODELS) }),
        )
        .route("/health", get(|| async { "ok" }))
}

/// Serves [`backend`] on a new loopback port; its address.
pub async fn serve_backend() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move { axum::serve(listener, backend()).await });
    addr
}

/// A loopback address nobody listens on (yet).
pub fn free_addr() -> SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr")
}

/// A router process, killed when dropped.
pub struct Process(Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `command` with no terminal I/O, as a [`Process`] killed when dropped.
pub fn spawn_quiet(command: &mut Command, what: &str) -> Process {
    let child = command
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    Process(child)
}
