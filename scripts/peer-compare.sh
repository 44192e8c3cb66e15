#!/usr/bin/env bash
# Real-time comparison of routers in front of the same `kvroute engine` fleet (issue 15, goal 3):
# kvroute's policies, the SGLang router and vLLM's router, each in turn in front of freshly
# started engines (empty caches), driven by `kvroute bench` with the same seed, so every router
# gets identical requests at identical times. Writes each run's JSON/Markdown/SVG, the engines'
# own prefix-cache counters per run, and a side-by-side table (`table.md`).
#
#   scripts/peer-compare.sh OUT_DIR [kvroute bench workload flags…]
#   e.g. scripts/peer-compare.sh /tmp/peers --synthetic shared-prefix --requests 400 --rate 16 \
#            --prefixes 32 --prefix-tokens 4096 --zipf 0.8 --slo-ttft 0.5 --slo-e2e 5
#
# Settings (environment):
#   KVROUTE       the kvroute binary (default target/release/kvroute)
#   ROUTERS       which routers, in order (default "kv_aware least_request sglang vllm");
#                 kvroute policies by name (or LABEL:POLICY:CONFIG, a policy with a config
#                 file, shown as LABEL; LABEL:POLICY:CONFIG:BINARY runs that build of kvroute
#                 as the router, to compare two builds alternating in one run),
#                 `sglang` = sglang-router cache_aware,
#                 `smg` = Shepherd Model Gateway 1.13 (`smg launch`) cache_aware,
#                 `vllm` = vllm-router cache_aware (it asks the engines' /tokenize)
#   ENGINES       engines in the fleet (default 4)
#   ENGINE_ARGS   flags for every `kvroute engine` (default: real speed, 2,048 blocks of 16)
#   ENGINE_SPEEDUPS  a mixed fleet: each engine's --engine-speedup, space-separated and
#                 repeated over the fleet ("2 1": every second engine at half the speed of
#                 the first); ENGINE_ARGS must not set --engine-speedup then (default: unset)
#   ENGINE_MAX_MODEL_LENS  a fleet of mixed contexts: each engine's --max-model-len,
#                 space-separated and repeated over the fleet ("32768 8192": every second
#                 engine takes prompts of at most 8,192 tokens with their output; default: unset)
#   ROUNDS        repeat the routers this many times, reversing the order every other round,
#                 so drift of a shared machine falls on every router alike (default 1)
#   PORT_BASE     first loopback port used (default 23000; below the ephemeral range)
# The peer routers come from scripts/peer-routers-setup.sh (a cached venv; installed if absent).
set -euo pipefail
cd "$(dirname "$0")/.."

out=${1:?usage: scripts/peer-compare.sh OUT_DIR [kvroute bench workload flags…]}
shift
mkdir -p "$out"
kvroute=${KVROUTE:-target/release/kvroute}
routers=(${ROUTERS:-kv_aware least_request sglang vllm})
engines=${ENGINES:-4}
read -r -a engine_speedups <<<"${ENGINE_SPEEDUPS:-}"
read -r -a engine_contexts <<<"${ENGINE_MAX_MODEL_LENS:-}"
if [ "${#engine_speedups[@]}" -gt 0 ]; then
    engine_args=${ENGINE_ARGS:---block-size 16 --num-blocks 2048}
else
    engine_args=${ENGINE_ARGS:---engine-speedup 1 --block-size 16 --num-blocks 2048}
fi
rounds=${ROUNDS:-1}
base=${PORT_BASE:-23000}
model=kvroute/sim
router_port=$((base + 99))

peer_python=$(bash scripts/peer-routers-setup.sh)
peer_bin=$(dirname "$peer_python")
smg_bin=
if [[ " ${routers[*]} " == *" smg "* ]]; then
    smg_bin=$(bash scripts/peer-routers-setup.sh --smg)
fi

pids=()
stop_all() {
    for pid in "${pids[@]}"; do
        kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
    done
    for pid in "${pids[@]}"; do
        for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null || true
    done
    pids=()
}
trap stop_all EXIT

# Starts a command in its own process group, its output in a log; remembers its id.
spawn() {
    local log=$1
    shift
    setsid "$@" >"$log" 2>&1 &
    pids+=($!)
}

wait_http() {
    local url=$1 what=$2
    for _ in $(seq 600); do
        curl -sf -o /dev/null "$url" && return 0
        sleep 0.1
    done
    echo "$what did not answer $url within 60 s" >&2
    return 1
}

engine_port() { echo $((base + 3 * $1)); }

start_engines() {
    local run=$1
    for i in $(seq 0 $((engines - 1))); do
        local p speed=()
        p=$(engine_port "$i")
        if [ "${#engine_speedups[@]}" -gt 0 ]; then
            speed=(--engine-speedup "${engine_speedups[$((i % ${#engine_speedups[@]}))]}")
        fi
        if [ "${#engine_contexts[@]}" -gt 0 ]; then
            speed+=(--max-model-len "${engine_contexts[$((i % ${#engine_contexts[@]}))]}")
        fi
        # shellcheck disable=SC2086
        spawn "$out/$run.engine$i.log" "$kvroute" engine --listen "127.0.0.1:$p" --model "$model" \
            --kv-events-endpoint "tcp://127.0.0.1:$((p + 1))" \
            --kv-replay-endpoint "tcp://127.0.0.1:$((p + 2))" --seed "$i" $engine_args "${speed[@]}"
    done
    for i in $(seq 0 $((engines - 1))); do
        wait_http "http://127.0.0.1:$(engine_port "$i")/health" "engine $i"
    done
}

start_router() {
    local router=$1 run=$2 urls=() workers=()
    for i in $(seq 0 $((engines - 1))); do
        local p
        p=$(engine_port "$i")
        urls+=("http://127.0.0.1:$p")
        workers+=(--worker "http://127.0.0.1:$p=$model@tcp://127.0.0.1:$((p + 1))@tcp://127.0.0.1:$((p + 2))")
    done
    case $router in
        sglang)
            spawn "$out/$run.router.log" "$peer_python" -m sglang_router.launch_router \
                --host 127.0.0.1 --port "$router_port" --policy cache_aware --worker-urls "${urls[@]}" ;;
        smg)
            spawn "$out/$run.router.log" "$smg_bin" launch \
                --host 127.0.0.1 --port "$router_port" --policy cache_aware --worker-urls "${urls[@]}" ;;
        vllm)
            spawn "$out/$run.router.log" "$peer_bin/vllm-router" \
                --host 127.0.0.1 --port "$router_port" --policy cache_aware --worker-urls "${urls[@]}" ;;
        *:*:*)
            # LABEL:POLICY:CONFIG[:BINARY] — a kvroute policy with a config file (and another
            # build of kvroute), run as LABEL.
            local policy config binary
            IFS=: read -r _ policy config binary <<<"$router"
            spawn "$out/$run.router.log" "${binary:-$kvroute}" serve \
                --listen "127.0.0.1:$router_port" \
                --policy "$policy" --config "$config" "${workers[@]}" ;;
        *)
            spawn "$out/$run.router.log" "$kvroute" serve --listen "127.0.0.1:$router_port" \
                --policy "$router" "${workers[@]}" ;;
    esac
    wait_http "http://127.0.0.1:$router_port/v1/models" "router $router"
}

# The engines' own counters after a run: requests, prompt tokens looked up and served from the
# prefix cache, per engine and in all.
engine_counters() {
    local run=$1 q=0 h=0
    {
        echo "engine requests prefix_queries prefix_hits"
        for i in $(seq 0 $((engines - 1))); do
            local text
            text=$(curl -sf "http://127.0.0.1:$(engine_port "$i")/metrics")
            local n qi hi
            n=$(sum_metric "$text" 'vllm:request_success_total')
            qi=$(sum_metric "$text" 'vllm:prefix_cache_queries_total')
            hi=$(sum_metric "$text" 'vllm:prefix_cache_hits_total')
            echo "$i $n $qi $hi"
        done
    } >"$out/$run.engines.txt"
    awk 'NR > 1 { q += $3; h += $4; r = r (r ? "/" : "") $2 }
         END { printf "engines: requests %s, prefix hit rate %.1f %%\n", r, q ? 100 * h / q : 0 }' \
        "$out/$run.engines.txt" | tee -a "$out/$run.engines.txt"
}

sum_metric() {
    awk -v name="$2" '$1 == name || index($1, name "{") == 1 { s += $NF } END { printf "%.0f", s }' <<<"$1"
}

files=()
for round in $(seq 1 "$rounds"); do
    order=("${routers[@]}")
    if ((round % 2 == 0)); then
        order=()
        for ((k = ${#routers[@]} - 1; k >= 0; k--)); do order+=("${routers[k]}"); done
    fi
    for router in "${order[@]}"; do
        run=${router%%:*}
        ((rounds > 1)) && run="$run-r$round"
        echo "== $run"
        start_engines "$run"
        start_router "$router" "$run"
        "$kvroute" bench --target "http://127.0.0.1:$router_port" --model "$model" --no-progress \
            --name "$run" --out "$out/$run.json" "$@"
        engine_counters "$run"
        stop_all
        files+=("$out/$run.json")
    done
done

"$kvroute" bench compare "${files[@]}" --plot "$out/ttft_cdf.svg" | tee "$out/table.md"
for f in "${files[@]}"; do
    tail -n1 "${f%.json}.engines.txt" | sed "s|^|$(basename "${f%.json}"): |"
done | tee -a "$out/table.md"
