//! How each endpoint reads its body, once it is admitted and received: the dispatch on
//! [`Read`] to the endpoint's reader, and the readers of the simple kinds (a JSON body's
//! `model`, a multipart form's `model` field, an allow-listed body).

use std::sync::Arc;

use bytes::Bytes;
use http::HeaderMap;

use super::auth::Caller;
use super::call::{Call, Prepared, Read, Routing, Step, default_model};
use super::{AppState, body};
use crate::openai::{ApiError, ModelField, multipart};

/// Lets the endpoint read the body.
pub(super) async fn prepare(
    state: &Arc<AppState>,
    caller: &Caller,
    call: &Call,
    bytes: &Bytes,
    read: Read,
) -> Result<Step, ApiError> {
    match read {
        Read::Generation(endpoint) => {
            let view = body::view(endpoint, bytes).await?;
            Ok(Step::Forward(Prepared {
                model: Some(view.model.clone()),
                salt: Some(view.cache_salt.clone()),
                routing: Routing::Prompt(Box::new(view)),
                affinity: None,
                response_id: None,
            }))
        }
        Read::Responses => super::responses::prepare(state, caller, bytes).await,
        Read::StoredResponse(id) => super::responses::prepare_stored(state, caller, call, &id),
        Read::ModelJson { salted } => {
            let f = body::model_field(bytes).await?;
            Ok(Step::Forward(Prepared {
                salt: salted.then_some(f.cache_salt),
                ..Prepared::on_load(default_model(state, f.model)?)
            }))
        }
        Read::Multipart => prepare_multipart(state, &call.headers, bytes),
        Read::Tokenize => super::tokenize::prepare(state, caller, bytes, false).await,
        Read::Detokenize => super::tokenize::prepare(state, caller, bytes, true).await,
        Read::Opaque => Ok(Step::Forward(prepare_opaque(&call.headers, bytes))),
    }
}

/// Reads the `model` field of a multipart form.
fn prepare_multipart(
    state: &AppState,
    headers: &HeaderMap,
    bytes: &Bytes,
) -> Result<Step, ApiError> {
    let content_type = headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let Some(boundary) = multipart::boundary(content_type) else {
        return Err(ApiError::invalid(
            "the body must be multipart/form-data (with a boundary)",
            None,
        ));
    };
    let named = multipart::text_field(bytes, &boundary, "model")?.filter(|m| !m.is_empty());
    let model = default_model(state, named)?;
    Ok(Step::Forward(Prepared::on_load(model)))
}

/// A body forwarded by the allow-list: its `model` when it is a JSON object naming one (then
/// only that model's workers take it), else any worker.
fn prepare_opaque(headers: &HeaderMap, bytes: &Bytes) -> Prepared {
    let json = headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim_start().starts_with("application/json"));
    let model = if json && !bytes.is_empty() {
        ModelField::from_json(bytes).ok().and_then(|f| f.model)
    } else {
        None
    };
    Prepared::on_load(model)
}
