//! Refusing a request that has gone round a routing loop (see [`crate::proxy::hops`]).

use axum::extract::Request;
use axum::response::{IntoResponse, Response};
use http::StatusCode;

use super::AppState;
use crate::openai::ApiError;

/// The 508 Loop Detected answer to a request that carries this router's own hop id
/// (forwarding it again would recurse until a limit is hit); `None` for any other request.
pub(super) fn loop_refused(state: &AppState, request: &Request) -> Option<Response> {
    if !state.upstream.hop().seen_in(request.headers()) {
        return None;
    }
    tracing::warn!(
        path = request.uri().path(),
        "refused a request this router forwarded before: a worker URL leads back to the router"
    );
    state
        .metrics
        .requests
        .with_label_values(&["-", "-", "-", StatusCode::LOOP_DETECTED.as_str()])
        .inc();
    ApiError::new(
        StatusCode::LOOP_DETECTED,
        "server_error",
        Some("loop_detected"),
        "this request already passed through this router: a worker URL leads back to it; \
         check the workers' URLs",
    )
    .into_response()
    .into()
}
