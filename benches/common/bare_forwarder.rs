//! The floor of any router process on this machine: a bare hyper forwarder, this bench binary
//! re-run as a child process ([`ENV`]) that forwards each request to the backend over a pooled
//! hyper connection and streams the answer back, deciding nothing (no parsing, no routing, no
//! metrics). What it adds is the cost of a process boundary and of the HTTP hops themselves,
//! which every router pays; what a router adds beyond it is its own.

use std::net::SocketAddr;
use std::process::Command;

use axum::Router;
use http_body_util::BodyExt;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use tokio::net::TcpListener;

use crate::fake_backend::{Process, free_addr, spawn_quiet};

/// Set (to `LISTEN BACKEND [read]`) in the child process that runs the forwarder.
pub const ENV: &str = "KVROUTE_BENCH_BARE_FORWARDER";

/// Runs the forwarder and never returns when this process is the child [`start`] started;
/// `false` otherwise.
pub fn serve_if_child() -> bool {
    match std::env::var(ENV) {
        Ok(spec) => {
            serve(&spec);
            true
        }
        Err(_) => false,
    }
}

/// With `read` as its spec's third word the forwarder reads the whole request body before
/// forwarding it, as any router must that routes on the body: what that adds over the
/// streaming forwarder is the part of a router's cost that reading the body itself costs.
fn serve(spec: &str) {
    let mut parts = spec.split_whitespace();
    let (Some(listen), Some(backend)) = (parts.next(), parts.next()) else {
        panic!("{ENV} must be `LISTEN BACKEND [read]`");
    };
    let read_first = parts.next() == Some("read");
    let (listen, backend) = (listen.to_owned(), backend.to_owned());
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async move {
        let client: Client<HttpConnector, axum::body::Body> =
            Client::builder(TokioExecutor::new()).build_http();
        let app = Router::new().fallback(move |req: axum::extract::Request| {
            let (client, backend) = (client.clone(), backend.clone());
            async move {
                let (mut parts, body) = req.into_parts();
                let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
                parts.uri = format!("http://{backend}{path}").parse().expect("uri");
                let body = if read_first {
                    let bytes = body.collect().await.expect("body").to_bytes();
                    axum::body::Body::from(bytes)
                } else {
                    body
                };
                match client.request(http::Request::from_parts(parts, body)).await {
                    Ok(resp) => resp.map(axum::body::Body::new),
                    Err(e) => http::Response::builder()
                        .status(502)
                        .body(axum::body::Body::from(e.to_string()))
                        .expect("response"),
                }
            }
        });
        let listener = TcpListener::bind(listen).await.expect("bind");
        axum::serve(listener, app).await.expect("serve");
    });
}

/// Starts the forwarder in front of `backend` as a child process; its address.
pub fn start(backend: SocketAddr, read_first: bool) -> (Process, SocketAddr) {
    let addr = free_addr();
    let read = if read_first { " read" } else { "" };
    let child = spawn_quiet(
        Command::new(std::env::current_exe().expect("this bench"))
            .env(ENV, format!("{addr} {backend}{read}")),
        "bare forwarder",
    );
    (child, addr)
}
