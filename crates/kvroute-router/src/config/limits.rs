//! `[limits]`: admission control of the router as a whole.

use std::time::Duration;

use super::file::FileLimits;
use super::server::DEFAULT_MAX_BODY_BYTES;
use super::values::seconds;
use super::{ConfigError, invalid};

/// The default body budget, in largest bodies: a few may be read at once, and thousands of
/// ordinary (kilobyte) ones.
const BODIES_IN_FLIGHT: usize = 4;

/// Admission limits: beyond `max_concurrency` requests in flight, up to `max_queue` wait for
/// at most `queue_timeout`; the rest are refused with 429. Request bodies being read and parsed
/// share `max_body_bytes_in_flight`; a body that would exceed it is refused with 429 too.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Limits {
    /// Requests in flight through the router at once.
    pub max_concurrency: usize,
    /// Requests waiting for a slot at once.
    pub max_queue: usize,
    /// Longest wait for a slot.
    pub queue_timeout: Duration,
    /// Bytes of request bodies being read and parsed at once, router-wide: what a burst of
    /// large bodies may cost the router's memory (parsing a body costs up to a few times its
    /// size). Default: four of the largest bodies (`server.max_body_bytes`).
    pub max_body_bytes_in_flight: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_concurrency: 4096,
            max_queue: 4096,
            queue_timeout: Duration::from_secs(10),
            max_body_bytes_in_flight: BODIES_IN_FLIGHT * DEFAULT_MAX_BODY_BYTES as usize,
        }
    }
}

impl Limits {
    /// The limits of `[limits]`, for bodies of at most `max_body_bytes`.
    pub(super) fn from_file(
        file: &FileLimits,
        max_body_bytes: usize,
    ) -> Result<Limits, ConfigError> {
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
            max_body_bytes_in_flight: match file.max_body_bytes_in_flight {
                Some(n) => usize::try_from(n).unwrap_or(usize::MAX),
                None => max_body_bytes.saturating_mul(BODIES_IN_FLIGHT),
            },
        };
        if limits.max_concurrency == 0 {
            return Err(invalid("limits.max_concurrency", "must be at least 1"));
        }
        if limits.max_body_bytes_in_flight < max_body_bytes {
            return Err(invalid(
                "limits.max_body_bytes_in_flight",
                format!(
                    "must be at least `server.max_body_bytes` ({max_body_bytes}), or the largest \
                     bodies could never be read"
                ),
            ));
        }
        Ok(limits)
    }
}
