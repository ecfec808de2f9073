"""The gateway against hostile or broken clients (issue 25), in process over real HTTP:
truncated uploads, keys that fail closed, parser errors that are 400s, bounded resources.
Each test asserts the error, then that a good request is still served."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import socket
import time
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from testkit.frontend import (
    AUDIO_LM_MODEL,
    PATIENCE,
    PRIMARY,
    WAV,
    Frontend,
    assert_still_serving,
    chat_pool,
    error,
    pool,
)
from testkit.host import free_port
from testkit.standins import Behaviour, Running, serve, transformers_app
from transcription_api.errors import APIError
from transcription_api.multipart import parse_upload
from transcription_api.routes import RouteTable
from transcription_frontend.auth import authorization


def form(boundary: str = "b", close: bool = True) -> bytes:
    body = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="model"\r\n\r\nwhisper-1\r\n'
        f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\n'
        "Content-Type: audio/wav\r\n\r\n"
    ).encode() + WAV
    return body + (f"\r\n--{boundary}--\r\n".encode() if close else b"")


def post_raw(fe: Frontend, body: bytes, boundary: str = "b") -> httpx.Response:
    return httpx.post(
        f"{fe.url}/v1/audio/transcriptions",
        content=body,
        headers={"content-type": f"multipart/form-data; boundary={boundary}"},
        timeout=30,
    )


# --------------------------------------------------------------------------- 4: complete uploads


def test_an_upload_without_its_closing_boundary_is_400_and_never_reaches_a_worker(
    frontend: Frontend, worker: tuple[Running, Behaviour]
) -> None:
    for cut in (form(close=False), form(close=False) + b"\r\n--b", form()[:-300]):
        r = post_raw(frontend, cut)
        assert r.status_code == 400, r.text
        e = error(r)
        assert e["code"] == "incomplete_upload" and "closing boundary" in e["message"]
    assert worker[1].seen == []
    assert post_raw(frontend, form()).status_code == 200
    assert_still_serving(frontend)


def test_a_body_shorter_than_its_content_length_never_reaches_a_worker(
    frontend: Frontend, worker: tuple[Running, Behaviour]
) -> None:
    host, port = frontend.url.removeprefix("http://").split(":")
    body = form()
    with socket.create_connection((host, int(port))) as s:
        s.sendall(
            b"POST /v1/audio/transcriptions HTTP/1.1\r\nHost: x\r\n"
            b"Content-Type: multipart/form-data; boundary=b\r\n"
            + f"Content-Length: {len(body) + 1000}\r\n\r\n".encode()
            + body
        )
        s.shutdown(socket.SHUT_WR)  # the client's side ends here: the body is short
        s.settimeout(10)
        with contextlib.suppress(OSError):
            s.recv(65536)
    assert worker[1].seen == []
    assert_still_serving(frontend)


# --------------------------------------------------------------------------- 5: parser errors


def test_a_boundary_over_the_limit_is_400(frontend: Frontend) -> None:
    long = "x" * 300
    r = post_raw(frontend, form(long), boundary=long)
    assert r.status_code == 400 and "boundary" in error(r)["message"]
    assert_still_serving(frontend)


# --------------------------------------------------------------------------- 3: keys fail closed


def keyed(worker: tuple[Running, Behaviour], keys: Path) -> Frontend:
    table = RouteTable(model=PRIMARY, aliases=["whisper-1"], pools=[pool("batch", [worker[0].url])])
    return Frontend(table, keys=keys)


def bearer(key: str | bytes) -> dict[str, str | bytes]:
    return {"authorization": b"Bearer " + (key.encode() if isinstance(key, str) else key)}


def test_keys_are_bytes_a_bom_comments_and_blank_lines_are_no_keys(
    worker: tuple[Running, Behaviour], tmp_path: Path
) -> None:
    keys = tmp_path / "keys"
    keys.write_bytes("\ufeffk-one\n\n# a comment\n  k-two  \nk-é\n".encode())
    fe = keyed(worker, keys)
    try:
        for good in ("k-one", "k-two", "k-é".encode()):
            assert fe.post({"model": "whisper-1"}, headers=bearer(good)).status_code == 200
        for bad in ("# a comment", "#", "\ufeffk-one".encode(), "é".encode(), b"\xff\xfe", "k"):
            r = fe.post({"model": "whisper-1"}, headers=bearer(bad))
            assert r.status_code == 401, (bad, r.text)
            assert error(r)["code"] == "invalid_api_key"
        assert httpx.get(f"{fe.url}/ready").status_code == 200
    finally:
        fe.running.stop()


@pytest.mark.parametrize("content", [None, b"", b"\n# only a comment\n\n", b"\xef\xbb\xbf\n"])
def test_a_missing_or_empty_key_file_is_not_ready_and_never_open(
    worker: tuple[Running, Behaviour], tmp_path: Path, content: bytes | None,
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    keys = tmp_path / "keys"
    if content is not None:
        keys.write_bytes(content)
    with caplog.at_level("ERROR", "transcription_frontend.auth"):
        fe = keyed(worker, keys)
    try:
        assert "not ready" in caplog.text and str(keys) in caplog.text  # the log tells where
        r = httpx.get(f"{fe.url}/ready")  # anyone may ask: neither the path nor the OS's words
        what = "cannot be read" if content is None else "has no key"
        assert r.status_code == 503 and r.json()["reason"] == f"the API key file {what}"
        for headers in ({}, bearer("anything")):
            r = fe.post({"model": "whisper-1"}, headers=headers)
            assert r.status_code == 503 and error(r)["code"] == "api_keys_unavailable"
            assert r.headers["retry-after"]
            r = httpx.get(f"{fe.url}/v1/models", headers=headers)
            assert r.status_code == 503
        assert worker[1].seen == []
        keys.write_text("k-new\n")  # the Secret gets its key: ready, without a restart
        os.utime(keys, (1, 1))
        assert httpx.get(f"{fe.url}/ready").status_code == 200
        assert fe.post({"model": "whisper-1"}, headers=bearer("k-new")).status_code == 200
        assert fe.post({"model": "whisper-1"}).status_code == 401
    finally:
        fe.running.stop()


def test_keys_rotate_without_a_restart(worker: tuple[Running, Behaviour], tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    keys.write_text("k-old\n")
    fe = keyed(worker, keys)
    try:
        assert fe.post({"model": "whisper-1"}, headers=bearer("k-old")).status_code == 200
        keys.write_text("k-new\n")
        os.utime(keys, (2, 2))
        assert fe.post({"model": "whisper-1"}, headers=bearer("k-old")).status_code == 401
        assert fe.post({"model": "whisper-1"}, headers=bearer("k-new")).status_code == 200
    finally:
        fe.running.stop()


def test_a_key_may_use_only_the_models_it_lists(
    worker: tuple[Running, Behaviour], tmp_path: Path
) -> None:
    keys = tmp_path / "keys"
    keys.write_text("k-all\nk-whisper whisper-1\nk-other other-model,another\n")
    fe = keyed(worker, keys)
    try:
        assert fe.post({"model": PRIMARY}, headers=bearer("k-whisper")).status_code == 200
        assert fe.post({"model": "whisper-1"}, headers=bearer("k-all")).status_code == 200
        r = fe.post({"model": "whisper-1"}, headers=bearer("k-other"))
        assert r.status_code == 403 and error(r)["code"] == "model_not_allowed"
        r = httpx.get(f"{fe.url}/v1/models", headers=bearer("k-other"))
        assert r.status_code == 200 and r.json()["data"] == []
        r = httpx.get(f"{fe.url}/v1/models", headers=bearer("k-whisper"))
        assert len(r.json()["data"]) == 2
    finally:
        fe.running.stop()


def test_chat_json_nested_thousands_deep_is_400(worker: tuple[Running, Behaviour]) -> None:
    with serve(transformers_app(Behaviour(), model=AUDIO_LM_MODEL, family="audio-lm")) as chat:
        table = RouteTable(
            model=PRIMARY,
            aliases=["whisper-1"],
            pools=[pool("batch", [worker[0].url]), chat_pool(chat.url)],
        )
        fe = Frontend(table)
        try:
            deep_json_is_400(fe)
        finally:
            fe.running.stop()


def deep_json_is_400(frontend: Frontend) -> None:
    for depth in (40, 10_000, 100_000):
        r = httpx.post(
            f"{frontend.url}/v1/chat/completions",
            content=b'{"messages": ' + b"[" * depth + b"]" * depth + b"}",
            headers={"content-type": "application/json"},
        )
        assert r.status_code == 400, r.text
        assert error(r)["code"] == "invalid_json" and "nested" in error(r)["message"]
    assert_still_serving(frontend)


def test_a_file_parts_content_type_goes_on_only_clean() -> None:
    async def parse(ctype: bytes) -> str:
        async def chunks() -> AsyncIterator[bytes]:
            yield form().replace(b"Content-Type: audio/wav", b"Content-Type: " + ctype)

        upload = await parse_upload(chunks(), "multipart/form-data; boundary=b", 1 << 20)
        upload.close()
        return upload.file_content_type

    assert asyncio.run(parse(b"audio/wav")) == "audio/wav"
    for evil in (b"audio/wav\x00", b"audio/wav\x7f", "audio/é".encode(), b"a" * 300):
        assert asyncio.run(parse(evil)) == "application/octet-stream", evil


def test_an_unknown_route_is_404_without_a_model_code(frontend: Frontend) -> None:
    r = httpx.get(f"{frontend.url}/v1/nope")
    assert r.status_code == 404 and error(r)["code"] == "unknown_url"
    assert error(r)["type"] == "not_found_error"


# --------------------------------------------------------------------------- 2: chat bodies


def test_a_chat_body_is_refused_unread_when_no_pool_can_chat(frontend: Frontend) -> None:
    """The deployment has a vLLM pool only: the 400 comes before the body is read, so a
    client that declares 20 MB and sends none of it gets its answer at once."""
    host, port = frontend.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=PATIENCE) as s:
        s.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 20000000\r\n\r\n"
        )
        data = s.recv(65536)
    assert data.startswith(b"HTTP/1.1 400") and b"unsupported_capability" in data
    assert b"missing capability chat" in data
    assert_still_serving(frontend)


# --------------------------------------------------------------------------- 6: addresses


def test_metrics_name_the_worker_pod_and_errors_name_no_address(
    worker: tuple[Running, Behaviour],
) -> None:
    table = RouteTable(model=PRIMARY, aliases=["whisper-1"], pools=[pool("batch", [])])
    fe = Frontend(table)
    try:
        port = int(worker[0].url.rsplit(":", 1)[1])
        fe.gateway.apply_slice("ADDED", {
            "metadata": {"name": "svc-batch-x", "labels": {"kubernetes.io/service-name": "svc-batch"}},
            "ports": [{"name": "http", "port": port}],
            "endpoints": [{"addresses": ["127.0.0.1"], "conditions": {"ready": True},
                           "targetRef": {"kind": "Pod", "name": "whisper-batch-7d9f-abcde"}}],
        })  # fmt: skip
        deadline = time.monotonic() + 5
        while fe.post({"model": "whisper-1"}).status_code != 200:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        text = httpx.get(f"{fe.url}/metrics").text
        lines = [
            x
            for x in text.splitlines()
            if x.startswith("transcription_frontend_worker_requests_total{")
        ]
        assert any('worker="whisper-batch-7d9f-abcde"' in x for x in lines), lines
        assert not any(f"127.0.0.1:{port}" in x for x in lines)  # (the registry is global)
        worker[1].status = 503  # the worker is full: 503, naming the pool, not the address
        r = fe.post({"model": "whisper-1"})
        assert r.status_code == 503
        assert "pool batch" in error(r)["message"] and "127.0.0.1" not in error(r)["message"]
    finally:
        fe.running.stop()


def test_static_endpoints_are_named_by_pool_and_place_in_metrics(
    worker: tuple[Running, Behaviour],
) -> None:
    table = RouteTable(model=PRIMARY, aliases=["whisper-1"],
                       pools=[pool("static", ["http://127.0.0.9:1", worker[0].url])])  # fmt: skip
    fe = Frontend(table)
    try:
        assert fe.post({"model": "whisper-1"}).status_code == 200  # 127.0.0.9:1 refuses: retried
        lines = [x for x in httpx.get(f"{fe.url}/metrics").text.splitlines()
                 if x.startswith('transcription_frontend_worker_requests_total{pool="static"')]  # fmt: skip
        assert {x.split('worker="')[1].split('"')[0] for x in lines} == {"static-0", "static-1"}
        assert not any(":" in x.split('worker="')[1].split('"')[0] for x in lines)
    finally:
        fe.running.stop()


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
def test_api_docs_are_off_by_default_and_load_a_cdn_when_on(
    worker: tuple[Running, Behaviour], page: str
) -> None:
    """Swagger UI and ReDoc pull their scripts from a CDN: a browser that opens them fetches
    third-party code, so they are served only when the settings ask (`api_docs`)."""
    table = RouteTable(model=PRIMARY, aliases=["whisper-1"], pools=[pool("batch", [worker[0].url])])
    for on in (False, True):
        fe = Frontend(table, api_docs=on)
        try:
            r = httpx.get(f"{fe.url}{page}")
            hosts = set(re.findall(r"(?:https?:)?//([\w.-]+)", r.text))
            if on:
                assert r.status_code == 200 and "cdn.jsdelivr.net" in hosts
            else:
                assert r.status_code == 404 and error(r)["code"] == "unknown_url"
                assert not hosts, hosts
            assert httpx.get(f"{fe.url}/openapi.json").status_code == 200
        finally:
            fe.running.stop()


def test_the_load_report_is_off_the_public_port_and_peers_read_it_there(
    worker: tuple[Running, Behaviour],
) -> None:
    internal = free_port()
    table = RouteTable(model=PRIMARY, aliases=["whisper-1"], pools=[pool("batch", [worker[0].url])])
    fe = Frontend(table, internal_port=internal)
    try:
        r = httpx.get(f"{fe.url}/internal/load")
        assert r.status_code == 404
        report = httpx.get(f"http://127.0.0.1:{internal}/internal/load").json()
        assert report["pools"]["batch"]["held"] == 0
        # Peers are found on the public Service's port: their reports are read on this one.
        fe.gateway.load.peers.set_urls(["http://10.0.0.7:8080"])
        assert fe.gateway.load.peers.urls == [f"http://10.0.0.7:{internal}"]
        assert_still_serving(fe)
    finally:
        fe.running.stop()


def test_one_authorization_header_is_read_and_several_are_refused() -> None:
    assert authorization([(b"host", b"x")]) is None
    assert authorization([(b"authorization", "Bearer k-é".encode("latin-1"))]) == "Bearer k-é"
    for twice in ([(b"authorization", b"Bearer a")] * 2,
                  [(b"authorization", b"Bearer a"), (b"host", b"x"), (b"Authorization", b"")]):  # fmt: skip
        with pytest.raises(APIError) as e:
            authorization(twice)
        assert (e.value.status, e.value.code) == (401, "duplicate_authorization")


def test_a_key_problem_is_told_once_per_new_problem(tmp_path: Path) -> None:
    """The frontend posts a Warning Event about its pod for each new key problem
    (transcription_frontend/events.py), not one per probe."""
    from transcription_frontend.auth import ApiKeys

    told: list[str] = []
    path = tmp_path / "keys"
    path.write_text("# no key yet\n")
    keys = ApiKeys(path, told.append)
    for _ in range(3):
        keys.keys()
    assert len(told) == 1 and "has no key" in told[0], told
    path.write_text("sk-1\n")
    assert keys.keys() and keys.problem is None
    path.unlink()
    keys2 = ApiKeys(path, told.append)
    keys2.keys()
    assert len(told) == 2 and "cannot be read" in told[1], told


@pytest.mark.parametrize("fails", ["raises", "returns"])
def test_an_app_that_fails_before_answering_gets_a_500_in_openais_shape(fails: str) -> None:
    """uvicorn's own 500 is plain text: the last resort answers in OpenAI's shape."""
    from starlette.types import Receive, Scope, Send

    from transcription_frontend.request_id import RequestIdMiddleware

    async def broken(scope: Scope, receive: Receive, send: Send) -> None:
        if fails == "raises":
            raise RuntimeError("a bug")

    async def call() -> httpx.Response:
        transport = httpx.ASGITransport(app=RequestIdMiddleware(broken))
        async with httpx.AsyncClient(transport=transport, base_url="http://gw") as c:
            return await c.get("/v1/models")

    r = asyncio.run(call())
    assert r.status_code == 500 and error(r)["type"] == "server_error"
    assert r.headers["connection"] == "close"
