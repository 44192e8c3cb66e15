//! The workload flags, one group flattened into both `kvroute bench` and `kvroute simulate`.
//!
//! A real-time run and a simulation of "the same workload" are only comparable if the same
//! flags build the same requests, so both subcommands parse them with this one struct: a flag
//! has one name and one meaning everywhere (`--trace-speedup` scales the trace's arrivals,
//! never an engine). Defaults are `kvroute bench`'s; `kvroute simulate` raises a few of them
//! (see `sim::args`). Older spellings stay accepted as hidden aliases.

use std::path::{Path, PathBuf};

use anyhow::bail;
use clap::{Args, ValueEnum};

use super::synthesis::PromptSynth;
use super::synthetic::{SyntheticKind, SyntheticSpec};
use super::trace::{MOONCAKE_BLOCK_TOKENS, Trace, Transforms};

/// Synthetic workloads selectable on the command line.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyntheticChoice {
    /// System prompts with zipf popularity plus unique questions.
    SharedPrefix,
    /// Conversations whose next turn extends the previous prompt.
    MultiTurn,
    /// Every prompt unique.
    Unique,
    /// One hot prefix at a high rate.
    HotPrefix,
    /// Groups sharing a prefix, each group at one instant.
    Siblings,
}

impl SyntheticChoice {
    /// The name as written on the command line (`shared-prefix`), for reports people read.
    pub fn flag(self) -> String {
        self.to_possible_value()
            .map_or_else(String::new, |v| v.get_name().to_owned())
    }
}

/// How a run names its workload in its reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Naming {
    /// The trace's full path and the whole synthetic spec: a bench result file must say
    /// exactly what was replayed, since it is compared with runs made elsewhere.
    Full,
    /// The trace's file name and the synthetic kind: a simulation's summary lists the
    /// engine and workload parameters beside it already.
    Short,
}

/// Workload flags: where requests come from (a trace or a synthetic generator), how the
/// synthetic generator is shaped, which transforms apply, and what prompt content is made of.
#[derive(Args, Debug, Clone, PartialEq)]
pub struct WorkloadArgs {
    /// A Mooncake JSONL trace (timestamp ms, input_length, output_length, hash_ids).
    #[arg(long, value_name = "FILE", conflicts_with = "synthetic")]
    pub trace: Option<PathBuf>,
    /// Tokens per block id of the trace file (Mooncake: 512). Lines that name their
    /// `block_size` (traces `kvroute serve --record-trace` writes) keep it unless a size other
    /// than 512 is given here.
    #[arg(
        long,
        default_value_t = MOONCAKE_BLOCK_TOKENS,
        value_name = "N",
        alias = "trace-block-tokens"
    )]
    pub trace_block_size: u32,
    /// A line-aligned JSONL sidecar naming each trace line's session (`session` or
    /// `session_id`), e.g. the agentic traces' `.meta.jsonl`; each request then names its
    /// session (bench: `prompt_cache_key`; simulate: the affinity hint the router reads).
    #[arg(long, value_name = "FILE", requires = "trace")]
    pub trace_sessions: Option<PathBuf>,
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
    /// Synthetic shared-prefix / hot-prefix / siblings: shared prefix length in tokens.
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
    /// Synthetic siblings: requests per group (a group shares a prefix and arrives at once).
    #[arg(long, default_value_t = 16, value_name = "N")]
    pub group_size: usize,
    /// Only arrivals in START:END seconds of the trace (re-based to 0).
    #[arg(long, value_name = "START:END", value_parser = parse_window)]
    pub window: Option<(f64, f64)>,
    /// Only the first N requests (after the window).
    #[arg(long, value_name = "N")]
    pub max_requests: Option<usize>,
    /// Divide the trace's inter-arrival times by X (2 = twice the rate).
    #[arg(long, value_name = "X", alias = "speedup-trace")]
    pub trace_speedup: Option<f64>,
    /// Cap prompts at N tokens, keeping their exact prefix.
    #[arg(long, value_name = "N")]
    pub max_input_tokens: Option<u32>,
    /// Delay every arrival by a seeded uniform time in [0, S) seconds (after the speed-up):
    /// spreads the bursts of a trace whose timestamps are coarse (the Mooncake conversation
    /// trace gives up to 28 requests one timestamp, every 3 s), which no real client sends
    /// at one instant.
    #[arg(long, value_name = "S")]
    pub arrival_jitter: Option<f64>,
    /// Token ids used for synthesized prompts, START:END (end exclusive).
    #[arg(long, value_name = "START:END", default_value = "1000:30000", value_parser = parse_vocab)]
    pub vocab: (u32, u32),
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

impl WorkloadArgs {
    /// True when neither a trace nor a synthetic workload is given (the subcommand says which
    /// other sources it accepts).
    pub fn is_empty(&self) -> bool {
        self.trace.is_none() && self.synthetic.is_none()
    }

    /// The workload these flags describe, with `seed` for the synthetic generator, after every
    /// transform (window, first N, speed-up, input cap), and a one-line description.
    pub fn load(&self, seed: u64, naming: Naming) -> anyhow::Result<(Trace, String)> {
        let (trace, mut label) = match (&self.trace, self.synthetic) {
            (Some(path), None) => (self.read_trace(path)?, trace_label(path, naming)),
            (None, Some(kind)) => {
                let spec = self.synthetic_spec(kind, seed);
                let label = match naming {
                    Naming::Full => format!("synthetic {spec}"),
                    Naming::Short => format!("synthetic {}", kind.flag()),
                };
                (spec.generate()?, label)
            }
            (Some(_), Some(_)) => bail!("give either --trace or --synthetic, not both"),
            (None, None) => bail!("give a workload: --trace FILE or --synthetic KIND"),
        };
        let trace = self.transforms(seed).apply(trace, &mut label)?;
        Ok((trace, label))
    }

    fn read_trace(&self, path: &Path) -> anyhow::Result<Trace> {
        let trace = match &self.trace_sessions {
            None => Trace::from_mooncake_file(path)?,
            Some(sidecar) => {
                let sessions = super::sessions::read_sidecar(sidecar)?;
                let file = std::fs::File::open(path)
                    .map_err(|e| anyhow::anyhow!("cannot read trace {}: {e}", path.display()))?;
                Trace::from_mooncake_with_sessions(std::io::BufReader::new(file), Some(&sessions))?
            }
        };
        if self.trace_block_size == MOONCAKE_BLOCK_TOKENS {
            return Ok(trace);
        }
        Ok(trace.with_block_tokens(self.trace_block_size)?)
    }

    /// The transforms these flags ask for; `seed` draws the arrival jitter.
    pub fn transforms(&self, seed: u64) -> Transforms {
        Transforms {
            window: self.window,
            max_requests: self.max_requests,
            speed_up: self.trace_speedup,
            max_input_tokens: self.max_input_tokens,
            jitter: self.arrival_jitter.map(|s| (s, seed)),
        }
    }

    /// The synthetic spec of these flags for `kind`, seeded with `seed`.
    pub fn synthetic_spec(&self, kind: SyntheticChoice, seed: u64) -> SyntheticSpec {
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
            SyntheticChoice::Siblings => SyntheticKind::Siblings {
                group: self.group_size,
                prefix_tokens: self.prefix_tokens,
            },
        };
        SyntheticSpec {
            kind,
            requests: self.requests,
            rate: self.rate,
            input_tokens: self.input_tokens,
            output_tokens: self.output_tokens,
            block_tokens: self.block_tokens,
            seed,
        }
    }

    /// The prompt content of these flags' vocabulary, seeded with `seed`.
    pub fn prompt_synth(&self, seed: u64) -> PromptSynth {
        PromptSynth::new(self.vocab.0, self.vocab.1, seed)
    }
}

fn trace_label(path: &Path, naming: Naming) -> String {
    match naming {
        Naming::Full => format!("trace {}", path.display()),
        Naming::Short => {
            let name = path.file_name().unwrap_or_default().to_string_lossy();
            format!("trace {name}")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        workload: WorkloadArgs,
    }

    fn parse(args: &[&str]) -> WorkloadArgs {
        Cli::try_parse_from(std::iter::once("x").chain(args.iter().copied()))
            .unwrap()
            .workload
    }

    #[test]
    fn old_spellings_parse_to_the_same_values() {
        assert_eq!(
            parse(&["--trace-block-tokens", "64"]),
            parse(&["--trace-block-size", "64"])
        );
        assert_eq!(
            parse(&["--speedup-trace", "3"]),
            parse(&["--trace-speedup", "3"])
        );
        assert_eq!(parse(&["--trace-speedup", "3"]).trace_speedup, Some(3.0));
    }

    #[test]
    fn labels_follow_the_naming() {
        let a = parse(&[
            "--synthetic",
            "unique",
            "--requests",
            "3",
            "--max-requests",
            "2",
        ]);
        let (trace, full) = a.load(0, Naming::Full).unwrap();
        assert_eq!(trace.len(), 2);
        assert!(
            full.starts_with("synthetic unique prompts, 3 requests"),
            "{full}"
        );
        assert!(full.ends_with(", first 2"), "{full}");
        let (_, short) = a.load(0, Naming::Short).unwrap();
        assert_eq!(short, "synthetic unique, first 2");
        let p = Path::new("/data/t.jsonl");
        assert_eq!(trace_label(p, Naming::Full), "trace /data/t.jsonl");
        assert_eq!(trace_label(p, Naming::Short), "trace t.jsonl");
    }
}
