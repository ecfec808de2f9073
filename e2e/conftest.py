"""Session fixtures for tests that need the local Kubernetes test bed."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import testbed
from tests.standins import free_port

E2E_DIR = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if E2E_DIR in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.e2e)


class Kubectl:
    """kubectl against the test bed, with JSON in and out."""

    def __init__(self, kubeconfig: Path) -> None:
        self.kubeconfig = kubeconfig
        self.binary = str(testbed.KUBERNETES.path("kubectl"))

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


@pytest.fixture(scope="session")
def cluster() -> Iterator[Path]:
    """A running test bed; started (and later stopped) unless one is already up."""
    was_up = testbed.is_up()
    kubeconfig = testbed.up()
    yield kubeconfig
    if not was_up and not os.environ.get("TESTBED_KEEP"):
        testbed.down()


@pytest.fixture(scope="session")
def kubectl(cluster: Path) -> Kubectl:
    return Kubectl(cluster)


def create_namespace(kubectl: Kubectl, prefix: str, simulated: bool) -> str:
    """A fresh namespace. `simulated`: its pods go to KWOK's simulated nodes (they never
    run); otherwise CPU pods run on the test bed's real node."""
    name = f"{prefix}-{uuid.uuid4().hex[:8]}"
    annotations = testbed.SIMULATED_NAMESPACE_ANNOTATIONS if simulated else {}
    kubectl.apply({"apiVersion": "v1", "kind": "Namespace",
                   "metadata": {"name": name, "annotations": annotations}})  # fmt: skip
    return name


@pytest.fixture
def namespace(kubectl: Kubectl) -> Iterator[str]:
    """A fresh namespace per test whose pods are simulated by KWOK, deleted afterwards
    (without waiting)."""
    name = create_namespace(kubectl, "t", simulated=True)
    yield name
    kubectl.run("delete", "namespace", name, "--wait=false", check=False)


@pytest.fixture
def real_namespace(kubectl: Kubectl) -> Iterator[str]:
    """A fresh namespace per test whose CPU pods run on the real node."""
    name = create_namespace(kubectl, "r", simulated=False)
    yield name
    kubectl.run("delete", "namespace", name, "--wait=false", check=False)


@pytest.fixture(scope="session")
def real_node(kubectl: Kubectl) -> str:
    """The test bed's real node (kubelet + containerd): fails when it is missing, unless
    the test bed was started without one on purpose (TESTBED_REAL_NODE=0)."""
    if not testbed.REAL_NODE:
        pytest.skip("TESTBED_REAL_NODE=0: the test bed runs without its real node")
    node = kubectl.json("get", "node", testbed.realnode.NODE_NAME)
    ready = [c for c in node["status"]["conditions"] if c["type"] == "Ready"]
    assert ready and ready[0]["status"] == "True", f"the real node is not Ready: {ready}"
    return str(node["metadata"]["name"])


ROOT = E2E_DIR.parent
CRD_FILE = ROOT / "crds" / "transcriptiondeployments.transcription.dev.yaml"


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
        import sys
        import urllib.request

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
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.log.close()
        self.proc = None

    def metrics(self) -> dict[str, float]:
        """Samples of the operator's Prometheus metrics, by 'name{labels}'."""
        import urllib.request

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


@pytest.fixture(scope="session")
def crd_installed(kubectl: Kubectl) -> None:
    kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRD_FILE))
    kubectl(
        "wait",
        "--for=condition=Established",
        "crd/transcriptiondeployments.transcription.dev",
        "--timeout=60s",
    )


@pytest.fixture(scope="module")
def operator(
    cluster: Path, crd_installed: None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[OperatorProcess]:
    """The operator as a local process, watching every namespace, for one test module
    (so that it never meets the in-cluster operator of another module)."""
    log = tmp_path_factory.mktemp("operator") / "operator.log"
    op = OperatorProcess(cluster, log)
    op.start()
    yield op
    op.stop()


@contextlib.contextmanager
def operator_in_cluster(
    kubectl: Kubectl, cluster: Path, release: str, watch: str, extra: tuple[str, ...] = ()
) -> Iterator[tuple[str, str]]:
    """The Helm chart installed with the test bed's images, watching one namespace: the
    operator runs in the cluster from its image, under its ServiceAccount. Yields the
    namespace it runs in (restricted PodSecurity, like the one it watches) and the release's
    name."""
    import images
    from test_chart import CHART, helm

    refs = images.refs()
    # A name of its own: a run killed before its uninstall leaves cluster-scoped objects
    # (the CRD-reading ClusterRole) that another release of the same name cannot adopt.
    release = f"{release}-{uuid.uuid4().hex[:4]}"
    system_ns = create_namespace(kubectl, f"{watch}-system", simulated=False)
    kubectl("label", "namespace", system_ns, "pod-security.kubernetes.io/enforce=restricted")
    repo, tag = refs["operator"].rsplit(":", 1)
    try:
        helm(
            "upgrade", "--install", release, str(CHART), "-n", system_ns, "--wait", "--timeout", "3m",
            "--set", "crds.install=false",  # the CRD is already there (another release owns it)
            # So is the cluster's one warning policy (cluster-scoped, one per cluster).
            "--set", "admissionPolicy.enabled=false",
            "--set", f"watchNamespaces={{{watch}}}",
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
    from test_operator import wait_ready

    ns = create_namespace(kubectl, prefix, simulated=False)
    kubectl("label", "namespace", ns, "pod-security.kubernetes.io/enforce=restricted")
    name = resource["metadata"]["name"]
    with operator_in_cluster(kubectl, cluster, release, ns, extra) as (system_ns, rel):
        kubectl.apply(resource, ns)
        try:
            wait_ready(kubectl, ns, name, timeout=timeout)
            yield ns, system_ns, rel
        finally:
            kubectl.run("delete", "tdeploy", name, "-n", ns, "--wait=false", check=False)
            kubectl.run("delete", "namespace", ns, "--wait=false", check=False)


@pytest.fixture(scope="module")
def speech(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """espeak-ng speaking each test sentence, as WAV files."""
    from tests.audio import SENTENCES, speak

    d = tmp_path_factory.mktemp("speech")
    return {s: speak(s, d) for s in SENTENCES}
