//! The endpoints beyond completions and chat against real vLLM engines (issue 18, part 1):
//! `/tokenize` and `/detokenize` answered by kvroute itself must be byte for byte what vLLM
//! answers for the same body (prompt and chat forms), and what kvroute cannot answer is
//! forwarded; the Responses API through kvroute: a new response's prompt is counted as vLLM
//! counts it (kvroute renders `instructions` and `input` as vLLM does), and continuations,
//! `GET /v1/responses/{id}` and streams reach the engine that stored the response.
//!
//! Ignored by default; see `real_vllm.rs` for how they run. Two engines with the Responses API
//! store on (`VLLM_ENABLE_RESPONSES_API_STORE=1`).

use std::time::Duration;

use serde_json::{Value, json};

use crate::support::real_router::{MODEL, RealRouter, router_config};
use crate::support::request_kinds::document;
use crate::support::vllm::{VllmEngine, VllmOptions, VllmSetup};

fn worker_of(resp: &reqwest::Response) -> Option<String> {
    resp.headers()
        .get("x-kvroute-worker")
        .map(|v| v.to_str().unwrap().to_owned())
}

/// POSTs `body` to `url`: (worker header, status, body text).
async fn post(http: &reqwest::Client, url: &str, body: &Value) -> (Option<String>, u16, String) {
    let resp = http.post(url).json(body).send().await.expect("answers");
    let worker = worker_of(&resp);
    let status = resp.status().as_u16();
    (worker, status, resp.text().await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs real vLLM: scripts/real-engines/vllm-setup.sh; run by .ci/run"]
async fn tokenize_and_the_responses_api_through_kvroute_match_vllm() {
    let setup = VllmSetup::locate();
    let options = VllmOptions {
        responses_store: true,
        ..VllmOptions::default()
    };
    let engines = VllmEngine::start_all(&setup, 2, &options).await;
    let mut config = router_config(&setup, &engines, "kv_aware", &[]);
    // The workers' models are configured, not discovered: the router is told max_model_len.
    for m in config.models.iter_mut().filter(|m| m.name == MODEL) {
        m.max_model_len = Some(options.max_model_len as u64);
    }
    let router = RealRouter::start(&config).await;
    router.wait_ready().await;
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(120))
        .build()
        .unwrap();

    // /tokenize and /detokenize: kvroute's own answer equals vLLM's.
    let chat = json!([
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Ünïcödé, 東京, <|im_start|> and numbers 12345"},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": document("tokenize", 80)},
    ]);
    let local = [
        (
            "/tokenize",
            json!({"model": MODEL, "prompt": document("prompt", 120)}),
        ),
        (
            "/tokenize",
            json!({"prompt": "Hello, world!", "add_special_tokens": false, "return_token_strs": true}),
        ),
        ("/tokenize", json!({"model": MODEL, "messages": chat})),
        (
            "/tokenize",
            json!({"model": MODEL, "messages": chat, "add_generation_prompt": false,
                              "chat_template_kwargs": {"enable_thinking": false}, "return_token_strs": true}),
        ),
        (
            "/tokenize",
            json!({"model": MODEL, "messages": chat, "add_special_tokens": true}),
        ),
        (
            "/detokenize",
            json!({"model": MODEL, "tokens": [9707, 11, 1879, 0, 151644, 198, 151645]}),
        ),
    ];
    for (path, body) in &local {
        let (worker, status, text) = post(&http, &router.url(path), body).await;
        let (_, vllm_status, vllm_text) =
            post(&http, &format!("{}{path}", engines[0].url()), body).await;
        println!("{path} {status}: kvroute {text}");
        assert!(
            worker.is_none(),
            "{path} {body} was forwarded to {worker:?}"
        );
        assert_eq!(status, 200, "{path}: {text}");
        let (mine, theirs): (Value, Value) = (
            serde_json::from_str(&text).unwrap(),
            serde_json::from_str(&vllm_text).unwrap(),
        );
        assert_eq!((status, &mine), (vllm_status, &theirs), "{path} {body}");
        assert_eq!(text, vllm_text, "{path}: byte for byte");
    }
    // What only vLLM renders (tools through its request model) is forwarded: the same answer.
    let tools = json!({"model": MODEL, "messages": [{"role": "user", "content": "weather?"}],
        "tools": [{"type": "function", "function": {"name": "get_weather", "description": "d",
                   "parameters": {"type": "object", "properties": {}}}}]});
    let (worker, status, text) = post(&http, &router.url("/tokenize"), &tools).await;
    let (_, _, vllm_text) = post(&http, &format!("{}/tokenize", engines[0].url()), &tools).await;
    assert!(worker.is_some() && status == 200, "{status} {text}");
    assert_eq!(
        serde_json::from_str::<Value>(&text).unwrap()["tokens"],
        serde_json::from_str::<Value>(&vllm_text).unwrap()["tokens"]
    );

    // The Responses API: the prompt kvroute routes on is the one vLLM computes.
    let first = json!({"model": MODEL, "instructions": "Answer in one word.",
                       "input": [{"role": "user", "content": [{"type": "input_text", "text": document("responses", 200)}]}],
                       "max_output_tokens": 4, "temperature": 0});
    let explained = router.explain(&first, None).await;
    let resp = http
        .post(router.url("/v1/responses"))
        .json(&first)
        .send()
        .await
        .unwrap();
    let home = worker_of(&resp).expect("a worker answered");
    let v: Value = resp.json().await.unwrap();
    println!("responses: {v}");
    assert_eq!(v["object"], "response", "{v}");
    assert_eq!(
        v["usage"]["input_tokens"], explained["prompt_tokens"],
        "kvroute's rendering of instructions + input is vLLM's"
    );
    let id = v["id"].as_str().unwrap().to_owned();
    let next = json!({"model": MODEL, "previous_response_id": id, "input": "And again?",
                      "max_output_tokens": 4, "temperature": 0});
    let resp = http
        .post(router.url("/v1/responses"))
        .json(&next)
        .send()
        .await
        .unwrap();
    assert_eq!(worker_of(&resp).as_deref(), Some(home.as_str()));
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["previous_response_id"], id.as_str(), "{v}");
    let resp = http
        .get(router.url(&format!("/v1/responses/{id}")))
        .send()
        .await
        .unwrap();
    assert_eq!(worker_of(&resp).as_deref(), Some(home.as_str()));
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.json::<Value>().await.unwrap()["id"], id.as_str());
    let other = engines.iter().find(|e| e.name != home).unwrap();
    let direct = http
        .get(format!("{}/v1/responses/{id}", other.url()))
        .send()
        .await
        .unwrap();
    assert_eq!(direct.status(), 404, "the other engine does not store it");

    // A stream teaches its id through `response.created`.
    let stream = json!({"model": MODEL, "input": document("stream", 60), "stream": true,
                        "max_output_tokens": 4, "temperature": 0});
    let resp = http
        .post(router.url("/v1/responses"))
        .json(&stream)
        .send()
        .await
        .unwrap();
    let streamed_on = worker_of(&resp).unwrap();
    let text = resp.text().await.unwrap();
    let created: Value = text
        .lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .filter_map(|d| serde_json::from_str::<Value>(d.trim()).ok())
        .find(|e| e["type"] == "response.created")
        .expect("a response.created event");
    assert!(text.contains("response.output_text.delta") && text.contains("response.completed"));
    let sid = created["response"]["id"].as_str().unwrap();
    let resp = http
        .post(router.url("/v1/responses"))
        .json(&json!({"model": MODEL, "previous_response_id": sid, "input": "More.", "max_output_tokens": 2}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(worker_of(&resp).as_deref(), Some(streamed_on.as_str()));
    router.shutdown().await;
}
