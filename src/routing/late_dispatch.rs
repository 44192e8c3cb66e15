//! Late dispatch: requests wait in the router, not in an engine's queue, while every candidate
//! is saturated, and are bound to a worker when one frees.
//!
//! A request sent to an engine whose waiting queue is long is committed to that engine: if
//! another worker frees first (a prefill ran shorter than predicted, decodes ended), it still
//! waits its turn where it is. Holding it in the router while *every* candidate already has at
//! least a full chunked-prefill step of work queued, and deciding only when one drops below
//! that, binds each request with the freshest view (Preble's global queue, llm-d's flow
//! control). Below saturation nothing is held, so an idle or lightly loaded fleet routes
//! exactly as without the queue.
//!
//! Saturation is counted in prefill *tokens* the router booked and not yet seen start
//! ([`LoadSnapshot::queued_prefill_tokens`]), not requests: one 30k-token prompt is several
//! steps of work, ten short ones may share one step.
//!
//! The wait is bounded (`max_wait_s`): a request held that long is dispatched whatever the
//! fleet's state, so holding can delay but never starve. Tenants take turns (one request each
//! per round), so one tenant's burst cannot hold every other tenant's requests behind it.
//!
//! Pure: no clock, no I/O; the caller passes times in seconds (virtual or wall).

use std::collections::VecDeque;

use crate::fleet::LoadSnapshot;

/// Settings of the router-side queue.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LateDispatchConfig {
    /// Hold requests while every candidate has at least this many prefill tokens queued; 0
    /// turns late dispatch off.
    pub hold_queued_tokens: u64,
    /// The longest a request is held, seconds.
    pub max_wait_s: f64,
}

impl Default for LateDispatchConfig {
    fn default() -> Self {
        LateDispatchConfig {
            hold_queued_tokens: 0,
            max_wait_s: 0.5,
        }
    }
}

impl LateDispatchConfig {
    /// Whether requests are ever held.
    pub fn enabled(&self) -> bool {
        self.hold_queued_tokens > 0
    }

    /// Whether every one of `loads` (the candidates' views) is saturated; false without any
    /// candidate (nothing to wait for) or when late dispatch is off.
    pub fn saturated<'a>(&self, loads: impl IntoIterator<Item = &'a LoadSnapshot>) -> bool {
        if !self.enabled() {
            return false;
        }
        let mut any = false;
        for l in loads {
            if l.queued_prefill_tokens < self.hold_queued_tokens {
                return false;
            }
            any = true;
        }
        any
    }
}

/// A request waiting in the router.
#[derive(Clone, Debug, PartialEq)]
struct Held<T> {
    item: T,
    since_s: f64,
}

/// Requests held by the router: first in, first out within a tenant, tenants in turn.
#[derive(Clone, Debug)]
pub struct HeldQueue<T> {
    /// Per tenant, its waiting requests; the front tenant is served next.
    tenants: VecDeque<(u64, VecDeque<Held<T>>)>,
    len: usize,
}

impl<T> Default for HeldQueue<T> {
    fn default() -> Self {
        HeldQueue {
            tenants: VecDeque::new(),
            len: 0,
        }
    }
}

impl<T> HeldQueue<T> {
    /// Requests held.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing is held.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Holds `item` of `tenant` from `now_s`.
    pub fn push(&mut self, tenant: u64, item: T, now_s: f64) {
        let held = Held {
            item,
            since_s: now_s,
        };
        match self.tenants.iter_mut().find(|(t, _)| *t == tenant) {
            Some((_, q)) => q.push_back(held),
            None => self.tenants.push_back((tenant, VecDeque::from([held]))),
        }
        self.len += 1;
    }

    /// The next request in fair order (the front tenant's oldest; that tenant then goes to
    /// the back), with when it was held.
    pub fn pop(&mut self) -> Option<(T, f64)> {
        let (tenant, mut q) = self.tenants.pop_front()?;
        let held = q.pop_front()?;
        if !q.is_empty() {
            self.tenants.push_back((tenant, q));
        }
        self.len -= 1;
        Some((held.item, held.since_s))
    }

    /// The oldest request held at least `max_wait_s` by `now_s`, whatever its tenant's turn.
    pub fn pop_expired(&mut self, now_s: f64, max_wait_s: f64) -> Option<(T, f64)> {
        let (k, _) = self
            .tenants
            .iter()
            .enumerate()
            .filter_map(|(k, (_, q))| q.front().map(|h| (k, h.since_s)))
            .filter(|&(_, since)| now_s - since >= max_wait_s)
            .min_by(|a, b| a.1.total_cmp(&b.1))?;
        let (tenant, mut q) = self.tenants.remove(k)?;
        let held = q.pop_front()?;
        if !q.is_empty() {
            self.tenants.insert(k, (tenant, q));
        }
        self.len -= 1;
        Some((held.item, held.since_s))
    }

    /// When the oldest held request reaches `max_wait_s`, if any is held.
    pub fn next_deadline(&self, max_wait_s: f64) -> Option<f64> {
        self.tenants
            .iter()
            .filter_map(|(_, q)| q.front().map(|h| h.since_s + max_wait_s))
            .min_by(f64::total_cmp)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn queued(tokens: u64) -> LoadSnapshot {
        LoadSnapshot {
            queued_prefill_tokens: tokens,
            ..LoadSnapshot::default()
        }
    }

    #[test]
    fn holds_only_while_every_candidate_is_saturated() {
        let off = LateDispatchConfig::default();
        assert!(!off.saturated(&[queued(1 << 20)]));
        let on = LateDispatchConfig {
            hold_queued_tokens: 8192,
            max_wait_s: 0.5,
        };
        assert!(on.saturated(&[queued(8192), queued(20_000)]));
        assert!(!on.saturated(&[queued(8192), queued(8191)]));
        assert!(!on.saturated(&[]), "no candidate: nothing to wait for");
    }

    #[test]
    fn tenants_take_turns_and_each_is_first_in_first_out() {
        let mut q = HeldQueue::default();
        for (i, tenant) in [1, 1, 1, 2, 2, 3].into_iter().enumerate() {
            q.push(tenant, i, i as f64);
        }
        assert_eq!(q.len(), 6);
        let order: Vec<usize> = std::iter::from_fn(|| q.pop().map(|(i, _)| i)).collect();
        assert_eq!(order, [0, 3, 5, 1, 4, 2]);
        assert!(q.is_empty());
    }

    #[test]
    fn the_oldest_expired_request_leaves_first_whatever_its_turn() {
        let mut q = HeldQueue::default();
        q.push(1, "a", 0.0);
        q.push(2, "b", 0.3);
        q.push(1, "c", 0.4);
        assert_eq!(q.next_deadline(0.5), Some(0.5));
        assert_eq!(q.pop_expired(0.49, 0.5), None);
        assert_eq!(q.pop_expired(0.85, 0.5), Some(("a", 0.0)));
        assert_eq!(q.pop_expired(0.85, 0.5), Some(("b", 0.3)));
        assert_eq!(q.pop_expired(0.85, 0.5), None, "c waited 0.45 s");
        assert_eq!(q.next_deadline(0.5), Some(0.9));
        assert_eq!(q.pop(), Some(("c", 0.4)));
        assert_eq!(q.next_deadline(0.5), None);
    }
}
