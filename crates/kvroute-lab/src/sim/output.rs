//! Writing a run's evidence: `results.json`, `summary.md`, `ttft_cdf.svg` and one
//! `load_<policy>.svg` per policy, with the charts `report::plot` draws for real-time runs;
//! for `--capacity`, `capacity.md`, `capacity.json` and `capacity.svg`.

use std::path::Path;

use anyhow::Context;

use crate::report::plot::{
    ChartSpec, Series, cdf_points, in_flight_over_time, line_chart, load_chart,
};

use super::capacity::Capacity;
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

/// The TTFT CDF of `run` in milliseconds, thinned to about `points` points (keeping the
/// last, so the curve reaches 1) to keep committed SVGs small.
pub fn ttft_cdf(name: &str, run: &PolicyRun, points: usize) -> Series {
    let all = cdf_points(run.records.iter().filter_map(|x| x.ttft()).map(|s| s * 1e3));
    let every = all.len().div_ceil(points.max(1)).max(1);
    let last = all.len().saturating_sub(1);
    Series {
        name: name.to_string(),
        points: all
            .into_iter()
            .enumerate()
            .filter(|(i, _)| i % every == 0 || *i == last)
            .map(|(_, p)| p)
            .collect(),
    }
}

/// The Markdown table of `results` (policies in run order, then the references, oracle last);
/// `wall_s` gives the host seconds each policy took, when known.
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

/// Writes `records_<policy>.jsonl` of each of `runs` into `dir`: one JSON object per request,
/// in trace order.
pub fn write_records(dir: &Path, runs: &[PolicyRun]) -> anyhow::Result<()> {
    use std::io::Write;
    for run in runs {
        let path = dir.join(format!("records_{}.jsonl", run.policy));
        let file = std::fs::File::create(&path)
            .with_context(|| format!("cannot write {}", path.display()))?;
        let mut out = std::io::BufWriter::new(file);
        for r in &run.records {
            serde_json::to_writer(&mut out, r)?;
            out.write_all(b"\n")?;
        }
        out.flush()
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    Ok(())
}

/// Writes every output file into `dir` (created if missing): `references` (the pooled cache,
/// the oracle) join the TTFT chart but have no per-worker load.
pub fn write_all(
    dir: &Path,
    header: &str,
    results: &Results,
    runs: &[PolicyRun],
    references: &[&PolicyRun],
    wall_s: &[(String, f64)],
) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let json = dir.join("results.json");
    std::fs::write(&json, results.to_json())
        .with_context(|| format!("cannot write {}", json.display()))?;
    let md = dir.join("summary.md");
    let mut text = format!("{header}\n{}", summary_table(results, wall_s));
    if let Some(parts) = super::unqueued::breakdown(results) {
        text.push_str(&format!("\nWhere the mean TTFT goes:\n\n{parts}"));
    }
    std::fs::write(&md, text).with_context(|| format!("cannot write {}", md.display()))?;
    let mut cdf: Vec<Series> = runs.iter().map(|r| ttft_cdf(&r.policy, r, 500)).collect();
    cdf.extend(references.iter().map(|r| ttft_cdf(&r.policy, r, 500)));
    let spec = ChartSpec {
        title: "Time to first token (CDF)",
        x_label: "TTFT (ms)",
        y_label: "fraction of requests",
    };
    line_chart(&dir.join("ttft_cdf.svg"), &spec, &cdf)?;
    for run in runs {
        load_chart(
            &dir.join(format!("load_{}.svg", run.policy)),
            &load_series(run, 300),
        )?;
    }
    Ok(())
}

/// Writes a capacity study into `dir` (created if missing): `capacity.md` (`header` and the
/// table), `capacity.json`, and `capacity.svg`, SLO attainment against the rate multiplier.
pub fn write_capacity(dir: &Path, header: &str, capacity: &Capacity) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let json = dir.join("capacity.json");
    std::fs::write(&json, capacity.to_json())
        .with_context(|| format!("cannot write {}", json.display()))?;
    let md = dir.join("capacity.md");
    std::fs::write(&md, format!("{header}\n{}", capacity.table()))
        .with_context(|| format!("cannot write {}", md.display()))?;
    let spec = ChartSpec {
        title: "SLO attainment vs arrival rate",
        x_label: "arrival-rate multiplier (× the trace's rate)",
        y_label: "fraction of requests within the SLO",
    };
    line_chart(
        &dir.join("capacity.svg"),
        &spec,
        &capacity.attainment_series(),
    )?;
    Ok(())
}
