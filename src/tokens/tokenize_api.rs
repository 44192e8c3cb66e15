//! vLLM's `POST /tokenize` and `POST /detokenize` (0.32, `serve/tokenize/`), answered from a
//! model's tokenizer and chat template: by the router when it has them, and by the simulated
//! engine, through this same code.
//!
//! - `/tokenize` with `prompt`: the prompt's ids, special tokens added unless
//!   `add_special_tokens: false`;
//! - `/tokenize` with `messages`: the chat rendered with the model's template
//!   (`add_generation_prompt` default true, `chat_template_kwargs`), then encoded without
//!   special tokens unless `add_special_tokens: true`;
//! - the answer: `{"count", "max_model_len", "tokens", "token_strs"}` (`token_strs` null unless
//!   `return_token_strs`, then transformers' `convert_ids_to_tokens`);
//! - `/detokenize`: `{"tokens": [...]}` → `{"prompt": text}` (transformers' `decode`: special
//!   tokens kept).
//!
//! A request is answered here only when every field it uses is understood and rendered the way
//! vLLM renders it: plain-text messages (`role`, string `content`, `name`), no request-supplied
//! `chat_template`, no `continue_final_message`, `tools` or multimodal options. Anything else —
//! including a malformed body, whose error only the engine words exactly — is
//! [`Parsed::Engine`]: forwarded to a worker.

use serde_json::{Map, Value, json};

use super::{ChatRequest, ModelTokens, TokenError};

/// How a body is to be answered.
#[derive(Clone, Debug, PartialEq)]
pub enum Parsed<T> {
    /// Here, from the model's tokenizer.
    Local(T),
    /// By an engine: the body uses something only the engine renders (or words) exactly.
    Engine,
}

/// A `/tokenize` request answered from the tokenizer.
#[derive(Clone, Debug, PartialEq)]
pub struct Tokenize {
    /// `model`, when given.
    pub model: Option<String>,
    /// The prompt or the chat.
    pub input: TokenizeInput,
    /// `add_special_tokens`.
    pub add_special_tokens: bool,
    /// `return_token_strs`.
    pub return_token_strs: bool,
}

/// What `/tokenize` encodes.
#[derive(Clone, Debug, PartialEq)]
pub enum TokenizeInput {
    /// `prompt`.
    Prompt(String),
    /// `messages`, rendered with the template.
    Chat {
        /// The messages.
        messages: Vec<Value>,
        /// `add_generation_prompt` (default true).
        add_generation_prompt: bool,
        /// `chat_template_kwargs`.
        kwargs: Option<Map<String, Value>>,
    },
}

/// A `/detokenize` request.
#[derive(Clone, Debug, PartialEq)]
pub struct Detokenize {
    /// `model`, when given.
    pub model: Option<String>,
    /// `tokens`.
    pub tokens: Vec<u32>,
}

/// Keys of a `/tokenize` body answered here (others, even if vLLM ignores them, go to it).
const PROMPT_KEYS: [&str; 4] = ["model", "prompt", "add_special_tokens", "return_token_strs"];
const CHAT_KEYS: [&str; 6] = [
    "model",
    "messages",
    "add_generation_prompt",
    "add_special_tokens",
    "return_token_strs",
    "chat_template_kwargs",
];

/// A `bool` field: absent → `default`, else only a JSON boolean is understood.
fn flag(o: &Map<String, Value>, key: &str, default: bool) -> Option<bool> {
    match o.get(key) {
        None => Some(default),
        Some(Value::Bool(b)) => Some(*b),
        Some(_) => None,
    }
}

fn model_of(o: &Map<String, Value>) -> Option<Option<String>> {
    match o.get("model") {
        None | Some(Value::Null) => Some(None),
        Some(Value::String(s)) if s.is_empty() => Some(None),
        Some(Value::String(s)) => Some(Some(s.clone())),
        Some(_) => None,
    }
}

/// Whether a chat message is plain text: a string `role`, a string (or null) `content`, an
/// optional string `name`, nothing else.
fn plain_message(m: &Value) -> bool {
    let Some(o) = m.as_object() else {
        return false;
    };
    o.get("role").is_some_and(Value::is_string)
        && o.iter().all(|(k, v)| match k.as_str() {
            "role" => true,
            "content" => v.is_string() || v.is_null(),
            "name" => v.is_string(),
            _ => false,
        })
}

impl Tokenize {
    /// Reads a `/tokenize` body.
    pub fn parse(body: &Value) -> Parsed<Tokenize> {
        Tokenize::read(body).map_or(Parsed::Engine, Parsed::Local)
    }

    fn read(body: &Value) -> Option<Tokenize> {
        let o = body.as_object()?;
        let model = model_of(o)?;
        let return_token_strs = match o.get("return_token_strs") {
            None | Some(Value::Null) => false,
            Some(Value::Bool(b)) => *b,
            Some(_) => return None,
        };
        match (o.get("prompt"), o.get("messages")) {
            (Some(Value::String(p)), None) => {
                if !o.keys().all(|k| PROMPT_KEYS.contains(&k.as_str())) {
                    return None;
                }
                Some(Tokenize {
                    model,
                    input: TokenizeInput::Prompt(p.clone()),
                    add_special_tokens: flag(o, "add_special_tokens", true)?,
                    return_token_strs,
                })
            }
            (None, Some(Value::Array(messages))) => {
                if !o.keys().all(|k| CHAT_KEYS.contains(&k.as_str()))
                    || messages.is_empty()
                    || !messages.iter().all(plain_message)
                {
                    return None;
                }
                let kwargs = match o.get("chat_template_kwargs") {
                    None | Some(Value::Null) => None,
                    // A template given through the kwargs is the engine's to judge.
                    Some(Value::Object(k)) if !k.contains_key("chat_template") => Some(k.clone()),
                    Some(_) => return None,
                };
                Some(Tokenize {
                    model,
                    input: TokenizeInput::Chat {
                        messages: messages.clone(),
                        add_generation_prompt: flag(o, "add_generation_prompt", true)?,
                        kwargs,
                    },
                    add_special_tokens: flag(o, "add_special_tokens", false)?,
                    return_token_strs,
                })
            }
            _ => None,
        }
    }

    /// The token ids, from `tokens`; `Err` with the template's or tokenizer's complaint (a 400).
    pub fn ids(&self, tokens: &ModelTokens) -> Result<Vec<u32>, TokenError> {
        let text = match &self.input {
            TokenizeInput::Prompt(p) => std::borrow::Cow::Borrowed(p.as_str()),
            TokenizeInput::Chat {
                messages,
                add_generation_prompt,
                kwargs,
            } => std::borrow::Cow::Owned(tokens.render_chat(&ChatRequest {
                messages,
                tools: None,
                add_generation_prompt: *add_generation_prompt,
                kwargs: kwargs.as_ref(),
            })?),
        };
        if self.add_special_tokens {
            tokens.encode_with_special_tokens(&text)
        } else {
            tokens.encode(&text)
        }
    }

    /// vLLM's answer for `ids` on a model of `max_model_len`; `None` when token strings were
    /// asked for and the tokenizer has no vocabulary to give them (the builtin one).
    pub fn answer(&self, tokens: &ModelTokens, ids: Vec<u32>, max_model_len: u64) -> Option<Value> {
        let token_strs = if self.return_token_strs {
            Some(tokens.token_strs(&ids)?)
        } else {
            None
        };
        Some(json!({
            "count": ids.len(),
            "max_model_len": max_model_len,
            "tokens": ids,
            "token_strs": token_strs,
        }))
    }
}

impl Detokenize {
    /// Reads a `/detokenize` body.
    pub fn parse(body: &Value) -> Parsed<Detokenize> {
        Detokenize::read(body).map_or(Parsed::Engine, Parsed::Local)
    }

    fn read(body: &Value) -> Option<Detokenize> {
        let o = body.as_object()?;
        if !o.keys().all(|k| k == "model" || k == "tokens") {
            return None;
        }
        let model = model_of(o)?;
        let tokens = o
            .get("tokens")?
            .as_array()?
            .iter()
            .map(|t| t.as_u64().and_then(|t| u32::try_from(t).ok()))
            .collect::<Option<Vec<u32>>>()?;
        Some(Detokenize { model, tokens })
    }

    /// vLLM's answer, `{"prompt": text}`; `None` when the tokenizer cannot decode (the builtin
    /// one) or an id is outside its vocabulary (left to the engine to judge).
    pub fn answer(&self, tokens: &ModelTokens) -> Option<Value> {
        tokens.token_strs(&self.tokens)?;
        let text = tokens.decode(&self.tokens)?;
        Some(json!({"prompt": text}))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn local(v: Value) -> Tokenize {
        match Tokenize::parse(&v) {
            Parsed::Local(t) => t,
            Parsed::Engine => panic!("{v} should be answered locally"),
        }
    }

    #[test]
    fn prompt_and_chat_forms_and_their_defaults() {
        let p = local(json!({"model": "m", "prompt": "hi"}));
        assert_eq!(p.input, TokenizeInput::Prompt("hi".into()));
        assert!(p.add_special_tokens && !p.return_token_strs);
        let c = local(json!({"messages": [{"role": "user", "content": "hi"}],
                             "return_token_strs": true, "chat_template_kwargs": {"enable_thinking": false}}));
        assert_eq!(c.model, None);
        assert!(!c.add_special_tokens && c.return_token_strs);
        assert!(matches!(
            c.input,
            TokenizeInput::Chat {
                add_generation_prompt: true,
                kwargs: Some(_),
                ..
            }
        ));
    }

    #[test]
    fn what_only_the_engine_renders_goes_to_the_engine() {
        for v in [
            json!([1]),
            json!({"prompt": 3}),
            json!({"prompt": "x", "messages": []}),
            json!({"messages": []}),
            json!({"messages": [{"role": "user", "content": [{"type": "text", "text": "x"}]}]}),
            json!({"messages": [{"role": "assistant", "tool_calls": []}]}),
            json!({"messages": [{"role": "user", "content": "x"}], "chat_template": "{{x}}"}),
            json!({"messages": [{"role": "user", "content": "x"}], "continue_final_message": true}),
            json!({"messages": [{"role": "user", "content": "x"}], "tools": []}),
            json!({"messages": [{"role": "user", "content": "x"}], "chat_template_kwargs": {"chat_template": "t"}}),
            json!({"prompt": "x", "add_special_tokens": "yes"}),
            json!({"prompt": "x", "model": 1}),
            json!({"prompt": "x", "unknown": 1}),
        ] {
            assert_eq!(Tokenize::parse(&v), Parsed::Engine, "{v}");
        }
        for v in [
            json!({"tokens": [-1]}),
            json!({"tokens": [4294967296u64]}),
            json!({"tokens": "1"}),
            json!({"model": "m"}),
        ] {
            assert_eq!(Detokenize::parse(&v), Parsed::Engine, "{v}");
        }
    }

    #[test]
    fn answers_in_vllm_shape() {
        let tokens = ModelTokens::builtin(16);
        let t = local(json!({"prompt": "hello world"}));
        let ids = t.ids(&tokens).unwrap();
        let a = t.answer(&tokens, ids.clone(), 4096).unwrap();
        assert_eq!(
            serde_json::to_string(&a).unwrap(),
            format!(
                r#"{{"count":2,"max_model_len":4096,"tokens":[{},{}],"token_strs":null}}"#,
                ids[0], ids[1]
            )
        );
        // The builtin tokenizer has no vocabulary: no token strings, no text.
        let strs = local(json!({"prompt": "hello", "return_token_strs": true}));
        assert!(strs.answer(&tokens, ids, 4096).is_none());
        let d = Detokenize {
            model: None,
            tokens: vec![1, 2],
        };
        assert!(d.answer(&tokens).is_none());
    }
}
