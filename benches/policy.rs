//! Routing decision time per policy with 16 candidate workers.
//!
//! Run: `cargo bench --bench policy`
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test and bench code: a failed step should stop the run"
)]

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use kvroute::fleet::{LoadSnapshot, WorkerId};
use kvroute::policy::{Candidate, PolicyKind, RouteRequest, seeded};

fn candidates(n: usize) -> Vec<Candidate> {
    (0..n)
        .map(|i| Candidate {
            id: format!("worker-{i}").into(),
            worker: WorkerId(i as u32),
            load: LoadSnapshot {
                in_flight: (i * 7 % 13) as u64,
                queued_prefill_tokens: (i * 1000 % 7000) as u64,
                decoding: (i % 5) as u64,
                active_prompt_tokens: (i * 3000 % 20000) as u64,
                admitted: (i * 11 % 17) as u64,
                unseen_in_flight: 0,
            },
            overlap_blocks: (i * 37 % 400) as u32,
            lower_blocks: Default::default(),
            cache: Default::default(),
            session_home: false,
        })
        .collect()
}

fn bench(c: &mut Criterion) {
    let cands = candidates(16);
    let req = RouteRequest {
        prompt_tokens: 8000,
        blocks: 500,
        block_size: 16,
        kv_bytes_per_token: 0,
        warm_prefix_rate: 0.0,
    };
    let mut group = c.benchmark_group("decision_16_workers");
    for kind in PolicyKind::ALL {
        let policy = seeded(kind, 1);
        group.bench_function(kind.name(), |b| {
            b.iter(|| black_box(policy.choose(black_box(&req), black_box(&cands))))
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
