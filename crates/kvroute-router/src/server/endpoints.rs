//! The engine endpoints beyond completions and chat: the route table ([`routes`]), the pooling
//! and audio endpoints (embeddings, rerank, score, transcriptions — routed on load: their
//! prompts are short-lived and engines seldom reuse their KV, so prefix routing would not pay
//! for its tokenization), and every other path on `[endpoints] forward_paths`, forwarded as it
//! came ([`other`]).
//!
//! Each of them goes through [`forward::handle`]: a tenant key as for chat, admission, the
//! model's eligible workers when the body names a model (the only model of the fleet when it
//! names none, as an engine would assume its own), retries, metrics labelled by endpoint kind,
//! errors in OpenAI's shape.

use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::response::Response;
use axum::routing::{MethodRouter, get, post};
use http::{HeaderMap, Method, StatusCode, Uri};

use super::AppState;
use super::api::Api;
use super::call::{Call, Read};
use super::forward;
use crate::openai::{ApiError, ECHO_MAX, shorten};

/// Adds the routes of the endpoints beyond completions, chat and the model list.
pub(super) fn routes(router: Router<Arc<AppState>>) -> Router<Arc<AppState>> {
    router
        .route("/v1/responses", post(responses_create))
        .route(
            "/v1/responses/{id}",
            get(responses_stored).delete(responses_stored),
        )
        .route("/v1/responses/{id}/cancel", post(responses_stored))
        .route("/v1/responses/{id}/input_items", get(responses_stored))
        .route("/v1/embeddings", pooling(Api::Embeddings))
        .route("/v1/rerank", pooling(Api::Rerank))
        .route("/rerank", pooling(Api::Rerank))
        .route("/v2/rerank", pooling(Api::Rerank))
        .route("/v1/score", pooling(Api::Score))
        .route("/score", pooling(Api::Score))
        .route("/v1/audio/transcriptions", post(transcriptions))
        .route("/tokenize", post(tokenize))
        .route("/detokenize", post(detokenize))
}

/// The path (and query) as received, to send to the worker.
fn target(uri: &Uri) -> String {
    uri.path_and_query()
        .map_or_else(|| uri.path().to_owned(), |pq| pq.as_str().to_owned())
}

/// The route of a pooling endpoint (`api`): embeddings (`/v1/embeddings`), rerank
/// (`/v1/rerank`, `/rerank`, `/v2/rerank`: the path is kept, engines answer each in its own
/// dialect) and score (`/v1/score`, `/score`). Its JSON body's `model` is read and a tenant's
/// cache salt written in.
fn pooling(api: Api) -> MethodRouter<Arc<AppState>> {
    post(
        move |State(state): State<Arc<AppState>>, uri: Uri, headers: HeaderMap, body: Body| async move {
            let call = Call {
                target: target(&uri),
                ..Call::post(api, "", headers)
            };
            forward::handle(state, call, body, Read::ModelJson { salted: true }).await
        },
    )
}

/// `POST /v1/audio/transcriptions`: a `multipart/form-data` upload, forwarded byte for byte.
async fn transcriptions(
    State(state): State<Arc<AppState>>,
    uri: Uri,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let call = Call {
        target: target(&uri),
        ..Call::post(Api::Transcriptions, "", headers)
    };
    forward::handle(state, call, body, Read::Multipart).await
}

/// `POST /v1/responses`.
async fn responses_create(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let call = Call::post(Api::Responses, "/v1/responses", headers);
    forward::handle(state, call, body, Read::Responses).await
}

/// `GET`/`DELETE /v1/responses/{id}`, `POST /v1/responses/{id}/cancel`,
/// `GET /v1/responses/{id}/input_items`: sent as received (path and query) to the worker that
/// stores the response.
async fn responses_stored(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let call = Call {
        api: Api::Responses,
        method,
        target: target(&uri),
        headers,
    };
    forward::handle(state, call, body, Read::StoredResponse(id)).await
}

/// `POST /tokenize`.
async fn tokenize(State(state): State<Arc<AppState>>, headers: HeaderMap, body: Body) -> Response {
    let call = Call::post(Api::Tokenize, "/tokenize", headers);
    forward::handle(state, call, body, Read::Tokenize).await
}

/// `POST /detokenize`.
async fn detokenize(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let call = Call::post(Api::Detokenize, "/detokenize", headers);
    forward::handle(state, call, body, Read::Detokenize).await
}

/// Any other path: forwarded when `[endpoints] forward_paths` allows it, else 404.
pub(super) async fn other(
    State(state): State<Arc<AppState>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Body,
) -> Response {
    if !state.endpoints.forwards(uri.path()) {
        return axum::response::IntoResponse::into_response(not_found(&uri));
    }
    let call = Call {
        api: Api::Forwarded,
        method,
        target: target(&uri),
        headers,
    };
    forward::handle(state, call, body, Read::Opaque).await
}

/// 404 for a path the router neither serves nor forwards.
pub(super) fn not_found(uri: &Uri) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "invalid_request_error",
        Some("not_found"),
        format!("no route for `{}`", shorten(uri.path(), ECHO_MAX)),
    )
}
