//! The OpenAI response bodies the engine sends, as vLLM shapes them.
//!
//! Pure JSON builders, separate from the handlers so their shape is unit tested.

use serde_json::{Value, json};

use kvroute_router::openai::Endpoint;

/// Token counts of one request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Usage {
    /// Prompt tokens.
    pub prompt_tokens: usize,
    /// Generated tokens.
    pub completion_tokens: usize,
    /// Prompt tokens served from the prefix cache.
    pub cached_tokens: usize,
}

impl Usage {
    /// The `usage` object, with `prompt_tokens_details.cached_tokens`.
    pub fn to_json(self) -> Value {
        json!({
            "prompt_tokens": self.prompt_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
            "completion_tokens": self.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": self.cached_tokens},
        })
    }
}

/// Words generated tokens are rendered as; the simulated model's "text" carries no meaning,
/// only its token count does.
const WORDS: &[&str] = &[
    " the", " of", " and", " to", " in", " a", " is", " that", " for", " it", " as", " was",
    " with", " be", " by", " on", " not", " he", " this", " are", " or", " his", " from", " at",
    " which", " but", " have", " an", " had", " they", " you", " were",
];

/// The text of one generated token.
pub fn token_text(token: u32) -> &'static str {
    WORDS[token as usize % WORDS.len()]
}

/// Builds the bodies of one response.
#[derive(Clone, Debug)]
pub struct ResponseShape {
    /// Completions or chat.
    pub endpoint: Endpoint,
    /// `cmpl-…` / `chatcmpl-…`.
    pub id: String,
    /// Unix seconds.
    pub created: u64,
    /// The served model name.
    pub model: String,
}

impl ResponseShape {
    /// A shape for a new response with request number `n`.
    pub fn new(endpoint: Endpoint, n: u64, created: u64, model: &str) -> Self {
        let prefix = match endpoint {
            Endpoint::Completions => "cmpl",
            Endpoint::ChatCompletions => "chatcmpl",
        };
        ResponseShape {
            endpoint,
            id: format!("{prefix}-{n:016x}"),
            created,
            model: model.to_owned(),
        }
    }

    fn object(&self, chunk: bool) -> &'static str {
        match (self.endpoint, chunk) {
            (Endpoint::Completions, _) => "text_completion",
            (Endpoint::ChatCompletions, false) => "chat.completion",
            (Endpoint::ChatCompletions, true) => "chat.completion.chunk",
        }
    }

    fn envelope(&self, chunk: bool, choices: Value) -> Value {
        json!({
            "id": self.id,
            "object": self.object(chunk),
            "created": self.created,
            "model": self.model,
            "choices": choices,
        })
    }

    /// The non-streaming body.
    pub fn full(&self, text: &str, finish_reason: &str, usage: Usage) -> Value {
        let choice = match self.endpoint {
            Endpoint::Completions => json!({
                "index": 0, "text": text, "logprobs": null,
                "finish_reason": finish_reason, "stop_reason": null,
            }),
            Endpoint::ChatCompletions => json!({
                "index": 0,
                "message": {"role": "assistant", "content": text, "tool_calls": []},
                "logprobs": null, "finish_reason": finish_reason, "stop_reason": null,
            }),
        };
        let mut v = self.envelope(false, json!([choice]));
        v["usage"] = usage.to_json();
        v
    }

    /// The chat stream's first chunk, announcing the assistant role (none for completions).
    pub fn role_chunk(&self) -> Option<Value> {
        match self.endpoint {
            Endpoint::Completions => None,
            Endpoint::ChatCompletions => Some(self.envelope(
                true,
                json!([{"index": 0, "delta": {"role": "assistant", "content": ""},
                        "logprobs": null, "finish_reason": null}]),
            )),
        }
    }

    /// A streaming chunk carrying one token; the last one carries the finish reason.
    pub fn token_chunk(&self, text: &str, finish_reason: Option<&str>) -> Value {
        let choice = match self.endpoint {
            Endpoint::Completions => json!({
                "index": 0, "text": text, "logprobs": null,
                "finish_reason": finish_reason, "stop_reason": null,
            }),
            Endpoint::ChatCompletions => json!({
                "index": 0, "delta": {"content": text}, "logprobs": null,
                "finish_reason": finish_reason, "stop_reason": null,
            }),
        };
        self.envelope(true, json!([choice]))
    }

    /// The final usage chunk of `stream_options.include_usage`: no choices.
    pub fn usage_chunk(&self, usage: Usage) -> Value {
        let mut v = self.envelope(true, json!([]));
        v["usage"] = usage.to_json();
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_match_vllm() {
        let u = Usage {
            prompt_tokens: 10,
            completion_tokens: 3,
            cached_tokens: 8,
        };
        let c = ResponseShape::new(Endpoint::Completions, 1, 5, "m");
        let v = c.full("a b c", "length", u);
        assert_eq!(v["object"], "text_completion");
        assert_eq!(v["choices"][0]["text"], "a b c");
        assert_eq!(v["usage"]["total_tokens"], 13);
        assert_eq!(v["usage"]["prompt_tokens_details"]["cached_tokens"], 8);
        assert!(c.role_chunk().is_none());
        let chat = ResponseShape::new(Endpoint::ChatCompletions, 1, 5, "m");
        assert!(chat.id.starts_with("chatcmpl-"));
        assert_eq!(
            chat.full("x", "length", u)["choices"][0]["message"]["content"],
            "x"
        );
        assert_eq!(
            chat.role_chunk().unwrap()["choices"][0]["delta"]["role"],
            "assistant"
        );
        let t = chat.token_chunk(" w", Some("length"));
        assert_eq!(t["object"], "chat.completion.chunk");
        assert_eq!(t["choices"][0]["delta"]["content"], " w");
        assert_eq!(t["choices"][0]["finish_reason"], "length");
        let uc = chat.usage_chunk(u);
        assert_eq!(uc["choices"], json!([]));
        assert_eq!(uc["usage"]["completion_tokens"], 3);
    }
}
