//! The bytes of request bodies being read and parsed at once (`limits.max_body_bytes_in_flight`),
//! router-wide and per client address.
//!
//! Bytes are claimed as they arrive (see `body::read_claimed`), never from a declared
//! `Content-Length`: four request heads declaring 32 MiB each used to hold the whole default
//! budget. And no one client address (peer) may hold more than half the budget (at least one
//! largest body): a client that sends real bytes and then stalls can take its share, not
//! everyone's. Behind a proxy on the same address, its clients share that half.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use super::refusal::too_many;
use crate::metrics::Metrics;
use crate::openai::ApiError;

/// The bytes of request bodies being read and parsed at once.
#[derive(Debug)]
pub struct BodyBudget {
    /// Shared with the claims, so that a reload's new limit applies to bodies being read.
    limit: Arc<AtomicUsize>,
    in_flight: Arc<AtomicUsize>,
    /// Bytes claimed per peer, for the peers holding any.
    peers: Arc<Mutex<HashMap<IpAddr, usize>>>,
}

/// One request's share of the [`BodyBudget`], returned when dropped.
#[derive(Debug)]
pub struct BodyClaim {
    limit: Arc<AtomicUsize>,
    in_flight: Arc<AtomicUsize>,
    peers: Arc<Mutex<HashMap<IpAddr, usize>>>,
    /// The client's address, and the largest body it may send (`server.max_body_bytes`).
    peer: Option<(IpAddr, usize)>,
    bytes: usize,
}

/// The most one peer may hold of a budget of `limit` bytes, where a body may be `max_body`
/// bytes: half the budget, but at least one largest body (within the budget).
fn peer_share(limit: usize, max_body: usize) -> usize {
    (limit / 2).max(max_body).min(limit)
}

impl BodyBudget {
    /// A budget of `limit` bytes.
    pub fn new(limit: usize) -> BodyBudget {
        BodyBudget {
            limit: Arc::new(AtomicUsize::new(limit)),
            in_flight: Arc::new(AtomicUsize::new(0)),
            peers: Arc::new(Mutex::new(HashMap::new())),
        }
    }

    /// An empty claim, grown as the body arrives, for a client at `peer` (`None`: unknown,
    /// bound by the router-wide budget only) whose bodies may be `max_body` bytes.
    pub fn claim(&self, peer: Option<IpAddr>, max_body: usize) -> BodyClaim {
        BodyClaim {
            limit: Arc::clone(&self.limit),
            in_flight: Arc::clone(&self.in_flight),
            peers: Arc::clone(&self.peers),
            peer: peer.map(|ip| (ip.to_canonical(), max_body)),
            bytes: 0,
        }
    }

    /// A new limit (a config reload); bytes already claimed stay claimed.
    pub(super) fn set_limit(&self, limit: usize) {
        self.limit.store(limit, Ordering::Release);
    }

    /// Bytes claimed now.
    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Relaxed)
    }
}

impl BodyClaim {
    /// Claims `n` more bytes, or refuses (429) when the budget cannot hold them
    /// (`body_bytes_in_flight`) or the client's address already holds its share
    /// (`body_bytes_per_client`); a refused claim keeps what it had.
    pub fn grow(&mut self, n: usize, metrics: &Metrics) -> Result<(), ApiError> {
        let limit = self.limit.load(Ordering::Acquire);
        let grown = self
            .in_flight
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |cur| {
                cur.checked_add(n).filter(|&next| next <= limit)
            });
        if grown.is_err() {
            return Err(too_many(
                "the router is reading too many large request bodies at once; retry later".into(),
                "body_bytes_in_flight",
                metrics,
            ));
        }
        if let Some((ip, max_body)) = self.peer {
            let mut peers = self.peers.lock().unwrap_or_else(|e| e.into_inner());
            let held = peers.entry(ip).or_default();
            if held.saturating_add(n) > peer_share(limit, max_body) {
                if *held == 0 {
                    peers.remove(&ip);
                }
                drop(peers);
                self.in_flight.fetch_sub(n, Ordering::AcqRel);
                return Err(too_many(
                    "this client is sending too many large request bodies at once; retry later"
                        .into(),
                    "body_bytes_per_client",
                    metrics,
                ));
            }
            *held += n;
        }
        self.bytes += n;
        Ok(())
    }

    /// Bytes held by this claim.
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

impl Drop for BodyClaim {
    fn drop(&mut self) {
        self.in_flight.fetch_sub(self.bytes, Ordering::AcqRel);
        if let Some((ip, _)) = self.peer
            && self.bytes > 0
        {
            let mut peers = self.peers.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(held) = peers.get_mut(&ip) {
                *held = held.saturating_sub(self.bytes);
                if *held == 0 {
                    peers.remove(&ip);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use http::StatusCode;

    use super::*;

    #[test]
    fn body_claims_share_the_budget_and_return_it() {
        let m = Metrics::new();
        let budget = BodyBudget::new(100);
        let mut a = budget.claim(None, 100);
        a.grow(60, &m).unwrap();
        let mut b = budget.claim(None, 100);
        let e = b.grow(41, &m).unwrap_err();
        assert_eq!(e.status, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(e.code, Some("body_bytes_in_flight"));
        assert_eq!(b.bytes(), 0, "a refused claim takes nothing");
        b.grow(40, &m).unwrap();
        assert_eq!(budget.in_flight(), 100);
        drop(a);
        assert_eq!(budget.in_flight(), 40);
        b.grow(usize::MAX, &m).unwrap_err();
        drop(b);
        assert_eq!(budget.in_flight(), 0);
        assert_eq!(
            m.rejected
                .with_label_values(&["body_bytes_in_flight"])
                .get(),
            2
        );
    }

    /// Issue 35 item 2: one client could take the whole budget; it takes half now (at least
    /// one largest body), and the rest stays for others.
    #[test]
    fn one_client_holds_at_most_half_the_budget() {
        let m = Metrics::new();
        let budget = BodyBudget::new(400);
        let (one, two): (IpAddr, IpAddr) =
            ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
        let mut a = budget.claim(Some(one), 100);
        a.grow(100, &m).unwrap();
        let mut b = budget.claim(Some(one), 100);
        b.grow(100, &m).unwrap();
        let mut c = budget.claim(Some(one), 100);
        let e = c.grow(1, &m).unwrap_err();
        assert_eq!(e.code, Some("body_bytes_per_client"));
        assert_eq!(budget.in_flight(), 200, "the refused byte was given back");
        let mut other = budget.claim(Some(two), 100);
        other.grow(200, &m).unwrap();
        drop(a);
        c.grow(100, &m).unwrap();
        drop(other);
        // The same client through an IPv4-mapped IPv6 address is the same peer.
        let mapped: IpAddr = "::ffff:10.0.0.1".parse().unwrap();
        let mut d = budget.claim(Some(mapped), 100);
        assert_eq!(
            d.grow(1, &m).unwrap_err().code,
            Some("body_bytes_per_client")
        );
        drop((b, c, d));
        assert_eq!(budget.in_flight(), 0);
        assert!(budget.peers.lock().unwrap().is_empty());
        // A budget of one largest body: a lone client may still send one.
        assert_eq!(peer_share(100, 100), 100);
        assert_eq!(peer_share(400, 100), 200);
    }
}
