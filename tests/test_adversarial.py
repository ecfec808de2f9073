"""Hostile clients against the real frontend process (`transcription-frontend`, as the pod
runs it: uvicorn, httptools, the guards of transcription_frontend/limits.py) in front of a stand-in vLLM worker.
One test per item of issue 25, each asserting the error and then that a good request is
still served. Limits are set low here so that each test takes about a second; their
defaults are in transcription_frontend/limits.py and docs/security.md. The memory ceiling under 100 hostile
connections is a benchmark (`python -m bench hostile`), not a timed test."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import websockets

from testkit.audio import tone_wav
from testkit.frontend import answered_with
from testkit.processes import frontend
from testkit.rawhttp import answer, connect, response, sent_until_closed
from testkit.realtime import refusal
from testkit.standins import Behaviour, Running, start, vllm_app
from transcription_api.capabilities import Engine, Mode
from transcription_api.frontend import FrontendLimits
from transcription_api.routes import PoolRoute, RouteTable

NAMES = ["whisper-large-v3", "whisper-1"]
WAV = tone_wav(0.3)
LIMITS = FrontendLimits(max_header_bytes=8192, max_headers=40, header_timeout_seconds=1,
                        body_timeout_seconds=1, body_min_bytes_per_second=100000,
                        max_body_bytes=2000000, max_concurrency=3, idle_timeout_seconds=2,
                        drain_max_bytes=1024 * 1024)  # fmt: skip


@pytest.fixture(scope="module")
def worker() -> Iterator[tuple[Running, Behaviour]]:
    b = Behaviour()
    running = start(vllm_app(NAMES, b))
    yield running, b
    running.stop()


def table(url: str) -> RouteTable:
    return RouteTable(model=NAMES[0], aliases=NAMES[1:], max_upload_bytes=1024 * 1024, pools=[
        PoolRoute(name="batch", engine=Engine.VLLM, mode=Mode.CONTINUOUS, service="b", endpoints=[url]),
    ])  # fmt: skip


@pytest.fixture(scope="module")
def gateway(
    worker: tuple[Running, Behaviour], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    d = tmp_path_factory.mktemp("adversarial")
    keys = d / "keys"
    keys.write_bytes("\ufeff# the team's key\n\nk-good\n".encode())
    url, proc = frontend(table(worker[0].url), d, limits=LIMITS, api_keys_path=keys)
    yield url
    proc.terminate()
    proc.wait(timeout=30)


KEY = {"authorization": "Bearer k-good"}


def transcription(url: str) -> httpx.Response:
    return httpx.post(f"{url}/v1/audio/transcriptions", data={"model": "whisper-1"},
                      files={"file": ("a.wav", WAV)}, headers=KEY, timeout=30)  # fmt: skip


def still_serving(url: str) -> None:
    r = transcription(url)
    assert r.status_code == 200, r.text


def form(close: bool = True) -> bytes:
    body = (
        b'--b\r\nContent-Disposition: form-data; name="model"\r\n\r\nwhisper-1\r\n'
        b'--b\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\n\r\n' + WAV
    )
    return body + (b"\r\n--b--\r\n" if close else b"")


def head(length: int | None = None, extra: bytes = b"") -> bytes:
    framing = (
        b"Transfer-Encoding: chunked\r\n" if length is None else b"Content-Length: %d\r\n" % length
    )
    return (b"POST /v1/audio/transcriptions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer k-good\r\n"
            b"Content-Type: multipart/form-data; boundary=b\r\n" + framing + extra + b"\r\n")  # fmt: skip


# --------------------------------------------------------------------------- 1: bounded resources


def test_an_endless_header_is_431_and_the_connection_closed(gateway: str) -> None:
    with connect(gateway) as s:
        s.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Junk: ")
        assert sent_until_closed(s, (b"a" * 4096 for _ in range(2000)))
        status, data = answer(s)
    assert status == 431 and b"headers_too_large" in data
    still_serving(gateway)


def test_too_many_headers_is_431(gateway: str) -> None:
    headers = {f"x-h{i}": "1" for i in range(60)}
    r = httpx.get(f"{gateway}/v1/models", headers={**KEY, **headers})
    assert r.status_code == 431 and r.json()["error"]["code"] == "too_many_headers"
    still_serving(gateway)


def test_headers_that_never_finish_time_out_with_408(gateway: str) -> None:
    with connect(gateway) as s:
        s.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n")
        started = time.monotonic()
        status, data = answer(s)
    assert status == 408 and b"header_timeout" in data
    assert time.monotonic() - started < 5
    with connect(gateway) as s:  # a connection that sends nothing at all, too
        assert answer(s)[0] == 408
    still_serving(gateway)


def test_a_body_that_stalls_is_408(gateway: str, worker: tuple[Running, Behaviour]) -> None:
    seen = len(worker[1].seen)
    with connect(gateway) as s:
        body = form()
        s.sendall(head(len(body)) + body[:1000])  # ... and then nothing
        status, data = answer(s)
    assert status == 408 and b"body_timeout" in data
    assert len(worker[1].seen) == seen
    still_serving(gateway)


def test_a_body_trickling_below_the_minimum_rate_is_408(gateway: str) -> None:
    with connect(gateway) as s:
        body = form()
        s.sendall(head(len(body)))
        started = time.monotonic()
        # 500 bytes every 0.2 s: 2.5 kB/s
        assert sent_until_closed(s, (body[i : i + 500] for i in range(0, len(body), 500)), 0.2)
        status, data = answer(s)
    assert status == 408 and b"slower than" in data
    assert time.monotonic() - started < 6
    still_serving(gateway)


def test_junk_after_a_valid_form_is_cut_off_by_the_whole_body_cap(gateway: str) -> None:
    body = form()
    with connect(gateway) as s:
        s.sendall(head() + b"%x\r\n%s\r\n" % (len(body), body))
        junk = b"\x00" * 65536
        chunk = b"%x\r\n%s\r\n" % (len(junk), junk)
        assert sent_until_closed(s, (chunk for _ in range(300 * 16)))  # up to 300 MiB
        status, data = answer(s)
    assert status == 413 and b"whole request body" in data
    still_serving(gateway)


@pytest.fixture
def patient_gateway(worker: tuple[Running, Behaviour], tmp_path: Path) -> Iterator[str]:
    """The module's limits, but a stalled body waits a minute, not a second: the uploads
    that hold the slots must stay in flight however slowly a loaded machine gets to them."""
    limits = LIMITS.model_copy(update={"body_timeout_seconds": 60})
    url, proc = frontend(table(worker[0].url), tmp_path, limits=limits)
    yield url
    proc.terminate()
    proc.wait(timeout=30)


def test_requests_over_the_concurrency_limit_get_503_with_retry_after(
    patient_gateway: str,
) -> None:
    gateway = patient_gateway

    def models() -> httpx.Response:
        return httpx.get(f"{gateway}/v1/models", timeout=30)

    held = []
    try:
        for _ in range(3):  # three slow uploads in flight: the limit
            s = connect(gateway)
            s.sendall(head(500_000))
            held.append(s)
        r = answered_with(503, models, "a request over the limit of 3 in flight")
        assert r.headers["retry-after"] == "1"
        assert r.json()["error"]["code"] == "too_many_requests_in_flight"
        assert httpx.get(f"{gateway}/ready").status_code == 200  # probes are exempt
    finally:
        for s in held:
            s.close()
    answered_with(200, models, "the closed uploads' slots free again")
    still_serving(gateway)


# --------------------------------------------------------------------------- 3, 4, 5


def test_a_bad_key_is_401_never_500(gateway: str) -> None:
    for key in ("Bearer é".encode(), b"Bearer \xff\xfe", b"Bearer # the team's key", b"Bearer"):
        r = httpx.get(f"{gateway}/v1/models", headers={"authorization": key})
        assert r.status_code == 401, (key, r.text)
    still_serving(gateway)


TWO_KEYS = [  # one good and one bad, in both orders, and the good one twice
    [("authorization", "Bearer k-good"), ("authorization", "Bearer k-bad")],
    [("authorization", "Bearer k-bad"), ("authorization", "Bearer k-good")],
    [("authorization", "Bearer k-good"), ("Authorization", "Bearer k-good")],
]


def test_two_authorization_headers_are_401_on_every_http_path(gateway: str) -> None:
    """Issue 37, finding 7: which header counts would be a guess, so neither does."""
    for headers in TWO_KEYS:
        for r in (
            httpx.get(f"{gateway}/v1/models", headers=headers),
            httpx.post(f"{gateway}/v1/audio/transcriptions", data={"model": "whisper-1"},
                       files={"file": ("a.wav", WAV)}, headers=headers),
            httpx.post(f"{gateway}/v1/chat/completions", json={"model": "whisper-1"},
                       headers=headers),
        ):  # fmt: skip
            assert r.status_code == 401, (headers, r.request.url, r.text)
            e = r.json()["error"]
            assert e["code"] == "duplicate_authorization" and "2 `Authorization`" in e["message"]
    still_serving(gateway)


def test_two_authorization_headers_refuse_the_websocket_upgrade(gateway: str) -> None:
    """The same rule before the realtime upgrade: 401 in OpenAI's shape, no session; one
    good header then opens one."""
    url = gateway.replace("http://", "ws://") + "/v1/realtime?intent=transcription"
    for headers in TWO_KEYS:
        status, _, body = refusal(url, additional_headers=headers)
        assert status == 401 and body["error"]["code"] == "duplicate_authorization", body

    async def session() -> str:
        async with websockets.connect(url, additional_headers=KEY) as ws:
            return str(json.loads(await ws.recv())["type"])

    assert asyncio.run(session()) == "session.created"
    still_serving(gateway)


def test_an_empty_key_file_is_never_open(worker: tuple[Running, Behaviour], tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    keys.write_text("# no key yet\n")
    url, proc = frontend(table(worker[0].url), tmp_path, ready="/health", api_keys_path=keys)
    try:
        r = httpx.get(f"{url}/ready")
        assert r.status_code == 503 and r.json()["reason"] == "the API key file has no key"
        r = httpx.post(f"{url}/v1/audio/transcriptions", data={"model": "whisper-1"},
                       files={"file": ("a.wav", WAV)})  # fmt: skip
        assert r.status_code == 503
        assert "has no key" in (tmp_path / "frontend.log").read_text()
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_a_truncated_upload_is_400_and_never_reaches_a_worker(
    gateway: str, worker: tuple[Running, Behaviour]
) -> None:
    seen = len(worker[1].seen)
    cut = form(close=False)
    with connect(gateway) as s:
        s.sendall(head(len(cut)) + cut)
        data = response(s)
    assert data.startswith(b"HTTP/1.1 400") and b"incomplete_upload" in data
    assert len(worker[1].seen) == seen
    still_serving(gateway)


def test_deep_json_and_a_long_boundary_are_400(gateway: str) -> None:
    r = httpx.post(f"{gateway}/v1/chat/completions", content=b"[" * 100_000, headers=KEY)
    assert r.status_code == 400
    r = httpx.post(f"{gateway}/v1/audio/transcriptions", content=form(), headers={
        **KEY, "content-type": "multipart/form-data; boundary=" + "b" * 300})  # fmt: skip
    assert r.status_code == 400
    still_serving(gateway)


def test_many_hostile_connections_at_once_leave_good_requests_served(gateway: str) -> None:
    """Fifty slow-header and slow-body clients at once (the benchmark runs 100 and measures
    memory): each is cut off by its timeout, and good requests are served meanwhile."""
    stop = threading.Event()
    sockets: list[socket.socket] = []

    def hostile(i: int) -> None:
        try:
            s = connect(gateway)
            sockets.append(s)
            s.sendall(b"GET / HTTP/1.1\r\nX: " if i % 2 else head(500_000) + b"--b")
            while not stop.is_set() and s.recv(1):
                pass
        except OSError:
            pass

    threads = [threading.Thread(target=hostile, args=(i,)) for i in range(50)]
    for t in threads:
        t.start()
    try:
        time.sleep(0.2)
        r = httpx.get(f"{gateway}/health")
        assert r.status_code == 200 and json.loads(r.text)["status"] == "ok"
        # The hostile ones time out (bodyTimeoutSeconds: 1): the gateway is free again.
        answered_with(200, lambda: transcription(gateway), "the gateway once they timed out")
    finally:
        stop.set()
        for s in sockets:
            s.close()
        for t in threads:
            t.join(timeout=5)
