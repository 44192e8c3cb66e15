//! A tokenized request's eligible workers narrowed to those whose context holds it
//! (`routing::context_fit`), with each worker's context as this router knows it: what the
//! worker reported for the model in `/v1/models` (for a LoRA adapter, what it reported for the
//! base model), else the model's configured `max_model_len` (`[[models]]`), else unknown.

use std::sync::Arc;

use super::AppState;
use crate::fleet::Worker;
use crate::routing::context_fit::{Fit, fitting};
use crate::routing::{Eligible, Plan, plan_roles};

/// `eligible` narrowed for a prompt of `prompt_tokens` (0 when it was not tokenized) with up to
/// `max_tokens` output tokens for `model`, and how, when it was. A
/// disaggregated request keeps every worker when narrowing would leave one side with none:
/// the engine then answers for itself, as it does where no context holds the prompt.
pub(super) fn narrowed(
    state: &AppState,
    eligible: Eligible,
    model: &str,
    prompt_tokens: u64,
    max_tokens: Option<u64>,
) -> (Eligible, Option<Narrowing>) {
    if prompt_tokens == 0 || eligible.workers.len() < 2 {
        return (eligible, None);
    }
    let base = state.adapter_base(model);
    let configured = state
        .model_config(base.as_deref().unwrap_or(model))
        .and_then(|m| m.max_model_len);
    let limits: Vec<Option<u64>> = eligible
        .workers
        .iter()
        .map(|w| context_of(w, model, base.as_deref()).or(configured))
        .collect();
    let (keep, kept_fit) = fitting(&limits, prompt_tokens, max_tokens);
    if keep.iter().all(|k| *k) {
        return (eligible, None);
    }
    let (kept, left): (Vec<_>, Vec<_>) = eligible
        .workers
        .iter()
        .zip(&keep)
        .partition(|(_, keep)| **keep);
    let kept: Vec<Arc<Worker>> = kept.into_iter().map(|(w, _)| Arc::clone(w)).collect();
    if eligible.plan == Plan::Pair && plan_roles(kept.iter().map(|w| w.role())) != Ok(Plan::Pair) {
        return (eligible, None);
    }
    let excluded = left.into_iter().map(|(w, _)| w.id().to_owned()).collect();
    let narrowed = Eligible {
        workers: kept,
        plan: eligible.plan,
    };
    let narrowing = Narrowing {
        kept: kept_fit,
        excluded,
    };
    (narrowed, Some(narrowing))
}

/// How a request's workers were narrowed.
#[derive(Debug)]
pub(super) struct Narrowing {
    /// What the workers kept can do with it.
    pub(super) kept: Fit,
    /// The ids of the workers left out.
    pub(super) excluded: Vec<String>,
}

/// The context `worker` reported for `model`, or for the base model it adapts.
fn context_of(worker: &Worker, model: &str, base: Option<&str>) -> Option<u64> {
    worker
        .max_model_len(model)
        .or_else(|| base.and_then(|b| worker.max_model_len(b)))
}
