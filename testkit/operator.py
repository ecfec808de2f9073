"""The operator's pure core and its reconciler, driven without a cluster: a recording API
client, a watch cache with one resource, and status from observed Deployments."""

from __future__ import annotations

import copy
from typing import Any

from testkit.resources import make_td
from transcription_api.v1alpha1 import TranscriptionDeployment, TranscriptionDeploymentStatus
from transcription_operator.cache import Cache
from transcription_operator.config import OperatorConfig
from transcription_operator.kube import KubeError
from transcription_operator.plan import plan
from transcription_operator.reconciler import Reconciler
from transcription_operator.status import Observed, compute_status


class RecordingKube:
    """An API server stand-in: keeps what is applied, adds what a server adds (uid,
    resourceVersion, defaults), records every write, and fails where told to."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str], dict[str, Any]] = {}
        self.writes: list[tuple[str, ...]] = []
        self.refuse: dict[str, KubeError] = {}  # object name -> the error applying it gets
        self.unserved: set[str] = set()  # kinds whose API is not served (404)
        self.secrets: set[str] = set()
        self.secret_error: KubeError | None = None
        self.status: dict[str, Any] | None = None
        self.events: list[tuple[str, str]] = []

    def apply(self, manifest: dict[str, Any]) -> dict[str, Any]:
        name = manifest["metadata"]["name"]
        self.writes.append(("apply", manifest["kind"], name))
        if name in self.refuse:
            raise self.refuse[name]
        if manifest["kind"] in self.unserved:
            raise KubeError(
                404, "Not Found", '{"message": "the server could not find the requested resource"}'
            )
        obj = copy.deepcopy(manifest)
        obj["metadata"].update(uid=f"uid-{manifest['kind']}-{name}", resourceVersion="1")
        if manifest["kind"] == "Service":
            obj["spec"]["clusterIP"] = "10.0.0.1"  # a default the server adds: not drift
        self.objects[(manifest["kind"], name)] = obj
        return obj

    def delete(self, kind: str, namespace: str, name: str, uid: str | None = None) -> bool:
        self.writes.append(("delete", kind, name, uid or ""))
        return self.objects.pop((kind, name), None) is not None

    def patch_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        self.writes.append(("status", name))
        self.status = status

    def event(self, owner: dict[str, Any], type_: str, reason: str, message: str, now: str) -> None:
        self.writes.append(("event", reason))
        self.events.append((type_, reason))

    def get(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        assert kind == "Secret"
        if self.secret_error:
            raise self.secret_error
        return {"metadata": {"name": name}} if name in self.secrets else None


class World:
    """One resource in the watch cache, the reconciler, and the recording client."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.kube = RecordingKube()
        self.cache = Cache()
        self.reconciler = Reconciler(self.kube, self.cache, OperatorConfig())  # type: ignore[arg-type]
        self.set_spec(spec)

    def set_spec(self, spec: dict[str, Any], generation: int = 3) -> None:
        body = make_td(spec).model_dump(by_alias=True, exclude_none=True, mode="json")
        body["metadata"]["generation"] = generation
        old = self.cache.get("TranscriptionDeployment", "speech", "whisper")
        if old and old.get("status"):
            body["status"] = old["status"]
        self.cache.put(body)

    def reconcile(self) -> Any:
        self.kube.writes.clear()
        return self.reconciler.reconcile("speech", "whisper")

    def condition(self, type_: str) -> dict[str, Any]:
        assert self.kube.status is not None
        return next(c for c in self.kube.status["conditions"] if c["type"] == type_)


CFG = OperatorConfig()
T0, T1 = "2026-11-30T10:00:00Z", "2026-11-30T10:05:00Z"


def deployment(
    name: str,
    desired: int,
    ready: int,
    generation: int = 1,
    observed: int = 1,
    updated: int | None = None,
    total: int | None = None,  # old and new replicas (a surge: desired + 1)
) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "generation": generation},
        "spec": {"replicas": desired},
        "status": {
            "observedGeneration": observed,
            "replicas": desired if total is None else total,
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
