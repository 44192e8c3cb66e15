#!/usr/bin/env bash
# Installs the peer routers kvroute is measured against (the SGLang router and vLLM's router,
# both Python packages with Rust inside) into a cached virtual environment outside the clone, and
# prints its Python. Used by `cargo bench --bench proxy_overhead` (KVROUTE_BENCH_SGLANG_ROUTER)
# and the real-time peer comparisons in docs/benchmarks.md; not part of CI's test stage.
#
#   KVROUTE_BENCH_SGLANG_ROUTER=$(bash scripts/peer-routers-setup.sh) cargo bench --bench proxy_overhead
set -euo pipefail

SGLANG_ROUTER_VERSION=0.3.2
VLLM_ROUTER_VERSION=0.1.17
venv="${KVROUTE_PEER_ROUTERS_VENV:-$HOME/.cache/kvroute/peer-routers}"
stamp="$venv/.kvroute-installed-sglang-router-$SGLANG_ROUTER_VERSION-vllm-router-$VLLM_ROUTER_VERSION"

if [[ ! -f "$stamp" ]]; then
    echo "installing sglang-router $SGLANG_ROUTER_VERSION and vllm-router $VLLM_ROUTER_VERSION into $venv" >&2
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check \
        "sglang-router==$SGLANG_ROUTER_VERSION" "vllm-router==$VLLM_ROUTER_VERSION" >&2
    "$venv/bin/python" -c "import sglang_router.launch_router" >&2
    touch "$stamp"
fi
echo "$venv/bin/python"
