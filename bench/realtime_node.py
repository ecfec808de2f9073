"""The realtime benchmark (bench/realtime.py) through the frontend's Service on the test bed's
real node, as issue 23 asks: the chart's operator in the cluster, the CPU sample (one
faster-whisper worker pod, Whisper tiny.en, continuous batching; one frontend pod), the
sessions' WebSockets and the HTTP reference requests through the Service's cluster IP
(kube-proxy), from this machine.

The rows, the targets and the table are bench/realtime.py's; only where the frontend and
the worker run differs. Concurrency 1, 4 and 8 (1 and 2 with --quick).
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import testbed.cluster
from testbed.kube import CRD_FILE, SAMPLES
from testbed.kubectl import Kubectl
from testbed.operators import deployed_on_the_real_node
from testkit.audio import HARD_SENTENCES, SENTENCES

from . import realtime
from .common import say

NAME = "whisper-cpu"
RELEASE = "bench-realtime-operator"


def resource() -> dict[str, Any]:
    """The CPU sample with one worker and one frontend; sessions that wait for their last
    turns without sending are not closed as idle meanwhile."""
    doc: dict[str, Any] = json.loads(json.dumps(SAMPLES["cpu-faster-whisper"]))
    doc["spec"]["pools"][0]["replicas"] = 1
    frontend = doc["spec"].setdefault("frontend", {})
    frontend["replicas"] = 1
    frontend.setdefault("limits", {})["realtimeIdleTimeoutSeconds"] = 600
    return doc


def run(quick: bool = False) -> dict[str, Any]:
    texts = SENTENCES[:2] + HARD_SENTENCES[:2] if quick else SENTENCES + HARD_SENTENCES
    levels = realtime.QUICK_CONCURRENCY if quick else realtime.CONCURRENCY
    say("bench realtime-node: the test bed with its real node (building what is missing)")
    kubeconfig = testbed.cluster.up()
    kubectl = Kubectl(kubeconfig)
    kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRD_FILE))
    directory = Path(tempfile.mkdtemp(prefix="bench-realtime-node-"))
    say("deploying the CPU sample (1 worker, 1 frontend) with the operator in the cluster")
    with deployed_on_the_real_node(kubectl, kubeconfig, resource(), "b", RELEASE,
                                   timeout=600) as (ns, _, _):  # fmt: skip
        svc = kubectl.json("get", "service", NAME, "-n", ns)
        url = f"http://{svc['spec']['clusterIP']}:{svc['spec']['ports'][0]['port']}"
        say(f"the frontend's Service: {url}")
        return realtime.measure(
            url, texts, levels, directory, where="through the Service on the real node "
            "(1 faster-whisper worker pod, 1 frontend pod)", name="realtime-node",
        )  # fmt: skip
