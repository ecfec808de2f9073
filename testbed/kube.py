"""kubectl and helm against the test bed, and the small waits the suites share."""

from __future__ import annotations

import json
import subprocess
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from testbed import cluster

ROOT = Path(__file__).resolve().parent.parent
CRD_FILE = ROOT / "crds" / "transcriptiondeployments.transcription.dev.yaml"
CHART = ROOT / "charts" / "transcription-operator"
SAMPLES: dict[str, dict[str, Any]] = {
    p.stem: yaml.safe_load(p.read_text()) for p in sorted((ROOT / "samples").glob("*.yaml"))
}


class Kubectl:
    """kubectl against the test bed, with JSON in and out."""

    def __init__(self, kubeconfig: Path) -> None:
        self.kubeconfig = kubeconfig
        self.binary = str(cluster.KUBERNETES.path("kubectl"))

    def run(
        self, *args: str, input: str | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            [self.binary, "--kubeconfig", str(self.kubeconfig), *args],
            input=input, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        if check and proc.returncode:
            raise AssertionError(f"kubectl {' '.join(args)}: {proc.stderr.strip()}")
        return proc

    def __call__(self, *args: str, input: str | None = None) -> str:
        return self.run(*args, input=input).stdout

    def json(self, *args: str) -> Any:
        return json.loads(self(*args, "-o", "json"))

    def apply(self, obj: dict[str, Any] | str, namespace: str | None = None) -> str:
        text = obj if isinstance(obj, str) else json.dumps(obj)
        ns = ["-n", namespace] if namespace else []
        return self("apply", *ns, "-f", "-", input=text)

    def pods(
        self, namespace: str, instance: str, component: str, pool: str | None = None
    ) -> list[dict[str, Any]]:
        """The pods of one component of a resource (of one pool, for workers), less those
        being deleted."""
        selector = f"app.kubernetes.io/instance={instance},app.kubernetes.io/component={component}"
        if pool:
            selector += f",transcription.dev/pool={pool}"
        items: list[dict[str, Any]] = self.json("get", "pods", "-n", namespace, "-l", selector)[
            "items"
        ]
        return [p for p in items if not p["metadata"].get("deletionTimestamp")]

    def service_url(self, namespace: str, name: str) -> str:
        """The ClusterIP URL of a Service's first port."""
        svc = self.json("get", "service", name, "-n", namespace)
        return f"http://{svc['spec']['clusterIP']}:{svc['spec']['ports'][0]['port']}"


def helm(
    *args: str, check: bool = True, kubeconfig: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """The test bed's helm binary."""
    cmd = [str(cluster.HELM.path("helm")), *args]
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
