use super::*;

fn at(ms: u64) -> Duration {
    Duration::from_millis(ms)
}

fn arrival(band: usize, flow: &str, weight: u32, sheddable: bool) -> Arrival {
    Arrival {
        band,
        flow: Arc::from(flow),
        weight,
        sheddable,
        deadline: at(10_000),
    }
}

fn drain<T: Clone>(q: &mut FairQueue<T>) -> Vec<T> {
    std::iter::from_fn(|| q.pop().map(|w| w.item)).collect()
}

#[test]
fn bands_are_strict() {
    let mut q = FairQueue::new(3, 100);
    q.push(at(0), arrival(2, "a", 1, false), "low").unwrap();
    q.push(at(1), arrival(1, "a", 1, false), "mid").unwrap();
    q.push(at(2), arrival(0, "b", 1, false), "high").unwrap();
    q.push(at(3), arrival(1, "b", 1, false), "mid2").unwrap();
    assert_eq!(q.peek_band(), Some(0));
    assert_eq!(drain(&mut q), ["high", "mid", "mid2", "low"]);
    assert_eq!(q.peek_band(), None);
    assert!(q.is_empty());
}

#[test]
fn flows_of_a_band_share_by_weight() {
    let mut q = FairQueue::new(1, 1000);
    // `a` queued 300 before `b` and `c` queued anything.
    for i in 0..300 {
        q.push(at(i), arrival(0, "a", 1, false), "a").unwrap();
    }
    for i in 0..100 {
        q.push(at(300 + i), arrival(0, "b", 2, false), "b").unwrap();
        q.push(at(300 + i), arrival(0, "c", 1, false), "c").unwrap();
    }
    let first: Vec<&str> = (0..120).filter_map(|_| q.pop().map(|w| w.item)).collect();
    let count = |f: &str| first.iter().filter(|x| **x == f).count();
    // Weights 1 : 2 : 1 over the first 120 grants.
    assert_eq!((count("a"), count("b"), count("c")), (30, 60, 30));
    assert_eq!(q.len(), 500 - 120);
}

/// A flooding tenant cannot delay another tenant's request by more than one turn of the
/// ring: counted in grants, whatever the backlog.
#[test]
fn a_flood_delays_another_flow_by_one_turn_at_most() {
    let mut q = FairQueue::new(1, 10_000);
    let mut t = 0;
    for _ in 0..5000 {
        q.push(at(t), arrival(0, "flood", 1, false), "flood")
            .unwrap();
        t += 1;
    }
    for round in 0..50 {
        q.push(at(t), arrival(0, "calm", 1, false), "calm").unwrap();
        let mut grants = 0;
        loop {
            grants += 1;
            if q.pop().unwrap().item == "calm" {
                break;
            }
        }
        assert!(
            grants <= 2,
            "round {round}: calm served after {grants} grants"
        );
        t += 1;
    }
}

#[test]
fn a_full_queue_sheds_the_newest_sheddable_of_the_lowest_band() {
    let mut q = FairQueue::new(2, 3);
    q.push(at(0), arrival(1, "a", 1, true), "shed-old").unwrap();
    q.push(at(1), arrival(1, "a", 1, true), "shed-new").unwrap();
    q.push(at(2), arrival(0, "a", 1, true), "high-sheddable")
        .unwrap();
    // A sheddable arrival of band 1 outranks nothing sheddable below its own band.
    assert_eq!(
        q.push(at(3), arrival(1, "b", 1, true), "refused")
            .unwrap_err(),
        Refusal::Full
    );
    let queued = q.push(at(4), arrival(1, "b", 1, false), "kept").unwrap();
    assert_eq!(queued.shed.map(|w| w.item), Some("shed-new"));
    // A band-0 sheddable arrival displaces a band-1 sheddable request.
    let queued = q.push(at(5), arrival(0, "c", 1, true), "hs2").unwrap();
    assert_eq!(queued.shed.map(|w| w.item), Some("shed-old"));
    // Nothing sheddable is left below band 0 for a band-1 arrival.
    assert_eq!(
        q.push(at(6), arrival(1, "b", 1, false), "x").unwrap_err(),
        Refusal::Full
    );
    assert_eq!(drain(&mut q), ["high-sheddable", "hs2", "kept"]);
}

#[test]
fn nothing_is_lost_or_granted_twice() {
    let mut q = FairQueue::new(3, 50);
    let mut outcomes: HashMap<u64, &str> = HashMap::new();
    let mut pushed = 0u64;
    for i in 0..2000u64 {
        let a = Arrival {
            band: (i % 3) as usize,
            flow: Arc::from(["x", "y", "z"][(i % 7 % 3) as usize]),
            weight: 1 + (i % 2) as u32,
            sheddable: i % 5 == 0,
            deadline: at(i + 40),
        };
        pushed += 1;
        match q.push(at(i), a, i) {
            Ok(Queued { shed, .. }) => {
                if let Some(w) = shed {
                    assert!(outcomes.insert(w.item, "shed").is_none());
                }
            }
            Err(_) => assert!(outcomes.insert(i, "refused").is_none()),
        }
        for w in q.expire(at(i)) {
            assert!(w.arrival.deadline <= at(i));
            assert!(outcomes.insert(w.item, "expired").is_none());
        }
        if i % 3 == 0
            && let Some(w) = q.pop()
        {
            assert!(outcomes.insert(w.item, "granted").is_none());
        }
        if i % 11 == 0 && i > 0 {
            // Gives up waiting (the client went away): at most once.
            let id = i - 1;
            if let Some(w) = q.remove(id) {
                assert!(outcomes.insert(w.item, "gone").is_none());
            }
        }
    }
    while let Some(w) = q.pop() {
        assert!(outcomes.insert(w.item, "granted").is_none());
    }
    assert_eq!(
        outcomes.len() as u64,
        pushed,
        "every request has one outcome"
    );
    assert!(q.is_empty());
    assert_eq!(q.depth(0, "x"), 0);
}

#[test]
fn expire_takes_only_the_late() {
    let mut q = FairQueue::new(1, 10);
    let mut a = arrival(0, "a", 1, false);
    a.deadline = at(100);
    q.push(at(0), a.clone(), 1).unwrap();
    a.deadline = at(50);
    q.push(at(0), a, 2).unwrap();
    assert!(q.expire(at(49)).is_empty());
    assert_eq!(
        q.expire(at(50))
            .into_iter()
            .map(|w| w.item)
            .collect::<Vec<_>>(),
        [2]
    );
    assert_eq!(q.depth(0, "a"), 1);
    assert_eq!(q.expire(at(100)).len(), 1);
    assert!(q.is_empty());
}

#[test]
fn an_unknown_band_is_refused() {
    let mut q: FairQueue<()> = FairQueue::new(2, 10);
    assert_eq!(
        q.push(at(0), arrival(2, "a", 1, false), ()).unwrap_err(),
        Refusal::NoSuchBand
    );
}

/// A flow passed over (it may not take a slot now) keeps its place: the next grant it may take
/// is its own, in turn.
#[test]
fn a_flow_passed_over_keeps_its_turn() {
    let mut q = FairQueue::new(1, 100);
    for i in 0..3 {
        q.push(at(i), arrival(0, "a", 1, false), "a").unwrap();
        q.push(at(i), arrival(0, "b", 1, false), "b").unwrap();
    }
    // `a` is first in turn but may not: `b` is served, twice.
    let not_a = |_: usize, flow: &str, _: u32| flow != "a";
    assert_eq!(q.pop_where(not_a).map(|w| w.item), Some("b"));
    assert_eq!(q.pop_where(not_a).map(|w| w.item), Some("b"));
    // Allowed again, `a` is served before `b`'s last.
    assert_eq!(drain(&mut q), ["a", "b", "a", "a"]);
}
