//! Disaggregated fleets in the simulator: every request goes prefill → KV transfer → decode,
//! each hand-off is counted, and the comparison with an aggregated fleet runs both.

use kvroute::policy::PolicyKind;
use kvroute::sim::pd_compare::{PdSlo, compare};
use kvroute::sim::{FleetChange, PdSplit, PolicyRun, SimConfig, Simulation};
use kvroute::workload::synthetic::{SyntheticKind, SyntheticSpec};

fn shared_prefix(requests: usize) -> kvroute::workload::Trace {
    SyntheticSpec {
        kind: SyntheticKind::SharedPrefix {
            prefixes: 8,
            prefix_tokens: 1024,
            zipf_s: 0.6,
        },
        requests,
        rate: 20.0,
        input_tokens: 200,
        output_tokens: 16,
        block_tokens: 64,
        seed: 5,
    }
    .generate()
    .unwrap()
}

fn disaggregated(prefill: u32, decode: u32) -> SimConfig {
    SimConfig {
        workers: prefill + decode,
        pd: Some(PdSplit { prefill, decode }),
        ..SimConfig::default()
    }
}

fn run(config: &SimConfig, policy: PolicyKind, requests: usize) -> PolicyRun {
    let trace = shared_prefix(requests);
    Simulation::new(&trace, config, policy).unwrap().run()
}

#[test]
fn every_request_is_prefilled_transferred_and_decoded() {
    let n = 240;
    let run = run(&disaggregated(2, 3), PolicyKind::KvAware, n);
    assert_eq!(run.records.len(), n);
    for (i, r) in run.records.iter().enumerate() {
        assert_eq!(r.error, None, "request {i}");
        let p = r.prefill_worker.expect("a prefill worker");
        let d = r.worker.expect("a decode worker");
        assert!(p < 2, "request {i} prefilled on {p}, not a prefill worker");
        assert!((2..5).contains(&d), "request {i} decoded on {d}");
        let (prefilled, ready) = (r.prefill_end.unwrap(), r.kv_ready.unwrap());
        let (first, end) = (r.first_token.unwrap(), r.end.unwrap());
        assert!(
            r.arrival <= prefilled && prefilled <= ready,
            "request {i}: {r:?}"
        );
        assert!(ready <= first && first <= end, "request {i}: {r:?}");
        assert!(r.transferred_tokens >= 1 && r.transferred_tokens <= r.prompt_tokens);
    }
    let c = run.counters;
    let n64 = n as u64;
    let outputs: u64 = run.records.iter().map(|r| u64::from(r.output_tokens)).sum();
    // One pull per request, and every held prefill released when its pull completed.
    assert_eq!((c.pulls, c.held_released, c.held_expired), (n64, n64, 0));
    let pulled: u64 = run
        .records
        .iter()
        .map(|r| u64::from(r.transferred_tokens))
        .sum();
    assert_eq!(c.transferred_tokens, pulled);
    // Each request finishes twice (its prefill, its decode); the prefill's one token is the
    // engine's, never the client's.
    assert_eq!(c.finished, 2 * n64);
    assert_eq!(c.generated_tokens, n64 + outputs);
    assert_eq!(run.itl_gaps.len() as u64, outputs - n64);
    assert!(run.itl_gaps.iter().all(|g| *g > 0.0));
}

#[test]
fn prefill_workers_are_chosen_kv_aware() {
    let hits = |policy| {
        let run = run(&disaggregated(3, 2), policy, 300);
        assert!(run.records.iter().all(|r| r.error.is_none()));
        let (cached, prompt) = run.records.iter().fold((0u64, 0u64), |(c, p), r| {
            (
                c + u64::from(r.cached_tokens),
                p + u64::from(r.prompt_tokens),
            )
        });
        cached as f64 / prompt as f64
    };
    let (kv, rr) = (hits(PolicyKind::KvAware), hits(PolicyKind::RoundRobin));
    assert!(
        kv > rr,
        "prefill-side prefix hits: kv_aware {kv}, round_robin {rr}"
    );
}

#[test]
fn the_comparison_runs_both_fleets_of_the_same_size() {
    let trace = shared_prefix(120);
    let split = PdSplit {
        prefill: 1,
        decode: 2,
    };
    let slo = PdSlo {
        ttft_s: Some(2.0),
        itl_s: Some(0.1),
        e2e_s: None,
    };
    for parallel in [false, true] {
        let r = compare(
            &trace,
            &SimConfig::default(),
            split,
            PolicyKind::KvAware,
            slo,
            parallel,
        )
        .unwrap();
        assert_eq!(r.len(), 2);
        assert_eq!(r[0].fleet, "aggregated 3");
        assert_eq!(r[1].fleet, "disaggregated 1P/2D");
        for f in &r {
            assert_eq!((f.workers, f.requests, f.errors), (3, 120, 0));
            assert_eq!(f.ttft_s.count, 120);
            assert!(f.slo_attainment <= f.ttft_attainment.min(f.itl_attainment));
        }
        assert_eq!(r[0].transferred_tokens, 0);
        assert!(r[1].transferred_tokens > 0);
        assert!(r[0].handoff_mean_s.is_none() && r[1].handoff_mean_s.is_some());
    }
}

#[test]
fn a_fleet_that_cannot_be_disaggregated_is_refused() {
    let trace = shared_prefix(4);
    let refused = |config: SimConfig| {
        Simulation::new(&trace, &config, PolicyKind::KvAware)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default()
    };
    assert!(refused(disaggregated(0, 2)).contains("at least 1"));
    assert!(
        refused(SimConfig {
            workers: 5,
            ..disaggregated(2, 2)
        })
        .contains("the fleet has 5")
    );
    assert!(
        refused(SimConfig {
            changes: vec![FleetChange::Join { at: 1.0 }],
            ..disaggregated(1, 1)
        })
        .contains("joins and restarts")
    );
}
