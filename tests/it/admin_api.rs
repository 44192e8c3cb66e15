//! The admin API checks a worker exactly as the config does (one shared check), refuses a URL
//! listed twice or the router's own address, and undoes a drain. Without an admin key its
//! changes are refused unless opened to loopback clients, and worker URLs are listed without
//! their userinfo.

use std::path::Path;

use kvroute::config::Config;
use serde_json::{Value, json};

use crate::support::*;

async fn add(c: &reqwest::Client, addr: std::net::SocketAddr, body: Value) -> reqwest::Response {
    c.post(format!("http://{addr}/admin/workers"))
        .json(&body)
        .send()
        .await
        .unwrap()
}

fn config_error(toml: &str) -> String {
    match Config::from_toml(toml, Path::new("test")) {
        Ok(_) => panic!("accepted: {toml}"),
        Err(e) => e.to_string(),
    }
}

/// Each bad worker: its admin body's extra fields, the TOML lines of the same worker, and the
/// field both must name.
fn bad_workers() -> Vec<(Value, &'static str, &'static str)> {
    vec![
        (json!({"id": ""}), "id = \"\"", "id"),
        (json!({"id": "has space"}), "id = \"has space\"", "id"),
        (json!({"id": "bell\u{7}"}), "id = \"bell\\u0007\"", "id"),
        (json!({"id": "new\nline"}), "id = \"new\\nline\"", "id"),
        // A rank's target is `id/dpN`: `dpw/dp1` would be rank 1 of a worker `dpw`.
        (json!({"id": "dpw/dp1"}), "id = \"dpw/dp1\"", "id"),
        (
            json!({"id": "x".repeat(200)}),
            // Filled in below: TOML cannot repeat.
            "",
            "id",
        ),
        (
            json!({"id": "m", "models": [""]}),
            "models = [\"\"]",
            "models",
        ),
        (
            json!({"id": "m", "models": ["a\u{1b}[31m"]}),
            "models = [\"a\\u001b[31m\"]",
            "models",
        ),
        (
            json!({"id": "e", "kv_events": "nope"}),
            "kv_events = \"nope\"",
            "kv_events",
        ),
        (
            json!({"id": "e", "kv_replay": "127.0.0.1:1"}),
            "kv_replay = \"127.0.0.1:1\"",
            "kv_replay",
        ),
        (
            json!({"id": "z", "kv_blocks": 0}),
            "kv_blocks = 0",
            "kv_blocks",
        ),
        (
            json!({"id": "d", "data_parallel_size": 0}),
            "data_parallel_size = 0",
            "data_parallel_size",
        ),
        (
            json!({"id": "d", "data_parallel_size": -2}),
            "data_parallel_size = -2",
            "data_parallel_size",
        ),
        (
            json!({"id": "d", "data_parallel_size": 257}),
            "data_parallel_size = 257",
            "data_parallel_size",
        ),
        // Rank N publishes on the port plus N: an ipc path has no port to offset.
        (
            json!({"id": "d", "data_parallel_size": 2, "kv_events": "ipc:///tmp/kv"}),
            "data_parallel_size = 2\nkv_events = \"ipc:///tmp/kv\"",
            "kv_events",
        ),
        (
            json!({"id": "d", "data_parallel_size": 4, "kv_events": "tcp://h:1", "kv_replay": "tcp://h:65534"}),
            "data_parallel_size = 4\nkv_events = \"tcp://h:1\"\nkv_replay = \"tcp://h:65534\"",
            "kv_replay",
        ),
    ]
}

#[tokio::test]
async fn the_admin_api_refuses_every_worker_the_config_refuses() {
    let a = Backend::start("a", &["m"]).await;
    let r = start_router_over(PolicyKind::RoundRobin, &[&a], ADMIN_ON_LOOPBACK).await;
    let c = client();
    let long_id = format!("id = \"{}\"", "x".repeat(200));
    for (extra, toml_line, field) in bad_workers() {
        let mut body = json!({"url": "http://127.0.0.1:1", "models": ["m"]});
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        let e = assert_openai_error(add(&c, r.addr, body.clone()).await, 400).await;
        assert_eq!(e["param"], field, "{body}: {e}");
        let line = if toml_line.is_empty() {
            long_id.as_str()
        } else {
            toml_line
        };
        let toml = format!("[[workers]]\nurl = \"http://127.0.0.1:1\"\nmodels = [\"m\"]\n{line}\n");
        // A later key replaces `models` when the bad line sets it: TOML refuses duplicates.
        let toml = if line.starts_with("models") {
            format!("[[workers]]\nurl = \"http://127.0.0.1:1\"\n{line}\n")
        } else {
            toml
        };
        let msg = config_error(&toml);
        assert!(msg.contains(&format!("workers[0].{field}")), "{msg}");
    }
    // Nothing was added, so no control character reached a metric label.
    assert_eq!(r.state.fleet.workers().len(), 1);
    let metrics = metrics_text(r.addr).await;
    assert!(!metrics.contains('\u{7}') && !metrics.contains('\u{1b}'));
    r.shutdown().await;
}

#[tokio::test]
async fn a_url_already_in_the_fleet_is_refused_by_admin_and_config() {
    let a = Backend::start("a", &["m"]).await;
    let r = start_router_over(PolicyKind::RoundRobin, &[&a], ADMIN_ON_LOOPBACK).await;
    let c = client();
    // The same replica under another id, spelt with a trailing slash.
    let same = format!("http://{}/", a.addr);
    let e = assert_openai_error(
        add(
            &c,
            r.addr,
            json!({"id": "again", "url": same, "models": ["m"]}),
        )
        .await,
        409,
    )
    .await;
    assert_eq!(e["code"], "worker_url_taken", "{e}");
    assert!(e["message"].as_str().unwrap().contains("w0"), "{e}");
    assert_eq!(r.state.fleet.workers().len(), 1);
    // Another path on the same host is another endpoint.
    let other = format!("http://{}/v2", a.addr);
    let resp = add(
        &c,
        r.addr,
        json!({"id": "v2", "url": other, "models": ["m"]}),
    )
    .await;
    assert_eq!(resp.status(), 201);

    let msg = config_error(
        "[[workers]]\nid = \"a\"\nurl = \"http://h:1\"\n[[workers]]\nid = \"b\"\nurl = \"http://H:1/\"\n",
    );
    assert!(msg.contains("same url"), "{msg}");
    r.shutdown().await;
}

#[tokio::test]
async fn the_router_itself_is_refused_as_a_worker() {
    let a = Backend::start("a", &["m"]).await;
    let r = start_router_over(PolicyKind::RoundRobin, &[&a], ADMIN_ON_LOOPBACK).await;
    let c = client();
    let port = r.addr.port();
    // Numeric spellings of loopback too (`inet_aton`'s forms, which the resolver takes).
    for host in [
        "127.0.0.1",
        "localhost",
        "0.0.0.0",
        "[::1]",
        "127.0.0.2",
        "127.1",
        "2130706433",
        "0x7f000001",
    ] {
        let url = format!("http://{host}:{port}");
        let e = assert_openai_error(
            add(&c, r.addr, json!({"id": "me", "url": url, "models": ["m"]})).await,
            400,
        )
        .await;
        assert_eq!(e["param"], "url", "{url}: {e}");
    }
    assert_eq!(r.state.fleet.workers().len(), 1);
    // The configured listen address, in the config itself.
    let msg = config_error(
        "[server]\nlisten = \"127.0.0.1:18123\"\n[[workers]]\nurl = \"http://localhost:18123\"\n",
    );
    assert!(msg.contains("own listen address"), "{msg}");
    r.shutdown().await;
}

#[tokio::test]
async fn undrain_puts_a_drained_worker_back_in_rotation() {
    let a = Backend::start("a", &["m"]).await;
    let b = Backend::start("b", &["m"]).await;
    let r = start_router_over(PolicyKind::RoundRobin, &[&a, &b], ADMIN_ON_LOOPBACK).await;
    let c = client();
    let admin = format!("http://{}/admin/workers", r.addr);
    let send = || async {
        let resp = complete(&c, r.addr, &json!({"model": "m", "prompt": "x"})).await;
        assert_eq!(resp.status(), 200);
        resp.bytes().await.unwrap();
    };
    let drained: Value = c
        .post(format!("{admin}/w0/drain"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(drained["draining"], true);
    for _ in 0..4 {
        send().await;
    }
    assert_eq!((a.count(), b.count()), (0, 4));
    let back = c.post(format!("{admin}/w0/undrain")).send().await.unwrap();
    assert_eq!(back.status(), 200);
    let back: Value = back.json().await.unwrap();
    assert_eq!(back["draining"], false);
    for _ in 0..4 {
        send().await;
    }
    assert_eq!((a.count(), b.count()), (2, 6));
    let e = assert_openai_error(
        c.post(format!("{admin}/nope/undrain"))
            .send()
            .await
            .unwrap(),
        404,
    )
    .await;
    assert_eq!(e["code"], "worker_not_found");
    r.shutdown().await;
}

/// Issue 35 item 0: with no `[admin]` key, an unauthenticated `POST /admin/workers` answered 201
/// and the worker joined (anyone reaching the listener could receive others' prompts), and
/// `GET /admin/workers` echoed a worker URL's password.
#[tokio::test]
async fn without_a_key_admin_changes_are_refused_and_urls_are_shown_without_userinfo() {
    let a = Backend::start("a", &["m"]).await;
    let with_password = format!("http://alice:s3cret@{}", a.addr);
    let workers = [(with_password, vec!["m"])];
    let r = start_router(&router_config(PolicyKind::RoundRobin, &workers, "")).await;
    let c = client();
    let admin = format!("http://{}/admin/workers", r.addr);
    let e = assert_openai_error(
        add(
            &c,
            r.addr,
            json!({"id": "evil", "url": "http://127.0.0.1:1", "models": ["m"]}),
        )
        .await,
        403,
    )
    .await;
    assert_eq!(e["code"], "admin_closed", "{e}");
    assert!(
        e["message"].as_str().unwrap().contains("open_on_loopback"),
        "{e}"
    );
    for (method, path) in [
        (reqwest::Method::POST, "/w0/drain"),
        (reqwest::Method::POST, "/w0/undrain"),
        (reqwest::Method::DELETE, "/w0"),
    ] {
        let resp = c
            .request(method, format!("{admin}{path}"))
            .send()
            .await
            .unwrap();
        assert_openai_error(resp, 403).await;
    }
    assert_eq!(r.state.fleet.workers().len(), 1, "nothing joined or left");
    assert!(!r.state.fleet.workers()[0].is_draining());
    // Reads stay open without keys, and never show the password.
    let listed = c.get(&admin).send().await.unwrap();
    assert_eq!(listed.status(), 200);
    let text = listed.text().await.unwrap();
    assert!(
        !text.contains("s3cret") && !text.contains("alice"),
        "{text}"
    );
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["workers"][0]["url"], format!("http://***@{}", a.addr));
    r.shutdown().await;

    // Opened to loopback clients (the tests' own address), the same request joins.
    let r = start_router_over(PolicyKind::RoundRobin, &[&a], ADMIN_ON_LOOPBACK).await;
    let b = Backend::start("b", &["m"]).await;
    let resp = add(
        &c,
        r.addr,
        json!({"id": "b", "url": b.url(), "models": ["m"]}),
    )
    .await;
    assert_eq!(resp.status(), 201);
    assert_eq!(r.state.fleet.workers().len(), 2);
    r.shutdown().await;
    // A key and the loopback opening together are refused: with a key, the key is required.
    let msg = config_error(&format!(
        "[admin]\napi_key_sha256 = \"{}\"\nopen_on_loopback = true\n",
        "0".repeat(64)
    ));
    assert!(msg.contains("admin.open_on_loopback"), "{msg}");
}
