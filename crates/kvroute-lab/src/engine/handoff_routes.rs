//! The endpoints a disaggregated pair's other engine calls: `POST /kv_transfer/pull` on the
//! HTTP port (vLLM style, [`super::kv_transfer`]) and the bootstrap server's
//! `GET /rooms/{room}` (SGLang style, [`super::bootstrap`]). Both hand a held prefill's blocks
//! over: released here, imported by the caller after its transfer time.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::{Json, Router};
use serde_json::json;

use super::app::AppState;
use super::kv_transfer::Pull;

fn refuse(status: StatusCode, message: String) -> Response {
    let body = json!({"error": {"message": message, "type": "kv_transfer_error", "code": status.as_u16()}});
    (status, Json(body)).into_response()
}

/// `POST /kv_transfer/pull`: a decode engine takes a held prefill's blocks.
pub(super) async fn pull(State(state): State<Arc<AppState>>, Json(pull): Json<Pull>) -> Response {
    let (rank, id, tokens) = match state.transfers.take(&pull) {
        Ok(held) => held,
        Err((status, why)) => return refuse(status, why),
    };
    match state.clients[rank].release_held(id).await {
        Ok(true) => Json(json!({"tokens": tokens})).into_response(),
        Ok(false) => refuse(
            StatusCode::NOT_FOUND,
            format!(
                "prefill `{}`'s blocks were released already",
                pull.request_id
            ),
        ),
        Err(_) => refuse(
            StatusCode::SERVICE_UNAVAILABLE,
            "the engine is stopping".into(),
        ),
    }
}

/// The bootstrap server of a prefill engine: `GET /rooms/{room}`.
pub fn bootstrap_router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/rooms/{room}", axum::routing::get(room))
        .with_state(state)
}

async fn room(State(state): State<Arc<AppState>>, Path(room): Path<u64>) -> Response {
    let Some((rank, id, tokens)) = state.rooms.take(room).await else {
        return refuse(
            StatusCode::NOT_FOUND,
            format!(
                "no prefill finished in room {room} within {:?}",
                state.rooms.wait
            ),
        );
    };
    match state.clients[rank].release_held(id).await {
        Ok(true) => Json(json!({"tokens": tokens})).into_response(),
        _ => refuse(
            StatusCode::GONE,
            format!("room {room}'s blocks were released already (hold expired)"),
        ),
    }
}
