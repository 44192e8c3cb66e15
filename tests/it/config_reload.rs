//! Live reload of a real `kvroute serve` process on SIGHUP: a streaming request in flight when
//! the signal arrives completes; changed tenants and keys take effect at once; a worker removed
//! from the static list drains (no new request reaches it) and leaves once its stream ended; an
//! invalid file is refused and the previous configuration keeps serving; the config metrics
//! follow.

use std::time::Duration;

use futures_util::StreamExt;
use serde_json::{Value, json};

use crate::support::*;

/// The router's config: `tenants` (name, key), the admin key, and the workers `(id, url)`.
fn config(tenants: &[(&str, &str)], workers: &[(&str, String)], extra: &str) -> String {
    let mut text = format!("policy = \"least_request\"\nshutdown_grace_s = 1.0\n{extra}\n");
    for (name, key) in tenants {
        text += &format!(
            "[[tenants]]\nname = \"{name}\"\napi_key_sha256 = \"{}\"\n",
            crate::support::sha256_hex(key)
        );
    }
    text += &format!(
        "[admin]\napi_key_sha256 = \"{}\"\n",
        crate::support::sha256_hex("k-admin")
    );
    for (id, url) in workers {
        text += &format!("[[workers]]\nid = \"{id}\"\nurl = \"{url}\"\nmodels = [\"m\"]\n");
    }
    text
}

/// Rewrites the router's file (keeping the `listen` line the process started with) and sends
/// the process SIGHUP.
fn reload(router: &RouterProcess, file: &std::path::Path, text: &str) {
    std::fs::write(file, format!("listen = \"{}\"\n{text}", router.addr)).unwrap();
    let pid = libc::pid_t::try_from(router.pid()).unwrap();
    // SAFETY: kill(2) with a valid signal number has no memory effects; the pid is this
    // test's own child, still running (it is reaped only when `router` is dropped).
    #[allow(unsafe_code)]
    let sent = unsafe { libc::kill(pid, libc::SIGHUP) };
    assert_eq!(sent, 0, "kill(SIGHUP)");
}

/// The value of the metric line starting with `series` (name and labels), if present.
fn metric(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(series) && l[series.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

async fn wait_metric(addr: std::net::SocketAddr, series: &str, value: f64) -> String {
    for _ in 0..500 {
        let text = metrics_text(addr).await;
        if metric(&text, series) == Some(value) {
            return text;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!(
        "{series} never became {value}:\n{}",
        metrics_text(addr).await
    );
}

async fn complete_as(addr: std::net::SocketAddr, key: &str) -> reqwest::Response {
    client()
        .post(format!("http://{addr}/v1/completions"))
        .bearer_auth(key)
        .json(&json!({"model": "m", "prompt": "hi"}))
        .send()
        .await
        .unwrap()
}

async fn workers(addr: std::net::SocketAddr) -> Vec<Value> {
    let v: Value = client()
        .get(format!("http://{addr}/admin/workers"))
        .bearer_auth("k-admin")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    v.as_array()
        .or_else(|| v["workers"].as_array())
        .cloned()
        .unwrap_or_else(|| panic!("not a worker list: {v}"))
}

#[tokio::test]
async fn sighup_applies_keys_and_workers_without_dropping_a_stream_and_refuses_a_bad_file() {
    let a = Backend::start("a", &["m"]).await;
    let b = Backend::start("b", &["m"]).await;
    for x in [&a, &b] {
        x.set(|s| {
            s.hold_last_chunk = true;
            s.chunks = 4;
        });
    }
    let both = [("w0", a.url()), ("w1", b.url())];
    let v1 = config(&[("alice", "k-alice")], &both, "");
    let (router, file) = RouterProcess::start(&v1).await;
    let addr = router.addr;
    let first = metrics_text(addr).await;
    let sha_v1 = crate::support::sha256_hex(&format!("listen = \"{addr}\"\n{v1}"));
    assert_eq!(
        metric(
            &first,
            &format!("kvroute_config_info{{sha256=\"{sha_v1}\"}}")
        ),
        Some(1.0),
        "the loaded file's digest:\n{first}"
    );
    let loaded_v1 = metric(&first, "kvroute_config_loaded_timestamp_seconds").unwrap();

    // A long stream, held by its engine until released.
    let stream = client()
        .post(format!("http://{addr}/v1/completions"))
        .bearer_auth("k-alice")
        .json(&json!({"model": "m", "prompt": "a long one", "stream": true}))
        .send()
        .await
        .unwrap();
    assert_eq!(stream.status(), 200);
    let busy = stream.headers()["x-kvroute-worker"]
        .to_str()
        .unwrap()
        .to_owned();
    let (busy_backend, other_backend, other) = if busy == "w0" {
        (&a, &b, ("w1", b.url()))
    } else {
        (&b, &a, ("w0", a.url()))
    };
    let mut body = stream.bytes_stream();
    let head = body.next().await.unwrap().unwrap();
    assert!(head.starts_with(b"data:"), "{head:?}");

    // Reload while it streams: alice leaves, bob arrives, the busy worker leaves the list.
    let v2 = config(&[("bob", "k-bob")], std::slice::from_ref(&other), "");
    reload(&router, file.path(), &v2);
    wait_metric(
        addr,
        "kvroute_config_reloads_total{result=\"applied\"}",
        1.0,
    )
    .await;
    // A scrape is not one snapshot: the registry gathers metric families in no fixed order, so
    // one scrape may see the reload counted and the digest not yet replaced. Each series the
    // reload sets is waited for on its own.
    let sha_v2 = crate::support::sha256_hex(&format!("listen = \"{addr}\"\n{v2}"));
    let text = wait_metric(
        addr,
        &format!("kvroute_config_info{{sha256=\"{sha_v2}\"}}"),
        1.0,
    )
    .await;
    assert_eq!(
        metric(
            &text,
            &format!("kvroute_config_info{{sha256=\"{sha_v1}\"}}")
        ),
        None,
        "the old digest is gone:\n{text}"
    );
    assert!(metric(&text, "kvroute_config_loaded_timestamp_seconds").unwrap() >= loaded_v1);
    assert_eq!(metric(&text, "kvroute_config_restart_pending"), Some(0.0));

    // Keys: at once.
    assert_eq!(complete_as(addr, "k-alice").await.status(), 401);
    // The busy worker drains: every new request goes to the other one (streams there are
    // held too, so ask for plain completions). The worker list goes through the lifecycle's
    // reconciler, a task of its own, so the drain shows up a moment after the reload counts.
    for _ in 0..250 {
        let listed = workers(addr).await;
        if listed
            .iter()
            .any(|w| w["id"] == busy.as_str() && w["draining"] == true)
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let before = busy_backend.count();
    for _ in 0..4 {
        let r = complete_as(addr, "k-bob").await;
        assert_eq!(r.status(), 200);
        assert_eq!(r.headers()["x-kvroute-worker"], other.0);
    }
    assert_eq!(
        busy_backend.count(),
        before,
        "a draining worker got a request"
    );
    assert!(other_backend.count() >= 4);
    let listed = workers(addr).await;
    let w = listed
        .iter()
        .find(|w| w["id"] == busy.as_str())
        .unwrap_or_else(|| panic!("the busy worker left with its stream in flight: {listed:?}"));
    assert_eq!(w["draining"], true, "{w}");

    // The stream was not cut: released, it completes.
    busy_backend.release();
    let mut rest = Vec::new();
    while let Some(chunk) = body.next().await {
        rest.extend_from_slice(&chunk.expect("the stream broke off"));
    }
    let rest = String::from_utf8_lossy(&rest);
    assert!(rest.contains("data: [DONE]"), "{rest}");
    assert!(!rest.contains("\"error\""), "{rest}");
    // Then the drained worker leaves.
    let mut left = false;
    for _ in 0..300 {
        if !workers(addr).await.iter().any(|w| w["id"] == busy.as_str()) {
            left = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        left,
        "the removed worker never left: {:?}",
        workers(addr).await
    );

    // An invalid file is refused; the running configuration keeps serving.
    reload(
        &router,
        file.path(),
        &format!("{v2}[limits]\nmax_concurrency = 0\n"),
    );
    let text = wait_metric(
        addr,
        "kvroute_config_reloads_total{result=\"refused\"}",
        1.0,
    )
    .await;
    assert_eq!(
        metric(
            &text,
            &format!("kvroute_config_info{{sha256=\"{sha_v2}\"}}")
        ),
        Some(1.0),
        "{text}"
    );
    assert_eq!(complete_as(addr, "k-bob").await.status(), 200);
    assert_eq!(complete_as(addr, "k-alice").await.status(), 401);
    // A key that needs a restart is applied no sooner, and says so.
    let v3 = config(
        &[("bob", "k-bob")],
        std::slice::from_ref(&other),
        "seed = 7",
    );
    reload(&router, file.path(), &v3);
    wait_metric(
        addr,
        "kvroute_config_reloads_total{result=\"applied\"}",
        2.0,
    )
    .await;
    wait_metric(addr, "kvroute_config_restart_pending", 1.0).await;
}

/// With `server.config_reload_interval_s`, a changed file is reloaded without a signal (a
/// Kubernetes ConfigMap volume is rewritten in place); an invalid one is refused once, not at
/// every check.
#[tokio::test]
async fn a_changed_file_is_reloaded_without_a_signal_when_watched() {
    let a = Backend::start("a", &["m"]).await;
    let watched = "[server]\nconfig_reload_interval_s = 0.05\n";
    let workers = [("w0", a.url())];
    let v1 = config(&[("alice", "k-alice")], &workers, watched);
    let (router, file) = RouterProcess::start(&v1).await;
    let addr = router.addr;
    assert_eq!(complete_as(addr, "k-alice").await.status(), 200);
    let write = |text: &str| {
        std::fs::write(file.path(), format!("listen = \"{addr}\"\n{text}")).unwrap();
    };
    write(&config(&[("bob", "k-bob")], &workers, watched));
    wait_metric(
        addr,
        "kvroute_config_reloads_total{result=\"applied\"}",
        1.0,
    )
    .await;
    assert_eq!(complete_as(addr, "k-bob").await.status(), 200);
    assert_eq!(complete_as(addr, "k-alice").await.status(), 401);
    write(&format!(
        "{}[limits]\nmax_queue = -1\n",
        config(&[("carol", "k-carol")], &workers, watched)
    ));
    wait_metric(
        addr,
        "kvroute_config_reloads_total{result=\"refused\"}",
        1.0,
    )
    .await;
    // Many checks later the same invalid file has not been tried again.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let text = metrics_text(addr).await;
    assert_eq!(
        metric(&text, "kvroute_config_reloads_total{result=\"refused\"}"),
        Some(1.0),
        "{text}"
    );
    assert_eq!(complete_as(addr, "k-bob").await.status(), 200);
    assert_eq!(complete_as(addr, "k-carol").await.status(), 401);
}

/// Issue 35 item 6: a reload of a file without `[[tenants]]` was applied with an INFO line
/// (keyless requests then got 200), and with `config_reload_interval_s` a file truncated to 0
/// bytes was applied (no tenants, no workers). Both are refused now unless the file says so.
#[tokio::test]
async fn a_reload_switches_keys_off_or_empties_the_fleet_only_when_the_file_says_so() {
    let a = Backend::start("a", &["m"]).await;
    let watched = "[server]\nconfig_reload_interval_s = 0.05\n";
    let workers = [("w0", a.url())];
    let v1 = config(&[("alice", "k-alice")], &workers, watched);
    let (router, file) = RouterProcess::start(&v1).await;
    let addr = router.addr;
    let write = |text: &str| std::fs::write(file.path(), text).unwrap();
    let with_listen = |text: &str| format!("listen = \"{addr}\"\n{text}");
    let keyless = || async {
        client()
            .post(format!("http://{addr}/v1/completions"))
            .json(&json!({"model": "m", "prompt": "hi"}))
            .send()
            .await
            .unwrap()
            .status()
    };
    assert_eq!(keyless().await, 401);
    let refused = "kvroute_config_reloads_total{result=\"refused\"}";
    // No [[tenants]]: refused, authentication stays on.
    write(&with_listen(&config(&[], &workers, watched)));
    wait_metric(addr, refused, 1.0).await;
    assert_eq!(keyless().await, 401);
    assert_eq!(complete_as(addr, "k-alice").await.status(), 200);
    // Truncated to nothing: refused, never applied; the worker stays.
    write("");
    wait_metric(addr, refused, 2.0).await;
    assert_eq!(keyless().await, 401);
    assert_eq!(workers_of(addr).await, ["w0"]);
    // No [[workers]]: refused too.
    write(&with_listen(&config(&[("alice", "k-alice")], &[], watched)));
    wait_metric(addr, refused, 3.0).await;
    assert_eq!(workers_of(addr).await, ["w0"]);
    // Said explicitly, it applies.
    write(&with_listen(&format!(
        "tenants = []\n{}",
        config(&[], &workers, watched)
    )));
    wait_metric(
        addr,
        "kvroute_config_reloads_total{result=\"applied\"}",
        1.0,
    )
    .await;
    assert_eq!(keyless().await, 200);
}

async fn workers_of(addr: std::net::SocketAddr) -> Vec<String> {
    workers(addr)
        .await
        .iter()
        .map(|w| w["id"].as_str().unwrap_or_default().to_owned())
        .collect()
}
