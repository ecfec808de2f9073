"""Monitoring on the test bed: the chart's monitors select the real pods with the labels the
alerts and the dashboard group by, and the real pods export the series the local recording
(tests/fixtures/metrics/local, `python -m testkit.metrics_record`) holds.

Each pod's /metrics is read through the API server's pod proxy (`kubectl get --raw
/api/v1/namespaces/<ns>/pods/<pod>:<port>/proxy/metrics`), as Prometheus would scrape it
(the monitors' relabelings applied to the pod's real labels).

    RECORD_METRICS=1 pytest e2e/test_monitoring.py

also writes the test bed's recording to tests/fixtures/metrics/testbed/healthy.prom (review
and commit it; tests/test_monitoring.py then checks the dashboard's metric names on it).
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from testbed.kube import SAMPLES
from testbed.kubectl import Kubectl
from testbed.operators import deployed_on_the_real_node
from testkit import monitoring
from testkit.longaudio import long_recording
from testkit.prom import FIXTURES, INTERVAL_S, Sample, parse, write_fixture
from testkit.realtime import conversation, transcribe_turns
from testkit.scrape import Target, chart_monitors, pod_target, scrape, service_target
from testkit.transcripts import client, transcribe_all

NAME, POOL = "whisper-cpu", "cpu"
RELEASE = "monitoring-operator"
WORKER_CPU = "500m"  # the real node has 2 cores (as in test_realnode)


@dataclass
class Stack:
    kubectl: Kubectl
    namespace: str
    system_namespace: str
    release: str

    def service_url(self) -> str:
        return self.kubectl.service_url(self.namespace, NAME)


@pytest.fixture(scope="module")
def stack(kubectl: Kubectl, cluster: Path, real_node: str, crd_installed: None) -> Iterator[Stack]:
    doc: dict[str, Any] = json.loads(json.dumps(SAMPLES["cpu-faster-whisper"]))
    doc["spec"]["pools"][0]["resources"]["cpu"] = WORKER_CPU
    with deployed_on_the_real_node(kubectl, cluster, doc, "m", RELEASE, timeout=300) as (
        ns,
        system_ns,
        rel,
    ):
        yield Stack(kubectl, ns, system_ns, rel)


def _port(pod: dict[str, Any], name: str) -> int:
    for c in pod["spec"]["containers"]:
        for p in c.get("ports", []):
            if p.get("name") == name:
                return int(p["containerPort"])
    raise LookupError(f"pod {pod['metadata']['name']} has no port {name}")


def targets(stack: Stack) -> list[tuple[Target, str]]:
    """(target, the pod-proxy path of its /metrics) for every frontend, worker and operator
    pod, the target labels from the chart's monitors on the pods' real labels."""
    monitors = chart_monitors()
    out: list[tuple[Target, str]] = []
    pods = stack.kubectl.json(
        "get", "pods", "-n", stack.namespace, "-l", f"app.kubernetes.io/instance={NAME}"
    )
    for pod in pods["items"]:
        meta = pod["metadata"]
        component = meta["labels"]["app.kubernetes.io/component"]
        port = _port(pod, "http")
        t = pod_target(monitors[component], meta["name"], stack.namespace, meta["labels"],
                       f"{pod['status']['podIP']}:{port}", pod["spec"]["containers"][0]["name"])  # fmt: skip
        if t is not None:
            out.append(
                (
                    t,
                    f"/api/v1/namespaces/{stack.namespace}/pods/{meta['name']}:{port}/proxy/metrics",
                )
            )
    ops = stack.kubectl.json("get", "pods", "-n", stack.system_namespace, "-l",
                             f"app.kubernetes.io/instance={stack.release}")  # fmt: skip
    for pod in ops["items"]:
        meta = pod["metadata"]
        port = _port(pod, "metrics")
        t = service_target(monitors["operator"], f"{stack.release}-transcription-operator-metrics", meta["name"],
                           stack.system_namespace, meta["labels"], f"{pod['status']['podIP']}:{port}",
                           pod["spec"]["containers"][0]["name"])  # fmt: skip
        assert t is not None
        out.append(
            (
                t,
                f"/api/v1/namespaces/{stack.system_namespace}/pods/{meta['name']}:{port}/proxy/metrics",
            )
        )
    return out


def scrape_all(stack: Stack, types: dict[str, str]) -> list[Sample]:
    samples: list[Sample] = []
    for t, path in targets(stack):
        text = stack.kubectl("get", "--raw", path)
        types |= parse(text)[1]
        samples += scrape(t, text)
    return samples


def test_monitors_label_the_real_pods(stack: Stack) -> None:
    got = {t.labels["job"]: t.labels for t, _ in targets(stack)}
    assert set(got) == {"transcription-frontend", "transcription-worker", "transcription-operator"}
    worker = got["transcription-worker"]
    assert (worker["namespace"], worker["deployment"], worker["pool"], worker["engine"]) == (
        stack.namespace, NAME, POOL, "faster-whisper")  # fmt: skip
    assert (got["transcription-frontend"]["namespace"], got["transcription-frontend"]["deployment"]) == (
        stack.namespace, NAME)  # fmt: skip


def test_the_real_pods_export_what_the_local_recording_holds(
    stack: Stack, speech: dict[str, Path], tmp_path: Path
) -> None:
    """Traffic of every kind through the Service, scraped before, during and after: every
    metric name of the local healthy recording (the dashboard's, the alerts') is exported by
    the real pods too, with the same labels names."""
    types: dict[str, str] = {"up": "gauge"}
    timeline = [scrape_all(stack, types)]
    transcribe_all(stack.service_url(), speech)
    timeline.append(scrape_all(stack, types))
    asyncio.run(transcribe_turns(stack.service_url(), conversation(list(speech)[:2], tmp_path), 2))
    rec = long_recording(tmp_path, seconds=60.0)
    with rec.wav.open("rb") as f:  # long audio, cut into chunks (OpenAI's chunking_strategy)
        client(stack.service_url()).audio.transcriptions.create(
            model="whisper-1", file=f, chunking_strategy="auto"
        )
    time.sleep(1)
    timeline.append(scrape_all(stack, types))
    recorded = {s.name for samples in timeline for s in samples}
    local = monitoring.Recording.load("local")
    healthy = {s.name for s in local.scenarios["healthy"]}
    assert healthy - recorded == set(), (
        "the local recording holds series the real pods do not export"
    )
    for s in timeline[-1]:
        assert "namespace" in dict(s.labels) and "job" in dict(s.labels), s
    # What the dashboard queries and the real pods did not export here: only series of the
    # local recording's bad states (a full queue, held requests) may be missing.
    queried = {
        n
        for q in monitoring.queries(monitoring.load_dashboard())
        for n in monitoring.metric_names(q.expr)
    }
    assert queried - recorded <= local.names() - healthy
    if os.environ.get("RECORD_METRICS"):
        when = datetime.now(UTC).strftime("%Y-%m-%d")
        header = (f"Scenario healthy: speech in every format, streamed, a realtime session, long audio "
                  f"chunked, through the Service.\nRecorded {when} by e2e/test_monitoring.py from the test "
                  f"bed's real pods (pod proxy); scrape i at i x {INTERVAL_S} s.")  # fmt: skip
        write_fixture(FIXTURES / "testbed" / "healthy.prom", header, timeline, types)
