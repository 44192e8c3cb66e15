//! Issue 35 items 1 and 5: a client that does not take its response. A response body's timers
//! ran only while hyper polled it, and hyper stops polling when it cannot write: a client that
//! stopped reading kept its slot and its engine request forever (`total_timeout_s = 30` held
//! 75 s and on), and an HTTP/2 client advertising a window of 0 kept a `/health` answer "in
//! progress", so no connection deadline applied either. Both are cut now, and the upstream
//! request ends with them.
//!
//! Real sockets on 127.0.0.1 against a real router; the bounds are generous polls, never
//! timing assertions.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use http_body_util::Empty;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpSocket, TcpStream};

use crate::support::*;

/// How long a test waits for the router to act before it fails.
const BOUND: Duration = Duration::from_secs(30);

fn closed_for(r: &kvroute::server::RouterHandle, reason: &str) -> u64 {
    r.state
        .metrics
        .connections
        .closed
        .with_label_values(&[reason])
        .get()
}

/// Sends a streaming completion over a socket with a small receive buffer and never reads it.
async fn never_reading(addr: SocketAddr) -> TcpStream {
    let socket = TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let mut s = socket.connect(addr).await.unwrap();
    let body = br#"{"model":"m","prompt":"a long answer","stream":true}"#;
    let head = format!(
        "POST /v1/completions HTTP/1.1\r\nhost: kvroute\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).await.unwrap();
    s.write_all(body).await.unwrap();
    s
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_stops_reading_loses_its_slot_and_its_engine_request() {
    let b = Backend::start("a", &["m"]).await;
    // An endless answer: far more than any socket buffer holds.
    b.set(|x| x.chunks = 10_000_000);
    let r = start_router_over(
        PolicyKind::RoundRobin,
        &[&b],
        // The worker streams without a pause, so nothing but the client's side can end it.
        "[proxy]\nidle_timeout_s = 1.0\n",
    )
    .await;
    let started = Instant::now();
    let _client = never_reading(r.addr).await;
    let worker = || r.state.fleet.workers()[0].in_flight();
    assert!(
        wait_for(BOUND, || worker() == 1).await,
        "the request reached the worker"
    );
    // The router's send buffer and the client's receive buffer fill; once the client has left
    // a chunk untaken for the idle timeout, the connection is cut, the slot freed, the engine
    // request ended.
    let released = wait_for(BOUND, || {
        worker() == 0
            && b.state
                .streams_cancelled
                .load(std::sync::atomic::Ordering::SeqCst)
                == 1
    })
    .await;
    println!(
        "a client that stopped reading held its slot for {:.1} s (idle_timeout_s = 1)",
        started.elapsed().as_secs_f64()
    );
    assert!(
        released,
        "still in flight on the worker after {BOUND:?}: {} (upstream cancelled: {})",
        worker(),
        b.state
            .streams_cancelled
            .load(std::sync::atomic::Ordering::SeqCst)
    );
    assert_eq!(closed_for(&r, "write_stalled"), 1);
    // Others are served as before.
    let resp = complete(
        &client(),
        r.addr,
        &serde_json::json!({"model": "m", "prompt": "x"}),
    )
    .await;
    assert_eq!(resp.status(), 200);
    r.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http2_client_with_a_window_of_zero_does_not_hold_its_connection() {
    let b = Backend::start("a", &["m"]).await;
    let r = start_router_over(
        PolicyKind::RoundRobin,
        &[&b],
        "[server]\nidle_timeout_s = 1.0\n",
    )
    .await;
    let started = Instant::now();
    let tcp = TcpStream::connect(r.addr).await.unwrap();
    // SETTINGS_INITIAL_WINDOW_SIZE = 0: no response body can be sent; hyper's client still
    // answers the server's pings, as the probe's client did.
    let (mut send, conn) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
        .initial_stream_window_size(0)
        .adaptive_window(false)
        .handshake::<_, Empty<bytes::Bytes>>(TokioIo::new(tcp))
        .await
        .unwrap();
    let driver = tokio::spawn(async move {
        let _ = conn.await;
    });
    let req = http::Request::get(format!("http://{}/health", r.addr))
        .body(Empty::new())
        .unwrap();
    let resp = send.send_request(req).await.unwrap();
    assert_eq!(
        resp.status(),
        200,
        "the head is sent; the body waits on the window"
    );
    // The body is never read; the connection must still end.
    let ended = tokio::time::timeout(BOUND, driver).await.is_ok();
    println!(
        "a window-0 HTTP/2 connection was closed after {:.1} s (idle_timeout_s = 1)",
        started.elapsed().as_secs_f64()
    );
    assert!(ended, "the connection was still open after {BOUND:?}");
    assert_eq!(closed_for(&r, "write_stalled"), 1);
    drop((send, resp));
    r.shutdown().await;
}
