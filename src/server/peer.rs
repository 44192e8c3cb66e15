//! The client address of the request being handled, for what is bounded per client (the body
//! budget's share, see `body_budget`). The front door puts each connection's peer on its
//! requests (axum's `ConnectInfo`); [`scope`] makes it readable, as [`current`], by everything
//! the handler runs, without threading it through every endpoint's signature.

use std::net::{IpAddr, SocketAddr};

use axum::extract::{ConnectInfo, Request};
use axum::middleware::Next;
use axum::response::Response;

tokio::task_local! {
    static PEER: Option<IpAddr>;
}

/// Runs the rest of the request with its client's address readable by [`current`].
pub(super) async fn scope(req: Request, next: Next) -> Response {
    let peer = req
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|ConnectInfo(a)| a.ip());
    PEER.scope(peer, next.run(req)).await
}

/// The address of the client whose request is being handled, when known.
pub(super) fn current() -> Option<IpAddr> {
    PEER.try_with(|p| *p).ok().flatten()
}
