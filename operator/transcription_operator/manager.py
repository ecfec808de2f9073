"""The runtime, as controller-runtime's manager: the watch caches, the work queue and its
workers, the relister, and the leader election that gates the workers.

Every event of a resource or of one of its children enqueues the resource (`handlers.py`
says which): a key (kind, namespace, name), the kind a TranscriptionDeployment or a
TranscriptionGateway. A deployment's change also enqueues every gateway (which may route
it), and a gateway's change the deployments it selected before and after (whose status
names it); queue workers run the level-triggered `Reconciler` (in a thread, as the official
client is synchronous), with per-resource exclusivity, exponential backoff on API errors
and a periodic resync.

With leader election (`--leader-elect`, `leader.py`), every replica watches and keeps its
cache hot, but only the leader's workers reconcile (and so write children, status and
Events). A replica that becomes leader enqueues every resource it knows at once; one that
loses the lease stops taking keys at once (a reconcile in flight finishes).

Everything here runs on kopf's event loop, where the work queue lives (asyncio's queue is
not thread-safe); only the reconciles and the listings run in threads.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
import os
import signal
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from transcription_api.v1alpha1 import GATEWAY_KIND, KIND, TranscriptionGateway

from . import metrics
from .cache import EVENT_SELECTOR, POD_SELECTOR, Cache, Key, Pods, owner_of
from .config import OperatorConfig
from .kinds import CHILDREN, NAMESPACE, RESOURCES
from .kube import Kube, KubeError
from .leader import ElectionConfig, LeaderElection, LeaseLock
from .names import MANAGED_SELECTOR
from .queue import WorkQueue
from .reconciler import Reconciler
from .scope import Scope

log = logging.getLogger("transcription_operator")

WORKERS = 4
RESYNC_SECONDS = 300.0
RELIST_SETTLE_SECONDS = 1.0
RELIST_RETRY_SECONDS = 5.0


class Runtime:
    """The process-wide state the handlers share; set up at startup."""

    def __init__(self) -> None:
        self.cache = Cache()
        self.pods = Pods()
        self.queue: WorkQueue[Key] = WorkQueue()
        self.reconciler: Reconciler | None = None
        self.tasks: list[asyncio.Task[None]] = []
        self.kubeconfig: str | None = None
        self.scope = Scope()  # no entries: every namespace
        self.election_config: ElectionConfig | None = None  # None: no leader election
        self.election: LeaderElection | None = None
        self.election_task: asyncio.Task[None] | None = None
        # Set while the workers may take keys (always, without leader election).
        self.leading = asyncio.Event()
        self.in_flight = 0
        self.idle = asyncio.Event()  # set while no reconcile is in flight
        self.idle.set()
        self.relist_wanted = asyncio.Event()  # kopf listed objects: a watch (re)started
        self.resync_seconds = RESYNC_SECONDS  # `--resync-period`

    def may_reconcile(self) -> bool:
        return self.election is None or self.election.is_leading()

    # ------------------------------------------------------------------ watch events

    def enqueue(self, key: Key, by: str, delay: float = 0.0) -> None:
        """Ask for a reconcile of the resource (kind, namespace, name); `by` says what asked
        (a kind whose watch event it is, "requeue", "resync", ...: the metric's label)."""
        metrics.ENQUEUED.labels(by=by).inc()
        self.queue.add(key, delay=delay)

    def resource_keys(self) -> list[Key]:
        """Every resource the cache holds, of both kinds."""
        return [(k.kind, ns, name) for k in RESOURCES for ns, name in self.cache.keys(k.kind)]

    def enqueue_gateways(self, by: str) -> None:
        """Every gateway: a deployment changed (one may route it) or a namespace's labels."""
        for ns, name in self.cache.keys(GATEWAY_KIND):
            self.enqueue((GATEWAY_KIND, ns, name), by)

    def selected_by(self, body: dict[str, Any] | None) -> set[Key]:
        """The deployments a gateway (as cached) selects, routed or refused."""
        if body is None or self.reconciler is None:
            return set()
        try:
            gw = TranscriptionGateway.model_validate(body)
        except ValueError:
            return set()
        return {(KIND, v.namespace, v.name) for v in self.reconciler.select(gw).verdicts}

    def enqueue_instance(self, key: tuple[str, str], by: str) -> None:
        """The resource of either kind named by a pod's instance label."""
        for kind in (KIND, GATEWAY_KIND):
            if self.cache.get(kind, *key) is not None:
                self.enqueue((kind, *key), by)

    def remember(
        self, kind: str, api_version: str, event_type: str | None, body: Mapping[str, Any]
    ) -> tuple[dict[str, Any], bool]:
        """Record a resource or a child as a watch delivered it; returns the object, and
        whether it is news: not the echo of a version the cache holds already (the
        operator's own write, cached from the API server's answer), which asks for no
        reconcile."""
        obj = copy.deepcopy(dict(body))
        obj["kind"], obj["apiVersion"] = kind, api_version
        if not self.scope.admits_object(obj):  # a pattern's cluster-wide watch: not ours
            return obj, False
        meta = obj["metadata"]
        news = True
        if event_type is None:
            # kopf (re)lists: at start, and when a watch resumes after a gap, it lists what
            # exists and says nothing of what was deleted meanwhile. `_relister` finds out.
            self.relist_wanted.set()
        if event_type == "DELETED":
            self.cache.drop(kind, meta.get("namespace", ""), meta["name"])
        else:
            news = self.cache.put(obj) or event_type is None
        metrics.MANAGED.labels(kind=kind).set(self.cache.count(kind))
        return obj, news

    def remember_pod(self, pod: dict[str, Any], deleted: bool) -> tuple[str, str] | None:
        """Record (or forget) one of the operator's pods; returns the resource it belongs
        to."""
        if not self.scope.admits(pod["metadata"].get("namespace", "")):
            return None
        key = self.pods.drop(pod) if deleted else self.pods.put(pod)
        self.count_pods()
        return key

    def remember_pod_event(self, event: dict[str, Any], deleted: bool) -> tuple[str, str] | None:
        """Record (or forget) a Warning Event about a pod; returns the resource its pod
        belongs to, or None for other pods' Events."""
        if not self.scope.admits(event["metadata"].get("namespace", "")):
            return None
        key = self.pods.put_event(event, deleted=deleted)
        self.count_pods()
        return key

    def count_pods(self) -> None:
        pods, events = self.pods.counts()
        metrics.MANAGED.labels(kind="Pod").set(pods)
        metrics.MANAGED.labels(kind="Event").set(events)

    # ------------------------------------------------------------------ reconciles

    async def reconcile(self, key: Key) -> None:
        """One reconcile of a key the queue handed out, in a thread: backoff on failure,
        a requeue when the result asks for one."""
        assert self.reconciler is not None
        with metrics.RECONCILE_SECONDS.time():
            try:
                result = await asyncio.to_thread(self.reconciler.reconcile, *key)
            except Exception as e:
                delay = self.queue.retry(key)
                metrics.RECONCILES.labels(result="error").inc()
                log.warning("reconcile %s %s/%s failed (retry in %.0fs): %s", *key, delay, e)
                return
        self.queue.forget(key)
        metrics.RECONCILES.labels(result=result.outcome).inc()
        if result.writes:
            log.info("reconciled %s %s/%s: %s (%d writes)", *key, result.outcome, result.writes)
        if result.requeue_after:
            self.enqueue(key, "requeue", delay=result.requeue_after)
        for other in result.enqueue:
            self.enqueue(other, "status")


RUNTIME = Runtime()


def queue_depth() -> int:
    return RUNTIME.queue.depth


# --------------------------------------------------------------------------- start and stop


async def start() -> None:
    """Fill the caches, then start the workers, the relister and (if asked) the election."""
    kube = Kube.connect(RUNTIME.kubeconfig)
    cfg = OperatorConfig.from_env()
    cluster_wide = RUNTIME.scope.cluster_wide
    if not cfg.api_server and cluster_wide:
        cfg = replace(cfg, api_server=await asyncio.to_thread(kube.api_server_endpoints))
    elif not cfg.api_server:  # its EndpointSlices are in `default`, which it may not read
        log.info("watching some namespaces only: the frontends' egress policies admit any "
                 "address on 443 and 6443 for the API server (the chart's "
                 "networkPolicy.apiServerEndpoints narrows it)")  # fmt: skip
    RUNTIME.reconciler = Reconciler(kube, RUNTIME.cache, cfg, RUNTIME.pods, cluster_wide)
    await asyncio.to_thread(prime_cache, kube, RUNTIME.scope)
    RUNTIME.tasks = [asyncio.create_task(_worker(i)) for i in range(WORKERS)]
    RUNTIME.tasks.append(asyncio.create_task(_relister(kube)))
    election = RUNTIME.election_config
    if election is None:
        metrics.LEADER.set(1)
        RUNTIME.leading.set()
    else:
        _stopped_leading()
        lock = LeaseLock(kube, election.namespace, election.name)
        RUNTIME.election = LeaderElection(election, lock, _started_leading, _stopped_leading)
        RUNTIME.election_task = asyncio.create_task(RUNTIME.election.run())
        RUNTIME.election_task.add_done_callback(_election_ended)


async def stop() -> None:
    """Hand the lease over (with leader election), then stop the workers and the relister."""
    if RUNTIME.election is not None:
        await _hand_over(RUNTIME.election)
    for t in RUNTIME.tasks:
        t.cancel()
    await asyncio.gather(*RUNTIME.tasks, return_exceptions=True)


def prime_cache(kube: Kube, scope: Scope) -> None:
    """List the resources and their children once before the first reconcile, so that a
    (re)started operator never mistakes a child it has not yet seen on a watch for a
    missing one."""
    relist(kube, scope)
    # Pods, then their Events: a status computed before the streams catch up already says
    # what it will say after (no write, no Event, caused by a restart).
    for ns in scope.listed:
        for pod in kube.list("Pod", ns, POD_SELECTOR):
            if scope.admits_object(pod):
                RUNTIME.pods.put(pod)
    for ns in scope.listed:
        for event in kube.list("Event", ns, field_selector=EVENT_SELECTOR):
            if scope.admits_object(event):
                RUNTIME.pods.put_event(event)
    RUNTIME.count_pods()


# --------------------------------------------------------------------------- leader election


def _election_ended(task: asyncio.Task[None]) -> None:
    """The election loop runs until shutdown; should it ever fail, this replica could
    neither lead nor stand by: stop the process (gracefully) so that it is restarted."""
    if task.cancelled():
        return
    log.error("leader election stopped unexpectedly: shutting down", exc_info=task.exception())
    os.kill(os.getpid(), signal.SIGTERM)


def _started_leading() -> None:
    """Reconcile everything known at once: the cache is already warm."""
    metrics.LEADER.set(1)
    RUNTIME.leading.set()
    for key in RUNTIME.resource_keys():
        RUNTIME.enqueue(key, "leader")


def _stopped_leading() -> None:
    metrics.LEADER.set(0)
    metrics.forget_all()  # the new leader reports the resources' status from now on
    RUNTIME.leading.clear()


async def _hand_over(election: LeaderElection) -> None:
    """Graceful shutdown of a replica with leader election: take no more keys, let the
    reconciles in flight finish (for up to the renew deadline, as when the lease is lost),
    then release the lease so that a standby takes over at its next retry."""
    if RUNTIME.election_task is not None:
        RUNTIME.election_task.cancel()  # from here on, election.is_leading() is False
        await asyncio.gather(RUNTIME.election_task, return_exceptions=True)
    _stopped_leading()
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(RUNTIME.idle.wait(), election.config.renew_deadline)
    await election.release()


# --------------------------------------------------------------------------- queue workers


async def _worker(index: int) -> None:
    while True:
        await RUNTIME.leading.wait()
        key = await RUNTIME.queue.get()
        if not RUNTIME.may_reconcile():
            # The lease lapsed a moment ago; the election loop is about to say so.
            RUNTIME.queue.done(key)
            RUNTIME.queue.add(key)
            await asyncio.sleep(0.05)
            continue
        metrics.QUEUE_DEPTH.set(RUNTIME.queue.depth)
        RUNTIME.in_flight += 1
        RUNTIME.idle.clear()
        try:
            await RUNTIME.reconcile(key)
        finally:
            RUNTIME.in_flight -= 1
            if not RUNTIME.in_flight:
                RUNTIME.idle.set()
            RUNTIME.queue.done(key)


# --------------------------------------------------------------------------- relister


def relist(kube: Kube, scope: Scope) -> set[Key]:
    """List the resources and their children afresh (and, watching every namespace, the
    namespaces) and make the cache agree, as an informer's relist does: what was deleted
    while a watch was away is forgotten. Returns the resources whose objects changed."""
    keys: set[Key] = set()
    for kind in (*RESOURCES, *CHILDREN):
        selector = "" if kind in RESOURCES else MANAGED_SELECTOR
        for ns in scope.listed:
            mark = RUNTIME.cache.mark()
            try:
                objs = [o for o in kube.list(kind.kind, ns, selector) if scope.admits_object(o)]
            except KubeError as e:
                if kind.optional and e.status == 404:
                    break  # its API is not served (KEDA is not installed): nothing to know
                raise
            for obj in RUNTIME.cache.replace(kind.kind, ns, objs, mark):
                meta = obj["metadata"]
                key = (kind.kind, meta["namespace"], meta["name"])
                owner = key if kind in RESOURCES else owner_of(obj)
                if owner:
                    keys.add(owner)
        metrics.MANAGED.labels(kind=kind.kind).set(RUNTIME.cache.count(kind.kind))
    if scope.cluster_wide:
        mark = RUNTIME.cache.mark()
        namespaces = [n for n in kube.list(NAMESPACE.kind, None) if scope.admits_object(n)]
        if RUNTIME.cache.replace(NAMESPACE.kind, None, namespaces, mark):
            keys |= {(GATEWAY_KIND, ns, name) for ns, name in RUNTIME.cache.keys(GATEWAY_KIND)}
    if any(k[0] == KIND for k in keys):  # a deployment changed: the gateways may route it
        keys |= {(GATEWAY_KIND, ns, name) for ns, name in RUNTIME.cache.keys(GATEWAY_KIND)}
    return keys


async def _relister(kube: Kube) -> None:
    """Relist once kopf's burst of (re)listings is over, so that a child deleted while a
    watch was away (an API server restart) is forgotten and applied again. Every
    `RUNTIME.resync_seconds` (`--resync-period`), reconcile every resource from the cache,
    as informers resync: no request at steady state."""
    while True:
        try:
            await asyncio.wait_for(RUNTIME.relist_wanted.wait(), RUNTIME.resync_seconds)
        except TimeoutError:
            for key in RUNTIME.resource_keys():
                RUNTIME.enqueue(key, "resync")
            continue
        while RUNTIME.relist_wanted.is_set():  # until the listings settle
            RUNTIME.relist_wanted.clear()
            await asyncio.sleep(RELIST_SETTLE_SECONDS)
        try:
            keys = await asyncio.to_thread(relist, kube, RUNTIME.scope)
        except Exception as e:  # the API server is away again: once it is back
            log.warning("relisting failed (again in %.0fs): %s", RELIST_RETRY_SECONDS, e)
            await asyncio.sleep(RELIST_RETRY_SECONDS)
            RUNTIME.relist_wanted.set()
            continue
        if keys:
            log.info("relisted: %d resources changed while not watched", len(keys))
        for key in keys:
            RUNTIME.enqueue(key, "relist")
