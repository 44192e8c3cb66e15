//! `kvroute simulate --prefill-workers P --decode-workers D`: a disaggregated fleet against an
//! aggregated fleet of the same size, same policy, same trace.
//!
//! Disaggregation trades two things. It wins inter-token latency: a decode worker never runs
//! a prefill chunk in its steps, while an aggregated worker's decode step also pays the
//! prefill of every prompt it admits (the step-time model charges a mixed step the sum). It
//! can lose TTFT: only P workers prefill (their queues are longer than N workers' would be)
//! and the prompt's KV must then cross the link before the first token. Which dominates
//! depends on prompt length, output length, load and the split, so each run reports both
//! fleets side by side: TTFT, inter-token latency (every gap between two tokens a client sees,
//! and each request's mean), E2E and SLO attainment.

use std::path::Path;
use std::time::Instant;

use anyhow::Context;
use serde::{Deserialize, Serialize};

use crate::report::Stats;
use crate::workload::trace::Trace;
use kvroute_router::policy::PolicyKind;

use super::args::SimulateArgs;
use super::config::{PdSplit, SimConfig};
use super::simulation::{PolicyRun, Simulation};

/// The service targets a comparison judges by; a missing one is always met.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PdSlo {
    /// Time to first token, seconds.
    pub ttft_s: Option<f64>,
    /// A request's mean inter-token latency, seconds.
    pub itl_s: Option<f64>,
    /// End to end, seconds.
    pub e2e_s: Option<f64>,
}

/// One fleet's results.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct FleetResult {
    /// `aggregated N` or `disaggregated PP/DD`.
    pub fleet: String,
    /// The policy.
    pub policy: String,
    /// Prefill workers (0: aggregated).
    pub prefill_workers: u32,
    /// Decode workers (0: aggregated).
    pub decode_workers: u32,
    /// Workers in all.
    pub workers: u32,
    /// Time to first token (the client's: the decode worker's first token), seconds.
    pub ttft_s: Stats,
    /// Every gap between two consecutive tokens a client received, seconds.
    pub itl_s: Stats,
    /// Each request's mean gap (time per output token), seconds.
    pub itl_per_request_s: Stats,
    /// End to end, seconds.
    pub e2e_s: Stats,
    /// Fraction of all requests that succeeded within every target.
    pub slo_attainment: f64,
    /// Fraction within the TTFT target alone.
    pub ttft_attainment: f64,
    /// Fraction within the ITL target alone.
    pub itl_attainment: f64,
    /// Prompt tokens found in the prefix cache of the worker that prefilled them, over prompt
    /// tokens (successful requests).
    pub prefix_hit_rate: f64,
    /// Disaggregated: mean seconds from the prefill's end to the KV's arrival (the decode
    /// side's wait for blocks plus the transfer).
    pub handoff_mean_s: Option<f64>,
    /// Prompt tokens whose KV crossed the link.
    pub transferred_tokens: u64,
    /// Preemptions over all engines.
    pub preemptions: u64,
    /// Requests.
    pub requests: usize,
    /// Requests that failed.
    pub errors: usize,
    /// Time of the last request's end, seconds.
    pub makespan_s: f64,
}

impl FleetResult {
    /// The results of `run` (a fleet of `split`, or aggregated for `None`) judged by `slo`.
    pub fn from_run(run: &PolicyRun, split: Option<PdSplit>, slo: PdSlo) -> FleetResult {
        let ok: Vec<_> = run.records.iter().filter(|r| r.error.is_none()).collect();
        let within = |x: Option<f64>, target: Option<f64>| match (x, target) {
            (_, None) | (None, Some(_)) => true,
            (Some(x), Some(t)) => x <= t,
        };
        let n = run.records.len().max(1) as f64;
        let count =
            |f: &dyn Fn(&super::SimRecord) -> bool| ok.iter().filter(|r| f(r)).count() as f64 / n;
        let (cached, prompt) = ok.iter().fold((0u64, 0u64), |(c, p), r| {
            (
                c + u64::from(r.cached_tokens),
                p + u64::from(r.prompt_tokens),
            )
        });
        let handoffs: Vec<f64> = ok
            .iter()
            .filter_map(|r| Some(r.kv_ready? - r.prefill_end?))
            .collect();
        let (p, d) = split.map_or((0, 0), |s| (s.prefill, s.decode));
        FleetResult {
            fleet: match split {
                Some(s) => format!("disaggregated {}P/{}D", s.prefill, s.decode),
                None => format!("aggregated {}", run.workers),
            },
            policy: run.policy.clone(),
            prefill_workers: p,
            decode_workers: d,
            workers: run.workers,
            ttft_s: Stats::of(ok.iter().filter_map(|r| r.ttft())),
            itl_s: Stats::of(run.itl_gaps.iter().copied()),
            itl_per_request_s: Stats::of(ok.iter().filter_map(|r| r.itl())),
            e2e_s: Stats::of(ok.iter().filter_map(|r| r.e2e())),
            slo_attainment: count(&|r| {
                within(r.ttft(), slo.ttft_s)
                    && within(r.itl(), slo.itl_s)
                    && within(r.e2e(), slo.e2e_s)
            }),
            ttft_attainment: count(&|r| within(r.ttft(), slo.ttft_s)),
            itl_attainment: count(&|r| within(r.itl(), slo.itl_s)),
            prefix_hit_rate: if prompt > 0 {
                cached as f64 / prompt as f64
            } else {
                0.0
            },
            handoff_mean_s: (!handoffs.is_empty())
                .then(|| handoffs.iter().sum::<f64>() / handoffs.len() as f64),
            transferred_tokens: run.counters.transferred_tokens,
            preemptions: run.counters.preemptions,
            requests: run.records.len(),
            errors: run.records.len() - ok.len(),
            makespan_s: run.records.iter().filter_map(|r| r.end).fold(0.0, f64::max),
        }
    }
}

/// Simulates `policy` on `trace` over the aggregated fleet of `base` (its `pd` ignored:
/// `split.workers()` whole workers) and over the disaggregated fleet `split`, in that order;
/// both at once on two threads when `parallel`.
pub fn compare(
    trace: &Trace,
    base: &SimConfig,
    split: PdSplit,
    policy: PolicyKind,
    slo: PdSlo,
    parallel: bool,
) -> anyhow::Result<Vec<FleetResult>> {
    let aggregated = SimConfig {
        workers: split.workers(),
        pd: None,
        ..base.clone()
    };
    let disaggregated = SimConfig {
        workers: split.workers(),
        pd: Some(split),
        ..base.clone()
    };
    let one = |config: &SimConfig| -> anyhow::Result<FleetResult> {
        let started = Instant::now();
        let run = Simulation::new(trace, config, policy)?.run();
        let result = FleetResult::from_run(&run, config.pd, slo);
        eprintln!(
            "  {} ({policy}): {} requests in {:.2} s",
            result.fleet,
            run.records.len(),
            started.elapsed().as_secs_f64()
        );
        Ok(result)
    };
    if !parallel {
        return [&aggregated, &disaggregated].into_iter().map(one).collect();
    }
    std::thread::scope(|s| {
        let handles = [&aggregated, &disaggregated].map(|c| s.spawn(move || one(c)));
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("a simulation thread panicked")))
            })
            .collect()
    })
}

/// The Markdown table of a comparison; latencies in milliseconds except E2E (seconds).
pub fn table(results: &[FleetResult]) -> String {
    let mut out = String::from(
        "| fleet | policy | TTFT mean | p50 | p90 | p99 | ITL mean | p90 | p99 | per-request ITL p90 | E2E mean (s) | p90 (s) | SLO | TTFT ok | ITL ok | prefix hits | handoff mean | errors |\n\
         |---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    let ms = |s: f64| format!("{:.1}", s * 1e3);
    for r in results {
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {:.2} | {:.2} | {:.1} % | {:.1} % | {:.1} % | {:.1} % | {} | {} |\n",
            r.fleet,
            r.policy,
            ms(r.ttft_s.mean),
            ms(r.ttft_s.p50),
            ms(r.ttft_s.p90),
            ms(r.ttft_s.p99),
            ms(r.itl_s.mean),
            ms(r.itl_s.p90),
            ms(r.itl_s.p99),
            ms(r.itl_per_request_s.p90),
            r.e2e_s.mean,
            r.e2e_s.p90,
            r.slo_attainment * 100.0,
            r.ttft_attainment * 100.0,
            r.itl_attainment * 100.0,
            r.prefix_hit_rate * 100.0,
            r.handoff_mean_s.map_or("–".to_string(), ms),
            r.errors,
        ));
    }
    out
}

/// Runs `kvroute simulate --prefill-workers P --decode-workers D …`: for each policy (default
/// kv_aware), the aggregated and the disaggregated fleet; prints the table and, with `--out`,
/// writes `pd.json` and `summary.md` there.
pub fn run(args: &SimulateArgs) -> anyhow::Result<()> {
    let Some(split) = args.pd_split() else {
        anyhow::bail!("give --prefill-workers and --decode-workers");
    };
    let (trace, label) = args.workload()?;
    if trace.is_empty() {
        anyhow::bail!("the workload has no request (check --window and --max-requests)");
    }
    let config = args.sim_config()?;
    let policies = match &args.policies {
        Some(_) => args.policy_kinds()?,
        None => vec![PolicyKind::KvAware],
    };
    let slo = PdSlo {
        ttft_s: args.slo.slo_ttft,
        itl_s: args.slo_itl,
        e2e_s: args.slo.slo_e2e,
    };
    let t = config.engine.transfer;
    let header = format!(
        "# kvroute simulate: {label}, aggregated {} vs disaggregated {}P/{}D\n\n\
         - requests: {}, over {:.1} s, {} prompt tokens\n\
         - engine: block {} tokens, {} blocks, {} batched tokens, {} seqs, speedup {}\n\
         - KV link: {} bytes per token, {:.3e} bytes/s, {} ms latency\n\
         - SLO: TTFT {}, ITL {}, E2E {}; seed {}\n",
        split.workers(),
        split.prefill,
        split.decode,
        trace.len(),
        trace.duration_s(),
        trace.total_input_tokens(),
        config.engine.block_size,
        config.engine.num_blocks,
        config.engine.max_num_batched_tokens,
        config.engine.max_num_seqs,
        config.engine.timing.speedup,
        t.bytes_per_token(),
        t.bandwidth_bytes_per_s(),
        t.latency_s() * 1e3,
        target(slo.ttft_s),
        target(slo.itl_s),
        target(slo.e2e_s),
        args.seed,
    );
    let mut results = Vec::new();
    for policy in policies {
        results.extend(compare(&trace, &config, split, policy, slo, args.jobs > 1)?);
    }
    let text = format!("{header}\n{}", table(&results));
    println!("{text}");
    if let Some(dir) = &args.out {
        write(dir, &text, &results)?;
        eprintln!("wrote {}", dir.display());
    }
    Ok(())
}

fn target(seconds: Option<f64>) -> String {
    seconds.map_or_else(|| "none".to_owned(), |s| format!("{s} s"))
}

fn write(dir: &Path, text: &str, results: &[FleetResult]) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let json = serde_json::to_string_pretty(results).context("cannot encode the results")?;
    let path = dir.join("pd.json");
    std::fs::write(&path, json).with_context(|| format!("cannot write {}", path.display()))?;
    let path = dir.join("summary.md");
    std::fs::write(&path, text).with_context(|| format!("cannot write {}", path.display()))
}
