"""The whole operator in this process, for any number of resources of both kinds: its
runtime (watch cache, work queue, reconciles: `manager.Runtime`), fed through its own kopf
handlers, its real REST client talking HTTP to the API-server stand-in.

A test writes objects as a user or a controller would (`apply`, `delete`, `roll_out`): the
stand-in stores them and their watch events reach the handlers, which enqueue what they
concern; `settle()` then runs the queue dry, as the queue workers would. The stand-in
records every request, so a test sees what the operator wrote (`writes`).
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from kubernetes import client

from testkit.apiserver import ApiServer, serve
from transcription_api.v1alpha1 import API_VERSION, GATEWAY_KIND
from transcription_operator import handlers, manager
from transcription_operator.config import OperatorConfig
from transcription_operator.kinds import KINDS
from transcription_operator.kube import Kube
from transcription_operator.reconciler import Reconciler


class InProcessOperator:
    def __init__(self, api: ApiServer, url: str) -> None:
        self.api = api
        self.runtime = manager.Runtime()
        kube = Kube(client.ApiClient(client.Configuration(host=url)))
        self.runtime.reconciler = Reconciler(kube, self.runtime.cache, OperatorConfig())

    # ------------------------------------------------------------------ the world changes

    def apply(self, doc: dict[str, Any]) -> dict[str, Any]:
        """A resource created or changed by a user (its status kept, a new generation when
        its spec changed), and its watch event."""
        meta = doc["metadata"]
        old = self.api.get(doc["kind"], meta["namespace"], meta["name"])
        body = copy.deepcopy(doc)
        body.setdefault("apiVersion", API_VERSION)
        generation = 1
        if old:
            body["status"] = old.get("status")
            body["metadata"]["uid"] = old["metadata"]["uid"]
            generation = old["metadata"]["generation"] + (old.get("spec") != body.get("spec"))
        body["metadata"]["generation"] = generation
        stored = self.api.put({k: v for k, v in body.items() if v is not None})
        self._resource_event("MODIFIED" if old else "ADDED", stored)
        return stored

    def delete(self, kind: str, namespace: str, name: str) -> None:
        """A resource deleted (its children are left to garbage collection)."""
        obj = self.api.get(kind, namespace, name)
        assert obj is not None, f"no {kind} {namespace}/{name}"
        self.api.remove(kind, namespace, name)
        self._resource_event("DELETED", obj)

    def roll_out(self) -> None:
        """Every Deployment's controller reports all its replicas ready."""
        for dep in list(self.api.objects.values()):
            if dep["kind"] != "Deployment":
                continue
            dep = copy.deepcopy(dep)
            want = int(dep["spec"].get("replicas", 1))
            dep["metadata"]["generation"] = 1
            dep["status"] = {"observedGeneration": 1, "replicas": want, "updatedReplicas": want,
                             "readyReplicas": want}  # fmt: skip
            handlers.child_seen(KINDS["Deployment"], "MODIFIED", self.api.put(dep))

    def _resource_event(self, event_type: str, body: dict[str, Any]) -> None:
        gateway = body["kind"] == GATEWAY_KIND
        handler: Any = handlers.gateway_event if gateway else handlers.resource_event
        asyncio.run(handler(event={"type": event_type}, body=body))

    # ------------------------------------------------------------------ the operator works

    def settle(self, limit: int = 100) -> int:
        """Reconcile what the queue holds until it is empty; returns how many reconciles."""

        async def run() -> int:
            done = 0
            while self.runtime.queue.depth:
                assert done < limit, "the queue never empties: reconciles keep asking for more"
                key = await self.runtime.queue.get()
                try:
                    await self.runtime.reconcile(key)
                finally:
                    self.runtime.queue.done(key)
                done += 1
            return done

        return asyncio.run(run())

    def resync(self) -> int:
        """Every resource reconciled once more, as the periodic resync does."""
        for key in self.runtime.resource_keys():
            self.runtime.enqueue(key, "resync")
        return self.settle()

    # ------------------------------------------------------------------ what a test reads

    def get(self, kind: str, namespace: str, name: str) -> dict[str, Any]:
        obj = self.api.get(kind, namespace, name)
        assert obj is not None, f"no {kind} {namespace}/{name}"
        return obj

    def condition(self, kind: str, namespace: str, name: str, type_: str) -> dict[str, Any]:
        status = self.get(kind, namespace, name).get("status") or {}
        return next(c for c in status.get("conditions", []) if c["type"] == type_)

    def events(self, namespace: str) -> list[tuple[str, str, str]]:
        """The Events posted in a namespace: (involved object's name, reason, message)."""
        prefix = KINDS["Event"].path(namespace) + "/"
        return [
            (e["involvedObject"]["name"], e["reason"], e["message"])
            for path, e in self.api.objects.items()
            if path.startswith(prefix)
        ]

    def writes(self, since: int = 0) -> list[tuple[str, str]]:
        """The requests that changed something, from request number `since` on."""
        return [(m, p) for m, p in self.api.requests[since:] if m != "GET"]


@contextmanager
def in_process() -> Iterator[InProcessOperator]:
    """An API-server stand-in served over HTTP and the operator in process as the one the
    handlers feed (the process-wide runtime restored afterwards)."""
    api = ApiServer()
    saved = manager.RUNTIME
    with serve(api) as url:
        op = InProcessOperator(api, url)
        manager.RUNTIME = op.runtime
        try:
            yield op
        finally:
            manager.RUNTIME = saved
