//! The client address of the request being handled, for what is bounded per client (the body
//! budget's share, see `body_budget`). The front door puts each connection's peer on its
//! requests (axum's `ConnectInfo`); [`scoped`] makes it readable, as [`current`], by everything
//! the handler runs, without threading it through every endpoint's signature.

use std::net::{IpAddr, SocketAddr};

use axum::extract::{ConnectInfo, Request};

tokio::task_local! {
    static PEER: Option<IpAddr>;
}

/// The client address the front door put on `req`.
pub(super) fn of(req: &Request) -> Option<IpAddr> {
    req.extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|ConnectInfo(a)| a.ip())
}

/// Runs the rest of the request (`rest`) with its client's address `peer` readable by
/// [`current`].
pub(super) async fn scoped<F: Future>(peer: Option<IpAddr>, rest: F) -> F::Output {
    PEER.scope(peer, rest).await
}

/// The address of the client whose request is being handled, when known.
pub(super) fn current() -> Option<IpAddr> {
    PEER.try_with(|p| *p).ok().flatten()
}
