"""Why replicas are not ready, in the words the cluster used: a pure function of the pods
(and their Warning Events) the watch cache holds.

Each pod that is not ready gets at most one problem, read from where the component that
knows wrote it:
- the scheduler: the pod's `PodScheduled=False/Unschedulable` condition and its message;
- the kubelet: container `waiting` reasons (ErrImagePull/ImagePullBackOff with the image,
  CrashLoopBackOff with the last termination's exit code and message, OOMKilled,
  CreateContainerConfigError, ...), and its probe Events (`Unhealthy`: "Startup probe
  failed: ...") for a container that runs but has not passed its startup or readiness probe;
- the ReplicaSet controller: a Deployment's `ReplicaFailure` condition (pods it could not
  create: quota, PodSecurity admission);
- the frontend itself, for a readiness probe that fails for a reason of its own: its
  `APIKeysUnavailable` Warning Event (a configured key file without a key).

A pool's summary is its dominant problem: failures (that waiting will not fix) before
waits, then the most frequent, then the first pod by name -- with the pod count and the
first pod's message. Nothing here polls: the reconciler passes what the watches delivered.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from transcription_api.v1alpha1 import NotReady

Obj = Mapping[str, Any]

# Reasons that waiting will not fix: Degraded at once. The others (a pod that cannot be
# scheduled yet, a model still loading) are progress until the Deployment's own progress
# deadline passes.
FAILING = frozenset(
    {
        "CrashLoopBackOff",
        "OOMKilled",
        "ImagePullBackOff",
        "InvalidImageName",
        "ErrImageNeverPull",
        "CreateContainerConfigError",
        "CreateContainerError",
        "RunContainerError",
        "PreCreateHookError",
        "PostStartHookError",
        "FailedCreate",
        "APIKeysUnavailable",  # the frontend's own Event: a key file without a key
    }
)
# Image pull reasons alternate with every retry (ErrImagePull, then ImagePullBackOff while
# the kubelet backs off): one name keeps the status, and the Events, steady.
_PULL = frozenset(
    {"ErrImagePull", "ImagePullBackOff", "RegistryUnavailable", "SignatureValidationFailed"}
)
_NORMAL_WAITING = frozenset({"ContainerCreating", "PodInitializing"})
MAX_MESSAGE = 400


@dataclass(frozen=True)
class Problem:
    reason: str
    message: str


def is_failing(reason: str) -> bool:
    return reason in FAILING


def parse_time(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def duration(seconds: float) -> str:
    """Whole minutes (a status that changes at most once a minute): '<1m', '7m', '1h05m'."""
    minutes = int(seconds // 60)
    if minutes < 1:
        return "<1m"
    if minutes < 60:
        return f"{minutes}m"
    return f"{minutes // 60}h{minutes % 60:02d}m"


def _tail(text: str) -> str:
    """The end of a termination message (with FallbackToLogsOnError, the log's last lines):
    the last lines that fit, most recent last."""
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    out: list[str] = []
    for line in reversed(lines):
        if out and sum(len(x) + 3 for x in out) + len(line) > MAX_MESSAGE:
            break
        out.insert(0, line)
    joined = " / ".join(out)
    return joined if len(joined) <= MAX_MESSAGE else "..." + joined[-MAX_MESSAGE:]


def _condition(obj: Obj, type_: str) -> Obj | None:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c.get("type") == type_:
            return c  # type: ignore[no-any-return]
    return None


def _spec_container(pod: Obj, name: str) -> Obj:
    spec = pod.get("spec") or {}
    for c in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]:
        if c.get("name") == name:
            return c  # type: ignore[no-any-return]
    return {}


def _latest(events: Iterable[Obj], reason: str, prefix: str = "") -> Obj | None:
    """The most recent Event with this reason (and message prefix)."""
    found = [
        e
        for e in events
        if e.get("reason") == reason and str(e.get("message", "")).startswith(prefix)
    ]
    return max(found, key=_event_time, default=None)


def _event_time(e: Obj) -> str:
    series = e.get("series") or {}
    return str(
        series.get("lastObservedTime")
        or e.get("lastTimestamp")
        or e.get("eventTime")
        or e.get("firstTimestamp")
        or ""
    )


def _terminated(container: str, t: Obj, spec: Obj) -> Problem:
    """A container's last termination: OOMKilled, or its exit code and message."""
    if t.get("reason") == "OOMKilled":
        limit = ((spec.get("resources") or {}).get("limits") or {}).get("memory")
        return Problem(
            "OOMKilled",
            f"container {container} was killed for using more memory than its limit"
            + (f" ({limit})" if limit else "")
            + "; raise resources.memory",
        )
    code = t.get("exitCode")
    message = _tail(str(t.get("message") or ""))
    text = f"container {container} keeps exiting (exit code {code}"
    text += f", {t['reason']})" if t.get("reason") not in (None, "Error") else ")"
    return Problem("CrashLoopBackOff", text + (f": {message}" if message else ""))


# Since Kubernetes 1.32 the back-off message wraps the last pull error:
#   Back-off pulling image "x": ErrImagePull: rpc error: code = NotFound desc = failed to ...
_PULL_WRAPPERS = re.compile(
    r'^(Back-off pulling image "[^"]*"(: )?)?([A-Z][A-Za-z]+: )?(rpc error: code = \w+ desc = )?'
)


def _pull(pod: Obj, container: str, image: str, message: str) -> Problem:
    """The image the kubelet cannot pull: the container's, or one of its image volumes' (a
    volume's failed pull is reported on the container that mounts it)."""
    detail = _PULL_WRAPPERS.sub("", message.strip())
    text = f'container {container} cannot pull image "{image}"'
    for volume in (pod.get("spec") or {}).get("volumes") or []:
        ref = str((volume.get("image") or {}).get("reference") or "")
        if ref and f'"{ref}"' in message:  # the back-off wrapper may name the container's
            text = f'container {container} cannot pull image "{ref}" of its volume {volume["name"]}'
    return Problem("ImagePullBackOff", text + (f": {_tail(detail)}" if detail else ""))


def _probe(
    pod: Obj, container: str, events: Sequence[Obj], now: datetime, cs: Obj
) -> Problem | None:
    """A running container whose startup (or readiness) probe has failed and not passed
    since; None while its first probes are still to come."""
    spec = _spec_container(pod, container)
    if cs.get("started") is False and spec.get("startupProbe"):
        event = _latest(events, "Unhealthy", "Startup probe failed")
        if event is None:
            return None
        probe = spec["startupProbe"]
        since = ((cs.get("state") or {}).get("running") or {}).get("startedAt")
        elapsed = duration((now - parse_time(since)).total_seconds()) if since else "?"
        budget = duration(
            int(probe.get("periodSeconds", 10)) * int(probe.get("failureThreshold", 3))
        )
        return Problem(
            "StartupProbeFailing",
            f"container {container} has not passed its startup probe for {elapsed} (the engine "
            f"may still be loading the model; the probe allows {budget}): "
            + _tail(str(event.get("message") or "")),
        )
    event = _latest(events, "Unhealthy", "Readiness probe failed")
    if event is None:
        return None
    # The probe says only its status code; a component that knows why says so in an Event
    # of its own about the pod (the frontend: transcription_frontend/events.py).
    own = _latest(events, "APIKeysUnavailable")
    if own is not None:
        return Problem("APIKeysUnavailable", f"container {container}: "
                       + _tail(str(own.get("message") or "")))  # fmt: skip
    return Problem(
        "ReadinessProbeFailing",
        f"container {container} is not ready: {_tail(str(event.get('message') or ''))}",
    )


def pod_problem(pod: Obj, events: Sequence[Obj], now: datetime) -> Problem | None:
    """Why this pod is not ready, or None (ready, terminating, finished, or just starting)."""
    meta, status = pod.get("metadata") or {}, pod.get("status") or {}
    if meta.get("deletionTimestamp") or status.get("phase") in ("Succeeded", "Failed"):
        return None
    ready = _condition(pod, "Ready")
    if ready and ready.get("status") == "True":
        return None
    scheduled = _condition(pod, "PodScheduled")
    if scheduled and scheduled.get("status") == "False":
        if scheduled.get("reason") == "Unschedulable":
            return Problem("Unschedulable", str(scheduled.get("message") or "").strip())
        return None  # SchedulingGated
    if not (pod.get("spec") or {}).get("nodeName"):
        # The scheduler's Event can arrive before its condition: the same words either way.
        event = _latest(events, "FailedScheduling")
        return Problem("Unschedulable", str(event.get("message") or "").strip()) if event else None
    statuses = [
        *(status.get("initContainerStatuses") or []),
        *(status.get("containerStatuses") or []),
    ]
    for cs in statuses:
        name = str(cs.get("name"))
        spec = _spec_container(pod, name)
        state = cs.get("state") or {}
        last = (cs.get("lastState") or {}).get("terminated")
        waiting = state.get("waiting")
        if waiting:
            reason = str(waiting.get("reason") or "")
            message = str(waiting.get("message") or "")
            if reason in _PULL:
                return _pull(pod, name, str(spec.get("image") or cs.get("image") or ""), message)
            if reason == "CrashLoopBackOff":
                if last:
                    return _terminated(name, last, spec)
                return Problem(reason, f"container {name}: {_tail(message)}")
            if reason and reason not in _NORMAL_WAITING:
                return Problem(reason, f"container {name}: {_tail(message)}".rstrip(": "))
        if state.get("terminated") and state["terminated"].get("reason") == "OOMKilled":
            return _terminated(name, state["terminated"], spec)
        if state.get("running") and not cs.get("ready"):
            problem = _probe(pod, name, events, now, cs)
            if problem:
                return problem
    # Still being created: a Warning Event (a volume that cannot be mounted, a sandbox that
    # cannot be created) is the only place the reason is written.
    creating = not statuses or any(
        ((cs.get("state") or {}).get("waiting") or {}).get("reason") in _NORMAL_WAITING
        for cs in statuses
    )
    warnings = [
        e
        for e in events
        if e.get("type") == "Warning" and e.get("reason") not in ("Unhealthy", "FailedScheduling")
    ]
    if creating and warnings:
        e = max(warnings, key=_event_time)
        return Problem(str(e["reason"]), _tail(str(e.get("message") or "")))
    return None


def summarise(
    deployment: Obj | None,
    pods: Sequence[Obj],
    events: Mapping[str, Sequence[Obj]],
    now: datetime,
) -> NotReady | None:
    """The dominant reason a Deployment's replicas are not ready, with its pod count and the
    first pod's message. `events` holds each pod's Warning Events by pod UID."""
    if deployment is not None:
        failure = _condition(deployment, "ReplicaFailure")
        if failure and failure.get("status") == "True":
            return NotReady(
                reason=str(failure.get("reason") or "FailedCreate"),
                message=_tail(str(failure.get("message") or "")),
                pods=0,
            )
    found: dict[str, list[Problem]] = {}
    for pod in sorted(pods, key=lambda p: str(p["metadata"]["name"])):
        uid = str(pod["metadata"].get("uid", ""))
        problem = pod_problem(pod, events.get(uid, []), now)
        if problem:
            found.setdefault(problem.reason, []).append(problem)
    if not found:
        return None
    order = list(found)  # first appearance, by pod name
    reason = min(found, key=lambda r: (not is_failing(r), -len(found[r]), order.index(r)))
    return NotReady(reason=reason, message=found[reason][0].message, pods=len(found[reason]))


def progress_deadline_exceeded(deployment: Obj | None) -> bool:
    """The Deployment controller has given up waiting for the rollout to progress."""
    c = _condition(deployment or {}, "Progressing")
    return bool(c and c.get("status") == "False" and c.get("reason") == "ProgressDeadlineExceeded")
