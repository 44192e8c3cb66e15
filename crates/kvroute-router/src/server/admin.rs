//! The admin API: the fleet at run time, without a restart.
//!
//! - `GET /admin/workers`: every worker with its state and load.
//! - `POST /admin/workers`: add one (`{"url", "id"?, "models"?, "kv_events"?, "kv_replay"?,
//!   "kv_blocks"?, "data_parallel_size"?}`); a data-parallel worker is listed with its
//!   `ranks`, each a routing target with its own load and index entries.
//! - `POST /admin/workers/{id}/drain`: no new requests; in-flight ones finish.
//! - `POST /admin/workers/{id}/undrain`: new requests again (the end of a drain).
//! - `DELETE /admin/workers/{id}`: remove a drained (idle) worker; `?force=true` removes it
//!   with requests in flight (they finish on their open connections). A discovered worker
//!   (`source` `kubernetes` or `dns`) is refused with 409 `worker_discovered` unless forced:
//!   its source would bring it back; forced, it comes back when its endpoint changes or at the
//!   source's next re-list.
//!
//! Reads take the admin key (open when no key at all is configured); changes take the admin
//! key, or, without one, come from a loopback client with `[admin] open_on_loopback` (see
//! `auth`): otherwise anyone reaching the listener could add a worker and read others' prompts.
//! Worker URLs are listed without their userinfo (see `fleet::BaseUrl`'s `Display`).
//!
//! A removed worker's KV-event feed stops and its index entries go with it. An added worker is
//! checked exactly as a `[[workers]]` entry is (`config::check_worker`), and refused when its
//! URL is another worker's or the router's own listen address.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use axum::extract::{ConnectInfo, Path, Query, State};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use http::{HeaderMap, StatusCode};
use serde::Deserialize;
use serde_json::{Value, json};

use super::AppState;
use crate::config::{
    bootstrap_port, check_worker, data_parallel_size, names_own_address, worker_role,
};
use crate::fleet::{AddError, BaseUrl, Worker, WorkerSpec};
use crate::lifecycle::{JoinError, LeaveError};
use crate::openai::ApiError;

fn describe(state: &AppState, w: &Worker) -> Value {
    let loads: Vec<_> = w.ranks().iter().map(|r| r.load.snapshot()).collect();
    let total = |f: fn(&crate::fleet::LoadSnapshot) -> u64| loads.iter().map(f).sum::<u64>();
    let ranks: Vec<Value> = w
        .ranks()
        .iter()
        .zip(&loads)
        .map(|(r, load)| {
            json!({
                "rank": r.index,
                "target": r.label.as_ref(),
                "in_flight": load.in_flight,
                "queued_tokens": load.queued_prefill_tokens,
                "decoding": load.decoding,
                "kv_warming": r.is_kv_warming(),
                "predicted_blocks": state.holdings.approx.len(r.key),
            })
        })
        .collect();
    json!({
        "id": w.id(),
        "source": state.lifecycle.source(w.id()).name(),
        "url": w.spec.url.to_string(),
        "models": w.models(),
        "healthy": w.is_healthy(),
        "health_error": w.health_error(),
        "draining": w.is_draining(),
        "circuit": w.breaker.state(std::time::Instant::now()).name(),
        "in_flight": total(|l| l.in_flight),
        "queued_tokens": total(|l| l.queued_prefill_tokens),
        "decoding": total(|l| l.decoding),
        "kv_events": w.spec.kv_events,
        // Subscribed: a feed is open, so routing trusts the engine's events over predictions.
        // Connected: something arrived on it (a batch or a replay answer). A ZeroMQ SUB
        // "connects" to a port where nothing listens without an error, so being subscribed
        // proves nothing; an idle engine without a replay endpoint stays unconnected until
        // it publishes its first batch.
        "kv_events_subscribed": w.has_event_feed(),
        "kv_events_connected": heard_from(state, w),
        "kv_warming": w.is_kv_warming(),
        "kv_blocks": w.kv_blocks(),
        // The block size the engine reports, and each model configured with another one.
        "engine_block_size": w.engine_block_size.reported(),
        "block_size_mismatch": state.lifecycle.block_size_mismatches(w).iter().map(|m| json!({
            "model": m.model,
            "block_size": m.configured,
            "engine_block_size": m.reported,
        })).collect::<Vec<_>>(),
        "predicted_blocks": w.keys().map(|k| state.holdings.approx.len(k)).sum::<usize>(),
        "data_parallel_size": w.data_parallel_size(),
        "ranks": ranks,
        "role": w.role().as_str(),
        "bootstrap_port": w.spec.bootstrap_port,
    })
}

/// Whether any of the worker's KV-event feeds delivered a batch or a replay answer.
fn heard_from(state: &AppState, w: &Worker) -> bool {
    let keys: Vec<_> = w.keys().collect();
    state.lifecycle.feed_stats().iter().any(|(key, stats)| {
        use std::sync::atomic::Ordering::Relaxed;
        keys.contains(key)
            && (stats.batches.load(Relaxed) > 0 || stats.replays_ok.load(Relaxed) > 0)
    })
}

/// The client's address, as the front door gave it to the request (absent when the app is
/// served some other way: then the client is not known to be on loopback).
type Peer = Option<Extension<ConnectInfo<SocketAddr>>>;

fn peer_ip(peer: &Peer) -> Option<IpAddr> {
    peer.as_ref().map(|Extension(ConnectInfo(a))| a.ip())
}

fn not_found(id: &str) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "invalid_request_error",
        Some("worker_not_found"),
        format!("no worker has the id `{id}`"),
    )
}

/// `GET /admin/workers`
pub(super) async fn list(State(state): State<Arc<AppState>>, headers: HeaderMap) -> Response {
    if let Err(e) = state.keys.admin(&headers) {
        return e.into_response();
    }
    let workers: Vec<Value> = state
        .fleet
        .workers()
        .iter()
        .map(|w| describe(&state, w))
        .collect();
    Json(json!({"workers": workers})).into_response()
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct NewWorker {
    url: String,
    id: Option<String>,
    #[serde(default)]
    models: Vec<String>,
    kv_events: Option<String>,
    kv_replay: Option<String>,
    kv_blocks: Option<usize>,
    data_parallel_size: Option<i64>,
    role: Option<String>,
    bootstrap_port: Option<i64>,
}

/// `POST /admin/workers`
pub(super) async fn add(
    State(state): State<Arc<AppState>>,
    peer: Peer,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    if let Err(e) = state.keys.admin_change(&headers, peer_ip(&peer)) {
        return e.into_response();
    }
    match add_worker(&state, &body) {
        Ok(v) => (StatusCode::CREATED, Json(v)).into_response(),
        Err(e) => e.into_response(),
    }
}

fn add_worker(state: &Arc<AppState>, body: &[u8]) -> Result<Value, ApiError> {
    let new: NewWorker = serde_json::from_slice(body)
        .map_err(|e| ApiError::invalid(format!("invalid worker: {e}"), None))?;
    let url =
        BaseUrl::parse(&new.url).map_err(|e| ApiError::invalid(e.to_string(), Some("url")))?;
    let spec = WorkerSpec {
        id: new.id.unwrap_or_else(|| url.host_port()),
        url,
        models: new.models,
        kv_events: new.kv_events,
        kv_replay: new.kv_replay,
        kv_blocks: new.kv_blocks,
        data_parallel_size: data_parallel_size(new.data_parallel_size)
            .map_err(|e| ApiError::invalid(e.message, Some(e.field)))?,
        role: worker_role(new.role.as_deref())
            .map_err(|e| ApiError::invalid(e.message, Some(e.field)))?,
        bootstrap_port: bootstrap_port(new.bootstrap_port)
            .map_err(|e| ApiError::invalid(e.message, Some(e.field)))?,
    };
    check_worker(&spec).map_err(|e| ApiError::invalid(e.message, Some(e.field)))?;
    if names_own_address(&spec.url, &state.own_addrs()) {
        return Err(ApiError::invalid(
            format!(
                "{} is this router's own address: every request would loop back to it",
                spec.url
            ),
            Some("url"),
        ));
    }
    let worker = state.lifecycle.join(spec).map_err(|JoinError::Exists(e)| {
        let code = match e {
            AddError::IdTaken(_) => "worker_exists",
            AddError::UrlTaken { .. } => "worker_url_taken",
        };
        ApiError::new(
            StatusCode::CONFLICT,
            "invalid_request_error",
            Some(code),
            e.to_string(),
        )
    })?;
    Ok(describe(state, &worker))
}

/// `POST /admin/workers/{id}/drain`
pub(super) async fn drain(
    State(state): State<Arc<AppState>>,
    peer: Peer,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Response {
    set_draining(&state, (&headers, peer_ip(&peer)), &id, true)
}

/// `POST /admin/workers/{id}/undrain`
pub(super) async fn undrain(
    State(state): State<Arc<AppState>>,
    peer: Peer,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Response {
    set_draining(&state, (&headers, peer_ip(&peer)), &id, false)
}

/// Drains or undrains worker `id` for the admin (its headers and address), answering with the
/// worker as it now is.
fn set_draining(
    state: &AppState,
    (headers, peer): (&HeaderMap, Option<IpAddr>),
    id: &str,
    draining: bool,
) -> Response {
    if let Err(e) = state.keys.admin_change(headers, peer) {
        return e.into_response();
    }
    let worker = if draining {
        state.lifecycle.drain(id)
    } else {
        state.lifecycle.undrain(id)
    };
    match worker {
        Some(w) => Json(describe(state, &w)).into_response(),
        None => not_found(id).into_response(),
    }
}

/// `DELETE /admin/workers/{id}[?force=true]`
pub(super) async fn remove(
    State(state): State<Arc<AppState>>,
    peer: Peer,
    headers: HeaderMap,
    Path(id): Path<String>,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    if let Err(e) = state.keys.admin_change(&headers, peer_ip(&peer)) {
        return e.into_response();
    }
    let force = q.get("force").is_some_and(|v| v == "true" || v == "1");
    let source = state.lifecycle.source(&id);
    if source.is_discovered() && !force && state.fleet.get(&id).is_some() {
        return ApiError::new(
            StatusCode::CONFLICT,
            "invalid_request_error",
            Some("worker_discovered"),
            format!(
                "worker `{id}` was discovered by {} and would come back; it leaves by itself \
                 when its endpoint goes. Add ?force=true to remove it until its endpoint changes \
                 or is listed again",
                source.name()
            ),
        )
        .into_response();
    }
    match state.lifecycle.leave(&id, force).await {
        Ok(in_flight) => Json(json!({"removed": id, "in_flight": in_flight})).into_response(),
        Err(LeaveError::NotFound(_)) => not_found(&id).into_response(),
        Err(LeaveError::Busy { in_flight, .. }) => ApiError::new(
            StatusCode::CONFLICT,
            "invalid_request_error",
            Some("worker_busy"),
            format!(
                "worker `{id}` has {in_flight} requests in flight; drain it first or add ?force=true"
            ),
        )
        .into_response(),
    }
}
