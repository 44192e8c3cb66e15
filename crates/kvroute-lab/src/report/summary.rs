//! Turning records into numbers people compare: SLO attainment, goodput, per-worker spread;
//! as a JSON result file, a Markdown summary and a side-by-side table.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};
use thiserror::Error;

use super::record::RequestRecord;
use super::slo::Slo;
use super::stats::Stats;

/// Why a result file could not be written or read.
#[derive(Debug, Error)]
pub enum ReportError {
    /// The file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file is not a result.
    #[error("{path} is not a kvroute bench result: {reason}")]
    Parse {
        /// The file.
        path: String,
        /// What serde said.
        reason: String,
    },
}

/// How much the client itself cost and whether it kept to the schedule.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ClientOverhead {
    /// CPU seconds of the client thread, when measurable.
    pub cpu_s: Option<f64>,
    /// Client CPU per request, microseconds.
    pub cpu_per_request_us: Option<f64>,
    /// Requests sent more than 10 ms after their due time.
    pub late_sends: usize,
    /// Requests that waited for a concurrency slot.
    pub waited_for_slot: usize,
    /// Largest sending delay, seconds.
    pub max_send_delay_s: f64,
}

/// Everything a run's summary says.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    /// Requests in the run.
    pub requests: usize,
    /// Requests that succeeded.
    pub ok: usize,
    /// Requests that failed.
    pub errors: usize,
    /// Failures by kind (`http_500`, `connect`, `timeout`, `stream`).
    pub errors_by_kind: BTreeMap<String, usize>,
    /// Time to first token of successful requests.
    pub ttft_s: Stats,
    /// Per-request mean inter-token latency (time per output token) of successful requests.
    pub itl_s: Stats,
    /// End-to-end latency of successful requests.
    pub e2e_s: Stats,
    /// The targets used for attainment and goodput.
    pub slo: Slo,
    /// Fraction of all requests that succeeded and met both targets.
    pub slo_attainment: f64,
    /// Requests per second that met both targets.
    pub goodput_rps: f64,
    /// Requests completed per second over the run.
    pub throughput_rps: f64,
    /// Generated tokens per second over the run.
    pub output_tokens_per_s: f64,
    /// Run length, seconds (first send to last response end).
    pub duration_s: f64,
    /// Cached prompt tokens over prompt tokens, among requests whose server reported it.
    pub cache_hit_rate: Option<f64>,
    /// Requests per worker (`x-kvroute-worker`; `unknown` when absent).
    pub per_worker: BTreeMap<String, usize>,
}

impl Summary {
    /// The summary of `records` over a run of `duration_s` seconds.
    pub fn from_records(records: &[RequestRecord], slo: Slo, duration_s: f64) -> Summary {
        let ok: Vec<&RequestRecord> = records.iter().filter(|r| r.outcome.is_ok()).collect();
        let mut errors_by_kind = BTreeMap::new();
        for r in records.iter().filter(|r| !r.outcome.is_ok()) {
            *errors_by_kind.entry(r.outcome.label()).or_insert(0) += 1;
        }
        let mut per_worker = BTreeMap::new();
        for r in records {
            let w = r.worker.clone().unwrap_or_else(|| "unknown".to_string());
            *per_worker.entry(w).or_insert(0) += 1;
        }
        let met = records
            .iter()
            .filter(|r| r.meets(slo.ttft_s, slo.e2e_s))
            .count();
        let per_s = |n: f64| {
            if duration_s > 0.0 {
                n / duration_s
            } else {
                0.0
            }
        };
        let (cached, prompt) = records
            .iter()
            .filter_map(|r| {
                r.cached_tokens
                    .map(|c| (u64::from(c), u64::from(r.prompt_tokens)))
            })
            .fold((0u64, 0u64), |(c, p), (dc, dp)| (c + dc, p + dp));
        Summary {
            requests: records.len(),
            ok: ok.len(),
            errors: records.len() - ok.len(),
            errors_by_kind,
            ttft_s: Stats::of(ok.iter().filter_map(|r| r.ttft_s)),
            itl_s: Stats::of(ok.iter().filter_map(|r| r.itl_mean_s)),
            e2e_s: Stats::of(ok.iter().map(|r| r.e2e_s)),
            slo,
            slo_attainment: if records.is_empty() {
                0.0
            } else {
                met as f64 / records.len() as f64
            },
            goodput_rps: per_s(met as f64),
            throughput_rps: per_s(ok.len() as f64),
            output_tokens_per_s: per_s(ok.iter().map(|r| f64::from(r.completion_tokens)).sum()),
            duration_s,
            cache_hit_rate: (prompt > 0).then(|| cached as f64 / prompt as f64),
            per_worker,
        }
    }
}

/// A run's result file: what was run, its summary and every record.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RunResult {
    /// Name shown in comparisons (e.g. the policy).
    pub name: String,
    /// Where the requests went.
    pub target: String,
    /// Which workload (trace path or synthetic kind with its parameters).
    pub workload: String,
    /// The summary.
    pub summary: Summary,
    /// The client's own cost.
    #[serde(default)]
    pub client: ClientOverhead,
    /// Every request's measurements.
    pub records: Vec<RequestRecord>,
}

impl RunResult {
    /// Writes the result as pretty JSON.
    pub fn write_json(&self, path: &Path) -> Result<(), ReportError> {
        let text = serde_json::to_string_pretty(self).map_err(|e| ReportError::Parse {
            path: path.display().to_string(),
            reason: e.to_string(),
        })?;
        std::fs::write(path, text).map_err(|source| ReportError::Io {
            path: path.display().to_string(),
            source,
        })
    }

    /// Reads a result written by [`RunResult::write_json`].
    pub fn read_json(path: &Path) -> Result<RunResult, ReportError> {
        let text = std::fs::read_to_string(path).map_err(|source| ReportError::Io {
            path: path.display().to_string(),
            source,
        })?;
        serde_json::from_str(&text).map_err(|e| ReportError::Parse {
            path: path.display().to_string(),
            reason: e.to_string(),
        })
    }

    /// A Markdown summary of the run.
    pub fn to_markdown(&self) -> String {
        let s = &self.summary;
        let mut out = format!("# kvroute bench: {}\n\n", self.name);
        out.push_str(&format!(
            "- target: `{}`\n- workload: {}\n- requests: {} ({} ok, {} errors)\n- duration: {:.1} s, throughput {:.2} req/s, {:.0} output tok/s\n",
            self.target, self.workload, s.requests, s.ok, s.errors, s.duration_s, s.throughput_rps, s.output_tokens_per_s
        ));
        out.push_str(&format!(
            "- SLO (TTFT {}, E2E {}): attainment {:.1} %, goodput {:.2} req/s\n",
            fmt_target(s.slo.ttft_s),
            fmt_target(s.slo.e2e_s),
            s.slo_attainment * 100.0,
            s.goodput_rps
        ));
        if let Some(h) = s.cache_hit_rate {
            out.push_str(&format!("- cached prompt tokens: {:.1} %\n", h * 100.0));
        }
        if !s.errors_by_kind.is_empty() {
            let kinds: Vec<String> = s
                .errors_by_kind
                .iter()
                .map(|(k, n)| format!("{k}: {n}"))
                .collect();
            out.push_str(&format!("- errors: {}\n", kinds.join(", ")));
        }
        let c = &self.client;
        out.push_str(&format!(
            "- client: {} late sends (> 10 ms), {} waited for a slot, max send delay {:.1} ms{}\n",
            c.late_sends,
            c.waited_for_slot,
            c.max_send_delay_s * 1e3,
            c.cpu_per_request_us
                .map(|us| format!(", {us:.0} µs CPU per request"))
                .unwrap_or_default()
        ));
        out.push_str(
            "\n| metric (ms) | mean | p50 | p90 | p99 | max |\n|---|---:|---:|---:|---:|---:|\n",
        );
        for (name, st) in [("TTFT", &s.ttft_s), ("ITL", &s.itl_s), ("E2E", &s.e2e_s)] {
            out.push_str(&format!(
                "| {name} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} |\n",
                st.mean * 1e3,
                st.p50 * 1e3,
                st.p90 * 1e3,
                st.p99 * 1e3,
                st.max * 1e3
            ));
        }
        out.push_str("\n| worker | requests |\n|---|---:|\n");
        for (w, n) in &s.per_worker {
            out.push_str(&format!("| {w} | {n} |\n"));
        }
        out
    }
}

fn fmt_target(t: Option<f64>) -> String {
    t.map_or_else(|| "none".to_string(), |t| format!("{t} s"))
}

/// A side-by-side Markdown table of several runs, one column per run.
pub fn compare(results: &[RunResult]) -> String {
    let mut out = String::from("| metric |");
    let mut rule = String::from("|---|");
    for r in results {
        out.push_str(&format!(" {} |", r.name.replace('|', "\\|")));
        rule.push_str("---:|");
    }
    out.push('\n');
    out.push_str(&rule);
    out.push('\n');
    let ms = |x: f64| format!("{:.1}", x * 1e3);
    type Row = (&'static str, fn(&Summary) -> f64, bool);
    let rows: [Row; 12] = [
        ("TTFT mean (ms)", |s| s.ttft_s.mean, true),
        ("TTFT p50 (ms)", |s| s.ttft_s.p50, true),
        ("TTFT p90 (ms)", |s| s.ttft_s.p90, true),
        ("TTFT p99 (ms)", |s| s.ttft_s.p99, true),
        ("ITL mean (ms)", |s| s.itl_s.mean, true),
        ("ITL p99 (ms)", |s| s.itl_s.p99, true),
        ("E2E p50 (ms)", |s| s.e2e_s.p50, true),
        ("E2E p99 (ms)", |s| s.e2e_s.p99, true),
        ("SLO attainment (%)", |s| s.slo_attainment * 100.0, false),
        ("goodput (req/s)", |s| s.goodput_rps, false),
        ("throughput (req/s)", |s| s.throughput_rps, false),
        (
            "cached tokens (%)",
            |s| s.cache_hit_rate.unwrap_or(0.0) * 100.0,
            false,
        ),
    ];
    let mut line = |label: &str, cell: &dyn Fn(&RunResult) -> String| {
        out.push_str(&format!("| {label} |"));
        for r in results {
            out.push_str(&format!(" {} |", cell(r)));
        }
        out.push('\n');
    };
    line("requests", &|r| r.summary.requests.to_string());
    line("errors", &|r| r.summary.errors.to_string());
    for (label, get, is_time) in rows {
        line(label, &|r| {
            let v = get(&r.summary);
            if is_time { ms(v) } else { format!("{v:.2}") }
        });
    }
    line("late sends", &|r| r.client.late_sends.to_string());
    out
}
