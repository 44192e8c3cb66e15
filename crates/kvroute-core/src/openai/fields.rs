//! A request body's top-level fields, read in one streaming pass without a JSON tree of the
//! whole body.
//!
//! Only the fields routing reads are kept, and only for the endpoint that reads them (a chat
//! request's `prompt` is skipped, a completion's `messages` too); everything else is walked
//! once and dropped. Token ids go straight into `Vec<u32>`: a body of numbers costs 4 bytes per
//! id instead of a `serde_json::Value` per id (≈ 30× the text), which is what let one 32 MiB
//! body raise the router's memory by more than a gigabyte.
//!
//! Nothing here fails on a wrong type: a field is recorded as [`Seen`] and judged afterwards, in
//! the fixed order of [`super::RequestView`]'s validation, so the client gets the same error as
//! when the body was parsed into a tree first. Only malformed JSON fails the pass, anywhere in
//! the body and before any field is judged — also as before. Skipped values are still parsed
//! (numbers in range, strings valid UTF-8, the nesting limit), never just scanned: a body the
//! tree parser refused is refused here too.

use std::fmt;

use serde::Deserialize as _;
use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};

use super::messages::MessagesSeed;
use super::prompt::{PromptFault, PromptSeed};
use super::walk::{Scalar, ScalarSeed, Seen, Skip, drain_seq};
use super::{Endpoint, Prompt};

/// The top-level fields routing reads, as seen.
#[derive(Debug, Default)]
pub(super) struct Fields {
    pub model: Seen<String>,
    /// Completions only (else skipped).
    pub prompt: Seen<Result<Prompt, PromptFault>>,
    /// Chat only (else skipped). Messages stay JSON: chat templates read arbitrary keys.
    pub messages: Seen<Vec<Value>>,
    pub stream: Seen<bool>,
    pub max_tokens: Seen<u64>,
    pub max_completion_tokens: Seen<u64>,
    pub n: Seen<u64>,
    pub cache_salt: Seen<String>,
    pub prompt_cache_key: Seen<String>,
    pub user: Seen<String>,
    /// An object, with its `include_usage` as seen.
    pub stream_options: Seen<Seen<bool>>,
    /// An array; kept for chat (the template reads it), `None` for completions.
    pub tools: Seen<Option<Value>>,
    /// Chat only (else skipped), as JSON: engines differ in which tools they render for it.
    pub tool_choice: Option<Value>,
    /// An object; kept for chat, `None` for completions.
    pub chat_template_kwargs: Seen<Option<Map<String, Value>>>,
    pub add_generation_prompt: Seen<bool>,
    /// `prompt_logprobs` (vLLM extension), given and not null.
    pub prompt_logprobs: bool,
    /// `echo` (completions).
    pub echo: Seen<bool>,
    /// `logprobs`, given and not null.
    pub logprobs: bool,
    /// `kv_transfer_params` is a top-level member (the router's to give, never the client's).
    pub kv_transfer_params: bool,
}

/// A body: an object's fields, or anything else.
pub(super) enum Body {
    Object(Box<Fields>),
    NotObject,
}

/// Reads a body sent to `endpoint`, of the given length in bytes (0: unknown).
pub(super) struct BodySeed(pub Endpoint, pub usize);

impl<'de> DeserializeSeed<'de> for BodySeed {
    type Value = Body;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Body, D::Error> {
        d.deserialize_any(self)
    }
}

/// The top-level keys routing reads.
#[derive(Clone, Copy)]
enum Key {
    Model,
    Prompt,
    Messages,
    Stream,
    MaxTokens,
    MaxCompletionTokens,
    N,
    CacheSalt,
    StreamOptions,
    Tools,
    ToolChoice,
    ChatTemplateKwargs,
    AddGenerationPrompt,
    PromptLogprobs,
    Echo,
    Logprobs,
    KvTransferParams,
    PromptCache,
    User,
    Unread,
}

impl Key {
    fn of(name: &str) -> Key {
        match name {
            "model" => Key::Model,
            "prompt" => Key::Prompt,
            "messages" => Key::Messages,
            "stream" => Key::Stream,
            "max_tokens" => Key::MaxTokens,
            "max_completion_tokens" => Key::MaxCompletionTokens,
            "n" => Key::N,
            "cache_salt" => Key::CacheSalt,
            "stream_options" => Key::StreamOptions,
            "tools" => Key::Tools,
            "tool_choice" => Key::ToolChoice,
            "chat_template_kwargs" => Key::ChatTemplateKwargs,
            "add_generation_prompt" => Key::AddGenerationPrompt,
            "prompt_logprobs" => Key::PromptLogprobs,
            "echo" => Key::Echo,
            "logprobs" => Key::Logprobs,
            "kv_transfer_params" => Key::KvTransferParams,
            "prompt_cache_key" => Key::PromptCache,
            "user" => Key::User,
            _ => Key::Unread,
        }
    }
}

/// Decodes a key without keeping it: the caller maps it with `F`.
struct KeySeed<F>(F);

impl<'de, T, F: FnOnce(&str) -> T> DeserializeSeed<'de> for KeySeed<F> {
    type Value = T;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<T, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de, T, F: FnOnce(&str) -> T> Visitor<'de> for KeySeed<F> {
    type Value = T;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a string key")
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<T, E> {
        Ok((self.0)(v))
    }
}

impl<'de> Visitor<'de> for BodySeed {
    type Value = Body;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Body, A::Error> {
        let chat = self.0 == Endpoint::ChatCompletions;
        let mut f = Fields::default();
        while let Some(key) = map.next_key_seed(KeySeed(Key::of))? {
            match key {
                Key::Model => f.model = map.next_value_seed(ScalarSeed)?.string(),
                Key::Prompt if !chat => f.prompt = map.next_value_seed(PromptSeed(self.1))?,
                Key::Messages if chat => f.messages = map.next_value_seed(MessagesSeed)?,
                Key::Stream => f.stream = map.next_value_seed(ScalarSeed)?.bool(),
                Key::MaxTokens => f.max_tokens = map.next_value_seed(ScalarSeed)?.u64(),
                Key::MaxCompletionTokens => {
                    f.max_completion_tokens = map.next_value_seed(ScalarSeed)?.u64();
                }
                Key::N => f.n = map.next_value_seed(ScalarSeed)?.u64(),
                Key::CacheSalt => f.cache_salt = map.next_value_seed(ScalarSeed)?.string(),
                Key::PromptCache => {
                    f.prompt_cache_key = map.next_value_seed(ScalarSeed)?.string();
                }
                Key::User => f.user = map.next_value_seed(ScalarSeed)?.string(),
                Key::StreamOptions => f.stream_options = map.next_value_seed(StreamOptionsSeed)?,
                Key::Tools => f.tools = map.next_value_seed(ToolsSeed { keep: chat })?,
                Key::ToolChoice if chat => f.tool_choice = Some(map.next_value::<Value>()?),
                Key::ChatTemplateKwargs => {
                    f.chat_template_kwargs = map.next_value_seed(KwargsSeed { keep: chat })?;
                }
                Key::AddGenerationPrompt => {
                    f.add_generation_prompt = map.next_value_seed(ScalarSeed)?.bool();
                }
                Key::PromptLogprobs => {
                    f.prompt_logprobs = !matches!(map.next_value_seed(ScalarSeed)?, Scalar::Null);
                }
                Key::Echo => f.echo = map.next_value_seed(ScalarSeed)?.bool(),
                Key::Logprobs => {
                    f.logprobs = !matches!(map.next_value_seed(ScalarSeed)?, Scalar::Null);
                }
                Key::KvTransferParams => {
                    f.kv_transfer_params = true;
                    map.next_value::<Skip>()?;
                }
                Key::Prompt | Key::Messages | Key::ToolChoice | Key::Unread => {
                    map.next_value::<Skip>()?;
                }
            }
        }
        Ok(Body::Object(Box::new(f)))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Body, A::Error> {
        drain_seq(seq)?;
        Ok(Body::NotObject)
    }

    fn visit_bool<E>(self, _: bool) -> Result<Body, E> {
        Ok(Body::NotObject)
    }
    fn visit_i64<E>(self, _: i64) -> Result<Body, E> {
        Ok(Body::NotObject)
    }
    fn visit_u64<E>(self, _: u64) -> Result<Body, E> {
        Ok(Body::NotObject)
    }
    fn visit_f64<E>(self, _: f64) -> Result<Body, E> {
        Ok(Body::NotObject)
    }
    fn visit_str<E>(self, _: &str) -> Result<Body, E> {
        Ok(Body::NotObject)
    }
    fn visit_unit<E>(self) -> Result<Body, E> {
        Ok(Body::NotObject)
    }
}

/// `stream_options`: an object; only `include_usage` is read.
struct StreamOptionsSeed;

impl<'de> DeserializeSeed<'de> for StreamOptionsSeed {
    type Value = Seen<Seen<bool>>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        match ContainerSeed.deserialize(d)? {
            Container::Map(include_usage) => Ok(Seen::Is(include_usage)),
            Container::Null => Ok(Seen::Null),
            Container::Seq | Container::Scalar => Ok(Seen::Other),
        }
    }
}

/// What `stream_options` turned out to be.
enum Container {
    /// An object, with its `include_usage` as seen.
    Map(Seen<bool>),
    Seq,
    Null,
    Scalar,
}

struct ContainerSeed;

impl<'de> DeserializeSeed<'de> for ContainerSeed {
    type Value = Container;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Container, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for ContainerSeed {
    type Value = Container;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Container, A::Error> {
        let mut include_usage = Seen::Absent;
        while let Some(wanted) = map.next_key_seed(KeySeed(|k: &str| k == "include_usage"))? {
            if wanted {
                include_usage = map.next_value_seed(ScalarSeed)?.bool();
            } else {
                map.next_value::<Skip>()?;
            }
        }
        Ok(Container::Map(include_usage))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Container, A::Error> {
        drain_seq(seq).map(|()| Container::Seq)
    }
    fn visit_unit<E>(self) -> Result<Container, E> {
        Ok(Container::Null)
    }
    fn visit_none<E>(self) -> Result<Container, E> {
        Ok(Container::Null)
    }
    fn visit_bool<E>(self, _: bool) -> Result<Container, E> {
        Ok(Container::Scalar)
    }
    fn visit_i64<E>(self, _: i64) -> Result<Container, E> {
        Ok(Container::Scalar)
    }
    fn visit_u64<E>(self, _: u64) -> Result<Container, E> {
        Ok(Container::Scalar)
    }
    fn visit_f64<E>(self, _: f64) -> Result<Container, E> {
        Ok(Container::Scalar)
    }
    fn visit_str<E>(self, _: &str) -> Result<Container, E> {
        Ok(Container::Scalar)
    }
}

/// `tools`: an array, kept as JSON when `keep`.
struct ToolsSeed {
    keep: bool,
}

impl<'de> DeserializeSeed<'de> for ToolsSeed {
    type Value = Seen<Option<Value>>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        if self.keep {
            return Ok(match Value::deserialize(d)? {
                Value::Null => Seen::Null,
                v @ Value::Array(_) => Seen::Is(Some(v)),
                _ => Seen::Other,
            });
        }
        Ok(match ContainerSeed.deserialize(d)? {
            Container::Seq => Seen::Is(None),
            Container::Null => Seen::Null,
            Container::Map(_) | Container::Scalar => Seen::Other,
        })
    }
}

/// `chat_template_kwargs`: an object, kept as JSON when `keep`.
struct KwargsSeed {
    keep: bool,
}

impl<'de> DeserializeSeed<'de> for KwargsSeed {
    type Value = Seen<Option<Map<String, Value>>>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        if self.keep {
            return Ok(match Value::deserialize(d)? {
                Value::Null => Seen::Null,
                Value::Object(o) => Seen::Is(Some(o)),
                _ => Seen::Other,
            });
        }
        Ok(match ContainerSeed.deserialize(d)? {
            Container::Map(_) => Seen::Is(None),
            Container::Null => Seen::Null,
            Container::Seq | Container::Scalar => Seen::Other,
        })
    }
}
