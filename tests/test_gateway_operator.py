"""A TranscriptionGateway and the deployments it routes, through the whole operator in
process (its handlers, cache, queue and reconciles) against the API-server stand-in over
HTTP: the routes the gateway's frontend reads, both statuses, conflicts, deletions, and
nothing written at steady state. e2e/test_gateway_operator.py runs the same against the
real API server."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from testkit.inprocess import InProcessOperator, in_process
from transcription_api.routes import ROUTES_KEY, Routes

GW = "TranscriptionGateway"
TD = "TranscriptionDeployment"
LABELS = {"transcription.dev/gateway": "speech"}


def gateway(**spec: Any) -> dict[str, Any]:
    return {"kind": GW, "metadata": {"name": "gw", "namespace": "speech"},
            "spec": {"selector": {"matchLabels": LABELS}, "frontend": {"replicas": 1}, **spec}}  # fmt: skip


def deployment(
    name: str, namespace: str = "speech", *, aliases: tuple[str, ...] = (),
    created: str = "2026-01-01T00:00:00Z", **spec: Any,
) -> dict[str, Any]:  # fmt: skip
    return {
        "kind": TD,
        "metadata": {"name": name, "namespace": namespace, "labels": LABELS,
                     "creationTimestamp": created},
        "spec": {"model": {"name": f"m-{name}", "aliases": list(aliases)},
                 "engine": "faster-whisper", "frontend": {"replicas": 1}, **spec},
    }  # fmt: skip


def routes(op: InProcessOperator) -> Routes:
    return Routes.model_validate_json(
        op.get("ConfigMap", "speech", "gw-routes")["data"][ROUTES_KEY]
    )


def gateways_of(op: InProcessOperator, namespace: str, name: str) -> list[tuple[str, bool, str]]:
    status = op.get(TD, namespace, name)["status"]
    return [(f"{g['namespace']}/{g['name']}", g["routed"], g["reason"]) for g in status["gateways"]]


@pytest.fixture
def op() -> Iterator[InProcessOperator]:
    with in_process() as running:
        yield running


def test_a_gateway_routes_two_deployments_and_steady_state_writes_nothing(
    op: InProcessOperator,
) -> None:
    op.apply(gateway(namespaces={"from": "All"}))
    op.apply(deployment("tiny", frontend={"enabled": False}))
    op.apply(deployment("base", "models", allowedGateways=[{"namespace": "speech"}],
                        created="2026-01-02T00:00:00Z"))  # fmt: skip
    op.settle()
    op.roll_out()
    op.settle()

    table = routes(op)
    assert [(t.deployment, t.served_names, [p.name for p in t.pools]) for t in table.deployments] == [
        ("speech/tiny", ["m-tiny"], ["tiny/default"]),
        ("models/base", ["m-base"], ["models/base/default"]),
    ]  # fmt: skip
    gw = op.get(GW, "speech", "gw")["status"]
    assert [(d["name"], d["routed"], d["ready"]) for d in gw["deployments"]] == [
        ("tiny", True, True), ("base", True, True),
    ]  # fmt: skip
    assert op.condition(GW, "speech", "gw", "Ready")["status"] == "True", gw["conditions"]
    assert gw["routedDeployments"] == "2/2"
    assert gateways_of(op, "speech", "tiny") == [("speech/gw", True, "Routed")]
    assert gateways_of(op, "models", "base") == [("speech/gw", True, "Routed")]
    tiny = op.get(TD, "speech", "tiny")["status"]
    assert tiny["endpoint"] == "http://gw.speech.svc.cluster.local/v1"
    assert op.condition(TD, "speech", "tiny", "Ready")["status"] == "True"
    # The gateway's frontend may read the EndpointSlices of the other namespace, nothing more.
    binding = op.get("RoleBinding", "models", "base-gateways")
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "gw-frontend", "namespace": "speech"}
    ]
    # `tiny` has no frontend of its own.
    assert op.api.get("Deployment", "speech", "tiny-frontend") is None

    mark = len(op.api.requests)
    assert op.resync() == 3
    assert op.writes(mark) == []


def test_an_alias_conflict_is_named_in_all_three_statuses_once(op: InProcessOperator) -> None:
    op.apply(gateway())
    op.apply(deployment("first", aliases=("whisper-1",)))
    op.apply(deployment("second", aliases=("whisper-1",), created="2026-02-01T00:00:00Z"))
    op.settle()

    assert [t.deployment for t in routes(op).deployments] == ["speech/first"]
    assert [(r.deployment, r.reason) for r in routes(op).refused] == [
        ("speech/second", "NameConflict")
    ]
    entries = {d["name"]: d for d in op.get(GW, "speech", "gw")["status"]["deployments"]}
    assert (entries["second"]["routed"], entries["second"]["reason"]) == (False, "NameConflict")
    assert "'whisper-1'" in entries["second"]["message"]
    assert "speech/first" in entries["second"]["message"]
    degraded = op.condition(GW, "speech", "gw", "Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", "NameConflict")
    assert gateways_of(op, "speech", "second") == [("speech/gw", False, "NameConflict")]
    assert gateways_of(op, "speech", "first") == [("speech/gw", True, "NameConflict")]
    first = op.get(TD, "speech", "first")["status"]["gateways"][0]["message"]
    assert "speech/second" in first
    warnings = sorted((name, reason) for name, reason, _ in op.events("speech")
                      if reason == "NameConflict")  # fmt: skip
    assert warnings == [("first", "NameConflict"), ("gw", "NameConflict"),
                        ("second", "NameConflict")]  # fmt: skip

    mark = len(op.api.requests)
    op.resync()
    assert op.writes(mark) == []  # no status written again, no Event posted again

    # The later one renames its alias: both are routed, the conflict gone from every status.
    op.apply(deployment("second", aliases=("whisper-2",), created="2026-02-01T00:00:00Z"))
    op.settle()
    assert [t.deployment for t in routes(op).deployments] == ["speech/first", "speech/second"]
    assert gateways_of(op, "speech", "first") == [("speech/gw", True, "Routed")]
    assert gateways_of(op, "speech", "second") == [("speech/gw", True, "Routed")]


def test_a_deleted_deployment_leaves_the_routes_and_a_relabelled_one_too(
    op: InProcessOperator,
) -> None:
    op.apply(gateway())
    for name in ("a", "b", "c"):
        op.apply(deployment(name))
    op.settle()
    assert [t.deployment for t in routes(op).deployments] == ["speech/a", "speech/b", "speech/c"]

    op.delete(TD, "speech", "b")
    op.settle()
    assert [t.deployment for t in routes(op).deployments] == ["speech/a", "speech/c"]

    unlabelled = deployment("c")
    unlabelled["metadata"]["labels"] = {}
    op.apply(unlabelled)
    op.settle()
    assert [t.deployment for t in routes(op).deployments] == ["speech/a"]
    assert op.get(TD, "speech", "c")["status"]["gateways"] == []


def test_a_deployment_served_only_through_gateways_waits_for_one(op: InProcessOperator) -> None:
    op.apply(deployment("tiny", frontend={"enabled": False}))
    op.settle()
    op.roll_out()
    op.settle()
    ready = op.condition(TD, "speech", "tiny", "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "NotRouted")
    assert "none selects it" in ready["message"]

    op.apply(gateway())
    op.settle()
    op.roll_out()
    op.settle()
    assert op.condition(TD, "speech", "tiny", "Ready")["status"] == "True"
    assert op.condition(GW, "speech", "gw", "Ready")["status"] == "True"

    op.delete(GW, "speech", "gw")
    op.settle()
    assert op.condition(TD, "speech", "tiny", "Ready")["reason"] == "NotRouted"
    assert op.get(TD, "speech", "tiny")["status"]["gateways"] == []


def test_a_gateway_that_selects_nothing_says_so(op: InProcessOperator) -> None:
    op.apply(gateway(selector={"matchLabels": {"team": "nobody"}}))
    op.apply(deployment("a"))
    op.settle()
    op.roll_out()
    op.settle()
    ready = op.condition(GW, "speech", "gw", "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "NoDeployments")
    assert (
        ready["message"] == "spec.selector selects no TranscriptionDeployment in namespace speech"
    )
    assert routes(op).deployments == []
    assert (
        json.loads(op.get("ConfigMap", "speech", "gw-routes")["data"][ROUTES_KEY])["refused"] == []
    )
