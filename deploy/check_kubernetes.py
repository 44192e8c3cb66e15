#!/usr/bin/env python3
"""Checks the Kubernetes manifests of deploy/kubernetes (run by deploy/check.sh).

For the base and every overlay: renders it with `kubectl kustomize` (warnings fail too),
validates the output against the Kubernetes API schemas with kubernetes-validate (strict: an
unknown or misspelt field fails), checks what the schemas cannot (probes on the right paths,
security context, graceful termination longer than the config's shutdown_grace_s, selectors
that match, the generated ConfigMap/Secret names wired into the pod, RBAC for discovery), then
runs the pod's init-container scripts (the config merge on the rendered ConfigMap and Secret;
the tokenizer fetch against a local server speaking the hub's resolve URLs) and starts
`kvroute serve` on the resulting config (on loopback), which must start, load the fetched
tokenizer, require an API key (the Secret's tenants were merged) and serve /health, /ready and
/metrics on its own port. The companions (the example vLLM StatefulSet, PodMonitor and
PrometheusRule): check_companions.py.

Usage: check_kubernetes.py --kubectl PATH --validator PATH --kvroute PATH [--dockerfile PATH]
       [--promtool PATH]
"""

import argparse
import base64
import http.server
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
import urllib.error
import urllib.request
from pathlib import Path

import yaml

from check_companions import MONITORING, companions

DEPLOY = Path(__file__).resolve().parent
# The endpoint picker's overlay (`kvroute epp`) is checked by check_epp.py: its pod serves
# gRPC, not the router's HTTP.
EPP = DEPLOY / "kubernetes/overlays/epp"
KUSTOMIZATIONS = [DEPLOY / "kubernetes/base"] + sorted(
    p for p in (DEPLOY / "kubernetes/overlays").iterdir()
    if (p / "kustomization.yaml").exists() and p != EPP
)
CHART = DEPLOY / "helm/kvroute"
# The chart's renderings: its defaults, and every option on.
HELM_VALUES = [None, CHART / "ci/full-values.yaml"]
# Oldest Kubernetes the manifests must be valid for, and the validator's newest.
K8S_VERSIONS = ["1.29.0", None]
UID = 10001
KEDA = DEPLOY / "kubernetes/keda/scaledobject.yaml"

failures: list[str] = []


def check(ok: bool, what: str) -> bool:
    print(f"  {'ok  ' if ok else 'FAIL'} {what}")
    if not ok:
        failures.append(what)
    return ok


def render(kubectl: str, path: Path) -> list[dict]:
    proc = subprocess.run([kubectl, "kustomize", str(path)], capture_output=True, text=True)
    if proc.returncode != 0 or proc.stderr.strip():
        print(proc.stderr, file=sys.stderr)
        check(False, f"kubectl kustomize {path.relative_to(DEPLOY.parent)} renders without warnings")
        return []
    check(True, f"kubectl kustomize {path.relative_to(DEPLOY.parent)} renders without warnings")
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


def render_helm(helm: str, chart: Path, values: Path | None) -> list[dict]:
    """`helm lint` and `helm template` of the chart (as release "kvroute" in llm-serving)."""
    what = f"helm template {chart.relative_to(DEPLOY.parent)}" + (f" -f {values.name}" if values else "")
    extra = ["-f", str(values)] if values else []
    lint = subprocess.run([helm, "lint", "--strict", str(chart)] + extra, capture_output=True, text=True)
    if not check(lint.returncode == 0, f"helm lint --strict {chart.name}" + (f" -f {values.name}" if values else "")):
        print(lint.stdout + lint.stderr, file=sys.stderr)
    proc = subprocess.run([helm, "template", "kvroute", str(chart), "--namespace", "llm-serving"] + extra,
                          capture_output=True, text=True)
    if not check(proc.returncode == 0 and not proc.stderr.strip(), f"{what} renders without warnings"):
        print(proc.stderr, file=sys.stderr)
        return []
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


def helm_replica_bus(rendered: dict[str, list[dict]]) -> None:
    """The chart's `replicaBus` value: unset, the router's config has no [replica_bus]; set (as
    ci/full-values.yaml sets it), [replica_bus] names its URL and subject."""
    chart = str(CHART.relative_to(DEPLOY.parent))
    print(f"{chart}: replicaBus")
    full_values = yaml.safe_load((CHART / "ci/full-values.yaml").read_text())
    want = full_values.get("replicaBus", {})
    for name, expected in ((chart, None), (f"{chart} -f full-values.yaml", want)):
        cms = [d for d in rendered.get(name, []) if d["kind"] == "ConfigMap" and "kvroute.toml" in d.get("data", {})]
        if not check(len(cms) == 1, f"{name}: one ConfigMap with kvroute.toml"):
            continue
        bus = tomllib.loads(cms[0]["data"]["kvroute.toml"]).get("replica_bus")
        if expected is None:
            check(bus is None, f"{name}: no [replica_bus] without replicaBus.url")
        else:
            check(bool(expected.get("url")) and bus == {"url": expected["url"], "subject": expected["subject"]},
                  f"{name}: [replica_bus] url {expected.get('url')!r}, subject {expected.get('subject')!r} (got {bus})")


def router_kinds(docs: list[dict]) -> set[str]:
    return {d["kind"] for d in docs if d["metadata"].get("labels", {}).get("app.kubernetes.io/name") == "kvroute"}


def validate(validator: str, docs: list[dict], name: str) -> None:
    # The Prometheus Operator's kinds have no schema in kubernetes-validate's set: checked by
    # check_companions.py instead.
    docs = [d for d in docs if d.get("apiVersion") != MONITORING]
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        yaml.safe_dump_all(docs, f)
    try:
        for version in K8S_VERSIONS:
            cmd = [validator, "--strict", "--quiet"]
            if version:
                cmd += ["-k", version]
            proc = subprocess.run(cmd + [f.name], capture_output=True, text=True)
            out = (proc.stdout + proc.stderr).strip()
            ok = proc.returncode == 0 and "ERROR" not in out
            if not ok:
                print(out)
            check(ok, f"{name}: {len(docs)} objects valid against the Kubernetes {version or 'latest'} schemas (strict)")
    finally:
        os.unlink(f.name)


def one(docs: list[dict], kind: str) -> dict:
    """The router's object of a kind (labelled app.kubernetes.io/name=kvroute: the example
    overlay also holds the engines' objects)."""
    found = [d for d in docs if d["kind"] == kind
             and d["metadata"].get("labels", {}).get("app.kubernetes.io/name") == "kvroute"]
    check(len(found) == 1, f"exactly one {kind}")
    return found[0] if found else {}


def matches(selector: dict, labels: dict) -> bool:
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def semantics(docs: list[dict], name: str, overlay: bool) -> dict:
    """Checks the schemas cannot express; returns the paths the pod mounts."""
    print(f"{name}: semantics")
    dep = one(docs, "Deployment")
    svc = one(docs, "Service")
    pdb = one(docs, "PodDisruptionBudget")
    role = one(docs, "Role")
    binding = one(docs, "RoleBinding")
    sa = one(docs, "ServiceAccount")
    cm = one(docs, "ConfigMap")
    secret = one(docs, "Secret")
    if not dep:
        return {}
    tpl = dep["spec"]["template"]
    pod = tpl["spec"]
    labels = tpl["metadata"].get("labels", {})
    check(matches(dep["spec"]["selector"]["matchLabels"], labels), "Deployment selector matches its pod labels")
    check(matches(svc.get("spec", {}).get("selector", {}), labels), "Service selects the router pods")
    check(matches(pdb.get("spec", {}).get("selector", {}).get("matchLabels", {}), labels), "PodDisruptionBudget selects the router pods")
    check("maxUnavailable" in pdb.get("spec", {}), "PodDisruptionBudget uses maxUnavailable (a 1-replica install can still be drained)")

    # Security: pod and every container.
    psc = pod.get("securityContext", {})
    check(psc.get("runAsNonRoot") is True and psc.get("runAsUser") == UID, f"pod runs as non-root uid {UID}")
    check(psc.get("seccompProfile", {}).get("type") == "RuntimeDefault", "pod seccomp profile RuntimeDefault")
    containers = pod.get("containers", []) + pod.get("initContainers", [])
    for c in containers:
        sc = c.get("securityContext", {})
        check(
            sc.get("runAsNonRoot") is True
            and sc.get("readOnlyRootFilesystem") is True
            and sc.get("allowPrivilegeEscalation") is False
            and sc.get("capabilities", {}).get("drop") == ["ALL"]
            and not sc.get("capabilities", {}).get("add"),
            f"container {c['name']}: non-root, read-only root filesystem, no privilege escalation, all capabilities dropped",
        )
        res = c.get("resources", {})
        check(
            all(k in res.get("requests", {}) for k in ("cpu", "memory"))
            and "memory" in res.get("limits", {}),
            f"container {c['name']}: cpu/memory requests and a memory limit",
        )
        image = c.get("image", "")
        if overlay:
            check(":" in image.rsplit("/", 1)[-1] and "/" in image, f"container {c['name']}: image {image} names a registry and a tag")

    main = next((c for c in pod.get("containers", []) if c["name"] == "kvroute"), None)
    if not check(main is not None, "a container named kvroute"):
        return {}
    ports = {p["name"]: p["containerPort"] for p in main.get("ports", [])}
    live = main.get("livenessProbe", {}).get("httpGet", {})
    ready = main.get("readinessProbe", {}).get("httpGet", {})
    check(live.get("path") == "/health" and live.get("port") in ports, "liveness probe GET /health on a declared port")
    check(ready.get("path") == "/ready" and ready.get("port") in ports, "readiness probe GET /ready on a declared port")
    target = svc.get("spec", {}).get("ports", [{}])[0].get("targetPort")
    check(target in ports, f"Service targetPort {target} is a container port")
    env = {e["name"]: e.get("value") for e in main.get("env", [])}
    listen = env.get("KVROUTE_LISTEN", "")
    check(listen.endswith(f":{ports.get('http')}"), f"KVROUTE_LISTEN {listen} is the http container port")
    config = tomllib.loads(cm.get("data", {}).get("kvroute.toml", ""))
    metrics = config.get("server", {}).get("metrics_listen", "")
    check(metrics.endswith(f":{ports.get('metrics')}"), f"[server] metrics_listen {metrics!r} is the container port `metrics`")
    note = tpl["metadata"].get("annotations", {}).get("prometheus.io/port")
    check(note == str(ports.get("metrics")), f"annotation prometheus.io/port {note} is the metrics port")
    check(all(p.get("targetPort") != "metrics" for p in svc.get("spec", {}).get("ports", [])),
          "the Service does not expose the metrics port")

    # Volumes name the generated (hash-suffixed) ConfigMap and Secret.
    vols = {v["name"]: v for v in pod.get("volumes", [])}
    cm_names = [v["configMap"]["name"] for v in vols.values() if "configMap" in v]
    secret_names = [v["secret"]["secretName"] for v in vols.values() if "secret" in v]
    check(cm_names == [cm.get("metadata", {}).get("name")], f"pod mounts the rendered ConfigMap {cm_names}")
    check(secret_names == [secret.get("metadata", {}).get("name")], f"pod mounts the rendered Secret {secret_names}")
    mounts = {}
    for c in containers:
        for m in c.get("volumeMounts", []):
            mounts[(c["name"], m["mountPath"])] = vols.get(m["name"], {})
    config_path = env.get("KVROUTE_CONFIG", "")
    check(
        any(config_path.startswith(path + "/") for (cname, path) in mounts if cname == "kvroute"),
        f"KVROUTE_CONFIG {config_path} lies in a volume the kvroute container mounts",
    )

    # Graceful termination: preStop sleep + shutdown_grace_s must fit in the grace period.
    grace = config.get("server", {}).get("shutdown_grace_s", 30.0)
    pre = main.get("lifecycle", {}).get("preStop", {})
    cmd = pre.get("exec", {}).get("command", [])
    sleep = float(cmd[-1]) if cmd and cmd[0].endswith("sleep") else float(pre.get("sleep", {}).get("seconds", 0))
    check(sleep > 0, f"preStop waits ({sleep:g} s) so the endpoint is removed before SIGTERM")
    tgps = pod.get("terminationGracePeriodSeconds", 30)
    check(tgps > sleep + grace, f"terminationGracePeriodSeconds {tgps} > preStop {sleep:g} s + shutdown_grace_s {grace:g} s")

    # Kubernetes discovery reads the API with the pod's ServiceAccount token: it must be mounted.
    if "kubernetes" in config.get("discovery", {}):
        check(pod.get("automountServiceAccountToken") is not False, "[discovery.kubernetes] is configured and the pod mounts its ServiceAccount token")
    # RBAC for discovery: read-only pods and endpointslices, bound to the pod's SA.
    rules = {(g, r): set(rule["verbs"]) for rule in role.get("rules", []) for g in rule["apiGroups"] for r in rule["resources"]}
    want = {"get", "list", "watch"}
    check(rules.get(("", "pods")) == want, "Role: get/list/watch on pods, nothing more")
    check(rules.get(("discovery.k8s.io", "endpointslices")) == want, "Role: get/list/watch on endpointslices, nothing more")
    check(len(rules) == 2, "Role grants nothing else")
    check(
        binding.get("roleRef", {}).get("name") == role.get("metadata", {}).get("name")
        and any(s.get("name") == pod.get("serviceAccountName") == sa.get("metadata", {}).get("name") for s in binding.get("subjects", [])),
        "RoleBinding binds the Role to the pod's ServiceAccount",
    )
    if overlay:
        ns = {d["metadata"].get("namespace") for d in docs if d["kind"] != "Namespace"}
        check(len(ns) == 1 and None not in ns, f"every object in one namespace {ns}")
    return {"pod": pod, "template": tpl, "config": config, "cm": cm, "secret": secret, "main": main,
            "mounts": mounts, "env": env}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url: str, data: bytes | None = None) -> tuple[int, str]:
    req = urllib.request.Request(url, data=data, headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


TOKENIZER_FIXTURE = DEPLOY.parent / "tests/fixtures/tokenizers/qwen3/tokenizer.json"


class Hub(http.server.ThreadingHTTPServer):
    """Serves a directory as the Hugging Face hub serves files
    (GET <endpoint>/<repo>/resolve/<revision>/<file>), for the tokenizer init container."""

    def __init__(self, root: Path):
        root_dir = str(root)

        class Handler(http.server.SimpleHTTPRequestHandler):
            def __init__(self, *a, **kw):
                super().__init__(*a, directory=root_dir, **kw)

            def log_message(self, *a):
                pass

        super().__init__(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


def localize(text: str, container: dict, dirs: dict) -> str:
    """The container's mount paths in `text` become the volumes' directories here."""
    mounts = {m["mountPath"] + "/": f"{dirs[m['name']]}/" for m in container.get("volumeMounts", [])}
    if not mounts:
        return text
    # One pass, longest path first: a replaced path is never replaced again (/tmp/...).
    pattern = "|".join(re.escape(p) for p in sorted(mounts, key=len, reverse=True))
    return re.sub(pattern, lambda m: mounts[m.group(0)], text)


def run_init_containers(parts: dict, tmp: Path) -> dict:
    """Runs every init container's /bin/sh script, in order, on directories standing for the
    pod's volumes (the ConfigMap's and Secret's rendered files in theirs); returns them."""
    pod = parts["pod"]
    dirs = {}
    for v in pod["volumes"]:
        d = dirs[v["name"]] = tmp / "volumes" / v["name"]
        d.mkdir(parents=True)
        if "configMap" in v:
            for k, text in parts["cm"]["data"].items():
                (d / k).write_text(text)
        elif "secret" in v:
            for k, data in parts["secret"]["data"].items():
                (d / k).write_bytes(base64.b64decode(data))
    names = [c["name"] for c in pod.get("initContainers", [])]
    check("config" in names, f"init containers {names} include `config` (the config merge)")
    for init in pod.get("initContainers", []):
        if not check(init["command"][:2] == ["/bin/sh", "-c"], f"init container `{init['name']}` runs a /bin/sh script"):
            continue
        env = {e["name"]: e["value"] for e in init.get("env", []) if "value" in e}
        hub = None
        if "HF_ENDPOINT" in env:
            # The hub, here: the repository's tokenizer.json (a real one, Qwen3's, standing in).
            hub_root = tmp / "hub"
            f = hub_root / env["MODEL"] / "resolve" / env["REVISION"] / "tokenizer.json"
            f.parent.mkdir(parents=True)
            shutil.copy(TOKENIZER_FIXTURE, f)
            hub = Hub(hub_root)
            env["HF_ENDPOINT"] = hub.url
        script = localize(init["command"][2], init, dirs)
        proc = subprocess.run(["/bin/sh", "-c", script], capture_output=True, text=True,
                              env={"PATH": os.environ["PATH"], **env})
        if hub:
            hub.shutdown()
        check(proc.returncode == 0, f"init container `{init['name']}` script ran ({proc.stderr.strip() or 'no error'})")
    return dirs


def run_config(kvroute: str, parts: dict, name: str) -> None:
    """Runs the init containers' scripts, then kvroute on the config they wrote."""
    print(f"{name}: the pod's config, as kvroute reads it")
    main = parts["main"]
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        dirs = run_init_containers(parts, tmp)
        config_path = parts["env"]["KVROUTE_CONFIG"]
        merged = Path(localize(config_path, main, dirs))
        if not check(merged.exists(), f"init script wrote {config_path}"):
            return
        text = merged.read_text()
        conf = tomllib.loads(text)
        check(len(conf.get("tenants", [])) >= 1 and "admin" in conf, "merged config has the Secret's [[tenants]] and [admin]")
        sources = sorted(conf.get("discovery", {}).keys() & {"kubernetes", "dns"})
        check(
            len(conf.get("workers", [])) >= 1 or sources,
            f"merged config lists {len(conf.get('workers', []))} workers, discovery {sources}",
        )
        tokenizers = [m["tokenizer"] for m in conf.get("models", []) if m.get("tokenizer", "builtin") != "builtin"]
        for t in tokenizers:
            check(Path(localize(t + "/", main, dirs), "tokenizer.json").exists(),
                  f"{t}/tokenizer.json is in a volume the kvroute container mounts, written by an init container")

        # The pod's paths, here; the metrics listener on a free loopback port.
        port, metrics_port = free_port(), free_port()
        local = tmp / "kvroute-local.toml"
        local.write_text(re.sub(r'(?m)^metrics_listen = ".*"$', f'metrics_listen = "127.0.0.1:{metrics_port}"',
                                localize(text, main, dirs)))
        env = dict(os.environ, KVROUTE_CONFIG=str(local), KVROUTE_LISTEN=f"127.0.0.1:{port}", RUST_LOG="warn")
        serve(kvroute, main, env, port, metrics_port if "metrics_listen" in conf.get("server", {}) else None, tmp,
              bool(tokenizers))


def serve(kvroute: str, main: dict, env: dict, port: int, metrics_port: int | None, tmp: Path, tokenized: bool) -> None:
    """Starts kvroute as the container does and asks what a pod's probes and clients ask."""
    log = open(tmp / "kvroute.log", "w+")
    # The argv of the image: ENTRYPOINT kvroute, the container's args.
    proc = subprocess.Popen([kvroute] + main.get("args", ["serve"]), env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        base = f"http://127.0.0.1:{port}"
        status = None
        for _ in range(100):
            if proc.poll() is not None:
                break
            try:
                status, _ = get(base + "/health")
                break
            except OSError:
                time.sleep(0.1)
        alive = check(status == 200, "kvroute serve starts on this config and /health answers 200")
        if alive:
            status, body = get(base + "/ready")
            check(status in (200, 503), f"/ready answers ({status}: {body.strip()[:80]})")
            metrics = f"http://127.0.0.1:{metrics_port}" if metrics_port else base
            status, body = get(metrics + "/metrics")
            check(status == 200 and "kvroute_build_info" in body, f"/metrics on {'its own port' if metrics_port else 'the API port'} serves kvroute_build_info")
            if metrics_port:
                status, _ = get(base + "/metrics")
                check(status == 404, f"/metrics is not on the API port (got {status})")
            status, body = get(base + "/v1/completions", b'{"model":"m","prompt":"hi","max_tokens":1}')
            check(status == 401, f"/v1 without an API key is refused (got {status}): the tenants are in force")
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        log.seek(0)
        out = log.read()
        if tokenized:
            check("builtin tokenizer" not in out, "no builtin-tokenizer warning: the fetched tokenizer.json was loaded")
        if failures:
            print(out[-3000:])


def dockerfile(path: Path, parts: dict) -> None:
    """The image the manifests run must be the one the Dockerfile builds."""
    lines = [l.strip() for l in path.read_text().splitlines() if l.strip() and not l.startswith("#")]
    final = lines[max(i for i, l in enumerate(lines) if l.upper().startswith("FROM "))]
    user = [l.split()[1] for l in lines if l.upper().startswith("USER ")]
    expose = [l.split()[1] for l in lines if l.upper().startswith("EXPOSE ")]
    main = parts["main"]
    check(user[-1:] == [str(UID)], f"Dockerfile USER {user[-1:]} is the pods' uid {UID}")
    ports = [str(p["containerPort"]) for p in main.get("ports", [])]
    check(expose and expose[-1] in ports, f"Dockerfile EXPOSE {expose} is a container port {ports}")
    # The init container's /bin/sh and cat, and the preStop's /bin/sleep, come from the base.
    check(final.split()[1].startswith("debian:"), f"final image `{final}` has /bin/sh, cat and sleep")
    check("ENTRYPOINT [\"/usr/local/bin/kvroute\"]" in lines and main.get("args") == ["serve"],
          "image ENTRYPOINT kvroute + container args [serve]")


def keda(path: Path, namespace: str | None) -> None:
    """The KEDA ScaledObject example: a CRD no schema here knows, so its shape is checked (its
    queries are evaluated by check_monitoring.py against a real Prometheus)."""
    name = str(path.relative_to(DEPLOY.parent))
    print(f"{name}:")
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    if not check(len(docs) == 1, "one document"):
        return
    so = docs[0]
    check(so.get("apiVersion") == "keda.sh/v1alpha1" and so.get("kind") == "ScaledObject", "a keda.sh/v1alpha1 ScaledObject")
    check(namespace is None or so["metadata"].get("namespace") == namespace, f"in the example overlay's namespace ({namespace})")
    spec = so.get("spec", {})
    check(bool(spec.get("scaleTargetRef", {}).get("name")), "names its scale target")
    lo, hi = spec.get("minReplicaCount", 0), spec.get("maxReplicaCount", 100)
    check(isinstance(lo, int) and isinstance(hi, int) and 0 <= lo <= hi, f"replicas {lo}..{hi}")
    triggers = spec.get("triggers", [])
    check(bool(triggers), "has triggers")
    for t in triggers:
        md = t.get("metadata", {})
        tname = t.get("name", "?")
        check(t.get("type") == "prometheus", f"trigger {tname}: prometheus")
        check(t.get("metricType", "AverageValue") in ("AverageValue", "Value", "Utilization"), f"trigger {tname}: metricType")
        check(md.get("serverAddress", "").startswith("http"), f"trigger {tname}: serverAddress")
        check("kvroute_" in md.get("query", ""), f"trigger {tname}: queries a kvroute metric")
        try:
            ok = float(md.get("threshold", "")) > 0 and float(md.get("activationThreshold", "0")) >= 0
        except ValueError:
            ok = False
        check(ok and isinstance(md.get("threshold"), str), f"trigger {tname}: threshold a positive number, quoted")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--promtool")
    ap.add_argument("--kubectl", required=True)
    ap.add_argument("--validator", required=True)
    ap.add_argument("--kvroute", required=True)
    ap.add_argument("--dockerfile", type=Path)
    ap.add_argument("--helm", help="helm binary: also render and check deploy/helm/kvroute")
    args = ap.parse_args()
    renders = [(str(p.relative_to(DEPLOY.parent)), "overlays" in p.parts, lambda p=p: render(args.kubectl, p))
               for p in KUSTOMIZATIONS]
    if args.helm:
        renders += [(f"{CHART.relative_to(DEPLOY.parent)}{' -f ' + v.name if v else ''}", True,
                     lambda v=v: render_helm(args.helm, CHART, v)) for v in HELM_VALUES]
    kinds, rendered = {}, {}
    for name, overlay, make in renders:
        print(f"{name}:")
        docs = make()
        if not docs:
            continue
        rendered[name] = docs
        kinds[name] = router_kinds(docs)
        validate(args.validator, docs, name)
        parts = semantics(docs, name, overlay=overlay)
        if parts:
            companions(check, docs, parts["template"], parts["config"], args.promtool)
            if args.dockerfile:
                dockerfile(args.dockerfile, parts)
            run_config(args.kvroute, parts, name)
    if args.helm:
        # The chart with every option on renders the router objects the example overlay does.
        example, full = kinds.get("deploy/kubernetes/overlays/example"), kinds.get(f"{CHART.relative_to(DEPLOY.parent)} -f full-values.yaml")
        check(example is not None and example == full, f"the chart renders the example overlay's router kinds ({sorted(full or [])})")
        helm_replica_bus(rendered)
    overlay_ns = next(
        (d["metadata"]["name"] for p in KUSTOMIZATIONS if "overlays" in p.parts
         for d in render(args.kubectl, p) if d["kind"] == "Namespace"),
        None,
    )
    keda(KEDA, overlay_ns)
    import check_epp

    epp_chart = (lambda: render_helm(args.helm, CHART, CHART / "ci/epp-values.yaml")) if args.helm else None
    check_epp.run(args.kubectl, args.validator, args.kvroute, render, validate, check, helm=epp_chart)
    if failures:
        print(f"kubernetes: {len(failures)} checks FAILED:")
        for f in failures:
            print(f"  - {f}")
        return 1
    print("kubernetes: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
