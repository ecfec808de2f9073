"""The operator's pure core and its reconciler, driven without a cluster: the operator's
client recording its writes on the API-server stand-in, a watch cache with one resource,
and status from observed Deployments."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

from kubernetes import client
from prometheus_client import REGISTRY, generate_latest

from testkit.apiserver import ApiServer
from testkit.resources import NAME, NAMESPACE, make_td
from transcription_api.v1alpha1 import (
    KIND,
    TranscriptionDeployment,
    TranscriptionDeploymentStatus,
)
from transcription_operator import manager, metrics
from transcription_operator.cache import Cache
from transcription_operator.config import OperatorConfig
from transcription_operator.kube import Kube, KubeError
from transcription_operator.plan import plan
from transcription_operator.reconciler import Reconciler
from transcription_operator.status import Observed, compute_status


class RecordingKube(Kube):
    """The operator's REST client on the API-server stand-in (in process), recording every
    write and failing where told to: `refuse` (object name -> the error applying it gets),
    `unserved` (kinds whose API is not served: 404), `secret_error` (reading a Secret)."""

    def __init__(self, server: ApiServer | None = None) -> None:
        self.server = server or ApiServer()
        self.writes: list[tuple[str, ...]] = []
        self.refuse: dict[str, KubeError] = {}
        self.unserved: set[str] = set()
        self.secret_error: KubeError | None = None
        self.events: list[tuple[str, str]] = []

    def request(self, method: str, path: str, *args: Any, **kw: Any) -> Any:
        return self.server.request(method, path, *args, **kw)

    @property
    def objects(self) -> dict[tuple[str, str], dict[str, Any]]:
        """What the server holds, by (kind, name)."""
        return {(o["kind"], o["metadata"]["name"]): o for o in self.server.objects.values()}

    def apply(self, manifest: dict[str, Any]) -> dict[str, Any]:
        name = manifest["metadata"]["name"]
        self.writes.append(("apply", manifest["kind"], name))
        if name in self.refuse:
            raise self.refuse[name]
        if manifest["kind"] in self.unserved:
            raise KubeError(
                404, "Not Found", '{"message": "the server could not find the requested resource"}'
            )
        return super().apply(manifest)

    def delete(self, kind: str, namespace: str, name: str, uid: str | None = None) -> bool:
        self.writes.append(("delete", kind, name, uid or ""))
        return super().delete(kind, namespace, name, uid)

    def patch_status(
        self, namespace: str, name: str, status: dict[str, Any], kind: str = KIND
    ) -> dict[str, Any]:
        self.writes.append(("status", name))
        return super().patch_status(namespace, name, status, kind)

    def event(self, owner: dict[str, Any], type_: str, reason: str, message: str, now: str) -> None:
        self.writes.append(("event", reason))
        self.events.append((type_, reason))
        super().event(owner, type_, reason, message, now)

    def get(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        if kind == "Secret" and self.secret_error:
            raise self.secret_error
        return super().get(kind, namespace, name)


class World:
    """One resource on the API-server stand-in and in the watch cache, the reconciler, and
    its recording client."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.kube = RecordingKube()
        self.cache = Cache()
        self.reconciler = Reconciler(self.kube, self.cache, OperatorConfig())
        self.set_spec(spec)

    def set_spec(self, spec: dict[str, Any], generation: int = 3) -> None:
        """The resource created or changed, as the server stores it and its watch delivers
        it (the status kept)."""
        body = make_td(spec).model_dump(by_alias=True, exclude_none=True, mode="json")
        body["metadata"]["generation"] = generation
        old = self.kube.server.get("TranscriptionDeployment", "speech", "whisper")
        if old and old.get("status"):
            body["status"] = old["status"]
        self.cache.put(self.kube.server.put(body))

    def observe(self, obj: dict[str, Any]) -> None:
        """Another writer's change (a controller's status, a user's edit): stored on the
        server, then delivered by the watch."""
        self.cache.put(self.kube.server.put(obj))

    def secret(self, name: str, present: bool = True) -> None:
        """A Secret of that name in the resource's namespace, created or deleted."""
        if present:
            self.kube.server.put({"apiVersion": "v1", "kind": "Secret",
                                  "metadata": {"name": name, "namespace": "speech"}})  # fmt: skip
        else:
            self.kube.server.remove("Secret", "speech", name)

    def reconcile(self) -> Any:
        self.kube.writes.clear()
        return self.reconciler.reconcile(KIND, "speech", "whisper")

    def condition(self, type_: str) -> dict[str, Any]:
        td = self.kube.server.get("TranscriptionDeployment", "speech", "whisper")
        assert td is not None and td.get("status")
        return next(c for c in td["status"]["conditions"] if c["type"] == type_)


class Operator:
    """The operator's runtime (watch cache, work queue, reconciles: `manager.Runtime`) in
    this process, for one resource, its real REST client talking HTTP to the API-server
    stand-in at `url`; its metrics are this process's registry. `runtime`: the one to
    drive (default: a fresh one), never the process's own."""

    def __init__(
        self, api: ApiServer, url: str, spec: dict[str, Any],
        runtime: manager.Runtime | None = None,
    ) -> None:  # fmt: skip
        self.api = api
        self.runtime = runtime or manager.Runtime()
        kube = Kube(client.ApiClient(client.Configuration(host=url)))
        self.runtime.reconciler = Reconciler(kube, self.runtime.cache, OperatorConfig())
        metrics.LEADER.set(1)
        self.key = (KIND, NAMESPACE, NAME)
        self.spec(spec)

    def spec(self, spec: dict[str, Any], generation: int = 3) -> None:
        """The resource, created or changed (a new generation), its status kept."""
        body = make_td(spec).model_dump(by_alias=True, exclude_none=True, mode="json")
        old = self.api.get("TranscriptionDeployment", NAMESPACE, NAME)
        if old and old.get("status"):
            body["status"] = old["status"]
        body["metadata"]["generation"] = generation
        self.watched("TranscriptionDeployment", "transcription.dev/v1alpha1", self.api.put(body))

    def watched(self, kind: str, api_version: str, body: dict[str, Any]) -> None:
        """A watch event of the resource or a child, as kopf delivers it."""
        _, news = self.runtime.remember(kind, api_version, "MODIFIED", body)
        if news:
            self.runtime.enqueue(self.key, kind)

    def reconcile(self) -> None:
        """The queue's next key, reconciled as the operator's queue workers do."""

        async def one() -> None:
            key = await self.runtime.queue.get()
            metrics.QUEUE_DEPTH.set(self.runtime.queue.depth)
            try:
                await self.runtime.reconcile(key)
            finally:
                self.runtime.queue.done(key)

        asyncio.run(one())

    def children(self, kind: str) -> list[dict[str, Any]]:
        return [o for o in self.runtime.cache.children(NAMESPACE, NAME, "uid-1")
                if o["kind"] == kind]  # fmt: skip

    def deployments(self, ready: int, *, desired: int | None = None, stuck: bool = False) -> None:
        """The Deployments' controller reports: `ready` replicas of each (a worker pool's
        desired count stays its spec's); `stuck`: the rollout of a new template past its
        progress deadline, the old replicas still serving."""
        for dep in self.children("Deployment"):
            dep = copy.deepcopy(dep)
            want = int(dep["spec"].get("replicas", 1))
            is_worker = dep["metadata"]["labels"].get("app.kubernetes.io/component") == "worker"
            if desired is not None and is_worker:
                want = dep["spec"]["replicas"] = desired  # as an autoscaler sets it
            generation = 2 if stuck else 1
            dep["metadata"]["generation"] = generation
            status: dict[str, Any] = {"observedGeneration": generation, "replicas": want,
                                      "updatedReplicas": want, "readyReplicas": min(ready, want)}  # fmt: skip
            if stuck and is_worker:
                status |= {"replicas": want + 1, "updatedReplicas": 1, "readyReplicas": want,
                           "conditions": [{"type": "Progressing", "status": "False",
                                           "reason": "ProgressDeadlineExceeded",
                                           "message": f'ReplicaSet "{dep["metadata"]["name"]}-2" has timed out progressing.'}]}  # fmt: skip
            dep["status"] = status
            self.watched("Deployment", "apps/v1", self.api.put(dep))
        self.reconcile()

    def exposition(self) -> str:
        return generate_latest(REGISTRY).decode()


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
