use std::time::Duration;

use super::*;
use crate::shaping::{Arrival, FairQueue};

fn ask(band: usize, flow: &str, weight: u32) -> Ask<'_> {
    Ask { band, flow, weight }
}

fn none() -> Vec<(&'static str, u32)> {
    Vec::new()
}

fn fill(book: &mut SlotBook, flow: &str, n: usize) {
    let f: Arc<str> = Arc::from(flow);
    for _ in 0..n {
        assert!(book.may_take(ask(1, flow, 1), none()), "{flow} refused");
        book.take(&f, 1);
    }
}

#[test]
fn without_a_reserve_one_flow_takes_every_slot() {
    let mut book = SlotBook::new(8, 0, 0);
    fill(&mut book, "a", 8);
    assert!(!book.may_take(ask(1, "a", 1), none()));
    assert!(!book.may_take(ask(1, "b", 1), none()));
}

#[test]
fn a_flow_alone_leaves_the_reserve_free_and_a_newcomer_takes_it() {
    let mut book = SlotBook::new(8, 0, 2);
    fill(&mut book, "a", 5);
    assert!(
        !book.needs_shares(),
        "outside the reserve, shares do not matter"
    );
    fill(&mut book, "a", 1);
    assert!(book.needs_shares());
    // `a` is alone: its share is the 6 slots outside the reserve, and it holds them.
    assert!(!book.may_take(ask(1, "a", 1), none()));
    // `b` holds nothing, its share is 3: it takes the reserve at once, twice.
    fill(&mut book, "b", 2);
    assert_eq!((book.in_use(), book.held("a"), book.held("b")), (8, 6, 2));
    // `a` returns one: the slot is not `a`'s again (6 in use outside the reserve, `a` above
    // its share of 3) but `b`'s, still under its share.
    book.release("a");
    assert!(!book.may_take(ask(1, "a", 1), [("a", 1)]));
    assert!(book.may_take(ask(1, "b", 1), [("a", 1)]));
    // A third tenant `c` waiting shrinks the shares to 2: `b` holding 2 may not.
    assert!(!book.may_take(ask(1, "b", 1), [("a", 1), ("c", 1)]));
    assert!(book.may_take(ask(1, "c", 1), [("a", 1)]));
}

#[test]
fn shares_follow_the_weights() {
    let mut book = SlotBook::new(10, 0, 2);
    fill(&mut book, "a", 8);
    let b: Arc<str> = Arc::from("b");
    // Weight 3 against `a`'s 1: a share of 8 · 3/4 = 6 — `b` may take both reserved slots.
    for _ in 0..2 {
        assert!(book.may_take(ask(1, "b", 3), none()));
        book.take(&b, 3);
    }
    assert!(!book.may_take(ask(1, "b", 3), none()));
}

#[test]
fn the_headroom_stays_for_band_zero_whatever_the_share() {
    let mut book = SlotBook::new(8, 2, 1);
    fill(&mut book, "a", 5);
    assert!(!book.may_take(ask(1, "a", 1), none()));
    // `b` is under its share: the reserve (one slot), not the headroom.
    assert!(book.may_take(ask(1, "b", 1), none()));
    book.take(&Arc::from("b"), 1);
    assert!(!book.may_take(ask(1, "b", 1), none()));
    // Band 0 takes the headroom, flooding tenant or not.
    assert!(book.may_take(ask(0, "a", 1), none()));
}

/// The live discipline in virtual time: `flood` keeps 40 requests waiting for 8 slots with a
/// reserve of 2, `b` sends one request every 7 ticks, every request holds its slot 5 ticks.
/// Every one of `b`'s requests is granted the tick it arrives (no release waited for), the
/// flood keeps its cap busy, and every request is granted exactly once.
#[test]
fn a_flow_under_its_share_is_admitted_without_waiting_while_a_flood_holds_its_cap() {
    let (flood, b): (Arc<str>, Arc<str>) = (Arc::from("flood"), Arc::from("b"));
    let mut book = SlotBook::new(8, 0, 2);
    let mut queue: FairQueue<(Arc<str>, u64)> = FairQueue::new(1, 1000);
    let mut running: Vec<(u64, Arc<str>, u64)> = Vec::new(); // (ends at, flow, id)
    let (mut granted, mut sent, mut next_id) = (Vec::new(), 0u64, 0u64);
    let mut b_waited = 0;
    for tick in 0..2000u64 {
        // Releases first, then the queue is pumped.
        running.retain(|(end, flow, _)| {
            let done = *end <= tick;
            if done {
                book.release(flow);
            }
            !done
        });
        // The flood keeps 40 of its requests in the system.
        let flood_in = queue.depth(0, "flood") + book.held("flood");
        for _ in flood_in..40 {
            let arrival = Arrival {
                band: 0,
                flow: Arc::clone(&flood),
                weight: 1,
                sheddable: false,
                deadline: Duration::from_secs(1 << 30),
            };
            queue
                .push(Duration::ZERO, arrival, (Arc::clone(&flood), next_id))
                .unwrap();
            next_id += 1;
            sent += 1;
        }
        loop {
            let flows: Vec<(Arc<str>, u32)> =
                queue.flows().map(|(f, w)| (Arc::from(f), w)).collect();
            let Some(w) = queue.pop_where(|band, flow, weight| {
                book.may_take(
                    ask(band, flow, weight),
                    flows.iter().map(|(f, w)| (&**f, *w)),
                )
            }) else {
                break;
            };
            book.take(&w.item.0, 1);
            granted.push(w.item.1);
            running.push((tick + 5, w.item.0, w.item.1));
        }
        if tick % 7 == 0 {
            // `b` takes a slot at once when the book lets it; it would queue otherwise.
            let flows: Vec<(Arc<str>, u32)> =
                queue.flows().map(|(f, w)| (Arc::from(f), w)).collect();
            if book.may_take(ask(0, "b", 1), flows.iter().map(|(f, w)| (&**f, *w))) {
                book.take(&b, 1);
                granted.push(next_id);
                running.push((tick + 5, Arc::clone(&b), next_id));
            } else {
                b_waited += 1;
            }
            next_id += 1;
            sent += 1;
        }
        // The flood holds its cap: the slots outside the reserve, less what `b` holds there.
        assert!(
            book.held("flood") >= 6 - book.held("b").min(6),
            "tick {tick}"
        );
    }
    assert_eq!(b_waited, 0, "b waited for a release");
    let unique: std::collections::HashSet<_> = granted.iter().collect();
    assert_eq!(unique.len(), granted.len(), "a request granted twice");
    // Nothing lost: every request sent was granted or still waits / runs.
    assert_eq!(granted.len() + queue.len(), sent as usize);
}
