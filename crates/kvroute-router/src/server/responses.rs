//! The Responses API: `POST /v1/responses`, and the requests about a stored response
//! (`GET`/`DELETE /v1/responses/{id}`, `POST /v1/responses/{id}/cancel`,
//! `GET /v1/responses/{id}/input_items`).
//!
//! A new response is routed like a chat, on the KV prefix of its `instructions` and `input`
//! rendered as the engine renders them ([`crate::openai::responses`]). Engines store responses in
//! their own memory, so everything that names a stored one — a request continuing it
//! (`previous_response_id`), reading, cancelling or deleting it — must reach the worker that
//! stored it: the router learns each response's id from the answer (see `affinity`) and pins
//! those requests to that worker. An id the router never learned, or whose worker has left,
//! is answered 404 here rather than sent to a worker that cannot have it; a worker that is down
//! or draining is a 503 (the response comes back with it).
//!
//! vLLM takes a body's `request_id` as the new response's id and keys its store by id alone:
//! a tenant's chosen id is sent namespaced to the tenant (`auth::Caller::response_id`), so
//! another tenant who knows or guesses it can neither read, continue nor overwrite it.

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use http::{Method, StatusCode};

use super::AppState;
use super::affinity::Lookup;
use super::auth::Caller;
use super::body;
use super::call::{Call, Prepared, Routing, Step, default_model};
use super::observer::{Affinity, AffinityAction};
use crate::fleet::Worker;
use crate::openai::{ApiError, ECHO_MAX, ResponsesRequest, shorten};
use crate::proxy::members::{self, Edit};

/// Reads a `POST /v1/responses` body: pinned to the worker of its `previous_response_id`, else
/// routed on its prompt.
pub(super) async fn prepare(
    state: &Arc<AppState>,
    caller: &Caller,
    bytes: &Bytes,
) -> Result<Step, ApiError> {
    let req = body::parse(bytes, ResponsesRequest::from_json).await?;
    let model = default_model(state, req.model.clone())?;
    let routing = match &req.previous_response_id {
        Some(prev) => Routing::Pinned(holder(state, caller, prev, "previous_response_id")?),
        None => match &model {
            Some(m) => Routing::Prompt(Box::new(req.chat_view(m))),
            None => Routing::Load,
        },
    };
    // vLLM makes a chosen `request_id` the response's id, in a store shared by every client:
    // a tenant's is namespaced, so no tenant can reach another's response by choosing its id.
    let response_id = match caller {
        Caller::Tenant(_) => req.request_id.as_deref().map(|id| caller.response_id(id)),
        Caller::Anonymous => None,
    };
    Ok(Step::Forward(Prepared {
        model,
        routing,
        salt: Some(req.cache_salt),
        affinity: Some(affinity(state, caller, AffinityAction::Learn)),
        response_id,
    }))
}

/// The body with its top-level `request_id` members given the value `id`, written into the
/// bytes as sent (nothing else is re-encoded).
pub(super) fn with_response_id(body: Bytes, id: &str) -> Result<Bytes, ApiError> {
    let encoded = serde_json::Value::String(id.to_owned()).to_string();
    members::edit(&body, &[("request_id", Edit::Replace(encoded.as_bytes()))])
        .map_err(|e| ApiError::invalid(format!("cannot set the request id: {e}"), None))
}

/// Reads a request about stored response `id`: pinned to its worker; a `DELETE` that succeeds
/// forgets it.
pub(super) fn prepare_stored(
    state: &Arc<AppState>,
    caller: &Caller,
    call: &Call,
    id: &str,
) -> Result<Step, ApiError> {
    let worker = holder(state, caller, id, "response_id")?;
    let affinity = (call.method == Method::DELETE)
        .then(|| affinity(state, caller, AffinityAction::Forget(id.to_owned())));
    Ok(Step::Forward(Prepared {
        routing: Routing::Pinned(worker),
        affinity,
        ..Prepared::on_load(None)
    }))
}

fn affinity(state: &AppState, caller: &Caller, action: AffinityAction) -> Affinity {
    Affinity {
        map: Arc::clone(&state.affinity),
        tenant: caller.tenant().map(str::to_owned),
        action,
    }
}

/// The worker that stores response `id` of the caller's tenant, if it can take the request now.
fn holder(
    state: &AppState,
    caller: &Caller,
    id: &str,
    param: &str,
) -> Result<Arc<Worker>, ApiError> {
    let now = Instant::now();
    let (outcome, result) = match state.affinity.lookup(caller.tenant(), id, now) {
        Lookup::Unknown => ("unknown", Err(not_found(id, param))),
        Lookup::Stored(weak) => {
            let live = weak
                .upgrade()
                .filter(|w| state.fleet.workers().iter().any(|x| Arc::ptr_eq(x, w)));
            match live {
                None => ("holder_gone", Err(holder_gone(id, param))),
                Some(w) if !w.is_routable(now) => {
                    ("holder_unavailable", Err(holder_unavailable(id, &w, param)))
                }
                Some(w) => ("routed", Ok(w)),
            }
        }
    };
    state
        .metrics
        .response_affinity
        .requests
        .with_label_values(&[outcome])
        .inc();
    result
}

fn not_found(id: &str, param: &str) -> ApiError {
    ApiError {
        param: Some(param.to_owned()),
        ..ApiError::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            Some("response_not_found"),
            format!(
                "Response with id '{}' not found: this router has no record of it (it was not \
                 created through this router with this key, or it was forgotten)",
                shorten(id, ECHO_MAX)
            ),
        )
    }
}

fn holder_gone(id: &str, param: &str) -> ApiError {
    ApiError {
        param: Some(param.to_owned()),
        ..ApiError::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            Some("response_holder_gone"),
            format!(
                "Response with id '{}' not found: the worker that stored it has left",
                shorten(id, ECHO_MAX)
            ),
        )
    }
}

fn holder_unavailable(id: &str, worker: &Worker, param: &str) -> ApiError {
    let why = if worker.is_draining() {
        "is draining"
    } else {
        "cannot take requests now"
    };
    ApiError {
        param: Some(param.to_owned()),
        retry_after_s: Some(1),
        ..ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "service_unavailable",
            Some("response_holder_unavailable"),
            format!(
                "the worker `{}` that stores response '{}' {why}; retry later",
                worker.id(),
                shorten(id, ECHO_MAX)
            ),
        )
    }
}
