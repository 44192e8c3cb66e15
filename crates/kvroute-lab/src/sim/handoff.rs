//! A disaggregated request's journey through the simulation: prefill → KV transfer → decode.
//!
//! As vLLM's disaggregated proxy drives it (and kvroute's live proxy does): the router picks
//! the prefill worker with the policy, KV-aware, when the request arrives, and sends it there
//! as a prefill for a remote decode (`Handoff::ToDecode`, one token). When that prefill ends,
//! the router picks the decode worker by load and KV room (`routing::choose_decode`) and sends
//! it the request with the prefill's KV to pull (`Handoff::FromPrefill`). The decode engine
//! admits it when blocks for the prompt are free, pulls over the engine's `TransferModel`,
//! and from then on decodes; when the pull completes, the prefill worker frees the blocks it
//! held (the NIXL read notification). The client's first token is the decode worker's first,
//! so TTFT = prefill (with its queue) + transfer (with the decode side's wait for blocks) +
//! the first decode step. The prefill's own token is never shown to the client.

use crate::engine::{KvPull, NewRequest, RequestId, RequestStats};
use kvroute_router::fleet::Side;

use super::{Event, Simulation};

/// Where one disaggregated request is.
#[derive(Clone, Copy, Debug)]
pub(super) struct Pair {
    /// Its prefill worker and that worker's life when the prefill ran.
    prefill: u32,
    prefill_life: u32,
    /// The router replica that routed it (it routes the decode too).
    replica: usize,
    /// Its decode worker, once the prefill ended.
    decode: Option<u32>,
}

impl Simulation<'_> {
    /// Whether request `i`'s tokens reach its client now: a whole request's always, a
    /// disaggregated one's only from its decode worker.
    pub(super) fn client_sees(&self, i: usize) -> bool {
        self.pairs[i].is_none_or(|p| p.decode.is_some())
    }

    /// Request `i` arrives at a disaggregated fleet: to the prefill worker the policy picks.
    pub(super) fn arrive_pair(&mut self, i: usize, now: f64) {
        let (prompt, replica, session) = self.open_arrival(i, now);
        let rec = &mut self.records[i];
        let max_tokens = Some(u64::from(self.trace.requests[i].output_tokens.max(1)));
        let Some(mut routed) =
            self.routers[replica].route_on(&prompt, max_tokens, now, Some(Side::Prefill), session)
        else {
            rec.error = Some("no prefill worker available".to_string());
            rec.end = Some(now);
            return;
        };
        rec.prefill_worker = Some(routed.slot);
        rec.predicted_blocks = routed.overlap_blocks;
        rec.predicted_ttft = routed.predicted_ttft();
        rec.predicted_room_wait = routed.room_wait_s;
        rec.blocks = routed.blocks;
        let slot = routed.slot;
        let w = &mut self.workers[slot as usize];
        let new = NewRequest::local(RequestId(i as u64), prompt, 1, now)
            .with_handoff(crate::engine::Handoff::ToDecode);
        match w.engine.add(new) {
            Ok(()) => {
                w.requests.insert(i);
                self.pairs[i] = Some(Pair {
                    prefill: slot,
                    prefill_life: w.life,
                    replica,
                    decode: None,
                });
                self.routed[i] = Some(routed);
                self.wake_now(slot, now);
            }
            Err(e) => {
                rec.error = Some(e.to_string());
                rec.end = Some(now);
                routed.finish();
            }
        }
    }

    /// Request `i`'s prefill ended on worker `slot` at `now` (its blocks are held there): the
    /// router picks its decode worker and sends it there to pull the KV.
    pub(super) fn prefill_done(&mut self, slot: u32, stats: &RequestStats, now: f64) {
        let i = stats.id.0 as usize;
        self.workers[slot as usize].requests.remove(&i);
        if let Some(mut routed) = self.routed[i].take() {
            routed.finish();
        }
        let rec = &mut self.records[i];
        rec.prefill_end = Some(now);
        rec.cached_tokens = stats.cached_tokens as u32;
        let Some(pair) = self.pairs[i] else {
            return;
        };
        let req = &self.trace.requests[i];
        let prompt = self.config.synth.prompt_tokens(req);
        let output = req.output_tokens.max(1) as usize;
        let Some(mut routed) = self.routers[pair.replica].route_decode(&prompt, pair.prefill, now)
        else {
            self.fail_pair(i, pair, "no decode worker available".to_string(), now);
            return;
        };
        let d = routed.slot;
        let new = NewRequest::local(RequestId(i as u64), prompt, output, now)
            .with_handoff(crate::engine::Handoff::FromPrefill);
        let w = &mut self.workers[d as usize];
        match w.engine.add(new) {
            Ok(()) => {
                w.requests.insert(i);
                self.records[i].worker = Some(d);
                self.pairs[i] = Some(Pair {
                    decode: Some(d),
                    ..pair
                });
                self.routed[i] = Some(routed);
                self.wake_now(d, now);
            }
            Err(e) => {
                routed.finish();
                self.fail_pair(i, pair, e.to_string(), now);
            }
        }
    }

    /// Decode workers started pulling these requests' KV: each prefill worker frees its held
    /// blocks when its pull completes.
    pub(super) fn pulls_started(&mut self, pulls: Vec<KvPull>) {
        for p in pulls {
            let i = p.id.0 as usize;
            let rec = &mut self.records[i];
            rec.kv_ready = Some(p.ready_at);
            rec.transferred_tokens = p.tokens as u32;
            if let Some(pair) = self.pairs[i] {
                self.queue.push(
                    p.ready_at,
                    Event::Release {
                        worker: pair.prefill,
                        life: pair.prefill_life,
                        request: i,
                    },
                );
            }
        }
    }

    /// The pull of request `i`'s KV from worker `slot` completed.
    pub(super) fn release(&mut self, slot: u32, life: u32, i: usize) {
        let w = &mut self.workers[slot as usize];
        if w.life == life {
            w.engine.release_held(RequestId(i as u64));
        }
    }

    /// Request `i` cannot continue after its prefill: it fails, and its prefill worker frees
    /// the blocks no one will pull.
    fn fail_pair(&mut self, i: usize, pair: Pair, error: String, now: f64) {
        let rec = &mut self.records[i];
        rec.error = Some(error);
        rec.end = Some(now);
        self.release(pair.prefill, pair.prefill_life, i);
    }

    /// Lets worker `slot` plan a step now if it is idle.
    fn wake_now(&mut self, slot: u32, now: f64) {
        let w = &mut self.workers[slot as usize];
        if w.pending.is_none() && !w.kicked {
            w.kicked = true;
            self.queue.push(now, Event::Kick(slot));
        }
    }
}
