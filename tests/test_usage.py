"""`usage`, the same everywhere (issue 22 item 2): every json and verbose_json answer and
the stream's done event of a duration-billed model carry the seconds of audio, from the
engine or from the gateway's reading of the upload; the gateway counts those seconds per
model and API key (`transcription_frontend_audio_seconds_total`), for metering."""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from testkit.audio import tone_wav
from testkit.frontend import PRIMARY, RECORDED, WAV, Frontend, chat_pool, pool, sse_events
from testkit.standins import VLLM, Behaviour, Running, recording, serve
from transcription_api.openai import ResponseFormat, VerboseTranscription
from transcription_api.render import billed_seconds, render
from transcription_api.routes import RouteTable

METRIC = "transcription_frontend_audio_seconds_total"
RECORDED_JSON = json.loads(recording(VLLM, "json")[2])
RECORDED_VERBOSE = json.loads(recording(VLLM, "verbose_json")[2])


# --------------------------------------------------------------------------- pure


@pytest.mark.parametrize(
    ("transcript", "known", "seconds"),
    [
        ({"text": "", "duration": 4.0550625}, None, 5),  # a verbose answer's own duration
        ({"text": "", "duration": 4.0550625}, 9.0, 5),  # the engine's reading wins
        ({"text": "", "usage": {"type": "duration", "seconds": 7}}, 2.0, 7),
        ({"text": "", "usage": {"type": "tokens", "input_tokens": 3}}, 2.5, 3),  # no seconds
        ({"text": ""}, 5.0, 5),  # an exact 5 s stays 5
        ({"text": ""}, 0.2, 1),
        ({"text": ""}, None, None),  # nobody says: no usage rather than a made-up one
        ({"text": "", "duration": float("nan")}, None, None),
        ({"text": "", "duration": -1}, None, None),
        ({"text": "", "duration": True}, 2.0, 2),  # not a number
        ({"text": "", "usage": {"type": "duration", "seconds": "x"}}, 1.5, 2),
    ],
)
def test_billed_seconds(transcript: dict[str, object], known: float | None,
                        seconds: int | None) -> None:  # fmt: skip
    assert billed_seconds(transcript, known) == seconds


def test_json_and_verbose_json_carry_the_seconds_and_text_does_not() -> None:
    body = {"text": " hi", "usage": {"type": "tokens", "input_tokens": 3}}
    assert json.loads(render(ResponseFormat.JSON, body, 4).body)["usage"] == {
        "type": "duration", "seconds": 4}  # fmt: skip
    assert render(ResponseFormat.TEXT, body, 4).body == b"hi\n"
    verbose = VerboseTranscription(language="en", duration=3.2, text=" hi", segments=[])
    out = json.loads(render(ResponseFormat.VERBOSE_JSON, verbose, 4).body)
    assert out["usage"] == {"type": "duration", "seconds": 4} and out["duration"] == 3.2
    # Without seconds the engine's own usage stays as it was.
    assert json.loads(render(ResponseFormat.JSON, body).body)["usage"]["type"] == "tokens"


# --------------------------------------------------------------------------- the gateway


def test_every_format_and_the_stream_carry_the_same_seconds(frontend: Frontend) -> None:
    c = frontend.client.audio.transcriptions
    before = frontend.metric(METRIC, model=PRIMARY, key="none")
    out = c.create(model="whisper-1", file=("a.wav", WAV))
    # vLLM counted the seconds itself: its usage passes through.
    assert out.usage is not None and out.usage.type == "duration"
    assert out.usage.seconds == RECORDED_JSON["usage"]["seconds"]
    verbose = c.create(model="whisper-1", file=("a.wav", WAV), response_format="verbose_json")
    # vLLM's verbose_json has no usage: the gateway adds its duration, rounded up.
    assert verbose.usage is not None and verbose.usage.type == "duration"
    assert verbose.usage.seconds == math.ceil(RECORDED_VERBOSE["duration"])
    text = c.create(model="whisper-1", file=("a.wav", WAV), response_format="text")
    assert isinstance(text, str)
    events = list(c.create(model="whisper-1", file=("a.wav", WAV), stream=True))
    done = events[-1]
    # The stream's done event: the upload's 0.5 s, not the engine's token count.
    assert done.type == "transcript.text.done" and done.usage is not None
    assert done.usage.model_dump(exclude_none=True) == {"type": "duration", "seconds": 1}
    expected = RECORDED_JSON["usage"]["seconds"] * 2 + math.ceil(RECORDED_VERBOSE["duration"]) + 1
    assert frontend.metric(METRIC, model=PRIMARY, key="none") - before == expected


async def bare_json(request: Request) -> JSONResponse:
    await request.body()
    return JSONResponse({"text": " hello"})  # as transformers serve answers: no usage


def test_an_answer_without_usage_gets_the_uploads_duration() -> None:
    app = Starlette(routes=[Route("/v1/audio/transcriptions", bare_json, methods=["POST"])])
    with serve(app) as engine:
        fe = Frontend(RouteTable(model=PRIMARY, pools=[pool("bare", [engine.url])]))
        try:
            r = fe.post({"model": PRIMARY}, file=tone_wav(2.2))
            assert r.status_code == 200, r.text
            assert r.json() == {"text": " hello", "usage": {"type": "duration", "seconds": 3}}
        finally:
            fe.running.stop()


def test_failed_requests_are_not_metered(
    frontend: Frontend, worker: tuple[Running, Behaviour]
) -> None:
    before = frontend.metric(METRIC, model=PRIMARY)
    assert frontend.post({"model": "whisper-1", "response_format": "bogus"}).status_code == 400
    worker[1].status = 500
    assert frontend.post({"model": "whisper-1"}).status_code == 502
    assert frontend.metric(METRIC, model=PRIMARY) == before
    worker[1].status = None
    assert frontend.post({"model": "whisper-1"}).status_code == 200  # and it still serves
    assert frontend.metric(METRIC, model=PRIMARY) > before


@pytest.fixture
def keyed(worker: tuple[Running, Behaviour], tmp_path: Path) -> Iterator[Frontend]:
    keys = tmp_path / "keys"
    keys.write_text("sk-team-a\nsk-team-b whisper-1\n")
    table = RouteTable(model=PRIMARY, aliases=["whisper-1"], pools=[pool("batch", [worker[0].url])])
    fe = Frontend(table, keys=keys)
    yield fe
    fe.running.stop()


def label(key: str) -> str:
    """The operator's way to find a key's label: `printf %s "$KEY" | sha256sum | cut -c1-8`."""
    return hashlib.sha256(key.encode()).hexdigest()[:8]


def test_seconds_are_counted_per_api_key_and_the_key_is_not_shown(keyed: Frontend) -> None:
    a, b = label("sk-team-a"), label("sk-team-b")
    before = {k: keyed.metric(METRIC, model=PRIMARY, key=k) for k in (a, b)}
    for key, times in (("sk-team-a", 2), ("sk-team-b", 1)):
        c = openai.OpenAI(base_url=f"{keyed.url}/v1", api_key=key, max_retries=0)
        for _ in range(times):
            c.audio.transcriptions.create(model="whisper-1", file=("a.wav", WAV))
    seconds = RECORDED_JSON["usage"]["seconds"]
    assert keyed.metric(METRIC, model=PRIMARY, key=a) - before[a] == 2 * seconds
    assert keyed.metric(METRIC, model=PRIMARY, key=b) - before[b] == seconds
    assert "sk-team" not in httpx.get(f"{keyed.url}/metrics").text
    # A refused key is not metered.
    bad = openai.OpenAI(base_url=f"{keyed.url}/v1", api_key="sk-wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.audio.transcriptions.create(model="whisper-1", file=("a.wav", WAV))


@pytest.mark.standin("audio-lm")
def test_an_audio_language_model_keeps_its_token_usage_and_is_metered_in_seconds(
    worker: tuple[Running, Behaviour],
) -> None:
    table = RouteTable(model="qwen", pools=[chat_pool(worker[0].url)])
    fe = Frontend(table)
    try:
        before = fe.metric(METRIC, model="qwen")
        r = fe.post({"model": "qwen"}, file=tone_wav(1.5))
        assert r.status_code == 200, r.text
        # Billed by token, as OpenAI's gpt-4o-transcribe answers.
        assert r.json()["usage"]["type"] == "tokens"
        assert r.json()["usage"]["total_tokens"] == RECORDED["usage"]["total_tokens"]
        assert fe.metric(METRIC, model="qwen") - before == 2
        stream = sse_events(fe.post({"model": "qwen", "stream": "true"}, file=tone_wav(1.5)))
        assert stream[-1]["type"] == "transcript.text.done"
        assert stream[-1]["usage"]["type"] == "tokens"
        assert fe.metric(METRIC, model="qwen") - before == 4
    finally:
        fe.running.stop()
