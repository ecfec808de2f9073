"""The watch caches: what the watch streams last delivered, read by every reconcile.

`Cache` holds the resources and their children by (kind, namespace, name), as an informer's
store does; `Pods` holds the operator's pods and the Warning Events about them, indexed by
the resource they belong to. Status explains pods that are not ready from those two streams,
filtered by the API server so that only what status reads arrives: the operator's pods (by
label) and Warning Events about pods (by field). A reconcile reads them from memory: no
request per pod, ever.
"""

from __future__ import annotations

import threading
from typing import Any

from transcription_api.v1alpha1 import KIND as TD_KIND

from .kinds import RESOURCE_KIND_NAMES
from .names import INSTANCE_LABEL, MANAGED_SELECTOR

Key = tuple[str, str, str]  # kind, namespace ("" for a namespace itself), name
# Server-side filters of the two streams status reads.
POD_SELECTOR = MANAGED_SELECTOR
EVENT_SELECTOR = "involvedObject.kind=Pod,type=Warning"


def instance_of(obj: dict[str, Any]) -> str | None:
    """The resource (instance label) a child or a pod belongs to."""
    return (obj["metadata"].get("labels") or {}).get(INSTANCE_LABEL)


def owner_of(obj: dict[str, Any]) -> Key | None:
    """The resource (kind, namespace, name) a child belongs to: its controller, else (a
    child without owner references) the TranscriptionDeployment its instance label names."""
    meta = obj["metadata"]
    for ref in meta.get("ownerReferences") or []:
        if ref.get("controller") and ref.get("kind") in RESOURCE_KIND_NAMES:
            return ref["kind"], meta["namespace"], ref["name"]
    instance = instance_of(obj)
    return (TD_KIND, meta["namespace"], instance) if instance else None


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

    def put(self, obj: dict[str, Any]) -> bool:
        """Remember an object, unless the cache already holds a newer version of it (a watch
        event can arrive after the answer to the operator's own, later, write). Returns
        whether it is news: False for a version the cache holds already (the watch's echo
        of the operator's own write) or an older one."""
        with self._lock:
            return self._put(obj)

    def _put(self, obj: dict[str, Any]) -> bool:
        m = obj["metadata"]
        key = (obj["kind"], m.get("namespace", ""), m["name"])
        held = self._objs.get(key)
        if held is not None and _older(m, held["metadata"]):
            return False
        self._clock += 1
        self._objs[key], self._stored[key] = obj, self._clock
        return held is None or held["metadata"].get("resourceVersion") != m.get("resourceVersion")

    def put_if_absent(self, obj: dict[str, Any]) -> None:
        m = obj["metadata"]
        with self._lock:
            if (obj["kind"], m.get("namespace", ""), m["name"]) not in self._objs:
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
                key = (kind, m.get("namespace", ""), m["name"])
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
            if o["kind"] not in RESOURCE_KIND_NAMES
            and o["metadata"].get("namespace") == namespace
            and (o["metadata"].get("labels") or {}).get(INSTANCE_LABEL) == instance
            and any(r.get("uid") == uid for r in o["metadata"].get("ownerReferences") or [])
        ]

    def keys(self, kind: str) -> list[tuple[str, str]]:
        with self._lock:
            return [(ns, name) for k, ns, name in self._objs if k == kind]

    def objects(self, kind: str) -> list[dict[str, Any]]:
        with self._lock:
            return [o for (k, _, _), o in self._objs.items() if k == kind]

    def namespace_labels(self) -> dict[str, dict[str, str]]:
        """Every cached namespace's labels, by name."""
        return {
            o["metadata"]["name"]: dict(o["metadata"].get("labels") or {})
            for o in self.objects("Namespace")
        }

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
            # Image volumes (weights from an OCI image): a failed pull names their image.
            "volumes": [
                {"name": v["name"], "image": v["image"]}
                for v in spec.get("volumes") or []
                if "image" in v
            ],
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


def _older(meta: dict[str, Any], than: dict[str, Any]) -> bool:
    """Whether `meta` is an older version of the same object than `than`. Resource versions
    are etcd revisions (integers) on every etcd-backed API server; anything else is taken
    as newer."""
    a, b = str(meta.get("resourceVersion", "")), str(than.get("resourceVersion", ""))
    same = meta.get("uid") == than.get("uid")
    return same and a.isdigit() and b.isdigit() and int(a) < int(b)
