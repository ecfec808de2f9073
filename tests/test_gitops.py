"""GitOps health: the Argo CD health check (run in a real Lua interpreter) on real statuses,
of a TranscriptionDeployment and of a TranscriptionGateway."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from lupa import LuaRuntime

from testkit.resources import make_gateway, make_td
from transcription_api.v1alpha1 import TranscriptionDeployment
from transcription_operator.config import OperatorConfig
from transcription_operator.gateway_status import gateway_status
from transcription_operator.plan import plan
from transcription_operator.selection import select
from transcription_operator.status import Observed, compute_status, status_body

SCRIPT = (Path(__file__).resolve().parents[1] / "gitops" / "argocd-health.lua").read_text()


def health(obj: dict[str, Any]) -> tuple[str, str]:
    lua = LuaRuntime(unpack_returned_tuples=True)

    def to_lua(v: Any) -> Any:
        if isinstance(v, dict):
            return lua.table_from({k: to_lua(x) for k, x in v.items()})
        if isinstance(v, list):
            return lua.table_from([to_lua(x) for x in v])
        return v

    lua.globals().obj = to_lua(obj)
    hs = lua.execute(SCRIPT)
    return hs["status"], hs["message"]


def body(
    spec: dict[str, Any],
    deployments: list[dict[str, Any]],
    problems: list[tuple[str, str]] | None = None,
    generation: int = 3,
) -> dict[str, Any]:
    td = make_td(spec)
    st = compute_status(
        td,
        plan(td.spec),
        Observed({d["metadata"]["name"]: d for d in deployments}, problems or []),
        OperatorConfig(),
        "2026-11-30T10:00:00Z",
    )
    return {"metadata": {"generation": generation}, "status": status_body(st)}


def dep(name: str, replicas: int, ready: int) -> dict[str, Any]:
    return {"metadata": {"name": name, "generation": 1},
            "status": {"observedGeneration": 1, "replicas": replicas, "updatedReplicas": replicas, "readyReplicas": ready}}  # fmt: skip


def rolling(name: str, stuck: bool = False) -> dict[str, Any]:
    """A rollout whose new replica is not ready while the old one serves (past its
    progress deadline, when `stuck`)."""
    d = dep(name, 1, 1)
    d["status"].update(replicas=2, updatedReplicas=1)
    if stuck:
        d["status"]["conditions"] = [{"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded"}]  # fmt: skip
    return d


SPEC = {"model": {"name": "m"}, "frontend": {"replicas": 1}}


@pytest.mark.parametrize(
    ("obj", "expected"),
    [
        ({"metadata": {"generation": 1}}, "Progressing"),
        (body(SPEC, []), "Progressing"),
        (body(SPEC, [dep("whisper-default", 1, 1), dep("whisper-frontend", 1, 1)]), "Healthy"),
        (
            body(SPEC, [dep("whisper-default", 1, 1), dep("whisper-frontend", 1, 1)], generation=4),
            "Progressing",
        ),
        (
            body(SPEC, [], problems=[("SecretNotFound", "Secret speech/keys does not exist")]),
            "Degraded",
        ),
        (
            body(
                {**SPEC, "engine": "transformers", "traffic": {"endpoints": ["chat"]}},
                [dep("whisper-default", 1, 1), dep("whisper-frontend", 1, 1)],
            ),
            "Degraded",
        ),
        # Rolling out while the old replica serves (Ready=True): Progressing, not Healthy;
        # past the Deployment's progress deadline: Degraded.
        (body(SPEC, [rolling("whisper-default"), dep("whisper-frontend", 1, 1)]), "Progressing"),
        (
            body(SPEC, [rolling("whisper-default", stuck=True), dep("whisper-frontend", 1, 1)]),
            "Degraded",
        ),
        # Every pool at 0 replicas serves nothing: not green (NoCapacity).
        (
            body(
                {**SPEC, "pools": [{"name": "default", "replicas": 0}]},
                [dep("whisper-default", 0, 0), dep("whisper-frontend", 1, 1)],
            ),
            "Degraded",
        ),
    ],
)
def test_argocd_health_check(obj: dict[str, Any], expected: str) -> None:
    status, message = health(obj)
    assert status == expected, message
    assert message


def gateway_body(candidates: list[dict[str, Any]], frontend_ready: int) -> dict[str, Any]:
    """A gateway's status over deployments (spec, Ready) of the same label."""
    gw = make_gateway({"selector": {"matchLabels": {"team": "a"}}, "frontend": {"replicas": 1}})
    tds = []
    for i, (spec, ready) in enumerate(candidates):
        d = make_td(spec, name=f"d{i}").model_dump(by_alias=True, exclude_none=True, mode="json")
        d["metadata"]["labels"] = {"team": "a"}
        d["status"] = {"conditions": [{"type": "Ready", "status": ready, "reason": "R",
                                       "lastTransitionTime": "2026-11-30T10:00:00Z"}]}  # fmt: skip
        tds.append(TranscriptionDeployment.model_validate(d))
    observed = Observed({"gw-frontend": dep("gw-frontend", 1, frontend_ready)})
    st = gateway_status(gw, select(gw, tds, {}), observed, OperatorConfig(), "2026-11-30T10:00:00Z")
    return {"metadata": {"generation": 1}, "status": status_body(st)}


@pytest.mark.parametrize(
    ("obj", "expected"),
    [
        (gateway_body([({"model": {"name": "a"}}, "True")], 1), "Healthy"),
        (gateway_body([({"model": {"name": "a"}}, "False")], 1), "Progressing"),
        (gateway_body([({"model": {"name": "a"}}, "True")], 0), "Progressing"),
        (gateway_body([], 1), "Degraded"),  # selects nothing
        (  # a name claimed twice: the later one refused
            gateway_body(
                [({"model": {"name": "a"}}, "True"), ({"model": {"name": "a"}}, "True")], 1
            ),
            "Degraded",
        ),
    ],
)
def test_argocd_health_check_of_a_gateway(obj: dict[str, Any], expected: str) -> None:
    status, message = health(obj)
    assert status == expected, message
    assert message
