//! Why a request cannot be routed: the one typed answer of eligibility and of a decision that
//! finds no target, mapped to the client's error in one place (`routing::route_error`), so a
//! live request and `/debug/route` answer alike.

use super::pair::MissingSide;

/// Why no target may take a request.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RouteError {
    /// No worker, healthy or not, serves the model (the client's mistake: 404).
    #[error("the model `{0}` is not served here")]
    ModelNotFound(String),
    /// Workers serve the model, but none may take a request now (down, draining, circuit
    /// open): 503, retry later.
    #[error("no healthy worker is available for this model")]
    NoWorker,
    /// The model is served disaggregated and one side has no worker (the operator's mistake).
    #[error(transparent)]
    MissingSide(#[from] MissingSide),
    /// The model is served disaggregated, and this endpoint generates but cannot be handed
    /// off: it needs a worker that serves whole requests, and there is none.
    #[error(
        "this model is served disaggregated, and only completions and chat completions are \
         routed as prefill/decode pairs: this endpoint needs a worker with role \"both\""
    )]
    NoWholeWorker,
}
