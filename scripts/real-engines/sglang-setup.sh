#!/usr/bin/env bash
# Prepares everything the real-SGLang test stage (tests/it/real_sglang*.rs) needs, outside the
# clone, without depending on the real-vLLM stage:
#   - SGLang 0.5.23 in a virtual environment (~7 GB, so cached and reused across clones), with
#     the wheel's CUDA-only requirements left out (sglang_requirements.py),
#   - the tiny random-weight Qwen3 model and its LoRA adapter, built by the same builder as the
#     vLLM stage's (tiny_model.py) from the project's own Qwen3 tokenizer fixture.
# The project's `sgl_kernel` stand-in (sgl_kernel_shim/, see its docstring) is not installed: the
# tests put it on PYTHONPATH when they start an engine, so the cache never holds a stale copy.
# Idempotent: a completion marker per step, written last, so a rerun takes seconds and an
# interrupted install is started over.
#
# Where: ${KVROUTE_ENGINE_CACHE:-$HOME/.cache/kvroute}/sglang-0.5.23 (the tests read the same
# variable). Layout: venv/ (python), models/tiny-qwen3/, models/tiny-qwen3-lora/.
set -euo pipefail

SGLANG_VERSION=0.5.23
HERE="$(cd "$(dirname "$0")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
CACHE="${KVROUTE_ENGINE_CACHE:-$HOME/.cache/kvroute}"
ROOT="$CACHE/sglang-$SGLANG_VERSION"
VENV="$ROOT/venv"
MODELS="$ROOT/models"
PY="${PYTHON:-python3}"
start=$SECONDS

step() { echo "-- $* ($((SECONDS - start)) s)"; }

mkdir -p "$ROOT"
if [[ -f "$VENV/.kvroute-complete" && "$(cat "$VENV/.kvroute-complete")" == "sglang $SGLANG_VERSION" ]]; then
    step "SGLang $SGLANG_VERSION already installed in $VENV"
else
    step "installing SGLang $SGLANG_VERSION into $VENV"
    rm -rf "$VENV"
    "$PY" -m venv "$VENV"
    pip=("$VENV/bin/python" -m pip --disable-pip-version-check --quiet)
    "${pip[@]}" install --upgrade pip
    wheels="$ROOT/wheels"
    rm -rf "$wheels" && mkdir -p "$wheels"
    # `pip install sglang` fails here: the wheel requires CUDA-only kernels that have no CPU
    # build (and no source). Install the rest of its requirements, then the wheel without
    # dependencies; the CPU engine takes its torch-native paths.
    "${pip[@]}" download --no-deps --dest "$wheels" "sglang==$SGLANG_VERSION"
    wheel="$(ls "$wheels"/sglang-*.whl)"
    "$VENV/bin/python" "$HERE/sglang_requirements.py" "$wheel" >"$wheels/requirements.txt"
    step "installing $(wc -l <"$wheels/requirements.txt") requirements of $(basename "$wheel")"
    "${pip[@]}" install -r "$wheels/requirements.txt"
    "${pip[@]}" install --no-deps "$wheel"
    step "installing peft (to build the LoRA adapter)"
    "${pip[@]}" install peft
    rm -rf "$wheels"
    echo "sglang $SGLANG_VERSION" >"$VENV/.kvroute-complete"
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

step "checking that SGLang's CPU engine imports with the sgl_kernel shim"
PYTHONPATH="$HERE/sgl_kernel_shim" SGLANG_USE_CPU_ENGINE=1 "$VENV/bin/python" -c \
    'import sglang, sglang.launch_server, sgl_kernel; print("sglang", sglang.__version__, "shim", sgl_kernel.__file__)'
step "done: python $VENV/bin/python, model $MODELS/tiny-qwen3, adapter $MODELS/tiny-qwen3-lora"
