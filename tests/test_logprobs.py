"""`include[]=logprobs` (issue 22 item 3): the transcript's tokens with their log
probabilities, from faster-whisper pools (the CPU worker aligns the decoded text with
CTranslate2; tests/test_worker.py checks the real ones). vLLM's and transformers'
transcription endpoints have none: such pools are never asked, and a deployment without a
faster-whisper pool answers 400 naming `logprobs`."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import openai
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.routing import Route

from testkit.frontend import PRIMARY, WAV, Frontend, assert_still_serving, error, pool
from testkit.standins import Behaviour, Running, serve
from transcription_api.capabilities import Engine
from transcription_api.routes import RouteTable

TOKENS = [[(" Hello", -0.01), (" there", -0.2)], [(" friend", -1.5), (".", -0.05)]]


def test_vllm_alone_is_a_400_naming_logprobs(
    frontend: Frontend, worker: tuple[Running, Behaviour]
) -> None:
    seen = len(worker[1].seen)
    with pytest.raises(openai.BadRequestError) as e:
        frontend.client.audio.transcriptions.create(
            model="whisper-1", file=("a.wav", WAV), include=["logprobs"]
        )
    assert "missing capability logprobs" in str(e.value)
    assert len(worker[1].seen) == seen
    assert_still_serving(frontend)


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ([("include[]", "logprobs"), ("response_format", "text")], "needs response_format=json"),
        ([("include[]", "words")], "include[] takes logprobs, not words"),
    ],
)
def test_bad_includes_are_400s(
    frontend: Frontend, fields: list[tuple[str, str]], says: str
) -> None:
    r = frontend.post([("model", "whisper-1"), *fields])
    assert r.status_code == 400 and says in error(r)["message"]
    assert error(r)["param"] == "include[]"


def test_logprobs_go_to_the_faster_whisper_pool(
    with_faster_whisper: tuple[Frontend, Behaviour],
) -> None:
    fe, behaviour = with_faster_whisper
    before = fe.metric("transcription_frontend_requests_total", pool="fw")
    r = fe.post([("model", "whisper-1"), ("include[]", "logprobs")])
    assert r.status_code == 200, r.text
    assert fe.metric("transcription_frontend_requests_total", pool="fw") == before + 1
    assert ("include[]", "logprobs") in behaviour.seen[-1].fields


async def chunks_with_logprobs(request: Request) -> StreamingResponse:
    """A faster-whisper worker's stream with `include[]=logprobs`: each chunk its tokens."""
    await request.body()

    async def events() -> AsyncIterator[bytes]:
        for part in TOKENS:
            choice = {"delta": {"content": "".join(t for t, _ in part)},
                      "logprobs": [{"token": t, "logprob": lp, "bytes": list(t.encode())}
                                   for t, lp in part]}  # fmt: skip
            chunk = {"id": "t", "object": "transcription.chunk", "created": 0, "model": "m",
                     "choices": [choice]}  # fmt: skip
            yield b"data: " + json.dumps(chunk).encode() + b"\n\n"
        done = {"id": "t", "object": "transcription.chunk", "created": 0, "model": "m",
                "choices": [{"delta": {"content": ""}, "finish_reason": "stop"}]}  # fmt: skip
        yield b"data: " + json.dumps(done).encode() + b"\n\ndata: [DONE]\n\n"

    return StreamingResponse(events(), media_type="text/event-stream")


def test_a_streams_logprobs_reach_each_delta_and_the_done_event() -> None:
    app = Starlette(routes=[Route("/v1/audio/transcriptions", chunks_with_logprobs,
                                  methods=["POST"])])  # fmt: skip
    with serve(app) as engine:
        fe = Frontend(RouteTable(model=PRIMARY, pools=[
            pool("fw", [engine.url], engine=Engine.FASTER_WHISPER)]))  # fmt: skip
        try:
            events = list(fe.client.audio.transcriptions.create(
                model=PRIMARY, file=("a.wav", WAV), stream=True, include=["logprobs"]))  # fmt: skip
        finally:
            fe.running.stop()
    deltas, done = events[:-1], events[-1]
    assert [[(lp.token, lp.logprob) for lp in d.logprobs or []] for d in deltas] == TOKENS
    assert done.type == "transcript.text.done" and done.text == " Hello there friend."
    assert [(lp.token, lp.logprob) for lp in done.logprobs or []] == [t for p in TOKENS for t in p]
