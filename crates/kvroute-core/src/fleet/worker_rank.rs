//! A rank of a worker as a routing decision sees it (see [`super::rank`]).

use std::sync::Arc;

use super::rank::Rank;
use super::worker::Worker;

/// A rank of a worker, as a routing decision sees it: the worker's health, drain and circuit
/// with the rank's own identity and load.
#[derive(Clone, Debug)]
pub struct WorkerRank {
    /// The worker.
    pub worker: Arc<Worker>,
    /// Which of its ranks.
    pub rank: u32,
}

impl WorkerRank {
    /// Every rank of every worker in `workers`, in order.
    pub fn all(workers: &[Arc<Worker>]) -> Vec<WorkerRank> {
        workers
            .iter()
            .flat_map(|w| {
                (0..w.data_parallel_size()).map(move |rank| WorkerRank {
                    worker: Arc::clone(w),
                    rank,
                })
            })
            .collect()
    }

    /// The rank's state.
    pub fn state(&self) -> &Rank {
        self.worker.rank(self.rank)
    }

    /// The rank to name in the forwarded request's [`DP_RANK_HEADER`]: none for a worker
    /// without data parallelism (its single engine needs no pin).
    pub fn pinned(&self) -> Option<u32> {
        (self.worker.data_parallel_size() > 1).then_some(self.rank)
    }
}
