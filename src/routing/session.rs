//! One live request's decisions: the first attempt and every retry, on the shared core.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::admitted::Admitted;
use super::analysis::Analysis;
use super::decider::Decider;
use crate::fleet::{Side, WorkerId};
use crate::fleet::{Worker, WorkerRank};
use crate::metrics::Metrics;

/// A worker chosen for one attempt, with the load the request holds on it.
#[derive(Debug)]
pub struct Attempt {
    /// The worker.
    pub worker: Arc<Worker>,
    /// The data-parallel rank to pin the request to (`fleet::DP_RANK_HEADER`); `None` for a
    /// worker without data parallelism.
    pub rank: Option<u32>,
    /// The admission (load, prediction) on it; released when dropped.
    pub admitted: Admitted,
    /// When the attempt was routed (its TTFT for calibration counts from here).
    pub at: Instant,
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
    metrics: &'d Metrics,
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
        metrics: &'d Metrics,
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

    /// The same session never choosing any rank of the workers whose first rank is in
    /// `workers` (a disaggregated request's prefill workers that failed it already).
    pub fn excluding(mut self, workers: &[WorkerId]) -> Session<'d> {
        for t in &self.eligible {
            if workers.contains(&t.worker.key) {
                self.tried.push(t.state().key);
            }
        }
        self
    }

    /// The request's analysis (the decode side of a pair is chosen over the same one).
    pub fn analysis(&self) -> &Analysis {
        &self.analysis
    }

    /// Routes the request to a worker not tried yet and admits it there; `None` when none is
    /// left. Every call after the first means the previous attempt failed.
    pub fn next_attempt(&mut self) -> Option<Attempt> {
        let policy = self.decider.policy().name();
        let scoring = Instant::now();
        // Workers whose circuit refuses are skipped for this attempt only: their probe may be
        // free again by the next one.
        let mut skip = self.tried.clone();
        let choice = self
            .decider
            .choose_on(&self.analysis, &self.eligible, &mut skip, self.side);
        self.metrics
            .decision
            .with_label_values(&[policy, "score"])
            .observe(scoring.elapsed().as_secs_f64());
        let choice = choice?;
        if std::mem::take(&mut self.first) {
            self.metrics
                .decision
                .with_label_values(&[policy, "total"])
                .observe(self.started.elapsed().as_secs_f64());
        }
        let target = choice.target.clone();
        let blocks = self.analysis.request.blocks;
        if blocks > 0 {
            let label = &*target.state().label;
            self.metrics
                .prefix_queried_blocks
                .with_label_values(&[label])
                .inc_by(u64::from(blocks));
            self.metrics
                .prefix_hit_blocks
                .with_label_values(&[label])
                .inc_by(u64::from(choice.candidate.overlap_blocks.min(blocks)));
        }
        let admitted = self.decider.admit(&self.analysis, &choice, (self.clock)());
        // A retry goes to another worker, not another rank of the one that failed: its ranks
        // share the process and the front door that failed.
        self.tried.extend(target.worker.keys());
        Some(Attempt {
            rank: target.pinned(),
            worker: target.worker,
            admitted,
            at: Instant::now(),
        })
    }
}
