//! Issue 14 items 2 and 4 on real sockets: a request is admitted before its body is read, bodies
//! share a budget of bytes in flight, and a tenant's `cache_salt` is written into the body's
//! bytes without re-encoding anything else.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use crate::support::*;
use kvroute::config::TenantConfig;
use kvroute::server::RouterHandle;
use kvroute::server::auth::Caller;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpSocket;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};

fn sha(key: &str) -> [u8; 32] {
    Sha256::digest(key.as_bytes()).into()
}

fn hex(d: [u8; 32]) -> String {
    d.iter().map(|b| format!("{b:02x}")).collect()
}

/// An HTTP/1.1 request written by hand, so a test can stop sending its body half-way and still
/// read the answer.
struct Upload {
    rd: OwnedReadHalf,
    wr: OwnedWriteHalf,
}

impl Upload {
    /// Sends the head of a `POST` to `path`, declaring `length` body bytes (`None`: chunked).
    async fn start(addr: SocketAddr, path: &str, key: Option<&str>, length: Option<usize>) -> Self {
        Upload::start_from([127, 0, 0, 1], addr, path, key, length).await
    }

    /// As [`Upload::start`], from the loopback address `from` (another client address).
    async fn start_from(
        from: [u8; 4],
        addr: SocketAddr,
        path: &str,
        key: Option<&str>,
        length: Option<usize>,
    ) -> Self {
        let socket = TcpSocket::new_v4().unwrap();
        socket.bind(SocketAddr::from((from, 0))).unwrap();
        let stream = socket.connect(addr).await.unwrap();
        let (rd, mut wr) = stream.into_split();
        let auth = key
            .map(|k| format!("authorization: Bearer {k}\r\n"))
            .unwrap_or_default();
        let framing = match length {
            Some(n) => format!("content-length: {n}\r\n"),
            None => "transfer-encoding: chunked\r\n".to_owned(),
        };
        let head = format!(
            "POST {path} HTTP/1.1\r\nhost: kvroute\r\ncontent-type: application/json\r\n{auth}{framing}\r\n"
        );
        wr.write_all(head.as_bytes()).await.unwrap();
        Upload { rd, wr }
    }

    /// Sends body bytes; false once the server has closed its side.
    async fn send(&mut self, bytes: &[u8]) -> bool {
        self.wr.write_all(bytes).await.is_ok() && self.wr.flush().await.is_ok()
    }

    /// Reads the response (status and body) while the request may still be unfinished; `None`
    /// when the connection closes first or nothing complete arrives within a generous bound.
    async fn response(&mut self) -> Option<(u16, Value)> {
        let mut buf = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(30), async {
            let mut chunk = [0u8; 8192];
            loop {
                if let Some(r) = complete(&buf) {
                    return Some(r);
                }
                match self.rd.read(&mut chunk).await {
                    Ok(0) | Err(_) => return None,
                    Ok(n) => buf.extend_from_slice(&chunk[..n]),
                }
            }
        });
        read.await.ok().flatten()
    }
}

/// A complete response: its status and its body as JSON (`null` for a chunked body, which only
/// has to have ended).
fn complete(buf: &[u8]) -> Option<(u16, Value)> {
    let end = buf.windows(4).position(|w| w == b"\r\n\r\n")? + 4;
    let head = String::from_utf8_lossy(&buf[..end]);
    let status = head.split_whitespace().nth(1)?.parse().ok()?;
    let length = head.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.eq_ignore_ascii_case("content-length")
            .then(|| v.trim().parse::<usize>().ok())
            .flatten()
    });
    match length {
        Some(n) => {
            let body = buf.get(end..end + n)?;
            Some((status, serde_json::from_slice(body).unwrap_or(Value::Null)))
        }
        None => buf.ends_with(b"0\r\n\r\n").then_some((status, Value::Null)),
    }
}

/// A completion body of exactly `size` bytes.
fn body_of(size: usize) -> Vec<u8> {
    let mut b = br#"{"model":"m","prompt":""#.to_vec();
    b.resize(size - 2, b'a');
    b.extend_from_slice(br#""}"#);
    b
}

fn rejected(r: &RouterHandle, reason: &str) -> u64 {
    r.state.metrics.rejected.with_label_values(&[reason]).get()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_over_its_limit_is_refused_before_its_body_is_read() {
    let b = Backend::start("a", &["m"]).await;
    b.set(|x| x.hold_last_chunk = true);
    let tenants = format!(
        "[server]\nbody_read_timeout_s = 5.0\n[[tenants]]\nname = \"acme\"\napi_key_sha256 = \"{}\"\nmax_concurrency = 2\n",
        hex(sha("key-acme"))
    );
    let r = start_router_over(PolicyKind::RoundRobin, &[&b], &tenants).await;
    let c = client();
    let url = format!("http://{}/v1/completions", r.addr);
    // Two slow streams hold the tenant's two slots.
    let mut slow = Vec::new();
    for _ in 0..2 {
        let resp = c
            .post(&url)
            .bearer_auth("key-acme")
            .json(&json!({"model": "m", "prompt": "x", "stream": true}))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        slow.push(resp);
    }
    // Four large bodies: each is answered 429 while most of it is still unsent. Before the fix
    // each body was read (and parsed) first; unfinished, it ended in a 408 instead.
    let size = 16 << 20;
    let body = body_of(size);
    let mut uploads = Vec::new();
    for _ in 0..4 {
        let mut u = Upload::start(r.addr, "/v1/completions", Some("key-acme"), Some(size)).await;
        assert!(u.send(&body[..64 << 10]).await);
        uploads.push(u);
    }
    for u in &mut uploads {
        let (status, e) = u.response().await.expect("an answer before the body ends");
        assert_eq!(status, 429, "{e}");
        assert_eq!(e["error"]["code"], "tenant_concurrency", "{e}");
    }
    assert_eq!(rejected(&r, "tenant_concurrency"), 4);
    assert_eq!(
        r.state.admission.bodies().in_flight(),
        0,
        "no body was read"
    );
    assert_eq!(b.count(), 2, "only the slow requests reached the worker");

    // The slots come back when the streams end; a large body is then read and forwarded whole.
    b.set(|x| x.hold_last_chunk = false);
    b.release();
    for resp in slow {
        resp.bytes().await.unwrap();
    }
    let resp = c
        .post(&url)
        .bearer_auth("key-acme")
        .header("content-type", "application/json")
        .body(body.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let salt = format!("\"cache_salt\":\"{}\",", acme_salt(None));
    assert_eq!(
        b.received().last().map(|x| x.body.len()),
        Some(size + salt.len())
    );
    r.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_beyond_the_byte_budget_are_refused_and_the_budget_comes_back() {
    let b = Backend::start("a", &["m"]).await;
    let mib = 1 << 20;
    let r = start_router_over(
        PolicyKind::KvAware,
        &[&b],
        &format!(
            "max_body_bytes = {mib}\n[limits]\nmax_body_bytes_in_flight = {}\n",
            2 * mib
        ),
    )
    .await;
    let body = body_of(mib);
    // Two bodies all but sent, from two clients, take the whole budget (claimed as their bytes
    // arrive; one client may hold half of it)...
    let mut first = Upload::start(r.addr, "/v1/completions", None, Some(mib)).await;
    let path = "/v1/completions";
    let mut second = Upload::start_from([127, 0, 0, 2], r.addr, path, None, Some(mib)).await;
    let sent = mib - 16;
    assert!(first.send(&body[..sent]).await);
    assert!(second.send(&body[..sent]).await);
    let budget = || r.state.admission.bodies().in_flight();
    assert!(eventually(|| budget() >= 2 * sent).await, "{}", budget());
    // ...so a third, with or without a Content-Length, is refused at once.
    let small = body_of(128);
    let small = small.as_slice();
    let mut third = Upload::start_from([127, 0, 0, 3], r.addr, path, None, Some(small.len())).await;
    assert!(third.send(small).await);
    let (status, e) = third.response().await.expect("an answer");
    assert_eq!(
        (status, &e["error"]["code"]),
        (429, &json!("body_bytes_in_flight"))
    );
    let mut chunked = Upload::start_from([127, 0, 0, 3], r.addr, path, None, None).await;
    assert!(
        chunked
            .send(format!("{:x}\r\n", small.len()).as_bytes())
            .await
    );
    assert!(chunked.send(small).await);
    assert!(chunked.send(b"\r\n0\r\n\r\n").await);
    let (status, e) = chunked.response().await.expect("an answer");
    assert_eq!(
        (status, &e["error"]["code"]),
        (429, &json!("body_bytes_in_flight"))
    );
    assert_eq!(rejected(&r, "body_bytes_in_flight"), 2);
    assert_eq!(b.count(), 0);

    // The first body ends: it is forwarded whole, and its bytes return to the budget.
    assert!(first.send(&body[sent..]).await);
    let (status, e) = first.response().await.expect("an answer");
    assert_eq!(status, 200, "{e}");
    assert_eq!(b.received()[0].body.len(), mib);
    assert!(
        eventually(|| (sent..=mib).contains(&budget())).await,
        "{}",
        budget()
    );
    // The second client goes away: its claim is returned too.
    drop(second);
    assert!(eventually(|| budget() == 0).await, "{}", budget());
    let resp = client()
        .post(format!("http://{}/v1/completions", r.addr))
        .json(&json!({"model": "m", "prompt": "x"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    r.shutdown().await;
}

/// The salt kvroute sends for tenant `acme` given the client's own salt.
fn acme_salt(client_salt: Option<&str>) -> String {
    Caller::Tenant(Arc::new(TenantConfig {
        name: "acme".into(),
        api_key_sha256: sha("key-acme"),
        models: vec!["*".into()],
        max_concurrency: None,
        shaping: Default::default(),
    }))
    .cache_salt(client_salt)
    .unwrap()
}

#[tokio::test]
async fn a_tenant_body_reaches_the_engine_byte_for_byte_but_for_its_salt() {
    let b = Backend::start("a", &["m", "nosalt"]).await;
    let extra = format!(
        "[[tenants]]\nname = \"acme\"\napi_key_sha256 = \"{}\"\n[[models]]\nname = \"nosalt\"\nforward_cache_salt = false\n",
        hex(sha("key-acme"))
    );
    let r = start_router(&router_config(
        PolicyKind::KvAware,
        &[(b.url(), vec!["m", "nosalt"])],
        &extra,
    ))
    .await;
    let odd = r#""big":12345678901234567890123, "e":1E2,"f":-0.0e-0,"dup":1,"dup":{"x":2},"u":"\u00e9\ud83d\ude00\/","nested":{"cache_salt":"inner","a":[{"cache_salt":1}]}"#;
    let no = acme_salt(None);
    let mine = acme_salt(Some("mine"));
    let again = acme_salt(Some("again"));
    // (path, client bytes, bytes the engine must get)
    let cases: Vec<(&str, String, String)> = vec![
        (
            "/v1/completions",
            format!(r#"{{"model":"m","prompt":"x",{odd}}}"#),
            format!(r#"{{"cache_salt":"{no}","model":"m","prompt":"x",{odd}}}"#),
        ),
        (
            "/v1/completions",
            format!(r#"{{ "cache_salt" : "mine" ,"model":"m","prompt":[1,2],{odd}}}"#),
            format!(r#"{{ "cache_salt" : "{mine}" ,"model":"m","prompt":[1,2],{odd}}}"#),
        ),
        (
            "/v1/chat/completions",
            format!(
                r#"{{"cache_salt":"mine","model":"m","messages":[{{"role":"user","content":"\u0068i"}}],{odd},"cache\u005fsalt":"again"}}"#
            ),
            format!(
                r#"{{"cache_salt":"{again}","model":"m","messages":[{{"role":"user","content":"\u0068i"}}],{odd},"cache\u005fsalt":"{again}"}}"#
            ),
        ),
        // A model whose engines take no salt: the client's top-level salts are removed, the
        // nested ones kept, and a body without one is passed on as it came.
        (
            "/v1/completions",
            format!(
                r#"{{"cache_salt":"mine","model":"nosalt","prompt":"x",{odd},"cache_salt":null}}"#
            ),
            format!(r#"{{"model":"nosalt","prompt":"x",{odd}}}"#),
        ),
        (
            "/v1/completions",
            format!("{{\n\t\"model\" : \"nosalt\",\"prompt\":\"x\",{odd} }}"),
            format!("{{\n\t\"model\" : \"nosalt\",\"prompt\":\"x\",{odd} }}"),
        ),
    ];
    let c = client();
    for (i, (path, sent, want)) in cases.iter().enumerate() {
        let resp = c
            .post(format!("http://{}{path}", r.addr))
            .bearer_auth("key-acme")
            .header("content-type", "application/json")
            .body(sent.clone())
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200, "{sent}");
        let got = &b.received()[i].body;
        assert_eq!(String::from_utf8_lossy(got), *want, "sent {sent}");
    }
    r.shutdown().await;
}

/// Issue 35 item 2: a request claimed its declared `Content-Length` from the budget before a
/// byte of its body arrived, so four heads declaring 32 MiB each (about 800 bytes sent) held
/// the whole default budget (4 × 32 MiB) and every other body, from anyone, was answered 429
/// `body_bytes_in_flight` until their read timeout. Bytes are now claimed as they arrive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_heads_declaring_large_bodies_do_not_hold_the_budget() {
    let b = Backend::start("a", &["m"]).await;
    // The defaults: 32 MiB bodies, a budget of four of them.
    let r = start_router_over(PolicyKind::RoundRobin, &[&b], "").await;
    let size = 32 << 20;
    let start = body_of(size);
    let mut heads = Vec::new();
    for _ in 0..4 {
        let mut u = Upload::start(r.addr, "/v1/completions", None, Some(size)).await;
        assert!(u.send(&start[..64]).await);
        heads.push(u);
    }
    let budget = || r.state.admission.bodies().in_flight();
    // All four are being read once their first bytes are claimed.
    assert!(eventually(|| budget() >= 4 * 64).await, "{}", budget());
    println!(
        "four heads declaring {size} bytes each hold {} bytes of the body budget",
        budget()
    );
    // Another client's body is read and forwarded (it was a 429 before).
    let resp = client()
        .post(format!("http://{}/v1/completions", r.addr))
        .json(&json!({"model": "m", "prompt": "x"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200, "{:?}", resp.text().await);
    assert!(budget() <= 4 * 1024, "the heads hold {} bytes", budget());
    assert_eq!(rejected(&r, "body_bytes_in_flight"), 0);
    drop(heads);
    assert!(eventually(|| budget() == 0).await, "{}", budget());
    r.shutdown().await;
}

/// Issue 35 item 2, the other half: one client could still hold the whole budget by sending
/// bodies' bytes and then stalling. A client address holds at most half of it (at least one
/// largest body); others are read meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_client_cannot_take_the_whole_budget() {
    let b = Backend::start("a", &["m"]).await;
    let mib = 1 << 20;
    let r = start_router_over(
        PolicyKind::RoundRobin,
        &[&b],
        &format!(
            "max_body_bytes = {mib}\n[limits]\nmax_body_bytes_in_flight = {}\n",
            4 * mib
        ),
    )
    .await;
    let body = body_of(mib);
    let sent = mib - 16;
    let path = "/v1/completions";
    let greedy = [127, 0, 0, 5];
    let mut held = Vec::new();
    for _ in 0..2 {
        let mut u = Upload::start_from(greedy, r.addr, path, None, Some(mib)).await;
        assert!(u.send(&body[..sent]).await);
        held.push(u);
    }
    let budget = || r.state.admission.bodies().in_flight();
    assert!(eventually(|| budget() >= 2 * sent).await, "{}", budget());
    // Its third body is refused once its bytes arrive: the client holds its half.
    let mut third = Upload::start_from(greedy, r.addr, path, None, Some(mib)).await;
    assert!(third.send(&body[..64 << 10]).await);
    let (status, e) = third.response().await.expect("an answer");
    assert_eq!(
        (status, &e["error"]["code"]),
        (429, &json!("body_bytes_per_client")),
        "{e}"
    );
    // Another client's large body is read and forwarded meanwhile.
    let mut other = Upload::start_from([127, 0, 0, 6], r.addr, path, None, Some(mib)).await;
    assert!(other.send(&body).await);
    let (status, e) = other.response().await.expect("an answer");
    assert_eq!(status, 200, "{e}");
    drop(held);
    assert!(eventually(|| budget() == 0).await, "{}", budget());
    r.shutdown().await;
}
