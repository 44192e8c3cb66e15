//! One live request's decisions: the first attempt and every retry, on the shared core.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::admitted::Admitted;
use super::analysis::Analysis;
use super::decider::Decider;
use super::decision_metrics::DecisionMetrics;
use super::target::Target;
use crate::fleet::{Side, WorkerId};
use crate::fleet::{Worker, WorkerRank};

/// A worker chosen for one attempt, with the load the request holds on it.
#[derive(Debug)]
pub struct Attempt {
    /// The worker.
    pub worker: Arc<Worker>,
    /// Which of its ranks: with `worker`, the target tried (a plain worker's only rank is 0).
    pub rank: u32,
    /// The admission (load, prediction) on it; released when dropped.
    pub admitted: Admitted,
    /// When the attempt was routed (its TTFT for calibration counts from here).
    pub at: Instant,
}

impl Attempt {
    /// The target tried: the worker's rank, whose key and load the admission holds.
    pub fn target(&self) -> WorkerRank {
        WorkerRank {
            worker: Arc::clone(&self.worker),
            rank: self.rank,
        }
    }

    /// The rank to pin the forwarded request to (`fleet::DP_RANK_HEADER`); `None` for a
    /// worker without data parallelism (its single engine needs no pin).
    pub fn pinned(&self) -> Option<u32> {
        (self.worker.data_parallel_size() > 1).then_some(self.rank)
    }
}

/// Where the proxy gets each attempt's worker: a request's [`Session`], or the decode side of a
/// disaggregated one ([`super::DecodeSession`]).
pub trait Attempts {
    /// The next worker to try, admitted; `None` when none is left. Every call after the first
    /// means the previous attempt failed.
    fn next_attempt(&mut self) -> Option<Attempt>;
    /// The side of a disaggregated request these attempts serve (`None`: a whole request).
    fn side(&self) -> Option<Side> {
        None
    }
}

impl Attempts for Session<'_> {
    fn next_attempt(&mut self) -> Option<Attempt> {
        Session::next_attempt(self)
    }

    fn side(&self) -> Option<Side> {
        self.side
    }
}

/// The decisions of one request: each [`Session::next_attempt`] routes to a worker not tried yet, so
/// the proxy retries without knowing how workers are chosen.
pub struct Session<'d> {
    decider: &'d Decider,
    metrics: &'d dyn DecisionMetrics,
    /// Every rank of every eligible worker: each is a target of its own.
    eligible: Vec<WorkerRank>,
    analysis: Analysis,
    tried: Vec<WorkerId>,
    clock: &'d (dyn Fn() -> Duration + Sync),
    started: Instant,
    first: bool,
    /// The side of a disaggregated request this session picks for (`None`: a whole request).
    side: Option<Side>,
}

impl<'d> Session<'d> {
    /// A session over the `eligible` workers for an analysed request whose decision began at
    /// `started`; `clock` is the index clock.
    pub fn new(
        decider: &'d Decider,
        metrics: &'d dyn DecisionMetrics,
        eligible: Vec<Arc<Worker>>,
        analysis: Analysis,
        clock: &'d (dyn Fn() -> Duration + Sync),
        started: Instant,
    ) -> Session<'d> {
        Session {
            decider,
            metrics,
            eligible: WorkerRank::all(&eligible),
            analysis,
            tried: Vec::new(),
            clock,
            started,
            first: true,
            side: None,
        }
    }

    /// The same session choosing only among workers whose role serves `side`: the prefill
    /// side of a disaggregated request, chosen by the policy like a whole request.
    pub fn on_side(mut self, side: Side) -> Session<'d> {
        self.side = Some(side);
        self
    }

    /// The same session choosing only rank `rank` of each worker: where a request already
    /// carries that rank's pin (`x-data-parallel-rank`), as a gateway's fallback does.
    pub fn on_rank(mut self, rank: u32) -> Session<'d> {
        self.eligible.retain(|t| t.rank == rank);
        self
    }

    /// The same session never choosing a target of the workers whose targets (exact rank
    /// keys) are in `failed`: a disaggregated request's prefill targets that failed it
    /// already. Every rank of such a worker is left out, as on a retry: they share the
    /// process and front door that failed.
    pub fn excluding(mut self, failed: &[WorkerId]) -> Session<'d> {
        let (eligible, tried) = (&self.eligible, &mut self.tried);
        for t in eligible.iter().filter(|t| failed.contains(&t.state().key)) {
            tried.extend(t.siblings());
        }
        tried.sort_unstable();
        tried.dedup();
        self
    }

    /// The request's analysis (the decode side of a pair is chosen over the same one).
    pub fn analysis(&self) -> &Analysis {
        &self.analysis
    }

    /// Routes the request to a worker not tried yet and admits it there; `None` when none is
    /// left. Every call after the first means the previous attempt failed.
    pub fn next_attempt(&mut self) -> Option<Attempt> {
        self.attempt(false).map(|(attempt, _)| attempt)
    }

    /// [`Self::next_attempt`], with the decision's runners-up: the other targets it weighed,
    /// best first by what it said of each ([`super::runners_up`]), none of them admitted —
    /// where a gateway may fall back without the policy being asked again.
    pub fn next_attempt_ranked(&mut self) -> Option<(Attempt, Vec<WorkerRank>)> {
        self.attempt(true)
    }

    fn attempt(&mut self, rank: bool) -> Option<(Attempt, Vec<WorkerRank>)> {
        let policy = self.decider.policy().name();
        let scoring = Instant::now();
        // Workers whose circuit refuses are skipped for this attempt only: their probe may be
        // free again by the next one.
        let mut skip = self.tried.clone();
        let choice = self
            .decider
            .choose_on(&self.analysis, &self.eligible, &mut skip, self.side);
        self.metrics.scored(policy, scoring.elapsed());
        let choice = choice?;
        if let Some(rule) = choice.confined {
            self.metrics.confined(rule);
        }
        if let Some(cause) = choice.saturated {
            self.metrics.saturated(cause);
        }
        if std::mem::take(&mut self.first) {
            self.metrics.decided(policy, self.started.elapsed());
        }
        let target = choice.target.clone();
        let blocks = self.analysis.request.blocks;
        if blocks > 0 {
            let hit = choice.candidate().overlap_blocks.min(blocks);
            self.metrics.prefix(&target.state().label, blocks, hit);
        }
        let admitted = self.decider.admit(&self.analysis, &choice, (self.clock)());
        let runners_up = if rank {
            super::runners_up(&choice.decision, &choice.candidates)
                .into_iter()
                .filter_map(|i| choice.weighed.get(i).map(|t| (*t).clone()))
                .collect()
        } else {
            Vec::new()
        };
        // A retry goes to another worker, not another rank of the one that failed: the exact
        // target tried and its siblings, which share the process and the front door that
        // failed.
        self.tried.extend(target.siblings());
        let attempt = Attempt {
            rank: target.rank,
            worker: target.worker,
            admitted,
            at: Instant::now(),
        };
        Some((attempt, runners_up))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fleet::{Fleet, WorkerSpec};
    use crate::index::{ApproxConfig, ApproxIndex, Holdings, IndexConfig, KvIndex};
    use crate::policy::{PolicyKind, seeded};

    fn spec(id: &str, ranks: u32) -> WorkerSpec {
        WorkerSpec::for_test(id, ranks)
    }

    /// A failed target is named by its own key, whichever rank it is: every rank of its
    /// worker is left out (they share its front door), the other worker's are not, and each
    /// attempt holds the exact rank it was admitted on.
    #[test]
    fn excluding_a_rank_leaves_out_its_worker_and_attempts_name_their_rank() {
        let fleet = Fleet::new(vec![spec("dp", 3), spec("plain", 1)]);
        let holdings = Arc::new(Holdings::new(
            KvIndex::new(IndexConfig { max_entries: 1024 }),
            ApproxIndex::new(ApproxConfig {
                ttl: Duration::from_secs(60),
                capacity_per_worker: 1024,
            }),
        ));
        let decider = Decider::new(seeded(PolicyKind::RoundRobin, 1), holdings);
        let clock = || Duration::ZERO;
        let workers = fleet.workers().to_vec();
        let dp = fleet.get("dp").unwrap();
        let session = |w: Vec<Arc<Worker>>| {
            Session::new(
                &decider,
                &(),
                w,
                Analysis::load_only(),
                &clock,
                Instant::now(),
            )
        };
        let mut s = session(workers.clone()).excluding(&[dp.rank(2).key]);
        let only = s.next_attempt().unwrap();
        assert_eq!(only.worker.id(), "plain");
        assert!(s.next_attempt().is_none(), "no rank of `dp` is tried");
        // Without exclusions, the attempts hold the exact ranks they were admitted on.
        let mut s = session(vec![Arc::clone(&dp)]);
        let a = s.next_attempt().unwrap();
        assert_eq!(a.admitted.worker(), dp.rank(a.rank).key);
        assert_eq!(a.target().state().key, a.admitted.worker());
        assert_eq!(dp.rank(a.rank).load.snapshot().in_flight, 1);
        assert_eq!(dp.in_flight(), 1, "only that rank holds the request");
        assert_eq!(a.pinned(), Some(a.rank));
    }
}
