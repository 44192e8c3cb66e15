//! Routing by context length (`routing::context_fit`): how many requests were kept off workers
//! whose `max_model_len` could not hold them, by what the workers left can do with them, so an
//! operator sees a fleet whose contexts are too small for its traffic.

use prometheus::{IntCounterVec, Opts, Registry};

use crate::routing::context_fit::Fit;

/// The context narrowing's counter.
#[derive(Clone)]
pub struct ContextMetrics {
    /// `kvroute_context_narrowed_total{kept}`: requests routed only among some of their
    /// model's workers because the others' context could not hold them: `whole` (those left
    /// hold the prompt and its `max_tokens`), `clamped` (they hold the prompt; the engine cuts
    /// the completion short) or `largest` (no context holds the prompt; the largest were kept
    /// and the engine answers).
    pub narrowed: IntCounterVec,
}

impl ContextMetrics {
    pub(super) fn register(registry: &Registry) -> ContextMetrics {
        let narrowed = IntCounterVec::new(
            Opts::new(
                "kvroute_context_narrowed_total",
                "Requests kept off workers whose context (max_model_len) could not hold them, by what the workers kept can do: whole (prompt and max_tokens fit), clamped (the prompt fits, the completion is cut short), largest (no context holds the prompt).",
            ),
            &["kept"],
        )
        .expect("static metric definition");
        for fit in [Fit::Whole, Fit::Clamped, Fit::Over] {
            narrowed.with_label_values(&[fit.as_str()]);
        }
        registry
            .register(Box::new(narrowed.clone()))
            .expect("metric names are unique");
        ContextMetrics { narrowed }
    }

    /// Counts one request narrowed to workers of fit `kept`.
    pub fn count(&self, kept: Fit) {
        self.narrowed.with_label_values(&[kept.as_str()]).inc();
    }
}
