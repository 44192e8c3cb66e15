//! The slice of the OpenAI API that routing needs: a validated view of a completion or chat
//! request, a Responses request's prompt ([`responses`]), the model of other bodies
//! ([`model_field`], [`multipart`]), and the error body every client library understands.
//!
//! The router reads a body once into [`RequestView`] ([`RequestView::from_json`]: one streaming
//! pass that keeps only what routing reads — model, prompt or messages, stream flag, salt — and
//! skips the rest) and forwards the original bytes. The simulated engine parses the same way so
//! both sides agree on what a request means.

use http::StatusCode;
use serde::Serialize;
use serde::de::DeserializeSeed;
use serde_json::Value;

use walk::Seen;

mod checks;
mod fields;
mod messages;
pub mod model_field;
pub mod multipart;
mod prompt;
pub mod responses;
mod responses_input;
pub mod token_ids;
pub mod top_level;
mod walk;

pub use model_field::ModelField;
pub use responses::ResponsesRequest;
pub use token_ids::TokenIds;
pub use walk::Scalar;

/// Which OpenAI endpoint a body was sent to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Endpoint {
    /// `POST /v1/completions`
    Completions,
    /// `POST /v1/chat/completions`
    ChatCompletions,
}

impl Endpoint {
    /// The request path of the endpoint.
    pub fn path(self) -> &'static str {
        match self {
            Endpoint::Completions => "/v1/completions",
            Endpoint::ChatCompletions => "/v1/chat/completions",
        }
    }
}

/// A completion `prompt` in any of the four shapes the OpenAI spec allows.
#[derive(Clone, Debug, PartialEq)]
pub enum Prompt {
    /// `"text"`
    Text(String),
    /// `["text", …]`: a batch; routing uses the first element's prefix.
    Texts(Vec<String>),
    /// `[1, 2, 3]`: pre-tokenized (kept compact: see [`TokenIds`]).
    Tokens(TokenIds),
    /// `[[1, 2], [3]]`: a batch of pre-tokenized prompts.
    TokenBatches(Vec<TokenIds>),
}

/// What a request asks for, as far as routing is concerned.
#[derive(Clone, Debug, PartialEq)]
pub enum Input {
    /// A completion prompt.
    Prompt(Prompt),
    /// Chat messages, kept as JSON for the chat template (which reads arbitrary keys).
    Messages(Vec<Value>),
}

/// A validated view of a completion or chat-completion request body.
#[derive(Clone, Debug, PartialEq)]
pub struct RequestView {
    /// The endpoint it was sent to.
    pub endpoint: Endpoint,
    /// The `model` field.
    pub model: String,
    /// The prompt or messages.
    pub input: Input,
    /// `stream: true`
    pub stream: bool,
    /// `max_tokens` (or `max_completion_tokens` for chat), if given.
    pub max_tokens: Option<u64>,
    /// `n`, if given.
    pub n: Option<u64>,
    /// The client's `cache_salt`, if given (namespaced per tenant before use).
    pub cache_salt: Option<String>,
    /// `prompt_cache_key` (OpenAI's name for a group of requests sharing a prefix), if given:
    /// an affinity hint.
    pub prompt_cache_key: Option<String>,
    /// `user`, if given: an affinity hint where configured.
    pub user: Option<String>,
    /// `stream_options.include_usage`
    pub include_usage: bool,
    /// `tools` for chat templates, if given.
    pub tools: Option<Value>,
    /// `tool_choice` of a chat, if given (SGLang renders no tools for `"none"`).
    pub tool_choice: Option<Value>,
    /// `chat_template_kwargs`, if given.
    pub chat_template_kwargs: Option<serde_json::Map<String, Value>>,
    /// `add_generation_prompt` (vLLM extension; default true).
    pub add_generation_prompt: bool,
    /// Whether the engine may serve the prompt from its prefix cache. vLLM skips reading the
    /// cache for requests that want prompt logprobs (`prompt_logprobs`, or `echo` with
    /// `logprobs` on completions: every prompt position must be computed to score it), and
    /// reports `cached_tokens` 0 for them; routing must predict no reuse for them either.
    pub reads_prefix_cache: bool,
    /// Whether the body may carry a client's own top-level `kv_transfer_params`, which never
    /// reach an engine (`proxy::handoff::without_client_params`): known from the parse for
    /// completions and chat, so other bodies are not scanned for it.
    pub kv_transfer_params: bool,
    /// Media that the messages' string contents no longer show (a Responses input's images,
    /// flattened as vLLM renders them): routing still keys the blocks from them on by them.
    pub flattened_media: Option<FlattenedMedia>,
}

/// Where the media of flattened messages were, and what they were ([`RequestView`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FlattenedMedia {
    /// The index of the first message that had a media item.
    pub message: usize,
    /// A digest of every media item, in order (`tokens::media::Digest`).
    pub digest: u64,
}

/// Largest `max_tokens` accepted; beyond it no engine could serve the request.
pub const MAX_TOKENS_LIMIT: u64 = 1 << 24;

impl RequestView {
    /// Validates a body's bytes sent to `endpoint`, in one pass and without a JSON tree of the
    /// whole body (see [`fields`]). Malformed JSON is a 400 naming the parser's complaint.
    pub fn from_json(endpoint: Endpoint, body: &[u8]) -> Result<RequestView, ApiError> {
        let mut de = serde_json::Deserializer::from_slice(body);
        let read = fields::BodySeed(endpoint, body.len())
            .deserialize(&mut de)
            .and_then(|b| de.end().map(|()| b))
            .map_err(|e| ApiError::invalid(format!("the body is not valid JSON: {e}"), None))?;
        RequestView::validate(endpoint, read)
    }

    /// Validates a parsed JSON body sent to `endpoint` (the same rules as [`Self::from_json`]).
    pub fn parse(endpoint: Endpoint, body: &Value) -> Result<RequestView, ApiError> {
        let read = fields::BodySeed(endpoint, 0)
            .deserialize(body)
            .map_err(|e| ApiError::invalid(format!("the body is not valid JSON: {e}"), None))?;
        RequestView::validate(endpoint, read)
    }

    /// Judges the fields as seen, one at a time in a fixed order, so a body with several
    /// problems always gets the same error.
    fn validate(endpoint: Endpoint, body: fields::Body) -> Result<RequestView, ApiError> {
        let fields::Body::Object(f) = body else {
            return Err(ApiError::invalid(
                "request body must be a JSON object",
                None,
            ));
        };
        let f = *f;
        let model = checks::model(f.model)?;
        let input = match endpoint {
            Endpoint::Completions => Input::Prompt(checks::prompt(f.prompt)?),
            Endpoint::ChatCompletions => Input::Messages(checks::messages(f.messages)?),
        };
        let stream = checks::opt_bool(f.stream, "stream")?.unwrap_or(false);
        let max_tokens = checks::max_tokens(f.max_tokens, f.max_completion_tokens)?;
        let n = checks::n(f.n, stream)?;
        let cache_salt = checks::cache_salt(f.cache_salt)?;
        let prompt_cache_key = checks::opt_string(f.prompt_cache_key, "prompt_cache_key")?;
        let user = checks::opt_string(f.user, "user")?;
        let include_usage = checks::include_usage(f.stream_options)?;
        let tools = checks::tools(f.tools)?;
        let chat_template_kwargs = checks::chat_template_kwargs(f.chat_template_kwargs)?;
        let add_generation_prompt =
            checks::opt_bool(f.add_generation_prompt, "add_generation_prompt")?.unwrap_or(true);
        let echo = matches!(f.echo, Seen::Is(true)) && endpoint == Endpoint::Completions;
        let reads_prefix_cache = !(f.prompt_logprobs || (echo && f.logprobs));
        Ok(RequestView {
            endpoint,
            model,
            input,
            stream,
            max_tokens,
            n,
            cache_salt,
            prompt_cache_key,
            user,
            include_usage,
            tools,
            tool_choice: f.tool_choice.filter(|v| !v.is_null()),
            chat_template_kwargs,
            add_generation_prompt,
            reads_prefix_cache,
            kv_transfer_params: f.kv_transfer_params,
            flattened_media: None,
        })
    }
}

/// Whether a content part of type `ty` is text (`text`, and the Responses API's `input_text`
/// and `output_text`) or an assistant's `refusal`; anything else is media.
pub fn is_text_part_type(ty: &str) -> bool {
    matches!(ty, "text" | "input_text" | "output_text" | "refusal")
}

/// The text of a chat message's `content`: a string, or the `text` parts of a list joined
/// with newlines (non-text parts contribute nothing).
pub fn content_text(content: Option<&Value>) -> String {
    match content {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => parts
            .iter()
            .filter_map(|p| p.get("text").and_then(Value::as_str))
            .collect::<Vec<_>>()
            .join("\n"),
        _ => String::new(),
    }
}

/// Longest client string (in bytes) an error message echoes; see [`shorten`].
pub const ECHO_MAX: usize = 256;

/// Longest error message; a backstop for client strings echoed without [`shorten`] (a parser's
/// error quoting a value, say).
const MESSAGE_MAX: usize = 2048;

/// `s` cut to at most `max` bytes (at a character boundary), marked with `…` when cut: client
/// strings echoed in errors must not make responses arbitrarily large.
pub fn shorten(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

/// An error as the OpenAI API returns it, with its HTTP status.
#[derive(Clone, Debug, PartialEq)]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// Human-readable message; never contains secrets.
    pub message: String,
    /// OpenAI error type (`invalid_request_error`, …).
    pub kind: &'static str,
    /// The offending parameter, if any.
    pub param: Option<String>,
    /// A short machine code, if any.
    pub code: Option<&'static str>,
    /// Seconds after which the client may retry (`Retry-After`, with 429 and 503).
    pub retry_after_s: Option<u64>,
}

#[derive(Serialize)]
struct ErrorBody<'a> {
    error: ErrorDetail<'a>,
}

#[derive(Serialize)]
struct ErrorDetail<'a> {
    message: &'a str,
    #[serde(rename = "type")]
    kind: &'a str,
    param: Option<&'a str>,
    code: Option<&'a str>,
}

impl ApiError {
    /// An error with every field given.
    pub fn new(
        status: StatusCode,
        kind: &'static str,
        code: Option<&'static str>,
        message: impl Into<String>,
    ) -> Self {
        let message = message.into();
        let message = if message.len() > MESSAGE_MAX {
            shorten(&message, MESSAGE_MAX)
        } else {
            message
        };
        ApiError {
            status,
            message,
            kind,
            param: None,
            code,
            retry_after_s: None,
        }
    }

    /// 400 `invalid_request_error` about `param`.
    pub fn invalid(message: impl Into<String>, param: Option<&str>) -> Self {
        ApiError {
            param: param.map(str::to_owned),
            ..ApiError::new(
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                Some("invalid_request"),
                message,
            )
        }
    }

    /// 404 for a model no worker serves.
    pub fn model_not_found(model: &str) -> Self {
        ApiError {
            param: Some("model".into()),
            ..ApiError::new(
                StatusCode::NOT_FOUND,
                "invalid_request_error",
                Some("model_not_found"),
                format!(
                    "The model `{}` does not exist or is not served here.",
                    shorten(model, ECHO_MAX)
                ),
            )
        }
    }

    /// 503 when no healthy worker can take a request for its model: none was routable, or
    /// every one tried has failed.
    pub fn no_worker() -> Self {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "service_unavailable",
            Some("no_worker_available"),
            "no healthy worker is available for this model; retry later",
        )
    }

    /// The JSON body `{"error": {...}}`.
    pub fn body(&self) -> String {
        let b = ErrorBody {
            error: ErrorDetail {
                message: &self.message,
                kind: self.kind,
                param: self.param.as_deref(),
                code: self.code,
            },
        };
        serde_json::to_string(&b).unwrap_or_else(|_| String::from("{\"error\":{}}"))
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} ({}): {}",
            self.status.as_u16(),
            self.kind,
            self.message
        )
    }
}

impl std::error::Error for ApiError {}

/// The error as the router answers it (feature `axum-core`: the router's handlers return it).
#[cfg(feature = "axum-core")]
impl axum_core::response::IntoResponse for ApiError {
    fn into_response(self) -> axum_core::response::Response {
        let mut resp = (
            self.status,
            [(http::header::CONTENT_TYPE, "application/json")],
            self.body(),
        )
            .into_response();
        if let Some(s) = self.retry_after_s {
            resp.headers_mut()
                .insert(http::header::RETRY_AFTER, s.into());
        }
        resp
    }
}

#[cfg(test)]
#[path = "openai_tests.rs"]
mod tests;
