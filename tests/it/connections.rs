//! Client connections that do no work are closed (issue 14, item 1): a connection that sends
//! nothing, only part of the HTTP/2 preface, the whole preface and then nothing, an idle
//! HTTP/2 connection after a request, and an idle HTTP/1 keep-alive connection. Over
//! `server.max_connections`, new connections are closed at once and counted. An idle client
//! does not hold graceful shutdown for the grace period.
//!
//! Real sockets on 127.0.0.1 against a real router; deadlines are generous polls, never
//! timing assertions.

use std::net::SocketAddr;
use std::time::Duration;

use http_body_util::{BodyExt, Empty};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::support::*;

/// The HTTP/2 connection preface (RFC 9113 §3.4).
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// An empty SETTINGS frame: the rest of a client's preface.
const EMPTY_SETTINGS: &[u8] = &[0, 0, 0, 4, 0, 0, 0, 0, 0];

/// Whether the server closes `stream` (EOF or reset) within `limit`; whatever it sends first
/// (an HTTP/2 SETTINGS or GOAWAY frame) is read and ignored.
async fn closed_by_server(stream: &mut TcpStream, limit: Duration) -> bool {
    let mut buf = [0u8; 4096];
    tokio::time::timeout(limit, async {
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await
    .is_ok()
}

async fn connect(addr: SocketAddr, send: &[u8]) -> TcpStream {
    let mut s = TcpStream::connect(addr).await.unwrap();
    if !send.is_empty() {
        s.write_all(send).await.unwrap();
    }
    s
}

/// An HTTP/1.1 keep-alive connection that has had one answered request.
async fn h1_after_one_request(addr: SocketAddr) -> TcpStream {
    let mut s = connect(addr, b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n").await;
    let mut got = Vec::new();
    let mut buf = [0u8; 1024];
    while !got.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = s.read(&mut buf).await.unwrap();
        assert!(n > 0, "the router answers /health");
        got.extend_from_slice(&buf[..n]);
    }
    assert!(
        got.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&got)
    );
    s
}

/// An HTTP/2 client connection (hyper's) that has had one answered request; the returned task
/// ends when the server closes the connection.
async fn h2_after_one_request(addr: SocketAddr) -> tokio::task::JoinHandle<()> {
    let tcp = TcpStream::connect(addr).await.unwrap();
    let (mut send, conn) = hyper::client::conn::http2::handshake::<_, _, Empty<bytes::Bytes>>(
        TokioExecutor::new(),
        TokioIo::new(tcp),
    )
    .await
    .unwrap();
    let driver = tokio::spawn(async move {
        let _ = conn.await;
    });
    let req = http::Request::get(format!("http://{addr}/health"))
        .body(Empty::new())
        .unwrap();
    let resp = send.send_request(req).await.unwrap();
    assert_eq!(resp.status(), 200);
    let _ = resp.into_body().collect().await.unwrap();
    // Keep the sender alive with the driver: a dropped sender closes the connection itself.
    tokio::spawn(async move {
        let _keep = send;
        std::future::pending::<()>().await;
    });
    driver
}

async fn health_ok(addr: SocketAddr) -> bool {
    client()
        .get(format!("http://{addr}/health"))
        .send()
        .await
        .is_ok_and(|r| r.status().is_success())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_without_work_are_closed() {
    let backend = Backend::start("b0", &["m"]).await;
    let router = start_router_over(
        PolicyKind::RoundRobin,
        &[&backend],
        "[server]\nheader_read_timeout_s = 1.0\nidle_timeout_s = 1.0\n",
    )
    .await;
    let addr = router.addr;
    let limit = Duration::from_secs(15);

    let mut silent = connect(addr, b"").await;
    let mut p_only = connect(addr, b"P").await;
    let mut preface = connect(addr, &[H2_PREFACE, EMPTY_SETTINGS].concat()).await;
    let mut h1_idle = h1_after_one_request(addr).await;
    let h2_idle = h2_after_one_request(addr).await;

    assert!(
        closed_by_server(&mut silent, limit).await,
        "silent connection"
    );
    assert!(closed_by_server(&mut p_only, limit).await, "`P` only");
    assert!(
        closed_by_server(&mut preface, limit).await,
        "HTTP/2 preface, no request"
    );
    assert!(
        closed_by_server(&mut h1_idle, limit).await,
        "idle HTTP/1 keep-alive"
    );
    assert!(
        tokio::time::timeout(limit, h2_idle).await.is_ok(),
        "idle HTTP/2 connection after a request"
    );

    let m = &router.state.metrics;
    assert!(eventually(|| m.connections.open.get() == 0).await);
    let closed = |reason: &str| m.connections.closed.with_label_values(&[reason]).get();
    assert!(
        closed("first_request_timeout") >= 3,
        "{}",
        closed("first_request_timeout")
    );
    assert!(closed("idle") >= 1, "{}", closed("idle"));
    assert!(
        health_ok(addr).await,
        "/health answers after idle connections expire"
    );
    router.shutdown().await;
}

/// A connection with a request in progress: a streaming completion its worker holds.
async fn busy(addr: SocketAddr) -> TcpStream {
    let body = br#"{"model":"m","prompt":"x","stream":true}"#;
    let head = format!(
        "POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    connect(addr, &[head.as_bytes(), body].concat()).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_over_the_cap_are_closed_and_counted() {
    let backend = Backend::start("b0", &["m"]).await;
    backend.set(|b| b.hold_last_chunk = true);
    let router = start_router_over(
        PolicyKind::RoundRobin,
        &[&backend],
        "[server]\nmax_connections = 4\nheader_read_timeout_s = 60.0\n",
    )
    .await;
    let addr = router.addr;
    let m = router.state.metrics.clone();

    // Four connections with work in progress: none can make room (idle ones would be evicted).
    let mut held = Vec::new();
    for _ in 0..4 {
        held.push(busy(addr).await);
    }
    let w = router.state.fleet.workers()[0].clone();
    assert!(eventually(|| w.in_flight() == 4).await, "{}", w.in_flight());
    assert!(
        eventually(|| m.connections.open.get() == 4).await,
        "gauge {}",
        m.connections.open.get()
    );
    for i in 0..3 {
        let mut extra = connect(addr, b"").await;
        assert!(
            closed_by_server(&mut extra, Duration::from_secs(10)).await,
            "connection {} over the cap is closed",
            i + 5
        );
    }
    assert_eq!(m.connections.refused.get(), 3);
    assert_eq!(m.connections.open.get(), 4);

    // Room again once the held ones go.
    backend.release();
    drop(held);
    assert!(eventually(|| m.connections.open.get() == 0).await);
    assert!(health_ok(addr).await);
    let text = metrics_text(addr).await;
    assert!(
        text.contains("kvroute_connections_refused_total 3"),
        "{text}"
    );
    router.shutdown().await;
}

/// An idle HTTP/2 client (one that never answers the GOAWAY's ping, and a well-behaved one),
/// a half-sent preface and an idle HTTP/1 connection do not hold shutdown for the grace
/// period: the router stops well before it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_clients_do_not_hold_shutdown() {
    let backend = Backend::start("b0", &["m"]).await;
    let router = start_router_over(
        PolicyKind::RoundRobin,
        &[&backend],
        "[server]\nshutdown_grace_s = 60.0\nheader_read_timeout_s = 60.0\nidle_timeout_s = 60.0\n",
    )
    .await;
    let addr = router.addr;
    let mut raw_h2 = connect(addr, &[H2_PREFACE, EMPTY_SETTINGS].concat()).await;
    // Wait until the router has answered the preface with its SETTINGS: the connection is
    // HTTP/2 now. The client never reads again, so it never answers a ping.
    let mut buf = [0u8; 64];
    let n = tokio::time::timeout(Duration::from_secs(10), raw_h2.read(&mut buf))
        .await
        .expect("the router answers the preface")
        .unwrap();
    assert!(n > 0);
    let _p_only = connect(addr, b"P").await;
    let _h1 = h1_after_one_request(addr).await;
    let _h2 = h2_after_one_request(addr).await;
    let m = router.state.metrics.clone();
    assert!(eventually(|| m.connections.open.get() == 4).await);

    let stopped = tokio::time::timeout(Duration::from_secs(20), router.shutdown()).await;
    assert!(
        stopped.is_ok(),
        "shutdown waited for idle connections (grace 60 s)"
    );
}

/// Issue 35 item 1: at `max_connections`, a cap's worth of silent connections locked every
/// other client out until `header_read_timeout_s` (75 s by default). A new client now takes
/// the place of the connection that has done nothing the longest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_client_at_the_cap_takes_the_place_of_a_silent_connection() {
    let backend = Backend::start("b0", &["m"]).await;
    let router = start_router_over(
        PolicyKind::RoundRobin,
        &[&backend],
        "[server]\nmax_connections = 4\nheader_read_timeout_s = 60.0\n",
    )
    .await;
    let addr = router.addr;
    let m = router.state.metrics.clone();
    let mut silent = Vec::new();
    for _ in 0..4 {
        silent.push(connect(addr, b"").await);
    }
    assert!(
        eventually(|| m.connections.open.get() == 4).await,
        "gauge {}",
        m.connections.open.get()
    );
    for i in 0..3 {
        assert!(
            health_ok(addr).await,
            "client {i} was locked out at the cap"
        );
    }
    let evicted = m.connections.closed.with_label_values(&["evicted"]).get();
    assert!(evicted >= 1, "{evicted}");
    assert_eq!(m.connections.refused.get(), 0);
    // The oldest silent one went first.
    assert!(closed_by_server(&mut silent[0], Duration::from_secs(10)).await);
    router.shutdown().await;
}

/// Issue 35 item 1, per client: at the cap, the idle connections of the client holding the
/// most are evicted first, so a client opening silent connections makes room out of its own,
/// not out of another client's older keep-alive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_the_cap_the_client_with_the_most_idle_connections_gives_way() {
    let backend = Backend::start("b0", &["m"]).await;
    let router = start_router_over(
        PolicyKind::RoundRobin,
        &[&backend],
        "[server]\nmax_connections = 4\nheader_read_timeout_s = 60.0\nidle_timeout_s = 60.0\n",
    )
    .await;
    let addr = router.addr;
    let m = router.state.metrics.clone();
    // A client's keep-alive, idle after its request: the oldest connection.
    let mut keep_alive = h1_after_one_request(addr).await;
    // Another client's silent connections fill the cap.
    let mut silent = Vec::new();
    for _ in 0..3 {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind(SocketAddr::from(([127, 0, 0, 7], 0))).unwrap();
        silent.push(socket.connect(addr).await.unwrap());
    }
    assert!(eventually(|| m.connections.open.get() == 4).await);
    assert!(
        health_ok(addr).await,
        "a new client was locked out at the cap"
    );
    assert!(
        !closed_by_server(&mut keep_alive, Duration::from_millis(500)).await,
        "the other client's keep-alive was evicted"
    );
    let mut evicted = 0;
    for s in &mut silent {
        if closed_by_server(s, Duration::from_millis(500)).await {
            evicted += 1;
        }
    }
    assert!(evicted >= 1, "none of the silent connections gave way");
    router.shutdown().await;
}
