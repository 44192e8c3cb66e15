//! The unqueued reference: a policy's placement without its queues.
//!
//! A policy's TTFT under pressure mixes two things it decides together: *where* it puts each
//! prompt, which decides what every worker's KV cache holds and evicts, and *when* each prompt
//! runs, behind whatever is queued on the worker chosen. The pooled-fleet reference
//! ([`super::simulation::pooled_fleet`]) measures what partitioning the cache costs; this one
//! splits a policy's own distance to it. It replays the policy's run in arrival order: each
//! request on the worker the policy chose, over that worker's own cache (the engines' size,
//! eviction order and host tier), but alone on an idle engine, as the pooled-cache reference
//! runs it ([`super::pooled::IdleCaches`]). What the policy's row adds to this one is queueing
//! and batching; what this row adds to the pooled cache is the placement's misses.
//!
//! Measured on the agentic trace (docs/benchmarks.md, "Placement and queueing, apart"): a
//! placement that balances sessions' working sets for the cache queues them behind each
//! other's long prefills, and one that avoids the queues scatters the sessions; this row shows
//! which of the two a policy's tail is.
//!
//! Fleets that change during the run (a restart empties a cache at a time the replay does not
//! model) and disaggregated fleets (a request's prefill and decode on two workers) have no
//! such row.

use crate::workload::trace::Trace;

use super::config::SimConfig;
use super::oracle::{Lookup, reference_run};
use super::pooled::{self, IdleCaches};
use super::results::Results;
use super::simulation::PolicyRun;
use crate::engine::kv_cache::KvCache;

/// The row name of `policy`'s unqueued replay.
pub fn name(policy: &str) -> String {
    format!("{policy}_unqueued")
}

/// `run`'s placement replayed on idle engines over per-worker caches (`config`'s engines);
/// `None` for a fleet that changes during the run or is disaggregated.
pub fn unqueued(trace: &Trace, config: &SimConfig, run: &PolicyRun) -> Option<PolicyRun> {
    if !config.changes.is_empty() || config.pd.is_some() {
        return None;
    }
    let engine = &config.engine;
    let caches = (0..config.max_workers().max(1))
        .map(|slot| {
            let blocks = config.slot_blocks(slot);
            KvCache::with_tier(blocks, engine.block_size.max(1), config.slot_tier(slot))
        })
        .collect();
    let mut caches = IdleCaches::new(engine, caches);
    let worker_of = |i: usize| {
        run.records
            .get(i)
            .and_then(|r| r.worker)
            .map(|w| w as usize)
            .filter(|&w| w < caches.len())
    };
    let slots: Vec<Option<usize>> = (0..trace.requests.len()).map(worker_of).collect();
    let mut replay = reference_run(&name(&run.policy), trace, config, |i, prompt, output| {
        match slots[i] {
            Some(slot) => caches.serve(slot, i, prompt, output),
            // The policy did not place it (no worker was eligible): it caches nothing, as a
            // request that never reached an engine, and fails below as it failed there.
            None => Lookup {
                queried_blocks: 0,
                hit_blocks: 0,
                cached_tokens: 0,
                load_s: 0.0,
            },
        }
    });
    for ((rec, slot), placed) in replay.records.iter_mut().zip(&slots).zip(&run.records) {
        rec.worker = slot.map(|s| s as u32);
        // A request the policy's run failed fails here too, so both rows' statistics are
        // over the same requests.
        if placed.error.is_some() && rec.error.is_none() {
            rec.error.clone_from(&placed.error);
            rec.first_token = None;
            rec.end = Some(rec.arrival);
        }
    }
    replay.counters.evictions = caches.evictions();
    Some(replay)
}

/// Where each policy's mean TTFT goes, as a Markdown table, when `results` has its unqueued
/// row: the oracle's (no cache limit, no queueing), plus capacity (the pooled cache less the
/// oracle), plus its placement's misses (its unqueued replay less the pooled cache), plus
/// queueing (the policy less its replay). Means add up, so the four parts sum to the policy's
/// mean (over successful requests); `None` without an unqueued row.
pub fn breakdown(results: &Results) -> Option<String> {
    let oracle = results.get(super::oracle::NAME)?.ttft_s.mean;
    let pooled = results.get(pooled::NAME)?.ttft_s.mean;
    let mut out = String::from(
        "| policy | TTFT mean (ms) | oracle | + capacity | + placement | + queueing |\n|---|---:|---:|---:|---:|---:|\n",
    );
    let mut any = false;
    for policy in results.policies.keys() {
        let (Some(run), Some(replay)) = (results.get(policy), results.get(&name(policy))) else {
            continue;
        };
        let (mean, unqueued) = (run.ttft_s.mean, replay.ttft_s.mean);
        let ms = |s: f64| s * 1e3;
        out.push_str(&format!(
            "| {policy} | {:.1} | {:.1} | {:+.1} | {:+.1} | {:+.1} |\n",
            ms(mean),
            ms(oracle),
            ms(pooled - oracle),
            ms(unqueued - pooled),
            ms(mean - unqueued),
        ));
        any = true;
    }
    any.then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::config::FleetChange;
    use crate::sim::pooled::pooled_cache;
    use crate::sim::record::SimRecord;
    use crate::sim::reference_tests::{config, req};

    /// A run that placed request `i` on `workers[i]`.
    fn placed(workers: &[u32]) -> PolicyRun {
        PolicyRun {
            policy: "p".to_string(),
            records: workers
                .iter()
                .map(|&w| SimRecord {
                    worker: Some(w),
                    ..SimRecord::default()
                })
                .collect(),
            ..PolicyRun::default()
        }
    }

    #[test]
    fn a_prefix_hits_only_on_the_worker_that_computed_it() {
        let trace = Trace::new(vec![
            req(0.0, &[1, 2], 128, 1),
            req(1.0, &[1, 2, 3], 192, 1),
        ]);
        let c = config(2, 64);
        let same = unqueued(&trace, &c, &placed(&[0, 0])).unwrap();
        let apart = unqueued(&trace, &c, &placed(&[0, 1])).unwrap();
        assert_eq!(same.policy, "p_unqueued");
        assert_eq!(same.records[1].cached_tokens, 128);
        assert_eq!(apart.records[1].cached_tokens, 0);
        assert_eq!(apart.records[1].worker, Some(1));
        // No queueing: the second request's TTFT is its own prefill, whatever ran before.
        let pooled = pooled_cache(&trace, &c);
        assert_eq!(same.records[1].ttft(), pooled.records[1].ttft());
    }

    #[test]
    fn each_worker_evicts_from_its_own_cache() {
        // Workers of 8 blocks: A (2 prompt + 1 output block), then B (7 + 1) on the same
        // worker evicts A, on another worker does not.
        let trace = Trace::new(vec![
            req(0.0, &[1, 2], 128, 64),
            req(1.0, &[7, 8, 9, 10, 11, 12, 13], 448, 64),
            req(2.0, &[1, 2, 3], 192, 1),
        ]);
        let c = config(2, 8);
        let crowded = unqueued(&trace, &c, &placed(&[0, 0, 0])).unwrap();
        let spread = unqueued(&trace, &c, &placed(&[0, 1, 0])).unwrap();
        assert_eq!(crowded.records[2].cached_tokens, 0);
        assert_eq!(crowded.counters.evictions, 7);
        assert_eq!(spread.records[2].cached_tokens, 128);
        assert_eq!(spread.counters.evictions, 0);
        // The pooled cache holds both on its 16 blocks: the partition is what evicts.
        assert_eq!(pooled_cache(&trace, &c).records[2].cached_tokens, 128);
    }

    #[test]
    fn an_unplaced_request_fails_as_it_did_and_caches_nothing() {
        let trace = Trace::new(vec![
            req(0.0, &[1, 2], 128, 1),
            req(1.0, &[1, 2, 3], 192, 1),
        ]);
        let mut run = placed(&[0, 0]);
        run.records[0].worker = None;
        run.records[0].error = Some("no worker is eligible".to_string());
        let r = unqueued(&trace, &config(1, 64), &run).unwrap();
        assert_eq!(r.records[0].worker, None);
        assert_eq!(r.records[0].error, run.records[0].error);
        assert_eq!(r.records[0].ttft(), None);
        assert_eq!(r.records[1].cached_tokens, 0);
    }

    #[test]
    fn fleets_that_change_have_no_row() {
        let trace = Trace::new(vec![req(0.0, &[1], 64, 1)]);
        let mut c = config(2, 8);
        c.changes.push(FleetChange::Restart { worker: 0, at: 1.0 });
        assert!(unqueued(&trace, &c, &placed(&[0])).is_none());
    }

    #[test]
    fn the_flag_adds_a_row_per_policy() {
        let args = crate::sim::args::tests::parse(&[
            "--synthetic",
            "multi-turn",
            "--requests",
            "40",
            "--workers",
            "2",
            "--policies",
            "kv_aware,round_robin",
            "--unqueued",
        ]);
        let (trace, _) = args.workload().unwrap();
        let rows = crate::sim::cli::run_one(&args, &trace, "", None)
            .unwrap()
            .results
            .policies;
        for name in ["kv_aware_unqueued", "round_robin_unqueued", "pooled_cache"] {
            assert!(rows.contains_key(name), "{name} missing: {:?}", rows.keys());
        }
        let without =
            crate::sim::args::tests::parse(&["--synthetic", "multi-turn", "--requests", "40"]);
        let rows = crate::sim::cli::run_one(&without, &trace, "", None)
            .unwrap()
            .results
            .policies;
        assert!(!rows.keys().any(|k| k.ends_with("_unqueued")));
    }

    #[test]
    fn the_breakdown_adds_up_to_each_policys_mean() {
        let args = crate::sim::args::tests::parse(&[
            "--synthetic",
            "multi-turn",
            "--requests",
            "60",
            "--rate",
            "40",
            "--policies",
            "kv_aware,round_robin",
            "--unqueued",
        ]);
        let (trace, _) = args.workload().unwrap();
        let results = crate::sim::cli::run_one(&args, &trace, "", None)
            .unwrap()
            .results;
        let table = breakdown(&results).unwrap();
        let rows: Vec<&str> = table.lines().skip(2).collect();
        assert_eq!(rows.len(), 2, "{table}");
        let mean_ms = |row: &str| results.get(row).unwrap().ttft_s.mean * 1e3;
        for row in rows {
            let policy = row.split('|').nth(1).unwrap().trim();
            let cells: Vec<f64> = row
                .split('|')
                .skip(2)
                .filter_map(|c| c.trim().parse().ok())
                .collect();
            let [mean, oracle, capacity, placement, queueing] = cells[..] else {
                panic!("{row}");
            };
            let close = |a: f64, b: f64| (a - b).abs() < 0.06;
            assert!(close(mean, mean_ms(policy)), "{row}");
            assert!(close(oracle, mean_ms("oracle")), "{row}");
            assert!(
                close(capacity, mean_ms("pooled_cache") - mean_ms("oracle")),
                "{row}"
            );
            let replay = mean_ms(&name(policy));
            assert!(close(placement, replay - mean_ms("pooled_cache")), "{row}");
            assert!(close(queueing, mean_ms(policy) - replay), "{row}");
            assert!(queueing > 0.0, "{row}");
        }
        // Without the replay there is nothing to split.
        let plain =
            crate::sim::args::tests::parse(&["--synthetic", "multi-turn", "--requests", "20"]);
        let results = crate::sim::cli::run_one(&plain, &trace, "", None)
            .unwrap()
            .results;
        assert!(breakdown(&results).is_none());
    }
}
