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
//!
//! Bodies are read without a JSON tree ([`crate::openai::top_level`]): only the members a form
//! uses are read, each with its own typed reader (`tokens` straight into `u32`s), so a body of
//! numbers costs its ids, not a `serde_json::Value` per number.

use serde_json::value::RawValue;
use serde_json::{Map, Value, json};

use super::{ChatRequest, ModelTokens, TokenError};
use crate::openai::Scalar;
use crate::openai::top_level::{self, Kind, Members};

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
/// Keys of a chat `/tokenize` body answered here.
const CHAT_KEYS: [&str; 6] = [
    "model",
    "messages",
    "add_generation_prompt",
    "add_special_tokens",
    "return_token_strs",
    "chat_template_kwargs",
];
/// Every key either form reads.
const TOKENIZE_KEYS: &[&str] = &[
    "model",
    "prompt",
    "messages",
    "add_generation_prompt",
    "add_special_tokens",
    "return_token_strs",
    "chat_template_kwargs",
];
/// The keys of a `/detokenize` body answered here.
const DETOKENIZE_KEYS: &[&str] = &["model", "tokens"];
/// The keys of a chat message answered here (`role`, string `content`, `name`).
const MESSAGE_KEYS: &[&str] = &["role", "content", "name"];

/// The `model` a `/tokenize` or `/detokenize` body names (a non-empty string), read without a
/// tree of the body; `None` for any other value, or a body that is not an object (the engine
/// words that error). `Err` only for a body that is not JSON.
pub fn named_model(body: &[u8]) -> Result<Option<String>, serde_json::Error> {
    let Some(m) = top_level::members(body, &["model"])? else {
        return Ok(None);
    };
    Ok(match top_level::scalar(m.get("model")) {
        Some(Scalar::Str(s)) if !s.is_empty() => Some(s),
        _ => None,
    })
}

/// A `bool` member: absent → `default`, else only a JSON boolean is understood.
fn flag(m: &Members<'_>, key: &str, default: bool) -> Option<bool> {
    match top_level::scalar(m.get(key)) {
        None => Some(default),
        Some(Scalar::Bool(b)) => Some(b),
        Some(_) => None,
    }
}

fn model_of(m: &Members<'_>) -> Option<Option<String>> {
    match top_level::scalar(m.get("model")) {
        None | Some(Scalar::Null) => Some(None),
        Some(Scalar::Str(s)) if s.is_empty() => Some(None),
        Some(Scalar::Str(s)) => Some(Some(s)),
        Some(_) => None,
    }
}

/// A plain-text chat message as JSON: a string `role`, a string (or null) `content`, an
/// optional string `name`, nothing else (the last of duplicate keys judged, as in a tree);
/// `None` for anything else. Built from those members alone, so a message carrying anything
/// large is refused without a tree of it.
fn plain_message(raw: &RawValue) -> Option<Value> {
    let m = top_level::members_of(raw, MESSAGE_KEYS)?;
    if m.others {
        return None;
    }
    let role = match top_level::scalar(m.get("role")) {
        Some(Scalar::Str(s)) => s,
        _ => return None,
    };
    let content = match top_level::scalar(m.get("content")) {
        None => None,
        Some(Scalar::Str(s)) => Some(Value::String(s)),
        Some(Scalar::Null) => Some(Value::Null),
        Some(_) => return None,
    };
    let name = match top_level::scalar(m.get("name")) {
        None => None,
        Some(Scalar::Str(s)) => Some(s),
        Some(_) => return None,
    };
    // The members in the body's order, as a tree (with `preserve_order`) keeps them.
    let mut out = Map::new();
    for key in m.keys() {
        match key {
            "role" => out.insert(key.into(), Value::String(role.clone())),
            "content" => out.insert(key.into(), content.clone().unwrap_or(Value::Null)),
            _ => out.insert(key.into(), name.clone().map_or(Value::Null, Value::String)),
        };
    }
    Some(Value::Object(out))
}

/// The messages of a chat `/tokenize`: a non-empty array of plain messages, else `None`.
/// Reading stops at the first message that is not plain.
fn plain_messages(raw: &RawValue) -> Option<Vec<Value>> {
    if top_level::kind(raw) != Kind::Array {
        return None;
    }
    let mut out = Vec::new();
    let mut plain = true;
    top_level::for_each_element(raw, |_, item| match plain_message(item) {
        Some(m) => {
            out.push(m);
            true
        }
        None => {
            plain = false;
            false
        }
    });
    (plain && !out.is_empty()).then_some(out)
}

impl Tokenize {
    /// Reads a `/tokenize` body.
    pub fn parse(body: &Value) -> Parsed<Tokenize> {
        Tokenize::from_json(&serde_json::to_vec(body).unwrap_or_default())
    }

    /// Reads a `/tokenize` body's bytes, without a tree of the body.
    pub fn from_json(body: &[u8]) -> Parsed<Tokenize> {
        let read = top_level::members(body, TOKENIZE_KEYS)
            .ok()
            .flatten()
            .and_then(|m| Tokenize::read(&m));
        read.map_or(Parsed::Engine, Parsed::Local)
    }

    fn read(m: &Members<'_>) -> Option<Tokenize> {
        let model = model_of(m)?;
        let return_token_strs = match top_level::scalar(m.get("return_token_strs")) {
            None | Some(Scalar::Null) => false,
            Some(Scalar::Bool(b)) => b,
            Some(_) => return None,
        };
        let only = |keys: &[&str]| {
            !m.others && TOKENIZE_KEYS.iter().all(|k| keys.contains(k) || !m.has(k))
        };
        match (m.get("prompt"), m.get("messages")) {
            (Some(prompt), None) => {
                let Some(Scalar::Str(p)) = top_level::scalar(Some(prompt)) else {
                    return None;
                };
                if !only(&PROMPT_KEYS) {
                    return None;
                }
                Some(Tokenize {
                    model,
                    input: TokenizeInput::Prompt(p),
                    add_special_tokens: flag(m, "add_special_tokens", true)?,
                    return_token_strs,
                })
            }
            (None, Some(messages)) => {
                if !only(&CHAT_KEYS) {
                    return None;
                }
                let messages = plain_messages(messages)?;
                let kwargs = match m.get("chat_template_kwargs") {
                    None => None,
                    Some(raw) => match top_level::kind(raw) {
                        Kind::Null => None,
                        Kind::Object => {
                            // A template given through the kwargs is the engine's to judge.
                            let k: Map<String, Value> = serde_json::from_str(raw.get()).ok()?;
                            if k.contains_key("chat_template") {
                                return None;
                            }
                            Some(k)
                        }
                        _ => return None,
                    },
                };
                Some(Tokenize {
                    model,
                    input: TokenizeInput::Chat {
                        messages,
                        add_generation_prompt: flag(m, "add_generation_prompt", true)?,
                        kwargs,
                    },
                    add_special_tokens: flag(m, "add_special_tokens", false)?,
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
        Detokenize::from_json(&serde_json::to_vec(body).unwrap_or_default())
    }

    /// Reads a `/detokenize` body's bytes: its ids go straight into `u32`s, with no tree.
    pub fn from_json(body: &[u8]) -> Parsed<Detokenize> {
        let read = top_level::members(body, DETOKENIZE_KEYS)
            .ok()
            .flatten()
            .and_then(|m| Detokenize::read(&m));
        read.map_or(Parsed::Engine, Parsed::Local)
    }

    fn read(m: &Members<'_>) -> Option<Detokenize> {
        if m.others {
            return None;
        }
        let model = model_of(m)?;
        let tokens: Vec<u32> = serde_json::from_str(m.get("tokens")?.get()).ok()?;
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

    /// Read from the bytes as a tree read them: members in the body's order, the last of
    /// duplicate keys judged, ids straight into `u32`s.
    #[test]
    fn bodies_read_without_a_tree_as_a_tree_read_them() {
        let body =
            br#"{"messages":[{"content":null,"role":"x","role":"user","name":"n"}],"model":""}"#;
        let Parsed::Local(t) = Tokenize::from_json(body) else {
            panic!("local");
        };
        assert_eq!(t.model, None);
        let TokenizeInput::Chat { messages, .. } = t.input else {
            panic!("chat");
        };
        assert_eq!(
            serde_json::to_string(&messages).unwrap(),
            r#"[{"content":null,"role":"user","name":"n"}]"#
        );
        let d = Detokenize::from_json(br#"{"tokens":[1, 2 ,3],"model":"m"}"#);
        assert_eq!(
            d,
            Parsed::Local(Detokenize {
                model: Some("m".into()),
                tokens: vec![1, 2, 3]
            })
        );
        // A message with anything else, however large, is the engine's; so is bad JSON.
        let big = format!(
            r#"{{"messages":[{{"role":"user","content":"x","extra":[{}0]}}]}}"#,
            "1,".repeat(1000)
        );
        assert_eq!(Tokenize::from_json(big.as_bytes()), Parsed::Engine);
        assert_eq!(Tokenize::from_json(b"{\"prompt\":"), Parsed::Engine);
        assert_eq!(
            named_model(br#"{"model":"m","x":[1,2]}"#)
                .unwrap()
                .as_deref(),
            Some("m")
        );
        assert_eq!(named_model(br#"{"model":7}"#).unwrap(), None);
        assert_eq!(named_model(b"[1]").unwrap(), None);
        assert!(named_model(b"{").is_err());
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
