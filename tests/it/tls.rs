//! TLS on both sides, with certificates made in the test: the front door serves HTTPS and
//! picks up a rotated certificate without a restart (and keeps the old one when the new files
//! cannot be used), requires client certificates when given a client CA, and `https://`
//! workers are reached with a configured CA bundle and client certificate.

use std::path::Path;
use std::time::Duration;

use axum::Router;
use axum::routing::{get, post};
use kvroute::config::Config;

use crate::support::tls::*;
use crate::support::*;

const COMPLETION: &str = r#"{"model":"m","prompt":"hello","max_tokens":1}"#;

fn config(text: &str) -> Config {
    Config::from_toml(text, Path::new("tls-test")).expect("config")
}

fn toml_path(p: &Path) -> String {
    p.display().to_string().replace('\\', "/")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_front_door_serves_https_and_picks_up_a_rotated_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new(dir.path(), "ca");
    let first = ca.issue("first");
    // The router reads the files where cert-manager would keep them.
    let (cert_file, key_file) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
    std::fs::write(&cert_file, &first.cert_pem).unwrap();
    std::fs::write(&key_file, &first.key_pem).unwrap();
    let backend = Backend::start("w0", &["m"]).await;
    let r = start_router(&config(&format!(
        "[server]\nmetrics_listen = \"127.0.0.1:0\"\n[server.tls]\ncert_file = \"{}\"\nkey_file = \"{}\"\nreload_interval_s = 0.05\n\n[[workers]]\nid = \"w0\"\nurl = \"{}\"\nmodels = [\"m\"]\n",
        toml_path(&cert_file),
        toml_path(&key_file),
        backend.url()
    )))
    .await;
    let url = format!("https://localhost:{}", r.addr.port());

    let (status, _) = https_request(
        ca.client_config(None),
        "POST",
        &format!("{url}/v1/completions"),
        COMPLETION,
    )
    .await
    .expect("an HTTPS completion");
    assert_eq!(status, 200);
    assert_eq!(backend.count(), 1);
    assert_eq!(
        presented_certificate(ca.client_config(None), r.addr).await,
        first.der()
    );
    // Plain HTTP to the TLS port gets no answer from the API.
    let plain = reqwest::Client::new()
        .get(format!("http://{}/health", r.addr))
        .timeout(Duration::from_secs(5))
        .send()
        .await;
    assert!(
        plain.is_err() || !plain.unwrap().status().is_success(),
        "plain HTTP is not served on the TLS listener"
    );

    // Rotation: new files, same paths; new connections get the new certificate.
    let second = ca.issue("second");
    std::fs::write(&key_file, &second.key_pem).unwrap();
    std::fs::write(&cert_file, &second.cert_pem).unwrap();
    let mut rotated = false;
    for _ in 0..200 {
        if presented_certificate(ca.client_config(None), r.addr).await == second.der() {
            rotated = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert!(
        rotated,
        "the rotated certificate is served without a restart"
    );

    // A rotation that cannot be used (a key that is not PEM) is refused and counted; the
    // previous certificate is still served.
    std::fs::write(&key_file, "not a key").unwrap();
    let metrics_addr = r.metrics_addr.expect("metrics on their own address");
    let mut refused = false;
    for _ in 0..200 {
        if metrics_text(metrics_addr)
            .await
            .contains("kvroute_tls_reloads_total{result=\"refused\"}")
        {
            refused = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert!(refused, "an unusable rotation is counted as refused");
    assert_eq!(
        presented_certificate(ca.client_config(None), r.addr).await,
        second.der()
    );
    let (status, _) = https_request(
        ca.client_config(None),
        "POST",
        &format!("{url}/v1/completions"),
        COMPLETION,
    )
    .await
    .expect("still served after a refused rotation");
    assert_eq!(status, 200);
    r.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_ca_makes_client_certificates_required() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new(dir.path(), "ca");
    let server = ca.issue("server");
    let client = ca.issue("client");
    let other_ca = TestCa::new(dir.path(), "other-ca");
    let stranger = other_ca.issue("stranger");
    let backend = Backend::start("w0", &["m"]).await;
    let r = start_router(&config(&format!(
        "[server]\nmetrics_listen = \"127.0.0.1:0\"\n[server.tls]\ncert_file = \"{}\"\nkey_file = \"{}\"\nclient_ca_file = \"{}\"\n\n[[workers]]\nid = \"w0\"\nurl = \"{}\"\nmodels = [\"m\"]\n",
        toml_path(&server.cert_file),
        toml_path(&server.key_file),
        toml_path(&ca.cert_file),
        backend.url()
    )))
    .await;
    let url = format!("https://localhost:{}/v1/completions", r.addr.port());

    let anonymous = https_request(ca.client_config(None), "POST", &url, COMPLETION).await;
    assert!(anonymous.is_err(), "no client certificate: {anonymous:?}");
    let foreign = https_request(ca.client_config(Some(&stranger)), "POST", &url, COMPLETION).await;
    assert!(foreign.is_err(), "a certificate of another CA: {foreign:?}");
    assert_eq!(backend.count(), 0, "nothing reached the worker");
    let (status, _) = https_request(ca.client_config(Some(&client)), "POST", &url, COMPLETION)
        .await
        .expect("a client certificate of the configured CA");
    assert_eq!(status, 200);
    assert_eq!(backend.count(), 1);
    let text = metrics_text(r.metrics_addr.expect("metrics on their own address")).await;
    assert!(
        text.contains("kvroute_tls_handshake_failures_total 2"),
        "{text}"
    );
    r.shutdown().await;
}

/// An HTTPS worker that answers completions and says which model it serves.
fn worker_app() -> Router {
    Router::new()
        .route(
            "/v1/completions",
            post(|| async {
                (
                    [("content-type", "application/json")],
                    r#"{"id":"c","object":"text_completion","choices":[{"index":0,"text":"hi","finish_reason":"length"}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}"#,
                )
            }),
        )
        .route("/health", get(|| async { "ok" }))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_workers_are_reached_with_the_configured_ca_and_client_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new(dir.path(), "ca");
    let worker_cert = ca.issue("worker");
    let router_cert = ca.issue("router-client");
    let (worker_addr, worker) = https_worker(worker_app(), &worker_cert, Some(&ca)).await;
    let worker_url = format!("https://localhost:{}", worker_addr.port());

    let with_tls = start_router(&config(&format!(
        "[proxy.tls]\nca_file = \"{}\"\ncert_file = \"{}\"\nkey_file = \"{}\"\n\n[[workers]]\nid = \"w0\"\nurl = \"{worker_url}\"\nmodels = [\"m\"]\n",
        toml_path(&ca.cert_file),
        toml_path(&router_cert.cert_file),
        toml_path(&router_cert.key_file),
    )))
    .await;
    let resp = client()
        .post(format!("http://{}/v1/completions", with_tls.addr))
        .header("content-type", "application/json")
        .body(COMPLETION)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200, "{:?}", resp.text().await);
    with_tls.shutdown().await;

    // Without the CA (system roots only) the worker's certificate is not trusted: the request
    // fails as a worker failure would, with an OpenAI-shaped error.
    let without = start_router(&config(&format!(
        "[[workers]]\nid = \"w0\"\nurl = \"{worker_url}\"\nmodels = [\"m\"]\n"
    )))
    .await;
    let resp = client()
        .post(format!("http://{}/v1/completions", without.addr))
        .header("content-type", "application/json")
        .body(COMPLETION)
        .send()
        .await
        .unwrap();
    assert_openai_error(resp, 502).await;
    without.shutdown().await;
    worker.abort();
}

#[test]
fn tls_settings_that_do_not_go_together_are_refused() {
    for (text, field) in [
        ("[server.tls]\ncert_file = \"a.crt\"", "server.tls"),
        ("[server.tls]\nkey_file = \"a.key\"", "server.tls"),
        (
            "[server.tls]\ncert_file = \"a\"\nkey_file = \"b\"\nreload_interval_s = 0",
            "server.tls.reload_interval_s",
        ),
        ("[proxy.tls]\ncert_file = \"a.crt\"", "proxy.tls"),
        ("[server.tls]\ncertfile = \"a.crt\"", "certfile"),
    ] {
        let e = Config::from_toml(text, Path::new("t")).expect_err(text);
        assert!(e.to_string().contains(field), "{text}: {e}");
    }
}

#[tokio::test]
async fn a_router_whose_certificate_cannot_be_loaded_does_not_start() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.crt");
    let c = config(&format!(
        "[server.tls]\ncert_file = \"{}\"\nkey_file = \"{}\"\n",
        toml_path(&missing),
        toml_path(&missing)
    ));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let Err(e) = kvroute::server::start(&c, listener) else {
        panic!("a router without its certificate started");
    };
    assert!(e.to_string().contains("server.tls"), "{e}");
}
