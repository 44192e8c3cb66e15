//! Which tools an engine renders into a chat prompt, and how it writes them.
//!
//! kvroute renders chats itself, so its prompt must be the engine's byte for byte, tools
//! included, or every prediction for a chat with tools is wrong. The engines differ:
//!
//! - **vLLM** renders the request's `tools` whatever the `tool_choice` (with `"none"` the tools
//!   are still rendered, the model is just not asked to call one). kvroute passes them as sent,
//!   which is what vLLM renders when each function lists `name`, `description`, `parameters`;
//!   vLLM too dumps each tool through its request model (`ChatCompletionToolsParam`), so a tool
//!   that leaves out a field or orders them otherwise renders differently there (measured: 6
//!   tokens more). Reproducing that dump, as is done for SGLang below, is left to do.
//! - **SGLang** (0.5.23, `serving_chat.py`) renders **no** tools when `tool_choice` is
//!   `"none"`, only the named one when `tool_choice` names a function, and otherwise passes each
//!   tool through its pydantic model (`protocol.py`, `Tool` / `Function`): a tool becomes
//!   `{"type", "function", "defer_loading"}` in that order (`defer_loading` null unless given;
//!   unknown keys dropped); its function keeps the keys the client sent, in the client's order,
//!   followed by those it left out of `description`, `name`, `parameters` (as null), with
//!   `strict` and `defer_loading` only when not null (a tool's `defer_loading` is copied to its
//!   function when the function has none).
//!
//! Which engine serves a model is configuration (`[[models]] engine`), like its block size.

use std::borrow::Cow;

use serde_json::{Map, Value as Json};

/// The engine kind that serves a model, where engines render a request differently.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum EngineKind {
    /// vLLM (and the simulated engine): tools rendered as sent (see the module documentation).
    #[default]
    Vllm,
    /// SGLang: tools filtered by `tool_choice` and normalized by its request model.
    Sglang,
}

impl EngineKind {
    /// Parses a configuration value (`"vllm"`, `"sglang"`).
    pub fn parse(s: &str) -> Option<EngineKind> {
        match s {
            "vllm" => Some(EngineKind::Vllm),
            "sglang" => Some(EngineKind::Sglang),
            _ => None,
        }
    }

    /// The `tools` the engine gives its chat template for a request with `tools` and
    /// `tool_choice`.
    pub fn template_tools<'a>(
        self,
        tools: Option<&'a Json>,
        tool_choice: Option<&Json>,
    ) -> Option<Cow<'a, Json>> {
        let tools = tools?;
        match self {
            EngineKind::Vllm => Some(Cow::Borrowed(tools)),
            EngineKind::Sglang => sglang_tools(tools, tool_choice).map(Cow::Owned),
        }
    }
}

/// SGLang's rendering of `tools` (see the module documentation); `None` when it renders none.
fn sglang_tools(tools: &Json, tool_choice: Option<&Json>) -> Option<Json> {
    let list = tools.as_array()?;
    let named = match tool_choice {
        Some(Json::String(s)) if s == "none" => return None,
        Some(Json::Object(choice)) => choice
            .get("function")
            .and_then(|f| f.get("name"))
            .and_then(Json::as_str),
        _ => None,
    };
    let rendered: Vec<Json> = list
        .iter()
        .filter(|t| named.is_none_or(|n| function_name(t) == Some(n)))
        .map(sglang_tool)
        .collect();
    if rendered.is_empty() {
        return None;
    }
    Some(Json::Array(rendered))
}

fn function_name(tool: &Json) -> Option<&str> {
    tool.get("function")?.get("name")?.as_str()
}

/// One tool as SGLang's `Tool.model_dump()` writes it.
fn sglang_tool(tool: &Json) -> Json {
    let empty = Map::new();
    let t = tool.as_object().unwrap_or(&empty);
    let defer = t.get("defer_loading").cloned().unwrap_or(Json::Null);
    let f = t
        .get("function")
        .and_then(Json::as_object)
        .unwrap_or(&empty);
    const FIELDS: [&str; 5] = [
        "description",
        "name",
        "parameters",
        "strict",
        "defer_loading",
    ];
    let value = |k: &str| -> Json {
        match (k, f.get(k)) {
            ("defer_loading", None | Some(Json::Null)) => defer.clone(),
            (_, v) => v.cloned().unwrap_or(Json::Null),
        }
    };
    let mut function = Map::new();
    let sent = f.keys().map(String::as_str).filter(|k| FIELDS.contains(k));
    let rest = FIELDS.iter().copied().filter(|k| !f.contains_key(*k));
    for k in sent.chain(rest) {
        let v = value(k);
        if matches!(k, "strict" | "defer_loading") && v.is_null() {
            continue;
        }
        function.insert(k.to_string(), v);
    }
    let mut out = Map::new();
    out.insert(
        "type".into(),
        t.get("type").cloned().unwrap_or_else(|| "function".into()),
    );
    out.insert("function".into(), Json::Object(function));
    out.insert("defer_loading".into(), defer);
    Json::Object(out)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn weather() -> Json {
        json!([
            {"type": "function", "function": {"name": "get_weather", "description": "d",
             "parameters": {"type": "object"}}},
            {"function": {"parameters": {}, "name": "other"}, "extra": 1}
        ])
    }

    #[test]
    fn vllm_renders_tools_as_sent_whatever_the_choice() {
        let tools = weather();
        let t = EngineKind::Vllm.template_tools(Some(&tools), Some(&json!("none")));
        assert_eq!(t.as_deref(), Some(&tools));
    }

    #[test]
    fn sglang_renders_no_tools_for_tool_choice_none() {
        let tools = weather();
        assert_eq!(
            EngineKind::Sglang.template_tools(Some(&tools), Some(&json!("none"))),
            None
        );
    }

    /// The expected text is what SGLang 0.5.23's `Tool.model_dump()` gives for these tools
    /// (run in its virtualenv), serialized in key order.
    #[test]
    fn sglang_normalizes_tools_as_its_request_model_dumps_them() {
        let tools = weather();
        let t = EngineKind::Sglang
            .template_tools(Some(&tools), Some(&json!("auto")))
            .unwrap();
        assert_eq!(
            serde_json::to_string(&*t).unwrap(),
            concat!(
                r#"[{"type":"function","function":{"name":"get_weather","description":"d","parameters":{"type":"object"}},"defer_loading":null},"#,
                r#"{"type":"function","function":{"parameters":{},"name":"other","description":null},"defer_loading":null}]"#
            )
        );
        let none = EngineKind::Sglang
            .template_tools(Some(&tools), None)
            .unwrap();
        assert_eq!(none, t);
    }

    #[test]
    fn sglang_renders_only_the_named_tool() {
        let tools = weather();
        let choice = json!({"type": "function", "function": {"name": "other"}});
        let t = EngineKind::Sglang
            .template_tools(Some(&tools), Some(&choice))
            .unwrap();
        assert_eq!(t.as_array().unwrap().len(), 1);
        assert_eq!(function_name(&t[0]), Some("other"));
    }
}
