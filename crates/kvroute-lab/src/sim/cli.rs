//! `kvroute simulate`: wiring flags and scenarios to the simulator and the output files.
//!
//! This is the only file of `sim` that reads files, measures host time or prints; the
//! simulation itself is pure.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::bail;

use crate::workload::trace::Trace;

use super::args::SimulateArgs;
use super::capacity::{Capacity, ProbeRequest, study};
use super::config::SimConfig;
use super::oracle::oracle;
use super::output::{summary_table, write_all, write_capacity, write_records};
use super::pooled::pooled_cache;
use super::results::{PolicyResult, Results};
use super::scenario::Scenario;
use super::simulation::pooled_fleet::pooled_fleet;
use super::simulation::{PolicyRun, Simulation};
use super::unqueued::{breakdown, unqueued};
use kvroute_router::policy::PolicyKind;

/// Everything one `kvroute simulate` invocation produced.
#[derive(Debug)]
pub struct Outcome {
    /// The results.
    pub results: Results,
    /// Host seconds per policy (and the oracle).
    pub wall_s: Vec<(String, f64)>,
}

/// Runs `kvroute simulate …`.
pub fn run(args: SimulateArgs) -> anyhow::Result<()> {
    if args.capacity.capacity {
        return run_capacity(&args).map(|_| ());
    }
    if args.pd_split().is_some() {
        return super::pd_compare::run(&args);
    }
    let Some(name) = args.scenario.clone() else {
        let (trace, label) = args.workload()?;
        let header = format!(
            "# kvroute simulate: {label}\n\n{}\n",
            describe(&args, &trace)
        );
        run_one(&args, &trace, &header, args.out.as_deref())?;
        return Ok(());
    };
    let scenarios = if name == "all" {
        Scenario::suite()?
    } else {
        vec![Scenario::load(&name)?]
    };
    let many = scenarios.len() > 1;
    for s in scenarios {
        let mut a = s.args.clone();
        if args.policies.is_some() {
            a.policies.clone_from(&args.policies);
        }
        a.jobs = args.jobs;
        a.records = args.records;
        a.pooled_fleet = args.pooled_fleet;
        a.unqueued = args.unqueued;
        // Policy settings given on the command line apply to every scenario.
        if args.kv_aware_prefill_rate.is_some() {
            a.kv_aware_prefill_rate = args.kv_aware_prefill_rate;
        }
        if args.kv_aware_decode_weight.is_some() {
            a.kv_aware_decode_weight = args.kv_aware_decode_weight;
        }
        if args.kv_aware_temperature.is_some() {
            a.kv_aware_temperature = args.kv_aware_temperature;
        }
        if args.kv_aware_eviction_weight.is_some() {
            a.kv_aware_eviction_weight = args.kv_aware_eviction_weight;
        }
        if args.kv_aware_copy_weight.is_some() {
            a.kv_aware_copy_weight = args.kv_aware_copy_weight;
        }
        if args.kv_aware_saturation_weight.is_some() {
            a.kv_aware_saturation_weight = args.kv_aware_saturation_weight;
        }
        if args.kv_aware_long_prefill_token_threshold.is_some() {
            a.kv_aware_long_prefill_token_threshold = args.kv_aware_long_prefill_token_threshold;
        }
        a.kv_aware_no_calibrate |= args.kv_aware_no_calibrate;
        let out: Option<PathBuf> = match &args.out {
            Some(dir) if many => Some(dir.join(&s.name)),
            other => other.clone(),
        };
        let (trace, label) = a.workload()?;
        eprintln!("scenario {}: {label}", s.name);
        let header = format!(
            "# Scenario `{}`\n\n{}\n\n- command: `{}`\n- workload: {label}\n{}\n",
            s.name,
            s.description,
            s.command(),
            describe(&a, &trace)
        );
        run_one(&a, &trace, &header, out.as_deref())?;
    }
    Ok(())
}

fn describe(a: &SimulateArgs, trace: &Trace) -> String {
    format!(
        "- requests: {}, over {:.1} s, {} prompt tokens\n- workers: {}{}{}, index: {}{}, event delay {} s\n{}- engine: block {} tokens, {} blocks, {} batched tokens, {} seqs, speedup {}\n- SLO: TTFT {}, E2E {}; seed {}\n",
        trace.len(),
        trace.duration_s(),
        trace.total_input_tokens(),
        a.workers,
        listed(" (joins at ", &a.join_at, |t| format!("{t} s")),
        listed(" (restarts ", &a.restart_at, |(w, t)| format!(
            "worker {w} at {t} s"
        )),
        a.index.flag(),
        index_notes(a),
        a.event_delay,
        replicas(a),
        a.core.block_size,
        a.core.num_blocks,
        a.core.max_num_batched_tokens,
        a.core.max_num_seqs,
        a.core.engine_speedup,
        target(a.slo.slo_ttft),
        target(a.slo.slo_e2e),
        a.seed,
    )
}

/// `cache_aware`'s own index and the approximate index's memory, when the flags set them.
fn index_notes(a: &SimulateArgs) -> String {
    let own = a
        .cache_aware_index
        .map(|i| format!(" (cache_aware: {})", i.flag()))
        .unwrap_or_default();
    let ttl = a
        .approx_ttl
        .map(|s| format!(", approximate index remembers {s} s"))
        .unwrap_or_default();
    own + &ttl
}

/// The router replicas line, for runs with more than one or with engine load readings.
fn replicas(a: &SimulateArgs) -> String {
    let sample = a.load_sample_ms.filter(|&ms| ms != 0.0);
    if a.routers == 1 && sample.is_none() && a.replica_sync_ms.is_none() {
        return String::new();
    }
    format!(
        "- router replicas: {} (arrivals dealt round-robin), engine load read {}, bookings shared {}\n",
        a.routers,
        sample.map_or_else(|| "never".to_owned(), |ms| format!("every {ms} ms")),
        a.replica_sync_ms
            .map_or_else(|| "never".to_owned(), |ms| format!("after {ms} ms")),
    )
}

/// ` (label a, b)` for a non-empty list, nothing for an empty one.
fn listed<T: Copy>(label: &str, items: &[T], show: impl Fn(T) -> String) -> String {
    if items.is_empty() {
        return String::new();
    }
    let shown: Vec<String> = items.iter().map(|&i| show(i)).collect();
    format!("{label}{})", shown.join(", "))
}

/// An SLO target as a person reads it.
fn target(seconds: Option<f64>) -> String {
    seconds.map_or_else(|| "none".to_owned(), |s| format!("{s} s"))
}

/// Simulates every policy of `args`, the pooled-cache reference and the oracle on `trace`;
/// writes outputs into `out`.
pub fn run_one(
    args: &SimulateArgs,
    trace: &Trace,
    header: &str,
    out: Option<&Path>,
) -> anyhow::Result<Outcome> {
    if trace.is_empty() {
        bail!("the workload has no request (check --window and --max-requests)");
    }
    let config = args.sim_config()?;
    let names = args.policy_kinds()?;
    let timed = simulate_all(trace, &config, &names, args.jobs.max(1))?;
    let mut wall_s: Vec<(String, f64)> =
        timed.iter().map(|(r, t)| (r.policy.clone(), *t)).collect();
    let mut references = Vec::new();
    if args.pooled_fleet {
        let started = Instant::now();
        if let Some(run) = pooled_fleet(trace, &config)? {
            wall_s.push((run.policy.clone(), started.elapsed().as_secs_f64()));
            references.push(run);
        }
    }
    if args.unqueued {
        for (run, _) in &timed {
            let started = Instant::now();
            if let Some(replay) = unqueued(trace, &config, run) {
                wall_s.push((replay.policy.clone(), started.elapsed().as_secs_f64()));
                references.push(replay);
            }
        }
    }
    let started = Instant::now();
    let pooled = pooled_cache(trace, &config);
    wall_s.push((pooled.policy.clone(), started.elapsed().as_secs_f64()));
    references.push(pooled);
    let started = Instant::now();
    let o = oracle(trace, &config);
    wall_s.push((o.policy.clone(), started.elapsed().as_secs_f64()));
    let runs: Vec<PolicyRun> = timed.into_iter().map(|(r, _)| r).collect();
    let refs: Vec<&PolicyRun> = references.iter().collect();
    let results = Results::new(&runs, &refs, &o, config.slo);
    println!("{header}\n{}", summary_table(&results, &wall_s));
    if let Some(parts) = breakdown(&results) {
        println!("Where the mean TTFT goes:\n\n{parts}");
    }
    if let Some(dir) = out {
        let mut shown = refs.clone();
        shown.push(&o);
        write_all(dir, header, &results, &runs, &shown, &wall_s)?;
        if args.records {
            write_records(dir, &runs)?;
            write_records(dir, &references)?;
        }
        eprintln!("wrote {}", dir.display());
    }
    Ok(Outcome { results, wall_s })
}

/// Runs each policy (in `jobs` threads; each simulation is independent and deterministic, so
/// the results do not depend on `jobs`), returning runs in `names` order with host seconds.
pub fn simulate_all(
    trace: &Trace,
    config: &SimConfig,
    names: &[PolicyKind],
    jobs: usize,
) -> anyhow::Result<Vec<(PolicyRun, f64)>> {
    let one = |name: &PolicyKind| -> anyhow::Result<(PolicyRun, f64)> {
        let started = Instant::now();
        let run = Simulation::new(trace, config, *name)?.run();
        let secs = started.elapsed().as_secs_f64();
        eprintln!("  {name}: {} requests in {secs:.2} s", run.records.len());
        Ok((run, secs))
    };
    if jobs <= 1 {
        return names.iter().map(one).collect();
    }
    let mut out = Vec::with_capacity(names.len());
    for chunk in names.chunks(jobs) {
        let results: Vec<anyhow::Result<(PolicyRun, f64)>> = std::thread::scope(|s| {
            let handles: Vec<_> = chunk.iter().map(|n| s.spawn(move || one(n))).collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| Err(anyhow::anyhow!("a simulation thread panicked")))
                })
                .collect()
        });
        for r in results {
            out.push(r?);
        }
    }
    Ok(out)
}

/// Runs `kvroute simulate --capacity`: both capacity searches for every policy of `args`, each
/// probe one simulation through [`simulate_all`]; prints the table and, with `--out`, writes
/// the study's files.
pub fn run_capacity(args: &SimulateArgs) -> anyhow::Result<Capacity> {
    let spec = args.capacity.spec()?;
    let config = args.sim_config()?;
    if config.slo.ttft_s.is_none() && config.slo.e2e_s.is_none() {
        bail!("--capacity needs a target to attain: give --slo-ttft and/or --slo-e2e");
    }
    if !config.changes.is_empty() || config.pd.is_some() {
        bail!(
            "--capacity sizes a fixed aggregated fleet: no --join-at, --restart-at or --prefill-workers"
        );
    }
    let names = args.policy_kinds()?;
    let workload = args.capacity_workload()?;
    let (trace, label) = args.workload()?;
    if trace.is_empty() {
        bail!("the workload has no request (check --window and --max-requests)");
    }
    let header = format!(
        "# kvroute simulate --capacity: {label}\n\n{}- capacity: SLO attainment ≥ {} %; rate multiplier on {} workers to {} % (up to ×{}), workers at ×1 (up to {})\n",
        describe(args, &trace),
        spec.attainment * 100.0,
        config.workers,
        spec.precision * 100.0,
        spec.max_multiplier,
        spec.max_workers,
    );
    let probe = |p: ProbeRequest<'_>| -> anyhow::Result<f64> {
        let runs = simulate_all(p.trace, p.config, &[p.policy], 1)?;
        let (run, _) = runs
            .first()
            .ok_or_else(|| anyhow::anyhow!("no run for {}", p.policy))?;
        let attainment = PolicyResult::from_run(run, p.config.slo, None).slo_attainment;
        eprintln!(
            "    {} at ×{:.4} on {} workers: SLO attainment {:.2} %",
            p.policy,
            p.multiplier,
            p.config.workers,
            attainment * 100.0
        );
        Ok(attainment)
    };
    let capacity = study(&workload, &config, &names, &spec, args.jobs, probe)?;
    println!("{header}\n{}", capacity.table());
    if let Some(dir) = &args.out {
        write_capacity(dir, &header, &capacity)?;
        eprintln!("wrote {}", dir.display());
    }
    Ok(capacity)
}
