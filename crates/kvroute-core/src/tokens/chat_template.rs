//! A model's Hugging Face chat template, rendered exactly as transformers renders it.
//!
//! The engine turns chat messages into a prompt with the model's Jinja template, then caches
//! KV blocks of *that* prompt's tokens. The router must produce the very same bytes, or every
//! block hash after the first differing byte is wrong and cache-aware routing silently turns
//! into random routing. transformers renders with Python's Jinja2; we use minijinja configured
//! to behave the same (see `ARCHITECTURE.md`, "Chat templates"):
//!
//! - `trim_blocks` + `lstrip_blocks`, one trailing newline of the template dropped;
//! - Python string and dict methods (`.startswith`, `.split`, `.items`, …) via
//!   `minijinja-contrib`'s `pycompat`;
//! - printing uses Python's `str()` (`None`, `True`), `tojson` is Python's `json.dumps` with
//!   `ensure_ascii=False` (see [`super::pyjson`]);
//! - globals `raise_exception` and `strftime_now`;
//! - the context transformers passes: `messages` (keys whose value is null dropped, as
//!   transformers 5 does), `tools` (none when absent), `documents` (none),
//!   `add_generation_prompt`, the request's `chat_template_kwargs`, and the special-token
//!   strings of `tokenizer_config.json`.
//!
//! Templates are compiled once per model; a render costs microseconds.

use std::collections::BTreeMap;

use minijinja::syntax::SyntaxConfig;
use minijinja::{Environment, Error, ErrorKind, Value};
use serde_json::{Map, Value as Json};

use super::pyjson;
use super::strftime::strftime_now;
use super::tokenizer::TokenError;

/// Name of the template used without tools (or when the model has a single template).
const DEFAULT_NAME: &str = "default";
/// Name of the template transformers prefers when the request defines tools.
const TOOL_USE_NAME: &str = "tool_use";

/// Keys of `tokenizer_config.json` whose strings transformers passes to the template.
const SPECIAL_TOKEN_KEYS: [&str; 7] = [
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
];

/// Context keys the renderer sets itself; request kwargs cannot replace them.
const RESERVED_KEYS: [&str; 4] = ["messages", "tools", "documents", "add_generation_prompt"];

/// What a chat request contributes to rendering.
#[derive(Debug, Clone, Copy)]
pub struct ChatRequest<'a> {
    /// The `messages` array, each an object with at least a `role`.
    pub messages: &'a [Json],
    /// The request's `tools`, if any.
    pub tools: Option<&'a Json>,
    /// Whether to open an assistant turn at the end.
    pub add_generation_prompt: bool,
    /// The request's `chat_template_kwargs` (e.g. `enable_thinking`).
    pub kwargs: Option<&'a Map<String, Json>>,
}

/// A compiled chat template with the special tokens it may print.
pub struct ChatTemplate {
    env: Environment<'static>,
    has_tool_use: bool,
    special_tokens: BTreeMap<String, Value>,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("has_tool_use", &self.has_tool_use)
            .field(
                "special_tokens",
                &self.special_tokens.keys().collect::<Vec<_>>(),
            )
            .finish()
    }
}

/// Marks an error raised by the template itself through `raise_exception`, so its message
/// reaches the client unchanged.
#[derive(Debug)]
struct RaisedException(String);

impl std::fmt::Display for RaisedException {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for RaisedException {}

fn raise_exception(message: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, message.clone())
        .with_source(RaisedException(message)))
}

impl ChatTemplate {
    /// Compiles the template of a parsed `tokenizer_config.json`; `Ok(None)` if it has none.
    ///
    /// `chat_template` may be a string or a list of `{"name", "template"}`; with a list,
    /// `default` is used, and `tool_use` (if present) for requests that define tools, as
    /// transformers does.
    pub fn from_tokenizer_config(config: &Json) -> Result<Option<ChatTemplate>, TokenError> {
        let templates: Vec<(String, String)> = match config.get("chat_template") {
            None | Some(Json::Null) => return Ok(None),
            Some(Json::String(s)) => vec![(DEFAULT_NAME.to_owned(), s.clone())],
            Some(Json::Array(items)) => {
                let mut out = Vec::new();
                for item in items {
                    let name = item.get("name").and_then(Json::as_str);
                    let source = item.get("template").and_then(Json::as_str);
                    match (name, source) {
                        (Some(n), Some(s)) => out.push((n.to_owned(), s.to_owned())),
                        _ => {
                            return Err(TokenError::InvalidTemplate(
                                "chat_template list entries need `name` and `template`".into(),
                            ));
                        }
                    }
                }
                if !out.iter().any(|(n, _)| n == DEFAULT_NAME) {
                    return Err(TokenError::InvalidTemplate(
                        "chat_template list has no `default` template".into(),
                    ));
                }
                out
            }
            Some(_) => {
                return Err(TokenError::InvalidTemplate(
                    "chat_template must be a string or a list of named templates".into(),
                ));
            }
        };
        ChatTemplate::compile(templates, special_tokens_of(config)).map(Some)
    }

    /// Compiles a single template source with the special tokens of `config`
    /// (a `tokenizer_config.json`; pass `Json::Null` for none). transformers 5 keeps the
    /// template in a separate `chat_template.jinja`; this is how to load it.
    pub fn from_source(source: &str, config: &Json) -> Result<ChatTemplate, TokenError> {
        ChatTemplate::compile(
            vec![(DEFAULT_NAME.to_owned(), source.to_owned())],
            special_tokens_of(config),
        )
    }

    fn compile(
        templates: Vec<(String, String)>,
        special_tokens: BTreeMap<String, Value>,
    ) -> Result<ChatTemplate, TokenError> {
        let mut env = Environment::new();
        let syntax = SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .keep_trailing_newline(false)
            .build()
            .map_err(|e| TokenError::InvalidTemplate(e.to_string()))?;
        env.set_syntax(syntax);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.set_formatter(|out, _state, value| {
            if let Some(s) = value.as_str() {
                return out.write_str(s).map_err(Error::from);
            }
            let mut s = String::new();
            pyjson::write_str(&mut s, value);
            out.write_str(&s).map_err(Error::from)
        });
        env.add_filter("tojson", pyjson::tojson_filter);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        let mut has_tool_use = false;
        for (name, source) in templates {
            has_tool_use |= name == TOOL_USE_NAME;
            env.add_template_owned(name.clone(), without_generation_tags(&source))
                .map_err(|e| TokenError::InvalidTemplate(format!("template `{name}`: {e:#}")))?;
        }
        Ok(ChatTemplate {
            env,
            has_tool_use,
            special_tokens,
        })
    }

    /// The special-token strings the template sees (`bos_token`, `eos_token`, …).
    pub fn special_tokens(&self) -> impl Iterator<Item = (&str, &Value)> {
        self.special_tokens.iter().map(|(k, v)| (k.as_str(), v))
    }

    /// Renders `req` to the prompt text the engine will tokenize.
    ///
    /// Errors are the request's fault (a message the template rejects, a `raise_exception`
    /// in the template, a type error on odd content): map them to HTTP 400.
    pub fn render(&self, req: &ChatRequest<'_>) -> Result<String, TokenError> {
        let name = if req.tools.is_some() && self.has_tool_use {
            TOOL_USE_NAME
        } else {
            DEFAULT_NAME
        };
        let template = self
            .env
            .get_template(name)
            .map_err(|e| TokenError::InvalidTemplate(e.to_string()))?;
        let mut ctx = self.special_tokens.clone();
        if let Some(kwargs) = req.kwargs {
            for (k, v) in kwargs {
                if !RESERVED_KEYS.contains(&k.as_str()) {
                    ctx.insert(k.clone(), json_value(v));
                }
            }
        }
        let messages: Vec<Value> = req.messages.iter().map(message_value).collect();
        ctx.insert("messages".into(), Value::from(messages));
        ctx.insert(
            "tools".into(),
            req.tools.map(json_value).unwrap_or(Value::from(())),
        );
        ctx.insert("documents".into(), Value::from(()));
        ctx.insert(
            "add_generation_prompt".into(),
            Value::from(req.add_generation_prompt),
        );
        template
            .render(Value::from_pairs(ctx))
            .map_err(render_error)
    }
}

/// A message as the template sees it: transformers 5 drops top-level keys whose value is null
/// (so `message.content` of a tool-call turn is *undefined*, not none).
fn message_value(message: &Json) -> Value {
    match message {
        Json::Object(obj) => Value::from_pairs(
            obj.iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (k.as_str(), json_value(v))),
        ),
        other => json_value(other),
    }
}

/// A JSON value as a template value, keeping object key order (tool schemas print in the
/// client's order, as Python dicts do).
pub(crate) fn json_value(v: &Json) -> Value {
    match v {
        Json::Null => Value::from(()),
        Json::Bool(b) => Value::from(*b),
        Json::Number(n) => match (n.as_i64(), n.as_u64(), n.as_f64()) {
            (Some(i), _, _) => Value::from(i),
            (None, Some(u), _) => Value::from(u),
            (None, None, Some(f)) => Value::from(f),
            (None, None, None) => Value::from(n.to_string()),
        },
        Json::String(s) => Value::from(s.as_str()),
        Json::Array(items) => Value::from(items.iter().map(json_value).collect::<Vec<_>>()),
        Json::Object(obj) => {
            Value::from_pairs(obj.iter().map(|(k, v)| (k.as_str(), json_value(v))))
        }
    }
}

fn render_error(err: Error) -> TokenError {
    let mut source: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(&err);
    while let Some(s) = source {
        if let Some(raised) = s.downcast_ref::<RaisedException>() {
            return TokenError::Template(raised.0.clone());
        }
        source = s.source();
    }
    let detail = err.detail().unwrap_or_default();
    let place = match err.line() {
        Some(line) => format!(" (chat template line {line})"),
        None => String::new(),
    };
    TokenError::Template(format!(
        "{}{}{place}",
        err.kind(),
        if detail.is_empty() {
            String::new()
        } else {
            format!(": {detail}")
        }
    ))
}

/// The special-token strings of a `tokenizer_config.json`: each may be a string or an
/// object with `content`; unset (null) ones are left out, as in transformers'
/// `special_tokens_map`, so `{{ bos_token }}` prints nothing rather than `None`.
fn special_tokens_of(config: &Json) -> BTreeMap<String, Value> {
    fn token_str(v: &Json) -> Option<&str> {
        match v {
            Json::String(s) => Some(s),
            Json::Object(o) => o.get("content").and_then(Json::as_str),
            _ => None,
        }
    }
    let mut out = BTreeMap::new();
    for key in SPECIAL_TOKEN_KEYS {
        if let Some(s) = config.get(key).and_then(token_str) {
            out.insert(key.to_owned(), Value::from(s));
        }
    }
    if let Some(Json::Array(items)) = config.get("additional_special_tokens") {
        let list: Vec<Value> = items
            .iter()
            .filter_map(token_str)
            .map(Value::from)
            .collect();
        out.insert("additional_special_tokens".to_owned(), Value::from(list));
    }
    out
}

/// transformers' `{% generation %}…{% endgeneration %}` marks assistant text for training
/// masks and renders its body unchanged. minijinja has no such tag, so rewrite it into an
/// always-true `if` with the same whitespace-control markers, which renders identically.
fn without_generation_tags(source: &str) -> String {
    if !source.contains("generation") {
        return source.to_owned();
    }
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    while let Some(start) = rest.find("{%") {
        out.push_str(&rest[..start]);
        let tag = &rest[start..];
        let Some(end) = tag.find("%}") else {
            out.push_str(tag);
            return out;
        };
        let inner = &tag[2..end];
        let (lead, body) = split_marker_start(inner);
        let (body, trail) = split_marker_end(body);
        match body.trim() {
            "generation" => out.push_str(&format!("{{%{lead} if true {trail}%}}")),
            "endgeneration" => out.push_str(&format!("{{%{lead} endif {trail}%}}")),
            _ => out.push_str(&tag[..end + 2]),
        }
        rest = &tag[end + 2..];
    }
    out.push_str(rest);
    out
}

fn split_marker_start(s: &str) -> (&str, &str) {
    match s.chars().next() {
        Some(c @ ('-' | '+')) => s.split_at(c.len_utf8()),
        _ => ("", s),
    }
}

fn split_marker_end(s: &str) -> (&str, &str) {
    match s.chars().last() {
        Some(c @ ('-' | '+')) => {
            let (a, b) = s.split_at(s.len() - c.len_utf8());
            (a, b)
        }
        _ => (s, ""),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn render(source: &str, messages: Json) -> Result<String, TokenError> {
        let t = ChatTemplate::from_source(source, &json!({"bos_token": {"content": "<s>"}}))?;
        let msgs = messages.as_array().cloned().unwrap_or_default();
        t.render(&ChatRequest {
            messages: &msgs,
            tools: None,
            add_generation_prompt: true,
            kwargs: None,
        })
    }

    #[test]
    fn python_printing_and_special_tokens() {
        let out = render(
            "{{ bos_token }}{% for m in messages %}{{ m.content }}|{{ m.x }}|{% endfor %}{{ none }}",
            json!([{"role": "user", "content": "a", "x": [1, "b", true]}]),
        )
        .unwrap();
        assert_eq!(out, "<s>a|[1, 'b', True]|None");
    }

    #[test]
    fn raise_exception_message_reaches_the_client() {
        let e = render(
            "{% if messages[0].role != 'system' %}{{ raise_exception('System first!') }}{% endif %}",
            json!([{"role": "user", "content": "a"}]),
        )
        .unwrap_err();
        match e {
            TokenError::Template(m) => assert_eq!(m, "System first!"),
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn null_keys_are_undefined() {
        let out = render(
            "{% for m in messages %}{{ m.content is defined }}{% endfor %}",
            json!([{"role": "assistant", "content": null}]),
        )
        .unwrap();
        assert_eq!(out, "False");
    }

    #[test]
    fn generation_tags_render_their_body() {
        let src = "{% for m in messages %}{%- generation -%} [{{ m.content }}] {%- endgeneration %}{% endfor %}";
        assert_eq!(
            without_generation_tags(src),
            "{% for m in messages %}{%- if true -%} [{{ m.content }}] {%- endif %}{% endfor %}"
        );
        let out = render(src, json!([{"role": "user", "content": "a"}])).unwrap();
        assert_eq!(out, "[a]");
    }

    #[test]
    fn named_templates_pick_default_and_tool_use() {
        let cfg = json!({"chat_template": [
            {"name": "default", "template": "D"},
            {"name": "tool_use", "template": "T{{ tools|length }}"}
        ]});
        let t = ChatTemplate::from_tokenizer_config(&cfg).unwrap().unwrap();
        let msgs = vec![json!({"role": "user", "content": "x"})];
        let tools = json!([{"type": "function"}]);
        let mut req = ChatRequest {
            messages: &msgs,
            tools: None,
            add_generation_prompt: true,
            kwargs: None,
        };
        assert_eq!(t.render(&req).unwrap(), "D");
        req.tools = Some(&tools);
        assert_eq!(t.render(&req).unwrap(), "T1");
        assert!(
            ChatTemplate::from_tokenizer_config(&json!({}))
                .unwrap()
                .is_none()
        );
        assert!(
            ChatTemplate::from_tokenizer_config(
                &json!({"chat_template": [{"name": "x", "template": ""}]})
            )
            .is_err()
        );
    }

    #[test]
    fn bad_template_is_a_load_time_error() {
        assert!(matches!(
            ChatTemplate::from_source("{% if %}", &Json::Null),
            Err(TokenError::InvalidTemplate(_))
        ));
    }

    #[test]
    fn kwargs_cannot_replace_messages() {
        let t = ChatTemplate::from_source("{{ messages|length }}{{ flag }}", &Json::Null).unwrap();
        let msgs = vec![json!({"role": "user", "content": "x"})];
        let kwargs = json!({"messages": [], "flag": 7});
        let out = t
            .render(&ChatRequest {
                messages: &msgs,
                tools: None,
                add_generation_prompt: false,
                kwargs: kwargs.as_object(),
            })
            .unwrap();
        assert_eq!(out, "17");
    }
}
