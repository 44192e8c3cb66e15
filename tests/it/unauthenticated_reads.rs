//! Reads that say what is deployed: with tenants, `GET /v1/models` needs a key and lists only
//! the caller's models; `/metrics` can be moved to a listener of its own.

use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::support::*;

fn sha(key: &str) -> String {
    Sha256::digest(key.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

async fn model_ids(resp: reqwest::Response) -> Vec<String> {
    assert_eq!(resp.status(), 200);
    let v: Value = resp.json().await.unwrap();
    v["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test]
async fn the_model_list_needs_a_key_and_shows_only_the_tenants_models() {
    let b = Backend::start("a", &["big", "small"]).await;
    let tenants = format!(
        "[[tenants]]\nname = \"acme\"\napi_key_sha256 = \"{}\"\n[[tenants]]\nname = \"bob\"\napi_key_sha256 = \"{}\"\nmodels = [\"small\"]\n[admin]\napi_key_sha256 = \"{}\"\n",
        sha("key-acme"),
        sha("key-bob"),
        sha("key-admin")
    );
    let r = start_router(&router_config(
        PolicyKind::RoundRobin,
        &[(b.url(), vec!["big", "small"])],
        &tenants,
    ))
    .await;
    let c = client();
    let url = format!("http://{}/v1/models", r.addr);
    let e = assert_openai_error(c.get(&url).send().await.unwrap(), 401).await;
    assert_eq!(e["code"], "invalid_api_key");
    assert_openai_error(c.get(&url).bearer_auth("wrong").send().await.unwrap(), 401).await;
    let get = |key: &'static str| c.get(&url).bearer_auth(key).send();
    assert_eq!(model_ids(get("key-bob").await.unwrap()).await, ["small"]);
    assert_eq!(
        model_ids(get("key-acme").await.unwrap()).await,
        ["big", "small"]
    );
    assert_eq!(
        model_ids(get("key-admin").await.unwrap()).await,
        ["big", "small"]
    );
    r.shutdown().await;

    // Without tenants the list stays open.
    let r = start_router_over(PolicyKind::RoundRobin, &[&b], "").await;
    let open = c.get(format!("http://{}/v1/models", r.addr)).send().await;
    assert_eq!(model_ids(open.unwrap()).await, ["m"]);
    r.shutdown().await;
}

#[tokio::test]
async fn metrics_listen_moves_metrics_off_the_main_listener() {
    let b = Backend::start("a", &["m"]).await;
    let r = start_router_over(
        PolicyKind::RoundRobin,
        &[&b],
        &format!("[server]\nmetrics_listen = \"127.0.0.1:0\"\n{ADMIN_ON_LOOPBACK}"),
    )
    .await;
    let metrics_addr = r.metrics_addr.expect("a metrics listener");
    assert_ne!(metrics_addr, r.addr);
    let c = client();
    let resp = complete(
        &c,
        r.addr,
        &serde_json::json!({"model": "m", "prompt": "x"}),
    )
    .await;
    assert_eq!(resp.status(), 200);
    resp.bytes().await.unwrap();
    let main = c
        .get(format!("http://{}/metrics", r.addr))
        .send()
        .await
        .unwrap();
    assert_openai_error(main, 404).await;
    let text = metrics_text(metrics_addr).await;
    assert!(
        text.contains(
            r#"kvroute_requests_total{endpoint="completions",model="m",status="200",worker="w0"} 1"#
        ),
        "{text}"
    );
    // The metrics listener serves nothing else.
    let other = c
        .get(format!("http://{metrics_addr}/v1/models"))
        .send()
        .await
        .unwrap();
    assert_openai_error(other, 404).await;
    // Nor can it be added as a worker: it is the router's own address.
    let me = c
        .post(format!("http://{}/admin/workers", r.addr))
        .json(&serde_json::json!({"url": format!("http://{metrics_addr}")}))
        .send()
        .await
        .unwrap();
    assert_openai_error(me, 400).await;
    r.shutdown().await;

    // Unset, /metrics stays on the main listener.
    let r = start_router_over(PolicyKind::RoundRobin, &[&b], "").await;
    assert!(r.metrics_addr.is_none());
    assert!(metrics_text(r.addr).await.contains("kvroute_"));
    r.shutdown().await;
}
