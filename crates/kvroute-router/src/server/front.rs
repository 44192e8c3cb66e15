//! The steps every request takes before its route's handler, as one middleware: a request
//! that went round a routing loop is refused (`hops`), the rest get an id (`request_id`) and
//! run with their client's address readable (`peer`). One `from_fn` layer where there were
//! three: each layer boxed its own futures and cloned its own service stack on every request
//! (about 20 of a small request's ~110 allocations, `scripts/alloc-per-request.sh`).

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;

use super::{AppState, hops, peer, request_id};

/// See the module doc; the order is the three layers' order: the loop check first (its 508
/// carries no request id), the id inside the client's address scope.
pub(super) async fn front(
    State(state): State<Arc<AppState>>,
    request: Request,
    next: Next,
) -> Response {
    if let Some(refused) = hops::loop_refused(&state, &request) {
        return refused;
    }
    let client = peer::of(&request);
    peer::scoped(client, request_id::stamp(request, next)).await
}
