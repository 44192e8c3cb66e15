//! Workers that come and go (Kubernetes replaces pods by the thousand) must not grow the
//! router: 10,000 workers join, publish KV events, and leave through the one lifecycle owner,
//! and the index's memory, the fleet's worker numbers and the metric series return to where
//! they were.

use std::sync::Arc;
use std::time::Duration;

use kvroute::fleet::WorkerId;
use kvroute::fleet::{BaseUrl, BreakerConfig, WorkerSpec};
use kvroute::index::{ApproxConfig, ApproxIndex, Holdings, IndexConfig, KvIndex, seeds_for};
use kvroute::kv_events::{BlockStored, EngineHash, EventBatch, KvEvent};
use kvroute::lifecycle::Lifecycle;
use kvroute::metrics::Metrics;
use kvroute::policy;

const BLOCK: usize = 16;

fn spec(id: &str, events: bool) -> WorkerSpec {
    WorkerSpec {
        id: id.into(),
        // Each worker its own URL: the fleet refuses a URL listed twice.
        url: BaseUrl::parse(&format!("http://{id}:9")).unwrap(),
        models: vec!["m".into()],
        // A subscriber to a port nobody publishes on: the feed runs, and must stop cleanly.
        kv_events: events.then(|| "tcp://127.0.0.1:9".to_owned()),
        kv_replay: None,
        kv_blocks: Some(64),
        data_parallel_size: 1,
        role: kvroute::fleet::Role::Both,
        bootstrap_port: None,
    }
}

/// A worker's cache: a shared system prompt (held by every worker) and a prompt of its own.
fn stored(worker_seed: u32, engine_base: u64) -> EventBatch {
    let mut tokens: Vec<u32> = (0..4 * BLOCK as u32).collect();
    tokens.extend((0..4 * BLOCK as u32).map(|t| 100_000 + worker_seed * 1_000 + t));
    let blocks = tokens.len() / BLOCK;
    EventBatch {
        ts: 0.0,
        events: vec![KvEvent::Stored(BlockStored {
            block_hashes: (0..blocks as u64)
                .map(|i| EngineHash(engine_base + i))
                .collect(),
            token_ids: tokens,
            block_size: BLOCK as u32,
            ..BlockStored::default()
        })],
        dp_rank: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_workers_come_and_go_and_the_index_returns_to_its_baseline() {
    let holdings = Arc::new(Holdings::new(
        KvIndex::new(IndexConfig::default()),
        ApproxIndex::new(ApproxConfig::default()),
    ));
    let metrics = Metrics::new();
    let life = Lifecycle::new(
        (0..4)
            .map(|i| spec(&format!("static-{i}"), false))
            .collect(),
        BreakerConfig::default(),
        Arc::clone(&holdings),
        policy::seeded(policy::PolicyKind::KvAware, 1),
        metrics.clone(),
        &[],
    );
    life.start();
    for w in life.fleet().workers().iter() {
        holdings.exact.apply(
            w.rank(0).key,
            &stored(w.rank(0).key.0, 1 << 40),
            &seeds_for("m"),
        );
    }
    // One warm-up cycle sizes the tables a churning worker uses; memory after it is the
    // baseline every later cycle must come back to.
    let cycle = |n: u32| {
        let life = &life;
        let holdings = &holdings;
        let metrics = &metrics;
        async move {
            // One worker in 500 has a live event feed (each stop waits out a poll interval).
            let w = life
                .join(spec(&format!("pod-{n}"), n.is_multiple_of(500)))
                .expect("joins");
            holdings.exact.apply(
                w.rank(0).key,
                &stored(n % 3, u64::from(n) << 8),
                &seeds_for("m"),
            );
            holdings.approx.record_routed(
                w.rank(0).key,
                &kvroute::tokens::block_hashes(
                    kvroute::tokens::model::hash_seed("m", None, None),
                    &(0..64).collect::<Vec<u32>>(),
                    BLOCK,
                ),
                Duration::from_secs(1),
            );
            metrics.prefix_hit_blocks.with_label_values(&[w.id()]).inc();
            let key = w.rank(0).key;
            let gone = Arc::downgrade(&w);
            drop(w);
            life.leave(&format!("pod-{n}"), false)
                .await
                .expect("leaves");
            // A worker's id is reused once nothing refers to it; an event-fed worker's
            // capacity reservation runs on a blocking thread and holds it until done.
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            while gone.strong_count() > 0 && std::time::Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            key
        }
    };
    cycle(0).await;
    let baseline = holdings.exact.heap_bytes();
    let entries = holdings.exact.entries();
    let mut highest = WorkerId(0);
    for n in 1..=10_000 {
        highest = highest.max(cycle(n).await);
    }
    assert_eq!(holdings.exact.entries(), entries, "entries left behind");
    assert!(
        holdings.exact.heap_bytes() <= baseline,
        "index memory grew from {baseline} to {} bytes",
        holdings.exact.heap_bytes()
    );
    assert_eq!(highest, WorkerId(4), "a departed worker's number is reused");
    assert!(
        !metrics.render().contains("pod-"),
        "a departed worker's metric series are removed"
    );
    assert_eq!(life.fleet().workers().len(), 4);
}
