//! What a prefix held in host memory or on disk is worth, in seconds.
//!
//! An engine with an offloading tier (vLLM's OffloadingConnector, LMCache, SGLang's HiCache)
//! does not recompute a prefix it finds there: it loads it back into GPU memory, which takes
//! `tokens × KV bytes per token ÷ the link's bandwidth + a fixed latency` (the request waits for
//! the load; other requests keep running, so nobody else is stalled). Peers credit such hits
//! with fixed weights (NVIDIA Dynamo: host 0.75, disk 0.25 of a GPU hit; llm-d: CPU 0.8). A
//! weight cannot know that loading 100k tokens over PCIe takes longer than recomputing 2k, nor
//! that the same hit is worth more on a slow GPU; seconds can, and they add up with the cost
//! model's other seconds (queue, prefill, stalls) without a hand-tuned exchange rate.
//!
//! The configured link (bandwidth, latency per tier, KV bytes per token of the model) is the
//! prior. Each first token of a request that loaded blocks is a measurement: what its TTFT took
//! beyond the prefill model's prediction is the load's time. A two-parameter recursive least
//! squares (one factor per tier, with forgetting) fits those residuals, so a link slower than
//! configured (a shared PCIe switch, a busy disk) is priced as it behaves. Factors are bounded
//! to [[`MIN_FACTOR`], [`MAX_FACTOR`]]: one wild sample must not make a tier free or useless.
//!
//! That residual includes any wait for room the load had (an engine allocates a load's blocks
//! before it starts it), so on a full worker the factor prices a load as it is served, above
//! its link time: on the simulator's tiered agentic fleet (seed 0) it moves between 1.3 and 3
//! and ends at 2. Taking the predicted wait for room out of it as well (as the prefill rates
//! do) kept the factor at 1.1–1.6, and the fleet's TTFT mean rose 4 % (seeds 0–2: 221.0
//! against 212.2 ms), because loads wait longer for room than `kv_room` predicts (seed 0: the
//! 12 loads predicted a wait were predicted 88.3 s of it and queued 124.1 s): what a load waits
//! and makes others wait is under-priced, and the factor is what prices it
//! (docs/benchmarks.md, "The wait for room is not slow prefill").

use serde::{Deserialize, Serialize};

/// How a policy credits blocks held in host memory or on disk.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TierCredit {
    /// Loaded blocks are not recomputed; their load costs the fitted seconds (the default).
    Seconds,
    /// NVIDIA Dynamo's fixed weights: a host block counts 0.75, a disk block 0.25 of a GPU
    /// block, loads cost nothing (the baseline of docs/benchmarks.md).
    DynamoWeights,
    /// Only GPU blocks count (kvroute before tiers; the "tiers ignored" baseline).
    Ignored,
}

impl TierCredit {
    /// Every mode, for flags and tests.
    pub const ALL: [TierCredit; 3] = [
        TierCredit::Seconds,
        TierCredit::DynamoWeights,
        TierCredit::Ignored,
    ];

    /// The mode's name, as `--tier-credit` takes it.
    pub fn name(self) -> &'static str {
        match self {
            TierCredit::Seconds => "seconds",
            TierCredit::DynamoWeights => "dynamo-weights",
            TierCredit::Ignored => "ignored",
        }
    }

    /// Parses [`TierCredit::name`].
    pub fn from_name(name: &str) -> Option<TierCredit> {
        TierCredit::ALL.into_iter().find(|c| c.name() == name)
    }
}

/// One tier's link to the GPU.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct TierLink {
    /// Bytes per second a load reads.
    pub bandwidth_bytes_per_s: f64,
    /// Seconds every load takes regardless of its size.
    pub latency_s: f64,
}

/// The tier part of the cost model.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct TierCostConfig {
    /// How hits in host memory or on disk are credited.
    pub credit: TierCredit,
    /// KV bytes of one token of the model (all layers, K and V); a request whose model states
    /// its own ([`super::RouteRequest::kv_bytes_per_token`]) uses that.
    pub kv_bytes_per_token: u64,
    /// Host memory → GPU.
    pub cpu: TierLink,
    /// Disk (or any slower medium) → GPU.
    pub disk: TierLink,
}

impl Default for TierCostConfig {
    /// Qwen3-8B-like KV (147,456 bytes per token); host memory over a PCIe 5 ×16 link
    /// (≈ 50 GB/s effective of 64 GB/s, 0.5 ms per load); a local NVMe disk (6 GB/s, 2 ms).
    fn default() -> Self {
        TierCostConfig {
            credit: TierCredit::Seconds,
            kv_bytes_per_token: 147_456,
            cpu: TierLink {
                bandwidth_bytes_per_s: 50e9,
                latency_s: 0.000_5,
            },
            disk: TierLink {
                bandwidth_bytes_per_s: 6e9,
                latency_s: 0.002,
            },
        }
    }
}

/// Blocks of a prompt past a worker's GPU prefix that it holds in host memory and on disk.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LowerBlocks {
    /// Blocks in host memory.
    pub cpu: u32,
    /// Blocks on disk (or slower).
    pub disk: u32,
}

impl LowerBlocks {
    /// Both tiers.
    pub fn total(self) -> u32 {
        self.cpu + self.disk
    }
}

/// What a candidate's tiers are worth to a request.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct TierQuote {
    /// Prompt tokens the worker does not compute (GPU hits and, if credited, loaded blocks).
    pub cached_tokens: u64,
    /// Seconds to load the host-memory part.
    pub cpu_s: f64,
    /// Seconds to load the disk part.
    pub disk_s: f64,
}

impl TierQuote {
    /// Seconds of loading in all.
    pub fn load_s(&self) -> f64 {
        self.cpu_s + self.disk_s
    }
}

/// Lowest and highest factor the fit may put on a tier's configured time.
pub const MIN_FACTOR: f64 = 0.25;
/// See [`MIN_FACTOR`].
pub const MAX_FACTOR: f64 = 4.0;

/// The online fit of the two tiers' time factors.
#[derive(Clone, Debug)]
pub struct TierFit {
    factors: [f64; 2],
    p: [[f64; 2]; 2],
    forgetting: f64,
    /// Observations with loaded blocks so far.
    pub observations: u64,
}

impl TierFit {
    /// Factors 1 (the configured links), `forgetting` as the prefill fit's.
    pub fn new(forgetting: f64) -> TierFit {
        TierFit {
            factors: [1.0, 1.0],
            // A weak prior: load times are milliseconds, so unit factors must yield to the first
            // few observations (the gain is about P·x, with x ≈ 0.001–1 s).
            p: [[1e6, 0.0], [0.0, 1e6]],
            forgetting: forgetting.clamp(0.9, 1.0),
            observations: 0,
        }
    }

    /// The factors now (host memory, disk).
    pub fn factors(&self) -> [f64; 2] {
        self.factors
    }

    /// Learns from one first token: `load_s` the configured seconds of its host-memory and
    /// disk loads, `residual_s` what its TTFT took beyond the prefill model's prediction.
    pub fn observe(&mut self, load_s: [f64; 2], residual_s: f64) {
        if load_s == [0.0, 0.0] || !residual_s.is_finite() {
            return;
        }
        let x = load_s;
        let px = [
            self.p[0][0] * x[0] + self.p[0][1] * x[1],
            self.p[1][0] * x[0] + self.p[1][1] * x[1],
        ];
        let denom = self.forgetting + x[0] * px[0] + x[1] * px[1];
        if denom <= 0.0 || !denom.is_finite() {
            return;
        }
        let k = [px[0] / denom, px[1] / denom];
        let err = residual_s - (self.factors[0] * x[0] + self.factors[1] * x[1]);
        for (i, f) in self.factors.iter_mut().enumerate() {
            *f = (*f + k[i] * err).clamp(MIN_FACTOR, MAX_FACTOR);
        }
        let p = self.p;
        for i in 0..2 {
            for j in 0..2 {
                self.p[i][j] = (p[i][j] - k[i] * px[j]) / self.forgetting;
            }
        }
        self.observations += 1;
    }
}

impl TierCostConfig {
    /// The configured seconds of loading `cpu_tokens` from host memory and `disk_tokens` from
    /// disk, at `bytes_per_token` (0: the configured default).
    pub fn load_s(&self, cpu_tokens: u64, disk_tokens: u64, bytes_per_token: u64) -> [f64; 2] {
        let bytes = if bytes_per_token == 0 {
            self.kv_bytes_per_token
        } else {
            bytes_per_token
        } as f64;
        let one = |tokens: u64, link: &TierLink| {
            if tokens == 0 {
                0.0
            } else {
                tokens as f64 * bytes / link.bandwidth_bytes_per_s.max(1.0) + link.latency_s
            }
        };
        [one(cpu_tokens, &self.cpu), one(disk_tokens, &self.disk)]
    }

    /// What `gpu` leading blocks and `lower` blocks past them are worth to a request of
    /// `block_size`-token blocks and `bytes_per_token` KV bytes per token (0: the default),
    /// with the fitted `factors`.
    pub fn quote(
        &self,
        gpu: u32,
        lower: LowerBlocks,
        block_size: u32,
        bytes_per_token: u64,
        factors: [f64; 2],
    ) -> TierQuote {
        let bs = u64::from(block_size);
        let gpu_tokens = u64::from(gpu) * bs;
        match self.credit {
            TierCredit::Ignored => TierQuote {
                cached_tokens: gpu_tokens,
                ..TierQuote::default()
            },
            TierCredit::DynamoWeights => {
                let credited = f64::from(lower.cpu) * 0.75 + f64::from(lower.disk) * 0.25;
                TierQuote {
                    cached_tokens: gpu_tokens + (credited * bs as f64) as u64,
                    ..TierQuote::default()
                }
            }
            TierCredit::Seconds => {
                let (cpu, disk) = (u64::from(lower.cpu) * bs, u64::from(lower.disk) * bs);
                let [cpu_s, disk_s] = self.load_s(cpu, disk, bytes_per_token);
                TierQuote {
                    cached_tokens: gpu_tokens + cpu + disk,
                    cpu_s: cpu_s * factors[0],
                    disk_s: disk_s * factors[1],
                }
            }
        }
    }
}

/// The tier pricing a cost-model policy keeps: the fitted factors, shared by every decision.
#[derive(Debug)]
pub struct TierPricing {
    fit: std::sync::Mutex<TierFit>,
}

impl TierPricing {
    /// Unfitted, forgetting as `forgetting`.
    pub fn new(forgetting: f64) -> TierPricing {
        TierPricing {
            fit: std::sync::Mutex::new(TierFit::new(forgetting)),
        }
    }

    /// The fitted factors (host memory, disk).
    pub fn factors(&self) -> [f64; 2] {
        super::lock(&self.fit).factors()
    }

    /// What candidate `c`'s GPU and lower-tier blocks are worth to `request`.
    pub fn quote(
        &self,
        config: &TierCostConfig,
        request: &super::RouteRequest,
        c: &super::Candidate,
        factors: [f64; 2],
    ) -> TierQuote {
        config.quote(
            c.overlap_blocks,
            c.lower_blocks,
            request.block_size,
            request.kv_bytes_per_token,
            factors,
        )
    }

    /// Splits an observed TTFT: returns the part the prefill model should learn from (the
    /// TTFT less the fitted load time), after learning the load factors from what the TTFT
    /// took beyond `prefill_predicted_s`. Only [`TierCredit::Seconds`] fits.
    pub fn observe(
        &self,
        config: &TierCostConfig,
        o: &super::Observation,
        prefill_predicted_s: f64,
    ) -> f64 {
        let [cpu, disk] = o.loaded_tokens;
        if cpu + disk == 0 {
            return o.ttft_s;
        }
        let load = config.load_s(cpu, disk, o.kv_bytes_per_token);
        let mut fit = super::lock(&self.fit);
        if config.credit == TierCredit::Seconds {
            fit.observe(load, o.ttft_s - prefill_predicted_s);
        }
        let f = fit.factors();
        (o.ttft_s - load[0] * f[0] - load[1] * f[1]).max(0.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_host_hit_costs_its_bytes_over_the_link_plus_latency() {
        let c = TierCostConfig::default();
        let lower = LowerBlocks { cpu: 100, disk: 10 };
        let q = c.quote(50, lower, 16, 0, [1.0, 1.0]);
        assert_eq!(q.cached_tokens, 160 * 16);
        let cpu = 1600.0 * 147_456.0 / 50e9 + 0.0005;
        let disk = 160.0 * 147_456.0 / 6e9 + 0.002;
        assert!((q.cpu_s - cpu).abs() < 1e-12 && (q.disk_s - disk).abs() < 1e-12);
        // A model with a smaller KV loads faster.
        let small = c.quote(50, lower, 16, 1024, [1.0, 1.0]);
        assert!(small.load_s() < q.load_s());
        // Nothing loaded, nothing paid: not even the latency.
        assert_eq!(
            c.quote(5, LowerBlocks::default(), 16, 0, [1.0, 1.0])
                .load_s(),
            0.0
        );
    }

    #[test]
    fn baselines_credit_fixed_weights_or_nothing() {
        let lower = LowerBlocks { cpu: 4, disk: 4 };
        let dynamo = TierCostConfig {
            credit: TierCredit::DynamoWeights,
            ..TierCostConfig::default()
        };
        let q = dynamo.quote(2, lower, 10, 0, [1.0, 1.0]);
        assert_eq!((q.cached_tokens, q.load_s()), (20 + 30 + 10, 0.0));
        let ignored = TierCostConfig {
            credit: TierCredit::Ignored,
            ..TierCostConfig::default()
        };
        assert_eq!(ignored.quote(2, lower, 10, 0, [1.0, 1.0]).cached_tokens, 20);
        for c in TierCredit::ALL {
            assert_eq!(TierCredit::from_name(c.name()), Some(c));
        }
    }

    #[test]
    fn the_fit_learns_a_slower_link_within_bounds() {
        let mut fit = TierFit::new(0.99);
        for i in 0..200 {
            let cpu = 0.01 + (i % 7) as f64 * 0.003;
            let disk = if i % 3 == 0 { 0.02 } else { 0.0 };
            // The host link is twice as slow as configured, the disk as configured.
            fit.observe([cpu, disk], 2.0 * cpu + disk);
        }
        let [cpu, disk] = fit.factors();
        assert!((cpu - 2.0).abs() < 0.05, "{cpu}");
        assert!((disk - 1.0).abs() < 0.05, "{disk}");
        // A wild residual cannot push a factor out of bounds.
        fit.observe([0.001, 0.0], 100.0);
        assert!(fit.factors()[0] <= MAX_FACTOR);
        fit.observe([0.0, 0.0], 5.0);
        assert_eq!(fit.observations, 201);
    }
}
