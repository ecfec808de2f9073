"""The frontend's worker discovery against the real API server: EndpointSlices that the
endpoint-slice controller maintains for the operator's pool Services."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from testbed.kube import SAMPLES, wait_for, wait_ready
from testbed.kubectl import Kubectl
from transcription_api.routes import RouteTable
from transcription_frontend.discovery import EndpointSliceWatcher, SliceIndex
from transcription_frontend.routing import Router

pytestmark = pytest.mark.usefixtures("operator")


def pod_urls(kubectl: Kubectl, ns: str, pool: str) -> set[str]:
    pods = kubectl.json("get", "pods", "-n", ns, "-l", f"transcription.dev/pool={pool}")["items"]
    return {f"http://{p['status']['podIP']}:8000" for p in pods if p["status"].get("podIP")}


def test_endpoints_follow_the_pool_pods(kubectl: Kubectl, namespace: str, cluster: Path) -> None:
    doc = copy.deepcopy(SAMPLES["vllm-gpu"])
    kubectl.apply(doc, namespace)
    wait_ready(kubectl, namespace, "whisper")
    cm = kubectl.json("get", "configmap", "whisper-routes", "-n", namespace)
    router = Router(RouteTable.model_validate(json.loads(cm["data"]["routes.json"])))
    watcher = EndpointSliceWatcher(SliceIndex(router), namespace, str(cluster))
    watcher.start()
    try:
        wait_for(lambda: set(router.endpoints("batch")) == pod_urls(kubectl, namespace, "batch") != set(),
                 timeout=30, what="the pool's pod IPs in the router")  # fmt: skip
        assert len(router.endpoints("batch")) == 2

        doc["spec"]["pools"][0]["replicas"] = 3
        kubectl.apply(doc, namespace)
        wait_for(lambda: len(router.endpoints("batch")) == 3 and set(router.endpoints("batch")) == pod_urls(kubectl, namespace, "batch"),
                 timeout=60, what="the third replica to be discovered")  # fmt: skip
    finally:
        watcher.stop()
