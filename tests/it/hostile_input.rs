//! Hostile and broken input against a real router on 127.0.0.1, in front of a recording test
//! backend.
//!
//! One table of bad (and borderline) requests, each row with the status and OpenAI error
//! `param` the client must get and whether the request may reach the backend. A row that is
//! rejected must cost the backend nothing: the router validates before it routes. Cases that
//! need a raw socket (oversize bodies with and without `Content-Length`, chunked bodies,
//! slow-loris bodies and headers) have their own tests below the table.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use crate::support::{Backend, PolicyKind, assert_openai_error, router_config, start_router};
use kvroute::server::RouterHandle;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const MODEL: &str = "m";
/// Body limit of the router under test: small enough to exceed cheaply, large enough for a
/// 200,000-message chat.
const LIMIT: usize = 8 << 20;

const COMPLETIONS: &str = "/v1/completions";
const CHAT: &str = "/v1/chat/completions";

/// What a row expects.
#[derive(Clone, Copy, Debug)]
enum Expect {
    /// An OpenAI-shaped error with this status and `param` (`None`: param may be anything),
    /// and the backend sees nothing.
    Reject(u16, Option<&'static str>),
    /// Forwarded: the backend answers 200 and receives the body byte for byte.
    Forward,
}

struct Row {
    name: &'static str,
    path: &'static str,
    body: Vec<u8>,
    content_type: Option<&'static str>,
    expect: Expect,
}

fn row(name: &'static str, path: &'static str, body: impl Into<Vec<u8>>, expect: Expect) -> Row {
    Row {
        name,
        path,
        body: body.into(),
        content_type: Some("application/json"),
        expect,
    }
}

fn js(v: Value) -> Vec<u8> {
    serde_json::to_vec(&v).unwrap()
}

/// `depth` nested arrays around a string: `[[[…"x"…]]]`.
fn nested_arrays(depth: usize) -> String {
    format!("{}\"x\"{}", "[".repeat(depth), "]".repeat(depth))
}

/// `depth` nested objects: `{"a":{"a":…{}…}}`.
fn nested_objects(depth: usize) -> String {
    format!("{}{{}}{}", "{\"a\":".repeat(depth), "}".repeat(depth))
}

fn huge_messages(n: usize) -> Vec<u8> {
    let mut s = String::with_capacity(n * 32 + 64);
    s.push_str("{\"model\":\"m\",\"max_tokens\":1,\"messages\":[");
    for i in 0..n {
        if i > 0 {
            s.push(',');
        }
        s.push_str("{\"role\":\"user\",\"content\":\"a\"}");
    }
    s.push_str("]}");
    s.into_bytes()
}

fn table() -> Vec<Row> {
    use Expect::*;
    let bad = |p| Reject(400, Some(p));
    let deep_prompt = format!("{{\"model\":\"m\",\"prompt\":{}}}", nested_arrays(10_000));
    let deep_unknown = format!(
        "{{\"model\":\"m\",\"prompt\":\"x\",\"extra\":{}}}",
        nested_objects(10_000)
    );
    let deep_messages = format!(
        "{{\"model\":\"m\",\"messages\":[{{\"role\":\"user\",\"content\":\"x\",\"meta\":{}}}]}}",
        nested_arrays(10_000)
    );
    let mut rows = vec![
        // Not JSON at all.
        row(
            "truncated JSON",
            COMPLETIONS,
            "{\"model\":",
            Reject(400, None),
        ),
        row("garbage", COMPLETIONS, "hello there", Reject(400, None)),
        row("empty body", COMPLETIONS, "", Reject(400, None)),
        row("empty body (chat)", CHAT, "", Reject(400, None)),
        row(
            "trailing garbage",
            COMPLETIONS,
            "{\"model\":\"m\",\"prompt\":\"x\"} x",
            Reject(400, None),
        ),
        row(
            "invalid UTF-8 in a string",
            COMPLETIONS,
            b"{\"model\":\"m\",\"prompt\":\"\xff\xfe\xfd\"}".to_vec(),
            Reject(400, None),
        ),
        row(
            "invalid UTF-8 in a key",
            COMPLETIONS,
            b"{\"model\":\"m\",\"prompt\":\"x\",\"\xc3\x28\":1}".to_vec(),
            Reject(400, None),
        ),
        row(
            "UTF-8 byte order mark",
            COMPLETIONS,
            b"\xef\xbb\xbf{\"model\":\"m\",\"prompt\":\"x\"}".to_vec(),
            Reject(400, None),
        ),
        row(
            "lone surrogate escape",
            COMPLETIONS,
            "{\"model\":\"m\",\"prompt\":\"\\ud800\"}",
            Reject(400, None),
        ),
        row(
            "number out of f64 range",
            COMPLETIONS,
            "{\"model\":\"m\",\"prompt\":\"x\",\"max_tokens\":1e400}",
            Reject(400, None),
        ),
        // Not an object.
        row(
            "JSON array body",
            COMPLETIONS,
            "[{\"model\":\"m\",\"prompt\":\"x\"}]",
            Reject(400, None),
        ),
        row("JSON string body", CHAT, "\"hi\"", Reject(400, None)),
        row("JSON null body", CHAT, "null", Reject(400, None)),
        // Deep nesting: a 400 from the parser's recursion limit, never a stack overflow.
        row(
            "10,000-deep prompt",
            COMPLETIONS,
            deep_prompt,
            Reject(400, None),
        ),
        row(
            "10,000-deep unknown field",
            COMPLETIONS,
            deep_unknown,
            Reject(400, None),
        ),
        row(
            "10,000-deep message field",
            CHAT,
            deep_messages,
            Reject(400, None),
        ),
        // model
        row(
            "missing model",
            COMPLETIONS,
            js(json!({"prompt":"x"})),
            bad("model"),
        ),
        row(
            "null model",
            COMPLETIONS,
            js(json!({"model":null,"prompt":"x"})),
            bad("model"),
        ),
        row(
            "empty model",
            CHAT,
            js(json!({"model":"","messages":[{"role":"user","content":"x"}]})),
            bad("model"),
        ),
        row(
            "numeric model",
            COMPLETIONS,
            js(json!({"model":5,"prompt":"x"})),
            bad("model"),
        ),
        row(
            "array model",
            COMPLETIONS,
            js(json!({"model":["m"],"prompt":"x"})),
            bad("model"),
        ),
        row(
            "unknown model",
            COMPLETIONS,
            js(json!({"model":"nope","prompt":"x"})),
            Reject(404, Some("model")),
        ),
        // prompt
        row(
            "missing prompt",
            COMPLETIONS,
            js(json!({"model":"m"})),
            bad("prompt"),
        ),
        row(
            "numeric prompt",
            COMPLETIONS,
            js(json!({"model":"m","prompt":5})),
            bad("prompt"),
        ),
        row(
            "object prompt",
            COMPLETIONS,
            js(json!({"model":"m","prompt":{"a":1}})),
            bad("prompt"),
        ),
        row(
            "empty prompt array",
            COMPLETIONS,
            js(json!({"model":"m","prompt":[]})),
            bad("prompt"),
        ),
        row(
            "mixed prompt array",
            COMPLETIONS,
            js(json!({"model":"m","prompt":["a",1]})),
            bad("prompt"),
        ),
        row(
            "token id above u32",
            COMPLETIONS,
            js(json!({"model":"m","prompt":[1, 4294967296u64]})),
            bad("prompt"),
        ),
        row(
            "huge token id",
            COMPLETIONS,
            "{\"model\":\"m\",\"prompt\":[18446744073709551616]}",
            Reject(400, None),
        ),
        row(
            "negative token id",
            COMPLETIONS,
            js(json!({"model":"m","prompt":[1,-1]})),
            bad("prompt"),
        ),
        row(
            "fractional token id",
            COMPLETIONS,
            js(json!({"model":"m","prompt":[1.5]})),
            bad("prompt"),
        ),
        row(
            "negative id in a batch",
            COMPLETIONS,
            js(json!({"model":"m","prompt":[[1],[-7]]})),
            bad("prompt"),
        ),
        row(
            "empty token list in a batch",
            COMPLETIONS,
            js(json!({"model":"m","prompt":[[1],[]]})),
            bad("prompt"),
        ),
        // messages
        row(
            "missing messages",
            CHAT,
            js(json!({"model":"m"})),
            bad("messages"),
        ),
        row(
            "string messages",
            CHAT,
            js(json!({"model":"m","messages":"hi"})),
            bad("messages"),
        ),
        row(
            "empty messages",
            CHAT,
            js(json!({"model":"m","messages":[]})),
            bad("messages"),
        ),
        row(
            "message not an object",
            CHAT,
            js(json!({"model":"m","messages":[1]})),
            bad("messages"),
        ),
        row(
            "missing role",
            CHAT,
            js(json!({"model":"m","messages":[{"content":"x"}]})),
            bad("messages"),
        ),
        row(
            "numeric role",
            CHAT,
            js(json!({"model":"m","messages":[{"role":1,"content":"x"}]})),
            bad("messages"),
        ),
        row(
            "null role",
            CHAT,
            js(json!({"model":"m","messages":[{"role":null,"content":"x"}]})),
            bad("messages"),
        ),
        row(
            "numeric content",
            CHAT,
            js(json!({"model":"m","messages":[{"role":"user","content":5}]})),
            bad("messages"),
        ),
        row(
            "content part without type",
            CHAT,
            js(json!({"model":"m","messages":[{"role":"user","content":[{"text":"x"}]}]})),
            bad("messages"),
        ),
        row(
            "content part with numeric type",
            CHAT,
            js(json!({"model":"m","messages":[{"role":"user","content":[{"type":1,"text":"x"}]}]})),
            bad("messages"),
        ),
        row(
            "content part not an object",
            CHAT,
            js(json!({"model":"m","messages":[{"role":"user","content":["x"]}]})),
            bad("messages"),
        ),
        // max_tokens, n, stream, stream_options
        row(
            "string max_tokens",
            COMPLETIONS,
            js(json!({"model":"m","prompt":"x","max_tokens":"5"})),
            bad("max_tokens"),
        ),
        row(
            "negative max_tokens",
            COMPLETIONS,
            js(json!({"model":"m","prompt":"x","max_tokens":-1})),
            bad("max_tokens"),
        ),
        row(
            "fractional max_tokens",
            COMPLETIONS,
            js(json!({"model":"m","prompt":"x","max_tokens":1.5})),
            bad("max_tokens"),
        ),
        row(
            "absurd max_tokens",
            COMPLETIONS,
            js(json!({"model":"m","prompt":"x","max_tokens":(1u64 << 24) + 1})),
            bad("max_tokens"),
        ),
        row(
            "u64::MAX max_tokens",
            COMPLETIONS,
            js(json!({"model":"m","prompt":"x","max_tokens":u64::MAX})),
            bad("max_tokens"),
        ),
        row(
            "absurd max_completion_tokens",
            CHAT,
            js(
                json!({"model":"m","messages":[{"role":"user","content":"x"}],"max_completion_tokens":1u64 << 40}),
            ),
            bad("max_completion_tokens"),
        ),
        row(
            "string stream",
            COMPLETIONS,
            js(json!({"model":"m","prompt":"x","stream":"true"})),
            bad("stream"),
        ),
        row(
            "numeric stream",
            CHAT,
            js(json!({"model":"m","messages":[{"role":"user","content":"x"}],"stream":1})),
            bad("stream"),
        ),
        row(
            "string n",
            COMPLETIONS,
            js(json!({"model":"m","prompt":"x","n":"2"})),
            bad("n"),
        ),
        row(
            "zero n",
            COMPLETIONS,
            js(json!({"model":"m","prompt":"x","n":0})),
            bad("n"),
        ),
        row(
            "n > 1 with stream",
            COMPLETIONS,
            js(json!({"model":"m","prompt":"x","n":2,"stream":true})),
            bad("n"),
        ),
        row(
            "n > 1 with stream (chat)",
            CHAT,
            js(json!({"model":"m","messages":[{"role":"user","content":"x"}],"n":3,"stream":true})),
            bad("n"),
        ),
        row(
            "string stream_options",
            COMPLETIONS,
            js(json!({"model":"m","prompt":"x","stream":true,"stream_options":"yes"})),
            bad("stream_options"),
        ),
        row(
            "string include_usage",
            COMPLETIONS,
            js(
                json!({"model":"m","prompt":"x","stream":true,"stream_options":{"include_usage":"yes"}}),
            ),
            bad("stream_options"),
        ),
        row(
            "numeric cache_salt",
            COMPLETIONS,
            js(json!({"model":"m","prompt":"x","cache_salt":5})),
            bad("cache_salt"),
        ),
        row(
            "object tools",
            CHAT,
            js(json!({"model":"m","messages":[{"role":"user","content":"x"}],"tools":{}})),
            bad("tools"),
        ),
        row(
            "array chat_template_kwargs",
            CHAT,
            js(
                json!({"model":"m","messages":[{"role":"user","content":"x"}],"chat_template_kwargs":[]}),
            ),
            bad("chat_template_kwargs"),
        ),
        // Borderline but valid: forwarded untouched.
        row(
            "max_tokens at the limit",
            COMPLETIONS,
            js(json!({"model":"m","prompt":"x","max_tokens":1u64 << 24})),
            Forward,
        ),
        row(
            "n > 1 without stream",
            COMPLETIONS,
            js(json!({"model":"m","prompt":"x","n":2})),
            Forward,
        ),
        row(
            "unknown fields kept, odd spacing and key order",
            COMPLETIONS,
            "{ \"x_vendor\" : {\"a\":[1,2,{\"b\":null}]},\"prompt\":\"x\",\n\t\"logit_bias\":{\"50256\":-100}, \"model\":\"m\" ,\"temperature\":0.10000000000000001}",
            Forward,
        ),
        row(
            "unknown fields kept (chat, stream)",
            CHAT,
            "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\",\"name\":\"bob\",\"x_meta\":[true]}],\"stream\":true,\"guided_json\":{\"type\":\"object\"},\"priority\":-3}",
            Forward,
        ),
        row(
            "unicode everywhere",
            CHAT,
            js(json!({"model":"m","messages":[{"role":"użytkownik","content":"😀 \u{0000} ☃"}]})),
            Forward,
        ),
        row(
            "null optional fields",
            COMPLETIONS,
            js(
                json!({"model":"m","prompt":"x","stream":null,"n":null,"max_tokens":null,"stream_options":null,"cache_salt":null}),
            ),
            Forward,
        ),
        row(
            "huge messages (200,000)",
            CHAT,
            huge_messages(200_000),
            Forward,
        ),
    ];
    let mut no_ct = row(
        "missing content-type",
        COMPLETIONS,
        js(json!({"model":"m","prompt":"x"})),
        Forward,
    );
    no_ct.content_type = None;
    rows.push(no_ct);
    let mut text_ct = row(
        "text/plain content-type",
        CHAT,
        js(json!({"model":"m","messages":[{"role":"user","content":"x"}]})),
        Forward,
    );
    text_ct.content_type = Some("text/plain");
    rows.push(text_ct);
    rows
}

struct Setup {
    backend: Backend,
    router: RouterHandle,
    http: reqwest::Client,
}

async fn setup(extra: &str) -> Setup {
    let backend = Backend::start("b", &[MODEL]).await;
    // kv_aware tokenizes every prompt, so rows exercise the tokenizer and chat template too.
    let config = router_config(
        PolicyKind::KvAware,
        &[(backend.url(), vec![MODEL])],
        &format!("max_body_bytes = {LIMIT}\n{extra}"),
    );
    let router = start_router(&config).await;
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    Setup {
        backend,
        router,
        http,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_bad_request_gets_its_status_and_an_openai_error() {
    let s = setup("").await;
    let mut failures = Vec::new();
    for r in table() {
        let before = s.backend.count();
        let mut req = s
            .http
            .post(format!("http://{}{}", s.router.addr, r.path))
            .body(r.body.clone());
        if let Some(ct) = r.content_type {
            req = req.header("content-type", ct);
        }
        let started = Instant::now();
        let resp = match req.send().await {
            Ok(resp) => resp,
            Err(e) => {
                failures.push(format!("{}: no response: {e}", r.name));
                continue;
            }
        };
        let status = resp.status().as_u16();
        match r.expect {
            Expect::Reject(want, param) => {
                if status != want {
                    let body = resp.text().await.unwrap_or_default();
                    let body: String = body.chars().take(300).collect();
                    failures.push(format!("{}: status {status}, want {want}: {body}", r.name));
                    continue;
                }
                let e = assert_openai_error(resp, want).await;
                if let Some(p) = param
                    && e["param"] != p
                {
                    failures.push(format!("{}: param {}, want {p}", r.name, e["param"]));
                }
                if s.backend.count() != before {
                    failures.push(format!(
                        "{}: a rejected request reached the backend",
                        r.name
                    ));
                }
            }
            Expect::Forward => {
                if status != 200 {
                    let body = resp.text().await.unwrap_or_default();
                    let body: String = body.chars().take(300).collect();
                    failures.push(format!("{}: status {status}, want 200: {body}", r.name));
                    continue;
                }
                assert!(
                    resp.headers().contains_key("x-kvroute-worker"),
                    "{}",
                    r.name
                );
                let _ = resp.bytes().await;
                let got = s.backend.received();
                if got.len() != before + 1 {
                    failures.push(format!(
                        "{}: backend received {} requests, want 1",
                        r.name,
                        got.len() - before
                    ));
                    continue;
                }
                let last = got.last().unwrap();
                if last.path != r.path || last.body != r.body {
                    failures.push(format!(
                        "{}: the body was not forwarded byte for byte",
                        r.name
                    ));
                }
            }
        }
        eprintln!("{:<48} {status} in {:?}", r.name, started.elapsed());
    }
    assert!(
        failures.is_empty(),
        "{} rows failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
    // The router survived all of it.
    let health = s
        .http
        .get(format!("http://{}/health", s.router.addr))
        .send()
        .await
        .unwrap();
    assert_eq!(health.status(), 200);
    s.router.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_methods_and_routes_are_openai_errors() {
    let s = setup("").await;
    let base = format!("http://{}", s.router.addr);
    let r = s
        .http
        .get(format!("{base}{COMPLETIONS}"))
        .send()
        .await
        .unwrap();
    assert_openai_error(r, 405).await;
    let r = s
        .http
        .put(format!("{base}{CHAT}"))
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_openai_error(r, 405).await;
    let r = s
        .http
        .post(format!("{base}/v1/engines"))
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_openai_error(r, 404).await;
    assert_eq!(s.backend.count(), 0);
    s.router.shutdown().await;
}

/// Client-chosen model names must not become metric label values: every bogus name would
/// add a time series (unbounded memory, a scrape that grows forever).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_model_names_do_not_grow_metrics() {
    let s = setup("").await;
    let base = format!("http://{}", s.router.addr);
    for i in 0..200 {
        let r = s
            .http
            .post(format!("{base}{COMPLETIONS}"))
            .json(&json!({"model": format!("bogus-{i}-{}", "x".repeat(200)), "prompt": "x"}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 404);
    }
    let metrics = s
        .http
        .get(format!("{base}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let series = metrics
        .lines()
        .filter(|l| l.starts_with("kvroute_requests_total{"))
        .count();
    let leaked = metrics.lines().filter(|l| l.contains("bogus-")).count();
    assert!(
        leaked == 0 && series < 10,
        "{series} kvroute_requests_total series, {leaked} metric lines carry client-chosen model names ({} bytes of metrics)",
        metrics.len()
    );
    assert_eq!(s.backend.count(), 0);
    s.router.shutdown().await;
}

/// A raw HTTP/1.1 exchange: writes `head`, then `body` chunks (each after `gap`), while
/// reading the response; returns the status and body, or `None` if the server closed the
/// connection without a response. Gives up after `limit`.
async fn raw(
    addr: SocketAddr,
    head: String,
    body: Vec<Vec<u8>>,
    gap: Duration,
    limit: Duration,
) -> Result<Option<(u16, String)>, &'static str> {
    let stream = TcpStream::connect(addr).await.unwrap();
    let (mut rd, mut wr) = stream.into_split();
    let writer = tokio::spawn(async move {
        if wr.write_all(head.as_bytes()).await.is_err() {
            return;
        }
        for chunk in body {
            if !gap.is_zero() {
                tokio::time::sleep(gap).await;
            }
            if wr.write_all(&chunk).await.is_err() {
                return;
            }
        }
        // Keep the write side open: a slow client does not half-close.
        std::future::pending::<()>().await;
    });
    let mut buf = Vec::new();
    let read = tokio::time::timeout(limit, async {
        let mut chunk = [0u8; 8192];
        loop {
            match rd.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
            if response_complete(&buf) {
                return;
            }
        }
    })
    .await;
    writer.abort();
    if read.is_err() {
        return Err("no response and the connection is still open");
    }
    Ok(parse_response(&buf))
}

fn header_end(buf: &[u8]) -> Option<usize> {
    buf.windows(4).position(|w| w == b"\r\n\r\n").map(|p| p + 4)
}

fn content_length(head: &str) -> Option<usize> {
    head.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.eq_ignore_ascii_case("content-length")
            .then(|| v.trim().parse().ok())
            .flatten()
    })
}

fn response_complete(buf: &[u8]) -> bool {
    let Some(end) = header_end(buf) else {
        return false;
    };
    let head = String::from_utf8_lossy(&buf[..end]);
    match content_length(&head) {
        Some(n) => buf.len() >= end + n,
        None => false,
    }
}

fn parse_response(buf: &[u8]) -> Option<(u16, String)> {
    let end = header_end(buf)?;
    let head = String::from_utf8_lossy(&buf[..end]).to_string();
    let status = head.split_whitespace().nth(1)?.parse().ok()?;
    Some((status, String::from_utf8_lossy(&buf[end..]).to_string()))
}

fn assert_error_body(body: &str, code: u16) {
    let v: Value =
        serde_json::from_str(body).unwrap_or_else(|e| panic!("{code}: body {body:?}: {e}"));
    let e = &v["error"];
    assert!(e["message"].is_string() && e["type"].is_string(), "{v}");
    assert!(e.get("param").is_some() && e.get("code").is_some(), "{v}");
}

fn oversize_json() -> Vec<u8> {
    let mut b = b"{\"model\":\"m\",\"prompt\":\"".to_vec();
    b.resize(LIMIT + 4096, b'a');
    b.extend_from_slice(b"\"}");
    b
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversize_bodies_are_413_with_and_without_content_length() {
    let s = setup("").await;
    let body = oversize_json();
    let limit = Duration::from_secs(20);

    // Declared too large: refused from the header, before reading.
    let head = format!(
        "POST {COMPLETIONS} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    );
    let chunks = body.chunks(64 * 1024).map(<[u8]>::to_vec).collect();
    let (status, text) = raw(s.router.addr, head, chunks, Duration::ZERO, limit)
        .await
        .unwrap()
        .expect("a response");
    assert_eq!(status, 413, "{text}");
    assert_error_body(&text, 413);

    // Content-Length absurdly large (no body sent): refused from the header alone.
    let head = format!(
        "POST {CHAT} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 99999999999999\r\nconnection: close\r\n\r\n"
    );
    let (status, text) = raw(s.router.addr, head, vec![], Duration::ZERO, limit)
        .await
        .unwrap()
        .expect("a response");
    assert_eq!(status, 413, "{text}");
    assert_error_body(&text, 413);

    // Chunked, no length: refused once the limit is crossed.
    let head = format!(
        "POST {COMPLETIONS} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n"
    );
    let chunks: Vec<Vec<u8>> = body
        .chunks(64 * 1024)
        .map(|c| {
            let mut v = format!("{:x}\r\n", c.len()).into_bytes();
            v.extend_from_slice(c);
            v.extend_from_slice(b"\r\n");
            v
        })
        .chain(std::iter::once(b"0\r\n\r\n".to_vec()))
        .collect();
    let (status, text) = raw(s.router.addr, head, chunks, Duration::ZERO, limit)
        .await
        .unwrap()
        .expect("a response");
    assert_eq!(status, 413, "{text}");
    assert_error_body(&text, 413);

    // Chunked through a real client library too.
    let stream = futures_util::stream::iter(
        body.chunks(256 * 1024)
            .map(|c| Ok::<_, std::io::Error>(bytes::Bytes::copy_from_slice(c)))
            .collect::<Vec<_>>(),
    );
    let r = s
        .http
        .post(format!("http://{}{COMPLETIONS}", s.router.addr))
        .header("content-type", "application/json")
        .body(reqwest::Body::wrap_stream(stream))
        .send()
        .await;
    if let Ok(r) = r {
        assert_openai_error(r, 413).await;
    }
    // A body just under the limit is fine.
    let mut ok = b"{\"model\":\"m\",\"prompt\":\"".to_vec();
    ok.resize(LIMIT - 64, b'a');
    ok.extend_from_slice(b"\"}");
    let r = s
        .http
        .post(format!("http://{}{COMPLETIONS}", s.router.addr))
        .body(ok)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(
        s.backend.count(),
        1,
        "only the body within the limit is forwarded"
    );
    s.router.shutdown().await;
}

/// Slow-loris body: headers at once, then one byte per second. With `proxy.body_read_timeout_s = 1`
/// the router must answer 408 (or 400), or close the connection, within a bounded time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_loris_body_is_cut_off() {
    let s = setup("[proxy]\nbody_read_timeout_s = 1.0\n").await;
    let body = js(json!({"model":"m","prompt":"hello there, a slow body"}));
    let head = format!(
        "POST {COMPLETIONS} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    let chunks = body.iter().map(|b| vec![*b]).collect();
    let started = Instant::now();
    let got = raw(
        s.router.addr,
        head,
        chunks,
        Duration::from_secs(1),
        Duration::from_secs(8),
    )
    .await;
    match got {
        Err(why) => panic!("slow-loris body: {why} after {:?}", started.elapsed()),
        Ok(Some((status, text))) => {
            assert!(matches!(status, 408 | 400), "status {status}: {text}");
            assert_error_body(&text, status);
        }
        Ok(None) => {} // closed without a response: acceptable
    }
    assert_eq!(s.backend.count(), 0);
    s.router.shutdown().await;
}

/// Slow-loris headers: one header byte per second. The router must not hold the connection
/// (and its memory) forever: it answers or closes within a bounded time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_loris_headers_are_cut_off() {
    let s = setup("[proxy]\nbody_read_timeout_s = 1.0\nheader_read_timeout_s = 3.0\n").await;
    let head = String::from("POST ");
    let trickle: Vec<Vec<u8>> = format!(
        "{COMPLETIONS} HTTP/1.1\r\nhost: x\r\nx-slow: {}\r\n",
        "a".repeat(60)
    )
    .bytes()
    .map(|b| vec![b])
    .collect();
    let started = Instant::now();
    let got = raw(
        s.router.addr,
        head,
        trickle,
        Duration::from_millis(500),
        Duration::from_secs(15),
    )
    .await;
    match got {
        Err(why) => panic!("slow-loris headers: {why} after {:?}", started.elapsed()),
        Ok(Some((status, _))) => assert!(matches!(status, 408 | 400), "status {status}"),
        Ok(None) => {}
    }
    assert_eq!(s.backend.count(), 0);
    s.router.shutdown().await;
}
