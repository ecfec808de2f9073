"""The gateway's connections against hostile clients (issue 37), on the real frontend process
(`transcription-frontend`: uvicorn, httptools and the guarded protocol) in front of a
stand-in vLLM worker: connection exhaustion by one client or many, and early answers that
must reach a client still uploading. Every answer in OpenAI's error shape, also where
uvicorn answered in plain text. Limits are low so that each test takes seconds."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from testkit.audio import tone_wav
from testkit.frontend import answered_with
from testkit.processes import frontend
from testkit.rawhttp import answer, connect, parse, response, sent_until_closed
from testkit.standins import Behaviour, start, vllm_app
from transcription_api.capabilities import Engine, Mode
from transcription_api.frontend import FrontendLimits
from transcription_api.routes import PoolRoute, RouteTable

NAMES = ["whisper-large-v3", "whisper-1"]
WAV = tone_wav(0.3)
PER_CLIENT, TOTAL = 8, 24
IDLE = 1
LIMITS = FrontendLimits(max_connections=TOTAL, max_connections_per_client=PER_CLIENT,
                        max_body_bytes=2_000_000, header_timeout_seconds=3,
                        idle_timeout_seconds=IDLE)  # fmt: skip
KEY = "k-good"
UPLOAD = 20_000_000  # bytes a client declares and sends whole before it reads
FORM_HEAD = (b'--b\r\nContent-Disposition: form-data; name="model"\r\n\r\nwhisper-1\r\n'
             b'--b\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\n\r\n'
             + WAV[:44])  # fmt: skip


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    worker = start(vllm_app(NAMES, Behaviour()))
    d = tmp_path_factory.mktemp("connections")
    (d / "keys").write_text(f"{KEY}\n")
    table = RouteTable(model=NAMES[0], aliases=NAMES[1:], pools=[
        PoolRoute(name="batch", engine=Engine.VLLM, mode=Mode.CONTINUOUS, service="b",
                  endpoints=[worker.url]),
    ])  # fmt: skip
    url, proc = frontend(table, d, limits=LIMITS, api_keys_path=d / "keys")
    yield url
    proc.terminate()
    proc.wait(timeout=30)
    worker.stop()


def transcribe(url: str, source: str = "127.0.0.1") -> httpx.Response:
    transport = httpx.HTTPTransport(local_address=source)
    with httpx.Client(transport=transport, timeout=30) as c:
        return c.post(f"{url}/v1/audio/transcriptions", data={"model": "whisper-1"},
                      files={"file": ("a.wav", WAV)}, headers={"authorization": f"Bearer {KEY}"})  # fmt: skip


def assert_refused(status: int, headers: dict[str, str], body: dict[str, dict[str, str]]) -> None:
    assert status == 503 and headers["retry-after"] == "1", (status, headers)
    assert body["error"]["code"] == "too_many_connections"
    assert body["error"]["type"] == "service_unavailable"


class Loris:
    """Connections from one source address that keep sending partial headers, each reopened
    as soon as the gateway cuts it off (the finding: 2,100 of them passed the cap)."""

    def __init__(self, url: str, source: str, connections: int) -> None:
        self.url, self.source = url, source
        self.stop = threading.Event()
        self.answers: list[bytes] = []
        self.threads = [threading.Thread(target=self.run, daemon=True) for _ in range(connections)]
        for t in self.threads:
            t.start()

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                with connect(self.url, self.source, timeout=1) as s:
                    s.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n")
                    data = b""
                    while not self.stop.is_set():
                        s.sendall(b"X")  # a header that never ends, a byte at a time
                        try:
                            chunk = s.recv(65536)
                        except TimeoutError:
                            continue
                        if not chunk:
                            break
                        data += chunk
                    if data:
                        self.answers.append(data)
            except OSError:
                self.stop.wait(0.05)

    def close(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=10)


def test_one_client_cannot_take_every_connection(gateway: str) -> None:
    """Three times a client's share of connections sending partial headers from 127.0.0.1:
    its connections beyond its cap get 503 in OpenAI's shape with Retry-After, and another
    client (127.0.0.2) is served all along."""
    loris = Loris(gateway, "127.0.0.1", 3 * PER_CLIENT)

    def refusals() -> list[tuple[int, dict[str, str], dict]]:
        return [parse(a) for a in list(loris.answers) if a.startswith(b"HTTP/1.1 503")]

    try:
        served = 0
        while not (refusals() and served >= 10):  # served all along, until the cap is seen
            r = transcribe(gateway, source="127.0.0.2")
            assert r.status_code == 200, r.text
            served += 1
            assert served < 1000, f"no connection beyond the cap refused: {loris.answers[:3]}"
        for refusal in refusals():
            assert_refused(*refusal)
    finally:
        loris.close()
    answered_with(200, lambda: transcribe(gateway, source="127.0.0.1"), "127.0.0.1 once it let go")


def test_beyond_every_connection_a_client_gets_503_with_retry_after(gateway: str) -> None:
    """Many clients, each within its share, take every connection: the next client gets
    503 in OpenAI's shape with Retry-After (never uvicorn's plain text, never a reset), and
    is served once they are gone."""
    held = [connect(gateway, f"127.0.0.{3 + i // PER_CLIENT}") for i in range(TOTAL)]
    try:
        for s in held:
            s.sendall(b"GET /v1/models HTTP/1.1\r\n")
        r = answered_with(
            503, lambda: transcribe(gateway, source="127.0.0.2"), "a client past every connection"
        )
        assert_refused(r.status_code, dict(r.headers), r.json())
        with connect(gateway, "127.0.0.2") as s:  # a raw client that reads before it sends
            assert_refused(*parse(answer(s)[1]))
    finally:
        for s in held:
            s.close()
    answered_with(
        200, lambda: transcribe(gateway, source="127.0.0.2"), "a client once they are gone"
    )


def upload(url: str, path: str, key: str, size: int = UPLOAD) -> tuple[int, dict[str, str], dict]:
    """A client that sends its whole upload, in 256 KiB writes, before it reads a byte (as
    HTTP libraries do): what it reads then, or the error it gets."""
    head = (f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n"
            "Content-Type: multipart/form-data; boundary=b\r\n"
            f"Content-Length: {size}\r\n\r\n").encode()  # fmt: skip
    piece = b"\0" * 262144
    with connect(url) as s:
        s.sendall(head + FORM_HEAD)
        size -= len(FORM_HEAD)
        for _ in range(size // len(piece)):
            s.sendall(piece)
        s.sendall(piece[: size % len(piece)])
        return parse(answer(s)[1])


@pytest.mark.parametrize(
    ("path", "key", "status", "code"),
    [
        ("/v1/nope", KEY, 404, "unknown_url"),
        ("/v1/audio/transcriptions", "k-bad", 401, "invalid_api_key"),
        ("/v1/audio/transcriptions", KEY, 413, "request_too_large"),  # over maxBodyBytes
    ],
)
def test_an_early_answer_reaches_a_client_still_uploading(
    gateway: str, path: str, key: str, status: int, code: str
) -> None:
    """The answer leaves while 20 MB are still coming: the rest is drained before the
    connection closes, so the client reads the status and the JSON (no reset), 60 times in a
    row; and an HTTP library gets the answer, not a connection error."""
    for _ in range(60):
        got, headers, body = upload(gateway, path, key)
        assert (got, body["error"]["code"]) == (status, code)
        assert headers["connection"] == "close"
    r = httpx.post(f"{gateway}{path}", content=FORM_HEAD + bytes(UPLOAD), timeout=30,
                   headers={"authorization": f"Bearer {key}",
                            "content-type": "multipart/form-data; boundary=b"})  # fmt: skip
    assert r.status_code == status and r.json()["error"]["code"] == code
    assert transcribe(gateway).status_code == 200


def test_an_answer_after_the_whole_request_keeps_the_connection(gateway: str) -> None:
    """Only an answer that leaves before its request's body has arrived whole closes the
    connection: one whose body came with its headers keeps it, for the next request."""
    request = b"POST /v1/nope HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n" + b"x" * 1000
    with connect(gateway) as s:
        for _ in range(3):
            s.sendall(request)  # one write: the body arrives with its headers
            status, headers, body = parse(response(s))
            assert status == 404 and body["error"]["code"] == "unknown_url"
            assert "connection" not in headers, headers


def test_a_request_the_parser_refuses_is_a_400_in_openais_shape(gateway: str) -> None:
    for bad in (b"GET / HTTP/1.1\r\nHost: x\r\nNo colon here\r\n\r\n", b"\x16\x03\x01\x02\x00"):
        with connect(gateway) as s:
            s.sendall(bad)
            status, headers, body = parse(answer(s)[1])
        assert status == 400 and body["error"]["code"] == "invalid_http", body
        assert headers["content-type"] == "application/json"
    assert transcribe(gateway).status_code == 200


def test_draining_ends_when_the_client_keeps_quiet(gateway: str) -> None:
    """Draining is bounded: the client reads the answer and the gateway's end at once, and a
    client that neither sends nor closes is closed after the idle timeout."""
    with connect(gateway) as s:
        s.sendall(b"POST /v1/nope HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n" + b"x" * 10)
        assert answer(s)[0] == 404  # the answer, then the gateway's FIN: no wait for the client
        time.sleep(3 * IDLE)
        assert sent_until_closed(s, [b"x"] * 20, pause=0.05)  # a reset, then a broken pipe
