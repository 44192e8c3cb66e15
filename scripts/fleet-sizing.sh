#!/usr/bin/env bash
# The router's own memory (RSS) and CPU as a function of its workers, with simulated engines.
#
# One `kvroute engine` listens on every address; the router is given N workers at distinct
# loopback addresses (127.1.x.y) that all reach it: N health checks, N load pollers (every
# 100 ms, the live default), N KV-event subscriptions (each worker subscribes to the engine's
# stream, so every batch is applied N times, as N engines publishing the same blocks would) and
# an index of N workers. The router is measured idle, then under `kvroute bench` traffic.
# Router replicas are separate processes: R replicas cost R times one row (and R times the
# engines' scrapes: tests/it/engine_scrape_cost.rs).
#
#   flock /tmp/kvroute-bench.lock scripts/fleet-sizing.sh [N ...]   (default: 16 256 1024)
#
# Prints one Markdown row per N. KVROUTE names the binary (default target/release/kvroute).
set -euo pipefail
KVROUTE=${KVROUTE:-target/release/kvroute}
WINDOW=${WINDOW:-30}
RATE=${RATE:-10}
sizes=("$@")
[ ${#sizes[@]} -eq 0 ] && sizes=(16 256 1024)
dir=${SIZING_DIR:-$(mktemp -d)}
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    [ -n "${SIZING_DIR:-}" ] || rm -rf "$dir"
}
trap cleanup EXIT

port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
ip() { echo "127.1.$(($1 / 200)).$(($1 % 200 + 1))"; }
rss_mib() { awk '/VmRSS/ {printf "%.0f", $2 / 1024}' "/proc/$1/status"; }
cpu_s() { awk '{printf "%.2f", ($14 + $15) / 100}' "/proc/$1/stat"; }

EP=$(port); KP=$(port); RP=$(port)
"$KVROUTE" engine --listen "0.0.0.0:$EP" --kv-events-endpoint "tcp://0.0.0.0:$KP" \
    --kv-replay-endpoint "tcp://0.0.0.0:$RP" --num-blocks 16384 --engine-speedup 20 \
    >"$dir/engine.log" 2>&1 &
pids+=($!)

echo "| workers | idle RSS (MiB) | idle CPU (cores) | under traffic: RSS (MiB) | CPU (cores) | requests ok |"
echo "|---:|---:|---:|---:|---:|---:|"
for n in "${sizes[@]}"; do
    LP=$(port)
    {
        echo "listen = \"127.0.0.1:$LP\""
        echo "[admin]"
        echo "open_on_loopback = true"
        for ((i = 0; i < n; i++)); do
            a=$(ip "$i")
            printf '[[workers]]\nid = "w%d"\nurl = "http://%s:%d"\nkv_events = "tcp://%s:%d"\nkv_replay = "tcp://%s:%d"\n' \
                "$i" "$a" "$EP" "$a" "$KP" "$a" "$RP"
        done
    } >"$dir/router.toml"
    "$KVROUTE" serve --config "$dir/router.toml" >"$dir/router-$n.log" 2>&1 &
    router=$!
    pids+=($router)
    # Ready: every worker healthy.
    for _ in $(seq 1 600); do
        healthy=$(curl -s "http://127.0.0.1:$LP/admin/workers" | python3 -c \
            'import json,sys; print(sum(w["healthy"] for w in json.load(sys.stdin)["workers"]))' 2>/dev/null || echo 0)
        [ "$healthy" = "$n" ] && break
        sleep 1
    done
    [ "$healthy" = "$n" ] || { echo "router with $n workers: only $healthy healthy" >&2; exit 1; }
    sleep 5
    c0=$(cpu_s "$router"); sleep "$WINDOW"; c1=$(cpu_s "$router")
    idle_rss=$(rss_mib "$router")
    idle_cpu=$(echo "($c1 - $c0) / $WINDOW" | bc -l)
    c0=$(cpu_s "$router")
    "$KVROUTE" bench --target "http://127.0.0.1:$LP" --synthetic shared-prefix --model kvroute/sim \
        --rate "$RATE" --requests $((RATE * WINDOW)) --input-tokens 2048 --output-tokens 32 \
        --no-progress --out "$dir/bench-$n.json" >"$dir/bench-$n.log" 2>&1
    c1=$(cpu_s "$router")
    secs=$(python3 -c "import json; print(json.load(open('$dir/bench-$n.json'))['summary']['duration_s'])" 2>/dev/null || echo "$WINDOW")
    load_rss=$(rss_mib "$router")
    load_cpu=$(echo "($c1 - $c0) / $secs" | bc -l)
    ok=$(python3 -c "import json; r=json.load(open('$dir/bench-$n.json')); print(r['summary']['ok'])" 2>/dev/null || echo "?")
    printf '| %d | %s | %.2f | %s | %.2f | %s |\n' "$n" "$idle_rss" "$idle_cpu" "$load_rss" "$load_cpu" "$ok"
    kill "$router"
    wait "$router" 2>/dev/null || true
done
