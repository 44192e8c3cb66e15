//! Cutting at added tokens and caching the pieces gives exactly the ids of one full encode,
//! and tokenizers for which that would not hold are detected.

use std::sync::Arc;

use kvroute::tokens::model::DEFAULT_CACHE_UNITS;
use kvroute::tokens::segment::Segmenter;
use kvroute::tokens::{ChatRequest, ModelTokens, Tokenizer};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};

use crate::support::{fixtures, qwen3};

fn hf(model: &ModelTokens) -> &tokenizers::Tokenizer {
    match model.tokenizer() {
        Tokenizer::Hf(t) => t,
        Tokenizer::Builtin => panic!("not an HF tokenizer"),
    }
}

fn full(model: &ModelTokens, text: &str) -> Vec<u32> {
    model.tokenizer().encode(text).unwrap()
}

/// Every added token, plus near-misses and text that tends to merge across boundaries.
fn fragments(model: &ModelTokens) -> Vec<String> {
    let mut out: Vec<String> = hf(model)
        .get_added_tokens_decoder()
        .into_values()
        .map(|t| t.content)
        .collect();
    out.sort();
    for s in [
        "<|im_",
        "<|im_end",
        "|>",
        "<",
        ">",
        "<think",
        "</think",
        "\n",
        "\n\n",
        "   ",
        " ",
        "\t",
        "Hello",
        " world",
        "user",
        "assistant",
        "123",
        "4567",
        "é",
        "日本語",
        "🚀👩\u{200d}💻",
        "'s",
        "'ll",
        "  padded  ",
        "{\"a\": 1}",
        "\r\n",
        "x",
        "ÅÄÖ",
        "\u{301}",
        "e",
    ] {
        out.push(s.to_owned());
    }
    out
}

#[test]
fn qwen3_cuts_at_every_added_token() {
    let model = qwen3();
    assert_eq!(model.segmenting(), Ok(()));
    let n = hf(model).get_added_tokens_decoder().len();
    assert!(n >= 20, "{n} added tokens");
}

#[test]
fn random_texts_encode_identically_cut_and_whole() {
    let model = qwen3();
    let frags = fragments(model);
    let mut rng = StdRng::seed_from_u64(0x5eed);
    for round in 0..300 {
        let len = rng.random_range(0..40);
        let text: String = (0..len)
            .map(|_| frags[rng.random_range(0..frags.len())].as_str())
            .collect();
        let expected = full(model, &text);
        // Twice: the second call is served from the cache.
        assert_eq!(
            model.encode(&text).unwrap(),
            expected,
            "round {round}: {text:?}"
        );
        assert_eq!(
            model.encode(&text).unwrap(),
            expected,
            "round {round} cached: {text:?}"
        );
    }
    let stats = model.cache_stats().unwrap();
    assert!(stats.hits > 0 && stats.misses > 0, "{stats:?}");
}

fn long_chat(system_words: usize, user_words: usize, seed: u64) -> Vec<Value> {
    let words = [
        "the", "router", "caches", "blocks", "of", "tokens", "and", "routes", "requests", "to",
        "workers", "that", "hold", "their", "prefix", "—", "fast,", "exact;", "🚀", "12345",
    ];
    let mut rng = StdRng::seed_from_u64(seed);
    let mut text = |n: usize| -> String {
        let mut s = String::new();
        for i in 0..n {
            if i % 37 == 36 {
                s.push('\n');
            } else if i > 0 {
                s.push(' ');
            }
            s.push_str(words[rng.random_range(0..words.len())]);
        }
        s
    };
    vec![
        json!({"role": "system", "content": text(system_words)}),
        json!({"role": "user", "content": text(user_words)}),
        json!({"role": "assistant", "content": "<think>\nok\n</think>\n\nSure."}),
        json!({"role": "user", "content": text(user_words / 4)}),
    ]
}

fn render(model: &ModelTokens, messages: &[Value]) -> String {
    model
        .render_chat(&ChatRequest {
            messages,
            tools: None,
            add_generation_prompt: true,
            kwargs: None,
        })
        .unwrap()
}

#[test]
fn long_chats_with_a_shared_system_prompt() {
    let model = qwen3();
    let a = long_chat(4000, 1000, 1);
    let mut b = long_chat(4000, 1200, 2);
    b[0] = a[0].clone(); // same system prompt, different turns
    for messages in [&a, &b, &a] {
        let text = render(model, messages);
        let expected = full(model, &text);
        assert!(expected.len() > 5000, "{}", expected.len());
        assert_eq!(model.encode(&text).unwrap(), expected);
    }
}

#[test]
fn concurrent_encoding_is_exact() {
    let model = qwen3();
    let texts: Arc<Vec<String>> = Arc::new(
        (0..6)
            .map(|i| render(model, &long_chat(300, 100 + i * 10, i as u64 % 3)))
            .collect(),
    );
    let expected: Vec<Vec<u32>> = texts.iter().map(|t| full(model, t)).collect();
    let handles: Vec<_> = (0..4)
        .map(|k| {
            let texts = texts.clone();
            std::thread::spawn(move || {
                let model = qwen3();
                (0..12)
                    .map(|i| {
                        let j = (i + k) % texts.len();
                        (j, model.encode(&texts[j]).unwrap())
                    })
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    for h in handles {
        for (j, ids) in h.join().unwrap() {
            assert_eq!(ids, expected[j]);
        }
    }
}

/// A tiny word-level tokenizer with a Metaspace pre-tokenizer and one added token.
fn metaspace_tokenizer(scheme: &str) -> tokenizers::Tokenizer {
    let json = json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": [{"id": 0, "content": "<s>", "single_word": false, "lstrip": false,
                          "rstrip": false, "normalized": false, "special": true}],
        "normalizer": null,
        "pre_tokenizer": {"type": "Metaspace", "replacement": "▁", "prepend_scheme": scheme,
                          "split": true},
        "post_processor": null,
        "decoder": null,
        "model": {"type": "WordLevel", "vocab": {"<s>": 0, "<unk>": 1, "▁hello": 2, "hello": 3},
                  "unk_token": "<unk>"}
    });
    json.to_string().parse().unwrap()
}

#[test]
fn offset_dependent_pre_tokenizer_is_refused() {
    let t = metaspace_tokenizer("first");
    // Why it must be refused: after `<s>`, "hello" is not at offset 0, so no `▁` is prepended
    // in a full encode, but it would be if "hello" were encoded on its own.
    let whole = t.encode_fast("<s>hello", false).unwrap().get_ids().to_vec();
    let alone = t.encode_fast("hello", false).unwrap().get_ids().to_vec();
    assert_eq!(whole, vec![0, 3]);
    assert_eq!(alone, vec![2]);
    let err = Segmenter::for_tokenizer(&t).unwrap_err();
    assert!(err.0.contains("prepend_scheme"), "{err}");
    // The model still encodes correctly, whole.
    let model = ModelTokens::new(Tokenizer::Hf(Box::new(t)), None, 16, DEFAULT_CACHE_UNITS);
    assert!(model.segmenting().is_err());
    assert_eq!(model.encode("<s>hello").unwrap(), vec![0, 3]);
}

#[test]
fn position_independent_pre_tokenizer_is_accepted() {
    let t = metaspace_tokenizer("always");
    Segmenter::for_tokenizer(&t).unwrap();
    let model = ModelTokens::new(Tokenizer::Hf(Box::new(t)), None, 16, DEFAULT_CACHE_UNITS);
    assert_eq!(model.segmenting(), Ok(()));
    for text in ["<s>hello", "hello<s>hello", "<s><s> hello", ""] {
        assert_eq!(model.encode(text).unwrap(), full(&model, text), "{text:?}");
    }
}

#[test]
fn stripping_added_tokens_are_refused() {
    let path = fixtures().join("tokenizers/qwen3/tokenizer.json");
    let mut json: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    json["added_tokens"][1]["lstrip"] = json!(true);
    let t: tokenizers::Tokenizer = json.to_string().parse().unwrap();
    let err = Segmenter::for_tokenizer(&t).unwrap_err();
    assert!(err.0.contains("lstrip"), "{err}");
}

#[test]
fn disabled_cache_encodes_whole() {
    let path = fixtures().join("tokenizers/qwen3/tokenizer.json");
    let model = ModelTokens::new(Tokenizer::from_file(&path).unwrap(), None, 16, 0);
    assert!(model.segmenting().is_err());
    assert!(model.cache_stats().is_none());
    let text = "<|im_start|>user\nhi<|im_end|>\n";
    assert_eq!(model.encode(text).unwrap(), full(&model, text));
}
