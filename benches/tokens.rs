//! Tokenization cost of a routing decision for an ~8,000-token chat (Qwen3 tokenizer):
//! template render, cold encode (whole, and cut into pieces that all miss the cache), a
//! conversation whose ~6,000-token system prompt was seen before plus a new ~2,000-token user
//! turn, a fully repeated request, and block hashing.
//!
//! `cargo bench --bench tokens`
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test and bench code: a failed step should stop the run"
)]

use std::hint::black_box;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use kvroute::openai::{Endpoint, RequestView};
use kvroute::tokens::model::{DEFAULT_CACHE_UNITS, hash_seed};
use kvroute::tokens::{ChatRequest, ModelTokens};
use serde_json::{Value, json};

#[path = "common/prose.rs"]
mod prose;

/// Deterministic prose of at least `tokens` Qwen3 tokens, distinct per `seed`.
fn prose(model: &ModelTokens, tokens: usize, seed: u64) -> String {
    let mut words = tokens / 2;
    loop {
        let s = prose::words(words, seed);
        if model
            .tokenizer()
            .encode(&s)
            .map(|v| v.len())
            .unwrap_or(usize::MAX)
            >= tokens
        {
            return s;
        }
        words += words / 4 + 1;
    }
}

fn chat(system: &str, user: &str) -> Value {
    json!({
        "model": "qwen3",
        "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": user},
        ],
    })
}

fn view(body: &Value) -> RequestView {
    RequestView::parse(Endpoint::ChatCompletions, body).expect("valid request")
}

fn benches(c: &mut Criterion) {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tokenizers/qwen3");
    let model = ModelTokens::from_hf_dir(&dir, 16, DEFAULT_CACHE_UNITS).expect("qwen3 loads");
    let system = prose(&model, 6000, 1);
    let user = prose(&model, 2000, 2);
    let body = chat(&system, &user);
    let messages = body["messages"].as_array().expect("messages").clone();
    let req = ChatRequest {
        messages: &messages,
        tools: None,
        add_generation_prompt: true,
        kwargs: None,
    };
    let text = model.render_chat(&req).expect("renders");
    let ids = model.tokenizer().encode(&text).expect("encodes");
    eprintln!("chat: {} bytes, {} tokens", text.len(), ids.len());

    let mut g = c.benchmark_group("tokens_8k_chat");
    g.sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));

    g.bench_function("render_template", |b| {
        b.iter(|| model.render_chat(black_box(&req)).expect("renders"))
    });
    g.bench_function("encode_whole_cold", |b| {
        b.iter(|| model.tokenizer().encode(black_box(&text)).expect("encodes"))
    });
    let n = AtomicU64::new(1_000);
    // Unique texts, so nothing in the tokenizer can have seen them either.
    g.bench_function("encode_whole_cold_unique_text", |b| {
        b.iter_batched(
            || {
                let k = n.fetch_add(1, Ordering::Relaxed);
                text.replacen(
                    "<|im_start|>system\n",
                    &format!("<|im_start|>system\n{k}"),
                    1,
                )
            },
            |t| model.tokenizer().encode(&t).expect("encodes"),
            BatchSize::SmallInput,
        )
    });
    // Every piece new: the cost of cutting plus caching when nothing was seen before.
    g.bench_function("prompt_ids_cold_all_pieces_miss", |b| {
        b.iter_batched(
            || {
                let k = n.fetch_add(1, Ordering::Relaxed);
                view(&chat(&format!("{k}{system}"), &format!("{k}{user}")))
            },
            |v| model.prompt_ids(&v).expect("ids"),
            BatchSize::SmallInput,
        )
    });
    // The 6,000-token system prompt was seen before; the 2,000-token user turn is new.
    model.prompt_ids(&view(&body)).expect("warms the cache");
    g.bench_function("prompt_ids_cached_system_new_user_turn", |b| {
        b.iter_batched(
            || {
                let k = n.fetch_add(1, Ordering::Relaxed);
                view(&chat(&system, &format!("{k}{user}")))
            },
            |v| model.prompt_ids(&v).expect("ids"),
            BatchSize::SmallInput,
        )
    });
    let repeated = view(&body);
    g.bench_function("prompt_ids_fully_cached", |b| {
        b.iter(|| model.prompt_ids(black_box(&repeated)).expect("ids"))
    });
    let seed = hash_seed("qwen3", None, None);
    g.bench_function("block_hashes_bs16", |b| {
        b.iter(|| model.block_hashes(black_box(&ids), seed))
    });
    g.finish();
}

criterion_group!(tokens, benches);
criterion_main!(tokens);
