//! `kvroute simulate` flags, and how they become a workload and a [`SimConfig`].
//!
//! The workload, engine and SLO flags are the groups `kvroute bench` and `kvroute engine`
//! flatten too, so each flag means the same everywhere: `--trace-speedup` scales the trace,
//! `--engine-speedup` (old spelling `--speedup`) the simulated GPU. Only the defaults differ:
//! simulate's are NVIDIA Dynamo's mocker defaults (64-token blocks, 16,384 blocks, 8,192
//! batched tokens, 256 sequences, its vLLM step-time fit) and larger synthetic workloads, so a
//! Mooncake run here can be read next to one of Dynamo's; [`simulate_defaults`] sets them.

use std::path::PathBuf;

use anyhow::bail;
use clap::{Arg, Args};

use crate::engine::{EngineConfig, EngineCoreArgs};
use crate::report::SloArgs;
use crate::workload::synthetic::SyntheticSpec;
use crate::workload::{Naming, SyntheticChoice, Trace, WorkloadArgs};
use kvroute_router::policy::{KvAwareConfig, PolicyKind, PolicySettings};

use super::capacity::Workload;
use super::capacity_args::CapacityArgs;
use super::config::{FleetChange, IndexMode, PdSplit, SimConfig};
use super::tier_args::TierArgs;

/// How the index is fed, on the command line.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum IndexChoice {
    /// The engines' KV events feed the exact index.
    Events,
    /// The router records routed blocks (no events).
    Approx,
}

impl IndexChoice {
    /// The index mode this choice names; events arrive `event_delay` seconds late.
    fn mode(self, event_delay: f64) -> IndexMode {
        match self {
            IndexChoice::Events => IndexMode::Events {
                delay_s: event_delay,
            },
            IndexChoice::Approx => IndexMode::Approx,
        }
    }

    /// The name as written on the command line, for reports.
    pub fn flag(self) -> &'static str {
        match self {
            IndexChoice::Events => "events",
            IndexChoice::Approx => "approx",
        }
    }
}

/// Where simulate's defaults differ from the shared groups' (which are `kvroute bench`'s and
/// `kvroute engine`'s): Dynamo mocker's block size and workloads sized for virtual time.
pub fn simulate_defaults(arg: Arg) -> Arg {
    let default = match arg.get_id().as_str() {
        "requests" => "1000",
        "input_tokens" => "512",
        "output_tokens" => "128",
        "prefixes" => "16",
        "prefix_tokens" => "2048",
        "think_time" => "5",
        "block_size" => "64",
        _ => return arg,
    };
    arg.default_value(default)
}

/// Flags of `kvroute simulate`.
#[derive(Args, Clone, Debug, PartialEq)]
#[command(mut_args(simulate_defaults))]
pub struct SimulateArgs {
    /// Run a named scenario of the suite (`all` for every one; see `src/sim/scenarios/`), or a
    /// scenario file (`*.toml`). The scenario sets the workload, fleet, engine and SLO: only
    /// --out, --policies, --jobs and the --kv-aware-* settings may be given with it (anything
    /// else is refused rather than silently ignored).
    #[arg(
        long,
        value_name = "NAME",
        conflicts_with_all = [
            // Flattened groups by struct name; the engine core's own flags by id (a group
            // holding a nested flatten does not conflict as a whole).
            "WorkloadArgs", "SloArgs", "TimingArgs", "block_size", "num_blocks", "max_num_seqs",
            "max_num_batched_tokens", "long_prefill_token_threshold", "max_model_len", "engine_speedup", "workers", "index",
            "event_delay", "join_at", "restart_at", "seed", "routers", "worker_speeds", "worker_kv_scales", "load_sample_ms", "replica_sync_ms",
            "prefill_workers", "decode_workers", "TransferArgs", "CpuTierArgs", "slo_itl",
            "TierArgs",
        ]
    )]
    pub scenario: Option<String>,
    /// The workload.
    #[command(flatten)]
    pub workload: WorkloadArgs,
    /// Workers at the start.
    #[arg(long, default_value_t = 4)]
    pub workers: u32,
    /// A mixed fleet: each worker's engine speed as a multiple of --engine-speedup, given per
    /// worker and repeated over the fleet (`1,0.5`: every second worker at half speed;
    /// default: every engine alike). The oracle, pooled-cache and --unqueued rows run every
    /// engine at speed 1; the --pooled-fleet row at each worker's speed.
    #[arg(long, value_delimiter = ',', value_name = "S1,S2,…")]
    pub worker_speeds: Vec<f64>,
    /// A fleet of mixed memory: each worker's KV cache (its --num-blocks, and its host tier)
    /// as a multiple of the engine's, given per worker and repeated over the fleet (`1,0.5`:
    /// every second worker with half the cache; default: every engine alike). The pooled
    /// references pool the fleet's sum; the --unqueued replay gives each worker its own size.
    #[arg(long, value_delimiter = ',', value_name = "K1,K2,…")]
    pub worker_kv_scales: Vec<f64>,
    /// Compare a disaggregated fleet of P prefill and D decode workers with an aggregated
    /// fleet of P + D workers (same policy, same trace): TTFT, inter-token latency, E2E, SLO.
    #[arg(
        long,
        value_name = "P",
        requires = "decode_workers",
        conflicts_with_all = ["workers", "join_at", "restart_at"]
    )]
    pub prefill_workers: Option<u32>,
    /// Decode workers of the disaggregated fleet (with --prefill-workers).
    #[arg(long, value_name = "D", requires = "prefill_workers")]
    pub decode_workers: Option<u32>,
    /// Inter-token latency target in seconds (a request's mean time between output tokens),
    /// for the SLO attainment of --prefill-workers comparisons.
    #[arg(long, value_name = "SECONDS")]
    pub slo_itl: Option<f64>,
    /// Comma-separated policies (default: all seven); the oracle is always added.
    #[arg(long, value_delimiter = ',', value_name = "P1,P2,…")]
    pub policies: Option<Vec<String>>,
    /// How the router's index learns what engines cache.
    #[arg(long, value_enum, default_value = "events")]
    pub index: IndexChoice,
    /// Events mode: seconds between a step's end and its KV events reaching the index.
    #[arg(long, default_value_t = 0.0, value_name = "SECONDS")]
    pub event_delay: f64,
    /// How `cache_aware` (the SGLang router's policy) learns what engines cache (default: as
    /// --index). The SGLang router learns from what it routed and never hears an eviction:
    /// `approx` with an --approx-ttl longer than the run models it.
    #[arg(long, value_enum, value_name = "INDEX")]
    pub cache_aware_index: Option<IndexChoice>,
    /// Seconds the approximate index remembers a routed prompt (the live router's
    /// `[index] approx_ttl_s`, 120 by default).
    #[arg(long, value_name = "SECONDS")]
    pub approx_ttl: Option<f64>,
    /// A cold worker joins at T seconds (repeatable).
    #[arg(long, value_name = "T")]
    pub join_at: Vec<f64>,
    /// Worker W restarts (cache and events reset, in-flight requests fail) at T seconds,
    /// given as W@T (repeatable).
    #[arg(long, value_name = "W@T", value_parser = parse_restart)]
    pub restart_at: Vec<(u32, f64)>,
    /// The engines' KV cache shape, scheduler limits and step time.
    #[command(flatten)]
    pub core: EngineCoreArgs,
    /// kv_aware: initial prefill rate of a worker, tokens per second (the live router's
    /// `kv_aware` config; calibration refines it from observed TTFTs).
    #[arg(long, value_name = "TOKENS_PER_S")]
    pub kv_aware_prefill_rate: Option<f64>,
    /// kv_aware: do not re-fit the cost model's rates from observed TTFTs.
    #[arg(long)]
    pub kv_aware_no_calibrate: bool,
    /// kv_aware: weight of the stall a prefill imposes on decoding sequences (the live
    /// router's `kv_aware.decode_weight`; 0 optimises each request's own TTFT only).
    #[arg(long, value_name = "WEIGHT")]
    pub kv_aware_decode_weight: Option<f64>,
    /// kv_aware: weight of the recomputation a placement causes later by evicting other
    /// sessions' live blocks (the live router's `kv_aware.eviction_weight`; 0 ignores it).
    #[arg(long, value_name = "WEIGHT")]
    pub kv_aware_eviction_weight: Option<f64>,
    /// kv_aware: weight of what a copy of a busy prefix saves the later requests for it (the
    /// live router's `kv_aware.copy_weight`; 0 copies only for the request in hand).
    #[arg(long, value_name = "WEIGHT")]
    pub kv_aware_copy_weight: Option<f64>,
    /// kv_aware: weight of the work a placement adds when every worker has at least twice the
    /// prompt queued (the live router's `kv_aware.saturation_weight`; 0 ignores it).
    #[arg(long, value_name = "WEIGHT")]
    pub kv_aware_saturation_weight: Option<f64>,
    /// kv_aware: the engines' long-prefill threshold as the router assumes it (default: the
    /// simulated engines' `--long-prefill-token-threshold`; 0 prices a whole queue as waited for).
    #[arg(long, value_name = "TOKENS")]
    pub kv_aware_long_prefill_token_threshold: Option<u64>,
    /// Send a prompt that needs at least two pieces of N tokens beyond what its worker holds
    /// in prefix pieces of N tokens first, each a one-token request, so that the requests
    /// arriving meanwhile queue ahead of its next piece (the live `[routing]
    /// prefill_piece_tokens`); kv_aware then prices a queued prefill as blocking one piece.
    #[arg(long, value_name = "N")]
    pub prefill_piece_tokens: Option<usize>,
    /// kv_aware: sample the choice with weights `exp(−Δcost / (temperature × best))` instead of
    /// always taking the minimum (the live router's `kv_aware.temperature`; default 0).
    #[arg(long, value_name = "T")]
    pub kv_aware_temperature: Option<f64>,
    /// Router replicas in front of the same workers, arrivals dealt round-robin; each sees
    /// only its own requests (plus engine load readings with --load-sample-ms).
    #[arg(long, default_value_t = 1, value_name = "N")]
    pub routers: u32,
    /// Every router replica reads every engine's own load (running and waiting requests)
    /// every M milliseconds, as the live `[health] load_interval_ms` poller does (default:
    /// never; 0 is never too).
    #[arg(long, value_name = "M")]
    pub load_sample_ms: Option<f64>,
    /// Router replicas share every booking (worker, prompt and predicted prefill tokens,
    /// first token, end) over a replica bus that delivers it M milliseconds later, as the
    /// live `[replica_bus]` over NATS does (default: no bus; 0 delivers at once).
    #[arg(long, value_name = "M")]
    pub replica_sync_ms: Option<f64>,
    /// Service targets.
    #[command(flatten)]
    pub slo: SloArgs,
    /// Seed of the synthetic workload, prompt content, engines and random policies.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Write results.json, summary.md and SVG charts into DIR.
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// With --out: also write `records_<policy>.jsonl`, one line per request in trace order
    /// (worker, times, cached and predicted blocks, predicted TTFT), to see where a policy's
    /// tail comes from.
    #[arg(long, requires = "out")]
    pub records: bool,
    /// Also simulate the pooled-fleet reference: the same engines and `kv_aware`, sharing one
    /// KV cache of the fleet's size (what partitioned caches cost, with queueing).
    #[arg(long)]
    pub pooled_fleet: bool,
    /// Also replay each policy's placement without its queues: every request on the worker
    /// the policy chose, over that worker's own cache, alone on an idle engine (a
    /// `<policy>_unqueued` row: how much of its TTFT is where it put prompts, how much its
    /// queues).
    #[arg(long)]
    pub unqueued: bool,
    /// Policies simulated in parallel threads (results do not depend on it).
    #[arg(long, default_value_t = 1)]
    pub jobs: usize,
    /// Capacity at the SLO instead of one run per policy.
    #[command(flatten)]
    pub capacity: CapacityArgs,
    /// How kv_aware credits what the engines' host-memory tiers (`--cpu-tier-*`) hold.
    #[command(flatten)]
    pub tiers: TierArgs,
}

fn parse_restart(s: &str) -> Result<(u32, f64), String> {
    let (w, t) = s
        .split_once('@')
        .ok_or_else(|| format!("`{s}` is not W@T (worker@seconds)"))?;
    let w = w
        .trim()
        .parse::<u32>()
        .map_err(|_| format!("worker `{w}` in `{s}` is not a number"))?;
    let t = t
        .trim()
        .parse::<f64>()
        .map_err(|_| format!("time `{t}` in `{s}` is not a number"))?;
    Ok((w, t))
}

impl SimulateArgs {
    /// The policies to run, validated, in the given order (default: all).
    pub fn policy_kinds(&self) -> anyhow::Result<Vec<PolicyKind>> {
        match &self.policies {
            // Strings, not `PolicyKind`s, on the command line: `oracle` is accepted (and
            // always run), but it is not a policy.
            Some(p) => Ok(p
                .iter()
                .map(|s| s.trim())
                .filter(|s| !s.is_empty() && *s != "oracle")
                .map(str::parse)
                .collect::<Result<_, _>>()?),
            None => Ok(PolicyKind::ALL.to_vec()),
        }
    }

    /// The workload after every transform (window, first N, speed-up, input cap), with a
    /// one-line description.
    pub fn workload(&self) -> anyhow::Result<(Trace, String)> {
        if self.workload.is_empty() {
            bail!("give a workload: --trace FILE, --synthetic KIND or --scenario NAME")
        }
        self.workload.load(self.seed, Naming::Short)
    }

    /// The workload of a capacity study: as read, with the transforms still to apply, so each
    /// probe applies them with its own rate multiplier.
    pub fn capacity_workload(&self) -> anyhow::Result<Workload> {
        if self.workload.is_empty() {
            bail!("give a workload: --trace FILE or --synthetic KIND")
        }
        let untransformed = WorkloadArgs {
            window: None,
            max_requests: None,
            trace_speedup: None,
            max_input_tokens: None,
            arrival_jitter: None,
            ..self.workload.clone()
        };
        let (raw, _) = untransformed.load(self.seed, Naming::Short)?;
        Ok(Workload {
            raw,
            transforms: self.workload.transforms(self.seed),
        })
    }

    /// The synthetic spec of these flags for `kind`.
    pub fn synthetic_spec(&self, kind: SyntheticChoice) -> SyntheticSpec {
        self.workload.synthetic_spec(kind, self.seed)
    }

    /// The engine configuration of these flags (the KV link of disaggregated fleets is the
    /// engine's `--kv-transfer-*` flags, its host-memory tier the `--cpu-tier-*` ones).
    pub fn engine_config(&self) -> EngineConfig {
        self.core.engine_config(self.seed)
    }

    /// The disaggregated fleet of `--prefill-workers` and `--decode-workers`, if given.
    pub fn pd_split(&self) -> Option<PdSplit> {
        Some(PdSplit {
            prefill: self.prefill_workers?,
            decode: self.decode_workers?,
        })
    }

    /// `--approx-ttl` as a duration (the live router's default without it).
    fn approx_ttl(&self) -> anyhow::Result<std::time::Duration> {
        match self.approx_ttl {
            None => Ok(kvroute_router::config::IndexSettings::default().approx_ttl),
            Some(s) if s.is_finite() && s > 0.0 => Ok(std::time::Duration::from_secs_f64(s)),
            Some(_) => bail!("--approx-ttl must be a positive number of seconds"),
        }
    }

    /// The policies' settings: the live router's defaults, seeded, with the kv_aware overrides.
    pub fn policy_settings(&self) -> PolicySettings {
        let mut kv_aware = KvAwareConfig::default();
        if let Some(rate) = self.kv_aware_prefill_rate {
            kv_aware.prefill_rate_tokens_per_s = rate;
        }
        kv_aware.calibrate = !self.kv_aware_no_calibrate;
        if let Some(w) = self.kv_aware_decode_weight {
            kv_aware.decode_weight = w;
        }
        if let Some(t) = self.kv_aware_temperature {
            kv_aware.temperature = t;
        }
        if let Some(w) = self.kv_aware_eviction_weight {
            kv_aware.eviction_weight = w;
        }
        if let Some(w) = self.kv_aware_copy_weight {
            kv_aware.copy_weight = w;
        }
        if let Some(w) = self.kv_aware_saturation_weight {
            kv_aware.saturation_weight = w;
        }
        // The router knows its engines' cap, as an operator configures it to match theirs,
        // and its own pieces.
        kv_aware.long_prefill_token_threshold = self
            .kv_aware_long_prefill_token_threshold
            .unwrap_or(self.core.long_prefill_token_threshold as u64);
        let pieces = self.prefill_piece_tokens.unwrap_or(0) as u64;
        kv_aware.long_prefill_token_threshold =
            kvroute_router::policy::kv_aware::threshold_with_pieces(
                kv_aware.long_prefill_token_threshold,
                pieces,
            );
        self.tiers
            .apply_policy(&mut kv_aware, &self.engine_config());
        PolicySettings {
            seed: self.seed,
            kv_aware,
            ..PolicySettings::default()
        }
    }

    /// The simulation configuration of these flags (validated).
    pub fn sim_config(&self) -> anyhow::Result<SimConfig> {
        self.core.transfer.model()?;
        if self.slo_itl.is_some_and(|s| !(s.is_finite() && s > 0.0)) {
            bail!("--slo-itl must be a positive number of seconds");
        }
        let pd = self.pd_split();
        let mut changes: Vec<FleetChange> = self
            .join_at
            .iter()
            .map(|&at| FleetChange::Join { at })
            .collect();
        changes.extend(
            self.restart_at
                .iter()
                .map(|&(worker, at)| FleetChange::Restart { worker, at }),
        );
        let config = SimConfig {
            workers: pd.map_or(self.workers, |p| p.workers()),
            engine: self.engine_config(),
            index: self.index.mode(self.event_delay),
            cache_aware_index: self.cache_aware_index.map(|i| i.mode(self.event_delay)),
            approx_ttl: self.approx_ttl()?,
            changes,
            policy: self.policy_settings(),
            model: "kvroute/sim".to_string(),
            synth: self.workload.prompt_synth(self.seed),
            slo: self.slo.slo(),
            routers: self.routers,
            load_sample_s: self
                .load_sample_ms
                .filter(|&ms| ms != 0.0)
                .map(|ms| ms / 1000.0),
            replica_sync_s: self.replica_sync_ms.map(|ms| ms / 1000.0),
            pd,
            worker_speeds: self.worker_speeds.clone(),
            worker_kv_scales: self.worker_kv_scales.clone(),
            prefill_piece_tokens: self.prefill_piece_tokens.unwrap_or(0),
        };
        config.validate()?;
        Ok(config)
    }
}

#[cfg(test)]
#[path = "args_tests.rs"]
pub(super) mod tests;
