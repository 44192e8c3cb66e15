//! `/tokenize` and `/detokenize` through the router: answered by the router itself, with the
//! model's own tokenizer, byte for byte what the engine answers (the simulated engine here,
//! with the Qwen3 tokenizer and chat template; vLLM itself in `real_vllm.rs`); forwarded when
//! the router lacks the tokenizer or the request uses what only the engine renders.

use serde_json::{Value, json};

use crate::support::*;

const MODEL: &str = "qwen";

fn qwen_dir() -> String {
    fixtures().join("tokenizers/qwen3").display().to_string()
}

/// The router answered it (no worker named).
fn answered_here(resp: &reqwest::Response) -> bool {
    resp.headers().get("x-kvroute-worker").is_none()
}

async fn ask(url: &str, body: &Value) -> (bool, u16, String) {
    let resp = client().post(url).json(body).send().await.unwrap();
    let here = answered_here(&resp);
    let status = resp.status().as_u16();
    (here, status, resp.text().await.unwrap())
}

/// Bodies the router answers itself.
fn local_bodies() -> Vec<(&'static str, Value)> {
    let chat = json!([
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Ünïcödé, 東京 and <|im_start|> in text"},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": "again"},
    ]);
    vec![
        (
            "/tokenize",
            json!({"model": MODEL, "prompt": "Hello, world! 12345"}),
        ),
        (
            "/tokenize",
            json!({"prompt": "no model given", "add_special_tokens": false}),
        ),
        (
            "/tokenize",
            json!({"model": MODEL, "prompt": "strs", "return_token_strs": true}),
        ),
        ("/tokenize", json!({"model": MODEL, "messages": chat})),
        (
            "/tokenize",
            json!({"model": MODEL, "messages": chat, "add_generation_prompt": false,
                              "chat_template_kwargs": {"enable_thinking": false},
                              "return_token_strs": true}),
        ),
        (
            "/tokenize",
            json!({"model": MODEL, "messages": chat, "add_special_tokens": true}),
        ),
        (
            "/detokenize",
            json!({"model": MODEL, "tokens": [9707, 11, 1879, 0, 151644]}),
        ),
    ]
}

#[tokio::test]
async fn the_router_answers_tokenize_exactly_as_the_engine() {
    let engine = SimEngine::start_plain(MODEL, &qwen_dir()).await;
    // Models discovered from the worker's /v1/models, whose `max_model_len` the answer reports.
    let toml = format!(
        "shutdown_grace_s = 1.0\n[health]\ninterval_s = 0.1\n[[models]]\nname = \"{MODEL}\"\n\
         tokenizer = \"{}\"\n[[workers]]\nid = \"w0\"\nurl = \"{}\"\n",
        qwen_dir(),
        engine.url()
    );
    let r = start_router(
        &kvroute::config::Config::from_toml(&toml, std::path::Path::new("t")).unwrap(),
    )
    .await;
    assert!(
        wait_for(std::time::Duration::from_secs(10), || reported(&r, MODEL)).await,
        "the worker's models were never read"
    );
    for (path, body) in local_bodies() {
        let (here, status, text) = ask(&format!("http://{}{path}", r.addr), &body).await;
        let (_, engine_status, engine_text) = ask(&format!("{}{path}", engine.url()), &body).await;
        assert!(here, "{path} {body} was forwarded");
        assert_eq!(
            (status, &text),
            (engine_status, &engine_text),
            "{path} {body}"
        );
        assert_eq!(status, 200, "{text}");
    }
    let strs: Value = serde_json::from_str(
        &ask(
            &format!("http://{}/tokenize", r.addr),
            &json!({"prompt": "Hello world", "return_token_strs": true}),
        )
        .await
        .2,
    )
    .unwrap();
    assert_eq!(strs["token_strs"], json!(["Hello", "Ġworld"]), "{strs}");

    // What only the engine renders (or refuses) is forwarded, and its answer relayed.
    for body in [
        json!({"model": MODEL, "messages": [{"role": "user", "content": "x"}],
               "tools": [{"type": "function", "function": {"name": "f"}}]}),
        json!({"model": MODEL, "messages": [{"role": "user", "content": [{"type": "text", "text": "x"}]}]}),
        json!({"model": MODEL, "prompt": 3}),
        json!({"model": MODEL, "tokens": [-1]}),
    ] {
        let path = if body.get("tokens").is_some() {
            "/detokenize"
        } else {
            "/tokenize"
        };
        let (here, status, _) = ask(&format!("http://{}{path}", r.addr), &body).await;
        assert!(!here, "{body} was answered by the router");
        assert_eq!(status, 400, "{body}");
    }
    let e = assert_openai_error(
        client()
            .post(format!("http://{}/tokenize", r.addr))
            .json(&json!({"model": "nope", "prompt": "x"}))
            .send()
            .await
            .unwrap(),
        404,
    )
    .await;
    assert_eq!(e["code"], "model_not_found");
    let text = metrics_text(r.addr).await;
    assert!(
        text.contains(&format!(
            r#"kvroute_requests_total{{endpoint="tokenize",model="{MODEL}",status="200",worker="-"}} 7"#
        )),
        "{text}"
    );
    assert!(text.contains(&format!(
        r#"kvroute_requests_total{{endpoint="detokenize",model="{MODEL}",status="200",worker="-"}} 1"#
    )));
    r.shutdown().await;
}

/// Whether every worker has reported its context for `model` (from its `/v1/models`).
fn reported(r: &kvroute::server::RouterHandle, model: &str) -> bool {
    r.state
        .fleet
        .workers()
        .iter()
        .all(|w| w.max_model_len(model).is_some())
}

/// Without the model's tokenizer (or with `local_tokenize = false`) every request is
/// forwarded; with it, a configured `max_model_len` is enough before any worker reports one.
#[tokio::test]
async fn without_the_models_tokenizer_tokenize_is_forwarded() {
    let engine = SimEngine::start_plain(MODEL, "builtin").await;
    let workers = [(engine.url(), vec![MODEL])];
    for extra in [
        // Listed, but builtin: not the engine's own tokenizer as far as the router knows.
        format!("[[models]]\nname = \"{MODEL}\"\nmax_model_len = 4096\n"),
        format!(
            "[endpoints]\nlocal_tokenize = false\n[[models]]\nname = \"{MODEL}\"\ntokenizer = \"{}\"\nmax_model_len = 4096\n",
            qwen_dir()
        ),
    ] {
        let r = start_router(&router_config(PolicyKind::KvAware, &workers, &extra)).await;
        let (here, status, text) = ask(
            &format!("http://{}/tokenize", r.addr),
            &json!({"model": MODEL, "prompt": "hello there"}),
        )
        .await;
        assert!(!here && status == 200, "{extra}: {text}");
        r.shutdown().await;
    }
    // A configured `max_model_len` is enough with the model's tokenizer. (The engine reports
    // the same on the router's first health check, which may come first: the worker's own
    // report is preferred, as in routing.)
    let engine = SimEngine::start_plain_with_context(MODEL, &qwen_dir(), 1234).await;
    let extra = format!(
        "[[models]]\nname = \"{MODEL}\"\ntokenizer = \"{}\"\nmax_model_len = 1234\n",
        qwen_dir()
    );
    let r = start_router(&router_config(
        PolicyKind::KvAware,
        &[(engine.url(), vec![MODEL])],
        &extra,
    ))
    .await;
    let (here, status, text) = ask(
        &format!("http://{}/tokenize", r.addr),
        &json!({"model": MODEL, "prompt": "hello there"}),
    )
    .await;
    assert!(here && status == 200, "{text}");
    assert_eq!(
        serde_json::from_str::<Value>(&text).unwrap()["max_model_len"],
        1234
    );
    r.shutdown().await;
}

/// In a fleet of mixed contexts `/tokenize` names the largest: routing sends a prompt where
/// its context fits (`routing::context_fit`), so that is the longest prompt the fleet takes.
/// Each worker's own report comes before the configured `max_model_len`, as in routing.
#[tokio::test]
async fn tokenize_names_the_largest_context_of_a_mixed_fleet() {
    let small = SimEngine::start_plain_with_context(MODEL, &qwen_dir(), 256).await;
    let large = SimEngine::start_plain_with_context(MODEL, &qwen_dir(), 4096).await;
    let extra = format!(
        "[health]\ninterval_s = 0.1\n[[models]]\nname = \"{MODEL}\"\ntokenizer = \"{}\"\nmax_model_len = 1234\n",
        qwen_dir()
    );
    let workers = [(small.url(), vec![MODEL]), (large.url(), vec![MODEL])];
    let r = start_router(&router_config(PolicyKind::KvAware, &workers, &extra)).await;
    assert!(
        wait_for(std::time::Duration::from_secs(10), || reported(&r, MODEL)).await,
        "the workers' contexts were never read"
    );
    let (here, status, text) = ask(
        &format!("http://{}/tokenize", r.addr),
        &json!({"model": MODEL, "prompt": "hello there"}),
    )
    .await;
    assert!(here && status == 200, "{text}");
    let answer: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(answer["max_model_len"], 4096, "{answer}");
    r.shutdown().await;
}
