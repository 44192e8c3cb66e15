//! The request kinds the real-engine suites send through kvroute, and the prompts they use:
//! every way kvroute turns a request into tokens (completions, token ids, chat templates with
//! `chat_template_kwargs`, tools, tool-call histories, multi-turn conversations), each checked
//! for exactness against the engine's own `cached_tokens` by the caller's table.

use serde_json::{Value, json};

use super::real_router::{Exactness, LORA, MODEL, RealRouter, chat, completion};

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

/// Completions, token-id prompts (exact multiples of the block size, so a router that forgets
/// the last-token rule is caught), chats, a multi-turn conversation that extends each turn with
/// the engine's own reply, `enable_thinking` off and on, and tools with a tool-call history,
/// once per `tool_choice` in `tool_choices` (engines render tools differently per choice).
/// With `tools_as_sent`, a second tool whose function leaves out `description` and puts
/// `parameters` before `name` is added: the engine renders it through its request model, which
/// kvroute reproduces for SGLang; for vLLM it does not yet (vLLM's `ChatCompletionToolsParam`
/// normalizes too: docs/real-sglang.md, "left to do"), so the vLLM suite sends the first tool
/// only, whose keys are already in the engines' order.
pub async fn common_request_kinds(
    router: &RealRouter,
    table: &mut Exactness,
    tool_choices: &[Value],
    tools_as_sent: bool,
) {
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

    // Tools (rendered into the system prompt, or not) and a tool-call history.
    for choice in tool_choices {
        let case = format!("tools, tool_choice {choice}");
        for body in tool_chats(choice, tools_as_sent) {
            let o = router.checked(&body, None).await;
            table.record(&case, &o);
        }
    }
}

/// The LoRA adapter: its blocks are its own, never the base model's.
pub async fn lora_requests(router: &RealRouter, table: &mut Exactness) {
    let lora_doc = document("adapter", 200);
    for model in [LORA, LORA, MODEL, LORA] {
        let mut body = completion(format!("{lora_doc}\nAnswer:"), 4);
        body["model"] = json!(model);
        let o = router.checked(&body, None).await;
        table.record("lora adapter", &o);
    }
}

/// A client's own `cache_salt` (no tenants): the same salt shares, another salt does not.
pub async fn client_salt_requests(router: &RealRouter, table: &mut Exactness) {
    let salted = document("salted", 150);
    for salt in ["alpha", "alpha", "beta"] {
        let mut body = completion(salted.clone(), 4);
        body["cache_salt"] = json!(salt);
        let o = router.checked(&body, None).await;
        table.record("client cache_salt", &o);
    }
}

/// Chats with two tools and `tool_choice` (vLLM refuses `"auto"` without a tool parser, so its
/// suite sends `"none"`), and a tool-call history.
pub fn tool_chats(tool_choice: &Value, second_tool: bool) -> Vec<Value> {
    let mut tools = json!([{
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": document("weather tool", 40),
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
        }
    }, {
        "type": "function",
        "function": {
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
            "name": "get_time"
        }
    }]);
    if !second_tool && let Some(list) = tools.as_array_mut() {
        list.truncate(1);
    }
    let ask = json!({"role": "user", "content": "What is the weather in Paris?"});
    let call = json!({"role": "assistant", "content": "", "tool_calls": [{
        "id": "call_1", "type": "function",
        "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}
    }]});
    let result = json!({"role": "tool", "tool_call_id": "call_1", "content": "Sunny, 21 C."});
    let with_tools = |messages: Value| {
        let mut body = chat(messages, 4);
        body["tools"] = tools.clone();
        body["tool_choice"] = tool_choice.clone();
        body
    };
    vec![
        with_tools(json!([ask])),
        with_tools(json!([ask])),
        with_tools(json!([ask, call, result])),
        with_tools(json!([ask, call, result, {"role": "user", "content": "And tomorrow?"}])),
    ]
}
