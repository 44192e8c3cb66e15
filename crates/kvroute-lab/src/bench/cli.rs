//! `kvroute bench`: replay a workload against an OpenAI endpoint and write the evidence;
//! `kvroute bench compare`: put several results side by side.
//!
//! This file only wires arguments to the library (trace → transforms → plan → replay →
//! report); every step is usable on its own by `sim` and by tests.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail};
use clap::{Args, Subcommand};

use super::models::first_model;
use super::plan::{RequestShape, plan};
use super::replay::{ReplayConfig, completions_url, replay};
use crate::report::plot::{load_chart, records_load, ttft_cdf_chart};
use crate::report::{ClientOverhead, RunResult, SloArgs, Summary, compare};
use crate::workload::{Naming, Trace, WorkloadArgs};

/// `kvroute bench …`: either a run (the flags below) or a subcommand.
#[derive(Args, Debug, Clone)]
#[command(args_conflicts_with_subcommands = true)]
pub struct BenchCli {
    /// A subcommand instead of a run.
    #[command(subcommand)]
    pub command: Option<BenchCommand>,
    /// The run's flags.
    #[command(flatten)]
    pub run: BenchArgs,
}

/// Subcommands of `kvroute bench`.
#[derive(Subcommand, Debug, Clone)]
pub enum BenchCommand {
    /// Print a side-by-side Markdown table of several result files.
    Compare(CompareArgs),
}

/// `kvroute bench compare A.json B.json …`.
#[derive(Args, Debug, Clone)]
pub struct CompareArgs {
    /// Result files written by `kvroute bench --out`.
    #[arg(required = true, num_args = 1..)]
    pub results: Vec<PathBuf>,
    /// Also draw the runs' TTFT CDFs on one chart (SVG).
    #[arg(long, value_name = "FILE.svg")]
    pub plot: Option<PathBuf>,
}

/// Flags of a bench run: the shared workload and SLO groups plus what only a real-time client
/// needs (where to send, how to shape and pace requests, where to write the evidence).
#[derive(Args, Debug, Clone)]
pub struct BenchArgs {
    /// Base URL of the OpenAI endpoint (`http://host:port`, `/v1/completions` is added) or the
    /// full completions URL. Required for a run.
    #[arg(long, value_name = "URL")]
    pub target: Option<String>,
    /// The workload.
    #[command(flatten)]
    pub workload: WorkloadArgs,
    /// Old spelling of `--trace-speedup` (bench only: `simulate --speedup` is the engine's),
    /// kept so existing command lines still mean what they meant.
    #[arg(long, value_name = "X", hide = true, conflicts_with = "trace_speedup")]
    pub speedup: Option<f64>,
    /// The `model` field sent with every request (default: the first model the target lists
    /// at `/v1/models`).
    #[arg(long)]
    pub model: Option<String>,
    /// Fraction of failed requests above which the run exits with an error (after writing its
    /// evidence), so a script does not take a run of 404s for a measurement.
    #[arg(long, default_value_t = 0.5, value_name = "FRACTION")]
    pub max_error_fraction: f64,
    /// Send text prompts (one word per token) instead of token ids.
    #[arg(long)]
    pub text_prompt: bool,
    /// Do not ask for `stream_options.include_usage` (most clients do not): output tokens are
    /// then counted from each stream's events, by this client and by any router between.
    #[arg(long)]
    pub no_usage: bool,
    /// Do not send `ignore_eos` / `min_tokens` (for servers that reject them).
    #[arg(long)]
    pub no_force_output_length: bool,
    /// Service targets.
    #[command(flatten)]
    pub slo: SloArgs,
    /// Write the JSON result here; a Markdown summary and SVG plots are written beside it.
    #[arg(long, value_name = "FILE.json")]
    pub out: Option<PathBuf>,
    /// Name of the run in comparisons (default: the output file's stem).
    #[arg(long)]
    pub name: Option<String>,
    /// Most requests in flight; a due request waits for a slot and is counted late.
    #[arg(long, default_value_t = 1024)]
    pub concurrency_limit: usize,
    /// Seconds allowed per request.
    #[arg(long, default_value_t = 600.0)]
    pub timeout: f64,
    /// Seed of the synthetic workload and of prompt content.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Never draw a progress bar.
    #[arg(long)]
    pub no_progress: bool,
}

impl BenchArgs {
    /// The workload flags with the old `--speedup` folded into `--trace-speedup`.
    pub fn workload_args(&self) -> WorkloadArgs {
        WorkloadArgs {
            trace_speedup: self.workload.trace_speedup.or(self.speedup),
            ..self.workload.clone()
        }
    }

    /// The workload these flags describe, after every transform, applied in this order:
    /// window, first N, speed-up, input cap.
    pub fn workload(&self) -> anyhow::Result<(Trace, String)> {
        self.workload_args().load(self.seed, Naming::Full)
    }
}

/// Runs `kvroute bench …`.
pub async fn run(cli: BenchCli) -> anyhow::Result<()> {
    match cli.command {
        Some(BenchCommand::Compare(args)) => run_compare(args),
        None => run_bench(cli.run).await,
    }
}

fn run_compare(args: CompareArgs) -> anyhow::Result<()> {
    let results = args
        .results
        .iter()
        .map(|p| RunResult::read_json(p))
        .collect::<Result<Vec<_>, _>>()?;
    println!("{}", compare(&results));
    if let Some(path) = args.plot {
        let runs: Vec<(String, Vec<f64>)> = results.iter().map(ttft_samples).collect();
        ttft_cdf_chart(&path, &runs)?;
        eprintln!("wrote {}", path.display());
    }
    Ok(())
}

fn ttft_samples(r: &RunResult) -> (String, Vec<f64>) {
    let s = r
        .records
        .iter()
        .filter(|x| x.outcome.is_ok())
        .filter_map(|x| x.ttft_s)
        .collect();
    (r.name.clone(), s)
}

async fn run_bench(args: BenchArgs) -> anyhow::Result<()> {
    let target = args
        .target
        .clone()
        .context("a run needs --target URL (or use `kvroute bench compare`)")?;
    let url = completions_url(&target)?;
    if !(args.timeout.is_finite() && args.timeout > 0.0) {
        bail!("--timeout must be a positive number of seconds");
    }
    if !(0.0..=1.0).contains(&args.max_error_fraction) {
        bail!("--max-error-fraction must be between 0 and 1");
    }
    let (trace, workload) = args.workload()?;
    if trace.is_empty() {
        bail!("the workload has no request (check --window and --max-requests)");
    }
    let model = match &args.model {
        Some(m) => m.clone(),
        None => {
            let m = first_model(&url, Duration::from_secs(10)).await?;
            eprintln!("kvroute bench: no --model given; sending `{m}` (the target's first model)");
            m
        }
    };
    let synth = args.workload.prompt_synth(args.seed);
    let shape = RequestShape {
        model,
        force_output_length: !args.no_force_output_length,
        text_prompt: args.text_prompt,
        no_usage: args.no_usage,
    };
    eprintln!(
        "kvroute bench: {} requests over {:.1} s ({} prompt tokens) → {url}",
        trace.len(),
        trace.duration_s(),
        trace.total_input_tokens()
    );
    let planned = tokio::task::spawn_blocking(move || plan(&trace, &synth, &shape)).await?;
    let config = ReplayConfig {
        url,
        concurrency_limit: args.concurrency_limit.max(1),
        request_timeout: Duration::from_secs_f64(args.timeout),
        progress: !args.no_progress,
    };
    let run = replay(planned, config).await?;
    let summary = Summary::from_records(&run.records, args.slo.slo(), run.wall_s);
    let name = args.name.clone().unwrap_or_else(|| {
        args.out
            .as_deref()
            .and_then(Path::file_stem)
            .map_or_else(|| "run".to_string(), |s| s.to_string_lossy().into_owned())
    });
    let result = RunResult {
        name,
        target,
        workload,
        client: ClientOverhead {
            cpu_s: run.client_cpu_s,
            cpu_per_request_us: run
                .client_cpu_s
                .filter(|_| !run.records.is_empty())
                .map(|s| s * 1e6 / run.records.len() as f64),
            late_sends: run.late_sends,
            waited_for_slot: run.waited_for_slot,
            max_send_delay_s: run.max_send_delay_s,
        },
        summary,
        records: run.records,
    };
    let markdown = result.to_markdown();
    println!("{markdown}");
    if let Some(out) = &args.out {
        write_outputs(out, &result, &markdown)?;
    }
    check_errors(&result.summary, args.max_error_fraction)
}

/// Fails the run when more than `max_fraction` of its requests failed, naming the commonest
/// failure, so a misconfigured run (wrong model, wrong URL) does not exit 0.
fn check_errors(summary: &Summary, max_fraction: f64) -> anyhow::Result<()> {
    if summary.requests == 0 {
        return Ok(());
    }
    let fraction = summary.errors as f64 / summary.requests as f64;
    if fraction <= max_fraction {
        return Ok(());
    }
    let commonest = summary
        .errors_by_kind
        .iter()
        .max_by_key(|(_, n)| **n)
        .map_or_else(String::new, |(kind, n)| format!(" (most: {n} × {kind})"));
    bail!(
        "{} of {} requests failed{commonest}, more than --max-error-fraction {max_fraction}",
        summary.errors,
        summary.requests
    )
}

/// Writes `out` (JSON), the Markdown beside it and the two charts.
fn write_outputs(out: &Path, result: &RunResult, markdown: &str) -> anyhow::Result<()> {
    result.write_json(out)?;
    let md = out.with_extension("md");
    std::fs::write(&md, markdown).with_context(|| format!("cannot write {}", md.display()))?;
    let stem = out.with_extension("");
    let cdf = PathBuf::from(format!("{}-ttft-cdf.svg", stem.display()));
    ttft_cdf_chart(&cdf, &[ttft_samples(result)])?;
    let load = PathBuf::from(format!("{}-load.svg", stem.display()));
    let step = (result.summary.duration_s / 200.0).max(0.01);
    load_chart(&load, &records_load(&result.records, step))?;
    eprintln!(
        "wrote {}, {}, {}, {}",
        out.display(),
        md.display(),
        cdf.display(),
        load.display()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::SyntheticChoice;
    use clap::{Parser, Subcommand};

    /// The shape `src/main.rs` wires it into.
    #[derive(Parser)]
    struct Cli {
        #[command(subcommand)]
        command: Command,
    }

    #[derive(Subcommand)]
    enum Command {
        Bench(BenchCli),
    }

    fn parse(args: &[&str]) -> Result<BenchCli, clap::Error> {
        Cli::try_parse_from(args).map(|c| match c.command {
            Command::Bench(b) => b,
        })
    }

    #[test]
    fn run_flags_and_compare_subcommand_parse() {
        let b = parse(&[
            "kvroute",
            "bench",
            "--target",
            "http://h:1",
            "--synthetic",
            "multi-turn",
            "--turns",
            "3",
            "--window",
            "10:20",
            "--speedup",
            "2",
            "--slo-ttft",
            "0.5",
        ])
        .unwrap();
        assert!(b.command.is_none());
        assert_eq!(b.run.workload.synthetic, Some(SyntheticChoice::MultiTurn));
        assert_eq!(b.run.workload.window, Some((10.0, 20.0)));
        assert_eq!(b.run.workload.vocab, (1000, 30000));
        let (trace, label) = b.run.workload().unwrap();
        assert!(label.contains("window 10:20"), "{label}");
        assert!(trace.requests.iter().all(|r| r.arrival_s < 5.0 + 1e-9));

        let c = parse(&["kvroute", "bench", "compare", "a.json", "b.json"]).unwrap();
        match c.command {
            Some(BenchCommand::Compare(args)) => assert_eq!(args.results.len(), 2),
            None => panic!("compare not parsed"),
        }
        assert!(parse(&["kvroute", "bench", "compare"]).is_err());
        assert!(parse(&["kvroute", "bench", "--vocab", "9:3"]).is_err());
    }

    #[test]
    fn old_spellings_still_mean_what_they_meant() {
        let run = |extra: &[&str]| {
            let mut a = vec!["kvroute", "bench", "--synthetic", "unique"];
            a.extend_from_slice(extra);
            parse(&a).unwrap().run
        };
        // `bench --speedup` always scaled the trace's arrivals.
        let old = run(&["--speedup", "2", "--trace-block-tokens", "64"]);
        let new = run(&["--trace-speedup", "2", "--trace-block-size", "64"]);
        assert_eq!(old.workload_args(), new.workload_args());
        assert_eq!(old.workload_args().trace_speedup, Some(2.0));
        assert_eq!(old.workload_args().trace_block_size, 64);
        assert_eq!(old.workload().unwrap(), new.workload().unwrap());
        assert!(parse(&["kvroute", "bench", "--speedup", "2", "--trace-speedup", "2"]).is_err());
    }
}
