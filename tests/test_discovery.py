"""Route table reloads and EndpointSlice folding (the watch itself runs in e2e)."""

from __future__ import annotations

import os
from pathlib import Path

from transcription_api.capabilities import Engine, Mode
from transcription_api.routes import PoolRoute, RouteTable
from transcription_frontend.discovery import SliceIndex, TableWatcher, ready_urls, slice_endpoints
from transcription_frontend.routing import Router


def table(*pools: str, aliases: tuple[str, ...] = ()) -> RouteTable:
    return RouteTable(model="m", aliases=list(aliases), pools=[
        PoolRoute(name=p, engine=Engine.VLLM, mode=Mode.CONTINUOUS, service=f"w-{p}") for p in pools
    ])  # fmt: skip


def slice_(service: str, name: str, *endpoints: tuple[str, bool | None]) -> dict[str, object]:
    return {
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
