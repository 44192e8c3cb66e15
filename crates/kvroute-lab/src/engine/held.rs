//! Prompt blocks a prefill engine keeps for a decode engine to pull.
//!
//! A prefill for a remote decode ([`super::request::Handoff::ToDecode`]) finishes after its
//! one token, but its KV must survive until the decode engine has read it. vLLM's NIXL
//! connector delays freeing such a request's blocks until the decode side notifies it that the
//! read is done, or until `VLLM_NIXL_ABORT_REQUEST_TIMEOUT` (480 s) passes without one (a
//! decode side that died, or a client that went away before the decode was sent). The same
//! here: the blocks stay referenced — counted in KV usage, never evicted, and still hit by
//! later prompts through the prefix cache — until [`HeldBlocks::release`] or the expiry.

use super::kv_cache::{BlockTable, KvCache};
use super::request::RequestId;
use kvroute_router::tokens::IdMap;

/// One finished prefill's blocks and when they are freed anyway.
#[derive(Debug)]
struct Held {
    table: BlockTable,
    expires: f64,
}

/// The blocks finished prefills hold for their decode engines, by request.
#[derive(Debug, Default)]
pub struct HeldBlocks {
    held: IdMap<RequestId, Held>,
}

impl HeldBlocks {
    /// Keeps `table`'s blocks for request `id` until released or `expires`.
    pub fn hold(&mut self, id: RequestId, table: BlockTable, expires: f64) {
        self.held.insert(id, Held { table, expires });
    }

    /// Whether request `id`'s blocks are held.
    pub fn contains(&self, id: RequestId) -> bool {
        self.held.contains_key(&id)
    }

    /// Requests whose blocks are held.
    pub fn len(&self) -> usize {
        self.held.len()
    }

    /// Whether nothing is held.
    pub fn is_empty(&self) -> bool {
        self.held.is_empty()
    }

    /// The decode side pulled request `id`'s KV: its blocks go back to the cache (cached
    /// blocks stay cached, as any finished request's do). Whether anything was held.
    pub fn release(&mut self, id: RequestId, cache: &mut KvCache) -> bool {
        let Some(mut h) = self.held.remove(&id) else {
            return false;
        };
        cache.free(&mut h.table);
        true
    }

    /// Frees every hold that expired by `now`; the requests, in id order.
    pub fn expire(&mut self, now: f64, cache: &mut KvCache) -> Vec<RequestId> {
        let mut due: Vec<RequestId> = self
            .held
            .iter()
            .filter(|(_, h)| h.expires <= now)
            .map(|(id, _)| *id)
            .collect();
        due.sort_unstable();
        for id in &due {
            self.release(*id, cache);
        }
        due
    }

    /// When the earliest hold expires.
    pub fn next_expiry(&self) -> Option<f64> {
        self.held.values().map(|h| h.expires).min_by(f64::total_cmp)
    }
}
