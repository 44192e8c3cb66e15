//! Tests of `runs`.

use super::*;

const W0: WorkerId = WorkerId(0);
const W1: WorkerId = WorkerId(1);

fn chain(tag: u64, n: usize) -> Vec<BlockHash> {
    (0..n as u64)
        .map(|i| BlockHash((tag << 40 ^ i).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1))
        .collect()
}

/// Stores `blocks` on `worker` after `parent`, as one event would.
fn store(runs: &mut Runs, worker: WorkerId, parent: Option<Loc>, blocks: &[BlockHash]) -> Vec<Loc> {
    let mut at = parent;
    let mut locs = Vec::new();
    for (i, b) in blocks.iter().enumerate() {
        let loc = runs.place(at, b.0, blocks.len() - i);
        runs.set(loc, worker);
        locs.push(loc);
        at = Some(loc);
    }
    locs
}

fn lookup(runs: &Runs, blocks: &[BlockHash]) -> Vec<(u32, u32)> {
    let mut o = Overlaps::new();
    runs.lookup(blocks, &mut o);
    o.sort();
    o.iter()
        .filter(|(w, _)| w.page() == 0)
        .map(|(w, n)| (w.0, n))
        .collect()
}

#[test]
fn a_chain_stored_by_one_event_is_one_run() {
    let mut runs = Runs::default();
    let c = chain(1, 50);
    let locs = store(&mut runs, W0, None, &c);
    assert_eq!(runs.len(), 1);
    assert!(locs.iter().enumerate().all(|(i, l)| *l
        == Loc {
            run: 0,
            offset: i as u32
        }));
    assert_eq!(lookup(&runs, &c), vec![(0, 50)]);
    // A longer request is credited with the stored prefix only.
    let mut longer = c.clone();
    longer.extend(chain(2, 5));
    assert_eq!(lookup(&runs, &longer), vec![(0, 50)]);
}

#[test]
fn branches_share_the_prefix_and_are_found_from_either_side() {
    let mut runs = Runs::default();
    let root = chain(1, 10);
    let locs = store(&mut runs, W0, None, &root);
    // W1 holds the first six blocks and its own continuation from block 5.
    store(&mut runs, W1, None, &root[..6]);
    let tail = chain(2, 4);
    store(&mut runs, W1, Some(locs[5]), &tail);
    assert_eq!(runs.len(), 2);
    let mut req = root[..6].to_vec();
    req.extend(&tail);
    assert_eq!(lookup(&runs, &req), vec![(0, 6), (1, 10)]);
    assert_eq!(lookup(&runs, &root), vec![(0, 10), (1, 6)]);
    assert_eq!(runs.hash_at(locs[3]), root[3]);
}

#[test]
fn a_lost_middle_block_ends_the_credit_and_dead_runs_are_freed() {
    let mut runs = Runs::default();
    let c = chain(1, 8);
    let locs = store(&mut runs, W0, None, &c);
    assert!(runs.unset(locs[3], W0));
    assert!(!runs.unset(locs[3], W0));
    assert_eq!(lookup(&runs, &c), vec![(0, 3)]);
    // The dead block stays while later blocks are held; cutting them frees everything.
    assert_eq!(runs.blocks(), 8);
    for l in locs.iter().rev() {
        runs.unset(*l, W0);
    }
    assert_eq!((runs.len(), runs.blocks()), (0, 0));
    assert_eq!(lookup(&runs, &c), vec![]);
    // Freed ids are reused and the chain can be stored again.
    store(&mut runs, W1, None, &c);
    assert_eq!(lookup(&runs, &c), vec![(1, 8)]);
    assert_eq!(runs.len(), 1);
}

#[test]
fn a_branch_keeps_its_dead_parent_until_it_goes() {
    let mut runs = Runs::default();
    let root = chain(1, 6);
    let locs = store(&mut runs, W0, None, &root);
    let branch = store(&mut runs, W1, Some(locs[2]), &chain(2, 3));
    for l in &locs {
        runs.unset(*l, W0);
    }
    // Nobody holds the root, but the walk to W1's blocks needs its first three hashes.
    assert_eq!(runs.len(), 2);
    assert_eq!(runs.blocks(), 6 + 3);
    for l in &branch {
        runs.unset(*l, W1);
    }
    assert_eq!((runs.len(), runs.blocks()), (0, 0));
}

#[test]
fn workers_beyond_the_first_page_have_their_own_holders() {
    let mut runs = Runs::default();
    let c = chain(1, 5);
    let locs = store(&mut runs, WorkerId(40), None, &c);
    store(&mut runs, W0, None, &c[..2]);
    let mut o = Overlaps::new();
    runs.lookup(&c, &mut o);
    o.sort();
    assert_eq!(o.get(WorkerId(40)), 5);
    assert_eq!(lookup(&runs, &c), vec![(0, 2)]);
    assert_eq!(runs.holders(&c, 1), vec![1 << 8; 5]);
    for l in locs {
        runs.unset(l, WorkerId(40));
    }
    assert_eq!(runs.blocks(), 2);
}

#[test]
fn a_lost_block_ends_the_credit_at_every_position_of_a_group() {
    let c = chain(1, 3 * GROUP + 3);
    for lost in 0..c.len() {
        let mut runs = Runs::default();
        let locs = store(&mut runs, W0, None, &c);
        store(&mut runs, W1, None, &c);
        runs.unset(locs[lost], W0);
        let mut expect = vec![(0, lost as u32), (1, c.len() as u32)];
        expect.retain(|(_, n)| *n > 0);
        assert_eq!(lookup(&runs, &c), expect);
        // A request that leaves the chain at `lost` is credited up to there.
        let mut other = c.clone();
        other[lost] = BlockHash(7);
        let expect = if lost == 0 {
            vec![]
        } else {
            vec![(0, lost as u32), (1, lost as u32)]
        };
        let mut full = Runs::default();
        store(&mut full, W0, None, &c);
        store(&mut full, W1, None, &c);
        assert_eq!(lookup(&full, &other), expect, "{lost}");
        let slots: Vec<Slot> = c
            .iter()
            .map(|b| [b.0 as u32, (b.0 >> 32) as u32, 0])
            .collect();
        assert_eq!(common_prefix(&slots, &other), lost);
        assert_eq!(common_prefix(&slots[..lost], &c), lost);
    }
}

#[test]
fn random_churn_frees_everything_once_nothing_is_held() {
    let mut runs = Runs::default();
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    let mut rand = move |n: u64| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x % n
    };
    // Chains that share prefixes and branch at random depths, on random workers.
    let roots: Vec<Vec<BlockHash>> = (0..8).map(|t| chain(t, 40)).collect();
    let mut held: Vec<(Loc, WorkerId)> = Vec::new();
    for step in 0..2_000u64 {
        if rand(3) > 0 || held.is_empty() {
            let root = &roots[rand(8) as usize];
            let depth = 1 + rand(39) as usize;
            let mut blocks = root[..depth].to_vec();
            blocks.extend(chain(100 + step, rand(5) as usize));
            let w = WorkerId(rand(40) as u32);
            for l in store(&mut runs, w, None, &blocks) {
                held.push((l, w));
            }
        } else {
            let (l, w) = held.swap_remove(rand(held.len() as u64) as usize);
            runs.unset(l, w);
        }
    }
    let walked: usize = runs.runs.iter().map(Run::bytes).sum();
    assert_eq!(runs.run_bytes, walked, "kept in step with the runs");
    for (l, w) in held {
        runs.unset(l, w);
    }
    assert_eq!((runs.len(), runs.blocks(), runs.run_bytes), (0, 0, 0));
    assert!(runs.starts.is_empty());
}
