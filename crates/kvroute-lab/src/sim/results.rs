//! The numbers of a simulation: per policy latency statistics, hit rate, SLO attainment,
//! preemptions, errors and the ratio to the oracle; written as `results.json`.
//!
//! The file is exactly `{"policies": {NAME: {...}}}` in run order (oracle last). It holds only
//! what the virtual run determines, never wall-clock figures, so the same seed gives a
//! byte-identical file.

use serde::{Deserialize, Serialize};

use crate::report::{Slo, Stats};

use super::simulation::PolicyRun;

/// One policy's results.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PolicyResult {
    /// Time to first token of successful requests, seconds.
    pub ttft_s: Stats,
    /// End-to-end latency of successful requests, seconds.
    pub e2e_s: Stats,
    /// Prompt blocks the engines found cached over blocks they looked up (block-weighted).
    pub hit_rate: f64,
    /// Fraction of all requests that succeeded within the SLO targets.
    pub slo_attainment: f64,
    /// Preemptions across engines.
    pub preemptions: u64,
    /// Requests in the trace.
    pub requests: usize,
    /// Requests that failed (too long for an engine, worker restarted, no worker).
    pub errors: usize,
    /// Mean TTFT over the oracle's (1 = the limit).
    pub ttft_mean_vs_oracle: Option<f64>,
    /// p50 TTFT over the oracle's.
    pub ttft_p50_vs_oracle: Option<f64>,
    /// p90 TTFT over the oracle's.
    pub ttft_p90_vs_oracle: Option<f64>,
    /// Prompt blocks the router predicted cached on the chosen worker over blocks routed
    /// (policies that use prefixes only).
    pub predicted_hit_rate: Option<f64>,
    /// Prompt tokens prefilled (including recomputation after preemption).
    pub prefill_tokens: u64,
    /// Cached blocks the engines evicted.
    pub evictions: u64,
    /// Requests routed to each worker, by slot.
    pub per_worker_requests: Vec<usize>,
    /// Time of the last request's end, seconds.
    pub makespan_s: f64,
    /// How far the observed TTFT fell from the policy's prediction on the chosen worker:
    /// statistics of |observed − predicted|, seconds (policies that predict one).
    pub ttft_prediction_abs_error_s: Option<Stats>,
    /// Mean of observed − predicted TTFT, seconds: above 0, the policy was too optimistic.
    pub ttft_prediction_bias_s: Option<f64>,
}

/// Results of every policy of one run.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Results {
    /// By policy name, in run order.
    pub policies: serde_json::Map<String, serde_json::Value>,
}

fn ratio(a: f64, b: f64) -> Option<f64> {
    (b > 0.0).then(|| a / b)
}

impl PolicyResult {
    /// The results of `run` judged by `slo`, relative to `oracle` when given.
    pub fn from_run(run: &PolicyRun, slo: Slo, oracle: Option<&Stats>) -> PolicyResult {
        let ok = run.records.iter().filter(|r| r.error.is_none());
        let ttft_s = Stats::of(ok.clone().filter_map(|r| r.ttft()));
        let e2e_s = Stats::of(ok.filter_map(|r| r.e2e()));
        let errors = run.records.iter().filter(|r| r.error.is_some()).count();
        let met = run
            .records
            .iter()
            .filter(|r| r.meets(slo.ttft_s, slo.e2e_s))
            .count();
        let c = &run.counters;
        let (pred, blocks) = run.records.iter().fold((0u64, 0u64), |(p, b), r| {
            (p + u64::from(r.predicted_blocks), b + u64::from(r.blocks))
        });
        let mut per_worker_requests = vec![0; run.workers as usize];
        for w in run.records.iter().filter_map(|r| r.worker) {
            if let Some(n) = per_worker_requests.get_mut(w as usize) {
                *n += 1;
            }
        }
        let errors_s: Vec<f64> = run
            .records
            .iter()
            .filter_map(|r| r.prediction_error())
            .collect();
        let bias =
            (!errors_s.is_empty()).then(|| errors_s.iter().sum::<f64>() / errors_s.len() as f64);
        let abs_error = (!errors_s.is_empty()).then(|| Stats::of(errors_s.iter().map(|e| e.abs())));
        PolicyResult {
            ttft_prediction_abs_error_s: abs_error,
            ttft_prediction_bias_s: bias,
            ttft_s,
            e2e_s,
            hit_rate: ratio(c.hit_blocks as f64, c.queried_blocks as f64).unwrap_or(0.0),
            slo_attainment: ratio(met as f64, run.records.len() as f64).unwrap_or(0.0),
            preemptions: c.preemptions,
            requests: run.records.len(),
            errors,
            ttft_mean_vs_oracle: oracle.and_then(|o| ratio(ttft_s.mean, o.mean)),
            ttft_p50_vs_oracle: oracle.and_then(|o| ratio(ttft_s.p50, o.p50)),
            ttft_p90_vs_oracle: oracle.and_then(|o| ratio(ttft_s.p90, o.p90)),
            predicted_hit_rate: ratio(pred as f64, blocks as f64),
            prefill_tokens: c.prefill_tokens,
            evictions: c.evictions,
            per_worker_requests,
            makespan_s: run.records.iter().filter_map(|r| r.end).fold(0.0, f64::max),
        }
    }
}

impl Results {
    /// Results of `runs` (policies), `references` (reference runs other than the oracle, such
    /// as the pooled cache) and `oracle`, in that order.
    pub fn new(
        runs: &[PolicyRun],
        references: &[&PolicyRun],
        oracle: &PolicyRun,
        slo: Slo,
    ) -> Results {
        let o = PolicyResult::from_run(oracle, slo, None);
        let mut policies = serde_json::Map::new();
        for run in runs.iter().chain(references.iter().copied()) {
            let r = PolicyResult::from_run(run, slo, Some(&o.ttft_s));
            policies.insert(run.policy.clone(), to_value(&r));
        }
        let mut o = o;
        let stats = o.ttft_s;
        o.ttft_mean_vs_oracle = ratio(stats.mean, stats.mean);
        o.ttft_p50_vs_oracle = ratio(stats.p50, stats.p50);
        o.ttft_p90_vs_oracle = ratio(stats.p90, stats.p90);
        policies.insert(super::oracle::NAME.to_string(), to_value(&o));
        Results { policies }
    }

    /// One policy's result.
    pub fn get(&self, name: &str) -> Option<PolicyResult> {
        self.policies
            .get(name)
            .and_then(|v| serde_json::from_value(v.clone()).ok())
    }

    /// Pretty JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_else(|_| "{}".to_string())
    }
}

fn to_value(r: &PolicyResult) -> serde_json::Value {
    serde_json::to_value(r).unwrap_or(serde_json::Value::Null)
}
