use super::*;

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

const BOOKED: BookingStep = BookingStep::Booked {
    prompt_tokens: 100,
    prefill_tokens: 60,
};

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

#[test]
fn another_replicas_request_is_known_load_from_booking_to_end() {
    let load = Arc::new(Load::default());
    let mut ledger = ReplicaLedger::new(secs(3));
    let find = |t: &TargetKey| (t == &key("w0")).then(|| Arc::clone(&load));
    assert_eq!(ledger.apply("b", &note(7, BOOKED), find), Applied::Applied);
    let s = load.snapshot();
    assert_eq!(
        (s.in_flight, s.queued_prefill_tokens, s.active_prompt_tokens),
        (1, 60, 100)
    );
    assert_eq!(
        ledger.apply("b", &note(7, BookingStep::FirstToken), find),
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
        ledger.apply("b", &note(7, BookingStep::Freed), find),
        Applied::Applied
    );
    assert_eq!(load.snapshot().in_flight, 0);
    assert_eq!(ledger.booked(), 0);
}

#[test]
fn a_repeated_booking_is_applied_once_and_steps_of_unknown_requests_are_ignored() {
    let load = Arc::new(Load::default());
    let mut ledger = ReplicaLedger::new(secs(3));
    let find = |_: &TargetKey| Some(Arc::clone(&load));
    ledger.apply("b", &note(1, BOOKED), find);
    assert_eq!(ledger.apply("b", &note(1, BOOKED), find), Applied::Ignored);
    // The same number from another replica is another request.
    assert_eq!(ledger.apply("c", &note(1, BOOKED), find), Applied::Applied);
    assert_eq!(load.snapshot().in_flight, 2);
    assert_eq!(
        ledger.apply("b", &note(9, BookingStep::Freed), find),
        Applied::Ignored
    );
    assert_eq!(load.snapshot().in_flight, 2);
    assert_eq!(
        ledger.apply("b", &note(2, BOOKED), |_| None),
        Applied::UnknownTarget
    );
    assert_eq!(ledger.booked(), 2);
}

#[test]
fn a_silent_replicas_bookings_expire_and_a_heard_ones_stay() {
    let load = Arc::new(Load::default());
    let mut ledger = ReplicaLedger::new(secs(3));
    let find = |_: &TargetKey| Some(Arc::clone(&load));
    ledger.heard("b", 0, secs(10));
    ledger.apply("b", &note(1, BOOKED), find);
    ledger.heard("c", 0, secs(10));
    ledger.apply("c", &note(1, BOOKED), find);
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
    let find = |t: &TargetKey| {
        if t == &key("w0") {
            Some(Arc::clone(&a))
        } else {
            Some(Arc::clone(&b))
        }
    };
    // Heard: requests 1 and 2 on w0; 2's end was lost. Another replica's 1 stays untouched.
    ledger.apply("r", &note(1, BOOKED), find);
    ledger.apply("r", &note(2, BOOKED), find);
    ledger.apply("other", &note(1, BOOKED), find);
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
    ledger.replace("r", &live, find);
    ledger.replace("r", &live, find);
    let (sa, sb) = (a.snapshot(), b.snapshot());
    assert_eq!(
        (sa.in_flight, sa.decoding, sa.queued_prefill_tokens),
        (2, 1, 60)
    );
    assert_eq!((sb.in_flight, sb.queued_prefill_tokens), (1, 50));
    assert_eq!(ledger.booked(), 3);
}
