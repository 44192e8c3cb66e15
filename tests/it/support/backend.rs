//! Test backends: small OpenAI-style servers on 127.0.0.1 that record what they receive and
//! misbehave on request, plus helpers to start a router in front of them. A backend accepts
//! bodies of any size: the router's body limit is what is under test, not the backend's.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use kvroute::config::Config;
pub use kvroute::policy::PolicyKind;
use kvroute::server::RouterHandle;
use tokio::net::TcpListener;
use tokio::sync::Notify;

/// One request a backend received.
#[derive(Clone, Debug)]
pub struct Received {
    pub path: String,
    /// The method and the query (any path beyond completions and chat is answered by
    /// [`any_path`], which records them).
    pub method: String,
    pub query: Option<String>,
    pub headers: HeaderMap,
    pub body: Bytes,
}

/// How a backend behaves; change it at any time.
#[derive(Clone, Debug)]
pub struct Behavior {
    /// Answer every completion with this status and an error body.
    pub fail_status: Option<u16>,
    /// Answer completions whose body contains this text with this status and an error body
    /// (an engine failing on one prompt, not on every request).
    pub fail_on: Option<(String, u16)>,
    /// Content chunks per stream.
    pub chunks: usize,
    /// Pause before each content chunk.
    pub chunk_delay: Duration,
    /// Before the last chunk, wait until the test calls `release()`.
    pub hold_last_chunk: bool,
    /// Stream the first chunk, then break the connection.
    pub break_mid_stream: bool,
    /// Stream the first chunk, then an in-band SSE error event (as vLLM and SGLang do when
    /// generation fails after the 200 head), then end the stream.
    pub error_event_mid_stream: bool,
    /// Open the stream (a chat's role chunk), then send an in-band SSE error event before any
    /// content (vLLM 0.32.0 answers a streamed decode whose KV load failed so), then end it.
    pub error_event_first: bool,
    /// Status of GET /health.
    pub health_status: u16,
    /// (adapter, base model) pairs: `GET /v1/models` lists these models with the base as
    /// `parent`, as vLLM lists LoRA adapters.
    pub adapters: Vec<(String, String)>,
}

impl Default for Behavior {
    fn default() -> Self {
        Behavior {
            fail_status: None,
            fail_on: None,
            chunks: 3,
            chunk_delay: Duration::ZERO,
            hold_last_chunk: false,
            break_mid_stream: false,
            error_event_mid_stream: false,
            error_event_first: false,
            health_status: 200,
            adapters: Vec::new(),
        }
    }
}

pub struct BackendState {
    pub name: String,
    pub models: Vec<String>,
    pub received: Mutex<Vec<Received>>,
    pub behavior: Mutex<Behavior>,
    pub gate: Notify,
    /// Streams whose body was dropped before it was finished (client or router hung up).
    pub streams_cancelled: AtomicUsize,
    pub streams_completed: AtomicUsize,
}

/// A running test backend.
pub struct Backend {
    pub addr: SocketAddr,
    pub state: Arc<BackendState>,
    task: tokio::task::JoinHandle<()>,
}

impl Backend {
    pub async fn start(name: &str, models: &[&str]) -> Backend {
        Backend::start_on(SocketAddr::from(([127, 0, 0, 1], 0)), name, models).await
    }

    /// A backend listening on `addr` (another loopback address, a chosen port).
    pub async fn start_on(addr: SocketAddr, name: &str, models: &[&str]) -> Backend {
        let state = Arc::new(BackendState {
            name: name.into(),
            models: models.iter().map(|m| m.to_string()).collect(),
            received: Mutex::new(Vec::new()),
            behavior: Mutex::new(Behavior::default()),
            gate: Notify::new(),
            streams_cancelled: AtomicUsize::new(0),
            streams_completed: AtomicUsize::new(0),
        });
        let app = Router::new()
            .route("/v1/completions", post(completion))
            .route("/v1/chat/completions", post(completion))
            .route("/v1/models", get(models_list))
            .route("/health", get(health))
            .fallback(any_path)
            .layer(DefaultBodyLimit::disable())
            .with_state(Arc::clone(&state));
        let listener = TcpListener::bind(addr).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Backend { addr, state, task }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn set(&self, f: impl FnOnce(&mut Behavior)) {
        f(&mut self.state.behavior.lock().unwrap());
    }

    pub fn received(&self) -> Vec<Received> {
        self.state.received.lock().unwrap().clone()
    }

    pub fn count(&self) -> usize {
        self.state.received.lock().unwrap().len()
    }

    pub fn release(&self) {
        self.state.gate.notify_waiters();
        self.state.gate.notify_one();
    }
}

impl Drop for Backend {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn health(State(s): State<Arc<BackendState>>) -> StatusCode {
    let code = s.behavior.lock().unwrap().health_status;
    StatusCode::from_u16(code).unwrap()
}

async fn models_list(State(s): State<Arc<BackendState>>) -> Response {
    let adapters = s.behavior.lock().unwrap().adapters.clone();
    let parent = |m: &String| {
        adapters
            .iter()
            .find(|(a, _)| a == m)
            .map(|(_, b)| b.clone())
    };
    let data: Vec<_> = s
        .models
        .iter()
        .map(|m| serde_json::json!({"id": m, "object": "model", "parent": parent(m)}))
        .collect();
    axum::Json(serde_json::json!({"object": "list", "data": data})).into_response()
}

/// Any other API path (under `/v1/` or `/v2/`, or an engine's own endpoint such as
/// `/tokenize`) and method: recorded, answered 200 with what was asked (`{"backend", "method",
/// "path", "query"}`), or with `fail_status` when set. Anything else (`/metrics` the router's
/// load reader asks for, …) is a 404, unrecorded.
async fn any_path(
    State(s): State<Arc<BackendState>>,
    method: axum::http::Method,
    uri: axum::http::Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    const ENGINE_PATHS: [&str; 6] = [
        "/tokenize",
        "/detokenize",
        "/rerank",
        "/score",
        "/classify",
        "/pooling",
    ];
    let path = uri.path();
    if !(path.starts_with("/v1/") || path.starts_with("/v2/") || ENGINE_PATHS.contains(&path)) {
        return StatusCode::NOT_FOUND.into_response();
    }
    s.received.lock().unwrap().push(Received {
        path: uri.path().to_string(),
        method: method.to_string(),
        query: uri.query().map(str::to_owned),
        headers,
        body,
    });
    if let Some(code) = s.behavior.lock().unwrap().fail_status {
        return (
            StatusCode::from_u16(code).unwrap(),
            [("content-type", "application/json")],
            format!(
                "{{\"error\":{{\"message\":\"{} failed\",\"type\":\"server_error\"}}}}",
                s.name
            ),
        )
            .into_response();
    }
    axum::Json(
        serde_json::json!({"backend": s.name, "method": method.as_str(),
        "path": uri.path(), "query": uri.query()}),
    )
    .into_response()
}

/// Counts a stream as cancelled unless it was marked complete.
struct StreamGuard {
    state: Arc<BackendState>,
    done: bool,
}

impl Drop for StreamGuard {
    fn drop(&mut self) {
        if self.done {
            self.state.streams_completed.fetch_add(1, Ordering::SeqCst);
        } else {
            self.state.streams_cancelled.fetch_add(1, Ordering::SeqCst);
        }
    }
}

async fn completion(
    State(s): State<Arc<BackendState>>,
    uri: axum::http::Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    s.received.lock().unwrap().push(Received {
        path: uri.path().to_string(),
        method: "POST".into(),
        query: uri.query().map(str::to_owned),
        headers: headers.clone(),
        body: body.clone(),
    });
    let b = s.behavior.lock().unwrap().clone();
    let fail_on = b.fail_on.as_ref().filter(|(text, _)| {
        body.windows(text.len().max(1))
            .any(|w| w == text.as_bytes())
    });
    if let Some(code) = b.fail_status.or(fail_on.map(|(_, code)| *code)) {
        return (
            StatusCode::from_u16(code).unwrap(),
            [("content-type", "application/json")],
            format!(
                "{{\"error\":{{\"message\":\"{} failed\",\"type\":\"server_error\"}}}}",
                s.name
            ),
        )
            .into_response();
    }
    let v: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
    let chat = uri.path().contains("chat");
    let stream = v.get("stream").and_then(|x| x.as_bool()).unwrap_or(false);
    if !stream {
        let text = "hello ".repeat(b.chunks);
        let body = if chat {
            serde_json::json!({"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":text},"finish_reason":"stop"}],"backend": s.name})
        } else {
            serde_json::json!({"id":"x","object":"text_completion","choices":[{"index":0,"text":text,"finish_reason":"stop"}],"backend": s.name})
        };
        return axum::Json(body).into_response();
    }
    let state = Arc::clone(&s);
    let stream = async_stream(state, b, chat);
    Response::builder()
        .header("content-type", "text/event-stream")
        .header("x-backend", s.name.clone())
        .body(Body::from_stream(stream))
        .unwrap()
}

fn async_stream(
    s: Arc<BackendState>,
    b: Behavior,
    chat: bool,
) -> impl futures_util::Stream<Item = Result<Bytes, std::io::Error>> {
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(1);
    tokio::spawn(async move {
        let mut guard = StreamGuard {
            state: Arc::clone(&s),
            done: false,
        };
        let chunk = |i: usize| -> Bytes {
            let ev = if chat {
                serde_json::json!({"choices":[{"index":0,"delta":{"content":format!("tok{i} ")}}]})
            } else {
                serde_json::json!({"choices":[{"index":0,"text":format!("tok{i} ")}]})
            };
            Bytes::from(format!("data: {ev}\n\n"))
        };
        if chat {
            let role = serde_json::json!({"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]});
            if tx
                .send(Ok(Bytes::from(format!("data: {role}\n\n"))))
                .await
                .is_err()
            {
                return;
            }
        }
        if b.error_event_first {
            let ev = serde_json::json!({"error": {"message": "Internal server error",
                "type": "InternalServerError", "param": null, "code": 500}});
            let _ = tx.send(Ok(Bytes::from(format!("data: {ev}\n\n")))).await;
            let _ = tx.send(Ok(Bytes::from_static(b"data: [DONE]\n\n"))).await;
            guard.done = true;
            return;
        }
        for i in 0..b.chunks {
            if !b.chunk_delay.is_zero() {
                tokio::time::sleep(b.chunk_delay).await;
            }
            if b.hold_last_chunk && i + 1 == b.chunks {
                tokio::select! {
                    _ = s.gate.notified() => {}
                    _ = tx.closed() => return,
                }
            }
            if tx.send(Ok(chunk(i))).await.is_err() {
                return;
            }
            if b.break_mid_stream {
                // After the chunk has left: cut at once, and hyper may drop the chunk still in
                // its write buffer, so the client would see the cut before any token (seen under
                // load: the router then rightly treated it as a failure before the first token).
                tokio::time::sleep(Duration::from_millis(300)).await;
                let _ = tx.send(Err(std::io::Error::other("backend died"))).await;
                return;
            }
            if b.error_event_mid_stream {
                let ev = serde_json::json!({"error": {"message": "generation failed",
                    "type": "InternalServerError", "param": null, "code": 500}});
                if tx
                    .send(Ok(Bytes::from(format!("data: {ev}\n\n"))))
                    .await
                    .is_ok()
                {
                    guard.done = true;
                }
                return;
            }
        }
        if tx
            .send(Ok(Bytes::from_static(b"data: [DONE]\n\n")))
            .await
            .is_ok()
        {
            guard.done = true;
        }
    });
    futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|x| (x, rx)) })
}

/// Extra TOML that opens the admin API's changes to loopback clients without a key (the
/// tests' requests come from 127.0.0.1): without a key they are refused otherwise.
pub const ADMIN_ON_LOOPBACK: &str = "[admin]\nopen_on_loopback = true\n";

/// Config for a router in front of `workers` (`(url, models)`), plus extra TOML.
pub fn router_config(policy: PolicyKind, workers: &[(String, Vec<&str>)], extra: &str) -> Config {
    let grace = if extra.contains("shutdown_grace_s") {
        ""
    } else {
        "shutdown_grace_s = 1.0\n"
    };
    let mut text = format!("policy = \"{policy}\"\n{grace}{extra}\n");
    for (i, (url, models)) in workers.iter().enumerate() {
        let models: Vec<String> = models.iter().map(|m| format!("\"{m}\"")).collect();
        text.push_str(&format!(
            "[[workers]]\nid = \"w{i}\"\nurl = \"{url}\"\nmodels = [{}]\n",
            models.join(",")
        ));
    }
    Config::from_toml(&text, Path::new("test")).unwrap()
}

/// Starts a router on an ephemeral port.
pub async fn start_router(config: &Config) -> RouterHandle {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    kvroute::server::start(config, listener).unwrap()
}

/// Starts a router with `policy` in front of `backends`, each serving model "m" (workers `w0`,
/// `w1`, … in order), plus extra TOML.
pub async fn start_router_over(
    policy: PolicyKind,
    backends: &[&Backend],
    extra: &str,
) -> RouterHandle {
    let workers: Vec<(String, Vec<&str>)> = backends.iter().map(|b| (b.url(), vec!["m"])).collect();
    start_router(&router_config(policy, &workers, extra)).await
}

pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(20))
        .build()
        .unwrap()
}

/// Asserts an OpenAI-shaped error with `status`; returns the error object.
pub async fn assert_openai_error(resp: reqwest::Response, status: u16) -> serde_json::Value {
    assert_eq!(resp.status().as_u16(), status);
    let v: serde_json::Value = resp.json().await.expect("error body is JSON");
    let e = v.get("error").expect("has an `error` object").clone();
    assert!(e["message"].as_str().is_some_and(|m| !m.is_empty()), "{e}");
    assert!(e["type"].is_string(), "{e}");
    assert!(e.get("param").is_some() && e.get("code").is_some(), "{e}");
    e
}

/// Requests in flight on every worker as `router` weighs them (its own and, with several
/// replicas, what it learned of the others').
pub fn in_flight_seen(router: &RouterHandle) -> u64 {
    router
        .state
        .fleet
        .workers()
        .iter()
        .map(|w| w.rank(0).load.view().in_flight)
        .sum()
}

/// The router's Prometheus text.
pub async fn metrics_text(addr: SocketAddr) -> String {
    client()
        .get(format!("http://{addr}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

/// POSTs `body` as JSON and parses the JSON answer.
pub async fn post_json(url: &str, body: &serde_json::Value) -> serde_json::Value {
    client()
        .post(url)
        .json(body)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// The workers a `/debug/route` explanation says were left out for their context.
pub fn context_excluded(explained: &serde_json::Value) -> Vec<String> {
    explained["context_excluded"]
        .as_array()
        .map(|ws| {
            ws.iter()
                .filter_map(|w| w.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// `POST /v1/completions` with a JSON body.
pub async fn complete(
    c: &reqwest::Client,
    addr: SocketAddr,
    body: &serde_json::Value,
) -> reqwest::Response {
    c.post(format!("http://{addr}/v1/completions"))
        .json(body)
        .send()
        .await
        .unwrap()
}
