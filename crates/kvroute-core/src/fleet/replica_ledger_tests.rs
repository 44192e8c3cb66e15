use std::cell::RefCell;

use super::*;
use crate::fleet::running_blocks::STRIDE;

/// This replica's loads, found by `find`, and the working-set touches bookings make.
struct Loads<F> {
    find: F,
    touched: RefCell<Vec<(TargetKey, Vec<BlockHash>, Duration)>>,
}

fn loads<F: Fn(&TargetKey) -> Option<Arc<Load>>>(find: F) -> Loads<F> {
    Loads {
        find,
        touched: RefCell::default(),
    }
}

impl<F: Fn(&TargetKey) -> Option<Arc<Load>>> Landing for Loads<F> {
    fn load_of(&self, target: &TargetKey) -> Option<Arc<Load>> {
        (self.find)(target)
    }

    fn touch(&self, target: &TargetKey, hashes: &[BlockHash], now: Duration) {
        self.touched
            .borrow_mut()
            .push((target.clone(), hashes.to_vec(), now));
    }
}

fn key(w: &str) -> TargetKey {
    TargetKey {
        worker: w.into(),
        rank: 0,
    }
}

fn note(request: u64, step: BookingStep) -> BookingNote {
    BookingNote {
        target: key("w0"),
        request,
        step,
    }
}

/// A booking of 100 prompt tokens, 60 to compute, without hashes (an older replica's).
fn booked() -> BookingStep {
    BookingStep::Booked {
        prompt_tokens: 100,
        prefill_tokens: 60,
        blocks: PromptBlocks::default(),
    }
}

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

#[test]
fn another_replicas_request_is_known_load_from_booking_to_end() {
    let load = Arc::new(Load::default());
    let mut ledger = ReplicaLedger::new(secs(3));
    let find = loads(|t: &TargetKey| (t == &key("w0")).then(|| Arc::clone(&load)));
    assert_eq!(
        ledger.apply("b", &note(7, booked()), &find, secs(0)),
        Applied::Applied
    );
    let s = load.snapshot();
    assert_eq!(
        (s.in_flight, s.queued_prefill_tokens, s.active_prompt_tokens),
        (1, 60, 100)
    );
    assert_eq!(
        ledger.apply("b", &note(7, BookingStep::FirstToken), &find, secs(0)),
        Applied::Applied
    );
    assert_eq!(
        (
            load.snapshot().queued_prefill_tokens,
            load.snapshot().decoding
        ),
        (0, 1)
    );
    assert_eq!(
        ledger.apply("b", &note(7, BookingStep::Freed), &find, secs(0)),
        Applied::Applied
    );
    assert_eq!(load.snapshot().in_flight, 0);
    assert_eq!(ledger.booked(), 0);
}

#[test]
fn a_repeated_booking_is_applied_once_and_steps_of_unknown_requests_are_ignored() {
    let load = Arc::new(Load::default());
    let mut ledger = ReplicaLedger::new(secs(3));
    let find = loads(|_: &TargetKey| Some(Arc::clone(&load)));
    ledger.apply("b", &note(1, booked()), &find, secs(0));
    assert_eq!(
        ledger.apply("b", &note(1, booked()), &find, secs(0)),
        Applied::Ignored
    );
    // The same number from another replica is another request.
    assert_eq!(
        ledger.apply("c", &note(1, booked()), &find, secs(0)),
        Applied::Applied
    );
    assert_eq!(load.snapshot().in_flight, 2);
    assert_eq!(
        ledger.apply("b", &note(9, BookingStep::Freed), &find, secs(0)),
        Applied::Ignored
    );
    assert_eq!(load.snapshot().in_flight, 2);
    assert_eq!(
        ledger.apply("b", &note(2, booked()), &loads(|_| None), secs(0)),
        Applied::UnknownTarget
    );
    assert_eq!(ledger.booked(), 2);
}

#[test]
fn a_silent_replicas_bookings_expire_and_a_heard_ones_stay() {
    let load = Arc::new(Load::default());
    let mut ledger = ReplicaLedger::new(secs(3));
    let find = loads(|_: &TargetKey| Some(Arc::clone(&load)));
    ledger.heard("b", 0, secs(10));
    ledger.apply("b", &note(1, booked()), &find, secs(0));
    ledger.heard("c", 0, secs(10));
    ledger.apply("c", &note(1, booked()), &find, secs(0));
    ledger.heard("c", 1, secs(12));
    assert!(ledger.expire(secs(13)).is_empty(), "3 s is not past 3 s");
    let gone = ledger.expire(secs(14));
    assert_eq!(gone, vec![Arc::<str>::from("b")]);
    assert_eq!(load.snapshot().in_flight, 1, "only c's request is left");
    assert_eq!(ledger.replicas(), vec![Arc::<str>::from("c")]);
    ledger.clear();
    assert_eq!(load.snapshot().in_flight, 0, "losing the bus releases all");
}

#[test]
fn gaps_in_a_replicas_numbers_count_lost_messages() {
    let mut ledger = ReplicaLedger::new(secs(3));
    assert_eq!(ledger.heard("b", 5, secs(0)), 0, "first heard: no loss");
    assert_eq!(ledger.heard("b", 6, secs(0)), 0);
    assert_eq!(ledger.heard("b", 9, secs(0)), 2);
    assert_eq!(ledger.heard("b", 3, secs(0)), 0, "renumbered: no loss");
    assert_eq!(ledger.heard("b", 4, secs(0)), 0);
}

#[test]
fn a_snapshot_replaces_what_was_held_for_its_replica_only() {
    let a = Arc::new(Load::default());
    let b = Arc::new(Load::default());
    let mut ledger = ReplicaLedger::new(secs(3));
    let find = loads(|t: &TargetKey| {
        if t == &key("w0") {
            Some(Arc::clone(&a))
        } else {
            Some(Arc::clone(&b))
        }
    });
    // Heard: requests 1 and 2 on w0; 2's end was lost. Another replica's 1 stays untouched.
    ledger.apply("r", &note(1, booked()), &find, secs(0));
    ledger.apply("r", &note(2, booked()), &find, secs(0));
    ledger.apply("other", &note(1, booked()), &find, secs(0));
    let live = [
        LiveBooking {
            request: 1,
            target: key("w0"),
            prompt_tokens: 100,
            prefill_tokens: 60,
            first_token: true,
        },
        LiveBooking {
            request: 3,
            target: key("w1"),
            prompt_tokens: 50,
            prefill_tokens: 50,
            first_token: false,
        },
    ];
    ledger.replace("r", &live, &find);
    ledger.replace("r", &live, &find);
    let (sa, sb) = (a.snapshot(), b.snapshot());
    assert_eq!(
        (sa.in_flight, sa.decoding, sa.queued_prefill_tokens),
        (2, 1, 60)
    );
    assert_eq!((sb.in_flight, sb.queued_prefill_tokens), (1, 50));
    assert_eq!(ledger.booked(), 3);
}

/// A 48-block prompt whose first 32 blocks every `chain` shares, the rest particular to `tag`.
fn chain(tag: u64) -> Vec<BlockHash> {
    (0..48)
        .map(|i| BlockHash(if i < 32 { i + 1 } else { tag * 1_000 + i }))
        .collect()
}

fn booked_with(hashes: &[BlockHash]) -> BookingStep {
    BookingStep::Booked {
        prompt_tokens: 48 * 16,
        prefill_tokens: 48 * 16,
        blocks: PromptBlocks::of(hashes, 16),
    }
}

#[test]
fn a_remote_bookings_hashes_touch_the_working_set_and_count_shared_prefixes_once() {
    let load = Arc::new(Load::default());
    let mut ledger = ReplicaLedger::new(secs(3));
    let find = loads(|_: &TargetKey| Some(Arc::clone(&load)));
    ledger.apply("b", &note(1, booked_with(&chain(1))), &find, secs(5));
    ledger.apply("c", &note(1, booked_with(&chain(2))), &find, secs(6));
    {
        let touched = find.touched.borrow();
        assert_eq!(
            *touched,
            vec![
                (key("w0"), chain(1), secs(5)),
                (key("w0"), chain(2), secs(6))
            ],
            "every block of each prompt, when heard"
        );
    }
    // Marks at blocks 15 and 31 (shared, once) and 47 (one each): 4 marks of 16 blocks,
    // where two prompts counted whole would be 96 blocks.
    let (tokens, held) = load.running(&chain(3), 16);
    assert_eq!((tokens, held), (4 * STRIDE as u64 * 16, 32));
    // A repeated booking touches nothing again.
    ledger.apply("b", &note(1, booked_with(&chain(1))), &find, secs(7));
    assert_eq!(find.touched.borrow().len(), 2);
    ledger.apply("b", &note(1, BookingStep::Freed), &find, secs(8));
    assert_eq!(load.running(&chain(3), 16), (3 * STRIDE as u64 * 16, 32));
    ledger.apply("c", &note(1, BookingStep::Freed), &find, secs(8));
    assert_eq!(load.running(&chain(3), 16), (0, 0));
    // Without hashes (an older replica): the prompt counts whole, nothing is touched.
    ledger.apply("b", &note(2, booked()), &find, secs(9));
    assert_eq!(load.running(&chain(3), 16), (100, 0));
    assert_eq!(find.touched.borrow().len(), 2);
}
