#!/usr/bin/env python3
"""Tests of scripts/agentic-trace.py: block chaining, gaps, sub-agents and determinism.

Run: python3 -m unittest discover -s scripts -p '*_test.py'
"""

import importlib.util
import json
import os
import tempfile
import unittest
from argparse import Namespace

HERE = os.path.dirname(os.path.abspath(__file__))
SPEC = importlib.util.spec_from_file_location("agentic_trace", os.path.join(HERE, "agentic-trace.py"))
trace = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(trace)


def turn(t, tokens, h, out=10):
    return {"t": t, "type": "n", "in": tokens, "out": out, "h": h}


def conversation(cid, turns, system=0, tools=0):
    return {
        "id": cid,
        "models": ["m"],
        "system_tokens": system,
        "tool_tokens": tools,
        "requests": turns,
    }


def args(**kw):
    base = dict(lanes=1, duration=10_000.0, seed=1, max_idle=300.0, share="none", no_subagents=False)
    base.update(kw)
    return Namespace(**base)


class TurnIds(unittest.TestCase):
    def test_a_turn_keeps_a_prefix_of_the_last_and_appends_its_runs(self):
        first = trace.turn_ids([0, [1, 4]], [])
        self.assertEqual(first, [1, 2, 3, 4])
        self.assertEqual(trace.turn_ids([3, [9, 2], [20, 1]], first), [1, 2, 3, 9, 10, 20])


class Chaining(unittest.TestCase):
    def test_blocks_are_shared_only_after_the_same_prefix(self):
        blocks = trace.Blocks()
        ids = list(range(1, 33))  # 32 raw blocks of 64 tokens: four of 512
        a = blocks.chain(("c", "s1"), ids, 32 * 64, None, 0)
        same = blocks.chain(("c", "s1"), ids, 32 * 64, None, 0)
        self.assertEqual(a, same)
        # A change in the second 512-token block changes it and every block after it.
        changed = ids[:9] + [99] + ids[10:]
        b = blocks.chain(("c", "s1"), changed, 32 * 64, None, 0)
        self.assertEqual(b[0], a[0])
        self.assertTrue(all(x != y for x, y in zip(a[1:], b[1:])))
        # Another session replaying the same conversation shares nothing.
        other = blocks.chain(("c", "s2"), ids, 32 * 64, None, 0)
        self.assertFalse(set(other) & set(a))

    def test_a_shared_system_prefix_is_one_set_of_blocks(self):
        blocks = trace.Blocks()
        ids = list(range(1, 17))
        a = blocks.chain(("c1", "s1"), ids, 16 * 64, ("m", 1024, 0), 2)
        b = blocks.chain(("c2", "s2"), ids, 16 * 64, ("m", 1024, 0), 2)
        self.assertEqual(a, b)
        c = blocks.chain(("c2", "s2"), ids, 16 * 64, ("m", 1024, 0), 1)
        self.assertEqual(c[0], a[0])
        self.assertNotEqual(c[1], a[1])

    def test_a_partial_last_block_counts(self):
        blocks = trace.Blocks()
        self.assertEqual(len(blocks.chain(("c", "s"), list(range(1, 10)), 513, None, 0)), 2)


class Gaps(unittest.TestCase):
    def test_idle_gaps_are_cut(self):
        self.assertEqual(trace.squeeze([0.0, 10.0, 1000.0, 1001.0], 300.0), [0.0, 10.0, 310.0, 311.0])

    def test_a_subagent_starts_where_its_parent_was(self):
        times = [0.0, 10.0, 1000.0]
        offsets = trace.squeeze(times, 300.0)
        self.assertEqual(trace.offset_of(5.0, times, offsets, 300.0), 5.0)
        self.assertEqual(trace.offset_of(1002.0, times, offsets, 300.0), 312.0)


class Build(unittest.TestCase):
    def raw(self, directory):
        sub = {"t": 15.0, "type": "subagent", "requests": [turn(0.0, 600, [0, [50, 10]])]}
        convs = [
            conversation("a", [turn(0.0, 640, [0, [1, 10]]), turn(20.0, 1280, [10, [11, 10]]), sub]),
            conversation("b", [turn(0.0, 1024, [0, [1, 16]]), turn(5.0, 1100, [16, [17, 2]])]),
        ]
        path = os.path.join(directory, "raw.jsonl")
        with open(path, "w") as f:
            for c in convs:
                f.write(json.dumps(c) + "\n")
        return path

    def test_a_build_is_sorted_names_sessions_and_repeats(self):
        with tempfile.TemporaryDirectory() as d:
            a = args(raw=self.raw(d), lanes=3, duration=400.0)
            rows, sessions, _ = trace.build(a)
            again, _, _ = trace.build(a)
        self.assertGreater(sessions, 2)
        times = [r[0] for r in rows]
        self.assertEqual(times, sorted(times))
        self.assertTrue(all(r[0] < 400.0 for r in rows))
        self.assertTrue(all("session_id" in line and line["hash_ids"] for _, line, _ in rows))
        self.assertEqual([r[1] for r in rows], [r[1] for r in again])
        # A session's second turn extends its first; a sub-agent is a session of its own.
        by = {}
        for _, line, meta in rows:
            by.setdefault(line["session_id"], []).append((line, meta))
        pairs = [v for v in by.values() if len(v) > 1]
        self.assertTrue(pairs)
        for turns in pairs:
            first, second = turns[0][0]["hash_ids"], turns[1][0]["hash_ids"]
            self.assertEqual(second[: len(first) - 1], first[:-1])
        self.assertTrue(any(meta["ctx"] == "sub0" for v in by.values() for _, meta in v))

    def test_without_subagents_none_is_played(self):
        with tempfile.TemporaryDirectory() as d:
            rows, _, _ = trace.build(args(raw=self.raw(d), lanes=2, duration=400.0, no_subagents=True))
        self.assertTrue(rows)
        self.assertFalse(any(meta["ctx"] != "main" for _, _, meta in rows))


if __name__ == "__main__":
    unittest.main()
