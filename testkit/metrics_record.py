"""Record the series the real components export, as Prometheus stores them through the
chart's monitors, for the alert-rule and dashboard tests (tests/test_monitoring.py).

    python -m testkit.metrics_record        record from local processes (no cluster)

Each *scenario* is a timeline of scrapes of every target: the frontend's, the workers' and
the operator's real ``/metrics``, after real requests (speech, a realtime session, long
audio cut into chunks, a worker gone, a queue full, a pool at zero). Every sample gets the
target labels the chart's monitors give the pods as the operator labels them, and ``up``
per target (``testkit.scrape``); each scenario is written as a fixture
(``testkit.prom``).

Here the components run as local processes: the frontend and the CPU worker (faster-whisper,
Whisper tiny.en) as their pods start them, and the operator's runtime in this process
(``testkit.operator.Operator``), fed by the API-server stand-in (``testkit.apiserver``: the
only part not real; the operator's requests and their count are). ``e2e/test_monitoring.py``
records the same from the test bed's pods.
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from testkit import processes
from testkit.apiserver import ApiServer, serve
from testkit.audio import speak
from testkit.host import free_port
from testkit.longaudio import long_recording
from testkit.operator import Operator
from testkit.prom import FIXTURES, INTERVAL_S, Sample, parse, write_fixture
from testkit.realtime import conversation, transcribe_turns
from testkit.resources import NAME, NAMESPACE
from testkit.scrape import (
    OPERATOR_NAMESPACE,
    RELEASE,
    Target,
    chart_monitors,
    pod_target,
    scrape,
    service_target,
)
from transcription_api.frontend import ChunkingSpec, FrontendLimits, HoldLimits
from transcription_api.routes import ROUTES_KEY, RouteTable

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
        return speak(text, self.dir).read_bytes()

    def worker(self, *args: str) -> str:
        """A CPU worker as its pod runs it (one thread: a pod's CPU); returns its address."""
        port = free_port()
        address = f"127.0.0.1:{port}"
        self.procs[address] = processes.start(
            [str(processes.BIN / "transcription-worker"), "--host", "127.0.0.1", "--port", str(port),
             "--served-name", "whisper-tiny.en", "--served-name", "whisper-1", "--threads", "1",
             "--log-level", "warning", *args],
            self.dir / f"worker-{port}.log", f"http://{address}/health")  # fmt: skip
        return address

    def frontend(self, workers: Mapping[str, list[str]], **settings: Any) -> str:
        """The frontend on the route table the operator wrote, each pool's endpoints the
        given local workers (none: the pool is at zero), with `settings` (fields of
        `FrontendSettings`); returns its address."""
        cm = self.operator.children("ConfigMap")[0]
        table = RouteTable.model_validate_json(cm["data"][ROUTES_KEY])
        pools = [p.model_copy(update={"endpoints": [f"http://{a}" for a in workers.get(p.name, [])]})
                 for p in table.pools]  # fmt: skip
        d = Path(tempfile.mkdtemp(dir=self.dir))
        url, proc = processes.frontend(table.model_copy(update={"pools": pools}), d,
                                       ["--log-level", "warning"], ready="/health", **settings)  # fmt: skip
        address = url.removeprefix("http://")
        self.procs[address] = proc
        return address

    def kill(self, address: str) -> None:
        processes.stop(self.procs.pop(address))

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
        out = [pod_target(self.monitors["frontend"], f"{NAME}-frontend-6d5f8b9c7d-x2k4p",
                          NAMESPACE, self.pod_labels("frontend"), frontend, "frontend")]  # fmt: skip
        for pool, addresses in workers.items():
            for i, address in enumerate(addresses):
                out.append(pod_target(self.monitors["worker"], f"{NAME}-{pool}-7b9f6c4d8-w5zn{i}",
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
    fe = local.frontend(workers, hold=HoldLimits(timeout_seconds=12))
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
    api = ApiServer()
    with tempfile.TemporaryDirectory() as tmp, serve(api) as url:
        operator = Operator(api, url, SPEC)
        operator.reconcile()  # the resource's children applied
        operator.deployments(ready=1)
        local = Local(Path(tmp), operator)
        scenarios: list[Scenario] = []
        try:
            worker = local.worker()
            workers = {"cpu": [worker]}
            fe = local.frontend(
                workers, chunking=ChunkingSpec(threshold_seconds=8, max_chunk_seconds=6),
                limits=FrontendLimits(realtime_idle_timeout_seconds=600),
                hold=HoldLimits(timeout_seconds=8),
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
