//! Connection pools to the workers: the one every thread shares, and one per thread for the
//! threads that run a runtime of their own (`kvroute serve`'s front door).
//!
//! hyper's client drives each pooled connection in a task on the runtime that opened it. On a
//! thread with its own single-threaded runtime, a connection from the shared pool may belong
//! to another thread's runtime, and then every read and write of the request wakes that
//! thread. A pool owned by the thread keeps a request's whole trip on the thread serving it.

use std::cell::RefCell;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::Request;
use http_body_util::Full;
use hyper_util::client::legacy::{Client, ResponseFuture};
use hyper_util::rt::{TokioExecutor, TokioTimer};

use crate::tls::upstream::WorkerConnector;

/// The pooled HTTP client to the workers.
pub(super) type UpstreamClient = Client<WorkerConnector, Full<Bytes>>;

/// How long an idle pooled connection is kept.
const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(90);

/// Ids of the [`Pools`] made in this process, so a thread's own pools are told apart.
static NEXT_ID: AtomicU64 = AtomicU64::new(0);

thread_local! {
    /// The pools this thread owns, by the id of the [`Pools`] they belong to.
    static OWN: RefCell<Vec<(u64, UpstreamClient)>> = const { RefCell::new(Vec::new()) };
}

/// What a new pool is made from, shared by an upstream's clones.
#[derive(Clone)]
pub(super) struct Pools {
    inner: Arc<Recipe>,
}

struct Recipe {
    id: u64,
    connector: WorkerConnector,
    max_idle_per_host: usize,
}

impl Pools {
    pub(super) fn new(connector: WorkerConnector, max_idle_per_host: usize) -> Pools {
        Pools {
            inner: Arc::new(Recipe {
                id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
                connector,
                max_idle_per_host,
            }),
        }
    }

    /// A client with a pool of its own.
    pub(super) fn client(&self) -> UpstreamClient {
        Client::builder(TokioExecutor::new())
            .pool_timer(TokioTimer::new())
            .pool_idle_timeout(POOL_IDLE_TIMEOUT)
            .pool_max_idle_per_host(self.inner.max_idle_per_host)
            .build(self.inner.connector.clone())
    }

    /// Gives the calling thread a pool of its own (once).
    pub(super) fn own_on_this_thread(&self) {
        let id = self.inner.id;
        OWN.with(|own| {
            let mut own = own.borrow_mut();
            if !own.iter().any(|(i, _)| *i == id) {
                own.push((id, self.client()));
            }
        });
    }

    /// Sends `req` through the calling thread's own pool, or through `shared` where the thread
    /// has none.
    pub(super) fn request(
        &self,
        shared: &UpstreamClient,
        req: Request<Full<Bytes>>,
    ) -> ResponseFuture {
        let id = self.inner.id;
        OWN.with(|own| {
            let own = own.borrow();
            match own.iter().find(|(i, _)| *i == id) {
                Some((_, client)) => client.request(req),
                None => shared.request(req),
            }
        })
    }
}
