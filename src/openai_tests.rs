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
    assert_eq!(p(json!([1, 2])), Prompt::Tokens(vec![1, 2]));
    assert_eq!(
        p(json!([[1], [2, 3]])),
        Prompt::TokenBatches(vec![vec![1], vec![2, 3]])
    );
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
