#!/usr/bin/env bash
# Installs the peer routers kvroute is measured against (the SGLang router and vLLM's router,
# both Python packages with Rust inside) into a cached virtual environment outside the clone, and
# prints its Python. Used by `cargo bench --bench proxy_overhead` (KVROUTE_BENCH_SGLANG_ROUTER)
# and the real-time peer comparisons in docs/benchmarks.md; not part of CI's test stage.
#
#   KVROUTE_BENCH_SGLANG_ROUTER=$(bash scripts/peer-routers-setup.sh) cargo bench --bench proxy_overhead
#
# With `--smg`, installs Shepherd Model Gateway (`smg`, the SGLang router's successor) into a
# venv of its own (it ships a `sglang_router`-free package, but pins its own dependencies) and
# prints the path of its `smg` command instead.
set -euo pipefail

SMG_VERSION=1.13.0
if [[ "${1:-}" == "--smg" ]]; then
    venv="${KVROUTE_PEER_SMG_VENV:-$HOME/.cache/kvroute/peer-smg}"
    stamp="$venv/.kvroute-installed-smg-$SMG_VERSION"
    if [[ ! -f "$stamp" ]]; then
        echo "installing smg $SMG_VERSION into $venv" >&2
        python3 -m venv "$venv"
        "$venv/bin/pip" install --quiet --disable-pip-version-check "smg==$SMG_VERSION" >&2
        "$venv/bin/smg" launch --help >/dev/null
        touch "$stamp"
    fi
    echo "$venv/bin/smg"
    exit 0
fi

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
