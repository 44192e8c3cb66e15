//! The client's answer to a request that cannot be routed: each [`RouteError`] as OpenAI's
//! error shape, here only, so the forwarding path, the hand-off and `/debug/route` answer a
//! given case with one status, type and code; and a prompt the tokenizer refuses as the
//! client's mistake.

use http::StatusCode;

use crate::fleet::Side;
use crate::openai::ApiError;
use crate::routing::RouteError;
use crate::tokens::TokenError;

impl From<RouteError> for ApiError {
    fn from(e: RouteError) -> Self {
        match e {
            RouteError::ModelNotFound(model) => ApiError::model_not_found(&model),
            RouteError::NoWorker => ApiError::no_worker(),
            RouteError::MissingSide(missing) => ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "service_unavailable",
                Some(match missing.0 {
                    Side::Prefill => "no_prefill_worker",
                    Side::Decode => "no_decode_worker",
                }),
                missing.to_string(),
            ),
            RouteError::NoWholeWorker => ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "service_unavailable",
                Some("no_whole_worker"),
                e.to_string(),
            ),
        }
    }
}

impl From<TokenError> for ApiError {
    fn from(e: TokenError) -> Self {
        ApiError::invalid(e.to_string(), None)
    }
}
