"""helm against the test bed, its samples, namespaces and the small waits the suites share
(kubectl itself: ``testbed.kubectl``)."""

from __future__ import annotations

import subprocess
import time
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

import toolchain
from testbed import cluster
from testbed.kubectl import Kubectl

ROOT = Path(__file__).resolve().parent.parent
CRD_FILE = ROOT / "crds" / "transcriptiondeployments.transcription.dev.yaml"
GATEWAY_CRD_FILE = ROOT / "crds" / "transcriptiongateways.transcription.dev.yaml"
CHART = ROOT / "charts" / "transcription-operator"
# Each sample's documents, by file name (without .yaml).
SAMPLE_DOCS: dict[str, list[dict[str, Any]]] = {
    p.stem: [d for d in yaml.safe_load_all(p.read_text()) if d]
    for p in sorted((ROOT / "samples").glob("*.yaml"))
}
# The samples of one TranscriptionDeployment each (gateway.yaml holds a gateway and two).
SAMPLES: dict[str, dict[str, Any]] = {
    stem: docs[0]
    for stem, docs in SAMPLE_DOCS.items()
    if len(docs) == 1 and docs[0]["kind"] == "TranscriptionDeployment"
}


def helm(
    *args: str, check: bool = True, kubeconfig: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """The test bed's helm binary."""
    cmd = [str(toolchain.HELM.path("helm")), *args]
    if kubeconfig:
        cmd += ["--kubeconfig", str(kubeconfig)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if check and out.returncode:
        raise AssertionError(f"helm {' '.join(args)}: {out.stderr}")
    return out


def wait_for(
    predicate: Callable[[], Any], timeout: float = 60, interval: float = 0.5, what: str = ""
) -> Any:
    """Poll until `predicate()` is truthy; fail naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what or predicate}: {last!r}")


def create_namespace(kubectl: Kubectl, prefix: str, simulated: bool) -> str:
    """A fresh namespace. `simulated`: its pods go to KWOK's simulated nodes (they never
    run); otherwise CPU pods run on the test bed's real node."""
    name = f"{prefix}-{uuid.uuid4().hex[:8]}"
    annotations = cluster.SIMULATED_NAMESPACE_ANNOTATIONS if simulated else {}
    kubectl.apply({"apiVersion": "v1", "kind": "Namespace",
                   "metadata": {"name": name, "annotations": annotations}})  # fmt: skip
    return name


def td_get(kubectl: Kubectl, ns: str, name: str) -> dict[str, Any]:
    result: dict[str, Any] = kubectl.json("get", "tdeploy", name, "-n", ns)
    return result


def condition(td: dict[str, Any], type_: str) -> dict[str, Any]:
    for c in (td.get("status") or {}).get("conditions", []):
        if c["type"] == type_:
            return dict(c)
    return {}


def wait_served(kubectl: Kubectl, ns: str, name: str, timeout: float = 60) -> str:
    """Wait until the Service `name` answers `/health` through its ClusterIP; return its URL.
    A resource is Ready once its pods are; the Service routes to them once the EndpointSlice
    controller and kube-proxy have caught up, a moment later (connection refused meanwhile).
    """
    url = kubectl.service_url(ns, name)

    def answers() -> bool:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=5) as r:
                return bool(r.status == 200)
        except OSError:  # refused, reset, timed out, or an HTTP error status
            return False

    wait_for(answers, timeout=timeout, what=f"the Service {ns}/{name} to answer")
    return url


def wait_ready(kubectl: Kubectl, ns: str, name: str, timeout: float = 90) -> dict[str, Any]:
    """Wait until the resource's status is current, Ready=True and rolled out (Progressing
    and Degraded False: Ready alone stays True while old replicas serve); return it."""

    def ready() -> dict[str, Any] | None:
        td = td_get(kubectl, ns, name)
        current = (td.get("status") or {}).get("observedGeneration") == td["metadata"]["generation"]
        done = [condition(td, t).get("status") for t in ("Ready", "Progressing", "Degraded")]
        return td if current and done == ["True", "False", "False"] else None

    result: dict[str, Any] = wait_for(ready, timeout=timeout, what=f"{ns}/{name} to be Ready")
    return result
