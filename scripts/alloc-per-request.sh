#!/usr/bin/env bash
# Allocations (glibc malloc calls), context switches and CPU per request of a router process,
# for one small completion sent N times over one keep-alive connection (the request of
# benches/proxy_overhead.rs) to a Python backend that answers at once. Counts, not timings:
# stable on a shared machine. Needs perf with uprobes (`perf probe -x libc malloc`), root.
#
#   scripts/alloc-per-request.sh serve  target/release/kvroute [N]   # kvroute serve, kv_aware
#   scripts/alloc-per-request.sh floor  target/release/deps/proxy_overhead-HASH [N]
#                                       # the bench's bare hyper forwarder
set -euo pipefail
what=$1 binary=$2 n=${3:-2000}
dir=$(mktemp -d)
trap 'kill $(cat "$dir"/*.pid 2>/dev/null) 2>/dev/null; rm -rf "$dir"; perf probe -q -d probe_libc:malloc 2>/dev/null' EXIT
cat > "$dir/backend.py" <<'PY'
import http.server, socketserver, sys
BODY = b'{"id":"c","object":"text_completion","choices":[{"index":0,"text":"hi","finish_reason":"length"}],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}'
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    def log_message(self, *a): pass
    def reply(self, b):
        self.send_response(200); self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(b))); self.end_headers(); self.wfile.write(b)
    def do_GET(self): self.reply(b'{"object":"list","data":[{"id":"m","object":"model"}]}')
    def do_POST(self):
        self.rfile.read(int(self.headers.get("content-length") or 0)); self.reply(BODY)
class S(socketserver.ThreadingMixIn, http.server.HTTPServer): daemon_threads = True
S(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
PY
cat > "$dir/client.py" <<'PY'
import http.client, sys
c = http.client.HTTPConnection("127.0.0.1", int(sys.argv[1]))
for _ in range(int(sys.argv[2])):
    c.request("POST", "/v1/completions", b'{"model":"m","prompt":"Say hello","max_tokens":1}',
              {"content-type": "application/json"})
    r = c.getresponse(); r.read(); assert r.status == 200, r.status
PY
. "$(dirname "$0")/router-under-test.sh"
start_router_under_test "$what" "$binary" 18200 18201
perf probe -q -x "$(ldd "$binary" | awk '/libc.so/ {print $3}')" malloc 2>/dev/null || true
perf stat -x, -e probe_libc:malloc,context-switches,task-clock -p "$pid" -o "$dir/stat" &
stat=$!; sleep 0.5
python3 "$dir/client.py" 18200 "$n"
kill -INT $stat; wait $stat || true
# task-clock is in milliseconds: shown in microseconds of CPU per request.
awk -F, -v n="$n" '$3 ~ /malloc|context-switches/ {printf "%-20s %8.1f per request\n", $3, $1 / n}
  $3 ~ /task-clock/ {printf "%-20s %8.1f µs per request\n", "cpu", $1 * 1000 / n}' "$dir/stat"
