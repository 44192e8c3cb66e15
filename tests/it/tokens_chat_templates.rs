//! Chat rendering and token ids against what Hugging Face transformers 5.24 produces for the
//! Qwen3 template (`tests/fixtures/chat-templates/`).

use kvroute::openai::{Endpoint, RequestView};
use kvroute::tokens::model::DEFAULT_CACHE_UNITS;
use kvroute::tokens::{ChatRequest, ModelTokens, TokenError, Tokenizer};
use serde_json::{Value, json};

use crate::support::{fixtures, qwen3};

fn load(name: &str) -> Value {
    let p = fixtures().join("chat-templates").join(name);
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

struct Case {
    name: String,
    messages: Vec<Value>,
    tools: Option<Value>,
    add_generation_prompt: bool,
    kwargs: serde_json::Map<String, Value>,
    expected: Value,
}

fn cases() -> Vec<Case> {
    let convs = load("conversations.json");
    let expected = load("expected.json");
    convs
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            let name = c["name"].as_str().unwrap().to_owned();
            Case {
                expected: expected["qwen3"][&name].clone(),
                name,
                messages: c["messages"].as_array().unwrap().clone(),
                tools: Some(c["tools"].clone()).filter(|t| !t.is_null()),
                add_generation_prompt: c["add_generation_prompt"].as_bool().unwrap(),
                kwargs: c["kwargs"].as_object().unwrap().clone(),
            }
        })
        .collect()
}

impl Case {
    fn request(&self) -> ChatRequest<'_> {
        ChatRequest {
            messages: &self.messages,
            tools: self.tools.as_ref(),
            add_generation_prompt: self.add_generation_prompt,
            kwargs: Some(&self.kwargs),
        }
    }

    fn ok(&self) -> bool {
        self.expected["ok"].as_bool().unwrap()
    }
}

#[test]
fn qwen3_tokenizer_is_segmented() {
    assert_eq!(qwen3().segmenting(), Ok(()));
}

#[test]
fn thirteen_conversations_with_expectations() {
    let cases = cases();
    assert_eq!(cases.len(), 13);
    assert!(
        cases.iter().all(|c| c.expected.is_object()),
        "missing expectations"
    );
    assert_eq!(cases.iter().filter(|c| !c.ok()).count(), 2);
}

#[test]
fn rendered_text_matches_transformers_byte_for_byte() {
    let model = qwen3();
    for case in cases().iter().filter(|c| c.ok()) {
        let text = model
            .render_chat(&case.request())
            .unwrap_or_else(|e| panic!("{}: {e}", case.name));
        assert_eq!(
            text,
            case.expected["text"].as_str().unwrap(),
            "{}",
            case.name
        );
    }
}

#[test]
fn token_ids_match_transformers() {
    let model = qwen3();
    for case in cases().iter().filter(|c| c.ok()) {
        let text = model.render_chat(&case.request()).unwrap();
        let expected: Vec<u32> = serde_json::from_value(case.expected["ids"].clone()).unwrap();
        assert_eq!(
            model.encode(&text).unwrap(),
            expected,
            "{} (cached path)",
            case.name
        );
        assert_eq!(
            model.tokenizer().encode(&text).unwrap(),
            expected,
            "{} (plain encode)",
            case.name
        );
    }
}

#[test]
fn failing_conversations_are_client_errors() {
    let model = qwen3();
    for case in cases().iter().filter(|c| !c.ok()) {
        let err = model.render_chat(&case.request()).unwrap_err();
        assert!(
            matches!(err, TokenError::Template(_)),
            "{}: {err:?}",
            case.name
        );
        eprintln!(
            "{}: {err} (transformers: {})",
            case.name, case.expected["error"]
        );
        assert!(err.is_client_error());
    }
}

#[test]
fn prompt_ids_of_a_chat_request_body() {
    let model = qwen3();
    for case in cases() {
        let mut body = json!({
            "model": "qwen3",
            "messages": case.messages,
            "add_generation_prompt": case.add_generation_prompt,
            "chat_template_kwargs": case.kwargs,
        });
        if let Some(t) = &case.tools {
            body["tools"] = t.clone();
        }
        let view = RequestView::parse(Endpoint::ChatCompletions, &body).unwrap();
        match model.prompt_ids(&view) {
            Ok(ids) => {
                let expected: Vec<u32> =
                    serde_json::from_value(case.expected["ids"].clone()).unwrap();
                assert_eq!(ids, expected, "{}", case.name);
            }
            Err(e) => assert!(!case.ok(), "{}: {e}", case.name),
        }
    }
}

#[test]
fn raise_exception_in_a_real_template_shape() {
    // Llama/Mistral-style role check, the most common use of raise_exception.
    let source = "{% for m in messages %}{% if (m.role == 'user') != (loop.index0 % 2 == 0) %}\
        {{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}\
        {% endif %}[{{ m.role }}]{{ m.content | trim }}{% endfor %}";
    let t = kvroute::tokens::ChatTemplate::from_source(source, &Value::Null).unwrap();
    let msgs = vec![
        json!({"role": "user", "content": "a"}),
        json!({"role": "user", "content": "b"}),
    ];
    let err = t
        .render(&ChatRequest {
            messages: &msgs,
            tools: None,
            add_generation_prompt: true,
            kwargs: None,
        })
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "Conversation roles must alternate user/assistant/user/assistant/..."
    );
}

#[test]
fn tojson_filter_options_behave_like_json_dumps() {
    let source = "{{ messages[0].x | tojson }}|{{ messages[0].x | tojson(indent=2) }}|\
        {{ messages[0].x | tojson(separators=(',', ':'), sort_keys=true) }}";
    let t = kvroute::tokens::ChatTemplate::from_source(source, &Value::Null).unwrap();
    let msgs = vec![json!({"role": "user", "x": {"b": "<&'>", "a": [1, 2.0]}})];
    let out = t
        .render(&ChatRequest {
            messages: &msgs,
            tools: None,
            add_generation_prompt: false,
            kwargs: None,
        })
        .unwrap();
    assert_eq!(
        out,
        "{\"b\": \"<&'>\", \"a\": [1, 2.0]}|{\n  \"b\": \"<&'>\",\n  \"a\": [\n    1,\n    2.0\n  ]\n}|\
         {\"a\":[1,2.0],\"b\":\"<&'>\"}"
    );
}

#[test]
fn builtin_tokenizer_has_no_template() {
    let m = ModelTokens::new(Tokenizer::builtin(), None, 16, DEFAULT_CACHE_UNITS);
    assert!(m.template().is_none());
    let msgs = vec![json!({"role": "user", "content": "hi"})];
    let text = m
        .render_chat(&ChatRequest {
            messages: &msgs,
            tools: None,
            add_generation_prompt: true,
            kwargs: None,
        })
        .unwrap();
    assert_eq!(
        text,
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    );
}
