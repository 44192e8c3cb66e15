//! The chat format for models without a chat template (the `builtin` tokenizer, or a
//! `tokenizer.json` shipped without `tokenizer_config.json`).
//!
//! It only has to be deterministic and prefix-stable — a conversation's earlier turns render to
//! the same leading text whatever follows — so the router and the simulated engine, which both
//! use it, agree on block hashes and multi-turn chats reuse their cache. It is ChatML-shaped:
//!
//! ```text
//! <|im_start|>system
//! # Tools
//! {"type": "function", …}          one line per tool, only when the request defines tools
//! <|im_end|>
//! <|im_start|>{role}
//! {content}                        string content, or the text parts joined by "\n"
//! <tool_call>
//! {"name": …, "arguments": …}      one block per tool call of an assistant turn
//! </tool_call><|im_end|>
//! <|im_start|>assistant            only with add_generation_prompt
//! ```
//! Each turn ends with `<|im_end|>\n`.

use serde_json::Value as Json;

use super::chat_template::ChatRequest;
use crate::openai::content_text;

/// Renders `req` in the builtin ChatML-like format described above.
pub fn render(req: &ChatRequest<'_>) -> String {
    let mut out = String::new();
    if let Some(Json::Array(tools)) = req.tools
        && !tools.is_empty()
    {
        out.push_str("<|im_start|>system\n# Tools\n");
        for tool in tools {
            out.push_str(&tool.to_string());
            out.push('\n');
        }
        out.push_str("<|im_end|>\n");
    }
    for message in req.messages {
        let role = message.get("role").and_then(Json::as_str).unwrap_or("user");
        out.push_str("<|im_start|>");
        out.push_str(role);
        out.push('\n');
        out.push_str(&content_text(message.get("content")));
        if let Some(Json::Array(calls)) = message.get("tool_calls") {
            for call in calls {
                let function = call.get("function").unwrap_or(call);
                out.push_str("\n<tool_call>\n");
                out.push_str(&function.to_string());
                out.push_str("\n</tool_call>");
            }
        }
        out.push_str("<|im_end|>\n");
    }
    if req.add_generation_prompt {
        out.push_str("<|im_start|>assistant\n");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn req<'a>(messages: &'a [Json], tools: Option<&'a Json>, generation: bool) -> ChatRequest<'a> {
        ChatRequest {
            messages,
            tools,
            add_generation_prompt: generation,
            kwargs: None,
        }
    }

    #[test]
    fn chatml_shape() {
        let msgs = vec![
            json!({"role": "system", "content": "Be brief."}),
            json!({"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}),
        ];
        assert_eq!(
            render(&req(&msgs, None, true)),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\na\nb<|im_end|>\n<|im_start|>assistant\n"
        );
    }

    #[test]
    fn tools_and_tool_calls() {
        let tools = json!([{"type": "function", "function": {"name": "f"}}]);
        let msgs = vec![json!({"role": "assistant", "content": null,
            "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": "{}"}}]})];
        assert_eq!(
            render(&req(&msgs, Some(&tools), false)),
            "<|im_start|>system\n# Tools\n{\"type\":\"function\",\"function\":{\"name\":\"f\"}}\n<|im_end|>\n\
             <|im_start|>assistant\n\n<tool_call>\n{\"name\":\"f\",\"arguments\":\"{}\"}\n</tool_call><|im_end|>\n"
        );
    }

    #[test]
    fn earlier_turns_are_a_prefix() {
        let mut msgs = vec![json!({"role": "user", "content": "hi"})];
        let first = render(&req(&msgs, None, false));
        msgs.push(json!({"role": "assistant", "content": "hello"}));
        msgs.push(json!({"role": "user", "content": "more"}));
        assert!(render(&req(&msgs, None, true)).starts_with(&first));
    }
}
