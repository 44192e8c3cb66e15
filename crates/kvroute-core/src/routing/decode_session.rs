//! The decode side of one live disaggregated request: its first decode worker and every retry.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::analysis::Analysis;
use super::decider::Decider;
use super::session::{Attempt, Attempts};
use super::target::Target;
use crate::fleet::{Side, Worker, WorkerId, WorkerRank};

/// The decode picks of one request: each [`DecodeSession::next_attempt`] chooses a
/// decode-capable worker not tried yet ([`Decider::choose_decode`]) and admits the request
/// there, so a decode that fails before its first token is retried elsewhere without the
/// proxy knowing how decode workers are chosen.
pub struct DecodeSession<'d> {
    decider: &'d Decider,
    eligible: Vec<WorkerRank>,
    analysis: Analysis,
    tried: Vec<WorkerId>,
    /// The ranks of the worker computing this request's prefill
    /// ([`DecodeSession::prefilled_on`]).
    prefill: Vec<WorkerId>,
    clock: &'d (dyn Fn() -> Duration + Sync),
}

impl<'d> DecodeSession<'d> {
    /// A session over the `eligible` workers (those of the model; only decode-capable ones are
    /// picked) for a request analysed as `analysis`; `clock` is the index clock.
    pub fn new(
        decider: &'d Decider,
        eligible: &[Arc<Worker>],
        analysis: Analysis,
        clock: &'d (dyn Fn() -> Duration + Sync),
    ) -> DecodeSession<'d> {
        DecodeSession {
            decider,
            eligible: WorkerRank::all(eligible),
            analysis,
            tried: Vec::new(),
            prefill: Vec::new(),
            clock,
        }
    }

    /// The same session choosing only rank `rank` of each worker (see `Session::on_rank`).
    pub fn on_rank(mut self, rank: u32) -> DecodeSession<'d> {
        self.eligible.retain(|t| t.rank == rank);
        self
    }

    /// Tells the session which worker computes the prompt: the decode goes elsewhere while
    /// another decode-capable worker is left ([`Decider::choose_decode`]).
    pub fn prefilled_on(&mut self, worker: &Worker) {
        self.prefill = worker.keys().collect();
    }

    /// Lets `worker` be chosen again: its attempt was abandoned through no fault of its own
    /// (SGLang style, the prefill of its pair failed and its request was dropped).
    pub fn forgive(&mut self, worker: &Worker) {
        self.tried.retain(|k| !worker.keys().any(|w| w == *k));
    }

    /// Routes the decode to a worker not tried yet and admits it there; `None` when none is
    /// left. Every call after the first means the previous decode attempt failed.
    pub fn next_attempt(&mut self) -> Option<Attempt> {
        self.attempt(false).map(|(attempt, _)| attempt)
    }

    /// [`Self::next_attempt`], with the pick's runners-up: the other decode targets it
    /// weighed, best first by its own order ([`super::decode_runners_up`]), none of them
    /// admitted — where a gateway may fall back for the decode, which reads the same prefill.
    pub fn next_attempt_ranked(&mut self) -> Option<(Attempt, Vec<WorkerRank>)> {
        self.attempt(true)
    }

    fn attempt(&mut self, rank: bool) -> Option<(Attempt, Vec<WorkerRank>)> {
        let mut skip = self.tried.clone();
        let choice =
            self.decider
                .choose_decode(&self.analysis, &self.eligible, &mut skip, &self.prefill)?;
        let runners_up = if rank {
            choice.runners_up().into_iter().cloned().collect()
        } else {
            Vec::new()
        };
        let target = choice.target.clone();
        let admitted = self
            .decider
            .admit_decode(&self.analysis, &choice, (self.clock)());
        // As for a whole request: a retry goes to another worker, not another rank of this one.
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

impl Attempts for DecodeSession<'_> {
    fn next_attempt(&mut self) -> Option<Attempt> {
        DecodeSession::next_attempt(self)
    }

    fn side(&self) -> Option<Side> {
        Some(Side::Decode)
    }
}
