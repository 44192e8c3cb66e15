//! Writing a run's evidence: `results.json`, `summary.md`, `ttft_cdf.svg` and one
//! `load_<policy>.svg` per policy, with the charts `bench::plot` draws for real-time runs.

use std::path::Path;

use anyhow::Context;

use crate::bench::plot::{Series, in_flight_over_time, load_chart, ttft_cdf_chart};

use super::results::{PolicyResult, Results};
use super::simulation::PolicyRun;

/// Per-worker requests in flight over time (arrival to end), one series per worker.
pub fn load_series(run: &PolicyRun, points: usize) -> Vec<Series> {
    let intervals: Vec<(String, f64, f64)> = run
        .records
        .iter()
        .filter_map(|r| Some((format!("w{}", r.worker?), r.arrival, r.end?)))
        .collect();
    let horizon = intervals.iter().map(|i| i.2).fold(0.0, f64::max);
    let step = (horizon / points.max(1) as f64).max(1e-3);
    in_flight_over_time(intervals, step)
}

/// The Markdown table of `results` (policies in run order, oracle last); `wall_s` gives the
/// host seconds each policy took, when known.
pub fn summary_table(results: &Results, wall_s: &[(String, f64)]) -> String {
    let mut out = String::from(
        "| policy | TTFT p50 (s) | TTFT p90 (s) | TTFT p99 (s) | E2E p50 (s) | E2E p99 (s) | hit rate | preemptions | SLO attainment | errors | TTFT p50 / oracle | TTFT p90 / oracle |",
    );
    let timed = !wall_s.is_empty();
    if timed {
        out.push_str(" sim time (s) |");
    }
    out.push_str("\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    if timed {
        out.push_str("---:|");
    }
    out.push('\n');
    for name in results.policies.keys() {
        let Some(r) = results.get(name) else { continue };
        out.push_str(&row(name, &r));
        if timed {
            let t = wall_s.iter().find(|(n, _)| n == name).map(|x| x.1);
            out.push_str(&t.map_or(" – |".to_string(), |t| format!(" {t:.2} |")));
        }
        out.push('\n');
    }
    out
}

fn row(name: &str, r: &PolicyResult) -> String {
    let ratio = |x: Option<f64>| x.map_or("–".to_string(), |v| format!("{v:.2}"));
    format!(
        "| {name} | {:.3} | {:.3} | {:.3} | {:.2} | {:.2} | {:.1} % | {} | {:.1} % | {} | {} | {} |",
        r.ttft_s.p50,
        r.ttft_s.p90,
        r.ttft_s.p99,
        r.e2e_s.p50,
        r.e2e_s.p99,
        r.hit_rate * 100.0,
        r.preemptions,
        r.slo_attainment * 100.0,
        r.errors,
        ratio(r.ttft_p50_vs_oracle),
        ratio(r.ttft_p90_vs_oracle),
    )
}

/// Writes every output file into `dir` (created if missing).
pub fn write_all(
    dir: &Path,
    header: &str,
    results: &Results,
    runs: &[PolicyRun],
    oracle: &PolicyRun,
    wall_s: &[(String, f64)],
) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let json = dir.join("results.json");
    std::fs::write(&json, results.to_json())
        .with_context(|| format!("cannot write {}", json.display()))?;
    let md = dir.join("summary.md");
    let text = format!("{header}\n{}", summary_table(results, wall_s));
    std::fs::write(&md, text).with_context(|| format!("cannot write {}", md.display()))?;
    let mut cdf: Vec<(String, Vec<f64>)> = runs
        .iter()
        .map(|r| (r.policy.clone(), r.records.iter().filter_map(|x| x.ttft()).collect()))
        .collect();
    cdf.push((
        "oracle".to_string(),
        oracle.records.iter().filter_map(|x| x.ttft()).collect(),
    ));
    ttft_cdf_chart(&dir.join("ttft_cdf.svg"), &cdf)?;
    for run in runs {
        load_chart(
            &dir.join(format!("load_{}.svg", run.policy)),
            &load_series(run, 300),
        )?;
    }
    Ok(())
}
