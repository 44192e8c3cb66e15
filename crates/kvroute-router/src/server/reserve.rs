//! The tokens a routed request reserves in its tenant's per-minute limit: its prompt's (as
//! the analysis counted them; counted here under a load-only policy, whose analysis has
//! none) plus the output it asks for, `max_tokens` × `n` (nothing when it names no maximum:
//! the engine's reported usage settles it at its end).

use super::AppState;
use super::admission::Reservation;
use super::auth::Caller;
use crate::openai::{ApiError, RequestView};
use crate::routing::Analysis;

/// Reserves the request's tokens, or refuses it with 429 (see `rate_limit`).
pub(super) fn reserve(
    state: &AppState,
    caller: &Caller,
    analysis: &Analysis,
    view: Option<&RequestView>,
    salt: Option<&str>,
) -> Result<Option<Reservation>, ApiError> {
    let tenant = caller.tenant();
    let mut tokens = 0;
    if state.admission.limits_tokens(tenant) {
        tokens = analysis.request.prompt_tokens;
        if let Some(view) = view {
            if tokens == 0 {
                tokens = super::route::hash_now(state, view.clone(), salt)
                    .map_or(0, |a| a.request.prompt_tokens);
            }
            tokens += view.max_tokens.unwrap_or(0) * view.n.unwrap_or(1).max(1);
        }
    }
    state.admission.reserve(tenant, tokens, &state.metrics)
}
