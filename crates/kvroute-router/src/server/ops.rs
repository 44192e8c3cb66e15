//! Operations endpoints: liveness, readiness, metrics, and the model list.

use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use http::{HeaderMap, StatusCode};
use serde_json::json;

use super::AppState;
use crate::metrics::sync_counter;
use crate::openai::ApiError;
use crate::shaping::saturation::{Part, kv_part};

/// `GET /health`: the process is alive.
pub(super) async fn health() -> Json<serde_json::Value> {
    Json(json!({"status": "ok"}))
}

/// `GET /ready`: at least one worker has passed a health check and can take requests (a pod
/// must not join its Service before any worker was seen).
pub(super) async fn ready(State(state): State<Arc<AppState>>) -> Response {
    if state.fleet.any_ready() {
        Json(json!({"status": "ready"})).into_response()
    } else {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "service_unavailable",
            Some("not_ready"),
            not_ready_message(&state.fleet),
        )
        .into_response()
    }
}

/// Why no worker is ready: the last health-check failure of the first few workers, so the
/// probe's answer (and `kubectl describe`) says what to fix.
fn not_ready_message(fleet: &crate::fleet::Fleet) -> String {
    /// Workers whose failure is named; the admin API lists them all.
    const NAMED: usize = 4;
    let mut message =
        String::from("no worker serving a model has passed a health check and can take requests");
    let failures: Vec<String> = fleet
        .workers()
        .iter()
        .filter_map(|w| w.health_error().map(|e| format!("`{}`: {e}", w.id())))
        .take(NAMED)
        .collect();
    if !failures.is_empty() {
        message.push_str("; last health checks: ");
        message.push_str(&failures.join("; "));
    }
    message
}

/// `GET /metrics`: Prometheus text. The fleet's, the index's and the workers' lives' metrics
/// are collectors of live state (`fleet::gauges`, `index::gauges`, `lifecycle::gauges`) read by
/// the render; what is set here is the front door's own state and the saturation's parts.
pub(super) async fn metrics(State(state): State<Arc<AppState>>) -> Response {
    let m = &state.metrics;
    if let Some(tls) = state.tls() {
        let (applied, refused) = tls.reload_counts();
        sync_counter(
            &m.connections.tls_reloads.with_label_values(&["applied"]),
            applied,
        );
        sync_counter(
            &m.connections.tls_reloads.with_label_values(&["refused"]),
            refused,
        );
    }
    m.response_affinity
        .entries
        .set(i64::try_from(state.affinity.len()).unwrap_or(i64::MAX));
    let workers = state.fleet.workers();
    // The engines' KV usage, as their last load readings report it (healthy workers only:
    // a worker out of the fleet's capacity does not make it fuller).
    let kv = kv_part(
        workers
            .iter()
            .filter(|w| w.is_healthy())
            .flat_map(|w| w.ranks())
            .filter_map(|r| r.load.reading()?.engine.kv_usage),
    );
    m.shaping.saturate(Part::Kv, kv.unwrap_or(0.0));
    m.shaping.fade_ttft();
    (
        [(http::header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        m.render(),
    )
        .into_response()
}

/// `GET /v1/models`: the union of the workers' models, in OpenAI's list shape. With tenants
/// configured it needs a key and lists only the models the key may use (the admin key: all),
/// since the list tells what is deployed.
pub(super) async fn models(State(state): State<Arc<AppState>>, headers: HeaderMap) -> Response {
    let reader = match state.keys.model_reader(&headers) {
        Ok(r) => r,
        Err(e) => return e.into_response(),
    };
    let data: Vec<_> = state
        .fleet
        .models()
        .into_iter()
        .filter(|m| reader.as_ref().is_none_or(|t| t.allows(m)))
        .map(|id| json!({"id": id, "object": "model", "created": 0, "owned_by": "kvroute"}))
        .collect();
    Json(json!({"object": "list", "data": data})).into_response()
}
