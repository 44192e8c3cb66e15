//! A request admitted on a worker: the load it holds and what the router predicted.

use std::sync::Arc;
use std::time::Duration;

use super::analysis::Analysis;
use crate::fleet::LoadGuard;
use crate::fleet::WorkerId;
use crate::policy::{Candidate, Observation, Policy};

/// What the router predicted when it sent the request, for calibration at the first token.
#[derive(Clone, Copy, Debug)]
struct Predicted {
    uncached_tokens: u64,
    queued_tokens: u64,
    decoding: u64,
    prefilling: u64,
    unseen_in_flight: u64,
    loaded_tokens: [u64; 2],
    kv_bytes_per_token: u64,
    room_wait_s: f64,
}

/// What the policy predicted for the chosen worker.
#[derive(Clone, Copy, Debug)]
pub(super) struct Forecast {
    /// Time to first token, if the policy predicts one.
    pub ttft_s: Option<f64>,
    /// The part of it spent waiting for room in the worker's KV cache.
    pub room_wait_s: f64,
}

/// The load a routed request holds on its worker until it ends, and the prediction the
/// policy learns from once its first token arrives. Dropping it releases the load.
pub struct Admitted {
    worker: WorkerId,
    guard: LoadGuard,
    policy: Arc<dyn Policy>,
    predicted: Option<Predicted>,
    /// Leading blocks the router believed the worker held (at most the prompt's blocks).
    pub overlap_blocks: u32,
    /// Blocks past those that it held in host memory or on disk (loaded, not computed).
    pub lower_blocks: u32,
    /// Full blocks of the prompt (0 for load-only policies).
    pub blocks: u32,
    /// Prompt length in tokens (0 for load-only policies).
    pub prompt_tokens: u64,
    /// The time to first token the policy predicted on this worker, if it predicts one.
    pub predicted_ttft_s: Option<f64>,
    /// The prompt tokens the router predicted the engine would find cached (its believed
    /// overlap in tokens; what the engine reports as `cached_tokens` when the index is right).
    /// `None` when the prompt was not analysed (load-only policies).
    pub predicted_cached_tokens: Option<u64>,
    /// When it was admitted, on the decider's clock (`Analysis::at`), if the caller said.
    admitted_at: Option<Duration>,
}

/// `overlap_blocks` of `analysis`'s prompt in tokens, if it was analysed.
fn cached_tokens(analysis: &Analysis, overlap_blocks: u32) -> Option<u64> {
    (analysis.request.prompt_tokens > 0).then(|| {
        u64::from(overlap_blocks.min(analysis.request.blocks))
            * u64::from(analysis.request.block_size)
    })
}

impl std::fmt::Debug for Admitted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Admitted")
            .field("worker", &self.worker)
            .field("overlap_blocks", &self.overlap_blocks)
            .field("blocks", &self.blocks)
            .finish_non_exhaustive()
    }
}

impl Admitted {
    pub(super) fn new(
        worker: WorkerId,
        guard: LoadGuard,
        policy: Arc<dyn Policy>,
        analysis: &Analysis,
        chosen: &Candidate,
        uncached_tokens: u64,
        forecast: Forecast,
    ) -> Admitted {
        Admitted {
            worker,
            guard,
            policy,
            predicted: Some(Predicted {
                uncached_tokens,
                queued_tokens: chosen.load.queued_prefill_tokens,
                decoding: chosen.load.decoding,
                prefilling: chosen.load.in_flight.saturating_sub(chosen.load.decoding),
                unseen_in_flight: chosen.load.unseen_in_flight,
                loaded_tokens: {
                    let bs = u64::from(analysis.request.block_size);
                    [chosen.lower_blocks.cpu, chosen.lower_blocks.disk].map(|b| u64::from(b) * bs)
                },
                kv_bytes_per_token: analysis.request.kv_bytes_per_token,
                room_wait_s: forecast.room_wait_s,
            }),
            overlap_blocks: chosen.overlap_blocks.min(analysis.request.blocks),
            lower_blocks: chosen.lower_blocks.total(),
            blocks: analysis.request.blocks,
            prompt_tokens: analysis.request.prompt_tokens,
            predicted_ttft_s: forecast.ttft_s,
            predicted_cached_tokens: cached_tokens(analysis, chosen.overlap_blocks),
            admitted_at: None,
        }
    }

    /// A request admitted on `worker` without a prediction to learn from: the decode side of
    /// a disaggregated request, whose first token waits for a KV transfer, not a prefill (its
    /// time says nothing about the policy's prefill model).
    pub(super) fn unpredicted(
        worker: WorkerId,
        guard: LoadGuard,
        policy: Arc<dyn Policy>,
        analysis: &Analysis,
        overlap_blocks: u32,
    ) -> Admitted {
        Admitted {
            worker,
            guard,
            policy,
            predicted: None,
            overlap_blocks: overlap_blocks.min(analysis.request.blocks),
            lower_blocks: analysis.overlaps.lower(worker).iter().sum(),
            blocks: analysis.request.blocks,
            prompt_tokens: analysis.request.prompt_tokens,
            predicted_ttft_s: None,
            predicted_cached_tokens: cached_tokens(analysis, overlap_blocks),
            admitted_at: None,
        }
    }

    /// The worker it was admitted on.
    pub fn worker(&self) -> WorkerId {
        self.worker
    }

    /// The prompt's leading blocks the worker holds in any tier: what the engine will not
    /// compute (host-memory and disk blocks are loaded).
    pub fn held_blocks(&self) -> u32 {
        self.overlap_blocks
            .saturating_add(self.lower_blocks)
            .min(self.blocks)
    }

    /// The prefill tokens of other requests queued on its worker, as this router counts them
    /// (`routing::prefill_pieces`: a ladder stops where a piece would wait behind more).
    pub fn others_queued_prefill_tokens(&self) -> u64 {
        self.guard.others_queued_prefill_tokens()
    }

    /// Admitted at `at` on the decider's clock: its first token's time can then be told as
    /// the time since ([`Admitted::first_token_after`]).
    pub fn admitted_at(mut self, at: Duration) -> Admitted {
        self.admitted_at = Some(at);
        self
    }

    /// The first token arrived: the prefill no longer queues others.
    pub fn first_token(&mut self) {
        self.guard.first_token();
    }

    /// The first token arrived `elapsed` after the request was admitted: as
    /// [`Admitted::first_token`], and the worker counts how long it has been decoding
    /// (`fleet::decode_ages`), when the admission time is known.
    pub fn first_token_after(&mut self, elapsed: Duration) {
        match self.admitted_at {
            Some(at) => self.guard.first_token_at(at + elapsed),
            None => self.guard.first_token(),
        }
    }

    /// Feeds the policy the observed time to first token, once per request.
    pub fn observe_ttft(&mut self, ttft_s: f64) {
        if let Some(p) = self.predicted.take() {
            self.policy.observe(&Observation {
                worker: self.worker,
                uncached_tokens: p.uncached_tokens,
                queued_tokens: p.queued_tokens,
                decoding: p.decoding,
                prefilling: p.prefilling,
                unseen_in_flight: p.unseen_in_flight,
                ttft_s,
                loaded_tokens: p.loaded_tokens,
                kv_bytes_per_token: p.kv_bytes_per_token,
                room_wait_s: p.room_wait_s,
            });
        }
    }

    /// The request completed `decode_s` seconds after its first token, with `output_tokens`
    /// where the engine reported them: the policy learns how long requests keep their KV
    /// blocks and how fast their answers fill them. Only for completed requests (a failure or
    /// a cancellation says nothing about how long answers run).
    pub fn observe_decode(&self, decode_s: f64, output_tokens: Option<u64>) {
        self.policy
            .observe_decode(self.worker, decode_s, output_tokens);
    }

    /// The request ended (completed, failed or cancelled): everything it held is released.
    pub fn finish(&mut self) {
        self.guard.finish();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::fleet::Load;
    use crate::policy::{PolicyKind, seeded};

    #[test]
    fn blocks_in_lower_tiers_are_held_and_pieces_and_queues_see_the_others() {
        let worker = WorkerId(3);
        let mut analysis = Analysis::default();
        analysis.request.blocks = 10;
        analysis.request.block_size = 16;
        analysis.request.prompt_tokens = 160;
        analysis.overlaps.set_lower(vec![(worker, [3, 2])]);
        let load = Arc::new(Load::default());
        let other = load.admit(500, 400);
        let guard = load.admit(160, 96);
        let policy = seeded(PolicyKind::KvAware, 1);
        let a = Admitted::unpredicted(worker, guard, policy, &analysis, 4);
        // Four on the GPU, three in host memory and two on disk: nine not computed.
        assert_eq!(
            (a.overlap_blocks, a.lower_blocks, a.held_blocks()),
            (4, 5, 9)
        );
        // Its own queued prefill is not counted against it; the other request's is.
        assert_eq!(a.others_queued_prefill_tokens(), 400);
        drop(other);
        assert_eq!(a.others_queued_prefill_tokens(), 0);
    }
}
