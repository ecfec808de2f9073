"""Route table reloads, EndpointSlice folding, and the list-and-watch against an API server
stand-in over real HTTP (against the real API server: e2e/test_discovery.py)."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest

from transcription_api.capabilities import Engine, Mode
from transcription_api.routes import PoolRoute, RouteTable
from transcription_frontend import discovery
from transcription_frontend.discovery import (
    EndpointSliceWatcher,
    SliceIndex,
    TableWatcher,
    ready_urls,
    slice_endpoints,
)
from transcription_frontend.routing import Router


def table(*pools: str, aliases: tuple[str, ...] = ()) -> RouteTable:
    return RouteTable(model="m", aliases=list(aliases), pools=[
        PoolRoute(name=p, engine=Engine.VLLM, mode=Mode.CONTINUOUS, service=f"w-{p}") for p in pools
    ])  # fmt: skip


def slice_(service: str, name: str, *endpoints: tuple[str, bool | None]) -> dict[str, object]:
    return {
        "addressType": "IPv4",
        "metadata": {"name": name, "labels": {"kubernetes.io/service-name": service}},
        "ports": [{"name": "http", "port": 8000}],
        "endpoints": [
            {"addresses": [ip], "conditions": {} if ready is None else {"ready": ready}}
            for ip, ready in endpoints
        ],
    }


def test_ready_urls_keep_ready_addresses_only() -> None:
    s = slice_("w-a", "s1", ("10.0.0.1", True), ("10.0.0.2", False), ("fd00::3", None))
    assert ready_urls(s, 9999) == ["http://10.0.0.1:8000", "http://[fd00::3]:8000"]


def test_slices_fold_into_pool_endpoints() -> None:
    router = Router(table("a", "b"))
    index = SliceIndex(router)
    index.update("ADDED", slice_("w-a", "s1", ("10.0.0.1", True)))
    index.update("ADDED", slice_("w-a", "s2", ("10.0.0.2", True)))
    index.update("ADDED", slice_("other", "s3", ("10.0.0.9", True)))  # not a pool Service
    assert router.endpoints("a") == ["http://10.0.0.1:8000", "http://10.0.0.2:8000"]
    assert router.endpoints("b") == []
    index.update("MODIFIED", slice_("w-a", "s1", ("10.0.0.1", False)))
    index.update("DELETED", slice_("w-a", "s2"))
    assert router.endpoints("a") == []


def test_route_table_file_is_reloaded_when_it_changes(tmp_path: Path) -> None:
    path = tmp_path / "routes.json"
    path.write_text(table("a").dumps())
    router = Router(table("a"))
    watcher = TableWatcher(path, router)
    assert not watcher.check()  # unchanged
    # kubelet swaps ConfigMap volumes atomically: a new file replaces the old one
    new = tmp_path / "routes.new"
    new.write_text(table("a", "b", aliases=("whisper-1",)).dumps())
    os.replace(new, path)
    assert watcher.check()
    assert [p.name for p in router.catalog.pools] == ["a", "b"]
    assert router.catalog.resolve("whisper-1").model == "m"


def test_an_invalid_route_table_keeps_the_previous_one(tmp_path: Path) -> None:
    path = tmp_path / "routes.json"
    path.write_text(table("a").dumps())
    router = Router(table("a"))
    watcher = TableWatcher(path, router)
    path.write_text("{not json")
    os.utime(path, ns=(1, 1))
    assert not watcher.check()
    assert [p.name for p in router.catalog.pools] == ["a"]


def conditions_slice(
    service: str, name: str, *eps: tuple[str, dict[str, bool]]
) -> dict[str, object]:
    return {
        "metadata": {"name": name, "labels": {"kubernetes.io/service-name": service}},
        "ports": [{"name": "metrics", "port": 9090}, {"name": "http", "port": 8080}],
        "endpoints": [{"addresses": [ip], "conditions": c} for ip, c in eps],
    }


TERMINATING = {"ready": False, "serving": True, "terminating": True}
DRAINED = {"ready": False, "serving": False, "terminating": True}
STARTING = {"ready": False, "serving": False, "terminating": False}
READY = {"ready": True, "serving": True, "terminating": False}


def test_endpoint_conditions_terminating_ones_get_no_new_requests() -> None:
    s = conditions_slice("w-a", "s1", ("10.0.0.1", READY), ("10.0.0.2", TERMINATING),
                         ("10.0.0.3", DRAINED), ("10.0.0.4", STARTING),
                         # publishNotReadyAddresses keeps ready=true on a terminating pod
                         ("10.0.0.5", {"ready": True, "serving": True, "terminating": True}))  # fmt: skip
    assert ready_urls(s, 1) == ["http://10.0.0.1:8080"]  # the `http` port, not the first
    eps = {e.url.split("//")[1]: e for e in slice_endpoints(s, 1)}
    assert eps["10.0.0.2:8080"].serving and eps["10.0.0.2:8080"].terminating
    assert not eps["10.0.0.3:8080"].serving


def test_peers_come_from_the_frontend_services_slices() -> None:
    router = Router(table("a"))
    peers: list[list[str]] = []
    index = SliceIndex(router, peers_service="whisper", on_peers=peers.append)
    index.update("ADDED", conditions_slice("whisper", "f1", ("10.0.1.1", READY), ("10.0.1.2", TERMINATING), ("10.0.1.3", STARTING)))  # fmt: skip
    # A terminating peer still has requests in flight: its load counts until it is gone.
    assert peers[-1] == ["http://10.0.1.1:8080", "http://10.0.1.2:8080"]
    assert router.endpoints("a") == []
    index.update("DELETED", conditions_slice("whisper", "f1"))
    assert peers[-1] == []


def test_static_endpoints_stay_until_discovery_reports_the_pools_service() -> None:
    t = RouteTable(model="m", pools=[
        PoolRoute(name="a", engine=Engine.VLLM, mode=Mode.CONTINUOUS, service="w-a", endpoints=["http://127.0.0.1:1"]),
        PoolRoute(name="b", engine=Engine.VLLM, mode=Mode.CONTINUOUS, service="w-b", endpoints=["http://127.0.0.1:2"]),
    ])  # fmt: skip
    router = Router(t)
    index = SliceIndex(router)
    index.update("ADDED", conditions_slice("w-a", "s1", ("10.0.0.1", READY)))
    assert router.endpoints("a") == ["http://10.0.0.1:8080"]
    assert router.endpoints("b") == ["http://127.0.0.1:2"]


def test_a_fresh_list_replaces_the_namespaces_slices_and_no_other() -> None:
    """What a relist brings replaces what the index had of that namespace: a slice deleted
    while no watch ran is forgotten; another namespace's slices stay."""
    router = Router(table("a", "b"))
    index = SliceIndex(router)
    index.update("ADDED", slice_("w-a", "old", ("10.0.0.1", True)))
    elsewhere = slice_("w-b", "elsewhere", ("10.9.0.1", True))
    elsewhere["metadata"] = {**elsewhere["metadata"], "namespace": "other"}  # type: ignore[dict-item]
    index.update("ADDED", elsewhere)
    index.replace("default", [slice_("w-a", "new", ("10.0.0.2", True))])
    assert router.endpoints("a") == ["http://10.0.0.2:8000"]
    assert router.endpoints("b") == ["http://10.9.0.1:8000"]
    index.replace("default", [])
    assert router.endpoints("a") == []
    assert router.endpoints("b") == ["http://10.9.0.1:8000"]


class _SliceServer:
    """An API server stand-in for one namespace's EndpointSlices over real HTTP: each list
    answers the next of `lists`; each watch sends `events` (JSON lines), then nothing,
    keeping the connection open: a watch left hanging, as by a paused API server."""

    def __init__(self, lists: list[list[dict[str, object]]], events: list[dict[str, object]]):
        self.lists, self.events = lists, events
        self.served: list[str] = []  # "list" / "watch", in order
        self.hang = threading.Event()
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                query = parse_qs(urlsplit(self.path).query)
                if query.get("watch") == ["true"]:
                    stand_in.served.append("watch")
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Transfer-Encoding", "chunked")
                    self.end_headers()
                    for ev in stand_in.events:
                        line = json.dumps(ev).encode() + b"\n"
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
                    self.wfile.flush()
                    stand_in.hang.wait(30)  # sends nothing more
                    return
                n = sum(1 for s in stand_in.served if s == "list")
                stand_in.served.append("list")
                items = stand_in.lists[min(n, len(stand_in.lists) - 1)]
                body = json.dumps({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSliceList",
                                   "metadata": {"resourceVersion": str(10 + n)},
                                   "items": items}).encode()  # fmt: skip
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.http.daemon_threads = True
        threading.Thread(target=self.http.serve_forever, daemon=True).start()

    def kubeconfig(self, path: Path) -> str:
        url = f"http://127.0.0.1:{self.http.server_address[1]}"
        path.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "c",
            "clusters": [{"name": "c", "cluster": {"server": url}}],
            "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
            "users": [{"name": "u", "user": {}}],
        }))  # fmt: skip
        return str(path)

    def close(self) -> None:
        self.hang.set()
        self.http.shutdown()
        self.http.server_close()


def _wait(check: Callable[[], bool], seconds: float) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if check():
            return True
        time.sleep(0.05)
    return check()


def test_a_watch_that_goes_quiet_is_dropped_and_the_namespace_listed_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first list has the pod at 10.0.0.1; the watch moves it to 10.0.0.3, then hangs.
    Past the read timeout the watcher lists again: the second list (the pod replaced by one
    at 10.0.0.2, the old slice deleted meanwhile) is what the router has, with nothing of
    the first left."""
    monkeypatch.setattr(discovery, "RETRY_SECONDS", 0.1)
    first = slice_("w-a", "s1", ("10.0.0.1", True))
    moved = slice_("w-a", "s1", ("10.0.0.3", True))
    second = slice_("w-a", "s2", ("10.0.0.2", True))
    server = _SliceServer([[first], [second]], [{"type": "MODIFIED", "object": moved}])
    router = Router(table("a"))
    watcher = EndpointSliceWatcher(SliceIndex(router), "default",
                                   server.kubeconfig(tmp_path / "kubeconfig"), read_seconds=1)  # fmt: skip
    watcher.start()
    try:
        assert _wait(lambda: router.endpoints("a") == ["http://10.0.0.3:8000"], 5), (
            router.endpoints("a")
        )
        assert _wait(lambda: router.endpoints("a") == ["http://10.0.0.2:8000"], 5), (
            router.endpoints("a")
        )
        assert server.served[:3] == ["list", "watch", "list"]
    finally:
        watcher.stop()
        server.close()
