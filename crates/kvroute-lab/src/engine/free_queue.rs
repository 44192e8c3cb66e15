//! The eviction order of free KV blocks, as vLLM's `FreeKVCacheBlockQueue`.
//!
//! Free blocks (reference count 0) sit in one queue whether or not they still hold cached
//! content. Allocation takes from the front, so the front is the least recently freed block:
//! that is what makes eviction LRU. A prefix-cache hit on a free block must pull it out of the
//! middle, so the queue is an intrusive doubly linked list over block indices (O(1) everything,
//! no allocation after construction).

/// Index of a physical KV block.
pub type BlockId = u32;

const NIL: u32 = u32::MAX;

/// A doubly linked queue of free block ids.
#[derive(Clone, Debug)]
pub struct FreeQueue {
    prev: Vec<u32>,
    next: Vec<u32>,
    in_queue: Vec<bool>,
    head: u32,
    tail: u32,
    len: usize,
}

impl FreeQueue {
    /// A queue holding every block `0..num_blocks`, in order.
    pub fn full(num_blocks: u32) -> Self {
        let mut q = FreeQueue {
            prev: vec![NIL; num_blocks as usize],
            next: vec![NIL; num_blocks as usize],
            in_queue: vec![false; num_blocks as usize],
            head: NIL,
            tail: NIL,
            len: 0,
        };
        for b in 0..num_blocks {
            q.push_back(b);
        }
        q
    }

    /// Number of free blocks.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no block is free.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether `b` is in the queue.
    pub fn contains(&self, b: BlockId) -> bool {
        self.in_queue.get(b as usize).copied().unwrap_or(false)
    }

    /// Appends `b` as the most recently freed block. No-op if already queued.
    pub fn push_back(&mut self, b: BlockId) {
        if self.contains(b) || b as usize >= self.in_queue.len() {
            return;
        }
        let i = b as usize;
        self.prev[i] = self.tail;
        self.next[i] = NIL;
        if self.tail == NIL {
            self.head = b;
        } else {
            self.next[self.tail as usize] = b;
        }
        self.tail = b;
        self.in_queue[i] = true;
        self.len += 1;
    }

    /// Takes the least recently freed block.
    pub fn pop_front(&mut self) -> Option<BlockId> {
        if self.head == NIL {
            return None;
        }
        let b = self.head;
        self.remove(b);
        Some(b)
    }

    /// Takes `b` out of the queue wherever it is (a prefix-cache hit on a free block).
    pub fn remove(&mut self, b: BlockId) {
        if !self.contains(b) {
            return;
        }
        let i = b as usize;
        let (p, n) = (self.prev[i], self.next[i]);
        if p == NIL {
            self.head = n;
        } else {
            self.next[p as usize] = n;
        }
        if n == NIL {
            self.tail = p;
        } else {
            self.prev[n as usize] = p;
        }
        self.prev[i] = NIL;
        self.next[i] = NIL;
        self.in_queue[i] = false;
        self.len -= 1;
    }

    /// Block ids from front (next to evict) to back.
    pub fn iter(&self) -> impl Iterator<Item = BlockId> + '_ {
        let mut cur = self.head;
        std::iter::from_fn(move || {
            if cur == NIL {
                return None;
            }
            let b = cur;
            cur = self.next[b as usize];
            Some(b)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fifo_with_removal_from_the_middle() {
        let mut q = FreeQueue::full(4);
        assert_eq!(q.iter().collect::<Vec<_>>(), vec![0, 1, 2, 3]);
        q.remove(1);
        q.remove(3);
        assert_eq!(q.len(), 2);
        q.push_back(3);
        q.push_back(1);
        q.push_back(1);
        assert_eq!(q.iter().collect::<Vec<_>>(), vec![0, 2, 3, 1]);
        assert_eq!(q.pop_front(), Some(0));
        q.remove(1);
        assert_eq!(q.iter().collect::<Vec<_>>(), vec![2, 3]);
        assert_eq!(q.pop_front(), Some(2));
        assert_eq!(q.pop_front(), Some(3));
        assert_eq!(q.pop_front(), None);
        assert!(q.is_empty());
        q.push_back(9);
        assert!(q.is_empty(), "out-of-range ids are ignored");
    }
}
