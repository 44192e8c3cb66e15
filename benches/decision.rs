//! A whole routing decision for an ~8,000-token chat whose system prompt was seen before:
//! render the chat template, tokenize (the system prompt's piece from the segment cache, the
//! new question from the tokenizer), hash the blocks, look up 16 workers in the index, score
//! with `kv_aware`. Two shapes: a short new question (~500 tokens) and a long one (~2,000).
//!
//! `cargo bench --bench decision`

use std::hint::black_box;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use kvroute::fleet::LoadSnapshot;
use kvroute::index::{Holdings, WorkerIdx};
use kvroute::openai::{Endpoint, RequestView};
use kvroute::policy::{Candidate, KvAware, KvAwareConfig, Policy, RouteRequest};
use kvroute::tokens::ModelTokens;
use kvroute::tokens::model::{DEFAULT_CACHE_UNITS, hash_seed};
use serde_json::json;

#[path = "common/prose.rs"]
mod prose;

fn view(system: &str, question: &str) -> RequestView {
    let body = json!({"model": "qwen3", "messages": [
        {"role": "system", "content": system},
        {"role": "user", "content": question},
    ]});
    RequestView::parse(Endpoint::ChatCompletions, &body).expect("valid request")
}

fn decide(model: &ModelTokens, holdings: &Holdings, policy: &KvAware, v: &RequestView) -> usize {
    let ids = model.prompt_ids(v).expect("tokenizes");
    let hashes = model.block_hashes(&ids, hash_seed("qwen3", None, None));
    let overlaps = holdings.lookup(&hashes, Duration::from_secs(1));
    let candidates: Vec<Candidate> = (0..16u32)
        .map(|w| Candidate {
            id: format!("w{w}").into(),
            slot: w,
            load: LoadSnapshot {
                in_flight: u64::from(w % 5),
                queued_prefill_tokens: u64::from(w) * 700,
                decoding: u64::from(w % 7),
                active_prompt_tokens: u64::from(w) * 3000,
            },
            overlap_blocks: overlaps.get(WorkerIdx(w)),
        })
        .collect();
    let request = RouteRequest {
        prompt_tokens: ids.len() as u64,
        blocks: hashes.len() as u32,
        block_size: 16,
    };
    policy
        .choose(&request, &candidates)
        .map(|d| d.chosen)
        .unwrap_or(0)
}

fn benches(c: &mut Criterion) {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tokenizers/qwen3");
    let model = ModelTokens::from_hf_dir(&dir, 16, DEFAULT_CACHE_UNITS).expect("qwen3 loads");
    let policy = KvAware::new(KvAwareConfig::default(), 1);
    let mut g = c.benchmark_group("decision_8k_chat");
    g.sample_size(20)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(4));
    for (name, system_words, question_words) in [
        ("seen_system_prompt_new_500_token_question", 5_600, 380),
        ("seen_system_prompt_new_2000_token_question", 4_500, 1_500),
    ] {
        let system = prose::words(system_words, 1);
        // Seen before: the system prompt's piece is cached, and worker 3 holds its blocks.
        let first = view(&system, "warm-up question");
        let ids = model.prompt_ids(&first).expect("tokenizes");
        eprintln!("{name}: {} tokens in the warm-up request", ids.len());
        let holdings = Holdings::default();
        let hashes = model.block_hashes(&ids, hash_seed("qwen3", None, None));
        holdings
            .approx
            .record_routed(WorkerIdx(3), &hashes, Duration::ZERO);
        let n = AtomicU64::new(10);
        g.bench_function(name, |b| {
            b.iter_batched(
                || {
                    view(
                        &system,
                        &prose::words(question_words, n.fetch_add(1, Ordering::Relaxed)),
                    )
                },
                |v| black_box(decide(&model, &holdings, &policy, &v)),
                BatchSize::SmallInput,
            )
        });
    }
    g.finish();
}

criterion_group!(decision, benches);
criterion_main!(decision);
