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

/// `GET /metrics`: Prometheus text. The fleet's and the index's gauges are collectors of live
/// state (`fleet::gauges`, `index::gauges`) read by the render; what is copied here is
/// monotonic or set per label, never reset, so concurrent scrapes cannot see it half-done.
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
    for (slot, stats) in state.lifecycle.feed_stats() {
        let Some(label) = workers
            .iter()
            .flat_map(|w| w.ranks())
            .find(|r| r.key == slot)
            .map(|r| &*r.label)
        else {
            continue;
        };
        let r = |a: &std::sync::atomic::AtomicU64| a.load(std::sync::atomic::Ordering::Relaxed);
        for (kind, value) in [
            ("batches", r(&stats.batches)),
            ("events", r(&stats.events)),
            ("undecodable", r(&stats.undecodable)),
            ("malformed", r(&stats.malformed_messages)),
            ("unknown_events", r(&stats.unknown_events)),
            ("gaps", r(&stats.gaps)),
            ("restarts", r(&stats.restarts)),
            ("replays_ok", r(&stats.replays_ok)),
            ("replays_failed", r(&stats.replays_failed)),
            ("replays_abandoned", r(&stats.replays_abandoned)),
            ("duplicates", r(&stats.duplicates)),
            ("dropped", r(&stats.dropped)),
            ("disconnects", r(&stats.disconnects)),
            ("block_size_mismatch", r(&stats.block_size_mismatch)),
            ("dp_rank_mismatch", r(&stats.dp_rank_mismatch)),
        ] {
            sync_counter(&m.kv_stream.with_label_values(&[label, kind]), value);
        }
    }
    for w in workers.iter() {
        if w.engine_ranks.listed().is_some() {
            let wrong = w.engine_ranks.disagrees(w.data_parallel_size());
            m.data_parallel
                .mismatch
                .with_label_values(&[w.id()])
                .set(i64::from(wrong));
        }
        if let Some(size) = w.engine_block_size.reported() {
            m.block_size
                .engine
                .with_label_values(&[w.id()])
                .set(i64::from(size));
            for (model, configured) in state.lifecycle.block_sizes_of(w) {
                m.block_size
                    .mismatch
                    .with_label_values(&[w.id(), &model])
                    .set(i64::from(configured != size));
            }
        }
    }
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
