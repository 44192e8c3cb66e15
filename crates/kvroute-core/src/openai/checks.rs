//! A completion or chat body's fields as seen by the parse ([`Seen`]), judged one at a time:
//! each check gives the field's value or the 400 that names it, so
//! `RequestView::validate` reads as the fixed order in which fields are judged.

use serde_json::{Map, Value};

use super::prompt::PromptFault;
use super::walk::Seen;
use super::{ApiError, MAX_TOKENS_LIMIT, Prompt};

/// The `model`: required, a non-empty string.
pub(super) fn model(seen: Seen<String>) -> Result<String, ApiError> {
    match seen {
        Seen::Is(m) if !m.is_empty() => Ok(m),
        Seen::Is(_) | Seen::Absent | Seen::Null => Err(ApiError::invalid(
            "you must provide a model parameter",
            Some("model"),
        )),
        Seen::Other => Err(ApiError::invalid("`model` must be a string", Some("model"))),
    }
}

/// The completion budget: `max_completion_tokens` if given (even as null), else `max_tokens`;
/// at most [`MAX_TOKENS_LIMIT`], and errors name the key that was used.
pub(super) fn max_tokens(
    max_tokens: Seen<u64>,
    max_completion_tokens: Seen<u64>,
) -> Result<Option<u64>, ApiError> {
    let (max_key, max_tokens) = match max_completion_tokens {
        Seen::Absent => ("max_tokens", max_tokens),
        seen => ("max_completion_tokens", seen),
    };
    let max_tokens = opt_u64(max_tokens, max_key)?;
    if let Some(m) = max_tokens
        && m > MAX_TOKENS_LIMIT
    {
        return Err(ApiError::invalid(
            format!("`{max_key}` must be at most {MAX_TOKENS_LIMIT}"),
            Some(max_key),
        ));
    }
    Ok(max_tokens)
}

/// `n`, the number of choices: at least 1, and not above 1 when the answer `stream`s.
pub(super) fn n(seen: Seen<u64>, stream: bool) -> Result<Option<u64>, ApiError> {
    let n = opt_u64(seen, "n")?;
    if n == Some(0) {
        return Err(ApiError::invalid("`n` must be at least 1", Some("n")));
    }
    if stream && n.is_some_and(|n| n > 1) {
        return Err(ApiError::invalid(
            "`n` > 1 is not supported with `stream: true`",
            Some("n"),
        ));
    }
    Ok(n)
}

/// The optional `cache_salt`, a string.
pub(super) fn cache_salt(seen: Seen<String>) -> Result<Option<String>, ApiError> {
    match seen {
        Seen::Absent | Seen::Null => Ok(None),
        Seen::Is(s) => Ok(Some(s)),
        Seen::Other => Err(ApiError::invalid(
            "`cache_salt` must be a string",
            Some("cache_salt"),
        )),
    }
}

/// `stream_options.include_usage`: false unless given as true; both levels must have the
/// right type when present.
pub(super) fn include_usage(seen: Seen<Seen<bool>>) -> Result<bool, ApiError> {
    match seen {
        Seen::Absent | Seen::Null => Ok(false),
        Seen::Is(include_usage) => match include_usage {
            Seen::Absent | Seen::Null => Ok(false),
            Seen::Is(b) => Ok(b),
            Seen::Other => Err(ApiError::invalid(
                "`stream_options.include_usage` must be a boolean",
                Some("stream_options"),
            )),
        },
        Seen::Other => Err(ApiError::invalid(
            "`stream_options` must be an object",
            Some("stream_options"),
        )),
    }
}

/// The optional `tools`, an array (kept for chat, whose template reads it).
pub(super) fn tools(seen: Seen<Option<Value>>) -> Result<Option<Value>, ApiError> {
    match seen {
        Seen::Absent | Seen::Null => Ok(None),
        Seen::Is(v) => Ok(v),
        Seen::Other => Err(ApiError::invalid("`tools` must be an array", Some("tools"))),
    }
}

/// The optional `chat_template_kwargs`, an object (kept for chat).
pub(super) fn chat_template_kwargs(
    seen: Seen<Option<Map<String, Value>>>,
) -> Result<Option<Map<String, Value>>, ApiError> {
    match seen {
        Seen::Absent | Seen::Null => Ok(None),
        Seen::Is(o) => Ok(o),
        Seen::Other => Err(ApiError::invalid(
            "`chat_template_kwargs` must be an object",
            Some("chat_template_kwargs"),
        )),
    }
}

/// An optional boolean `key`.
pub(super) fn opt_bool(seen: Seen<bool>, key: &str) -> Result<Option<bool>, ApiError> {
    match seen {
        Seen::Absent | Seen::Null => Ok(None),
        Seen::Is(b) => Ok(Some(b)),
        Seen::Other => Err(ApiError::invalid(
            format!("`{key}` must be a boolean"),
            Some(key),
        )),
    }
}

/// An optional string `key`.
pub(super) fn opt_string(seen: Seen<String>, key: &str) -> Result<Option<String>, ApiError> {
    match seen {
        Seen::Absent | Seen::Null => Ok(None),
        Seen::Is(s) => Ok(Some(s)),
        Seen::Other => Err(ApiError::invalid(
            format!("`{key}` must be a string"),
            Some(key),
        )),
    }
}

/// An optional non-negative integer `key`.
pub(super) fn opt_u64(seen: Seen<u64>, key: &str) -> Result<Option<u64>, ApiError> {
    match seen {
        Seen::Absent | Seen::Null => Ok(None),
        Seen::Is(n) => Ok(Some(n)),
        Seen::Other => Err(ApiError::invalid(
            format!("`{key}` must be a non-negative integer"),
            Some(key),
        )),
    }
}

/// A completion's `prompt`: required, not empty, and of one of the shapes engines accept.
pub(super) fn prompt(seen: Seen<Result<Prompt, PromptFault>>) -> Result<Prompt, ApiError> {
    match seen {
        Seen::Absent | Seen::Null => Err(ApiError::invalid(
            "you must provide a prompt",
            Some("prompt"),
        )),
        Seen::Is(Ok(p)) => Ok(p),
        Seen::Is(Err(PromptFault::Empty)) => Err(ApiError::invalid(
            "`prompt` must not be empty",
            Some("prompt"),
        )),
        Seen::Is(Err(PromptFault::EmptyTokenList)) => Err(ApiError::invalid(
            "`prompt` must not contain an empty token list",
            Some("prompt"),
        )),
        Seen::Is(Err(PromptFault::Shape)) | Seen::Other => Err(ApiError::invalid(
            "`prompt` must be a string, an array of strings, an array of token ids or an array of arrays of token ids",
            Some("prompt"),
        )),
    }
}

/// A chat's `messages`: required, not empty, each an object with a string `role` and a
/// `content` engines accept; the items are kept as sent.
pub(super) fn messages(seen: Seen<Vec<Value>>) -> Result<Vec<Value>, ApiError> {
    let items = match seen {
        Seen::Absent | Seen::Null => {
            return Err(ApiError::invalid(
                "you must provide `messages`",
                Some("messages"),
            ));
        }
        Seen::Is(items) => items,
        Seen::Other => {
            return Err(ApiError::invalid(
                "`messages` must be an array",
                Some("messages"),
            ));
        }
    };
    if items.is_empty() {
        return Err(ApiError::invalid(
            "`messages` must contain at least one message",
            Some("messages"),
        ));
    }
    for (i, m) in items.iter().enumerate() {
        let Some(obj) = m.as_object() else {
            return Err(ApiError::invalid(
                format!("`messages[{i}]` must be an object"),
                Some("messages"),
            ));
        };
        match obj.get("role") {
            Some(Value::String(_)) => {}
            _ => {
                return Err(ApiError::invalid(
                    format!("`messages[{i}].role` must be a string"),
                    Some("messages"),
                ));
            }
        }
        match obj.get("content") {
            None | Some(Value::Null) | Some(Value::String(_)) => {}
            Some(Value::Array(parts)) => {
                for (j, p) in parts.iter().enumerate() {
                    let ok = p
                        .as_object()
                        .is_some_and(|o| o.get("type").is_some_and(Value::is_string));
                    if !ok {
                        return Err(ApiError::invalid(
                            format!("`messages[{i}].content[{j}]` must be an object with a `type`"),
                            Some("messages"),
                        ));
                    }
                }
            }
            Some(_) => {
                return Err(ApiError::invalid(
                    format!("`messages[{i}].content` must be a string or an array of parts"),
                    Some("messages"),
                ));
            }
        }
    }
    Ok(items)
}
