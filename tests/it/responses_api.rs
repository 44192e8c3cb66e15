//! The Responses API through the router, against simulated engines that store responses per
//! engine (an id stored on one is a 404 on the other): new responses are routed on their KV
//! prefix like chats; continuations (`previous_response_id`), `GET`, `DELETE` and `cancel` go
//! to the worker that stored the response, learned from the id in its answer (JSON or stream);
//! ids are per tenant; a worker that drains or leaves is a clear error, never a guess.

use std::time::Duration;

use kvroute::server::RouterHandle;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use tokio::net::TcpListener;

use crate::support::{self, ADMIN_ON_LOOPBACK, SimEngine, assert_openai_error};

const MODEL: &str = "sim";

struct Stack {
    router: RouterHandle,
    engines: Vec<SimEngine>,
    http: reqwest::Client,
}

fn hex_sha(key: &str) -> String {
    Sha256::digest(key.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

impl Stack {
    async fn start(extra: &str) -> Stack {
        let mut engines = Vec::new();
        for seed in 0..2 {
            engines.push(SimEngine::start(MODEL, seed, 50.0).await);
        }
        let text = format!(
            "policy = \"kv_aware\"\nshutdown_grace_s = 1.0\n[health]\ninterval_s = 0.2\n\
             [[models]]\nname = \"{MODEL}\"\nblock_size = 16\n[kv_aware]\ncalibrate = false\n{extra}"
        );
        let config = SimEngine::config_over(&text, &engines, MODEL);
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let router = kvroute::server::start(&config, listener).unwrap();
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(30))
            .build()
            .unwrap();
        Stack {
            router,
            engines,
            http,
        }
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.router.addr)
    }

    fn request(
        &self,
        method: reqwest::Method,
        path: &str,
        key: Option<&str>,
    ) -> reqwest::RequestBuilder {
        let r = self.http.request(method, self.url(path));
        match key {
            Some(k) => r.bearer_auth(k),
            None => r,
        }
    }

    /// `POST /v1/responses`; (worker, answer).
    async fn create(&self, body: Value, key: Option<&str>) -> (String, Value) {
        let resp = self
            .request(reqwest::Method::POST, "/v1/responses", key)
            .json(&body)
            .send()
            .await
            .unwrap();
        let status = resp.status();
        let worker = worker_of(&resp).unwrap_or_default();
        let v: Value = resp.json().await.unwrap();
        assert_eq!(status, 200, "{v}");
        (worker, v)
    }

    async fn get(&self, id: &str, key: Option<&str>) -> reqwest::Response {
        self.request(reqwest::Method::GET, &format!("/v1/responses/{id}"), key)
            .send()
            .await
            .unwrap()
    }

    async fn admin(&self, path: &str) {
        let resp = self
            .request(reqwest::Method::POST, path, None)
            .send()
            .await
            .unwrap();
        assert!(resp.status().is_success(), "{path}: {}", resp.status());
    }

    /// Waits until the index holds at least one block of `body`'s prompt on `worker`.
    async fn settle(&self, body: &Value, worker: &str) {
        for _ in 0..250 {
            let v = support::post_json(&self.url("/debug/route"), body).await;
            let held = v["candidates"]
                .as_array()
                .unwrap()
                .iter()
                .find(|c| c["worker"] == worker)
                .map_or(0, |c| c["overlap_blocks"].as_u64().unwrap_or(0));
            if held > 0 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("the index never learned {worker}'s blocks");
    }
}

fn worker_of(resp: &reqwest::Response) -> Option<String> {
    resp.headers()
        .get("x-kvroute-worker")
        .map(|v| v.to_str().unwrap().to_owned())
}

fn document(words: usize) -> String {
    (0..words).map(|i| format!("w{i} ")).collect()
}

/// The events of an SSE body, by type.
fn events(text: &str) -> Vec<Value> {
    text.lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .filter_map(|d| serde_json::from_str(d.trim()).ok())
        .collect()
}

#[tokio::test]
async fn stored_responses_are_reached_on_the_worker_that_stored_them() {
    let s = Stack::start(ADMIN_ON_LOOPBACK).await;
    let first = json!({"model": MODEL, "instructions": "Answer briefly.",
                       "input": document(300), "max_output_tokens": 3});
    // The router renders the prompt as the engine does: its token count is the engine's.
    let explained = support::post_json(&s.url("/debug/route"), &first).await;
    let (home, v) = s.create(first.clone(), None).await;
    assert_eq!(v["object"], "response");
    assert_eq!(v["status"], "incomplete", "3 tokens of output: {v}");
    assert_eq!(
        v["usage"]["input_tokens"], explained["prompt_tokens"],
        "{v}\n{explained}"
    );
    assert_eq!(v["output"][0]["content"][0]["type"], "output_text");
    let mut id = v["id"].as_str().unwrap().to_owned();
    assert!(id.starts_with("resp_"));

    // Continuations follow the stored response, whatever the load or prefix says.
    for turn in 0..4 {
        let body = json!({"model": MODEL, "previous_response_id": id, "input": format!("turn {turn}"),
                          "max_output_tokens": 2});
        let (worker, v) = s.create(body, None).await;
        assert_eq!(worker, home, "turn {turn}");
        assert_eq!(v["previous_response_id"], id.as_str());
        // The stored conversation is the prompt's prefix: the engine serves it from its cache
        // (but for the first turn: instructions do not carry over, so its prompt no longer
        // starts with the first one's system message, as in vLLM).
        let cached = v["usage"]["input_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap();
        assert!(turn == 0 || cached > 0, "turn {turn}: {v}");
        id = v["id"].as_str().unwrap().to_owned();
    }
    let resp = s.get(&id, None).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(worker_of(&resp).as_deref(), Some(home.as_str()));
    assert_eq!(resp.json::<Value>().await.unwrap()["id"], id.as_str());
    // The other engine does not have it.
    let other = &s.engines[usize::from(home == "e0")];
    let direct = s
        .http
        .get(format!("{}/v1/responses/{id}", other.url()))
        .send()
        .await
        .unwrap();
    assert_eq!(direct.status(), 404);

    // A new response on the same prompt is routed on its prefix like a chat: to where it is
    // cached.
    s.settle(&first, &home).await;
    let (again, v) = s.create(first.clone(), None).await;
    assert_eq!(again, home);
    assert!(
        v["usage"]["input_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap()
            > 0,
        "{v}"
    );

    // A stream teaches its id through `response.created`.
    let stream = s
        .request(reqwest::Method::POST, "/v1/responses", None)
        .json(
            &json!({"model": MODEL, "input": document(40), "stream": true, "max_output_tokens": 4}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(stream.status(), 200);
    let streamed_on = worker_of(&stream).unwrap();
    let evs = events(&stream.text().await.unwrap());
    assert_eq!(evs[0]["type"], "response.created");
    assert_eq!(evs.last().unwrap()["type"], "response.completed");
    let deltas = evs
        .iter()
        .filter(|e| e["type"] == "response.output_text.delta")
        .count();
    assert_eq!(deltas, 4);
    let sid = evs[0]["response"]["id"].as_str().unwrap().to_owned();
    let (worker, _) = s
        .create(
            json!({"model": MODEL, "previous_response_id": sid, "input": "more"}),
            None,
        )
        .await;
    assert_eq!(worker, streamed_on);

    // cancel goes to the holder (which answers); DELETE forgets; unknown ids never reach a worker.
    let cancel = s
        .request(
            reqwest::Method::POST,
            &format!("/v1/responses/{id}/cancel"),
            None,
        )
        .send()
        .await
        .unwrap();
    assert_eq!(worker_of(&cancel).as_deref(), Some(home.as_str()));
    assert_openai_error(cancel, 400).await;
    let deleted = s
        .request(
            reqwest::Method::DELETE,
            &format!("/v1/responses/{id}"),
            None,
        )
        .send()
        .await
        .unwrap();
    assert_eq!(deleted.status(), 200);
    assert_eq!(deleted.json::<Value>().await.unwrap()["deleted"], true);
    let gone = s.get(&id, None).await;
    assert!(worker_of(&gone).is_none());
    let e = assert_openai_error(gone, 404).await;
    assert_eq!(e["code"], "response_not_found");
    let e = assert_openai_error(s.get("resp_never_seen", None).await, 404).await;
    assert_eq!(e["param"], "response_id");

    let metrics = support::metrics_text(s.router.addr).await;
    for needle in [
        r#"kvroute_response_affinity_total{outcome="learned"}"#,
        r#"kvroute_response_affinity_total{outcome="routed"}"#,
        r#"kvroute_response_affinity_total{outcome="unknown"} 2"#,
        r#"kvroute_requests_total{endpoint="responses",model="sim",status="200""#,
        "kvroute_response_affinity_entries ",
    ] {
        assert!(metrics.contains(needle), "{needle}:\n{metrics}");
    }
    s.router.shutdown().await;
}

#[tokio::test]
async fn a_draining_or_departed_holder_is_an_error_not_a_guess() {
    let s = Stack::start(ADMIN_ON_LOOPBACK).await;
    let (home, v) = s
        .create(
            json!({"model": MODEL, "input": "hello", "max_output_tokens": 2}),
            None,
        )
        .await;
    let id = v["id"].as_str().unwrap().to_owned();
    let next = json!({"model": MODEL, "previous_response_id": id, "input": "again"});

    s.admin(&format!("/admin/workers/{home}/drain")).await;
    let resp = s
        .request(reqwest::Method::POST, "/v1/responses", None)
        .json(&next)
        .send()
        .await
        .unwrap();
    assert!(resp.headers().get("retry-after").is_some());
    let e = assert_openai_error(resp, 503).await;
    assert_eq!(e["code"], "response_holder_unavailable");
    // A new conversation still goes to the other worker.
    let (other, _) = s
        .create(json!({"model": MODEL, "input": "fresh"}), None)
        .await;
    assert_ne!(other, home);

    let removed = s
        .request(
            reqwest::Method::DELETE,
            &format!("/admin/workers/{home}"),
            None,
        )
        .send()
        .await
        .unwrap();
    assert!(removed.status().is_success(), "{}", removed.status());
    let resp = s
        .request(reqwest::Method::POST, "/v1/responses", None)
        .json(&next)
        .send()
        .await
        .unwrap();
    let e = assert_openai_error(resp, 404).await;
    assert_eq!(e["code"], "response_holder_gone");
    assert_eq!(e["param"], "previous_response_id");
    let metrics = support::metrics_text(s.router.addr).await;
    assert!(
        metrics.contains(r#"kvroute_response_affinity_total{outcome="holder_gone"} 1"#),
        "{metrics}"
    );
    assert!(metrics.contains(r#"kvroute_response_affinity_total{outcome="holder_unavailable"} 1"#));
    s.router.shutdown().await;
}

#[tokio::test]
async fn one_tenant_cannot_address_anothers_responses() {
    let extra = format!(
        "[[tenants]]\nname = \"acme\"\napi_key_sha256 = \"{}\"\n\
         [[tenants]]\nname = \"bob\"\napi_key_sha256 = \"{}\"\n",
        hex_sha("key-acme"),
        hex_sha("key-bob")
    );
    let s = Stack::start(&extra).await;
    let (home, v) = s
        .create(
            json!({"model": MODEL, "input": "secret", "max_output_tokens": 2}),
            Some("key-acme"),
        )
        .await;
    let id = v["id"].as_str().unwrap().to_owned();
    let mine = s.get(&id, Some("key-acme")).await;
    assert_eq!(mine.status(), 200);
    assert_eq!(worker_of(&mine).as_deref(), Some(home.as_str()));
    let e = assert_openai_error(s.get(&id, Some("key-bob")).await, 404).await;
    assert_eq!(e["code"], "response_not_found");
    let steal = s
        .request(reqwest::Method::POST, "/v1/responses", Some("key-bob"))
        .json(&json!({"model": MODEL, "previous_response_id": id, "input": "x"}))
        .send()
        .await
        .unwrap();
    assert_openai_error(steal, 404).await;
    assert_openai_error(s.get(&id, None).await, 401).await;
    s.router.shutdown().await;
}

/// Issue 35 item 4: vLLM takes a body's `request_id` as the response's id and keys its store
/// by id alone. The router forwarded a tenant's chosen id as is, so another tenant choosing the
/// same id got the same response id (and, on the same engine, read, continued or overwrote the
/// first tenant's response). A tenant's chosen id is now namespaced to it.
#[tokio::test]
async fn a_chosen_request_id_cannot_reach_another_tenants_response() {
    let extra = format!(
        "[[tenants]]\nname = \"acme\"\napi_key_sha256 = \"{}\"\n\
         [[tenants]]\nname = \"bob\"\napi_key_sha256 = \"{}\"\n",
        hex_sha("key-acme"),
        hex_sha("key-bob")
    );
    let s = Stack::start(&extra).await;
    let body = |who: &str, id: &str| {
        json!({"model": MODEL, "input": format!("{who}'s secret"), "instructions": who,
               "max_output_tokens": 2, "request_id": id})
    };
    let (_, a) = s
        .create(body("acme", "resp_chosen"), Some("key-acme"))
        .await;
    let acme_id = a["id"].as_str().unwrap().to_owned();
    let (_, b) = s.create(body("bob", "resp_chosen"), Some("key-bob")).await;
    let bob_id = b["id"].as_str().unwrap().to_owned();
    assert_ne!(
        acme_id, bob_id,
        "two tenants chose one id and got one response id"
    );
    // Bob choosing acme's actual id gets another one too, and acme's response is intact.
    for _ in 0..2 {
        let (_, b) = s.create(body("bob", &acme_id), Some("key-bob")).await;
        assert_ne!(b["id"], acme_id.as_str());
    }
    let mine = s.get(&acme_id, Some("key-acme")).await;
    assert_eq!(mine.status(), 200);
    let v: Value = mine.json().await.unwrap();
    assert_eq!(v["instructions"], "acme", "{v}");
    assert_openai_error(s.get(&acme_id, Some("key-bob")).await, 404).await;
    // The same tenant choosing the same id again reaches its own response's id.
    let (_, again) = s
        .create(body("acme", "resp_chosen"), Some("key-acme"))
        .await;
    assert_eq!(again["id"], acme_id.as_str());
    s.router.shutdown().await;
}
