"""The suites' reads answered in-process (testbed/kubeget.py): which command lines it
serves, how it finds a kind, kubectl's output for the API server's answer, and what it
leaves to kubectl when the API server is away or silent. The answers themselves are held
against kubectl's on the real API server in e2e/test_testbed.py."""

from __future__ import annotations

import json
import socket
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from testbed import kubeget
from testbed.kubeget import Get, Resource


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["get", "pods", "-n", "ns", "-o", "json"], Get("pods", None, "ns")),
        (["get", "tdeploy", "x", "-n", "ns", "-o", "json"], Get("tdeploy", "x", "ns")),
        (["get", "svc/kube-dns", "-o", "json"], Get("svc", "kube-dns", None)),
        (
            ["get", "pods", "-l", "a=b,c=d", "--namespace", "ns", "--output", "json"],
            Get("pods", None, "ns", "a=b,c=d"),
        ),
        (
            ["get", "lease", "l", "--ignore-not-found", "--request-timeout=3s", "-o", "json"],
            Get("lease", "l", None, ignore_not_found=True, request_timeout=3.0),
        ),
    ],
)
def test_the_plain_reads_are_served(args: list[str], expected: Get) -> None:
    assert kubeget.parse(args) == expected


@pytest.mark.parametrize(
    "args",
    [
        [],
        ["apply", "-f", "-", "-o", "json"],  # not a read
        ["get", "pods", "-n", "ns"],  # a table
        ["get", "pods", "-o", "wide"],
        ["get", "pods", "-o", "jsonpath={.items}"],
        ["get", "pods", "-A", "-o", "json"],  # an option it does not know
        ["get", "pods,replicasets", "-o", "json"],  # several kinds
        ["get", "pods", "a", "b", "-o", "json"],  # several names
        ["get", "pods/a", "b", "-o", "json"],
        ["get", "pods/", "-o", "json"],
        ["get", "a/b/c", "-o", "json"],
        ["get", "pods", "a", "-l", "x=y", "-o", "json"],  # kubectl's own refusal
        ["get", "pods", "-o", "json", "-n"],  # a flag without its value
        ["get", "pods", "--request-timeout=1m", "-o", "json"],  # not in seconds
        ["get", "-o", "json"],  # no kind
    ],
)
def test_every_other_command_is_left_to_kubectl(args: list[str]) -> None:
    assert kubeget.parse(args) is None


LISTS: dict[str, dict[str, Any]] = {
    "/api/v1": {"resources": [
        {"name": "pods", "singularName": "pod", "kind": "Pod", "namespaced": True,
         "shortNames": ["po"], "verbs": ["get", "list"]},
        {"name": "pods/log", "singularName": "", "kind": "Pod", "namespaced": True,
         "verbs": ["get"]},
        {"name": "events", "singularName": "event", "kind": "Event", "namespaced": True,
         "shortNames": ["ev"], "verbs": ["get", "list"]},
        {"name": "nodes", "singularName": "node", "kind": "Node", "namespaced": False,
         "shortNames": ["no"], "verbs": ["get", "list"]},
        {"name": "bindings", "singularName": "binding", "kind": "Binding", "namespaced": True,
         "verbs": ["create"]},
    ]},
    "/apis/events.k8s.io/v1": {"resources": [
        {"name": "events", "singularName": "event", "kind": "Event", "namespaced": True,
         "shortNames": ["ev"], "verbs": ["get", "list"]},
    ]},
    "/apis/metrics.example/v1": {"resources": [
        {"name": "widgets", "singularName": "widget", "kind": "Widget", "namespaced": True,
         "shortNames": ["wd"], "verbs": ["get"]},
    ]},
    "/apis/other.example/v1": {"resources": [
        {"name": "widgets", "singularName": "widget", "kind": "Widget", "namespaced": True,
         "verbs": ["get"]},
    ]},
    "/apis/transcription.dev/v1alpha1": {"resources": [
        {"name": "transcriptiondeployments", "singularName": "transcriptiondeployment",
         "kind": "TranscriptionDeployment", "namespaced": True, "shortNames": ["tdeploy"],
         "verbs": ["get", "list"]},
    ]},
}  # fmt: skip
POD = Resource("/api/v1", "pods", True)
TDEPLOY = Resource("/apis/transcription.dev/v1alpha1", "transcriptiondeployments", True)


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("pods", POD), ("pod", POD), ("po", POD), ("Pod", POD), ("POD", POD),
        ("tdeploy", TDEPLOY), ("transcriptiondeployment", TDEPLOY),
        ("transcriptiondeployments.transcription.dev", TDEPLOY),
        ("transcriptiondeployment.transcription.dev", TDEPLOY),
        ("events", Resource("/api/v1", "events", True)),  # the core group first, as kubectl
        ("events.events.k8s.io", Resource("/apis/events.k8s.io/v1", "events", True)),
        ("widgets.other.example", Resource("/apis/other.example/v1", "widgets", True)),
        ("wd", Resource("/apis/metrics.example/v1", "widgets", True)),
        ("widgets", None),  # two groups, neither the core: kubectl decides
        ("bindings", None),  # not readable
        ("log", None),  # a subresource
        ("nothing", None),
    ],
)  # fmt: skip
def test_a_kind_is_found_by_every_name_kubectl_knows_it_by(
    name: str, expected: Resource | None
) -> None:
    candidates = kubeget.index(LISTS).get(name.lower())
    assert (kubeget.choose(candidates) if candidates else None) == expected


def test_paths_of_namespaced_and_cluster_kinds() -> None:
    assert POD.path("ns", "p") == "/api/v1/namespaces/ns/pods/p"
    assert TDEPLOY.path("ns", None) == (
        "/apis/transcription.dev/v1alpha1/namespaces/ns/transcriptiondeployments"
    )
    assert Resource("/api/v1", "nodes", False).path("ns", "n") == "/api/v1/nodes/n"


def test_a_list_is_wrapped_and_its_items_named_as_kubectl_prints_them() -> None:
    body = {"apiVersion": "v1", "kind": "PodList", "metadata": {"resourceVersion": "7"},
            "items": [{"metadata": {"name": "a"}},
                      {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "b"}}]}  # fmt: skip
    proc = kubeget.output(Get("pods", None, "ns"), 200, body)
    assert proc is not None and proc.returncode == 0 and not proc.stderr
    assert json.loads(proc.stdout) == {
        "apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": ""},
        "items": [{"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "a"}},
                  {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "b"}}],
    }  # fmt: skip


def test_an_object_is_printed_as_it_came_less_its_managed_fields() -> None:
    body = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "a"}}
    fields = {"managedFields": [{"manager": "kubectl", "operation": "Apply"}]}
    proc = kubeget.output(Get("pod", "a", "ns"), 200, body | {"metadata": {"name": "a"} | fields})
    assert proc is not None and json.loads(proc.stdout) == body
    listed = {
        "apiVersion": "v1",
        "kind": "PodList",
        "items": [{"metadata": {"name": "a"} | fields}],
    }
    proc = kubeget.output(Get("pods", None, "ns"), 200, listed)
    assert proc is not None and json.loads(proc.stdout)["items"] == [body]


NOT_FOUND = {"kind": "Status", "status": "Failure", "reason": "NotFound", "code": 404,
             "message": 'pods "a" not found', "details": {"name": "a", "kind": "pods"}}  # fmt: skip


def test_a_missing_object_fails_with_kubectls_message_or_prints_nothing_when_ignored() -> None:
    proc = kubeget.output(Get("pod", "a", "ns"), 404, NOT_FOUND)
    assert proc is not None and proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr == 'Error from server (NotFound): pods "a" not found\n'
    ignored = kubeget.output(Get("pod", "a", "ns", ignore_not_found=True), 404, NOT_FOUND)
    assert ignored is not None and (ignored.returncode, ignored.stdout) == (0, "")
    empty = {"apiVersion": "v1", "kind": "PodList", "items": []}
    quiet = kubeget.output(Get("pods", None, "ns", ignore_not_found=True), 200, empty)
    assert quiet is not None and (quiet.returncode, quiet.stdout) == (0, "")
    listed = kubeget.output(Get("pods", None, "ns"), 200, empty)
    assert listed is not None and json.loads(listed.stdout)["items"] == []


@pytest.mark.parametrize(
    ("status", "body"),
    [
        (404, {"kind": "Status", "reason": "NotFound", "details": {}}),  # the kind is gone
        (404, NOT_FOUND | {"details": {"name": "other"}}),
        (403, {"kind": "Status", "reason": "Forbidden"}),
        (429, {"kind": "Status", "reason": "TooManyRequests"}),
        (500, {}),
        (503, {}),
    ],
)
def test_any_other_answer_is_left_to_kubectl(status: int, body: dict[str, Any]) -> None:
    assert kubeget.output(Get("pod", "a", "ns"), status, body) is None


# ---------------------------------------------------------------- an API server away


class Offline(kubeget.Reader):
    """A reader of a kubeconfig naming `server` (no kubectl is asked)."""

    def __init__(self, tmp: Path, server: str) -> None:
        config = tmp / "kubeconfig"
        config.write_text("{}")
        super().__init__("kubectl-is-not-run", config)
        self.server = server

    def view(self) -> dict[str, Any]:
        return {
            "clusters": [{"cluster": {"server": self.server, "insecure-skip-tls-verify": True}}],
            "users": [{"user": {"token": "t"}}],
            "contexts": [{"context": {}}],
        }


@pytest.fixture
def silent() -> Iterator[int]:
    """A port that takes connections and never answers (an API server under SIGSTOP)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(8)
        yield s.getsockname()[1]


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_refused_connection_is_left_to_kubectl_and_nothing_stays_broken(
    tmp_path: Path, silent: int
) -> None:
    reader = Offline(tmp_path, f"https://127.0.0.1:{closed_port()}")
    assert reader.answer(Get("pods", None, "ns"), timeout=5) is None
    assert reader.answer(Get("pods", None, "ns"), timeout=5) is None
    reader.server = f"https://127.0.0.1:{silent}"  # a new kubeconfig: read again
    Path(reader.kubeconfig).write_text("{ }")
    with pytest.raises(subprocess.TimeoutExpired):
        reader.answer(Get("pods", None, "ns"), timeout=0.5)


def test_a_silent_api_server_times_out_as_kubectl_would(tmp_path: Path, silent: int) -> None:
    reader = Offline(tmp_path, f"https://127.0.0.1:{silent}")
    proc = reader.answer(Get("pods", None, "ns", request_timeout=0.5), timeout=60)
    assert proc is not None and proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr.startswith("Unable to connect to the server")
    with pytest.raises(subprocess.TimeoutExpired):
        reader.answer(Get("pods", None, "ns"), timeout=0.5)


def test_a_kubeconfig_it_cannot_read_leaves_every_read_to_kubectl(tmp_path: Path) -> None:
    class Exec(Offline):
        calls = 0

        def view(self) -> dict[str, Any]:
            Exec.calls += 1
            doc = super().view()
            doc["users"] = [{"user": {"exec": {"command": "login"}}}]
            return doc

    reader = Exec(tmp_path, "https://127.0.0.1:1")
    assert reader.answer(Get("pods", None, "ns"), timeout=5) is None
    assert reader.answer(Get("pods", None, "ns"), timeout=5) is None
    assert Exec.calls == 1  # read once, not once a command


def test_threads_share_nothing_but_the_credentials(tmp_path: Path, silent: int) -> None:
    reader = Offline(tmp_path, f"https://127.0.0.1:{silent}")
    outcomes: list[int] = []

    def one() -> None:
        proc = reader.answer(Get("pods", None, "ns", request_timeout=0.3), timeout=60)
        outcomes.append(proc.returncode if proc else -1)

    threads = [threading.Thread(target=one) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert outcomes == [1, 1, 1, 1]
