"""Slot exhaustion by slow but legal uploads (issue 37, finding 5), on the real frontend
process (`transcription-frontend`) in front of a stand-in vLLM worker: one key's uploads
in flight are capped (`maxUploadsPerKey`), and a body must arrive whole by a deadline that
grows with its declared length (`bodyDeadlineBytesPerSecond`), however steadily it trickles
above the minimum rate. Limits are low so that each test takes seconds."""

from __future__ import annotations

import asyncio
import contextlib
import math
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from starlette.types import Message

from testkit.audio import tone_wav
from testkit.frontend import answered_with
from testkit.processes import frontend
from testkit.rawhttp import connect, parse, trickle
from testkit.standins import Behaviour, Running, start, vllm_app
from transcription_api.capabilities import Engine, Mode
from transcription_api.errors import APIError
from transcription_api.frontend import FrontendLimits
from transcription_api.routes import PoolRoute, RouteTable
from transcription_frontend.limits import Uploads, body_deadline, content_length

NAMES = ["whisper-large-v3", "whisper-1"]
WAV = tone_wav(0.3)
PER_KEY = 2
RATE = 100_000  # bytes/s a body must keep over its whole length, after 5 s
LIMITS = FrontendLimits(max_uploads_per_key=PER_KEY, body_deadline_bytes_per_second=RATE,
                        body_timeout_seconds=5, body_min_bytes_per_second=1000,
                        max_body_bytes=2_000_000, drain_seconds=2, idle_timeout_seconds=1)  # fmt: skip
FORM_HEAD = (b'--b\r\nContent-Disposition: form-data; name="model"\r\n\r\nwhisper-1\r\n'
             b'--b\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\n\r\n')  # fmt: skip


@pytest.fixture(scope="module")
def worker() -> Iterator[Running]:
    running = start(vllm_app(NAMES, Behaviour()))
    yield running
    running.stop()


def table(url: str) -> RouteTable:
    return RouteTable(model=NAMES[0], aliases=NAMES[1:], pools=[
        PoolRoute(name="batch", engine=Engine.VLLM, mode=Mode.CONTINUOUS, service="b", endpoints=[url]),
    ])  # fmt: skip


@contextlib.contextmanager
def gateway(worker: Running, d: Path, keys: bool = True, limits: FrontendLimits = LIMITS
            ) -> Iterator[str]:  # fmt: skip
    if keys:
        (d / "keys").write_text("k-a\nk-b\n")
    url, proc = frontend(table(worker.url), d, limits=limits,
                         api_keys_path=d / "keys" if keys else None)  # fmt: skip
    try:
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def transcribe(url: str, key: str | None, source: str = "127.0.0.1") -> httpx.Response:
    headers = {"authorization": f"Bearer {key}"} if key else {}
    with httpx.Client(transport=httpx.HTTPTransport(local_address=source), timeout=30) as c:
        return c.post(f"{url}/v1/audio/transcriptions", data={"model": "whisper-1"},
                      files={"file": ("a.wav", WAV)}, headers=headers)  # fmt: skip


def head(length: int, key: str | None) -> bytes:
    auth = b"Authorization: Bearer %s\r\n" % key.encode() if key else b""
    return (b"POST /v1/audio/transcriptions HTTP/1.1\r\nHost: x\r\n" + auth +
            b"Content-Type: multipart/form-data; boundary=b\r\nContent-Length: %d\r\n\r\n" % length
            + FORM_HEAD + WAV[:44])  # fmt: skip


# For the uploads that hold their slots: a stalled body waits a minute, not 5 s, so that
# they stay in flight however slowly a loaded machine gets to the request they crowd out.
PATIENT = LIMITS.model_copy(update={"body_timeout_seconds": 60})


def slow_uploads(url: str, key: str | None, n: int) -> list[socket.socket]:
    """`n` uploads of 1 MB that have sent their head and wait (each holds a slot)."""
    held = []
    for _ in range(n):
        s = connect(url)
        s.sendall(head(1_000_000, key))
        held.append(s)
    return held


def assert_too_many_uploads(r: httpx.Response) -> None:
    assert r.status_code == 429 and r.headers["retry-after"] == "1", r.text
    e = r.json()["error"]
    assert e["code"] == "too_many_uploads" and "maxUploadsPerKey" in e["message"], e


def test_one_key_cannot_hold_every_upload_slot(worker: Running, tmp_path: Path) -> None:
    """A key with its cap of uploads in flight is refused the next one with 429 and
    Retry-After, while another key is served; once they end, it is served again."""
    with gateway(worker, tmp_path, limits=PATIENT) as url:
        held = slow_uploads(url, "k-a", PER_KEY)
        try:
            # Refused once each upload is past its key check, reading its body:
            assert_too_many_uploads(
                answered_with(429, lambda: transcribe(url, "k-a"), "k-a's next upload")
            )
            assert transcribe(url, "k-b").status_code == 200
        finally:
            for s in held:
                s.close()
        answered_with(200, lambda: transcribe(url, "k-a"), "k-a's upload once its others closed")


def test_without_keys_the_cap_is_per_client_address(worker: Running, tmp_path: Path) -> None:
    with gateway(worker, tmp_path, keys=False, limits=PATIENT) as url:
        held = slow_uploads(url, None, PER_KEY)
        try:
            assert_too_many_uploads(
                answered_with(429, lambda: transcribe(url, None), "this address's next upload")
            )
            assert transcribe(url, None, source="127.0.0.2").status_code == 200
        finally:
            for s in held:
                s.close()
        answered_with(
            200, lambda: transcribe(url, None), "this address's upload once its others closed"
        )


def test_a_steady_trickle_above_the_minimum_rate_is_cut_by_its_lengths_deadline(
    worker: Running, tmp_path: Path
) -> None:
    """20 kB/s, twenty times the minimum rate: a small upload at that rate is served, but a
    declared 500 kB must arrive within 5 + 5 s, and is cut then with 408 naming the limit
    (before: it would have taken 25 s, all that time in its slot)."""
    with gateway(worker, tmp_path) as url:
        body = FORM_HEAD + WAV + b"\r\n--b--\r\n"
        with connect(url) as s:
            s.sendall(head(len(body), "k-a")[: -len(FORM_HEAD) - 44])
            data = trickle(s, (body[i : i + 2000] for i in range(0, len(body), 2000)), 0.1)
        assert parse(data)[0] == 200, data
        with connect(url) as s:
            s.sendall(head(500_000, "k-a"))
            started = time.monotonic()
            data = trickle(s, (b"\x00" * 2000 for _ in range(250)), 0.1)
            took = time.monotonic() - started
        status, _, answer = parse(data)
        assert status == 408 and answer["error"]["code"] == "body_timeout", data
        assert "within 10s" in answer["error"]["message"]
        assert "bodyDeadlineBytesPerSecond (100000)" in answer["error"]["message"]
        assert 9 < took < 14, took
        assert transcribe(url, "k-a").status_code == 200


# --------------------------------------------------------------------------- pure parts


def test_the_deadline_grows_with_the_declared_length_up_to_the_cap() -> None:
    limits = FrontendLimits(body_timeout_seconds=30, body_deadline_bytes_per_second=16384)
    assert body_deadline(0, 10**9, limits) == 30
    assert body_deadline(16384 * 100, 10**9, limits) == 130
    assert body_deadline(None, 16384 * 10, limits) == 40  # without a length: the cap's
    assert body_deadline(10**12, 16384 * 10, limits) == 40
    # the finding: 20 MB at 1.3 kB/s took over four hours; now about 21 minutes at most
    assert 20 * 60 < body_deadline(20_000_000, 26 * 1024**2, limits) < 22 * 60
    off = FrontendLimits(body_deadline_bytes_per_second=0)
    assert body_deadline(20_000_000, 10**9, off) == math.inf


def test_content_length_is_read_from_the_raw_headers() -> None:
    assert content_length({"headers": [(b"host", b"x"), (b"content-length", b"12")]}) == 12
    assert content_length({"headers": [(b"content-length", b"-1")]}) is None
    assert content_length({"headers": []}) is None


def test_uploads_are_counted_out_once_when_whole_or_ended() -> None:
    uploads = Uploads(FrontendLimits(max_uploads_per_key=2))
    messages = [{"type": "http.request", "body": b"a", "more_body": True},
                {"type": "http.request", "body": b"b", "more_body": False}]  # fmt: skip

    async def receive() -> Message:
        return messages.pop(0)

    async def scenario() -> None:
        first, end_first = uploads.start("k", receive)
        _, end_second = uploads.start("k", receive)
        with pytest.raises(APIError) as e:
            uploads.start("k", receive)
        assert (e.value.status, e.value.code) == (429, "too_many_uploads")
        uploads.start("other", receive)  # another key has its own cap
        await first()
        assert uploads.by_key["k"] == 2  # more body to come: still counted
        await first()
        assert uploads.by_key["k"] == 1  # whole: counted out
        end_first()  # the request ends: already out, not counted twice
        end_second()
        end_second()
        assert "k" not in uploads.by_key and uploads.by_key["other"] == 1

    asyncio.run(scenario())
