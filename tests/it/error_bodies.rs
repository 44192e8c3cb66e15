//! Error bodies stay small and OpenAI-shaped (issue 14, item 8): client strings echoed in an
//! error are shortened (a 1 MiB model name made a 1 MiB error), and the answers hyper writes by
//! itself for requests it cannot parse (400, 414, 431) carry an `{"error": …}` body instead of
//! none.

use std::net::SocketAddr;
use std::time::Duration;

use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::support::*;

/// Largest error body accepted for a request that echoes a huge string.
const SMALL: usize = 4096;

fn sha(key: &str) -> String {
    Sha256::digest(key.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

async fn small_error(resp: reqwest::Response, status: u16) -> String {
    assert_eq!(resp.status().as_u16(), status);
    let text = resp.text().await.unwrap();
    assert!(
        text.len() < SMALL,
        "{status}: a {} byte error body",
        text.len()
    );
    let v: Value = serde_json::from_str(&text).expect("JSON error body");
    let message = v["error"]["message"]
        .as_str()
        .expect("a message")
        .to_owned();
    assert!(
        message.contains('…'),
        "the echo is marked as cut: {message}"
    );
    message
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn echoed_client_strings_are_shortened() {
    let backend = Backend::start("b0", &["m"]).await;
    let tenants = format!(
        "[[tenants]]\nname = \"bob\"\napi_key_sha256 = \"{}\"\nmodels = [\"m\"]\n",
        sha("key-bob")
    );
    let router = start_router_over(PolicyKind::RoundRobin, &[&backend], &tenants).await;
    let addr = router.addr;
    let huge = "é".repeat(512 * 1024); // 1 MiB, two bytes a character
    let c = client();

    // A model the tenant may not use: 403.
    let resp = c
        .post(format!("http://{addr}/v1/completions"))
        .bearer_auth("key-bob")
        .json(&json!({"model": huge, "prompt": "x"}))
        .send()
        .await
        .unwrap();
    small_error(resp, 403).await;

    // A path no route serves: 404 (hyper takes URIs up to 64 KiB).
    let path = "a".repeat(60_000);
    let resp = c.get(format!("http://{addr}/{path}")).send().await.unwrap();
    small_error(resp, 404).await;
    router.shutdown().await;

    // A model no worker serves: 404 (without tenants).
    let router = start_router_over(PolicyKind::RoundRobin, &[&backend], "").await;
    let resp = c
        .post(format!("http://{}/v1/completions", router.addr))
        .json(&json!({"model": huge, "prompt": "x"}))
        .send()
        .await
        .unwrap();
    let message = small_error(resp, 404).await;
    assert!(message.starts_with("The model `éé"), "{message}");
    assert_eq!(backend.count(), 0);
    router.shutdown().await;
}

/// Writes `request` on a fresh connection and reads the answer until the server closes it.
async fn raw_answer(addr: SocketAddr, request: &[u8]) -> (u16, String, String) {
    let mut s = TcpStream::connect(addr).await.unwrap();
    // The server may answer and close before it has read everything: ignore write errors.
    let _ = s.write_all(request).await;
    let mut got = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(15), s.read_to_end(&mut got)).await;
    assert!(read.is_ok(), "the server answers and closes");
    let text = String::from_utf8_lossy(&got).to_string();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    (status, head.to_owned(), body.to_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_hyper_cannot_parse_get_openai_bodies() {
    let backend = Backend::start("b0", &["m"]).await;
    let router = start_router_over(PolicyKind::RoundRobin, &[&backend], "").await;
    let addr = router.addr;
    let many_headers: String = (0..150).map(|i| format!("x-h{i}: v\r\n")).collect();
    let cases: Vec<(&str, Vec<u8>, u16)> = vec![
        ("malformed request line", b"GARBAGE\r\n\r\n".to_vec(), 400),
        (
            "malformed header",
            b"GET /health HTTP/1.1\r\nhost: x\r\nbad header\r\n\r\n".to_vec(),
            400,
        ),
        (
            "URI too long",
            format!("GET /{} HTTP/1.1\r\nhost: x\r\n\r\n", "a".repeat(70_000)).into_bytes(),
            414,
        ),
        (
            "too many headers",
            format!("GET /health HTTP/1.1\r\nhost: x\r\n{many_headers}\r\n").into_bytes(),
            431,
        ),
        (
            "headers too large",
            format!(
                "GET /health HTTP/1.1\r\nhost: x\r\nx-big: {}\r\n\r\n",
                "a".repeat(600_000)
            )
            .into_bytes(),
            431,
        ),
    ];
    for (name, request, status) in cases {
        let (got, head, body) = raw_answer(addr, &request).await;
        assert_eq!(got, status, "{name}: {head}");
        assert!(
            head.to_ascii_lowercase()
                .contains("content-type: application/json"),
            "{name}: {head}"
        );
        let v: Value =
            serde_json::from_str(&body).unwrap_or_else(|e| panic!("{name}: {body:?}: {e}"));
        let e = &v["error"];
        assert!(
            e["message"].is_string() && e["type"].is_string(),
            "{name}: {v}"
        );
        assert!(
            e.get("param").is_some() && e.get("code").is_some(),
            "{name}: {v}"
        );
    }
    // Requests that parse are untouched, on a connection of their own and after the bad ones.
    let resp = client()
        .get(format!("http://{addr}/health"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    router.shutdown().await;
}
