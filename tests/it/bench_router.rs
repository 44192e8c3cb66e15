//! `bench` through the real router: token-id prompts are routed, `x-kvroute-worker` is
//! recorded per request, and the per-worker counts add up.

use std::time::Duration;

use crate::support::*;
use kvroute::bench::plan::{RequestShape, plan};
use kvroute::bench::replay::{ReplayConfig, completions_url, replay};
use kvroute::report::{Slo, Summary};
use kvroute::workload::synthesis::PromptSynth;
use kvroute::workload::synthetic::{SyntheticKind, SyntheticSpec};

#[tokio::test]
async fn replay_through_router_records_workers() {
    let a = Backend::start("a", &["m"]).await;
    let b = Backend::start("b", &["m"]).await;
    let r = start_router_over(PolicyKind::RoundRobin, &[&a, &b], "").await;
    let trace = SyntheticSpec {
        kind: SyntheticKind::SharedPrefix {
            prefixes: 2,
            prefix_tokens: 128,
            zipf_s: 1.0,
        },
        requests: 10,
        rate: 100.0,
        input_tokens: 32,
        output_tokens: 3,
        block_tokens: 16,
        seed: 5,
    }
    .generate()
    .unwrap();
    let shape = RequestShape {
        model: "m".into(),
        force_output_length: true,
        text_prompt: false,
        no_usage: false,
    };
    let planned = plan(&trace, &PromptSynth::default(), &shape);
    let config = ReplayConfig {
        url: completions_url(&format!("http://{}", r.addr)).unwrap(),
        concurrency_limit: 16,
        request_timeout: Duration::from_secs(20),
        progress: false,
    };
    let run = replay(planned, config).await.unwrap();
    for rec in &run.records {
        assert!(rec.outcome.is_ok(), "{:?}", rec.error);
        assert!(rec.ttft_s.is_some());
    }
    let s = Summary::from_records(&run.records, Slo::default(), run.wall_s);
    assert_eq!(s.per_worker.get("w0"), Some(&5), "{:?}", s.per_worker);
    assert_eq!(s.per_worker.get("w1"), Some(&5), "{:?}", s.per_worker);
    assert_eq!(a.count() + b.count(), 10);
    // The backend saw token-id prompts of the planned length.
    let body: serde_json::Value = serde_json::from_slice(&a.received()[0].body).unwrap();
    assert!(body["prompt"].as_array().unwrap().len() >= 128);
    assert_eq!(body["stream"], true);
    r.shutdown().await;
}
