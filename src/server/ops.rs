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

/// `GET /metrics`: Prometheus text. Fleet gauges are read from the live counters at scrape
/// time, so they can never drift from what routing sees.
pub(super) async fn metrics(State(state): State<Arc<AppState>>) -> Response {
    let m = &state.metrics;
    if let Some(tls) = state.tls() {
        let (applied, refused) = tls.reload_counts();
        sync_counter(&m.tls_reloads.with_label_values(&["applied"]), applied);
        sync_counter(&m.tls_reloads.with_label_values(&["refused"]), refused);
    }
    m.response_affinity_entries
        .set(i64::try_from(state.affinity.len()).unwrap_or(i64::MAX));
    m.in_flight.reset();
    m.worker_healthy.reset();
    m.worker_kv_blocks.reset();
    m.worker_warming.reset();
    m.worker_load_age.reset();
    m.worker_unseen_in_flight.reset();
    m.circuit_state.reset();
    let now = std::time::Instant::now();
    let workers = state.fleet.workers();
    let index = state.holdings.exact.stats();
    m.index_entries
        .set(i64::try_from(index.entries).unwrap_or(i64::MAX));
    m.index_bytes
        .set(i64::try_from(state.holdings.exact.heap_bytes()).unwrap_or(i64::MAX));
    sync_counter(
        &m.index_events.with_label_values(&["applied"]),
        index.events_applied,
    );
    sync_counter(
        &m.index_events.with_label_values(&["skipped"]),
        index.events_skipped,
    );
    sync_counter(&m.index_evictions, index.evictions);
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
        m.worker_healthy
            .with_label_values(&[w.id()])
            .set(i64::from(w.is_healthy()));
        if let Some(blocks) = w.kv_blocks() {
            m.worker_kv_blocks
                .with_label_values(&[w.id()])
                .set(i64::try_from(blocks).unwrap_or(i64::MAX));
        }
        // Load and warm-up are a routing target's: a data-parallel worker's per rank.
        for rank in w.ranks() {
            let label = &*rank.label;
            let load = rank.load.snapshot();
            m.in_flight
                .with_label_values(&[label])
                .set(i64::try_from(load.in_flight).unwrap_or(i64::MAX));
            if w.has_event_feed() {
                m.worker_warming
                    .with_label_values(&[label])
                    .set(i64::from(rank.is_kv_warming()));
            }
            if let Some(at) = rank.load.reading_taken() {
                m.worker_load_age
                    .with_label_values(&[label])
                    .set(now.saturating_duration_since(at).as_secs_f64());
                m.worker_unseen_in_flight
                    .with_label_values(&[label])
                    .set(i64::try_from(rank.load.view().unseen_in_flight).unwrap_or(i64::MAX));
            }
        }
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
        m.circuit_state
            .with_label_values(&[w.id()])
            .set(w.breaker.state(now).as_metric());
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
