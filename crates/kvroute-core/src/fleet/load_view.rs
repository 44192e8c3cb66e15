//! What a worker is doing, as one router replica can know it: the engine's own last report
//! combined with the requests this replica has sent since.
//!
//! With several router replicas, each one counts only the requests it routed itself, so each
//! would route as if the others did not exist. Every engine reports its whole load (vLLM's
//! `vllm:num_requests_running` / `vllm:num_requests_waiting`, SGLang's
//! `sglang:num_running_reqs` / `sglang:num_queue_reqs`), which includes every replica's
//! requests but is only as fresh as the last scrape. The view keeps the best of both: the
//! engine's count at the reading minus what this replica itself had there at that moment is
//! the work *other* replicas put on the worker (assumed unchanged until the next reading), and
//! this replica's own counters are always current. That is the same as "engine-reported plus
//! own requests since the reading", except that own requests that finished since the reading
//! are no longer counted.
//!
//! Engines report request counts, not tokens, so others' requests still before their first
//! token — the engine's waiting ones, and those that arrived since the previous reading (a
//! long prefill runs for several steps and shows as running) — are priced at this replica's
//! own mean uncached prompt tokens per routed request (replicas behind one load balancer see
//! the same mix); the rest count as decoding. Without a reading, or when the engine reports no more than this
//! replica's own requests (one router), the view is exactly the router-side counters, so a
//! single router behaves as it did before readings existed.
//!
//! Pure: no clock, no I/O. The poller (`fleet::load_poller`) and the simulator supply readings.

/// A consistent-enough copy of a worker's [`super::Load`] for one routing decision: this
/// router's own counters, with other replicas' requests added when the engine's load is read.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LoadSnapshot {
    /// Requests routed and not yet finished.
    pub in_flight: u64,
    /// Uncached prompt tokens of routed requests that have not produced a first token.
    pub queued_prefill_tokens: u64,
    /// Routed requests past their first token.
    pub decoding: u64,
    /// Prompt tokens of all routed, unfinished requests (their KV footprint, roughly).
    pub active_prompt_tokens: u64,
    /// Requests this router ever admitted here (never released): `kv_aware`'s "least used"
    /// tie-break, which rotates requests the cost model cannot tell apart (an idle fleet, new
    /// prefixes) instead of letting one worker win every tie.
    pub admitted: u64,
    /// Of `in_flight`, requests this router did not send (other router replicas'), from the
    /// engine's last load reading; 0 without one. The other fields include their share.
    pub unseen_in_flight: u64,
}

/// One reading of an engine's own load.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct EngineLoad {
    /// Requests in the engine's running batch (prefilling or decoding).
    pub running: u64,
    /// Requests queued at the engine, not yet scheduled.
    pub waiting: u64,
    /// Fraction of the KV cache in use (0–1), when the engine reports it.
    pub kv_usage: Option<f64>,
}

/// An engine reading, with this replica's own counters at the moment it was taken.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Reading {
    /// What the engine reported.
    pub engine: EngineLoad,
    /// This replica's router-side counters for the worker when the reading was taken.
    pub own: LoadSnapshot,
    /// How many more requests of others the engine held than at the previous reading (0 for
    /// a first reading): recent arrivals, most likely still before their first token.
    pub others_arrived: u64,
}

impl Reading {
    /// A reading that follows `previous` (if any) of the same worker.
    pub fn after(previous: Option<&Reading>, engine: EngineLoad, own: LoadSnapshot) -> Reading {
        let mut r = Reading {
            engine,
            own,
            others_arrived: 0,
        };
        if let Some(p) = previous {
            r.others_arrived = r.others().saturating_sub(p.others());
        }
        r
    }

    /// Requests on the engine that this replica did not send.
    pub fn others(&self) -> u64 {
        self.engine
            .running
            .saturating_add(self.engine.waiting)
            .saturating_sub(self.own.in_flight)
    }
}

/// Totals of every request this replica has routed to a worker, to price others' requests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Admissions {
    /// Requests admitted.
    pub requests: u64,
    /// Their uncached prompt tokens (predicted prefill).
    pub prefill_tokens: u64,
    /// Their prompt tokens.
    pub prompt_tokens: u64,
}

impl Admissions {
    fn mean(total: u64, n: u64) -> u64 {
        total.checked_div(n).unwrap_or(0)
    }
}

/// The worker's load as this replica should weigh it: `own` (its current router-side counters)
/// plus the requests of other replicas found in `reading`, priced with `history`.
pub fn combine(own: LoadSnapshot, reading: Option<&Reading>, history: Admissions) -> LoadSnapshot {
    let Some(r) = reading else {
        return own;
    };
    let at = r.own;
    let others = r.others();
    if others == 0 {
        return own;
    }
    // Own requests that had no first token at the reading are assumed to be the engine's
    // waiting ones first: the rest of its queue belongs to others. Others' requests that
    // arrived since the previous reading are counted as still prefilling too (the engine's
    // running count does not tell a long prefill from a decode).
    let own_prefilling = at.in_flight.saturating_sub(at.decoding);
    let others_waiting = r
        .engine
        .waiting
        .saturating_sub(own_prefilling.min(r.engine.waiting))
        .max(r.others_arrived)
        .min(others);
    let others_running = others - others_waiting;
    let prefill = Admissions::mean(history.prefill_tokens, history.requests);
    let prompt = Admissions::mean(history.prompt_tokens, history.requests);
    LoadSnapshot {
        in_flight: own.in_flight.saturating_add(others),
        queued_prefill_tokens: own
            .queued_prefill_tokens
            .saturating_add(others_waiting.saturating_mul(prefill)),
        decoding: own.decoding.saturating_add(others_running),
        active_prompt_tokens: own
            .active_prompt_tokens
            .saturating_add(others.saturating_mul(prompt)),
        admitted: own.admitted,
        unseen_in_flight: others,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snap(in_flight: u64, queued: u64, decoding: u64) -> LoadSnapshot {
        LoadSnapshot {
            in_flight,
            queued_prefill_tokens: queued,
            decoding,
            active_prompt_tokens: in_flight * 100,
            admitted: 0,
            unseen_in_flight: 0,
        }
    }

    fn reading(running: u64, waiting: u64, own: LoadSnapshot) -> Reading {
        Reading {
            engine: EngineLoad {
                running,
                waiting,
                kv_usage: None,
            },
            own,
            others_arrived: 0,
        }
    }

    const HISTORY: Admissions = Admissions {
        requests: 10,
        prefill_tokens: 5_000,
        prompt_tokens: 8_000,
    };

    #[test]
    fn without_a_reading_the_view_is_the_own_counters() {
        let own = snap(3, 700, 1);
        assert_eq!(combine(own, None, HISTORY), own);
    }

    #[test]
    fn a_reading_of_only_own_requests_changes_nothing() {
        // One router: the engine holds exactly what this replica sent (or less, when some
        // finished on the engine before the router heard of it).
        let at = snap(4, 900, 2);
        let own = snap(5, 1_000, 2);
        for (running, waiting) in [(2, 2), (1, 2), (0, 0)] {
            assert_eq!(
                combine(own, Some(&reading(running, waiting, at)), HISTORY),
                own
            );
        }
    }

    #[test]
    fn others_requests_are_added_to_the_current_own_counters() {
        // At the reading this replica had 2 requests there, 1 decoding and 1 prefilling; the
        // engine had 5 running and 3 waiting: 6 belong to others, 2 of them waiting.
        let at = snap(2, 300, 1);
        let own = snap(4, 800, 2);
        let v = combine(own, Some(&reading(5, 3, at)), HISTORY);
        assert_eq!(v.unseen_in_flight, 6);
        assert_eq!(v.in_flight, 10);
        assert_eq!(v.queued_prefill_tokens, 800 + 2 * 500);
        assert_eq!(v.decoding, 2 + 4);
        assert_eq!(v.active_prompt_tokens, 400 + 6 * 800);
    }

    #[test]
    fn others_arrived_since_the_previous_reading_are_priced_as_prefilling() {
        let at = snap(1, 0, 1);
        let first = reading(3, 0, at);
        assert_eq!(first.others(), 2);
        let next = Reading::after(Some(&first), first.engine, at);
        assert_eq!(next.others_arrived, 0);
        let grown = EngineLoad {
            running: 6,
            ..first.engine
        };
        let next = Reading::after(Some(&first), grown, at);
        assert_eq!(next.others_arrived, 3);
        let v = combine(at, Some(&next), HISTORY);
        // 5 others: the 3 new ones queued at 500 tokens each, 2 decoding.
        assert_eq!((v.queued_prefill_tokens, v.decoding), (1_500, 1 + 2));
    }

    #[test]
    fn no_history_prices_others_waiting_at_zero_tokens_but_still_counts_them() {
        let v = combine(
            snap(0, 0, 0),
            Some(&reading(1, 2, snap(0, 0, 0))),
            Admissions::default(),
        );
        assert_eq!(
            (v.in_flight, v.queued_prefill_tokens, v.decoding),
            (3, 0, 1)
        );
    }
}
