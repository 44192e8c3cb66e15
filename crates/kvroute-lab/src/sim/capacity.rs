//! Capacity at an SLO (`kvroute simulate --capacity`): per policy, the highest arrival-rate
//! multiplier at which a target fraction of requests still meets the SLO on the given fleet,
//! and the fewest workers that meet it at the trace's own rate.
//!
//! Latency tables answer "how fast at this load"; an operator sizing a fleet from a recording
//! of their own traffic asks the inverse: "how much more traffic can these workers take" and
//! "how many workers does this traffic need". Each answer is a search over whole simulations
//! ([`super::search`]); the multiplier is exactly `--trace-speedup` (times any speed-up the
//! command already gives), applied by the workload's own transforms. Pure: the caller's probe
//! runs each simulation (see `cli::run_capacity`), so this file only decides what to simulate
//! and how to read the answers.

use std::collections::HashMap;

use serde::{Serialize, Serializer};

use crate::report::Slo;
use crate::report::plot::Series;
use crate::workload::{Trace, TraceError, trace::Transforms};
use kvroute_router::policy::PolicyKind;

use super::config::SimConfig;
use super::search::{CONFIRM_STEP, Found, RateSearch, max_multiplier, min_workers};

/// What the searches look for, and how hard.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct CapacitySpec {
    /// Fraction of requests that must meet the SLO (0.9 = 90 %).
    pub attainment: f64,
    /// Relative precision of the rate multiplier (0.02 = 2 %).
    pub precision: f64,
    /// The highest multiplier probed.
    pub max_multiplier: f64,
    /// The most workers probed.
    pub max_workers: u32,
}

impl CapacitySpec {
    /// The rate search of this spec: from `1 / max_multiplier` to `max_multiplier`.
    pub fn rate_search(&self) -> RateSearch {
        RateSearch {
            target: self.attainment,
            precision: self.precision,
            min: self.max_multiplier.recip(),
            max: self.max_multiplier,
            confirm: CONFIRM_STEP,
        }
    }
}

/// The workload of a study: the trace before any speed-up, and the transforms the command
/// gives, so each probe applies them in their usual order with its own multiplier.
#[derive(Clone, Debug)]
pub struct Workload {
    /// The trace (or synthetic workload) as read, untransformed.
    pub raw: Trace,
    /// The command's transforms; `speed_up` is the 1× the multipliers scale.
    pub transforms: Transforms,
}

impl Workload {
    /// The trace at `multiplier` times the command's arrival rate.
    pub fn at(&self, multiplier: f64) -> Result<Trace, TraceError> {
        let transforms = Transforms {
            speed_up: Some(self.transforms.speed_up.unwrap_or(1.0) * multiplier),
            ..self.transforms
        };
        transforms.apply(self.raw.clone(), &mut String::new())
    }
}

/// One simulation a search asks for.
#[derive(Clone, Copy, Debug)]
pub struct ProbeRequest<'a> {
    /// The policy.
    pub policy: PolicyKind,
    /// The arrival-rate multiplier `trace` was made with.
    pub multiplier: f64,
    /// The workload at that multiplier.
    pub trace: &'a Trace,
    /// The fleet (`config.workers` is the probed count).
    pub config: &'a SimConfig,
}

/// One policy's capacity.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PolicyCapacity {
    /// The policy (the key of `capacity.json`'s `policies`).
    #[serde(skip)]
    pub policy: String,
    /// The highest multiplier measured passing on the configured workers (none when even
    /// the lowest probed fails).
    pub max_multiplier: Option<f64>,
    /// Whether `max_multiplier` is the search's upper bound (the capacity is at least that).
    pub at_bound: bool,
    /// Arrival rate at `max_multiplier`: requests over the span of their arrivals.
    pub requests_per_s: Option<f64>,
    /// SLO attainment measured at `max_multiplier`.
    pub attainment: Option<f64>,
    /// The fewest workers measured passing at 1× (none when even the most probed fail).
    pub workers_needed: Option<u32>,
    /// Simulations run for this policy (both searches; a point both ask for runs once).
    pub probes: usize,
    /// The rate search's probes on the configured workers, in order.
    pub rate: Found<f64>,
    /// The worker search's probes at 1×, in order.
    pub workers: Found<u32>,
}

/// Every policy's capacity, as written to `capacity.json`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Capacity {
    /// The targets.
    pub spec: CapacitySpec,
    /// The SLO a request must meet.
    pub slo: Slo,
    /// Workers of the rate search.
    pub workers: u32,
    /// Requests in the workload.
    pub requests: usize,
    /// The workload's arrival rate at 1×.
    pub requests_per_s: Option<f64>,
    /// By policy, in the order given.
    #[serde(serialize_with = "by_name")]
    pub policies: Vec<PolicyCapacity>,
}

fn by_name<S: Serializer>(policies: &[PolicyCapacity], s: S) -> Result<S::Ok, S::Error> {
    s.collect_map(policies.iter().map(|p| (&p.policy, p)))
}

/// Requests over the span of their arrivals (None for a single instant).
pub fn arrival_rate(trace: &Trace) -> Option<f64> {
    let span = trace.duration_s();
    (span > 0.0).then(|| trace.len() as f64 / span)
}

/// Runs both searches for every policy, `jobs` policies at a time (each search is sequential;
/// probes are deterministic, so the answers do not depend on `jobs`).
pub fn study<P>(
    workload: &Workload,
    config: &SimConfig,
    policies: &[PolicyKind],
    spec: &CapacitySpec,
    jobs: usize,
    probe: P,
) -> anyhow::Result<Capacity>
where
    P: Fn(ProbeRequest<'_>) -> anyhow::Result<f64> + Sync,
{
    let one = |policy: &PolicyKind| policy_capacity(workload, config, *policy, spec, &probe);
    let mut out = Vec::with_capacity(policies.len());
    for chunk in policies.chunks(jobs.max(1)) {
        let results: Vec<anyhow::Result<PolicyCapacity>> = std::thread::scope(|s| {
            let handles: Vec<_> = chunk.iter().map(|p| s.spawn(move || one(p))).collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| Err(anyhow::anyhow!("a capacity search panicked")))
                })
                .collect()
        });
        for r in results {
            out.push(r?);
        }
    }
    let base = workload.at(1.0)?;
    Ok(Capacity {
        spec: *spec,
        slo: config.slo,
        workers: config.workers,
        requests: base.len(),
        requests_per_s: arrival_rate(&base),
        policies: out,
    })
}

/// One policy's two searches. A probe both searches ask for (1× on the configured workers)
/// runs once.
fn policy_capacity<P>(
    workload: &Workload,
    config: &SimConfig,
    policy: PolicyKind,
    spec: &CapacitySpec,
    probe: &P,
) -> anyhow::Result<PolicyCapacity>
where
    P: Fn(ProbeRequest<'_>) -> anyhow::Result<f64>,
{
    let mut seen: HashMap<(u64, u32), f64> = HashMap::new();
    let mut measure = |multiplier: f64, workers: u32| -> anyhow::Result<f64> {
        if let Some(&a) = seen.get(&(multiplier.to_bits(), workers)) {
            return Ok(a);
        }
        let trace = workload.at(multiplier)?;
        let config = SimConfig {
            workers,
            ..config.clone()
        };
        config.validate()?;
        let a = probe(ProbeRequest {
            policy,
            multiplier,
            trace: &trace,
            config: &config,
        })?;
        seen.insert((multiplier.to_bits(), workers), a);
        Ok(a)
    };
    let rate = max_multiplier(&spec.rate_search(), |m| measure(m, config.workers))?;
    let workers = min_workers(spec.attainment, spec.max_workers, |n| measure(1.0, n))?;
    let requests_per_s = match rate.best {
        Some(m) => arrival_rate(&workload.at(m)?),
        None => None,
    };
    Ok(PolicyCapacity {
        policy: policy.to_string(),
        max_multiplier: rate.best,
        at_bound: rate.best.is_some_and(|m| m >= spec.max_multiplier),
        requests_per_s,
        attainment: rate.best_probe().map(|p| p.attainment),
        workers_needed: workers.best,
        probes: seen.len(),
        rate,
        workers,
    })
}

impl Capacity {
    /// Pretty JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_else(|_| "{}".to_string())
    }

    /// The Markdown table: one row per policy.
    pub fn table(&self) -> String {
        let mut out = String::from(
            "| policy | max rate multiplier | requests/s at it | SLO attainment at it | workers needed at 1× | probes run |\n|---|---:|---:|---:|---:|---:|\n",
        );
        for p in &self.policies {
            let multiplier = match p.max_multiplier {
                None => format!("< 1/{}×", self.spec.max_multiplier),
                Some(m) if p.at_bound => format!("≥ {}", fmt_multiplier(m)),
                Some(m) => fmt_multiplier(m),
            };
            let workers = p
                .workers_needed
                .map_or_else(|| format!("> {}", self.spec.max_workers), |n| n.to_string());
            out.push_str(&format!(
                "| {} | {multiplier} | {} | {} | {workers} | {} |\n",
                p.policy,
                p.requests_per_s.map_or("–".into(), |r| format!("{r:.2}")),
                p.attainment
                    .map_or("–".into(), |a| format!("{:.1} %", a * 100.0)),
                p.probes,
            ));
        }
        out
    }

    /// The chart's lines: SLO attainment against the multiplier, one per policy from its rate
    /// probes (sorted by multiplier), and the target as a flat line across them.
    pub fn attainment_series(&self) -> Vec<Series> {
        let mut series: Vec<Series> = self
            .policies
            .iter()
            .map(|p| {
                let mut points: Vec<(f64, f64)> =
                    p.rate.probes.iter().map(|x| (x.at, x.attainment)).collect();
                points.sort_by(|a, b| a.0.total_cmp(&b.0));
                Series {
                    name: p.policy.clone(),
                    points,
                }
            })
            .collect();
        let xs = series.iter().flat_map(|s| s.points.iter().map(|p| p.0));
        let (lo, hi) = xs.fold((f64::INFINITY, 0.0f64), |(lo, hi), x| {
            (lo.min(x), hi.max(x))
        });
        if lo <= hi {
            series.push(Series {
                name: format!("target {:.0} %", self.spec.attainment * 100.0),
                points: vec![(lo, self.spec.attainment), (hi, self.spec.attainment)],
            });
        }
        series
    }
}

/// A multiplier to 3 significant decimals (2.000, 0.031).
fn fmt_multiplier(m: f64) -> String {
    if m >= 100.0 {
        format!("{m:.0}×")
    } else if m >= 0.1 {
        format!("{m:.3}×")
    } else {
        format!("{m:.5}×")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::TraceRequest;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// 101 requests one second apart.
    fn workload(speed_up: Option<f64>) -> Workload {
        let requests = (0..=100u32)
            .map(|i| TraceRequest {
                arrival_s: f64::from(i),
                input_tokens: 64,
                output_tokens: 4,
                hash_ids: vec![u64::from(i)],
                block_tokens: 64,
                session: None,
            })
            .collect();
        Workload {
            raw: Trace::new(requests),
            transforms: Transforms {
                speed_up,
                ..Transforms::default()
            },
        }
    }

    #[test]
    fn the_multiplier_scales_the_commands_own_speed_up() {
        let w = workload(Some(2.0));
        let rate = |m: f64| arrival_rate(&w.at(m).unwrap()).unwrap();
        // 101 requests over 100 s, sped up 2× by the command, then 3× by the multiplier.
        assert!((rate(1.0) - 2.02).abs() < 1e-9, "{}", rate(1.0));
        assert!((rate(3.0) - 6.06).abs() < 1e-9, "{}", rate(3.0));
        assert!(w.at(0.0).is_err());
    }

    /// A fake fleet whose load is multiplier × 8 / workers and passes at load 3 or less: the
    /// rate capacity on 4 workers is 1.5×, and 3 workers carry 1×. The point both searches
    /// share (1× on 4 workers) is simulated once.
    #[test]
    fn both_searches_on_a_fake_fleet() {
        let calls = AtomicUsize::new(0);
        let probe = |p: ProbeRequest<'_>| {
            calls.fetch_add(1, Ordering::Relaxed);
            let load = p.multiplier * 8.0 / f64::from(p.config.workers);
            Ok(if load <= 3.0 { 0.95 } else { 0.5 })
        };
        let spec = CapacitySpec {
            attainment: 0.9,
            precision: 0.02,
            max_multiplier: 64.0,
            max_workers: 64,
        };
        let config = SimConfig::default();
        let policies = [PolicyKind::KvAware, PolicyKind::RoundRobin];
        let w = workload(None);
        let c = study(&w, &config, &policies, &spec, 2, probe).unwrap();
        let kv = &c.policies[0];
        let m = kv.max_multiplier.unwrap();
        assert!((1.5 / 1.02..=1.5).contains(&m), "{m}");
        assert_eq!(kv.workers_needed, Some(3));
        assert!(!kv.at_bound);
        let probed = kv.rate.probes.len() + kv.workers.probes.len();
        assert_eq!(kv.probes, probed - 1, "1× on 4 workers is shared");
        assert_eq!(calls.load(Ordering::Relaxed), 2 * kv.probes);
        assert_eq!(
            c.policies[1],
            PolicyCapacity {
                policy: "round_robin".into(),
                ..kv.clone()
            }
        );
        assert!(c.requests_per_s.is_some_and(|r| (r - 1.01).abs() < 1e-9));
        let json: serde_json::Value = serde_json::from_str(&c.to_json()).unwrap();
        assert_eq!(json["policies"]["kv_aware"]["workers_needed"], 3);
        assert_eq!(
            json["policies"]["kv_aware"]["max_multiplier"].as_f64(),
            Some(m)
        );
        let table = c.table();
        assert!(
            table.contains("| kv_aware | 1.4") && table.contains("| 3 |"),
            "{table}"
        );
        let series = c.attainment_series();
        assert_eq!(series.len(), 3);
        assert_eq!(series[2].name, "target 90 %");
    }

    #[test]
    fn a_policy_beyond_the_bounds_is_reported_as_such() {
        let spec = CapacitySpec {
            attainment: 0.9,
            precision: 0.02,
            max_multiplier: 8.0,
            max_workers: 4,
        };
        let config = SimConfig::default();
        let w = workload(None);
        let all = study(&w, &config, &[PolicyKind::KvAware], &spec, 1, |_| Ok(1.0)).unwrap();
        assert!(all.policies[0].at_bound);
        assert_eq!(all.policies[0].workers_needed, Some(1));
        assert!(all.table().contains("≥ 8.000×"), "{}", all.table());
        let none = study(&w, &config, &[PolicyKind::KvAware], &spec, 1, |_| Ok(0.0)).unwrap();
        assert_eq!(none.policies[0].max_multiplier, None);
        assert_eq!(none.policies[0].workers_needed, None);
        assert!(none.table().contains("< 1/8×") && none.table().contains("> 4"));
        let err = study(&w, &config, &[PolicyKind::KvAware], &spec, 1, |_| {
            anyhow::bail!("engine failed")
        });
        assert!(err.is_err());
    }
}
