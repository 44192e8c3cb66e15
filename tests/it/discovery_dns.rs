//! DNS discovery: the name `localhost` (which resolves to 127.0.0.1 here) with a port is a
//! worker marked `dns`; requests reach it; the admin API lists every worker's source and
//! refuses to remove the discovered one unless forced. A name that does not resolve counts
//! errors and adds nothing.

use serde_json::{Value, json};

use crate::support::*;

async fn workers(c: &reqwest::Client, r: std::net::SocketAddr) -> Vec<Value> {
    let v: Value = c
        .get(format!("http://{r}/admin/workers"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    v["workers"].as_array().unwrap().clone()
}

#[tokio::test]
async fn a_resolved_name_is_a_worker_that_the_admin_api_keeps_unless_forced() {
    let found = Backend::start("found", &["m"]).await;
    let listed = Backend::start("listed", &["m"]).await;
    let added = Backend::start("added", &["m"]).await;
    let port = found.addr.port();
    let extra = format!(
        "[discovery.dns]\nname = \"localhost\"\nport = {port}\ninterval_s = 0.2\n{ADMIN_ON_LOOPBACK}"
    );
    let router = start_router_over(PolicyKind::RoundRobin, &[&listed], &extra).await;
    let r = router.addr;
    let c = client();
    let id = format!("dns:127.0.0.1:{port}");
    let end = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !workers(&c, r).await.iter().any(|w| w["id"] == id.as_str()) {
        assert!(std::time::Instant::now() < end, "{id} never joined");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let resp = c
        .post(format!("http://{r}/admin/workers"))
        .json(&json!({"url": added.url(), "id": "added"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 201);
    let sources: std::collections::BTreeMap<String, String> = workers(&c, r)
        .await
        .iter()
        .map(|w| {
            (
                w["id"].as_str().unwrap().to_owned(),
                w["source"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(sources.get(&id).map(String::as_str), Some("dns"));
    assert_eq!(sources.get("w0").map(String::as_str), Some("config"));
    assert_eq!(sources.get("added").map(String::as_str), Some("admin"));
    for i in 0..12 {
        let resp = complete(
            &c,
            r,
            &json!({"model": "m", "prompt": format!("p{i}"), "max_tokens": 2}),
        )
        .await;
        assert_eq!(resp.status(), 200);
    }
    assert!(found.count() > 0, "the discovered worker took no request");
    let delete = |force: bool| {
        let c = c.clone();
        let url = format!(
            "http://{r}/admin/workers/{id}{}",
            if force { "?force=true" } else { "" }
        );
        async move { c.delete(url).send().await.unwrap() }
    };
    let e = assert_openai_error(delete(false).await, 409).await;
    assert_eq!(e["code"], "worker_discovered");
    assert!(e["message"].as_str().unwrap().contains("force=true"), "{e}");
    // Admin and config workers are removed as before.
    let resp = c
        .delete(format!("http://{r}/admin/workers/added"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let resp = delete(true).await;
    assert_eq!(resp.status(), 200);
    assert!(!workers(&c, r).await.iter().any(|w| w["id"] == id.as_str()));
    router.shutdown().await;
}

#[tokio::test]
async fn a_name_that_does_not_resolve_adds_nothing_and_counts_errors() {
    let listed = Backend::start("listed", &["m"]).await;
    let extra = "[discovery.dns]\nname = \"kvroute-test.invalid\"\nport = 8000\ninterval_s = 0.2\n";
    let router = start_router_over(PolicyKind::RoundRobin, &[&listed], extra).await;
    let r = router.addr;
    let series = "kvroute_discovery_events_total{kind=\"error\",source=\"dns\"}";
    let end = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let text = metrics_text(r).await;
        if text.lines().any(|l| l.starts_with(series)) {
            break;
        }
        assert!(
            std::time::Instant::now() < end,
            "no resolution error counted"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(workers(&client(), r).await.len(), 1);
    let resp = complete(
        &client(),
        r,
        &json!({"model": "m", "prompt": "p", "max_tokens": 2}),
    )
    .await;
    assert_eq!(resp.status(), 200);
    router.shutdown().await;
}
