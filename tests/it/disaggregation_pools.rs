//! Disaggregated pools as configured and administered: a model with one side only is a load
//! error or a 503, never a request sent whole to a worker that cannot serve it; roles and
//! bootstrap ports are checked alike in the file and the admin API.

use std::path::Path;

use kvroute::config::Config;
use serde_json::{Value, json};

use crate::disaggregation::{MODEL, W, backend, config_text, router};
use crate::support::*;

fn config_error(text: &str) -> String {
    match Config::from_toml(text, Path::new("test")) {
        Ok(_) => panic!("accepted: {text}"),
        Err(e) => e.to_string(),
    }
}

fn w(id: &'static str, port: u16, role: &'static str) -> W {
    W {
        id,
        url: format!("http://127.0.0.1:{port}"),
        role,
        events: None,
        bootstrap: None,
    }
}

#[test]
fn a_half_disaggregated_model_and_bad_roles_are_config_errors() {
    let e = config_error(&config_text(
        "vllm",
        &[w("d0", 1, "decode"), w("d1", 2, "decode")],
        "",
    ));
    assert!(e.contains("no prefill worker"), "{e}");
    let e = config_error(&config_text("vllm", &[w("p0", 1, "prefill")], ""));
    assert!(e.contains("no decode worker"), "{e}");
    let e = config_error(&config_text("vllm", &[w("p0", 1, "prefil")], ""));
    assert!(
        e.contains("workers[0].role") && e.contains("prefill"),
        "{e}"
    );
    let mut d = w("d0", 2, "decode");
    d.bootstrap = Some(8998);
    let e = config_error(&config_text("sglang", &[w("p0", 1, "prefill"), d], ""));
    assert!(e.contains("workers[1].bootstrap_port"), "{e}");
    let e = config_error(&config_text(
        "nixl",
        &[w("p0", 1, "prefill"), w("d0", 2, "decode")],
        "",
    ));
    assert!(e.contains("models[0].disaggregation"), "{e}");
    let ok = config_text("sglang", &[w("p0", 1, "prefill"), w("b0", 2, "both")], "");
    Config::from_toml(&ok, Path::new("test")).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_api_takes_roles_and_a_model_without_a_prefill_worker_is_a_503() {
    let b = Backend::start("b", &[MODEL, "other"]).await;
    let r = router("vllm", &[backend("b0", &b, "both")], ADMIN_ON_LOOPBACK).await;
    let c = client();
    let add = |body: Value| {
        let c = c.clone();
        let url = format!("http://{}/admin/workers", r.addr);
        async move { c.post(url).json(&body).send().await.unwrap() }
    };
    let other = Backend::start("o", &["other"]).await;
    let resp =
        add(json!({"url": other.url(), "id": "dec", "models": ["other"], "role": "decode"})).await;
    assert_eq!(resp.status(), 201);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(
        (v["role"].as_str(), v["bootstrap_port"].as_u64()),
        (Some("decode"), None)
    );
    let bad = add(json!({"url": "http://127.0.0.1:9", "id": "x", "role": "encode"})).await;
    assert_eq!(assert_openai_error(bad, 400).await["param"], "role");
    let bad = add(
        json!({"url": "http://127.0.0.1:9", "id": "x", "role": "decode", "bootstrap_port": 8998}),
    )
    .await;
    assert_eq!(
        assert_openai_error(bad, 400).await["param"],
        "bootstrap_port"
    );
    let list: Value = c
        .get(format!("http://{}/admin/workers", r.addr))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let roles: Vec<_> = list["workers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| (w["id"].clone(), w["role"].clone()))
        .collect();
    assert_eq!(
        roles,
        [
            (json!("b0"), json!("both")),
            (json!("dec"), json!("decode"))
        ]
    );
    // A model served by a decode worker alone has no prefill worker: 503, never a whole
    // request sent to a decode engine.
    let lonely = Backend::start("l", &["lonely"]).await;
    let resp =
        add(json!({"url": lonely.url(), "id": "dec2", "models": ["lonely"], "role": "decode"}))
            .await;
    assert_eq!(resp.status(), 201);
    let resp = complete(&c, r.addr, &json!({"model": "lonely", "prompt": "hi"})).await;
    let e = assert_openai_error(resp, 503).await;
    assert_eq!(e["code"], "no_prefill_worker", "{e}");
}
