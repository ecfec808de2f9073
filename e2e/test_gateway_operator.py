"""A TranscriptionGateway on the real node: the chart's operator, running in the cluster
from its image under its ServiceAccount (watching two namespaces: the namespaced mode),
routes two faster-whisper deployments behind one frontend and Service.

What the operator does, against the real API server and real pods: the gateway's children
and its route table, both statuses (Ready from the deployments' own Ready, a deployment
without a frontend of its own served through the gateway), an alias conflict named in all
three statuses with one Warning each, a deployment of another namespace refused until it
consents (then a RoleBinding there for the gateway's frontend), `namespaces.from: Selector`
refused by a namespaced operator, deletions reaching the routes, printer columns, and no
write in a quiet period. The requests themselves (routing by model, /v1/models, streams,
realtime through the gateway) are the frontend's suites'.
"""

from __future__ import annotations

import copy
import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from testbed import images
from testbed.kube import condition, create_namespace, wait_for
from testbed.kubectl import Kubectl
from testbed.operators import operator_in_cluster
from testkit.scrape import pods_metric
from transcription_api.routes import ROUTES_KEY, Routes

GW = "gw"
LABELS = {"transcription.dev/gateway": "e2e"}
# The operator resyncs every RESYNC seconds: the quiet period spans two resyncs.
RESYNC = 5.0
QUIET_SECONDS = float(os.environ.get("QUIET_SECONDS", "12"))


@dataclass
class Namespaces:
    kubectl: Kubectl
    here: str  # the gateway's
    there: str  # another one the operator watches
    system: str  # the operator's


@pytest.fixture(scope="module")
def watched(
    kubectl: Kubectl, cluster: Path, real_node: str, crd_installed: None
) -> Iterator[Namespaces]:
    here = create_namespace(kubectl, "g", simulated=False)
    there = create_namespace(kubectl, "h", simulated=False)
    for ns in (here, there):
        kubectl("label", "namespace", ns, "pod-security.kubernetes.io/enforce=restricted")
    try:
        resync = ("--set", f"resyncPeriod={RESYNC:g}s")
        with operator_in_cluster(kubectl, cluster, "gateway-operator", (here, there), resync) as (
            system,
            _,
        ):
            yield Namespaces(kubectl, here, there, system)
    finally:
        for ns in (here, there):
            kubectl.run("delete", "namespace", ns, "--wait=false", check=False)


def gateway(**spec: Any) -> dict[str, Any]:
    refs = images.refs()
    return {
        "apiVersion": "transcription.dev/v1alpha1", "kind": "TranscriptionGateway",
        "metadata": {"name": GW},
        "spec": {"selector": {"matchLabels": LABELS},
                 "frontend": {"replicas": 1, "resources": {"cpu": "100m", "memory": "256Mi"}},
                 "images": {"frontend": refs["frontend"], "pullPolicy": "IfNotPresent"}, **spec},
    }  # fmt: skip


def deployment(name: str, aliases: tuple[str, ...] = (), **spec: Any) -> dict[str, Any]:
    """Whisper tiny.en from the CPU worker image, served as model `name`, sized for the real
    node's 2 cores."""
    refs = images.refs()
    return {
        "apiVersion": "transcription.dev/v1alpha1", "kind": "TranscriptionDeployment",
        "metadata": {"name": name, "labels": LABELS},
        "spec": {
            "model": {"name": name, "aliases": list(aliases), "source": "image",
                      "path": "/models/whisper-tiny.en"},
            "engine": "faster-whisper",
            "pools": [{"name": "cpu", "replicas": 1, "resources": {"cpu": "300m", "memory": "1Gi"}}],
            "frontend": {"replicas": 1, "resources": {"cpu": "100m", "memory": "256Mi"}},
            "images": {"fasterWhisper": refs["worker-cpu"], "frontend": refs["frontend"],
                       "pullPolicy": "IfNotPresent"},
            **spec,
        },
    }  # fmt: skip


def get(kubectl: Kubectl, kind: str, ns: str, name: str) -> dict[str, Any]:
    result: dict[str, Any] = kubectl.json("get", kind, name, "-n", ns)
    return result


def done(obj: dict[str, Any]) -> bool:
    """Status current, Ready, rolled out (as testbed.kube.wait_ready, for either kind)."""
    current = (obj.get("status") or {}).get("observedGeneration") == obj["metadata"]["generation"]
    states = [condition(obj, t).get("status") for t in ("Ready", "Progressing", "Degraded")]
    return current and states == ["True", "False", "False"]


def wait_done(
    kubectl: Kubectl, kind: str, ns: str, name: str, timeout: float = 300
) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        obj = get(kubectl, kind, ns, name)
        return obj if done(obj) else None

    result: dict[str, Any] = wait_for(
        check, timeout=timeout, what=f"{kind} {ns}/{name} to be Ready"
    )
    return result


def routes(kubectl: Kubectl, ns: str) -> Routes:
    cm = get(kubectl, "configmap", ns, f"{GW}-routes")
    return Routes.model_validate_json(cm["data"][ROUTES_KEY])


def gateways_of(kubectl: Kubectl, ns: str, name: str) -> list[dict[str, Any]]:
    return list((get(kubectl, "tdeploy", ns, name).get("status") or {}).get("gateways", []))


def events(kubectl: Kubectl, ns: str, reason: str) -> list[str]:
    """The names of the objects with an Event of this reason in the namespace."""
    items = kubectl.json("get", "events", "-n", ns, "--field-selector", f"reason={reason}")["items"]
    return sorted(e["involvedObject"]["name"] for e in items)


def resyncs(kubectl: Kubectl, system: str) -> float:
    """The reconciles the operator's replicas' resyncs asked for (two resources: 2 each)."""
    pods = kubectl.json("get", "pods", "-n", system)["items"]
    counts = pods_metric(pods, "transcription_operator_enqueued_total", "by")
    return counts.get(("resync",), 0.0)


def versions(kubectl: Kubectl, ns: str) -> dict[str, str]:
    """The resourceVersion of every resource and child of the namespace."""
    kinds = ("tgw,tdeploy,deployments,services,configmaps,serviceaccounts,roles,rolebindings,"
             "networkpolicies,poddisruptionbudgets")  # fmt: skip
    items = kubectl.json("get", kinds, "-n", ns)["items"]
    return {f"{i['kind']}/{i['metadata']['name']}": i["metadata"]["resourceVersion"] for i in items}


def test_a_gateway_routes_two_deployments_and_names_a_conflict(watched: Namespaces) -> None:
    k, ns = watched.kubectl, watched.here
    k.apply(gateway(), ns)
    k.apply(deployment("tiny-a", ("a",), frontend={"enabled": False}), ns)
    k.apply(deployment("tiny-b", ("b",)), ns)
    for name in ("tiny-a", "tiny-b"):
        wait_done(k, "tdeploy", ns, name)
    gw = wait_done(k, "tgw", ns, GW)

    table = routes(k, ns)
    assert sorted((t.deployment, tuple(t.served_names)) for t in table.deployments) == [
        (f"{ns}/tiny-a", ("tiny-a", "a")), (f"{ns}/tiny-b", ("tiny-b", "b")),
    ]  # fmt: skip
    assert sorted(p.name for t in table.deployments for p in t.pools) == [
        "tiny-a/cpu",
        "tiny-b/cpu",
    ]
    status = gw["status"]
    assert status["routedDeployments"] == "2/2"
    assert status["endpoint"] == f"http://{GW}.{ns}.svc.cluster.local/v1"
    assert all(d["routed"] and d["ready"] for d in status["deployments"])
    # tiny-a has no frontend of its own: it is reached through the gateway.
    a = get(k, "tdeploy", ns, "tiny-a")
    assert a["status"]["endpoint"] == status["endpoint"]
    assert [(g["name"], g["routed"]) for g in a["status"]["gateways"]] == [(GW, True)]
    assert k.run("get", "deployment", "tiny-a-frontend", "-n", ns, check=False).returncode != 0
    # The gateway's frontend runs, owned by the gateway, with the routes mounted.
    [pod] = k.pods(ns, GW, "frontend")
    assert pod["status"]["phase"] == "Running"
    owner = get(k, "deployment", ns, f"{GW}-frontend")["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["uid"]) == ("TranscriptionGateway", gw["metadata"]["uid"])

    header, row = k("get", "tgw", "-n", ns).splitlines()[:2]
    assert header.split() == ["NAME", "READY", "REASON", "DEPLOYMENTS", "ENDPOINT", "AGE"]
    assert row.split()[:4] == [GW, "True", "Ready", "2/2"]

    # A quiet period: the operator resyncs and writes nothing.
    time.sleep(3)
    before, resynced = versions(k, ns), resyncs(k, watched.system)
    time.sleep(QUIET_SECONDS)
    assert versions(k, ns) == before
    assert resyncs(k, watched.system) - resynced >= 2 * 2, "no resync in the quiet period"

    # A third deployment claims alias `a`: refused, named in all three statuses.
    k.apply(deployment("tiny-c", ("a",), pools=[{"name": "cpu", "replicas": 0}],
                       frontend={"enabled": False}), ns)  # fmt: skip

    def conflicted() -> dict[str, Any] | None:
        obj = get(k, "tgw", ns, GW)
        c = condition(obj, "Degraded")
        return obj if (c.get("status"), c.get("reason")) == ("True", "NameConflict") else None

    gw = wait_for(conflicted, timeout=60, what="the gateway to report the conflict")
    [c] = [d for d in gw["status"]["deployments"] if d["name"] == "tiny-c"]
    assert (c["routed"], c["reason"]) == (False, "NameConflict")
    assert "'a'" in c["message"] and f"{ns}/tiny-a" in c["message"]
    assert condition(gw, "Ready")["status"] == "True"  # it serves what it routes
    wait_for(lambda: [(g["routed"], g["reason"]) for g in gateways_of(k, ns, "tiny-c")]
             == [(False, "NameConflict")], timeout=60, what="tiny-c's status")  # fmt: skip
    wait_for(lambda: [(g["routed"], g["reason"]) for g in gateways_of(k, ns, "tiny-a")]
             == [(True, "NameConflict")], timeout=60, what="tiny-a's status")  # fmt: skip
    assert f"{ns}/tiny-c" in gateways_of(k, ns, "tiny-a")[0]["message"]
    assert [t.deployment for t in routes(k, ns).refused] == [f"{ns}/tiny-c"]
    wait_for(lambda: events(k, ns, "NameConflict") == [GW, "tiny-a", "tiny-c"],
             timeout=30, what="one NameConflict Event each")  # fmt: skip
    time.sleep(5)
    assert events(k, ns, "NameConflict") == [GW, "tiny-a", "tiny-c"]  # not once per reconcile

    # Deleting the later one clears the conflict; deleting tiny-b leaves the routes.
    k("delete", "tdeploy", "tiny-c", "-n", ns)
    wait_done(k, "tgw", ns, GW, timeout=60)
    k("delete", "tdeploy", "tiny-b", "-n", ns)
    wait_for(lambda: [t.deployment for t in routes(k, ns).deployments] == [f"{ns}/tiny-a"],
             timeout=60, what="the routes to lose tiny-b")  # fmt: skip
    # The status is patched when the reconcile that applied the routes ends: read after it.
    wait_for(lambda: get(k, "tgw", ns, GW)["status"]["routedDeployments"] == "1/1",
             timeout=30, what="the gateway's status to count one deployment")  # fmt: skip


def test_another_namespace_is_routed_only_with_its_consent(watched: Namespaces) -> None:
    k, here, there = watched.kubectl, watched.here, watched.there
    everywhere = gateway(namespaces={"from": "All"})
    everywhere["metadata"]["name"] = "edge"
    k.apply(everywhere, here)
    # No replica: what is checked is the routing, not the serving.
    alone = deployment("far", ("far-1",), pools=[{"name": "cpu", "replicas": 0}],
                       frontend={"enabled": False})  # fmt: skip
    k.apply(alone, there)

    def verdict() -> tuple[bool, str] | None:
        gs = [g for g in gateways_of(k, there, "far") if g["name"] == "edge"]
        return (gs[0]["routed"], gs[0]["reason"]) if gs else None

    assert wait_for(verdict, timeout=60, what="far's status to name edge") == (
        False,
        "NotPermitted",
    )
    [g] = [g for g in gateways_of(k, there, "far") if g["name"] == "edge"]
    assert f"{here}/edge" in g["message"] and "spec.allowedGateways" in g["message"]
    ready = condition(get(k, "tdeploy", there, "far"), "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "NotRouted")
    # The gateway's own reconcile writes its status, apart from far's: wait for it too.
    wait_for(lambda: condition(get(k, "tgw", here, "edge"), "Degraded").get("reason")
             == "NotPermitted", timeout=60, what="edge's status to say NotPermitted")  # fmt: skip
    assert k.run("get", "rolebinding", "far-gateways", "-n", there, check=False).returncode != 0

    consenting = copy.deepcopy(alone)
    consenting["spec"]["allowedGateways"] = [{"namespace": here, "name": "edge"}]
    k.apply(consenting, there)
    assert wait_for(lambda: verdict() == (True, "Routed") and verdict(), timeout=60,
                    what="far to be routed")  # fmt: skip
    binding = wait_for(
        lambda: (p := k.run("get", "rolebinding", "far-gateways", "-n", there, "-o", "json",
                            check=False)).returncode == 0 and json.loads(p.stdout),
        timeout=30, what="the RoleBinding for edge's frontend",
    )  # fmt: skip
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "edge-frontend",
                                    "namespace": here}]  # fmt: skip

    def pools() -> list[str]:
        table = get(k, "configmap", here, "edge-routes")["data"][ROUTES_KEY]
        return [p.name for t in Routes.model_validate_json(table).deployments for p in t.pools]

    # The route table is the gateway's child, written by its reconcile, not far's.
    wait_for(lambda: f"{there}/far/cpu" in pools(), timeout=60, what="edge's routes to hold far")

    # Namespaces by label: a namespaced operator may not read namespaces, and says so.
    by_label = copy.deepcopy(everywhere)
    by_label["spec"]["namespaces"] = {"from": "Selector", "selector": {"matchLabels": {"x": "y"}}}
    k.apply(by_label, here)
    wait_for(lambda: condition(get(k, "tgw", here, "edge"), "Ready").get("reason")
             == "NamespacesUnreadable", timeout=60, what="NamespacesUnreadable")  # fmt: skip
    k("delete", "tgw", "edge", "-n", here)
    wait_for(lambda: not [g for g in gateways_of(k, there, "far") if g["name"] == "edge"],
             timeout=60, what="far's status to forget edge")  # fmt: skip
