//! The routing decision: from a validated request to a chosen worker.
//!
//! Policies that weigh prefixes need the prompt's block hashes and each worker's overlap, which
//! costs tokenization (milliseconds for long prompts, so it runs on a blocking thread, never on
//! the async workers) and an index lookup (microseconds). Load-only policies skip both. The
//! same analysis serves live requests and `/debug/route`, so an explanation is exactly what a
//! request would get.

use std::sync::Arc;
use std::time::Instant;

use http::StatusCode;

use super::AppState;
use crate::fleet::Worker;
use crate::index::{Overlaps, WorkerIdx};
use crate::openai::{ApiError, RequestView};
use crate::policy::{Candidate, RouteDecision, RouteRequest};
use crate::tokens::model::hash_seed;
use crate::tokens::{BlockHash, TokenError};

/// What routing knows about a request's prompt.
#[derive(Debug, Default)]
pub(super) struct Analysis {
    /// The policy's view of the request.
    pub request: RouteRequest,
    /// Chained hashes of the prompt's full blocks (empty for load-only policies).
    pub hashes: Vec<BlockHash>,
    /// Leading blocks held per worker.
    pub overlaps: Overlaps,
}

/// Tokenizes and looks up the prompt if the policy needs it; `cache_salt` is the request's
/// effective (tenant-namespaced) salt. The view travels to the tokenizer thread and back
/// rather than being copied (a long chat is tens of kilobytes of JSON).
pub(super) async fn analyse(
    state: &Arc<AppState>,
    view: RequestView,
    cache_salt: Option<&str>,
) -> Result<(Analysis, RequestView), ApiError> {
    if !state.policy.uses_prefix() {
        return Ok((Analysis::default(), view));
    }
    // A LoRA adapter's prompts are the base model's tokens, hashed with the adapter's name, as
    // the engine's events name the adapter's blocks.
    let base = state.adapter_base(&view.model);
    let tokens = state.tokens.get(base.as_deref().unwrap_or(&view.model));
    let block_size = tokens.block_size();
    let started = Instant::now();
    let (ids, view) = tokio::task::spawn_blocking(move || (tokens.prompt_ids(&view), view))
        .await
        .map_err(|e| internal(format!("tokenizer task failed: {e}")))?;
    let ids = match ids {
        Ok(ids) => ids,
        Err(e) if e.is_client_error() => {
            return Err(ApiError::invalid(e.to_string(), Some("messages")));
        }
        Err(e) => {
            // A tokenizer failure must not fail the request: route it on load alone.
            tracing::warn!(model = %view.model, error = %e, "cannot tokenize; routing on load only");
            return Ok((Analysis::default(), view));
        }
    };
    state
        .metrics
        .decision
        .with_label_values(&[state.policy.name(), "tokenize"])
        .observe(started.elapsed().as_secs_f64());
    let seed = match &base {
        Some(base) => hash_seed(base, Some(&view.model), cache_salt),
        None => hash_seed(&view.model, None, cache_salt),
    };
    let hashes = crate::tokens::block_hashes(seed, &ids, block_size);
    let overlaps = state.holdings.lookup(&hashes, state.now());
    let analysis = Analysis {
        request: RouteRequest {
            prompt_tokens: ids.len() as u64,
            blocks: u32::try_from(hashes.len()).unwrap_or(u32::MAX),
            block_size: u32::try_from(block_size).unwrap_or(u32::MAX),
        },
        hashes,
        overlaps,
    };
    Ok((analysis, view))
}

/// The candidates among `workers` not yet `tried`, with their load and overlap.
pub(super) fn candidates<'w>(
    workers: &'w [Arc<Worker>],
    analysis: &Analysis,
    tried: &[u32],
) -> (Vec<&'w Arc<Worker>>, Vec<Candidate>) {
    let now = Instant::now();
    let picked: Vec<&Arc<Worker>> = workers
        .iter()
        .filter(|w| !tried.contains(&w.slot) && w.is_routable(now))
        .collect();
    let candidates = picked
        .iter()
        .map(|w| Candidate {
            id: Arc::clone(&w.label),
            slot: w.slot,
            load: w.load.snapshot(),
            overlap_blocks: analysis.overlaps.get(WorkerIdx(w.slot)),
        })
        .collect();
    (picked, candidates)
}

/// Chooses among `candidates`, timing the scoring.
pub(super) fn choose(
    state: &AppState,
    analysis: &Analysis,
    candidates: &[Candidate],
) -> Option<RouteDecision> {
    let started = Instant::now();
    let d = state.policy.choose(&analysis.request, candidates);
    state
        .metrics
        .decision
        .with_label_values(&[state.policy.name(), "score"])
        .observe(started.elapsed().as_secs_f64());
    d
}

/// Prompt tokens the chosen worker is expected to compute (not in its cache).
pub(super) fn uncached_tokens(analysis: &Analysis, c: &Candidate) -> u64 {
    let cached = u64::from(c.overlap_blocks) * u64::from(analysis.request.block_size);
    analysis.request.prompt_tokens.saturating_sub(cached)
}

fn internal(message: String) -> ApiError {
    ApiError::new(
        StatusCode::INTERNAL_SERVER_ERROR,
        "server_error",
        Some("internal_error"),
        message,
    )
}

impl From<TokenError> for ApiError {
    fn from(e: TokenError) -> Self {
        ApiError::invalid(e.to_string(), None)
    }
}
