//! Long prompts sent in prefix pieces (`proxy.prefill_piece_tokens`,
//! `routing::prefill_pieces`): how many pieces went out and how each ended, and how many prompt
//! tokens they carried to their engines ahead of their requests, so an operator sees the
//! ladder work (and a worker that refuses pieces).

use prometheus::{IntCounter, IntCounterVec, Opts, Registry};

/// The pieces' counters.
#[derive(Clone)]
pub struct PrefillPieceMetrics {
    /// `kvroute_prefill_pieces_total{outcome}`: pieces sent, by how they ended (`answered`,
    /// `failed`: the worker refused or dropped one, and the request was sent whole after it).
    pub pieces: IntCounterVec,
    /// `kvroute_prefill_piece_tokens_total`: prompt tokens the answered pieces carried past
    /// what their workers held before.
    pub tokens: IntCounter,
    /// `kvroute_prefill_pieced_requests_total`: requests sent in pieces.
    pub requests: IntCounter,
    /// `kvroute_prefill_piece_ladders_stopped_total`: ladders ended after their first piece
    /// because more than a piece of other requests' prefill was queued on the worker (a
    /// request that finds that before its first piece is not pieced at all).
    pub stopped: IntCounter,
}

impl PrefillPieceMetrics {
    pub(super) fn register(registry: &Registry) -> PrefillPieceMetrics {
        let pieces = IntCounterVec::new(
            Opts::new(
                "kvroute_prefill_pieces_total",
                "Prefix pieces of long prompts sent to their workers ahead of the requests (proxy.prefill_piece_tokens), by outcome: answered, or failed (the request then went whole).",
            ),
            &["outcome"],
        )
        .expect("static metric definition");
        let tokens = IntCounter::new(
            "kvroute_prefill_piece_tokens_total",
            "Prompt tokens that answered prefix pieces computed ahead of their requests.",
        )
        .expect("static metric definition");
        let requests = IntCounter::new(
            "kvroute_prefill_pieced_requests_total",
            "Requests whose long prompt was sent in prefix pieces first.",
        )
        .expect("static metric definition");
        let stopped = IntCounter::new(
            "kvroute_prefill_piece_ladders_stopped_total",
            "Prefix-piece ladders ended early, the rest of the prompt sent whole with the request, because more than a piece of other requests' prefill was queued on the worker.",
        )
        .expect("static metric definition");
        for m in [
            Box::new(pieces.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(tokens.clone()),
            Box::new(requests.clone()),
            Box::new(stopped.clone()),
        ] {
            registry.register(m).expect("metric names are unique");
        }
        for outcome in ["answered", "failed"] {
            pieces.with_label_values(&[outcome]);
        }
        PrefillPieceMetrics {
            pieces,
            tokens,
            requests,
            stopped,
        }
    }
}
