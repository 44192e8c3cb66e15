//! Routing decision time per policy with 16 candidate workers, and `kv_aware`'s once its
//! calibration has evidence from every worker (16 and 1,024 workers): the decision, and one
//! observation (a first token) fed to the calibration.
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
use kvroute::policy::{Candidate, Observation, PolicyKind, RouteRequest, seeded};

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

/// An 8,000-token prompt of 16-token blocks.
fn request() -> RouteRequest {
    RouteRequest {
        prompt_tokens: 8000,
        blocks: 500,
        block_size: 16,
        kv_bytes_per_token: 0,
        warm_prefix_rate: 0.0,
    }
}

fn bench(c: &mut Criterion) {
    let cands = candidates(16);
    let req = request();
    let mut group = c.benchmark_group("decision_16_workers");
    for kind in PolicyKind::ALL {
        let policy = seeded(kind, 1);
        group.bench_function(kind.name(), |b| {
            b.iter(|| black_box(policy.choose(black_box(&req), black_box(&cands))))
        });
    }
    group.finish();
}

/// A first token on `worker`: `uncached` tokens computed, some queued ahead, a TTFT off the
/// prediction by a few per cent either way.
fn observation(worker: usize, i: usize) -> Observation {
    let uncached = 500 + (i * 7919 % 8000) as u64;
    let queued = if i.is_multiple_of(3) {
        0
    } else {
        (i * 31 % 4000) as u64
    };
    Observation {
        worker: WorkerId(worker as u32),
        uncached_tokens: uncached,
        queued_tokens: queued,
        decoding: (i % 7) as u64,
        prefilling: u64::from(queued > 0),
        unseen_in_flight: 0,
        ttft_s: (uncached + queued) as f64 * 5e-5 * (0.9 + (i % 5) as f64 * 0.05) + 0.02,
        loaded_tokens: [0, 0],
        kv_bytes_per_token: 0,
        room_wait_s: 0.0,
    }
}

fn calibrated(c: &mut Criterion) {
    let req = request();
    let mut group = c.benchmark_group("kv_aware_calibrated");
    for workers in [16, 1024] {
        let cands = candidates(workers);
        let policy = seeded(PolicyKind::KvAware, 1);
        for i in 0..20 * workers {
            policy.observe(&observation(i % workers, i));
        }
        group.bench_function(format!("choose_{workers}_workers"), |b| {
            b.iter(|| black_box(policy.choose(black_box(&req), black_box(&cands))))
        });
        let mut i = 0;
        group.bench_function(format!("observe_{workers}_workers"), |b| {
            b.iter(|| {
                i += 1;
                policy.observe(black_box(&observation(i % workers, i)));
            })
        });
    }
    group.finish();
}

criterion_group!(benches, bench, calibrated);
criterion_main!(benches);
