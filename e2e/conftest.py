"""Fixtures for the suites that need the local Kubernetes test bed (helpers: ``testbed``)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path

import pytest

import testbed.cluster
import testbed.realnode
from testbed.kube import CRD_FILE, GATEWAY_CRD_FILE, create_namespace
from testbed.kubectl import Kubectl
from testbed.operators import OperatorProcess
from testkit import e2e_order
from testkit.audio import SENTENCES, speak
from transcription_api.telemetry import quiet_this_process

# The gateways, workers and operators the suites start report to no vendor.
quiet_this_process()

E2E_DIR = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if E2E_DIR in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.e2e)
    # A stable sort: within a module, and among the modules not in LAST, the order stays.
    items.sort(key=lambda item: e2e_order.rank(Path(str(item.fspath)).name))


@pytest.fixture(scope="session")
def cluster() -> Iterator[Path]:
    """A running test bed; started (and later stopped) unless one is already up. Stopping
    it must leave no process of it behind (issue 20 item 3): the run fails, naming them."""
    was_up = testbed.cluster.is_up()
    # Without KEDA: the modules that need it ask for it (the `keda` fixture).
    kubeconfig = testbed.cluster.up(scaling=False)
    yield kubeconfig
    if not was_up and not os.environ.get("TESTBED_KEEP"):
        try:
            testbed.cluster.down()
        except SystemExit as e:  # a leftover process: fail the run, naming it
            raise AssertionError(str(e)) from e
        assert not testbed.realnode.leftovers(testbed.cluster.CACHE)


@pytest.fixture(scope="session")
def kubectl(cluster: Path) -> Kubectl:
    return Kubectl(cluster)


@pytest.fixture(scope="session")
def shown(pytestconfig: pytest.Config) -> Callable[[], AbstractContextManager[None]]:
    """A context in which the test bed's progress lines reach the terminal at once (pytest
    keeps a fixture's output otherwise): for a build, or a wait for one."""
    capture = pytestconfig.pluginmanager.getplugin("capturemanager")
    return capture.global_and_fixture_disabled  # type: ignore[no-any-return]


@pytest.fixture(scope="session")
def keda(cluster: Path, shown: Callable[[], AbstractContextManager[None]]) -> None:
    """KEDA on the test bed, for the modules that scale on it. It is built on first use;
    under `make test` its build runs beside the suite's first modules, and this waits for
    it (testkit.e2e_order puts those modules last)."""
    with shown():
        testbed.cluster.add_keda()


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
    if not testbed.cluster.REAL_NODE:
        pytest.skip("TESTBED_REAL_NODE=0: the test bed runs without its real node")
    node = kubectl.json("get", "node", testbed.realnode.NODE_NAME)
    ready = [c for c in node["status"]["conditions"] if c["type"] == "Ready"]
    assert ready and ready[0]["status"] == "True", f"the real node is not Ready: {ready}"
    return str(node["metadata"]["name"])


@pytest.fixture(scope="session")
def crd_installed(kubectl: Kubectl) -> None:
    for crd in (CRD_FILE, GATEWAY_CRD_FILE):
        kubectl("apply", "--server-side", "--force-conflicts", "-f", str(crd))
    kubectl(
        "wait",
        "--for=condition=Established",
        "crd/transcriptiondeployments.transcription.dev",
        "crd/transcriptiongateways.transcription.dev",
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


@pytest.fixture(scope="module")
def speech(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """espeak-ng speaking each test sentence, as WAV files."""
    d = tmp_path_factory.mktemp("speech")
    return {s: speak(s, d) for s in SENTENCES}
