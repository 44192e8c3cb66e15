#!/usr/bin/env python3
"""Replay-ready Mooncake traces from the raw agentic-coding sessions: traces no result was tuned on.

The repository's agentic figures come from one replay of the WEKA Claude Code sessions
(`agentic_cc_v8_l64_1h.jsonl`, ../shared/traces/agentic/README.md). kvroute is judged on traces
and fleets it has not seen, so this script builds others from the same raw conversations
(`weka_cc_v8_compact.jsonl`): LANES users, each playing conversations drawn with SEED one after
another (a pause of 1 s to `--max-idle` between two) from a random start in the first minute,
for DURATION seconds of arrivals. Every turn keeps
its recorded prompt and answer lengths, its blocks (the conversation's own block ids, chained
into 512-token blocks as the Mooncake traces have them) and its recorded time since the turn
before, with idle gaps cut at `--max-idle` seconds (300, as the repository's replay). Sub-agents
run as sessions of their own from their recorded start. Sessions that replay the same
conversation share nothing; with `--share counts` (the default) the system prompt and tool
definitions (`system_tokens + tool_tokens`, whole blocks) are one prefix across conversations
that recorded the same model and the same sizes (one Claude Code release), an approximation of
the cross-session sharing the raw v8 ids do not keep (`--share none` turns it off).

Each line carries `session_id`, the affinity hint `kvroute simulate` and `kvroute bench` send;
`OUT.meta.jsonl` is written beside `OUT.jsonl` (lane, session, conversation, context, turn) for
analysis. Nothing is written into the repository: give OUT outside it.

Usage:
  scripts/agentic-trace.py RAW.jsonl OUT [--lanes 64] [--duration 3600] [--seed 1]
                           [--max-idle 300] [--share counts|none] [--no-subagents]
  kvroute simulate --trace OUT.jsonl --workers 8 --slo-ttft 2 --policies kv_aware,cache_aware
"""

import argparse
import hashlib
import json
import random
import sys

TRACE_BLOCK = 512  # tokens per block of the Mooncake traces
RAW_BLOCK = 64  # tokens per block id of the raw sessions


def turn_ids(h, previous):
    """A turn's block ids: the first `h[0]` of the previous turn's, then each [start, count] run."""
    ids = previous[: h[0]]
    for start, count in h[1:]:
        ids.extend(range(start, start + count))
    return ids


class Blocks:
    """Global ids of 512-token blocks, chained: a block is the same only after the same prefix."""

    def __init__(self):
        self.ids = {}

    def _id(self, key):
        return self.ids.setdefault(key, len(self.ids))

    def chain(self, scope, ids, tokens, shared_key, shared_blocks):
        out = []
        digest = hashlib.blake2b(repr(scope).encode(), digest_size=16).digest()
        per = TRACE_BLOCK // RAW_BLOCK
        for j in range((tokens + TRACE_BLOCK - 1) // TRACE_BLOCK):
            if shared_key is not None and j < shared_blocks:
                out.append(self._id(("shared", shared_key, j)))
                continue
            part = ids[j * per : (j + 1) * per]
            digest = hashlib.blake2b(digest + repr(part).encode(), digest_size=16).digest()
            out.append(self._id(digest))
        return out


def squeeze(times, max_idle):
    """Recorded times → replay offsets, every gap between consecutive ones cut at `max_idle`."""
    out, at, last = [], 0.0, None
    for t in times:
        if last is not None:
            at += min(max(t - last, 0.0), max_idle)
        out.append(at)
        last = t
    return out


def offset_of(t, times, offsets, max_idle):
    """The replay offset of recorded time `t` (a sub-agent's start) among a timeline's turns."""
    k = max((i for i, x in enumerate(times) if x <= t), default=None)
    if k is None:
        return 0.0
    return offsets[k] + min(t - times[k], max_idle)


def play(conv, start, session, args, blocks, lane):
    """The requests of one conversation replayed from `start`, as (arrival_s, line, meta)."""
    shared_key = None
    shared_blocks = 0
    if args.share == "counts":
        shared_key = (tuple(conv.get("models", [])), conv.get("system_tokens"), conv.get("tool_tokens"))
        shared_blocks = (conv.get("system_tokens", 0) + conv.get("tool_tokens", 0)) // TRACE_BLOCK
    main = [r for r in conv["requests"] if "h" in r]
    times = [r["t"] for r in main]
    offsets = squeeze(times, args.max_idle)
    timelines = [("main", session, main, offsets, start)]
    if not args.no_subagents:
        for n, sub in enumerate(r for r in conv["requests"] if "requests" in r):
            turns = [r for r in sub["requests"] if "h" in r]
            at = start + offset_of(sub["t"], times, offsets, args.max_idle)
            sub_offsets = squeeze([r["t"] for r in turns], args.max_idle)
            timelines.append((f"sub{n}", f"{session}.{n + 1}", turns, sub_offsets, at))
    out = []
    for ctx, sid, turns, offs, begin in timelines:
        ids = []
        for turn, (r, off) in enumerate(zip(turns, offs)):
            ids = turn_ids(r["h"], ids)
            hashes = blocks.chain((conv["id"], sid), ids, r["in"], shared_key, shared_blocks)
            line = {
                "timestamp": int(round((begin + off) * 1000)),
                "input_length": r["in"],
                "output_length": max(1, r["out"]),
                "hash_ids": hashes,
                "session_id": sid,
            }
            meta = {"lane": lane, "session": sid, "conv": conv["id"], "ctx": ctx, "turn": turn}
            out.append((begin + off, line, meta))
    return out, offsets[-1] if offsets else 0.0


def build(args):
    with open(args.raw) as f:
        convs = [json.loads(line) for line in f if line.strip()]
    convs = [c for c in convs if any("h" in r for r in c["requests"])]
    rng = random.Random(args.seed)
    blocks = Blocks()
    rows = []
    sessions = 0
    for lane in range(args.lanes):
        at = rng.uniform(0.0, 60.0)
        while at < args.duration:
            sessions += 1
            played, length = play(rng.choice(convs), at, f"s{sessions}", args, blocks, lane)
            rows.extend(r for r in played if r[0] < args.duration)
            at += length + rng.uniform(1.0, args.max_idle)
    rows.sort(key=lambda r: r[0])
    return rows, sessions, len(blocks.ids)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("raw", help="weka_cc_v8_compact.jsonl (../shared/traces/agentic/)")
    p.add_argument("out", help="OUT: writes OUT.jsonl and OUT.meta.jsonl")
    p.add_argument("--lanes", type=int, default=64)
    p.add_argument("--duration", type=float, default=3600.0)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--max-idle", type=float, default=300.0)
    p.add_argument("--share", choices=["counts", "none"], default="counts")
    p.add_argument("--no-subagents", action="store_true")
    args = p.parse_args()
    if args.lanes < 1 or args.duration <= 0 or args.max_idle <= 0:
        sys.exit("agentic-trace: --lanes, --duration and --max-idle must be positive")
    rows, sessions, distinct = build(args)
    if not rows:
        sys.exit("agentic-trace: no requests (is RAW the compact sessions file?)")
    with open(args.out + ".jsonl", "w") as t, open(args.out + ".meta.jsonl", "w") as m:
        for _, line, meta in rows:
            t.write(json.dumps(line, separators=(",", ":")) + "\n")
            m.write(json.dumps(meta, separators=(",", ":")) + "\n")
    inputs = [line["input_length"] for _, line, _ in rows]
    print(
        f"{len(rows)} requests, {sessions} conversations over {args.lanes} lanes; "
        f"input mean {sum(inputs) / len(inputs):,.0f} tokens, max {max(inputs):,}; "
        f"{distinct:,} distinct blocks"
    )


if __name__ == "__main__":
    main()
