//! SVG charts for reports: latency CDFs of several runs on one chart, and load over time per
//! worker. Generic over named series so the real-time bench and the simulator draw the same
//! pictures from their own numbers.

use std::path::Path;

use plotters::prelude::*;
use thiserror::Error;

use super::record::RequestRecord;

/// Why a chart could not be drawn.
#[derive(Debug, Error)]
pub enum PlotError {
    /// The plotting backend failed.
    #[error("cannot draw chart: {0}")]
    Draw(String),
    /// The file could not be written.
    #[error("cannot write chart {path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
}

/// One named line on a chart.
#[derive(Clone, Debug, PartialEq)]
pub struct Series {
    /// Legend label.
    pub name: String,
    /// Points, in drawing order.
    pub points: Vec<(f64, f64)>,
}

/// Labels of a chart.
#[derive(Clone, Debug)]
pub struct ChartSpec<'a> {
    /// Title above the chart.
    pub title: &'a str,
    /// X axis label.
    pub x_label: &'a str,
    /// Y axis label.
    pub y_label: &'a str,
}

/// The empirical CDF of `samples` as points (value, fraction ≤ value); NaNs are dropped.
pub fn cdf_points(samples: impl IntoIterator<Item = f64>) -> Vec<(f64, f64)> {
    let mut v: Vec<f64> = samples.into_iter().filter(|x| !x.is_nan()).collect();
    v.sort_by(f64::total_cmp);
    let n = v.len() as f64;
    v.iter()
        .enumerate()
        .map(|(i, &x)| (x, (i + 1) as f64 / n))
        .collect()
}

/// Requests in flight per worker, sampled every `step_s` seconds, from `(worker, start, end)`
/// intervals. One series per worker, sorted by name.
pub fn in_flight_over_time(
    intervals: impl IntoIterator<Item = (String, f64, f64)>,
    step_s: f64,
) -> Vec<Series> {
    let mut by_worker: std::collections::BTreeMap<String, Vec<(f64, f64)>> = Default::default();
    let mut horizon: f64 = 0.0;
    for (w, start, end) in intervals {
        horizon = horizon.max(end);
        by_worker.entry(w).or_default().push((start, end));
    }
    if step_s.is_nan() || step_s <= 0.0 {
        return Vec::new();
    }
    let steps = (horizon / step_s).ceil() as usize + 1;
    by_worker
        .into_iter()
        .map(|(name, spans)| {
            // Difference array: +1 at the first sample inside the span, -1 after its last.
            let mut delta = vec![0i64; steps + 1];
            for (start, end) in spans {
                let a = (start / step_s).ceil() as usize;
                let b = ((end / step_s).floor() as usize + 1).min(steps);
                if a < b {
                    delta[a] += 1;
                    delta[b] -= 1;
                }
            }
            let mut level = 0i64;
            let points = (0..steps)
                .map(|i| {
                    level += delta[i];
                    (i as f64 * step_s, level as f64)
                })
                .collect();
            Series { name, points }
        })
        .collect()
}

/// The per-worker in-flight series of a replay's records.
pub fn records_load(records: &[RequestRecord], step_s: f64) -> Vec<Series> {
    in_flight_over_time(
        records.iter().map(|r| {
            let w = r.worker.clone().unwrap_or_else(|| "unknown".to_string());
            (w, r.start_s, r.end_s())
        }),
        step_s,
    )
}

/// Draws `series` as lines on one chart and returns the SVG text.
pub fn line_chart_svg(spec: &ChartSpec<'_>, series: &[Series]) -> Result<String, PlotError> {
    let draw = |e: &dyn std::fmt::Display| PlotError::Draw(e.to_string());
    let (mut x_max, mut y_max) = (0.0f64, 0.0f64);
    let (mut x_min, mut y_min) = (f64::INFINITY, 0.0f64);
    for p in series.iter().flat_map(|s| &s.points) {
        x_min = x_min.min(p.0);
        x_max = x_max.max(p.0);
        y_min = y_min.min(p.1);
        y_max = y_max.max(p.1);
    }
    if !x_min.is_finite() || x_min >= x_max {
        x_min = x_min.min(0.0).min(x_max);
        if x_min.is_infinite() {
            x_min = 0.0;
        }
        x_max = x_min + 1.0;
    }
    if y_max <= y_min {
        y_max = y_min + 1.0;
    }
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (900, 560)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| draw(&e))?;
        let mut chart = ChartBuilder::on(&root)
            .caption(spec.title, ("sans-serif", 22))
            .margin(16)
            .x_label_area_size(44)
            .y_label_area_size(64)
            .build_cartesian_2d(x_min..x_max * 1.02, y_min..y_max * 1.05)
            .map_err(|e| draw(&e))?;
        chart
            .configure_mesh()
            .x_desc(spec.x_label)
            .y_desc(spec.y_label)
            .draw()
            .map_err(|e| draw(&e))?;
        for (i, s) in series.iter().enumerate() {
            let color = Palette99::pick(i).to_rgba();
            chart
                .draw_series(LineSeries::new(
                    s.points.iter().copied(),
                    color.stroke_width(2),
                ))
                .map_err(|e| draw(&e))?
                .label(s.name.clone())
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2))
                });
        }
        if series.len() > 1 || series.first().is_some_and(|s| !s.name.is_empty()) {
            chart
                .configure_series_labels()
                .background_style(WHITE.mix(0.85))
                .border_style(BLACK)
                .position(SeriesLabelPosition::LowerRight)
                .draw()
                .map_err(|e| draw(&e))?;
        }
        root.present().map_err(|e| draw(&e))?;
    }
    Ok(svg)
}

/// Draws `series` as lines and writes the SVG to `path`.
pub fn line_chart(path: &Path, spec: &ChartSpec<'_>, series: &[Series]) -> Result<(), PlotError> {
    let svg = line_chart_svg(spec, series)?;
    std::fs::write(path, svg).map_err(|source| PlotError::Io {
        path: path.display().to_string(),
        source,
    })
}

/// A TTFT CDF chart with one line per named run; samples in seconds, drawn in milliseconds.
pub fn ttft_cdf_chart(path: &Path, runs: &[(String, Vec<f64>)]) -> Result<(), PlotError> {
    let series: Vec<Series> = runs
        .iter()
        .map(|(name, samples)| Series {
            name: name.clone(),
            points: cdf_points(samples.iter().map(|s| s * 1e3)),
        })
        .collect();
    let spec = ChartSpec {
        title: "Time to first token (CDF)",
        x_label: "TTFT (ms)",
        y_label: "fraction of requests",
    };
    line_chart(path, &spec, &series)
}

/// A per-worker in-flight requests chart.
pub fn load_chart(path: &Path, series: &[Series]) -> Result<(), PlotError> {
    let spec = ChartSpec {
        title: "Requests in flight per worker",
        x_label: "time (s)",
        y_label: "requests in flight",
    };
    line_chart(path, &spec, series)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cdf_ends_at_one() {
        let p = cdf_points([3.0, 1.0, 2.0]);
        assert_eq!(p, vec![(1.0, 1.0 / 3.0), (2.0, 2.0 / 3.0), (3.0, 1.0)]);
    }

    #[test]
    fn in_flight_counts_overlaps() {
        let s = in_flight_over_time(
            [
                ("a".to_string(), 0.0, 2.0),
                ("a".to_string(), 1.0, 3.0),
                ("b".to_string(), 0.5, 0.7),
            ],
            1.0,
        );
        assert_eq!(s[0].name, "a");
        let levels: Vec<f64> = s[0].points.iter().map(|p| p.1).collect();
        assert_eq!(levels, vec![1.0, 2.0, 2.0, 1.0]);
        // b's span holds no sample instant.
        assert!(s[1].points.iter().all(|p| p.1 == 0.0));
    }

    #[test]
    fn svg_has_every_series_name() {
        let svg = line_chart_svg(
            &ChartSpec {
                title: "t",
                x_label: "x",
                y_label: "y",
            },
            &[
                Series {
                    name: "kv_aware".into(),
                    points: vec![(0.0, 0.0), (1.0, 1.0)],
                },
                Series {
                    name: "round_robin".into(),
                    points: vec![(0.0, 0.0), (2.0, 1.0)],
                },
            ],
        )
        .unwrap();
        assert!(svg.starts_with("<svg"));
        assert!(svg.contains("kv_aware") && svg.contains("round_robin"));
    }
}
