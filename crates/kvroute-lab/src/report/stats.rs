//! Latency distributions: the percentiles every report and comparison quotes.
//!
//! Percentiles are exact (sort, nearest rank): runs are at most tens of thousands of
//! requests, and exact numbers make two reports of the same records identical.

use serde::{Deserialize, Serialize};

/// Distribution summary of one latency, seconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Stats {
    /// Number of samples.
    pub count: usize,
    /// Arithmetic mean.
    pub mean: f64,
    /// Median.
    pub p50: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Largest sample.
    pub max: f64,
}

/// Nearest-rank percentile `q` (0..=1) of `sorted` (ascending); 0 for no samples.
pub fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

impl Stats {
    /// Summary of `samples` (any order; NaNs are ignored).
    pub fn of(samples: impl IntoIterator<Item = f64>) -> Stats {
        let mut v: Vec<f64> = samples.into_iter().filter(|x| !x.is_nan()).collect();
        if v.is_empty() {
            return Stats::default();
        }
        v.sort_by(f64::total_cmp);
        Stats {
            count: v.len(),
            mean: v.iter().sum::<f64>() / v.len() as f64,
            p50: percentile(&v, 0.50),
            p90: percentile(&v, 0.90),
            p99: percentile(&v, 0.99),
            max: v[v.len() - 1],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 0.5), 50.0);
        assert_eq!(percentile(&v, 0.99), 99.0);
        assert_eq!(percentile(&v, 1.0), 100.0);
        assert_eq!(percentile(&[7.0], 0.9), 7.0);
        assert_eq!(percentile(&[], 0.9), 0.0);
        let s = Stats::of([3.0, 1.0, 2.0]);
        assert_eq!((s.count, s.mean, s.p50, s.max), (3, 2.0, 2.0, 3.0));
    }
}
