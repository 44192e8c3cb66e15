//! Long prompts sent to their worker in prefix pieces (`SimConfig::prefill_piece_tokens`,
//! `routing::prefill_pieces`): the live router's ladder in virtual time. Each piece is a
//! request of one output token, queued on the worker a router round trip ([`ROUND_TRIP_S`])
//! after the one before it ended; the request itself follows the last. Its record and its
//! admission are the request's: the router counts its whole prefill queued until its own first
//! token, as the live router does.

use super::{Event, Routed, Simulation};
use crate::engine::RequestId;
use kvroute_router::routing::prefill_pieces::{next_piece_goes, piece_ends};

/// A prompt the router sends in prefix pieces (`routing::prefill_pieces`): each piece a
/// request of one output token, the next queued a round trip after the last ended, then the
/// request.
pub(super) struct Pieces {
    prompt: Vec<u32>,
    ends: Vec<usize>,
    /// Pieces sent so far.
    sent: usize,
    slot: u32,
    output: usize,
}

impl Pieces {
    pub(super) fn new(prompt: Vec<u32>, ends: Vec<usize>, slot: u32, output: usize) -> Pieces {
        Pieces {
            prompt,
            ends,
            sent: 0,
            slot,
            output,
        }
    }
}

/// From a piece's answer at its engine to the next piece there: the answer's way back, the
/// router's next send, the engine's parse. Any delay at all means the engine has planned its
/// next step without the piece, as a real engine has (it plans the next step as the last ends).
pub(super) const ROUND_TRIP_S: f64 = 0.002;

/// Engine ids of pieces: request `i`'s is `PIECE + i` (one piece of it is live at a time),
/// above every trace index.
const PIECE: u64 = 1 << 40;

/// Whether engine request `id` is a piece.
pub(super) fn is_piece(id: RequestId) -> bool {
    id.0 >= PIECE
}

/// The trace index of the request whose piece `id` is, if it is one.
pub(super) fn piece_of(id: RequestId) -> Option<usize> {
    is_piece(id).then(|| (id.0 - PIECE) as usize)
}

impl Simulation<'_> {
    /// Sends request `i` (its `prompt` and `output` tokens, routed as `routed`) in pieces
    /// when its prompt needs them, its first piece queued now (`None`); its prompt and
    /// admission back when it goes whole.
    pub(super) fn send_in_pieces(
        &mut self,
        i: usize,
        prompt: Vec<u32>,
        routed: Routed,
        output: usize,
        now: f64,
    ) -> Option<(Vec<u32>, Routed)> {
        let block = self.config.engine.block_size;
        // Blocks in host memory are loaded, not computed: no piece for them.
        let cached = routed.held_blocks() as usize * block;
        let ends = piece_ends(
            prompt.len(),
            cached,
            self.config.prefill_piece_tokens,
            block,
        );
        if ends.is_empty() {
            return Some((prompt, routed));
        }
        let slot = routed.slot;
        self.routed[i] = Some(routed);
        self.pieces
            .insert(i, Pieces::new(prompt, ends, slot, output));
        self.next_piece(i, now);
        None
    }

    /// Queues request `i`'s next piece on its worker, or the request itself after the last.
    pub(super) fn next_piece(&mut self, i: usize, now: f64) {
        let Some(p) = self.pieces.get_mut(&i) else {
            return;
        };
        let slot = p.slot;
        let ahead = self.routed[i]
            .as_ref()
            .map_or(0, Routed::others_queued_prefill_tokens);
        if !next_piece_goes(ahead, self.config.prefill_piece_tokens) {
            p.sent = p.ends.len();
        }
        let (id, prompt, output) = match p.ends.get(p.sent) {
            Some(&end) => {
                p.sent += 1;
                (RequestId(PIECE + i as u64), p.prompt[..end].to_vec(), 1)
            }
            None => {
                let Some(p) = self.pieces.remove(&i) else {
                    return;
                };
                (RequestId(i as u64), p.prompt, p.output)
            }
        };
        let whole = id.0 == i as u64;
        let w = &mut self.workers[slot as usize];
        match w.engine.add_request(id, prompt, output, now) {
            Ok(()) if whole => {
                w.requests.insert(i);
            }
            Ok(()) => {}
            Err(e) => {
                // A piece is refused as its request would be: the request fails now.
                self.pieces.remove(&i);
                self.fail_pieced(i, &e.to_string(), now);
                return;
            }
        }
        let w = &mut self.workers[slot as usize];
        if w.pending.is_none() && !w.kicked {
            w.kicked = true;
            self.queue.push(now, Event::Kick(slot));
        }
    }

    /// Fails the pieced requests of the worker in `slot` (it restarts: their pieces are gone).
    pub(super) fn drop_pieces(&mut self, slot: u32, now: f64) {
        let gone: Vec<usize> = self
            .pieces
            .iter()
            .filter(|(_, p)| p.slot == slot)
            .map(|(&i, _)| i)
            .collect();
        for i in gone {
            self.pieces.remove(&i);
            self.fail_pieced(i, "worker restarted", now);
        }
    }

    fn fail_pieced(&mut self, i: usize, why: &str, now: f64) {
        let rec = &mut self.records[i];
        rec.error = Some(why.to_string());
        rec.end = Some(now);
        if let Some(mut routed) = self.routed[i].take() {
            routed.finish();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::reference_tests::{config, req};
    use crate::workload::trace::Trace;
    use kvroute_router::policy::PolicyKind;

    /// One worker: a 64k-token prompt nobody holds, then a short one 10 ms later.
    fn run(piece_tokens: usize) -> crate::sim::simulation::PolicyRun {
        let long: Vec<u64> = (0..1_000).collect();
        let trace = Trace::new(vec![
            req(0.0, &long, 64_000, 4),
            req(0.01, &[5_000, 5_001], 128, 4),
        ]);
        let mut c = config(1, 4_096);
        c.prefill_piece_tokens = piece_tokens;
        Simulation::new(&trace, &c, PolicyKind::KvAware)
            .unwrap()
            .run()
    }

    #[test]
    fn a_short_request_goes_between_a_long_prompts_pieces() {
        let whole = run(0);
        let cut = run(8_192);
        let ttft = |r: &crate::sim::simulation::PolicyRun, i: usize| r.records[i].ttft().unwrap();
        // Whole, the short request waits for all 64k tokens; cut, for one piece at most.
        assert!(
            ttft(&whole, 1) >= ttft(&whole, 0) - 0.011,
            "{:?}",
            whole.records
        );
        assert!(ttft(&cut, 1) < ttft(&whole, 1) / 3.0, "{:?}", cut.records);
        // The long prompt's tokens are computed once: its pieces leave them cached for it.
        let long = &cut.records[0];
        assert!(long.error.is_none());
        assert!(long.cached_tokens >= 64_000 - 2 * 8_192, "{long:?}");
        assert!(
            ttft(&cut, 0) >= ttft(&whole, 0),
            "it pays for the short one's turn"
        );
        assert_eq!(whole.counters.prefill_tokens, cut.counters.prefill_tokens);
    }

    #[test]
    fn a_ladder_behind_another_long_prompt_goes_whole_and_is_not_starved() {
        let (a, b): (Vec<u64>, Vec<u64>) = ((0..1_000).collect(), (5_000..6_000).collect());
        let trace = Trace::new(vec![req(0.0, &a, 64_000, 4), req(0.01, &b, 64_000, 4)]);
        let mut c = config(1, 4_096);
        let whole = Simulation::new(&trace, &c, PolicyKind::KvAware)
            .unwrap()
            .run();
        c.prefill_piece_tokens = 8_192;
        let cut = Simulation::new(&trace, &c, PolicyKind::KvAware)
            .unwrap()
            .run();
        let ttft = |r: &crate::sim::simulation::PolicyRun, i: usize| r.records[i].ttft().unwrap();
        // The second prompt found more than a piece queued: it went whole, between the first
        // one's first piece and its rest, which then went whole too (once, not per piece).
        assert!(ttft(&cut, 1) < ttft(&cut, 0), "{:?}", cut.records);
        assert!(ttft(&cut, 0) < ttft(&whole, 1) + 0.5, "{:?}", cut.records);
        assert_eq!(whole.counters.prefill_tokens, cut.counters.prefill_tokens);
    }

    #[test]
    fn a_restart_fails_a_pieced_request() {
        let long: Vec<u64> = (0..1_000).collect();
        let trace = Trace::new(vec![req(0.0, &long, 64_000, 4)]);
        let mut c = config(1, 4_096);
        c.prefill_piece_tokens = 8_192;
        c.changes = vec![crate::sim::config::FleetChange::Restart {
            at: 0.05,
            worker: 0,
        }];
        let run = Simulation::new(&trace, &c, PolicyKind::KvAware)
            .unwrap()
            .run();
        assert_eq!(run.records[0].error.as_deref(), Some("worker restarted"));
    }
}
