//! How often the fleet was saturated for a decision (`policy::saturation`), by what: every
//! candidate had at least twice the prompt queued for prefill, or no candidate had room for it
//! in its KV cache. An operator sees when the cost model prices fleet work rather than each
//! request's own latency — and which capacity a fleet saturated for much of its decisions
//! lacks: prefill for the one, KV memory (or a host tier) for the other.

use prometheus::{IntCounter, Registry};

use crate::policy::saturation::Saturation;

/// The saturated decisions' counters, one per cause.
#[derive(Clone)]
pub struct SaturatedDecisionMetrics {
    /// `kvroute_prefill_saturated_decisions_total`: decisions made while every candidate had
    /// at least twice the request's prompt queued for prefill.
    pub prefill: IntCounter,
    /// `kvroute_kv_room_saturated_decisions_total`: decisions made while every candidate's
    /// running requests left no room for the prompt in its KV cache (and the queues were not
    /// saturated).
    pub kv_room: IntCounter,
}

impl SaturatedDecisionMetrics {
    pub(super) fn register(registry: &Registry) -> SaturatedDecisionMetrics {
        let prefill = IntCounter::new(
            "kvroute_prefill_saturated_decisions_total",
            "Routing decisions made while every candidate worker had at least twice the request's prompt queued for prefill (kv_aware then counts the work a placement adds, and the prefix a request in flight computes, so requests sharing a prefix co-locate).",
        )
        .expect("static metric definition");
        let kv_room = IntCounter::new(
            "kvroute_kv_room_saturated_decisions_total",
            "Routing decisions made while no candidate worker had room in its KV cache for the request's prompt beside its running requests (and the prefill queues were not saturated); kv_aware then prices the fleet as saturated.",
        )
        .expect("static metric definition");
        for counter in [&prefill, &kv_room] {
            registry
                .register(Box::new(counter.clone()))
                .expect("metric names are unique");
        }
        SaturatedDecisionMetrics { prefill, kv_room }
    }

    /// Counts one decision saturated by `cause`.
    pub fn count(&self, cause: Saturation) {
        match cause {
            Saturation::Prefill => self.prefill.inc(),
            Saturation::KvRoom => self.kv_room.inc(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_cause_has_its_own_counter() {
        let m = SaturatedDecisionMetrics::register(&Registry::new());
        m.count(Saturation::KvRoom);
        m.count(Saturation::KvRoom);
        m.count(Saturation::Prefill);
        assert_eq!((m.prefill.get(), m.kv_room.get()), (1, 2));
    }
}
