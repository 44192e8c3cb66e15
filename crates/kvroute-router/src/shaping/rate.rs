//! A per-minute limit (tokens or requests) as a sliding window: what was charged in the last
//! 60 s, in 100 ms buckets, may not exceed the limit. A request is charged at admission with
//! what it may spend (its prompt plus the output it asks for) and settled at its end with what
//! it did spend, in the bucket it was charged in, so a window never holds more than the limit
//! of reservations and, once settled, holds what was actually used.
//!
//! Pure: time is passed in. With 100 ms buckets a window spans 59.9 to 60 s, so over any 60 s
//! the charges exceed the limit by at most the share of one bucket (under 0.2 %).

use std::time::Duration;

/// The window's length.
pub const WINDOW: Duration = Duration::from_secs(60);
/// Buckets in a window.
const BUCKETS: usize = 600;
/// One bucket's span.
const BUCKET: Duration = Duration::from_millis(100);

/// Where a charge was made, for its settlement.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Charge {
    /// The bucket's absolute number (time / 100 ms).
    bucket: u64,
    /// What was charged.
    pub amount: u64,
}

/// Why a charge does not fit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Over {
    /// It fits once enough older charges leave the window: after this long.
    RetryAfter(Duration),
    /// It is larger than the limit itself: it never fits.
    Never,
}

/// A sliding 60 s window of charges against one limit.
#[derive(Clone, Debug)]
pub struct Window {
    limit: u64,
    buckets: Vec<u64>,
    /// The absolute number of the newest bucket.
    head: u64,
    total: u64,
}

fn bucket_of(now: Duration) -> u64 {
    (now.as_millis() / BUCKET.as_millis()) as u64
}

impl Window {
    /// An empty window for `limit` per minute.
    pub fn new(limit: u64) -> Window {
        Window {
            limit,
            buckets: vec![0; BUCKETS],
            head: 0,
            total: 0,
        }
    }

    /// The limit per minute.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// A new limit; what is charged stays.
    pub fn set_limit(&mut self, limit: u64) {
        self.limit = limit;
    }

    /// Moves the window to `now`, emptying the buckets that left it.
    fn advance(&mut self, now: Duration) {
        let target = bucket_of(now);
        if target <= self.head {
            return;
        }
        let steps = (target - self.head).min(BUCKETS as u64);
        for i in 1..=steps {
            let slot = ((self.head + i) % BUCKETS as u64) as usize;
            self.total -= self.buckets[slot];
            self.buckets[slot] = 0;
        }
        self.head = target;
    }

    /// What the window holds at `now`.
    pub fn used(&mut self, now: Duration) -> u64 {
        self.advance(now);
        self.total
    }

    /// Whether `amount` fits at `now`, and if not, when it would.
    pub fn check(&mut self, now: Duration, amount: u64) -> Result<(), Over> {
        self.advance(now);
        if self.total + amount <= self.limit {
            return Ok(());
        }
        if amount > self.limit {
            return Err(Over::Never);
        }
        // The oldest buckets leave first: bucket head - BUCKETS + k leaves at (its number +
        // BUCKETS) * 100 ms.
        let mut left = self.total;
        for k in 1..=BUCKETS as u64 {
            let number = self.head + k;
            let slot = (number % BUCKETS as u64) as usize;
            left -= self.buckets[slot];
            if left + amount <= self.limit {
                let at = BUCKET * number as u32;
                return Err(Over::RetryAfter(at.saturating_sub(now)));
            }
        }
        Err(Over::RetryAfter(WINDOW))
    }

    /// Charges `amount` at `now` (checked with [`Window::check`] first, or forced).
    pub fn charge(&mut self, now: Duration, amount: u64) -> Charge {
        self.advance(now);
        let slot = (self.head % BUCKETS as u64) as usize;
        self.buckets[slot] += amount;
        self.total += amount;
        Charge {
            bucket: self.head,
            amount,
        }
    }

    /// Replaces `charge` by `actual` at `now`, if its bucket is still in the window (a charge
    /// that left it no longer counts either way).
    pub fn settle(&mut self, now: Duration, charge: Charge, actual: u64) {
        self.advance(now);
        if charge.bucket + (BUCKETS as u64) <= self.head || charge.bucket > self.head {
            return;
        }
        let slot = (charge.bucket % BUCKETS as u64) as usize;
        let b = &mut self.buckets[slot];
        let removed = charge.amount.min(*b);
        *b = *b - removed + actual;
        self.total = self.total - removed + actual;
    }
}

#[cfg(test)]
#[path = "rate_tests.rs"]
mod tests;
