#!/usr/bin/env bash
# Task hops per request of `kvroute epp` beside `kvroute serve`, for the same requests: the
# epp_decision bench's (a 300-word chat completion; the picker asked as Envoy asks it, serve
# proxying to a fake engine). Two passes of the bench binary with KVROUTE_BENCH_N=N: the first
# counts each router process's CPU time and context switches per request (`perf stat`,
# counting only); the second records their scheduler events (`perf record -e
# sched:sched_wakeup,sched:sched_switch --call-graph dwarf`) and prints, per process, every
# wake-up its threads caused per request by the innermost frames that are not the standard
# library's (scripts/wakeups-report.py). A request here is the whole of one: for the picker,
# its ext_proc stream (headers, body chunks, the pick, the response phase). Needs perf and
# root; run it alone (`flock /tmp/kvroute-bench.lock`).
#
#   cargo bench --bench epp_decision --no-run   # prints the bench binary's path
#   flock /tmp/kvroute-bench.lock scripts/wakeups-per-pick.sh target/release/deps/epp_decision-HASH [N]
set -euo pipefail
bench=$1 n=${2:-300}
here=$(cd "$(dirname "$0")" && pwd)
dir=$(mktemp -d)
trap 'kill $(cat "$dir"/*.pid 2>/dev/null) 2>/dev/null; rm -rf "$dir"' EXIT
# Requests each router gets: the bench's 10 rounds of N/10 timed and 50 warm-up ones, and the
# one that found it ready.
requests=$((10 * (n / 10 + 50) + 1))

# Starts the bench; sets serve_pid and epp_pid once both routers run.
start_bench() {
  KVROUTE_BENCH_N=$n "$bench" > "$dir/bench.txt" 2>&1 & echo $! > "$dir/bench.pid"
  local b; b=$(cat "$dir/bench.pid")
  for _ in $(seq 200); do
    serve_pid=$(pgrep -P "$b" -f "kvroute serve" || true)
    epp_pid=$(pgrep -P "$b" -f "kvroute epp" || true)
    [ -n "$serve_pid" ] && [ -n "$epp_pid" ] && return
    sleep 0.05
  done
  echo "the bench did not start its routers" >&2; exit 1
}

# Waits for the bench, then stops both perf processes started under `$1-<process>.pid`.
stop_perf_when_bench_ends() {
  wait "$(cat "$dir/bench.pid")"
  for p in serve epp; do kill -INT "$(cat "$dir/$1-$p.pid")" 2>/dev/null || true; done
  wait "$(cat "$dir/$1-serve.pid")" "$(cat "$dir/$1-epp.pid")" || true
  rm -f "$dir/$1"-*.pid
}

start_bench
for p in serve epp; do
  pid_var=${p}_pid
  perf stat -x, -e task-clock,context-switches -p "${!pid_var}" -o "$dir/$p.stat" & echo $! > "$dir/stat-$p.pid"
done
stop_perf_when_bench_ends stat
for p in serve epp; do
  awk -F, -v n="$requests" -v who="$p" '
    $3 == "task-clock" {cpu = $1} $3 == "context-switches" {cs = $1}
    END {printf "%-5s: %.1f µs of CPU, %.2f context switches per request\n", who, cpu * 1000 / n, cs / n}' \
    "$dir/$p.stat"
done

start_bench
for p in serve epp; do
  pid_var=${p}_pid
  perf record -q -o "$dir/$p.data" -e sched:sched_wakeup,sched:sched_switch \
    --call-graph dwarf,16384 -p "${!pid_var}" 2>/dev/null & echo $! > "$dir/rec-$p.pid"
done
stop_perf_when_bench_ends rec
for p in serve epp; do
  echo "== kvroute $p"
  perf script -i "$dir/$p.data" -F comm,tid,event,trace,ip,sym 2>/dev/null > "$dir/$p.txt"
  python3 "$here/wakeups-report.py" "$dir/$p.txt" "$requests"
done
