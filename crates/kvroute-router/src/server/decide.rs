//! A read request up to the choice of its worker: authorised for its model, its eligible
//! workers found (`routing::eligible`), its prompt analysed under its seed. The forwarding path
//! and `/debug/route` both take this step, so an explanation is what the request would get,
//! its errors included.

use std::sync::Arc;
use std::time::Instant;

use super::api::Api;
use super::auth::{Caller, Keys};
use super::call::{Call, Routing};
use super::session_hint::{HintSource, session_of};
use super::{AppState, context, route};
use crate::openai::{ApiError, RequestView};
use crate::proxy::dispatch::PromptPieces;
use crate::routing::{self, Analysis, Eligible, Needs, Plan};

/// A request decided up to the choice of its worker.
pub(super) struct Decided {
    /// The workers that may serve it, and whether as pairs.
    pub(super) eligible: Eligible,
    /// Its prompt's analysis (a load-only one when not routed on the prompt).
    pub(super) analysis: Analysis,
    /// The prompt's view when routed on it (the trail hashes it for load-only policies).
    pub(super) view: Option<RequestView>,
    /// The cache salt it is hashed and cached under (a tenant's is namespaced).
    pub(super) salt: Option<String>,
    /// Whether its body carries the client's own `kv_transfer_params` (never sent on).
    pub(super) client_params: bool,
    /// When the decision began (after eligibility, before the analysis).
    pub(super) started: Instant,
    /// Where the session it names was named, if it names one.
    pub(super) hint: Option<HintSource>,
    /// How its workers were narrowed to those whose context holds it, when they were
    /// (`context::narrowed`).
    pub(super) context: Option<context::Narrowing>,
    /// Its prompt's token ids when it may go to its worker in prefix pieces.
    pub(super) pieces: Option<PromptPieces>,
}

/// What a request of `api` routed so needs of its model's workers.
fn needs(api: Api, routing: &Routing) -> Needs {
    match (api, routing) {
        (Api::Completions | Api::Chat, Routing::Prompt(_)) => Needs::Pairable,
        _ if api.generates() => Needs::Whole,
        _ => Needs::Any,
    }
}

/// Authorises `caller` for `model`, finds the eligible workers and analyses the prompt
/// (`client_salt`: the body's own `cache_salt`; `body_bytes`: the body's size), with the
/// session `call` names, if any.
pub(super) async fn decide(
    state: &Arc<AppState>,
    caller: &Caller,
    call: &Call,
    model: Option<&str>,
    client_salt: Option<&str>,
    routing: Routing,
    body_bytes: usize,
) -> Result<Decided, ApiError> {
    if let Some(m) = model {
        Keys::authorize_model(caller, m)?;
    }
    let salt = caller.cache_salt(client_salt);
    let needs = needs(call.api, &routing);
    let eligible = match &routing {
        Routing::Pinned(w) => routing::shape(vec![Arc::clone(w)], needs)?,
        _ => routing::eligible(&state.fleet.workers(), model, needs, Instant::now())?,
    };
    let started = Instant::now();
    // Only a body whose parse saw the member is scanned for it.
    let client_params = matches!(&routing, Routing::Prompt(view) if view.kv_transfer_params);
    let session = model.and_then(|m| {
        let view = match &routing {
            Routing::Prompt(view) => Some(view.as_ref()),
            _ => None,
        };
        session_of(&state.sessions(), &call.headers, view, caller.tenant(), m)
    });
    let (mut analysis, view, pieces) = match routing {
        Routing::Prompt(view) => {
            let (analysis, view, pieces) =
                route::analyse(state, *view, salt.as_deref(), body_bytes).await?;
            (analysis, Some(view), pieces)
        }
        Routing::Load | Routing::Pinned(_) => (Analysis::load_only(), None, None),
    };
    analysis.session = session.map(|(key, _)| key);
    let (eligible, context, view) = match (model, view) {
        (Some(m), Some(v)) => {
            let tokens = analysis.request.prompt_tokens;
            let (eligible, context, v) =
                context::narrowed(state, eligible, m, tokens, v, body_bytes).await?;
            (eligible, context, Some(v))
        }
        (_, view) => (eligible, None, view),
    };
    // A pair's prefill goes to a prefill worker through its hand-off: no pieces.
    let pieces = pieces.filter(|_| eligible.plan == Plan::Whole);
    Ok(Decided {
        eligible,
        analysis,
        view,
        salt,
        client_params,
        started,
        hint: session.map(|(_, source)| source),
        context,
        pieces,
    })
}
