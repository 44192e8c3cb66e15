//! What one simulation runs: the fleet's engines, how the router learns what they cache, fleet
//! changes over time, and the service targets results are judged by.
//!
//! This is the pure description `Simulation` needs; `args` builds it from command-line flags
//! and scenario files, so a test can build one directly without going through clap.

use std::time::Duration;

use thiserror::Error;

use crate::engine::cpu_tier::CpuTierConfig;
use crate::engine::{ConfigError, EngineConfig};
use crate::report::Slo;
use crate::workload::synthesis::PromptSynth;
use kvroute_router::policy::{PolicyKind, PolicySettings};

/// How the router's index learns what each engine caches.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum IndexMode {
    /// The engines' own KV events feed the exact index, each batch `delay_s` after the step
    /// that produced it (a real subscriber sees them a little late).
    Events {
        /// Seconds between a step's end and its events reaching the index.
        delay_s: f64,
    },
    /// No events: the router records the blocks of every routed request (approximate mode).
    Approx,
}

/// A change to the fleet at a given virtual time.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum FleetChange {
    /// A new worker with a cold cache joins at `at` seconds.
    Join {
        /// Virtual time, seconds.
        at: f64,
    },
    /// Worker `worker` restarts at `at` seconds: its in-flight requests fail, its cache is
    /// empty afterwards, and its event stream restarts (the router drops its index entries).
    Restart {
        /// Worker slot.
        worker: u32,
        /// Virtual time, seconds.
        at: f64,
    },
}

impl FleetChange {
    /// When the change happens.
    pub fn at(&self) -> f64 {
        match *self {
            FleetChange::Join { at } | FleetChange::Restart { at, .. } => at,
        }
    }
}

/// A disaggregated fleet: slots `0..prefill` are prefill workers, the next `decode` slots
/// decode workers. Each request is prefilled on one (chosen by the policy, KV-aware), its KV
/// pulled by the other (chosen by load and KV room), which streams its tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PdSplit {
    /// Prefill workers.
    pub prefill: u32,
    /// Decode workers.
    pub decode: u32,
}

impl PdSplit {
    /// Workers in all.
    pub fn workers(&self) -> u32 {
        self.prefill + self.decode
    }

    /// The role of worker `slot`.
    pub fn role(&self, slot: u32) -> kvroute_router::fleet::Role {
        if slot < self.prefill {
            kvroute_router::fleet::Role::Prefill
        } else {
            kvroute_router::fleet::Role::Decode
        }
    }
}

/// Everything about a simulation except the workload and the policy.
#[derive(Clone, Debug)]
pub struct SimConfig {
    /// Workers at time 0.
    pub workers: u32,
    /// Every engine's configuration (each engine gets its own seed derived from this one's).
    pub engine: EngineConfig,
    /// How the index is fed.
    pub index: IndexMode,
    /// How `cache_aware` (the SGLang router's policy) learns instead, when it differs from
    /// `index`: the SGLang router itself learns from what it routed (its own radix tree,
    /// which hears no eviction), so [`IndexMode::Approx`] with a long `approx_ttl` models it.
    pub cache_aware_index: Option<IndexMode>,
    /// How long the approximate index remembers a routed prompt (the live
    /// `[index] approx_ttl_s`).
    pub approx_ttl: Duration,
    /// Workers joining or restarting during the run.
    pub changes: Vec<FleetChange>,
    /// Policy settings (seeded), as the live router's config would give them.
    pub policy: PolicySettings,
    /// Model name: seeds kvroute's block hashes exactly as the live router would.
    pub model: String,
    /// Turns trace block ids into prompt token ids.
    pub synth: PromptSynth,
    /// Service targets.
    pub slo: Slo,
    /// Router replicas; arrivals are dealt to them round-robin. Each has its own load
    /// counters and policy (calibration included) and sees only its own decisions.
    pub routers: u32,
    /// Seconds between two readings of every engine's own load by every router replica
    /// (`[health] load_interval_ms` live); `None`: replicas see only their own requests.
    pub load_sample_s: Option<f64>,
    /// Router replicas share their bookings over a replica bus that delivers each one this
    /// many seconds after it was made (the live `[replica_bus]`); `None`: no bus.
    pub replica_sync_s: Option<f64>,
    /// A disaggregated fleet (`workers` must be its size); `None`: every worker serves whole
    /// requests.
    pub pd: Option<PdSplit>,
    /// A mixed fleet: worker `i`'s engine runs at `worker_speeds[i % len]` times the engine's
    /// speed (another GPU type, another tensor-parallel size); empty: every engine alike. The
    /// oracle, the pooled cache and the unqueued replay run at the engine's own speed; the
    /// pooled fleet at each slot's.
    pub worker_speeds: Vec<f64>,
    /// A fleet of mixed memory: worker `i`'s KV cache — its GPU blocks and its host tier —
    /// holds `worker_kv_scales[i % len]` times the engine's (another GPU's memory, another
    /// tensor-parallel size); empty: every engine alike. The pooled references pool the
    /// fleet's sum; the unqueued replay gives each worker its own size.
    pub worker_kv_scales: Vec<f64>,
    /// The router sends a prompt that needs at least two pieces of this many tokens beyond
    /// what its worker holds in prefix pieces first (`routing::prefill_pieces`); 0: whole.
    pub prefill_piece_tokens: usize,
}

impl SimConfig {
    /// The KV-cache scale of the worker in `slot` (1 unless the fleet's memory is mixed).
    pub fn kv_scale(&self, slot: u32) -> f64 {
        if self.worker_kv_scales.is_empty() {
            1.0
        } else {
            self.worker_kv_scales[slot as usize % self.worker_kv_scales.len()]
        }
    }

    /// The GPU KV blocks of the engine in `slot`.
    pub fn slot_blocks(&self, slot: u32) -> u32 {
        scaled(self.engine.num_blocks, self.kv_scale(slot))
    }

    /// The host tier of the engine in `slot`, if the engines have one.
    pub fn slot_tier(&self, slot: u32) -> Option<CpuTierConfig> {
        let scale = self.kv_scale(slot);
        self.engine.cpu_tier.map(|t| CpuTierConfig {
            blocks: scaled(t.blocks, scale),
            ..t
        })
    }

    /// The GPU KV blocks of the first `workers` slots together.
    pub fn fleet_blocks(&self, workers: u32) -> u32 {
        let sum: u64 = (0..workers).map(|s| u64::from(self.slot_blocks(s))).sum();
        u32::try_from(sum).unwrap_or(u32::MAX)
    }

    /// The host-tier blocks of the first `workers` slots together (0 without a tier).
    pub fn fleet_tier_blocks(&self, workers: u32) -> u32 {
        let sum: u64 = (0..workers)
            .filter_map(|s| self.slot_tier(s))
            .map(|t| u64::from(t.blocks))
            .sum();
        u32::try_from(sum).unwrap_or(u32::MAX)
    }

    /// How `policy`'s router learns what the engines cache in this simulation.
    pub fn index_for(&self, policy: PolicyKind) -> IndexMode {
        match (policy, self.cache_aware_index) {
            (PolicyKind::CacheAware, Some(index)) => index,
            _ => self.index,
        }
    }
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            workers: 4,
            engine: dynamo_mocker_engine(),
            index: IndexMode::Events { delay_s: 0.0 },
            cache_aware_index: None,
            approx_ttl: kvroute_router::config::IndexSettings::default().approx_ttl,
            changes: Vec::new(),
            policy: PolicySettings::default(),
            model: "kvroute/sim".to_string(),
            synth: PromptSynth::default(),
            slo: Slo::default(),
            routers: 1,
            load_sample_s: None,
            replica_sync_s: None,
            pd: None,
            worker_speeds: Vec::new(),
            worker_kv_scales: Vec::new(),
            prefill_piece_tokens: 0,
        }
    }
}

/// The engine shape NVIDIA Dynamo's mocker uses by default: 64-token blocks, 16,384 blocks,
/// 8,192 batched tokens, 256 sequences; the step-time model is the mocker's vLLM fit (the
/// engine's default).
pub fn dynamo_mocker_engine() -> EngineConfig {
    EngineConfig {
        block_size: 64,
        num_blocks: 16_384,
        max_num_batched_tokens: 8192,
        max_num_seqs: 256,
        ..EngineConfig::default()
    }
}

/// A configuration the simulator cannot run.
#[derive(Debug, Error, PartialEq)]
pub enum SimConfigError {
    /// The engine configuration is invalid.
    #[error("engine: {0}")]
    Engine(#[from] ConfigError),
    /// No worker at all.
    #[error("--workers must be at least 1")]
    NoWorkers,
    /// A fleet change names a worker that does not exist or a bad time.
    #[error("fleet change {0}")]
    Change(String),
    /// A negative or non-finite event delay.
    #[error("--event-delay must be a number of seconds >= 0")]
    EventDelay,
    /// An approximate index that would forget a prompt at once.
    #[error("--approx-ttl must be a positive number of seconds")]
    ApproxTtl,
    /// No router replica.
    #[error("--routers must be at least 1")]
    NoRouters,
    /// A load sampling interval that is not a positive number of seconds.
    #[error("--load-sample-ms must be a positive number of milliseconds")]
    LoadSample,
    /// A replica bus delay that is not a number of seconds >= 0.
    #[error("--replica-sync-ms must be a number of milliseconds >= 0")]
    ReplicaSync,
    /// A disaggregated fleet without a side, of the wrong size, or with fleet changes.
    #[error("disaggregated fleet: {0}")]
    Pd(String),
    /// A worker speed that is not a positive number.
    #[error("--worker-speeds must be positive numbers")]
    WorkerSpeed,
    /// A worker KV scale that is not a positive number, or leaves a worker no block.
    #[error("--worker-kv-scales must be positive numbers that leave every worker a KV block")]
    WorkerKvScale,
}

impl SimConfig {
    /// Checks the configuration; a valid one cannot make the simulation fail.
    pub fn validate(&self) -> Result<(), SimConfigError> {
        self.engine.validate()?;
        if self.workers == 0 {
            return Err(SimConfigError::NoWorkers);
        }
        if self.routers == 0 {
            return Err(SimConfigError::NoRouters);
        }
        if self
            .worker_speeds
            .iter()
            .any(|s| !(s.is_finite() && *s > 0.0))
        {
            return Err(SimConfigError::WorkerSpeed);
        }
        if self
            .worker_kv_scales
            .iter()
            .any(|s| !(s.is_finite() && *s > 0.0) || scaled(self.engine.num_blocks, *s) == 0)
        {
            return Err(SimConfigError::WorkerKvScale);
        }
        if self
            .load_sample_s
            .is_some_and(|s| !(s.is_finite() && s > 0.0))
        {
            return Err(SimConfigError::LoadSample);
        }
        if self
            .replica_sync_s
            .is_some_and(|s| !(s.is_finite() && s >= 0.0))
        {
            return Err(SimConfigError::ReplicaSync);
        }
        for index in [Some(self.index), self.cache_aware_index]
            .into_iter()
            .flatten()
        {
            if let IndexMode::Events { delay_s } = index
                && !(delay_s.is_finite() && delay_s >= 0.0)
            {
                return Err(SimConfigError::EventDelay);
            }
        }
        if self.approx_ttl.is_zero() {
            return Err(SimConfigError::ApproxTtl);
        }
        if let Some(pd) = self.pd {
            if pd.prefill == 0 || pd.decode == 0 {
                return Err(SimConfigError::Pd(
                    "--prefill-workers and --decode-workers must both be at least 1".into(),
                ));
            }
            if pd.workers() != self.workers {
                return Err(SimConfigError::Pd(format!(
                    "{} prefill + {} decode workers, but the fleet has {}",
                    pd.prefill, pd.decode, self.workers
                )));
            }
            if !self.changes.is_empty() {
                return Err(SimConfigError::Pd(
                    "joins and restarts are not simulated in a disaggregated fleet".into(),
                ));
            }
        }
        let joins = self
            .changes
            .iter()
            .filter(|c| matches!(c, FleetChange::Join { .. }))
            .count() as u32;
        for c in &self.changes {
            let at = c.at();
            if !(at.is_finite() && at >= 0.0) {
                return Err(SimConfigError::Change(format!(
                    "at {at} s: time must be >= 0"
                )));
            }
            if let FleetChange::Restart { worker, .. } = c
                && *worker >= self.workers + joins
            {
                return Err(SimConfigError::Change(format!(
                    "restarts worker {worker}, but there are only {} workers",
                    self.workers + joins
                )));
            }
        }
        Ok(())
    }

    /// Total workers over the run (initial plus joining).
    pub fn max_workers(&self) -> u32 {
        self.workers
            + self
                .changes
                .iter()
                .filter(|c| matches!(c, FleetChange::Join { .. }))
                .count() as u32
    }
}

/// `blocks × scale`, rounded.
fn scaled(blocks: u32, scale: f64) -> u32 {
    (f64::from(blocks) * scale)
        .round()
        .clamp(0.0, f64::from(u32::MAX)) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validation_names_the_problem() {
        let mut c = SimConfig::default();
        assert!(c.validate().is_ok());
        c.changes.push(FleetChange::Restart { worker: 9, at: 1.0 });
        assert!(c.validate().unwrap_err().to_string().contains("worker 9"));
        c.changes = vec![
            FleetChange::Join { at: 1.0 },
            FleetChange::Restart { worker: 4, at: 2.0 },
        ];
        assert!(c.validate().is_ok());
        assert_eq!(c.max_workers(), 5);
        c.workers = 0;
        assert_eq!(c.validate().unwrap_err(), SimConfigError::NoWorkers);
        let mut c = SimConfig {
            routers: 0,
            ..SimConfig::default()
        };
        assert_eq!(c.validate().unwrap_err(), SimConfigError::NoRouters);
        c.routers = 4;
        for bad in [0.0, -1.0, f64::NAN] {
            c.load_sample_s = Some(bad);
            assert_eq!(c.validate().unwrap_err(), SimConfigError::LoadSample);
        }
        c.load_sample_s = Some(0.1);
        assert!(c.validate().is_ok());
    }

    #[test]
    fn a_fleet_of_mixed_memory_sizes_each_cache() {
        let mut c = SimConfig {
            workers: 3,
            ..SimConfig::default()
        };
        c.engine.num_blocks = 1000;
        c.engine.cpu_tier = Some(CpuTierConfig {
            blocks: 4000,
            read_bytes_per_s: 5e10,
            write_bytes_per_s: 5e10,
            latency_s: 5e-4,
            bytes_per_token: 147_456,
            events: Default::default(),
        });
        assert_eq!((c.slot_blocks(2), c.fleet_blocks(3)), (1000, 3000));
        c.worker_kv_scales = vec![1.5, 0.5];
        assert!(c.validate().is_ok());
        let blocks: Vec<u32> = (0..3).map(|s| c.slot_blocks(s)).collect();
        assert_eq!(blocks, [1500, 500, 1500]);
        assert_eq!(c.slot_tier(1).map(|t| t.blocks), Some(2000));
        assert_eq!((c.fleet_blocks(3), c.fleet_tier_blocks(3)), (3500, 14_000));
        for bad in [0.0, -1.0, f64::INFINITY, 0.0001] {
            c.worker_kv_scales = vec![1.0, bad];
            assert_eq!(c.validate().unwrap_err(), SimConfigError::WorkerKvScale);
        }
    }
}
