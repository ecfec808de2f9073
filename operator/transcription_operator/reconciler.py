"""One reconcile of one resource: observe (from the watch cache), build, apply, report.

Level-triggered: whatever event arrives (the resource changed, a child changed or
vanished, a timer), the same function computes the whole desired state and converges to
it. Nothing is written when the cluster already matches: a child is applied only when
its live object differs from the desired one, and the status only when it changed.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError

from transcription_api.v1alpha1 import KIND as TD_KIND
from transcription_api.v1alpha1 import TranscriptionDeployment, TranscriptionDeploymentStatus

from .children import build
from .config import OperatorConfig
from .kinds import CHILD_KIND_NAMES, KINDS
from .kube import Kube, KubeError
from .names import INSTANCE_LABEL, MANAGED_BY_LABEL, PART_OF, POOL_LABEL
from .plan import plan
from .status import Observed, compute_status, invalid_spec_status, status_body, status_events

log = logging.getLogger(__name__)
Key = tuple[str, str, str]  # kind, namespace, name
LOADING_RECHECK = 60.0


def now_rfc3339() -> str:
    return datetime.now(UTC).replace(microsecond=0).strftime("%Y-%m-%dT%H:%M:%SZ")


def is_subset(desired: Any, live: Any) -> bool:
    """Whether every field of `desired` is present and equal in `live`.

    The API server adds defaults to what we apply, so equality is checked only for the
    fields the operator sets. Lists must have the same length (an added container or env
    var is drift).
    """
    if isinstance(desired, dict):
        return isinstance(live, dict) and all(
            k in live and is_subset(v, live[k]) for k, v in desired.items()
        )
    if isinstance(desired, list):
        return (
            isinstance(live, list)
            and len(desired) == len(live)
            and all(is_subset(d, v) for d, v in zip(desired, live, strict=True))
        )
    if isinstance(desired, bool) or isinstance(live, bool):
        return desired is live
    if isinstance(desired, int | float) and isinstance(live, int | float):
        return desired == live
    return str(desired) == str(live)


class Cache:
    """Objects last seen on the watch streams, by (kind, namespace, name)."""

    def __init__(self) -> None:
        self._objs: dict[Key, dict[str, Any]] = {}
        # A logical clock: when each entry was stored, and when each key was last dropped
        # (so that a listing taken before those moments cannot undo them).
        self._clock = 0
        self._stored: dict[Key, int] = {}
        self._dropped: dict[Key, int] = {}
        self._lock = threading.Lock()

    def put(self, obj: dict[str, Any]) -> None:
        """Remember an object, unless the cache already holds a newer version of it (a watch
        event can arrive after the answer to the operator's own, later, write)."""
        with self._lock:
            self._put(obj)

    def _put(self, obj: dict[str, Any]) -> bool:
        m = obj["metadata"]
        key = (obj["kind"], m["namespace"], m["name"])
        held = self._objs.get(key)
        if held is not None and _older(m, held["metadata"]):
            return False
        self._clock += 1
        self._objs[key], self._stored[key] = obj, self._clock
        return held is None or held["metadata"].get("resourceVersion") != m.get("resourceVersion")

    def put_if_absent(self, obj: dict[str, Any]) -> None:
        m = obj["metadata"]
        with self._lock:
            if (obj["kind"], m["namespace"], m["name"]) not in self._objs:
                self._put(obj)

    def drop(self, kind: str, namespace: str, name: str) -> None:
        with self._lock:
            self._clock += 1
            key = (kind, namespace, name)
            self._objs.pop(key, None)
            self._stored.pop(key, None)
            self._dropped[key] = self._clock

    def mark(self) -> int:
        """Now, on the cache's clock: take it before a listing that `replace` is given."""
        with self._lock:
            return self._clock

    def replace(
        self, kind: str, namespace: str | None, listed: list[dict[str, Any]], mark: int
    ) -> list[dict[str, Any]]:
        """Make the cache's objects of `kind` (in `namespace`; None: all) those of a listing
        taken after `mark`, as an informer's relist does: an object deleted while the watch
        was away is forgotten. What the watches stored or dropped after `mark` is newer
        than the listing and stays. Returns the objects that changed, were added or were
        forgotten."""
        changed: list[dict[str, Any]] = []
        with self._lock:
            keys = set()
            for obj in listed:
                m = obj["metadata"]
                key = (kind, m["namespace"], m["name"])
                keys.add(key)
                if self._dropped.get(key, -1) <= mark and self._put(obj):
                    changed.append(obj)
            for key in [k for k in self._objs if k[0] == kind and k not in keys]:
                if (namespace is None or key[1] == namespace) and self._stored[key] <= mark:
                    changed.append(self._objs.pop(key))
                    del self._stored[key]
            self._dropped = {k: t for k, t in self._dropped.items() if t > mark}
        return changed

    def get(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        with self._lock:
            return self._objs.get((kind, namespace, name))

    def children(self, namespace: str, instance: str, uid: str) -> list[dict[str, Any]]:
        """Cached objects owned by the resource with this UID."""
        with self._lock:
            objs = list(self._objs.values())
        return [
            o
            for o in objs
            if o["kind"] != TD_KIND
            and o["metadata"]["namespace"] == namespace
            and (o["metadata"].get("labels") or {}).get(INSTANCE_LABEL) == instance
            and any(r.get("uid") == uid for r in o["metadata"].get("ownerReferences") or [])
        ]

    def keys(self, kind: str) -> list[tuple[str, str]]:
        with self._lock:
            return [(ns, name) for k, ns, name in self._objs if k == kind]

    def count(self, kind: str) -> int:
        with self._lock:
            return sum(1 for k in self._objs if k[0] == kind)


def slim_pod(pod: dict[str, Any]) -> dict[str, Any]:
    """The parts of a pod status reads (the watch cache keeps only these)."""
    meta, spec = pod["metadata"], pod.get("spec") or {}
    keep = ("name", "namespace", "uid", "labels", "creationTimestamp", "deletionTimestamp")

    def container(c: dict[str, Any]) -> dict[str, Any]:
        return {k: c[k] for k in ("name", "image", "resources", "startupProbe") if k in c}

    return {
        "kind": "Pod",
        "metadata": {k: meta[k] for k in keep if k in meta},
        "spec": {
            "nodeName": spec.get("nodeName"),
            **{
                k: [container(c) for c in spec.get(k) or []]
                for k in ("initContainers", "containers")
            },
        },
        "status": pod.get("status") or {},
    }


def slim_event(event: dict[str, Any]) -> dict[str, Any]:
    keep = ("reason", "message", "type", "count", "series", "firstTimestamp", "lastTimestamp",
            "eventTime", "involvedObject")  # fmt: skip
    out = {k: event[k] for k in keep if k in event}
    out["metadata"] = {k: event["metadata"][k] for k in ("name", "namespace")}
    return out


class Pods:
    """The resources' pods and their Warning Events, as the watch streams delivered them,
    indexed by the resource (instance label) they belong to."""

    def __init__(self) -> None:
        self._pods: dict[tuple[str, str], dict[str, dict[str, Any]]] = {}  # (ns, inst) -> pods
        self._owner: dict[str, tuple[str, str]] = {}  # pod UID -> (ns, instance)
        self._events: dict[str, dict[str, dict[str, Any]]] = {}  # pod UID -> name -> event
        self._lock = threading.Lock()

    def put(self, pod: dict[str, Any]) -> tuple[str, str] | None:
        """Remember a pod; returns the (namespace, instance) it belongs to."""
        meta = pod["metadata"]
        instance = (meta.get("labels") or {}).get(INSTANCE_LABEL)
        if not instance:
            return None
        key = (meta["namespace"], instance)
        with self._lock:
            self._pods.setdefault(key, {})[meta["name"]] = slim_pod(pod)
            self._owner[meta["uid"]] = key
        return key

    def drop(self, pod: dict[str, Any]) -> tuple[str, str] | None:
        meta = pod["metadata"]
        with self._lock:
            key = self._owner.pop(meta.get("uid", ""), None)
            self._events.pop(meta.get("uid", ""), None)
            if key:
                self._pods.get(key, {}).pop(meta["name"], None)
                if not self._pods.get(key):
                    self._pods.pop(key, None)
        return key

    def put_event(self, event: dict[str, Any], deleted: bool = False) -> tuple[str, str] | None:
        """Remember (or forget) a Warning Event of one of our pods; returns the pod's
        (namespace, instance), or None for other pods' Events (not kept)."""
        uid = (event.get("involvedObject") or {}).get("uid", "")
        name = event["metadata"]["name"]
        with self._lock:
            key = self._owner.get(uid)
            if key is None:
                return None
            if deleted:
                self._events.get(uid, {}).pop(name, None)
            else:
                self._events.setdefault(uid, {})[name] = slim_event(event)
        return key

    def of(self, namespace: str, instance: str) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._pods.get((namespace, instance), {}).values())

    def events(self, pods: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
        with self._lock:
            return {
                uid: list(self._events[uid].values())
                for uid in (p["metadata"]["uid"] for p in pods)
                if uid in self._events
            }

    def counts(self) -> tuple[int, int]:
        with self._lock:
            return len(self._owner), sum(len(e) for e in self._events.values())


class RetryLater(Exception):
    """The reconcile reported what failed and should run again after a backoff."""


@dataclass
class Result:
    outcome: str  # "applied", "unchanged", "degraded", "gone", "error"
    writes: int = 0
    requeue_after: float | None = None
    messages: list[str] = field(default_factory=list)


def missing_api(manifest: dict[str, Any]) -> tuple[str, str]:
    """The problem of a child whose API the cluster does not serve (KEDA's ScaledObject)."""
    labels = manifest["metadata"].get("labels") or {}
    pool = labels.get(POOL_LABEL, "?")
    return (
        "AutoscalerMissing",
        f"pool {pool}: spec.pools[].autoscaling needs KEDA, and this cluster does not serve "
        f"{manifest['apiVersion']} {manifest['kind']}: install KEDA (https://keda.sh); "
        "until then the pool does not scale",
    )


class Reconciler:
    def __init__(
        self, kube: Kube, cache: Cache, cfg: OperatorConfig, pods: Pods | None = None
    ) -> None:
        self.kube = kube
        self.cache = cache
        self.cfg = cfg
        self.pods = pods or Pods()

    def reconcile(self, namespace: str, name: str) -> Result:
        body = self.cache.get(TD_KIND, namespace, name)
        if body is None or body["metadata"].get("deletionTimestamp"):
            return Result("gone")  # children go with it: garbage collection
        try:
            td = TranscriptionDeployment.model_validate(body)
        except ValidationError as e:
            status = invalid_spec_status(body, "InvalidSpec", _validation_message(e), now_rfc3339())
            return self._report(body, status, [("InvalidSpec", status.conditions[0].message)], 0)

        the_plan = plan(td.spec)
        desired = build(td, self.cfg, the_plan)
        observed = Observed(problems=self._missing_secrets(td))
        writes = 0
        transient: list[str] = []
        for manifest in desired:
            meta = manifest["metadata"]
            live = self.cache.get(manifest["kind"], meta["namespace"], meta["name"])
            if live is not None and is_subset(manifest, live):
                continue
            try:
                applied = self.kube.apply(manifest)
            except KubeError as e:
                if e.status == 404 and KINDS[manifest["kind"]].optional:
                    observed.problems.append(missing_api(manifest))
                    continue
                # Either way the user sees it in status. A refusal (400/403/422: a bad
                # affinity, say) waits for the spec to change; anything else (the cluster
                # out of Service IPs, an API server hiccup) is retried with backoff.
                msg = f"{manifest['kind']} {meta['name']}: {e.message}"
                observed.problems.append(("ApplyFailed", msg))
                if e.status not in (400, 403, 422):
                    transient.append(msg)
                continue
            writes += 1
            self.cache.put(applied)
        writes += self._prune(td, desired)
        for child in self.cache.children(namespace, name, str(td.metadata["uid"])):
            if child["kind"] == "Deployment":
                observed.deployments[child["metadata"]["name"]] = child
        observed.pods = self.pods.of(namespace, name)
        observed.events = self.pods.events(observed.pods)
        status = compute_status(td, the_plan, observed, self.cfg, now_rfc3339())
        result = self._report(body, status, observed.problems, writes)
        if _loading(status):
            # The elapsed time in the message moves once a minute without any event.
            result.requeue_after = min(result.requeue_after or LOADING_RECHECK, LOADING_RECHECK)
        if transient:
            raise RetryLater("; ".join(transient))
        return result

    def _report(
        self,
        body: dict[str, Any],
        status: TranscriptionDeploymentStatus,
        problems: list[tuple[str, str]],
        writes: int,
    ) -> Result:
        """Write the status if it changed (with Events for changes users care about)."""
        meta = body["metadata"]
        old = body.get("status") or {}
        new = status_body(status)
        if _without_kopf(old) != new:
            stored = self.kube.patch_status(meta["namespace"], meta["name"], new)
            writes += 1
            writes += self._events(body, old, new)
            # Cache what the server stored (its resourceVersion too): the watch event of an
            # earlier write, arriving later, must not bring back the older status.
            self.cache.put({**body, **(stored or {}), "status": new})
        degraded = any(c.type == "Degraded" and c.status == "True" for c in status.conditions)
        outcome = "degraded" if degraded else ("applied" if writes else "unchanged")
        # Missing Secrets are not watched: look again in a minute (not a retry storm).
        requeue = 60.0 if problems else None
        return Result(outcome, writes, requeue, [m for _, m in problems])

    def _prune(self, td: TranscriptionDeployment, desired: list[dict[str, Any]]) -> int:
        wanted = {(m["kind"], m["metadata"]["name"]) for m in desired}
        deleted = 0
        for child in self.cache.children(td.namespace, td.name, str(td.metadata["uid"])):
            key = (child["kind"], child["metadata"]["name"])
            labels = child["metadata"].get("labels") or {}
            managed = child["kind"] in CHILD_KIND_NAMES and labels.get(MANAGED_BY_LABEL) == PART_OF
            if key in wanted or not managed:
                continue
            log.info("deleting %s %s/%s: no longer desired", *key[:1], td.namespace, key[1])
            if self.kube.delete(child["kind"], td.namespace, key[1], child["metadata"]["uid"]):
                deleted += 1
            self.cache.drop(child["kind"], td.namespace, key[1])
        return deleted

    def _missing_secrets(self, td: TranscriptionDeployment) -> list[tuple[str, str]]:
        refs = []
        if td.spec.frontend.api_key_secret:
            refs.append(("frontend.apiKeySecret", td.spec.frontend.api_key_secret.name))
        if td.spec.model.hub_token_secret:
            refs.append(("model.hubTokenSecret", td.spec.model.hub_token_secret.name))
        problems = []
        for field_name, secret in refs:
            try:
                exists = self.kube.get("Secret", td.namespace, secret) is not None
            except KubeError as e:
                if e.status != 403:
                    raise
                exists = True  # not allowed to look: let the pod report it
            if not exists:
                problems.append(
                    (
                        "SecretNotFound",
                        f"{field_name}: Secret {td.namespace}/{secret} does not exist; "
                        "create it or remove the reference",
                    )
                )
        return problems

    def _events(self, body: dict[str, Any], old: dict[str, Any], new: dict[str, Any]) -> int:
        """Post the Events the status change deserves (see `status_events`)."""
        posted = 0
        for event in status_events(old, new):
            try:
                self.kube.event(body, *event, now=now_rfc3339())
                posted += 1
            except KubeError as e:
                log.warning("could not post event %s: %s", event[1], e)
        return posted


def _loading(status: TranscriptionDeploymentStatus) -> bool:
    not_ready = [p.not_ready for p in status.pools]
    if status.frontend:
        not_ready.append(status.frontend.not_ready)
    return any(nr and nr.reason == "StartupProbeFailing" for nr in not_ready)


def _older(meta: dict[str, Any], than: dict[str, Any]) -> bool:
    """Whether `meta` is an older version of the same object than `than`. Resource versions
    are etcd revisions (integers) on every etcd-backed API server; anything else is taken
    as newer."""
    a, b = str(meta.get("resourceVersion", "")), str(than.get("resourceVersion", ""))
    same = meta.get("uid") == than.get("uid")
    return same and a.isdigit() and b.isdigit() and int(a) < int(b)


def _without_kopf(status: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in status.items() if k != "kopf"}


def _validation_message(e: ValidationError) -> str:
    parts = []
    for err in e.errors()[:5]:
        loc = ".".join(str(x) for x in err["loc"])
        parts.append(f"{loc}: {err['msg']}" if loc else err["msg"])
    return "invalid spec: " + "; ".join(parts)
