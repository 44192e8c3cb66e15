//! A request as the forwarding path carries it between its steps: the call as it arrived
//! ([`Call`]), how its endpoint reads its body ([`Read`]), and what reading it decided
//! ([`Step`], [`Prepared`], [`Routing`]). Shared by `forward`, `read` and the endpoint readers,
//! and importing none of them.

use std::sync::Arc;

use axum::response::Response;
use http::{HeaderMap, Method};

use super::AppState;
use super::api::Api;
use super::observer::Affinity;
use crate::fleet::Worker;
use crate::openai::{ApiError, Endpoint, RequestView};

/// A request as it arrived, before its body is read.
pub(super) struct Call {
    /// The kind of endpoint.
    pub(super) api: Api,
    /// The method, sent on as is.
    pub(super) method: Method,
    /// The path and query sent to the worker.
    pub(super) target: String,
    /// The client's headers.
    pub(super) headers: HeaderMap,
}

impl Call {
    /// A `POST` to `path`.
    pub(super) fn post(api: Api, path: &str, headers: HeaderMap) -> Call {
        Call {
            api,
            method: Method::POST,
            target: path.to_owned(),
            headers,
        }
    }
}

/// How an endpoint reads its body.
pub(super) enum Read {
    /// A completion or chat: validated, routed on its prompt.
    Generation(Endpoint),
    /// `POST /v1/responses` (see `responses`).
    Responses,
    /// A request about stored response `0` (`GET`/`DELETE /v1/responses/{id}`, …).
    StoredResponse(String),
    /// A JSON body of which only `model` is read (embeddings, rerank, score); `salted`: it
    /// takes a `cache_salt`, so a tenant's is written in.
    ModelJson {
        /// Whether the tenant's cache salt is written into the body.
        salted: bool,
    },
    /// A `multipart/form-data` body with a `model` field (transcriptions).
    Multipart,
    /// `POST /tokenize`, answered here when possible (see `tokenize`).
    Tokenize,
    /// `POST /detokenize`, answered here when possible.
    Detokenize,
    /// A body on the allow-list: its `model` read when it is a JSON object that names one.
    Opaque,
}

/// How a request is routed.
pub(super) enum Routing {
    /// On the prompt's KV prefix (and load), as the policy weighs them.
    Prompt(Box<RequestView>),
    /// On load alone.
    Load,
    /// To this worker only: it stores the response the request is about.
    Pinned(Arc<Worker>),
}

/// A request its endpoint has read, ready to be routed.
pub(super) struct Prepared {
    /// The model; `None`: any worker may take it.
    pub(super) model: Option<String>,
    /// How to choose the worker.
    pub(super) routing: Routing,
    /// `Some(client salt)` when the tenant's cache salt is written into the (JSON) body.
    pub(super) salt: Option<Option<String>>,
    /// What the answer teaches about stored responses.
    pub(super) affinity: Option<Affinity>,
    /// `Some(id)`: the body's top-level `request_id` (the client's choice of a Responses
    /// response's id) is replaced with this one, namespaced to the tenant.
    pub(super) response_id: Option<String>,
}

impl Prepared {
    /// A request for `model` routed on load, its body sent as it came.
    pub(super) fn on_load(model: Option<String>) -> Prepared {
        Prepared {
            model,
            routing: Routing::Load,
            salt: None,
            affinity: None,
            response_id: None,
        }
    }
}

/// What reading the body decided.
pub(super) enum Step {
    /// Route and forward it.
    Forward(Prepared),
    /// The router answers itself (a `/tokenize` it can answer), with the model it was for.
    Answer(Response, String),
}

/// The model of a request that may leave it out (engines then use the one they serve): the one
/// named, else the fleet's only base model; `None` when the fleet knows no model yet; 400 when
/// it serves several and the request must say which.
pub(super) fn default_model(
    state: &AppState,
    named: Option<String>,
) -> Result<Option<String>, ApiError> {
    if named.is_some() {
        return Ok(named);
    }
    let mut base: Vec<String> = state
        .fleet
        .models()
        .into_iter()
        .filter(|m| state.adapter_base(m).is_none())
        .collect();
    match base.len() {
        0 => Ok(None),
        1 => Ok(base.pop()),
        n => Err(ApiError::invalid(
            format!("you must provide a model parameter: this router serves {n} models"),
            Some("model"),
        )),
    }
}
