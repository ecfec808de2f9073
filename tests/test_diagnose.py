"""Why replicas are not ready: the summariser on pods and Events as the cluster writes them."""

from __future__ import annotations

import copy
import json
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from transcription_operator.cache import slim_pod
from transcription_operator.diagnose import (
    duration,
    is_failing,
    parse_time,
    pod_problem,
    progress_deadline_exceeded,
    summarise,
)

FIXTURES = Path(__file__).parent / "fixtures" / "pods"
NOW = parse_time("2026-11-30T10:07:30Z")


def case(name: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    doc = json.loads((FIXTURES / f"{name}.json").read_text())
    return doc["pod"], doc["events"]


IMG = "registry.invalid/transcription/worker-vllm:0.1.0"
PULL = (
    f'container engine cannot pull image "{IMG}": failed to pull and unpack image "{IMG}": '
    f'failed to resolve reference "{IMG}": failed to do request: Head '
    '"https://registry.invalid/v2/transcription/worker-vllm/manifests/0.1.0": dial tcp: '
    "lookup registry.invalid: no such host"
)
EXPECTED = {
    "unschedulable": (
        "Unschedulable",
        "0/3 nodes are available: 1 node(s) didn't match Pod's node affinity/selector, 2 "
        "Insufficient nvidia.com/gpu. preemption: 0/3 nodes are available: 1 Preemption is not "
        "helpful for scheduling, 2 No preemption victims found for incoming pod.",
    ),
    # The first failure and the back-off that wraps it read the same: a steady status.
    "err-image-pull": ("ImagePullBackOff", PULL),
    "image-pull-backoff": ("ImagePullBackOff", PULL),
    "crash-loop": (
        "CrashLoopBackOff",
        "container engine keeps exiting (exit code 2): error: model directory "
        "/weights/whisper-large-v3 has no config.json: check spec.model.path (and, for source "
        "'pvc', that the claim holds the weights)",
    ),
    "oom-killed": (
        "OOMKilled",
        "container engine was killed for using more memory than its limit (2Gi); "
        "raise resources.memory",
    ),
    "startup-probe": (
        "StartupProbeFailing",
        "container engine has not passed its startup probe for 7m (the engine may still be "
        "loading the model; the probe allows 30m): Startup probe failed: Get "
        '"http://10.244.1.17:8000/health": dial tcp 10.244.1.17:8000: connect: connection refused',
    ),
    "readiness-probe": (
        "ReadinessProbeFailing",
        "container engine is not ready: Readiness probe failed: HTTP probe failed with "
        "statuscode: 503",
    ),
    "failed-mount": (
        "FailedMount",
        'MountVolume.SetUp failed for volume "weights" : configmap "whisper-weights" not found',
    ),
    "config-error": (
        "CreateContainerConfigError",
        "container engine: couldn't find key token in Secret speech/hf-token",
    ),
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_each_reason_in_the_clusters_words(name: str) -> None:
    pod, events = case(name)
    problem = pod_problem(pod, events, NOW)
    assert problem is not None
    assert (problem.reason, problem.message) == EXPECTED[name]


def test_a_ready_pod_has_no_problem() -> None:
    pod, events = case("ready")
    assert pod_problem(pod, events, NOW) is None


def test_terminating_and_finished_pods_are_ignored() -> None:
    pod, events = case("crash-loop")
    pod["metadata"]["deletionTimestamp"] = "2026-11-30T10:05:00Z"
    assert pod_problem(pod, events, NOW) is None
    pod, events = case("crash-loop")
    pod["status"]["phase"] = "Failed"
    assert pod_problem(pod, events, NOW) is None


def test_a_container_that_just_started_is_not_a_problem_before_its_first_probe_fails() -> None:
    pod, _ = case("startup-probe")
    assert pod_problem(pod, [], NOW) is None


def test_elapsed_time_moves_in_whole_minutes() -> None:
    pod, events = case("startup-probe")
    at = {t: pod_problem(pod, events, parse_time(t)) for t in
          ("2026-11-30T10:00:50Z", "2026-11-30T10:07:05Z", "2026-11-30T10:07:59Z", "2026-11-30T11:10:05Z")}  # fmt: skip
    fors = [p.message.split(" for ")[1].split(" ")[0] for p in at.values() if p]
    assert fors == ["<1m", "7m", "7m", "1h10m"]
    assert duration(59) == "<1m" and duration(3600) == "1h00m"


def test_a_long_traceback_keeps_its_last_lines() -> None:
    pod, events = case("crash-loop")
    trace = "\n".join(f'  File "/app/x.py", line {i}, in f' for i in range(200))
    trace += "\nValueError: Total number of attention heads (20) must be divisible by tensor parallel size (3).\n"
    pod["status"]["containerStatuses"][0]["lastState"]["terminated"]["message"] = trace
    problem = pod_problem(pod, events, NOW)
    assert problem is not None
    assert problem.message.endswith(
        "ValueError: Total number of attention heads (20) must be divisible by tensor parallel size (3)."
    )
    assert len(problem.message) < 520


def named(pod: dict[str, Any], name: str, uid: str) -> dict[str, Any]:
    out = copy.deepcopy(pod)
    out["metadata"] |= {"name": name, "uid": uid}
    return out


def test_the_dominant_reason_failures_first_then_the_most_frequent() -> None:
    loading, loading_events = case("startup-probe")
    crash, crash_events = case("crash-loop")
    ready, _ = case("ready")
    pods = [
        named(loading, "w-a", "u1"), named(loading, "w-b", "u2"), named(ready, "w-c", "u3"),
        named(crash, "w-d", "u4"),
    ]  # fmt: skip
    events = {"u1": loading_events, "u2": loading_events, "u4": crash_events}
    nr = summarise(None, pods, events, NOW)
    assert nr is not None
    # One crash-looping pod outweighs two that are still loading.
    assert (nr.reason, nr.pods) == ("CrashLoopBackOff", 1)
    nr = summarise(None, pods[:3], events, NOW)
    assert nr is not None
    assert (nr.reason, nr.pods) == ("StartupProbeFailing", 2)
    assert summarise(None, [pods[2]], events, NOW) is None


def test_the_first_message_is_the_first_pod_by_name() -> None:
    pod, _ = case("unschedulable")
    a = named(pod, "w-b", "u1")
    b = named(pod, "w-a", "u2")
    b["status"]["conditions"][0]["message"] = "0/3 nodes are available: 3 Insufficient cpu."
    nr = summarise(None, [a, b], {}, NOW)
    assert nr is not None
    assert (nr.reason, nr.pods, nr.message) == (
        "Unschedulable", 2, "0/3 nodes are available: 3 Insufficient cpu.",
    )  # fmt: skip


def test_pods_the_replicaset_could_not_create() -> None:
    dep = {"status": {"conditions": [
        {"type": "Progressing", "status": "True", "reason": "ReplicaSetUpdated"},
        {"type": "ReplicaFailure", "status": "True", "reason": "FailedCreate",
         "message": 'pods "whisper-batch-5f7b9d8c6-abcde" is forbidden: exceeded quota: gpus, requested: requests.nvidia.com/gpu=1, used: requests.nvidia.com/gpu=4, limited: requests.nvidia.com/gpu=4'},
    ]}}  # fmt: skip
    nr = summarise(dep, [], {}, NOW)
    assert nr is not None
    assert (nr.reason, nr.pods) == ("FailedCreate", 0)
    assert "exceeded quota: gpus" in nr.message


def test_progress_deadline() -> None:
    stuck = {"status": {"conditions": [{"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded"}]}}  # fmt: skip
    moving = {"status": {"conditions": [{"type": "Progressing", "status": "True", "reason": "ReplicaSetUpdated"}]}}  # fmt: skip
    assert progress_deadline_exceeded(stuck)
    assert not progress_deadline_exceeded(moving)
    assert not progress_deadline_exceeded(None)


def test_events_of_the_new_api_series_shape_are_read() -> None:
    """events.k8s.io-style recorders keep the latest time in series.lastObservedTime."""
    pod, events = case("readiness-probe")
    old = copy.deepcopy(events[0]) | {"message": "Readiness probe failed: old", "lastTimestamp": None,
                                      "series": {"count": 2, "lastObservedTime": "2026-11-30T10:01:00.000000Z"}}  # fmt: skip
    new = copy.deepcopy(events[0]) | {"lastTimestamp": None,
                                      "series": {"count": 9, "lastObservedTime": "2026-11-30T10:09:00.000000Z"}}  # fmt: skip
    problem = pod_problem(pod, [new, old], NOW)
    assert problem is not None and problem.message.endswith("statuscode: 503")


def test_times_parse_with_and_without_fractions() -> None:
    assert parse_time("2026-11-30T10:00:00Z") == datetime.fromisoformat("2026-11-30T10:00:00+00:00")


def test_old_warnings_do_not_explain_a_container_that_is_starting_again() -> None:
    """After a crash the container runs again; the earlier BackOff Event is history."""
    pod, _ = case("startup-probe")
    _, crash_events = case("crash-loop")
    assert pod_problem(pod, crash_events, NOW) is None


def test_the_schedulers_event_before_its_condition_reads_the_same() -> None:
    """The watch can deliver the FailedScheduling Event before the pod's condition."""
    pod, events = case("unschedulable")
    without_condition = copy.deepcopy(pod)
    without_condition["status"].pop("conditions")
    early = pod_problem(without_condition, events, NOW)
    assert early == pod_problem(pod, events, NOW)
    assert pod_problem(without_condition, [], NOW) is None  # not tried yet
    # Once scheduled, an old FailedScheduling Event explains nothing.
    placed, _ = case("failed-mount")
    assert pod_problem(placed, events, NOW) is None


def test_the_frontends_own_event_says_why_its_readiness_probe_fails() -> None:
    """The probe says only "statuscode: 503"; the frontend's APIKeysUnavailable Warning
    Event (transcription_frontend/events.py) about the same pod names the cause, and it is
    a failure: waiting will not fix an empty key file."""
    from datetime import UTC

    from transcription_frontend.events import KEYS_UNAVAILABLE, event_body

    pod, events = case("readiness-probe")
    meta = pod["metadata"]
    why = "the API key file /etc/transcription/api-keys/keys has no key: the gateway is not ready"
    own = event_body(KEYS_UNAVAILABLE, why, meta["name"], meta["namespace"], meta["uid"],
                     datetime(2026, 11, 30, 10, 6, tzinfo=UTC))  # fmt: skip
    own["metadata"]["name"] = meta["name"] + ".keys"
    problem = pod_problem(pod, [*events, own], NOW)
    assert problem is not None
    assert problem.reason == "APIKeysUnavailable" and why in problem.message, problem
    assert is_failing(problem.reason)
    assert own["involvedObject"] == {"apiVersion": "v1", "kind": "Pod", "name": meta["name"],
                                     "namespace": meta["namespace"], "uid": meta["uid"]}  # fmt: skip
    assert own["type"] == "Warning"  # the operator's watch selects Warning Events of pods


def test_an_image_volume_that_cannot_be_pulled_is_named_not_the_containers_image() -> None:
    """Weights from an OCI image (source oci): the kubelet reports the volume's failed pull on
    the container that mounts it; status names the volume's image (seen on the real node)."""
    pod, _ = case("image-pull-backoff")
    weights = "registry.invalid/weights/tiny@sha256:" + "0" * 64
    pod["spec"].setdefault("volumes", []).append(
        {"name": "weights", "image": {"reference": weights}}
    )
    [cs] = pod["status"]["containerStatuses"]
    cs["state"] = {
        "waiting": {
            "reason": "ImagePullBackOff",
            "message": (
                f'Back-off pulling image "{pod["spec"]["containers"][0]["image"]}": ErrImagePull: '
                f'failed to pull and unpack image "{weights}": failed to resolve image: no such host'
            ),
        }
    }  # fmt: skip (as the kubelet says it: the back-off names the container's image)
    pod["spec"]["volumes"].append({"name": "scratch", "emptyDir": {}})
    problem = pod_problem(slim_pod(pod), [], NOW)  # as the operator's watch cache keeps it
    assert problem is not None and problem.reason == "ImagePullBackOff"
    assert problem.message.startswith(
        f'container engine cannot pull image "{weights}" of its volume weights: failed to pull'
    ), problem.message
