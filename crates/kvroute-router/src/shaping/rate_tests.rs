use super::*;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

#[test]
fn charges_leave_after_a_minute_and_retry_after_says_when() {
    let mut w = Window::new(1000);
    w.charge(ms(0), 600);
    w.charge(ms(30_000), 300);
    assert_eq!(w.check(ms(30_000), 100), Ok(()));
    assert_eq!(w.check(ms(30_000), 200), Err(Over::RetryAfter(ms(30_000))));
    assert_eq!(w.check(ms(30_000), 2000), Err(Over::Never));
    assert_eq!(w.used(ms(60_000)), 300, "the first charge left the window");
    assert_eq!(w.check(ms(60_000), 700), Ok(()));
    assert_eq!(w.used(ms(200_000)), 0);
}

#[test]
fn settling_replaces_the_reservation_in_its_bucket() {
    let mut w = Window::new(1000);
    let c = w.charge(ms(100), 900);
    assert!(w.check(ms(200), 200).is_err());
    w.settle(ms(5_000), c, 150);
    assert_eq!(w.used(ms(5_000)), 150);
    assert_eq!(w.check(ms(5_000), 850), Ok(()));
    // A settlement after the charge left the window changes nothing.
    let late = w.charge(ms(6_000), 500);
    w.settle(ms(70_000), late, 10);
    assert_eq!(w.used(ms(70_000)), 0);
}

/// Clients that retry as told, in virtual time, for ten minutes: every 60 s window (sampled
/// each 100 ms) holds at most the limit, within 2 %, and the limit is used.
#[test]
fn a_token_limit_holds_over_every_minute() {
    let limit = 100_000;
    let mut w = Window::new(limit);
    // (time, tokens) of every settled request.
    let mut spent: Vec<(u64, u64)> = Vec::new();
    let mut clients: Vec<(u64, u64)> = (0..20).map(|i| (i * 37, 1500 + i * 211)).collect();
    let end = 600_000;
    let mut now = 0;
    // Settlements due: (at, charge, actual).
    let mut due: Vec<(u64, Charge, u64)> = Vec::new();
    while now < end {
        due.retain(|(at, c, actual)| {
            if *at > now {
                return true;
            }
            w.settle(ms(now), *c, *actual);
            false
        });
        for (next, size) in clients.iter_mut() {
            if *next > now {
                continue;
            }
            // Reserves prompt + max output; spends 40-100 % of it.
            match w.check(ms(now), *size) {
                Ok(()) => {
                    let c = w.charge(ms(now), *size);
                    let actual = *size * (40 + (*next % 61)) / 100;
                    due.push((now + 2_000, c, actual));
                    spent.push((now, actual));
                    *next = now + 50;
                }
                Err(Over::RetryAfter(d)) => *next = now + d.as_millis() as u64,
                Err(Over::Never) => unreachable!("every request is under the limit"),
            }
        }
        now += 10;
    }
    let mut worst = 0;
    for start in (0..end - 60_000).step_by(100) {
        let in_window: u64 = spent
            .iter()
            .filter(|(t, _)| *t >= start && *t < start + 60_000)
            .map(|(_, n)| n)
            .sum();
        worst = worst.max(in_window);
    }
    assert!(worst as f64 <= limit as f64 * 1.02, "{worst} in one minute");
    let total: u64 = spent.iter().map(|(_, n)| n).sum();
    let per_minute = total as f64 / 10.0;
    // Reservations are held 2 s at their full size while 70 % of them is spent on average:
    // the limit is used, not left idle, yet never exceeded.
    assert!(per_minute >= limit as f64 * 0.6, "{per_minute} per minute");
}
