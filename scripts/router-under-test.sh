# Sourced by alloc-per-request.sh and wakeups-per-request.sh: starts their Python backend
# ("$dir/backend.py") on BACKEND_PORT and the router under test on ROUTER_PORT in front of it —
# `kvroute serve` with kv_aware for `serve`, the proxy_overhead bench's bare hyper forwarder for
# `floor` — records both pids in "$dir", waits for the router, and warms it with 200 requests
# ("$dir/client.py"). Sets `pid` to the router's process id.
#
#   start_router_under_test WHAT BINARY ROUTER_PORT BACKEND_PORT
start_router_under_test() {
  local what=$1 binary=$2 router=$3 backend=$4
  python3 "$dir/backend.py" "$backend" & echo $! > "$dir/backend.pid"
  if [ "$what" = serve ]; then
    printf 'policy = "kv_aware"\n[server]\nlisten = "127.0.0.1:%s"\n[[workers]]\nid = "b"\nurl = "http://127.0.0.1:%s"\nmodels = ["m"]\n' \
      "$router" "$backend" > "$dir/kvroute.toml"
    RUST_LOG=warn "$binary" serve --config "$dir/kvroute.toml" > "$dir/router.log" 2>&1 &
  else
    KVROUTE_BENCH_BARE_FORWARDER="127.0.0.1:$router 127.0.0.1:$backend" "$binary" > "$dir/router.log" 2>&1 &
  fi
  pid=$!; echo $pid > "$dir/router.pid"
  sleep 3
  python3 "$dir/client.py" "$router" 200   # warm up
}
