//! A request's eligible workers narrowed to those whose context holds it
//! (`routing::context_fit`), with each worker's context as this router knows it: what the
//! worker reported for the model in `/v1/models` (for a LoRA adapter, what it reported for the
//! base model), else the model's configured `max_model_len` (`[[models]]`), else unknown.
//!
//! A prefix-aware policy has tokenized the prompt already. A load-only one has not, and skips
//! tokenizing for its speed: it is tokenized here only when the workers' contexts differ, the
//! one case where its length can change where the request may go.

use std::sync::Arc;

use super::{AppState, route};
use crate::fleet::Role;
use crate::fleet::Worker;
use crate::openai::{ApiError, Input, Prompt, RequestView};
use crate::routing::Eligible;
use crate::routing::context_fit::{Fit, differ, narrow};
use crate::tokens::EngineKind;

/// How a request's workers were narrowed.
#[derive(Debug)]
pub(super) struct Narrowing {
    /// What the workers kept can do with it.
    pub(super) kept: Fit,
    /// The ids of the workers left out.
    pub(super) excluded: Vec<String>,
}

/// `eligible` narrowed for `view`'s request for `model`, whose prompt has `prompt_tokens`
/// tokens (0 when it was not tokenized; `body_bytes`: the body's size, for where to tokenize
/// it then), and how, when it was. A disaggregated request keeps every worker when narrowing
/// would leave one side with none: the engine then answers for itself, as it does where no
/// context holds the prompt.
pub(super) async fn narrowed(
    state: &Arc<AppState>,
    eligible: Eligible,
    model: &str,
    prompt_tokens: u64,
    view: RequestView,
    body_bytes: usize,
) -> Result<(Eligible, Option<Narrowing>, RequestView), ApiError> {
    let digest = eligible.workers.first().map(|w| w.contexts_digest());
    if eligible
        .workers
        .iter()
        .all(|w| Some(w.contexts_digest()) == digest)
    {
        // Every worker reported the same contexts (or none): one context for all. An atomic
        // read per worker, where looking the contexts up takes a lock each.
        return Ok((eligible, None, view));
    }
    let (limits, engine) = contexts(state, &eligible.workers, model);
    if !differ(&limits) {
        // One context for all: nothing to choose between.
        return Ok((eligible, None, view));
    }
    // A batch was analysed on its first prompt; it fits only where its longest one does. The
    // analysis counted the first (and, for token ids, moved them out of the view): the longest
    // is the larger of that count and the rest's.
    let (prompt_tokens, view) = match prompt_tokens {
        n if n > 0 && !batched(&view) => (Some(n), view),
        n => {
            let (counted, view) = route::prompt_len(state, view, body_bytes).await?;
            let first = (n > 0).then_some(n);
            (counted.max(first), view)
        }
    };
    let roles: Vec<Role> = eligible.workers.iter().map(|w| w.role()).collect();
    let narrowed =
        prompt_tokens.and_then(|tokens| narrow(&limits, &roles, tokens, view.max_tokens, engine));
    let Some((keep, kept_fit)) = narrowed else {
        return Ok((eligible, None, view));
    };
    let (kept, left): (Vec<_>, Vec<_>) = eligible
        .workers
        .iter()
        .zip(&keep)
        .partition(|(_, keep)| **keep);
    let kept: Vec<Arc<Worker>> = kept.into_iter().map(|(w, _)| Arc::clone(w)).collect();
    let excluded = left.into_iter().map(|(w, _)| w.id().to_owned()).collect();
    let narrowed = Eligible {
        workers: kept,
        plan: eligible.plan,
    };
    let narrowing = Narrowing {
        kept: kept_fit,
        excluded,
    };
    Ok((narrowed, Some(narrowing), view))
}

/// The largest context among the workers serving `model`, as routing knows each
/// ([`contexts`]): the longest request the fleet takes, since a request goes where its context
/// fits. `None` when no worker's is known.
pub(super) fn largest(state: &AppState, model: &str) -> Option<u64> {
    let base = state.adapter_base(model);
    let serving: Vec<Arc<Worker>> = state
        .fleet
        .workers()
        .iter()
        .filter(|w| w.serves(model) || base.as_deref().is_some_and(|b| w.serves(b)))
        .cloned()
        .collect();
    let (limits, _) = contexts(state, &serving, model);
    limits.into_iter().flatten().max()
}

/// Whether `view` carries a batch of more than one prompt.
fn batched(view: &RequestView) -> bool {
    match &view.input {
        Input::Prompt(Prompt::Texts(texts)) => texts.len() > 1,
        Input::Prompt(Prompt::TokenBatches(batches)) => batches.len() > 1,
        _ => false,
    }
}

/// Each of `workers`' context for `model`, as far as it is known, and the kind of engine
/// that runs the model (whose limits differ: `routing::context_fit`).
fn contexts(
    state: &AppState,
    workers: &[Arc<Worker>],
    model: &str,
) -> (Vec<Option<u64>>, EngineKind) {
    let base = state.adapter_base(model);
    let config = state.model_config(base.as_deref().unwrap_or(model));
    let configured = config.and_then(|m| m.max_model_len);
    let limits = workers
        .iter()
        .map(|w| context_of(w, model, base.as_deref()).or(configured))
        .collect();
    (limits, config.map(|m| m.engine).unwrap_or_default())
}

/// The context `worker` reported for `model`, or for the base model it adapts.
fn context_of(worker: &Worker, model: &str, base: Option<&str>) -> Option<u64> {
    worker
        .max_model_len(model)
        .or_else(|| base.and_then(|b| worker.max_model_len(b)))
}
