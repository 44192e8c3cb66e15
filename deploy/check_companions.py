"""Checks of the objects that go with the router in deploy/kubernetes (used by
check_kubernetes.py): the example vLLM StatefulSet against the router's config (the port
names, label selector, model and block size that discovery and prefix matching rely on), and
the Prometheus Operator objects, PodMonitor and PrometheusRule, whose CRDs kubernetes-validate
has no schema for: their fields are checked here against the operator's monitoring.coreos.com/v1
API, the rules against deploy/prometheus/kvroute-alerts.yml (the same groups) and by
`promtool check rules`.
"""

import json
import re
import subprocess
import tempfile
from pathlib import Path
from typing import Callable

import yaml

DEPLOY = Path(__file__).resolve().parent
MONITORING = "monitoring.coreos.com/v1"
Check = Callable[[bool, str], bool]

# The fields of monitoring.coreos.com/v1 the manifests may use (a subset of the operator's
# API: the CRDs accept more). An unknown or misspelt key fails, as kubernetes-validate --strict
# does for the built-in kinds.
PODMONITOR_SPEC = {"jobLabel", "podTargetLabels", "selector", "namespaceSelector", "podMetricsEndpoints",
                   "sampleLimit", "targetLimit", "attachMetadata"}
ENDPOINT = {"port", "portNumber", "path", "scheme", "interval", "scrapeTimeout", "honorLabels",
            "honorTimestamps", "relabelings", "metricRelabelings", "params", "enableHttp2",
            "followRedirects", "filterRunning"}
RULE = {"alert", "record", "expr", "for", "keep_firing_for", "labels", "annotations"}
GROUP = {"name", "interval", "rules", "partial_response_strategy", "limit", "query_offset", "labels"}
METADATA = {"name", "namespace", "labels", "annotations"}


def duration(value) -> bool:
    """Prometheus duration as the operator's CRD pattern accepts: 30s, 1m30s, 2h..."""
    return isinstance(value, str) and re.fullmatch(r"((\d+)y)?((\d+)w)?((\d+)d)?((\d+)h)?((\d+)m)?((\d+)s)?((\d+)ms)?", value) is not None and value != ""


def pod_monitor(check: Check, pm: dict, router_pod: dict) -> None:
    check(set(pm) == {"apiVersion", "kind", "metadata", "spec"} and set(pm["metadata"]) <= METADATA,
          "PodMonitor: only apiVersion, kind, metadata, spec")
    spec = pm.get("spec", {})
    check(set(spec) <= PODMONITOR_SPEC, f"PodMonitor spec fields {sorted(set(spec) - PODMONITOR_SPEC) or 'all'} known")
    labels = router_pod["metadata"].get("labels", {})
    sel = spec.get("selector", {}).get("matchLabels", {})
    check(bool(sel) and all(labels.get(k) == v for k, v in sel.items()), "PodMonitor selects the router pods")
    job = labels.get(spec.get("jobLabel", ""))
    check(job == "kvroute", f"PodMonitor jobLabel gives job {job!r}, the job KvrouteDown watches (up{{job=\"kvroute\"}})")
    main = next(c for c in router_pod["spec"]["containers"] if c["name"] == "kvroute")
    ports = {p["name"] for p in main.get("ports", [])}
    eps = spec.get("podMetricsEndpoints", [])
    check(len(eps) >= 1, "PodMonitor has an endpoint")
    for ep in eps:
        check(set(ep) <= ENDPOINT, f"PodMonitor endpoint fields {sorted(set(ep) - ENDPOINT) or 'all'} known")
        check(ep.get("port") == "metrics" and "metrics" in ports and ep.get("path", "/metrics") == "/metrics",
              "PodMonitor scrapes /metrics on the container port `metrics`")
        check(all(duration(ep[k]) for k in ("interval", "scrapeTimeout") if k in ep), "PodMonitor durations well formed")


def prometheus_rule(check: Check, rule: dict, promtool: str | None) -> None:
    check(set(rule) == {"apiVersion", "kind", "metadata", "spec"} and set(rule.get("spec", {})) == {"groups"},
          "PrometheusRule: spec.groups only")
    groups = rule.get("spec", {}).get("groups", [])
    fields = all(set(g) <= GROUP and all(set(r) <= RULE and ("alert" in r) != ("record" in r) for r in g.get("rules", []))
                 for g in groups)
    check(fields, "PrometheusRule groups and rules use known fields, each rule an alert or a record")
    source = yaml.safe_load((DEPLOY / "prometheus/kvroute-alerts.yml").read_text())["groups"]
    check(groups == source, "PrometheusRule holds exactly the groups of deploy/prometheus/kvroute-alerts.yml")
    if promtool:
        with tempfile.NamedTemporaryFile("w", suffix=".yml") as f:
            yaml.safe_dump({"groups": groups}, f)
            f.flush()
            proc = subprocess.run([promtool, "check", "rules", f.name], capture_output=True, text=True)
        check(proc.returncode == 0, f"promtool check rules on the PrometheusRule ({(proc.stdout + proc.stderr).strip().splitlines()[-1:]})")


def kv_events_config(args: list[str]) -> dict:
    for a in args:
        if a.startswith("--kv-events-config="):
            return json.loads(a.split("=", 1)[1])
    return {}


def flag(args: list[str], name: str) -> str | None:
    for i, a in enumerate(args):
        if a.startswith(name + "="):
            return a.split("=", 1)[1]
        if a == name and i + 1 < len(args):
            return args[i + 1]
    return None


def vllm(check: Check, sts: dict, services: list[dict], config: dict) -> None:
    """The example engines as the router's config finds and tokenizes them."""
    pod = sts["spec"]["template"]
    labels = pod["metadata"].get("labels", {})
    c = pod["spec"]["containers"][0]
    args = c.get("command", [])[2:] + c.get("args", [])
    ports = {p["name"]: p["containerPort"] for p in c.get("ports", [])}
    k8s = config.get("discovery", {}).get("kubernetes", {})
    selector = dict(kv.split("=", 1) for kv in k8s.get("label_selector", "").split(",") if "=" in kv)
    check(bool(selector) and all(labels.get(k) == v for k, v in selector.items()),
          f"vLLM pods match [discovery.kubernetes] label_selector {k8s.get('label_selector')!r}")
    names = {k8s.get("http_port", "http"), k8s.get("kv_events_port", "kv-events"), k8s.get("kv_replay_port", "kv-replay")}
    check(names <= set(ports), f"vLLM container ports {sorted(ports)} carry the names discovery reads {sorted(names)}")
    check(str(ports.get("http")) == flag(args, "--port"), f"vLLM --port {flag(args, '--port')} is the port named http")
    ev = kv_events_config(args)
    check(ev.get("enable_kv_cache_events") is True and ev.get("publisher") == "zmq", "vLLM publishes KV events over ZeroMQ")
    check(ev.get("endpoint") == f"tcp://*:{ports.get('kv-events')}" and ev.get("replay_endpoint") == f"tcp://*:{ports.get('kv-replay')}",
          f"vLLM binds its events at the ports named kv-events/kv-replay ({ev.get('endpoint')}, {ev.get('replay_endpoint')})")
    check("--enable-prefix-caching" in args, "vLLM runs with --enable-prefix-caching")
    models = {m["name"]: m for m in config.get("models", [])}
    served = next((a for a in args if not a.startswith("-")), None)
    model = models.get(served, {})
    check(bool(model), f"vLLM's model {served!r} is a [[models]] entry of kvroute.toml")
    check(str(model.get("block_size")) == flag(args, "--block-size"),
          f"vLLM --block-size {flag(args, '--block-size')} = the model's block_size {model.get('block_size')}")
    check(model.get("tokenizer", "builtin") != "builtin", f"the model has a real tokenizer ({model.get('tokenizer')!r})")
    probe = c.get("readinessProbe", {}).get("httpGet", {})
    check(probe.get("port") == "http", "vLLM has a readiness probe (kvroute routes to Ready pods)")
    headless = [s for s in services if s["metadata"]["name"] == sts["spec"].get("serviceName")]
    check(len(headless) == 1 and headless[0]["spec"].get("clusterIP") == "None",
          f"StatefulSet serviceName {sts['spec'].get('serviceName')!r} is a headless Service")
    if headless:
        sel = headless[0]["spec"].get("selector", {})
        check(bool(sel) and all(labels.get(k) == v for k, v in sel.items()), "the headless Service selects the vLLM pods")


def companions(check: Check, docs: list[dict], router_pod: dict, config: dict, promtool: str | None) -> None:
    for sts in [d for d in docs if d["kind"] == "StatefulSet"]:
        print(f"  StatefulSet {sts['metadata']['name']}:")
        vllm(check, sts, [d for d in docs if d["kind"] == "Service"], config)
    for d in docs:
        if d.get("apiVersion") == MONITORING:
            check(d["kind"] in ("PodMonitor", "PrometheusRule"), f"{d['kind']} is a PodMonitor or PrometheusRule")
            if d["kind"] == "PodMonitor":
                pod_monitor(check, d, router_pod)
            elif d["kind"] == "PrometheusRule":
                prometheus_rule(check, d, promtool)

