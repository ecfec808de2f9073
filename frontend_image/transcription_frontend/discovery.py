"""Where the route table and the worker endpoints come from.

- The route table is a file (the operator's ConfigMap, mounted): re-read whenever it
  changes (kubelet swaps ConfigMap volumes atomically, so a changed mtime or inode of the
  path means a new table).
- Worker endpoints are either listed in the table (`static`, for local runs) or read from
  the EndpointSlices of each pool's Service (`kubernetes`): a watch on the namespace's
  EndpointSlices, keeping the addresses whose `ready` condition is true.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from pathlib import Path
from typing import Any

from transcription_api.routes import RouteTable

from . import metrics
from .routing import Router

log = logging.getLogger("transcription_frontend.discovery")
SERVICE_LABEL = "kubernetes.io/service-name"


def load_table(path: Path) -> RouteTable:
    return RouteTable.model_validate_json(path.read_text())


class TableWatcher:
    """Polls the route table file and swaps the router's table when it changes."""

    def __init__(self, path: Path, router: Router, interval: float = 2.0) -> None:
        self.path = path
        self.router = router
        self.interval = interval
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
        self.router.set_table(table)
        log.info("route table reloaded: %d pool(s)", len(table.pools))
        return True

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            self.check()


def ready_urls(slice_: dict[str, Any], default_port: int) -> list[str]:
    """Base URLs of the ready endpoints of one EndpointSlice."""
    ports = slice_.get("ports") or []
    port = next((p["port"] for p in ports if p.get("name") == "http"), None)
    port = port or (ports[0]["port"] if ports else default_port)
    urls = []
    for ep in slice_.get("endpoints") or []:
        if (ep.get("conditions") or {}).get("ready") is False:
            continue
        for addr in ep.get("addresses") or []:
            host = f"[{addr}]" if ":" in addr else addr
            urls.append(f"http://{host}:{port}")
    return urls


class SliceIndex:
    """EndpointSlices by Service, folded into the router's per-pool endpoint lists."""

    def __init__(self, router: Router) -> None:
        self.router = router
        self._slices: dict[str, dict[str, list[str]]] = {}  # service -> slice -> urls

    def update(self, event: str, slice_: dict[str, Any]) -> None:
        meta = slice_.get("metadata") or {}
        service = (meta.get("labels") or {}).get(SERVICE_LABEL)
        if not service:
            return
        pool = self.router.pool_for_service(service)
        slices = self._slices.setdefault(service, {})
        if event == "DELETED":
            slices.pop(meta.get("name", ""), None)
        else:
            slices[meta.get("name", "")] = ready_urls(slice_, pool.port if pool else 8000)
        self.refresh()

    def refresh(self) -> None:
        for pool in self.router.table.pools:
            urls = sorted({u for us in self._slices.get(pool.service, {}).values() for u in us})
            self.router.set_endpoints(pool.name, urls)
            metrics.ENDPOINTS.labels(pool=pool.name).set(len(urls))


class EndpointSliceWatcher:
    """Watches EndpointSlices of one namespace in a thread (the official client is sync)."""

    def __init__(self, router: Router, namespace: str, kubeconfig: str | None = None) -> None:
        self.index = SliceIndex(router)
        self.namespace = namespace
        self.kubeconfig = kubeconfig
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="endpointslices", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        from kubernetes import client, config, watch

        if self.kubeconfig:
            config.load_kube_config(config_file=self.kubeconfig)  # type: ignore[no-untyped-call]
        else:
            config.load_incluster_config()  # type: ignore[no-untyped-call]
        api = client.DiscoveryV1Api()
        while not self._stop.is_set():
            try:
                w = watch.Watch()  # type: ignore[no-untyped-call]
                for ev in w.stream(  # type: ignore[no-untyped-call]
                    api.list_namespaced_endpoint_slice, self.namespace, timeout_seconds=300
                ):
                    obj = api.api_client.sanitize_for_serialization(ev["object"])
                    self.index.update(ev["type"], obj)
                    if self._stop.is_set():
                        w.stop()  # type: ignore[no-untyped-call]
            except Exception as e:  # reconnect on any watch failure
                log.warning("EndpointSlice watch failed, retrying in 2s: %s", e)
                self._stop.wait(2.0)
