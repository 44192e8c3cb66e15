//! A fake Kubernetes API server on 127.0.0.1 for the discovery tests: real HTTP, the pods of one
//! namespace as a list (`GET /api/v1/namespaces/{ns}/pods`) and as a watch stream
//! (`?watch=true`) of newline-delimited JSON events with resource versions, BOOKMARK events,
//! an ERROR event with code 410 (Expired) for a watch from a version older than its history
//! keeps, dropped watch connections, and an outage (connections accepted and dropped at once).
//! It serves every pod whatever the label selector, and records the queries it got. It serves
//! `InferencePool`s (`/apis/inference.networking.k8s.io/v1/…/inferencepools`) the same way,
//! each kind's list and watch showing only that kind's objects.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Path as UrlPath, Query, State};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde_json::{Value, json};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{broadcast, mpsc, watch};

/// One change of the pod set.
#[derive(Clone, Debug)]
struct Change {
    rv: u64,
    kind: &'static str,
    pod: Value,
}

#[derive(Default)]
struct Pods {
    rv: u64,
    pods: BTreeMap<String, Value>,
    history: Vec<Change>,
    /// Watches from a version below this get 410 Gone.
    expired_below: u64,
}

/// What the server served.
#[derive(Default)]
pub struct KubeStats {
    pub lists: AtomicUsize,
    pub watches: AtomicUsize,
    pub gone: AtomicUsize,
    pub bookmarks: AtomicUsize,
    pub refused: AtomicUsize,
    /// Query strings of the lists and watches, in order.
    pub queries: Mutex<Vec<String>>,
}

struct KubeState {
    namespace: String,
    pods: Mutex<Pods>,
    changes: broadcast::Sender<Change>,
    /// Bumped to drop every open watch connection.
    cut: watch::Sender<u64>,
    down: Arc<AtomicBool>,
    stats: KubeStats,
}

/// A running fake API server.
pub struct FakeKube {
    pub addr: SocketAddr,
    state: Arc<KubeState>,
    task: tokio::task::JoinHandle<()>,
}

/// Accepts connections, dropping them at once while the server is "down".
struct Flaky {
    inner: TcpListener,
    down: Arc<AtomicBool>,
    state: Arc<KubeState>,
}

impl axum::serve::Listener for Flaky {
    type Io = TcpStream;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (TcpStream, SocketAddr) {
        loop {
            if let Ok((s, a)) = self.inner.accept().await {
                if self.down.load(Ordering::SeqCst) {
                    self.state.stats.refused.fetch_add(1, Ordering::SeqCst);
                    drop(s);
                    continue;
                }
                return (s, a);
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.inner.local_addr()
    }
}

impl FakeKube {
    /// Starts serving the (empty) namespace `namespace`.
    pub async fn start(namespace: &str) -> FakeKube {
        let down = Arc::new(AtomicBool::new(false));
        let state = Arc::new(KubeState {
            namespace: namespace.into(),
            pods: Mutex::new(Pods {
                rv: 100,
                ..Pods::default()
            }),
            changes: broadcast::channel(1024).0,
            cut: watch::channel(0).0,
            down: Arc::clone(&down),
            stats: KubeStats::default(),
        });
        let app = Router::new()
            .route("/api/v1/namespaces/{ns}/pods", get(pods))
            .route(
                "/apis/inference.networking.k8s.io/v1/namespaces/{ns}/inferencepools",
                get(pools),
            )
            .with_state(Arc::clone(&state));
        let inner = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = inner.local_addr().unwrap();
        let listener = Flaky {
            inner,
            down,
            state: Arc::clone(&state),
        };
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        FakeKube { addr, state, task }
    }

    /// Writes a kubeconfig naming this server (plain HTTP, a token, `namespace` as the
    /// context's) into `dir`; returns its path.
    pub fn kubeconfig(&self, dir: &Path) -> PathBuf {
        let path = dir.join("kubeconfig");
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: http://{}\n\
             contexts:\n- name: fake\n  context:\n    cluster: fake\n    user: fake\n    namespace: {}\n\
             current-context: fake\nusers:\n- name: fake\n  user:\n    token: test-token\n",
            self.addr, self.state.namespace
        );
        std::fs::write(&path, text).unwrap();
        path
    }

    /// Adds or replaces `pod` (a pod object, or any object with a `kind`; its kind and name
    /// are its key).
    pub fn put(&self, mut pod: Value) {
        if pod["kind"].is_null() {
            pod["kind"] = json!("Pod");
        }
        let name = key(
            pod["kind"].as_str().unwrap(),
            pod["metadata"]["name"].as_str().unwrap(),
        );
        let mut p = self.state.pods.lock().unwrap();
        p.rv += 1;
        pod["metadata"]["resourceVersion"] = json!(p.rv.to_string());
        let kind = if p.pods.contains_key(&name) {
            "MODIFIED"
        } else {
            "ADDED"
        };
        p.pods.insert(name, pod.clone());
        self.record(&mut p, kind, pod);
    }

    /// Deletes the pod `name`.
    pub fn delete(&self, name: &str) {
        let mut p = self.state.pods.lock().unwrap();
        let Some(mut pod) = p.pods.remove(&key("Pod", name)) else {
            return;
        };
        p.rv += 1;
        pod["metadata"]["resourceVersion"] = json!(p.rv.to_string());
        self.record(&mut p, "DELETED", pod);
    }

    fn record(&self, p: &mut Pods, kind: &'static str, pod: Value) {
        let change = Change {
            rv: p.rv,
            kind,
            pod,
        };
        p.history.push(change.clone());
        let _ = self.state.changes.send(change);
    }

    /// Down: every open watch is dropped and new connections are closed at once. Up: served
    /// again.
    pub fn set_down(&self, down: bool) {
        self.state.down.store(down, Ordering::SeqCst);
        if down {
            self.cut_watches();
        }
    }

    /// Drops every open watch connection mid-stream.
    pub fn cut_watches(&self) {
        self.state.cut.send_modify(|n| *n += 1);
    }

    /// Forgets the history (as etcd compaction does): a watch resuming from an older version
    /// gets 410 Gone and must list again.
    pub fn expire_history(&self) {
        let mut p = self.state.pods.lock().unwrap();
        p.expired_below = p.rv + 1;
        p.history.clear();
    }

    pub fn stats(&self) -> &KubeStats {
        &self.state.stats
    }
}

impl Drop for FakeKube {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn key(kind: &str, name: &str) -> String {
    format!("{kind}/{name}")
}

/// An `InferencePool` selecting the pods labelled `app: engine`, with `ports` as its
/// `targetPorts`.
pub fn pool_json(namespace: &str, name: &str, ports: &[u16]) -> Value {
    let ports: Vec<Value> = ports.iter().map(|p| json!({"number": p})).collect();
    json!({
        "apiVersion": "inference.networking.k8s.io/v1",
        "kind": "InferencePool",
        "metadata": {"name": name, "namespace": namespace, "uid": format!("uid-pool-{name}")},
        "spec": {"selector": {"matchLabels": {"app": "engine"}}, "targetPorts": ports},
    })
}

/// A pod of the namespace: Running with `ready`, at `ip`, its engine's HTTP port named `http`.
pub fn pod_json(namespace: &str, name: &str, ip: &str, ready: bool, http_port: u16) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": format!("uid-{name}-{ip}"),
            "labels": {"app": "engine"},
        },
        "spec": {"containers": [{
            "name": "engine",
            "ports": [{"name": "http", "containerPort": http_port, "protocol": "TCP"}],
        }]},
        "status": {
            "phase": "Running",
            "podIP": ip,
            "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}],
        },
    })
}

async fn pods(
    state: State<Arc<KubeState>>,
    ns: UrlPath<String>,
    q: Query<BTreeMap<String, String>>,
    uri: axum::http::Uri,
) -> Response {
    objects("Pod", state, ns, q, uri)
}

async fn pools(
    state: State<Arc<KubeState>>,
    ns: UrlPath<String>,
    q: Query<BTreeMap<String, String>>,
    uri: axum::http::Uri,
) -> Response {
    objects("InferencePool", state, ns, q, uri)
}

/// The list or watch of the objects of `kind`.
fn objects(
    kind: &'static str,
    State(s): State<Arc<KubeState>>,
    UrlPath(ns): UrlPath<String>,
    Query(q): Query<BTreeMap<String, String>>,
    uri: axum::http::Uri,
) -> Response {
    s.stats
        .queries
        .lock()
        .unwrap()
        .push(uri.query().unwrap_or_default().to_owned());
    if ns != s.namespace {
        return (axum::http::StatusCode::NOT_FOUND, "no such namespace").into_response();
    }
    if q.get("watch").is_some_and(|w| w == "true" || w == "1") {
        let from: u64 = q
            .get("resourceVersion")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        return watch_pods(s, from, kind);
    }
    s.stats.lists.fetch_add(1, Ordering::SeqCst);
    let p = s.pods.lock().unwrap();
    let list = json!({
        "apiVersion": "v1",
        "kind": format!("{kind}List"),
        "metadata": {"resourceVersion": p.rv.to_string()},
        "items": p.pods.values().filter(|o| o["kind"] == kind).cloned().collect::<Vec<_>>(),
    });
    axum::Json(list).into_response()
}

fn line(v: &Value) -> Result<Bytes, std::io::Error> {
    let mut text = serde_json::to_vec(v).unwrap();
    text.push(b'\n');
    Ok(Bytes::from(text))
}

fn event(c: &Change) -> Value {
    json!({"type": c.kind, "object": c.pod})
}

/// A watch from version `from`: the changes after it, then new ones as they come, a bookmark
/// every 200 ms; 410 Gone when `from` is older than the history.
fn watch_pods(s: Arc<KubeState>, from: u64, kind: &'static str) -> Response {
    s.stats.watches.fetch_add(1, Ordering::SeqCst);
    let (tx, rx) = mpsc::channel::<Result<Bytes, std::io::Error>>(256);
    let (backlog, mut changes, expired, now) = {
        let p = s.pods.lock().unwrap();
        let changes = s.changes.subscribe();
        let backlog: Vec<Change> = p
            .history
            .iter()
            .filter(|c| c.rv > from && c.pod["kind"] == kind)
            .cloned()
            .collect();
        (backlog, changes, from < p.expired_below, p.rv)
    };
    let mut cut = s.cut.subscribe();
    tokio::spawn(async move {
        if expired {
            s.stats.gone.fetch_add(1, Ordering::SeqCst);
            let status = json!({"type": "ERROR", "object": {
                "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": format!("too old resource version: {from} ({now})"),
                "reason": "Expired", "code": 410,
            }});
            let _ = tx.send(line(&status)).await;
            return;
        }
        let mut last = from;
        for c in backlog {
            last = c.rv;
            if tx.send(line(&event(&c))).await.is_err() {
                return;
            }
        }
        let mut beat = tokio::time::interval(Duration::from_millis(200));
        loop {
            tokio::select! {
                c = changes.recv() => match c {
                    Ok(c) if c.rv > last && c.pod["kind"] == kind => {
                        last = c.rv;
                        if tx.send(line(&event(&c))).await.is_err() {
                            return;
                        }
                    }
                    Ok(_) => {}
                    Err(_) => return,
                },
                _ = cut.changed() => {
                    let _ = tx.send(Err(std::io::Error::other("connection cut"))).await;
                    return;
                }
                _ = beat.tick() => {
                    s.stats.bookmarks.fetch_add(1, Ordering::SeqCst);
                    let bookmark = json!({"type": "BOOKMARK", "object": {
                        "kind": kind, "apiVersion": "v1",
                        "metadata": {"resourceVersion": last.to_string()},
                    }});
                    if tx.send(line(&bookmark)).await.is_err() {
                        return;
                    }
                }
            }
        }
    });
    let stream =
        futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|x| (x, rx)) });
    Response::builder()
        .header("content-type", "application/json")
        .body(Body::from_stream(stream))
        .unwrap()
}
