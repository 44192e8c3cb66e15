#!/usr/bin/env python3
"""Checks the endpoint picker's overlay, deploy/kubernetes/overlays/epp, and the Helm chart
rendered as the picker (ci/epp-values.yaml) (run by check_kubernetes.py, with its
render/validate/check helpers).

Renders it; validates the Kubernetes objects against the API schemas (strict); checks the two
Gateway API Inference Extension objects against what the inference.networking.k8s.io/v1 and
gateway.networking.k8s.io/v1 APIs require of the fields used here (their CRDs are not in the
validator's schemas, and the check stays offline); checks that they are wired to each other
and to the picker (pool -> picker Service and port, route -> pool, the pod's --pool-name, RBAC
on inferencepools, gRPC probes on the health port); then starts `kvroute epp` on the pod's
rendered config (loopback ports) and requires its Prometheus endpoint to answer.
"""

import base64
import os
import re
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

DEPLOY = Path(__file__).resolve().parent
EPP = DEPLOY / "kubernetes/overlays/epp"
CRD_KINDS = {"InferencePool", "HTTPRoute"}
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


def one(docs, kind, check):
    found = [d for d in docs if d["kind"] == kind]
    check(len(found) == 1, f"epp: exactly one {kind}")
    return found[0] if found else {}


def pool_schema(pool, check):
    """The InferencePool fields the v1 API requires, as used here."""
    check(pool.get("apiVersion") == "inference.networking.k8s.io/v1", "InferencePool is inference.networking.k8s.io/v1")
    name = pool.get("metadata", {}).get("name", "")
    check(bool(DNS_LABEL.match(name)), f"InferencePool name {name!r} is a DNS label")
    spec = pool.get("spec", {})
    allowed = {"selector", "targetPorts", "appProtocol", "endpointPickerRef"}
    check(set(spec) <= allowed, f"InferencePool spec has only known fields {sorted(set(spec) - allowed)}")
    labels = spec.get("selector", {}).get("matchLabels", {})
    check(set(spec.get("selector", {})) == {"matchLabels"} and 1 <= len(labels) <= 64,
          "InferencePool selector is matchLabels only, 1 to 64 labels")
    ports = [p.get("number") for p in spec.get("targetPorts", [])]
    check(1 <= len(ports) <= 8 and all(isinstance(p, int) and 1 <= p <= 65535 for p in ports)
          and all(set(p) == {"number"} for p in spec.get("targetPorts", [])),
          f"InferencePool targetPorts {ports}: 1 to 8 port numbers")
    check(ports == list(range(ports[0], ports[0] + len(ports))) if ports else False,
          "targetPorts are consecutive (rank N on the first port plus N), as kvroute epp requires")
    ref = spec.get("endpointPickerRef", {})
    check(set(ref) <= {"group", "kind", "name", "port", "failureMode"} and ref.get("kind", "Service") == "Service"
          and ref.get("failureMode", "FailClose") in ("FailOpen", "FailClose"),
          "endpointPickerRef names a Service with a valid failureMode")
    return name, labels, ports, ref


def route_schema(route, check):
    check(route.get("apiVersion") == "gateway.networking.k8s.io/v1", "HTTPRoute is gateway.networking.k8s.io/v1")
    spec = route.get("spec", {})
    check(len(spec.get("parentRefs", [])) >= 1, "HTTPRoute has a parentRef")
    refs = [b for r in spec.get("rules", []) for b in r.get("backendRefs", [])]
    for r in spec.get("rules", []):
        for m in r.get("matches", []):
            p = m.get("path", {})
            check(p.get("type") in ("Exact", "PathPrefix", "RegularExpression") and str(p.get("value", "")).startswith("/"),
                  f"HTTPRoute path match {p}")
    return refs


def wiring(docs, check):
    pool = one(docs, "InferencePool", check)
    route = one(docs, "HTTPRoute", check)
    dep = one(docs, "Deployment", check)
    svc = one(docs, "Service", check)
    role = one(docs, "Role", check)
    if not (pool and route and dep and svc):
        return None
    name, labels, ports, ref = pool_schema(pool, check)
    refs = route_schema(route, check)
    check(any(b.get("group") == "inference.networking.k8s.io" and b.get("kind") == "InferencePool"
              and b.get("name") == name for b in refs), "HTTPRoute sends to the InferencePool")
    svc_ports = {p["port"]: p for p in svc.get("spec", {}).get("ports", [])}
    check(ref.get("name") == svc["metadata"]["name"] and ref.get("port", {}).get("number") in svc_ports,
          f"endpointPickerRef -> Service {svc['metadata']['name']} port {ref.get('port')}")
    pod = dep["spec"]["template"]
    check(not all(pod["metadata"].get("labels", {}).get(k) == v for k, v in labels.items()),
          "the pool's selector does not select the picker's own pods")
    main = next(c for c in pod["spec"]["containers"] if c["name"] == "kvroute")
    args = main.get("args", [])
    check(args[:1] == ["epp"] and "--pool-name" in args and args[args.index("--pool-name") + 1] == name,
          f"the container runs `kvroute epp --pool-name {name}`")
    cports = {p["name"]: p["containerPort"] for p in main.get("ports", [])}
    metrics = 9090
    if "--metrics-listen" in args:
        metrics = int(args[args.index("--metrics-listen") + 1].rsplit(":", 1)[1])
    check(cports == {"grpc": 9002, "grpc-health": 9003, "metrics": metrics}, f"container ports {cports}")
    target = svc_ports.get(ref.get("port", {}).get("number"), {}).get("targetPort")
    check(target == "grpc", "the picker Service targets the gRPC port")
    targets = [p.get("targetPort") for p in svc_ports.values()]
    check(all(t in cports or t in cports.values() for t in targets),
          f"every Service port {targets} targets a container port")
    for probe, service in (("livenessProbe", "liveness"), ("readinessProbe", "readiness")):
        p = main.get(probe, {})
        check(set(p) & {"httpGet", "tcpSocket", "exec"} == set() and p.get("grpc") == {"port": 9003, "service": service},
              f"{probe}: gRPC health `{service}` on 9003, no other handler")
    check(pod["spec"].get("automountServiceAccountToken") is True, "the pod mounts its ServiceAccount token")
    rules = {(g, r): set(rule["verbs"]) for rule in role.get("rules", []) for g in rule["apiGroups"] for r in rule["resources"]}
    check(rules.get(("inference.networking.k8s.io", "inferencepools")) == {"get", "list", "watch"}
          and rules.get(("", "pods")) == {"get", "list", "watch"}, "Role: get/list/watch on inferencepools and pods")
    env = {e["name"] for e in main.get("env", [])}
    check("KVROUTE_EPP_CONFIG" in env and "KVROUTE_CONFIG" not in env and "KVROUTE_LISTEN" not in env,
          f"the picker reads KVROUTE_EPP_CONFIG (env {sorted(env)})")
    return pod, main


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_picker(kvroute, docs, pod, main, check):
    """Writes the pod's config as its init container does, then runs `kvroute epp` on it."""
    cm = next(d for d in docs if d["kind"] == "ConfigMap")
    secret = next(d for d in docs if d["kind"] == "Secret")
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "kvroute.toml"
        keys = base64.b64decode(secret["data"]["keys.toml"]).decode()
        config.write_text(cm["data"]["kvroute.toml"] + "\n" + keys)
        grpc, health, metrics = free_port(), free_port(), free_port()
        env = dict(os.environ, RUST_LOG="warn", KVROUTE_EPP_CONFIG=str(config))
        cmd = [kvroute, "epp", "--grpc-listen", f"127.0.0.1:{grpc}", "--health-listen",
               f"127.0.0.1:{health}", "--metrics-listen", f"127.0.0.1:{metrics}"]
        log = open(Path(tmp) / "epp.log", "w+")
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            body = ""
            for _ in range(100):
                if proc.poll() is not None:
                    break
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{metrics}/metrics", timeout=5) as r:
                        body = r.read().decode()
                    break
                except OSError:
                    time.sleep(0.1)
            check("kvroute_build_info" in body, "kvroute epp starts on the pod's config and serves /metrics")
            with socket.create_connection(("127.0.0.1", health), timeout=5), \
                 socket.create_connection(("127.0.0.1", grpc), timeout=5):
                check(True, "its gRPC and health ports accept connections")
        except OSError as e:
            check(False, f"kvroute epp ports: {e}")
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
            log.seek(0)
            out = log.read()
            if proc.returncode not in (0, -signal.SIGTERM):
                print(out[-3000:])


def run(kubectl, validator, kvroute, render, validate, check, helm=None):
    """The overlay, and with `helm` (a function rendering the chart with ci/epp-values.yaml)
    the Helm chart's picker, checked alike."""
    renders = [(str(EPP.relative_to(DEPLOY.parent)), lambda: render(kubectl, EPP))]
    if helm:
        renders.append(("deploy/helm/kvroute -f epp-values.yaml", helm))
    for name, make in renders:
        print(f"{name}:")
        docs = make()
        if not docs:
            continue
        validate(validator, [d for d in docs if d["kind"] not in CRD_KINDS], name)
        wired = wiring(docs, lambda ok, what, name=name: check(ok, f"{name}: {what}"))
        if wired:
            start_picker(kvroute, docs, *wired, check)
