"""status(resource, observed): conditions, pools, and no change at steady state."""

from __future__ import annotations

from typing import Any

import pytest

from tests.conftest import make_td
from transcription_api.v1alpha1 import TranscriptionDeployment, TranscriptionDeploymentStatus
from transcription_operator.config import OperatorConfig
from transcription_operator.plan import plan
from transcription_operator.status import Observed, compute_status, status_body

CFG = OperatorConfig()
T0, T1 = "2026-11-30T10:00:00Z", "2026-11-30T10:05:00Z"


def deployment(
    name: str,
    desired: int,
    ready: int,
    generation: int = 1,
    observed: int = 1,
    updated: int | None = None,
) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "generation": generation},
        "spec": {"replicas": desired},
        "status": {
            "observedGeneration": observed,
            "replicas": desired,
            "updatedReplicas": desired if updated is None else updated,
            "readyReplicas": ready,
        },
    }


def conditions(st: TranscriptionDeploymentStatus) -> dict[str, tuple[str, str]]:
    return {c.type: (c.status.value, c.reason) for c in st.conditions}


def run(
    td: TranscriptionDeployment,
    deps: list[dict[str, Any]],
    now: str = T0,
    problems: list[tuple[str, str]] | None = None,
) -> TranscriptionDeploymentStatus:
    observed = Observed(
        deployments={d["metadata"]["name"]: d for d in deps}, problems=problems or []
    )
    return compute_status(td, plan(td.spec), observed, CFG, now)


def with_status(
    td: TranscriptionDeployment, st: TranscriptionDeploymentStatus
) -> TranscriptionDeployment:
    body = td.model_dump(by_alias=True, exclude_none=True, mode="json")
    body["status"] = status_body(st)
    return TranscriptionDeployment.model_validate(body)


def test_nothing_ready_yet(vllm_td: TranscriptionDeployment) -> None:
    st = run(vllm_td, [])
    assert conditions(st) == {
        "Ready": ("False", "NotServing"),
        "Degraded": ("False", "AsExpected"),
        "Stalled": ("False", "AsExpected"),
        "Progressing": ("True", "RollingOut"),
        "Reconciling": ("True", "RollingOut"),
        "AutoSplit": ("False", "NotNeeded"),
    }
    assert st.observed_generation == 3
    assert st.ready_pools == "0/1"
    assert st.endpoint == "http://whisper.speech.svc.cluster.local/v1"
    assert st.models == ["openai/whisper-large-v3-turbo", "whisper-1"]
    msg = next(c.message for c in st.conditions if c.type == "Ready")
    assert msg == "waiting for pool batch 0/2 ready, frontend 0/2 ready"


def test_ready_when_every_pool_and_the_frontend_are_rolled_out(
    vllm_td: TranscriptionDeployment,
) -> None:
    st = run(vllm_td, [deployment("whisper-batch", 2, 2), deployment("whisper-frontend", 2, 2)])
    assert conditions(st)["Ready"] == ("True", "Ready")
    assert conditions(st)["Progressing"] == ("False", "Complete")
    pool = st.pools[0]
    assert (pool.name, pool.replicas, pool.ready_replicas, pool.automatic) == ("batch", 2, 2, False)
    assert [c.value for c in pool.capabilities] == [
        "language_detection", "segment_timestamps", "stream", "transcriptions", "translations",
    ]  # fmt: skip


def test_partially_ready_is_serving_but_rolling_out(vllm_td: TranscriptionDeployment) -> None:
    st = run(vllm_td, [deployment("whisper-batch", 2, 1), deployment("whisper-frontend", 2, 2)])
    assert conditions(st)["Ready"] == ("False", "RollingOut")


def test_a_controller_that_has_not_seen_the_new_template_is_not_done(
    vllm_td: TranscriptionDeployment,
) -> None:
    st = run(
        vllm_td,
        [
            deployment("whisper-batch", 2, 2, generation=2, observed=1),
            deployment("whisper-frontend", 2, 2),
        ],
    )
    assert conditions(st)["Progressing"][0] == "True"


def test_steady_state_gives_an_identical_status(vllm_td: TranscriptionDeployment) -> None:
    deps = [deployment("whisper-batch", 2, 2), deployment("whisper-frontend", 2, 2)]
    first = run(vllm_td, deps, now=T0)
    second = run(with_status(vllm_td, first), deps, now=T1)
    assert status_body(first) == status_body(second)


def test_transition_time_moves_only_when_a_condition_changes(
    vllm_td: TranscriptionDeployment,
) -> None:
    first = run(vllm_td, [], now=T0)
    second = run(
        with_status(vllm_td, first),
        [deployment("whisper-batch", 2, 2), deployment("whisper-frontend", 2, 2)],
        now=T1,
    )
    times = {c.type: c.last_transition_time for c in second.conditions}
    assert times["Ready"] == T1  # False -> True
    assert times["Degraded"] == T0  # unchanged


def test_split_is_reported() -> None:
    # transformers serve has no translations route: faster-whisper is added for them.
    td = make_td({"model": {"name": "m"}, "engine": "transformers",
                  "traffic": {"endpoints": ["transcriptions", "translations"]}})  # fmt: skip
    st = run(td, [])
    assert conditions(st)["AutoSplit"] == ("True", "SequentialPoolAdded")
    msg = next(c.message for c in st.conditions if c.type == "AutoSplit")
    assert msg == "added pool auto-faster-whisper (faster-whisper, sequential) for translations"
    auto = st.pools[1]
    assert auto.automatic
    assert auto.reason == "added for traffic needing translations"


def test_uncovered_traffic_is_degraded_with_the_missing_capability() -> None:
    td = make_td({"model": {"name": "m"}, "engine": "transformers", "autoSplit": {"enabled": False},
                  "traffic": {"endpoints": ["transcriptions", "translations"]}})  # fmt: skip
    st = run(td, [deployment("whisper-default", 1, 1), deployment("whisper-frontend", 2, 2)])
    c = {c.type: c for c in st.conditions}
    assert (c["Degraded"].status.value, c["Degraded"].reason) == ("True", "TrafficNotCovered")
    assert c["Stalled"].status.value == "True"
    assert c["Ready"].status.value == "False"
    assert c["Degraded"].message == (
        "no pool can serve translations: missing translations in every pool; add a pool whose "
        "engine serves it or enable autoSplit"
    )


@pytest.mark.parametrize(
    ("family", "endpoint"),
    [("whisper", "chat"), ("audio-lm", "transcriptions")],
)
def test_traffic_no_engine_serves_for_the_model_family_is_degraded(
    family: str, endpoint: str
) -> None:
    """transformers serve: Whisper cannot chat; an audio LM cannot use the transcription
    endpoint (a bare 500 in both modes). No split can help: the message says so."""
    td = make_td({"model": {"name": "m", "family": family}, "engine": "transformers",
                  "traffic": {"endpoints": ["chat", "transcriptions"]}})  # fmt: skip
    st = run(td, [deployment("whisper-default", 1, 1), deployment("whisper-frontend", 2, 2)])
    c = {c.type: c for c in st.conditions}
    assert (c["Degraded"].status.value, c["Degraded"].reason) == ("True", "TrafficNotCovered")
    assert c["Degraded"].message == (
        f"no pool can serve {endpoint}: missing {endpoint} in every pool, and no engine serves "
        f"it for model family {family}"
    )
    assert conditions(st)["AutoSplit"] == ("False", "NotNeeded")


def test_problems_found_by_the_reconciler_are_degraded(vllm_td: TranscriptionDeployment) -> None:
    st = run(
        vllm_td,
        [],
        problems=[("SecretNotFound", "frontend.apiKeySecret: Secret speech/keys does not exist")],
    )
    assert conditions(st)["Degraded"] == ("True", "SecretNotFound")
    assert conditions(st)["Progressing"] == ("False", "Failed")


def test_invalid_spec_status_is_stable_across_reconciles() -> None:
    """Otherwise each status write would trigger a reconcile that writes again."""
    from transcription_operator.status import invalid_spec_status

    body: dict[str, Any] = {"metadata": {"generation": 2}, "spec": {"model": {}}}
    first = status_body(
        invalid_spec_status(body, "InvalidSpec", "invalid spec: model.name: Field required", T0)
    )
    second = status_body(
        invalid_spec_status(
            body | {"status": first}, "InvalidSpec", "invalid spec: model.name: Field required", T1
        )
    )
    assert first == second
    conds = {c["type"]: (c["status"], c["reason"]) for c in first["conditions"]}
    assert conds == {
        "Ready": ("False", "InvalidSpec"),
        "Degraded": ("True", "InvalidSpec"),
        "Stalled": ("True", "InvalidSpec"),
    }
    assert first["observedGeneration"] == 2
