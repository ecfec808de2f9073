"""status(resource, observed): conditions, pools, and no change at steady state."""

from __future__ import annotations

from typing import Any

import pytest

from testkit.operator import CFG, T0, T1, conditions, deployment, run
from testkit.resources import make_td
from transcription_api.v1alpha1 import TranscriptionDeployment, TranscriptionDeploymentStatus
from transcription_operator.plan import plan
from transcription_operator.status import Observed, compute_status, status_body, status_changes


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
    assert msg == "waiting for pool batch 0/2 ready; frontend 0/2 ready"


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
    assert conditions(st)["Ready"] == ("True", "RollingOut")
    assert conditions(st)["Progressing"] == ("True", "RollingOut")
    assert cond(st, "Ready")[2] == (
        "serving every declared kind of request; waiting for pool batch 1/2 ready"
    )


def test_a_rollout_stuck_behind_old_replicas_is_ready_then_degraded_after_its_deadline(
    vllm_td: TranscriptionDeployment,
) -> None:
    """The surge pod cannot be scheduled (a full node): the old replicas keep serving, so
    Ready stays True; Progressing says why, in the scheduler's words; past the
    Deployment's progressDeadlineSeconds, Degraded with ProgressDeadlineExceeded."""
    rolling = deployment("whisper-batch", 2, 2, updated=1, total=3)
    rolling["spec"]["progressDeadlineSeconds"] = 60
    fe = deployment("whisper-frontend", 2, 2)
    st = observe(vllm_td, [rolling, fe], pods_of("unschedulable", "batch", 1))
    waiting = (
        "waiting for pool batch 0/2 ready on the new spec, 2 old replicas serving, "
        f"1 pod Unschedulable: {GPU_MESSAGE}"
    )
    assert cond(st, "Ready") == (
        "True", "RollingOut", f"serving every declared kind of request; {waiting}"
    )  # fmt: skip
    assert cond(st, "Progressing") == ("True", "Unschedulable", waiting)
    assert cond(st, "Reconciling") == ("True", "Unschedulable", waiting)
    assert cond(st, "Degraded")[:2] == ("False", "AsExpected")

    rolling["status"]["conditions"] = [{"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded"}]  # fmt: skip
    st = observe(vllm_td, [rolling, fe], pods_of("unschedulable", "batch", 1))
    failed = (
        "rollout stuck past its progressDeadlineSeconds (60s): pool batch 0/2 ready on the "
        f"new spec, 2 old replicas serving, 1 pod Unschedulable: {GPU_MESSAGE}"
    )
    assert cond(st, "Degraded") == ("True", "ProgressDeadlineExceeded", failed)
    assert cond(st, "Stalled") == ("True", "ProgressDeadlineExceeded", failed)
    assert cond(st, "Progressing") == ("False", "ProgressDeadlineExceeded", failed)
    assert cond(st, "Ready") == (
        "True", "ProgressDeadlineExceeded", f"serving every declared kind of request; {failed}"
    )  # fmt: skip

    # The same with nothing serving: not Ready.
    st = observe(vllm_td, [rolling, deployment("whisper-frontend", 2, 0)], pods_of("unschedulable", "batch", 1))  # fmt: skip
    assert cond(st, "Ready")[:2] == ("False", "ProgressDeadlineExceeded")


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
    assert msg == (
        "added pool auto-faster-whisper (faster-whisper, sequential) for translations: "
        "1 replica, each requesting no GPU, CPU or memory"
    )
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
    [("whisper", "chat"), ("audio-lm", "translations")],
)
def test_traffic_no_engine_serves_for_the_model_family_is_degraded(
    family: str, endpoint: str
) -> None:
    """transformers serve: Whisper cannot chat; an audio LM transcribes (through chat) but
    does not translate. No split can help: the message says so."""
    td = make_td({"model": {"name": "m", "family": family}, "engine": "transformers",
                  "traffic": {"endpoints": list(dict.fromkeys(["chat", "transcriptions", endpoint]))}})  # fmt: skip
    st = run(td, [deployment("whisper-default", 1, 1), deployment("whisper-frontend", 2, 2)])
    c = {c.type: c for c in st.conditions}
    assert (c["Degraded"].status.value, c["Degraded"].reason) == ("True", "TrafficNotCovered")
    assert c["Degraded"].message == (
        f"no pool can serve {endpoint}: missing {endpoint} in every pool, and no engine serves "
        f"it for model family {family}"
    )
    assert conditions(st)["AutoSplit"] == ("False", "NoEngineCovers")


def test_problems_found_by_the_reconciler_are_degraded(vllm_td: TranscriptionDeployment) -> None:
    st = run(
        vllm_td,
        [],
        problems=[("SecretNotFound", "frontend.apiKeySecret: Secret speech/keys does not exist")],
    )
    assert conditions(st)["Degraded"] == ("True", "SecretNotFound")
    assert conditions(st)["Progressing"] == ("False", "SecretNotFound")
    assert conditions(st)["Ready"] == ("False", "SecretNotFound")


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


# --------------------------------------------------------------------------- not ready: why

import copy  # noqa: E402
import itertools  # noqa: E402
import json  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

from transcription_operator.status import status_events  # noqa: E402

PODS = Path(__file__).parent / "fixtures" / "pods"
NOW = "2026-11-30T10:07:30Z"


def pods_of(case: str, pool: str, n: int) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """n copies of a fixture pod in `pool`, and their Events by pod UID."""
    doc = json.loads((PODS / f"{case}.json").read_text())
    pods, events = [], {}
    for i in range(n):
        pod = copy.deepcopy(doc["pod"])
        pod["metadata"]["name"] = f"whisper-{pool}-5f7b9d8c6-{i:05d}"
        pod["metadata"]["uid"] = f"{pool}-{case}-{i}"
        pod["metadata"]["labels"]["transcription.dev/pool"] = pool
        pods.append(pod)
        events[pod["metadata"]["uid"]] = doc["events"]
    return pods, events


def observe(
    td: TranscriptionDeployment,
    deps: list[dict[str, Any]],
    pods: tuple[list[dict[str, Any]], dict[str, Any]] = ([], {}),
    now: str = NOW,
) -> TranscriptionDeploymentStatus:
    observed = Observed(
        deployments={d["metadata"]["name"]: d for d in deps}, pods=pods[0], events=pods[1]
    )
    return compute_status(td, plan(td.spec), observed, CFG, now)


def cond(st: TranscriptionDeploymentStatus, type_: str) -> tuple[str, str, str]:
    c = next(c for c in st.conditions if c.type == type_)
    return c.status.value, c.reason, c.message


GPU_MESSAGE = (
    "0/3 nodes are available: 1 node(s) didn't match Pod's node affinity/selector, 2 "
    "Insufficient nvidia.com/gpu. preemption: 0/3 nodes are available: 1 Preemption is not "
    "helpful for scheduling, 2 No preemption victims found for incoming pod."
)


def test_unschedulable_pool_says_what_the_scheduler_said(vllm_td: TranscriptionDeployment) -> None:
    st = observe(
        vllm_td,
        [deployment("whisper-batch", 2, 0), deployment("whisper-frontend", 2, 2)],
        pods_of("unschedulable", "batch", 2),
    )
    expected = f"waiting for pool batch 0/2 ready, 2 pods Unschedulable: {GPU_MESSAGE}"
    assert cond(st, "Ready") == ("False", "Unschedulable", expected)
    # Capacity may still come (an autoscaler): progressing, not failed -- until the
    # Deployment's own progress deadline passes.
    assert cond(st, "Progressing") == ("True", "Unschedulable", expected)
    assert cond(st, "Degraded")[0] == "False"
    nr = st.pools[0].not_ready
    assert nr is not None and (nr.reason, nr.pods, nr.message) == ("Unschedulable", 2, GPU_MESSAGE)

    stuck = deployment("whisper-batch", 2, 0)
    stuck["status"]["conditions"] = [{"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded"}]  # fmt: skip
    st = observe(
        vllm_td, [stuck, deployment("whisper-frontend", 2, 2)], pods_of("unschedulable", "batch", 2)
    )
    assert cond(st, "Degraded")[:2] == ("True", "ProgressDeadlineExceeded")
    assert cond(st, "Degraded")[2] == f"rollout stuck past its deadline: pool batch 0/2 ready, 2 pods Unschedulable: {GPU_MESSAGE}"  # fmt: skip
    assert cond(st, "Ready")[:2] == ("False", "ProgressDeadlineExceeded")


@pytest.mark.parametrize(
    ("case", "reason", "failing"),
    [
        ("image-pull-backoff", "ImagePullBackOff", True),
        ("err-image-pull", "ImagePullBackOff", True),
        ("crash-loop", "CrashLoopBackOff", True),
        ("oom-killed", "OOMKilled", True),
        ("config-error", "CreateContainerConfigError", True),
        ("startup-probe", "StartupProbeFailing", False),
        ("readiness-probe", "ReadinessProbeFailing", False),
        ("failed-mount", "FailedMount", False),
    ],
)
def test_each_pod_reason_reaches_ready_and_the_pool(
    vllm_td: TranscriptionDeployment, case: str, reason: str, failing: bool
) -> None:
    # Nothing serves: the pods' reason is Ready's.
    st = observe(
        vllm_td,
        [deployment("whisper-batch", 2, 0), deployment("whisper-frontend", 2, 2)],
        pods_of(case, "batch", 1),
    )
    ready = cond(st, "Ready")
    assert ready[:2] == ("False", reason)
    assert ready[2].startswith(("pool batch 0/2 ready, 1 pod " + reason, "waiting for pool batch 0/2 ready, 1 pod " + reason))  # fmt: skip
    assert cond(st, "Degraded")[0] == ("True" if failing else "False")
    assert cond(st, "Progressing")[:2] == ("False" if failing else "True", reason)
    nr = st.pools[0].not_ready
    assert nr is not None and nr.reason == reason and nr.pods == 1
    # One replica of the old spec serves: Ready, and the new pod's reason is the rollout's.
    st = observe(
        vllm_td,
        [deployment("whisper-batch", 2, 1, updated=1), deployment("whisper-frontend", 2, 2)],
        pods_of(case, "batch", 1),
    )
    assert cond(st, "Ready")[:2] == ("True", reason if failing else "RollingOut")
    assert cond(st, "Progressing")[:2] == ("False" if failing else "True", reason)
    assert "pool batch 0/2 ready on the new spec, 1 old replica serving, 1 pod " + reason in cond(st, "Ready")[2]  # fmt: skip


def test_the_frontend_says_why_too(vllm_td: TranscriptionDeployment) -> None:
    pods, events = pods_of("image-pull-backoff", "x", 2)
    for p in pods:
        p["metadata"]["labels"]["app.kubernetes.io/component"] = "frontend"
        del p["metadata"]["labels"]["transcription.dev/pool"]
    st = observe(vllm_td, [deployment("whisper-batch", 2, 2), deployment("whisper-frontend", 2, 0)], (pods, events))  # fmt: skip
    assert cond(st, "Degraded")[:2] == ("True", "ImagePullBackOff")
    assert cond(st, "Ready")[2].startswith("frontend 0/2 ready, 2 pods ImagePullBackOff: container engine cannot pull image")  # fmt: skip
    assert st.frontend is not None and st.frontend.not_ready is not None
    assert st.pools[0].not_ready is None


def test_a_ready_pool_reports_no_reason(vllm_td: TranscriptionDeployment) -> None:
    st = observe(
        vllm_td,
        [deployment("whisper-batch", 2, 2), deployment("whisper-frontend", 2, 2)],
        pods_of("ready", "batch", 2),
    )
    assert cond(st, "Ready")[0] == "True"
    assert st.pools[0].not_ready is None
    assert st.worker_replicas == "2/2"


# --------------------------------------------------------------------------- capacity


def test_no_replicas_is_not_ready_with_no_capacity() -> None:
    td = make_td({"model": {"name": "m"}, "pools": [{"name": "default", "replicas": 0}], "frontend": {"replicas": 1}})  # fmt: skip
    st = observe(td, [deployment("whisper-default", 0, 0), deployment("whisper-frontend", 1, 1)])
    assert cond(st, "Ready") == (
        "False", "NoCapacity",
        "no replica can serve transcriptions: pool default has 0 replicas; scale up spec.pools[].replicas",
    )  # fmt: skip
    assert cond(st, "Degraded")[:2] == ("True", "NoCapacity")
    assert cond(st, "Stalled")[:2] == ("True", "NoCapacity")
    assert st.ready_pools == "1/1"  # the pool is as declared...
    assert st.worker_replicas == "0/0"  # ...and serves nothing


def test_no_capacity_names_the_feature_and_the_added_pool() -> None:
    td = make_td({"model": {"name": "m"}, "traffic": {"features": ["word_timestamps"]},
                  "autoSplit": {"replicas": 0}, "frontend": {"replicas": 1}})  # fmt: skip
    st = observe(td, [deployment("whisper-default", 1, 1), deployment("whisper-auto-faster-whisper", 0, 0), deployment("whisper-frontend", 1, 1)])  # fmt: skip
    assert cond(st, "Ready")[1:] == (
        "NoCapacity",
        "no replica can serve transcriptions with word_timestamps: pool auto-faster-whisper has 0 replicas; scale up spec.autoSplit.replicas",
    )  # fmt: skip


def test_a_frontend_with_no_replicas_serves_nothing(vllm_td: TranscriptionDeployment) -> None:
    body = vllm_td.model_dump(by_alias=True, exclude_none=True, mode="json")
    body["spec"]["frontend"]["replicas"] = 0
    td = TranscriptionDeployment.model_validate(body)
    st = observe(td, [deployment("whisper-batch", 2, 2), deployment("whisper-frontend", 0, 0)])
    assert cond(st, "Ready")[1:] == ("NoCapacity", "spec.frontend.replicas is 0: nothing receives requests; scale it up")  # fmt: skip


# --------------------------------------------------------------------------- findings


def test_spec_findings_are_degraded_as_the_admission_policy_warns() -> None:
    td = make_td({"model": {"name": "openai/whisper-small.en"},
                  "traffic": {"endpoints": ["transcriptions", "translations"]},
                  "pools": [{"name": "tp", "resources": {"gpus": 8}}], "frontend": {"replicas": 1}})  # fmt: skip
    st = observe(td, [deployment("whisper-tp", 1, 1), deployment("whisper-frontend", 1, 1)])
    degraded = cond(st, "Degraded")
    assert degraded[:2] == ("True", "GPUsDoNotDivideHeads")
    assert degraded[2] == (
        "pool tp: resources.gpus=8 does not divide the 12 attention heads of Whisper small "
        "(openai/whisper-small.en), so vLLM cannot split the model across them (tensor "
        "parallelism): use 1, 2, 3, 4, 6, 12 GPUs; "
        "spec.traffic.endpoints declares translations, but openai/whisper-small.en is an "
        "English-only Whisper model (.en), which cannot translate: use a multilingual model "
        "(the name without .en) or remove translations"
    )


# --------------------------------------------------------------------------- the split


def test_auto_split_disabled_says_disabled_not_not_needed() -> None:
    td = make_td({"model": {"name": "m"}, "traffic": {"endpoints": ["translations"]},
                  "engine": "transformers", "autoSplit": {"enabled": False}})  # fmt: skip
    st = observe(td, [deployment("whisper-default", 1, 1), deployment("whisper-frontend", 2, 2)])
    assert cond(st, "AutoSplit") == (
        "False", "Disabled",
        "spec.autoSplit.enabled is false; no declared pool serves translations (see Degraded)",
    )  # fmt: skip
    td = make_td({"model": {"name": "m"}, "autoSplit": {"enabled": False}})
    assert cond(observe(td, []), "AutoSplit") == ("False", "Disabled", "spec.autoSplit.enabled is false")  # fmt: skip


def test_the_added_pool_says_what_it_requests() -> None:
    td = make_td({
        "model": {"name": "openai/whisper-large-v3"},
        "pools": [{"name": "batch", "replicas": 2, "resources": {"gpus": 4, "cpu": "8", "memory": "48Gi"}}],
        "traffic": {"features": ["word_timestamps"]},
    })  # fmt: skip
    st = observe(td, [])
    assert cond(st, "AutoSplit")[2] == (
        "added pool auto-faster-whisper (faster-whisper, sequential) for transcriptions, "
        "word_timestamps: 1 replica, each requesting 1 nvidia.com/gpu, 8 CPU, 48Gi memory"
    )
    auto = st.pools[1]
    assert (auto.resources.gpus, auto.resources.cpu, auto.resources.memory) == (1, "8", "48Gi")
    assert st.pools[0].resources.gpus == 4


# --------------------------------------------------------------------------- events


def test_events_on_reason_changes_only(vllm_td: TranscriptionDeployment) -> None:
    deps = [deployment("whisper-batch", 2, 0), deployment("whisper-frontend", 2, 2)]
    first = status_body(observe(vllm_td, deps))
    unsched = status_body(observe(vllm_td, deps, pods_of("unschedulable", "batch", 2)))
    assert status_events(first, unsched) == [
        ("Warning", "Unschedulable", f"pool batch: 2 pods Unschedulable: {GPU_MESSAGE}")
    ]
    assert status_events(unsched, unsched) == []
    loading = status_body(observe(vllm_td, deps, pods_of("startup-probe", "batch", 2)))
    later = status_body(observe(vllm_td, deps, pods_of("startup-probe", "batch", 2), now="2026-11-30T10:09:30Z"))  # fmt: skip
    assert [e[:2] for e in status_events(unsched, loading)] == [("Normal", "StartupProbeFailing")]
    assert later != loading  # the elapsed time moved...
    assert status_events(loading, later) == []  # ...and no Event for that
    crash = status_body(observe(vllm_td, deps, pods_of("crash-loop", "batch", 2)))
    # One Event for the pool, not a second one for Degraded with the same reason.
    assert [e[:2] for e in status_events(loading, crash)] == [("Warning", "CrashLoopBackOff")]
    ready = status_body(observe(vllm_td, [deployment("whisper-batch", 2, 2), deployment("whisper-frontend", 2, 2)]))  # fmt: skip
    assert [e[:2] for e in status_events(crash, ready)] == [("Normal", "Ready")]


def test_degraded_for_another_reason_posts_its_own_event() -> None:
    up = make_td({"model": {"name": "m"}, "pools": [{"name": "default", "replicas": 1}]})
    before = status_body(observe(up, [deployment("whisper-default", 1, 1), deployment("whisper-frontend", 2, 2)]))  # fmt: skip
    down = make_td({"model": {"name": "m"}, "pools": [{"name": "default", "replicas": 0}]})
    after = status_body(observe(down, [deployment("whisper-default", 0, 0), deployment("whisper-frontend", 2, 2)]))  # fmt: skip
    assert status_events(before, after) == [
        ("Warning", "NoCapacity", "no replica can serve transcriptions: pool default has 0 replicas; scale up spec.pools[].replicas")
    ]  # fmt: skip
    assert status_events(after, after) == []
    assert [e[:2] for e in status_events(after, before)] == [("Normal", "Ready")]


def test_the_split_event_says_what_the_pool_costs() -> None:
    td = make_td({"model": {"name": "m"}, "pools": [{"name": "b", "resources": {"gpus": 2}}],
                  "traffic": {"features": ["word_timestamps"]}})  # fmt: skip
    events = status_events({}, status_body(observe(td, [])))
    assert events == [(
        "Normal", "SequentialPoolAdded",
        "added pool auto-faster-whisper (faster-whisper, sequential) for transcriptions, "
        "word_timestamps: 1 replica, each requesting 1 nvidia.com/gpu",
    )]  # fmt: skip


# --------------------------------------------------------------------------- consistency


POOL_STATES = ["ready", "loading", "failing", "absent", "rolling", "stuck"]


def _table_case(split: bool, covered: bool, pools: str) -> TranscriptionDeploymentStatus:
    """`pools`: all ready; loading or crash-looping with none ready; not created; rolling
    out (2 old replicas serve, the new one loads); stuck (the same, past the deadline)."""
    spec: dict[str, Any] = {
        "model": {"name": "m"},
        "pools": [{"name": "batch", "replicas": 2, "resources": {"gpus": 1}}],
        "autoSplit": {"enabled": split},
        "frontend": {"replicas": 1},
    }
    if not covered:  # vLLM has no word timestamps: the split covers them, if enabled
        spec["traffic"] = {"features": ["word_timestamps"]}
    td = make_td(spec)
    names = [f"whisper-{p.name}" for p in plan(td.spec).pools]
    ready = {"ready": 2, "loading": 0, "failing": 0, "absent": 0, "rolling": 2, "stuck": 2}[pools]
    deps = [] if pools == "absent" else [deployment(n, 2 if "batch" in n else 1, ready if "batch" in n else (1 if ready else 0)) for n in names]  # fmt: skip
    if pools in ("rolling", "stuck"):
        deps[0] = deployment(names[0], 2, 2, updated=1, total=3)
        if pools == "stuck":
            deps[0]["status"]["conditions"] = [{"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded"}]  # fmt: skip
    deps.append(deployment("whisper-frontend", 1, 1))
    pods: tuple[list[dict[str, Any]], dict[str, Any]] = ([], {})
    if pools in ("loading", "failing"):
        pods = pods_of("startup-probe" if pools == "loading" else "crash-loop", "batch", 2)
    elif pools in ("rolling", "stuck"):
        pods = pods_of("startup-probe", "batch", 1)
    return observe(td, deps, pods)


@pytest.mark.parametrize(
    ("split", "covered", "pools"),
    list(itertools.product([True, False], [True, False], POOL_STATES)),
)
def test_conditions_never_contradict_each_other(split: bool, covered: bool, pools: str) -> None:
    st = _table_case(split, covered, pools)
    c = {x.type: x for x in st.conditions}
    status = {t: x.status.value == "True" for t, x in c.items()}
    assert set(c) == {"Ready", "Progressing", "Degraded", "Reconciling", "Stalled", "AutoSplit"}
    # The kstatus pair mirrors the Deployment-like pair.
    assert (c["Stalled"].status, c["Stalled"].reason) == (
        c["Degraded"].status,
        c["Degraded"].reason,
    )
    assert (c["Reconciling"].status, c["Reconciling"].reason) == (
        c["Progressing"].status,
        c["Progressing"].reason,
    )
    # Exactly one of done, progressing, failed.
    done = status["Ready"] and not status["Progressing"] and not status["Degraded"]
    assert [done, status["Progressing"], status["Degraded"]].count(True) == 1
    if status["Degraded"]:
        assert c["Ready"].reason == c["Degraded"].reason == c["Progressing"].reason
        assert c["Degraded"].message in c["Ready"].message
    if done:
        assert st.ready_pools == f"{len(st.pools)}/{len(st.pools)}"
        assert all(p.not_ready is None for p in st.pools)
    # The split condition agrees with the spec and with Degraded.
    uncovered = (
        c["Degraded"].reason == "TrafficNotCovered" or "TrafficNotCovered" in c["Ready"].message
    )
    if not split:
        assert (status["AutoSplit"], c["AutoSplit"].reason) == (False, "Disabled")
    elif covered:
        assert (status["AutoSplit"], c["AutoSplit"].reason) == (False, "NotNeeded")
    else:
        assert (status["AutoSplit"], c["AutoSplit"].reason) == (True, "SequentialPoolAdded")
    assert uncovered == (not split and not covered)
    if c["AutoSplit"].reason == "NotNeeded":
        assert not uncovered
    # Ready: whether a request of every declared kind would be served now (old replicas
    # count), whatever the rollout's state.
    assert status["Ready"] == (not uncovered and pools in ("ready", "rolling", "stuck"))
    # What the pods say decides the outcome when nothing else is wrong.
    if not uncovered:
        expected = {"ready": "Ready", "loading": "StartupProbeFailing", "failing": "CrashLoopBackOff", "absent": "NotServing", "rolling": "RollingOut", "stuck": "ProgressDeadlineExceeded"}[pools]  # fmt: skip
        assert c["Ready"].reason == expected
        if pools == "rolling":  # the new replica's reason
            assert c["Progressing"].reason == "StartupProbeFailing"


def test_status_changes_name_the_paths_that_moved() -> None:
    old = {"conditions": [{"type": "Ready", "status": "False", "message": "a"}],
           "pools": [{"name": "cpu", "readyReplicas": 0}], "readyPools": "0/1"}  # fmt: skip
    new = {"conditions": [{"type": "Ready", "status": "False", "message": "b"}],
           "pools": [{"name": "cpu", "readyReplicas": 1}, {"name": "gpu"}], "readyPools": "0/1"}  # fmt: skip
    assert status_changes(old, new) == [
        "conditions[Ready].message", "pools[cpu].readyReplicas", "pools[gpu]",
    ]  # fmt: skip
    assert status_changes(new, new) == []
    assert status_changes({}, {"observedGeneration": 2}) == ["observedGeneration"]


def test_a_frontend_rollout_stuck_behind_its_old_replica_reads_the_same(
    vllm_td: TranscriptionDeployment,
) -> None:
    batch = deployment("whisper-batch", 2, 2)
    fe = deployment("whisper-frontend", 2, 2, updated=1, total=3)
    pods, events = pods_of("unschedulable", "x", 1)
    for p in pods:
        p["metadata"]["labels"]["app.kubernetes.io/component"] = "frontend"
        del p["metadata"]["labels"]["transcription.dev/pool"]
    st = observe(vllm_td, [batch, fe], (pods, events))
    assert conditions(st)["Ready"] == ("True", "RollingOut")
    assert conditions(st)["Progressing"] == ("True", "Unschedulable")
    assert "frontend 0/2 ready on the new spec, 2 old replicas serving" in cond(st, "Ready")[2]
    fe["status"]["conditions"] = [{"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded"}]  # fmt: skip
    st = observe(vllm_td, [batch, fe], (pods, events))
    assert conditions(st)["Degraded"] == ("True", "ProgressDeadlineExceeded")
    assert conditions(st)["Ready"] == ("True", "ProgressDeadlineExceeded")


def _worker_pod(pool: str, ref: str | None, reference: str = "r/tiny:v2") -> dict[str, Any]:
    mounts = [{"name": "tmp", "mountPath": "/tmp"}, {"name": "weights", "mountPath": "/weights"}]
    if ref:
        mounts[1]["volumeStatus"] = {"image": {"imageRef": ref}}
    return {
        "metadata": {"name": f"w-{pool}", "uid": pool, "labels": {
            "app.kubernetes.io/component": "worker", "transcription.dev/pool": pool}},
        "spec": {"volumes": [{"name": "weights", "image": {"reference": reference}}]},
        "status": {"containerStatuses": [{"name": "engine", "volumeMounts": mounts}]},
    }  # fmt: skip


def test_a_tag_that_moved_under_running_pools_is_a_status_naming_both_digests() -> None:
    """Same reference, different digests: replicas serve different weights. A rollout from
    one reference to another (pinned or not) shows two digests and is no problem."""
    old, new = "sha256:" + "1" * 64, "sha256:" + "2" * 64
    td = make_td({"model": {"name": "m", "source": "oci", "image": "r/tiny:v2"},
                  "pools": [{"name": "a"}]})  # fmt: skip
    moved = [_worker_pod("a", f"r/tiny@{old}"), _worker_pod("a", f"r/tiny@{new}")]
    st = observe(td, [], (moved, {}))
    assert conditions(st)["Degraded"] == ("True", "WeightsDigestChanged")
    assert cond(st, "Degraded")[2] == (
        f"worker pods mount r/tiny:v2 as 2 different images ({old}, {new}): the tag moved "
        "under running pools, so replicas serve different weights. Pin spec.model.image by "
        "digest (@sha256:...)"
    )
    rollout = [_worker_pod("a", f"r/tiny@{old}", "r/tiny:v1"), _worker_pod("a", f"r/tiny@{new}")]
    assert conditions(observe(td, [], (rollout, {})))["Degraded"][0] == "False"
    unreported = [_worker_pod("a", None), _worker_pod("a", f"r/tiny@{new}")]
    assert conditions(observe(td, [], (unreported, {})))["Degraded"][0] == "False"


def test_oci_weights_show_the_image_whether_it_is_pinned_and_the_digests_mounted() -> None:
    old, new = "sha256:" + "1" * 64, "sha256:" + "2" * 64
    image = f"registry.example.com/models/tiny:v2@{new}"
    td = make_td({"model": {"name": "m", "source": "oci", "image": image},
                  "pools": [{"name": "a"}, {"name": "b"}]})  # fmt: skip
    ref = "registry.example.com/models/tiny@"
    pods = [_worker_pod("a", ref + old), _worker_pod("b", ref + new), _worker_pod("b", None)]
    st = observe(td, [], (pods, {}))
    assert st.weights is not None
    assert (st.weights.image, st.weights.pinned) == (image, True)
    assert st.weights.digests == [ref + old, ref + new]  # mid-rollout: both
    body = status_body(st)
    assert body["weights"] == {"image": image, "pinned": True, "digests": [ref + old, ref + new]}
    tagged = make_td({"model": {"name": "m", "source": "oci", "image": "tiny:v2"}})
    weights = observe(tagged, []).weights
    assert weights is not None and (weights.pinned, weights.digests) == (False, [])
    assert observe(make_td({"model": {"name": "m"}}), []).weights is None  # hub: none
