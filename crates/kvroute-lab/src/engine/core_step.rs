//! One step of an [`EngineCore`]: schedule, time the batch, compute its tokens, and end the
//! requests that reached their output length. A child of `core` so it reads the engine's
//! private state, kept apart so `core` stays the engine's shape and bookkeeping.

use super::{EngineCore, StepOutcome, TokenEvent, sample_token};
use crate::engine::kv_cache::KvCache;
use crate::engine::request::{FinishReason, Handoff, RequestId};
use crate::engine::scheduler::Scheduled;
use crate::engine::timing::StepWork;

impl EngineCore {
    /// Runs one step starting at `now`.
    pub fn step(&mut self, now: f64) -> StepOutcome {
        let expired = self.cache.with(|c| self.held.expire(now, c));
        self.counters.held_expired += expired.len() as u64;
        let batch = self.cache.with(|c| self.scheduler.schedule(c, now));
        self.counters.pulls += batch.pulls.len() as u64;
        self.counters.transferred_tokens +=
            batch.pulls.iter().map(|p| p.tokens as u64).sum::<u64>();
        let mut out = StepOutcome {
            start: now,
            end: now,
            num_scheduled: batch.scheduled.len(),
            preempted: batch.preempted,
            pulls: batch.pulls,
            landed: batch.landed,
            expired,
            ..StepOutcome::default()
        };
        self.counters.preemptions += out.preempted.len() as u64;
        self.counters.queried_tokens += batch.queried_tokens as u64;
        self.counters.hit_tokens += batch.hit_tokens as u64;
        self.counters.queried_blocks += batch.queried_blocks as u64;
        self.counters.hit_blocks += batch.hit_blocks as u64;
        if batch.scheduled.is_empty() {
            out.kv_events = self.cache.with(KvCache::take_events);
            return out;
        }
        let work = self.step_work(&batch.scheduled);
        out.work = work;
        out.duration = self.config.timing.step_seconds(work);
        out.end = now + out.duration;
        self.counters.steps += 1;
        self.counters.prefill_tokens += work.prefill_tokens as u64;

        let done = self.compute(&batch.scheduled, &mut out);
        self.counters.generated_tokens += out.tokens.len() as u64;
        self.finish(done, &mut out);
        out.kv_events = self.cache.with(KvCache::take_events);
        out
    }

    /// The step's work for its timing: decode sequences, prefill tokens and the KV usage it
    /// starts with.
    fn step_work(&self, scheduled: &[Scheduled]) -> StepWork {
        let mut work = StepWork {
            kv_usage: self.cache.read(KvCache::usage),
            ..StepWork::default()
        };
        for s in scheduled {
            if s.decode {
                work.decode_seqs += 1;
            } else {
                work.prefill_tokens += s.num_new_tokens;
            }
        }
        work
    }

    /// Computes the scheduled tokens: a request whose prompt is complete gets its next
    /// output token (at the step's end); the requests that reached their output length are
    /// handed back, in schedule order.
    fn compute(&mut self, scheduled: &[Scheduled], out: &mut StepOutcome) -> Vec<RequestId> {
        let mut done = Vec::new();
        for s in scheduled {
            let Some(req) = self.scheduler.get_mut(s.id) else {
                continue;
            };
            req.num_computed += s.num_new_tokens;
            if req.num_computed < req.num_tokens() {
                continue; // a prefill chunk that does not finish the prompt
            }
            let index = req.output_len();
            let token = sample_token(self.config.seed, s.id, index, self.config.vocab_size);
            req.push_output(token, &self.hasher, self.config.block_size);
            if req.first_token.is_none() {
                req.first_token = Some(out.end);
            }
            out.tokens.push(TokenEvent {
                id: s.id,
                token,
                index,
            });
            if req.output_len() >= req.max_output {
                done.push(s.id);
            }
        }
        done
    }

    /// Ends the `done` requests: a prefill handed off to a decode engine keeps its blocks
    /// (until picked up, or expired); any other frees them.
    fn finish(&mut self, done: Vec<RequestId>, out: &mut StepOutcome) {
        for id in done {
            let Some(mut req) = self.scheduler.take(id) else {
                continue;
            };
            if req.handoff == Handoff::ToDecode {
                let table = std::mem::take(&mut req.table);
                let expires = out.end + self.config.kv_hold_timeout_s;
                self.held.hold(id, table, expires);
            } else {
                self.cache.with(|c| c.free(&mut req.table));
            }
            self.counters.finished += 1;
            out.finished.push(req.stats(out.end, FinishReason::Length));
        }
    }
}
