//! A request refused for lack of room (slots, queue, body bytes): 429 with `Retry-After`,
//! counted by reason. Shared by admission and the body budget, which neither owns.

use http::StatusCode;

use crate::metrics::Metrics;
use crate::openai::ApiError;

/// The 429 for `reason` (a `kvroute_rejected_total` label), counted.
pub(super) fn too_many(message: String, reason: &'static str, metrics: &Metrics) -> ApiError {
    metrics.rejected.with_label_values(&[reason]).inc();
    ApiError {
        retry_after_s: Some(1),
        ..ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "rate_limit_error",
            Some(reason),
            message,
        )
    }
}

/// The 503 of a sheddable request refused or displaced under saturation (reason `shed` of
/// `kvroute_rejected_total`): the router, not the client, is short of room.
pub(super) fn overloaded(message: String, metrics: &Metrics) -> ApiError {
    metrics.rejected.with_label_values(&["shed"]).inc();
    ApiError {
        retry_after_s: Some(1),
        ..ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "service_unavailable",
            Some("shed"),
            message,
        )
    }
}
