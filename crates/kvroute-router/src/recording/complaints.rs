//! How often a failing trace file is complained about. When the disk is full every record
//! fails to be written; one WARN per record (1,766 lines in one probe) buries every other log
//! line, so the writer warns at most once per [`EVERY`], saying how many failures it did not
//! log since (each is still counted in `kvroute_trace_records_dropped_total`).

use std::time::{Duration, Instant};

/// Least time between two warnings about the trace file.
pub const EVERY: Duration = Duration::from_secs(60);

/// The failures of the trace file since it was last complained about.
#[derive(Debug)]
pub struct Complaints {
    every: Duration,
    last: Option<Instant>,
    quiet: u64,
}

impl Complaints {
    /// A limiter that lets one complaint through per `every`.
    pub fn new(every: Duration) -> Complaints {
        Complaints {
            every,
            last: None,
            quiet: 0,
        }
    }

    /// A failure at `now`: `Some(n)` when it is to be logged, `n` being the failures not
    /// logged since the last one that was; `None` when it is to stay quiet.
    pub fn failed(&mut self, now: Instant) -> Option<u64> {
        let due = self
            .last
            .is_none_or(|last| now.saturating_duration_since(last) >= self.every);
        if !due {
            self.quiet += 1;
            return None;
        }
        self.last = Some(now);
        Some(std::mem::take(&mut self.quiet))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_complaint_per_interval_with_the_count_of_the_quiet_ones() {
        let t0 = Instant::now();
        let mut c = Complaints::new(Duration::from_secs(60));
        assert_eq!(c.failed(t0), Some(0));
        for s in 1..60 {
            assert_eq!(c.failed(t0 + Duration::from_secs(s)), None);
        }
        assert_eq!(c.failed(t0 + Duration::from_secs(60)), Some(59));
        assert_eq!(c.failed(t0 + Duration::from_secs(61)), None);
    }
}
