use super::*;

fn prompt(prefix: u64, len: usize) -> Vec<BlockHash> {
    // Chained like real hashes: block i depends on every block before it.
    let mut out = Vec::with_capacity(len);
    let mut h = prefix;
    for i in 0..len as u64 {
        h = h.wrapping_mul(0x9e37_79b9_7f4a_7c15).wrapping_add(i + 1);
        out.push(BlockHash(h));
    }
    out
}

const S: Duration = Duration::from_secs(1);

#[test]
fn a_continuation_finds_its_home_and_how_much_it_shares() {
    let homes = SessionHomes::default();
    let key = SessionKey::new(None, "m", b"s1");
    let first = prompt(7, 80);
    homes.learn(key, WorkerId(3), &first, S);
    // The next turn extends the prompt: every block of the last one is shared.
    let mut next = first.clone();
    next.extend(prompt(99, 20));
    let home = homes.home(key, &next, 5 * S).expect("known session");
    assert_eq!(home.worker, WorkerId(3));
    assert_eq!(home.age, 4 * S);
    assert_eq!(home.shared_blocks, 80);
    // A prompt that diverges at block 55 shares the largest mark at or below it (50 of 80:
    // marks every tenth block).
    let mut edited = first[..55].to_vec();
    edited.extend(prompt(5, 40));
    assert_eq!(homes.home(key, &edited, 5 * S).unwrap().shared_blocks, 50);
    // A prompt sharing nothing still has a home (evidence for ties), with nothing shared.
    assert_eq!(
        homes
            .home(key, &prompt(1, 10), 5 * S)
            .unwrap()
            .shared_blocks,
        0
    );
}

#[test]
fn sessions_are_scoped_to_tenant_and_model() {
    let homes = SessionHomes::default();
    homes.learn(SessionKey::new(Some("a"), "m", b"s"), WorkerId(1), &[], S);
    assert!(
        homes
            .home(SessionKey::new(Some("b"), "m", b"s"), &[], S)
            .is_none()
    );
    assert!(
        homes
            .home(SessionKey::new(None, "m", b"s"), &[], S)
            .is_none()
    );
    assert!(
        homes
            .home(SessionKey::new(Some("a"), "n", b"s"), &[], S)
            .is_none()
    );
    assert!(
        homes
            .home(SessionKey::new(Some("a"), "m", b"s"), &[], S)
            .is_some()
    );
}

#[test]
fn a_home_expires_after_the_ttl_and_a_new_request_renews_it() {
    let homes = SessionHomes::new(10 * S, 100);
    let key = SessionKey::new(None, "m", b"s");
    homes.learn(key, WorkerId(0), &[], S);
    assert!(homes.home(key, &[], 11 * S).is_some());
    assert!(homes.home(key, &[], 12 * S).is_none());
    homes.learn(key, WorkerId(2), &[], 20 * S);
    assert_eq!(homes.home(key, &[], 29 * S).unwrap().worker, WorkerId(2));
    // Expired entries leave the table when others are learned.
    homes.learn(SessionKey::new(None, "m", b"t"), WorkerId(0), &[], 100 * S);
    assert_eq!(homes.len(), 1);
}

#[test]
fn memory_is_bounded_by_the_capacity_longest_unused_first() {
    let homes = SessionHomes::new(1000 * S, 3);
    let keys: Vec<SessionKey> = (0..5)
        .map(|i| SessionKey::new(None, "m", format!("s{i}").as_bytes()))
        .collect();
    for (i, k) in keys.iter().take(3).enumerate() {
        homes.learn(*k, WorkerId(i as u32), &[], S);
    }
    // s0 is used again, so s1 is the longest unused when s3 arrives.
    homes.learn(keys[0], WorkerId(0), &[], 2 * S);
    homes.learn(keys[3], WorkerId(3), &[], 3 * S);
    assert_eq!(homes.len(), 3);
    assert!(homes.home(keys[1], &[], 3 * S).is_none());
    assert!(homes.home(keys[0], &[], 3 * S).is_some());
    // A session used over and over leaves no growing queue behind.
    for t in 0..10_000u64 {
        homes.learn(keys[4], WorkerId(4), &[], 4 * S + Duration::from_millis(t));
    }
    assert!(
        homes.lock().order.len() <= 2 * 16 + 1,
        "{}",
        homes.lock().order.len()
    );
    // Capacity 0 turns hints off.
    let off = SessionHomes::new(S, 0);
    off.learn(keys[0], WorkerId(0), &[], S);
    assert!(off.is_empty());
}

#[test]
fn a_worker_that_leaves_takes_its_sessions_with_it() {
    let homes = SessionHomes::default();
    let a = SessionKey::new(None, "m", b"a");
    let b = SessionKey::new(None, "m", b"b");
    homes.learn(a, WorkerId(0), &[], S);
    homes.learn(b, WorkerId(1), &[], S);
    homes.clear_worker(WorkerId(0));
    assert!(homes.home(a, &[], S).is_none());
    assert!(homes.home(b, &[], S).is_some());
}

#[test]
fn marks_cover_the_prompt_and_end_on_its_last_block() {
    let p = prompt(1, 100);
    let m = marks(&p);
    assert_eq!(m.len(), MARKS);
    assert_eq!(m.last().copied(), Some((100, p[99])));
    assert_eq!(m[0], (12, p[11]));
    assert_eq!(
        marks(&prompt(1, 3)).iter().map(|m| m.0).collect::<Vec<_>>(),
        [1, 2, 3]
    );
    assert!(marks(&[]).is_empty());
}
