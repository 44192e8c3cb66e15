//! Property tests of the parsers that see untrusted input: request bodies
//! (`RequestView::parse` on arbitrary JSON, then `prompt_ids` on what it accepts), `--worker`
//! flags, and the SSE first-token detector under arbitrary chunkings. None may panic; what
//! they accept must satisfy the documented invariants. (Arbitrary bytes into the KV-event
//! decoder are covered by `kv_events_proptest.rs`.)

use kvroute::config::parse_worker_flag;
use kvroute::openai::{Endpoint, Input, MAX_TOKENS_LIMIT, Prompt, RequestView};
use kvroute::proxy::first_token::{FirstTokenDetector, event_has_content};
use kvroute::tokens::ModelTokens;
use proptest::prelude::*;
use serde_json::{Map, Number, Value, json};

/// Numbers of every awkward kind serde_json can hold.
fn number() -> impl Strategy<Value = Value> {
    prop_oneof![
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        (0u64..70_000).prop_map(Value::from),
        Just(Value::from(u64::from(u32::MAX) + 1)),
        Just(Value::from(MAX_TOKENS_LIMIT)),
        Just(Value::from(MAX_TOKENS_LIMIT + 1)),
        Just(Value::from(-1)),
        Just(Value::from(0)),
        any::<f64>().prop_filter_map("finite", |f| Number::from_f64(f).map(Value::Number)),
        Just(json!(1.0)),
        Just(json!(-0.0)),
        Just(json!(1e300)),
    ]
}

fn leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        number(),
        ".{0,12}".prop_map(Value::String),
        prop_oneof![
            Just("user"),
            Just("assistant"),
            Just("system"),
            Just("text"),
            Just("m")
        ]
        .prop_map(|s| Value::String(s.into())),
    ]
}

/// Any JSON value, a few levels deep.
fn value() -> impl Strategy<Value = Value> {
    leaf().prop_recursive(6, 48, 6, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            proptest::collection::vec((key(), inner), 0..6)
                .prop_map(|kv| Value::Object(kv.into_iter().collect::<Map<_, _>>())),
        ]
    })
}

/// Keys the parser reads, and some it does not.
fn key() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("model"),
        Just("prompt"),
        Just("messages"),
        Just("role"),
        Just("content"),
        Just("type"),
        Just("text"),
        Just("stream"),
        Just("n"),
        Just("max_tokens"),
        Just("max_completion_tokens"),
        Just("stream_options"),
        Just("include_usage"),
        Just("cache_salt"),
        Just("tools"),
        Just("chat_template_kwargs"),
        Just("add_generation_prompt"),
        Just("x"),
    ]
    .prop_map(str::to_owned)
}

/// `v` wrapped in `depth` arrays or objects.
fn deep(v: Value, depth: usize, objects: bool) -> Value {
    (0..depth).fold(v, |acc, _| {
        if objects {
            json!({ "content": acc })
        } else {
            json!([acc])
        }
    })
}

fn token_ids() -> impl Strategy<Value = Value> {
    prop_oneof![
        proptest::collection::vec(any::<u32>().prop_map(Value::from), 1..40).prop_map(Value::Array),
        proptest::collection::vec(number(), 0..8).prop_map(Value::Array),
    ]
}

fn prompt() -> impl Strategy<Value = Value> {
    prop_oneof![
        ".{0,200}".prop_map(Value::String),
        proptest::collection::vec(".{0,40}".prop_map(Value::String), 0..4).prop_map(Value::Array),
        token_ids(),
        proptest::collection::vec(token_ids(), 0..4).prop_map(Value::Array),
        value(),
    ]
}

fn message() -> impl Strategy<Value = Value> {
    let content = prop_oneof![
        ".{0,80}".prop_map(Value::String),
        Just(Value::Null),
        proptest::collection::vec(
            (".{0,40}", prop_oneof![Just("text"), Just("image_url")])
                .prop_map(|(t, k)| json!({"type": k, "text": t})),
            0..4
        )
        .prop_map(Value::Array),
        value(),
    ];
    let role = prop_oneof![
        Just(json!("user")),
        Just(json!("assistant")),
        Just(json!("system")),
        Just(json!("tool")),
        leaf(),
    ];
    (role, content, proptest::option::of(value())).prop_map(|(role, content, extra)| {
        let mut m = json!({"role": role, "content": content});
        if let Some(x) = extra {
            m["name"] = x;
        }
        m
    })
}

/// A request-shaped object: every field the parser reads, each either well-formed or not.
fn request() -> impl Strategy<Value = Value> {
    let model = prop_oneof![
        4 => Just(Some(json!("m"))),
        1 => proptest::option::of(leaf()),
    ];
    let messages = prop_oneof![
        4 => proptest::collection::vec(message(), 0..5).prop_map(Value::Array),
        1 => value(),
    ];
    let opt = || proptest::option::of(prop_oneof![3 => leaf(), 1 => value()]);
    (
        model,
        proptest::option::of(prompt()),
        proptest::option::of(messages),
        (opt(), opt(), opt(), opt()),
        (opt(), opt(), opt(), opt(), opt()),
    )
        .prop_map(
            |(
                model,
                prompt,
                messages,
                (stream, n, max_tokens, max_ct),
                (so, salt, tools, kw, agp),
            )| {
                let mut o = Map::new();
                for (k, v) in [
                    ("model", model),
                    ("prompt", prompt),
                    ("messages", messages),
                    ("stream", stream),
                    ("n", n),
                    ("max_tokens", max_tokens),
                    ("max_completion_tokens", max_ct),
                    ("stream_options", so),
                    ("cache_salt", salt),
                    ("tools", tools),
                    ("chat_template_kwargs", kw),
                    ("add_generation_prompt", agp),
                ] {
                    if let Some(v) = v {
                        o.insert(k.into(), v);
                    }
                }
                Value::Object(o)
            },
        )
}

/// What an accepted view must satisfy, and what a rejection must look like.
fn check(endpoint: Endpoint, body: &Value) -> Result<(), TestCaseError> {
    match RequestView::parse(endpoint, body) {
        Ok(view) => {
            prop_assert!(!view.model.is_empty());
            prop_assert_eq!(view.endpoint, endpoint);
            prop_assert!(!(view.stream && view.n.is_some_and(|n| n > 1)));
            prop_assert!(view.n != Some(0));
            prop_assert!(view.max_tokens.is_none_or(|m| m <= MAX_TOKENS_LIMIT));
            match (&view.input, endpoint) {
                (Input::Prompt(_), Endpoint::Completions) => {}
                (Input::Messages(m), Endpoint::ChatCompletions) => prop_assert!(!m.is_empty()),
                (input, ep) => prop_assert!(false, "{ep:?} produced {input:?}"),
            }
            let tokens = ModelTokens::builtin(16);
            let ids = tokens.prompt_ids(&view);
            prop_assert_eq!(
                &ids.is_ok(),
                &tokens.prompt_ids(&view).is_ok(),
                "deterministic"
            );
            match (&view.input, &ids) {
                (Input::Prompt(Prompt::Tokens(t)), Ok(ids)) => prop_assert_eq!(&t.to_vec(), ids),
                (Input::Prompt(Prompt::TokenBatches(b)), Ok(ids)) => {
                    let first = b.first().map(|t| t.to_vec());
                    prop_assert_eq!(first.as_ref(), Some(ids))
                }
                (Input::Prompt(Prompt::Tokens(_) | Prompt::TokenBatches(_)), Err(e)) => {
                    prop_assert!(false, "token ids failed: {e}")
                }
                (Input::Prompt(Prompt::Text(t)), Ok(ids)) => {
                    let again = tokens.encode(t).ok();
                    prop_assert_eq!(Some(ids), again.as_ref())
                }
                _ => {}
            }
        }
        Err(e) => {
            prop_assert!(e.status.is_client_error(), "{e}");
            let v: Value = serde_json::from_str(&e.body()).expect("error body is JSON");
            prop_assert!(v["error"]["message"].is_string());
            prop_assert!(v["error"]["type"].is_string());
            prop_assert!(v["error"].get("param").is_some() && v["error"].get("code").is_some());
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn parse_never_panics_on_arbitrary_json(v in value()) {
        check(Endpoint::Completions, &v)?;
        check(Endpoint::ChatCompletions, &v)?;
    }

    #[test]
    fn parse_upholds_its_invariants_on_request_shaped_json(v in request()) {
        check(Endpoint::Completions, &v)?;
        check(Endpoint::ChatCompletions, &v)?;
    }

    /// Deep nesting up to what the router's JSON parser lets through (128 levels), in every
    /// field the parser or the chat template reads.
    #[test]
    fn deeply_nested_fields_are_handled(depth in 1usize..123, objects in any::<bool>(), at in 0usize..5) {
        let inner = deep(json!("x"), depth, objects);
        let body = match at {
            0 => json!({"model": "m", "prompt": inner, "messages": inner}),
            1 => json!({"model": "m", "messages": [{"role": "user", "content": inner}]}),
            2 => json!({"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": "a", "x": inner}]}]}),
            3 => json!({"model": "m", "messages": [{"role": "user", "content": "a"}], "tools": [inner], "chat_template_kwargs": {"k": inner}}),
            _ => json!({"model": "m", "prompt": "p", "messages": [{"role": "user", "content": "a", "name": inner}], "stream_options": inner}),
        };
        // The same bytes the router would see must parse within serde_json's limit (128 levels, the wrapper included).
        let text = serde_json::to_vec(&body).unwrap();
        let reparsed: Value = serde_json::from_slice(&text).unwrap();
        check(Endpoint::Completions, &reparsed)?;
        check(Endpoint::ChatCompletions, &reparsed)?;
    }

    #[test]
    fn worker_flags_never_panic(flag in prop_oneof![
        ".{0,60}",
        "(http|https|ftp|tcp)://[a-z0-9.:\\[\\]@=,/_-]{0,30}(=[a-z,=]{0,10})?(@(tcp|ipc|udp)://[a-z0-9.:*@=]{0,20})?",
        "http://[a-zA-Z0-9.:\\[\\]%]{0,20}@tcp://.{0,10}",
    ]) {
        if let Ok(w) = parse_worker_flag(&flag) {
            prop_assert!(!w.id.is_empty());
            prop_assert!(!w.id.chars().any(|c| c.is_whitespace() || c.is_control()));
            prop_assert!(w.models.iter().all(|m| !m.is_empty()));
            if let Some(ep) = &w.kv_events {
                prop_assert!(ep.starts_with("tcp://") || ep.starts_with("ipc://"), "{ep}");
            }
            let url = w.url.to_string();
            prop_assert!(url.starts_with("http://") || url.starts_with("https://"), "{url}");
            prop_assert_eq!(url.starts_with("https://"), w.url.is_tls());
            // A worker URL joins any API path into a valid URI.
            let _ = w.url.join("/v1/completions");
        }
    }
}

/// One line of an SSE stream as engines and proxies write them.
fn sse_line() -> impl Strategy<Value = String> {
    let text = ".{0,12}";
    prop_oneof![
        Just("data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}".to_string()),
        Just("data: {\"choices\":[{\"index\":0,\"text\":\"\"}]}".to_string()),
        Just("data: {\"choices\":[],\"usage\":{\"prompt_tokens\":3}}".to_string()),
        Just(": keep-alive".to_string()),
        Just("event: message".to_string()),
        Just("id: 7".to_string()),
        Just("data: [DONE]".to_string()),
        Just("data:".to_string()),
        Just(String::new()),
        text.prop_map(|t| format!("data: {}", json!({"choices":[{"index":0,"text":t}]}))),
        text.prop_map(|t| format!("data:{}", json!({"choices":[{"index":0,"delta":{"content":t}}]}))),
        text.prop_map(|t| format!("data: {}", json!({"choices":[{"delta":{"reasoning_content":t}}]}))),
        "[a-z ]{1,10}".prop_map(|t| format!("data: {t}")),
        "[a-z:{}\" ]{0,20}",
    ]
}

/// The first-token position by definition: the offset just past the `\n` that ends the first
/// `data:` line carrying content.
fn oracle(stream: &[u8]) -> Option<usize> {
    let mut start = 0;
    while let Some(nl) = stream[start..].iter().position(|&b| b == b'\n') {
        let end = start + nl;
        let line = &stream[start..end];
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if let Some(data) = line.strip_prefix(b"data:") {
            let data = data.trim_ascii();
            if !data.is_empty() && data != b"[DONE]" {
                let content = match serde_json::from_slice::<Value>(data) {
                    Ok(v) => event_has_content(&v),
                    Err(_) => true,
                };
                if content {
                    return Some(end + 1);
                }
            }
        }
        start = end + 1;
    }
    None
}

/// Feeds `stream` in chunks ending at `cuts`; returns the end offset of the chunk on which
/// the detector fired, checking it fires at most once.
fn detect(stream: &[u8], cuts: &[usize]) -> Option<usize> {
    let mut d = FirstTokenDetector::default();
    let mut fired = None;
    let mut prev = 0;
    for &cut in cuts.iter().chain(std::iter::once(&stream.len())) {
        if cut < prev {
            continue;
        }
        if d.feed(&stream[prev..cut]) {
            assert!(fired.is_none(), "fired twice");
            fired = Some((prev, cut));
        }
        prev = cut;
    }
    assert_eq!(d.found(), fired.is_some());
    fired.map(|(start, end)| {
        // The chunk that fired must contain the end of the first content line.
        assert!(start < end);
        end
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1024, ..ProptestConfig::default() })]

    #[test]
    fn first_token_position_does_not_depend_on_chunking(
        lines in proptest::collection::vec((sse_line(), prop_oneof![Just("\n"), Just("\r\n"), Just("\n\n")]), 0..12),
        tail in "[a-z:{}\" ]{0,10}",
        cuts in proptest::collection::vec(any::<prop::sample::Index>(), 0..20),
    ) {
        let mut stream = Vec::new();
        for (l, sep) in &lines {
            stream.extend_from_slice(l.as_bytes());
            stream.extend_from_slice(sep.as_bytes());
        }
        stream.extend_from_slice(tail.as_bytes());
        let want = oracle(&stream);
        let mut cuts: Vec<usize> = cuts.iter().map(|i| i.index(stream.len() + 1)).collect();
        cuts.sort_unstable();

        // Whole.
        let whole = detect(&stream, &[]);
        prop_assert_eq!(whole.is_some(), want.is_some());
        // Byte by byte: fires exactly on the line's last byte.
        let bytes: Vec<usize> = (1..stream.len()).collect();
        prop_assert_eq!(detect(&stream, &bytes), want);
        // Arbitrary cuts: fires on the chunk holding that byte.
        let got = detect(&stream, &cuts);
        match want {
            None => prop_assert_eq!(got, None),
            Some(p) => {
                let end = got.expect("first token found");
                let start = cuts.iter().rev().find(|&&c| c < p).copied().unwrap_or(0);
                prop_assert!(start < p && p <= end, "fired on chunk ending {end}, token at {p}, cuts {cuts:?}");
                let chunk_end = cuts.iter().find(|&&c| c >= p).copied().unwrap_or(stream.len());
                prop_assert_eq!(end, chunk_end);
            }
        }
    }
}

/// A first content event longer than the detector's 1 MiB line buffer (a large tool-call
/// argument, say) is found when it arrives in one chunk, and must be found as well when it
/// arrives in the 16–64 KiB pieces a socket delivers.
#[test]
fn a_first_event_longer_than_one_mib_is_found_however_it_is_split() {
    let big = "y".repeat(1 << 21);
    let event = format!(
        "data: {}\n\n",
        json!({"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":big}}]}}]})
    );
    let stream = event.as_bytes();
    let want = oracle(stream);
    assert!(want.is_some());
    assert!(detect(stream, &[]).is_some(), "whole");
    let cuts: Vec<usize> = (1..stream.len() / 65_536 + 1).map(|i| i * 65_536).collect();
    assert_eq!(
        detect(stream, &cuts),
        Some(
            cuts.iter()
                .find(|&&c| c >= want.unwrap())
                .copied()
                .unwrap_or(stream.len())
        ),
        "split into 64 KiB chunks, the first token is never seen"
    );
}
