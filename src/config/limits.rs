//! `[limits]`: admission control of the router as a whole.

use std::time::Duration;

use super::file::FileLimits;
use super::values::seconds;
use super::{ConfigError, invalid};

/// Admission limits: beyond `max_concurrency` requests in flight, up to `max_queue` wait for
/// at most `queue_timeout`; the rest are refused with 429.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Limits {
    /// Requests in flight through the router at once.
    pub max_concurrency: usize,
    /// Requests waiting for a slot at once.
    pub max_queue: usize,
    /// Longest wait for a slot.
    pub queue_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_concurrency: 4096,
            max_queue: 4096,
            queue_timeout: Duration::from_secs(10),
        }
    }
}

impl Limits {
    /// The limits of `[limits]`.
    pub(super) fn from_file(file: &FileLimits) -> Result<Limits, ConfigError> {
        let d = Limits::default();
        let limits = Limits {
            max_concurrency: file.max_concurrency.unwrap_or(d.max_concurrency),
            max_queue: file.max_queue.unwrap_or(d.max_queue),
            queue_timeout: seconds(
                "limits.queue_timeout_s",
                file.queue_timeout_s,
                d.queue_timeout,
                0.0,
            )?,
        };
        if limits.max_concurrency == 0 {
            return Err(invalid("limits.max_concurrency", "must be at least 1"));
        }
        Ok(limits)
    }
}
