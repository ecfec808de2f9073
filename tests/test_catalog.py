"""The models a frontend serves (transcription_frontend/catalog.py), read from one deployment's
route table or a gateway's `Routes`; the multipart parser's field hook that routes a request
at its `model` field; EndpointSlices of several namespaces. Without HTTP (the gateway over
HTTP: test_gateway_routing.py)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from transcription_api.capabilities import Engine, Mode
from transcription_api.errors import APIError
from transcription_api.multipart import Limit, parse_upload
from transcription_api.routes import PoolRoute, RefusedDeployment, Routes, RouteTable
from transcription_frontend import discovery
from transcription_frontend.auth import Key
from transcription_frontend.catalog import Catalog
from transcription_frontend.discovery import SliceIndex, SliceWatches, TableWatcher, load_table
from transcription_frontend.routing import Router


def pool(name: str, service: str = "workers") -> PoolRoute:
    return PoolRoute(name=name, engine=Engine.VLLM, mode=Mode.CONTINUOUS, service=service)


def table(model: str, *aliases: str, namespace: str = "speech", limit: int = 26_214_400
          ) -> RouteTable:  # fmt: skip
    return RouteTable(model=model, aliases=list(aliases), namespace=namespace,
                      deployment=f"{namespace}/{model}", max_upload_bytes=limit,
                      pools=[pool(f"{model}/batch")])  # fmt: skip


COPYCAT = RefusedDeployment(deployment="speech/copycat", names=["copycat", "whisper-1"],
                            reason="NameConflict",
                            message="whisper-1 is already claimed by speech/large.")  # fmt: skip
ROUTES = Routes(deployments=[table("large", "whisper-1"), table("tiny", "t", namespace="drafts")],
                refused=[COPYCAT])  # fmt: skip


def error(catalog: Catalog, name: str | None, key: Key | None = None) -> APIError:
    with pytest.raises(APIError) as e:
        catalog.resolve(name, key)
    return e.value


# ---- names


def test_every_name_resolves_to_its_deployments_table() -> None:
    catalog = Catalog(ROUTES)
    assert {n: catalog.resolve(n).deployment for n in catalog.names} == {
        "large": "speech/large", "whisper-1": "speech/large", "tiny": "drafts/tiny", "t": "drafts/tiny",
    }  # fmt: skip
    assert [p.name for p in catalog.pools] == ["large/batch", "tiny/batch"]
    assert catalog.namespaces == {"speech", "drafts"}


def test_unknown_refused_and_missing_names_say_what_is_valid_and_why() -> None:
    catalog = Catalog(ROUTES)
    unknown = error(catalog, "nope")
    assert (unknown.status, unknown.param, unknown.code) == (404, "model", "model_not_found")
    assert (
        unknown.message
        == "The model `nope` does not exist. Valid models: large, whisper-1, tiny, t"
    )
    refused = error(catalog, "copycat")
    assert refused.status == 404
    assert refused.message == (
        "The model `copycat` is claimed by deployment speech/copycat, which this gateway does not "
        "route: whisper-1 is already claimed by speech/large (NameConflict). Valid models: large, "
        "whisper-1, tiny, t"
    )
    # A name both claim is the earlier deployment's.
    assert catalog.resolve("whisper-1").model == "large"
    for missing in (None, ""):
        e = error(catalog, missing)
        assert (e.status, e.param, e.code) == (400, "model", "missing_model")
        assert e.message.endswith("Valid models: large, whisper-1, tiny, t")


def test_a_one_deployment_table_keeps_its_default_and_a_gateway_of_one_has_none() -> None:
    one = table("large", "whisper-1")
    assert Catalog(one).resolve(None) is one
    assert Catalog(one).resolve("") is one
    assert Catalog(one).namespaces == set()  # its pools are in the frontend's namespace
    assert error(Catalog(Routes(deployments=[one])), None).status == 400


def test_a_gateway_routing_no_deployment_says_so_and_why() -> None:
    assert error(Catalog(Routes()), "large").message == (
        "The model `large` does not exist: this gateway routes no deployment."
    )
    assert error(Catalog(Routes(refused=[COPYCAT])), None).message == (
        "The model `` does not exist: this gateway routes no deployment. Not routed: "
        "speech/copycat: whisper-1 is already claimed by speech/large (NameConflict)."
    )


def test_a_key_scoped_to_one_deployments_names_cannot_use_the_others() -> None:
    catalog = Catalog(ROUTES)
    key = Key(b"sk", frozenset({"t"}))
    assert catalog.resolve("tiny", key).model == "tiny"
    e = error(catalog, "whisper-1", key)
    assert (e.status, e.code) == (403, "model_not_allowed")
    assert error(catalog, "nope", key).status == 404  # unknown first, as ever


def test_a_deployments_lower_upload_limit_bounds_what_is_routed_to_it() -> None:
    catalog = Catalog(Routes(deployments=[table("large"), table("small", limit=1000)]))
    assert catalog.upload_limit(catalog.resolve("large")) is None
    limit = catalog.upload_limit(catalog.resolve("small"))
    assert limit is not None and limit.bytes == 1000
    assert (limit.error.status, limit.error.param) == (413, "file")
    assert "deployment speech/small" in limit.error.message
    assert Catalog(table("large")).upload_limit(table("large")) is None


# ---- the parser's field hook

BOUNDARY = "b0undary"


def form(*parts: tuple[str, bytes]) -> bytes:
    out = b""
    for name, value in parts:
        filename = '; filename="a.wav"' if name == "file" else ""
        out += (f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="{name}"{filename}\r\n\r\n'
                .encode() + value + b"\r\n")  # fmt: skip
    return out + f"--{BOUNDARY}--\r\n".encode()


def chunks(body: bytes, pulled: list[int], size: int = 64 * 1024) -> AsyncIterator[bytes]:
    async def gen() -> AsyncIterator[bytes]:
        for i in range(0, len(body), size):
            pulled.append(size)
            yield body[i : i + size]

    return gen()


def parse(body: bytes, on_field: Any, limit: int = 30 * 1024 * 1024) -> tuple[Any, int]:
    pulled: list[int] = []
    ctype = f"multipart/form-data; boundary={BOUNDARY}"
    try:
        result: Any = asyncio.run(parse_upload(chunks(body, pulled), ctype, limit, on_field))
    except APIError as e:
        result = e
    return result, sum(pulled)


def test_a_field_refused_by_the_hook_stops_the_parse_before_the_file_is_read() -> None:
    seen: list[tuple[str, str]] = []

    def refuse(name: str, value: str) -> Limit | None:
        seen.append((name, value))
        if name == "model":
            raise APIError(404, f"no {value}")
        return None

    body = form(("language", b"en"), ("model", b"nope"), ("file", b"\0" * 20 * 1024 * 1024))
    error, read = parse(body, refuse)
    assert isinstance(error, APIError) and error.message == "no nope"
    assert seen == [("language", "en"), ("model", "nope")]
    assert read <= 64 * 1024  # the first chunk: the fields and the file's first bytes
    # After the file, the same field is refused once the file is read (it was spooled).
    error, read = parse(form(("file", b"\0" * 1024 * 1024), ("model", b"nope")), refuse)
    assert isinstance(error, APIError) and read > 1024 * 1024


def test_a_lower_limit_from_the_hook_refuses_the_file_past_it_before_or_after_it() -> None:
    small = Limit(1000, APIError(413, "too large for small"))

    def lower(name: str, value: str) -> Limit | None:
        return small if name == "model" else None

    for parts in ((("model", b"small"), ("file", b"\0" * 5000)),
                  (("file", b"\0" * 5000), ("model", b"small"))):  # fmt: skip
        error, _ = parse(form(*parts), lower)
        assert isinstance(error, APIError) and error.message == "too large for small", parts
    upload, _ = parse(form(("model", b"small"), ("file", b"\0" * 1000)), lower)
    assert upload.size == 1000 and upload.fields == [("model", "small")]


# ---- route tables and EndpointSlices of several namespaces


def slice_(namespace: str | None, service: str, ip: str, name: str = "s1") -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "labels": {"kubernetes.io/service-name": service}}
    if namespace:
        meta["namespace"] = namespace
    return {"metadata": meta, "ports": [{"name": "http", "port": 8000}],
            "endpoints": [{"addresses": [ip], "conditions": {"ready": True}}]}  # fmt: skip


def test_slices_of_each_namespace_go_to_that_namespaces_pool() -> None:
    router = Router(ROUTES)  # both pools' Service is named `workers`
    index = SliceIndex(router, namespace="gateway")
    index.update("ADDED", slice_("speech", "workers", "10.0.0.1"))
    index.update("ADDED", slice_("drafts", "workers", "10.0.0.2"))
    index.update("ADDED", slice_("elsewhere", "workers", "10.0.0.3"))
    assert router.endpoints("large/batch") == ["http://10.0.0.1:8000"]
    assert router.endpoints("tiny/batch") == ["http://10.0.0.2:8000"]
    index.forget("drafts")  # no watch vouches for its endpoints any more
    assert router.endpoints("tiny/batch") == []
    assert router.endpoints("large/batch") == ["http://10.0.0.1:8000"]
    # A table that arrives after its Service's slices gets their endpoints at once.
    late = Routes(deployments=[*ROUTES.deployments, table("late", namespace="elsewhere")])
    router.set_routes(late)
    index.refresh()
    assert router.endpoints("late/batch") == ["http://10.0.0.3:8000"]


def test_pools_that_leave_the_tables_lose_their_endpoints_and_wake_their_waiters() -> None:
    router = Router(ROUTES)
    router.set_endpoints("tiny/batch", ["http://10.0.0.2:8000"])
    changed: list[str] = []
    router.on_change(changed.append)
    router.set_routes(Routes(deployments=[ROUTES.deployments[0]]))
    assert router.endpoints("tiny/batch") == [] and changed == ["tiny/batch"]
    assert router.catalog.pool_names == {"large/batch"}


def test_one_watch_per_namespace_the_tables_name_started_and_stopped_as_they_change(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The watch itself (the API server's) runs in e2e; here each watcher's thread idles."""
    monkeypatch.setattr(discovery.EndpointSliceWatcher, "_run", lambda self: self._stop.wait())

    async def main() -> None:
        router = Router(ROUTES)
        index = SliceIndex(router, namespace="gateway")
        watches = SliceWatches(index, None, asyncio.get_running_loop())
        watches.sync({"gateway", *router.catalog.namespaces})
        assert sorted(watches.watching) == ["drafts", "gateway", "speech"]
        drafts = watches.watching["drafts"]
        # its namespace is the watch's
        drafts._deliver("ADDED", slice_(None, "workers", "10.0.0.2"))
        await asyncio.sleep(0.01)
        assert router.endpoints("tiny/batch") == ["http://10.0.0.2:8000"]
        router.set_routes(Routes(deployments=[ROUTES.deployments[0]]))
        watches.sync({"gateway", *router.catalog.namespaces})
        assert sorted(watches.watching) == ["gateway", "speech"]
        # A late event of the stopped watch changes nothing.
        router.set_routes(ROUTES)
        drafts._deliver("ADDED", slice_(None, "workers", "10.0.0.9"))
        await asyncio.sleep(0.01)
        assert router.endpoints("tiny/batch") == []
        watches.stop()
        assert watches.watching == {} and drafts._stop.is_set()

    asyncio.run(main())


def test_either_route_table_file_is_read_and_reloaded(tmp_path: Path) -> None:
    path = tmp_path / "routes.json"
    one = table("large", "whisper-1")
    path.write_text(one.dumps())
    assert load_table(path) == one
    router = Router(load_table(path))
    reloads: list[int] = []
    watcher = TableWatcher(path, router, on_reload=lambda: reloads.append(1))
    new = tmp_path / "routes.new"
    new.write_text(ROUTES.dumps())
    os.replace(new, path)
    assert watcher.check() and reloads == [1]
    assert load_table(path) == ROUTES
    assert router.catalog.resolve("t").deployment == "drafts/tiny"
    path.write_text('{"deployments": [{"model": "x", "pools": "nope"}]}')
    os.utime(path, ns=(1, 1))
    assert not watcher.check() and reloads == [1]  # invalid: the previous routes stay
    assert router.catalog.resolve("t").deployment == "drafts/tiny"
