#!/usr/bin/env bash
# Task hops per request of a router process: which code of the router wakes which thread, for
# one small completion sent N times over one keep-alive connection (the request and backend of
# scripts/alloc-per-request.sh). Prints the router's voluntary and involuntary context switches
# per request (its threads' /proc counters, without perf attached), then — from a second pass
# of N requests under `perf record -e sched:sched_wakeup,sched:sched_switch --call-graph dwarf`
# — every wake-up the router's threads caused, per request, by the innermost frames that are
# not the standard library's. A wake of another router thread is a hop between the runtime's
# worker threads: an OS context switch on the latency path. Needs perf and root.
#
#   scripts/wakeups-per-request.sh serve target/release/kvroute [N]
#   scripts/wakeups-per-request.sh floor target/release/deps/proxy_overhead-HASH [N]
set -euo pipefail
what=$1 binary=$2 n=${3:-300}
here=$(cd "$(dirname "$0")" && pwd)
dir=$(mktemp -d)
trap 'kill $(cat "$dir"/*.pid 2>/dev/null) 2>/dev/null; rm -rf "$dir"' EXIT
# The backend and client of alloc-per-request.sh, verbatim.
for f in backend client; do
  sed -n "/^cat > \"\\\$dir\\/$f.py\"/,/^PY\$/p" "$here/alloc-per-request.sh" | sed '1d;$d' > "$dir/$f.py"
done
. "$here/router-under-test.sh"
start_router_under_test "$what" "$binary" 18230 18231
switches() { cat /proc/"$pid"/task/*/status | awk '/^voluntary/ {v+=$2} /^nonvoluntary/ {i+=$2} END {print v, i}'; }
read -r v0 i0 < <(switches)
python3 "$dir/client.py" 18230 "$n"
read -r v1 i1 < <(switches)
awk -v v=$((v1 - v0)) -v i=$((i1 - i0)) -v n="$n" \
  'BEGIN {printf "context switches per request: %.2f voluntary, %.2f involuntary\n", v / n, i / n}'
perf record -q -o "$dir/perf.data" -e sched:sched_wakeup,sched:sched_switch \
  --call-graph dwarf,16384 -p "$pid" 2>/dev/null & rec=$!
sleep 1
python3 "$dir/client.py" 18230 "$n"
kill -INT $rec; wait $rec || true
perf script -i "$dir/perf.data" -F comm,tid,event,trace,ip,sym 2>/dev/null > "$dir/events.txt"
python3 "$here/wakeups-report.py" "$dir/events.txt" "$n"
