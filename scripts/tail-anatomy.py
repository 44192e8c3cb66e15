#!/usr/bin/env python3
"""What a policy's slow requests are made of, from one `kvroute simulate` run's records.

`simulate --unqueued` splits a policy's mean TTFT into placement and queueing; a goal on a
percentile needs the requests themselves. This script reads the run's records (`--records`
writes them) and sorts every request slower than THRESHOLD seconds under POLICY into:

- **slow in the pooled cache too**: one cache of the fleet's size, each request alone on an
  idle engine, was slow as well (a first turn, or a prefix the whole fleet's cache had lost);
- **placement**: slow when the policy's placement is replayed alone on idle engines
  (`POLICY_unqueued`), fast in the pooled cache: the placement's own cache miss;
- **queueing**: fast when replayed alone: the wait on its worker.

With a sessions sidecar (the agentic traces' `.meta.jsonl`), each request is also labelled by
where its conversation ran before (`first` turn, back `home`, or `moved`), and for the moved
and queued ones the largest uncached prefill running or queued on the worker that mattered
(the old home, or the worker chosen) when the request arrived: head-of-line blocking.

    kvroute simulate --trace T.jsonl --trace-sessions T.meta.jsonl --workers 8 \\
        --policies kv_aware --unqueued --records --out DIR
    python3 scripts/tail-anatomy.py DIR --policy kv_aware --threshold 0.59 \\
        --sessions T.meta.jsonl

Nothing is simulated here: it only reads what the run wrote.
"""

import argparse
import collections
import json
import pathlib
import sys


def load(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def ttft(record):
    if record.get("error") or record.get("first_token") is None:
        return None
    return record["first_token"] - record["arrival"]


def conversation_keys(sessions_path, n):
    """One key per request: its conversation and context when the sidecar names them (the
    agentic traces: a session's lane runs several conversations, and sub-agents beside the
    main one), else its session."""
    rows = load(sessions_path)
    if len(rows) != n:
        sys.exit(f"{sessions_path}: {len(rows)} lines for {n} records")
    keys = []
    for row in rows:
        if "conv" in row:
            keys.append((row["conv"], row.get("ctx")))
        else:
            keys.append(row.get("session", row.get("session_id")))
    return keys


class Backlog:
    """The requests on each worker between arrival and first token, to ask what prefill was
    ahead of a request on a worker at an instant."""

    def __init__(self, records):
        self.by_worker = collections.defaultdict(list)
        for r in records:
            if r.get("worker") is not None and ttft(r) is not None:
                self.by_worker[r["worker"]].append(r)

    def largest_uncached(self, worker, at):
        waiting = [r for r in self.by_worker[worker] if r["arrival"] <= at < r["first_token"]]
        return max((r["prompt_tokens"] - r["cached_tokens"] for r in waiting), default=0)


def size_class(tokens):
    if tokens >= 100_000:
        return ">=100k uncached tokens ahead"
    if tokens >= 20_000:
        return ">=20k uncached tokens ahead"
    return "less ahead"


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("dir", type=pathlib.Path)
    p.add_argument("--policy", default="kv_aware")
    p.add_argument("--threshold", type=float, required=True, help="seconds of TTFT")
    p.add_argument("--sessions", type=pathlib.Path)
    a = p.parse_args()
    run = load(a.dir / f"records_{a.policy}.jsonl")
    alone = load(a.dir / f"records_{a.policy}_unqueued.jsonl")
    pooled = load(a.dir / "records_pooled_cache.jsonl")
    if not len(run) == len(alone) == len(pooled):
        sys.exit("the three record files differ in length: not one run")
    n = len(run)
    served = [i for i in range(n) if ttft(run[i]) is not None]
    slow = [i for i in served if ttft(run[i]) > a.threshold]
    allowed = int(0.1 * len(served))
    print(f"{a.policy}: {len(slow)} of {len(served)} served requests over {a.threshold} s "
          f"(a p90 at or under it allows {allowed})")

    def cause(i):
        if (ttft(pooled[i]) or 0) > a.threshold:
            return "slow in the pooled cache too"
        if (ttft(alone[i]) or 0) > a.threshold:
            return "placement"
        return "queueing"

    causes = collections.Counter(cause(i) for i in slow)
    for c in ("slow in the pooled cache too", "placement", "queueing"):
        print(f"  {c}: {causes[c]}")
    if not a.sessions:
        return
    keys = conversation_keys(a.sessions, n)
    backlog = Backlog(run)
    last_worker = {}
    where = {}
    for i in range(n):
        worker = run[i].get("worker")
        before = last_worker.get(keys[i])
        if worker is not None:
            last_worker[keys[i]] = worker
        where[i] = ("first" if before is None else "home" if before == worker else "moved", before)
    table = collections.Counter((cause(i), where[i][0]) for i in slow)
    print("by where the conversation ran before:")
    for (c, w), count in sorted(table.items()):
        print(f"  {c}, {w}: {count}")
    moved = [i for i in slow if cause(i) == "placement" and where[i][0] == "moved"]
    warmer = sum(1 for i in moved if run[i]["warmest_blocks"] > run[i]["predicted_blocks"])
    print(f"placement misses that moved: {len(moved)}; a worker held more of the prompt "
          f"than the one chosen for {warmer}")
    at_home = collections.Counter(
        size_class(backlog.largest_uncached(where[i][1], run[i]["arrival"])) for i in moved)
    print("  at the old home when they arrived:", dict(at_home))
    queued = [i for i in slow if cause(i) == "queueing"]
    ahead = collections.Counter(
        size_class(backlog.largest_uncached(run[i]["worker"], run[i]["arrival"]))
        for i in queued)
    print(f"queueing: {len(queued)}; on the worker chosen when they arrived:", dict(ahead))


if __name__ == "__main__":
    main()
