//! Who may take a router slot now: the slots each flow (tenant) holds, the headroom kept for
//! the highest band, and the **fair reserve** kept for flows under their fair share.
//!
//! Why a reserve: the queue ([`super::FairQueue`]) shares the slots that are *freed* fairly,
//! but at saturation every slot is busy, so a tenant under its share that arrives behind a
//! flood still waits for one of the flood's requests to end (measured: ×6–9 its TTFT p90).
//! A slot cannot be taken back from a running request, so the only way such a tenant starts
//! at once is that a slot is already free: `reserve` slots are kept free of every flow at or
//! above its share, and only a flow under its share may take them.
//!
//! A flow's share is of the slots outside the reserve, `(limit − headroom − reserve) · w / W`,
//! `W` the weight of the active flows (holding a slot or waiting for one, itself included).
//! So a tenant alone fills every slot but the reserve and the headroom, two flooding tenants
//! hold half of those each, and a third arriving finds the reserve free. The price: while no
//! tenant under its share comes, the reserve idles (hence `0` by default: only an operator of
//! several tenants knows how many arrive at once).
//!
//! Pure: counts only, no lock and no clock; `server::gate` holds it with the queue.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

/// A flow's held slots and weight.
#[derive(Clone, Copy, Debug)]
struct Held {
    slots: usize,
    weight: u32,
}

/// The slots and who holds them; see the module's documentation.
#[derive(Debug)]
pub struct SlotBook {
    limit: usize,
    /// Slots only band 0 may take.
    headroom: usize,
    /// Slots only flows under their fair share may take.
    reserve: usize,
    in_use: usize,
    held: HashMap<Arc<str>, Held>,
}

/// A request asking for a slot: its band, flow and the flow's weight.
#[derive(Clone, Copy, Debug)]
pub struct Ask<'a> {
    /// Its priority band (0 the highest).
    pub band: usize,
    /// Its flow (tenant).
    pub flow: &'a str,
    /// The flow's weight (at least 1).
    pub weight: u32,
}

impl SlotBook {
    /// `limit` slots, `headroom` of them for band 0, `reserve` for flows under their share.
    pub fn new(limit: usize, headroom: usize, reserve: usize) -> SlotBook {
        SlotBook {
            limit,
            headroom,
            reserve,
            in_use: 0,
            held: HashMap::new(),
        }
    }

    /// New slot count: fewer take effect as held slots are returned.
    pub fn set_limit(&mut self, limit: usize) {
        self.limit = limit;
    }

    /// Slots held now.
    pub fn in_use(&self) -> usize {
        self.in_use
    }

    /// The slot count.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Slots `flow` holds.
    pub fn held(&self, flow: &str) -> usize {
        self.held.get(flow).map_or(0, |h| h.slots)
    }

    /// The flows holding slots: each one's slots and weight (in no particular order).
    pub fn holders(&self) -> impl Iterator<Item = (&Arc<str>, usize, u32)> {
        self.held.iter().map(|(f, h)| (f, h.slots, h.weight))
    }

    /// The slots fair shares are taken of: all but the headroom and the reserve.
    pub fn pool(&self) -> usize {
        self.limit
            .saturating_sub(self.headroom)
            .saturating_sub(self.reserve)
    }

    /// Whether [`SlotBook::may_take`] would look at the flows waiting now: only when a fair
    /// reserve is set and the slots left reach into it (callers skip listing them otherwise).
    pub fn needs_shares(&self) -> bool {
        self.reserve > 0 && self.in_use + self.headroom + self.reserve >= self.limit
    }

    /// Whether `ask` may take a slot now, `waiting` being the flows waiting and their
    /// weights (any band; a flow listed twice counts once).
    ///
    /// A slot must be free beyond the headroom (unless band 0); beyond the reserve too,
    /// unless the flow holds fewer slots than its fair share.
    pub fn may_take<'a>(
        &self,
        ask: Ask<'_>,
        waiting: impl IntoIterator<Item = (&'a str, u32)>,
    ) -> bool {
        let headroom = if ask.band == 0 { 0 } else { self.headroom };
        if self.in_use + headroom >= self.limit {
            return false;
        }
        if self.reserve == 0 || self.in_use + headroom + self.reserve < self.limit {
            return true;
        }
        (self.held(ask.flow) as f64) < self.share(ask, waiting)
    }

    /// `ask`'s flow's fair share of the slots outside headroom and reserve, among the active
    /// flows (holding or waiting, itself included).
    fn share<'a>(&self, ask: Ask<'_>, waiting: impl IntoIterator<Item = (&'a str, u32)>) -> f64 {
        let mut total = u64::from(ask.weight.max(1));
        for (flow, h) in &self.held {
            if &**flow != ask.flow {
                total += u64::from(h.weight.max(1));
            }
        }
        let mut seen = HashSet::new();
        for (flow, weight) in waiting {
            if flow != ask.flow && !self.held.contains_key(flow) && seen.insert(flow) {
                total += u64::from(weight.max(1));
            }
        }
        self.pool() as f64 * f64::from(ask.weight.max(1)) / total as f64
    }

    /// `flow` takes a slot (the caller checked [`SlotBook::may_take`]).
    pub fn take(&mut self, flow: &Arc<str>, weight: u32) {
        self.in_use += 1;
        let h = self
            .held
            .entry(Arc::clone(flow))
            .or_insert(Held { slots: 0, weight });
        h.slots += 1;
        h.weight = weight;
    }

    /// `flow` returns a slot.
    pub fn release(&mut self, flow: &str) {
        self.in_use = self.in_use.saturating_sub(1);
        if let Some(h) = self.held.get_mut(flow) {
            h.slots = h.slots.saturating_sub(1);
            if h.slots == 0 {
                self.held.remove(flow);
            }
        }
    }
}

#[cfg(test)]
#[path = "slots_tests.rs"]
mod tests;
