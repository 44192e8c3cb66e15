//! Tests of `table`.

use super::*;
use std::collections::HashMap;

#[test]
fn insert_get_remove_agree_with_a_std_map() {
    let mut t: Table<u64> = Table::default();
    let mut m = HashMap::new();
    let mut x = 1u64;
    for i in 0..20_000u64 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let key = if i % 97 == 0 { 0 } else { x % 50_000 };
        let key = mix(key);
        if i % 3 == 0 {
            assert_eq!(t.remove(key), m.remove(&key));
        } else {
            assert_eq!(t.insert(key, i), m.insert(key, i));
        }
        assert_eq!(t.len(), m.len());
    }
    for (k, v) in &m {
        assert_eq!(t.get(*k), Some(*v));
    }
    let mut listed: Vec<_> = t.iter().collect();
    listed.sort_unstable();
    let mut expected: Vec<_> = m.iter().map(|(k, v)| (*k, *v)).collect();
    expected.sort_unstable();
    assert_eq!(listed, expected);
}

#[test]
fn a_reserved_table_keeps_its_entries_and_does_not_grow_up_to_the_reservation() {
    let mut t: Table<u64> = Table::default();
    for i in 0..100u64 {
        t.insert(mix(i), i);
    }
    t.reserve(50_000);
    let reserved = t.heap_bytes();
    for i in 0..100u64 {
        assert_eq!(t.get(mix(i)), Some(i));
    }
    for i in 100..50_000u64 {
        t.insert(mix(i), i);
    }
    assert_eq!(t.heap_bytes(), reserved);
    assert_eq!(t.len(), 50_000);
    // A smaller reservation never shrinks it.
    t.reserve(10);
    assert_eq!(t.heap_bytes(), reserved);
    for i in 50_000..50_010u64 {
        t.insert(mix(i), i);
    }
    assert!(t.heap_bytes() > reserved);
}

#[test]
fn sequential_ids_are_spread_by_mix() {
    let mut t: Table<u32> = Table::default();
    for i in 0..10_000u64 {
        t.insert(mix(i), i as u32);
    }
    for i in 0..10_000u64 {
        assert_eq!(t.get(mix(i)), Some(i as u32));
    }
    assert_eq!(t.get(mix(10_001)), None);
    // Grew by the load bound (≥ 50 % full), not by runs overflowing the slack.
    assert!(t.heap_bytes() < 10_000 * 16 * 2, "{}", t.heap_bytes());
}

#[test]
fn keys_crowding_the_end_lengthen_the_tail_not_the_table() {
    let mut t: Table<u64> = Table::with_capacity(1000);
    let before = t.heap_bytes();
    // 500 keys that all sort last (as crafted block hashes could).
    for i in 0..500u64 {
        t.insert(u64::MAX - i, i);
    }
    for i in 0..500u64 {
        assert_eq!(t.get(u64::MAX - i), Some(i));
    }
    assert!(
        t.heap_bytes() < before + 600 * 16,
        "{} vs {before}",
        t.heap_bytes()
    );
    // Growth still rebuilds them in order into a longer tail.
    for i in 1..2000u64 {
        t.insert(mix(i), i);
    }
    for i in 0..500u64 {
        assert_eq!(t.get(u64::MAX - i), Some(i));
    }
    assert_eq!(t.len(), 2499);
    // The rebuilt tail is sized to the run, not doubled: compared with the same number of
    // spread keys, the crowded keys cost at most their own buckets and some slack.
    let mut spread: Table<u64> = Table::with_capacity(1000);
    for i in 1..2500u64 {
        spread.insert(mix(i), i);
    }
    assert!(
        t.heap_bytes() <= spread.heap_bytes() + (500 / 4 + 2 * SLACK) * 64,
        "{} vs {}",
        t.heap_bytes(),
        spread.heap_bytes()
    );
}

#[test]
fn remove_next_sweeps_every_entry() {
    let mut t: Table<u8> = Table::default();
    for i in 1..=100u64 {
        t.insert(mix(i), 1);
    }
    let mut hand = 0;
    let mut n = 0;
    while let Some((_, _, h)) = t.remove_next(hand) {
        hand = h;
        n += 1;
    }
    assert_eq!(n, 100);
    assert!(t.is_empty());
}
