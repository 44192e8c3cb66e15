//! A stand-in for the Hugging Face hub's file API on 127.0.0.1, for the tokenizer fetch
//! (`kvroute::tokens::hub`), since the hub itself is not reachable from the tests.
//!
//! It answers what `hf-hub` 0.4 asks, as the hub does:
//! - `GET /{org}/{name}/resolve/{revision}/{file}` with `Range: bytes=0-0` first (the file's
//!   metadata: `X-Repo-Commit`, `ETag`, `Content-Range: bytes 0-0/SIZE`), then with the range
//!   of each chunk; a file stored in LFS (here `tokenizer.json`) is answered with a 302 to
//!   another host (`localhost` instead of `127.0.0.1`, as the hub sends to its CDN), with
//!   `X-Linked-Etag`, and the CDN answers the ranges;
//! - 401 for a repository it does not know or a gated one asked without its token (the hub
//!   says 401 for both, so that private names do not leak), 404 for a file the repository
//!   lacks.
//!
//! Every request is counted, so a test can tell that a start used the cache.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::Router;
use axum::extract::{Path as UrlPath, State};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use http::{HeaderMap, StatusCode, header};
use sha2::Digest;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// The commit every repository of the stand-in is at.
pub const COMMIT: &str = "0123456789abcdef0123456789abcdef01234567";

/// One repository: its files, and the token it needs when gated.
#[derive(Clone, Default)]
pub struct HubRepo {
    pub files: HashMap<String, Vec<u8>>,
    pub token: Option<String>,
}

impl HubRepo {
    /// The files of a local tokenizer directory (`tokenizer.json`, `tokenizer_config.json`,
    /// `chat_template.jinja`, those it has).
    pub fn from_dir(dir: &Path) -> HubRepo {
        let mut files = HashMap::new();
        for name in [
            "tokenizer.json",
            "tokenizer_config.json",
            "chat_template.jinja",
        ] {
            if let Ok(bytes) = std::fs::read(dir.join(name)) {
                files.insert(name.to_owned(), bytes);
            }
        }
        HubRepo { files, token: None }
    }
}

struct Shared {
    repos: HashMap<String, HubRepo>,
    requests: AtomicUsize,
    port: u16,
}

/// The running stand-in; stopped by [`FakeHub::stop`].
pub struct FakeHub {
    pub addr: SocketAddr,
    shared: Arc<Shared>,
    stop: CancellationToken,
    task: JoinHandle<()>,
}

impl FakeHub {
    /// Serves `repos` (by id, `ORG/NAME`) on a free loopback port.
    pub async fn start(repos: HashMap<String, HubRepo>) -> FakeHub {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let shared = Arc::new(Shared {
            repos,
            requests: AtomicUsize::new(0),
            port: addr.port(),
        });
        let app = Router::new()
            .route("/{org}/{name}/resolve/{revision}/{file}", get(resolve))
            .route("/cdn/{org}/{name}/{file}", get(cdn))
            .with_state(Arc::clone(&shared));
        let stop = CancellationToken::new();
        let until = stop.clone();
        let task = tokio::spawn(async move {
            axum::serve(listener, app)
                .with_graceful_shutdown(async move { until.cancelled().await })
                .await
                .unwrap();
        });
        FakeHub {
            addr,
            shared,
            stop,
            task,
        }
    }

    /// `HF_ENDPOINT` for it.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Requests answered so far.
    pub fn requests(&self) -> usize {
        self.shared.requests.load(Ordering::SeqCst)
    }

    /// Stops listening and waits until it has.
    pub async fn stop(self) {
        self.stop.cancel();
        let _ = self.task.await;
    }
}

/// The hub's error answer, with its `X-Error-Code`.
fn refuse(status: StatusCode, code: &str) -> Response {
    (status, [("x-error-code", code.to_owned())], code.to_owned()).into_response()
}

async fn resolve(
    State(shared): State<Arc<Shared>>,
    UrlPath((org, name, _revision, file)): UrlPath<(String, String, String, String)>,
    headers: HeaderMap,
) -> Response {
    shared.requests.fetch_add(1, Ordering::SeqCst);
    let Some(repo) = shared.repos.get(&format!("{org}/{name}")) else {
        return refuse(StatusCode::UNAUTHORIZED, "RepoNotFound");
    };
    if let Some(token) = &repo.token {
        let sent = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok());
        if sent != Some(&format!("Bearer {token}")) {
            return refuse(StatusCode::UNAUTHORIZED, "GatedRepo");
        }
    }
    let Some(bytes) = repo.files.get(&file) else {
        return refuse(StatusCode::NOT_FOUND, "EntryNotFound");
    };
    let etag = format!("\"{}\"", hex(&sha2::Sha256::digest(bytes)));
    if file == "tokenizer.json" {
        // Stored in LFS: the hub sends the client to its CDN, another host.
        let location = format!("http://localhost:{}/cdn/{org}/{name}/{file}", shared.port);
        return (
            StatusCode::FOUND,
            [
                (header::LOCATION.as_str(), location),
                ("x-repo-commit", COMMIT.to_owned()),
                ("x-linked-etag", etag),
                ("x-linked-size", bytes.len().to_string()),
            ],
        )
            .into_response();
    }
    ranged(bytes, &headers, &etag)
}

async fn cdn(
    State(shared): State<Arc<Shared>>,
    UrlPath((org, name, file)): UrlPath<(String, String, String)>,
    headers: HeaderMap,
) -> Response {
    shared.requests.fetch_add(1, Ordering::SeqCst);
    let Some(bytes) = shared
        .repos
        .get(&format!("{org}/{name}"))
        .and_then(|r| r.files.get(&file))
    else {
        return refuse(StatusCode::NOT_FOUND, "NoSuchKey");
    };
    let etag = format!("\"{}\"", hex(&sha2::Sha256::digest(bytes)));
    ranged(bytes, &headers, &etag)
}

/// `bytes`, or the range the request asks for (its end clamped to the file, as HTTP says).
fn ranged(bytes: &[u8], headers: &HeaderMap, etag: &str) -> Response {
    let len = bytes.len();
    let range = headers
        .get(header::RANGE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("bytes="))
        .and_then(|v| v.split_once('-'))
        .and_then(|(a, b)| Some((a.parse::<usize>().ok()?, b.parse::<usize>().ok()?)));
    let common = [
        ("x-repo-commit", COMMIT.to_owned()),
        (header::ETAG.as_str(), etag.to_owned()),
    ];
    match range {
        None => (StatusCode::OK, common, bytes.to_vec()).into_response(),
        Some((start, _)) if start >= len => StatusCode::RANGE_NOT_SATISFIABLE.into_response(),
        Some((start, end)) => {
            let end = end.min(len - 1);
            let mut response = (
                StatusCode::PARTIAL_CONTENT,
                common,
                bytes[start..=end].to_vec(),
            )
                .into_response();
            response.headers_mut().insert(
                header::CONTENT_RANGE,
                format!("bytes {start}-{end}/{len}").parse().unwrap(),
            );
            response
        }
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
