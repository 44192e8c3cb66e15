//! Where a tenant stands for placement isolation (`routing::isolation`): over its fair share of
//! the router's slots while another tenant is active, within it while some other tenant is
//! over, or free.
//!
//! A tenant is **active** while it holds a slot, waits for one, or arrived within the last
//! `window`: a tenant sending a few short requests a second holds no slot between them, and
//! the workers a flood left to it must still be free when its next request comes. Its
//! **share** is the slot book's (`shaping::slots`): `pool · w / W` of the slots outside
//! headroom and reserve, `W` the weight of the active tenants. A tenant holding more than
//! that is over it, and is kept on `w / W` of the workers.
//!
//! Pure: the book, the queue's flows and the recent arrivals are passed in with the time.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use kvroute_core::routing::Stance;

use super::SlotBook;

/// Placement isolation's settings (`[priority] isolate`, `isolate_window_s`): reloadable.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Isolation {
    /// Whether a tenant over its share is kept on its share of the workers.
    pub enabled: bool,
    /// How long a tenant counts as active after its last arrival.
    pub window: Duration,
}

/// The default window: a few of a slow tenant's requests apart.
pub const DEFAULT_WINDOW: Duration = Duration::from_secs(5);

impl Default for Isolation {
    fn default() -> Self {
        Isolation {
            enabled: false,
            window: DEFAULT_WINDOW,
        }
    }
}

/// The last arrival of each tenant (and its weight), forgotten once older than the window.
#[derive(Debug, Default)]
pub struct Arrivals {
    last: HashMap<Arc<str>, (Duration, u32)>,
}

impl Arrivals {
    /// `flow` (of `weight`) arrived at `now`; arrivals older than `window` are forgotten (so
    /// the map holds the tenants of one window at most).
    pub fn arrived(&mut self, flow: &Arc<str>, weight: u32, now: Duration, window: Duration) {
        self.last
            .retain(|_, (at, _)| now.saturating_sub(*at) <= window);
        self.last.insert(Arc::clone(flow), (now, weight));
    }

    /// The tenants that arrived within `window` before `now`, with their weights.
    fn recent(&self, now: Duration, window: Duration) -> impl Iterator<Item = (&str, u32)> {
        self.last
            .iter()
            .filter(move |(_, (at, _))| now.saturating_sub(*at) <= window)
            .map(|(f, (_, w))| (&**f, *w))
    }
}

/// What the stance is computed from: the slots, the flows waiting, the recent arrivals.
pub struct Tenants<'a, W> {
    /// Who holds the router's slots.
    pub book: &'a SlotBook,
    /// The flows waiting and their weights (a flow may be listed more than once).
    pub waiting: W,
    /// The recent arrivals.
    pub arrivals: &'a Arrivals,
}

/// `flow`'s (of `weight`) stance at `now`: [`Stance::Over`] when it holds more than its share
/// while another tenant is active, [`Stance::Within`] naming the tenants over theirs when it
/// is not and some are, else [`Stance::Free`].
pub fn stance<'a, W: Iterator<Item = (&'a str, u32)>>(
    flow: &str,
    weight: u32,
    tenants: Tenants<'a, W>,
    now: Duration,
    window: Duration,
) -> Stance {
    let Tenants {
        book,
        waiting,
        arrivals,
    } = tenants;
    let mut active: HashMap<&str, u32> = HashMap::new();
    active.insert(flow, weight.max(1));
    let holders = book.holders().map(|(f, _, w)| (&**f, w));
    for (f, w) in holders.chain(waiting).chain(arrivals.recent(now, window)) {
        active.entry(f).or_insert(w.max(1));
    }
    if active.len() < 2 {
        return Stance::Free;
    }
    let total: u32 = active.values().copied().fold(0, u32::saturating_add);
    // Held more than `pool · w / total`, in integers: `held · total > pool · w`.
    let over = |held: usize, w: u32| {
        held as u64 * u64::from(total) > book.pool() as u64 * u64::from(w.max(1))
    };
    if over(book.held(flow), weight) {
        return Stance::Over {
            weight: weight.max(1),
            active_weight: total,
        };
    }
    let mut others: Vec<Arc<str>> = book
        .holders()
        .filter(|(f, held, w)| &***f != flow && over(*held, *w))
        .map(|(f, _, _)| Arc::clone(f))
        .collect();
    if others.is_empty() {
        return Stance::Free;
    }
    others.sort();
    Stance::Within { over: others }
}

#[cfg(test)]
mod tests {
    use super::*;

    const WINDOW: Duration = Duration::from_secs(5);

    fn at(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    fn book(held: &[(&str, usize, u32)]) -> SlotBook {
        // 8 slots, 2 of headroom, 2 of reserve: a pool of 4.
        let mut b = SlotBook::new(8, 2, 2);
        for (f, n, w) in held {
            let flow: Arc<str> = (*f).into();
            for _ in 0..*n {
                b.take(&flow, *w);
            }
        }
        b
    }

    fn of(
        flow: &str,
        b: &SlotBook,
        waiting: &[(&str, u32)],
        arrivals: &Arrivals,
        now: u64,
    ) -> Stance {
        let tenants = Tenants {
            book: b,
            waiting: waiting.iter().copied(),
            arrivals,
        };
        stance(flow, 1, tenants, at(now), WINDOW)
    }

    #[test]
    fn a_tenant_alone_is_free_however_much_it_holds() {
        let b = book(&[("a", 4, 1)]);
        assert_eq!(of("a", &b, &[], &Arrivals::default(), 0), Stance::Free);
        assert_eq!(
            of("a", &b, &[("a", 1)], &Arrivals::default(), 0),
            Stance::Free
        );
    }

    #[test]
    fn a_tenant_over_its_share_is_confined_while_another_holds_waits_or_came_lately() {
        let none = Arrivals::default();
        let over = Stance::Over {
            weight: 1,
            active_weight: 2,
        };
        // `b` holds a slot: `a`'s 3 of a pool of 4 are over its 2.
        let b = book(&[("a", 3, 1), ("b", 1, 1)]);
        assert_eq!(of("a", &b, &[], &none, 0), over);
        let within = Stance::Within {
            over: vec!["a".into()],
        };
        assert_eq!(of("b", &b, &[], &none, 0), within);
        // Exactly its share is not over it.
        let even = book(&[("a", 2, 1), ("b", 2, 1)]);
        assert_eq!(of("a", &even, &[], &none, 0), Stance::Free);
        // `b` holds nothing but waits, or came within the window.
        let alone = book(&[("a", 4, 1)]);
        assert_eq!(of("a", &alone, &[("b", 1)], &none, 0), over);
        let mut arrivals = Arrivals::default();
        arrivals.arrived(&"b".into(), 1, at(10), WINDOW);
        assert_eq!(of("a", &alone, &[], &arrivals, 15), over);
        assert_eq!(
            of("a", &alone, &[], &arrivals, 16),
            Stance::Free,
            "window passed"
        );
        // A newcomer holding nothing yet is within its share, kept off `a`'s workers.
        assert_eq!(of("b", &alone, &[], &none, 0), within);
    }

    #[test]
    fn weights_set_the_share_and_old_arrivals_are_forgotten() {
        let none = Arrivals::default();
        // `a` of weight 3 beside `b` of 1: a share of 3 of 4; 3 held is not over it.
        let b = book(&[("a", 3, 3), ("b", 1, 1)]);
        let t = Tenants {
            book: &b,
            waiting: std::iter::empty(),
            arrivals: &none,
        };
        assert_eq!(stance("a", 3, t, at(0), WINDOW), Stance::Free);
        let mut arrivals = Arrivals::default();
        arrivals.arrived(&"x".into(), 1, at(0), WINDOW);
        arrivals.arrived(&"y".into(), 1, at(9), WINDOW);
        assert_eq!(
            arrivals.last.len(),
            1,
            "x's arrival is older than the window"
        );
    }
}
