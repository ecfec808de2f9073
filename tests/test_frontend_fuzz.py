"""Fuzzing the gateway: whatever arrives, no 500, and the server keeps serving.

Two generators: schemathesis, from the gateway's own OpenAPI document, and hypothesis
building hostile multipart bodies by hand (odd field names and values, binary junk,
broken framing, wrong content types) and hostile chat bodies (any JSON, near-valid
messages, URLs and paths where audio belongs)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from testkit.audio import tone_wav
from testkit.frontend import AUDIO_LM_MODEL, chat_pool, in_process
from testkit.standins import Behaviour, Running, start, transformers_app, vllm_app
from transcription_api.capabilities import Engine, Mode
from transcription_api.routes import PoolRoute, RouteTable
from transcription_frontend.app import Gateway, create_app
from transcription_frontend.routing import Router

NAMES = ["whisper-large-v3", "whisper-1"]
WAV = tone_wav(0.2)


@pytest.fixture(scope="module")
def gateway() -> Iterator[str]:
    worker = start(vllm_app(NAMES, Behaviour()))
    # A chat pool too, so that hostile chat bodies get past "no pool can chat" (refused
    # before the body is read) to the parser.
    chat = start(transformers_app(Behaviour(), model=AUDIO_LM_MODEL, family="audio-lm"))
    table = RouteTable(model=NAMES[0], aliases=NAMES[1:], max_upload_bytes=1024 * 1024, pools=[
        PoolRoute(name="batch", engine=Engine.VLLM, mode=Mode.CONTINUOUS, service="b", endpoints=[worker.url]),
        chat_pool(chat.url),
    ])  # fmt: skip
    fe: Running = start(create_app(Gateway(router=Router(table), settings=in_process())))
    yield fe.url
    fe.stop()
    worker.stop()
    chat.stop()


def still_serving(url: str) -> None:
    r = httpx.post(
        f"{url}/v1/audio/transcriptions",
        data={"model": "whisper-1"},
        files={"file": ("a.wav", WAV)},
    )
    assert r.status_code == 200, r.text


def test_schemathesis_finds_no_server_error(gateway: str) -> None:
    """Every operation of the gateway's OpenAPI document, with generated requests."""
    schema = schemathesis.openapi.from_url(f"{gateway}/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert {op.path for op in operations} >= {"/v1/audio/transcriptions", "/v1/models"}
    for operation in operations:

        @given(case=operation.as_strategy())
        @settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
        def check(case: Any) -> None:
            response = case.call()
            assert response.status_code < 500, f"{case.method} {case.path}: {response.text}"

        check()
    still_serving(gateway)


field_names = st.sampled_from(["model", "language", "prompt", "response_format", "temperature", "stream",
                               "timestamp_granularities[]", "include[]", "file", "x", ""]) | st.text(max_size=20)  # fmt: skip
field_values = st.sampled_from(
    ["whisper-1", "json", "srt", "true", "0.5", "-1", "nan", "inf", "word", "", "\x00"]
) | st.text(max_size=50)


@st.composite
def multipart(draw: st.DrawFn) -> tuple[bytes, str]:
    boundary = draw(st.sampled_from(["b0undary", "x", "----WebKitFormBoundary7MA4YWxkTrZu0gW"]))
    parts = []
    for name, value in draw(st.lists(st.tuples(field_names, field_values), max_size=8)):
        parts.append(
            f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n{value}\r\n'.encode(
                "utf-8", "surrogatepass"
            )
        )
    if draw(st.booleans()):
        payload = draw(st.sampled_from([WAV, b"", b"RIFF", b"\xff\xfb\x90junk"])) + draw(
            st.binary(max_size=512)
        )
        filename = draw(st.text(max_size=30)).replace('"', "")
        parts.append(f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="{filename}"\r\n'
                     f"Content-Type: {draw(st.sampled_from(['audio/wav', 'application/octet-stream', '']))}\r\n\r\n".encode("utf-8", "surrogatepass")
                     + payload + b"\r\n")  # fmt: skip
    tail = draw(
        st.sampled_from([f"--{boundary}--\r\n".encode(), b"", b"--", f"--{boundary}".encode()])
    )
    ctype = draw(st.sampled_from([f"multipart/form-data; boundary={boundary}", "multipart/form-data",
                                  "application/json", "text/plain", f"multipart/mixed; boundary={boundary}", ""]))  # fmt: skip
    return b"".join(parts) + tail, ctype


@given(body=multipart(), endpoint=st.sampled_from(["transcriptions", "translations"]))
@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
def test_hostile_multipart_bodies_never_cause_a_500(
    gateway: str, body: tuple[bytes, str], endpoint: str
) -> None:
    content, ctype = body
    headers = {"content-type": ctype} if ctype else {}
    r = httpx.post(f"{gateway}/v1/audio/{endpoint}", content=content, headers=headers, timeout=30)
    assert r.status_code < 500, r.text
    if r.status_code != 200:
        err = r.json()["error"]
        assert err["message"] and err["type"]


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=20,
)  # fmt: skip
part = st.fixed_dictionaries({"type": st.sampled_from(["text", "input_audio", "audio_url", "image_url", "x"])},
                             optional={"text": json_values, "input_audio": st.fixed_dictionaries(
                                 {}, optional={"data": st.sampled_from(["UklGRg==", "", "http://x", "//uQ///proc/self/environ"]) | st.text(max_size=30),
                                               "format": st.sampled_from(["wav", "m4a", "w,a"]) | json_values}),
                                       "audio_url": json_values})  # fmt: skip
message = st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "assistant", "tool", "x"]) | json_values},
                                optional={"content": st.text(max_size=20) | st.lists(part, max_size=3) | json_values,
                                          "tool_calls": json_values, "tool_call_id": json_values})  # fmt: skip
chat_body = st.fixed_dictionaries({}, optional={
    "model": st.sampled_from(NAMES) | json_values, "messages": st.lists(message, max_size=3) | json_values,
    "stream": json_values, "max_tokens": json_values, "temperature": json_values, "n": json_values,
}) | json_values  # fmt: skip


@given(body=chat_body, raw=st.none() | st.binary(max_size=200))
@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
def test_hostile_chat_bodies_never_cause_a_500(gateway: str, body: Any, raw: bytes | None) -> None:
    content = raw if raw is not None else json.dumps(body).encode()
    r = httpx.post(f"{gateway}/v1/chat/completions", content=content,
                   headers={"content-type": "application/json"}, timeout=30)  # fmt: skip
    assert r.status_code < 500, r.text
    if r.status_code == 200:  # hypothesis drew a valid body (no model: the deployment's)
        assert r.json()["object"] == "chat.completion", r.text
        return
    err = r.json()["error"]
    assert err["message"] and err["type"]


ENDPOINTS = [("POST", "/v1/audio/transcriptions"), ("POST", "/v1/audio/translations"),
             ("POST", "/v1/chat/completions"), ("GET", "/v1/models"), ("GET", "/health"),
             ("GET", "/ready"), ("GET", "/metrics"), ("POST", "/v1/models"), ("GET", "/v1/nope")]  # fmt: skip
content_types = st.sampled_from(["multipart/form-data; boundary=b", "multipart/form-data; boundary=" + "x" * 300,
                                 "multipart/form-data; boundary=", "multipart/form-data; boundary=\"", "application/json",
                                 "application/json; charset=utf-16", "text/plain", ""]) | st.text(
                                 st.characters(min_codepoint=0x21, max_codepoint=0x7E), max_size=40)  # fmt: skip


@given(endpoint=st.sampled_from(ENDPOINTS), body=st.binary(max_size=2048), ctype=content_types,
       deep=st.integers(0, 3000), prefix=st.sampled_from([b"", b"--b\r\n", b'{"messages": ']))  # fmt: skip
@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
def test_any_bytes_to_any_endpoint_never_cause_a_5xx(
    gateway: str, endpoint: tuple[str, str], body: bytes, ctype: str, deep: int, prefix: bytes
) -> None:
    """Arbitrary bytes, framing starts, and JSON nested up to thousands deep, with any
    content type: every answer is below 500 and, if an error, in OpenAI's shape."""
    content = prefix + b"[" * deep + body
    headers = {"content-type": ctype} if ctype else {}
    method, path = endpoint
    r = httpx.request(method, gateway + path, content=content, headers=headers, timeout=30)
    assert r.status_code < 500, (endpoint, r.text)
    if r.status_code >= 400:
        assert r.headers["content-type"] == "application/json", (endpoint, headers, r.text)
        err = r.json()["error"]
        assert err["message"] and err["type"]


def test_still_serving_after_fuzzing(gateway: str) -> None:
    still_serving(gateway)
