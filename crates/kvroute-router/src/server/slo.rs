//! A request's latency targets (SLO hints): a time-to-first-token and an inter-token latency
//! target, from its headers (`x-kvroute-ttft-target-ms`, `x-kvroute-itl-target-ms`), else its
//! model's `[[models]]` `ttft_target_ms` / `itl_target_ms`, else its tenant's.
//!
//! The TTFT target steers the decision (`routing::slo`: a worker predicted to meet it is
//! preferred); a sheddable request that no worker is predicted to meet it on is refused at
//! once with 503 rather than queued behind work that would make it late anyway; others are
//! routed best effort. Both targets are counted against what happened
//! (`kvroute_slo_requests_total`).

use http::{HeaderMap, StatusCode};

use super::AppState;
use super::auth::Caller;
use crate::fleet::{Side, WorkerRank};
use crate::openai::ApiError;
use crate::routing::{Analysis, Eligible, Plan};

/// The header naming a request's TTFT target in milliseconds.
pub const TTFT_HEADER: &str = "x-kvroute-ttft-target-ms";
/// The header naming a request's inter-token latency target in milliseconds.
pub const ITL_HEADER: &str = "x-kvroute-itl-target-ms";

/// A request's targets, seconds, and whether it may be refused to keep them.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(super) struct Hints {
    pub(super) ttft_s: Option<f64>,
    pub(super) itl_s: Option<f64>,
    pub(super) sheddable: bool,
}

/// The targets of `caller`'s request for `model`: its headers', else its model's
/// (`[[models]]`), else its tenant's; 400 for a header that is not a positive number of
/// milliseconds.
fn hints(
    state: &AppState,
    caller: &Caller,
    headers: &HeaderMap,
    model: Option<&str>,
) -> Result<Hints, ApiError> {
    let tenant = match caller {
        Caller::Tenant(t) => Some(t.shaping),
        Caller::Anonymous => None,
    };
    let sheddable = state
        .admission
        .place(caller, headers)
        .is_ok_and(|p| p.placement.sheddable);
    let model = model.and_then(|m| state.model_config(m));
    Ok(Hints {
        ttft_s: header_s(headers, TTFT_HEADER)?
            .or(model.and_then(|m| m.ttft_target_s))
            .or(tenant.and_then(|t| t.ttft_target_s)),
        itl_s: header_s(headers, ITL_HEADER)?
            .or(model.and_then(|m| m.itl_target_s))
            .or(tenant.and_then(|t| t.itl_target_s)),
        sheddable,
    })
}

fn header_s(headers: &HeaderMap, name: &str) -> Result<Option<f64>, ApiError> {
    let Some(v) = headers.get(name) else {
        return Ok(None);
    };
    match v.to_str().ok().and_then(|s| s.trim().parse::<f64>().ok()) {
        Some(ms) if ms.is_finite() && ms > 0.0 => Ok(Some(ms / 1000.0)),
        _ => Err(ApiError {
            code: Some("invalid_slo"),
            ..ApiError::invalid(
                format!("header {name} must be a positive number of milliseconds"),
                None,
            )
        }),
    }
}

/// The request's targets, its TTFT target put in `analysis` for the decision; a sheddable
/// request no worker is predicted to meet it on is refused ([`refuse_unmeetable`]).
pub(super) fn apply(
    state: &AppState,
    caller: &Caller,
    headers: &HeaderMap,
    model: Option<&str>,
    analysis: &mut Analysis,
    eligible: &Eligible,
) -> Result<Hints, ApiError> {
    let hints = hints(state, caller, headers, model)?;
    analysis.ttft_target_s = hints.ttft_s;
    refuse_unmeetable(state, &hints, analysis, eligible)?;
    Ok(hints)
}

/// Refuses a sheddable request with a TTFT target that no eligible worker is predicted to meet
/// (503 `slo_unmeetable`, counted); every other request passes.
fn refuse_unmeetable(
    state: &AppState,
    hints: &Hints,
    analysis: &Analysis,
    eligible: &Eligible,
) -> Result<(), ApiError> {
    let Some(target) = hints.ttft_s.filter(|_| hints.sheddable) else {
        return Ok(());
    };
    let targets = WorkerRank::all(&eligible.workers);
    let side = (eligible.plan == Plan::Pair).then_some(Side::Prefill);
    let (_, decision) = state.decider.explain(analysis, &targets, side);
    let predicted = decision.and_then(|d| d.predicted_ttft_s.get(d.chosen).copied().flatten());
    match predicted {
        Some(p) if p > target => {
            state.metrics.slo.count("ttft", "refused");
            state
                .metrics
                .rejected
                .with_label_values(&["slo_unmeetable"])
                .inc();
            Err(ApiError {
                retry_after_s: Some(1),
                ..ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "service_unavailable",
                    Some("slo_unmeetable"),
                    format!(
                        "no worker is predicted to give the first token within {:.0} ms (best: \
                         {:.0} ms) and this request is sheddable; retry later",
                        target * 1000.0,
                        p * 1000.0
                    ),
                )
            })
        }
        _ => Ok(()),
    }
}
