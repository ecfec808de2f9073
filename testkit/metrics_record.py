"""Record the series the real components export, as Prometheus stores them through the
chart's monitors, for the alert-rule and dashboard tests (tests/test_monitoring.py).

    python -m testkit.metrics_record        record from local processes (no cluster)

Each *scenario* is a timeline of scrapes of every target: the frontend's, the workers' and
the operator's real ``/metrics``, after real requests (speech, a realtime session, long
audio cut into chunks, a worker gone, a queue full, a pool at zero). Every sample gets the
target labels the chart's monitors give it: the PodMonitors' and the ServiceMonitor's
relabelings, read from the chart as Helm renders it, are applied here to the pod's labels as
the operator sets them (``namespace``, ``deployment``, ``pool``, ``engine``, ``pod``,
``job``, ``instance``), and ``up`` is added per target. A scenario's file,
``tests/fixtures/metrics/<source>/<scenario>.prom``, is the Prometheus text format with a
timestamp on every sample: scrape *i* at *i* x 30 s (the monitors' interval).

Here the components run as local processes: the frontend and the CPU worker (faster-whisper,
Whisper tiny.en) as their pods start them, and the operator's reconciler in this process,
fed by a minimal API server stand-in (the only part not real: the operator's requests and
their count are). ``e2e/test_monitoring.py`` records the same from the test bed's pods.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import re
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import yaml
from prometheus_client.parser import text_string_to_metric_families

import toolchain

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "charts" / "transcription-operator"
FIXTURES = ROOT / "tests" / "fixtures" / "metrics"
INTERVAL_S = 30  # between scrapes in a fixture: the monitors' default interval
RELEASE, OPERATOR_NAMESPACE = "transcription-operator", "transcription-system"
NAMESPACE, DEPLOYMENT = "speech", "whisper"
# Families every Python process exports (prometheus_client's default collectors): not the
# components' own, and left out of the fixtures.
DEFAULT_PREFIXES = ("python_", "process_")


# --------------------------------------------------------------------------- samples


@dataclass(frozen=True)
class Sample:
    name: str
    labels: tuple[tuple[str, str], ...]  # sorted
    value: float
    step: int = 0  # the scrape's index in its scenario

    @property
    def series(self) -> str:
        return series_text(self.name, dict(self.labels))


def series_text(name: str, labels: Mapping[str, str]) -> str:
    """`name{a="x",b="y"}`, labels sorted, values escaped as the text format escapes them."""
    if not labels:
        return name
    esc = {
        k: v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
        for k, v in labels.items()
    }
    return name + "{" + ",".join(f'{k}="{esc[k]}"' for k in sorted(esc)) + "}"


CUMULATIVE = {"counter", "histogram", "summary"}  # their samples only grow


def parse(text: str) -> tuple[list[Sample], dict[str, str]]:
    """The samples of an exposition (a scrape, or a fixture with timestamps) and the type of
    each sample name: counter samples (and a histogram's _bucket, _count and _sum) are
    cumulative, the rest gauges."""
    samples: list[Sample] = []
    types: dict[str, str] = {}
    families = list(text_string_to_metric_families(text))
    cumulative = {f.name for f in families if f.type in CUMULATIVE}
    for family in families:
        if family.name.endswith("_created") and family.name[: -len("_created")] in cumulative:
            continue  # a counter's creation time (its own gauge in the text format)
        for s in family.samples:
            if s.name.endswith("_created") and family.type in CUMULATIVE:
                continue
            types[s.name] = "counter" if family.type in CUMULATIVE else "gauge"
            step = round(float(s.timestamp) / INTERVAL_S) if s.timestamp is not None else 0
            labels = tuple(sorted(s.labels.items()))
            samples.append(Sample(s.name, labels, float(s.value), step))
    return samples, types


# --------------------------------------------------------------------------- relabelling


def _sanitize(name: str) -> str:
    return re.sub(r"[^a-zA-Z0-9_]", "_", name)


def relabel(labels: Mapping[str, str], rules: Sequence[Mapping[str, Any]]) -> dict[str, str] | None:
    """Prometheus' relabelling (the actions the chart uses: replace, keep, drop, labeldrop,
    labelkeep), on prometheus-operator's camelCase fields. None: the target (or sample) is
    dropped."""
    out = dict(labels)
    for rule in rules:
        action = rule.get("action", "replace").lower()
        regex = re.compile(f"^(?:{rule.get('regex', '(.*)')})$")
        if action in ("labeldrop", "labelkeep"):
            keep = action == "labelkeep"
            out = {k: v for k, v in out.items() if bool(regex.match(k)) == keep}
            continue
        value = rule.get("separator", ";").join(
            out.get(s, "") for s in rule.get("sourceLabels", [])
        )
        match = regex.match(value)
        if (action == "keep" and not match) or (action == "drop" and match):
            return None
        if action == "replace" and match:
            replacement = str(rule.get("replacement", "$1"))
            result = match.expand(re.sub(r"\$\{?(\d+)\}?", r"\\g<\1>", replacement))
            if result:
                out[rule["targetLabel"]] = result
            else:
                out.pop(rule["targetLabel"], None)
        elif action not in ("replace", "keep", "drop"):
            raise ValueError(f"relabel action {action} is not supported here")
    return out


def chart_monitors() -> dict[str, dict[str, Any]]:
    """The chart's monitors as Helm renders them with the monitoring CRDs present, by kind
    and component: `operator` (ServiceMonitor), `frontend` and `worker` (PodMonitors)."""
    out = subprocess.run(
        [str(toolchain.helm()), "template", RELEASE, str(CHART), "-n", OPERATOR_NAMESPACE,
         *monitoring_api_versions(), "--set", "metrics.serviceMonitor.enabled=true",
         "--set", "metrics.podMonitors.enabled=true"],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    found: dict[str, dict[str, Any]] = {}
    for doc in yaml.safe_load_all(out.stdout):
        if doc and doc["kind"] == "ServiceMonitor":
            found["operator"] = doc
        elif doc and doc["kind"] == "PodMonitor":
            found[doc["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"]] = doc
    return found


def monitoring_api_versions() -> list[str]:
    """`helm template` flags that make the chart see prometheus-operator's CRDs."""
    kinds = ("ServiceMonitor", "PodMonitor", "PrometheusRule")
    return [a for k in kinds for a in ("--api-versions", f"monitoring.coreos.com/v1/{k}")]


@dataclass
class Target:
    """A scrape target: its URL and the labels its samples get."""

    url: str
    labels: dict[str, str]
    metric_relabelings: list[dict[str, Any]] = field(default_factory=list)


def pod_target(
    monitor: Mapping[str, Any], pod: str, namespace: str, pod_labels: Mapping[str, str],
    address: str, container: str,
) -> Target | None:  # fmt: skip
    """The target a PodMonitor makes of a pod: prometheus-operator's own relabelings
    (namespace, container, pod, endpoint, job), then the monitor's."""
    ep = monitor["spec"]["podMetricsEndpoints"][0]
    meta = {
        "__address__": address,
        "__meta_kubernetes_namespace": namespace,
        "__meta_kubernetes_pod_name": pod,
        "__meta_kubernetes_pod_container_name": container,
        **{f"__meta_kubernetes_pod_label_{_sanitize(k)}": v for k, v in pod_labels.items()},
    }
    meta |= {"namespace": namespace, "container": container, "pod": pod, "endpoint": ep["port"],
             "job": f"{monitor['metadata']['namespace']}/{monitor['metadata']['name']}"}  # fmt: skip
    return _target(meta, ep, f"http://{address}{ep.get('path', '/metrics')}")


def service_target(
    monitor: Mapping[str, Any], service: str, pod: str, namespace: str,
    pod_labels: Mapping[str, str], address: str, container: str,
) -> Target | None:  # fmt: skip
    """The target a ServiceMonitor makes of an endpoint of `service` (the operator's pod)."""
    ep = monitor["spec"]["endpoints"][0]
    meta = {
        "__address__": address,
        "__meta_kubernetes_namespace": namespace,
        "__meta_kubernetes_service_name": service,
        "__meta_kubernetes_pod_name": pod,
        **{f"__meta_kubernetes_pod_label_{_sanitize(k)}": v for k, v in pod_labels.items()},
    }
    meta |= {"namespace": namespace, "service": service, "pod": pod, "container": container,
             "endpoint": ep["port"], "job": service}  # fmt: skip
    return _target(meta, ep, f"http://{address}{ep.get('path', '/metrics')}")


def _target(meta: dict[str, str], ep: Mapping[str, Any], url: str) -> Target | None:
    labels = relabel(meta, ep.get("relabelings", []))
    if labels is None:
        return None
    labels.setdefault("instance", labels["__address__"])
    labels = {k: v for k, v in labels.items() if not k.startswith("__")}
    return Target(url, labels, list(ep.get("metricRelabelings", [])))


def scrape(target: Target, text: str | None = None, step: int = 0) -> list[Sample]:
    """One scrape as Prometheus stores it: the target's labels on every sample (a sample's
    own label of the same name becomes `exported_<name>`, honor_labels being off), the
    metric relabelings, and `up`. `text`: an exposition already read; None: GET the URL."""
    if text is None:
        try:
            r = httpx.get(target.url, timeout=10)
            r.raise_for_status()
            text = r.text
        except httpx.HTTPError:
            return [Sample("up", tuple(sorted(target.labels.items())), 0.0, step)]
    out = [Sample("up", tuple(sorted(target.labels.items())), 1.0, step)]
    for s in parse(text)[0]:
        if s.name.startswith(DEFAULT_PREFIXES):
            continue
        labels = dict(s.labels)
        for k in set(labels) & set(target.labels):
            labels[f"exported_{k}"] = labels.pop(k)
        labels |= target.labels
        relabelled = relabel({**labels, "__name__": s.name}, target.metric_relabelings)
        if relabelled is not None:
            name = relabelled.pop("__name__")
            out.append(Sample(name, tuple(sorted(relabelled.items())), s.value, step))
    return out


# --------------------------------------------------------------------------- fixtures


def write_fixture(
    path: Path, header: str, timeline: list[list[Sample]], types: Mapping[str, str]
) -> None:
    """A scenario's scrapes as the text format, each sample stamped with its scrape's time."""
    by_family: dict[str, list[Sample]] = {}
    for step, samples in enumerate(timeline):
        for s in samples:
            by_family.setdefault(family_of(s.name, types), []).append(
                Sample(s.name, s.labels, s.value, step)
            )
    lines = [f"# {line}" if line else "#" for line in header.splitlines()]
    for fam in sorted(by_family):
        kind = "counter" if types.get(fam + "_total", types.get(fam)) == "counter" else "gauge"
        lines.append(f"# TYPE {fam} {kind}")
        for s in sorted(by_family[fam], key=lambda s: (s.series, s.step)):
            lines.append(f"{s.series} {s.value:.17g} {s.step * INTERVAL_S * 1000}")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")


def family_of(name: str, types: Mapping[str, str]) -> str:
    """Counters are one family per sample name (`x_total` as `x`); a histogram's samples
    are written as counters of their own (`x_bucket`, `x_count`, `x_sum`): the fixture keeps
    only what Prometheus keeps, series and whether they are cumulative."""
    if types.get(name) == "counter" and name.endswith("_total"):
        return name[: -len("_total")]
    return name


_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+) (\d+)$")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)",?')


def read_fixture(path: Path) -> tuple[list[Sample], dict[str, str]]:
    """A fixture's samples (their step from their timestamp) and the type of each sample
    name (a counter family `x` types its sample `x_total`)."""
    samples: list[Sample] = []
    family_types: dict[str, str] = {}
    for line in path.read_text().splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split()
            family_types[name] = kind
            continue
        if not line or line.startswith("#"):
            continue
        m = _LINE.match(line)
        if not m:
            raise ValueError(f"{path}: not a sample: {line}")
        name, labels, value, ts = m.groups()
        pairs = tuple(
            sorted(
                (k, bytes(v, "utf-8").decode("unicode_escape"))
                for k, v in _LABEL.findall(labels or "")
            )
        )
        samples.append(Sample(name, pairs, float(value), round(int(ts) / 1000 / INTERVAL_S)))
    types = {
        s.name: "counter"
        if "counter" in (family_types.get(s.name), family_types.get(s.name.removesuffix("_total")))
        else "gauge"
        for s in samples
    }
    return samples, types


def input_series(samples: Iterable[Sample], types: Mapping[str, str], steps: int,
                 extra: Mapping[str, str] | None = None) -> list[dict[str, str]]:  # fmt: skip
    """promtool's `input_series` for a recorded timeline, held for `steps` scrapes in all:
    the recorded scrapes, then the last scrape's state sustained (counters go on growing at
    their mean rate since the first scrape, gauges keep their last value). A counter absent
    from the first scrapes was 0 until it appeared; a gauge was absent. A series missing
    from the last scrape (gone, or its target down) stays absent."""
    samples = list(samples)
    end = max((s.step for s in samples), default=0)
    by_series: dict[str, dict[int, float]] = {}
    names: dict[str, str] = {}
    for s in samples:
        key = series_text(s.name, {**dict(s.labels), **(extra or {})})
        by_series.setdefault(key, {})[s.step] = s.value
        names[key] = s.name
    out = []
    for key in sorted(by_series):
        points = by_series[key]
        counter = types.get(names[key]) == "counter"
        values: list[str] = []
        for i in range(end + 1):
            v = points.get(i, 0.0 if counter and i < min(points) else None)
            values.append("_" if v is None else _num(v))
        if end in points and steps > end + 1:
            # A counter goes on at its mean rate since the first scrape (0 where absent).
            rate = (points[end] - points.get(0, 0.0)) / end if counter and end else 0.0
            values.append(f"{_num(points[end] + rate)}+{_num(rate)}x{steps - end - 2}")
        out.append({"series": key, "values": " ".join(values)})
    return out


def _num(v: float) -> str:
    return repr(int(v)) if v == int(v) else repr(v)


# --------------------------------------------------------------------------- the operator


class _ApiStandIn(BaseHTTPRequestHandler):
    """The least of an API server the reconciler's writes need: an object applied is stored
    and comes back as stored, a status patch merges into the stored object, an Event is
    taken; reading finds what is stored (else 404)."""

    server_version = "api-stand-in"
    server: _ApiServer

    def _answer(self, status: int, body: dict[str, Any]) -> None:
        raw = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def _write(self) -> None:
        size = int(self.headers.get("Content-Length") or 0)
        body = yaml.safe_load(self.rfile.read(size)) if size else {}  # JSON is YAML
        path = self.path.split("?", 1)[0]
        objects = self.server.objects
        if path.endswith("/status"):
            obj = copy.deepcopy(objects.get(path.removesuffix("/status"), {"metadata": {}}))
            obj["status"] = body.get("status", {})
            path = path.removesuffix("/status")
        else:
            obj = {**body, "status": objects.get(path, {}).get("status", body.get("status"))}
            obj = {k: v for k, v in obj.items() if v is not None}
        meta = obj.setdefault("metadata", {})
        meta.setdefault("uid", f"uid-{meta.get('name', 'x')}")
        meta["resourceVersion"] = str(time.monotonic_ns())
        if self.command == "PATCH":
            objects[path] = obj
        self._answer(200, obj)

    do_PATCH = do_POST = do_PUT = _write

    def do_GET(self) -> None:
        obj = self.server.objects.get(self.path.split("?", 1)[0])
        self._answer(*((200, obj) if obj else (404, {"kind": "Status", "code": 404})))

    def do_DELETE(self) -> None:
        self.server.objects.pop(self.path.split("?", 1)[0], None)
        self._answer(200, {"kind": "Status", "status": "Success"})

    def log_message(self, format: str, *args: Any) -> None:
        pass


class _ApiServer(ThreadingHTTPServer):
    objects: dict[str, dict[str, Any]]  # API path -> object


@contextlib.contextmanager
def api_stand_in() -> Iterator[_ApiServer]:
    server = _ApiServer(("127.0.0.1", 0), _ApiStandIn)
    server.objects = {}
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()


class Operator:
    """The operator's reconciler and watch bookkeeping (its `manager`), in this process,
    for one resource; its metrics are this process's registry."""

    def __init__(self, api: _ApiServer, spec: dict[str, Any]) -> None:
        from kubernetes import client

        from transcription_operator import manager, metrics
        from transcription_operator.config import OperatorConfig
        from transcription_operator.kube import Kube
        from transcription_operator.reconciler import Reconciler

        self.manager = manager
        self.api = api
        kube = Kube(
            client.ApiClient(client.Configuration(host=f"http://127.0.0.1:{api.server_address[1]}"))
        )
        manager.RUNTIME.reconciler = Reconciler(kube, manager.RUNTIME.cache, OperatorConfig())
        metrics.LEADER.set(1)
        self.key = (NAMESPACE, DEPLOYMENT)
        self.spec(spec)

    def spec(self, spec: dict[str, Any], generation: int = 3) -> None:
        """The resource, created or changed (a new generation)."""
        from testkit.resources import make_td

        td = make_td(spec, DEPLOYMENT, NAMESPACE)
        body = td.model_dump(by_alias=True, exclude_none=True, mode="json")
        old = self.manager.RUNTIME.cache.get("TranscriptionDeployment", NAMESPACE, DEPLOYMENT)
        if old and old.get("status"):
            body["status"] = old["status"]
        body["metadata"] |= {"generation": generation, "resourceVersion": str(time.monotonic_ns())}
        from transcription_operator.kinds import KINDS

        self.api.objects[KINDS["TranscriptionDeployment"].path(NAMESPACE, DEPLOYMENT)] = body
        self.watched("TranscriptionDeployment", "transcription.dev/v1alpha1", body)

    def watched(self, kind: str, api_version: str, body: dict[str, Any]) -> None:
        """A watch event of the resource or a child, as kopf delivers it."""
        _, news = self.manager.remember(kind, api_version, "MODIFIED", body)
        if news:
            self.manager.enqueue(self.key, kind)

    def reconcile(self) -> None:
        """The queue's next key, reconciled as the operator's queue workers do."""
        from transcription_operator import metrics

        async def one() -> None:
            key = await self.manager.RUNTIME.queue.get()
            metrics.QUEUE_DEPTH.set(self.manager.RUNTIME.queue.depth)
            try:
                await self.manager._reconcile(key)
            finally:
                self.manager.RUNTIME.queue.done(key)

        asyncio.run(one())

    def children(self, kind: str) -> list[dict[str, Any]]:
        return [o for o in self.manager.RUNTIME.cache.children(NAMESPACE, DEPLOYMENT, "uid-1")
                if o["kind"] == kind]  # fmt: skip

    def deployments(self, ready: int, *, desired: int | None = None, stuck: bool = False) -> None:
        """The Deployments' controller reports: `ready` replicas of each (a worker pool's
        desired count stays its spec's); `stuck`: the rollout of a new template past its
        progress deadline, the old replicas still serving."""
        for dep in self.children("Deployment"):
            dep = copy.deepcopy(dep)
            want = int(dep["spec"].get("replicas", 1))
            is_worker = dep["metadata"]["labels"].get("app.kubernetes.io/component") == "worker"
            if desired is not None and is_worker:
                want = dep["spec"]["replicas"] = desired  # as an autoscaler sets it
            generation = 2 if stuck else 1
            dep["metadata"]["generation"] = generation
            status: dict[str, Any] = {"observedGeneration": generation, "replicas": want,
                                      "updatedReplicas": want, "readyReplicas": min(ready, want)}  # fmt: skip
            if stuck and is_worker:
                status |= {"replicas": want + 1, "updatedReplicas": 1, "readyReplicas": want,
                           "conditions": [{"type": "Progressing", "status": "False",
                                           "reason": "ProgressDeadlineExceeded",
                                           "message": f'ReplicaSet "{dep["metadata"]["name"]}-2" has timed out progressing.'}]}  # fmt: skip
            dep["status"] = status
            dep["metadata"]["resourceVersion"] = str(time.monotonic_ns())
            self.watched("Deployment", "apps/v1", dep)
        self.reconcile()

    def exposition(self) -> str:
        from prometheus_client import REGISTRY, generate_latest

        return generate_latest(REGISTRY).decode()


# --------------------------------------------------------------------------- local processes


SPEC: dict[str, Any] = {
    "model": {"name": "whisper-tiny.en", "aliases": ["whisper-1"], "source": "image",
              "path": "/models/whisper-tiny.en"},
    "engine": "faster-whisper",
    "pools": [{"name": "cpu", "replicas": 1, "resources": {"cpu": "1", "memory": "2Gi"}}],
    "traffic": {"features": ["stream", "segment_timestamps", "word_timestamps"]},
    "frontend": {"replicas": 1},
}  # fmt: skip
SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "Please transcribe this sentence for the metrics test.",
    "Prometheus scrapes the frontend and the workers every thirty seconds.",
]


class Local:
    """The frontend and the CPU worker as local processes, the operator in this process, and
    the targets the chart's monitors would make of their pods."""

    def __init__(self, directory: Path, operator: Operator) -> None:
        self.dir = directory
        self.operator = operator
        self.monitors = chart_monitors()
        self.procs: dict[str, subprocess.Popen[bytes]] = {}  # address -> process
        self.types: dict[str, str] = {"up": "gauge"}
        self.wav = [self._speak(t) for t in SENTENCES]

    def _speak(self, text: str) -> bytes:
        from testkit.audio import speak

        return speak(text, self.dir).read_bytes()

    def worker(self, *args: str) -> str:
        """A CPU worker as its pod runs it (one thread: a pod's CPU); returns its address."""
        from testkit.host import free_port
        from testkit.processes import BIN, start

        port = free_port()
        address = f"127.0.0.1:{port}"
        self.procs[address] = start(
            [str(BIN / "transcription-worker"), "--host", "127.0.0.1", "--port", str(port),
             "--served-name", "whisper-tiny.en", "--served-name", "whisper-1", "--threads", "1",
             "--log-level", "warning", *args],
            self.dir / f"worker-{port}.log", f"http://{address}/health")  # fmt: skip
        return address

    def frontend(self, workers: Mapping[str, list[str]], *args: str) -> str:
        """The frontend on the route table the operator wrote, each pool's endpoints the
        given local workers (none: the pool is at zero); returns its address."""
        from testkit import processes
        from transcription_api.routes import ROUTES_KEY, RouteTable

        cm = self.operator.children("ConfigMap")[0]
        table = RouteTable.model_validate_json(cm["data"][ROUTES_KEY])
        pools = [p.model_copy(update={"endpoints": [f"http://{a}" for a in workers.get(p.name, [])]})
                 for p in table.pools]  # fmt: skip
        d = Path(tempfile.mkdtemp(dir=self.dir))
        url, proc = processes.frontend(table.model_copy(update={"pools": pools}), d,
                                       ["--log-level", "warning", *args], ready="/health")  # fmt: skip
        address = url.removeprefix("http://")
        self.procs[address] = proc
        return address

    def kill(self, address: str) -> None:
        proc = self.procs.pop(address)
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def stop(self) -> None:
        for address in reversed(list(self.procs)):
            self.kill(address)

    def pod_labels(self, component: str, pool: str | None = None) -> dict[str, str]:
        """The labels of the pods of a Deployment the operator built."""
        for dep in self.operator.children("Deployment"):
            labels = dep["spec"]["template"]["metadata"]["labels"]
            if (
                labels.get("app.kubernetes.io/component") == component
                and labels.get("transcription.dev/pool") == pool
            ):
                return dict(labels)
        raise LookupError(f"no {component} Deployment for pool {pool}")

    def targets(self, frontend: str, workers: Mapping[str, list[str]]) -> list[Target]:
        """What the PodMonitors make of the frontend's and the workers' pods (pod names as
        a Deployment names them)."""
        out = [pod_target(self.monitors["frontend"], f"{DEPLOYMENT}-frontend-6d5f8b9c7d-x2k4p",
                          NAMESPACE, self.pod_labels("frontend"), frontend, "frontend")]  # fmt: skip
        for pool, addresses in workers.items():
            for i, address in enumerate(addresses):
                out.append(pod_target(self.monitors["worker"], f"{DEPLOYMENT}-{pool}-7b9f6c4d8-w5zn{i}",
                                      NAMESPACE, self.pod_labels("worker", pool), address, "engine"))  # fmt: skip
        return [t for t in out if t is not None]

    def operator_target(self) -> Target:
        labels = {"app.kubernetes.io/name": RELEASE, "app.kubernetes.io/instance": RELEASE}
        t = service_target(self.monitors["operator"], f"{RELEASE}-metrics", f"{RELEASE}-5c8d7f6b9-h7m2q",
                           OPERATOR_NAMESPACE, labels, "10.244.0.10:8080", "operator")  # fmt: skip
        assert t is not None
        return t

    def scrape(self, targets: Sequence[Target]) -> list[Sample]:
        """Every target once, the operator's included."""
        out: list[Sample] = []
        for t in targets:
            text = None
            with contextlib.suppress(httpx.HTTPError):
                text = httpx.get(t.url, timeout=10).text
            if text is not None:
                self.types |= parse(text)[1]
            out += scrape(t, text)
        text = self.operator.exposition()
        self.types |= parse(text)[1]
        return out + scrape(self.operator_target(), text)

    def post(self, address: str, wav: bytes, **fields: str) -> httpx.Response:
        return httpx.post(f"http://{address}/v1/audio/transcriptions", data={"model": "whisper-1", **fields},
                          files={"file": ("speech.wav", wav, "audio/wav")}, timeout=120)  # fmt: skip

    def posts(self, address: str, n: int, **fields: str) -> ThreadPoolExecutor:
        """`n` requests at once, in threads (wait: shutdown the returned executor)."""
        pool = ThreadPoolExecutor(n)
        for i in range(n):
            pool.submit(self.post, address, self.wav[i % len(self.wav)], **fields)
        return pool


Timeline = list[list[Sample]]
Scenario = tuple[str, str, Timeline]  # name, what happened, scrapes


def healthy(local: Local, fe: str, targets: Sequence[Target]) -> Scenario:
    from testkit.longaudio import long_recording
    from testkit.realtime import conversation, transcribe_turns

    timeline = [local.scrape(targets)]
    for fmt, wav in zip(("json", "verbose_json", "srt"), local.wav, strict=True):
        r = local.post(fe, wav, response_format=fmt)
        assert r.status_code == 200, r.text
    assert local.post(fe, local.wav[0], model="no-such-model").status_code == 404
    local.posts(fe, 3).shutdown()
    timeline.append(local.scrape(targets))
    during: Timeline = []

    def on_event(when: float, event: Any) -> None:
        if getattr(event, "type", "").endswith("transcription.completed") and not during:
            during.append(local.scrape(targets))  # a session open

    audio = conversation(SENTENCES[:2], local.dir)
    asyncio.run(transcribe_turns(f"http://{fe}", audio, 2, on_event=on_event))
    timeline += during
    rec = long_recording(local.dir, seconds=24.0)  # over the chunk threshold: cut
    r = local.post(fe, rec.wav.read_bytes())
    assert r.status_code == 200, r.text
    timeline.append(local.scrape(targets))
    return ("healthy", "speech transcribed in several formats, some at once, an unknown model "
            "(404), a realtime session of two turns, long audio cut into chunks", timeline)  # fmt: skip


def worker_down(local: Local, fe: str, worker: str, targets: Sequence[Target]) -> Scenario:
    timeline = [local.scrape(targets)]
    local.kill(worker)
    local.operator.deployments(ready=0)
    local.posts(fe, 3).shutdown()  # each held for 8 s (no ready worker), then 503
    timeline.append(local.scrape(targets))
    local.posts(fe, 3).shutdown()
    timeline.append(local.scrape(targets))
    return ("worker_down", "the pool's only worker stopped: requests are held for 8 s, "
            "then refused (503); its Deployment reports no ready replica", timeline)  # fmt: skip


def saturated(local: Local) -> Scenario:
    """A sequential worker with a short queue, sent more at once than it holds."""
    worker = local.worker("--mode", "sequential", "--max-queue", "2")
    workers = {"cpu": [worker]}
    fe = local.frontend(workers)
    targets = local.targets(fe, workers)
    local.operator.deployments(ready=1)
    timeline = [local.scrape(targets)]
    busy = local.posts(fe, 8)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # scrape while the queue is full
        now = local.scrape(targets)
        if any(s.name == "vllm:num_requests_waiting" and s.value >= 2 for s in now):
            timeline.append(now)
            break
        time.sleep(0.1)
    else:
        raise AssertionError("the worker's queue never filled")
    busy.shutdown()
    local.kill(fe)
    local.kill(worker)
    return ("saturated", "a sequential worker (queue of 2) sent 8 requests at once: scraped "
            "while its queue is full, some refused", timeline)  # fmt: skip


def held(local: Local) -> Scenario:
    """The pool at zero: the frontend holds requests, and they time out."""
    workers: dict[str, list[str]] = {"cpu": []}
    fe = local.frontend(workers, "--hold-timeout", "12")
    targets = local.targets(fe, workers)
    pool = {**SPEC["pools"][0], "autoscaling": {"minReplicas": 0, "maxReplicas": 2}}
    local.operator.spec({**SPEC, "pools": [pool]}, 4)
    local.operator.reconcile()
    local.operator.deployments(ready=1, desired=1)
    timeline = [local.scrape(targets)]
    local.operator.deployments(ready=0, desired=0)  # KEDA scales it to zero
    busy = local.posts(fe, 3)
    time.sleep(2)
    timeline.append(local.scrape(targets))  # held
    busy.shutdown()
    timeline.append(local.scrape(targets))  # timed out: 503
    local.kill(fe)
    local.operator.spec(SPEC, 5)
    local.operator.reconcile()
    local.operator.deployments(ready=1, desired=1)
    return ("held", "an autoscaled pool at zero that does not wake: three requests held, "
            "then refused (503) when the hold timed out after 12 s", timeline)  # fmt: skip


def rollout_stuck(local: Local) -> Scenario:
    """A new worker template that never becomes ready, past the progress deadline (the old
    replica still serves): the operator's view only."""
    timeline = [local.scrape([])]
    local.operator.deployments(ready=1, stuck=True)
    timeline.append(local.scrape([]))
    return ("rollout_stuck", "the worker pool's rollout past its progress deadline, the old "
            "replica serving (the operator's series only)", timeline)  # fmt: skip


def secret_missing(local: Local) -> Scenario:
    """The resource asks for API keys from a Secret that does not exist: the operator's
    view only."""
    timeline = [local.scrape([])]
    keys = {"name": "api-keys", "key": "keys"}
    local.operator.spec({**SPEC, "frontend": {"replicas": 1, "apiKeySecret": keys}}, 6)
    local.operator.reconcile()
    timeline.append(local.scrape([]))
    return ("secret_missing", "the resource names an API-key Secret that does not exist (the "
            "operator's series only)", timeline)  # fmt: skip


def record_local(out: Path = FIXTURES / "local") -> list[Path]:
    """Every scenario from local processes; returns the fixture files written."""
    when = datetime.now(UTC).strftime("%Y-%m-%d")
    written: list[Path] = []
    with tempfile.TemporaryDirectory() as tmp, api_stand_in() as api:
        operator = Operator(api, SPEC)
        operator.reconcile()  # the resource's children applied
        operator.deployments(ready=1)
        local = Local(Path(tmp), operator)
        scenarios: list[Scenario] = []
        try:
            worker = local.worker()
            workers = {"cpu": [worker]}
            fe = local.frontend(
                workers, "--chunk-threshold", "8", "--max-chunk-seconds", "6",
                "--realtime-idle-timeout", "600", "--hold-timeout", "8",
            )  # fmt: skip
            targets = local.targets(fe, workers)
            scenarios.append(healthy(local, fe, targets))
            scenarios.append(worker_down(local, fe, worker, targets))
            local.kill(fe)
            scenarios.append(saturated(local))
            scenarios.append(held(local))
            scenarios.append(rollout_stuck(local))
            scenarios.append(secret_missing(local))
        finally:
            local.stop()
        for name, what, timeline in scenarios:
            header = (f"Scenario {name}: {what}.\nRecorded {when} by `python -m testkit.metrics_record` "
                      "from local processes (the frontend, the CPU worker; the operator's reconciler "
                      f"in process); scrape i at i x {INTERVAL_S} s.")  # fmt: skip
            path = out / f"{name}.prom"
            write_fixture(path, header, timeline, local.types)
            written.append(path)
    return written


if __name__ == "__main__":
    for p in record_local():
        print(p)
