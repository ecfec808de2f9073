"""`POST /v1/chat/completions` through the gateway, over real HTTP, against a stand-in
`transformers serve` with an audio language model replaying its recorded answers
(`fixtures/transformers-5.24/cb_audio_lm_chat_*`), with the official OpenAI client."""

from __future__ import annotations

import base64
import concurrent.futures
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from testkit import rawhttp
from testkit.audio import convert, speak, tone_wav
from testkit.frontend import (
    AUDIO_LM_MODEL,
    PATIENCE,
    PRIMARY,
    RECORDED,
    RECORDED_DELTAS,
    Frontend,
    assert_budget_released,
    chat_pool,
    error,
    pool,
)
from testkit.host import free_port
from testkit.standins import (
    Behaviour,
    Running,
    serve,
    transformers_app,
)
from transcription_api.capabilities import Engine, Mode
from transcription_api.chat import parse_chat
from transcription_api.errors import APIError
from transcription_api.frontend import FrontendLimits, WorkerTimeouts
from transcription_api.routes import RouteTable

WAV = tone_wav(0.5)

pytestmark = pytest.mark.standin("audio-lm")


def audio_part(data: bytes = WAV, fmt: str = "wav") -> dict[str, Any]:
    return {"type": "input_audio",
            "input_audio": {"data": base64.b64encode(data).decode(), "format": fmt}}  # fmt: skip


def messages(*parts: dict[str, Any]) -> list[dict[str, Any]]:
    content = [*parts, {"type": "text", "text": "Transcribe this."}]
    return [{"role": "system", "content": "You transcribe."}, {"role": "user", "content": content}]


@pytest.fixture
def frontend(worker: tuple[Running, Behaviour]) -> Iterator[Frontend]:
    fe = Frontend(RouteTable(model=PRIMARY, aliases=["qwen"], pools=[chat_pool(worker[0].url)]))
    yield fe
    fe.running.stop()


def post(fe: Frontend, body: Any, **kw: Any) -> httpx.Response:
    return httpx.post(f"{fe.url}/v1/chat/completions", json=body, **{"timeout": 30, **kw})


def counter(fe: Frontend, **labels: str) -> Callable[[], float]:
    """Chat requests counted with these labels since now (the registry is process-wide)."""
    labels = {"endpoint": "chat", **labels}
    before = fe.metric("transcription_frontend_requests_total", **labels)
    return lambda: fe.metric("transcription_frontend_requests_total", **labels) - before


def assert_still_serving(fe: Frontend) -> None:
    r = fe.client.chat.completions.create(model="qwen", messages=messages(audio_part()))  # type: ignore[arg-type]
    assert r.choices[0].message.content == RECORDED["choices"][0]["message"]["content"]


# --------------------------------------------------------------------------- answers


def test_audio_input_through_the_openai_client(
    frontend: Frontend, worker: tuple[Running, Behaviour]
) -> None:
    r = frontend.client.chat.completions.create(
        model="qwen",
        messages=messages(audio_part()),
        max_tokens=5,  # type: ignore[arg-type]
    )
    assert r.choices[0].message.content == "International Rush Incomeímediate"
    assert (r.usage.prompt_tokens, r.choices[0].finish_reason) == (125, "length")  # type: ignore[union-attr]
    # The worker got the name it loaded; the client gets the primary name back.
    assert r.model == PRIMARY
    seen = worker[1].seen[-1]
    assert (seen.path, seen.body["model"]) == ("/v1/chat/completions", AUDIO_LM_MODEL)  # type: ignore[index]
    # Every other field as sent, the audio untouched.
    assert seen.body == {
        "model": AUDIO_LM_MODEL,
        "messages": messages(audio_part()),
        "max_tokens": 5,
    }


def test_the_audio_format_sent_is_the_container_the_bytes_are_in(
    frontend: Frontend, worker: tuple[Running, Behaviour], tmp_path: Path
) -> None:
    """transformers picks its decoder from `format`: a flac file labelled wav (the OpenAI SDK
    types only wav and mp3) reaches it as flac."""
    flac = convert(speak("hello", tmp_path), "flac").read_bytes()
    r = post(frontend, {"model": "qwen", "messages": messages(audio_part(flac, "wav"))})
    assert r.status_code == 200, r.text
    sent = worker[1].seen[-1].body["messages"][1]["content"][0]["input_audio"]  # type: ignore[index]
    assert sent == {"data": base64.b64encode(flac).decode(), "format": "flac"}


def test_stream_passes_through_with_the_primary_name_and_done(
    frontend: Frontend, worker: tuple[Running, Behaviour]
) -> None:
    chunks = list(frontend.client.chat.completions.create(
        model="qwen", messages=messages(audio_part()), stream=True))  # type: ignore[arg-type]  # fmt: skip
    assert [c.model for c in chunks] == [PRIMARY] * 7
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].delta.content for c in chunks[1:-1]] == RECORDED_DELTAS
    assert chunks[-1].choices[0].finish_reason == "length"
    assert chunks[-1].usage.total_tokens == 18  # type: ignore[union-attr]
    # transformers ends without [DONE]; the client gets it.
    raw = post(frontend, {"model": "qwen", "messages": messages(), "stream": True})
    assert raw.headers["content-type"] == "text/event-stream"
    events = raw.text.split("\n\n")
    assert events[-2:] == ["data: [DONE]", ""]
    assert all(e.startswith("data: {") for e in events[:-2])


def test_stream_events_reach_the_client_as_they_arrive(
    frontend: Frontend, worker: tuple[Running, Behaviour]
) -> None:
    worker[1].chunk_delay = 0.3
    arrivals = []
    start = time.monotonic()
    with httpx.stream("POST", f"{frontend.url}/v1/chat/completions", timeout=30,
                      json={"model": "qwen", "messages": messages(), "stream": True}) as r:  # fmt: skip
        for line in r.iter_lines():
            if line.startswith("data: "):
                arrivals.append(time.monotonic() - start)
    assert len(arrivals) == 8
    # Seven events 0.3 s apart: the first arrives long before the last (no buffering).
    assert arrivals[-1] - arrivals[0] > 1.5


def test_alias_primary_and_no_model_all_reach_the_pool(frontend: Frontend) -> None:
    for name in ("qwen", PRIMARY, None):
        body = {"messages": messages()} | ({"model": name} if name else {})
        r = post(frontend, body)
        assert r.status_code == 200 and r.json()["model"] == PRIMARY


def test_metrics_request_id_and_api_keys(worker: tuple[Running, Behaviour], tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    keys.write_text("k1\n")
    fe = Frontend(RouteTable(model=PRIMARY, pools=[chat_pool(worker[0].url)]), keys=keys)
    try:
        labels = {"model": PRIMARY, "endpoint": "chat", "pool": "chat"}
        count = "transcription_frontend_requests_total"
        before = (fe.metric(count, status="200", **labels),
                  fe.metric(count, status="401", endpoint="chat", pool="none"),
                  fe.metric("transcription_frontend_upload_bytes_count", endpoint="chat"))  # fmt: skip
        r = post(fe, {"model": PRIMARY, "messages": messages()})
        assert r.status_code == 401 and "Missing API key" in error(r)["message"]
        with pytest.raises(openai.AuthenticationError):
            fe.client.chat.completions.create(model=PRIMARY, messages=messages())  # type: ignore[arg-type]
        auth = {"authorization": "Bearer k1", "x-request-id": "chat-42"}
        r = post(fe, {"model": PRIMARY, "messages": messages(audio_part())}, headers=auth)
        assert r.status_code == 200
        assert r.headers["x-request-id"] == "chat-42"
        assert worker[1].seen[-1].headers["x-request-id"] == "chat-42"
        after = (fe.metric(count, status="200", **labels),
                 fe.metric(count, status="401", endpoint="chat", pool="none"),
                 fe.metric("transcription_frontend_upload_bytes_count", endpoint="chat"))  # fmt: skip
        assert [a - b for a, b in zip(after, before, strict=True)] == [1, 2, 1]
    finally:
        fe.running.stop()


# --------------------------------------------------------------------------- bad input


BAD_BODIES: list[tuple[Any, int, str, str | None]] = [
    ({"model": "nope", "messages": messages()}, 404,
     f"The model `nope` does not exist. Valid models: {PRIMARY}, qwen", "model"),
    ({"model": "qwen"}, 400, "messages: Field required", "messages"),
    ({"model": "qwen", "messages": []}, 400, "at least 1 item", "messages"),
    ({"model": "qwen", "messages": [{"role": "robot", "content": "hi"}]}, 400,
     "Input tag 'robot' found using 'role'", "messages[0]"),
    ({"model": "qwen", "messages": messages({"type": "audio_url", "audio_url": {"url": "http://10.0.0.1/a.wav"}})},
     400, "audio_url parts are not accepted (the worker would fetch the URL itself): send the audio inline",
     "messages[1].content[0]"),
    ({"model": "qwen", "messages": messages({"type": "image_url", "image_url": {"url": "https://x/cat.png"}})},
     400, "image_url parts are not accepted", "messages[1].content[0]"),
    ({"model": "qwen", "messages": messages({"type": "input_audio", "input_audio": {"data": "http://169.254.169.254/", "format": "wav"}})},
     400, "must be the audio itself, base64-encoded: not a URL", "messages[1].content[0].input_audio.data"),
    ({"model": "qwen", "messages": messages({"type": "input_audio", "input_audio": {"data": "/etc/passwd", "format": "wav"}})},
     400, "not a URL, a path", "messages[1].content[0].input_audio.data"),
    ({"model": "qwen", "messages": messages({"type": "input_audio", "input_audio": {"data": "not base64!", "format": "wav"}})},
     400, "is not valid base64", "messages[1].content[0].input_audio.data"),
    ({"model": "qwen", "messages": messages({"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "wav,evil"}})},
     400, "must name the audio's container", "messages[1].content[0].input_audio.format"),
    ({"model": "qwen", "messages": messages(audio_part(b"\x00 this is no audio " * 10))}, 400,
     "the audio is not a recognised audio container", "messages[1].content[0].input_audio.data"),
    ({"model": "qwen", "messages": messages(), "stream": "false"}, 400, "stream: Input should be a valid boolean", "stream"),
    ({"model": "qwen", "messages": messages(), "temperature": 3}, 400, "temperature: Input should be less than or equal to 2", "temperature"),
    ({"model": "qwen", "messages": messages(), "frobnicate": True}, 400,
     "the transformers engine of pool chat does not accept the field(s) `frobnicate`; remove them", "frobnicate"),
    ({"model": "qwen", "messages": messages(), "n": 3}, 400,
     "the transformers engine of pool chat cannot honour `n`: it returns one choice", "n"),
    ({"model": "qwen", "messages": messages(), "response_format": {"type": "json_object"}}, 400,
     "cannot honour `response_format`: it answers free text", "response_format"),
    ([1, 2], 400, "the request body must be a JSON object", None),
]  # fmt: skip


@pytest.mark.parametrize(
    ("body", "status", "message", "param"), BAD_BODIES, ids=[m[:40] for _, _, m, _ in BAD_BODIES]
)
def test_bad_input_gets_a_clear_error_and_the_server_keeps_serving(
    frontend: Frontend, worker: tuple[Running, Behaviour], body: Any, status: int, message: str,
    param: str | None,
) -> None:  # fmt: skip
    r = post(frontend, body)
    assert r.status_code == status, r.text
    e = error(r)
    assert message in e["message"]
    assert e["param"] == param
    assert worker[1].seen == []  # refused before any worker was busy with it
    assert_still_serving(frontend)


def test_not_json_is_a_clear_400(frontend: Frontend) -> None:
    r = httpx.post(f"{frontend.url}/v1/chat/completions", content=b"model=qwen",
                   headers={"content-type": "application/x-www-form-urlencoded"})  # fmt: skip
    assert r.status_code == 400
    assert error(r)["message"].startswith("the request body is not valid JSON")
    # Not even text in an encoding JSON allows (the fuzzer found it once a 500).
    r = httpx.post(f"{frontend.url}/v1/chat/completions", content=b'\xda{"model": "qwen"}')
    assert r.status_code == 400 and error(r)["code"] == "invalid_json"
    assert "can't decode byte 0xda" in error(r)["message"]
    assert_still_serving(frontend)


def test_audio_the_engine_cannot_decode_is_refused_naming_it(
    frontend: Frontend, worker: tuple[Running, Behaviour], tmp_path: Path
) -> None:
    """transformers (soundfile) answers m4a with a bare 500: the gateway says why first."""
    m4a = convert(speak("hello", tmp_path), "m4a").read_bytes()
    with pytest.raises(openai.BadRequestError) as e:
        frontend.client.chat.completions.create(
            model="qwen", messages=messages(audio_part(m4a, "mp3")))  # type: ignore[arg-type]  # fmt: skip
    body = e.value.body
    assert body["param"] == "messages[1].content[0].input_audio"  # type: ignore[index]
    assert body["code"] == "unsupported_audio_format"  # type: ignore[index]
    assert body["message"].startswith(  # type: ignore[index]
        "the audio is MP4/M4A (AAC), which the transformers engine of pool chat cannot decode "
        "(it reads aiff, au, caf, flac, mp3, ogg, wav)"
    )
    assert worker[1].seen == []
    assert_still_serving(frontend)


def test_a_body_over_the_limit_is_413_naming_base64(worker: tuple[Running, Behaviour]) -> None:
    table = RouteTable(model=PRIMARY, max_upload_bytes=64 * 1024, pools=[chat_pool(worker[0].url)])
    fe = Frontend(table)
    try:
        big = {"model": PRIMARY, "messages": messages(audio_part(tone_wav(3)))}
        r = post(fe, big)
        assert r.status_code == 413
        e = error(r)
        assert e["code"] == "request_too_large" and e["param"] == "messages"
        assert e["message"] == (
            "Request too large: the limit is 65536 bytes (0.1 MiB) for the whole JSON body. "
            "Audio sent inline as base64 takes about 4/3 of its file size, so about 0.0 MiB "
            "of audio fits: compress it (e.g. to mp3 or opus) or send a shorter clip."
        )
        # Without a Content-Length (chunked): refused as the body crosses the limit.
        data = json.dumps(big).encode()
        chunked = httpx.post(f"{fe.url}/v1/chat/completions", timeout=30,
                             content=iter([data[i : i + 8192] for i in range(0, len(data), 8192)]))  # fmt: skip
        assert chunked.status_code == 413
        with pytest.raises(openai.APIStatusError) as too_large:
            fe.client.chat.completions.create(**big)
        assert too_large.value.status_code == 413
        assert worker[1].seen == []
        assert post(fe, {"model": PRIMARY, "messages": messages(audio_part())}).status_code == 200
    finally:
        fe.running.stop()


def test_bodies_past_the_memory_budget_get_503_and_are_served_after(
    worker: tuple[Running, Behaviour],
) -> None:
    """Chat bodies are held in memory (parsed) until answered, within `bufferedBodyBytes`
    for all requests together: one that would pass it gets 503 with Retry-After naming it,
    while smaller ones still fit, and once the held body is answered the same request is
    served."""
    fe = Frontend(RouteTable(model=PRIMARY, pools=[chat_pool(worker[0].url)]),
                  limits=FrontendLimits(buffered_body_bytes=1024**2))  # fmt: skip
    big = {"model": PRIMARY, "messages": messages(audio_part(tone_wav(20)))}  # 0.85 MB
    worker[1].delay = 1.5
    try:
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            first = pool.submit(post, fe, big)
            deadline = time.monotonic() + 10
            while worker[1].in_flight < 1 and time.monotonic() < deadline:
                time.sleep(0.02)
            assert worker[1].in_flight == 1
            refused = post(fe, big)
            assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
            e = error(refused)
            assert e["code"] == "memory_budget_exceeded" and "(bufferedBodyBytes)" in e["message"]
            assert e["type"] == "server_error"
            assert (
                post(fe, {"model": PRIMARY, "messages": messages(audio_part())}).status_code == 200
            )
            assert first.result().status_code == 200
        worker[1].delay = 0.0
        assert post(fe, big).status_code == 200  # its bytes were released, once
        assert_budget_released(fe.gateway)
    finally:
        fe.running.stop()


def test_no_pool_serves_chat_names_the_capability(worker: tuple[Running, Behaviour]) -> None:
    """A Whisper deployment: its pools transcribe, none chats."""
    whisper = pool("seq", [worker[0].url], engine=Engine.TRANSFORMERS, mode=Mode.SEQUENTIAL)
    fe = Frontend(RouteTable(model=PRIMARY, pools=[whisper]))
    try:
        with pytest.raises(openai.BadRequestError) as e:
            fe.client.chat.completions.create(model=PRIMARY, messages=messages(), stream=True)  # type: ignore[arg-type]
        assert e.value.body["message"] == (  # type: ignore[index]
            "no pool of this deployment can serve this request: missing capability chat"
        )
        assert e.value.body["code"] == "unsupported_capability"  # type: ignore[index]
        assert worker[1].seen == []
    finally:
        fe.running.stop()


def test_wrong_method(frontend: Frontend) -> None:
    r = httpx.get(f"{frontend.url}/v1/chat/completions")
    assert r.status_code == 405 and "use POST" in error(r)["message"]


# --------------------------------------------------------------------------- worker failures


def test_a_detail_answer_becomes_openais_error_shape(worker: tuple[Running, Behaviour]) -> None:
    """A route table whose worker_model is not what the worker loaded: its recorded
    `400 {"detail": "Server is pinned to ..."}` reaches the client in OpenAI's shape."""
    p = chat_pool(worker[0].url).model_copy(update={"worker_model": "other"})
    fe = Frontend(RouteTable(model=PRIMARY, pools=[p]))
    try:
        r = post(fe, {"model": PRIMARY, "messages": messages()})
        assert r.status_code == 400
        assert error(r)["message"] == f"Server is pinned to '{AUDIO_LM_MODEL}'; requested 'other'."
    finally:
        fe.running.stop()


def test_a_bare_500_is_a_502_naming_pool_and_engine() -> None:
    """A Whisper checkpoint behind a pool the table says is an audio LM: transformers'
    recorded bare `500 Internal Server Error` (`whisper_chat`)."""
    b = Behaviour()
    with serve(transformers_app(b, model=AUDIO_LM_MODEL, family="whisper")) as running:
        fe = Frontend(RouteTable(model=PRIMARY, pools=[chat_pool(running.url)]))
        try:
            failed = counter(fe, status="502", pool="chat")
            with pytest.raises(openai.InternalServerError) as e:
                fe.client.chat.completions.create(model=PRIMARY, messages=messages())  # type: ignore[arg-type]
            assert e.value.status_code == 502
            assert e.value.body["message"].startswith(  # type: ignore[index]
                "the transformers worker of pool chat failed to process the request "
                "(500: Internal Server Error)"
            )
            assert failed() == 1
        finally:
            fe.running.stop()


def test_an_error_mid_stream_reaches_the_client_and_the_stream_ends(
    frontend: Frontend, worker: tuple[Running, Behaviour]
) -> None:
    worker[1].fail_stream_after = 3
    failed = counter(frontend, status="502")
    stream = frontend.client.chat.completions.create(
        model="qwen", messages=messages(), stream=True)  # type: ignore[arg-type]  # fmt: skip
    got: list[str | None] = []

    def read() -> None:
        got.extend(chunk.choices[0].delta.content for chunk in stream)

    with pytest.raises(openai.APIError) as e:
        read()
    assert got == [None, "International", " Rush"]
    assert "mid-stream: CUDA out of memory. Tried to allocate 2.00 GiB" in e.value.message
    raw = post(frontend, {"model": "qwen", "messages": messages(), "stream": True})
    events = [ev for ev in raw.text.split("\n\n") if ev]
    assert json.loads(events[-2].removeprefix("data: "))["error"]["code"] == "worker_error"
    assert events[-1] == "data: [DONE]"
    assert failed() == 2
    worker[1].fail_stream_after = None
    assert_still_serving(frontend)


def test_client_disconnect_cancels_the_worker_request(worker: tuple[Running, Behaviour]) -> None:
    worker[1].hold = True
    fe = Frontend(RouteTable(model=PRIMARY, pools=[chat_pool(worker[0].url)]))
    try:
        gone = counter(fe, status="499")
        chat = {"model": PRIMARY, "messages": messages()}
        rawhttp.leave(httpx.Request("POST", f"{fe.url}/v1/chat/completions", json=chat),
                      reached=lambda: worker[1].in_flight == 1)  # fmt: skip
        deadline = time.monotonic() + 3
        while worker[1].cancelled == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert worker[1].cancelled == 1
        assert fe.router.in_flight(worker[0].url) == 0
        deadline = time.monotonic() + 3
        while gone() == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert gone() == 1
    finally:
        fe.running.stop()


# --------------------------------------------------------------------------- wire models


def test_content_as_a_string_or_parts_and_what_passes_through() -> None:
    raw = {"model": "m", "messages": [
        {"role": "developer", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "hi", "cache": True}]},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "content": "42", "tool_call_id": "c1"},
    ], "seed": 7, "vendor_option": {"a": 1}}  # fmt: skip
    request, body = parse_chat(json.dumps(raw).encode())
    assert body == raw  # forwarded as sent
    assert request.seed == 7 and request.audio_parts() == []
    with pytest.raises(APIError, match=r"messages\[0\]\.tool_call_id: Field required"):
        parse_chat(json.dumps({"messages": [{"role": "tool", "content": "x"}]}).encode())


def test_the_openapi_document_describes_the_chat_body(frontend: Frontend) -> None:
    doc = httpx.get(f"{frontend.url}/openapi.json").json()
    op = doc["paths"]["/v1/chat/completions"]["post"]
    ref = op["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    assert ref == "#/components/schemas/ChatCompletionRequest"
    schemas = doc["components"]["schemas"]
    assert schemas["ChatCompletionRequest"]["required"] == ["messages"]
    parts = schemas["UserMessage"]["properties"]["content"]["anyOf"]
    assert parts[0] == {"type": "string"}
    assert set(parts[1]["items"]["discriminator"]["mapping"]) == {"text", "input_audio"}
    assert schemas["InputAudio"]["required"] == ["data", "format"]


# --------------------------------------------------------------------------- scale from zero


def test_a_chat_pool_at_zero_holds_the_request_until_a_worker_appears(
    worker: tuple[Running, Behaviour],
) -> None:
    fe = Frontend(RouteTable(model=PRIMARY, pools=[chat_pool(worker[0].url).model_copy(
        update={"endpoints": []})]))  # fmt: skip
    held = "transcription_frontend_held_requests"
    try:
        body = json.dumps({"model": PRIMARY, "messages": messages(audio_part())}).encode()
        with concurrent.futures.ThreadPoolExecutor(1) as ex:
            answer = ex.submit(httpx.post, f"{fe.url}/v1/chat/completions", content=body,
                               timeout=30)  # fmt: skip
            deadline = time.monotonic() + 5
            while fe.metric(held, pool="chat") != 1 and time.monotonic() < deadline:
                time.sleep(0.02)
            assert fe.metric(held, pool="chat") == 1
            # The held JSON body counts against the bytes bound of held requests.
            assert fe.metric("transcription_frontend_held_bytes") == len(body)
            assert not answer.done()
            fe.endpoints("chat", [worker[0].url])
            r = answer.result(timeout=PATIENCE)
        assert r.status_code == 200 and r.json()["model"] == PRIMARY
        assert fe.metric(held, pool="chat") == 0
    finally:
        fe.running.stop()


def test_a_dead_endpoint_is_retried_on_another(worker: tuple[Running, Behaviour]) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    p = chat_pool(worker[0].url).model_copy(update={"endpoints": [dead, worker[0].url]})
    fe = Frontend(RouteTable(model=PRIMARY, pools=[p]))
    try:
        for _ in range(2):  # whichever endpoint is picked first
            assert post(fe, {"model": PRIMARY, "messages": messages()}).status_code == 200
        assert len(worker[1].seen) == 2
    finally:
        fe.running.stop()


def test_a_stream_that_stalls_ends_with_an_error_event_after_the_read_timeout(
    worker: tuple[Running, Behaviour],
) -> None:
    worker[1].chunk_delay = 3.0
    fe = Frontend(RouteTable(model=PRIMARY, pools=[chat_pool(worker[0].url)]),
                  worker_timeouts=WorkerTimeouts(read_seconds=0.5))  # fmt: skip
    try:
        started = time.monotonic()
        r = post(fe, {"model": PRIMARY, "messages": messages(), "stream": True})
        assert time.monotonic() - started < 2.5
        events = [e for e in r.text.split("\n\n") if e]
        assert json.loads(events[0].removeprefix("data: "))["model"] == PRIMARY
        error_event = json.loads(events[1].removeprefix("data: "))["error"]
        assert (
            "its stream sent nothing for longer than the worker read timeout"
            in (error_event["message"])
        )
        assert events[2:] == ["data: [DONE]"]
    finally:
        fe.running.stop()
