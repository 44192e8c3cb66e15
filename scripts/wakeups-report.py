#!/usr/bin/env python3
"""Wake-ups per request from `perf script -F comm,tid,event,trace,ip,sym` output of
`perf record -e sched:sched_wakeup,sched:sched_switch --call-graph dwarf` on one process:
the voluntary switches per request, and every wake-up the process's threads caused, by the
innermost frames that are not the standard library's (a wake of another of its own threads is
a hop between the runtime's workers). Used by wakeups-per-request.sh and wakeups-per-pick.sh.

    wakeups-report.py EVENTS_TXT REQUESTS
"""
import collections, re, sys
path, n = sys.argv[1], int(sys.argv[2])
events = []
for line in open(path, errors="replace"):
    if not line.strip():
        continue
    if line[0] not in " \t":
        m = re.match(r"(.+?)\s+(\d+)\s+(sched:\S+):\s*(.*)", line.rstrip())
        if m:
            events.append(dict(tid=int(m.group(2)), ev=m.group(3), trace=m.group(4), stack=[]))
    elif events:
        addr, _, sym = line.strip().partition(" ")
        if not addr.startswith("ffffffff"):  # user frames only
            events[-1]["stack"].append(sym)
own = {e["tid"] for e in events}
plain = re.compile(r"^(__|syscall|std::|<std::|core::|<core::|mio::|<mio|<&mio|<&std|\[unknown\])")
wakes, voluntary = collections.Counter(), 0
for e in events:
    if e["ev"] == "sched:sched_switch":
        voluntary += "prev_state=S" in e["trace"] or "prev_state=D" in e["trace"]
        continue
    m = re.search(r"comm=(\S+) pid=(\d+)", e["trace"])
    wakee = "router thread" if int(m.group(2)) in own else m.group(1)
    frames = [f for f in e["stack"] if not plain.match(f)
              and not f.startswith("tokio::runtime::context::")]
    # `<impl Schedule for Arc<Handle>>::yield_now` -> `Schedule::yield_now`
    frames = [re.sub(r"^(?:[\w:]+::)?<impl (?:[\w:]+::)?(\w+)(?:<[^ ]*>)? for .*>::(\w+)$", r"\1::\2", f)
              for f in frames][:3]
    wakes[(wakee, " <- ".join(f[:110] for f in frames))] += 1
print(f"under perf: {voluntary / n:.2f} voluntary switches per request; wake-ups caused per request:")
for (wakee, where), c in wakes.most_common(12):
    if c / n >= 0.01:
        print(f"{c / n:6.2f}  -> {wakee}: {where}")
