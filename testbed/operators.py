"""The operator against the test bed: as a local process, or installed by the chart and
running in the cluster from its image."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from testbed import images
from testbed.kube import CHART, create_namespace, helm, wait_for, wait_ready, wait_served
from testbed.kubectl import Kubectl
from testkit import processes
from testkit.host import free_port


class OperatorProcess:
    """The operator as a local process against the test bed."""

    def __init__(self, kubeconfig: Path, log_path: Path, args: list[str] | None = None) -> None:
        self.kubeconfig = kubeconfig
        self.log_path = log_path
        self.args = args or []
        self.metrics_port = free_port()
        self.health_port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.log = open(self.log_path, "ab")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "transcription_operator.main", "--kubeconfig", str(self.kubeconfig),
             "--metrics-port", str(self.metrics_port), "--health-port", str(self.health_port), *self.args],
            stdout=self.log, stderr=subprocess.STDOUT,
        )  # fmt: skip

        def healthy() -> bool:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise AssertionError(f"operator exited; see {self.log_path}")
            try:
                with urllib.request.urlopen(
                    f"http://127.0.0.1:{self.health_port}/healthz", timeout=2
                ) as r:
                    return bool(r.status == 200)
            except OSError:
                return False

        try:
            wait_for(healthy, timeout=60, what="the operator's liveness endpoint")
        except AssertionError:
            self.stop()  # never leave a second operator behind to act on later tests
            raise

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            processes.stop(self.proc, grace=30)
        self.log.close()
        self.proc = None

    def metrics(self) -> dict[str, float]:
        """Samples of the operator's Prometheus metrics, by 'name{labels}'."""
        with urllib.request.urlopen(
            f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5
        ) as r:
            text = r.read().decode()
        out = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                key, _, value = line.rpartition(" ")
                out[key] = float(value)
        return out

    def writes(self) -> float:
        m = self.metrics()
        return sum(
            v for k, v in m.items()
            if k.startswith("transcription_operator_api_requests_total") and 'verb="GET"' not in k
        )  # fmt: skip


@contextlib.contextmanager
def operator_in_cluster(
    kubectl: Kubectl, cluster: Path, release: str, watch: str | tuple[str, ...],
    extra: tuple[str, ...] = (),
) -> Iterator[tuple[str, str]]:  # fmt: skip
    """The Helm chart installed with the test bed's images, watching one namespace (or
    several): the operator runs in the cluster from its image, under its ServiceAccount.
    Yields the namespace it runs in (restricted PodSecurity, like the ones it watches) and
    the release's name."""
    watched = (watch,) if isinstance(watch, str) else watch
    refs = images.refs()
    # A name of its own: a run killed before its uninstall leaves cluster-scoped objects
    # (the CRD-reading ClusterRole) that another release of the same name cannot adopt.
    release = f"{release}-{uuid.uuid4().hex[:4]}"
    system_ns = create_namespace(kubectl, f"{watched[0]}-system", simulated=False)
    kubectl("label", "namespace", system_ns, "pod-security.kubernetes.io/enforce=restricted")
    repo, tag = refs["operator"].rsplit(":", 1)
    try:
        helm(
            "upgrade", "--install", release, str(CHART), "-n", system_ns, "--wait", "--timeout", "3m",
            "--set", "crds.install=false",  # the CRD is already there (another release owns it)
            # So is the cluster's one warning policy (cluster-scoped, one per cluster).
            "--set", "admissionPolicy.enabled=false",
            "--set", f"watchNamespaces={{{','.join(watched)}}}",
            "--set", f"image.repository={repo}", "--set", f"image.tag={tag}",
            "--set", "image.pullPolicy=Never",
            "--set", f"defaultImages.frontend={refs['frontend']}",
            "--set", f"defaultImages.fasterWhisper={refs['worker-cpu']}",
            "--set", "defaultImages.pullPolicy=Never",
            *extra,
            kubeconfig=cluster,
        )  # fmt: skip
        yield system_ns, release
    finally:
        helm("uninstall", release, "-n", system_ns, check=False, kubeconfig=cluster)
        kubectl.run("delete", "namespace", system_ns, "--wait=false", check=False)


@contextlib.contextmanager
def deployed_on_the_real_node(
    kubectl: Kubectl, cluster: Path, resource: dict[str, Any], prefix: str, release: str,
    timeout: float, extra: tuple[str, ...] = (),
) -> Iterator[tuple[str, str, str]]:  # fmt: skip
    """`resource` in a fresh namespace that enforces PodSecurity `restricted`, reconciled by
    the chart's operator running in the cluster, and Ready (real pods, real probes). Yields
    the namespace, the operator's namespace and the release; deletes them afterwards."""
    ns = create_namespace(kubectl, prefix, simulated=False)
    kubectl("label", "namespace", ns, "pod-security.kubernetes.io/enforce=restricted")
    name = resource["metadata"]["name"]
    with operator_in_cluster(kubectl, cluster, release, ns, extra) as (system_ns, rel):
        kubectl.apply(resource, ns)
        try:
            wait_ready(kubectl, ns, name, timeout=timeout)
            if resource["spec"].get("frontend", {}).get("enabled", True):
                wait_served(kubectl, ns, name)  # its frontend's Service, through kube-proxy
            yield ns, system_ns, rel
        finally:
            kubectl.run("delete", "tdeploy", name, "-n", ns, "--wait=false", check=False)
            kubectl.run("delete", "namespace", ns, "--wait=false", check=False)
