"""Where the route table and the worker endpoints come from.

- The route table is a file (the operator's ConfigMap, mounted): one deployment's
  `RouteTable`, or a gateway's `Routes` (catalog.py), re-read whenever it changes (kubelet
  swaps ConfigMap volumes atomically, so a changed mtime or inode of the path means a new
  table).
- Worker endpoints are either listed in the table (`static`, for local runs) or read from
  the EndpointSlices of each pool's Service (`kubernetes`): a list, then a watch from it, per
  namespace (RBAC is granted per namespace), keeping the addresses that are ready and not
  terminating. The frontend watches its own namespace (a one-deployment table's pools are
  there) and each namespace a gateway's tables name, and starts and stops those watches as
  the tables change.
- A watch never goes quiet unnoticed: the API server ends each one after `WATCH_SECONDS`,
  and a connection that sends nothing for `READ_SECONDS` (one that a paused API server or a
  lost connection left hanging) is dropped; either way the namespace is listed again, and
  the list replaces what the index had of it, so a slice deleted while no watch ran is
  forgotten too (client-go's reflector does the same).
- The frontend's peers (the other replicas behind its own Service, the settings' `peers_service`,
  in its own namespace) come from the same watch: they sum their load for the autoscaler
  (`load.py`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from transcription_api.routes import Routes, RouteTable

from . import metrics
from .routing import Router

log = logging.getLogger("transcription_frontend.discovery")
SERVICE_LABEL = "kubernetes.io/service-name"
WATCH_SECONDS = 60  # the API server ends a watch after this (then: list, watch again)
READ_SECONDS = WATCH_SECONDS + 15  # a watch that sends nothing for this long is dropped
CONNECT_SECONDS = 10
RETRY_SECONDS = 2.0  # after a failed list or watch


def load_table(path: Path) -> RouteTable | Routes:
    """The route-table file: a gateway's `Routes` (it has `deployments`), else one
    deployment's `RouteTable`. ValueError if it is neither."""
    text = path.read_text()
    doc = json.loads(text)
    if isinstance(doc, dict) and "deployments" in doc:
        return Routes.model_validate_json(text)
    return RouteTable.model_validate_json(text)


class TableWatcher:
    """Polls the route table file and swaps the router's routes when it changes (then tells
    `on_reload`)."""

    def __init__(
        self, path: Path, router: Router, interval: float = 2.0,
        on_reload: Callable[[], None] = lambda: None,
    ) -> None:  # fmt: skip
        self.path = path
        self.router = router
        self.interval = interval
        self.on_reload = on_reload
        self._seen = self._stamp()

    def _stamp(self) -> tuple[int, int, int] | None:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return (st.st_ino, st.st_mtime_ns, st.st_size)

    def check(self) -> bool:
        stamp = self._stamp()
        if stamp == self._seen or stamp is None:
            return False
        self._seen = stamp
        try:
            table = load_table(self.path)
        except (OSError, ValueError) as e:
            log.error("route table %s is invalid, keeping the previous one: %s", self.path, e)
            return False
        self.router.set_routes(table)
        catalog = self.router.catalog
        log.info("route table reloaded: %d deployment(s), %d pool(s)", len(catalog.tables),
                 len(catalog.pools))  # fmt: skip
        self.on_reload()
        return True

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            self.check()


@dataclass(frozen=True)
class SliceEndpoint:
    """One address of an EndpointSlice, with its conditions as Kubernetes defines them."""

    url: str
    ready: bool  # takes new traffic (false while terminating)
    serving: bool  # still answers: a terminating endpoint finishing its requests
    terminating: bool
    pod: str | None = None  # the pod behind the address (targetRef), for metrics labels


def slice_endpoints(slice_: dict[str, Any], default_port: int) -> list[SliceEndpoint]:
    """The addresses of one EndpointSlice on its `http` port (else its first port).

    An absent `ready` counts as ready and an absent `serving` as `ready`, as the
    EndpointSlice API says consumers must read them.
    """
    ports = slice_.get("ports") or []
    port = next((p["port"] for p in ports if p.get("name") == "http"), None)
    port = port or (ports[0]["port"] if ports else default_port)
    out = []
    for ep in slice_.get("endpoints") or []:
        cond = ep.get("conditions") or {}
        ready = cond.get("ready") is not False
        serving = ready if cond.get("serving") is None else bool(cond["serving"])
        terminating = cond.get("terminating") is True
        ref = ep.get("targetRef") or {}
        pod = ref.get("name") if ref.get("kind", "Pod") == "Pod" else None
        for addr in ep.get("addresses") or []:
            host = f"[{addr}]" if ":" in addr else addr
            out.append(SliceEndpoint(f"http://{host}:{port}", ready, serving, terminating, pod))
    return out


def ready_urls(slice_: dict[str, Any], default_port: int) -> list[str]:
    """Base URLs that may get new requests: ready, and not terminating."""
    return [e.url for e in slice_endpoints(slice_, default_port) if e.ready and not e.terminating]


class SliceIndex:
    """EndpointSlices by (namespace, Service), folded into the router's per-pool endpoint
    lists, and (when `peers_service` is set) into the frontend's list of peers (`load.py`).

    Every slice of the watched namespaces is kept, so that a pool that a new route table
    adds gets its Service's endpoints at once (`refresh`). A pool whose Service no slice
    has named yet keeps the route table's static endpoints. A slice without a namespace
    (one written by hand) counts as in `namespace`, the frontend's own.
    """

    def __init__(
        self,
        router: Router,
        peers_service: str | None = None,
        on_peers: Callable[[list[str]], None] | None = None,
        namespace: str = "default",
    ) -> None:
        self.router = router
        self.peers_service = peers_service
        self.on_peers = on_peers
        self.namespace = namespace
        # (namespace, service) -> slice name -> its endpoints
        self._slices: dict[tuple[str, str], dict[str, list[SliceEndpoint]]] = {}

    def update(self, event: str, slice_: dict[str, Any]) -> None:
        """One watch event (ADDED, MODIFIED, DELETED) of a slice."""
        self._fold(event, slice_)
        self.refresh()

    def replace(self, namespace: str, slices: list[dict[str, Any]]) -> None:
        """A fresh list of `namespace`'s slices: it replaces what the index had of it."""
        self._drop(namespace)
        for slice_ in slices:
            slice_.setdefault("metadata", {}).setdefault("namespace", namespace)
            self._fold("ADDED", slice_)
        self.refresh()

    def forget(self, namespace: str) -> None:
        """The namespace is no longer watched: its slices are dropped."""
        self._drop(namespace)
        self.refresh()

    def _fold(self, event: str, slice_: dict[str, Any]) -> None:
        meta = slice_.get("metadata") or {}
        service = (meta.get("labels") or {}).get(SERVICE_LABEL)
        if not service:
            return
        key = (meta.get("namespace") or self.namespace, service)
        pool = self.router.catalog.pool_for_service(*key)
        slices = self._slices.setdefault(key, {})
        if event == "DELETED":
            slices.pop(meta.get("name", ""), None)
        else:
            slices[meta.get("name", "")] = slice_endpoints(slice_, pool.port if pool else 8080)

    def _drop(self, namespace: str) -> None:
        # The keys stay, empty: `refresh` then gives their pools no endpoints.
        for key in [k for k in self._slices if k[0] == namespace]:
            self._slices[key] = {}

    def _endpoints(self, key: tuple[str, str]) -> list[SliceEndpoint]:
        return [e for eps in self._slices.get(key, {}).values() for e in eps]

    def refresh(self) -> None:
        """Fold the slices into the pools of the router's current route tables."""
        catalog = self.router.catalog
        pods = {}
        for key in self._slices:
            pool = catalog.pool_for_service(*key)
            if pool is None:
                continue
            eps = self._endpoints(key)
            pods.update({e.url: e.pod for e in eps if e.pod})
            urls = sorted({e.url for e in eps if e.ready and not e.terminating})
            self.router.set_endpoints(pool.name, urls)
            metrics.ENDPOINTS.labels(pool=pool.name).set(len(urls))
        self.router.name_endpoints(pods)
        if self.peers_service and self.on_peers:
            # Terminating peers still count: their requests in flight are load.
            eps = self._endpoints((self.namespace, self.peers_service))
            self.on_peers(sorted({e.url for e in eps if e.serving or e.ready}))


class EndpointSliceWatcher:
    """Lists, then watches, the EndpointSlices of one namespace in a thread (the official
    client is sync), over and over (the module's docstring).

    Lists go to `index.replace` and events to `index.update`, on `loop` (the gateway's event
    loop, so that the router is only ever changed there and held requests wake at once), or
    in the watch thread when no loop is given; none once `stop` was called (on the loop:
    none after it).
    """

    def __init__(
        self,
        index: SliceIndex,
        namespace: str,
        kubeconfig: str | None = None,
        loop: asyncio.AbstractEventLoop | None = None,
        watch_seconds: int = WATCH_SECONDS,
        read_seconds: float = READ_SECONDS,
    ) -> None:
        self.index = index
        self.namespace = namespace
        self.kubeconfig = kubeconfig
        self.loop = loop
        self.watch_seconds = watch_seconds
        self.read_seconds = read_seconds
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name=f"endpointslices-{namespace}", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _on_loop(self, apply: Callable[[], None]) -> None:
        if self.loop is None:
            self._unless_stopped(apply)
        elif not self.loop.is_closed():
            self.loop.call_soon_threadsafe(self._unless_stopped, apply)

    def _unless_stopped(self, apply: Callable[[], None]) -> None:
        if not self._stop.is_set():
            apply()

    def _deliver(self, event: str, obj: dict[str, Any]) -> None:
        obj.setdefault("metadata", {}).setdefault("namespace", self.namespace)
        self._on_loop(lambda: self.index.update(event, obj))

    def _run(self) -> None:
        from kubernetes import client, config

        if self.kubeconfig:
            config.load_kube_config(config_file=self.kubeconfig)  # type: ignore[no-untyped-call]
        else:
            config.load_incluster_config()  # type: ignore[no-untyped-call]
        api = client.DiscoveryV1Api()
        while not self._stop.is_set():
            try:
                self._list_and_watch(api)
            except Exception as e:  # list and watch again on any failure
                log.warning(
                    "EndpointSlice list or watch of namespace %s failed, retrying in %gs: %s",
                    self.namespace, RETRY_SECONDS, e,
                )  # fmt: skip
                self._stop.wait(RETRY_SECONDS)

    def _list_and_watch(self, api: Any) -> None:
        """One list (replacing the namespace's slices in the index) and one watch from it,
        until the API server ends the watch, it sends nothing for `read_seconds`, or `stop`."""
        from kubernetes import watch

        timeouts = (CONNECT_SECONDS, self.read_seconds)
        listed = api.list_namespaced_endpoint_slice(self.namespace, _request_timeout=timeouts)
        items = api.api_client.sanitize_for_serialization(listed.items)
        self._on_loop(lambda: self.index.replace(self.namespace, items))
        w = watch.Watch()  # type: ignore[no-untyped-call]
        for ev in w.stream(  # type: ignore[no-untyped-call]
            api.list_namespaced_endpoint_slice, self.namespace,
            resource_version=listed.metadata.resource_version, allow_watch_bookmarks=True,
            timeout_seconds=self.watch_seconds, _request_timeout=timeouts,
        ):  # fmt: skip
            if self._stop.is_set():
                w.stop()  # type: ignore[no-untyped-call]
                return
            if ev["type"] in ("ADDED", "MODIFIED", "DELETED"):  # not BOOKMARK
                self._deliver(ev["type"], ev["raw_object"])


class SliceWatches:
    """One EndpointSlice watch per namespace, started and stopped as the namespaces to
    watch change (`sync`, on the event loop)."""

    def __init__(
        self, index: SliceIndex, kubeconfig: str | None, loop: asyncio.AbstractEventLoop
    ) -> None:
        self.index = index
        self.kubeconfig = kubeconfig
        self.loop = loop
        self.watching: dict[str, EndpointSliceWatcher] = {}

    def sync(self, namespaces: set[str]) -> None:
        for ns in sorted(namespaces - set(self.watching)):
            log.info("watching the EndpointSlices of namespace %s", ns)
            self.watching[ns] = EndpointSliceWatcher(self.index, ns, self.kubeconfig, self.loop)
            self.watching[ns].start()
        for ns in sorted(set(self.watching) - namespaces):
            log.info("no longer watching the EndpointSlices of namespace %s", ns)
            self.watching.pop(ns).stop()
            self.index.forget(ns)

    def stop(self) -> None:
        self.sync(set())
