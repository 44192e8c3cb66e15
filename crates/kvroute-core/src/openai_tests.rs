//! Tests of `openai`.

use super::*;
use serde_json::json;

fn parse(ep: Endpoint, v: Value) -> Result<RequestView, ApiError> {
    RequestView::parse(ep, &v)
}

#[test]
fn prompt_shapes() {
    let c = Endpoint::Completions;
    let p = |v| match parse(c, json!({"model":"m","prompt":v})).unwrap().input {
        Input::Prompt(p) => p,
        _ => panic!("not a prompt"),
    };
    assert_eq!(p(json!("hi")), Prompt::Text("hi".into()));
    assert_eq!(
        p(json!(["a", "b"])),
        Prompt::Texts(vec!["a".into(), "b".into()])
    );
    assert_eq!(p(json!([1, 2])), Prompt::Tokens(vec![1, 2].into()));
    assert_eq!(
        p(json!([[1], [2, 3]])),
        Prompt::TokenBatches(vec![vec![1].into(), vec![2, 3].into()])
    );
    let wide = [0, 127, 128, 151_935, u32::MAX];
    assert_eq!(p(json!(wide)), Prompt::Tokens(wide[..].into()));
    match p(json!(wide)) {
        Prompt::Tokens(ids) => assert_eq!(ids.to_vec(), wide),
        other => panic!("{other:?}"),
    }
}

#[test]
fn bad_prompts_are_400_on_prompt() {
    for v in [
        json!(null),
        json!(3),
        json!([]),
        json!(["a", 1]),
        json!([-1]),
        json!([[]]),
        json!([4294967296u64]),
        json!([{}]),
    ] {
        let e = parse(Endpoint::Completions, json!({"model":"m","prompt":v})).unwrap_err();
        assert_eq!(e.status, StatusCode::BAD_REQUEST, "{v}");
        assert_eq!(e.param.as_deref(), Some("prompt"), "{v}");
    }
}

#[test]
fn model_is_required() {
    for body in [
        json!({"prompt":"x"}),
        json!({"model":"","prompt":"x"}),
        json!({"model":5,"prompt":"x"}),
    ] {
        let e = parse(Endpoint::Completions, body).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("model"));
    }
    assert!(parse(Endpoint::Completions, json!([1])).is_err());
}

#[test]
fn chat_messages_validated() {
    let ok = parse(
        Endpoint::ChatCompletions,
        json!({"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"a"}]}],"stream":true}),
    )
    .unwrap();
    assert!(ok.stream);
    for m in [
        json!(null),
        json!([]),
        json!("x"),
        json!([{"content":"x"}]),
        json!([{"role":"user","content":5}]),
        json!([{"role":"user","content":[1]}]),
    ] {
        let e = parse(Endpoint::ChatCompletions, json!({"model":"m","messages":m})).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("messages"), "{m}");
    }
}

#[test]
fn stream_with_n_and_absurd_max_tokens_rejected() {
    let e = parse(
        Endpoint::Completions,
        json!({"model":"m","prompt":"x","stream":true,"n":2}),
    )
    .unwrap_err();
    assert_eq!(e.param.as_deref(), Some("n"));
    let e = parse(
        Endpoint::Completions,
        json!({"model":"m","prompt":"x","max_tokens":1u64<<40}),
    )
    .unwrap_err();
    assert_eq!(e.param.as_deref(), Some("max_tokens"));
    let e = parse(
        Endpoint::Completions,
        json!({"model":"m","prompt":"x","max_tokens":"5"}),
    )
    .unwrap_err();
    assert_eq!(e.param.as_deref(), Some("max_tokens"));
}

#[test]
fn error_body_has_openai_shape() {
    let e = ApiError::model_not_found("x");
    let v: Value = serde_json::from_str(&e.body()).unwrap();
    let err = &v["error"];
    assert_eq!(err["type"], "invalid_request_error");
    assert_eq!(err["code"], "model_not_found");
    assert_eq!(err["param"], "model");
    assert!(err["message"].as_str().unwrap().contains('x'));
}

#[test]
fn content_text_joins_parts() {
    assert_eq!(content_text(Some(&json!("a"))), "a");
    assert_eq!(
        content_text(Some(
            &json!([{"type":"text","text":"a"},{"type":"image_url"},{"type":"text","text":"b"}])
        )),
        "a\nb"
    );
    assert_eq!(content_text(None), "");
}

/// The streaming reader and the tree path agree on every body, valid or not: same view, or the
/// same error (status, param and message).
#[test]
fn bytes_and_tree_give_the_same_answer() {
    let bodies = [
        r#"{"model":"m","prompt":"x"}"#,
        r#"{"model":"m","prompt":[1,2,3],"max_tokens":5,"n":2}"#,
        r#"{"model":"m","prompt":[[1],[2,3]]}"#,
        r#"{"model":"m","prompt":["a","b"]}"#,
        r#"{"model":"m","prompt":[[1],[]]}"#,
        r#"{"model":"m","prompt":[[1],[-7]]}"#,
        r#"{"model":"m","prompt":[[1],5]}"#,
        r#"{"model":"m","prompt":[]}"#,
        r#"{"model":"m","prompt":[null]}"#,
        r#"{"model":"m","prompt":[1.5]}"#,
        r#"{"model":"m","prompt":[1,"a"]}"#,
        r#"{"model":"m","prompt":["a",[1]]}"#,
        r#"{"model":"m","prompt":{"a":[1]}}"#,
        r#"{"model":5,"prompt":[-1]}"#,
        r#"{"prompt":[-1],"model":"m","model":null}"#,
        r#"{"model":"a","model":"b","prompt":"x","prompt":[7]}"#,
        r#"{"model":"m","prompt":"x","max_tokens":-1,"n":0}"#,
        r#"{"model":"m","prompt":"x","max_completion_tokens":null,"max_tokens":"5"}"#,
        r#"{"model":"m","prompt":"x","stream":true,"stream_options":{"include_usage":true,"x":[{}]}}"#,
        r#"{"model":"m","prompt":"x","stream_options":{"include_usage":1}}"#,
        r#"{"model":"m","prompt":"x","stream_options":[]}"#,
        r#"{"model":"m","prompt":"x","tools":{},"cache_salt":"s"}"#,
        r#"{"model":"m","prompt":"x","cache_salt":5}"#,
        r#"{"model":"m","messages":[{"role":"user","content":"x"}],"tools":[{"type":"function"}],"chat_template_kwargs":{"a":1}}"#,
        r#"{"model":"m","messages":[{"role":"user","content":"x"}],"chat_template_kwargs":[]}"#,
        r#"{"model":"m","messages":[{"role":"user","content":[{"type":1}]}]}"#,
        r#"{"model":"m","messages":"x","prompt":[1]}"#,
        r#"{"model":"m","messages":[],"add_generation_prompt":false}"#,
        r#"{"model":"m","messages":[{"role":"user"}],"add_generation_prompt":"no"}"#,
        r#"[{"model":"m"}]"#,
        r#""m""#,
        "null",
        "5",
    ];
    for body in bodies {
        let tree: Value = serde_json::from_str(body).unwrap();
        for ep in [Endpoint::Completions, Endpoint::ChatCompletions] {
            assert_eq!(
                RequestView::from_json(ep, body.as_bytes()),
                RequestView::parse(ep, &tree),
                "{ep:?} {body}"
            );
        }
    }
}

/// Malformed JSON anywhere is refused, even inside a field routing skips, and before any field
/// is judged: skipped values are parsed, not scanned.
#[test]
fn malformed_json_is_refused_wherever_it_is() {
    for body in [
        &b"{\"model\":5,\"x\":1e400}"[..],
        b"{\"model\":\"m\",\"prompt\":\"x\",\"x\":\"\\ud800\"}",
        b"{\"model\":\"m\",\"prompt\":\"x\",\"x\":[\"\xff\"]}",
        b"{\"model\":\"m\",\"prompt\":\"x\",\"messages\":[1,}",
        b"{\"model\":\"m\",\"prompt\":[-1,1e400]}",
        b"{\"model\":\"m\",\"prompt\":\"x\"} x",
        b"",
    ] {
        let e = RequestView::from_json(Endpoint::Completions, body).unwrap_err();
        assert!(
            e.message.starts_with("the body is not valid JSON"),
            "{}: {e}",
            String::from_utf8_lossy(body)
        );
        assert_eq!(e.param, None);
    }
    let deep = format!(
        "{{\"model\":\"m\",\"prompt\":\"x\",\"x\":{}1{}}}",
        "[".repeat(200),
        "]".repeat(200)
    );
    let e = RequestView::from_json(Endpoint::Completions, deep.as_bytes()).unwrap_err();
    assert!(e.message.contains("recursion limit"), "{e}");
}

/// What routing does not read is not kept: a completion's `messages` and a chat's `prompt` are
/// skipped, and a completion keeps no `tools`.
#[test]
fn unread_fields_are_not_kept() {
    let v = RequestView::from_json(
        Endpoint::Completions,
        br#"{"model":"m","prompt":[1,2],"messages":"not checked","tools":[{"a":1}]}"#,
    )
    .unwrap();
    assert_eq!(v.input, Input::Prompt(Prompt::Tokens(vec![1, 2].into())));
    assert_eq!(v.tools, None);
    let v = RequestView::from_json(
        Endpoint::ChatCompletions,
        br#"{"model":"m","prompt":{"not":"checked"},"messages":[{"role":"user","content":"x"}],"tools":[{"a":1}]}"#,
    )
    .unwrap();
    assert_eq!(v.tools, Some(json!([{"a":1}])));
}

/// Messages are judged in order, the first refused one naming the error, however much follows
/// it (which is walked, not kept).
#[test]
fn the_first_refused_message_names_the_error() {
    let cases = [
        (
            r#"[{"role":"user","content":"x"},1,{"role":2}]"#,
            "`messages[1]` must be an object",
        ),
        (
            r#"[{"content":[1],"role":5}]"#,
            "`messages[0].role` must be a string",
        ),
        (
            r#"[{"role":1,"role":"user","content":{"a":[1]}}]"#,
            "`messages[0].content` must be a string or an array of parts",
        ),
        (
            r#"[{"role":"u","content":[{"type":"text"},{"type":1},7]},5]"#,
            "`messages[0].content[1]` must be an object with a `type`",
        ),
        (
            r#"[{"role":"u"},{"role":"u","content":[{"type":"t"},[1,2]]}]"#,
            "`messages[1].content[1]` must be an object with a `type`",
        ),
    ];
    for (messages, want) in cases {
        let body = format!(r#"{{"model":"m","messages":{messages}}}"#);
        let e = RequestView::from_json(Endpoint::ChatCompletions, body.as_bytes()).unwrap_err();
        assert_eq!(e.message, want, "{messages}");
        assert_eq!(e.param.as_deref(), Some("messages"));
    }
    let ok = RequestView::from_json(
        Endpoint::ChatCompletions,
        br#"{"model":"m","messages":[{"role":1,"role":"user","content":[{"type":"text","text":"a","x":[1]}],"name":"n"}]}"#,
    )
    .unwrap();
    assert_eq!(
        ok.input,
        Input::Messages(vec![
            json!({"role":"user","content":[{"type":"text","text":"a","x":[1]}],"name":"n"})
        ])
    );
}

/// vLLM computes every prompt position of a request that asks for prompt logprobs, so it
/// reads nothing from its prefix cache (`cached_tokens` 0, measured on vLLM 0.32).
#[test]
fn prompt_logprobs_skip_the_prefix_cache() {
    let c = Endpoint::Completions;
    let chat = Endpoint::ChatCompletions;
    let reads = |ep, v: Value| parse(ep, v).unwrap().reads_prefix_cache;
    let msgs = json!([{"role": "user", "content": "hi"}]);
    assert!(reads(c, json!({"model": "m", "prompt": "hi"})));
    assert!(!reads(
        c,
        json!({"model": "m", "prompt": "hi", "prompt_logprobs": 1})
    ));
    assert!(!reads(
        c,
        json!({"model": "m", "prompt": "hi", "prompt_logprobs": -1})
    ));
    assert!(reads(
        c,
        json!({"model": "m", "prompt": "hi", "prompt_logprobs": null})
    ));
    assert!(!reads(
        c,
        json!({"model": "m", "prompt": "hi", "echo": true, "logprobs": 0})
    ));
    assert!(reads(
        c,
        json!({"model": "m", "prompt": "hi", "echo": true})
    ));
    assert!(reads(
        c,
        json!({"model": "m", "prompt": "hi", "echo": false, "logprobs": 5})
    ));
    assert!(reads(
        c,
        json!({"model": "m", "prompt": "hi", "logprobs": 5})
    ));
    assert!(!reads(
        chat,
        json!({"model": "m", "messages": msgs, "prompt_logprobs": 2})
    ));
    assert!(reads(
        chat,
        json!({"model": "m", "messages": msgs, "logprobs": true})
    ));
    // The streaming reader sees the same.
    let body = br#"{"model":"m","prompt":[1,2,3],"echo":true,"logprobs":1}"#;
    assert!(!RequestView::from_json(c, body).unwrap().reads_prefix_cache);
}
