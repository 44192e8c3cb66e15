//! A worker's identity inside the router.

use std::fmt;

/// A worker's number, assigned by the [`super::Fleet`] when it joins: the key of its index
/// entries, its load, its policy calibration and its event feed. Workers alive at the same time
/// have different numbers; a departed worker's number is handed out again once nothing refers
/// to that worker any more, so numbers stay as small as the fleet (the index keeps "who holds
/// this block" as one bit per worker in pages of 32).
///
/// Operators never see it: they name workers by their id string (`Worker::id`).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug, Default)]
pub struct WorkerId(pub u32);

impl fmt::Display for WorkerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "w{}", self.0)
    }
}
