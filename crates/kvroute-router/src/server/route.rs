//! A request's prompt as routing needs it: tokenized (long prompts off the async threads), then
//! analysed by the shared decision core ([`crate::routing`]).
//!
//! Tokenization costs milliseconds for long prompts, so they go to a blocking thread; the
//! index lookup costs microseconds. Load-only policies skip both. Live requests and
//! `/debug/route` share this, so an explanation is exactly what a request would get.

use std::sync::Arc;
use std::time::Instant;

use http::StatusCode;
use tracing::Instrument;

use super::AppState;
use crate::index::Overlaps;
use crate::openai::{ApiError, Input, Prompt, RequestView, TokenIds};
use crate::proxy::dispatch::PromptPieces;
use crate::routing::{Analysis, request_seed};
use crate::telemetry::TARGET as TRACE;
use crate::tokens::media::MediaMark;
use crate::tokens::{
    BlockHash, HashSeed, ModelTokens, TokenError, block_hashes_marked, block_hashes_of,
};

/// Bodies smaller than this are tokenized on the request's own task: their prompt tokenizes
/// in microseconds, less than the hop to a blocking thread and back costs (measured by
/// `cargo bench --bench proxy_overhead`, where that hop was most of what `kv_aware` added over a
/// load-only policy). Longer prompts take milliseconds and go to a blocking thread, so that no
/// other connection on this async thread waits on them.
pub const INLINE_TOKENIZE_BYTES: usize = 2 << 10;

/// Tokenizes and analyses the prompt if the policy needs it; `cache_salt` is the request's
/// effective (tenant-namespaced) salt and `body_bytes` the size of the body it came in (an
/// upper bound on the prompt's text, for choosing where to tokenize it). The view travels to
/// the tokenizer thread and back rather than being copied (a long chat is tens of kilobytes of
/// JSON). Token ids a client sent are moved out of the view, not copied, and need no tokenizer
/// thread: the view that comes back is for its model name and flags, not its prompt. They are
/// hashed as they are walked, never expanded to four bytes each (see [`TokenIds`]).
pub(super) async fn analyse(
    state: &Arc<AppState>,
    mut view: RequestView,
    cache_salt: Option<&str>,
    body_bytes: usize,
) -> Result<Analysed, ApiError> {
    if !state.decider.uses_prefix() {
        return Ok((Analysis::load_only(), view, None));
    }
    let (tokens, seed) = tokens_and_seed(state, &view.model, cache_salt);
    let block_size = tokens.block_size();
    let started = Instant::now();
    let span = tracing::info_span!(target: TRACE, "tokenize", tokens = tracing::field::Empty);
    let (ids, view) = async move {
        match take_token_ids(&mut view) {
            Some(ids) => Ok((Ok(PromptIds::Sent(ids)), view)),
            None if body_bytes < INLINE_TOKENIZE_BYTES => {
                Ok((PromptIds::encode(&tokens, &view), view))
            }
            None => tokio::task::spawn_blocking(move || (PromptIds::encode(&tokens, &view), view))
                .await
                .map_err(|e| internal(format!("tokenizer task failed: {e}"))),
        }
    }
    .instrument(span.clone())
    .await?;
    if let Ok(ids) = &ids {
        span.record("tokens", ids.len());
    }
    let ids = match ids {
        Ok(ids) => ids,
        Err(e) if e.is_client_error() => {
            return Err(ApiError::invalid(e.to_string(), Some("messages")));
        }
        Err(e) => {
            // A tokenizer failure must not fail the request: route it on load alone.
            tracing::warn!(model = %view.model, error = %e, "cannot tokenize; routing on load only");
            return Ok((Analysis::load_only(), view, None));
        }
    };
    state
        .metrics
        .decision
        .with_label_values(&[state.policy.name(), "tokenize"])
        .observe(started.elapsed().as_secs_f64());
    let pieces = ids.pieces(state, &view, block_size);
    let analysis = ids.analysis(state, seed, block_size, view.reads_prefix_cache);
    Ok((analysis, view, pieces))
}

/// A prompt's analysis, its view, and its token ids when it may be sent in prefix pieces.
pub(super) type Analysed = (Analysis, RequestView, Option<PromptPieces>);

/// How many tokens `view`'s prompt has (a batch's: its longest prompt's), for routing by
/// context length (`server::context`) where the policy did not tokenize it, or tokenized only
/// a batch's first prompt: counted on the request's task when the body is small
/// (`body_bytes`), else on a blocking thread. `None` when it cannot be tokenized (the engine
/// will say why). Token ids a client sent are counted where they are, not moved.
pub(super) async fn prompt_len(
    state: &Arc<AppState>,
    view: RequestView,
    body_bytes: usize,
) -> Result<(Option<u64>, RequestView), ApiError> {
    match &view.input {
        Input::Prompt(Prompt::Tokens(ids)) => return Ok((Some(ids.len() as u64), view)),
        Input::Prompt(Prompt::TokenBatches(batches)) => {
            let longest = batches.iter().map(|ids| ids.len() as u64).max();
            return Ok((Some(longest.unwrap_or(0)), view));
        }
        _ => {}
    }
    let (tokens, _) = tokens_and_seed(state, &view.model, None);
    let count = move |view: &RequestView| {
        let longest = tokens.longest_prompt_len(view).ok();
        longest.map(|len| len as u64)
    };
    if body_bytes < INLINE_TOKENIZE_BYTES {
        return Ok((count(&view), view));
    }
    tokio::task::spawn_blocking(move || (count(&view), view))
        .await
        .map_err(|e| internal(format!("tokenizer task failed: {e}")))
}

/// The analysis a prefix-aware policy would have made of `view`'s prompt, made for a load-only
/// policy (see `trail`): tokenized, hashed and looked up now, on the calling thread. `None`
/// when the prompt cannot be tokenized.
pub(super) fn hash_now(
    state: &AppState,
    mut view: RequestView,
    cache_salt: Option<&str>,
) -> Option<Analysis> {
    let (tokens, seed) = tokens_and_seed(state, &view.model, cache_salt);
    let block_size = tokens.block_size();
    let reads_cache = view.reads_prefix_cache;
    let ids = match take_token_ids(&mut view) {
        Some(ids) => PromptIds::Sent(ids),
        None => PromptIds::encode(&tokens, &view).ok()?,
    };
    Some(ids.analysis(state, seed, block_size, reads_cache))
}

/// [`hash_now`] on a blocking thread, for a prompt too long to tokenize on an async one.
pub(super) async fn hash_off_path(
    state: &Arc<AppState>,
    view: RequestView,
    cache_salt: Option<String>,
) -> Option<Analysis> {
    let state = Arc::clone(state);
    tokio::task::spawn_blocking(move || hash_now(&state, view, cache_salt.as_deref()))
        .await
        .ok()
        .flatten()
}

/// The tokenizer of `model` (its base model's, for a LoRA adapter) and the hash seed of its
/// prompts under the tenant-namespaced `cache_salt`. A LoRA adapter's prompts are the base
/// model's tokens, hashed with the adapter's name, as the engine's events name the adapter's
/// blocks.
fn tokens_and_seed(
    state: &AppState,
    model: &str,
    cache_salt: Option<&str>,
) -> (Arc<ModelTokens>, HashSeed) {
    let base = state.adapter_base(model);
    let tokens = state.tokens.get(base.as_deref().unwrap_or(model));
    let seed = request_seed(model, base.as_deref(), cache_salt);
    (tokens, seed)
}

/// A prompt's token ids: as the client sent them, or as the tokenizer made them (with where a
/// chat's media begin in them: `tokens::media`).
enum PromptIds {
    Sent(TokenIds),
    Encoded(Vec<u32>, Option<MediaMark>),
}

impl PromptIds {
    /// `view`'s prompt, tokenized.
    fn encode(tokens: &ModelTokens, view: &RequestView) -> Result<PromptIds, TokenError> {
        let (ids, mark) = tokens.prompt_ids_marked(view)?;
        Ok(PromptIds::Encoded(ids, mark))
    }

    /// The ids kept for prefix pieces (`proxy.prefill_piece_tokens`) when the request may go
    /// in them: one prompt (a batch is many requests to its engine), read from the prefix
    /// cache, without media (a piece of token ids would not carry them), and at least two
    /// pieces long. Copied only then.
    fn pieces(
        &self,
        state: &AppState,
        view: &RequestView,
        block_size: usize,
    ) -> Option<PromptPieces> {
        let piece = state.upstream.config().prefill_piece_tokens;
        let batch = match &view.input {
            Input::Prompt(Prompt::Texts(texts)) => texts.len() > 1,
            Input::Prompt(Prompt::TokenBatches(batches)) => batches.len() > 1,
            _ => false,
        };
        if piece == 0 || batch || !view.reads_prefix_cache || self.len() < 2 * piece {
            return None;
        }
        let ids: Arc<[u32]> = match self {
            PromptIds::Sent(ids) => ids.to_vec().into(),
            PromptIds::Encoded(ids, None) => Arc::from(ids.as_slice()),
            PromptIds::Encoded(_, Some(_)) => return None,
        };
        Some(PromptPieces { ids, block_size })
    }

    fn len(&self) -> usize {
        match self {
            PromptIds::Sent(ids) => ids.len(),
            PromptIds::Encoded(ids, _) => ids.len(),
        }
    }

    /// The chained hashes of the full blocks, and how many ids there are.
    fn hashes(&self, seed: HashSeed, block_size: usize) -> (Vec<BlockHash>, usize) {
        match self {
            PromptIds::Sent(ids) => block_hashes_of(seed, ids, block_size),
            PromptIds::Encoded(ids, mark) => {
                let hashes = block_hashes_marked(seed, ids, block_size, *mark);
                (hashes, ids.len())
            }
        }
    }

    /// The ids hashed and looked up in the index now; the ids are dropped before the lookup
    /// (a large prompt's ids are not held alongside its hashes). When the engine does not read
    /// its prefix cache for this request (`reads_cache` false) it computes the whole prompt
    /// but still caches its blocks: no reuse is predicted, the blocks are.
    fn analysis(
        self,
        state: &AppState,
        seed: HashSeed,
        block_size: usize,
        reads_cache: bool,
    ) -> Analysis {
        let (hashes, prompt_tokens) = self.hashes(seed, block_size);
        drop(self);
        let mut analysis = Analysis::of_hashes(
            hashes,
            prompt_tokens,
            block_size,
            state.decider.holdings(),
            state.now(),
        );
        if !reads_cache {
            analysis.overlaps = Overlaps::default();
            analysis.no_reuse = true;
        }
        analysis
    }
}

/// The ids routing hashes when the client sent token ids (the first of a batch, as
/// [`crate::tokens::ModelTokens::prompt_ids`] takes), moved out of the view.
fn take_token_ids(view: &mut RequestView) -> Option<TokenIds> {
    match &mut view.input {
        Input::Prompt(Prompt::Tokens(ids)) => Some(std::mem::take(ids)),
        Input::Prompt(Prompt::TokenBatches(batches)) => {
            Some(batches.first_mut().map(std::mem::take).unwrap_or_default())
        }
        _ => None,
    }
}

fn internal(message: String) -> ApiError {
    ApiError::new(
        StatusCode::INTERNAL_SERVER_ERROR,
        "server_error",
        Some("internal_error"),
        message,
    )
}
