//! A whole routing decision for an ~8,000-token chat whose system prompt was seen before:
//! render the chat template, tokenize (the system prompt's piece from the segment cache, the
//! new question from the tokenizer), hash the blocks, look up 16 workers in the index, score
//! with `kv_aware` and admit, through the live decision core. Two shapes: a short new question
//! (~500 tokens) and a long one (~2,000). The short one is also measured with every new piece
//! encoded by the `tokenizers` crate instead of the byte-level BPE fast path (`_tokenizers_crate`).
//! The short one is also decided among 256 and 1,024 workers of the model, an eighth of which
//! hold the system prompt in the exact index (applied as KV events); and among 16 and 1,024
//! workers whose caches are full (`_full_index`: every worker holds 4,096 blocks, two of 64
//! shared 8k-token prefixes and conversations of its own, `common/population.rs`), as a busy
//! fleet's index is.
//!
//! Each case is measured twice: `decision_8k_chat` in wall time and `decision_8k_chat_cpu` in
//! the deciding thread's CPU time, which is the latency on an idle core (on a shared machine
//! wall time also counts other jobs' time slices).
//!
//! `cargo bench --bench decision`
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test and bench code: a failed step should stop the run"
)]

use std::hint::black_box;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use criterion::measurement::Measurement;
use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use kvroute::fleet::WorkerId;
use kvroute::fleet::{BaseUrl, LoadGuard, Worker, WorkerRank, WorkerSpec};
use kvroute::index::Holdings;
use kvroute::kv_events::{BlockStored, EngineHash, EventBatch, KvEvent};
use kvroute::openai::{Endpoint, RequestView};
use kvroute::policy::{KvAware, KvAwareConfig};
use kvroute::routing::{Decider, request_seed};
use kvroute::tokens::ModelTokens;
use kvroute::tokens::model::DEFAULT_CACHE_UNITS;
use serde_json::json;

#[path = "common/population.rs"]
mod population;
#[path = "common/prose.rs"]
mod prose;
#[path = "common/thread_cpu.rs"]
mod thread_cpu;

fn view(system: &str, question: &str) -> RequestView {
    let body = json!({"model": "qwen3", "messages": [
        {"role": "system", "content": system},
        {"role": "user", "content": question},
    ]});
    RequestView::parse(Endpoint::ChatCompletions, &body).expect("valid request")
}

/// The live decision for `v`: tokenize, analyse (hash, look up), choose and admit, through the
/// same core the server calls.
fn decide(model: &ModelTokens, decider: &Decider, workers: &[WorkerRank], v: &RequestView) -> u32 {
    let ids = model.prompt_ids(v).expect("tokenizes");
    let seed = request_seed("qwen3", None, None);
    let analysis = decider.analyse(&ids, seed, model.block_size(), Duration::from_secs(1));
    let Some(choice) = decider.choose(&analysis, workers, &mut Vec::new()) else {
        return u32::MAX;
    };
    let admitted = decider.admit(&analysis, &choice, Duration::from_secs(1));
    admitted.worker().0
}

/// `n` workers with events (nothing is predicted on admission) and uneven load: worker `w`
/// holds `w % 7` decoding requests and one request with `(w % 16) × 700` tokens still to
/// prefill.
fn fleet(n: u32) -> (Vec<WorkerRank>, Vec<LoadGuard>) {
    let mut guards = Vec::new();
    let workers: Vec<Arc<Worker>> = (0..n)
        .map(|w| {
            let spec = WorkerSpec {
                id: format!("w{w}"),
                url: BaseUrl::parse("http://127.0.0.1:1").expect("valid url"),
                models: vec!["qwen3".into()],
                kv_events: None,
                kv_replay: None,
                kv_blocks: None,
                data_parallel_size: 1,
                role: kvroute::fleet::Role::Both,
                bootstrap_port: None,
            };
            let worker = Arc::new(Worker::new(spec, WorkerId(w)));
            worker.set_event_feed(true);
            for _ in 0..w % 7 {
                let mut g = worker.rank(0).load.admit(1000, 0);
                g.first_token();
                guards.push(g);
            }
            let w16 = u64::from(w % 16);
            guards.push(worker.rank(0).load.admit(w16 * 3000, w16 * 700));
            worker
        })
        .collect();
    (WorkerRank::all(&workers), guards)
}

fn wall(c: &mut Criterion) {
    benches(c, "decision_8k_chat");
}

fn cpu(c: &mut Criterion<thread_cpu::ThreadCpu>) {
    benches(c, "decision_8k_chat_cpu");
}

fn benches<M: Measurement>(c: &mut Criterion<M>, group: &str) {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tokenizers/qwen3");
    let model = ModelTokens::from_hf_dir(&dir, 16, DEFAULT_CACHE_UNITS).expect("qwen3 loads");
    assert!(
        model.fast_path(),
        "qwen3 takes the byte-level BPE fast path"
    );
    // The same decision with every new piece encoded by the `tokenizers` crate (before the
    // fast path), measured alternately with the one above.
    let slow = ModelTokens::from_hf_dir(&dir, 16, DEFAULT_CACHE_UNITS)
        .expect("qwen3 loads")
        .without_fast_path();
    let (workers, _guards) = fleet(16);
    let mut g = c.benchmark_group(group);
    g.sample_size(20)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(4));
    for (name, model, system_words, question_words) in [
        (
            "seen_system_prompt_new_500_token_question",
            &model,
            5_600,
            380,
        ),
        (
            "seen_system_prompt_new_500_token_question_tokenizers_crate",
            &slow,
            5_600,
            380,
        ),
        (
            "seen_system_prompt_new_2000_token_question",
            &model,
            4_500,
            1_500,
        ),
    ] {
        let system = prose::words(system_words, 1);
        // Seen before: the system prompt's piece is cached, and worker 3 holds its blocks.
        let first = view(&system, "warm-up question");
        let ids = model.prompt_ids(&first).expect("tokenizes");
        eprintln!("{name}: {} tokens in the warm-up request", ids.len());
        let holdings = Arc::new(Holdings::default());
        let decider = Decider::new(
            Arc::new(KvAware::new(KvAwareConfig::default(), 1)),
            Arc::clone(&holdings),
        );
        let hashes = model.block_hashes(&ids, request_seed("qwen3", None, None));
        holdings
            .approx
            .record_routed(WorkerId(3), &hashes, Duration::ZERO);
        let n = AtomicU64::new(10);
        g.bench_function(name, |b| {
            b.iter_batched(
                || {
                    view(
                        &system,
                        &prose::words(question_words, n.fetch_add(1, Ordering::Relaxed)),
                    )
                },
                |v| black_box(decide(model, &decider, &workers, &v)),
                BatchSize::SmallInput,
            )
        });
    }
    for (n, full) in [(256u32, false), (1024, false), (16, true), (1024, true)] {
        let (workers, _guards) = fleet(n);
        let (system_words, question_words) = (5_600, 380);
        let system = prose::words(system_words, 1);
        let first = view(&system, "warm-up question");
        let ids = model.prompt_ids(&first).expect("tokenizes");
        let holdings = Arc::new(Holdings::default());
        let decider = Decider::new(
            Arc::new(KvAware::new(KvAwareConfig::default(), 1)),
            Arc::clone(&holdings),
        );
        if full {
            let pairs = population::Population::default().fill(&holdings.exact, n, "qwen3");
            eprintln!("{n} workers, full index: {pairs} pairs");
        }
        // An eighth of the fleet holds the system prompt's blocks, as its engines announced.
        let whole = ids.len() / 16 * 16;
        let seeds = kvroute::index::seeds_for("qwen3");
        for w in (3..n).step_by(8) {
            let batch = EventBatch {
                ts: 0.0,
                events: vec![KvEvent::Stored(BlockStored {
                    block_hashes: (0..(whole / 16) as u64)
                        .map(|i| EngineHash(u64::from(w) << 32 | 1 << 31 | i))
                        .collect(),
                    token_ids: ids[..whole].to_vec(),
                    block_size: 16,
                    ..BlockStored::default()
                })],
                dp_rank: None,
            };
            holdings.exact.apply(WorkerId(w), &batch, &seeds);
        }
        let n_q = AtomicU64::new(10);
        let suffix = if full { "_full_index" } else { "" };
        g.bench_function(
            format!("seen_system_prompt_new_500_token_question_{n}_workers{suffix}"),
            |b| {
                b.iter_batched(
                    || {
                        view(
                            &system,
                            &prose::words(question_words, n_q.fetch_add(1, Ordering::Relaxed)),
                        )
                    },
                    |v| black_box(decide(&model, &decider, &workers, &v)),
                    BatchSize::SmallInput,
                )
            },
        );
    }
    g.finish();
}

criterion_group!(decision, wall);
criterion_group! {
    name = decision_cpu;
    config = Criterion::default().with_measurement(thread_cpu::ThreadCpu);
    targets = cpu
}
criterion_main!(decision, decision_cpu);
