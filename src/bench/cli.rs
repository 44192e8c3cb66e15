//! `kvroute bench`: replay a workload against an OpenAI endpoint and write the evidence;
//! `kvroute bench compare`: put several results side by side.
//!
//! This file only wires arguments to the library (trace → transforms → plan → replay →
//! report); every step is usable on its own by `sim` and by tests.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail};
use clap::{Args, Subcommand};

use super::plan::{RequestShape, plan};
use super::replay::{ReplayConfig, completions_url, replay};
use crate::report::plot::{load_chart, records_load, ttft_cdf_chart};
use crate::report::{ClientOverhead, RunResult, Slo, Summary, compare};
use crate::workload::SyntheticChoice;
use crate::workload::synthesis::PromptSynth;
use crate::workload::synthetic::{SyntheticKind, SyntheticSpec};
use crate::workload::trace::{MOONCAKE_BLOCK_TOKENS, Trace, Transforms};

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

/// Flags of a bench run.
#[derive(Args, Debug, Clone)]
pub struct BenchArgs {
    /// Base URL of the OpenAI endpoint (`http://host:port`, `/v1/completions` is added) or the
    /// full completions URL. Required for a run.
    #[arg(long, value_name = "URL")]
    pub target: Option<String>,
    /// A Mooncake JSONL trace (timestamp ms, input_length, output_length, hash_ids).
    #[arg(long, value_name = "FILE", conflicts_with = "synthetic")]
    pub trace: Option<PathBuf>,
    /// Tokens per block id of the trace file (Mooncake: 512).
    #[arg(long, default_value_t = 512, value_name = "N")]
    pub trace_block_tokens: u32,
    /// A synthetic workload instead of a trace.
    #[arg(long, value_enum, value_name = "KIND")]
    pub synthetic: Option<SyntheticChoice>,
    /// Synthetic: number of requests.
    #[arg(long, default_value_t = 200)]
    pub requests: usize,
    /// Synthetic: mean arrival rate, requests per second (Poisson).
    #[arg(long, default_value_t = 10.0)]
    pub rate: f64,
    /// Synthetic: mean unique prompt tokens per request (±50 %).
    #[arg(long, default_value_t = 256)]
    pub input_tokens: u32,
    /// Synthetic: mean output tokens per request (±50 %).
    #[arg(long, default_value_t = 64)]
    pub output_tokens: u32,
    /// Synthetic: tokens per block id (sharing granularity).
    #[arg(long, default_value_t = 64)]
    pub block_tokens: u32,
    /// Synthetic shared-prefix: number of system prompts.
    #[arg(long, default_value_t = 8)]
    pub prefixes: usize,
    /// Synthetic shared-prefix / hot-prefix: shared prefix length in tokens.
    #[arg(long, default_value_t = 1024)]
    pub prefix_tokens: u32,
    /// Synthetic shared-prefix: zipf exponent of prompt popularity.
    #[arg(long, default_value_t = 1.1)]
    pub zipf: f64,
    /// Synthetic multi-turn: turns per conversation.
    #[arg(long, default_value_t = 4)]
    pub turns: u32,
    /// Synthetic multi-turn: mean seconds between turns.
    #[arg(long, default_value_t = 2.0)]
    pub think_time: f64,
    /// Synthetic hot-prefix: fraction of requests carrying the hot prefix.
    #[arg(long, default_value_t = 0.9)]
    pub hot_fraction: f64,
    /// Replay only arrivals in START:END seconds of the trace (re-based to 0).
    #[arg(long, value_name = "START:END", value_parser = parse_window)]
    pub window: Option<(f64, f64)>,
    /// Divide inter-arrival times by X (2 = twice the rate).
    #[arg(long, value_name = "X")]
    pub speedup: Option<f64>,
    /// Cap prompts at N tokens, keeping their exact prefix.
    #[arg(long, value_name = "N")]
    pub max_input_tokens: Option<u32>,
    /// Replay only the first N requests (after the window).
    #[arg(long, value_name = "N")]
    pub max_requests: Option<usize>,
    /// The `model` field sent with every request.
    #[arg(long, default_value = "default")]
    pub model: String,
    /// Token ids used for synthesized prompts, START:END (end exclusive).
    #[arg(long, value_name = "START:END", default_value = "1000:30000", value_parser = parse_vocab)]
    pub vocab: (u32, u32),
    /// Send text prompts (one word per token) instead of token ids.
    #[arg(long)]
    pub text_prompt: bool,
    /// Do not send `ignore_eos` / `min_tokens` (for servers that reject them).
    #[arg(long)]
    pub no_force_output_length: bool,
    /// TTFT target in seconds, for attainment and goodput.
    #[arg(long, value_name = "SECONDS")]
    pub slo_ttft: Option<f64>,
    /// End-to-end latency target in seconds.
    #[arg(long, value_name = "SECONDS")]
    pub slo_e2e: Option<f64>,
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

fn parse_pair<T: std::str::FromStr>(s: &str) -> Result<(T, T), String> {
    let (a, b) = s
        .split_once(':')
        .ok_or_else(|| format!("`{s}` is not START:END"))?;
    let parse = |x: &str| {
        x.trim()
            .parse::<T>()
            .map_err(|_| format!("`{x}` in `{s}` is not a number"))
    };
    Ok((parse(a)?, parse(b)?))
}

fn parse_window(s: &str) -> Result<(f64, f64), String> {
    let (a, b) = parse_pair::<f64>(s)?;
    if a >= 0.0 && b > a {
        Ok((a, b))
    } else {
        Err(format!("window `{s}` needs 0 <= START < END"))
    }
}

fn parse_vocab(s: &str) -> Result<(u32, u32), String> {
    let (a, b) = parse_pair::<u32>(s)?;
    if b > a {
        Ok((a, b))
    } else {
        Err(format!("vocab range `{s}` needs START < END"))
    }
}

impl BenchArgs {
    /// The workload these flags describe, after every transform, applied in this order:
    /// window, first N, speed-up, input cap.
    pub fn workload(&self) -> anyhow::Result<(Trace, String)> {
        let (trace, mut label) = match (&self.trace, self.synthetic) {
            (Some(path), None) => {
                let mut trace = Trace::from_mooncake_file(path)?;
                if self.trace_block_tokens != MOONCAKE_BLOCK_TOKENS {
                    trace = trace.with_block_tokens(self.trace_block_tokens)?;
                }
                (trace, format!("trace {}", path.display()))
            }
            (None, Some(kind)) => {
                let spec = self.synthetic_spec(kind);
                (spec.generate()?, format!("synthetic {spec}"))
            }
            (Some(_), Some(_)) => bail!("give either --trace or --synthetic, not both"),
            (None, None) => bail!("give a workload: --trace FILE or --synthetic KIND"),
        };
        let trace = Transforms {
            window: self.window,
            max_requests: self.max_requests,
            speed_up: self.speedup,
            max_input_tokens: self.max_input_tokens,
        }
        .apply(trace, &mut label)?;
        Ok((trace, label))
    }

    /// The synthetic spec of these flags for `kind`.
    pub fn synthetic_spec(&self, kind: SyntheticChoice) -> SyntheticSpec {
        let kind = match kind {
            SyntheticChoice::SharedPrefix => SyntheticKind::SharedPrefix {
                prefixes: self.prefixes,
                prefix_tokens: self.prefix_tokens,
                zipf_s: self.zipf,
            },
            SyntheticChoice::MultiTurn => SyntheticKind::MultiTurn {
                turns: self.turns,
                think_s: self.think_time,
            },
            SyntheticChoice::Unique => SyntheticKind::Unique,
            SyntheticChoice::HotPrefix => SyntheticKind::HotPrefix {
                prefix_tokens: self.prefix_tokens,
                hot_fraction: self.hot_fraction,
            },
        };
        SyntheticSpec {
            kind,
            requests: self.requests,
            rate: self.rate,
            input_tokens: self.input_tokens,
            output_tokens: self.output_tokens,
            block_tokens: self.block_tokens,
            seed: self.seed,
        }
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
    let (trace, workload) = args.workload()?;
    if trace.is_empty() {
        bail!("the workload has no request (check --window and --max-requests)");
    }
    let synth = PromptSynth::new(args.vocab.0, args.vocab.1, args.seed);
    let shape = RequestShape {
        model: args.model.clone(),
        force_output_length: !args.no_force_output_length,
        text_prompt: args.text_prompt,
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
    let slo = Slo {
        ttft_s: args.slo_ttft,
        e2e_s: args.slo_e2e,
    };
    let summary = Summary::from_records(&run.records, slo, run.wall_s);
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
    Ok(())
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
        assert_eq!(b.run.synthetic, Some(SyntheticChoice::MultiTurn));
        assert_eq!(b.run.window, Some((10.0, 20.0)));
        assert_eq!(b.run.vocab, (1000, 30000));
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
}
