#!/usr/bin/env python3
"""How much of a Mooncake trace's cache misses placement could still remove (issue 15).

`kvroute simulate` prints a `pooled_cache` row: the fleet's whole KV capacity as one LRU
cache with no queueing. A router can beat that only by steering which content each worker
evicts, which needs knowing at arrival which requests' blocks will be reused. This script
answers two questions on the trace's own block ids (512 tokens each, outputs ignored):

1. With perfect foresight (Belady: evict the block reused furthest in the future), what
   TTFT would the same total capacity give, prefilling on an idle engine with the simulator's
   default step-time fit? That is the room a clairvoyant placement would have over LRU.
2. Can a router tell at arrival whose blocks will be reused? The share of requests whose new
   blocks are ever reused, by how much of their prompt was seen before.

Usage: scripts/trace-reuse.py TRACE.jsonl [CAPACITY_BLOCKS]  (default 32768: 16 workers of
16,384 blocks of 64 tokens, in 512-token trace blocks)
"""

import heapq
import json
import sys
from collections import Counter


def prefill_ms(tokens: int) -> float:
    """The simulator's default step-time fit, in chunks of 8,192 batched tokens."""
    ms = 0.0
    while tokens > 0:
        c = min(tokens, 8192)
        ms += 4.209989e-7 * c * c + 1.518344e-2 * c + 16.50142
        tokens -= c
    return ms


def leading(ids, held) -> int:
    n = 0
    for b in ids:
        if b not in held:
            break
        n += 1
    return n


def percentile(sorted_values, q: float) -> float:
    return sorted_values[min(len(sorted_values) - 1, int(len(sorted_values) * q))]


def belady(rows, capacity: int):
    uses = {}
    for i, r in enumerate(rows):
        for b in r["hash_ids"]:
            uses.setdefault(b, []).append(i)
    pointer = {b: 0 for b in uses}
    never = len(rows)

    def next_use(b, after):
        u, p = uses[b], pointer[b]
        while p < len(u) and u[p] <= after:
            p += 1
        pointer[b] = p
        return u[p] if p < len(u) else never

    cache, heap, ttft = set(), [], []
    for i, r in enumerate(rows):
        ids, n = r["hash_ids"], r["input_length"]
        ttft.append(prefill_ms(n - min(leading(ids, cache) * 512, n)))
        for b in ids:
            cache.add(b)
            heapq.heappush(heap, (-next_use(b, i), b))
        while len(cache) > capacity:
            negative, b = heapq.heappop(heap)
            if b in cache and -negative == next_use(b, i):
                cache.discard(b)
    return ttft


def main() -> None:
    path = sys.argv[1]
    capacity = int(sys.argv[2]) if len(sys.argv) > 2 else 32768
    rows = [json.loads(line) for line in open(path)]
    ttft = sorted(belady(rows, capacity))
    print(
        f"Belady over {capacity} blocks: TTFT mean {sum(ttft) / len(ttft):.1f} ms, "
        f"p90 {percentile(ttft, 0.9):.1f} ms, p99 {percentile(ttft, 0.99):.1f} ms"
    )
    uses = Counter(b for r in rows for b in r["hash_ids"])
    once = sum(1 for v in uses.values() if v == 1)
    print(f"distinct blocks {len(uses)}, used by one request only {once} ({once / len(uses):.0%})")
    seen, classes = set(), {}
    for r in rows:
        ids = r["hash_ids"]
        hit = leading(ids, seen)
        new = [b for b in ids if b not in seen]
        seen.update(ids)
        if not new:
            continue
        key = "no block seen" if hit == 0 else "first block seen" if hit == 1 else "2+ blocks seen"
        c = classes.setdefault(key, [0, 0])
        c[0] += 1
        c[1] += any(uses[b] > 1 for b in new)
    for key, (n, reused) in sorted(classes.items()):
        print(f"{key}: {n} requests, new blocks of {reused} ({reused / n:.0%}) reused later")


if __name__ == "__main__":
    main()
